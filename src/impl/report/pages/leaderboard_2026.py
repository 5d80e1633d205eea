"""leaderboard (2026): the 8B training step on two GPUs (SPEC.md), each run's fastest checkpointing candidate
against the class's best scaled by the datasheets, and the step predicted from one-GPU rows with fewer layers
(impl.leaderboard_prediction, priced with parallelism_calcs' W)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Status
from impl.leaderboard_prediction import LayerRun, StepPrediction, predict_step
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages._nsys import Profiled, profiled_steps
from impl.report.pages.parallelism_calcs import Bandwidth, nccl_bus_bandwidth
from impl.report.ratio import ratio
from impl.report.rows import Bench, View, group
from impl.report.runs import RunsFacts, device_name, files_of, gpu_model, newest_date
from impl.workloads.leaderboard_2026 import (CLASS_BEST_GPU, CLASS_BEST_GPUS, CLASS_BEST_STEP_S, COLD_RUN_LIMIT_S,
                                             LEADERBOARD, WORLD_SIZE)
from impl.workloads.problems import Problem as P

PROBLEMS = (P.LEADERBOARD_2026,)
PROBLEM = P.LEADERBOARD_2026


@dataclass(frozen=True)
class StepConfig(View):
    checkpointing: str = ""
    k: int | None = None
    compile: str = "none"  # StepSpec.compile (rows before it: none)
    attn_impl: str = "flash_triton"
    allocator: str = "default"  # StepSpec.allocator (rows before it: default)
    grad_sync: str = "ddp_bucketed"  # StepSpec.grad_sync (rows before it: ddp_bucketed)
    nccl_high_priority: bool = False  # StepSpec's NCCL options (rows before them: NCCL's defaults)
    nccl_max_ctas: int | None = None
    residual: str = "fp32"  # StepSpec.residual (in the row only where bf16)
    lm_head_chunk_mib: int | None = None  # StepSpec's LM head (in the row only where a candidate sets them)
    lm_head_softmax: str = "torch"
    layers: int = 0
    world_size: int | None = None
    batch: int = 0
    context: int = 0


_cfg = StepConfig.of


def policy_label(c: StepConfig) -> str:
    """"every_k (k 1)", "keep_attention (k 3), pointwise compiled, flash_gluon_ws": its checkpointing and every
    option set away from its default."""
    nccl = [name.replace("_", " ") + ("" if value is True else f" {value}")  # a StepSpec field's name, its value
            for name in ("nccl_high_priority", "nccl_max_ctas") if (value := getattr(c, name)) not in (False, None)]
    options = (c.compile != "none" and f"{c.compile} compiled",
               c.attn_impl not in ("flash_triton", "flash_torch") and c.attn_impl,
               c.allocator != "default" and c.allocator.replace("_", " "),
               c.grad_sync != "ddp_bucketed" and c.grad_sync.replace("_", " "),
               *nccl,
               c.residual != "fp32" and f"{c.residual} residual",
               c.lm_head_chunk_mib is not None and f"lm_head_chunk {c.lm_head_chunk_mib} MiB",
               c.lm_head_softmax != "torch" and f"{c.lm_head_softmax} softmax")
    return c.checkpointing + ("" if c.k is None else f" (k {c.k})") + "".join(f", {o}" for o in options if o)


@dataclass(frozen=True)
class Candidate:
    """One stored row of the step: a checkpointing candidate on several GPUs, or a layer count on one."""

    b: Bench
    earlier: tuple[tuple[str, float], ...] = ()  # the same candidate's earlier measured runs: (run, step s)

    policy = property(lambda self: policy_label(_cfg(self.b)))  # "none", "every_k (k 1)"
    layers = property(lambda self: _cfg(self.b).layers)
    run_when = property(lambda self: self.b.run.when)  # UTC
    status = property(lambda self: self.b.status)
    reason = property(lambda self: self.b.row.reason or "")
    measured = property(lambda self: self.b.measured)
    median_s = property(lambda self: self.b.stats.median if self.measured else None)  # the harness's
    first_call_s = property(lambda self: self.b.metric(Metric.FIRST_CALL_S))
    first_call_caches = property(lambda self: self.b.details.get("first_call_caches"))  # newer rows
    run_wall_s = property(lambda self: self.b.details.get("run_wall_s"))  # the run's start to this row's end (newer)
    flops = property(lambda self: self.b.metric(Metric.FLOPS))  # model FLOPs of one rank's share of the step
    datasheet_flops = property(lambda self: self.b.row.peaks and self.b.row.peaks.datasheet_flops)
    measured_peak_flops = property(lambda self: self.b.row.peaks and self.b.row.peaks.measured_flops)  # the run's
    breakdown = property(lambda self: self.b.details.get("breakdown"))  # impl.workloads.kernels.step_breakdown
    gpu = property(lambda self: self.b.row.env.device.removeprefix("NVIDIA ").strip())  # "H200"
    # the handout's timer (the slowest rank's median), where the row has it
    do_bench_s = property(lambda self: None if (ms := self.b.metric(Metric.DO_BENCH_MS)) is None else ms / 1e3)
    step_s = property(lambda self: self.median_s if self.do_bench_s is None else self.do_bench_s)
    rank_peaks = property(lambda self: tuple(r["peak"] for r in self.b.details.get("ranks") or []
                                             if r.get("peak") is not None))

    @property
    def from_empty_caches(self) -> bool | None:
        """Whether its first call began with no compiled Triton kernel or Inductor graph on disk (None: not
        recorded), the handout's "from an empty PyTorch/Triton cache"."""
        caches = self.first_call_caches
        return None if caches is None else caches["triton_files"] == 0 and caches["inductor_files"] == 0

    def _mfu(self, peak: float | None) -> float | None:
        return self.flops / self.step_s / peak if self.flops and peak else None

    mfu = property(lambda self: self._mfu(self.datasheet_flops))  # of the datasheet's dense bf16 peak
    mfu_measured_peak = property(lambda self: self._mfu(self.measured_peak_flops))


