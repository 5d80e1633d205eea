"""Optimizer-state sharding (ZeRO stage 1), in two flavours.

``ShardedOptimizer``: each *parameter* is owned by one rank. The owner keeps
its optimizer state and updates it; then every parameter is broadcast from its
owner. Gradients must already be synchronised (use any DDP wrapper: averaged, or summed for a summed loss). Wrapping
AdamWMaster (bf16 parameters, fp32 masters), ``cast_params_`` leaves each
master with its owner only.

``ZeRO1Optimizer``: parameters of each group are packed into one flat buffer
cut into buckets; rank r owns the r-th 1/world_size of every bucket. Each step
walks the buckets: it packs the raw local gradients of a bucket into a staging
buffer (freeing each parameter's gradient once packed) and reduce-scatters it
(so it replaces DDP's all-reduce: wrap the model with
``DDPNaive(model, reduce_gradients=False)``), steps the local optimizer on the
owned parts, and all-gathers every bucket back into the flat buffer, which the
model parameters are views of. Same traffic as one all-reduce (reduce-scatter
+ all-gather), with 1/world_size of the optimizer state. Per rank it keeps one
copy of the parameters (the flat buffer) and the state of its parts; gradients
are autograd's own until the step, which turns them into this rank's averaged
shard (1/world_size of them), so the step's peak is the parameters, the
gradients, 1/world_size of the state and two staging buckets, and forward and
backward run with 1/world_size of the state and no gradient buffer.

Both are real ``torch.optim.Optimizer`` subclasses wrapping any torch.optim
class (SGD, Adam, AdamW, ...). Hyperparameters edited in ``param_groups``
(e.g. by an LR scheduler) are copied to the local optimizer at every step.

``ZeRO1Optimizer`` does not compose with AdamWMaster: its shards are views of
one flat buffer made before the local optimizer exists, while a master must be
taken from the fp32 value before the parameter is rounded to bf16.

Checkpoints: ``state_dict()`` returns only this rank's shard of optimizer
state. Save one file per rank and load it on the same rank of a run with the
same world size and the same parameters/groups (and, for ZeRO-1, the same
bucket_numel): the sharding is deterministic, so the same shard is rebuilt. ``bytes_communicated_last_step`` counts the
buffer sizes handed to collectives in the last ``step``.
"""

from __future__ import annotations

import bisect
import functools
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.optim import Optimizer

from impl.distributed.agreement import verify_param_groups
from impl.distributed.collectives import all_gather_single, reduce_scatter_single
from impl.distributed.release import Released


def _dedupe(params) -> list:
    """Tied weights appear once: the base class would warn on duplicates, and a
    duplicate would be updated twice."""
    if isinstance(params, torch.Tensor):
        params = [params]
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _normalize_group(param_group: dict) -> dict:
    group = dict(param_group)
    group["params"] = _dedupe(group["params"])
    return group


def _param_groups(params) -> list[dict]:
    """`params` as torch.optim takes them (an iterable of tensors, or of group dicts) as a list of
    normalized groups: read once (it may be a generator) for the agreement check and the base class."""
    if isinstance(params, torch.Tensor):  # torch.optim's refusal, before it would be iterated
        raise TypeError(f"params argument given to the optimizer should be an iterable of Tensors or dicts, "
                        f"but got {torch.typename(params)}")
    params = list(params)
    if params and not isinstance(params[0], dict):
        params = [{"params": params}]
    return [_normalize_group(g) for g in params]


def _hyperparams(group: dict) -> dict:
    return {k: v for k, v in group.items() if k != "params"}


