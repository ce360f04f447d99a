"""``simpler_setup.kernel_compiler`` on pto: see :mod:`pto.simpler._compiler`."""

from pto.simpler._compiler import KernelCompiler  # noqa: F401
