#!/usr/bin/env bash
# The README's test command: installs what the tests need, then runs every test.
# Runs on a fresh machine with the Rust toolchain (cargo, cargo-nextest) present.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo-nextest >/dev/null 2>&1; then
  echo "== installing cargo-nextest"
  cargo install --locked cargo-nextest
fi

echo "== unit, integration and property tests (nextest)"
cargo nextest run --workspace --profile ci

echo "== documentation examples"
cargo test --workspace --doc --quiet

echo "== no stale shared-memory segments left behind"
if ls /dev/shm 2>/dev/null | grep -q '^pto'; then
  ls /dev/shm | grep '^pto' >&2
  echo "tests left pto segments in /dev/shm" >&2
  exit 1
fi
