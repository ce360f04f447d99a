"""ffn_tp_parallel from Python: tensor-parallel FFN, y = sum_r x_r w_r.

Each chip computes its partial x_r w_r on an AIC core, then allreduces it on an AIV core; the
host checks every chip's y against a numpy float64 golden (tolerance 1e-4).

    python examples/python/ffn_tp_parallel.py [--chips N] [--dim D] [--trace FILE]
"""

import argparse
import sys

import pto  # before numpy: keeps numpy's BLAS single-threaded (the Worker forks)
import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", type=int, default=4)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--trace")
    a = p.parse_args()
    n, d = a.chips, a.dim
    with pto.Worker(chips=n, cores=(1, 2), collectives=64 << 10) as w:
        x, wt, y = (w.buffer((n, d, d)) for _ in range(3))
        ar = np.arange(d * d, dtype=np.float64).reshape(d, d)
        for r in range(n):
            x[r] = (ar + 0.25 * r) / 32.0
            wt[r] = (ar + 0.5 * (r + 1)) / 48.0

        def orch(h: pto.HostOrch, _: object) -> None:
            h.submit_group(list(range(n)), "ffn_tp_parallel", [pto.IN(x), pto.IN(wt), pto.OUT(y)])

        report = w.run(orch, trace=a.trace)
        golden = sum(x[r].astype(np.float64) @ wt[r].astype(np.float64) for r in range(n))
        ok = all(np.allclose(y[r], golden, rtol=1e-4, atol=1e-4) for r in range(n))
    verdict = "PASSED" if ok else "FAILED"
    print(f"ffn_tp_parallel on {n} chips (python): {verdict} ({report['tasks']} host tasks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
