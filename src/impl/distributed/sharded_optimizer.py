"""Optimizer-state sharding (ZeRO stage 1), in two flavours.

``ShardedOptimizer``: each *parameter* is owned by one rank. The owner keeps
its optimizer state and updates it; then every parameter is broadcast from its
owner. Gradients must already be averaged (use any DDP wrapper).

``ZeRO1Optimizer``: parameters of each group are packed into one flat buffer
cut into equal contiguous per-rank shards. Each step reduce-scatters the raw
local gradients (so it replaces DDP's all-reduce: wrap the model with
``DDPNaive(model, reduce_gradients=False)``), steps the local optimizer on the
flat shard, and all-gathers the updated shards back into the flat buffer,
which the model parameters are views of. Same traffic as one all-reduce
(reduce-scatter + all-gather), with 1/world_size of the optimizer state.

Both are real ``torch.optim.Optimizer`` subclasses wrapping any torch.optim
class (SGD, Adam, AdamW, ...). Hyperparameters edited in ``param_groups``
(e.g. by an LR scheduler) are copied to the local optimizer at every step.

Checkpoints: ``state_dict()`` returns only this rank's shard of optimizer
state. Save one file per rank and load it on the same rank of a run with the
same world size and the same parameters/groups (the sharding is deterministic,
so the same shard is rebuilt). ``bytes_communicated_last_step`` counts the
buffer sizes handed to collectives in the last ``step``.
"""

from __future__ import annotations

from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.optim import Optimizer

from impl.distributed.collectives import all_gather_single, reduce_scatter_single


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
        super().__init__(params, defaults=kwargs)
        local_groups = [self._local_group(i) for i in range(len(self.param_groups))]
        self.local_optimizer = optimizer_cls(local_groups, **kwargs)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(_normalize_group(param_group))
        self._register_group(self.param_groups[-1])
        if self.local_optimizer is not None:
            self.local_optimizer.add_param_group(self._local_group(len(self.param_groups) - 1))

    def _sync_hyperparams(self) -> None:
        for group, local in zip(self.param_groups, self.local_optimizer.param_groups):
            local.update(_hyperparams(group))

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

    def _local_group(self, index: int) -> dict:
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

    def _local_group(self, index: int) -> dict:
        group = self.param_groups[index]
        mine = [p for p in group["params"] if self.owner[id(p)] == self.rank]
        return {**_hyperparams(group), "params": mine}

    def owned_params(self, rank: int | None = None) -> list[torch.Tensor]:
        rank = self.rank if rank is None else rank
        return [p for g in self.param_groups for p in g["params"] if self.owner[id(p)] == rank]

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        # The closure runs once here on every rank (it may contain
        # collectives); the local optimizer never calls it.
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparams()
        self.local_optimizer.step(**kwargs)
        self._broadcast_updates()
        return loss

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
                dist.broadcast(flat, src=owner)
                nbytes += flat.numel() * flat.element_size()
                if owner != self.rank:
                    for p, new in zip(group, _unflatten_dense_tensors(flat, group)):
                        p.copy_(new)
        self.bytes_communicated_last_step = nbytes


class _FlatGroup:
    """One param group's trainable params packed into a padded flat buffer.

    After construction the params' ``.data`` are views into ``flat_param``,
    so writing the buffer updates the model with no copy back.
    """

    def __init__(self, params: list[torch.Tensor], rank: int, world_size: int):
        # Frozen params are left out: in a flat shard they would be stepped
        # with a zero grad (weight decay, momentum) unlike torch.optim.
        self.params = [p for p in params if p.requires_grad]
        self.rank, self.world_size = rank, world_size
        self.numel = sum(p.numel() for p in self.params)
        self.shard: nn.Parameter | None = None
        if not self.params:
            return
        kinds = {(p.dtype, p.device) for p in self.params}
        if len(kinds) != 1:
            raise ValueError(f"ZeRO1Optimizer needs one dtype/device per param group, got {kinds}")
        dtype, device = kinds.pop()

        padded = -(-self.numel // world_size) * world_size
        self.shard_numel = padded // world_size
        self.flat_param = torch.zeros(padded, dtype=dtype, device=device)
        self.flat_grad = torch.zeros(padded, dtype=dtype, device=device)
        self.offsets = []
        offset = 0
        with torch.no_grad():
            for p in self.params:
                view = self.flat_param[offset : offset + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view
                self.offsets.append(offset)
                offset += p.numel()
        # A separate copy of our shard is what the local optimizer steps; it
        # is refreshed from flat_param every step, so external writes to the
        # model params (load_state_dict, broadcast) are picked up.
        self.shard = nn.Parameter(self.my_slice(self.flat_param).clone())
        self.shard_grad = torch.zeros_like(self.shard)

    def my_slice(self, flat: torch.Tensor) -> torch.Tensor:
        start = self.rank * self.shard_numel
        return flat[start : start + self.shard_numel]

    @property
    def nbytes(self) -> int:
        return self.flat_param.numel() * self.flat_param.element_size()

    def pack_grads(self) -> None:
        # A trainable param without grad this step contributes zeros (unlike
        # torch.optim, which would skip it; a flat shard cannot skip a slice).
        for p, offset in zip(self.params, self.offsets):
            dst = self.flat_grad[offset : offset + p.numel()]
            if p.grad is None:
                dst.zero_()
            else:
                dst.copy_(p.grad.reshape(-1))


class ZeRO1Optimizer(_ShardedBase):
    """Flat, rank-aligned shards; reduce-scatter grads, all-gather params.

    Reads each parameter's *local, unreduced* ``.grad``: do not average grads
    beforehand (``DDPNaive(model, reduce_gradients=False)``). One flat buffer
    per param group, so groups keep their own hyperparameters.
    """

    def __init__(self, params: Iterable, optimizer_cls: type[Optimizer], **kwargs: Any):
        self.flat_groups: list[_FlatGroup] = []
        self._use_reduce_scatter = True
        super().__init__(params, optimizer_cls, **kwargs)

    def _register_group(self, group: dict) -> None:
        self.flat_groups.append(_FlatGroup(group["params"], self.rank, self.world_size))

    def _local_group(self, index: int) -> dict:
        fg = self.flat_groups[index]
        return {**_hyperparams(self.param_groups[index]), "params": [] if fg.shard is None else [fg.shard]}

    def _reduce_scatter_mean(self, fg: _FlatGroup) -> int:
        if self._use_reduce_scatter:
            try:
                reduce_scatter_single(fg.shard_grad, fg.flat_grad)
                fg.shard_grad.div_(self.world_size)
                return fg.nbytes
            except (RuntimeError, NotImplementedError):
                # Older gloo builds lack reduce_scatter; torch 2.13's gloo has
                # it. Every rank fails identically, so they switch together.
                self._use_reduce_scatter = False
        dist.all_reduce(fg.flat_grad)
        fg.shard_grad.copy_(fg.my_slice(fg.flat_grad)).div_(self.world_size)
        return fg.nbytes

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._sync_hyperparams()
        nbytes = 0
        active = [fg for fg in self.flat_groups if fg.shard is not None]
        for fg in active:
            fg.pack_grads()
            nbytes += self._reduce_scatter_mean(fg)
            fg.shard.copy_(fg.my_slice(fg.flat_param))
            fg.shard.grad = fg.shard_grad
        self.local_optimizer.step(**kwargs)
        for fg in active:
            all_gather_single(fg.flat_param, fg.shard.detach())
            nbytes += fg.nbytes
        self.bytes_communicated_last_step = nbytes
        return loss
