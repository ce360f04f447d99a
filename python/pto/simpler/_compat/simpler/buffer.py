"""``simpler.buffer`` on pto."""

from pto.simpler._types import Buffer, Tensor  # noqa: F401
