"""Live tensor bytes on the CPU, where there is no CUDA allocator to read: a TorchDispatchMode that
notes the storage of every tensor an op under it takes or returns and, after each op, sums the
storages still alive (at their current size: fully_shard frees its unsharded parameters by
resize_(0)) and keeps the peak, per phase.

It sees what the ops of the thread it runs on touch. Not counted: storages no op under it ever
touched (register them with `note`), and what a collective's worker thread allocates for itself.
gloo's reduce-scatter sums into a full-size copy of its input made on its worker thread, which the
caller's thread first touches at the wait, splitting it to copy this rank's chunk out; NCCL keeps no
such copy. A storage first seen as the input of a split is taken to be that copy and not counted
(nothing measured here splits a tensor of its own that no op made).
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
        self._ignored: dict[int, StorageWeakRef] = {}  # gloo's reduce-scatter copies
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
                if not self._known(s, self._ignored) and not self._known(s, self._live):
                    self._live[s._cdata] = StorageWeakRef(s)

    @staticmethod
    def _known(s: torch.UntypedStorage, refs: dict[int, StorageWeakRef]) -> bool:
        ref = refs.get(s._cdata)
        return ref is not None and not ref.expired()

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
        if func is torch.ops.aten.split.Tensor and not self._known(args[0].untyped_storage(), self._live):
            self._ignored[args[0].untyped_storage()._cdata] = StorageWeakRef(args[0].untyped_storage())
        self.note(*tree_flatten((args, kwargs))[0])
        out = func(*args, **(kwargs or {}))
        self.note(*tree_flatten(out)[0])
        self.now()
        return out


__all__ = ["LiveBytes"]
