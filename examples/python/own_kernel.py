"""Your own kernels in Python: ``@pto.kernel`` functions run on the chips' cores.

Every chip r has x[r, i] = i + 100 r. ``saxpy`` computes y = 2 x + 1 on an AIV core (numpy
views of the task's tensors, no copy); ``shift`` puts y into the next chip's ``inbox`` window
buffer, notifies that chip's ``ready`` signal, waits for its own, and copies its inbox out.
Golden (numpy): out[r] = 2 x[r - 1] + 1.

    python examples/python/own_kernel.py [--chips N] [--len L]
"""

import argparse
import sys

import pto  # before numpy: keeps numpy's BLAS single-threaded (the Worker forks)
import numpy as np


@pto.kernel(core="aiv")
def saxpy(ctx: pto.KernelContext, x: np.ndarray, y: np.ndarray, a: float, b: float) -> None:
    y[:] = a * x + b


@pto.kernel(core="aiv")
def shift(ctx: pto.KernelContext, y: np.ndarray, out: np.ndarray) -> None:
    nxt = (ctx.rank + 1) % ctx.size
    ctx.put(nxt, "inbox", 0, y)
    ctx.notify(nxt, "ready", 0, 1)
    ctx.wait_until("ready", 0, 1)
    out[:] = ctx.window("inbox")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", type=int, default=4)
    p.add_argument("--len", type=int, default=1024)
    a = p.parse_args()
    n, length = a.chips, a.len
    buffers = [("inbox", "float32", length), ("ready", "uint32", 1)]
    with pto.Worker(chips=n, cores=(1, 2), buffers=buffers, kernels=[saxpy, shift]) as w:
        x, y, out = (w.buffer((n, length)) for _ in range(3))
        x[:] = np.arange(length)[None, :] + 100.0 * np.arange(n)[:, None]

        def orch(h: pto.HostOrch, _: object) -> None:
            for r in range(n):
                h.submit_chip(r, "saxpy", [pto.IN(x[r]), pto.OUT(y[r]), 2.0, 1.0])
            for r in range(n):
                h.submit_chip(r, "shift", [pto.IN(y[r]), pto.OUT(out[r])])

        report = w.run(orch)
        golden = np.roll(2.0 * x + 1.0, 1, axis=0)
        ok = np.array_equal(out, golden)
    verdict = "PASSED" if ok else "FAILED"
    print(f"own_kernel on {n} chips (python): {verdict} ({report['tasks']} host tasks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
