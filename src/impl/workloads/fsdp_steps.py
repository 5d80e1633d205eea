"""Worker commands of perf/test_fsdp.py (run by impl.bench.worker_group): build one FSDP variant
on every rank, and one step with our FSDP's collective timeline recorded (impl.distributed.
fsdp_timeline); build tensor parallelism on the same model and global batch, and time the matmul and
the all-reduce its prediction is made of. The timed step itself is impl.workloads.dist_steps.step,
the same as DDP's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

import torch.distributed as dist

from impl.bench.worker_group import timed
from impl.workloads.dist_steps import WorkerState, fresh_model, train_step
from impl.workloads.rank_memory import Allocated
from impl.workloads.steps import random_batch
from impl.workloads.variants import FSDPVariant
from impl.distributed.fsdp import FSDP
from impl.distributed.release import Released
from impl.distributed.tensor_parallel import TensorParallel
from impl.model import AdamW
from impl.model.transformer import TransformerBlock

def fsdp_wrapper(model: torch.nn.Module, variant: FSDPVariant | str, mesh=None):
    """The variant's wrapper of `model`. `mesh`: fully_shard's device mesh (None: torch's default,
    which is the GPUs where there are any; a CPU measurement passes a CPU mesh)."""
    from impl.distributed.ddp import DDPBucketed

    V, variant = FSDPVariant, FSDPVariant.of(variant)
    if variant is V.FSDP:
        return FSDP(model)
    if variant is V.FSDP_BF16:
        return FSDP(model, compute_dtype=torch.bfloat16)
    if variant is V.FSDP_BLOCK_BF16:  # torch_fsdp_bf16's layout: one unit per block, the rest per weight
        return FSDP(model, compute_dtype=torch.bfloat16, unit=TransformerBlock, prefetch=1)
    if variant is V.FSDP_BLOCK_BF16_RS1:  # and fully_shard's single flat gradient in flight
        return FSDP(model, compute_dtype=torch.bfloat16, unit=TransformerBlock, prefetch=1,
                    max_outstanding_reduce_scatters=1)
    if variant is V.DDP:
        return DDPBucketed(model, bucket_size_mb=100.0)
    if variant in (V.TORCH_FSDP, V.TORCH_FSDP_BF16):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if variant is V.TORCH_FSDP_BF16 else MixedPrecisionPolicy()
        # One FSDP unit per block plus the root (embeddings, final norm, head), torch's usual layout.
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        return fully_shard(model, mesh=mesh, mp_policy=mp)
    raise AssertionError(f"no wrapper for {variant!r}")


@dataclass
class FSDPSetup:
    init: Allocated  # after the wrapper and optimizer were built, from an emptied allocator
    n_params: int
    local_param_bytes: int  # the parameters this rank holds (its shards, for the sharded variants)


def fsdp_setup(state: WorkerState, size: str, context: int, batch: int, variant: str,
               lr: float = 1e-4) -> FSDPSetup:
    """A fresh model per variant (FSDP re-registers the weights); the optimizer is
    impl.model.AdamW on the wrapper's parameters."""
    model = fresh_model(state, size, context)
    n_params = sum(p.numel() for p in model.parameters())
    state.wrapper = fsdp_wrapper(model, variant)
    state.optimizer = AdamW(state.wrapper.parameters(), lr=lr, weight_decay=0.01)
    state.x, state.y = random_batch(model, batch, context, state.device, seed=1000 + state.rank)
    state.active = True
    # fully_shard's parameters are DTensors, whose numel() is the global one: count the local shard.
    local = sum(q.numel() * q.element_size() for q in (getattr(p, "to_local", lambda p=p: p)()
                                                        for p in state.wrapper.parameters()))
    return FSDPSetup(init=Allocated.read(state.device), n_params=n_params, local_param_bytes=local)


@dataclass
class TimelineReply:
    step_s: float  # the instrumented step's time on this rank
    summary: dict  # impl.distributed.fsdp_timeline's summary
    timeline: dict | None  # rank 0 only: the rows (at most max_rows) and summary


