"""``simpler.task_interface`` on pto: see :mod:`pto.simpler._types`."""

from pto.simpler._types import (  # noqa: F401
    ArgDirection,
    Buffer,
    CallConfig,
    ChipCallable,
    ChipDomainContext,
    CommBufferSpec,
    CommDomainHandle,
    CoreCallable,
    DataType,
    RuntimeEnv,
    TaskArgs,
    Tensor,
    TensorArgType,
    get_dtype_name,
    get_element_size,
    scalar_to_uint64,
)
