"""Every problem of both course editions (impl.workloads.problems.Problem: its name and editions,
defined once), in the index's order, with the page that answers it. A page module declares the
problems it answers by these names."""
from __future__ import annotations

from impl.report.pages import Problem
from impl.workloads.problems import Problem as P, StoredGroup

# The page (its file stem under reports/) of each problem; the index lists them in the enum's order.
SLUGS: dict[P, str] = {
    P.BENCHMARKING_SCRIPT: "benchmarking_script",
    P.NSYS_PROFILE: "nsys_profile",
    P.MIXED_PRECISION_ACCUMULATION: "mixed_precision",
    P.BENCHMARKING_MIXED_PRECISION: "mixed_precision",
    P.MEMORY_PROFILING: "memory_profiling",
    P.GRADIENT_CHECKPOINTING: "gradient_checkpointing",
    P.PYTORCH_ATTENTION: "pytorch_attention",
    P.TORCH_COMPILE: "torch_compile",
    P.FLASH_FORWARD: "flash_attention",
    P.FLASH_BACKWARD: "flash_attention",
    P.FLASH_BENCHMARKING: "flash_benchmarking",
    P.LEADERBOARD: "leaderboard",
    P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE: "distributed_communication",
    P.NAIVE_DDP: "ddp",
    P.NAIVE_DDP_BENCHMARKING: "ddp",
    P.MINIMAL_DDP_FLAT_BENCHMARKING: "ddp",
    P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS: "ddp",
    P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING: "ddp",
    P.DDP_OVERLAP_BUCKETED: "ddp",
    P.DDP_BUCKETED_BENCHMARKING: "ddp",
    P.COMMUNICATION_ACCOUNTING: "communication_accounting",
    P.OPTIMIZER_STATE_SHARDING: "optimizer_sharding",
    P.OPTIMIZER_STATE_SHARDING_ACCOUNTING: "optimizer_sharding",
    P.FSDP: "fsdp",
    P.FSDP_ACCOUNTING: "fsdp",
    P.ALTERNATE_RING_ALL_REDUCE: "parallelism_calcs",
    P.DATA_PARALLEL_CALCS: "parallelism_calcs",
    P.FSDP_CALCS: "parallelism_calcs",
    P.TP_CALCS: "parallelism_calcs",
    P.FSDP_TP_CALCS: "parallelism_calcs",
    P.LEADERBOARD_2026: "leaderboard_2026",
    P.TRAINING_STEP: "training_step",
    P.FLASH_SHAPES: "flash_shapes",
}

PROBLEMS: list[Problem] = [Problem(p, p.edition_tag, SLUGS[p]) for p in P]

# Benchmark groups stored under another name than the handout's problem (older runs): read as the
# handout's name everywhere (impl.report.pages.Context applies it to the loaded rows).
STORED_ALIASES = {StoredGroup.DDP_OVERLAP_BUCKETED_BENCHMARKING.value: P.DDP_BUCKETED_BENCHMARKING.value}

BY_NAME = {p.name: p for p in PROBLEMS}


def problem(name: str) -> Problem:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; SPEC's problems: {', '.join(BY_NAME)}") from None
