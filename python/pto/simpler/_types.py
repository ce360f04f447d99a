"""The argument and callable types simpler's drivers use (``simpler.task_interface``), for pto.

Written for pto from the interface's names and semantics: enums with simpler's wire values,
``TaskArgs`` (tensors before scalars, access checked), ``CallConfig`` and ``RuntimeEnv``,
``CoreCallable``/``ChipCallable`` (a compiled binary and its children by func_id),
``CommBufferSpec``, domain contexts and handles, and the host-side ``Buffer``/``Tensor`` a task
argument names.
"""

from __future__ import annotations

import ctypes
import enum
import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

__all__ = [
    "ArgDirection",
    "Buffer",
    "CallConfig",
    "ChipCallable",
    "ChipDomainContext",
    "CommBufferSpec",
    "CommDomainHandle",
    "CoreCallable",
    "DataType",
    "RuntimeEnv",
    "TaskArgs",
    "Tensor",
    "TensorArgType",
    "get_dtype_name",
    "get_element_size",
    "scalar_to_uint64",
]


class DataType(enum.IntEnum):
    """Element types (the byte a tensor descriptor carries)."""

    FLOAT32 = 0
    FLOAT16 = 1
    INT32 = 2
    INT16 = 3
    INT8 = 4
    UINT8 = 5
    BFLOAT16 = 6
    INT64 = 7
    UINT64 = 8
    UINT16 = 9
    UINT32 = 10
    FP8E4M3FN = 12
    FP8E8M0 = 13
    FP4E2M1 = 14


_SIZES = {0: 4, 1: 2, 2: 4, 3: 2, 4: 1, 5: 1, 6: 2, 7: 8, 8: 8, 9: 2, 10: 4, 11: 1, 12: 1, 13: 1, 14: 1}
_NAMES = {
    "float32": 0, "float16": 1, "int32": 2, "int16": 3, "int8": 4, "uint8": 5, "bfloat16": 6,
    "int64": 7, "uint64": 8, "uint16": 9, "uint32": 10, "bool": 11,
}


def get_element_size(dtype: Union[DataType, int]) -> int:
    return _SIZES.get(int(dtype), 0)


def get_dtype_name(dtype: Union[DataType, int]) -> str:
    try:
        return DataType(int(dtype)).name
    except ValueError:
        return "BOOL" if int(dtype) == 11 else "UNKNOWN"


def dtype_code(dtype: Any) -> int:
    """A DataType, its int value, or a dtype name ("float32") as the wire value."""
    if isinstance(dtype, str):
        code = _NAMES.get(dtype.lower())
        if code is None:
            raise ValueError(f"unknown dtype {dtype!r}")
        return code
    if isinstance(dtype, bool) or not isinstance(dtype, int):
        raise TypeError(f"dtype must be a DataType, an int or a name, not {type(dtype).__name__}")
    if int(dtype) not in _SIZES:
        raise ValueError(f"unknown DataType value {int(dtype)}")
    return int(dtype)


def dtype_name(code: int) -> str:
    """The lower-case name pto's chips read ("float32")."""
    for n, c in _NAMES.items():
        if c == code:
            return n
    if code in (12, 13, 14):
        return "uint8"
    raise ValueError(f"unknown DataType value {code}")


class TensorArgType(enum.IntEnum):
    """How a task uses a tensor argument."""

    INPUT = 0
    OUTPUT = 1
    INOUT = 2
    OUTPUT_EXISTING = 3
    NO_DEP = 4


class ArgDirection(enum.IntEnum):
    """A callable's signature entries."""

    SCALAR = 0
    IN = 1
    OUT = 2
    INOUT = 3


def scalar_to_uint64(value: Any) -> int:
    """A scalar argument's 64-bit pattern: a Python float as its single-precision bits, a ctypes
    float or double bit for bit, any other value as an integer (two's complement, 64 bits)."""
    if isinstance(value, ctypes.c_float):
        return struct.unpack("<I", struct.pack("<f", value.value))[0]
    if isinstance(value, ctypes.c_double):
        return struct.unpack("<Q", struct.pack("<d", value.value))[0]
    if isinstance(value, ctypes._SimpleCData):  # type: ignore[attr-defined]
        return int(value.value) & 0xFFFFFFFFFFFFFFFF
    if isinstance(value, float):
        return struct.unpack("<I", struct.pack("<f", value))[0]
    return int(value) & 0xFFFFFFFFFFFFFFFF


# Buffer kinds: memory every chip maps (pto shared memory), a host tensor pto stages around each
# run, a domain window on one chip, memory a chip allocated.
HOST, STAGED, WINDOW, DEVICE = "host", "staged", "window", "device"
READ, WRITE, READWRITE = "READ", "WRITE", "READWRITE"


