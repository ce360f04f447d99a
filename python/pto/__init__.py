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
import sys as _sys

# numpy's BLAS starts worker threads when it is imported; a process with threads cannot fork
# the Worker's children safely, so ask it for one thread unless the user chose otherwise.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    _os.environ.setdefault(_var, "1")

import operator as _operator  # noqa: E402
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union  # noqa: E402

import numpy as np  # noqa: E402
import weakref as _weakref  # noqa: E402

from . import _native  # noqa: E402
from ._errors import CommError, PtoError, WorkerError  # noqa: E402
from ._native import HostOrch, KernelContext, SharedBuffer  # noqa: E402

#: The package version (the native module's, set from its Cargo.toml: the one source).
__version__: str = _native.__version__

__all__ = [
    "__version__",
    "Worker",
    "HostOrch",
    "Comm",
    "Window",
    "IN",
    "OUT",
    "INOUT",
    "NODEP",
    "run_ranks",
    "programs",
    "kernels",
    "kernel",
    "Kernel",
    "KernelContext",
    "load_plugin",
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


class Kernel:
    """A Python function that runs as a chip kernel (made by :func:`kernel`).

    Give it to ``Worker(kernels=[...])``; ``HostOrch.submit_chip``/``submit_group`` then run it
    by its name, beside the built-in kernels. Calling the object calls the function.
    """

    def __init__(self, fn: Callable[..., Any], core: str = "aiv", name: Optional[str] = None) -> None:
        if not callable(fn):
            raise TypeError(f"pto.kernel: {fn!r} is not callable")
        if core not in ("aic", "aiv", "mix"):
            raise ValueError(f'pto.kernel: core must be "aic", "aiv" or "mix", not {core!r}')
        self.fn = fn
        self.core = core
        self.name = name if name is not None else getattr(fn, "__name__", None)
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("pto.kernel: give the kernel a name (name=...)")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"pto.Kernel({self.name!r}, core={self.core!r})"


def kernel(
    fn: Optional[Callable[..., Any]] = None, *, core: str = "aiv", name: Optional[str] = None
) -> Any:
    """Makes ``fn(ctx, *arrays, *scalars)`` a chip kernel that runs on ``core`` ("aic", "aiv"
    or "mix") cores, named ``name`` (the function's name by default)::

        @pto.kernel(core="aiv")
        def scale(ctx, x, y, factor):
            y[:] = factor * x

    ``ctx`` (a :class:`KernelContext`) gives ``rank``, ``size``, ``block_idx``, ``block_num``,
    ``window(name)`` (a numpy view of this rank's part of a window buffer; with ``check=True``
    taking it counts as a write of the whole buffer by the task) and the one-sided
    operations ``put(rank, buffer, offset_bytes, array)``, ``get(rank, buffer, offset_bytes,
    out)``, ``notify(rank, buffer, offset_bytes, value)``, ``wait_until(buffer, offset_bytes,
    value)`` and ``barrier()``. The arrays are zero-copy views of the task's tensors (read-only
    unless the task writes them; with SPMD blocks, each block gets its rows of what it writes);
    they are valid during the call only. An exception fails the task with its traceback; the
    tasks that consume its outputs are not run; the Worker stays usable.
    """
    if fn is not None:
        return Kernel(fn, core, name)
    return lambda f: Kernel(f, core, name)


def load_plugin(path: Union[str, "_os.PathLike[str]"]) -> Dict[str, Any]:
    """Loads a C plugin (a shared library built against ``pto.h``: see ``pto include-dir``).
    Workers created afterwards run its kernels and programs by name and have its window
    buffers. Returns what it registered: ``{"path", "programs", "kernels", "buffers"}``.
    Raises :class:`PtoError` naming the file and the cause when it cannot be loaded."""
    if not isinstance(path, (str, bytes, _os.PathLike)):
        raise TypeError(f"load_plugin: path must be a path, not {type(path).__name__}")
    text = _os.fsdecode(path)
    if not text or "\0" in text:
        raise ValueError(f"load_plugin: path {text!r} is empty or holds a NUL byte")
    return _native.load_plugin(text)


def _kernel_specs(kernels: Any) -> Any:
    """``kernels`` as ``(name, core, fn)`` tuples; plain callables run on AIV cores."""
    if kernels is None or not isinstance(kernels, (list, tuple)):
        return kernels
    out = []
    for k in kernels:
        if isinstance(k, Kernel):
            out.append((k.name, k.core, k.fn))
        elif callable(k):
            kk = Kernel(k)
            out.append((kk.name, kk.core, kk.fn))
        else:
            out.append(k)
    return out


# pto's short dtype names that numpy reads as another type (its codes count bytes, pto's bits).
_AMBIGUOUS_DTYPES = {"i8": ("int64", "int8"), "u8": ("uint64", "uint8"), "f16": ("float128", "float16")}


def _dtype_name(d: Any, what: str = "dtype") -> Any:
    """numpy's name of dtype ``d`` (a name, a numpy dtype or type); what numpy does not know is
    passed on unchanged, for the native module to accept (pto's names: ``"f32"``, ``"bf16"``)
    or refuse by name. Names that numpy and pto read differently are refused."""
    if isinstance(d, str):
        if d in ("bf16", "bfloat16"):
            return "bf16"
        if d in _AMBIGUOUS_DTYPES:
            numpy_reads, pto_reads = _AMBIGUOUS_DTYPES[d]
            raise ValueError(
                f"{what}: {d!r} is ambiguous: numpy reads it as {numpy_reads}, pto as "
                f"{pto_reads}; write {pto_reads!r} or {numpy_reads!r}"
            )
    if d is None:
        # numpy reads None as float64; pto's default is float32: say which.
        raise TypeError(f"{what}: None is not a dtype (pto's default is 'float32')")
    try:
        dt = np.dtype(d)
    except (TypeError, ValueError):
        return d
    if dt.byteorder not in ("=", "|") and dt.byteorder != ("<" if _sys.byteorder == "little" else ">"):
        raise ValueError(f"{what}: {d!r} is not in this machine's byte order ({_sys.byteorder}-endian)")
    return dt.name


def _buffer_specs(buffers: Any) -> Any:
    """``buffers`` with numpy dtypes turned into names; anything malformed is left for the
    native module to refuse with a message naming it."""
    if buffers is None or not isinstance(buffers, (list, tuple)):
        return buffers
    return [
        (b[0], _dtype_name(b[1], f"buffers[{i}] dtype"), b[2])
        if isinstance(b, (list, tuple)) and len(b) == 3
        else b
        for i, b in enumerate(buffers)
    ]


#: The Workers of this process not closed yet (to say why a second one cannot start).
_OPEN_WORKERS: "_weakref.WeakSet[Any]" = _weakref.WeakSet()


class Worker:
    """Chips (one process each, or one thread each with ``backend="local"``), optional
    sub-workers, and a communication window.

    Args:
        chips: number of chips (ranks), 1 to 1024.
        cores: logical ``(AIC, AIV)`` cores per chip: 0 to 1024 AIC, 0 to 2048 AIV, at least
            one in all.
        sub_workers: sub-worker processes that run the ``subs`` callables, 0 to 1024.
        buffers: the window's named buffers, ``[(name, dtype, count), ...]``, the same on
            every chip (signals, mailboxes, scratch): distinct non-empty names, a numpy or pto
            dtype name, a count of at least 1; at most 1 TiB per chip in all.
        collectives: staging bytes for the chips' collectives (needed by programs that
            allreduce, such as ``ffn_tp_parallel``), at least 1.
        comm: give the chips a communicator (default); False for chips that never talk.
        subs: ``{name: callable}`` run on sub-workers by ``HostOrch.submit_sub``; a callable
            gets numpy arrays of the task's tensors, then its scalars.
        timeout: seconds any wait may take before it fails (above 0, at most 1e9).
        kernels: Python kernels (made by :func:`kernel`) that chip programs may run by name,
            beside the built-in kernels and those of loaded plugins (:func:`load_plugin`).
        check: run every chip under the happens-before checker (``pto check``):
            :meth:`check_report` lists the races between chips' window accesses that no
            notify -> wait, barrier or collective orders. One checked Worker at a time.
        threads: OS threads serving each chip's logical cores, 1 to 1024 (default
            ``PTO_THREADS``, else as many as cores and CPUs allow); one per logical core lets
            every core hold a kernel that waits for a peer, as on the device.
        backend: ``"shm"`` (default): every chip and sub-worker is a forked process over
            shared memory; ``"local"``: they are threads of this process (same results, one
            process to debug, and the process may already have threads; but a crash in a chip
            ends this process, and a chip stuck in a kernel cannot be killed).

    Bad arguments raise :class:`TypeError` (a wrong type) or :class:`ValueError` (out of
    range) naming the argument and what it may be, here and in every method; failures of the
    Worker or of a run raise :class:`WorkerError`.
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
        kernels: Optional[Sequence[Union[Kernel, Callable[..., Any]]]] = None,
        check: bool = False,
        threads: Optional[int] = None,
        backend: str = "shm",
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int)):
            raise TypeError(f"Worker: threads must be an int, not {type(threads).__name__}")
        try:
            self._w = _native.Worker(
                chips,
                cores,
                sub_workers,
                _buffer_specs(buffers),
                collectives,
                comm,
                subs,
                timeout,
                _kernel_specs(kernels),
                check,
                threads,
                backend,
            )
        except WorkerError as e:
            if "before any thread starts" in str(e) and any(
                getattr(o, "_w", None) is not None for o in list(_OPEN_WORKERS)
            ):
                raise WorkerError(
                    "another Worker is open in this process: close it (or leave its with block) "
                    "before creating one (a Worker forks its chips before it starts its threads, "
                    "so one is open at a time)"
                ) from None
            if "before any thread starts" in str(e):
                raise WorkerError(
                    f"{e}. From Python: create Workers before starting threads, and import pto "
                    "before numpy (or set OPENBLAS_NUM_THREADS=1) so that numpy's BLAS does not "
                    "start threads"
                ) from None
            raise
        _OPEN_WORKERS.add(self)

    @property
    def chips(self) -> int:
        return self._w.chips

    def buffer(self, shape: Union[int, Sequence[int]], dtype: Any = "float32") -> np.ndarray:
        """A zero-filled array in shared memory: chips read and write it in place (no copy).

        ``shape`` is an int or a sequence of 1 to 5 ints, each at least 1; ``dtype`` a numpy
        dtype (or its name) that pto supports. Do not touch the array while a run uses it.
        """
        try:
            dims: Any = [_operator.index(shape)]  # type: ignore[arg-type]
        except TypeError:
            # Any iterable of ints (a tuple, a list, an array's shape); anything else is left for
            # the native module to refuse by name.
            iterable = hasattr(shape, "__iter__") and not isinstance(shape, (str, bytes))
            dims = list(shape) if iterable else shape  # type: ignore[arg-type]
        return np.asarray(self._w.buffer(dims, _dtype_name(dtype, "Worker.buffer: dtype")))

    def run(
        self,
        orch_fn: Callable[[HostOrch, Any], Any],
        args: Any = None,
        trace: Optional[Union[str, "_os.PathLike[str]"]] = None,
    ) -> Dict[str, int]:
        """Calls ``orch_fn(orch, args)``, which submits tasks through ``orch``, then runs them
        to completion (the GIL is released meanwhile). Returns ``{"tasks": n}``. With
        ``trace``, writes a Chrome trace of the host and every chip to that path.

        Ctrl-C raises :class:`KeyboardInterrupt` at once: the run is aborted (every child is
        killed) and the Worker cannot run again; closing it (or leaving its ``with`` block)
        reaps the children and removes its shared memory."""
        if trace is not None and not isinstance(trace, (str, bytes, _os.PathLike)):
            raise TypeError(f"trace must be a path (str or os.PathLike), not {type(trace).__name__}")
        return self._w.run(orch_fn, args, None if trace is None else _os.fsdecode(trace))

    def check_report(self) -> Dict[str, Any]:
        """With ``check=True``: ``{"races": [...], "warnings": [...], "accesses": n, "edges": n}``
        for the runs so far; each race names both accesses (rank, task, kernel, operation, buffer
        and byte range) and what would order them."""
        return self._w.check_report()

    def chip_context(self, chip: int) -> Dict[str, Any]:
        """Chip ``chip``'s rank, size, window bytes and buffers ``(name, dtype, count, offset)``."""
        return self._w.chip_context(chip)

    def close(self) -> None:
        """Stops every child process and removes the Worker's shared memory (twice is fine)."""
        w = getattr(self, "_w", None)
        if w is not None:
            try:
                w.close()
            except RuntimeError as e:
                # PyO3's borrow check: a run (this thread's orchestration, or another thread)
                # holds the Worker.
                if "borrow" not in str(e).lower():
                    raise
                raise WorkerError(
                    "the Worker is running (Worker.run has not returned): close it after the "
                    "run returns, not from its orchestration or while another thread runs it"
                ) from None
            _OPEN_WORKERS.discard(self)

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
        """Waits until every rank has called it."""
        self._c.barrier()

    def allreduce(self, a: np.ndarray, op: str = "sum") -> np.ndarray:
        """Reduces ``a`` (float16, bfloat16, float32, float64, int32 or int64) over every rank,
        in place (``a`` must be writable), with ``op`` ("sum", "max", "min" or "prod"). A
        C-contiguous array is reduced where it is, without a copy. Every rank passes the same
        length, dtype and ``op`` (otherwise every rank gets an error naming what each passed).
        bfloat16 is ``ml_dtypes.bfloat16`` (numpy has none of its own)."""
        if self._c.allreduce_array(a, op):  # the fast path: checked natively, no copy
            return a
        _check_array(a, "comm.allreduce: a", writable=True)
        flat = np.ascontiguousarray(a)
        self._c.allreduce_raw(_bytes_of(flat), _reducible(a, "comm.allreduce"), op)
        if flat is not a:
            a[...] = flat
        return a

    def reduce_scatter(self, a: np.ndarray, op: str = "sum", out: Optional[np.ndarray] = None) -> np.ndarray:
        """Reduces ``a`` over every rank with ``op`` and returns this rank's block of the result:
        ``a``'s first dimension splits into ``size`` equal blocks, and rank ``r`` gets block
        ``r`` (shape ``(a.shape[0] // size, *a.shape[1:])``), into ``out`` (writable,
        C-contiguous, that shape and ``a``'s dtype) or a new array. ``a`` may be read-only.
        Every rank passes the same shape, dtype and ``op``."""
        _check_array(a, "comm.reduce_scatter: a", writable=False)
        dtype = _reducible(a, "comm.reduce_scatter")
        if a.ndim == 0 or a.shape[0] % self.size != 0:
            raise ValueError(
                f"comm.reduce_scatter: a's first dimension ({a.shape[0] if a.ndim else 0}) must "
                f"be a multiple of the rank count ({self.size})"
            )
        shape = (a.shape[0] // self.size,) + a.shape[1:]
        out = _out_array(out, shape, a.dtype, "comm.reduce_scatter")
        self._c.reduce_scatter_into(_bytes_of(np.ascontiguousarray(a)), _bytes_of(out), dtype, op)
        return out

    def allgather(self, a: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Every rank's ``a``, stacked in rank order: shape ``(size, *a.shape)``, into ``out``
        (writable, C-contiguous, that shape and ``a``'s dtype) or a new array; ``a`` may be
        read-only. Every rank passes the same number of bytes. No copy through Python."""
        _check_array(a, "comm.allgather: a", writable=False)
        shape = (self.size,) + a.shape
        out = _out_array(out, shape, a.dtype, "comm.allgather")
        self._c.allgather_into(_bytes_of(np.ascontiguousarray(a)), _bytes_of(out))
        return out

    def broadcast(self, a: np.ndarray, root: int = 0) -> np.ndarray:
        """Copies ``root``'s ``a`` into every rank's ``a``, in place (``a`` must be writable on
        every rank but ``root``). Every rank passes the same number of bytes and ``root``."""
        try:
            mine = _operator.index(root) == self.rank
        except TypeError:
            mine = False  # the native module names the bad root
        _check_array(a, "comm.broadcast: a", writable=not mine)
        if a.flags.c_contiguous and a.flags.writeable:
            self._c.broadcast_into(_bytes_of(a), root)
            return a
        flat = np.array(a, order="C")  # a writable copy (a is read-only or strided)
        self._c.broadcast_into(_bytes_of(flat), root)
        if a.flags.writeable:
            a[...] = flat
        return a

    def all_to_all(self, a: np.ndarray) -> np.ndarray:
        """Block ``j`` of ``a`` (its first dimension split into ``size`` equal blocks) goes to
        rank ``j``; returns the blocks received, in rank order, as a new array of ``a``'s
        shape. Every rank passes the same shape."""
        _check_array(a, "comm.all_to_all: a", writable=False)
        if a.ndim == 0 or a.shape[0] % self.size != 0:
            raise ValueError(
                f"comm.all_to_all: a's first dimension ({a.shape[0] if a.ndim else 0}) must be "
                f"a multiple of the rank count ({self.size})"
            )
        out = np.empty_like(a, order="C")
        self._c.all_to_all_into(_bytes_of(np.ascontiguousarray(a)), _bytes_of(out))
        return out

    def window(
        self, name: str, shape: Union[int, Sequence[int]], dtype: Any = "float32", signals: int = 1
    ) -> "Window":
        """Allocates a symmetric window on every rank (every rank calls it with the same
        arguments): a buffer ``name`` of ``shape`` and ``dtype`` per rank, zeroed, plus
        ``signals`` u32 signal words. Returns after every rank's window exists. See
        :class:`Window` for what it offers."""
        if not isinstance(name, str):
            raise TypeError(f"comm.window: name must be a str, not {type(name).__name__}")
        if not name or name == _SIGNALS:
            raise ValueError(f"comm.window: name must be a non-empty str other than {_SIGNALS!r}, not {name!r}")
        def is_int(d: Any) -> bool:
            return isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_))

        if is_int(shape):
            shape_t: Tuple[Any, ...] = (shape,)
        elif isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
            raise TypeError(f"comm.window: shape must be an int or a sequence of ints, not {type(shape).__name__}")
        else:
            shape_t = tuple(shape)
        if any(not is_int(d) for d in shape_t):
            raise TypeError(f"comm.window: shape must be integers, not {shape!r}")
        if any(d < 0 for d in shape_t):
            raise ValueError(f"comm.window: shape must be non-negative integers, not {shape!r}")
        shape_t = tuple(int(d) for d in shape_t)
        count = int(np.prod(shape_t, dtype=np.int64)) if shape_t else 1
        if count == 0:
            raise ValueError(f"comm.window: buffer {name!r} of shape {shape_t} has no elements")
        if not is_int(signals):
            raise TypeError(f"comm.window: signals must be an integer, not {type(signals).__name__}")
        if signals < 0:
            raise ValueError(f"comm.window: signals must be >= 0, not {signals!r}")
        dname = _dtype_name(dtype, "comm.window: dtype")
        specs = [(name, dname, count)]
        if signals:
            specs.append((_SIGNALS, "uint32", int(signals)))
        native = self._c.window(specs)
        view_as = None
        if dname == "bf16":
            try:
                view_as = np.dtype("bfloat16")  # registered by ml_dtypes when it is imported
            except TypeError:
                view_as = None
        return Window(native, self.rank, name, shape_t, int(signals), view_as)


_REDUCIBLE = ("float16", "float32", "float64", "int32", "int64")
_SIGNALS = "__signals"


class Window:
    """A symmetric window of :func:`run_ranks` ranks, from :meth:`Comm.window`: every rank has a
    buffer of the same shape and dtype, and ``signals`` u32 signal words. Offsets count
    elements of the flattened buffer.

    - :attr:`local` and :meth:`view` are numpy views of a rank's buffer, without a copy (any
      rank's: ranks are threads or processes of one host that map each other's memory).
    - :meth:`put` and :meth:`get` copy between numpy arrays and any rank's buffer (one-sided).
    - :meth:`notify` adds to (or sets) a rank's signal after this rank's puts before it are
      visible there; :meth:`wait_until` waits until this rank's signal reaches a value
      (without the GIL, under the job's deadline: a dead or failed peer ends it with an error).

    A put, notify, wait pattern::

        def rank_fn(comm):
            w = comm.window("x", 4, "float32")
            peer = (comm.rank + 1) % comm.size
            w.put(peer, np.full(4, comm.rank, np.float32))
            w.notify(peer)
            w.wait_until(0, 1)
            return w.local.copy()   # the left neighbour's rank, four times
    """

    def __init__(self, native: Any, me: int, name: str, shape: Tuple[int, ...], signals: int, view_as: Any) -> None:
        self._w = native
        self._me = me
        self.name = name
        self.shape = shape
        self.signals = signals
        self._view_as = view_as

    def _view(self, arr: np.ndarray) -> np.ndarray:
        if self._view_as is not None:
            arr = arr.view(self._view_as)
        return arr.reshape(self.shape)

    @property
    def dtype(self) -> np.dtype:
        """The buffer's numpy dtype (bfloat16 shows as uint16 unless ml_dtypes is imported)."""
        return self.local.dtype

    @property
    def local(self) -> np.ndarray:
        """This rank's buffer, as a writable numpy view (no copy)."""
        return self._view(self._w.view(self._me, self.name))

    def view(self, rank: int) -> np.ndarray:
        """Rank ``rank``'s buffer, as a writable numpy view (no copy). Reading or writing a
        peer's buffer races with that peer unless signals or barriers order them."""
        return self._view(self._w.view(rank, self.name))

    def put(self, rank: int, a: Any, offset: int = 0) -> None:
        """Copies ``a`` (converted to the buffer's dtype) into rank ``rank``'s buffer at element
        ``offset``; visible there once a :meth:`notify` after it is seen (or after
        :meth:`quiet` and a barrier)."""
        src = np.ascontiguousarray(a, dtype=self.dtype)
        at = self._byte_offset(offset)
        self._fits("window.put", offset, src.size)
        self._w.put(rank, self.name, at, _bytes_of(src))

    def get(self, rank: int, out: Optional[np.ndarray] = None, offset: int = 0, count: Optional[int] = None) -> np.ndarray:
        """Copies ``count`` elements (default: to the end) of rank ``rank``'s buffer from element
        ``offset`` into ``out`` (writable, C-contiguous, the buffer's dtype) or a new array."""
        if out is None:
            total = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
            n = total - _index(offset, "offset") if count is None else _index(count, "count")
            if n < 0:
                raise ValueError(f"window.get: count {n} is negative")
            out = np.empty(n, dtype=self.dtype)
        else:
            _check_array(out, "window.get: out", writable=True)
            if out.dtype != self.dtype or not out.flags.c_contiguous:
                raise ValueError(f"window.get: out must be a C-contiguous {self.dtype} array, not {out.dtype}")
        at = self._byte_offset(offset)
        self._fits("window.get", offset, out.size)
        self._w.get(rank, self.name, at, _bytes_of(out))
        return out

    def _fits(self, what: str, offset: int, n: int) -> None:
        total = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        if _operator.index(offset) + n > total:
            raise ValueError(
                f"{what}: {n} element(s) at offset {offset} do not fit buffer {self.name!r} of "
                f"{total} element(s)"
            )

    def notify(self, rank: int, signal: int = 0, value: int = 1, op: str = "add") -> None:
        """Adds ``value`` to (``op="add"``) or stores it into (``op="set"``) signal ``signal`` of
        rank ``rank``, after every put of this rank before it is visible there."""
        if op not in ("add", "set"):
            raise ValueError(f'window.notify: op must be "add" or "set", not {op!r}')
        self._w.notify(rank, _SIGNALS, self._signal_offset(signal), _u32(value, "window.notify: value"), op == "add")

    def wait_until(self, signal: int, value: int) -> int:
        """Waits until this rank's signal ``signal`` reaches ``value`` (``>=``, as a wrapping
        u32 difference); returns the value seen. Puts notified before it are visible."""
        return self._w.wait_until(_SIGNALS, self._signal_offset(signal), _u32(value, "window.wait_until: value"))

    def signal(self, signal: int = 0, rank: Optional[int] = None) -> int:
        """The current value of signal ``signal`` of rank ``rank`` (this rank by default)."""
        return self._w.load(self._me if rank is None else rank, _SIGNALS, self._signal_offset(signal))

    def quiet(self) -> None:
        """Completes this rank's puts (visible to every rank)."""
        self._w.quiet()

    def barrier(self) -> None:
        """Waits for every rank of the window (and orders every put before it)."""
        self._w.barrier()

    def _byte_offset(self, offset: int) -> int:
        i = _index(offset, "offset")
        total = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        if not 0 <= i <= total:
            raise ValueError(f"window: offset {i} out of range: the window holds {total} element(s)")
        return i * self.dtype.itemsize

    def _signal_offset(self, signal: int) -> int:
        i = _index(signal, "signal")
        if not 0 <= i < self.signals:
            raise ValueError(f"window: signal {i} out of range: the window has {self.signals} signal(s)")
        return 4 * i

    def __repr__(self) -> str:
        return f"<pto.Window {self.name!r} shape={self.shape} dtype={self.dtype} signals={self.signals}>"


def _index(v: Any, what: str) -> int:
    try:
        return _operator.index(v)
    except TypeError:
        raise TypeError(f"window: {what} must be an integer, not {type(v).__name__}") from None


def _u32(v: Any, what: str) -> int:
    """A signal value: an integer from 0 to 2**32 - 1."""
    try:
        i = _operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an integer, not {type(v).__name__}") from None
    if not 0 <= i < 1 << 32:
        raise ValueError(f"{what} {i} out of range: signals hold 0 to 4294967295")
    return i


def _bytes_of(a: np.ndarray) -> np.ndarray:
    """A C-contiguous array's bytes, as a flat uint8 view (no copy)."""
    return a.reshape(-1).view(np.uint8)


def _reducible(a: np.ndarray, what: str) -> str:
    name = a.dtype.name
    if name in _REDUCIBLE or name == "bfloat16":
        return name
    raise TypeError(f"{what} supports float16, bfloat16, float32, float64, int32 and int64 arrays, not {name}")


def _out_array(out: Optional[np.ndarray], shape: Tuple[int, ...], dtype: np.dtype, what: str) -> np.ndarray:
    if out is None:
        return np.empty(shape, dtype=dtype)
    _check_array(out, f"{what}: out", writable=True)
    if out.shape != shape or out.dtype != dtype or not out.flags.c_contiguous:
        raise ValueError(
            f"{what}: out must be a C-contiguous {dtype} array of shape {shape}, not {out.dtype} {out.shape}"
        )
    return out


def _check_array(a: Any, what: str, writable: bool) -> None:
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{what} must be a numpy array, not {type(a).__name__}")
    if writable and not a.flags.writeable:
        raise ValueError(
            f"{what} is a read-only array (flags.writeable is False), but the result is written "
            "into it: pass a writable array"
        )


def run_ranks(n: int, fn: Callable[[Comm], Any], backend: str = "shm") -> List[Any]:
    """Runs ``fn(comm)`` on ``n`` ranks and returns their results in rank order.

    ``backend="shm"`` (the default) forks one process per rank (1 to 256), so the ranks' Python
    code runs in parallel (each pinned to its own CPU when there are enough; ``PTO_BIND=0`` turns
    that off); results and exceptions come back pickled (a result that cannot be
    pickled is an error naming the rank). ``backend="local"`` runs the ranks as threads of this
    process (collectives release the GIL, Python code takes turns).

    When ranks raise, the first exception (in time) is raised here: the same type, its message
    prefixed ``"rank R: "``, a ``rank`` attribute, the original exception as ``__cause__``, and
    the other ranks' exceptions as notes. A rank that dies (a crash, ``os._exit``) leads, with its
    signal or exit code. The first failure aborts the collectives of every other rank, so none
    waits for its deadline; on processes, ranks still running 2 s after it (busy in their own
    code) are stopped. Ctrl-C raises :class:`KeyboardInterrupt` (on
    processes, after ending every rank)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable (fn(comm)), not {type(fn).__name__}")
    if backend == "local":
        return _native.run_ranks(n, lambda c: fn(Comm(c)))
    if backend != "shm":
        raise ValueError(f'run_ranks: backend must be "shm" or "local", not {backend!r}')
    return _run_ranks_forked(n, fn)


#: Seconds the other ranks get to end once one rank has failed; then they are stopped.
_RANKS_GRACE_S = 2.0


def _exit_words(status: int) -> str:
    """A rank process's wait status in words."""
    if _os.WIFSIGNALED(status):
        sig = _os.WTERMSIG(status)
        try:
            import signal as _signal

            name = _signal.Signals(sig).name
        except (ValueError, ImportError):
            name = f"signal {sig}"
        return f"killed by signal {sig} ({name})"
    return f"exited with code {_os.WEXITSTATUS(status)} without a result"


def _run_ranks_forked(n: int, fn: Callable[[Comm], Any]) -> List[Any]:
    import pickle
    import selectors
    import time

    world = _native.ShmWorld(n)
    pids: List[int] = []
    reads: List[int] = []
    # Per rank: what it sent, when it ended (time.time()), and whether this parent stopped it.
    payloads: Dict[int, bytes] = {}
    ended: Dict[int, float] = {}
    stopped: List[int] = []
    statuses: Dict[int, int] = {}
    try:
        for r in range(n):
            rfd, wfd = _os.pipe()
            pid = _os.fork()
            if pid == 0:  # pragma: no cover (the child ends in os._exit)
                _os.close(rfd)
                _rank_child(world.name, r, n, fn, wfd, pickle)
            _os.close(wfd)
            pids.append(pid)
            reads.append(rfd)
        world.watch(pids)  # after the last fork: it starts a thread
        # Every rank's pipe at once: a rank busy in its own code must not keep the others'
        # results (and a failure) from being seen. Once one rank has failed, the others get
        # _RANKS_GRACE_S to end (their collectives were aborted); the rest are stopped.
        sel = selectors.DefaultSelector()
        chunks: Dict[int, List[bytes]] = {r: [] for r in range(n)}
        for r, fd in enumerate(reads):
            sel.register(fd, selectors.EVENT_READ, r)
        failed_at: Optional[float] = None
        while sel.get_map():
            wait = None if failed_at is None else max(0.0, failed_at + _RANKS_GRACE_S - time.monotonic())
            events = sel.select(wait)
            if not events and failed_at is not None and time.monotonic() >= failed_at + _RANKS_GRACE_S:
                for key in list(sel.get_map().values()):
                    r = key.data
                    stopped.append(r)
                    try:
                        _os.kill(pids[r], 9)
                    except OSError:
                        pass
                    sel.unregister(key.fd)
                break
            for key, _ in events:
                r = key.data
                b = _os.read(key.fd, 1 << 20)
                if b:
                    chunks[r].append(b)
                    continue
                sel.unregister(key.fd)
                ended[r] = time.time()
                payloads[r] = b"".join(chunks[r])
                if failed_at is None and not _sent_ok(payloads[r], pickle):
                    failed_at = time.monotonic()
        sel.close()
        for fd in reads:
            _os.close(fd)
        reads = []
        for r, pid in enumerate(pids):
            statuses[r] = _os.waitpid(pid, 0)[1]
        pids = []
    except BaseException:
        for pid in pids:
            try:
                _os.kill(pid, 9)
                _os.waitpid(pid, 0)
            except OSError:
                pass
        for fd in reads:
            try:
                _os.close(fd)
            except OSError:
                pass
        raise
    finally:
        world.close()
    values: List[Any] = []
    # (order, when, rank, exception): a rank that died on its own leads (the others failed
    # because it did), then exceptions in the order they were raised, then the ranks stopped.
    failures: List[Tuple[int, float, int, BaseException]] = []
    for r in range(n):
        if r in stopped:
            failures.append((2, 0.0, r, PtoError(
                f"rank {r} was still running {_RANKS_GRACE_S:g} s after another rank failed: stopped"
            )))
            continue
        data = payloads.get(r, b"")
        try:
            kind, value, when = pickle.loads(data)
        except Exception:
            words = _exit_words(statuses.get(r, 0))
            failures.append((0, ended.get(r, 0.0), r, PtoError(f"died: {words}")))
            continue
        if kind == "ok":
            values.append(value)
        else:
            failures.append((1, when, r, value))
    if not failures:
        return values
    failures.sort(key=lambda f: (f[0], f[1], f[2]))
    from ._errors import _rank_error

    raise _rank_error([(r, e) for _, _, r, e in failures], n)


def _sent_ok(data: bytes, pickle: Any) -> bool:
    """Whether a rank's pipe carried a result (not an exception, not nothing)."""
    try:
        return bool(pickle.loads(data)[0] == "ok")
    except Exception:
        return False


def _text_of(e: BaseException) -> str:
    try:
        return str(e)
    except Exception:
        return "<exception str() failed>"


def _bind(rank: int, n: int) -> None:
    """Pins forked rank ``rank`` to one CPU of this process's affinity set (rank r to the r-th),
    as MPI launchers do, when there are at least ``n`` of them: two ranks that share a CPU wait
    for each other's time slice. ``PTO_BIND=0`` leaves the ranks unpinned."""
    if _os.environ.get("PTO_BIND", "1").strip() == "0" or not hasattr(_os, "sched_getaffinity"):
        return
    try:
        cpus = sorted(_os.sched_getaffinity(0))
        if n <= len(cpus):
            _os.sched_setaffinity(0, {cpus[rank]})
    except OSError:
        pass  # a sandbox that refuses it: the ranks run unpinned


def _rank_child(name: str, rank: int, n: int, fn: Callable[[Comm], Any], wfd: int, pickle: Any) -> None:
    import time

    code = 0
    native = None
    _bind(rank, n)
    try:
        native = _native.join_world(name, rank, n)
        result: Any = ("ok", fn(Comm(native)), 0.0)
    except BaseException as e:  # noqa: BLE001 (every failure goes back to the parent)
        import traceback

        code = 1
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        if hasattr(e, "add_note"):
            e.add_note(tb)  # the traceback object does not cross the process; its text does
        result = ("err", e, time.time())
        if native is not None:
            native.abort(f"{type(e).__name__}: {_text_of(e)}")
    try:
        data = pickle.dumps(result)
    except Exception as pe:
        code = 1
        if result[0] == "err":
            raised = result[1]
            err = PtoError(
                f"{type(raised).__name__}: {_text_of(raised)} (the exception cannot be pickled: {pe})"
            )
        else:
            err = PtoError(f"the result cannot be pickled: {pe}")
        data = pickle.dumps(("err", err, time.time()))
    try:
        with _os.fdopen(wfd, "wb") as f:
            f.write(data)
    finally:
        if native is not None and code == 0:
            # os._exit runs no destructor: say so, or a peer still waiting for this rank
            # would call it dead.
            native.leave()
        _os._exit(code)
