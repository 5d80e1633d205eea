"""The ranks agree on what a distributed wrapper manages: checked once, at construction.

Every wrapper here pairs tensors across ranks by position: DDP broadcasts rank 0's parameters and
buffers flattened together and all-reduces flat gradients, the sharded optimizers pick owners and
flat shards by order and size, FSDP all-gathers flat units, TP broadcasts from its group's first
rank. Ranks that disagree on those tensors silently overwrite each other's values, leave a
parameter never stepped, or issue different collectives and abort or hang. torch's DDP refuses
this at construction (``_verify_param_shape_across_processes``); so does every wrapper here,
through ``verify_module`` (a model: its parameters and buffers) or ``verify_param_groups`` (an
optimizer's groups), before its first collective.

Compared per tensor: shape, dtype, requires_grad and the wrapper's role for it (FSDP: sharded or
replicated; an optimizer: its param group). Compared first, the wrapper's options that decide which
collectives it issues (DDPBucketed's bucket size, FSDP's dtypes, units and prefetch): ranks that
differ there pair buffers of different sizes or dtypes. Names are shown, not compared (torch pairs by position
too). The message names the wrapper, the first tensor that differs (its kind, index and name), what
each rank has there, and the ranks that differ from the group's first.

One all-gather of a fixed-size digest of every rank's description (and its size); only where the
digests differ, a second all-gather of the descriptions themselves, to name the difference. Every
rank sees the same digests, so all take the second step or none, and all raise the same ValueError:
none is left waiting in the wrapper's next collective. Not ``all_gather_object``: its staging
tensors would bypass impl.distributed.release, and a rank that raises here may exit at once (issue
23's abort at exit)."""
from __future__ import annotations

import hashlib
import pickle
from dataclasses import dataclass
from typing import Iterable, Mapping

import torch
import torch.distributed as dist
from torch import nn

from impl.distributed.release import Released

KINDS = ("option", "parameter", "buffer")  # compared in this order


@dataclass(frozen=True)
class _Entry:
    """One rank's view of one tensor: what is compared (key) and how it is named."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    requires_grad: bool
    role: str = ""

    @property
    def key(self) -> tuple:
        return self.shape, self.dtype, self.requires_grad, self.role

    def describe(self) -> str:
        role = f", {self.role}" if self.role else ""
        return f"shape {self.shape}, {self.dtype}, requires_grad={self.requires_grad}{role}"


@dataclass(frozen=True)
class _Option:
    """One rank's value of one wrapper option, compared by its repr."""

    name: str
    value: str

    @property
    def key(self) -> tuple:
        return (self.value,)

    def describe(self) -> str:
        return self.value


def _options(options: dict[str, object] | None) -> list[_Option]:
    return [_Option(k, repr(v)) for k, v in sorted((options or {}).items())]


def _entry(name: str, t: torch.Tensor, role: str = "") -> _Entry:
    return _Entry(name, tuple(t.shape), str(t.dtype), t.requires_grad, role)


def verify_module(wrapper: str, module: nn.Module, group=None, sharded_layers: tuple[type, ...] = (),
                  options: dict[str, object] | None = None, roles: Mapping[int, str] | None = None) -> None:
    """Raise ValueError on every rank of `group` (None: the default group) unless all of them give
    the same `options` (compared by repr) and hold parameters and buffers of the same count, shapes,
    dtypes and requires_grad, in the same order. `sharded_layers`: the layer classes whose ``weight``
    the wrapper shards (FSDP), so the ranks must also agree on which parameters are sharded.
    `roles`: id(parameter) -> the wrapper's role for it ("owned by rank 1"), for a role that is not
    a layer class's (absent: ""). A collective: every rank of `group` calls it."""
    sharded = {id(m._parameters.get("weight")) for m in module.modules() if isinstance(m, sharded_layers)}

    def role(p: torch.Tensor) -> str:
        if roles is not None:
            return roles.get(id(p), "")
        if not sharded_layers:
            return ""
        return "sharded" if id(p) in sharded else "replicated"

    tensors = list(module.parameters()) + list(module.buffers())
    _verify(wrapper, {"option": _options(options),
                      "parameter": [_entry(n, p, role(p)) for n, p in module.named_parameters()],
                      "buffer": [_entry(n, b) for n, b in module.named_buffers()]}, tensors, group)


