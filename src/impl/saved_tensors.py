"""Bytes that autograd keeps for backward, counted with saved-tensor hooks: how the accounting
formulas for activations are checked against what the framework really holds."""
from __future__ import annotations

import weakref
from typing import Callable

import torch


class _Held:
    """What the pack hook hands autograd: alive exactly as long as the graph keeps the tensor."""

    def __init__(self, t):
        self.t = t


def saved_tensor_bytes(fn: Callable, exclude=()) -> tuple[object, int]:
    """Runs fn() under saved-tensor hooks; returns (its result, bytes of the distinct storages
    autograd still keeps when fn returns), storages of `exclude` (parameters, inputs) left out.
    Tensors saved inside a checkpoint are packed by the checkpoint's own hooks and not seen."""
    refs = []

    def pack(t):
        h = _Held(t.detach())  # detach: a saved output with its grad_fn would keep its node alive
        refs.append(weakref.ref(h))
        return h

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda h: h.t):
        out = fn()
    skip = {t.untyped_storage().data_ptr() for t in exclude}
    seen = {}
    for r in refs:
        h = r()
        if h is not None and h.t.untyped_storage().data_ptr() not in skip:
            seen[h.t.untyped_storage().data_ptr()] = h.t.untyped_storage().nbytes()
    return out, sum(seen.values())
