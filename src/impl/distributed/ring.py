"""Ring collectives written with point-to-point send/recv, counting what each rank sends.

The 2026 edition prices collectives by the ring algorithm (impl.parallelism_calcs): all-gather and
reduce-scatter of S bytes send (N−1)/N · S per device in N−1 steps, all-reduce twice that in
2(N−1) steps, and the "alternate" ring all-reduce (whole inputs passed around) (N−1)·S in N−1
steps. These functions run those algorithms for real over a process group (gloo or NCCL), so tests
can check both the result (against torch's collectives) and the counted bytes and steps (against
the formulas). A step is one simultaneous exchange: every rank sends one buffer to its successor
and receives one from its predecessor.

`RingCollectives` and `TorchCollectives` give impl.distributed.tensor_parallel and fsdp_tp one
interface over either implementation, each with a `Traffic` counter: payload bytes (what the
caller handed in, both) and, for the ring, the bytes really sent and the steps.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from impl.distributed.release import Released

# torch 2.13 renamed the tensor collectives (the old names warn); the GPU machine runs 2.11.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Traffic:
    """Per rank: collective calls, payload bytes handed to them, and (ring only) bytes this rank
    sent and exchange steps it took part in."""
    calls: int = 0
    payload_bytes: int = 0
    bytes_sent: int = 0
    steps: int = 0

    def reset(self) -> None:
        self.calls = self.payload_bytes = self.bytes_sent = self.steps = 0


class _Ring:
    """This rank's place in `group`'s ring: its index, the size, and its neighbours' global ranks."""

    def __init__(self, group=None):
        self.group = group
        ranks = dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))
        self.n = len(ranks)
        self.r = dist.get_rank(group) if group is not None else dist.get_rank()
        self.next, self.prev = ranks[(self.r + 1) % self.n], ranks[(self.r - 1) % self.n]

    def exchange(self, send: torch.Tensor, recv: torch.Tensor, traffic: Traffic) -> None:
        """Send `send` to the successor while receiving `recv` from the predecessor (one step)."""
        reqs = [dist.isend(send.contiguous(), self.next, group=self.group),
                dist.irecv(recv, self.prev, group=self.group)]
        for req in reqs:
            req.wait()
        traffic.bytes_sent += send.numel() * send.element_size()
        traffic.steps += 1


def _chunks(flat: torch.Tensor, n: int) -> list[torch.Tensor]:
    """n contiguous views of a 1-D tensor (sizes differ by at most one element when n ∤ numel)."""
    return list(torch.tensor_split(flat, n))


def _reduce_scatter_phase(ring: _Ring, chunks: list[torch.Tensor], traffic: Traffic) -> None:
    """In place: afterwards chunks[r] on rank r holds the sum over ranks. Step t sends the partial
    sum of chunk r−t−1 and adds the received chunk r−t−2 (indices mod N): chunk c starts at rank c+1
    and collects one contribution per hop until it reaches rank c."""
    n, r = ring.n, ring.r
    for t in range(n - 1):
        send, into = chunks[(r - t - 1) % n], chunks[(r - t - 2) % n]
        buf = torch.empty_like(into)
        ring.exchange(send, buf, traffic)
        into.add_(buf)


def _all_gather_phase(ring: _Ring, chunks: list[torch.Tensor], traffic: Traffic) -> None:
    """In place: rank r starts owning chunks[r]; step t forwards chunk r−t, receives chunk r−t−1."""
    n, r = ring.n, ring.r
    for t in range(n - 1):
        ring.exchange(chunks[(r - t) % n], chunks[(r - t - 1) % n], traffic)


def _count_call(traffic: Traffic, t: torch.Tensor) -> None:
    traffic.calls += 1
    traffic.payload_bytes += t.numel() * t.element_size()


