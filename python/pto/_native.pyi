"""Type stubs of pto's native module (checked against it by `python -m mypy.stubtest pto._native`)."""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, final

from ._errors import CommError as CommError
from ._errors import PtoError as PtoError
from ._errors import WorkerError as WorkerError

__all__ = [
    "__version__",
    "PtoError",
    "WorkerError",
    "CommError",
    "Worker",
    "SharedBuffer",
    "HostOrch",
    "Comm",
    "run_ranks",
    "programs",
    "kernels",
]

#: The package version (the crate's, from its Cargo.toml).
__version__: str

@final
class SharedBuffer:
    @property
    def shape(self) -> List[int]: ...
    @property
    def dtype(self) -> str: ...
    @property
    def addr(self) -> int: ...
    @property
    def __array_interface__(self) -> Dict[str, Any]: ...

@final
class HostOrch:
    def submit_chip(self, chip: int, program: str, args: Optional[Sequence[Any]] = None) -> None: ...
    def submit_group(
        self, chips: Sequence[int], program: str, args: Optional[Sequence[Any]] = None
    ) -> None: ...
    def submit_sub(self, name: str, args: Optional[Sequence[Any]] = None) -> None: ...

@final
class Worker:
    def __new__(
        cls,
        chips: int = 1,
        cores: Tuple[int, int] = ...,
        sub_workers: int = 0,
        buffers: Optional[Sequence[Tuple[str, str, int]]] = None,
        collectives: Optional[int] = None,
        comm: bool = True,
        subs: Optional[Dict[str, Callable[..., Any]]] = None,
        timeout: Optional[float] = None,
    ) -> Worker: ...
    @property
    def chips(self) -> int: ...
    def buffer(self, shape: Sequence[int], dtype_name: str) -> SharedBuffer: ...
    def run(
        self,
        orch_fn: Callable[[HostOrch, Any], Any],
        args: Any = None,
        trace: Optional[str] = None,
    ) -> Dict[str, int]: ...
    def chip_context(self, i: int) -> Dict[str, Any]: ...
    def close(self) -> None: ...

@final
class Comm:
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    def barrier(self) -> None: ...
    def allreduce_bytes(self, data: bytes, dtype_name: str, op: str) -> bytes: ...
    def allgather_bytes(self, data: bytes) -> bytes: ...
    def broadcast_bytes(self, data: bytes, root: int) -> bytes: ...

def run_ranks(n: int, f: Callable[[Comm], Any]) -> List[Any]: ...
def programs() -> List[Tuple[str, str]]: ...
def kernels() -> List[str]: ...
