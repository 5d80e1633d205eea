"""Worker commands of the distributed benchmarks (run on every rank by impl.bench.worker_group):
the all-reduce, the data-parallel training step of DDP, sharded-optimizer and FSDP rows (one
function, `train_step`), its memory-probed and profiled variants, and the set-up of each row's
model, wrapper and optimizer. A command is `fn(state, **kwargs)` on the rank's `WorkerState` (the
worker group's RankState with what these commands build: a group for them is made with
`state_type=WorkerState`).

Timed work is read with the clocks of impl.bench.timers on the rank's own device: the synchronised
host clock for steps, CUDA events for kernel-level work (the all-reduce); the reply's `seconds`
is what the parent's SlowestRankClock adds up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from impl.annotate import annotate
from impl.bench.harness import reset_peak_memory
from impl.workloads.rank_memory import Allocated, NamedBytes, named_bytes
from impl.workloads.steps import build_model, random_batch
from impl.bench.worker_group import RankState, Timed, timed
from impl.bench.traces import SYNC, step_timeline
from impl.distributed.release import Released
from impl.model import AdamW, cross_entropy
from impl.runtime import free_memory
from impl.workloads.variants import DDPVariant, ShardVariant


@dataclass
class WorkerState(RankState):
    """What a rank keeps between these commands."""

    model: torch.nn.Module | None = None
    model_key: tuple | None = None  # (size, context) the model was built for
    wrapper: Any = None  # a DDP / FSDP wrapper; None runs the bare model
    optimizer: Any = None
    x: torch.Tensor | None = None
    y: torch.Tensor | None = None
    active: bool = True  # False: this rank sits the row out (the single-GPU floor runs on rank 0)
    buffer: torch.Tensor | None = None  # the all-reduce's

    def drop(self, *names: str) -> None:
        """Forget `names` and free their memory. Post-accumulate-grad hooks that wrappers left on
        the parameters go too, so the next wrapper of the same parameters starts clean."""
        if self.model is not None and {"model", "wrapper", "optimizer"} & set(names):
            for p in self.model.parameters():
                hooks = getattr(p, "_post_accumulate_grad_hooks", None)
                if hooks:
                    hooks.clear()
        for name in names:
            setattr(self, name, None)
        free_memory()


@dataclass
class StepMemory:
    """Allocator readings around the optimizer step (peaks reset at the step's start and again
    right before the optimizer step) and, where asked, the named tensors at both points."""

    before: Allocated
    after: Allocated
    named_before: NamedBytes | None = None
    named_after: NamedBytes | None = None

    def peak(self) -> int | None:
        """The step's peak: the larger of the two phases' (None off CUDA)."""
        return None if self.before.peak is None else max(self.before.peak, self.after.peak)


@dataclass
class StepReply(Timed):
    """One training step on one rank; `seconds` is the whole step."""

    fwd_bwd_s: float  # until backward's compute finished (compute stream only)
    opt_s: float
    comm_s: float | None  # the wrapper's wait for its collectives after backward (ours only)
    bytes: int | None  # bytes the wrapper handed to collectives (ours only)
    loss: float
    prefetched: int | None = None  # FSDP: all-gathers issued ahead of their layer
    memory: StepMemory | None = None


@dataclass
class StepSummary:
    """A row's timed steps reduced, for its details: per figure the mean over steps of the slowest
    rank's value (None where no rank measured it); the bytes of the last step."""

    fwd_bwd_s: float | None
    opt_s: float | None
    comm_s: float | None
    bytes_per_step: int | None

    @classmethod
    def of(cls, steps: list[list[StepReply | None]]) -> StepSummary:
        def slowest(replies, key):
            vals = [getattr(r, key) for r in replies if r is not None and getattr(r, key) is not None]
            return max(vals) if vals else None

        def mean(key):
            vals = [v for v in (slowest(r, key) for r in steps) if v is not None]
            return sum(vals) / len(vals) if vals else None
        return cls(fwd_bwd_s=mean("fwd_bwd_s"), opt_s=mean("opt_s"), comm_s=mean("comm_s"),
                   bytes_per_step=slowest(steps[-1], "bytes") if steps else None)


