"""Live tensor bytes on the CPU, where there is no CUDA allocator to read: a TorchDispatchMode that
notes the storage of every tensor an op under it takes or returns and, after each op, sums the
storages still alive (at their current size: fully_shard frees its unsharded parameters by
resize_(0)) and keeps the peak, per phase.

It sees what the ops of the thread it runs on touch. Not counted: storages no op under it ever
touched (register them with `note`), and what a collective's worker thread allocates for itself
(gloo's copies): the same for every wrapper measured with it.
"""
from __future__ import annotations

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self._live: dict[int, StorageWeakRef] = {}  # StorageImpl address -> weak ref (an address
        # is unique while the storage lives; a data pointer is not, after a resize_(0))
        self.phase = "start"
        self.peak = 0
        self.peak_phase = self.phase
        self.phase_peaks: dict[str, int] = {}

    def note(self, *tensors: torch.Tensor) -> None:
        """Count these tensors' storages (e.g. parameters and optimizer state made before entering)."""
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: its local shard
                s = t.untyped_storage()
                ref = self._live.get(s._cdata)
                if ref is None or ref.expired():
                    self._live[s._cdata] = StorageWeakRef(s)

    def now(self) -> int:
        """Bytes of the noted storages alive now; updates the peaks."""
        total = 0
        for key, ref in list(self._live.items()):
            storage = torch.UntypedStorage._new_with_weak_ptr(ref.cdata)  # None once freed
            if storage is None:
                del self._live[key]
            else:
                total += storage.nbytes()
        self.phase_peaks[self.phase] = max(self.phase_peaks.get(self.phase, 0), total)
        if total > self.peak:
            self.peak, self.peak_phase = total, self.phase
        return total

    def mark(self, phase: str) -> int:
        """End the current phase and start `phase`; returns the bytes alive between the two."""
        total = self.now()
        self.phase = phase
        return total

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.note(*tree_flatten((args, kwargs))[0])
        out = func(*args, **(kwargs or {}))
        self.note(*tree_flatten(out)[0])
        self.now()
        return out


__all__ = ["LiveBytes"]