class _ShardedBase(Optimizer):
    """Shared plumbing: the base constructor calls ``add_param_group`` before
    the local optimizer exists, so subclasses create it afterwards from the
    groups collected so far and forward later groups to it."""

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], process_group=None, **kwargs: Any):
        self.process_group = process_group  # None: the default group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.optimizer_cls = optimizer_cls
        self.local_optimizer: Optimizer | None = None
        self.bytes_communicated_last_step = 0
        # local_owner[j]: index of the group that local group j belongs to
        # (a group may map to several local groups, see ZeRO1Optimizer).
        self.local_owner: list[int] = []
        params = _param_groups(params)
        # One check of all groups (their count and bounds too), before any is registered: the
        # ownership and flat shards pair parameters across ranks by group and position.
        verify_param_groups(type(self).__name__, params, group=process_group)
        super().__init__(params, defaults=kwargs)
        local_groups = []
        for i in range(len(self.param_groups)):
            local = self._local_groups(i)
            local_groups += local
            self.local_owner += [i] * len(local)
        self.local_optimizer = optimizer_cls(local_groups, **kwargs)

    def add_param_group(self, param_group: dict) -> None:
        param_group = _normalize_group(param_group)
        if self.local_optimizer is not None:  # added after construction (the constructor checked the rest)
            verify_param_groups(f"{type(self).__name__}.add_param_group", [param_group], len(self.param_groups))
        super().add_param_group(param_group)
        self._register_group(self.param_groups[-1])
        if self.local_optimizer is not None:
            index = len(self.param_groups) - 1
            for local in self._local_groups(index):
                self.local_optimizer.add_param_group(local)
                self.local_owner.append(index)

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        # The closure runs once here on every rank (it may contain
        # collectives); the local optimizer never calls it.
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparams()
        self._step_shard(**kwargs)
        return loss

    def _step_shard(self, **kwargs) -> None:
        """Step this rank's shard and leave every rank with the updated parameters."""
        raise NotImplementedError

    def _sync_hyperparams(self) -> None:
        for index, local in zip(self.local_owner, self.local_optimizer.param_groups):
            local.update(_hyperparams(self.param_groups[index]))

    # The base class's state_dict would describe all parameters; ours is
    # deliberately per-rank.
    def state_dict(self) -> dict:
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "param_groups": [_hyperparams(g) for g in self.param_groups],
            "local": self.local_optimizer.state_dict(),
        }

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict["world_size"] != self.world_size or state_dict["rank"] != self.rank:
            raise ValueError(
                f"shard saved by rank {state_dict['rank']}/{state_dict['world_size']} "
                f"cannot be loaded on rank {self.rank}/{self.world_size}"
            )
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError("saved state has a different number of param groups")
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            group.update(saved)
        self.local_optimizer.load_state_dict(state_dict["local"])

    def _register_group(self, group: dict) -> None:
        raise NotImplementedError

    def _local_groups(self, index: int) -> list[dict]:
        raise NotImplementedError


class ShardedOptimizer(_ShardedBase):
    """Each parameter's optimizer state lives on exactly one owner rank.

    Ownership is greedy by size: within each added group, parameters sorted
    largest first (ties by position) go to the rank with the fewest elements
    so far (ties to the lowest rank). Deterministic, so all ranks agree
    without communicating. ``process_group``: the ranks that share the
    states (None: the default group); ranks are the group's.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], process_group=None, **kwargs: Any):
        self.owner: dict[int, int] = {}  # id(param) -> owning rank
        self.rank_numel = [0] * dist.get_world_size(process_group)
        super().__init__(params, optimizer_cls, process_group=process_group, **kwargs)

    def _register_group(self, group: dict) -> None:
        order = sorted(range(len(group["params"])), key=lambda i: -group["params"][i].numel())
        for i in order:
            p = group["params"][i]
            target = min(range(self.world_size), key=lambda r: (self.rank_numel[r], r))
            self.owner[id(p)] = target
            self.rank_numel[target] += p.numel()

    def _local_groups(self, index: int) -> list[dict]:
        group = self.param_groups[index]
        mine = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        return [{**_hyperparams(group), "params": mine}]

    def owned_params(self, rank: int | None = None) -> list[torch.Tensor]:
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[id(p)] == rank]

    def _step_shard(self, **kwargs) -> None:
        self.local_optimizer.step(**kwargs)
        self._broadcast_updates()

    @torch.no_grad()
    def cast_params_(self, params, dtype: torch.dtype = torch.bfloat16) -> None:
        """For a master-weight local optimizer (impl.model.adamw_master.AdamWMaster): store `params`
        in `dtype`. The owner of each keeps its fp32 value as the master (the local optimizer's
        cast_params_); the other ranks only round it, the same rounding, since they never step it
        and receive its updated value from the owner's broadcast."""
        if not hasattr(self.local_optimizer, "cast_params_"):
            raise ValueError(f"ShardedOptimizer.cast_params_: the local optimizer "
                             f"{type(self.local_optimizer).__name__} keeps no masters (use AdamWMaster)")
        params = _dedupe(params)
        unknown = [tuple(p.shape) for p in params if id(p) not in self.owner]
        if unknown:
            raise ValueError(f"ShardedOptimizer.cast_params_: parameters of shapes {unknown} are not in this optimizer")
        self.local_optimizer.cast_params_([p for p in params if self.owner[id(p)] == self.rank], dtype)
        for p in params:
            if self.owner[id(p)] != self.rank:
                p.data = p.detach().to(dtype)

    @torch.no_grad()
    def _broadcast_updates(self) -> None:
        """Every owner broadcasts its parameters, one flat message per owner
        (per dtype/device) instead of one per parameter. Parameters without a
        grad this step are still sent so replicas cannot drift; frozen ones
        (requires_grad=False) never change and are skipped."""
        nbytes = 0
        for owner in range(self.world_size):
            params = [p for p in self.owned_params(owner) if p.requires_grad]
            by_kind: dict = {}
            for p in params:
                by_kind.setdefault((p.device, p.dtype), []).append(p)
            for group in by_kind.values():
                flat = _flatten_dense_tensors(group)
                with Released() as keep:
                    dist.broadcast(keep(flat), group=self.process_group, group_src=owner)
                nbytes += flat.numel() * flat.element_size()
                if owner != self.rank:
                    for p, new in zip(group, _unflatten_dense_tensors(flat, group)):
                        p.copy_(new)
        self.bytes_communicated_last_step = nbytes


