"""Fully sharded data parallelism (ZeRO-3) for models built from Linear / Embedding layers.

``FSDP(module, compute_dtype=None, unit=None)`` shards the ``weight`` of every ``impl.model``
Linear and Embedding (and ``torch.nn.Linear`` / ``torch.nn.Embedding``) across the ranks of the
default process group, in units. A unit is a group of weights gathered together: the weights
concatenated into one flat buffer, padded to a multiple of the world size; each rank keeps its
contiguous slice in fp32 as the one Parameter the optimizer sees for that unit.

* ``unit=None``: one unit per weight, registered on the layer as ``weight_shard``.
* ``unit=SomeBlock`` (an nn.Module subclass or a tuple of them, e.g. ``impl.model.TransformerBlock``):
  every weight inside an instance (not nested in another instance) forms one unit, registered on
  that module as ``flat_shard``; weights outside every instance stay units of one weight. A tied
  weight (one Parameter in several layers) is one slot of one unit; if its uses lie in different
  instances (or partly outside) it is a unit of its own, whichever instances use it.

All other parameters (norm gains, biases) stay replicated; their gradients are all-reduced
(averaged) in ``finish_gradient_synchronization``.

A *visit* is one gather of a unit in forward: the forward of a group module (its layers take views
of the one gathered buffer), or of a single layer whose unit no enclosing call has open. The visit
ends, and the full buffer is dropped, when that forward returns ("done"; a layer that keeps its
weight alive keeps the buffer). So in forward at most the open visits (one, or a tied weight's
visit nested in a group's) and ``prefetch`` prefetched units are full. A group's layer called
outside the group module's forward is a visit of its own (correct; one whole-unit gather per call).

* forward: a visit all-gathers its unit (in ``compute_dtype`` when given: the shard is cast into
  its slice of the gather buffer, an in-place all-gather) and issues the gathers of the next
  ``prefetch`` visits (0 to 2 units, default 1; in the previous forward's visit order)
  asynchronously. Each layer's weight is attached to autograd through ``_AttachWeight``, whose
  backward hands the weight's gradient to FSDP.
* autograd would keep the full weight alive for backward (matmul saves it). A
  ``saved_tensors_hooks`` pair replaces any saved view of the gathered buffer by a small marker
  (``_SavedWeight``); the first unpack of a visit's markers re-gathers the unit's whole buffer,
  which is kept until the visit's last marker is unpacked, and prefetches the visits that backward
  reaches next (reverse forward order). The pack hook (``_PackWeight``) holds no reference to the
  buffer: autograd keeps it alive with every tensor saved under it.
* gradients: each use's weight gradient is held as autograd made it (``_UnitGrad``); when every use
  of the unit since the last issue has delivered, they are summed into the unit's full-size flat
  gradient in ``reduce_dtype`` (fp32 by default) and ONE reduce-scatter of it is issued
  asynchronously. Those buffers are the big transient: at most max_outstanding_reduce_scatters
  (2 by default, fully_shard keeps 1) exist at once (the oldest waited on before the next is
  made), and one whose reduce-scatter has completed is folded at the next delivery without
  waiting (NCCL reports completion; gloo's reduce-scatter never does, so on the CPU they go at
  the next issue). A fold adds ``sum / world``
  into the shard's ``.grad`` (so gradient accumulation over several backwards works).
  ``finish_gradient_synchronization`` issues those of units with uses that never delivered (a use
  outside the loss, a forward without backward) and folds the rest; replicated gradients go
  through one flat all-reduce there.

Usage per step (as for the DDP wrappers)::

    loss = loss_fn(fsdp(x_local), y_local)
    loss.backward()
    fsdp.finish_gradient_synchronization()
    opt.step()            # opt built on fsdp.parameters(): fp32 shards + replicated params

Rank 0's parameters and buffers are broadcast at construction. A sharded layer's ``weight``
attribute is ``None`` outside its forward; ``gather_full_params()`` (a collective: every rank must
call it) returns the full fp32 state dict under the original names.

Why forward wrappers (per layer, and per group module) instead of forward pre/post hooks: the
saved-tensor hooks must be active exactly during the layer's forward, and a ``with`` block around
the original forward also ends the visit when the forward raises. Layers are leaves (Linear /
Embedding), so the wrapper sees every use of the weight.

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
``last_timeline()`` resolves them after the step. Steps without it record nothing. A row's
``call`` is the visit's index in forward order (a reduce-scatter: the visit whose use delivered
last; -1 when issued in finish); ``unit`` indexes the timeline's ``units``, whose names are the
group module's name for a grouped unit and the weight's key otherwise.
"""
from __future__ import annotations