@dataclass(frozen=True)
class ClassBest:  # the class's best entry against ours, scaled by the GPUs' datasheet dense bf16 peaks
    ours: Candidate
    step_s = CLASS_BEST_STEP_S
    gpus = CLASS_BEST_GPUS
    gpu = CLASS_BEST_GPU
    gpu_flops = datasheet_bf16_flops(CLASS_BEST_GPU)

    scale = property(lambda self: self.gpu_flops / self.ours.datasheet_flops)  # one of its GPUs' work ÷ ours'
    ratio = property(lambda self: ratio(self.ours.step_s, self.step_s, "the class's best"))
    # with our row's FLOPs per GPU (the same model and batch)
    mfu = property(lambda self: self.ours.flops / self.step_s / self.gpu_flops if self.ours.flops else None)
    at_our_peak_s = property(lambda self: self.step_s * self.scale)  # its step on our GPUs at its MFU
    ours_at_its_peak_s = property(lambda self: self.ours.step_s / self.scale)


@dataclass(frozen=True)
class Breakdown:
    phases: tuple[str, ...]
    categories: tuple[str, ...]  # those with time in any profiled candidate
    top_of: Candidate  # whose top kernels the page lists


# step_breakdown's parts_ms keys (impl.workloads.kernels.STEP_PARTS) of the blocks' compute: with the layers
# they give the per-layer cost; the template names every part
BLOCK_PARTS = ("blocks forward", "attention forward", "recompute", "attention recompute", "blocks backward",
               "attention backward")
ATTENTION_PARTS = ("attention forward", "attention recompute", "attention backward")


@dataclass(frozen=True)
class StepParts:
    """A profiled step by part (step_breakdown's parts_ms and communication_exposed_ms, in rows since the
    nineteenth session; older rows lack them and the page says nothing of parts): the compute parts,
    communication not hidden behind other kernels, and the rest of the measured step (host, launches, idle)."""

    of: Candidate
    parts_ms: dict[str, float]  # STEP_PARTS -> ms per step, summing to the kernel time
    exposed_ms: dict[str, float]  # phase -> communication kernel time with no other kernel beside it

    step_ms = property(lambda self: self.of.breakdown["step_ms"])
    communication_ms = property(lambda self: self.parts_ms.get("communication", 0.0))
    hidden_ms = property(lambda self: self.communication_ms - sum(self.exposed_ms.values()))

    @classmethod
    def of_row(cls, c: Candidate) -> StepParts | None:
        b = c.breakdown or {}
        parts, exposed = b.get("parts_ms"), b.get("communication_exposed_ms")
        return cls(c, parts, exposed) if parts and exposed is not None else None

    @property
    def rows(self) -> list[tuple[str, float]]:
        """(part, ms) summing to the measured step: every compute part, communication not hidden, the rest."""
        compute = [(k, v) for k, v in self.parts_ms.items() if k != "communication"]
        exposed = sum(self.exposed_ms.values())
        rest = self.step_ms - sum(v for _, v in compute) - exposed
        return [*compute, ("communication exposed", exposed), ("rest", rest)]

    def _per_layer_ms(self, parts: tuple[str, ...]) -> float | None:  # None: a row without its layer count
        return sum(self.parts_ms.get(k, 0.0) for k in parts) / self.of.layers if self.of.layers else None

    per_layer_ms = property(lambda self: self._per_layer_ms(BLOCK_PARTS))
    attention_per_layer_ms = property(lambda self: self._per_layer_ms(ATTENTION_PARTS))


