"""The types of the sweep grids (their values, per profile, are in impl.workloads.sweeps): one frozen
dataclass per perf file's grid, so a grid is read by attribute and a missing or misspelt field fails
at import, not in the middle of a GPU run. Sequences are tuples (a grid is a constant); sizes named
by [edition, name] pairs are impl.model.SizeRef; variant and mode names are the StrEnums of
impl.workloads.variants."""
from __future__ import annotations

from dataclasses import dataclass

from impl.model import SizeRef
from impl.workloads.variants import DDPVariant, FSDPVariant, ShardVariant, StepMode


@dataclass(frozen=True)
class Tolerance:
    """Relative errors allowed against the reference: the output's, and each gradient's."""

    out: float
    grad: float


@dataclass(frozen=True)
class Rounds:
    """How a row of the grid is timed: untimed warm-up calls, then timed rounds."""

    warmup: int
    rounds: int


@dataclass(frozen=True)
class ScriptGrid(Rounds):
    """benchmarking_script (2025): sizes x contexts x modes x dtypes."""

    sizes: tuple[str, ...]
    contexts: tuple[int, ...]
    modes: tuple[StepMode, ...]
    dtypes: tuple[str, ...]
    batch: int


@dataclass(frozen=True)
class ScriptWarmupGrid:
    """benchmarking_script (c): each warm-up count in `warmups`."""

    sizes: tuple[str, ...]
    contexts: tuple[int, ...]
    modes: tuple[StepMode, ...]
    dtypes: tuple[str, ...]
    warmups: tuple[int, ...]
    batch: int
    rounds: int
    left_out: str


@dataclass(frozen=True)
class Script2026Grid(Rounds):
    """benchmarking_script (b) and benchmarking_mixed_precision (c), 2026: the modes timed per dtype."""

    edition: str
    sizes: tuple[str, ...]
    context: int
    batch: int
    modes: dict[str, tuple[StepMode, ...]]


@dataclass(frozen=True)
class FreshWarmupGrid:
    """benchmarking_script (c), 2026: each warm-up count in a fresh process."""

    edition: str
    sizes: tuple[str, ...]
    context: int
    batch: int
    dtype: str
    warmups: tuple[int, ...]
    rounds: int
    start_timeout_s: float
    step_timeout_s: float
    left_out: str


@dataclass(frozen=True)
class ProfiledStepsGrid:
    """What nsys_profile's rows share: the timer's warm-up and rounds, the profiled steps, the
    kernel table's length and the largest trace kept."""

    dtype: str
    batch: int
    timer_warmup: int
    timer_rounds: int
    prof_warmup: int
    prof_steps: int
    top: int
    trace_max_mb: float
    budget_s: float


@dataclass(frozen=True)
class NsysGrid(ProfiledStepsGrid):
    sizes: tuple[str, ...]
    contexts: tuple[int, ...]
    trace: tuple[str, int]  # (size, context) whose trace is kept


@dataclass(frozen=True)
class Nsys2026Grid(ProfiledStepsGrid):
    """The `n_sizes` largest `candidates` with `n_contexts` powers of two in [min_context,
    max_context] whose step fits `headroom` of `device_bytes` (None: the device's)."""

    edition: str
    candidates: tuple[str, ...]
    n_sizes: int
    n_contexts: int
    min_context: int
    max_context: int
    headroom: float
    device_bytes: int | None


@dataclass(frozen=True)
class MixedPrecisionGrid(Rounds):
    steps: int
    autocast_dtypes: tuple[str, ...]


@dataclass(frozen=True)
class MemoryProfilingGrid(Rounds):
    sizes: tuple[str, ...]
    contexts: tuple[int, ...]
    dtypes: tuple[str, ...]
    modes: tuple[StepMode, ...]
    batch: int
    snapshot_dtypes: tuple[str, ...]
    max_points: int
    artifacts: tuple[tuple[str, str, int, str, StepMode], ...]  # (edition, size, context, dtype, mode)
    cases_2026: tuple[tuple[str, int], ...]  # (size of the 2026 table, context)
    probe_layers: int
    probe_top: int
    # the 2025 handout's reference hyperparameters' context (batch 4, context 512), at which its (d) and (e)
    # are asked: its rows are marked (details.reference_context); the other contexts' rows are extra rows
    reference_context: int | None = None


