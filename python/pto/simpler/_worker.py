"""simpler's L3 ``Worker`` and orchestrator, on a pto Worker.

``Worker(level=3, device_ids=[...], num_sub_workers=n)`` forks one pto chip process per device
id at ``init()`` (shm backend; with ``PTO_SIMPLER_BACKEND=local`` each chip is a thread of this
process instead); its chips run the bridge's chip program ``simpler``. A run calls
the user's ``orch_fn(orch, args, config)`` on this thread: ``allocate_domain`` allocates at once
(a collective over the members' chips), submits are recorded, and when ``orch_fn`` returns they
run as one pto run, host dependencies inferred from the tensors they share. Host tensors in pto's
shared memory (``create_buffer``) are passed in place; other host tensors (torch or numpy) are
copied into pto's shared memory before the run and back after it, as simpler's simulator copies
them to and from device memory. Domains allocated in a run are freed when it ends.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import shutil
import tempfile
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _build
from ._types import (
    DEVICE,
    HOST,
    READ,
    READWRITE,
    STAGED,
    WINDOW,
    Buffer,
    CallConfig,
    ChipCallable,
    ChipDomainContext,
    CommBufferSpec,
    CommDomainHandle,
    TaskArgs,
    Tensor,
    TensorArgType,
    dtype_code,
    dtype_name,
    get_element_size,
)

__all__ = ["CallableHandle", "Orchestrator", "Worker"]

PLATFORMS = ("a2a3sim", "a5sim")
_PROGRAM = "simpler"
_SUB = "simpler.sub"


def _clusters() -> int:
    raw = os.environ.get("PTO_SIMPLER_CLUSTERS", "8")
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"PTO_SIMPLER_CLUSTERS={raw!r}: an integer from 1 to 64") from None
    if not 1 <= n <= 64:
        raise ValueError(f"PTO_SIMPLER_CLUSTERS={n}: from 1 to 64")
    return n


class CallableHandle:
    """What ``Worker.register`` returns: a chip callable or a sub-worker callable."""

    def __init__(self, kind: str, index: int, target: Any) -> None:
        self.kind = kind
        self.index = index
        self._target = target
        self.hashid = target.identity() if isinstance(target, ChipCallable) else f"sub-{index}"

    def __repr__(self) -> str:
        return f"CallableHandle({self.kind} #{self.index})"


def _storage_of(obj: Any) -> Tuple[int, int, int, Any, Optional[bool], Any]:
    """(storage base, storage bytes, the object's data address, the object to keep, shared?,
    its dtype) of a torch tensor or numpy array."""
    if isinstance(obj, np.ndarray):
        owner = obj
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        base = owner.__array_interface__["data"][0]
        return base, owner.nbytes, obj.__array_interface__["data"][0], owner, True, obj.dtype
    storage = getattr(obj, "untyped_storage", None)
    if storage is None:
        raise TypeError(f"a host tensor must be a torch tensor or a numpy array, not {type(obj).__name__}")
    if getattr(obj, "device", None) is not None and str(obj.device) != "cpu":
        raise ValueError(f"host tensors live on the CPU, not on {obj.device}")
    s = obj.untyped_storage()
    return int(s.data_ptr()), int(s.nbytes()), int(obj.data_ptr()), obj, bool(obj.is_shared()), obj.dtype


_TORCH_DTYPES = {
    "torch.float32": 0, "torch.float16": 1, "torch.int32": 2, "torch.int16": 3, "torch.int8": 4,
    "torch.uint8": 5, "torch.bfloat16": 6, "torch.int64": 7, "torch.uint64": 8, "torch.uint16": 9,
    "torch.uint32": 10, "torch.bool": 11,
}


def _dtype_of_object(dt: Any) -> int:
    key = str(dt)
    if key in _TORCH_DTYPES:
        return _TORCH_DTYPES[key]
    try:
        return dtype_code(np.dtype(dt).name)
    except (TypeError, ValueError):
        raise ValueError(f"dtype {dt} has no simpler DataType") from None


class Worker:
    """simpler's Worker on pto: ``Worker(level=3, platform="a2a3sim", device_ids=[0, 1],
    num_sub_workers=0)``, then ``register``, ``init``, ``run`` (any number of times) and
    ``close``."""

    def __init__(self, level: int = 3, **config: Any) -> None:
        if level != 3:
            raise ValueError(
                f"Worker(level={level}): pto runs simpler's level-3 Workers (chips on one host); "
                "level 2 alone and level 4 (remote hosts) are not supported"
            )
        platform = str(config.get("platform", "a2a3sim"))
        if platform not in PLATFORMS:
            raise ValueError(
                f"platform {platform!r}: pto runs the simulator platforms {', '.join(PLATFORMS)} "
                "(it is a simulator; the hardware platforms need the device)"
            )
        self.level = level
        self.platform = platform
        self.runtime = str(config.get("runtime", "tensormap_and_ringbuffer"))
        ids = config.get("device_ids")
        if ids is None and "device_id" in config:
            ids = [config["device_id"]]
        self.device_ids = [int(d) for d in (ids or [])]
        if len(set(self.device_ids)) != len(self.device_ids):
            raise ValueError(f"device_ids has duplicates: {self.device_ids}")
        self.num_sub_workers = int(config.get("num_sub_workers", 0))
        if self.num_sub_workers < 0:
            raise ValueError("num_sub_workers must be >= 0")
        self._handles: List[CallableHandle] = []
        self._pw: Any = None
        self._closed = False
        self._ids = itertools.count(1)
        self._live_names: Dict[str, CommDomainHandle] = {}
        self._staging: Dict[Tuple[int, int], np.ndarray] = {}
        self._host: List[Buffer] = []
        self._memo: Dict[Tuple[int, int], Buffer] = {}
        self._arena: Optional[np.ndarray] = None
        self._chip_tokens: Dict[int, np.ndarray] = {}
        self._notes = ""

    # -- registration and life cycle ------------------------------------------------------

    def register(self, target: Any, *, workers: Optional[Sequence[int]] = None) -> CallableHandle:
        """A handle to submit ``target`` by: a ChipCallable (for chips) or a Python callable (for
        sub-workers)."""
        if self._pw is not None:
            raise RuntimeError("Worker.register: register callables before init()")
        if isinstance(target, ChipCallable):
            if not self.device_ids:
                raise ValueError("Worker.register: a ChipCallable needs device_ids")
            for h in self._handles:
                if h.kind == "chip" and h.hashid == target.identity():
                    return h
            h = CallableHandle("chip", len(self._handles), target)
        elif callable(target):
            if self.num_sub_workers <= 0:
                raise ValueError("Worker.register: a Python callable needs num_sub_workers > 0")
            h = CallableHandle("sub", len(self._handles), target)
        else:
            raise TypeError(f"Worker.register: a ChipCallable or a callable, not {type(target).__name__}")
        self._handles.append(h)
        return h

    def init(self, prewarm_config: Any = None) -> None:
        """Forks the chips (and sub-workers)."""
        if self._pw is not None:
            raise RuntimeError("Worker.init: already initialised")
        if self._closed:
            raise RuntimeError("Worker.init: the Worker is closed")
        backend = os.environ.get("PTO_SIMPLER_BACKEND", "shm").strip() or "shm"
        if backend not in ("shm", "local"):
            raise ValueError(
                f"PTO_SIMPLER_BACKEND={backend!r}: shm (each chip a forked process, the default) "
                "or local (each chip a thread of this process)"
            )
        import pto

        c = _clusters()
        subs = {_SUB: self._sub_entry} if self.num_sub_workers else None
        # A chip whose compiled code crashes leaves a note here naming what crashed (the chips
        # read the variable when they start: it is set only around the fork).
        self._notes = tempfile.mkdtemp(prefix="pto-simpler-notes-")
        saved = os.environ.get("PTO_SIMPLER_NOTES")
        os.environ["PTO_SIMPLER_NOTES"] = self._notes
        try:
            self._pw = pto.Worker(
                chips=max(1, len(self.device_ids)),
                cores=(c, 2 * c),
                threads=3 * c,
                sub_workers=self.num_sub_workers,
                subs=subs,
                comm=True,
                backend=backend,
            )
        except BaseException:
            shutil.rmtree(self._notes, ignore_errors=True)
            raise
        finally:
            if saved is None:
                os.environ.pop("PTO_SIMPLER_NOTES", None)
            else:
                os.environ["PTO_SIMPLER_NOTES"] = saved

    def close(self) -> None:
        """Ends the chips and sub-workers and frees their shared memory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        pw, self._pw = self._pw, None
        try:
            if pw is not None:
                pw.close()
        finally:
            if self._notes:
                shutil.rmtree(self._notes, ignore_errors=True)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _require(self) -> Any:
        if self._pw is None:
            raise RuntimeError("the Worker is not initialised (call init())" if not self._closed else "the Worker is closed")
        return self._pw

    # -- host memory --------------------------------------------------------------------------

    def create_buffer(self, nbytes: int) -> Buffer:
        """``nbytes`` of host memory every chip maps (pto shared memory): passed to tasks in
        place. ``buffer.shm.buf`` is a writable view of it."""
        pw = self._require()
        if nbytes <= 0:
            raise ValueError(f"create_buffer: nbytes must be positive, not {nbytes}")
        arr = pw.buffer(int(nbytes), "uint8")
        b = Buffer(HOST, int(nbytes), arr.__array_interface__["data"][0], READWRITE, array=arr)
        self._host.append(b)
        return b

    def _host_buffer_at(self, addr: int, nbytes: int) -> Optional[Buffer]:
        for b in self._host:
            if b.base <= addr and addr + nbytes <= b.base + b.nbytes:
                return b
        return None

    def make_tensor_arg(self, tensor: Any, shapes: Optional[Sequence[int]] = None, dtype: Any = None, *, strides: Optional[Sequence[int]] = None) -> Tensor:
        """A task argument naming a host tensor (torch or numpy): in place when it lives in
        memory from ``create_buffer``, else staged (copied in before each run and, when a task
        writes it, back after). A torch tensor that was not ``share_memory_()``'d is read-only,
        as on simpler."""
        base, size, addr, keep, shared, obj_dtype = _storage_of(tensor)
        code = _dtype_of_object(obj_dtype) if dtype is None else dtype_code(dtype)
        if shapes is None:
            shapes = tuple(getattr(tensor, "shape"))
        host = self._host_buffer_at(addr, 1)
        if host is not None:
            return host.tensor(shapes, code, strides, addr - host.base)
        key = (base, size)
        b = self._memo.get(key)
        if b is None:
            b = Buffer(STAGED, size, base, READWRITE if shared else READ, holder=keep)
            self._memo[key] = b
        return b.tensor(shapes, code, strides, addr - base)

    # -- runs --------------------------------------------------------------------------------

    def run(self, fn: Callable[..., Any], args: Any = None, config: Optional[CallConfig] = None) -> None:
        """Calls ``fn(orch, args, config)`` here, then runs what it submitted; raises what
        ``fn`` raised, unchanged, or the run's failure."""
        self._require()
        cfg = config if config is not None else CallConfig()
        orch = Orchestrator(self)
        try:
            fn(orch, args, cfg)
            orch._closed = True
            self._execute(orch._items)
        finally:
            orch._closed = True
            self._free_domains(orch._domains)

    def _control(self, chips: Sequence[int], request: Dict[str, Any], out: Optional[np.ndarray] = None) -> None:
        pw = self._require()
        req = np.frombuffer(json.dumps(request).encode(), dtype=np.uint8)
        arr = pw.buffer(max(1, req.size), "uint8")
        arr[: req.size] = req
        import pto

        a: List[Any] = [pto.IN(arr)]
        if out is not None:
            a.append(pto.OUT(out))
        self._run(pw, lambda h, _: h.submit_group(list(chips), _PROGRAM, a))

    def _allocate_domain(self, name: str, workers: Sequence[int], window_size: int, buffers: Sequence[CommBufferSpec]) -> CommDomainHandle:
        workers = [int(w) for w in workers]
        if not workers:
            raise ValueError("allocate_domain: workers is empty")
        if len(set(workers)) != len(workers):
            raise ValueError(f"allocate_domain: workers has duplicates: {workers}")
        n = max(1, len(self.device_ids))
        for w in workers:
            if not 0 <= w < n:
                raise ValueError(f"allocate_domain: worker {w} is not a chip of this Worker (0 to {n - 1})")
        if window_size <= 0:
            raise ValueError(f"allocate_domain: window_size must be positive, not {window_size}")
        names = [b.name for b in buffers]
        if len(set(names)) != len(names):
            raise ValueError(f"allocate_domain: buffer names repeat: {names}")
        total = sum(int(b.nbytes) for b in buffers)
        if total > window_size:
            raise ValueError(f"allocate_domain: buffers need {total} bytes, more than window_size {window_size}")
        if name in self._live_names:
            raise ValueError(f"allocate_domain: a domain named {name!r} is live")
        ident = next(self._ids)
        rows = self._require().buffer((len(workers), 8), "uint64")
        self._control(
            workers,
            {"op": "alloc_domain", "id": ident, "name": name, "members": workers, "window_size": int(window_size),
             "buffers": [{"name": b.name, "nbytes": int(b.nbytes)} for b in buffers]},
            rows,
        )
        contexts: Dict[int, ChipDomainContext] = {}
        for pos, chip in enumerate(workers):
            row = [int(x) for x in rows[pos]]
            bufs: Dict[str, Buffer] = {}
            off = 0
            for b in buffers:
                bufs[b.name] = Buffer(WINDOW, int(b.nbytes), row[1] + off, READWRITE, chip, domain=ident, window_offset=off)
                off += int(b.nbytes)
            contexts[chip] = ChipDomainContext(name, pos, len(workers), row[0], row[1], int(window_size), bufs)
        h = CommDomainHandle(name, workers, contexts, ident)
        self._live_names[name] = h
        return h

    def _alloc_device(self, worker: int, shapes: Sequence[int], dtype: Any) -> Buffer:
        n = max(1, len(self.device_ids))
        if isinstance(worker, bool) or not isinstance(worker, int) or not 0 <= worker < n:
            raise ValueError(f"alloc_child_tensor: worker_id {worker!r} is not a chip of this Worker (0 to {n - 1})")
        code = dtype_code(dtype)
        count = 1
        for s in shapes:
            if int(s) <= 0:
                raise ValueError(f"alloc_child_tensor: shapes must be positive, not {tuple(shapes)}")
            count *= int(s)
        nbytes = count * get_element_size(code)
        ident = next(self._ids)
        out = self._require().buffer(1, "uint64")
        self._control([worker], {"op": "alloc_device", "id": ident, "nbytes": nbytes}, out)
        # Tasks that use it are ordered by its chip's task order (chip memory is not the host's
        # to see).
        return Buffer(DEVICE, nbytes, int(out[0]), READWRITE, worker, domain=ident)

    def _free_domains(self, domains: List[CommDomainHandle]) -> None:
        errors = []
        for h in domains:
            if h.freed:
                continue
            h.release()
            h._freed = True
            self._live_names.pop(h.name, None)
            if self._pw is not None:
                try:
                    self._control(h.workers, {"op": "free_domain", "id": h.allocation_id})
                except Exception as e:  # noqa: BLE001 - every domain is freed; the first error is raised
                    errors.append(e)
        if errors:
            raise errors[0]

    def _execute(self, items: List[Tuple[str, Any]]) -> None:
        if not items:
            return
        import pto

        pw = self._require()
        staged: Dict[int, Tuple[Buffer, np.ndarray, bool]] = {}
        requests: List[bytes] = []
        plans: List[Tuple[str, Any, List[Tuple[np.ndarray, str]]]] = []

        def host_array(b: Buffer, writes: bool) -> np.ndarray:
            if b.kind == HOST:
                return b._array  # type: ignore[no-any-return]
            key = id(b)
            if key not in staged:
                k = (b.base, b.nbytes)
                arr = self._staging.get(k)
                if arr is None:
                    arr = pw.buffer(b.nbytes, "uint8")
                    self._staging[k] = arr
                staged[key] = (b, arr, writes)
            elif writes:
                staged[key] = (staged[key][0], staged[key][1], True)
            return staged[key][1]

        # A chip runs its tasks one at a time in submission order (simpler's per-worker queue):
        # every chip task takes its chip's order token INOUT. A group is one task per member, so
        # a member that finishes frees its chip while another member still runs.
        def token(chip: int) -> np.ndarray:
            tok = self._chip_tokens.get(chip)
            if tok is None:
                tok = pw.buffer(8, "uint8")
                self._chip_tokens[chip] = tok
            return tok

        for kind, item in items:
            if kind in ("copy_to", "copy_from", "free_device"):
                dev, host_buf = item
                chip = dev.owner_worker_id
                copy: List[Tuple[np.ndarray, str]]
                if kind == "free_device":
                    req: Dict[str, Any] = {"op": "free_device", "id": dev._domain}
                    copy = [(token(chip), "inout")]
                elif kind == "copy_to":
                    req = {"op": "copy_to", "id": dev._domain, "index": 1}
                    copy = [(host_array(host_buf, False), "in"), (token(chip), "inout")]
                else:
                    req = {"op": "copy_from", "id": dev._domain, "index": 1}
                    copy = [(host_array(host_buf, True), "out"), (token(chip), "inout")]
                requests.append(json.dumps(req).encode())
                plans.append(("chip", chip, copy))
                continue
            if kind == "sub":
                handle, args = item
                arrays: List[Tuple[np.ndarray, str]] = []
                metas = []
                for i in range(args.tensor_count() if args is not None else 0):
                    t, tag = args.tensor(i), args.tag(i)
                    if t.buffer.kind in (WINDOW, DEVICE):
                        raise ValueError(f"submit_sub: tensor {i} is chip memory; a sub-worker reads host memory")
                    arr = host_array(t.buffer, tag in _WRITE_TAGS)
                    idx = _merge(arrays, arr, tag)
                    metas.append({"index": idx, "offset": t.byte_offset, "shape": list(t.shapes),
                                  "strides": list(t.strides), "dtype": t.dtype,
                                  "writable": tag in _WRITE_TAGS})
                scalars = [args.scalar(i) for i in range(args.scalar_count())] if args is not None else []
                requests.append(json.dumps({"handle": handle.index, "tensors": metas, "scalars": scalars}).encode())
                plans.append(("sub", None, arrays))
                continue
            handle, members, _group = item
            callable_request = self._callable_request(handle)
            for chip, args in members:
                tensors: List[Dict[str, Any]] = []
                # Host tensors by their array: the bytes this member touches, and how.
                spans: Dict[int, List[Any]] = {}
                for i in range(args.tensor_count()):
                    t, tag = args.tensor(i), args.tag(i)
                    b = t.buffer
                    if not t._row_major:
                        raise ValueError(f"tensor {i}: pto's bridge passes row-major tensors only (strides {t.strides})")
                    if b.kind == WINDOW:
                        if b.owner_worker_id != chip:
                            raise ValueError(
                                f"tensor {i}: a buffer of domain window on chip {b.owner_worker_id}, submitted to chip {chip}"
                            )
                        tensors.append({"kind": "window", "domain": b._domain, "offset": b._window_offset + t.byte_offset,
                                        "shape": list(t.shapes), "dtype": dtype_name(t.dtype)})
                    elif b.kind == DEVICE:
                        if b.owner_worker_id != chip:
                            raise ValueError(
                                f"tensor {i}: chip memory of chip {b.owner_worker_id}, submitted to chip {chip}"
                            )
                        tensors.append({"kind": "device", "id": b._domain, "offset": t.byte_offset,
                                        "shape": list(t.shapes), "dtype": dtype_name(t.dtype)})
                    else:
                        arr = host_array(b, tag in _WRITE_TAGS)
                        start = t.byte_offset
                        end = start + t.nbytes
                        span = spans.setdefault(id(arr), [arr, start, end, []])
                        span[1], span[2] = min(span[1], start), max(span[2], end)
                        span[3].append(tag)
                        tensors.append({"kind": "host", "span": id(arr), "offset": start,
                                        "shape": list(t.shapes), "dtype": dtype_name(t.dtype)})
                # Each member depends on the bytes it touches only (members of a group often
                # write disjoint parts of one host tensor, and must not wait for each other).
                arrays = [(token(chip), "inout")]
                index: Dict[int, Tuple[int, int]] = {}
                for key, (arr, start, end, tags) in spans.items():
                    view = arr.view(np.uint8)[start:end]
                    slot: List[Tuple[np.ndarray, str]] = []
                    for tag in tags:
                        _merge(slot, view, tag)
                    arrays.append(slot[0])
                    # The chip task's tensor 0 is the request itself.
                    index[key] = (len(arrays), start)
                for tdesc in tensors:
                    if tdesc["kind"] == "host":
                        at, start = index[tdesc.pop("span")]
                        tdesc["index"] = at
                        tdesc["offset"] -= start
                scalars = [args.scalar(i) for i in range(args.scalar_count())]
                margs = [{"chip": chip, "tensors": tensors, "scalars": scalars}]
                requests.append(json.dumps({"op": "run", "callable": callable_request, "members": margs}).encode())
                plans.append(("chip", chip, arrays))
        # One arena for every request of the run; each task reads its own slice.
        total = sum(len(r) + 8 for r in requests)
        if self._arena is None or self._arena.size < total:
            self._arena = pw.buffer(max(total, 4096), "uint8")
        arena = self._arena
        arena[:] = 0
        views = []
        at = 0
        for r in requests:
            arena[at : at + len(r)] = np.frombuffer(r, dtype=np.uint8)
            views.append(arena[at : at + len(r) + 1])
            at += len(r) + 8
        for b, arr, _ in staged.values():
            ctypes.memmove(arr.__array_interface__["data"][0], b.base, b.nbytes)

        def orch(h: Any, _: Any) -> None:
            for (kind, chips, arrays), view in zip(plans, views):
                a = [pto.IN(view)] + [_MODES[m](arr) for arr, m in arrays]
                if kind == "sub":
                    h.submit_sub(_SUB, a)
                else:
                    h.submit_chip(chips, _PROGRAM, a)

        self._run(pw, orch)
        for b, arr, writes in staged.values():
            if writes:
                ctypes.memmove(b.base, arr.__array_interface__["data"][0], b.nbytes)

    def _run(self, pw: Any, orch: Callable[[Any, Any], None]) -> None:
        """Runs ``orch`` on the pto Worker; a chip that crashed in compiled code adds its note
        (what crashed: the kernel's source, func_id, callable and task) to the error."""
        import pto

        try:
            pw.run(orch)
        except pto.WorkerError as e:
            notes = self._crash_notes()
            if not notes:
                raise
            raise pto.WorkerError(f"{e}\n" + "\n".join(notes)) from e

    def _crash_notes(self) -> List[str]:
        out: List[str] = []
        if not self._notes or not os.path.isdir(self._notes):
            return out
        for name in sorted(os.listdir(self._notes)):
            path = os.path.join(self._notes, name)
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    out.extend(line.strip() for line in f if line.strip())
                os.unlink(path)
            except OSError:
                continue
        return out

    def _callable_request(self, handle: CallableHandle) -> Dict[str, Any]:
        c: ChipCallable = handle._target
        cached = getattr(handle, "_request", None)
        if cached is not None:
            return cached  # type: ignore[no-any-return]
        req = {
            "name": getattr(c, "name", "") or c.func_name,
            "orchestration": _build.store_binary(c.binary),
            "function": c.func_name,
            "config": c.config_name,
            "source": c.source or _build.source_of(c.binary),
            "kernels": [
                {"func_id": c.child_func_id(i), "path": _build.store_binary(c.child(i).binary),
                 "core": _build.core_type_of(c.child(i).binary), "source": _build.source_of(c.child(i).binary)}
                for i in range(c.child_count)
            ],
        }
        handle._request = req  # type: ignore[attr-defined]
        return req

    def _sub_entry(self, request: np.ndarray, *arrays: Any) -> None:
        """A sub task, in a sub-worker: the registered callable with simpler's mapped args."""
        end = int(np.flatnonzero(request)[-1]) + 1 if request.any() else 0
        r = json.loads(bytes(request[:end]).decode())
        h = self._handles[r["handle"]]
        items = [_MappedArg(arrays[m["index"]], m) for m in r["tensors"]]
        h._target(MappedArgs(items, r["scalars"]))


