#!/usr/bin/env bash
# Benchmarks with their baselines in the same run. Prints JSON lines.
#   scripts/bench.sh [TASKS]
# Needs gcc with OpenMP (Debian: gcc, libgomp1) for the OpenMP anchor in ../shared/anchors.
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-200000}
anchors=${PTO_ANCHORS:-../shared/anchors}
cargo build --release --quiet -p pto-cli
omp=()
if [ -f "$anchors/omp_deps.c" ] && gcc -O2 -fopenmp -o target/omp_deps "$anchors/omp_deps.c" 2>/dev/null; then
  omp=(--omp-anchor target/omp_deps)
else
  echo "note: OpenMP anchor not built (no $anchors/omp_deps.c or no OpenMP); pto figures only" >&2
fi
./target/release/pto bench dag --tasks "$tasks" --json "${omp[@]}"