class _Shm:
    """What ``Buffer.shm`` offers: ``buf``, a writable view of the bytes."""

    def __init__(self, buf: memoryview, name: str) -> None:
        self.buf = buf
        self.name = name

    def close(self) -> None:
        pass

    def unlink(self) -> None:
        pass


class Buffer:
    """One allocation a task argument can name: its base address, size, access and owner."""

    def __init__(
        self,
        kind: str,
        nbytes: int,
        base: int,
        access: str = READWRITE,
        owner_worker_id: Optional[int] = None,
        *,
        array: Any = None,
        holder: Any = None,
        domain: Optional[int] = None,
        window_offset: int = 0,
    ) -> None:
        self.kind = kind
        self.nbytes = int(nbytes)
        self.base = int(base)
        self.access = access
        self.owner_worker_id = owner_worker_id
        self.address_space = "DEVICE" if kind in (WINDOW, DEVICE) else "HOST"
        # HOST: the pto shared array (uint8); STAGED: the object owning the memory.
        self._array = array
        self._holder = holder
        self._domain = domain
        self._window_offset = window_offset
        self.shm = _Shm(memoryview(array).cast("B"), f"pto-buffer-{base:#x}") if array is not None else None
        self.closed = False

    def tensor(
        self,
        shapes: Sequence[int],
        dtype: Any,
        strides: Optional[Sequence[int]] = None,
        byte_offset: int = 0,
    ) -> "Tensor":
        """A row-major view (or one with ``strides`` in elements) at ``byte_offset``."""
        return Tensor(self, int(byte_offset), tuple(int(s) for s in shapes), strides, dtype_code(dtype))

    def close(self) -> None:
        self.closed = True

    def __repr__(self) -> str:
        return f"Buffer({self.kind}, {self.nbytes} bytes at {self.base:#x}, {self.access})"


class Tensor:
    """A task argument: a view of a buffer (no address of its own)."""

    def __init__(
        self,
        buffer: Buffer,
        byte_offset: int,
        shapes: Tuple[int, ...],
        strides: Optional[Sequence[int]],
        dtype: int,
    ) -> None:
        es = get_element_size(dtype)
        if not 1 <= len(shapes) <= 5:
            raise ValueError(f"a tensor has 1 to 5 dimensions, not {len(shapes)}")
        if any(s <= 0 for s in shapes):
            raise ValueError(f"tensor shapes must be positive, not {shapes}")
        row = []
        acc = 1
        for s in reversed(shapes):
            row.append(acc)
            acc *= s
        row.reverse()
        st = tuple(int(s) for s in strides) if strides is not None else tuple(row)
        if len(st) != len(shapes) or any(s <= 0 for s in st):
            raise ValueError(f"tensor strides must be positive, one per dimension, not {strides}")
        if es == 0 or byte_offset < 0 or byte_offset % es:
            raise ValueError(f"byte_offset {byte_offset} is not a multiple of the element size {es}")
        extent = 1 + sum((s - 1) * t for s, t in zip(shapes, st))
        if byte_offset + extent * es > buffer.nbytes:
            raise ValueError(
                f"a tensor of shape {shapes} at byte {byte_offset} does not fit its buffer of {buffer.nbytes} bytes"
            )
        self.buffer = buffer
        self.byte_offset = byte_offset
        self.shapes = shapes
        self.strides = st
        self.dtype = dtype
        self._row_major = st == tuple(row)

    @property
    def nbytes(self) -> int:
        return (1 + sum((s - 1) * t for s, t in zip(self.shapes, self.strides))) * get_element_size(self.dtype)

    def __repr__(self) -> str:
        return f"Tensor({get_dtype_name(self.dtype)}{list(self.shapes)} at +{self.byte_offset} of {self.buffer!r})"


_WRITES = (TensorArgType.OUTPUT, TensorArgType.OUTPUT_EXISTING, TensorArgType.INOUT)