def sync_compute(device: torch.device) -> None:
    """Wait for the compute stream only: NCCL work launched asynchronously runs on its own streams
    and keeps running, so an overlapped all-reduce is not counted as compute."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def train_step(state: WorkerState, memory: bool = False, named: bool = False) -> StepReply:
    """One data-parallel training step of the rank's model, wrapper and optimizer, with its phases
    annotated for the profiler. `memory`: read the allocator around the optimizer step (and the
    named tensors with `named`); the readings synchronise, so timed steps run without them."""
    dev, model, wrapper, opt = state.device, state.model, state.wrapper, state.optimizer
    forward = wrapper if wrapper is not None else model
    clock = state.clock(kernel=False)
    probe = {}
    start = clock()
    opt.zero_grad(set_to_none=True)
    if memory:
        reset_peak_memory(dev)
    with annotate("forward"):
        loss = cross_entropy(forward(state.x), state.y)
    with annotate("backward"):
        loss.backward()
        sync_compute(dev)
    fwd_bwd = time.perf_counter() - start
    comm_s = nbytes = None
    if hasattr(wrapper, "finish_gradient_synchronization"):
        with annotate(SYNC):
            wrapper.finish_gradient_synchronization()
        comm_s, nbytes = wrapper.comm_time_s, wrapper.bytes_communicated_last_step
    if memory:
        probe["before"] = Allocated.read(dev)
        probe["named_before"] = named_bytes(model, wrapper, opt) if named else None
        reset_peak_memory(dev)
    opt_start = time.perf_counter()
    with annotate("optimizer step"):
        opt.step()
    end = clock()
    if memory:
        probe["after"] = Allocated.read(dev)
        probe["named_after"] = named_bytes(model, wrapper, opt) if named else None
    return StepReply(seconds=end - start, fwd_bwd_s=fwd_bwd, opt_s=end - opt_start, comm_s=comm_s, bytes=nbytes,
                     loss=loss.item(), prefetched=getattr(wrapper, "prefetched_last_step", None),
                     memory=StepMemory(**probe) if memory else None)


# ---- commands --------------------------------------------------------------------------------


def allreduce(state: WorkerState, nbytes: int) -> Timed:
    """One all-reduce of `nbytes` of float32 ones, the ranks lined up by a barrier first; the
    time is device time (CUDA events on a GPU)."""
    numel = max(1, nbytes // 4)
    if state.buffer is None or state.buffer.numel() != numel:
        state.drop("buffer")
        state.buffer = torch.ones(numel, dtype=torch.float32, device=state.device)
    dist.barrier()
    release = Released()  # gloo's worker must let go of the buffer before this rank may exit (issue 23)
    release(state.buffer)
    result = Timed(timed(state, lambda: dist.all_reduce(state.buffer), kernel=True))
    release.wait()  # outside the timed region: on the CPU it sleeps until the worker is done
    return result


def step(state: WorkerState) -> StepReply | None:
    """The timed step: None on a rank that sits the row out."""
    return train_step(state) if state.active else None


def memory_step(state: WorkerState, named: bool = False) -> StepReply | None:
    """One more step after the timed ones, with the allocator (and named tensors) read around the
    optimizer step."""
    return train_step(state, memory=True, named=named) if state.active else None


def teardown(state: WorkerState) -> None:
    if state.model is not None:
        state.model.zero_grad(set_to_none=True)
    state.drop("wrapper", "optimizer", "x", "y")


def profiled_steps(state: WorkerState, warmup: int, steps: int, max_intervals: int) -> dict | None:
    """`steps` steps, profiled on rank 0 (the other ranks run them unprofiled): the timeline of the
    last one (impl.bench.traces) with that step's reply under "step"."""
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(warmup):
        train_step(state)
    if state.rank != 0:
        for _ in range(steps):
            train_step(state)
        return None
    cuda = state.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"step {i}"):
                last = train_step(state)
    return dict(step_timeline(prof, f"step {steps - 1}", max_intervals, cuda), step_s=last.seconds)


def _batch(state: WorkerState, batch: int, context: int):
    # Each rank draws its own micro-batch, as in data-parallel training.
    return random_batch(state.model, batch, context, state.device, seed=1000 + state.rank)


def fresh_model(state: WorkerState, size: str, context: int) -> torch.nn.Module:
    """A new model (seed 0 on every rank) for wrappers that take its parameters over (ZeRO-1's flat
    buffer, FSDP's shards), the allocator's peak reset first."""
    state.drop("model", "model_key", "wrapper", "optimizer", "x", "y")
    reset_peak_memory(state.device)
    state.model = build_model(size, context, state.device, seed=0)
    return state.model


# DDP ------------------------------------------------------------------------------------------


@dataclass
class DDPSetup:
    grad_bytes: int
    n_params: int
    num_buckets: int


def _fresh_parameters(model: torch.nn.Module) -> None:
    """Replace every Parameter object by a new one over the same storage: the previous wrapper's
    post-accumulate-grad hooks live on the old objects and must not fire for the next wrapper.
    Tied parameters stay tied (memo by identity)."""
    memo: dict[int, torch.nn.Parameter] = {}
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)
            m._parameters[name] = memo[id(p)]


