#!/usr/bin/env bash
# Runs every fuzz target (cargo-fuzz, libFuzzer) for a few seconds each.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]
# Works on the stable toolchain: the targets are built without a sanitizer (-s none), with
# libFuzzer's coverage guidance; each target asserts that decoding never panics.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs=${1:-10}
if ! command -v cargo-fuzz >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  cargo install --locked cargo-fuzz
fi
for t in $(cargo fuzz list); do
  echo "== fuzz $t (${secs}s)"
  cargo fuzz run -s none "$t" -- -max_total_time="$secs" 2>&1 | tail -1
done