import math
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from impl.distributed.agreement import verify_module
from impl.distributed.fsdp_timeline import Clock, StepRecorder
from impl.distributed.release import Released
from impl.model.layers import Embedding, Linear

SHARDABLE = (Linear, Embedding, nn.Linear, nn.Embedding)

# torch 2.13 renamed the tensor collectives (the old names warn); the GPU machine runs 2.11.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class _Slot:
    """Where one weight lies in its unit's flat buffer."""

    key: str  # the weight's original state-dict key (the first one, for a tied weight)
    offset: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class _Unit:
    """A group of weights sharded and gathered together: their fp32 flat shard (the weights
    concatenated, padded to a multiple of the world size, this rank's contiguous slice) and where
    each weight lies in the full flat buffer. A per-layer unit is a group of one weight."""

    def __init__(self, weights: list[tuple[str, torch.Tensor]], rank: int, world: int, name: str, index: int):
        self.name, self.index, self.rank, self.world = name, index, rank, world
        self.slots: list[_Slot] = []
        offset = 0
        for key, w in weights:
            self.slots.append(_Slot(key, offset, tuple(w.shape)))
            offset += w.numel()
        self.numel = offset
        self.shard_numel = -(-self.numel // world)  # ceil: pad to a multiple of the world size
        flat = torch.zeros(self.shard_numel * world, dtype=torch.float32, device=weights[0][1].device)
        for slot, (_, w) in zip(self.slots, weights):
            flat[slot.offset:slot.offset + slot.numel] = w.detach().reshape(-1)
        self.shard = nn.Parameter(flat[rank * self.shard_numel:(rank + 1) * self.shard_numel].clone())

    def gather(self, dtype: torch.dtype, async_op: bool, keep: Released):
        """All-gather the full flat buffer (padded) in `dtype` (its tensors passed through `keep`);
        returns (buffer, work handle or None). A shard of another dtype is cast straight into this
        rank's slice of the buffer (an in-place all-gather): no cast copy lives until the wait."""
        shard = self.shard.detach()
        buf = torch.empty(self.gather_numel, dtype=dtype, device=shard.device)
        if dtype == shard.dtype:
            src = shard
        else:
            src = buf.narrow(0, self.rank * self.shard_numel, self.shard_numel).copy_(shard)
        work = _all_gather(keep(buf), keep(src), async_op=async_op)
        return buf, work

    @staticmethod
    def view(flat: torch.Tensor, slot: _Slot) -> torch.Tensor:
        return flat[slot.offset:slot.offset + slot.numel].view(slot.shape)

    @property
    def gather_numel(self) -> int:
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
        self.released.wait()  # before any view of `full` is made (a view counts as a use)
        return self.full


@dataclass
class _PendingReduce:
    """An issued reduce-scatter of `unit`'s gradient into `out`; fields as in _Pending."""

    unit: _Unit
    out: torch.Tensor
    work: object | None
    released: Released
    entry: dict | None = None


class _UnitGrad:
    """One unit's gradient while its uses deliver. Each use's gradient is held as autograd made it
    until the unit is sent, or until the held ones would take more bytes than the unit's full-size
    flat gradient in the reduce dtype (a weight used many times); then, and from then on, they are
    summed into that flat gradient, in delivery order either way. With bf16 compute and each
    weight used once, a unit waits in half the bytes of its flat gradient (as fully_shard's
    unsharded gradients do), and the flat gradient exists only while it is being sent."""

    def __init__(self, unit: _Unit, dtype: torch.dtype):
        self.unit, self.dtype = unit, dtype
        self.held: list[tuple[_Slot, torch.Tensor]] = []
        self.flat: torch.Tensor | None = None

    def add(self, slot: _Slot, grad: torch.Tensor) -> None:
        self.held.append((slot, grad))
        flat_bytes = self.unit.gather_numel * self.dtype.itemsize
        if self.flat is not None or sum(g.nbytes for _, g in self.held) > flat_bytes:
            self._sum()

    def take(self) -> torch.Tensor:
        """The flat gradient, every held gradient summed into it."""
        self._sum()
        return self.flat

    def _sum(self) -> None:
        if self.flat is None:
            self.flat = torch.zeros(self.unit.gather_numel, dtype=self.dtype, device=self.held[0][1].device)
        while self.held:  # each dropped once added
            slot, grad = self.held.pop(0)
            _Unit.view(self.flat, slot).add_(grad)


@dataclass
class _Visit:
    """A unit's gathered flat buffer during forward: `index` is the visit's position in this
    forward's visit order (the timeline's `call`)."""

    index: int
    unit: _Unit
    full: torch.Tensor


@dataclass(frozen=True)
class _SavedWeight:
    """What autograd keeps instead of a saved view of a gathered weight: the visit whose buffer
    backward re-gathers and the view's geometry in that flat buffer."""

    visit: int
    unit: _Unit
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class _PackWeight:
    """The pack hook of one layer call: a saved view of the visit's gathered buffer (known by its
    storage address and dtype) becomes a _SavedWeight marker; anything else is saved as is.
    Autograd keeps a pack hook alive with every tensor saved under it until backward frees that
    tensor (torch's PySavedVariableHooks holds both hooks), so this must hold the buffer's address,
    never the buffer: a closure over the weight kept every visit's buffer from its forward to its
    backward (a full unsharded copy of the model at the end of forward)."""

    owner: FSDP
    visit: int
    unit: _Unit
    storage: int
    dtype: torch.dtype

    def __call__(self, t: torch.Tensor):
        if t.untyped_storage().data_ptr() != self.storage or t.dtype != self.dtype:
            return t
        self.owner._count_saved(self.visit)
        return _SavedWeight(self.visit, self.unit, t.size(), t.stride(), t.storage_offset())


class _AttachWeight(torch.autograd.Function):
    """Forward: returns the already-gathered full weight (a view of its unit's flat buffer) as a
    function of the unit's shard. Backward: hands the weight's gradient to the owner, which
    reduce-scatters the unit's gradient once every use delivered (the shard's .grad is filled in
    when that is folded, hence no gradient returned here)."""

    @staticmethod
    def forward(ctx, shard, fsdp, unit, slot, visit, full):
        ctx.fsdp, ctx.unit, ctx.slot, ctx.visit = fsdp, unit, slot, visit
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._deliver_grad(ctx.unit, ctx.slot, ctx.visit, grad_full)
        return None, None, None, None, None, None


def _inside(name: str, group: str) -> bool:
    """Whether the submodule `name` lies in (or is) the submodule `group` ("" is the root)."""
    return group == "" or name == group or name.startswith(group + ".")


def _unit_classes(unit) -> tuple[type, ...]:
    """`unit` checked: None (one unit per weight), an nn.Module subclass or a tuple of them."""
    if unit is None:
        return ()
    classes = unit if isinstance(unit, tuple) else (unit,)
    if not classes or not all(isinstance(c, type) and issubclass(c, nn.Module) for c in classes):
        raise ValueError(f"unit must be None, an nn.Module subclass or a non-empty tuple of them, got {unit!r}")
    return classes


class FSDP(nn.Module):
    MAX_OUTSTANDING_REDUCE_SCATTERS = 2  # the default of max_outstanding_reduce_scatters

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype = torch.float32, prefetch: int = 1, record_timeline: bool = False,
                 unit=None, max_outstanding_reduce_scatters: int = MAX_OUTSTANDING_REDUCE_SCATTERS):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("FSDP needs an initialised default process group (dist.init_process_group)")
        for name, dt in (("compute_dtype", compute_dtype), ("reduce_dtype", reduce_dtype)):
            if dt is not None and (not isinstance(dt, torch.dtype) or not dt.is_floating_point):
                raise ValueError(f"{name} must be a floating torch.dtype or None, got {dt!r}")
        if not isinstance(prefetch, int) or not 0 <= prefetch <= 2:
            raise ValueError(f"prefetch must be 0, 1 or 2 units, got {prefetch!r}")
        # 1 is fully_shard's (one flat gradient in flight: the lower peak); 2 lets a reduce-scatter
        # overlap the next unit's backward while the one before it completes.
        n = max_outstanding_reduce_scatters
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 4:
            raise ValueError("max_outstanding_reduce_scatters must be an int from 1 to 4, got "
                             f"{max_outstanding_reduce_scatters!r}")
        # First: ranks whose modules disagree all raise here, before any rank-dependent check.
        verify_module("FSDP", module, sharded_layers=SHARDABLE, options=dict(
            compute_dtype=compute_dtype, reduce_dtype=reduce_dtype, prefetch=prefetch, unit=unit))
        groups = self._find_groups(module, _unit_classes(unit))  # before the broadcast
        self.module = module
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.compute_dtype, self.prefetch = compute_dtype, prefetch
        self.max_outstanding_reduce_scatters = max_outstanding_reduce_scatters
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
        self._wrap_layers(groups)
        if not self.units:
            warnings.warn("FSDP: the module has no Linear/Embedding layer to shard; every parameter "
                          "is replicated (plain data parallelism)", stacklevel=2)
        shard_ids = {id(u.shard) for u in self.units}
        self.replicated = [p for p in module.parameters() if p.requires_grad and id(p) not in shard_ids]
        # Per forward: the visit order (for the next forward's prefetch), the open visits, and the
        # visits whose saved weights backward will re-gather (forward order) with how many each.
        self._visits: list[_Unit] = []
        self._prev_visits: list[_Unit] = []
        self._open: dict[int, _Visit] = {}  # unit index -> its open visit
        self._packed_visits: list[int] = []
        self._saved_left: dict[int, int] = {}
        self._pending_fwd: dict[int, _Pending] = {}
        self._pending_bwd: dict[int, _Pending] = {}
        self._bwd_full: dict[int, torch.Tensor] = {}  # visit -> re-gathered buffer, until its last unpack
        # Gradients: per unit the uses not yet delivered and the delivered ones' gradients.
        self._uses: dict[int, int] = {}
        self._grads: dict[int, _UnitGrad] = {}
        self._grad_work: list[_PendingReduce] = []
        # Runs however the model is called (fsdp(x) or module(x) from a loss method).
        module.register_forward_pre_hook(self._begin_forward)
        module.register_forward_hook(self._end_forward)

    # ---- construction ----------------------------------------------------------------------

    @staticmethod
    def _find_groups(module: nn.Module, classes: tuple[type, ...]) -> dict[str, nn.Module]:
        """name -> module of every instance of `classes` not inside another one (an instance nested
        in another belongs to the outer one's unit)."""
        groups: dict[str, nn.Module] = {}
        for name, m in module.named_modules():
            if isinstance(m, classes) and not any(_inside(name, g) for g in groups):
                groups[name] = m
        if classes and not groups:
            raise ValueError(f"unit {tuple(c.__name__ for c in classes)} matches no submodule of "
                             f"{type(module).__name__}")
        return groups

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

    def _wrap_layers(self, groups: dict[str, nn.Module]) -> None:
        """One unit per group (its weights in module order) and one per weight outside every
        group. A tied weight whose uses lie in different groups (or partly outside) is a unit of
        its own: one Parameter, one shard, whichever groups use it."""
        layers: list[tuple[str, nn.Module, nn.Parameter]] = []  # (state-dict key, layer, weight)
        where: dict[int, set] = {}  # id(weight) -> the groups of its uses (None: outside every group)
        for name, layer in self.module.named_modules():
            if not isinstance(layer, SHARDABLE):
                continue
            w = layer._parameters.get("weight")
            if w is None or not w.requires_grad:
                continue  # frozen weights stay replicated and are never synchronised
            if self.compute_dtype is not None and getattr(layer, "bias", None) is not None:
                raise ValueError(f"FSDP: compute_dtype with a biased layer ({name}) is not supported; "
                                 "use impl.model.Linear (no bias) or compute_dtype=None")
            layers.append((f"{name}.weight" if name else "weight", layer, w))
            where.setdefault(id(w), set()).add(next((g for g in groups if _inside(name, g)), None))
        # owner: a group's name, or id(weight) for a weight's own unit -> its weights, first use first
        members: dict[str | int, list[tuple[str, nn.Module, nn.Parameter]]] = {}
        for key, layer, w in layers:
            uses = where[id(w)]
            owner = next(iter(uses)) if len(uses) == 1 and None not in uses else id(w)
            entries = members.setdefault(owner, [])
            if all(p is not w for _, _, p in entries):
                entries.append((key, layer, w))
        by_param: dict[int, tuple[_Unit, _Slot]] = {}
        for owner, entries in members.items():
            grouped = isinstance(owner, str)
            name = (owner or type(self.module).__name__) if grouped else entries[0][0]
            unit = _Unit([(key, w) for key, _, w in entries], self.rank, self.world_size, name, len(self.units))
            self.units.append(unit)
            for slot, (_, _, w) in zip(unit.slots, entries):
                by_param[id(w)] = (unit, slot)
            if grouped:  # one flat shard per group, on the group module, whose forward is one visit
                groups[owner].register_parameter("flat_shard", unit.shard)
                groups[owner].forward = self._make_group_forward(unit, groups[owner].forward)
            else:  # as before grouping: on the weight's (first) layer
                entries[0][1].register_parameter("weight_shard", unit.shard)
        self._names: dict[str, tuple[_Unit, _Slot]] = {}  # original state-dict key -> unit, slot
        for key, layer, w in layers:
            unit, slot = by_param[id(w)]
            del layer._parameters["weight"]
            layer.__dict__["weight"] = None
            self._names[key] = (unit, slot)
            layer.forward = self._make_forward(layer, unit, slot, layer.forward)

    # ---- forward ------------------------------------------------------------------------------

    @contextmanager
    def _visiting(self, unit: _Unit) -> Iterator[_Visit]:
        """The unit's gathered buffer for the code inside: its open visit, else a new visit that
        gathers it and is closed (the buffer dropped) when the code inside returns."""
        visit = self._open.get(unit.index)
        if visit is not None:
            yield visit
            return
        visit = self._start_visit(unit)
        self._open[unit.index] = visit
        try:
            yield visit
        finally:
            del self._open[unit.index]

    def _make_group_forward(self, unit: _Unit, orig_forward):
        """The group module's forward runs inside one visit of its unit: its layers share the gather."""
        def forward(*args, **kwargs):
            with self._visiting(unit):
                return orig_forward(*args, **kwargs)
        return forward

    def _make_forward(self, layer: nn.Module, unit: _Unit, slot: _Slot, orig_forward):
        def forward(*args, **kwargs):
            if self.compute_dtype is not None:
                args = tuple(a.to(self.compute_dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                             for a in args)
            with self._visiting(unit) as visit:
                weight = _Unit.view(visit.full, slot)
                if torch.is_grad_enabled():
                    weight = _AttachWeight.apply(unit.shard, self, unit, slot, visit.index, weight)
                    self._uses[unit.index] = self._uses.get(unit.index, 0) + 1
                pack = _PackWeight(self, visit.index, unit, weight.untyped_storage().data_ptr(), weight.dtype)
                layer.__dict__["weight"] = weight
                try:
                    with torch.autograd.graph.saved_tensors_hooks(pack, self._unpack):
                        return orig_forward(*args, **kwargs)
                finally:
                    layer.__dict__["weight"] = None  # the buffer is freed with its visit unless a caller holds it
        return forward

    def _count_saved(self, visit: int) -> None:
        """One more saved view of `visit`'s buffer for backward to re-gather (visits in forward order)."""
        if not self._packed_visits or self._packed_visits[-1] != visit:
            self._packed_visits.append(visit)
        self._saved_left[visit] = self._saved_left.get(visit, 0) + 1

    def _begin_forward(self, module, args) -> None:
        """A new forward: keep the last visit order for prefetching, reset per-forward state."""
        if self._visits:
            self._prev_visits = self._visits
        self._visits, self._packed_visits, self._saved_left, self._bwd_full, self._open = [], [], {}, {}, {}
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

    def _issue(self, unit: _Unit, async_op: bool, phase: str, visit: int) -> _Pending:
        rec = self._rec
        entry = rec.issue("all_gather", phase, visit, unit.index, async_op) if rec is not None else None
        released = Released()
        full, work = unit.gather(self._gather_dtype(), async_op, released)
        self._bytes += unit.gather_numel * full.element_size()
        if entry is not None:
            rec.launched(entry, work)
        return _Pending(unit, full, work, released, entry)

    def _take(self, pending: _Pending | None, unit: _Unit, phase: str, visit: int) -> torch.Tensor:
        """The gathered buffer of `visit`: from its prefetch, else from a blocking gather issued
        now. Timeline: needed before the wait, compute resumes after it."""
        need = self._mark()
        if pending is None:
            pending = self._issue(unit, async_op=False, phase=phase, visit=visit)
        full = pending.result()
        if pending.entry is not None:
            self._rec.waited(pending.entry, need)
        return full

    def _start_visit(self, unit: _Unit) -> _Visit:
        index = len(self._visits)
        self._visits.append(unit)
        pending = self._pending_fwd.pop(index, None)
        if pending is not None and pending.unit is not unit:  # the visit order changed
            pending.result()
            pending = None
        self._hits[0] += pending is not None
        full = self._take(pending, unit, "forward", index)
        # Prefetch: the next units in the previous forward's visit order, at most `prefetch` ahead.
        for nxt in range(index + 1, min(index + 1 + self.prefetch, len(self._prev_visits))):
            if nxt not in self._pending_fwd:
                self._pending_fwd[nxt] = self._issue(self._prev_visits[nxt], True, "forward", nxt)
        return _Visit(index, unit, full)

    def _unpack(self, saved):
        if not isinstance(saved, _SavedWeight):
            return saved
        visit = saved.visit
        full = self._bwd_full.get(visit)
        if full is None:
            pending = self._pending_bwd.pop(visit, None)
            self._hits[1] += pending is not None
            full = self._take(pending, saved.unit, "backward", visit)
            self._bwd_full[visit] = full
            # Backward reaches the visits in reverse forward order: prefetch the previous ones.
            try:
                pos = self._packed_visits.index(visit)
            except ValueError:
                pos = 0
            # Nearest first: the collectives run one after another on NCCL's stream.
            for prev in reversed(self._packed_visits[max(0, pos - self.prefetch):pos]):
                if prev not in self._pending_bwd and prev not in self._bwd_full:
                    self._pending_bwd[prev] = self._issue(self._visits[prev], True, "backward", prev)
        # The visit's last saved weight: drop the buffer (the view returned holds it while needed).
        self._saved_left[visit] = self._saved_left.get(visit, 0) - 1
        if self._saved_left[visit] <= 0:
            del self._bwd_full[visit]
        return full.as_strided(saved.size, saved.stride, saved.offset)

    # ---- gradients ---------------------------------------------------------------------------

    def _deliver_grad(self, unit: _Unit, slot: _Slot, visit: int, grad: torch.Tensor) -> None:
        """A use's weight gradient, added to the unit's _UnitGrad; the unit's last outstanding use
        issues its reduce-scatter."""
        self._fold_completed()
        if unit.index not in self._grads:
            self._grads[unit.index] = _UnitGrad(unit, self.reduce_dtype)
        self._grads[unit.index].add(slot, grad)
        self._uses[unit.index] = self._uses.get(unit.index, 0) - 1
        if self._uses[unit.index] <= 0:
            del self._uses[unit.index]
            self._reduce_scatter_async(unit, visit, self._grads.pop(unit.index), "backward")

    def _reduce_scatter_async(self, unit: _Unit, visit: int, grad: _UnitGrad, phase: str) -> None:
        """Reduce-scatter the unit's flat gradient, asynchronously."""
        # Each outstanding reduce-scatter keeps a full-size gradient buffer alive. The oldest are
        # waited on (their buffers dropped) before this one's is made, so at most
        # max_outstanding_reduce_scatters buffers exist at once, this one's included; the newest
        # still overlap the rest of backward, and the collectives run in issue order anyway.
        while len(self._grad_work) >= self.max_outstanding_reduce_scatters:
            self._fold_grad(self._grad_work.pop(0))
        flat = grad.take()
        out = torch.empty(unit.shard_numel, dtype=self.reduce_dtype, device=flat.device)
        rec = self._rec
        entry = rec.issue("reduce_scatter", phase, visit, unit.index, True) if rec is not None else None
        released = Released()
        work = _reduce_scatter(released(out), released(flat), async_op=True)
        self._bytes += flat.numel() * flat.element_size()
        if entry is not None:
            rec.launched(entry, work)
        self._grad_work.append(_PendingReduce(unit, out, work, released, entry))

    def _fold_completed(self) -> None:
        """Fold the oldest reduce-scatters that have already completed (a query, no wait): a
        finished one's full-size gradient buffer is dropped now, not at the next issue."""
        while self._grad_work and self._grad_work[0].work.is_completed():
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
        # Prefetches that no visit used (a changed visit order, or the first backward units).
        for pending in list(self._pending_fwd.values()) + list(self._pending_bwd.values()):
            pending.result()
        self._pending_fwd.clear()
        self._pending_bwd.clear()
        self._bwd_full = {}
        # Units whose uses did not all deliver (a use outside the loss, a forward without backward).
        for index in sorted(self._grads):  # the same order on every rank
            self._reduce_scatter_async(self.units[index], -1, self._grads.pop(index), "finish")
        self._uses = {}
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
        flats: dict[int, torch.Tensor] = {}
        for unit in self.units:
            with Released() as keep:
                flats[unit.index], _ = unit.gather(torch.float32, False, keep)
        current = self.module.state_dict()
        out = {}
        for key in self._state_keys:
            if key in self._names:
                unit, slot = self._names[key]
                out[key] = _Unit.view(flats[unit.index], slot).clone()
            else:
                out[key] = current[key].detach().clone()
        return out

    def sharded_numel(self) -> int:
        return sum(u.shard_numel for u in self.units)
