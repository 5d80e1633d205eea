"""Every problem of both course editions (SPEC.md), in the index's order, with the page that
answers it. A page module declares the problems it answers by these names."""
from __future__ import annotations

from impl.report.pages import Problem

B, N, BOTH = "2025", "2026", "2025, 2026"

# Editions exactly as the handouts (shared/handouts) pose each problem.
PROBLEMS: list[Problem] = [
    # 1.1 profiling and benchmarking
    Problem("benchmarking_script", BOTH, "benchmarking_script"),
    Problem("nsys_profile", BOTH, "nsys_profile"),
    Problem("mixed_precision_accumulation", BOTH, "mixed_precision"),
    Problem("benchmarking_mixed_precision", BOTH, "mixed_precision"),
    Problem("memory_profiling", BOTH, "memory_profiling"),
    Problem("gradient_checkpointing", N, "gradient_checkpointing"),
    # 1.2-1.3 attention
    Problem("pytorch_attention", BOTH, "pytorch_attention"),
    Problem("torch_compile", BOTH, "torch_compile"),
    Problem("flash_forward", BOTH, "flash_attention"),
    Problem("flash_backward", BOTH, "flash_attention"),
    Problem("flash_benchmarking", BOTH, "flash_benchmarking"),
    Problem("leaderboard", B, "leaderboard"),  # 2025's FlashAttention leaderboard (section 1.3.3)
    # 2 distributed data parallel
    Problem("distributed_communication_single_node", BOTH, "distributed_communication"),
    Problem("naive_ddp", BOTH, "ddp"),
    Problem("naive_ddp_benchmarking", BOTH, "ddp"),
    Problem("minimal_ddp_flat_benchmarking", BOTH, "ddp"),
    Problem("ddp_overlap_individual_parameters", BOTH, "ddp"),
    Problem("ddp_overlap_individual_parameters_benchmarking", BOTH, "ddp"),
    Problem("ddp_overlap_bucketed", B, "ddp"),
    Problem("ddp_bucketed_benchmarking", B, "ddp"),
    Problem("communication_accounting", B, "communication_accounting"),
    # 3 optimizer state sharding
    Problem("optimizer_state_sharding", BOTH, "optimizer_sharding"),
    Problem("optimizer_state_sharding_accounting", BOTH, "optimizer_sharding"),
    # the 2026 edition's new problems
    Problem("fsdp", N, "fsdp"),
    Problem("fsdp_accounting", N, "fsdp"),
    Problem("alternate_ring_all_reduce", N, "parallelism_calcs"),
    Problem("data_parallel_calcs", N, "parallelism_calcs"),
    Problem("fsdp_calcs", N, "parallelism_calcs"),
    Problem("tp_calcs", N, "parallelism_calcs"),
    Problem("fsdp_tp_calcs", N, "parallelism_calcs"),
    Problem("leaderboard_2026", N, "leaderboard_2026"),  # 2026's "leaderboard": an 8B training step
    # beyond the assignment
    Problem("training_step", "suite", "training_step"),
    Problem("flash_shapes", "suite", "flash_shapes"),
]

# Benchmark groups stored under another name than the handout's problem (older runs): read as the
# handout's name everywhere (impl.report.pages.Context applies it to the loaded rows).
STORED_ALIASES = {"ddp_overlap_bucketed_benchmarking": "ddp_bucketed_benchmarking"}

BY_NAME = {p.name: p for p in PROBLEMS}


def problem(name: str) -> Problem:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; SPEC's problems: {', '.join(BY_NAME)}") from None
