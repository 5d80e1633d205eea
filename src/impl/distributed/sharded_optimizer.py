"""Optimizer-state sharding (ZeRO stage 1), in two flavours.

``ShardedOptimizer``: each *parameter* is owned by one rank. The owner keeps
its optimizer state and updates it; then every parameter is broadcast from its
owner. Gradients must already be synchronised (use any DDP wrapper: averaged, or summed for a summed loss). Wrapping
AdamWMaster (bf16 parameters, fp32 masters), ``cast_params_`` leaves each
master with its owner only.

``ZeRO1Optimizer``: parameters of each group are packed into one flat buffer
cut into equal contiguous per-rank shards. Each step reduce-scatters the raw
local gradients (so it replaces DDP's all-reduce: wrap the model with
``DDPNaive(model, reduce_gradients=False)``), steps the local optimizer on the
flat shard, and all-gathers the updated shards back into the flat buffer,
which the model parameters are views of. Same traffic as one all-reduce
(reduce-scatter + all-gather), with 1/world_size of the optimizer state.
Per rank it keeps one copy of the parameters (the flat buffer), one of the
gradients (a flat buffer the params' ``.grad`` are views of) and the state of
its shard: the local optimizer steps views of the buffers, no shard copies.

Both are real ``torch.optim.Optimizer`` subclasses wrapping any torch.optim
class (SGD, Adam, AdamW, ...). Hyperparameters edited in ``param_groups``
(e.g. by an LR scheduler) are copied to the local optimizer at every step.

``ZeRO1Optimizer`` does not compose with AdamWMaster: its shards are views of
one flat buffer made before the local optimizer exists, while a master must be
taken from the fp32 value before the parameter is rounded to bf16.

Checkpoints: ``state_dict()`` returns only this rank's shard of optimizer
state. Save one file per rank and load it on the same rank of a run with the
same world size and the same parameters/groups (the sharding is deterministic,
so the same shard is rebuilt). ``bytes_communicated_last_step`` counts the
buffer sizes handed to collectives in the last ``step``.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Iterable

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

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], **kwargs: Any):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.optimizer_cls = optimizer_cls
        self.local_optimizer: Optimizer | None = None
        self.bytes_communicated_last_step = 0
        # local_owner[j]: index of the group that local group j belongs to
        # (a group may map to several local groups, see ZeRO1Optimizer).
        self.local_owner: list[int] = []
        params = _param_groups(params)
        # One check of all groups (their count and bounds too), before any is registered: the
        # ownership and flat shards pair parameters across ranks by group and position.
        verify_param_groups(type(self).__name__, params)
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
    without communicating.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], **kwargs: Any):
        self.owner: dict[int, int] = {}  # id(param) -> owning rank
        self.rank_numel = [0] * dist.get_world_size()
        super().__init__(params, optimizer_cls, **kwargs)

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
                    dist.broadcast(keep(flat), src=owner)
                nbytes += flat.numel() * flat.element_size()
                if owner != self.rank:
                    for p, new in zip(group, _unflatten_dense_tensors(flat, group)):
                        p.copy_(new)
        self.bytes_communicated_last_step = nbytes


class _FlatGroup:
    """One param group's trainable params packed into padded flat buffers.

    Per rank this holds exactly one full copy of the parameters and one of the
    gradients, nothing else:

    * ``flat_param``: the params' ``.data`` are views into it (their original
      storages are released), so the all-gather writing it updates the model.
    * ``flat_grad``: each param's ``.grad`` is re-pointed to its view of it as
      soon as autograd has accumulated the grad (post-accumulate-grad hook), so
      the separate grad autograd allocated is freed during backward; a later
      backward without ``zero_grad`` accumulates straight into the view.
    * ``chunks``: this rank's shard of ``flat_param`` cut into views of at most
      ``chunk_numel`` elements, each an ``nn.Parameter`` aliasing the buffer
      with ``.grad`` the matching view of ``flat_grad``. The local optimizer
      steps these in place: no shard copy, no separate shard gradient. One
      local param group per chunk because optimizers such as AdamW allocate a
      temporary the size of a whole group (``sqrt(v)``); per chunk, that
      transient stays small instead of the size of the shard.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int, chunk_numel: int):
        # Frozen params are left out: in a flat shard they would be stepped
        # with a zero grad (weight decay, momentum) unlike torch.optim.
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = rank, world_size
        self.numel = sum(p.numel() for p in self.params)
        self.chunks: list[nn.Parameter] = []
        if not self.params:
            return
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"ZeRO1Optimizer needs one dtype/device per param group, got {kinds}")
        dtype, device = kinds.pop()

        padded = -(-self.numel // world_size) * world_size
        self.shard_numel = padded // world_size
        self.flat_param = torch.zeros(padded, dtype=dtype, device=device)
        self.offsets, self.param_views = [], []
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
        # Allocated after the old parameter storages are gone, so the
        # construction peak is two copies of the params, not three.
        self.flat_grad = torch.zeros_like(self.flat_param)
        self.grad_views = [self.flat_grad[o : o + p.numel()].view_as(p) for p, o in zip(self.params, self.offsets)]
        param_shard, grad_shard = self.my_slice(self.flat_param), self.my_slice(self.flat_grad)
        for start in range(0, self.shard_numel, chunk_numel):
            end = min(start + chunk_numel, self.shard_numel)
            chunk = nn.Parameter(param_shard[start:end])  # aliases flat_param
            chunk.grad = grad_shard[start:end]
            self.chunks.append(chunk)
        # The hook holds the group only weakly: a strong reference from the
        # params back to the optimizer would be a cycle through a C++ hook
        # that gc cannot see, keeping the model and buffers alive forever.
        me = weakref.ref(self)
        self.hook_handles = [p.register_post_accumulate_grad_hook(functools.partial(_grad_ready, me, i))
                             for i, p in enumerate(self.params)]

    def my_slice(self, flat: torch.Tensor) -> torch.Tensor:
        start = self.rank * self.shard_numel
        return flat[start : start + self.shard_numel]

    @property
    def nbytes(self) -> int:
        return self.flat_param.numel() * self.flat_param.element_size()

    def adopt_grad(self, i: int) -> None:
        """Make param i's ``.grad`` its view of ``flat_grad``: a grad that is
        elsewhere (fresh from autograd, or set by the user) is copied in and
        released; no grad this step means zeros (unlike torch.optim, which
        would skip it; a flat shard cannot skip a slice)."""
        p, view = self.params[i], self.grad_views[i]
        g = p.grad
        if g is None:
            view.zero_()
        elif g.data_ptr() != view.data_ptr():
            view.copy_(g)
            p.grad = view

    def pack_grads(self) -> None:
        for i in range(len(self.params)):
            self.adopt_grad(i)


@torch.no_grad()
def _grad_ready(group_ref, index: int, param: torch.Tensor) -> None:
    fg = group_ref()
    if fg is not None and param.grad is not None:
        fg.adopt_grad(index)


class ZeRO1Optimizer(_ShardedBase):
    """Flat, rank-aligned shards; reduce-scatter grads, all-gather params.

    Reads each parameter's *local, unreduced* ``.grad``: do not average grads
    beforehand (``DDPNaive(model, reduce_gradients=False)``). One flat buffer
    per param group, so groups keep their own hyperparameters.

    The step reduce-scatters in place: afterwards this rank's slice of the
    flat gradient (seen through the params' ``.grad`` views) holds the
    averaged gradient and the rest the local one, so call ``zero_grad``
    before the next backward (as every training loop does).

    ``chunk_numel`` bounds the local optimizer's per-group temporaries (see
    ``_FlatGroup``). ``in_place`` (default: only on NCCL, which documents
    in-place reduce-scatter / all-gather with this rank's slice of the full
    buffer as output / input) runs both collectives without a staging
    tensor; otherwise a shard-sized temporary is used instead of relying on
    aliasing. Every other keyword goes to ``optimizer_cls``.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], chunk_numel: int = 2**25,
                 in_place: bool | None = None, **kwargs: Any):
        self.flat_groups: list[_FlatGroup] = []
        self.chunk_numel = chunk_numel
        self._in_place = dist.get_backend() == "nccl" if in_place is None else in_place
        self._use_reduce_scatter = True
        super().__init__(params, optimizer_cls, **kwargs)

    def _register_group(self, group: dict) -> None:
        self.flat_groups.append(_FlatGroup(group["params"], self.rank, self.world_size, self.chunk_numel))

    def _local_groups(self, index: int) -> list[dict]:
        # At least one (possibly empty) local group per group keeps the
        # mapping simple when a group has no trainable params.
        chunks = self.flat_groups[index].chunks or [None]
        return [{**_hyperparams(self.param_groups[index]), "params": [] if c is None else [c]} for c in chunks]

    def _reduce_scatter_mean(self, fg: _FlatGroup) -> int:
        shard = fg.my_slice(fg.flat_grad)
        if self._use_reduce_scatter:
            try:
                if self._in_place:
                    with Released() as keep:
                        reduce_scatter_single(keep(shard), keep(fg.flat_grad))
                else:
                    out = torch.empty_like(shard)
                    with Released() as keep:
                        reduce_scatter_single(keep(out), keep(fg.flat_grad))
                    shard.copy_(out)
                shard.div_(self.world_size)
                return fg.nbytes
            except (RuntimeError, NotImplementedError):
                # Older gloo builds lack reduce_scatter; torch 2.13's gloo has
                # it. Every rank fails identically, so they switch together.
                self._use_reduce_scatter = False
        with Released() as keep:
            dist.all_reduce(keep(fg.flat_grad))
        shard.div_(self.world_size)
        return fg.nbytes

    def _all_gather(self, fg: _FlatGroup) -> int:
        shard = fg.my_slice(fg.flat_param)
        with Released() as keep:
            all_gather_single(keep(fg.flat_param), keep(shard if self._in_place else shard.clone()))
        return fg.nbytes

    def flat_buffers(self) -> list[torch.Tensor]:
        """Every tensor this optimizer allocated (flat params and grads; the
        local optimizer's params and grads are views of these)."""
        return [t for fg in self.flat_groups if fg.chunks for t in (fg.flat_param, fg.flat_grad)]

    def _step_shard(self, **kwargs) -> None:
        nbytes = 0
        active = [fg for fg in self.flat_groups if fg.chunks]
        for fg in active:
            fg.pack_grads()
            nbytes += self._reduce_scatter_mean(fg)
        self.local_optimizer.step(**kwargs)
        for fg in active:
            nbytes += self._all_gather(fg)
        self.bytes_communicated_last_step = nbytes
