"""Every problem of both course editions (impl.workloads.problems.Problem: its name and editions,
defined once), in the index's order, with the page that answers it. A page module declares the
problems it answers by these names."""
from __future__ import annotations

from dataclasses import dataclass

from impl.workloads.problems import Problem as P, StoredGroup


@dataclass(frozen=True)
class PageProblem:
    """One problem of the course (SPEC.md) as the index lists it: its name, which edition(s) ask it,
    the page it is on."""

    name: str
    edition: str  # "2025", "2026" or "2025, 2026"
    slug: str  # the page's file stem under reports/

# Each page (its file stem under reports/) and the problems it answers; the index lists the problems
# in the enum's order.
PAGES: dict[str, tuple[P, ...]] = {
    "benchmarking_script": (P.BENCHMARKING_SCRIPT,),
    "nsys_profile": (P.NSYS_PROFILE,),
    "mixed_precision": (P.MIXED_PRECISION_ACCUMULATION, P.BENCHMARKING_MIXED_PRECISION),
    "memory_profiling": (P.MEMORY_PROFILING,),
    "gradient_checkpointing": (P.GRADIENT_CHECKPOINTING,),
    "pytorch_attention": (P.PYTORCH_ATTENTION,),
    "torch_compile": (P.TORCH_COMPILE,),
    "flash_attention": (P.FLASH_FORWARD, P.FLASH_BACKWARD),
    "flash_benchmarking": (P.FLASH_BENCHMARKING,),
    "leaderboard": (P.LEADERBOARD,),
    "distributed_communication": (P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE,),
    "ddp": (P.NAIVE_DDP, P.NAIVE_DDP_BENCHMARKING, P.MINIMAL_DDP_FLAT_BENCHMARKING, P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS,
            P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING, P.DDP_OVERLAP_BUCKETED, P.DDP_BUCKETED_BENCHMARKING),
    "communication_accounting": (P.COMMUNICATION_ACCOUNTING,),
    "optimizer_sharding": (P.OPTIMIZER_STATE_SHARDING, P.OPTIMIZER_STATE_SHARDING_ACCOUNTING),
    "fsdp": (P.FSDP, P.FSDP_ACCOUNTING),
    "parallelism_calcs": (P.ALTERNATE_RING_ALL_REDUCE, P.DATA_PARALLEL_CALCS, P.FSDP_CALCS, P.TP_CALCS,
                          P.FSDP_TP_CALCS),
    "leaderboard_2026": (P.LEADERBOARD_2026,),
    "training_step": (P.TRAINING_STEP,),
    "flash_shapes": (P.FLASH_SHAPES,),
    "cpu_smoke": (),  # the plumbing check: answers no problem
}
SLUGS: dict[P, str] = {p: slug for slug, ps in PAGES.items() for p in ps}

PROBLEMS: list[PageProblem] = [PageProblem(p, p.edition_tag, SLUGS[p]) for p in P]

# Benchmark groups stored under another name than the handout's problem (older runs): read as the
# handout's name everywhere (impl.report.pages.Context applies it to the loaded rows).
STORED_ALIASES = {StoredGroup.DDP_OVERLAP_BUCKETED_BENCHMARKING.value: P.DDP_BUCKETED_BENCHMARKING.value}

BY_NAME = {p.name: p for p in PROBLEMS}


def problem(name: str) -> PageProblem:
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown problem {name!r}; SPEC's problems: {', '.join(BY_NAME)}") from None
