"""pto's pytest plugin for simpler's tests, in place of simpler's root conftest (which needs
simpler's native build): ``python -m pto.simpler pytest ...`` loads it.

Options: ``--platform`` (a2a3sim or a5sim), ``--device`` (ids: ``0``, ``0-3``, ``0,2,5``),
``--manual`` (exclude, include, only), ``--runtime``, ``--level``, ``--case`` (repeatable:
``Cls``, ``Cls::case``, ``case``), ``--rounds``, ``--skip-golden``; simpler's diagnostics options
are accepted and ignored. Markers: ``platforms``, ``device_count``, ``manual``, ``runtime``,
``requires_hardware``, ``sdma``, ``network1_remote_device_count``. Fixtures: ``st_platform``,
``st_device_ids``, ``st_worker``, ``device_pool``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Set

import pytest

from pto.simpler import activate
from pto.simpler._scene import case_selected, compile_callable, is_manual_for

activate()

_IGNORED_FLAGS = [
    "--enable-chip-swimlane",
    "--dump-args",
    "--enable-dep-gen",
    "--enable-pmu",
    "--enable-scope-stats",
    "--enable-swimlane-overhead",
    "--require-pto-isa",
    "--skip-golden",
]


def pytest_addoption(parser: Any) -> None:
    g = parser.getgroup("pto.simpler", "simpler's tests on pto")
    g.addoption("--platform", default=None, help="a2a3sim or a5sim")
    g.addoption("--device", default="0", help="device ids: 0, 0-3, 0,2,5")
    g.addoption("--manual", default="exclude", choices=["exclude", "include", "only"])
    g.addoption("--runtime", default=None)
    g.addoption("--level", default=None, type=int)
    g.addoption("--exclude-level", default=None, type=int)
    g.addoption("--case", action="append", default=[])
    g.addoption("--rounds", default=1, type=int)
    g.addoption("--max-parallel", default=None)
    g.addoption("--sanitizer", default="")
    g.addoption("--pto-session-timeout", default=None)
    for f in _IGNORED_FLAGS:
        g.addoption(f, action="store_true", default=False, help="accepted; pto ignores it" if f != "--skip-golden" else "skip golden comparisons")


def pytest_configure(config: Any) -> None:
    for m in (
        "platforms(list): platforms a test runs on",
        "device_count(n): devices a test needs",
        "manual(platforms=None): run only with --manual include/only",
        "runtime(name): the runtime a test is for",
        "requires_hardware: needs a device",
        "sdma: uses SDMA",
        "network1_remote_device_count(n): remote devices (level 4)",
    ):
        config.addinivalue_line("markers", m)


def device_list(spec: str) -> List[int]:
    """``0``, ``0-3``, ``0,2,5`` or mixes, sorted and without duplicates."""
    out: Set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-", 1))
            if hi < lo:
                raise pytest.UsageError(f"--device {spec!r}: {part} is an empty range")
            out.update(range(lo, hi + 1))
        else:
            out.add(int(part))
    return sorted(out)


def _marker_list(item: Any, name: str) -> Any:
    m = item.get_closest_marker(name)
    if m is None:
        return None
    if m.args:
        return m.args[0]
    return m.kwargs.get("platforms", True)


def pytest_collection_modifyitems(config: Any, items: List[Any]) -> None:
    platform = config.getoption("--platform")
    manual = config.getoption("--manual")
    runtime = config.getoption("--runtime")
    level = config.getoption("--level")
    keep: List[Any] = []
    drop: List[Any] = []
    for item in items:
        cls = getattr(item, "cls", None)
        cases = getattr(cls, "CASES", None) if cls is not None else None
        if isinstance(cases, list):
            if platform is None:
                item.add_marker(pytest.mark.skip(reason="--platform required"))
                keep.append(item)
                continue
            ok = any(case_selected(c, platform, manual) for c in cases)
            if runtime and getattr(cls, "_st_runtime", runtime) != runtime:
                ok = False
            if level is not None and getattr(cls, "_st_level", level) != level:
                ok = False
            (keep if ok else drop).append(item)
            continue
        plats = _marker_list(item, "platforms")
        if plats is not None:
            if platform is None:
                item.add_marker(pytest.mark.skip(reason="--platform required"))
            elif platform not in plats:
                drop.append(item)
                continue
        man = item.get_closest_marker("manual")
        if man is not None and platform is not None:
            targets = man.args[0] if man.args else man.kwargs.get("platforms")
            is_manual = targets is None or targets is True or platform in (targets if isinstance(targets, (list, tuple)) else [targets])
            if {"exclude": is_manual, "include": False, "only": not is_manual}[manual]:
                drop.append(item)
                continue
        rt = item.get_closest_marker("runtime")
        if rt is not None and runtime and rt.args and rt.args[0] != runtime:
            drop.append(item)
            continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep


class DevicePool:
    """The ``--device`` ids, handed out to tests."""

    def __init__(self, ids: List[int]) -> None:
        self._free = list(ids)

    def allocate(self, n: int) -> List[int]:
        if n > len(self._free):
            return []
        out, self._free = self._free[:n], self._free[n:]
        return out

    def release(self, ids: List[int]) -> None:
        self._free = sorted(set(self._free) | set(ids))


@pytest.fixture(scope="session")
def device_pool(request: Any) -> DevicePool:
    return DevicePool(device_list(request.config.getoption("--device")))


@pytest.fixture(scope="session")
def st_platform(request: Any) -> str:
    p = request.config.getoption("--platform")
    if p is None:
        pytest.skip("--platform required")
    return str(p)


@pytest.fixture
def st_device_ids(request: Any, device_pool: DevicePool) -> Iterator[List[int]]:
    m = request.node.get_closest_marker("device_count")
    n = int(m.args[0]) if m is not None and m.args else 1
    ids = device_pool.allocate(n)
    if not ids:
        pytest.fail(f"need {n} devices (--device gives {request.config.getoption('--device')})")
    try:
        yield ids
    finally:
        device_pool.release(ids)


@pytest.fixture
def st_worker(request: Any, st_platform: str, device_pool: DevicePool) -> Iterator[Any]:
    """The class's Worker: as many chips as its cases need at most, its callables compiled and
    registered."""
    from ._worker import Worker

    cls = request.cls
    cases = getattr(cls, "CASES", [])
    n = max([int(c.get("config", {}).get("device_count", 1)) for c in cases] or [1])
    subs = max([int(c.get("config", {}).get("num_sub_workers", 0)) for c in cases] or [0])
    ids = device_pool.allocate(n)
    if not ids:
        pytest.fail(f"{cls.__name__} needs {n} devices (--device gives {request.config.getoption('--device')})")
    runtime = getattr(cls, "_st_runtime", "tensormap_and_ringbuffer")
    w = Worker(level=3, platform=st_platform, runtime=runtime, device_ids=ids, num_sub_workers=subs)
    handles: Dict[str, Any] = {}
    try:
        for entry in cls.CALLABLE.get("callables", []):
            if "orchestration" in entry:
                c = compile_callable(entry, st_platform, runtime)
                handles[entry["name"]] = w.register(c)
                handles[entry["name"] + "_sig"] = entry["orchestration"].get("signature", [])
            elif "callable" in entry:
                handles[entry["name"]] = w.register(entry["callable"])
        cls._st_chip_handles = handles
        w.init()
        yield w
    finally:
        w.close()
        device_pool.release(ids)


__all__ = ["DevicePool", "device_list", "is_manual_for"]