@dataclass(frozen=True)
class TwoGpuFacts:
    device: str  # folder
    heading: str  # named as headings name it
    world: int
    candidates: tuple[Candidate, ...]  # every candidate's newest row, in run order
    fastest: dict[str, Candidate]  # run (UTC) -> its fastest measured candidate
    runs: RunsFacts
    files: tuple[str, ...]
    cold: tuple[Candidate, ...]  # the newest run from empty compile caches, where the newest run is not one
    cold_limit_s: float = COLD_RUN_LIMIT_S

    newest = property(lambda self: self.fastest[max(self.fastest)])  # the newest run's fastest: the answer
    newest_run = property(lambda self: tuple(c for c in self.candidates if c.run_when == self.newest.run_when))
    first_calls = property(lambda self: tuple(c for c in self.newest_run if c.measured and c.first_call_s is not None))
    profiled = property(lambda self: tuple(c for c in self.candidates if c.measured and c.breakdown))
    answer_profile = property(lambda self: min((c for c in self.profiled if c.run_when == self.newest.run_when),
                                               key=lambda c: c.step_s, default=None))  # its run's fastest profiled
    parts = property(lambda self: StepParts.of_row(self.newest))  # the answer's step by part, where its row has them
    class_best = property(lambda self: ClassBest(self.newest) if ClassBest.gpu_flops and self.newest.datasheet_flops
                          else None)
    # the newest run's fastest configuration is among the cold run's
    cold_has_answer = property(lambda self: any(c.policy == self.newest.policy for c in self.cold))

    @property
    def breakdown(self) -> Breakdown | None:  # the categories with time in any profiled candidate
        if not (p := self.profiled):
            return None
        cats = tuple(k for k in p[0].breakdown["category_ms"]
                     if any(c.breakdown["category_ms"].get(k, 0.0) > 0 for c in p))
        return Breakdown(tuple(p[0].breakdown["phase_ms"]), cats, self.answer_profile or p[-1])


def _multi(b: Bench) -> bool:
    return (_cfg(b).world_size or 1) > 1


def cold_run(device: str, rows: Sequence[Bench]) -> tuple[Candidate, ...]:
    """The measured candidates, in run order, of the newest run on `device` that began from empty compile caches
    (tools/leaderboard_cold.sh), superseded rows included: a later run of the same candidates must not hide it."""
    every = [Candidate(b) for b in rows if b.run.device == device and _multi(b)]
    runs = group(sorted((c for c in every if c.measured and c.first_call_s is not None),
                        key=lambda c: c.run_wall_s or 0.0), key=lambda c: c.run_when)
    cold = [w for w, cs in runs.items() if cs[0].from_empty_caches]
    return tuple(runs[max(cold)]) if cold else ()


def two_gpu_facts(device: str, rows: list[Bench], history: Sequence[Bench] = ()) -> TwoGpuFacts | None:
    """The facts of a device's multi-GPU rows (None where it has no measured one); `history`, the earlier
    rows of any device, gives each candidate its earlier runs (the spread between runs)."""
    rows = [b for b in rows if _multi(b)]
    earlier = group((Candidate(b) for b in history if b.run.device == device and b.measured), key=lambda c: c.b.name)
    cands = tuple(Candidate(b, tuple((c.run_when, c.step_s) for c in earlier.get(b.name, ()))) for b in rows)
    # a run's fastest among all its rows: one measured again later (shown under its newer run) still counts
    superseded = [Candidate(b) for b in history if b.run.device == device and _multi(b) and b.measured]
    fastest = {w: min((c for c in (*cands, *superseded) if c.measured and c.run_when == w), key=lambda c: c.step_s)
               for w in sorted({c.run_when for c in cands if c.measured})}
    if not fastest:
        return None
    newest = fastest[max(fastest)]
    cold = cold_run(device, [*rows, *history])
    cold = () if not cold or cold[0].run_when == newest.run_when else cold
    files = tuple(sorted({*files_of(rows), *(c.b.run.file for c in cold)}))
    return TwoGpuFacts(device, device_name(device, rows), int(_cfg(rows[0]).world_size), cands, fastest,
                       RunsFacts.of(device, rows), files, cold)


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
    """(policy, runs) of the (policy, k, run) with the most measured layer counts (checkpointed first on a
    tie: 34 plain layers would not fit): the points the prediction fits. Other k or runs are other models."""
    groups = group([b for b in rows if b.status is Status.MEASURED],
                   lambda b: (_cfg(b).checkpointing, _cfg(b).k or 0, b.run.datetime))
    if not groups:
        return "", []
    (checkpointing, k, _), g = max(sorted(groups.items(), key=lambda kv: kv[0][0] == "none"),
                                   key=lambda kv: len({_cfg(b).layers for b in kv[1]}))  # the first of the most
    return (checkpointing if checkpointing == "none" else f"{checkpointing} (k {k})",
            [LayerRun(_cfg(b).layers, b.stats.median, b.row.memory.peak_allocated) for b in g])


