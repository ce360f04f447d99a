#!/usr/bin/env bash
# Every benchmark, each with its baseline measured in the same run. Prints JSON lines (pto) and
# the anchors' own lines. Needs gcc with OpenMP for the OpenMP anchor, and Open MPI (Debian:
# libopenmpi-dev openmpi-bin) for the MPI anchors; missing anchors are skipped with a note.
#   scripts/bench.sh [TASKS]
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=${1:-200000}
anchors=${PTO_ANCHORS:-../shared/anchors}
cargo build --release --quiet -p pto-cli
pto=./target/release/pto

omp=()
# The repository's own OpenMP anchor (chain, fan and diamond).
if gcc -O2 -fopenmp -o target/omp_deps scripts/anchors/omp_deps.c 2>/dev/null; then
  omp=(--omp-anchor target/omp_deps)
else
  echo "note: OpenMP anchor not built; dag figures without a baseline" >&2
fi
# The CPU-to-CPU latency before and after: the engine's figures follow it (a virtual machine's
# CPUs are nearer or further apart from one hour to the next; docs/BENCHMARKS.md).
line_rt=()
if gcc -O2 -pthread -o target/line_rt scripts/anchors/line_rt.c 2>/dev/null; then
  line_rt=(target/line_rt)
fi
[ ${#line_rt[@]} -eq 0 ] || "${line_rt[@]}" || true
$pto bench dag --tasks "$tasks" --json "${omp[@]}"
[ ${#line_rt[@]} -eq 0 ] || "${line_rt[@]}" || true
$pto bench deferred --json
$pto bench worker --json
for n in 2 4 8; do $pto bench comm --backend shm --ranks "$n" --json; done
$pto bench comm --backend local --ranks 2 --json

if command -v mpicc >/dev/null && [ -f "$anchors/mpi_osu.c" ]; then
  mpicc -O2 -o target/mpi_osu "$anchors/mpi_osu.c"
  mpicc -O2 -o target/mpi_bar8 "$anchors/mpi_bar8.c"
  echo "# Open MPI anchors (same run)"
  mpirun --allow-run-as-root --oversubscribe -n 2 target/mpi_osu
  mpirun --allow-run-as-root --oversubscribe -n 8 target/mpi_bar8
  # The mpi backend against MPI_Allreduce in the same job (shared windows, then RMA windows).
  cargo build --release --quiet -p pto-cli --features mpi
  for n in 2 4; do $pto bench allreduce --backend mpi --ranks "$n" --json; done
  PTO_MPI_WINDOWS=rma $pto bench allreduce --backend mpi --ranks 2 --json
  # The hierarchical allreduce (nodes of 2 ranks, leaders over MPI) beside MPI_Allreduce.
  PTO_MPI_WINDOWS=rma PTO_MPI_NODE_RANKS=2 $pto bench allreduce --backend mpi --ranks 4 --json
  # Many ranks: bring-up, barrier and allreduce up to 256 ranks, Open MPI's barrier beside.
  $pto bench scale --max-ranks 256 --mpi-anchor target/mpi_bar8 --json
else
  echo "note: Open MPI not installed; MPI anchors and the mpi backend skipped" >&2
fi

# The checker's cost: `pto check` beside `pto run` of every distributed example, 4 ranks.
PTO_BIN=$pto bash scripts/check-overhead.sh 4 5

# A C plugin's kernel beside a built-in one (examples/plugin/empty.c).
if cc -O2 -shared -fPIC -I"$($pto include-dir)" examples/plugin/empty.c -o target/libempty.so; then
  $pto bench plugin --plugin target/libempty.so --json
fi

# Python (when the package is installed in target/py-venv by scripts/test.sh): its Worker costs,
# beside `pto bench worker` above (the Rust baseline, same run).
if [ -x target/py-venv/bin/python ]; then
  echo "# Python package (same run)"
  target/py-venv/bin/python python/bench/roundtrip.py
else
  echo "note: no target/py-venv (run scripts/test.sh first); Python figures skipped" >&2
fi