def ddp_wrapper(model: torch.nn.Module, variant: DDPVariant | str, bucket_mb: float | None):
    from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive

    V, variant = DDPVariant, DDPVariant.of(variant)
    if variant is V.SINGLE:
        return None
    if variant is V.NAIVE:
        return DDPNaive(model)
    if variant is V.FLAT:
        return DDPFlat(model)
    if variant is V.INDIVIDUAL:
        return DDPIndividualParameters(model)
    if variant is V.BUCKETED:
        return DDPBucketed(model, bucket_size_mb=bucket_mb)
    if variant is V.TORCH_DDP:
        from torch.nn.parallel import DistributedDataParallel

        dev = next(model.parameters()).device
        kw = {} if bucket_mb is None else dict(bucket_cap_mb=bucket_mb)
        return DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None, **kw)
    raise AssertionError(f"no wrapper for {variant!r}")


def ddp_setup(state: WorkerState, size: str, max_context: int, context: int, batch: int, variant: DDPVariant,
              bucket_mb: float | None = None, lr: float = 1e-4) -> DDPSetup:
    """Wrap the rank's model (one per worker, built for the largest context so every context
    reuses it) in `variant` with a fresh AdamW (impl.model). "single" (the single-GPU floor) runs
    on rank 0 only, without a wrapper; the other ranks sit it out."""
    state.drop("wrapper", "optimizer", "x", "y")
    if state.model_key != (size, max_context):
        state.drop("model")
        state.model, state.model_key = build_model(size, max_context, state.device, seed=0), (size, max_context)
    model = state.model
    model.zero_grad(set_to_none=True)
    _fresh_parameters(model)
    state.active = variant != DDPVariant.SINGLE or state.rank == 0
    state.wrapper = ddp_wrapper(model, variant, bucket_mb)
    state.optimizer = AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    state.x, state.y = _batch(state, batch, context)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return DDPSetup(grad_bytes=grad_bytes, n_params=sum(p.numel() for p in model.parameters()),
                    num_buckets=len(getattr(state.wrapper, "buckets", []) or []))


# optimizer-state sharding ---------------------------------------------------------------------


@dataclass
class ShardSetup:
    init: Allocated  # model, wrapper and optimizer built (AdamW's state comes at the first step)
    named_init: NamedBytes
    n_params: int
    num_param_tensors: int
    owned_numel: int | None  # elements whose optimizer state this rank holds (our sharded optimizers)
    largest_numel: int


def sharding(model: torch.nn.Module, variant: ShardVariant | str, lr: float):
    """(wrapper, optimizer) of one optimizer-state sharding configuration."""
    from impl.distributed.ddp import DDPIndividualParameters, DDPNaive
    from impl.distributed.sharded_optimizer import ShardedOptimizer, ZeRO1Optimizer

    V, variant = ShardVariant, ShardVariant.of(variant)
    kw = dict(lr=lr, weight_decay=0.01)
    if variant is V.NONE:
        return DDPIndividualParameters(model), AdamW(model.parameters(), **kw)
    if variant is V.SHARDED:
        return DDPIndividualParameters(model), ShardedOptimizer(model.parameters(), AdamW, **kw)
    if variant is V.ZERO1:
        # ZeRO-1 reduce-scatters the raw local grads itself: the wrapper only broadcasts at init.
        return DDPNaive(model, reduce_gradients=False), ZeRO1Optimizer(model.parameters(), AdamW, **kw)
    if variant is V.TORCH_ZERO:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return DDPIndividualParameters(model), ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    raise AssertionError(f"no optimizer for {variant!r}")


def optimizer_bytes(state: WorkerState) -> int | None:
    """Bytes the sharded optimizer handed to collectives in the last step (ours only)."""
    return getattr(state.optimizer, "bytes_communicated_last_step", None)


def shard_setup(state: WorkerState, size: str, context: int, batch: int, variant: ShardVariant,
                lr: float = 1e-4) -> ShardSetup:
    """A fresh model per config (ZeRO-1 re-points parameters into its flat buffer, so a model is
    not reusable across configs); memory measured from an emptied allocator."""
    model = fresh_model(state, size, context)
    state.wrapper, state.optimizer = sharding(model, variant, lr)
    state.x, state.y = _batch(state, batch, context)
    state.active = True
    opt = state.optimizer
    owned = sum(p.numel() for p in opt.owned_params()) if hasattr(opt, "owned_params") else None
    params = list(model.parameters())
    return ShardSetup(init=Allocated.read(state.device), named_init=named_bytes(model, state.wrapper, opt),
                      n_params=sum(p.numel() for p in params), num_param_tensors=len(params), owned_numel=owned,
                      largest_numel=max(p.numel() for p in params))


__all__ = ["DDPSetup", "ShardSetup", "StepMemory", "StepReply", "StepSummary",
           "WorkerState", "allreduce", "ddp_setup", "fresh_model", "memory_step", "optimizer_bytes",
           "profiled_steps", "shard_setup", "step", "teardown", "train_step"]
