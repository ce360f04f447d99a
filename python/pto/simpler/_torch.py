"""simpler_setup's ``torch_interop`` for pto."""

from __future__ import annotations

from typing import Any

from ._types import DataType, Tensor
from ._worker import _TORCH_DTYPES


def torch_dtype_to_datatype(dt: Any) -> DataType:
    code = _TORCH_DTYPES.get(str(dt))
    if code is None or code == 11:
        raise KeyError(f"torch dtype {dt} has no simpler DataType")
    return DataType(code)


def make_tensor_arg(worker: Any, tensor: Any) -> Tensor:
    """A task argument over a CPU, contiguous torch tensor."""
    if str(getattr(tensor, "device", "cpu")) != "cpu":
        raise ValueError(f"make_tensor_arg: the tensor is on {tensor.device}, not the CPU")
    if not tensor.is_contiguous():
        raise ValueError("make_tensor_arg: the tensor is not contiguous")
    try:
        dt = torch_dtype_to_datatype(tensor.dtype)
    except KeyError as e:
        raise ValueError(str(e)) from None
    return worker.make_tensor_arg(tensor, shapes=tuple(tensor.shape), dtype=int(dt.value))
