"""Compiling simpler's kernels and orchestrations against pto's headers, with a build cache.

A kernel is compiled as simpler's simulator driver compiles it (C++23, ``-D__CPU_SIM``, the core
type's ``-D__DAV_VEC__``/``-D__DAV_CUBE__``), against pto's headers first, then the user's
pto-isa (``PTO_ISA_ROOT``), then the caller's include folders. An orchestration is compiled as
C++17 against pto's headers. The compiler is ``$CXX``, else a g++ of version 13 or later, else a
clang++ of version 17 or later (pto-isa needs one of them).

Every build is cached under ``$XDG_CACHE_HOME/pto/simpler`` (``~/.cache/pto/simpler``), keyed
by the compiler, the flags, the include folders and the source; an entry is reused while every
file the compiler read for it (the dependency list it wrote) is unchanged, so a second run
compiles nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = [
    "BuildError",
    "cache_dir",
    "ensure_pto_isa_root",
    "compiler",
    "compile_kernel",
    "compile_orchestration",
    "core_type_of",
    "include_dir",
    "source_of",
    "store_binary",
]


class BuildError(RuntimeError):
    """A compile that failed, or could not be attempted, with the reason."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    d = Path(base) / "pto" / "simpler"
    d.mkdir(parents=True, exist_ok=True)
    return d


def include_dir() -> str:
    """The folder of pto's simpler-compatible headers (``pto include-dir --simpler``)."""
    from pto import _native

    return str(_native.simpler_include_dir())


def _version(cxx: str) -> Tuple[str, int]:
    """(kind, major) of a C++ compiler: kind is "gcc" or "clang"."""
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ("", 0)
    first = out.splitlines()[0] if out else ""
    kind = "clang" if "clang" in first else "gcc"
    try:
        major = subprocess.run([cxx, "-dumpversion"], capture_output=True, text=True, timeout=30).stdout
        return (kind, int(major.strip().split(".")[0]))
    except (OSError, subprocess.SubprocessError, ValueError):
        return (kind, 0)


_COMPILER: Optional[Tuple[str, str]] = None


def compiler() -> Tuple[str, str]:
    """The C++ compiler to use and its identity (for the cache): ``$CXX``, else g++ >= 13, else
    clang++ >= 17. Raises :class:`BuildError` naming what to install when there is none."""
    global _COMPILER
    if _COMPILER is not None:
        return _COMPILER
    tried: List[str] = []
    env = os.environ.get("CXX")
    candidates: List[str] = []
    if env:
        candidates.append(env)
    else:
        candidates += ["g++"] + [f"g++-{v}" for v in range(20, 12, -1)]
        candidates += ["clang++"] + [f"clang++-{v}" for v in range(22, 16, -1)]
    for c in candidates:
        path = shutil.which(c)
        if path is None:
            continue
        kind, major = _version(path)
        if env or (kind == "gcc" and major >= 13) or (kind == "clang" and major >= 17):
            ident = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.splitlines()
            _COMPILER = (path, f"{path} {ident[0] if ident else ''}")
            return _COMPILER
        tried.append(f"{c} ({kind} {major})")
    raise BuildError(
        "no C++ compiler pto-isa accepts: it needs g++ 13 or later or clang++ 17 or later"
        + (f" (found {', '.join(tried)})" if tried else " (found none)")
        + "; on Debian 12: apt-get install clang-19, or set CXX"
    )


