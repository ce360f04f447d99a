"""allreduce_distributed from Python: the four-phase allreduce kernel on every chip's window.

Chip r's input is in[r][i] = i + 100 r; after the run every chip's out[r][i] must equal the
numpy golden sum_k in[k][i] = n i + 100 n (n - 1) / 2.

    python examples/python/allreduce_distributed.py [--chips N] [--len L] [--trace FILE]
"""

import argparse
import sys

import pto  # before numpy: keeps numpy's BLAS single-threaded (the Worker forks)
import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", type=int, default=4)
    p.add_argument("--len", type=int, default=256)
    p.add_argument("--trace")
    a = p.parse_args()
    n, length = a.chips, a.len
    buffers = [("scratch", "float32", length), ("signals", "uint32", 16 * n)]
    with pto.Worker(chips=n, cores=(1, 2), buffers=buffers) as w:
        x = w.buffer((n, length))
        out = w.buffer((n, length))
        x[:] = np.arange(length)[None, :] + 100.0 * np.arange(n)[:, None]

        def orch(h: pto.HostOrch, _: object) -> None:
            h.submit_group(list(range(n)), "allreduce_distributed", [pto.IN(x), pto.OUT(out)])

        report = w.run(orch, trace=a.trace)
        golden = x.astype(np.float64).sum(axis=0)
        ok = np.allclose(out, golden[None, :], rtol=1e-6, atol=0)
    verdict = "PASSED" if ok else "FAILED"
    print(f"allreduce_distributed on {n} chips (python): {verdict} ({report['tasks']} host tasks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
