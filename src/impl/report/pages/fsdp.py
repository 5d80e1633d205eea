"""fsdp and fsdp_accounting (2026): per GPU device and [edition, size] run (impl.report.rows.size_runs_of)
our FSDP (fp32, bf16 compute, a unit per block), torch's fully_shard and DDPBucketed, the
optimizer-sharding rows of the same shape, and the collective timeline of one instrumented step of
ours (impl.distributed.fsdp_timeline); every ratio divides rows of one run. Then tensor parallelism
beside DDP and FSDP on one model and global batch, and the one-GPU per_rank_memory check.
templates/fsdp.md.j2 holds every word (the timeline figure's own words excepted)."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.bench.row import Metric, Status
from impl.model.sizes import SizeRef
from impl.report import figures
from impl.report.pages import Context, Kind, Scored
from impl.report.pages import optimizer_sharding as opt_sharding
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, answering, current_edition, size_label, size_ref, \
    size_runs_of, view
from impl.report.runs import RunsFacts, device_name, device_short
from impl.workloads.problems import Problem as P, StoredGroup
from impl.workloads.sweeps import grid
from impl.workloads.variants import DDPVariant, FSDPVariant

PROBLEMS = (P.FSDP, P.FSDP_ACCOUNTING)
SLUG = "fsdp"
LABEL = {v.value: v.label for v in FSDPVariant}
DDP_LABEL = {v.value: v.label for v in DDPVariant}
OURS = ("fsdp", "fsdp_bf16", "fsdp_block_bf16")
TP = "tp"  # perf/test_fsdp.py's tensor-parallel rows: the whole global batch on every rank
# The headline pair, by rule rather than by which row looks best: the target configuration (ours with
# a unit per block against fully_shard, both bf16, the grid's first pair), else the nearest pair the
# run has, bf16 before fp32.
HEADLINE_PAIRS = (("fsdp_block_bf16", "torch_fsdp_bf16"), ("fsdp_bf16", "torch_fsdp_bf16"), ("fsdp", "torch_fsdp"))
# The timeline's collectives as its table and its figure's legend name them, and their figure style.
COLLECTIVE = {("all_gather", "forward"): "all-gather, forward", ("all_gather", "backward"): "all-gather, backward",
              ("reduce_scatter", "backward"): "reduce-scatter", ("all_reduce", "finish"): "all-reduce (replicated)"}
STYLE = {("all_gather", "forward"): ("C0", 0.0), ("all_gather", "backward"): ("C1", 0.0),
         ("reduce_scatter", "backward"): ("C2", 0.35), ("all_reduce", "finish"): ("C7", 0.0)}
BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2}
PER_RANK_PARTS = ("parameters", "gradients", "optimizer_state", "activations")


@dataclass(frozen=True)
class DistConfig:
    """What this page reads of an fsdp, ddp, optimizer-sharding or per_rank_memory row's config."""

    variant: str = ""
    size: str | None = None
    edition: str | None = None
    context: int = 0
    batch_per_rank: int = 0
    world_size: int = 0
    backend: str = ""
    dtype: str = ""
    kind: str | None = None  # older ddp files: "trace" rows beside the benchmarks

    @property
    def size_ref(self) -> SizeRef | None:
        return size_ref(self.size, self.edition)

    @property
    def size_label(self) -> str:
        return size_label(self.size_ref, self.size)


def cfg(b: Bench) -> DistConfig:
    return view(DistConfig, b)


def headline_pair(measured_variants) -> tuple[str, str] | None:
    """The first of HEADLINE_PAIRS whose two variants both have a measured row."""
    have = set(measured_variants)
    return next((p for p in HEADLINE_PAIRS if set(p) <= have), None)


def _vs(o: Bench, x: Bench, name: str) -> Ratio:
    return ratio(o.stats.median, x.stats.median, name, spread(o.stats.stddev, o.stats.iqr),
                 spread(x.stats.stddev, x.stats.iqr))


# ---- one [edition, size] run of the fsdp rows ----------------------------------------------------

@dataclass(frozen=True)
class ConfigRow:
    """A configuration of the run's table; `status` other than measured: a not-run cell with its reason."""

    label: str
    status: str
    reason: str | None
    step_s: float | None = None
    step_std: float | None = None
    comm_s: float | None = None  # what finish_gradient_synchronization waited
    payload_bytes: float | None = None  # handed to collectives per step
    peak_bytes: float | None = None
    predicted_bytes: float | None = None
    tokens_per_s: float | None = None


