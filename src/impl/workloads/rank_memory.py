"""Memory of one rank, read inside a worker: the CUDA allocator's figures (None on the CPU) and a
breakdown of the tensors the rank holds (parameters, gradients, optimizer state, buffers)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.runtime import synchronize


@dataclass
class Allocated:
    """The allocator at one moment: bytes allocated now and the peak since the last reset."""

    allocated: int | None
    peak: int | None

    @classmethod
    def read(cls, device: torch.device) -> Allocated:
        if device.type != "cuda":
            return cls(None, None)
        synchronize(device)
        return cls(torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device))


@dataclass
class NamedBytes:
    """Bytes of the distinct storages behind each kind of tensor on the rank."""

    parameters: int
    gradients: int
    optimizer_state: int
    buffers: int  # storages not counted as parameters or gradients: DDP buckets, ZeRO-1 flat buffers

    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_state + self.buffers


def unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def inner_optimizer(opt):
    """The optimizer that holds this rank's state: ours keep it in `local_optimizer`, torch's
    ZeroRedundancyOptimizer in `optim`."""
    return getattr(opt, "local_optimizer", None) or getattr(opt, "optim", None) or opt


def _state_tensors(opt) -> list[torch.Tensor]:
    return [v for s in inner_optimizer(opt).state.values() for v in s.values() if torch.is_tensor(v)]


def _buffer_tensors(wrapper, opt, counted: set) -> list[torch.Tensor]:
    """Communication / staging buffers the wrappers own (DDP buckets; ZeRO-1's flat buffers) whose
    storage is not already counted as parameters or gradients (`counted`: storage pointers).
    ZeRO-1's params are views of its flat buffer (counted as parameters); its gradient shard shows
    here from its step until zero_grad."""
    out = [b.buffer for b in getattr(wrapper, "buckets", []) or []]
    if hasattr(opt, "flat_buffers"):
        out += opt.flat_buffers()
    return [t for t in out if t.untyped_storage().data_ptr() not in counted]


def named_bytes(model: torch.nn.Module, wrapper, opt) -> NamedBytes:
    params = list(model.parameters())
    grads = [p.grad for p in params]
    counted = {t.untyped_storage().data_ptr() for t in params + grads if t is not None}
    return NamedBytes(parameters=unique_bytes(params), gradients=unique_bytes(grads),
                      optimizer_state=unique_bytes(_state_tensors(opt)),
                      buffers=unique_bytes(_buffer_tensors(wrapper, opt, counted)))


__all__ = ["Allocated", "NamedBytes", "inner_optimizer", "named_bytes", "unique_bytes"]
