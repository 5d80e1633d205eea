"""leaderboard (2026): one full training step of the 8B model (SPEC "leaderboard (2026)": zero_grad,
forward, cross-entropy summed over tokens, backward, AdamW step; context 32,768, batch 2, bf16,
causal, two GPUs), built for one rank.

The step is impl.workloads.steps.make_train_step's with: FlashAttention-2 (`flash_triton`, head dim
128), the Linear weights in bf16 with fp32 masters in AdamWMaster, the fused chunked LM head +
cross-entropy with reduction "sum" (full fp32 logits would be 32,768 × 2 × 151,936 × 4 B = 40 GB),
and activation checkpointing per block (impl.checkpointing). With a process group of world size
N > 1 it is data parallel: rank r takes its contiguous share batch/N of the global batch, the
gradients are summed over the ranks during backward (DDPBucketed with average=False: the loss is
a sum) and the optimizer states are sharded (ShardedOptimizer over AdamWMaster: each rank keeps
the masters and moments of the parameters it owns and broadcasts their new values). ZeRO-1's
reduce-scatter schedule does not compose with AdamWMaster (impl.distributed.sharded_optimizer).
StepSpec.grad_sync "reduce_to_owner" sends each gradient only to the rank that owns its parameter
(impl.distributed.DDPReduceToOwner, ZeRO-2): half the bytes of the all-reduce, and no gradient of
another rank's parameters kept.

`num_layers` below the config's gives the reduced-layer steps that one GPU can hold, from which
impl.leaderboard_prediction predicts the 34-layer step on two GPUs. The worker commands at the end
run the step on every rank of an impl.bench.worker_group (perf/test_leaderboard_2026.py's two-GPU rows).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from impl.bench.compile_caches import CompileCaches
from impl.model.fused_ce import MAX_CHUNK_BYTES, SOFTMAXES, LMHead
from impl.bench.timers import time_once
from impl.bench.worker_group import RankState, Timed, timed
from impl.workloads.rank_memory import Allocated
from impl.runtime import free_memory, synchronize

from impl.workloads.steps import GRAD_SYNCS as TRAIN_GRAD_SYNCS
from impl.workloads.steps import TrainConfig, bf16_params, make_train_step, random_batch
from impl.checkpointing import POLICIES, TAKES_K, apply_checkpointing
from impl.model import ModelConfig, TransformerLM, model_config

CONFIG = "8B"
CONTEXT = 32_768
BATCH = 2  # the global batch, over WORLD_SIZE ranks
WORLD_SIZE = 2
# The handout's limit: "From an empty PyTorch/Triton cache, your benchmarking run must complete within
# 10 minutes".
COLD_RUN_LIMIT_S = 600.0
# The course's best class entry (SPEC "leaderboard (2026)"): one step in 3.84 s on two B200s, the GPU
# named as impl.bench.peaks.DATASHEET_BF16_FLOPS names it.
COMPILES = ("none", "pointwise")  # StepSpec.compile
# StepSpec.allocator: the caching allocator's default segments, or expandable segments (one virtual range
# grown in place: no cudaMalloc/cudaFree, and their device syncs, when a large block does not fit a segment)
ALLOCATORS = ("default", "expandable_segments")
GRAD_SYNCS = tuple(s for s in TRAIN_GRAD_SYNCS if s != "none")  # StepSpec.grad_sync (impl.workloads.steps)
# StepSpec.nccl_max_ctas's bound: a cap, so at most the channels NCCL uses on two NVLink GPUs; above its
# MAXCHANNELS (32 or 64 by release) NCCL ignores the setting with a warning, and a row would claim a cap it never had
MAX_NCCL_CTAS = 32
RESIDUALS = ("fp32", "bf16")  # StepSpec.residual
CLASS_BEST_STEP_S = 3.84
CLASS_BEST_GPUS = 2
CLASS_BEST_GPU = "B200"


@dataclass(frozen=True)
class StepSpec:
    """What one leaderboard step is. Defaults: SPEC's (the 34-layer 8B model on two GPUs).

    config         a name of impl.model.MODEL_CONFIGS
    num_layers     None for the config's own; fewer for the reduced-layer runs
    batch          the global batch (sequences); each of N ranks takes batch / N
    context        tokens per sequence (the model's context_length too)
    checkpointing  impl.checkpointing policy: "none", "every_k" (checkpoint_k: the segment length),
                   "nested", or "keep_attention" (checkpoint_k: the blocks at the end run plainly)
    attn_impl      "flash_triton" (ours); "flash_torch" for CPU checks in bf16, where the Triton
                   interpreter's bf16 dot is wrong
    compile        "none", or "pointwise": the RMSNorms, RoPE and SwiGLUs through torch.compile
                   (impl.workloads.pointwise_compile; Inductor on a GPU, aot_eager on the CPU)
    allocator      one of ALLOCATORS, set by rank_setup on a CUDA rank before it builds the step
    grad_sync      one of GRAD_SYNCS with N > 1 ranks: "ddp_bucketed" (every gradient all-reduced), or
                   "reduce_to_owner" (each reduced to its owner in the sharded optimizer only: ZeRO-2)
    nccl_high_priority  the step's collectives on a high-priority CUDA stream (ProcessGroupNCCL.Options'
                   is_high_priority_stream): the SMs' block scheduler then places NCCL's blocks ahead of
                   the compute kernels' waiting ones
    nccl_max_ctas  None, or at most this many CTAs (channels: one SM each) per collective (the
                   communicator's ncclConfig_t.maxCTAs, what NCCL_MAX_CTAS / NCCL_MAX_NCHANNELS set for a
                   whole process); 1..MAX_NCCL_CTAS
    residual       "fp32": the token embedding stays fp32, so the residual stream is fp32 under autocast;
                   "bf16": the embedding is bf16 through its master too, so the residual stream, the
                   checkpoints' saved block inputs and their gradients are bf16 (TrainConfig.weights
                   "bf16_residual")
    lm_head_chunk_mib  the fused LM head's fp32 logits a chunk, MiB (the default is impl.model.fused_ce's
                   256): at 256, 75 chunks of 441 tokens a rank, each adding its weight
                   gradient into the fp32 sum (2.5 GB read and written, plus the 1.2 GB bf16 product)
    lm_head_softmax  its softmax step: "torch" (an fp32 copy of each chunk's logits, ~8 passes over it) or
                   "triton" (impl.model.ce_softmax: one kernel, the gradient written over the bf16 logits)
    With either NCCL option, rank_setup runs the step on a process group of its own made with them
    (step_group): NCCL reads its options as it creates a communicator, and a worker's default group
    has had its communicator since it started. NCCL only (nccl_refusal).
    """

    config: str = CONFIG
    num_layers: int | None = None
    batch: int = BATCH
    context: int = CONTEXT
    checkpointing: str = "every_k"
    checkpoint_k: int | None = 1
    attn_impl: str = "flash_triton"
    compile: str = "none"
    allocator: str = "default"
    grad_sync: str = "ddp_bucketed"
    nccl_high_priority: bool = False
    nccl_max_ctas: int | None = None
    residual: str = "fp32"
    lm_head_chunk_mib: int = MAX_CHUNK_BYTES // 2**20
    lm_head_softmax: str = "torch"
    lr: float = 1e-4
    weight_decay: float = 0.01

    def __post_init__(self):
        model_config(self.config)  # a clear ValueError for an unknown name
        for name in ("num_layers", "batch", "context", "lm_head_chunk_mib"):
            value = getattr(self, name)
            if value is None and name == "num_layers":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StepSpec.{name} must be a positive int, got {value!r}")
        for name, allowed in (("compile", COMPILES), ("allocator", ALLOCATORS), ("grad_sync", GRAD_SYNCS),
                              ("lm_head_softmax", SOFTMAXES), ("residual", RESIDUALS), ("checkpointing", POLICIES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"StepSpec.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if not isinstance(self.nccl_high_priority, bool):
            raise ValueError(f"StepSpec.nccl_high_priority must be a bool, got {self.nccl_high_priority!r}")
        ctas = self.nccl_max_ctas
        if ctas is not None and (isinstance(ctas, bool) or not isinstance(ctas, int) or not 1 <= ctas <= MAX_NCCL_CTAS):
            raise ValueError(f"StepSpec.nccl_max_ctas must be None or an int in 1..{MAX_NCCL_CTAS} (NCCL's channels), "
                             f"got {ctas!r}")
        k, least = self.checkpoint_k, TAKES_K.get(self.checkpointing)
        if (least is None) != (k is None) or \
                (k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < least)):
            raise ValueError(f"StepSpec.checkpoint_k is given for checkpointing {sorted(TAKES_K)} only (an int >= "
                             f"{TAKES_K}), got checkpointing={self.checkpointing!r}, checkpoint_k={k!r}")

    @property
    def nccl_options(self) -> dict[str, object]:
        """The NCCL options this step sets (empty: NCCL's defaults on the default group)."""
        return {k: v for k, v in (("nccl_high_priority", self.nccl_high_priority),
                                  ("nccl_max_ctas", self.nccl_max_ctas)) if v not in (False, None)}

    def nccl_refusal(self, backend: str) -> str | None:
        """Why this step cannot run on `backend`, or None: its NCCL options configure an NCCL communicator,
        and on another backend they would be silently nothing (a row claiming a setting it never had)."""
        if self.nccl_options and backend != "nccl":
            return f"{', '.join(self.nccl_options)} configure(s) an NCCL communicator; the backend is {backend}"
        return None

    @property
    def model(self) -> ModelConfig:
        base = model_config(self.config)
        return base if self.num_layers is None else base.replace(num_layers=self.num_layers)

    def train_config(self, world_size: int) -> TrainConfig:
        """The step as a TrainConfig: bf16 weights (the embedding too for residual "bf16"), fp32 masters,
        fused LM head + summed loss."""
        distributed = world_size > 1
        weights = "bf16" if self.residual == "fp32" else "bf16_residual"
        return TrainConfig(dtype="bf16", weights=weights, attn_impl=self.attn_impl, compile=self.compile,
                           optimizer="adamw_master_sharded" if distributed else "adamw_master",
                           fused_ce=True, loss="sum", grad_sync=self.grad_sync if distributed else "none")

    def flops(self, world_size: int = 1) -> float:
        """Model FLOPs of one rank's share of the step (impl.model.flops: matmuls, full attention square)."""
        return self.model.flops("train_step", local_batch(self.batch, world_size), self.context)


LEADERBOARD = StepSpec()


def local_batch(batch: int, world_size: int) -> int:
    """Sequences per rank: the global batch split evenly (a remainder would make the ranks' steps unequal)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if batch % world_size:
        raise ValueError(f"batch {batch} is not divisible by the world size {world_size}: every rank takes an "
                         "equal share of the global batch")
    return batch // world_size


@dataclass
class LeaderboardStep:
    """One rank's step: `step()` runs it and returns this rank's loss (summed over its tokens)."""

    spec: StepSpec
    step: Callable[[], torch.Tensor]
    model: TransformerLM
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    rank: int
    world_size: int

    @property
    def tokens(self) -> int:
        return self.x.numel()


def _world(group) -> tuple[int, int]:
    if group is None:
        return 0, 1
    world_size = dist.get_world_size(group)
    if world_size != dist.get_world_size():
        raise ValueError(f"group: the step's batch is split over every rank; got a group of {world_size} ranks in a "
                         f"world of {dist.get_world_size()}")
    return dist.get_rank(group), world_size


def build_step(spec: StepSpec, device: torch.device, group=None, seed: int = 0) -> LeaderboardStep:
    """This rank's step. group: None for one process; else a process group of every rank (the default
    one, or step_group's): every rank builds the same model from `seed` and the same global batch, takes
    its share, and the gradient sync and sharded optimizer run on `group`."""
    rank, world_size = _world(group)
    per_rank = local_batch(spec.batch, world_size)
    torch.manual_seed(seed)
    model = TransformerLM(**spec.model, context_length=spec.context, attn_impl=spec.attn_impl, device=device)
    apply_checkpointing(model, spec.checkpointing, spec.checkpoint_k)
    x, y = random_batch(model, spec.batch, spec.context, device, seed=seed)
    x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
    # Inductor where it generates GPU kernels; on the CPU (checks, the smoke profile) aot_eager, which
    # traces the same graphs without the C++ compiles that take ~40 s each on the CI machine
    backend = "inductor" if device.type == "cuda" else "aot_eager"
    step, optimizer = make_train_step(spec.train_config(world_size), model, x, y, backend=backend, lr=spec.lr,
                                      weight_decay=spec.weight_decay, group=group,
                                      lm_head=LMHead(spec.lm_head_chunk_mib * 2**20, spec.lm_head_softmax))
    return LeaderboardStep(spec, step, model, optimizer, x, y, rank, world_size)


def master_weights(built: LeaderboardStep) -> dict[str, torch.Tensor]:
    """Every parameter by name in fp32: the bf16 Linear weights' masters where this rank keeps them
    (all of them on one process, its own shard's on a rank of a sharded step), else the values."""
    opt = built.optimizer
    local = getattr(opt, "local_optimizer", opt)
    bf16 = {id(p) for p in bf16_params(built.model, built.spec.train_config(built.world_size).weights)}
    out = {}
    for name, p in built.model.named_parameters():
        has_master = id(p) in bf16 and "master_lo" in local.state.get(p, {})
        out[name] = local.master(p) if has_master else p.detach().float().clone()
    return out


# ---- worker commands: the step on every rank of a worker group ------------------------------------


@dataclass
class StepRankState(RankState):
    built: LeaderboardStep | None = None
    group: object = None  # step_group's own group, while a step with NCCL options is built


def step_group(spec: StepSpec):
    """The process group the step's collectives run on: the default one, or for a step with NCCL options a
    new NCCL group of every rank whose communicator NCCL creates with them (at its first collective).
    A collective call: every rank makes it. ValueError (spec.nccl_refusal) on another backend."""
    if not spec.nccl_options:
        return dist.group.WORLD
    refusal = spec.nccl_refusal(dist.get_backend())
    if refusal is not None:
        raise ValueError(f"StepSpec: {refusal}")
    options = dist.ProcessGroupNCCL.Options(is_high_priority_stream=spec.nccl_high_priority)
    if spec.nccl_max_ctas is not None:
        options.config.max_ctas = spec.nccl_max_ctas
    return dist.new_group(backend="nccl", pg_options=options)


def _release_group(state: StepRankState) -> None:
    if state.group is not None:
        dist.destroy_process_group(state.group)
        state.group = None


def rank_setup(state: StepRankState, spec: StepSpec) -> Allocated:
    """Build this rank's step on step_group's group; the allocator's reading after it, its peak counted
    from an emptied allocator."""
    state.built = None
    _release_group(state)
    free_memory()  # every segment of the previous candidate released, so the setting below governs them all
    if state.device.type == "cuda":
        torch.cuda.memory._set_allocator_settings(
            f"expandable_segments:{spec.allocator == 'expandable_segments'}")  # a worker runs several candidates
        torch.cuda.reset_peak_memory_stats(state.device)
    group = step_group(spec)
    state.group = None if group is dist.group.WORLD else group
    state.built = build_step(spec, state.device, group=group)
    return Allocated.read(state.device)


@dataclass
class FirstCall(Timed):
    caches: CompileCaches  # what the on-disk compile caches held when the call began


def rank_first_step(state: StepRankState) -> FirstCall:
    """The first call, from this process's empty autotune cache (compilation, autotuning, optimizer
    state allocation), timed apart, with what the on-disk caches held before it."""
    caches = CompileCaches.read()
    return FirstCall(time_once(state.built.step, state.device), caches)


def rank_step(state: StepRankState) -> Timed:
    return Timed(timed(state, state.built.step, kernel=False))


def rank_do_bench(state: StepRankState, warmup_ms: float, rep_ms: float) -> float:
    """The handout's timing of the step: triton.testing.do_bench's median, in seconds. Every rank
    must call the step equally often: with warm-up and rep far below one step (the defaults, on a
    multi-second step), do_bench's estimate gives one warm-up and one timed call on every rank."""
    from triton.testing import do_bench

    return do_bench(state.built.step, warmup=warmup_ms, rep=rep_ms, return_mode="median") / 1e3


def rank_breakdown(state: StepRankState, step_s: float, warmup: int = 1) -> dict | None:
    """Where one step's time goes on rank 0 (impl.workloads.kernels.step_breakdown: kernel time per
    phase and category, the top kernels, the gap to `step_s`, the unprofiled step time), from one
    profiled step after `warmup` unrecorded ones; the other ranks run as many steps unprofiled."""
    from impl.workloads.kernels import profile_calls, step_breakdown

    if state.rank != 0:
        for _ in range(warmup + 1):
            state.built.step()
        synchronize(state.device)
        return None
    profile, _ = profile_calls(lambda: state.built.step(annotated=True), state.device, warmup=warmup, steps=1)
    return step_breakdown(profile, step_s)


def rank_peak(state: StepRankState) -> Allocated:
    """The allocator now and its peak since set-up: the step's peak, first call included."""
    return Allocated.read(state.device)


def rank_teardown(state: StepRankState) -> None:
    state.built = None
    _release_group(state)
    free_memory()


__all__ = ["ALLOCATORS", "GRAD_SYNCS", "MAX_NCCL_CTAS", "BATCH", "CLASS_BEST_GPU", "CLASS_BEST_GPUS", "CLASS_BEST_STEP_S", "COLD_RUN_LIMIT_S", "COMPILES", "CONFIG", "CONTEXT", "LEADERBOARD", "LeaderboardStep", "StepRankState", "StepSpec", "WORLD_SIZE",
           "build_step", "local_batch", "master_weights", "rank_breakdown", "rank_do_bench", "rank_first_step", "rank_peak", "rank_setup",
           "rank_step", "rank_teardown", "step_group"]