def _config_row(b: Bench) -> ConfigRow:
    label = LABEL.get(cfg(b).variant, cfg(b).variant)
    if b.status is not Status.MEASURED:
        return ConfigRow(label, b.status.value, b.row.reason)
    s = b.stats
    return ConfigRow(label, b.status.value, b.row.reason, s.median if s else None, s.stddev if s else None,
                     b.figure("comm_s"), b.figure("bytes_per_step"), b.figure("peak_bytes"),
                     b.figure("predicted_total_bytes"), b.figure("tokens_per_s", Metric.TOKENS_PER_S))


def _sharding(rows: list[Bench], first: Bench) -> list[opt_sharding.Variant]:
    """The optimizer_state_sharding_accounting rows (same device) of `first`'s shape: size by edition,
    context, per-rank batch; measured, with a peak."""
    shape = lambda b: (cfg(b).size_ref, cfg(b).context, cfg(b).batch_per_rank)  # noqa: E731
    return [v for b in rows if shape(b) == shape(first) and b.status is Status.MEASURED and b.details.get("ranks")
            and (v := opt_sharding.variant(b)).peak]


@dataclass(frozen=True)
class Collective:
    """One kind of collective in the instrumented step (the timeline's summary group)."""

    name: str  # COLLECTIVE
    n: int
    prefetched: int
    used: int  # waited on
    in_time: int
    stall_ms: float
    max_stall_ms: float
    worst: str  # the weight of the largest stall
    comm_ms: float  # issue -> ready, summed

    @property
    def stalled(self) -> int:
        return self.used - self.in_time


def _phase_counts(tl: dict, phase: str) -> tuple[int, int]:
    """(all-gathers ready in time, waited on) of a phase."""
    g = [x for x in tl["summary"]["groups"] if x["kind"] == "all_gather" and x["phase"] == phase]
    return (g[0]["in_time"], g[0]["used"]) if g else (0, 0)


@dataclass(frozen=True)
class Timeline:
    """fsdp_accounting (b) for one of our configurations: rank 0's instrumented step."""

    label: str
    collectives: list[Collective]
    gathers: int
    gathers_in_time: int
    forward: tuple[int, int]  # (in time, waited on)
    backward: tuple[int, int]
    gather_stall_ms: float
    exposed_ms: float  # all collectives' exposed communication
    span_ms: float
    rank_exposed_ms: tuple[float, ...]  # per rank, where the row kept them
    step_s: float | None  # the instrumented step
    timed_s: float | None  # the timed (uninstrumented) steps

    @property
    def all_in_time(self) -> bool:
        return self.forward[0] == self.forward[1] and self.backward[0] == self.backward[1]


def _timeline(b: Bench) -> Timeline:
    tl = b.details["timeline"]
    s, units = tl["summary"], tl.get("units") or []
    groups = [Collective(COLLECTIVE.get((g["kind"], g["phase"]), f"{g['kind']}, {g['phase']}"), g["n"],
                         g["prefetched"], g["used"], g["in_time"], g["stall_ms"], g["max_stall_ms"],
                         units[w] if isinstance(w := g["max_stall_unit"], int) and 0 <= w < len(units) else "–",
                         g["comm_ms"]) for g in s["groups"]]
    timed = b.figure("worker_step_s") or b.stats.median  # older files: the ranks' clock beside the parent's
    return Timeline(LABEL.get(cfg(b).variant, cfg(b).variant), groups, s["gathers"], s["gathers_in_time"],
                    _phase_counts(tl, "forward"), _phase_counts(tl, "backward"), s["gather_stall_ms"],
                    s["exposed_ms"], s["span_ms"],
                    tuple(x["summary"]["exposed_ms"] for x in b.details.get("timeline_ranks") or []),
                    b.figure("timeline_step_s"), timed)