def verify_param_groups(wrapper: str, param_groups: Iterable[dict], first: int = 0, group=None) -> None:
    """As verify_module for an optimizer's param groups (dicts with their ``params`` deduplicated),
    numbered from `first` (a group added later); the ranks must also agree on the groups' bounds."""
    entries, tensors = [], []
    for g, param_group in enumerate(param_groups, start=first):
        for i, p in enumerate(param_group["params"]):
            entries.append(_entry(f"param_groups[{g}]['params'][{i}]", p, f"in param group {g}"))
            tensors.append(p)
    _verify(wrapper, {"parameter": entries}, tensors, group)


def _verify(wrapper: str, mine: dict[str, list[_Entry]], tensors: list[torch.Tensor], group) -> None:
    views = _gather_if_different(mine, group, _device(tensors, group))
    if views is None:
        return
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
    message = _first_difference(wrapper, dict(zip(ranks, views)))
    if message is not None:
        raise ValueError(message)


def _device(tensors: list[torch.Tensor], group) -> torch.device:
    """Where the gathered bytes live: NCCL needs this rank's own GPU (the wrapper's tensors are on
    it; torch's current device is GPU 0 on every rank that never called set_device), gloo the CPU."""
    if dist.get_backend(group) != "nccl":
        return torch.device("cpu")
    return next((t.device for t in tensors if t.is_cuda), torch.device("cuda", torch.cuda.current_device()))


def _gather_if_different(mine: dict[str, list[_Entry]], group, device) -> list | None:
    """Every rank's description (in group rank order), or None when all compare equal."""
    payload = pickle.dumps(mine)
    keys = {kind: [e.key for e in entries] for kind, entries in mine.items()}
    head = hashlib.sha256(pickle.dumps(keys)).digest() + len(payload).to_bytes(8, "little")
    heads = [bytes(h.cpu().numpy()) for h in _all_gather(_as_tensor(head, len(head), device), group)]
    if all(h[:-8] == heads[0][:-8] for h in heads):
        return None
    sizes = [int.from_bytes(h[-8:], "little") for h in heads]
    parts = _all_gather(_as_tensor(payload, max(sizes), device), group)
    return [pickle.loads(bytes(part[:n].cpu().numpy())) for part, n in zip(parts, sizes)]


def _as_tensor(data: bytes, length: int, device) -> torch.Tensor:
    """`data` as uint8, zero-padded to `length` (all-gather needs equal sizes)."""
    out = torch.zeros(length, dtype=torch.uint8)
    out[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return out.to(device)


def _all_gather(t: torch.Tensor, group) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    with Released() as keep:  # gloo's worker must let go first (impl.distributed.release)
        dist.all_gather([keep(p) for p in parts], keep(t), group=group)
    return parts


def _first_difference(wrapper: str, views: dict[int, dict[str, list]]) -> str | None:
    """The refusal message for the first tensor on which the ranks differ from the group's first
    rank (the broadcast source), or None. `views`: global rank -> description, in group rank order.
    Pure, so every rank, given the same views, raises the same message."""
    first = next(iter(views))
    for kind in KINDS:
        lists = {rank: view.get(kind, []) for rank, view in views.items()}
        for i in range(max(len(entries) for entries in lists.values())):
            at = {rank: entries[i] if i < len(entries) else None for rank, entries in lists.items()}
            keys = {rank: e.key if e is not None else None for rank, e in at.items()}
            differ = sorted(rank for rank in keys if keys[rank] != keys[first])
            if differ:
                return _message(wrapper, kind, i, at, lists, differ, first)
    return None


def _message(wrapper: str, kind: str, i: int, at: dict[int, _Entry | _Option | None], lists: dict[int, list],
             differ: list[int], first: int) -> str:
    name = next(e.name for e in at.values() if e is not None)
    seen: dict[str, list[int]] = {}  # what a rank has there -> the ranks that have it
    for rank, e in sorted(at.items()):
        if e is None:
            what = f"none (it has {len(lists[rank])})"
        else:
            what = (f"{e.name}: " if e.name != name else "") + e.describe()
        seen.setdefault(what, []).append(rank)
    per_rank = "; ".join(f"{_ranks(rs)}: {what}" for what, rs in seen.items())
    if kind == "option":
        return (f"{wrapper}: the ranks disagree on option {name}: {per_rank}. Ranks {differ} differ from rank "
                f"{first}: every rank must construct the wrapper with the same options")
    return (f"{wrapper}: the ranks disagree on {kind} {i} ({name}): {per_rank}. Ranks {differ} differ from "
            f"rank {first}: every rank must give the same {kind}s (count, order, shapes, dtypes, requires_grad)")


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))
