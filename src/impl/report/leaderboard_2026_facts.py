"""leaderboard (2026) measured on several GPUs, as facts: the candidates of the two-GPU step (one row
per checkpointing policy, perf/test_leaderboard_2026.py's test_leaderboard_2026_two_gpus), the fastest
of each run, where its time goes where the row carries a profiled step (details["breakdown"],
impl.workloads.kernels.step_breakdown), and the class's best entry scaled by the datasheets
(impl.workloads.leaderboard_2026.CLASS_BEST_*, impl.bench.peaks). templates/leaderboard_2026.md.j2
holds the words.

The step time is the handout's: triton.testing.do_bench's median (the slowest rank's), where the row
has it, else the harness median. MFU here divides the row's model FLOPs per GPU by that time and by
the datasheet's or the run's measured bf16 matmul peak, so ours and the class's best are counted alike.
"""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric
from impl.report.ratio import Ratio, ratio
from impl.report.rows import Bench
from impl.workloads.leaderboard_2026 import CLASS_BEST_GPU, CLASS_BEST_GPUS, CLASS_BEST_STEP_S, COLD_RUN_LIMIT_S


@dataclass(frozen=True)
class Candidate:
    """One checkpointing policy's two-GPU row."""

    bench: Bench

    @property
    def policy(self) -> str:
        k = self.bench.cfg.k
        return self.bench.cfg.checkpointing + ("" if k is None else f" (k {k})")

    @property
    def measured(self) -> bool:
        return self.bench.measured

    @property
    def do_bench_s(self) -> float | None:
        ms = self.bench.metric(Metric.DO_BENCH_MS)
        return None if ms is None else ms / 1e3

    @property
    def step_s(self) -> float:
        """The handout's timer (do_bench) where the row has it, else the harness median."""
        return self.do_bench_s if self.do_bench_s is not None else self.bench.stats.median

    @property
    def timer(self) -> str:
        return "do_bench" if self.do_bench_s is not None else "harness median"

    @property
    def median_s(self) -> float:
        return self.bench.stats.median

    @property
    def iqr_s(self) -> float | None:
        return self.bench.stats.iqr

    @property
    def first_call_s(self) -> float | None:
        return self.bench.metric(Metric.FIRST_CALL_S)

    @property
    def rank_peaks(self) -> list[float]:
        return [r["peak"] for r in self.bench.details.get("ranks") or [] if r.get("peak") is not None]

    @property
    def flops(self) -> float | None:
        """Model FLOPs of one rank's share of the step (the row's flops metric)."""
        return self.bench.metric(Metric.FLOPS)

    @property
    def datasheet_flops(self) -> float | None:
        p = self.bench.row.peaks
        return p.datasheet_flops if p is not None else None

    @property
    def measured_peak_flops(self) -> float | None:
        p = self.bench.row.peaks
        return p.measured_flops if p is not None else None

    @property
    def mfu(self) -> float | None:
        return self.flops / self.step_s / self.datasheet_flops if self.flops and self.datasheet_flops else None

    @property
    def mfu_measured_peak(self) -> float | None:
        peak = self.measured_peak_flops
        return self.flops / self.step_s / peak if self.flops and peak else None

    @property
    def do_bench(self) -> dict:
        return self.bench.details.get("do_bench") or {}

    @property
    def breakdown(self) -> dict | None:
        return self.bench.details.get("breakdown")

    @property
    def run_when(self) -> str:
        return self.bench.run.when

    @property
    def file(self) -> str:
        return self.bench.run.file


@dataclass(frozen=True)
class ClassBest:
    """The class's best entry against ours, scaled by the GPUs' datasheet dense bf16 peaks."""

    step_s: float
    gpus: int
    gpu: str
    gpu_flops: float  # its datasheet dense bf16 FLOP/s
    ours_gpu_flops: float  # our device's
    ours: Candidate

    @property
    def ours_gpu(self) -> str:
        """Our GPU as its row's environment names it, without the vendor: "H200"."""
        return self.ours.bench.row.env.device.removeprefix("NVIDIA ").strip()

    @property
    def scale(self) -> float:
        """How much more dense bf16 work one of its GPUs does than one of ours (datasheets)."""
        return self.gpu_flops / self.ours_gpu_flops

    @property
    def ratio(self) -> Ratio:
        return ratio(self.ours.step_s, self.step_s, "the class's best")

    @property
    def mfu(self) -> float | None:
        """The MFU the class's best implies, with our row's FLOPs per GPU (the same model and batch)."""
        return self.ours.flops / self.step_s / self.gpu_flops if self.ours.flops else None

    @property
    def at_our_peak_s(self) -> float:
        """The class's best step on our GPUs at its own MFU: its time × the datasheet ratio."""
        return self.step_s * self.scale

    @property
    def ours_at_its_peak_s(self) -> float:
        """Our step on its GPUs at our MFU."""
        return self.ours.step_s / self.scale


@dataclass(frozen=True)
class TwoGpuFacts:
    device: str  # named as headings name it
    world: int
    candidates: list[Candidate]  # every candidate's newest row, in run order
    fastest: dict[str, Candidate]  # run (UTC) -> its fastest measured candidate
    class_best: ClassBest | None
    cold_limit_s: float = COLD_RUN_LIMIT_S

    @property
    def runs(self) -> list[str]:
        return list(self.fastest)

    @property
    def newest(self) -> Candidate | None:
        """The newest run's fastest candidate: the page's answer."""
        return self.fastest[max(self.fastest)] if self.fastest else None

    @property
    def files(self) -> list[str]:
        return sorted({c.file for c in self.candidates})

    @property
    def newest_run(self) -> list[Candidate]:
        """The candidates of the newest run (the answer's), in run order."""
        best = self.newest
        return [c for c in self.candidates if best is not None and c.run_when == best.run_when]

    @property
    def first_calls(self) -> list[Candidate]:
        """The newest run's first calls, in run order: the first from fresh worker processes."""
        return [c for c in self.newest_run if c.measured and c.first_call_s is not None]

    @property
    def slowest_first_call(self) -> Candidate | None:
        calls = self.first_calls
        return max(calls, key=lambda c: c.first_call_s) if calls else None

    @property
    def profiled(self) -> list[Candidate]:
        return [c for c in self.candidates if c.measured and c.breakdown]


def two_gpu_facts(device: str, rows: list[Bench]) -> TwoGpuFacts | None:
    """The facts of a device's multi-GPU leaderboard_2026 rows (None where it has none)."""
    rows = [b for b in rows if (b.cfg.world_size or 1) > 1]
    if not rows:
        return None
    cands = [Candidate(b) for b in rows]
    fastest: dict[str, Candidate] = {}
    for c in cands:
        if c.measured and (c.run_when not in fastest or c.step_s < fastest[c.run_when].step_s):
            fastest[c.run_when] = c
    fastest = dict(sorted(fastest.items()))
    best = None
    newest = fastest[max(fastest)] if fastest else None
    gpu_flops = datasheet_bf16_flops(CLASS_BEST_GPU)
    if newest is not None and gpu_flops and newest.datasheet_flops:
        best = ClassBest(CLASS_BEST_STEP_S, CLASS_BEST_GPUS, CLASS_BEST_GPU, gpu_flops, newest.datasheet_flops, newest)
    return TwoGpuFacts(device, int(rows[0].cfg.world_size), cands, fastest, best)
