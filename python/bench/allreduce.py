"""Allreduce from Python: pto (``run_ranks``, ranks as processes, in-place numpy float32)
beside mpi4py's ``Comm.Allreduce(MPI.IN_PLACE, a)`` under ``mpirun`` when mpi4py is installed,
median microseconds per call from 8 B to 16 MiB (a benchmark, not a test).

    python python/bench/allreduce.py [--ranks 2 4] [--iters 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import pto
import numpy as np

SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20]


def iters_for(size: int, iters: int) -> int:
    return max(5, min(iters, (64 << 20) // max(size, 1) // 4))


def pto_medians(n: int, iters: int) -> dict:
    def body(c: pto.Comm) -> dict:
        out = {}
        for size in SIZES:
            a = np.ones(size // 4, dtype=np.float32)
            k = iters_for(size, iters)
            for _ in range(3):
                c.allreduce(a)
            ts = []
            for _ in range(k):
                c.barrier()
                t = time.perf_counter()
                c.allreduce(a)
                ts.append(time.perf_counter() - t)
            out[size] = statistics.median(ts) * 1e6
        return out

    return pto.run_ranks(n, body)[0]


MPI_SCRIPT = r"""
import json, statistics, sys, time
import numpy as np
from mpi4py import MPI
sizes, iters = json.loads(sys.argv[1]), int(sys.argv[2])
c = MPI.COMM_WORLD
out = {}
for size in sizes:
    a = np.ones(size // 4, dtype=np.float32)
    k = max(5, min(iters, (64 << 20) // max(size, 1) // 4))
    for _ in range(3):
        c.Allreduce(MPI.IN_PLACE, a)
    ts = []
    for _ in range(k):
        c.Barrier()
        t = time.perf_counter()
        c.Allreduce(MPI.IN_PLACE, a)
        ts.append(time.perf_counter() - t)
    out[size] = statistics.median(ts) * 1e6
if c.rank == 0:
    print(json.dumps(out))
"""


def mpi_medians(n: int, iters: int):
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    if shutil.which("mpirun") is None:
        return None
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(MPI_SCRIPT)
        path = f.name
    try:
        cmd = ["mpirun", "-n", str(n), "--oversubscribe"]
        if os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        r = subprocess.run(
            cmd + [sys.executable, path, json.dumps(SIZES), str(iters)],
            capture_output=True, text=True, timeout=600,
        )
        if r.returncode != 0:
            print(f"mpi4py run failed: {r.stderr.strip()[:300]}", file=sys.stderr)
            return None
        return {int(k): v for k, v in json.loads(r.stdout.strip().splitlines()[-1]).items()}
    finally:
        os.unlink(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    for n in a.ranks:
        p = pto_medians(n, a.iters)
        m = mpi_medians(n, a.iters)
        for size in SIZES:
            line = {"bench": "python_allreduce", "ranks": n, "bytes": size, "pto_us": round(p[size], 2)}
            if m is not None:
                line["mpi4py_us"] = round(m[size], 2)
                line["ratio"] = round(p[size] / m[size], 3)
            print(json.dumps(line) if a.json else "  ".join(f"{k}: {v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
