"""Worker commands of perf/test_parallelism_calcs.py (run on every rank by impl.bench.worker_group):
the collectives and sharded FFNs whose costs impl.parallelism_calcs writes in closed form, run for
real over gloo with impl.distributed.ring's send/recv rings, so each reply carries what the rank
really sent (impl.distributed.ring.Traffic) beside its time.

Values are fp16 (p = 2 bytes, the calculations' setting) for the bare collectives; the sharded FFNs
compute in fp32 on the CPU (its fp16 matmuls are slow), so their traffic is counted at p = 4.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from impl.bench.worker_group import Timed, timed
from impl.workloads.dist_steps import WorkerState
from impl.distributed import ring
from impl.distributed.fsdp_tp import FSDPTPFeedForward, make_mesh
from impl.distributed.ring import Traffic, make_collectives
from impl.distributed.tensor_parallel import ParallelSwiGLU
from impl.model.layers import SwiGLU

# collective name -> (ring function, input numel from the collective's payload numel S and N)
COLLECTIVES = {
    "all_reduce": (ring.ring_all_reduce, lambda s, n: s),
    "alternate_all_reduce": (ring.alternate_ring_all_reduce, lambda s, n: s),
    "all_gather": (ring.ring_all_gather, lambda s, n: s // n),  # the input is this rank's shard
    "reduce_scatter": (ring.ring_reduce_scatter, lambda s, n: s),
}


@dataclass
class TrafficReply(Timed):
    """One timed command on one rank and what it sent, per counter (a collective: one; a sharded
    FFN: one per (axis, pass))."""

    traffic: dict[str, Traffic] = field(default_factory=dict)


def collective_setup(state: WorkerState, collectives: list[str], numel: int) -> None:
    """Buffers for `collectives` run back to back on a payload of `numel` fp16 values (each
    collective's gathered / reduced size S = 2·numel bytes)."""
    for name in collectives:
        if name not in COLLECTIVES:
            raise ValueError(f"collectives must be among {sorted(COLLECTIVES)}, got {name!r}")
    n = state.world_size
    if numel % n:
        raise ValueError(f"numel={numel} must be divisible by the world size {n}")
    state.drop("buffer", "wrapper")
    state.wrapper = [(name, torch.full((COLLECTIVES[name][1](numel, n),), float(state.rank + 1),
                                       dtype=torch.float16)) for name in collectives]


def collective(state: WorkerState) -> TrafficReply:
    """The set-up collectives, one after another, lined up by a barrier first; the counted traffic
    is one Traffic per collective."""
    traffic = {name: Traffic() for name, _ in state.wrapper}

    def run():
        for name, t in state.wrapper:
            COLLECTIVES[name][0](t, traffic=traffic[name])
    dist.barrier()
    return TrafficReply(timed(state, run, kernel=False), traffic)


def tp_ffn_setup(state: WorkerState, d_model: int, d_ff: int, tokens: int) -> None:
    """tp_calcs' layout: the SwiGLU FFN with w1, w3 column-parallel and w2 row-parallel over the
    world, its all-reduces through the ring; every rank gets the same `tokens` × d_model input."""
    torch.manual_seed(0)
    fwd, bwd = make_collectives("ring"), make_collectives("ring")
    state.drop("model", "x")
    state.model = ParallelSwiGLU(SwiGLU(d_model, d_ff), state.rank, state.world_size, fwd, bwd)
    state.x = torch.randn(tokens, d_model, requires_grad=True)
    state.buffer = None
    state.wrapper = {"forward": fwd.traffic, "backward": bwd.traffic}


def fsdp_tp_ffn_setup(state: WorkerState, n_tp: int, n_fsdp: int, d_model: int, d_ff: int, tokens: int) -> None:
    """fsdp_tp_calcs' mesh: the FFN over n_fsdp rows of n_tp ranks (impl.distributed.fsdp_tp),
    collectives through the ring; each row gets its tokens/n_fsdp slice of the batch."""
    if tokens % n_fsdp:
        raise ValueError(f"tokens={tokens} must be divisible by n_fsdp={n_fsdp}")
    torch.manual_seed(0)
    mesh = make_mesh(n_tp, n_fsdp)
    state.drop("model", "x")
    state.model = FSDPTPFeedForward(SwiGLU(d_model, d_ff), mesh, collectives="ring")
    x = torch.randn(tokens, d_model)
    state.x = x.chunk(n_fsdp)[mesh.fsdp_index].clone().requires_grad_(True)
    state.wrapper = {f"{axis} {phase}": t for (axis, phase), t in state.model.traffic.items()}


def ffn_step(state: WorkerState) -> TrafficReply:
    """Forward and backward of the set-up sharded FFN (loss = sum of y); traffic counted afresh."""
    for t in state.wrapper.values():
        t.reset()

    def run():
        state.model.zero_grad(set_to_none=True)
        state.x.grad = None
        state.model(state.x).sum().backward()
    dist.barrier()
    seconds = timed(state, run, kernel=False)
    return TrafficReply(seconds, {k: Traffic(**vars(t)) for k, t in state.wrapper.items()})
