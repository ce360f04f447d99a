"""The cost of a Python kernel's task beside a Rust one's, in one run (a benchmark, not a test).

Each pattern submits N tasks of one kernel to chip 0 in one host run (``HostOrch.submit_chip``,
one chip task each, with no arguments) and reports microseconds per task: the built-in Rust
kernel ``noop`` and an empty ``@pto.kernel`` (``py_empty``), interleaved over ``--reps`` rounds (medians),
and their difference. With ``--plugin LIB``, a C plugin's kernel ``--plugin-kernel`` too.

    python python/bench/kernels.py [--tasks 2000] [--reps 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pto


@pto.kernel(core="aiv", name="py_empty")
def empty(ctx):  # type: ignore[no-untyped-def]
    pass


def per_task_us(w: pto.Worker, kernel: str, n: int) -> float:
    t = time.perf_counter()
    w.run(lambda h, _: [h.submit_chip(0, kernel) for _ in range(n)])
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--plugin", default=None, help="a C plugin to load (see examples/plugin)")
    ap.add_argument("--plugin-kernel", default="empty")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    kernels = {"rust_noop": "noop", "python_empty": "py_empty"}
    if a.plugin:
        pto.load_plugin(a.plugin)
        kernels["c_plugin"] = a.plugin_kernel
    times: dict = {k: [] for k in kernels}
    with pto.Worker(chips=1, cores=(1, 2), kernels=[empty]) as w:
        for k in kernels.values():
            per_task_us(w, k, 200)  # warm up
        for _ in range(a.reps):
            for label, k in kernels.items():
                times[label].append(per_task_us(w, k, a.tasks))
    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        {"bench": "kernel_task", "kernel": label, "tasks": a.tasks, "us_per_task": round(v, 3)}
        for label, v in med.items()
    ]
    lines.append(
        {
            "bench": "python_kernel_overhead",
            "us_over_rust": round(med["python_empty"] - med["rust_noop"], 3),
            "target_us": 5.0,
        }
    )
    if "c_plugin" in med:
        lines.append({"bench": "c_plugin_vs_rust", "ratio": round(med["c_plugin"] / med["rust_noop"], 3)})
    for line in lines:
        print(json.dumps(line) if a.json else "  ".join(f"{k}: {v}" for k, v in line.items()))


if __name__ == "__main__":
    main()