@dataclass(frozen=True)
class CompileModelGrid:
    sizes: tuple[SizeRef, ...]  # by edition: the 2026 edition's 10B beside the 2025 table
    contexts: tuple[int, ...]
    modes: tuple[StepMode, ...]
    dtype: str
    batch: int
    compile: str
    dynamic_seq: bool
    backend: str
    warmup: int
    rounds_min: int
    rounds_max: int
    row_s: float
    budget_s: float


@dataclass(frozen=True)
class CommAccountingGrid(Rounds):
    fsdp_tokens: tuple[int, ...]
    bucket_model_size: str
    bucket_sizes_mb: tuple[float, ...]
    bucket_o_s: float  # PLACEHOLDER input, not a measurement
    bucket_w_Bps: float  # PLACEHOLDER input, not a measurement
    world_sizes: tuple[int, ...]


@dataclass(frozen=True)
class MemoryAccountingGrid(Rounds):
    sizes: tuple[str, ...]
    batch: int
    contexts: tuple[int, ...]
    world_size: int


@dataclass(frozen=True)
class AttentionGrid(Rounds):
    """pytorch_attention: naive attention per (d, seq)."""

    batch: int
    dims: tuple[int, ...]
    seqs: tuple[int, ...]
    dtype: str
    budget_s: float


@dataclass(frozen=True)
class CompiledAttentionGrid(AttentionGrid):
    backend: str


@dataclass(frozen=True)
class KernelTiming(Rounds):
    """Kernel rows: the harness's warm-up and rounds, and do_bench's cross-check."""

    warmup_ms: float
    rep_ms: float
    budget_s: float


@dataclass(frozen=True)
class FlashGrid(KernelTiming):
    batch: int
    seqs: tuple[int, ...]
    dims: tuple[int, ...]
    dtypes: tuple[str, ...]
    modes: tuple[str, ...]
    impls: tuple[str, ...]
    naive_max_seq: int
    compiled_bwd_dims: tuple[int, ...]
    autotune: bool


@dataclass(frozen=True)
class HostCost(Rounds):
    """One tiny attention shape whose fwd+bwd call is timed on the host clock (impl.bench.timers.HostTimer)."""
    shape: tuple[int, int, int]  # (batch, heads, seq)
    d: int
    causal: bool
    dtype: str


@dataclass(frozen=True)
class FlashShapesGrid(KernelTiming):
    dims: tuple[int, ...]
    causal: tuple[bool, ...]
    shapes: tuple[tuple[int, int, int], ...]  # (batch, heads, seq)
    modes: tuple[str, ...]
    impls: tuple[str, ...]
    dtype: str
    compile: bool
    tol: Tolerance
    host: HostCost  # the host-cost row (issue 36)


@dataclass(frozen=True)
class LeaderboardGrid(Rounds):
    batch: int
    heads: int
    seq: int
    d: int
    dtype: str
    compile: bool
    tol: Tolerance


@dataclass(frozen=True)
class DistributedGrid(Rounds):
    """A distributed perf file: its wall-clock budget and each command's timeout."""

    budget_s: float
    timeout_s: float


@dataclass(frozen=True)
class CommunicationGrid(DistributedGrid):
    sizes_mb: tuple[float, ...]
    runs: tuple[tuple[str, int], ...]  # (backend, processes)
    left_out: str | None = None


@dataclass(frozen=True)
class DDPTrace:
    """ddp_overlap_individual_parameters_benchmarking (b): the profiled rows' timelines."""

    context: int
    variants: tuple[tuple[DDPVariant, float | None], ...]  # (variant, bucket MB)
    warmup: int
    steps: int
    max_intervals: int


@dataclass(frozen=True)
class DDPGrid(DistributedGrid):
    sizes: tuple[SizeRef, ...]
    world_size: int
    configs: tuple[tuple[int, int], ...]  # (context, per-rank batch)
    bucket_mb: tuple[float, ...]
    bucketed_editions: tuple[str, ...]
    variants: tuple[DDPVariant, ...]
    trace: DDPTrace


@dataclass(frozen=True)
class ShardingGrid(DistributedGrid):
    sizes: tuple[SizeRef, ...]
    world_size: int
    context: int
    batch: int
    variants: tuple[ShardVariant, ...]


@dataclass(frozen=True)
class FSDPGrid(DistributedGrid):
    sizes: tuple[SizeRef, ...]
    world_size: int
    context: int
    batch: int
    variants: tuple[FSDPVariant, ...]
    timeline_rows: int
    # Tensor parallelism beside them on the same model and global batch (world_size x batch
    # sequences, all of them on every TP rank), at each of these group sizes
    tp_world_sizes: tuple[int, ...] = ()
    tp_probe_reps: int = 10  # timed repeats of the matmul and all-reduce behind TP's prediction


