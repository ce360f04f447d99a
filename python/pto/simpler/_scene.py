"""simpler's scene tests on pto: ``@scene_test``, ``SceneTestCase`` and their helpers, as the
worker scene tests use them (level 3: chips of one host).

A case runs as on simpler: ``generate_args(params)`` builds the arguments; a clone of them gets
``compute_golden``; every host tensor is rehosted into memory from the Worker's
``create_buffer`` (pto shared memory: chips read and write it in place); the class's
orchestration function runs (``CALLABLE["orchestration"](orch, callables, args, config)``) in
``worker.run``; then every tensor is compared with its golden (``torch.allclose`` at the class's
``RTOL``/``ATOL``).
"""

from __future__ import annotations

import copy
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional

__all__ = [
    "CallableNamespace",
    "Scalar",
    "SceneTestCase",
    "TaskArgsBuilder",
    "TensorArg",
    "compile_callable",
    "scene_test",
]


class TensorArg(NamedTuple):
    name: str
    value: Any


class Scalar(NamedTuple):
    name: str
    value: Any


class CallableNamespace:
    """Attribute access to a run's callables by name."""

    def __init__(self, entries: Dict[str, Any]) -> None:
        self._entries = dict(entries)
        self._keepalive: List[Any] = []

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._entries[name]
        except KeyError:
            raise AttributeError(f"CallableNamespace has no entry {name!r}") from None

    def keep(self, *objs: Any) -> None:
        self._keepalive.extend(objs)


def _is_tensor(v: Any) -> bool:
    return hasattr(v, "data_ptr") or hasattr(v, "__array_interface__")


class TaskArgsBuilder:
    """Named tensors then scalars, in order; ``builder.<name>`` is the value."""

    _RESERVED = {"specs", "clone", "tensor_names", "add_tensor", "add_scalar"}

    def __init__(self, *specs: Any) -> None:
        object.__setattr__(self, "_specs", [])
        object.__setattr__(self, "_rehost_handles", {})
        for s in specs:
            if isinstance(s, TensorArg):
                self.add_tensor(s.name, s.value)
            elif isinstance(s, Scalar):
                self.add_scalar(s.name, s.value)
            else:
                raise TypeError(f"TaskArgsBuilder: TensorArg or Scalar specs, not {type(s).__name__}")

    def _add(self, spec: Any) -> None:
        if spec.name in self._RESERVED or spec.name.startswith("_"):
            raise ValueError(f"TaskArgsBuilder: {spec.name!r} is not a usable name")
        if any(s.name == spec.name for s in self._specs):
            raise ValueError(f"TaskArgsBuilder: {spec.name!r} is given twice")
        self._specs.append(spec)

    def add_tensor(self, name: str, value: Any) -> None:
        if any(isinstance(s, Scalar) for s in self._specs):
            raise ValueError("TaskArgsBuilder: tensors come before scalars")
        self._add(TensorArg(name, value))

    def add_scalar(self, name: str, value: Any) -> None:
        self._add(Scalar(name, value))

    @property
    def specs(self) -> List[Any]:
        return list(self._specs)

    def tensor_names(self) -> List[str]:
        return [s.name for s in self._specs if isinstance(s, TensorArg)]

    def __getattr__(self, name: str) -> Any:
        for s in object.__getattribute__(self, "_specs"):
            if s.name == name:
                return s.value
        raise AttributeError(f"TaskArgsBuilder has no argument {name!r}")

    def _replace(self, name: str, value: Any) -> None:
        for i, s in enumerate(self._specs):
            if s.name == name:
                self._specs[i] = s._replace(value=value)
                return
        raise KeyError(name)

    def clone(self) -> "TaskArgsBuilder":
        out = TaskArgsBuilder()
        for s in self._specs:
            if isinstance(s, TensorArg):
                v = s.value.clone() if hasattr(s.value, "clone") else s.value.copy()
                out.add_tensor(s.name, v)
            else:
                out.add_scalar(s.name, copy.copy(s.value))
        return out


def _rehosted_buffer_for(task_args: TaskArgsBuilder, tensor: Any) -> Any:
    addr = tensor.data_ptr() if hasattr(tensor, "data_ptr") else tensor.__array_interface__["data"][0]
    for h in task_args._rehost_handles.values():
        if h.base == addr:
            return h
    raise ValueError("no rehosted buffer holds this tensor (it is used only inside a scene test's run)")


def _rehosted_ref_for(task_args: TaskArgsBuilder, tensor: Any) -> Any:
    """The task argument over a rehosted tensor (matched by its address)."""
    from ._torch import torch_dtype_to_datatype

    h = _rehosted_buffer_for(task_args, tensor)
    return h.tensor(shapes=tuple(tensor.shape), dtype=torch_dtype_to_datatype(tensor.dtype).value)


