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
# Parts nested in the phases, opened only while a step is annotated (annotating_parts): the fused LM head +
# loss's autograd Function (its forward computes the gradients too; its backward only scales them) and
# activation checkpointing's re-forward in backward (impl.checkpointing).
PARTS = ("lm head forward", "lm head backward", "recompute")

# A module global, not a ContextVar: backward's parts run on autograd's device threads, which do not see
# the main thread's context. One step runs at a time in a process.
_parts_on = False
_open_parts: set[str] = set()


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


@contextlib.contextmanager
def annotating_parts() -> Iterator[None]:
    """Opens the PARTS ranges (part) inside it: only a profiled step pays for them."""
    global _parts_on
    saved, _parts_on = _parts_on, True
    try:
        yield
    finally:
        _parts_on = saved


@contextlib.contextmanager
def part(name: str) -> Iterator[None]:
    """annotate(name) inside annotating_parts, else nothing. A part already open is not opened again (a
    nested checkpoint's recompute): impl.workloads.kernels matches a time to the latest-starting range of
    a name, which nested ranges of one name would defeat."""
    if not _parts_on or name in _open_parts:
        yield
        return
    _open_parts.add(name)
    try:
        with annotate(name):
            yield
    finally:
        _open_parts.discard(name)


__all__ = ["PARTS", "PHASES", "annotate", "annotating_parts", "part"]