# Collectives in flight at once in a ZeRO-1 step: packing (or staging) the next bucket overlaps
# the current one's collective; more would only hold more staging memory.
_DEPTH = 2


@dataclass(frozen=True)
class _Bucket:
    """``[start, stop)`` of a group's padded flat index space, a multiple of world_size long: the
    unit of one reduce-scatter and one all-gather. Rank r owns its r-th 1/world_size (ownership
    interleaved per bucket), which keeps each collective's equal-split contract."""

    start: int
    stop: int

    @property
    def numel(self) -> int:
        return self.stop - self.start

    def of(self, flat: torch.Tensor) -> torch.Tensor:
        return flat[self.start : self.stop]

    def owned(self, flat: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
        """Rank ``rank``'s part of this bucket of ``flat``."""
        return self.of(flat).view(world_size, -1)[rank]


def _cut(padded: int, bucket_numel: int) -> list[_Bucket]:
    """Consecutive buckets of ``bucket_numel`` elements (the last one shorter) covering
    ``padded``; both are multiples of world_size, so every bucket is too."""
    return [_Bucket(start, min(start + bucket_numel, padded)) for start in range(0, padded, bucket_numel)]


class _FlatGroup:
    """One param group's trainable params packed into one padded flat buffer, cut into buckets.

    * ``flat_param``: the params' ``.data`` are views into it (their original storages are
      released), so the all-gathers writing it update the model.
    * ``buckets``: consecutive ranges of ``flat_param``; a bucket boundary may split a param.
    * ``chunks``: this rank's part of each bucket, an ``nn.Parameter`` aliasing ``flat_param``.
      The local optimizer steps these in place, one local param group per chunk, so that
      temporaries of optimizers such as AdamW (``sqrt(v)``, the size of a whole group) stay the
      size of a chunk instead of the shard. A chunk's ``.grad`` is its part of the averaged
      gradient, written by the step's reduce-scatter.

    No gradient buffer is kept: during backward the params' ``.grad`` are autograd's own tensors;
    the step packs them bucket by bucket (``pack_grads``) and frees them.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int, bucket_numel: int):
        # Frozen params are left out: in a flat shard they would be stepped
        # with a zero grad (weight decay, momentum) unlike torch.optim.
        self.params = [p for p in params if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.buckets: list[_Bucket] = []
        self.chunks: list[nn.Parameter] = []
        if not self.params:
            return
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"ZeRO1Optimizer needs one dtype/device per param group, got {kinds}")
        dtype, device = kinds.pop()

        padded = -(-self.numel // world_size) * world_size
        self.flat_param = torch.zeros(padded, dtype=dtype, device=device)
        self.offsets: list[int] = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                view = self.flat_param[offset : offset + p.numel()].view_as(p)
                view.copy_(p)
                # Replacing .data drops the param's reference to its old
                # storage, which is freed here unless the caller holds it.
                p.data = view
                self.offsets.append(offset)
                offset += p.numel()
        self.ends = [o + p.numel() for o, p in zip(self.offsets, self.params)]
        self.buckets = _cut(padded, bucket_numel)
        self.chunks = [nn.Parameter(b.owned(self.flat_param, rank, world_size)) for b in self.buckets]

    @property
    def nbytes(self) -> int:
        return self.flat_param.numel() * self.flat_param.element_size()

    def pack_grads(self, bucket: _Bucket, out: torch.Tensor) -> None:
        """Copy the parts of the params' grads that fall in ``bucket`` into ``out`` (its length),
        and drop each param's ``.grad`` once its last part is copied, which frees it. No grad this
        step means zeros (unlike torch.optim, which would skip the param; a flat shard cannot skip
        a slice); the padding is zeros too."""
        first = bisect.bisect_right(self.ends, bucket.start)  # the first param ending after its start
        for i in range(first, len(self.params)):
            p, start, end = self.params[i], self.offsets[i], self.ends[i]
            if start >= bucket.stop:
                break
            lo, hi = max(start, bucket.start), min(end, bucket.stop)
            dst = out[lo - bucket.start : hi - bucket.start]
            if p.grad is None:
                dst.zero_()
            else:
                dst.copy_(p.grad.reshape(-1)[lo - start : hi - start])
            if end <= bucket.stop:
                p.grad = None
        out[max(self.numel, bucket.start) - bucket.start :].zero_()


@dataclass
class _Pending:
    work: dist.Work | None
    release: Released
    then: Callable[[], None] | None


class _InFlight:
    """Collectives launched asynchronously, at most ``depth`` at once. Each is finished in launch
    order: its work waited for, its tensors released by gloo's worker (issue 23), then its
    ``then`` run."""

    def __init__(self, depth: int):
        self.depth = depth
        self._pending: deque[_Pending] = deque()

    def make_room(self) -> None:
        """Finish the oldest collectives until another may start: the buffers the one launched
        ``depth`` ago read are free again."""
        while len(self._pending) >= self.depth:
            self._finish_oldest()

    def launch(self, collective: Callable, *tensors: torch.Tensor, then: Callable[[], None] | None = None) -> None:
        self.make_room()
        release = Released()
        work = collective(*map(release, tensors), async_op=True)
        self._pending.append(_Pending(work, release, then))

    def drain(self) -> None:
        while self._pending:
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        pending = self._pending.popleft()
        pending.work.wait()
        pending.work = None  # the worker may let go of the tensors only once no handle is left
        pending.release.wait()
        if pending.then is not None:
            pending.then()


class ZeRO1Optimizer(_ShardedBase):
    """Flat buffers cut into buckets; reduce-scatter grads, all-gather params, bucket by bucket.

    Reads each parameter's *local, unreduced* ``.grad``: do not average grads
    beforehand (``DDPNaive(model, reduce_gradients=False)``). One flat buffer
    per param group, so groups keep their own hyperparameters.

    Gradients: during backward the params' ``.grad`` are autograd's own tensors. ``step()``
    consumes them: it packs each bucket's grads into a staging buffer, freeing every param's
    ``.grad`` once packed, and reduce-scatters the bucket into this rank's chunk of it. After
    ``step()`` the model params' ``.grad`` are None, and the local optimizer's chunks hold this
    rank's averaged gradient shard until ``zero_grad`` drops it. A trainable param without a
    ``.grad`` at ``step()`` is stepped with a zero gradient (weight decay and momentum still act).

    ``bucket_numel`` (rounded up to a multiple of world_size) sets the elements per collective
    and staging buffer: two staging buffers of it are alive during the reduce-scatters (packing
    one bucket overlaps the previous one's collective), and the local optimizer's per-group
    temporaries are the size of one chunk (bucket_numel / world_size). The default, 2**26 (256 MiB
    of fp32), keeps each collective's fixed latency small next to its transfer. ``in_place`` (default:
    only on NCCL, which documents in-place all-gather with this rank's part of the output as the
    input) all-gathers without staging; otherwise a chunk-sized copy is sent. Every other
    keyword goes to ``optimizer_cls``. A saved state_dict loads only with the same world_size,
    bucket_numel and param groups (the chunks are the local optimizer's params).
    """

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], bucket_numel: int = 2**26,
                 in_place: bool | None = None, **kwargs: Any):
        if "process_group" in kwargs:  # its reduce-scatters and gathers run on the default group only
            raise ValueError("ZeRO1Optimizer works on the default process group; process_group is not supported")
        self.flat_groups: list[_FlatGroup] = []
        self.bucket_numel = _bucket_numel(bucket_numel, dist.get_world_size())
        self._in_place = dist.get_backend() == "nccl" if in_place is None else in_place
        self._use_reduce_scatter = True
        super().__init__(params, optimizer_cls, **kwargs)

    def _register_group(self, group: dict) -> None:
        self.flat_groups.append(_FlatGroup(group["params"], self.rank, self.world_size, self.bucket_numel))

    def _local_groups(self, index: int) -> list[dict]:
        # At least one (possibly empty) local group per group keeps the
        # mapping simple when a group has no trainable params.
        chunks = self.flat_groups[index].chunks or [None]
        return [{**_hyperparams(self.param_groups[index]), "params": [] if c is None else [c]} for c in chunks]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """The model params' grads as in torch.optim; this rank's gradient shard is dropped either
        way (the next step rewrites it), so it is not held through the next forward and backward."""
        super().zero_grad(set_to_none)
        for fg in self.flat_groups:
            for chunk in fg.chunks:
                chunk.grad = None

    def flat_buffers(self) -> list[torch.Tensor]:
        """Every tensor this optimizer keeps: the flat params and this rank's gradient shard (the
        local optimizer's params are views of the former)."""
        grads = [c.grad for fg in self.flat_groups for c in fg.chunks if c.grad is not None]
        return [fg.flat_param for fg in self.flat_groups if fg.chunks] + grads

    def _step_shard(self, **kwargs) -> None:
        active = [fg for fg in self.flat_groups if fg.chunks]
        nbytes = sum(self._reduce_scatter_grads(fg) for fg in active)
        self.local_optimizer.step(**kwargs)
        nbytes += sum(self._all_gather_params(fg) for fg in active)
        self.bytes_communicated_last_step = nbytes

    def _reduce_scatter_grads(self, fg: _FlatGroup) -> int:
        """Bucket by bucket: pack the grads into a reused staging buffer (freeing each param's
        grad once packed) and reduce-scatter it into the chunk's ``.grad``, averaged. The peak
        is the grads not yet freed plus the staging buffers, not a second full-size copy."""
        staging = [fg.flat_param.new_empty(fg.buckets[0].numel) for _ in range(min(_DEPTH, len(fg.buckets)))]
        inflight = _InFlight(len(staging))
        for k, (bucket, chunk) in enumerate(zip(fg.buckets, fg.chunks)):
            inflight.make_room()  # the collective that last read this staging buffer is done
            packed = staging[k % len(staging)][: bucket.numel]
            fg.pack_grads(bucket, packed)
            # A shard grad left by a step without zero_grad is overwritten, not reallocated.
            out = chunk.grad if chunk.grad is not None else torch.empty_like(chunk)
            self._launch_reduce_scatter(inflight, out, packed, functools.partial(self._set_shard_grad, chunk, out))
        inflight.drain()
        return fg.nbytes

    def _launch_reduce_scatter(self, inflight: _InFlight, out: torch.Tensor, packed: torch.Tensor,
                               then: Callable[[], None]) -> None:
        if self._use_reduce_scatter:
            try:
                inflight.launch(reduce_scatter_single, out, packed, then=then)
                return
            except (RuntimeError, NotImplementedError):
                # Older gloo builds lack reduce_scatter; torch 2.13's gloo has it. Every rank
                # fails identically, so they switch together.
                self._use_reduce_scatter = False
        mine = packed.view(self.world_size, -1)[self.rank]
        inflight.launch(dist.all_reduce, packed, then=functools.partial(_copy_then, out, mine, then))

    def _set_shard_grad(self, chunk: nn.Parameter, summed: torch.Tensor) -> None:
        chunk.grad = summed.div_(self.world_size)

    def _all_gather_params(self, fg: _FlatGroup) -> int:
        inflight = _InFlight(_DEPTH)
        for bucket in fg.buckets:
            mine = bucket.owned(fg.flat_param, self.rank, self.world_size)
            inflight.launch(all_gather_single, bucket.of(fg.flat_param), mine if self._in_place else mine.clone())
        inflight.drain()
        return fg.nbytes


def _copy_then(dst: torch.Tensor, src: torch.Tensor, then: Callable[[], None]) -> None:
    dst.copy_(src)
    then()


def _bucket_numel(bucket_numel: int, world_size: int) -> int:
    """``bucket_numel`` rounded up to a multiple of ``world_size`` (each rank owns an equal part)."""
    if not isinstance(bucket_numel, int) or isinstance(bucket_numel, bool) or bucket_numel < 1:
        raise ValueError(f"ZeRO1Optimizer: bucket_numel must be an int >= 1, got {bucket_numel!r}")
    return -(-bucket_numel // world_size) * world_size
