"""The course's problems, each named once: its handout name (the value a stored row's `problem`
carries), the editions that pose it (shared/handouts, SPEC.md) and a short label. The order is the
handouts' (the index's scoreboard order). str-valued (StrEnum): a row's `problem` serialises a member
as its value, so stored benchmark JSON reads exactly as the plain strings did.

StoredGroup names the few benchmark groups stored under a name of their own (rows that serve a
problem without being one)."""
from __future__ import annotations

from enum import StrEnum


class Edition(StrEnum):
    E2025 = "2025"
    E2026 = "2026"
    SUITE = "suite"  # beyond the assignment: the suite's own question


_B = (Edition.E2025,)
_N = (Edition.E2026,)
_BOTH = (Edition.E2025, Edition.E2026)
_SUITE = (Edition.SUITE,)


class Problem(StrEnum):
    """A problem of either edition (or of the suite), in the handouts' order."""

    editions: tuple[Edition, ...]
    label: str

    def __new__(cls, value: str, editions: tuple[Edition, ...], label: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.editions = editions
        member.label = label
        return member

    @property
    def edition_tag(self) -> str:
        """The editions as the index tags them: "2025", "2026", "2025, 2026" or "suite"."""
        return ", ".join(e.value for e in self.editions)

    # 1.1 profiling and benchmarking
    BENCHMARKING_SCRIPT = "benchmarking_script", _BOTH, "end-to-end benchmarking"
    NSYS_PROFILE = "nsys_profile", _BOTH, "Nsight Systems profile"
    MIXED_PRECISION_ACCUMULATION = "mixed_precision_accumulation", _BOTH, "mixed-precision accumulation"
    BENCHMARKING_MIXED_PRECISION = "benchmarking_mixed_precision", _BOTH, "bf16 autocast benchmarks"
    MEMORY_PROFILING = "memory_profiling", _BOTH, "memory profile"
    GRADIENT_CHECKPOINTING = "gradient_checkpointing", _N, "gradient checkpointing"
    # 1.2-1.3 attention
    PYTORCH_ATTENTION = "pytorch_attention", _BOTH, "naive attention benchmarks"
    TORCH_COMPILE = "torch_compile", _BOTH, "torch.compile"
    FLASH_FORWARD = "flash_forward", _BOTH, "FlashAttention-2 forward"
    FLASH_BACKWARD = "flash_backward", _BOTH, "FlashAttention-2 backward"
    FLASH_BENCHMARKING = "flash_benchmarking", _BOTH, "FlashAttention-2 benchmarks"
    LEADERBOARD = "leaderboard", _B, "FlashAttention leaderboard (2025)"
    # 2 distributed data parallel
    DISTRIBUTED_COMMUNICATION_SINGLE_NODE = "distributed_communication_single_node", _BOTH, "all-reduce benchmarks"
    NAIVE_DDP = "naive_ddp", _BOTH, "naive DDP"
    NAIVE_DDP_BENCHMARKING = "naive_ddp_benchmarking", _BOTH, "naive DDP benchmarks"
    MINIMAL_DDP_FLAT_BENCHMARKING = "minimal_ddp_flat_benchmarking", _BOTH, "flat-gradient DDP benchmarks"
    DDP_OVERLAP_INDIVIDUAL_PARAMETERS = "ddp_overlap_individual_parameters", _BOTH, "overlapped DDP"
    DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING = ("ddp_overlap_individual_parameters_benchmarking", _BOTH,
                                                      "overlapped DDP benchmarks")
    DDP_OVERLAP_BUCKETED = "ddp_overlap_bucketed", _B, "bucketed DDP"
    DDP_BUCKETED_BENCHMARKING = "ddp_bucketed_benchmarking", _B, "bucketed DDP benchmarks"
    COMMUNICATION_ACCOUNTING = "communication_accounting", _B, "communication accounting"
    # 3 optimizer state sharding
    OPTIMIZER_STATE_SHARDING = "optimizer_state_sharding", _BOTH, "optimizer state sharding"
    OPTIMIZER_STATE_SHARDING_ACCOUNTING = "optimizer_state_sharding_accounting", _BOTH, "sharding accounting"
    # the 2026 edition's new problems
    FSDP = "fsdp", _N, "fully-sharded data parallel"
    FSDP_ACCOUNTING = "fsdp_accounting", _N, "FSDP accounting"
    ALTERNATE_RING_ALL_REDUCE = "alternate_ring_all_reduce", _N, "alternate ring all-reduce"
    DATA_PARALLEL_CALCS = "data_parallel_calcs", _N, "data-parallel calculations"
    FSDP_CALCS = "fsdp_calcs", _N, "FSDP calculations"
    TP_CALCS = "tp_calcs", _N, "tensor-parallel calculations"
    FSDP_TP_CALCS = "fsdp_tp_calcs", _N, "2D-parallel calculations"
    LEADERBOARD_2026 = "leaderboard_2026", _N, "training-step leaderboard (2026)"  # the 2026 handout's "leaderboard"
    # beyond the assignment
    TRAINING_STEP = "training_step", _SUITE, "the training step, ablated"
    FLASH_SHAPES = "flash_shapes", _SUITE, "FlashAttention over shapes"


class StoredGroup(StrEnum):
    """Benchmark groups stored under their own name: rows that serve a problem without being one."""

    PER_RANK_MEMORY = "per_rank_memory"  # the one-GPU check of the two-GPU 2026 questions' per-rank states
    MEMORY_ACCOUNTING = "memory_accounting"  # the closed-form memory of the model sizes
    DDP_BENCHMARKING_ANCHORS = "ddp_benchmarking_anchors"  # the DDP table's single-GPU and torch DDP rows
    DDP_OVERLAP_BUCKETED_BENCHMARKING = "ddp_overlap_bucketed_benchmarking"  # older runs' ddp_bucketed_benchmarking


__all__ = ["Edition", "Problem", "StoredGroup"]
