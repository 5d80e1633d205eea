"""The named workloads profiled under Nsight Systems, one nsys process (one .nsys-rep) per case,
taken from the perf files' own grids so nsys sees what the suite measures:

  nsys_profile      the benchmarking script's training step (forward, backward, optimizer step ranges,
                    the naive attention's three parts) per (size, context): the 2026 edition's chosen
                    cases first (impl.workloads.steps.chosen_2026_cases), then the 2025 grid
  memory_profiling  (f): the 2026 cases' block-probe stack (fp32), PyTorch's own per-op NVTX labels
                    (emit_nvtx) and "block k" ranges, --cuda-memory-usage=true with the caching
                    allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1), so every tensor is a cudaMalloc
  ddp               (b): naive against per-parameter overlapped DDP at the trace context of
                    ddp_benchmarking, each edition's xl, two GPUs
  fsdp              fsdp_accounting (b): our FSDP (fp32 per weight, bf16 per block) on the 2026 xl,
                    two GPUs
  leaderboard_2026  the 8B step on two GPUs at its fastest measured candidate (LEADERBOARD_CANDIDATE):
                    where its compute stream waits (communication under and after backward)

A single-GPU case records only its measured steps (nsys --capture-range=nvtx on the range
"measured"; warm-up runs before it). A two-GPU case records its ranks' whole processes: its steps
are the ranges "step 0", "step 1", ... (after "warm-up"), read back with Timeline.window.
"""
from __future__ import annotations

from dataclasses import dataclass

from impl.workloads.grids import DDPGrid, FSDPGrid, MemoryProfilingGrid, StepCandidate
from impl.workloads.steps import chosen_2026_cases
from impl.workloads.sweeps import grid
from impl.workloads.variants import DDPVariant, FSDPVariant

GROUPS = ("nsys_profile", "memory_profiling", "ddp", "fsdp", "leaderboard_2026")
MEASURED = "measured"  # the NVTX range a single-GPU case's capture starts at
DDP_VARIANTS = (DDPVariant.NAIVE, DDPVariant.INDIVIDUAL)  # ddp (b): not overlapped against overlapped
FSDP_VARIANTS = (FSDPVariant.FSDP, FSDPVariant.FSDP_BLOCK_BF16)
# The fastest two-GPU 8B candidate measured (2xH200, leaderboard_2026/20261126T120418Z_8876506.json.gz: 6.136 s)
LEADERBOARD_CANDIDATE = StepCandidate("keep_attention", 3, "pointwise", "flash_gluon")


@dataclass(frozen=True)
class NsysCase:
    name: str  # file stem of its outputs (letters, digits, '_', '-', '.': what the device returns)
    group: str  # one of GROUPS
    args: tuple[str, ...]  # argv of `python -m impl.nsys.workloads`
    gpus: int
    capture: str | None  # NVTX range that starts the capture; None: the whole process tree
    memory: bool = False  # nsys --cuda-memory-usage=true
    env: tuple[tuple[str, str], ...] = ()  # extra environment of the profiled process


def _stem(*parts) -> str:
    return "_".join(str(p).replace(".", "p") for p in parts)


def nsys_profile_cases(device_bytes: int | None) -> list[NsysCase]:
    g26, g25 = grid("nsys_profile_2026", "full"), grid("nsys_profile", "full")
    pairs = [(g26, "2026", s, c) for s, c in chosen_2026_cases(g26, device_bytes)]
    pairs += [(g25, "2025", s, c) for s in g25.sizes for c in g25.contexts]
    return [NsysCase(name=_stem("nsys_profile", e, s, f"ctx{c}"), group="nsys_profile", gpus=1, capture=MEASURED,
                     args=("nsys_profile", "--edition", e, "--size", s, "--context", str(c), "--batch", str(g.batch),
                           "--dtype", g.dtype, "--warmup", str(g.prof_warmup), "--steps", str(g.prof_steps)))
            for g, e, s, c in pairs]


def memory_cases() -> list[NsysCase]:
    g: MemoryProfilingGrid = grid("memory_profiling", "full")
    return [NsysCase(name=_stem("memory_profiling", "2026", s, f"ctx{c}", "fp32"), group="memory_profiling", gpus=1,
                     capture=MEASURED, memory=True, env=(("PYTORCH_NO_CUDA_MEMORY_CACHING", "1"),),
                     args=("memory_block", "--edition", "2026", "--size", s, "--context", str(c), "--batch", str(g.batch),
                           "--dtype", "fp32", "--layers", str(g.probe_layers)))
            for s, c in g.cases_2026]


def ddp_cases() -> list[NsysCase]:
    g: DDPGrid = grid("ddp_benchmarking", "full")
    batch = dict(g.configs)[g.trace.context]
    return [NsysCase(name=_stem("ddp", z.edition, z.name, v.value, f"ctx{g.trace.context}"), group="ddp", gpus=g.world_size,
                     capture=None,
                     args=("ddp", "--edition", z.edition, "--size", z.name, "--context", str(g.trace.context),
                           "--batch", str(batch), "--variant", v.value, "--warmup", str(g.trace.warmup),
                           "--steps", str(g.trace.steps), "--world-size", str(g.world_size)))
            for z in g.sizes for v in DDP_VARIANTS]


def fsdp_cases() -> list[NsysCase]:
    g: FSDPGrid = grid("fsdp", "full")
    return [NsysCase(name=_stem("fsdp", z.edition, z.name, v.value, f"ctx{g.context}"), group="fsdp", gpus=g.world_size,
                     capture=None,
                     args=("fsdp", "--edition", z.edition, "--size", z.name, "--context", str(g.context),
                           "--batch", str(g.batch), "--variant", v.value, "--warmup", "1", "--steps", "2",
                           "--world-size", str(g.world_size)))
            for z in g.sizes if z.edition == "2026" for v in FSDP_VARIANTS]


def leaderboard_cases() -> list[NsysCase]:
    two = grid("leaderboard_2026", "full").two_gpus
    c = LEADERBOARD_CANDIDATE
    if c not in two.candidates:
        raise ValueError(f"nsys leaderboard_2026: candidate {c.id} is not in the grid's {[x.id for x in two.candidates]}")
    return [NsysCase(name=_stem("leaderboard_2026", c.id), group="leaderboard_2026", gpus=two.world_size, capture=None,
                     args=("leaderboard_2026", "--config", two.config, "--context", str(two.context), "--batch",
                           str(two.batch), "--checkpointing", c.checkpointing, *(("--k", str(c.k)) if c.k is not None else ()),
                           "--compile", c.compile,
                           "--attn", c.attn_impl or two.attn_impl, "--warmup", "2", "--steps", "2",
                           "--world-size", str(two.world_size)))]


def cases(groups: list[str], device_bytes: int | None) -> list[NsysCase]:
    """The cases of `groups` in the order given."""
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown nsys case groups {unknown}; the groups are {list(GROUPS)}")
    made = {"nsys_profile": lambda: nsys_profile_cases(device_bytes), "memory_profiling": memory_cases,
            "ddp": ddp_cases, "fsdp": fsdp_cases, "leaderboard_2026": leaderboard_cases}
    return [c for g in groups for c in made[g]()]


__all__ = ["DDP_VARIANTS", "FSDP_VARIANTS", "GROUPS", "LEADERBOARD_CANDIDATE", "MEASURED", "NsysCase", "cases",
           "ddp_cases", "fsdp_cases", "leaderboard_cases", "memory_cases", "nsys_profile_cases"]