class TaskArgs:
    """A task's arguments: tagged tensors, then 64-bit scalars."""

    def __init__(self) -> None:
        self._tensors: List[Tensor] = []
        self._tags: List[TensorArgType] = []
        self._scalars: List[int] = []

    def add_tensor(self, t: Tensor, tag: TensorArgType = TensorArgType.INPUT) -> None:
        if self._scalars:
            raise RuntimeError("TaskArgs: cannot add a tensor after a scalar")
        if not isinstance(t, Tensor):
            raise TypeError(f"TaskArgs.add_tensor: a Tensor (from make_tensor_arg or a buffer), not {type(t).__name__}")
        tag = TensorArgType(tag)
        if tag == TensorArgType.OUTPUT:
            raise ValueError("TaskArgs.add_tensor: OUTPUT tensors are allocated by an orchestration; use OUTPUT_EXISTING")
        acc = t.buffer.access
        if tag in _WRITES and acc == READ:
            raise ValueError(
                f"TaskArgs.add_tensor: {tag.name} needs a writable buffer; this one is read-only "
                "(a host tensor must be share_memory_()'d before the Worker's init to be written)"
            )
        if tag in (TensorArgType.INPUT, TensorArgType.INOUT) and acc == WRITE:
            raise ValueError(f"TaskArgs.add_tensor: {tag.name} needs a readable buffer; this one is write-only")
        self._tensors.append(t)
        self._tags.append(tag)

    def add_scalar(self, s: Any) -> None:
        v = scalar_to_uint64(s) if not isinstance(s, int) or isinstance(s, bool) else int(s)
        if not 0 <= v < 2**64:
            v &= 0xFFFFFFFFFFFFFFFF
        self._scalars.append(v)

    def tensor(self, i: int) -> Tensor:
        return self._tensors[i]

    def scalar(self, i: int) -> int:
        return self._scalars[i]

    def tag(self, i: int) -> TensorArgType:
        return self._tags[i]

    def set_tag(self, i: int, tag: TensorArgType) -> None:
        self._tags[i] = TensorArgType(tag)

    def tensor_count(self) -> int:
        return len(self._tensors)

    def scalar_count(self) -> int:
        return len(self._scalars)

    def clear(self) -> None:
        self._tensors.clear()
        self._tags.clear()
        self._scalars.clear()

    def __len__(self) -> int:
        return len(self._tensors) + len(self._scalars)


_RINGS = 4


