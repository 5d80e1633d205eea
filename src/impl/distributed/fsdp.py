"""Fully sharded data parallelism (ZeRO-3) for models built from Linear / Embedding layers.

``FSDP(module, compute_dtype=None)`` shards the ``weight`` of every ``impl.model`` Linear and
Embedding (and ``torch.nn.Linear`` / ``torch.nn.Embedding``) across the ranks of the default
process group. Each rank keeps one flat fp32 shard per weight (the weight flattened, padded to a
multiple of the world size, this rank's contiguous slice) as the Parameter the optimizer sees,
registered on the layer as ``weight_shard``. All other parameters (norm gains, biases) stay
replicated; their gradients are all-reduced (averaged) in ``finish_gradient_synchronization``.

Per layer call:

* forward: the layer's weight is all-gathered just before the call (in ``compute_dtype`` when
  given: the shard is cast before communication), the gathers of the next ``prefetch`` layers
  (0 to 2, default 1; in the previous forward's call order) are issued asynchronously, and the full weight is
  dropped after the call. The weight is attached to autograd through ``_AttachWeight``, whose
  backward hands the weight's gradient to an asynchronous reduce-scatter.
* autograd would keep the full weight alive for backward (matmul saves it). A
  ``saved_tensors_hooks`` pair replaces any saved view of the gathered weight by a small marker,
  and re-gathers the weight when backward unpacks it; the unpack of one layer prefetches the
  gather of the layer that backward reaches next (reverse forward order).
* gradients: per rank the weight gradient (compute dtype) is cast to ``reduce_dtype`` (fp32 by
  default), reduce-scattered asynchronously, and ``finish_gradient_synchronization`` waits on it
  and adds ``sum / world`` into ``weight_shard.grad`` (so gradient accumulation over several
  backwards works); replicated gradients go through one flat all-reduce there.

Usage per step (as for the DDP wrappers)::

    loss = loss_fn(fsdp(x_local), y_local)
    loss.backward()
    fsdp.finish_gradient_synchronization()
    opt.step()            # opt built on fsdp.parameters(): fp32 shards + replicated params

Rank 0's parameters and buffers are broadcast at construction. A sharded layer's ``weight``
attribute is ``None`` outside its forward; ``gather_full_params()`` (a collective: every rank must
call it) returns the full fp32 state dict under the original names.

Why a forward wrapper per layer instead of forward pre/post hooks: the saved-tensor hooks must be
active exactly during the layer's forward, and a ``with`` block around the original forward also
restores state when the forward raises. Layers are leaves (Linear / Embedding), so the wrapper sees
every use of the weight. Tied weights (one Parameter in several layers) share one shard.

Instrumentation: ``prefetched_last_step`` = (forward, backward) all-gathers of the last step that
a prefetch served; ``bytes_communicated_last_step`` (payload handed to all-gathers, reduce-scatters
and the all-reduce since the previous finish) and ``comm_time_s`` (host time finish waited,
device synchronised), as in impl.distributed.ddp.

Exit safety (issue 23): every collective's tensors go through ``impl.distributed.release``
(blocking ones in a ``with Released()``, async ones hold a ``Released`` until their wait), which
waits until gloo's worker thread let go of them; otherwise a rank can abort at exit.

Timeline (off by default): with ``record_timeline`` set (constructor or attribute) when a step's
first forward begins, every collective of that step is timestamped (issued, ready, needed by its
layer, compute resumed; see impl.distributed.fsdp_timeline for the events and streams), and
``last_timeline()`` resolves them after the step. Steps without it record nothing.
"""
from __future__ import annotations

import time
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from impl.distributed.fsdp_timeline import Clock, StepRecorder
from impl.distributed.release import Released
from impl.model.layers import Embedding, Linear

SHARDABLE = (Linear, Embedding, nn.Linear, nn.Embedding)

# torch 2.13 renamed the tensor collectives (the old names warn); the GPU machine runs 2.11.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


