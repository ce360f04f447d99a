"""simpler_setup's ``KernelCompiler`` for pto: kernels and orchestrations compiled against pto's
headers (first on the include path) and the user's pto-isa, cached (see
:mod:`pto.simpler._build`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence

from . import _build
from ._worker import PLATFORMS


def _project_root() -> Path:
    """A folder whose ``src/common`` is pto's headers: drivers add ``project_root / "src" /
    "common"`` to their include folders."""
    root = _build.cache_dir().parent / "simpler-root"
    common = root / "src" / "common"
    target = Path(_build.include_dir())
    if not (common.is_symlink() and Path(os.readlink(common)) == target):
        (root / "src").mkdir(parents=True, exist_ok=True)
        tmp = root / "src" / f".common.{os.getpid()}"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, common)
    return root


class KernelCompiler:
    """Compiles a callable's pieces for pto's simulator platforms."""

    def __init__(self, platform: str = "a2a3") -> None:
        if platform not in PLATFORMS:
            raise ValueError(
                f"KernelCompiler: platform {platform!r}: pto compiles for the simulator platforms "
                f"{', '.join(PLATFORMS)} (run with -p a2a3sim)"
            )
        self.platform = platform
        self.project_root = _project_root()

    def get_platform_include_dirs(self) -> List[str]:
        return [_build.include_dir()]

    def get_orchestration_include_dirs(self, runtime_name: str = "tensormap_and_ringbuffer") -> List[str]:
        return [_build.include_dir()]

    def get_incore_include_dirs(self) -> List[str]:
        return [_build.include_dir()]

    def compile_incore(
        self,
        source_path: str,
        core_type: str = "aiv",
        pto_isa_root: Optional[str] = None,
        extra_include_dirs: Optional[Sequence[str]] = None,
        build_dir: Optional[str] = None,
    ) -> bytes:
        """The kernel's shared library (its bytes)."""
        return _build.compile_kernel(str(source_path), core_type, pto_isa_root, list(extra_include_dirs or []))

    def compile_orchestration(
        self,
        runtime_name: str,
        source_path: str,
        extra_include_dirs: Optional[Sequence[str]] = None,
        build_dir: Optional[str] = None,
    ) -> bytes:
        """The orchestration's shared library (its bytes)."""
        return _build.compile_orchestration(str(source_path), list(extra_include_dirs or []))