_CONFIG_KEYS = {"aicpu_thread_num", "runtime_env", "device_count", "num_sub_workers"}
_ENV_KEYS = {"ring_task_window", "ring_heap", "ring_dep_pool"}


def _resolve(base: Path, p: str) -> str:
    return p if os.path.isabs(p) else str((base / p).resolve())


def scene_test(level: int, runtime: str) -> Callable[[type], type]:
    """Marks a SceneTestCase class: its level, runtime, and its CALLABLE's source paths made
    absolute (relative to the file that defines the class)."""

    def wrap(cls: type) -> type:
        for case in getattr(cls, "CASES", []):
            if not isinstance(case, dict):
                raise TypeError(f"{cls.__name__}: every CASES entry is a dict")
            bad = set(case.get("config", {})) - _CONFIG_KEYS
            if bad:
                raise ValueError(f"{cls.__name__}: unknown config keys {sorted(bad)}")
            env = case.get("config", {}).get("runtime_env", {})
            bad = set(env) - _ENV_KEYS
            if bad:
                raise ValueError(f"{cls.__name__}: unknown runtime_env keys {sorted(bad)}")
        cls._st_level = int(level)  # type: ignore[attr-defined]
        cls._st_runtime = runtime  # type: ignore[attr-defined]
        base = Path(inspect.getfile(cls)).resolve().parent
        spec = getattr(cls, "CALLABLE", None)
        if isinstance(spec, dict) and isinstance(spec.get("callables"), list):
            entries = []
            for e in spec["callables"]:
                e = dict(e)
                if "orchestration" in e:
                    o = dict(e["orchestration"])
                    o["source"] = _resolve(base, o["source"])
                    e["orchestration"] = o
                    incs = []
                    for k in e.get("incores", []):
                        k = dict(k)
                        k["source"] = _resolve(base, k["source"])
                        if "extra_include_dirs" in k:
                            k["extra_include_dirs"] = [
                                os.path.expandvars(d) if "$" in d else _resolve(base, d) for d in k["extra_include_dirs"]
                            ]
                        incs.append(k)
                    e["incores"] = incs
                entries.append(e)
            cls.CALLABLE = dict(spec, callables=entries)  # type: ignore[attr-defined]
        return cls

    return wrap


def compile_callable(entry: Dict[str, Any], platform: str, runtime: str) -> Any:
    """A CALLABLE entry's ChipCallable, compiled (from the cache when unchanged)."""
    from ._build import ensure_pto_isa_root
    from ._compiler import KernelCompiler
    from ._types import ChipCallable, CoreCallable

    kc = KernelCompiler(platform=platform)
    inc = kc.get_orchestration_include_dirs(runtime)
    orch = entry["orchestration"]
    isa: Optional[str] = None
    children = []
    # pto-isa is the user's: when PTO_ISA_ROOT is set it must be one; kernels that do not use
    # it build without it (a kernel that does fails naming PTO_ISA_ROOT).
    if os.environ.get("PTO_ISA_ROOT"):
        isa = ensure_pto_isa_root()
    for k in entry.get("incores", []):
        extra = list(inc) + [d for d in k.get("extra_include_dirs", []) if os.path.isdir(d)]
        binary = kc.compile_incore(k["source"], core_type=k.get("core_type", "aiv"), pto_isa_root=isa, extra_include_dirs=extra)
        children.append((int(k["func_id"]), CoreCallable.build(signature=k.get("signature", []), binary=binary)))
    obin = kc.compile_orchestration(runtime, orch["source"])
    c = ChipCallable.build(
        signature=orch.get("signature", []),
        func_name=orch["function_name"],
        binary=obin,
        children=children,
        config_name=orch.get("config_name", ""),
    )
    c.name = entry.get("name", orch["function_name"])  # type: ignore[attr-defined]
    c.source = orch["source"]
    return c


def is_manual_for(case: Dict[str, Any], platform: str) -> bool:
    m = case.get("manual", False)
    if m is True:
        return True
    if isinstance(m, str):
        return m == platform
    if isinstance(m, (list, tuple)):
        return platform in m
    return False


def case_selected(case: Dict[str, Any], platform: str, manual: str) -> bool:
    if platform not in case.get("platforms", []):
        return False
    is_manual = is_manual_for(case, platform)
    return {"exclude": not is_manual, "include": True, "only": is_manual}[manual]