def _digest(parts: Sequence[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


def _deps_unchanged(deps: List[Tuple[str, int, int]]) -> bool:
    for path, size, mtime in deps:
        try:
            st = os.stat(path)
        except OSError:
            return False
        if st.st_size != size or st.st_mtime_ns != mtime:
            return False
    return True


def _read_deps(depfile: Path) -> List[Tuple[str, int, int]]:
    text = depfile.read_text().replace("\\\n", " ")
    _, _, rest = text.partition(":")
    out = []
    for p in rest.split():
        try:
            st = os.stat(p)
        except OSError:
            continue
        out.append((os.path.abspath(p), st.st_size, st.st_mtime_ns))
    return out


def _build(source: str, flags: List[str], includes: List[str], what: str) -> bytes:
    src = Path(source)
    if not src.is_file():
        raise FileNotFoundError(f"{what}: source file not found: {source}")
    cxx, ident = compiler()
    key = _digest([ident, *flags, *[f"-I{i}" for i in includes], str(src.resolve()), src.read_text(errors="replace")])
    d = cache_dir()
    lib = d / f"{key}.so"
    meta = d / f"{key}.json"
    if lib.is_file() and meta.is_file():
        try:
            deps = [tuple(x) for x in json.loads(meta.read_text())["deps"]]
            if _deps_unchanged(deps):  # type: ignore[arg-type]
                return lib.read_bytes()
        except (OSError, ValueError, KeyError):
            pass
    with tempfile.TemporaryDirectory(prefix="pto-simpler-build-") as tmp:
        out = Path(tmp) / "out.so"
        depfile = Path(tmp) / "out.d"
        cmd = [cxx, *flags, *[f"-I{i}" for i in includes], "-MD", "-MF", str(depfile), str(src), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            hint = ""
            if "pto/" in r.stderr and "No such file" in r.stderr and not os.environ.get("PTO_ISA_ROOT"):
                hint = "\n(the kernel includes pto-isa: set PTO_ISA_ROOT to your pto-isa checkout)"
            raise BuildError(f"compiling {what} {source} failed:\n  {' '.join(cmd)}\n{r.stderr.strip()}{hint}")
        deps = _read_deps(depfile)
        data = out.read_bytes()
        # Written beside, then renamed: a concurrent build of the same source never sees half.
        part = d / f"{key}.so.{os.getpid()}"
        part.write_bytes(data)
        os.replace(part, lib)
        partm = d / f"{key}.json.{os.getpid()}"
        partm.write_text(json.dumps({"source": str(src.resolve()), "deps": deps}))
        os.replace(partm, meta)
    return data


_BF16: Optional[List[str]] = None


def bf16_flags() -> List[str]:
    """Extra flags that give pto-isa a real ``std::bfloat16_t``: none when the compiler has it
    (GCC 14 and later), else pto's shim folder and ``-D__STDCPP_BFLOAT16_T__=1`` (clang, which
    has the ``__bf16`` arithmetic type but not the standard name)."""
    global _BF16
    if _BF16 is not None:
        return _BF16
    cxx, _ = compiler()
    probe = "#include <stdfloat>\n#ifndef __STDCPP_BFLOAT16_T__\n#error none\n#endif\nstd::bfloat16_t x = 1.0bf16;\n"
    with tempfile.TemporaryDirectory(prefix="pto-simpler-probe-") as tmp:
        src = Path(tmp) / "p.cpp"
        src.write_text(probe)
        ok = subprocess.run([cxx, "-std=c++23", "-fsyntax-only", str(src)], capture_output=True).returncode == 0
    _BF16 = [] if ok else [f"-I{os.path.join(include_dir(), 'bf16')}", "-D__STDCPP_BFLOAT16_T__=1"]
    return _BF16


def kernel_flags(core_type: str) -> List[str]:
    if core_type not in ("aiv", "aic"):
        raise ValueError(f"core_type must be 'aiv' or 'aic', not {core_type!r}")
    core = "-D__DAV_VEC__" if core_type == "aiv" else "-D__DAV_CUBE__"
    return ["-shared", "-O2", "-fPIC", "-std=c++23", "-fpermissive", "-D__CPU_SIM",
            "-DPTO_CPU_MAX_THREADS=1", "-DNDEBUG", core, "-w", *bf16_flags()]


# What pto knows of binaries it compiled: (core type, source file), by content.
_KNOWN: Dict[str, Tuple[str, str]] = {}


def _key(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:32]


def core_type_of(data: bytes) -> str:
    """The core type a kernel binary was compiled for here ("aiv", "aic"), or "" when unknown."""
    return _KNOWN.get(_key(data), ("", ""))[0]


def source_of(data: bytes) -> str:
    """The source file a binary was compiled from here, or "" when unknown."""
    return _KNOWN.get(_key(data), ("", ""))[1]


def compile_kernel(source: str, core_type: str, pto_isa_root: Optional[str], extra: Sequence[str] = ()) -> bytes:
    """A kernel's shared library (bytes), compiled or from the cache."""
    includes = [include_dir()]
    if pto_isa_root:
        includes += [os.path.join(pto_isa_root, "include"), os.path.join(pto_isa_root, "include", "pto")]
    includes += [str(e) for e in extra if str(e) not in includes]
    data = _build(source, kernel_flags(core_type), includes, f"{core_type} kernel")
    _KNOWN[_key(data)] = (core_type, str(source))
    return data


def compile_orchestration(source: str, extra: Sequence[str] = ()) -> bytes:
    """An orchestration's shared library (bytes), compiled or from the cache."""
    includes = [include_dir()] + [str(e) for e in extra]
    flags = ["-shared", "-fPIC", "-O2", "-std=c++17", "-pthread", "-w"]
    data = _build(source, flags, includes, "orchestration")
    _KNOWN[_key(data)] = ("", str(source))
    return data


_STORED: Dict[str, str] = {}


def store_binary(data: bytes) -> str:
    """A path holding ``data`` (content-addressed under the cache), for the chips to load."""
    key = _key(data)
    hit = _STORED.get(key)
    if hit is not None and os.path.isfile(hit):
        return hit
    d = cache_dir() / "bin"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{key}.so"
    if not path.is_file() or path.stat().st_size != len(data):
        part = d / f"{key}.so.{os.getpid()}"
        part.write_bytes(data)
        os.replace(part, path)
    _STORED[key] = str(path)
    return str(path)

def ensure_pto_isa_root(verbose: bool = False) -> str:
    """The absolute path of the pto-isa checkout ``PTO_ISA_ROOT`` names (pto never downloads
    it). Raises :class:`OSError` saying what to set when it is unset or not a pto-isa."""
    root = os.environ.get("PTO_ISA_ROOT", "")
    if not root:
        raise OSError(
            "PTO_ISA_ROOT is not set: point it at a checkout of pto-isa (the commit your simpler "
            "pins in pto_isa.pin), e.g. export PTO_ISA_ROOT=/path/to/pto-isa"
        )
    marker = os.path.join(root, "include", "pto", "pto-inst.hpp")
    if not os.path.isfile(marker):
        raise OSError(f"PTO_ISA_ROOT={root} is not a pto-isa checkout: {marker} does not exist")
    return os.path.abspath(root)