@dataclass(frozen=True)
class PerRankMemoryGrid(Rounds):
    size: SizeRef
    world_size: int
    context: int
    batch: int
    stages: dict[str, int]  # ZeRO stage of each variant's closed form


@dataclass(frozen=True)
class CheckpointDepth:
    width: str
    layers: tuple[int, ...]
    batch: int
    context: int
    dtype: str
    policies: tuple[str, ...]


@dataclass(frozen=True)
class CheckpointCase2026:
    edition: str
    size: str
    batch: int
    context: int
    dtype: str


@dataclass(frozen=True)
class CheckpointingGrid(Rounds):
    size: str
    batch: int
    context: int
    dtypes: tuple[str, ...]
    depth: CheckpointDepth
    edition_2026: CheckpointCase2026
    budget_s: float


@dataclass(frozen=True)
class TrainingStepGrid(Rounds):
    sizes: tuple[str, ...]
    contexts: tuple[int, ...]
    configs: tuple[str, ...]  # named configs of impl.workloads.steps, in run order
    batch: int
    flash_impl: str
    compile_backend: str
    profiled: tuple[str, ...]
    prof_warmup: int
    top_kernels: int
    budget_s: float


@dataclass(frozen=True)
class FFNShape:
    d_model: int
    d_ff: int
    tokens: int


@dataclass(frozen=True)
class ParallelismGrid(DistributedGrid):
    world_sizes: tuple[int, ...]
    numels: tuple[int, ...]
    ffn: FFNShape
    mesh: tuple[int, int]  # (N_TP, N_FSDP)


@dataclass(frozen=True)
class Leaderboard2026Grid(Rounds):
    config: str
    layers: tuple[int, ...]
    batch: int
    context: int
    policies: tuple[tuple[str, int | None], ...]  # (checkpointing policy, its k)
    attn_impl: str
    budget_s: float
    two_gpus: "LeaderboardTwoGPUGrid | None" = None


@dataclass(frozen=True)
class StepCandidate:
    """One way to run the two-GPU leaderboard step: impl.workloads.leaderboard_2026.StepSpec's
    checkpointing, checkpoint_k, compile, attn_impl (None: the grid's), allocator, grad_sync, NCCL options,
    residual dtype and the LM head's chunk (MiB; None: StepSpec's default) and softmax step."""

    checkpointing: str
    k: int | None
    compile: str = "none"
    attn_impl: str | None = None
    allocator: str = "default"
    grad_sync: str = "ddp_bucketed"
    nccl_high_priority: bool = False
    nccl_max_ctas: int | None = None
    residual: str = "fp32"
    lm_head_chunk_mib: int | None = None
    lm_head_softmax: str = "torch"

    @property
    def id(self) -> str:  # the test id: "keep_attention-3", "keep_attention-3-pointwise-flash_gluon_ws"
        return "-".join([self.checkpointing, str(self.k)] + [self.compile] * (self.compile != "none")
                        + [self.attn_impl] * (self.attn_impl is not None)
                        + [self.allocator] * (self.allocator != "default")
                        + [self.grad_sync] * (self.grad_sync != "ddp_bucketed")
                        + ["nccl_high_priority"] * self.nccl_high_priority
                        + [f"nccl_max_ctas{self.nccl_max_ctas}"] * (self.nccl_max_ctas is not None)
                        + [f"residual_{self.residual}"] * (self.residual != "fp32")
                        + [f"lm_head_chunk{self.lm_head_chunk_mib}"] * (self.lm_head_chunk_mib is not None)
                        + [f"lm_head_{self.lm_head_softmax}"] * (self.lm_head_softmax != "torch"))


@dataclass(frozen=True)
class LeaderboardTwoGPUGrid(DistributedGrid):
    """The leaderboard step itself on `world_size` ranks: each candidate (checkpointing policy, its
    k) is one row, timed by the harness's rounds and by triton.testing.do_bench with its default
    warm-up and rep (recorded: on a multi-second step they come to one warm-up and one timed call)."""

    config: str
    num_layers: int | None  # None: the config's own
    batch: int  # global
    context: int
    world_size: int
    candidates: tuple[StepCandidate, ...]
    attn_impl: str
    do_bench_warmup_ms: float = 25.0  # triton.testing.do_bench's defaults
    do_bench_rep_ms: float = 100.0
