"""leaderboard (2026): one training step of the 8B model on two GPUs (SPEC.md). The answer is the
measured step of the first multi-GPU device with rows (one row per checkpointing candidate,
perf/test_leaderboard_2026.py's test_leaderboard_2026_two_gpus: the fastest of each run, where its
time goes where the row carries a profiled step, details["breakdown"]) and the class's best entry
scaled by the datasheets; beside it, the one-GPU rows of the step with fewer layers and the two-GPU
step predicted from them (impl.leaderboard_prediction, priced with the parallelism_calcs page's W).
templates/leaderboard_2026.md.j2 holds every word.

The step time is the handout's: triton.testing.do_bench's median (the slowest rank's), where the row
has it, else the harness median. MFU divides the row's model FLOPs per GPU by that time and by the
datasheet's or the run's measured bf16 matmul peak, so ours and the class's best are counted alike."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Status
from impl.leaderboard_prediction import LayerRun, StepPrediction, predict_step
from impl.report.pages import Context, Kind, Scored
from impl.report.pages.parallelism_calcs import Bandwidth, nccl_bus_bandwidth
from impl.report.ratio import Ratio, ratio
from impl.report.rows import Bench, view
from impl.report.runs import RunsFacts, device_name, gpu_model, newest_date
from impl.workloads.leaderboard_2026 import (CLASS_BEST_GPU, CLASS_BEST_GPUS, CLASS_BEST_STEP_S, COLD_RUN_LIMIT_S,
                                             LEADERBOARD, WORLD_SIZE, StepSpec)
from impl.workloads.problems import Problem as P

PROBLEMS = (P.LEADERBOARD_2026,)
PROBLEM = P.LEADERBOARD_2026


@dataclass(frozen=True)
class StepConfig:
    checkpointing: str = ""
    k: int | None = None
    layers: int = 0
    world_size: int | None = None
    batch: int = 0
    context: int = 0


def _cfg(b: Bench) -> StepConfig:
    return view(StepConfig, b)


def policy(b: Bench) -> str:
    """The checkpointing candidate: "none", "every_k (k 1)"."""
    c = _cfg(b)
    return c.checkpointing + ("" if c.k is None else f" (k {c.k})")


# ---- the multi-GPU rows ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Candidate:
    """One stored row of the step: a checkpointing candidate on several GPUs, or a layer count on one."""

    policy: str
    layers: int
    run_when: str  # its run, UTC
    status: Status
    reason: str
    median_s: float | None  # the harness's
    iqr_s: float | None
    rounds: int | None
    do_bench_s: float | None  # the handout's timer, where the row has it
    first_call_s: float | None
    tokens_per_s: float | None
    row_mfu: float | None  # the row's own MFU metric (of the harness median)
    peak_bytes: float | None  # allocated, the row's process
    flops: float | None  # model FLOPs of one rank's share of the step
    datasheet_flops: float | None
    measured_peak_flops: float | None  # the run's measured bf16 matmul peak
    rank_peaks: tuple[float, ...]
    do_bench: dict  # its settings (warmup_ms, rep_ms)
    breakdown: dict | None  # the profiled step (impl.workloads.kernels.step_breakdown)
    gpu: str  # as the row's environment names it, without the vendor: "H200"
    file: str

    @classmethod
    def of(cls, b: Bench) -> Candidate:
        ok, peaks, d = b.measured, b.row.peaks, b.details
        ms = b.metric(Metric.DO_BENCH_MS)
        return cls(policy(b), _cfg(b).layers, b.run.when, b.status, b.row.reason or "", b.stats.median if ok else None,
                   b.stats.iqr if ok else None, b.stats.rounds if ok else None, None if ms is None else ms / 1e3,
                   b.metric(Metric.FIRST_CALL_S), b.metric(Metric.TOKENS_PER_S), b.metric(Metric.MFU),
                   b.row.memory.peak_allocated, b.metric(Metric.FLOPS),
                   peaks.datasheet_flops if peaks else None, peaks.measured_flops if peaks else None,
                   tuple(r["peak"] for r in d.get("ranks") or [] if r.get("peak") is not None), d.get("do_bench") or {},
                   d.get("breakdown"), b.row.env.device.removeprefix("NVIDIA ").strip(), b.run.file)

    @property
    def measured(self) -> bool:
        return self.median_s is not None

    @property
    def step_s(self) -> float:
        """The handout's timer (do_bench) where the row has it, else the harness median."""
        return self.do_bench_s if self.do_bench_s is not None else self.median_s

    @property
    def timer(self) -> str:
        return "do_bench" if self.do_bench_s is not None else "harness median"

    @property
    def mfu(self) -> float | None:
        return self.flops / self.step_s / self.datasheet_flops if self.flops and self.datasheet_flops else None

    @property
    def mfu_measured_peak(self) -> float | None:
        peak = self.measured_peak_flops
        return self.flops / self.step_s / peak if self.flops and peak else None


