#!/usr/bin/env bash
# `pto check` beside a plain `pto run` of the same example, interleaved in one session: whole
# process, launch to exit, median of REPS runs each. One JSON line per example and backend.
#   scripts/check-overhead.sh [RANKS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=${1:-4}
reps=${2:-7}
pto=${PTO_BIN:-./target/release/pto}
examples=$($pto list | awk '{print $1}' | grep -vE '^(vector_pipeline|ffn_chip|multi_chip_dispatch)$' || true)
ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1 || return 1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000 )); }
median() { sort -n | awk '{a[NR]=$1} END {m=a[int((NR+1)/2)]; printf "%.2f", m/1000}'; }
for backend in local shm; do
  for ex in $examples; do
    run=(); chk=()
    for _ in $(seq "$reps"); do
      run+=("$(ms $pto run "$ex" --ranks "$ranks" --backend "$backend")") || { echo "note: $ex failed on $backend" >&2; continue 2; }
      chk+=("$(ms $pto check "$ex" --ranks "$ranks" --backend "$backend")") || { echo "note: check of $ex failed on $backend" >&2; continue 2; }
    done
    r=$(printf '%s\n' "${run[@]}" | median)
    c=$(printf '%s\n' "${chk[@]}" | median)
    awk -v ex="$ex" -v b="$backend" -v n="$ranks" -v r="$r" -v c="$c" 'BEGIN {printf "{\"bench\":\"check_overhead\",\"example\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"run_ms\":%s,\"check_ms\":%s,\"ratio\":%.2f}\n", ex, b, n, r, c, c / r}'
  done
done
