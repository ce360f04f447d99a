"""pto's stand-in for simpler's Python package (``python -m pto.simpler`` puts it first on the
import path): the names simpler's drivers import, implemented on pto (``pto.simpler``)."""

from pto.simpler._types import *  # noqa: F401,F403