@dataclass(frozen=True)
class Saving:
    """fsdp_accounting (a): DDP's and our fp32 FSDP's measured peaks against the closed form."""

    predicted: acc.FSDPPeakSaving
    ddp_peak: float
    fsdp_peak: float

    @property
    def measured(self) -> float:
        return self.ddp_peak - self.fsdp_peak

    @property
    def of_predicted(self) -> float:
        return self.measured / self.predicted.saving

    @property
    def above_prediction(self) -> float:
        return self.fsdp_peak - self.predicted.fsdp_peak


def saving(rows: list[Bench]) -> Saving | None:
    by = {cfg(b).variant: b for b in rows if b.measured}
    ddp, fsdp = by.get("ddp"), by.get("fsdp")
    if ddp is None or fsdp is None or cfg(fsdp).size_ref is None or None in (ddp.figure("peak_bytes"),
                                                                            fsdp.figure("peak_bytes")):
        return None
    shape = cfg(fsdp).size_ref.config  # by edition: the 2026 xl is the 2025 2.7B
    pred = acc.fsdp_peak_saving(int(fsdp.details["n_params"]), int(cfg(fsdp).world_size),
                                acc.largest_sharded_layer_numel(shape.d_model, shape.d_ff),
                                activations=fsdp.details.get("predicted_activations_bytes") or 0.0)
    return Saving(pred, ddp.figure("peak_bytes"), fsdp.figure("peak_bytes"))


@dataclass(frozen=True)
class Headline:
    ours: str  # labels
    anchor: str
    ours_s: float
    ours_std: float | None
    vs_anchor: Ratio
    vs_ddp: Ratio | None


def headline(rows: list[Bench]) -> Headline | None:
    by = {cfg(b).variant: b for b in rows if b.measured}
    pair = headline_pair(by)
    if pair is None:
        return None
    o, a, ddp = by[pair[0]], by[pair[1]], by.get("ddp")
    return Headline(LABEL[pair[0]], LABEL[pair[1]], o.stats.median, o.stats.stddev, _vs(o, a, LABEL[pair[1]]),
                    _vs(o, ddp, "our DDP") if ddp is not None else None)


@dataclass(frozen=True)
class RunFacts:
    """One [edition, size] run of a device's fsdp rows (its TP rows aside)."""

    run: RunLabel
    device: str  # the device folder
    config: DistConfig  # its first row's: size, context, per-rank batch, ranks, backend
    rows: list[ConfigRow]
    not_yet_run: list[str]  # labels of today's grid's variants the run lacks
    sharding: list[opt_sharding.Variant]  # beside, of the same shape
    timeline_errors: list[str]  # "label: error" (older files)
    ran_ours: bool  # one of our configurations ran (so a timeline is expected)
    timelines: list[Timeline]
    timeline_source: str = ""
    timeline_kept: int = 0  # rows the JSON keeps of the first timeline
    timeline_total: int = 0
    figure: str | None = None
    saving: Saving | None = None
    headline: Headline | None = None

    @property
    def date(self) -> str:
        return self.run.date


