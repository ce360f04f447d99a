"""``python -m pto.simpler SCRIPT ARGS...`` runs a simpler driver script on pto;
``python -m pto.simpler pytest ARGS...`` runs simpler's tests (the scene tests and the examples'
tests) on pto with pto's pytest plugin in place of simpler's root conftest."""

from __future__ import annotations

import os
import runpy
import sys

USAGE = """usage: python -m pto.simpler SCRIPT [ARGS...]
       python -m pto.simpler pytest [PYTEST ARGS...]

Runs a program written for simpler (its Python driver, C++ kernels and orchestrations) on pto,
unchanged: `import simpler` / `import simpler_setup` resolve to pto's implementation, kernels are
compiled against pto's headers and your pto-isa (PTO_ISA_ROOT), and every device id is a pto
chip (a process over shared memory).

  python -m pto.simpler examples/workers/l3/allreduce/main.py -p a2a3sim -d 0-1
  python -m pto.simpler pytest tests/st/worker/collectives --platform a2a3sim --device 0-3

Environment: PTO_ISA_ROOT (required to compile kernels over pto-isa), CXX (else g++ >= 13 or
clang++ >= 17), PTO_SIMPLER_CLUSTERS (AIC/AIV clusters per chip, default 8), PTO_WAIT_TIMEOUT_MS
and the other PTO_* settings (pto env)."""


def main(argv: list) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    from pto.simpler import activate

    activate()
    if argv[0] == "pytest":
        import pytest

        args = ["-p", "pto.simpler.pytest_plugin", "--noconftest", "--import-mode=importlib", "-p", "no:cacheprovider"] + argv[1:]
        return int(pytest.main(args))
    script = argv[0]
    if not os.path.isfile(script):
        print(f"python -m pto.simpler: no such script: {script}", file=sys.stderr)
        return 2
    sys.argv = list(argv)
    sys.path.insert(1, os.path.dirname(os.path.abspath(script)))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
