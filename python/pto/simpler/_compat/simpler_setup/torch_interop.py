"""``simpler_setup.torch_interop`` on pto: see :mod:`pto.simpler._torch`."""

from pto.simpler._torch import make_tensor_arg, torch_dtype_to_datatype  # noqa: F401
