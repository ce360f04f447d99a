"""deferred_notify from Python: deferred completion across chips.

Chip r puts partial[r] = r + 1 into chip r+1's mailbox and notifies its counter; a deferred
wait task gates the consumer, so result[r] = partial[(r - 1) mod n] (numpy golden).

    python examples/python/deferred_notify.py [--chips N] [--len L]
"""

import argparse
import sys

import pto  # before numpy: keeps numpy's BLAS single-threaded (the Worker forks)
import numpy as np


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chips", type=int, default=4)
    p.add_argument("--len", type=int, default=16)
    p.add_argument("--trace")
    a = p.parse_args()
    n, length = a.chips, a.len
    buffers = [("mailbox", "float32", length), ("counter", "uint32", 1)]
    with pto.Worker(chips=n, cores=(1, 2), buffers=buffers) as w:
        partial = w.buffer((n, length))
        result = w.buffer((n, length))
        partial[:] = (np.arange(n) + 1.0)[:, None]

        def orch(h: pto.HostOrch, _: object) -> None:
            h.submit_group(list(range(n)), "deferred_notify", [pto.IN(partial), pto.OUT(result)])

        report = w.run(orch, trace=a.trace)
        golden = np.roll(partial, 1, axis=0)
        ok = np.array_equal(result, golden)
    verdict = "PASSED" if ok else "FAILED"
    print(f"deferred_notify on {n} chips (python): {verdict} ({report['tasks']} host tasks)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
