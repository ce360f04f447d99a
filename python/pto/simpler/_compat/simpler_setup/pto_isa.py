"""``simpler_setup.pto_isa`` on pto: the user's pto-isa checkout, from ``PTO_ISA_ROOT`` (pto never
downloads it)."""

from pto.simpler._build import ensure_pto_isa_root  # noqa: F401