_WRITE_TAGS = (TensorArgType.OUTPUT, TensorArgType.OUTPUT_EXISTING, TensorArgType.INOUT)


def _modes() -> Dict[str, Callable[[np.ndarray], Any]]:
    import pto

    return {"in": pto.IN, "out": pto.OUT, "inout": pto.INOUT, "nodep": pto.NODEP}


class _Modes(dict):  # type: ignore[type-arg]
    def __missing__(self, key: str) -> Any:
        self.update(_modes())
        return self[key]


_MODES = _Modes()


def _merge(arrays: List[Tuple[np.ndarray, str]], arr: np.ndarray, tag: TensorArgType) -> int:
    """The index of ``arr`` among a task's host tensors (once each), its mode widened by ``tag``."""
    mode = {TensorArgType.INPUT: "in", TensorArgType.OUTPUT_EXISTING: "out", TensorArgType.OUTPUT: "out",
            TensorArgType.INOUT: "inout", TensorArgType.NO_DEP: "nodep"}[TensorArgType(tag)]
    for i, (a, m) in enumerate(arrays):
        if a is arr:
            if m != mode:
                # Untracked beside tracked is tracked; a read beside a write is both.
                other = mode if m == "nodep" else m if mode == "nodep" else "inout"
                arrays[i] = (a, other)
            return i
    arrays.append((arr, mode))
    return len(arrays) - 1


