#!/usr/bin/env bash
# Model-checks pto-shm's barrier and signal protocols with loom (crates/pto-shm/tests/loom.rs).
# A separate target directory keeps `--cfg loom` from invalidating the normal build cache.
# The models run one at a time (the timings it prints are then per model).
# LOOM_MAX_PREEMPTIONS, if set, overrides every model's preemption bound.
set -euo pipefail
cd "$(dirname "$0")/.."

RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p pto-shm --test loom --release -- --nocapture --test-threads=1 "$@"