def fsdp_timeline(state: WorkerState, max_rows: int) -> TimelineReply | None:
    """One more step with our FSDP's timeline recorded, outside the benchmark's timed steps. None
    for the other wrappers."""
    wrapper = state.wrapper
    if not isinstance(wrapper, FSDP):
        return None
    wrapper.record_timeline = True
    try:
        reply = train_step(state)
    finally:
        wrapper.record_timeline = False
    tl = wrapper.last_timeline(max_rows)
    return TimelineReply(step_s=reply.seconds, summary=tl["summary"], timeline=tl if state.rank == 0 else None)


@dataclass
class TPSetup:
    init: Allocated  # after the wrapper and optimizer were built, from an emptied allocator
    n_params: int  # of the unsharded model
    local_param_bytes: int  # this rank's shards and the replicated parameters


def tp_setup(state: WorkerState, size: str, context: int, batch: int, lr: float = 1e-4) -> TPSetup:
    """A fresh model, its blocks sharded over every rank (impl.distributed.TensorParallel), AdamW on
    what this rank keeps. Every rank gets the same whole batch (`batch` sequences): TP splits the
    work of each sequence, not the sequences."""
    model = fresh_model(state, size, context)
    n_params = sum(p.numel() for p in model.parameters())
    state.wrapper = TensorParallel(model)
    state.optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    state.x, state.y = random_batch(model, batch, context, state.device, seed=1000)
    state.active = True
    return TPSetup(init=Allocated.read(state.device), n_params=n_params,
                   local_param_bytes=sum(p.numel() * p.element_size() for p in model.parameters()))


@dataclass
class TPTraffic:
    calls: int  # all-reduces of one step (forward and backward)
    payload_bytes: int  # the activations handed to them


def tp_step_traffic(state: WorkerState) -> TPTraffic:
    """One untimed step with TP's collectives counted from zero."""
    state.wrapper.reset_traffic()
    train_step(state)
    f, b = state.wrapper.forward_traffic, state.wrapper.backward_traffic
    return TPTraffic(calls=f.calls + b.calls, payload_bytes=f.payload_bytes + b.payload_bytes)


@dataclass
class TPProbe:
    """What tp_calcs' prediction is made of, measured on this rank in this run."""

    matmul_flops_per_s: float  # (tokens, d_model) @ (d_model, d_ff / N), the block's typical shard
    allreduce_s: float  # one all-reduce of a (tokens, d_model) activation
    allreduce_bytes: int


def tp_probe(state: WorkerState, tokens: int, d_model: int, d_ff: int, reps: int) -> TPProbe:
    """Median over `reps` of a column-parallel shard's matmul and of one activation all-reduce,
    each on the rank's kernel clock (CUDA events on a GPU), in the model's dtype."""
    dtype = next(state.model.parameters()).dtype
    n = dist.get_world_size()
    x = torch.randn(tokens, d_model, device=state.device, dtype=dtype)
    w = torch.randn(d_model, d_ff // n, device=state.device, dtype=dtype)
    act = torch.randn(tokens, d_model, device=state.device, dtype=dtype)

    def median(fn) -> float:
        fn()  # warm-up (cuBLAS heuristics, NCCL's first use of this size)
        return sorted(timed(state, fn, kernel=True) for _ in range(reps))[reps // 2]

    mm_s = median(lambda: x @ w)
    dist.barrier()
    with Released() as keep:  # gloo's worker must let go before this rank may exit (issue 23)
        ar_s = median(lambda: dist.all_reduce(keep(act)))
    return TPProbe(matmul_flops_per_s=2 * tokens * d_model * (d_ff // n) / mm_s, allreduce_s=ar_s,
                   allreduce_bytes=act.numel() * act.element_size())


__all__ = ["FSDPSetup", "TPProbe", "TPSetup", "TPTraffic", "TimelineReply", "fsdp_setup", "fsdp_timeline",
           "fsdp_wrapper", "tp_probe", "tp_setup", "tp_step_traffic"]
