"""Worker commands of perf/test_fsdp.py (run by impl.bench.worker_group): build one FSDP variant
on every rank, and one step with our FSDP's collective timeline recorded (impl.distributed.
fsdp_timeline). The timed step itself is impl.workloads.dist_steps.step, the same as DDP's."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.workloads.dist_steps import WorkerState, fresh_model, train_step
from impl.workloads.rank_memory import Allocated
from impl.workloads.steps import random_batch
from impl.workloads.variants import FSDPVariant
from impl.distributed.fsdp import FSDP
from impl.model import AdamW
from impl.model.transformer import TransformerBlock

def fsdp_wrapper(model: torch.nn.Module, variant: FSDPVariant | str):
    from impl.distributed.ddp import DDPBucketed

    V, variant = FSDPVariant, FSDPVariant.of(variant)
    if variant is V.FSDP:
        return FSDP(model)
    if variant is V.FSDP_BF16:
        return FSDP(model, compute_dtype=torch.bfloat16)
    if variant is V.FSDP_BLOCK_BF16:  # torch_fsdp_bf16's layout: one unit per block, the rest per weight
        return FSDP(model, compute_dtype=torch.bfloat16, unit=TransformerBlock, prefetch=1)
    if variant is V.DDP:
        return DDPBucketed(model, bucket_size_mb=100.0)
    if variant in (V.TORCH_FSDP, V.TORCH_FSDP_BF16):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if variant is V.TORCH_FSDP_BF16 else MixedPrecisionPolicy()
        # One FSDP unit per block plus the root (embeddings, final norm, head), torch's usual layout.
        for block in model.layers:
            fully_shard(block, mp_policy=mp)
        return fully_shard(model, mp_policy=mp)
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


__all__ = ["FSDPSetup", "TimelineReply", "fsdp_setup", "fsdp_timeline", "fsdp_wrapper"]