class _Unit:
    """One sharded weight: its fp32 flat shard and how to rebuild the full tensor."""

    def __init__(self, weight: torch.Tensor, rank: int, world: int, name: str, index: int):
        self.name, self.index, self.shape, self.numel = name, index, tuple(weight.shape), weight.numel()
        self.world = world
        self.shard_numel = -(-self.numel // world)  # ceil: pad to a multiple of the world size
        flat = torch.zeros(self.shard_numel * world, dtype=torch.float32, device=weight.device)
        flat[: self.numel] = weight.detach().reshape(-1)
        self.shard = nn.Parameter(flat[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone())

    def gather(self, dtype: torch.dtype, async_op: bool, keep: Released):
        """All-gather the full weight in `dtype` (its tensors passed through `keep`); returns (full
        weight, work handle or None)."""
        src = self.shard.detach().to(dtype)
        buf = torch.empty(self.shard_numel * self.world, dtype=dtype, device=src.device)
        full = buf[: self.numel].view(self.shape)  # before keep(buf): the view holds buf
        work = _all_gather(keep(buf), keep(src), async_op=async_op)
        return full, work

    @property
    def gather_bytes(self) -> int:
        return self.shard_numel * self.world


@dataclass
class _Pending:
    """An issued all-gather of `unit`; `entry` is its timeline record when the step is recorded.
    `released` holds the collective's tensors until after the wait: the worker thread must let go
    of them first (impl.distributed.release), and on CUDA the compute stream must have waited
    before NCCL's stash of the input is dropped (see fsdp_timeline)."""

    unit: _Unit
    full: torch.Tensor
    work: object | None
    released: Released
    entry: dict | None = None

    def result(self) -> torch.Tensor:
        if self.work is not None:
            self.work.wait()
            self.work = None
        self.released.wait()
        return self.full


@dataclass
class _PendingReduce:
    """An issued reduce-scatter of `unit`'s gradient into `out`; fields as in _Pending."""

    unit: _Unit
    out: torch.Tensor
    work: object | None
    released: Released
    entry: dict | None = None


class _AttachWeight(torch.autograd.Function):
    """Forward: returns the already-gathered full weight as a function of the shard. Backward:
    hands the full weight's gradient to the owner's reduce-scatter (asynchronous; the shard's
    .grad is filled in by finish_gradient_synchronization, hence no gradient returned here)."""

    @staticmethod
    def forward(ctx, shard, fsdp, unit, call, full):
        ctx.fsdp, ctx.unit, ctx.call = fsdp, unit, call
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._reduce_scatter_async(ctx.unit, ctx.call, grad_full)
        return None, None, None, None, None


class FSDP(nn.Module):
    MAX_OUTSTANDING_REDUCE_SCATTERS = 2

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype = torch.float32, prefetch: int = 1, record_timeline: bool = False):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("FSDP needs an initialised default process group (dist.init_process_group)")
        for name, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
                raise ValueError(f"{name} must be a floating torch.dtype or None, got {dt!r}")
        if not isinstance(prefetch, int) or not 0 <= prefetch <= 2:
            raise ValueError(f"prefetch must be 0, 1 or 2 layers, got {prefetch!r}")
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype, self.prefetch = compute_dtype, prefetch
        self.reduce_dtype = reduce_dtype or torch.float32
        self.comm_time_s = 0.0
        self.bytes_communicated_last_step = 0
        self._bytes = 0
        # How many all-gathers of the last step a prefetch served (forward, backward).
        self.prefetched_last_step = (0, 0)
        self._hits = [0, 0]
        # Timeline: the recorder of the step in progress and of the last finished step.
        self.record_timeline = record_timeline
        self._rec: StepRecorder | None = None
        self._last_rec: StepRecorder | None = None
        self._clock: Clock | None = None
        self._broadcast_from_rank0()
        self._state_keys = list(module.state_dict().keys())
        self.units: list[_Unit] = []
        self._wrap_layers()
        if not self.units:
            warnings.warn("FSDP: the module has no Linear/Embedding layer to shard; every parameter "
                          "is replicated (plain data parallelism)", stacklevel=2)
        shard_ids = {id(u.shard) for u in self.units}
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in shard_ids]
        # Per forward: the call order (for the next forward's prefetch) and the calls whose
        # saved weight backward will re-gather (in forward order).
        self._order: list[_Unit] = []
        self._prev_order: list[_Unit] = []
        self._packed_calls: list[int] = []
        self._pending_fwd: dict[int, _Pending] = {}
        self._pending_bwd: dict[int, _Pending] = {}
        self._bwd_live: dict[int, weakref.ref] = {}
        self._grad_work: list[_PendingReduce] = []
        # Runs however the model is called (fsdp(x) or module(x) from a loss method).
        module.register_forward_pre_hook(self._begin_forward)
        module.register_forward_hook(self._end_forward)

    # ---- construction ----------------------------------------------------------------------

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        groups: dict = {}
        for t in tensors:
            groups.setdefault((t.device, t.dtype), []).append(t)
        for group in groups.values():
            flat = _flatten_dense_tensors(group)
            with Released() as keep:
                dist.broadcast(keep(flat), src=0)
            for t, synced in zip(group, _unflatten_dense_tensors(flat, group)):
                t.copy_(synced)

    def _wrap_layers(self) -> None:
        by_param: dict[int, _Unit] = {}
        self._names: dict[str, _Unit] = {}  # original state-dict key -> unit
        for name, layer in self.module.named_modules():
            if not isinstance(layer, SHARDABLE):
                continue
            w = layer._parameters.get("weight")
            if w is None or not w.requires_grad:
                continue  # frozen weights stay replicated and are never synchronised
            if self.compute_dtype is not None and getattr(layer, "bias", None) is not None:
                raise ValueError(f"FSDP: compute_dtype with a biased layer ({name}) is not supported; "
                                 "use impl.model.Linear (no bias) or compute_dtype=None")
            key = f"{name}.weight" if name else "weight"
            unit = by_param.get(id(w))
            if unit is None:
                unit = by_param[id(w)] = _Unit(w, self.rank, self.world_size, key, len(self.units))
                self.units.append(unit)
                layer.register_parameter("weight_shard", unit.shard)
            del layer._parameters["weight"]
            layer.__dict__["weight"] = None
            self._names[key] = unit
            layer.forward = self._make_forward(layer, unit, layer.forward)

    def _make_forward(self, layer: nn.Module, unit: _Unit, orig_forward):
        def forward(*args, **kwargs):
            if self.compute_dtype is not None:
                args = tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                             for a in args)
            call = len(self._order)
            self._order.append(unit)
            full = self._forward_weight(call, unit)
            weight = _AttachWeight.apply(unit.shard, self, unit, call, full) if torch.is_grad_enabled() else full
            storage = weight.untyped_storage().data_ptr()

            def pack(t):
                if t.untyped_storage().data_ptr() == storage and t.dtype == weight.dtype:
                    if not self._packed_calls or self._packed_calls[-1] != call:
                        self._packed_calls.append(call)
                    return ("fsdp_weight", call, unit, t.size(), t.stride(), t.storage_offset())
                return t

            layer.__dict__["weight"] = weight
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                    return orig_forward(*args, **kwargs)
            finally:
                layer.__dict__["weight"] = None  # the full weight is freed unless a caller holds it
        return forward

    def _begin_forward(self, module, args) -> None:
        """A new forward: keep the last call order for prefetching, reset per-forward state."""
        if self._order:
            self._prev_order = self._order
        self._order, self._packed_calls, self._bwd_live = [], [], {}
        if self.record_timeline and self._rec is None:
            self._rec = StepRecorder(self._timeline_clock(), [u.name for u in self.units])
        if self._rec is not None:
            self._rec.begin("forward")

    def _end_forward(self, module, args, output) -> None:
        if self._rec is not None:
            self._rec.begin("backward")  # loss and backward: everything until finish

    def _timeline_clock(self) -> Clock:
        if self._clock is None:
            params = [u.shard for u in self.units] or list(self.module.parameters())
            self._clock = Clock(params[0].device if params else torch.device("cpu"))
        return self._clock

    def _mark(self):
        return self._rec.now() if self._rec is not None else None

    # ---- all-gathers -------------------------------------------------------------------------

    def _gather_dtype(self) -> torch.dtype:
        return self.compute_dtype or torch.float32

    def _issue(self, unit: _Unit, async_op: bool, phase: str, call: int) -> _Pending:
        rec = self._rec
        entry = rec.issue("all_gather", phase, call, unit.index, async_op) if rec is not None else None
        released = Released()
        full, work = unit.gather(self._gather_dtype(), async_op, released)
        self._bytes += unit.gather_bytes * full.element_size()
        if entry is not None:
            rec.launched(entry, work)
        return _Pending(unit, full, work, released, entry)

    def _take(self, pending: _Pending | None, unit: _Unit, phase: str, call: int) -> torch.Tensor:
        """The full weight of `call`: from its prefetch, else from a blocking gather issued now.
        Timeline: needed before the wait, compute resumes after it."""
        need = self._mark()
        if pending is None:
            pending = self._issue(unit, async_op=False, phase=phase, call=call)
        full = pending.result()
        if pending.entry is not None:
            self._rec.waited(pending.entry, need)
        return full

    def _forward_weight(self, call: int, unit: _Unit) -> torch.Tensor:
        pending = self._pending_fwd.pop(call, None)
        if pending is not None and pending.unit is not unit:  # the call order changed
            pending.result()
            pending = None
        self._hits[0] += pending is not None
        full = self._take(pending, unit, "forward", call)
        # Prefetch: the next layers in the previous forward's order, at most `prefetch` ahead.
        for nxt in range(call + 1, min(call + 1 + self.prefetch, len(self._prev_order))):
            if nxt not in self._pending_fwd:
                self._pending_fwd[nxt] = self._issue(self._prev_order[nxt], True, "forward", nxt)
        return full

    def _unpack(self, packed):
        if not (isinstance(packed, tuple) and len(packed) == 6 and packed[0] == "fsdp_weight"):
            return packed
        _, call, unit, size, stride, offset = packed
        ref = self._bwd_live.get(call)
        full = ref() if ref is not None else None
        if full is None:
            pending = self._pending_bwd.pop(call, None)
            self._hits[1] += pending is not None
            full = self._take(pending, unit, "backward", call)
            self._bwd_live[call] = weakref.ref(full)
            # Backward runs the layers in reverse forward order: prefetch the previous call.
            try:
                pos = self._packed_calls.index(call)
            except ValueError:
                pos = 0
            # Nearest first: the collectives run one after another on NCCL's stream.
            for prev in reversed(self._packed_calls[max(0, pos - self.prefetch):pos]):
                if prev not in self._pending_bwd and self._bwd_live.get(prev) is None:
                    self._pending_bwd[prev] = self._issue(self._unit_of(prev), True, "backward", prev)
        return full.as_strided(size, stride, offset)

    def _unit_of(self, call: int) -> _Unit:
        return self._order[call]

    # ---- gradients ---------------------------------------------------------------------------

    def _reduce_scatter_async(self, unit: _Unit, call: int, grad_full: torch.Tensor) -> None:
        flat = torch.zeros(unit.shard_numel * self.world_size, dtype=self.reduce_dtype, device=grad_full.device)
        flat[: unit.numel] = grad_full.reshape(-1)
        out = torch.empty(unit.shard_numel, dtype=self.reduce_dtype, device=grad_full.device)
        rec = self._rec
        entry = rec.issue("reduce_scatter", "backward", call, unit.index, True) if rec is not None else None
        released = Released()
        work = _reduce_scatter(released(out), released(flat), async_op=True)
        self._bytes += flat.numel() * flat.element_size()
        if entry is not None:
            rec.launched(entry, work)
        self._grad_work.append(_PendingReduce(unit, out, work, released, entry))
        # Each outstanding reduce-scatter keeps a full-size gradient buffer alive; waiting on the
        # oldest bounds that to a few layers (sharded gradients, not a full replica, at the peak)
        # while the newest still overlaps the rest of backward.
        while len(self._grad_work) > self.MAX_OUTSTANDING_REDUCE_SCATTERS:
            self._fold_grad(self._grad_work.pop(0))

    def _fold_grad(self, pending: _PendingReduce) -> None:
        """Wait for a reduce-scatter and add its shard to the grad."""
        need = self._mark()
        pending.work.wait()
        pending.work = None  # the only handle: the worker can destroy the work
        if pending.entry is not None:
            self._rec.waited(pending.entry, need)
        pending.released.wait()  # before `out` gets another holder (the grad)
        unit, out = pending.unit, pending.out
        g = out.to(torch.float32).div_(self.world_size)
        if unit.shard.grad is None:
            unit.shard.grad = g
        else:
            unit.shard.grad.add_(g)

    def finish_gradient_synchronization(self) -> None:
        t0 = time.perf_counter()
        rec = self._rec
        if rec is not None:
            rec.begin("finish")
        # Prefetches that no layer used (a changed call order, or the first backward layers).
        for pending in list(self._pending_fwd.values()) + list(self._pending_bwd.values()):
            pending.result()
        self._pending_fwd.clear()
        self._pending_bwd.clear()
        self._bwd_live = {}
        for pending in self._grad_work:
            self._fold_grad(pending)
        self._grad_work.clear()
        grads = [p.grad for p in self.replicated if p.grad is not None]
        groups: dict = {}
        for g in grads:
            groups.setdefault((g.device, g.dtype), []).append(g)
        for group in groups.values():
            flat = _flatten_dense_tensors(group).div_(self.world_size)
            entry = rec.issue("all_reduce", "finish", -1, -1, False) if rec is not None else None
            with Released() as keep:
                dist.all_reduce(keep(flat))
            if entry is not None:  # blocking: needed at once, compute resumes when it is done
                rec.launched(entry, None)
                rec.waited(entry, entry["issue"])
            self._bytes += flat.numel() * flat.element_size()
            for g, reduced in zip(group, _unflatten_dense_tensors(flat, group)):
                g.copy_(reduced)
        if rec is not None:
            rec.end()  # before the synchronize: the step's span ends with its last queued work
        for p in self.parameters():
            if p.is_cuda:
                torch.cuda.synchronize(p.device)
                break
        self.bytes_communicated_last_step, self._bytes = self._bytes, 0
        self.prefetched_last_step, self._hits = tuple(self._hits), [0, 0]
        self._last_rec, self._rec = rec, None
        self.comm_time_s = time.perf_counter() - t0

    def last_timeline(self, max_rows: int | None = None) -> dict | None:
        """The last step's timeline (impl.distributed.fsdp_timeline), resolved now; None unless
        that step was recorded. At most `max_rows` rows (the summary counts all of them)."""
        return None if self._last_rec is None else self._last_rec.resolve(max_rows)

    # ---- forward and state -------------------------------------------------------------------

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The wrapped module's full state dict (fp32 weights, unpadded, original keys and order).
        A collective: every rank must call it."""
        full: dict[int, torch.Tensor] = {}
        for unit in self.units:
            with Released() as keep:
                t, _ = unit.gather(torch.float32, False, keep)
            full[id(unit)] = t.clone()
        current = self.module.state_dict()
        out = {}
        for key in self._state_keys:
            unit = self._names.get(key)
            out[key] = full[id(unit)] if unit is not None else current[key].detach().clone()
        return out

    def sharded_numel(self) -> int:
        return sum(u.shard_numel for u in self.units)