def one_gpu(ctx: Context, like: str | None) -> OneGpu | None:
    """The rows of the one-GPU device with `like`'s GPU (the W's device) when it has rows, else the first."""
    found = [(d, rows) for d, rows in ctx.rows.per_gpu(PROBLEM) if d.endswith("-x1")]
    same = [x for x in found if like is not None and gpu_model(x[0]) == gpu_model(like)]
    if not (same or found):
        return None
    device, rows = (same or found)[0]
    rows = sorted(rows, key=lambda b: (_cfg(b).checkpointing, _cfg(b).k is None, _cfg(b).k or 0, _cfg(b).layers))
    fit_policy, runs = layer_runs(rows)
    return OneGpu(device, device_name(device, rows), newest_date(rows),
                  _cfg(rows[0]).batch, _cfg(rows[0]).context, tuple(map(Candidate, rows)), fit_policy,
                  tuple(runs), files_of(rows))


NSYS_COLLECTIVES = ("ncclAllReduce", "ncclBroadcast")  # DDPBucketed's gradient buckets; the sharded states'


class StepNsys(Profiled):
    """The 8B step on two GPUs under Nsight Systems (impl.nsys's leaderboard_2026 case): its first case's measured
    step, both ranks, to see where the compute stream waits and what NCCL overlaps."""

    timeline = property(lambda self: self.timelines[0][1])


def step_nsys(ctx: Context) -> StepNsys | None:
    def label(a: dict) -> str | None:
        return policy_label(StepConfig(checkpointing=a["checkpointing"], k=a.get("k"),
                                       compile=a.get("compile") or "none", attn_impl=a.get("attn") or "flash_triton",
                                       allocator=a.get("allocator") or "default")) if a.get("config") else None
    filed, steps = profiled_steps(ctx, "leaderboard_2026", label, NSYS_COLLECTIVES)
    return StepNsys(filed, tuple(steps[:1])) if steps else None


@dataclass(frozen=True)
class Leaderboard2026Facts:
    two_gpu_sections: tuple[tuple[str, tuple[str, ...]], ...]  # (device heading, sections) of multi-GPU devices
    multi: TwoGpuFacts | None  # the answer, None: not run on more than one GPU
    one: OneGpu | None
    w: Bandwidth | None  # the prediction's bus bandwidth
    fits: bool  # the one-GPU rows have two layer counts of a policy
    pred: StepPrediction | None  # None: no fit, or no W
    beside: Candidate | None  # the newest measured multi-GPU candidate of the prediction's policy
    sources: list[str]
    nsys: StepNsys | None = None
    spec = LEADERBOARD
    world = WORLD_SIZE  # the ranks the step is built for

    @property
    def scores(self) -> dict[str, Scored]:
        if self.multi is not None:
            device = self.multi.device + (f" + {self.one.device}" if self.pred else "")
            return {PROBLEM: Scored(Kind.MEASURED, device, self.multi.runs.date)}
        if self.pred is not None:
            return {PROBLEM: Scored(Kind.PREDICTED, f"{self.one.device} + {self.w.device}", self.one.date)}
        return {PROBLEM: NOT_MEASURED}


def facts(ctx: Context) -> Leaderboard2026Facts:
    sections = tuple((device_name(d, rows), tuple(sorted({b.run.section for b in rows})))
                     for d, rows in ctx.rows.per_gpu() if not d.endswith("-x1"))
    multi = next((f for d, rows in ctx.rows.per_gpu(PROBLEM) if not d.endswith("-x1")
                  and (f := two_gpu_facts(d, rows, ctx.rows.history)) is not None), None)
    w = nccl_bus_bandwidth(ctx.rows, world_size=WORLD_SIZE)
    one = one_gpu(ctx, None if w is None else w.device)
    fits = one is not None and len({r.layers for r in one.fit_runs}) >= 2
    pred = predict_step(list(one.fit_runs), LEADERBOARD.model, w.bps, WORLD_SIZE) if fits and w is not None else None
    beside = next((c for c in reversed(multi.candidates) if c.measured and c.policy == one.fit_policy), None) \
        if multi and one else None
    nsys = step_nsys(ctx)
    files = {*(multi.files if multi else []), *(one.files if one else ()), *([w.file] if pred else []),
             *(nsys.sources if nsys else [])}
    return Leaderboard2026Facts(sections, multi, one, w, fits, pred, beside, sorted(files), nsys)
