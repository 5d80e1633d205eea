"""The on-disk compile caches a first call starts from.

The 2026 leaderboard's rule is a run "from an empty PyTorch/Triton cache". A first call's time says that
only if the caches were empty when it began: a machine that ran anything before (the correctness suite,
an earlier candidate in another process) holds compiled Triton kernels and Inductor graphs on disk, and a
later first call loads them instead of compiling. So a row that reports a first call records what the
caches held at its start, and a page calls it "from an empty cache" only when both were empty.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def _entries(path: Path) -> int:
    """Files below `path` (0 when it does not exist): one compiled kernel or graph is several files,
    so this counts whether the cache is empty, not how many kernels it holds."""
    if not path.is_dir():
        return 0
    return sum(len(files) for _, _, files in os.walk(path))


def triton_cache_dir() -> Path:
    from triton import knobs  # Triton's own reading of TRITON_CACHE_DIR and its default

    return Path(knobs.cache.dir)


def inductor_cache_dir() -> Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir  # TORCHINDUCTOR_CACHE_DIR or its default

    return Path(cache_dir())


@dataclass(frozen=True)
class CompileCaches:
    triton_dir: str
    triton_files: int
    inductor_dir: str
    inductor_files: int

    @property
    def empty(self) -> bool:
        return self.triton_files == 0 and self.inductor_files == 0

    @classmethod
    def read(cls) -> CompileCaches:
        triton, inductor = triton_cache_dir(), inductor_cache_dir()
        return cls(str(triton), _entries(triton), str(inductor), _entries(inductor))