@dataclass(frozen=True)
class ClassBest:
    """The class's best entry against ours, scaled by the GPUs' datasheet dense bf16 peaks."""

    step_s: float
    gpus: int
    gpu: str
    gpu_flops: float  # its datasheet dense bf16 FLOP/s
    ours: Candidate

    @property
    def scale(self) -> float:
        """How much more dense bf16 work one of its GPUs does than one of ours (datasheets)."""
        return self.gpu_flops / self.ours.datasheet_flops

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
class Breakdown:
    """Where the time of the profiled candidates goes: the phases and kinds their table shows, and the
    top kernels of the newest run's fastest profiled candidate."""

    phases: tuple[str, ...]
    categories: tuple[str, ...]  # those with time in any profiled candidate
    top_of: Candidate


@dataclass(frozen=True)
class TwoGpuFacts:
    device: str  # folder
    heading: str  # named as headings name it
    world: int
    candidates: tuple[Candidate, ...]  # every candidate's newest row, in run order
    fastest: dict[str, Candidate]  # run (UTC) -> its fastest measured candidate
    class_best: ClassBest | None
    runs: RunsFacts
    date: str  # the newest run's
    cold_limit_s: float = COLD_RUN_LIMIT_S

    def is_fastest(self, c: Candidate) -> bool:
        """`c` is the fastest of its run."""
        return self.fastest.get(c.run_when) is c

    @property
    def newest(self) -> Candidate:
        """The newest run's fastest candidate: the page's answer."""
        return self.fastest[max(self.fastest)]

    @property
    def files(self) -> list[str]:
        return sorted({c.file for c in self.candidates})

    @property
    def newest_run(self) -> list[Candidate]:
        """The candidates of the newest run (the answer's), in run order."""
        return [c for c in self.candidates if c.run_when == self.newest.run_when]

    @property
    def first_calls(self) -> list[Candidate]:
        """The newest run's first calls, in run order: the first from fresh worker processes."""
        return [c for c in self.newest_run if c.measured and c.first_call_s is not None]

    @property
    def slowest_first_call(self) -> Candidate | None:
        return max(self.first_calls, key=lambda c: c.first_call_s, default=None)

    @property
    def profiled(self) -> list[Candidate]:
        return [c for c in self.candidates if c.measured and c.breakdown]

    @property
    def answer_profile(self) -> Candidate | None:
        """The newest run's fastest profiled candidate (the time question's answer)."""
        return min((c for c in self.profiled if c.run_when == self.newest.run_when), key=lambda c: c.step_s,
                   default=None)

    @property
    def breakdown(self) -> Breakdown | None:
        p = self.profiled
        if not p:
            return None
        cats = tuple(k for k in p[0].breakdown["category_ms"] if any(c.breakdown["category_ms"].get(k, 0.0) > 0 for c in p))
        return Breakdown(tuple(p[0].breakdown["phase_ms"]), cats, self.answer_profile or p[-1])


def two_gpu_facts(device: str, rows: list[Bench]) -> TwoGpuFacts | None:
    """The facts of a device's multi-GPU leaderboard_2026 rows (None where it has no measured one)."""
    rows = [b for b in rows if (_cfg(b).world_size or 1) > 1]
    cands = tuple(Candidate.of(b) for b in rows)
    fastest: dict[str, Candidate] = {}
    for c in cands:
        if c.measured and (c.run_when not in fastest or c.step_s < fastest[c.run_when].step_s):
            fastest[c.run_when] = c
    if not fastest:
        return None
    fastest = dict(sorted(fastest.items()))
    newest = fastest[max(fastest)]
    gpu_flops = datasheet_bf16_flops(CLASS_BEST_GPU)
    best = ClassBest(CLASS_BEST_STEP_S, CLASS_BEST_GPUS, CLASS_BEST_GPU, gpu_flops, newest) \
        if gpu_flops and newest.datasheet_flops else None
    return TwoGpuFacts(device, device_name(device, rows[0].row.env.device), int(_cfg(rows[0]).world_size), cands,
                       fastest, best, RunsFacts.of(device, rows), newest_date(rows))


# ---- one GPU, fewer layers, and the prediction ----------------------------------------------------

@dataclass(frozen=True)
class OneGpu:
    device: str
    heading: str
    date: str  # the newest row's run
    batch: int
    context: int
    rows: tuple[Candidate, ...]
    fit_policy: str  # the policy the prediction fits
    fit_runs: tuple[LayerRun, ...]
    files: tuple[str, ...]