def _draw(ax, tl: dict, title: str) -> None:
    """Gantt of one step on rank 0: one row per layer call (forward order, top down; a layer's
    reduce-scatter just below its gathers); a bar from issue to ready per collective, a tick where
    it was needed (red, with the stall drawn from need to ready, when it was not ready yet)."""
    rows = [dict(zip(tl["columns"], r)) for r in tl["rows"]]
    n_calls = max(max((r["call"] for r in rows), default=0) + 1, 1)
    lw = max(0.5, min(5.0, 240 / n_calls))
    for r in rows:
        r["y"] = float(r["call"] if r["call"] >= 0 else n_calls + 1) + STYLE.get((r["kind"], r["phase"]), ("", 0.0))[1]
    shades, seen = {"forward": "C0", "backward": "C1", "finish": "C7"}, set()
    for p in tl["phases"]:  # a step with several forwards shades each, one legend entry per phase name
        ax.axvspan(p["start_ms"], p["end_ms"], color=shades.get(p["name"], "C4"), alpha=0.08, lw=0,
                   label=None if p["name"] in seen else f"phase: {p['name']}")
        seen.add(p["name"])
    for kind, phase in sorted({(r["kind"], r["phase"]) for r in rows}):
        g = [r for r in rows if (r["kind"], r["phase"]) == (kind, phase)]
        color, off = STYLE.get((kind, phase), ("C7", 0.0))
        ax.hlines([r["y"] for r in g], [r["issue_ms"] for r in g], [r["ready_ms"] for r in g], color=color,
                  lw=lw if off == 0 else lw / 2, label=COLLECTIVE.get((kind, phase), f"{kind}, {phase}"))
    used = [r for r in rows if r["need_ms"] is not None]
    late = [r for r in used if (r["stall_ms"] or 0) > 0]
    ax.hlines([r["y"] for r in late], [r["need_ms"] for r in late], [r["ready_ms"] for r in late], color="red", lw=lw)
    tick = max(4.0, lw * 12)
    for pts, color, label, z in ((used, "black", "needed (in time)", 3),
                                 (late, "red", "needed (stalled until ready, red)", 4)):
        ax.scatter([r["need_ms"] for r in pts], [r["y"] for r in pts], marker="|", s=tick, color=color, lw=0.8,
                   label=label, zorder=z)
    ax.set_ylim(n_calls + 2, -1)
    ax.yaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
    ax.set(xlabel="ms from the step's first forward", ylabel="layer call (forward order; all-reduce last)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _draw_slack(ax, tl: dict) -> None:
    """Per all-gather, how long before its layer needed it the weight was ready (need - ready):
    below zero the layer waited. Readable per gather where the Gantt's bars are too short."""
    rows = [r for r in (dict(zip(tl["columns"], x)) for x in tl["rows"])
            if r["kind"] == "all_gather" and r["need_ms"] is not None]
    for phase, color in (("forward", "C0"), ("backward", "C1")):
        pts = [(r["call"], r["need_ms"] - r["ready_ms"]) for r in rows if r["phase"] == phase]
        ax.scatter([c for c, _ in pts], [s for _, s in pts], s=6, color=color, label=f"{phase} all-gather")
        late = [(c, s) for c, s in pts if s < 0]
        ax.scatter([c for c, _ in late], [s for _, s in late], s=10, facecolors="none", edgecolors="red", lw=0.6)
    ax.axhline(0, color="0.4", lw=0.6)
    ax.xaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
    ax.set(xlabel="layer call (forward order)", ylabel="ready before needed (ms); < 0: stalled")
    ax.set_title("slack per all-gather (red: stalled)", fontsize=9)
    ax.legend(fontsize=7, frameon=False)


def _draw_timelines(rows: list[Bench], ctx: Context, name: str) -> str:
    """A Gantt and a slack panel per configuration; the figure's link."""
    c = cfg(rows[0])
    fig, axes = figures.plt.subplots(len(rows), 2, figsize=(15, 4.6 * len(rows) + 0.4), squeeze=False,
                                     gridspec_kw=dict(width_ratios=[2.2, 1]))
    fig.suptitle(f"{c.size_label}: one instrumented step, context {c.context}, per-rank batch {c.batch_per_rank}, "
                 f"{c.world_size} ranks", fontsize=11, x=0.01, ha="left")
    for (gantt, slack), b in zip(axes, rows):
        tl, t = b.details["timeline"], _timeline(b)
        _draw(gantt, tl, f"{t.label}, rank 0\n{t.gathers_in_time} of {t.gathers} all-gathers ready in time; "
                         f"{t.exposed_ms:.2f} ms of communication exposed in a {t.span_ms:.2f} ms step")
        _draw_slack(slack, tl)
    figures.save(fig, ctx.fig_dir / name)
    return f"{ctx.fig_rel}/{name}"


def run_facts(device: str, label: str, run: SizeRun, shard: list[Bench], ctx: Context) -> RunFacts | None:
    """The facts of one [edition, size] run of a device's fsdp rows; None for a run of TP rows only."""
    rows = [b for b in run.rows if b.problem == P.FSDP and cfg(b).variant != TP]
    if not rows:
        return None
    have = {cfg(b).variant for b in rows}
    ours = [b for b in rows if cfg(b).variant in OURS and b.status is Status.MEASURED]
    with_tl = [b for b in ours if b.details.get("timeline")]
    tl0 = with_tl[0].details["timeline"] if with_tl else {}
    return RunFacts(
        run.label(label), device, cfg(rows[0]),
        [_config_row(b) for b in rows],
        [LABEL.get(v, v) for v in grid(P.FSDP, "full").variants if v not in have],
        _sharding(shard, rows[0]),
        [f"{LABEL.get(cfg(b).variant, cfg(b).variant)}: {b.details['timeline_error']}" for b in rows
         if b.details.get("timeline_error")],
        bool(ours), [_timeline(b) for b in with_tl], tl0.get("source", ""), len(tl0.get("rows", ())),
        tl0.get("rows_total", 0),
        _draw_timelines(with_tl, ctx, f"{SLUG}-{device}-{run.id}_fsdp_timeline.png") if with_tl else None,
        saving(rows), headline(rows))


@dataclass(frozen=True)
class DeviceSection:
    heading: str  # "2× NVIDIA H200 (h200-141gb-x2)"
    runs: list[RunFacts]
    source: RunsFacts  # the device's fsdp rows but TP's


# ---- tensor parallelism beside DDP and FSDP ------------------------------------------------------

def global_batch(b: Bench) -> int:
    """Sequences per step over all ranks: a TP row's ranks all take the whole batch, the others a share."""
    c = cfg(b)
    return c.batch_per_rank if c.variant == TP else c.batch_per_rank * c.world_size


@dataclass(frozen=True)
class Shape:
    """What makes two rows the same workload: the model size (edition, name), context and global batch."""

    size: SizeRef | None
    context: int
    batch: int

    @classmethod
    def of(cls, b: Bench) -> Shape:
        return cls(cfg(b).size_ref, cfg(b).context, global_batch(b))


@dataclass(frozen=True)
class Side:
    """A row of the TP section: a TP row, or one of the same model and global batch that shards the batch
    (DDP, FSDP) with TP's ratio against it where the two come from one run."""

    bench: Bench
    run: RunLabel
    where: str  # "2×H200 (h200-141gb-x2)"
    label: str = ""
    section: str = "fsdp"  # the section it was read from ("fsdp", "ddp")
    vs_tp: Ratio | None = None  # the same-run TP row (the same rank count) ÷ this row

    @property
    def world(self) -> int:
        return cfg(self.bench).world_size

    @property
    def step_s(self) -> float:
        return self.bench.stats.median

    @property
    def spread(self) -> float | None:
        return spread(self.bench.stats.stddev, self.bench.stats.iqr)

    @property
    def peak(self) -> float | None:
        return self.bench.row.memory.peak_allocated or self.bench.figure("peak_bytes")

    @property
    def tokens_per_s(self) -> float | None:
        return self.bench.metric(Metric.TOKENS_PER_S)


class TpRow(Side):
    """One TP row: measured, counted, closed form and predicted."""

    @property
    def dtype(self) -> str:
        return cfg(self.bench).dtype

    @property
    def counted(self) -> dict:
        """{"calls", "payload_bytes"} the ranks counted (the same on every rank)."""
        return self.bench.details.get("tp_traffic") or {}

    @property
    def bytes_per_value(self) -> int:
        """p of the closed form: the activations' bytes per value in the row's dtype."""
        return BYTES_PER_VALUE[self.dtype]

    @property
    def closed_form_bytes(self) -> float:
        shape = cfg(self.bench).size_ref.config
        return pc.tp_step_allreduce_payload(global_batch(self.bench) * cfg(self.bench).context, shape.d_model,
                                            shape.num_layers, self.bytes_per_value)

    @property
    def closed_form_calls(self) -> int:
        return 4 * cfg(self.bench).size_ref.config.num_layers

    @property
    def ring_bytes_per_rank(self) -> float:
        return pc.ring_all_reduce_bytes(self.counted.get("payload_bytes", self.closed_form_bytes), self.world)

    @property
    def predicted(self) -> dict:
        """tp_calcs' terms from the run's own measured matmul rate C and bus bandwidth W."""
        return self.bench.details.get("tp_predicted") or {}

    @property
    def measured_over_predicted(self) -> float | None:
        pred = self.predicted.get("step_s")
        return self.step_s / pred if pred else None


@dataclass(frozen=True)
class TpFacts:
    size: str  # described: "xl (2026): d_model 2560, 32 layers, 3.4B params"
    context: int
    batch: int  # global sequences per step
    rows: list[TpRow]  # measured TP rows, fewest ranks first
    not_run: list[TpRow]  # TP rows of a rank count no device measured
    beside: list[Side]

    @property
    def dtype(self) -> str:
        return self.rows[0].dtype if self.rows else ""

    @property
    def has_fsdp(self) -> bool:
        """An FSDP row (ours or fully_shard) of this model and batch stands beside TP."""
        return any(b.section == "fsdp" and cfg(b.bench).variant != "ddp" for b in self.beside)

    @property
    def shared_runs(self) -> bool:
        """Some TP row and some row beside it come from one run (so a ratio exists)."""
        return any(b.vs_tp is not None for b in self.beside)

    @property
    def tp_files(self) -> list[str]:
        return sorted({f for r in self.rows for f in r.run.files})

    @property
    def beside_files(self) -> list[str]:
        return sorted({f for b in self.beside for f in b.run.files})


def _where(device: str) -> str:
    return f"{device_short(device)} ({device})"


def _newest_of_shape(per_device: list[tuple[str, list[Bench]]], shape: Shape, keep
                     ) -> list[tuple[str, SizeRun, Bench]]:
    """(device, its newest run of `shape`'s size, each measured row of that run with `shape` that `keep` accepts)."""
    out = []
    for device, rows in per_device:
        runs = [r for r in size_runs_of(rows) if r.size == shape.size]
        if runs:
            out += [(device, runs[0], b) for b in runs[0].rows if b.measured and keep(b) and Shape.of(b) == shape]
    return out


def tp_facts(fsdp: list[tuple[str, list[Bench]]], ddp: list[tuple[str, list[Bench]]]) -> list[TpFacts]:
    """One TpFacts per TP shape (size, context, global batch), newest edition first. fsdp, ddp: (device,
    its rows) of the fsdp and ddp sections; the ddp section's rows stand beside TP only while the fsdp
    runs have no DDP row of the shape. A ratio divides only rows of one run."""
    tp_rows: dict[Shape, list[TpRow]] = {}
    for device, rows in fsdp:
        for run in size_runs_of(rows):
            for b in run.rows:
                if cfg(b).variant == TP and cfg(b).size_ref is not None:
                    tp_rows.setdefault(Shape.of(b), []).append(TpRow(b, run.label(device), _where(device)))
    out = []
    for shape, rows in tp_rows.items():
        measured = sorted((r for r in rows if r.bench.measured), key=lambda r: (r.world, r.run.device))
        done = {r.world for r in measured}
        not_run = [r for r in rows if not r.bench.measured and r.world not in done]
        beside_rows = _newest_of_shape(fsdp, shape, lambda b: cfg(b).variant != TP)
        if not any(cfg(b).variant == "ddp" for _, _, b in beside_rows):
            beside_rows += _newest_of_shape(ddp, shape, lambda b: cfg(b).variant not in ("single", "bucketed")
                                            and cfg(b).kind != "trace")
        beside = []
        for device, run, b in beside_rows:
            v = cfg(b).variant
            label = (DDP_LABEL if b.run.section == "ddp" else LABEL).get(v, v)
            same = [r for r in measured if r.bench.run.datetime == b.run.datetime and r.world == cfg(b).world_size]
            vs = ratio(same[0].step_s, b.stats.median, "", same[0].spread, spread(b.stats.stddev, b.stats.iqr)) \
                if same else None
            beside.append(Side(b, run.label(device), _where(device), label, b.run.section, vs))
        if measured or not_run:
            size = (measured or not_run)[0].run.size
            out.append(TpFacts(size, shape.context, shape.batch, measured, not_run, beside))
    return sorted(out, key=lambda f: -int((f.rows or f.not_run)[0].run.edition))


# ---- per_rank_memory: the one-GPU check of the two-GPU 2026 questions ----------------------------

@dataclass(frozen=True)
class RankVariant:
    name: str  # ddp / sharded_optimizer / fsdp
    parts: dict[str, float]  # PER_RANK_PARTS -> bytes
    total: float
    fits: bool | None  # this GPU


@dataclass(frozen=True)
class PerRankFacts:
    """The closed-form memory of one rank at world size 2 for DDP, the sharded optimizer and FSDP, and
    the measured peak of the replicated (DDP) rank's step run on one GPU."""

    size: str
    world_size: int
    batch_per_rank: int
    context: int
    gpu_bytes: int | None
    variants: list[RankVariant]
    measured_variant: str  # the variant whose rank ran on one GPU
    measured_peak: int | None
    mean_s: float | None
    heading: str = ""  # the device, as headings name it
    source: RunsFacts | None = None

    @property
    def measured_over_closed_form(self) -> float | None:
        v = next((v for v in self.variants if v.name == self.measured_variant), None)
        return None if v is None or not self.measured_peak else self.measured_peak / v.total


def per_rank_facts(rows: list[Bench], heading: str = "", source: RunsFacts | None = None) -> PerRankFacts | None:
    rows = [b for b in rows if b.problem == StoredGroup.PER_RANK_MEMORY and b.details.get("closed_form")]
    if not rows:
        return None
    b = next((b for b in rows if b.measured), rows[0])
    d, c = b.details, cfg(b)
    fits = d.get("fits_this_gpu") or {}
    variants = [RankVariant(n, {p: v.get(p, 0.0) for p in PER_RANK_PARTS}, v["total"], fits.get(n))
                for n, v in sorted(d["closed_form"].items(), key=lambda kv: (d.get("stages") or {}).get(kv[0], 0))]
    return PerRankFacts(c.size_label, c.world_size, c.batch_per_rank, c.context, d.get("gpu_memory_bytes"), variants,
                        c.variant, b.row.memory.peak_allocated if b.measured else None,
                        b.stats.mean if b.measured else None, heading, source)


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FsdpPage:
    current: str  # the edition that poses fsdp
    answers: list[RunFacts]  # answering order (impl.report.rows.answering)
    sections: list[DeviceSection]
    tps: list[TpFacts]
    per_rank: list[PerRankFacts]
    saving_run: RunFacts | None = None  # the scoreboard's runs: the newest edition's with the numbers
    headline_run: RunFacts | None = None
    headline_devices: str = "–"  # the fsdp row's devices: the headline run's and the TP rows'
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        a, h = self.saving_run, self.headline_run
        return {P.FSDP_ACCOUNTING: Scored(Kind.MEASURED, a.device, a.date) if a else Scored(Kind.NOT_MEASURED),
                P.FSDP: Scored(Kind.MEASURED, self.headline_devices, h.date) if h else Scored(Kind.NOT_MEASURED)}

    @property
    def sources(self) -> list[str]:
        files = {f for s in self.sections for f in s.source.files}
        files |= {v.row.run.file for s in self.sections for f in s.runs for v in f.sharding}
        files |= {f for t in self.tps for f in t.tp_files + t.beside_files}
        files |= {f for p in self.per_rank for f in p.source.files}
        return sorted(files)


def facts(ctx: Context) -> FsdpPage:
    current = current_edition(P.FSDP)
    fsdp = ctx.rows.per_gpu(P.FSDP)
    shard = dict(ctx.rows.per_gpu(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING))
    sections, found = [], []
    for device, rows in fsdp:
        heading = device_name(device, rows[0].row.env.device)
        runs = [f for run in size_runs_of(rows) if (f := run_facts(device, heading, run, shard.get(device, []), ctx))]
        if runs:
            found += runs
            but_tp = [b for b in rows if cfg(b).variant != TP]
            sections.append(DeviceSection(heading, runs, RunsFacts.of(device, but_tp)))
    newest_first = sorted(found, key=lambda f: -int(f.run.edition))
    saving_run = next((f for f in newest_first if f.saving), None)
    headline_run = next((f for f in newest_first if f.headline), None)
    ddp = [(dev, rows) for dev in ctx.rows.gpu_devices() if (rows := [b for b in ctx.rows.of(device=dev)
                                                                      if b.run.section == "ddp"])]
    tps = tp_facts(fsdp, ddp)
    devices = "–"
    if headline_run:  # the page's fsdp answers read the TP rows' devices too
        devices = " + ".join(dict.fromkeys([headline_run.device] + [r.run.device for f in tps for r in f.rows]))
    per_rank = [p for dev, rows in ctx.rows.per_gpu(StoredGroup.PER_RANK_MEMORY)
                if (p := per_rank_facts(rows, device_name(dev, rows[0].row.env.device), RunsFacts.of(dev, rows)))]
    return FsdpPage(current, answering(found, P.FSDP), sections, tps, per_rank, saving_run, headline_run, devices)