class RuntimeEnv:
    """Per-ring sizes (each an int for every ring, or a list of four); 0 keeps the default."""

    def __init__(self) -> None:
        self._v: Dict[str, List[int]] = {k: [0] * _RINGS for k in ("ring_task_window", "ring_heap", "ring_dep_pool")}

    def _set(self, key: str, value: Union[int, Sequence[int]]) -> None:
        vals = [int(value)] * _RINGS if isinstance(value, int) else [int(v) for v in value]
        if len(vals) != _RINGS:
            raise ValueError(f"{key}: an int or a list of {_RINGS}, not {value!r}")
        for v in vals:
            if key == "ring_task_window" and v and (v < 4 or v & (v - 1)):
                raise ValueError(f"ring_task_window: 0 or a power of two of at least 4, not {v}")
            if key == "ring_heap" and v and v < 1024:
                raise ValueError(f"ring_heap: 0 or at least 1024, not {v}")
            if key == "ring_dep_pool" and v and v < 4:
                raise ValueError(f"ring_dep_pool: 0 or at least 4, not {v}")
        self._v[key] = vals

    def __getattr__(self, key: str) -> List[int]:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return list(self._v[key])
        except KeyError:
            raise AttributeError(f"RuntimeEnv has no field {key!r}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        if key.startswith("_"):
            object.__setattr__(self, key, value)
        elif key in self._v:
            self._set(key, value)
        else:
            raise AttributeError(f"RuntimeEnv has no field {key!r}")

    def validate(self) -> None:
        pass

    def __repr__(self) -> str:
        return "RuntimeEnv(" + ", ".join(f"{k}={v}" for k, v in self._v.items()) + ")"


class CallConfig:
    """A run's configuration. pto honours the ring sizes it can (``PTO_RING_*`` apply to its
    chips); the diagnostics options are accepted and recorded."""

    def __init__(self) -> None:
        self.aicpu_thread_num = 0
        self.enable_chip_swimlane = 0
        self.enable_dump_args = 0
        self.enable_pmu = 0
        self.enable_dep_gen = False
        self.enable_scope_stats = False
        self.output_prefix = ""
        self._runtime_env = RuntimeEnv()

    @property
    def runtime_env(self) -> RuntimeEnv:
        return self._runtime_env

    @runtime_env.setter
    def runtime_env(self, env: RuntimeEnv) -> None:
        if not isinstance(env, RuntimeEnv):
            raise TypeError("runtime_env must be a RuntimeEnv")
        self._runtime_env = env

    def validate(self) -> None:
        on = any(
            [self.enable_chip_swimlane, self.enable_dump_args, self.enable_pmu, self.enable_dep_gen, self.enable_scope_stats]
        )
        if on and not self.output_prefix:
            raise ValueError("CallConfig: a diagnostics option is on but output_prefix is empty")


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


class _Callable:
    """What both callables answer: their signature and the size of their binary."""

    _signature: List[ArgDirection]
    binary: bytes

    def sig(self, i: int) -> ArgDirection:
        return self._signature[i]

    @property
    def sig_count(self) -> int:
        return len(self._signature)

    @property
    def binary_size(self) -> int:
        return len(self.binary)


class CoreCallable(_Callable):
    """A compiled kernel and its signature."""

    def __init__(self, signature: Sequence[ArgDirection], binary: bytes) -> None:
        self._signature = [ArgDirection(int(s)) for s in signature]
        self.binary = bytes(binary)

    @classmethod
    def build(cls, signature: Sequence[ArgDirection], binary: bytes) -> "CoreCallable":
        if not isinstance(binary, (bytes, bytearray, memoryview)) or len(binary) == 0:
            raise ValueError("CoreCallable.build: binary must be the kernel's non-empty shared-library bytes")
        return cls(signature, bytes(binary))

    # pto knows a kernel's core type from the compile (the source's include of core type is the
    # driver's choice): KernelCompiler records it.
    core_type: str = "aiv"
    source: str = ""


class ChipCallable(_Callable):
    """A compiled orchestration (entry and optional config function names) and its kernels by
    func_id."""

    def __init__(
        self,
        signature: Sequence[ArgDirection],
        func_name: str,
        binary: bytes,
        children: Sequence[Tuple[int, CoreCallable]],
        config_name: str = "",
    ) -> None:
        self._signature = [ArgDirection(int(s)) for s in signature]
        self.func_name = str(func_name)
        self.config_name = str(config_name or "")
        self.binary = bytes(binary)
        self._children: List[Tuple[int, CoreCallable]] = []
        seen = set()
        for fid, c in children:
            if not isinstance(c, CoreCallable):
                raise TypeError(f"ChipCallable.build: child {fid} is not a CoreCallable")
            if int(fid) in seen:
                raise ValueError(f"ChipCallable.build: func_id {fid} appears twice")
            seen.add(int(fid))
            self._children.append((int(fid), c))
        self.source = ""

    @classmethod
    def build(
        cls,
        signature: Sequence[ArgDirection],
        func_name: str,
        binary: bytes,
        children: Sequence[Tuple[int, CoreCallable]],
        config_name: str = "",
    ) -> "ChipCallable":
        if not func_name:
            raise ValueError("ChipCallable.build: func_name names the orchestration's entry function")
        if not isinstance(binary, (bytes, bytearray, memoryview)) or len(binary) == 0:
            raise ValueError("ChipCallable.build: binary must be the orchestration's shared-library bytes")
        return cls(signature, func_name, bytes(binary), list(children), config_name)

    @property
    def child_count(self) -> int:
        return len(self._children)

    def child_func_id(self, i: int) -> int:
        return self._children[i][0]

    def child(self, i: int) -> CoreCallable:
        return self._children[i][1]

    def identity(self) -> str:
        h = hashlib.sha256(self.binary)
        h.update(self.func_name.encode() + b"\0" + self.config_name.encode())
        for fid, c in self._children:
            h.update(str(fid).encode() + b"\0" + c.binary)
        return h.hexdigest()[:16]


@dataclass
class CommBufferSpec:
    """A named buffer of a domain's window (carved in order, ``nbytes`` each)."""

    name: str
    dtype: str = "float32"
    count: int = 0
    nbytes: int = 0
    load_from_host: bool = False
    store_to_host: bool = False


@dataclass
class ChipDomainContext:
    """One member's view of a domain."""

    name: str
    domain_rank: int
    domain_size: int
    device_ctx: int
    local_window_base: int
    actual_window_size: int
    buffers: Dict[str, Buffer] = field(default_factory=dict)


class CommDomainHandle:
    """A domain allocated in a run: ``handle[chip]`` is that member's context. Released at
    ``with``-exit or ``release()``; freed when the run ends (a domain never outlives its run)."""

    def __init__(self, name: str, workers: Iterable[int], contexts: Dict[int, ChipDomainContext], allocation_id: int) -> None:
        self.name = name
        self.workers = tuple(workers)
        self.contexts = contexts
        self.allocation_id = allocation_id
        self._released = False
        self._freed = False

    def __getitem__(self, worker: int) -> ChipDomainContext:
        if self._released:
            raise RuntimeError(f"domain {self.name!r} was released")
        return self.contexts[worker]

    def release(self) -> None:
        self._released = True

    @property
    def released(self) -> bool:
        return self._released

    @property
    def freed(self) -> bool:
        return self._freed

    def __enter__(self) -> "CommDomainHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()