class SceneTestCase:
    """A scene test: ``CALLABLE``, ``CASES``, ``generate_args`` and ``compute_golden``."""

    CALLABLE: Dict[str, Any] = {}
    CASES: List[Dict[str, Any]] = []
    RTOL = 1e-5
    ATOL = 1e-5
    SKIP_GOLDEN = False
    RUNTIME_ENV: Dict[str, str] = {}

    def generate_args(self, params: Dict[str, Any]) -> TaskArgsBuilder:
        raise NotImplementedError(f"{type(self).__name__} defines no generate_args")

    def compute_golden(self, args: TaskArgsBuilder, params: Dict[str, Any]) -> None:
        raise NotImplementedError(f"{type(self).__name__} defines no compute_golden")

    def compare_outputs(self, test_args: TaskArgsBuilder, golden_args: TaskArgsBuilder, names: Iterable[str], params: Dict[str, Any]) -> None:
        import torch

        for n in names:
            actual, expected = getattr(test_args, n), getattr(golden_args, n)
            a = actual if isinstance(actual, torch.Tensor) else torch.as_tensor(actual)
            e = expected if isinstance(expected, torch.Tensor) else torch.as_tensor(expected)
            if not torch.allclose(a, e, rtol=self.RTOL, atol=self.ATOL):
                diff = (a.double() - e.double()).abs().max().item()
                raise AssertionError(f"Golden mismatch on {n!r}: max_diff={diff}, rtol={self.RTOL}, atol={self.ATOL}")

    def test_run(self, st_platform: str, st_worker: Any, request: Any) -> None:
        import pytest

        manual = request.config.getoption("--manual", default="exclude")
        selectors = request.config.getoption("--case", default=None) or []
        cases = [c for c in self.CASES if case_selected(c, st_platform, manual) and _case_wanted(type(self).__name__, c, selectors)]
        if not cases:
            pytest.skip(f"no case of {type(self).__name__} runs on {st_platform} with --manual {manual}")
        rounds = int(request.config.getoption("--rounds", default=1) or 1)
        skip_golden = bool(request.config.getoption("--skip-golden", default=False))
        for case in cases:
            run_case(self, st_worker, case, rounds, skip_golden or self.SKIP_GOLDEN or case.get("skip_golden", False))


def _case_wanted(cls: str, case: Dict[str, Any], selectors: List[str]) -> bool:
    if not selectors:
        return True
    for s in selectors:
        c, sep, name = s.partition("::")
        if not sep:
            if s == case.get("name"):
                return True
        elif c == cls and (not name or name == case.get("name")):
            return True
    return False


def _rehost(worker: Any, args: TaskArgsBuilder) -> None:
    """Copies every host tensor into memory from ``worker.create_buffer`` and puts a view of it
    in its place."""
    import torch

    seen: List[Any] = []
    for s in args.specs:
        if not isinstance(s, TensorArg):
            continue
        t = s.value
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        if not t.is_contiguous():
            raise ValueError(f"scene test: tensor {s.name!r} is not contiguous")
        lo = t.data_ptr()
        hi = lo + t.numel() * t.element_size()
        for n, a, b in seen:
            if a < hi and lo < b:
                raise ValueError(f"scene test: tensors {n!r} and {s.name!r} share memory")
        seen.append((s.name, lo, hi))
        nbytes = t.numel() * t.element_size()
        buf = worker.create_buffer(nbytes)
        view = torch.frombuffer(buf.shm.buf, dtype=t.dtype, count=t.numel()).view(t.shape)
        view.copy_(t)
        args._rehost_handles[s.name] = buf
        args._replace(s.name, view)


def _build_config(case: Dict[str, Any]) -> Any:
    from ._types import CallConfig

    cfg = CallConfig()
    conf = case.get("config", {})
    if "aicpu_thread_num" in conf:
        cfg.aicpu_thread_num = int(conf["aicpu_thread_num"])
    for k, v in conf.get("runtime_env", {}).items():
        setattr(cfg.runtime_env, k, v)
    return cfg


def run_case(test: SceneTestCase, worker: Any, case: Dict[str, Any], rounds: int, skip_golden: bool) -> None:
    import torch

    cls = type(test)
    params = case.get("params", {})
    args = test.generate_args(params)
    golden = None
    if not skip_golden:
        golden = args.clone()
        test.compute_golden(golden, params)
    _rehost(worker, args)
    handles = getattr(cls, "_st_chip_handles", {})
    ns = CallableNamespace(handles)
    orch_fn = cls.CALLABLE["orchestration"]
    env_saved: Dict[str, Optional[str]] = {}
    base = Path(inspect.getfile(cls)).resolve().parent
    for k, v in getattr(cls, "RUNTIME_ENV", {}).items():
        env_saved[k] = os.environ.get(k)
        os.environ[k] = _resolve(base, v) if k.endswith(("_DIR", "_PATH")) else str(v)
    try:
        for _ in range(max(1, rounds)):
            cfg = _build_config(case)
            worker.run(lambda orch, _a, _c: orch_fn(orch, ns, args, cfg))
            if golden is not None:
                test.compare_outputs(args, golden, args.tensor_names(), params)
    finally:
        for k, old in env_saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old
        del torch
