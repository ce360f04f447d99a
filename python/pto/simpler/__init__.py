"""Run simpler's programs (drivers, kernels and orchestrations written for the PTO runtime's
simpler) on pto, unchanged.

From a checkout of simpler, with pto-isa checked out and ``PTO_ISA_ROOT`` pointing at it::

    python -m pto.simpler examples/workers/l3/allreduce/main.py -p a2a3sim -d 0-1
    python -m pto.simpler pytest tests/st/worker/collectives --platform a2a3sim --device 0-3

``import simpler...`` and ``import simpler_setup...`` then resolve to pto's implementation
(:mod:`pto.simpler._types`, :mod:`pto.simpler._worker`, :mod:`pto.simpler._scene`); kernels and
orchestrations are compiled from the user's sources against pto's headers (``pto include-dir
--simpler``) and the user's pto-isa, cached by content, and run on pto chips: one forked process
per device id. See ``docs/design/simpler.md``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._types import *  # noqa: F401,F403
from ._worker import CallableHandle, Orchestrator, Worker  # noqa: F401

COMPAT = str(Path(__file__).resolve().parent / "_compat")


def activate() -> None:
    """Makes ``import simpler`` and ``import simpler_setup`` resolve to pto's implementation
    (first on ``sys.path``, for this process and the ones it starts)."""
    if sys.path[:1] != [COMPAT]:
        sys.path.insert(0, COMPAT)
    for name in list(sys.modules):
        if name == "simpler" or name.startswith(("simpler.", "simpler_setup")):
            mod = sys.modules[name]
            if not str(getattr(mod, "__file__", "") or "").startswith(COMPAT):
                del sys.modules[name]
    paths = os.environ.get("PYTHONPATH", "")
    if COMPAT not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = COMPAT + (os.pathsep + paths if paths else "")
