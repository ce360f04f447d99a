"""pto from Python: drive simulated chips through the host Worker.

A :class:`Worker` forks one process per chip (and per sub-worker). Its buffers are numpy arrays
over shared memory that every chip reads and writes in place. A run takes a Python function
that submits chip programs (every built-in kernel by its name, and the registered programs
listed by :func:`programs`) and sub-worker callables; pto infers the dependencies between them
from the arrays they share, exactly as in Rust::

    import numpy as np
    import pto

    with pto.Worker(chips=2) as w:
        a, b, c = (w.buffer(1024) for _ in range(3))
        a[:] = np.arange(1024)
        b[:] = 1.0
        w.run(lambda h, _: h.submit_chip(1, "vector_add", [pto.IN(a), pto.IN(b), pto.OUT(c)]))
        assert (c == a + 1).all()

Create Workers before the process starts threads (the Worker forks): import ``pto`` before
numpy, or set ``OPENBLAS_NUM_THREADS=1``, so that numpy's BLAS stays single-threaded.
"""

from __future__ import annotations

import os as _os

# numpy's BLAS starts worker threads when it is imported; a process with threads cannot fork
# the Worker's children safely, so ask it for one thread unless the user chose otherwise.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union  # noqa: E402

import numpy as np  # noqa: E402

from . import _native  # noqa: E402
from ._native import CommError, HostOrch, PtoError, SharedBuffer, WorkerError  # noqa: E402

__all__ = [
    "Worker",
    "HostOrch",
    "Comm",
    "IN",
    "OUT",
    "INOUT",
    "NODEP",
    "run_ranks",
    "programs",
    "kernels",
    "PtoError",
    "WorkerError",
    "CommError",
    "SharedBuffer",
]

Arg = Union[Tuple[str, np.ndarray], float, int]


def IN(a: np.ndarray) -> Tuple[str, np.ndarray]:
    """A tensor the task reads (it runs after earlier writers of overlapping bytes)."""
    return ("in", a)


def OUT(a: np.ndarray) -> Tuple[str, np.ndarray]:
    """A tensor the task writes in place (after earlier readers and writers)."""
    return ("out", a)


def INOUT(a: np.ndarray) -> Tuple[str, np.ndarray]:
    """A tensor the task reads and writes."""
    return ("inout", a)


def NODEP(a: np.ndarray) -> Tuple[str, np.ndarray]:
    """A tensor passed without dependency tracking."""
    return ("nodep", a)


def programs() -> List[Tuple[str, str]]:
    """The registered chip programs besides the built-in kernels: ``(name, about)``."""
    return _native.programs()


def kernels() -> List[str]:
    """The built-in kernels; each is also a chip program of the same name."""
    return _native.kernels()


def _dtype_name(d: Any) -> str:
    if isinstance(d, str) and d in ("bf16", "bfloat16"):
        return "bf16"
    return np.dtype(d).name