class _MappedArg:
    """One tensor of a sub task: its bytes (from the view's origin), shape, strides and dtype."""

    def __init__(self, array: np.ndarray, meta: Dict[str, Any]) -> None:
        off = int(meta["offset"])
        es = get_element_size(meta["dtype"])
        extent = (1 + sum((s - 1) * t for s, t in zip(meta["shape"], meta["strides"]))) * es
        view = array[off : off + extent]
        self.buffer = view.data if meta["writable"] else view.data.toreadonly()
        self.shapes = tuple(meta["shape"])
        self.strides = tuple(meta["strides"])
        self.dtype = meta["dtype"]


class MappedArgs:
    """A sub task's arguments: a sequence of mapped tensors, and its scalars."""

    def __init__(self, items: List[_MappedArg], scalars: List[int]) -> None:
        self._items = items
        self._scalars = scalars

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i: int) -> _MappedArg:
        return self._items[i]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._items)

    def tensor_count(self) -> int:
        return len(self._items)

    def scalar_count(self) -> int:
        return len(self._scalars)

    def scalar(self, i: int) -> int:
        return self._scalars[i]


class Orchestrator:
    """What ``orch_fn`` receives: submits chip tasks, groups and sub tasks, allocates domains."""

    def __init__(self, worker: Worker) -> None:
        self._w = worker
        self._items: List[Tuple[str, Any]] = []
        self._domains: List[CommDomainHandle] = []
        self._closed = False

    def _open(self) -> None:
        if self._closed:
            raise RuntimeError("the orchestrator is only usable while its orch function runs")

    @staticmethod
    def _chip_handle(handle: Any) -> CallableHandle:
        if isinstance(handle, ChipCallable):
            raise TypeError("submit a CallableHandle (Worker.register's result), not a ChipCallable")
        if not isinstance(handle, CallableHandle) or handle.kind != "chip":
            raise TypeError(f"not a chip callable's handle: {handle!r}")
        return handle

    def _worker_index(self, w: Any, what: str) -> int:
        if isinstance(w, bool) or not isinstance(w, int):
            raise TypeError(f"{what}: a chip index, not {type(w).__name__}")
        n = max(1, len(self._w.device_ids))
        if not 0 <= w < n:
            raise ValueError(f"{what}: worker {w} is not a chip of this Worker (0 to {n - 1})")
        return w

    def submit_next_level(self, handle: Any, args: TaskArgs, config: Any = None, *, worker: int) -> None:
        """One chip task on chip ``worker``."""
        self._open()
        h = self._chip_handle(handle)
        self._items.append(("chip", (h, [(self._worker_index(worker, "submit_next_level"), args)], False)))

    def submit_next_level_group(self, handle: Any, args_list: Sequence[TaskArgs], config: Any = None, *, workers: Sequence[int]) -> None:
        """One task on several chips at once (they start together): ``args_list[i]`` for
        ``workers[i]``."""
        self._open()
        h = self._chip_handle(handle)
        ws = [self._worker_index(w, "submit_next_level_group") for w in workers]
        if len(ws) != len(args_list):
            raise ValueError(f"submit_next_level_group: {len(args_list)} argument sets for {len(ws)} workers")
        if len(set(ws)) != len(ws):
            raise ValueError(f"submit_next_level_group: workers has duplicates: {ws}")
        self._items.append(("chip", (h, list(zip(ws, args_list)), True)))

    def submit_sub(self, handle: Any, args: Optional[TaskArgs] = None) -> None:
        """A task of a registered Python callable on a sub-worker."""
        self._open()
        if not isinstance(handle, CallableHandle) or handle.kind != "sub":
            raise TypeError(f"submit_sub: a sub callable's handle, not {handle!r}")
        self._items.append(("sub", (handle, args)))

    def allocate_domain(self, *, name: str, workers: Sequence[int], window_size: int, buffers: Sequence[CommBufferSpec] = ()) -> CommDomainHandle:
        """Allocates a domain over ``workers`` now (their windows are zeroed); freed when the run
        ends."""
        self._open()
        h = self._w._allocate_domain(name, workers, int(window_size), list(buffers))
        self._domains.append(h)
        return h

    def alloc_child_tensor(self, worker_id: int, shapes: Sequence[int], dtype: Any) -> Buffer:
        """Chip memory on chip ``worker_id`` (zeroed), allocated now; it lives until ``free`` or
        the Worker's close, across runs."""
        self._open()
        return self._w._alloc_device(worker_id, shapes, dtype)

    @staticmethod
    def _host(b: Any, what: str) -> Buffer:
        if not isinstance(b, Buffer) or b.kind not in (HOST, STAGED):
            raise TypeError(f"{what}: the host side must be a Buffer from create_buffer")
        return b

    @staticmethod
    def _device(b: Any, what: str) -> Buffer:
        if not isinstance(b, Buffer) or b.kind != DEVICE:
            raise TypeError(f"{what}: the chip side must be a Buffer from alloc_child_tensor")
        return b

    def copy_to(self, dst: Any, src: Any) -> None:
        """Copies host buffer ``src`` into chip memory ``dst`` (a task on its chip, ordered with
        the tasks that use ``dst``)."""
        self._open()
        d, s = self._device(dst, "copy_to"), self._host(src, "copy_to")
        if s.nbytes > d.nbytes:
            raise ValueError(f"copy_to: {s.nbytes} bytes do not fit chip memory of {d.nbytes}")
        self._items.append(("copy_to", (d, s)))

    def copy_from(self, dst: Any, src: Any) -> None:
        """Copies chip memory ``src`` into host buffer ``dst``."""
        self._open()
        s, d = self._device(src, "copy_from"), self._host(dst, "copy_from")
        if d.nbytes > s.nbytes:
            raise ValueError(f"copy_from: {d.nbytes} bytes are more than chip memory of {s.nbytes}")
        self._items.append(("copy_from", (s, d)))

    def free(self, handle: Any) -> None:
        """Frees chip memory (after the tasks submitted before that use it)."""
        self._open()
        self._items.append(("free_device", (self._device(handle, "free"), None)))
