"""``simpler_setup.pto_isa`` on pto: the user's pto-isa checkout, from ``PTO_ISA_ROOT``."""

from __future__ import annotations

import os


def ensure_pto_isa_root(verbose: bool = False) -> str:
    """The absolute path of the pto-isa checkout ``PTO_ISA_ROOT`` names (pto never downloads
    it). Raises :class:`OSError` saying what to set when it is unset or not a pto-isa."""
    root = os.environ.get("PTO_ISA_ROOT", "")
    if not root:
        raise OSError(
            "PTO_ISA_ROOT is not set: point it at a checkout of pto-isa (the commit your simpler "
            "pins in pto_isa.pin), e.g. export PTO_ISA_ROOT=/path/to/pto-isa"
        )
    marker = os.path.join(root, "include", "pto", "pto-inst.hpp")
    if not os.path.isfile(marker):
        raise OSError(f"PTO_ISA_ROOT={root} is not a pto-isa checkout: {marker} does not exist")
    return os.path.abspath(root)