class Worker:
    """Chips (one process each), optional sub-worker processes, and a communication window.

    Args:
        chips: number of chips (ranks).
        cores: logical ``(AIC, AIV)`` cores per chip.
        sub_workers: sub-worker processes that run the ``subs`` callables.
        buffers: the window's named buffers, ``[(name, dtype, count), ...]``, the same on
            every chip (signals, mailboxes, scratch).
        collectives: staging bytes for the chips' collectives (needed by programs that
            allreduce, such as ``ffn_tp_parallel``).
        comm: give the chips a communicator (default); False for chips that never talk.
        subs: ``{name: callable}`` run on sub-workers by ``HostOrch.submit_sub``; a callable
            gets numpy arrays of the task's tensors, then its scalars.
        timeout: seconds any wait may take before it fails.
    """

    def __init__(
        self,
        chips: int = 1,
        cores: Tuple[int, int] = (1, 2),
        sub_workers: int = 0,
        buffers: Optional[Iterable[Tuple[str, Any, int]]] = None,
        collectives: Optional[int] = None,
        comm: bool = True,
        subs: Optional[Dict[str, Callable[..., Any]]] = None,
        timeout: Optional[float] = None,
    ) -> None:
        specs = [(n, _dtype_name(d), int(c)) for (n, d, c) in (buffers or [])]
        aic, aiv = cores
        try:
            self._w = _native.Worker(
                chips, (int(aic), int(aiv)), sub_workers, specs, collectives, comm, subs, timeout
            )
        except WorkerError as e:
            if "before any thread starts" in str(e):
                raise WorkerError(
                    f"{e}. From Python: create Workers before starting threads, and import pto "
                    "before numpy (or set OPENBLAS_NUM_THREADS=1) so that numpy's BLAS does not "
                    "start threads"
                ) from None
            raise

    @property
    def chips(self) -> int:
        return self._w.chips

    def buffer(self, shape: Union[int, Sequence[int]], dtype: Any = "float32") -> np.ndarray:
        """A zero-filled array in shared memory: chips read and write it in place (no copy).

        Do not touch it while a run uses it.
        """
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        return np.asarray(self._w.buffer(list(shape), _dtype_name(dtype)))

    def run(
        self,
        orch_fn: Callable[[HostOrch, Any], Any],
        args: Any = None,
        trace: Optional[Union[str, "_os.PathLike[str]"]] = None,
    ) -> Dict[str, int]:
        """Calls ``orch_fn(orch, args)``, which submits tasks through ``orch``, then runs them
        to completion (the GIL is released meanwhile). Returns ``{"tasks": n}``. With
        ``trace``, writes a Chrome trace of the host and every chip to that path."""
        return self._w.run(orch_fn, args, None if trace is None else _os.fspath(trace))

    def chip_context(self, chip: int) -> Dict[str, Any]:
        """Chip ``chip``'s rank, size, window bytes and buffers ``(name, dtype, count, offset)``."""
        return self._w.chip_context(chip)

    def close(self) -> None:
        """Stops every child process."""
        self._w.close()

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Comm:
    """One rank of :func:`run_ranks`: rank, size, barrier and collectives over numpy arrays."""

    def __init__(self, native: "_native.Comm") -> None:
        self._c = native

    @property
    def rank(self) -> int:
        return self._c.rank

    @property
    def size(self) -> int:
        return self._c.size

    def barrier(self) -> None:
        self._c.barrier()

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduces ``a`` (float32, float64, int32 or int64) over every rank, in place."""
        flat = np.ascontiguousarray(a)
        out = self._c.allreduce_bytes(flat.tobytes(), flat.dtype.name, op)
        a[...] = np.frombuffer(out, dtype=flat.dtype).reshape(a.shape)
        return a

    def allgather(self, a: np.ndarray) -> np.ndarray:
        """Every rank's ``a``, stacked in rank order: shape ``(size, *a.shape)``."""
        flat = np.ascontiguousarray(a)
        out = self._c.allgather_bytes(flat.tobytes())
        return np.frombuffer(out, dtype=flat.dtype).reshape((self.size,) + a.shape).copy()

    def broadcast(self, a: np.ndarray, root: int = 0) -> np.ndarray:
        """Copies ``root``'s ``a`` into every rank's ``a``, in place."""
        flat = np.ascontiguousarray(a)
        out = self._c.broadcast_bytes(flat.tobytes(), root)
        a[...] = np.frombuffer(out, dtype=flat.dtype).reshape(a.shape)
        return a


def run_ranks(n: int, fn: Callable[[Comm], Any]) -> List[Any]:
    """Runs ``fn(comm)`` on ``n`` ranks (threads of this process; collectives release the GIL)
    and returns their results in rank order; an exception on a rank raises :class:`PtoError`
    naming it."""
    return _native.run_ranks(n, lambda c: fn(Comm(c)))
