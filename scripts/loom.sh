#!/usr/bin/env bash
# Model-checks pto-shm's barrier, signal and queue protocols (crates/pto-shm/tests/loom.rs) and
# the engine's successor list and sleep protocol (crates/pto-core/tests/loom.rs) with loom.
# A separate target directory keeps `--cfg loom` from invalidating the normal build cache.
# The models run one at a time (the timings it prints are then per model).
# LOOM_MAX_PREEMPTIONS, if set, overrides every model's preemption bound.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p pto-shm --test loom --release -- --nocapture --test-threads=1 "$@"
# The engine's successor list and sleep protocol (crates/pto-core/tests/loom.rs).
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p pto-core --test loom --release -- --nocapture --test-threads=1 "$@"
