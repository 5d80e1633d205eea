"""Profiler annotations shared by the project.

``annotate(name)`` opens an NVTX range (visible in Nsight Systems) when CUDA is
available and initialised, and always a ``torch.profiler.record_function``
range (visible in the PyTorch profiler / Chrome traces).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

# The annotated phases of a training step (impl.workloads.kernels attributes kernels to them).
PHASES = ("forward", "backward", "optimizer step")


def _nvtx_enabled() -> bool:
    # Never initialise CUDA just to annotate: only use NVTX when CUDA is
    # available *and* already initialised by real work.
    try:
        return torch.cuda.is_available() and torch.cuda.is_initialized()
    except Exception:  # pragma: no cover - defensive (broken driver etc.)
        return False


@contextlib.contextmanager
def annotate(name: str) -> Iterator[None]:
    """Context manager marking a named region for NVTX and torch.profiler."""
    if torch.compiler.is_compiling():
        # Dynamo cannot trace the ranges and would break the graph at every one; a compiled graph
        # carries no ranges of its own anyway.
        yield
        return
    with contextlib.ExitStack() as stack:
        if _nvtx_enabled():
            stack.enter_context(torch.cuda.nvtx.range(name))
        stack.enter_context(torch.profiler.record_function(name))
        yield


__all__ = ["PHASES", "annotate"]
