"""Python-side costs of the Worker, as JSON lines (compare with `pto bench worker --json`, the
Rust baseline, in the same run: scripts/bench.sh runs both).

    python python/bench/roundtrip.py [--runs N]
"""

import argparse
import json
import statistics
import time

import pto  # before numpy: keeps numpy's BLAS single-threaded (the Worker forks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=2000)
    a = p.parse_args()
    t = time.perf_counter()
    w = pto.Worker(chips=4)
    init_ms = (time.perf_counter() - t) * 1e3
    x, y = w.buffer(16), w.buffer(16)

    def one(h: pto.HostOrch, _: object) -> None:
        h.submit_chip(0, "vector_scale", [pto.IN(x), pto.OUT(y), 2.0])

    def empty(h: pto.HostOrch, _: object) -> None:
        return None

    def median_us(orch: object) -> float:
        for _ in range(50):
            w.run(orch)  # type: ignore[arg-type]
        v = []
        for _ in range(a.runs):
            s = time.perf_counter()
            w.run(orch)  # type: ignore[arg-type]
            v.append((time.perf_counter() - s) * 1e6)
        return statistics.median(v)

    lines = [
        {"bench": "py_worker_init", "chips": 4, "ms": round(init_ms, 3)},
        {"bench": "py_run_empty", "median_us": round(median_us(empty), 3)},
        {"bench": "py_chip_kernel_roundtrip", "chips": 4, "kernel": "vector_scale", "floats": 16,
         "median_us": round(median_us(one), 3)},
    ]
    w.close()
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