def ring_all_gather(shard: torch.Tensor, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """Concatenation (1-D) of every rank's `shard` (equal shapes), rank order. Payload = the
    gathered size S."""
    ring, traffic = _Ring(group), traffic if traffic is not None else Traffic()
    out = torch.empty(shard.numel() * ring.n, dtype=shard.dtype, device=shard.device)
    chunks = _chunks(out, ring.n)
    chunks[ring.r].copy_(shard.reshape(-1))
    _count_call(traffic, out)
    _all_gather_phase(ring, chunks, traffic)
    return out


def ring_reduce_scatter(full: torch.Tensor, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """This rank's chunk (torch.tensor_split of the flattened input into N) of the sum of every
    rank's `full`. The input is not modified."""
    ring, traffic = _Ring(group), traffic if traffic is not None else Traffic()
    work = full.detach().reshape(-1).clone()
    chunks = _chunks(work, ring.n)
    _count_call(traffic, work)
    _reduce_scatter_phase(ring, chunks, traffic)
    return chunks[ring.r].clone()


def ring_all_reduce(tensor: torch.Tensor, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """In-place sum over ranks: reduce-scatter then all-gather over N chunks of the flattened
    tensor. Returns `tensor`."""
    ring, traffic = _Ring(group), traffic if traffic is not None else Traffic()
    work = tensor.detach().reshape(-1).clone()
    chunks = _chunks(work, ring.n)
    _count_call(traffic, work)
    _reduce_scatter_phase(ring, chunks, traffic)
    _all_gather_phase(ring, chunks, traffic)
    tensor.detach().copy_(work.view_as(tensor))
    return tensor


def alternate_ring_all_reduce(tensor: torch.Tensor, group=None, traffic: Traffic | None = None) -> torch.Tensor:
    """alternate_ring_all_reduce: for t = 1…N−1 rank i sends the whole input x^((i−t+1) mod N) — its
    own at t = 1, then the one it received the step before — to i+1, receives x^((i−t) mod N) from
    i−1 and adds it to its running sum. In place; returns `tensor`."""
    ring, traffic = _Ring(group), traffic if traffic is not None else Traffic()
    _count_call(traffic, tensor)
    passing = tensor.detach().clone()
    total = tensor.detach().clone()
    for _ in range(ring.n - 1):
        received = torch.empty_like(passing)
        ring.exchange(passing, received, traffic)
        total.add_(received)
        passing = received
    tensor.detach().copy_(total)
    return tensor


class TorchCollectives:
    """torch.distributed's own collectives on `group`; counts calls and payload bytes only (the
    bytes a backend's algorithm sends are not observable from here)."""

    def __init__(self, group=None):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.traffic = Traffic()

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        _count_call(self.traffic, tensor)
        with Released() as keep:  # gloo's worker must let go first (impl.distributed.release)
            dist.all_reduce(keep(tensor), group=self.group)
        return tensor

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        out = torch.empty(shard.numel() * self.size, dtype=shard.dtype, device=shard.device)
        _count_call(self.traffic, out)
        with Released() as keep:
            _all_gather(keep(out), keep(shard.contiguous().reshape(-1)), group=self.group)
        return out

    def reduce_scatter(self, full: torch.Tensor) -> torch.Tensor:
        flat = full.contiguous().reshape(-1)
        if flat.numel() % self.size:
            raise ValueError(f"reduce_scatter needs numel {flat.numel()} divisible by the group size {self.size}")
        out = torch.empty(flat.numel() // self.size, dtype=flat.dtype, device=flat.device)
        _count_call(self.traffic, flat)
        with Released() as keep:
            _reduce_scatter(keep(out), keep(flat), group=self.group)
        return out


class RingCollectives(TorchCollectives):
    """The same interface through this module's send/recv rings: also counts bytes sent and steps."""

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return ring_all_reduce(tensor, self.group, self.traffic)

    def all_gather(self, shard: torch.Tensor) -> torch.Tensor:
        return ring_all_gather(shard, self.group, self.traffic)

    def reduce_scatter(self, full: torch.Tensor) -> torch.Tensor:
        if full.numel() % self.size:
            raise ValueError(f"reduce_scatter needs numel {full.numel()} divisible by the group size {self.size}")
        return ring_reduce_scatter(full, self.group, self.traffic)


COLLECTIVES = {"torch": TorchCollectives, "ring": RingCollectives}


def make_collectives(kind: str, group=None) -> TorchCollectives:
    if kind not in COLLECTIVES:
        raise ValueError(f"collectives must be one of {sorted(COLLECTIVES)}, got {kind!r}")
    return COLLECTIVES[kind](group)