def layer_runs(rows: list[Bench]) -> tuple[str, list[LayerRun]]:
    """(policy, runs) of the checkpointing policy with the most measured layer counts (checkpointed
    first on a tie: 34 plain layers would not fit): the points the prediction fits. One line per
    (policy, k) and run: rows of another k or another run (code, machine) are not one model."""
    groups: dict[tuple, list[Bench]] = {}
    for b in rows:
        if b.status is Status.MEASURED:
            groups.setdefault((_cfg(b).checkpointing, _cfg(b).k or 0, b.run.datetime), []).append(b)
    best: tuple[str, list[LayerRun]] = ("", [])
    for (checkpointing, k, _), g in sorted(groups.items(), key=lambda kv: kv[0][0] == "none"):
        runs = [LayerRun(_cfg(b).layers, b.stats.median, b.row.memory.peak_allocated) for b in g]
        if len({r.layers for r in runs}) > len({r.layers for r in best[1]}):
            best = (checkpointing if checkpointing == "none" else f"{checkpointing} (k {k})", runs)
    return best


def one_gpu(ctx: Context, like: str | None) -> OneGpu | None:
    """The leaderboard_2026 rows of a one-GPU device: the one with the same GPU as `like` (the device
    whose bandwidth prices the prediction) when it has rows, else the first that has any."""
    found = [(d, rows) for d, rows in ctx.rows.per_gpu(PROBLEM) if d.endswith("-x1")]
    same = [x for x in found if like is not None and gpu_model(x[0]) == gpu_model(like)]
    if not (same or found):
        return None
    device, rows = (same or found)[0]
    rows = sorted(rows, key=lambda b: (_cfg(b).checkpointing, _cfg(b).k is None, _cfg(b).k or 0, _cfg(b).layers))
    fit_policy, runs = layer_runs(rows)
    return OneGpu(device, device_name(device, rows[0].row.env.device), newest_date(rows),
                  _cfg(rows[0]).batch, _cfg(rows[0]).context, tuple(Candidate.of(b) for b in rows), fit_policy,
                  tuple(runs), tuple(sorted({b.run.file for b in rows})))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Leaderboard2026Facts:
    spec: StepSpec
    world: int  # the ranks the step is built for
    two_gpu_sections: tuple[tuple[str, tuple[str, ...]], ...]  # (device heading, sections) of multi-GPU devices
    multi: TwoGpuFacts | None  # the answer, None: not run on more than one GPU
    one: OneGpu | None
    w: Bandwidth | None  # the prediction's bus bandwidth
    pred: StepPrediction | None  # None: no one-GPU fit of two layer counts, or no W
    index_figures: tuple = ()

    @property
    def fits(self) -> bool:
        return self.one is not None and len({r.layers for r in self.one.fit_runs}) >= 2

    @property
    def beside(self) -> Candidate | None:
        """The newest measured multi-GPU candidate of the prediction's policy."""
        same = [c for c in self.multi.candidates if c.measured and c.policy == self.one.fit_policy]
        return same[-1] if same else None

    @property
    def scores(self) -> dict[str, Scored]:
        if self.multi is not None:
            device = self.multi.device + (f" + {self.one.device}" if self.pred else "")
            return {PROBLEM: Scored(Kind.MEASURED, device, self.multi.date)}
        if self.pred is not None:
            return {PROBLEM: Scored(Kind.PREDICTED, f"{self.one.device} + {self.w.device}", self.one.date)}
        return {PROBLEM: Scored(Kind.NOT_MEASURED)}

    @property
    def sources(self) -> list[str]:
        files = (self.multi.files if self.multi else []) + list(self.one.files if self.one else ())
        return sorted({*files, *([self.w.file] if self.pred else [])})


def facts(ctx: Context) -> Leaderboard2026Facts:
    sections = tuple((device_name(d, rows[0].row.env.device), tuple(sorted({b.run.section for b in rows})))
                     for d in ctx.rows.gpu_devices() if not d.endswith("-x1") and (rows := ctx.rows.of(device=d)))
    multi = next((f for d, rows in ctx.rows.per_gpu(PROBLEM) if not d.endswith("-x1")
                  and (f := two_gpu_facts(d, rows)) is not None), None)
    w = nccl_bus_bandwidth(ctx.rows, world_size=WORLD_SIZE)
    one = one_gpu(ctx, None if w is None else w.device)
    f = Leaderboard2026Facts(LEADERBOARD, WORLD_SIZE, sections, multi, one, w, None)
    if f.fits and w is not None:
        f = Leaderboard2026Facts(LEADERBOARD, WORLD_SIZE, sections, multi, one, w,
                                 predict_step(list(one.fit_runs), LEADERBOARD.model, w.bps, WORLD_SIZE))
    return f
