"""fsdp and fsdp_accounting (2026): per GPU device and [edition, size] run, our FSDP against fully_shard, DDP and
the optimizer-sharding rows of the same shape, with one instrumented step's collective timeline; then TP beside DDP
and FSDP, and the one-GPU per_rank_memory check. Every ratio divides rows of one run."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.bench.row import Status
from impl.nsys.timeline import RESUME_NS
from impl.report import figures
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages import optimizer_sharding as opt_sharding
from impl.report.pages._nsys import Profiled
from impl.report.ratio import Ratio, of_benches
from impl.report.rows import (Bench, DistConfig, DistRow, SizeRun, answering, current_edition, group, newest_first,
                              size_runs_of)
from impl.report.runs import DeviceSection, RunsFacts, device_name, device_short
from impl.workloads.problems import Problem as P, StoredGroup
from impl.workloads.sweeps import grid
from impl.workloads.variants import FSDPVariant

PROBLEMS = (P.FSDP, P.FSDP_ACCOUNTING)
SLUG = "fsdp"
OURS = tuple(v.value for v in FSDPVariant if v.ours)  # the rows with an instrumented step
TP = "tp"  # perf/test_fsdp.py's tensor-parallel rows: the whole global batch on every rank
# the headline pair by rule, not by the best-looking row: the target configuration, else the nearest, bf16 first
HEADLINE_PAIRS = (("fsdp_block_bf16", "torch_fsdp_bf16"), ("fsdp_bf16", "torch_fsdp_bf16"), ("fsdp", "torch_fsdp"))
# the timeline's collectives: (colour, row offset in the figure); collective_name names them
COLLECTIVE = {("all_gather", "forward"): ("C0", 0.0), ("all_gather", "backward"): ("C1", 0.0),
              ("reduce_scatter", "backward"): ("C2", 0.35), ("all_reduce", "finish"): ("C7", 0.0)}
OTHER = ("C7", 0.0)  # any other collective's
BYTES_PER_VALUE = {"fp32": 4, "bf16": 2, "fp16": 2}
# the words drawn into the timeline figure, and the collectives' names in its legend and the page's table
WORDS, NAMES = figures.words("fsdp"), figures.words("collective")


def collective_name(kind: str, phase: str) -> str:
    key = f"{kind}_{phase}"
    return NAMES.label(key) if key in NAMES.labels else NAMES.label("other", kind=kind, phase=phase)


cfg = DistConfig.of


def headline_pair(measured_variants) -> tuple[str, str] | None:
    return next((p for p in HEADLINE_PAIRS if set(p) <= set(measured_variants)), None)


@dataclass(frozen=True)
class Timeline:
    """fsdp_accounting (b) for one of our configurations: rank 0's instrumented step as its row stored it
    (details["timeline"]: source, rows (those kept), rows_total, units, phases and the `summary` counts `s`)."""

    b: Bench

    label = property(lambda self: cfg(self.b).label)
    recorded = property(lambda self: self.b.details["timeline"])
    s = property(lambda self: self.recorded["summary"])
    # the kept rows (one per collective call), each a fresh dict of the stored columns
    calls = property(lambda self: [dict(zip(self.recorded["columns"], r)) for r in self.recorded["rows"]])
    forward = property(lambda self: self._gathers("forward"))
    backward = property(lambda self: self._gathers("backward"))
    # every all-gather waited on was ready in time
    all_in_time = property(lambda self: self.forward[0] == self.forward[1] and self.backward[0] == self.backward[1])
    rank_exposed_ms = property(lambda self: tuple(x["summary"]["exposed_ms"]
                                                  for x in self.b.details.get("timeline_ranks") or []))  # per rank
    step_s = property(lambda self: self.b.figure("timeline_step_s"))  # the instrumented step
    timed_s = property(lambda self: self.b.figure("worker_step_s") or self.b.stats.median)  # the timed steps

    def _gathers(self, phase: str) -> tuple[int, int]:  # the phase's all-gathers: (in time, waited on)
        return next(((g["in_time"], g["used"]) for g in self.s["groups"]
                     if (g["kind"], g["phase"]) == ("all_gather", phase)), (0, 0))

    @property
    def collectives(self) -> list[tuple[dict, str, str]]:
        """Per kind of collective: (its stored summary group, its name, the weight of its largest stall)."""
        units = self.recorded.get("units") or []
        return [(g, collective_name(g["kind"], g["phase"]),
                 units[w] if isinstance(w := g["max_stall_unit"], int) and 0 <= w < len(units) else "–")
                for g in self.s["groups"]]


@dataclass(frozen=True)
class Saving:  # fsdp_accounting (a): DDP's and our fp32 FSDP's measured peaks against the closed form
    predicted: acc.FSDPPeakSaving
    ddp_peak: float
    fsdp_peak: float

    measured = property(lambda self: self.ddp_peak - self.fsdp_peak)  # the saving
    of_predicted = property(lambda self: self.measured / self.predicted.saving)
    above_prediction = property(lambda self: self.fsdp_peak - self.predicted.fsdp_peak)  # FSDP's, above its predicted


def _saving(by: dict[str, Bench]) -> Saving | None:
    ddp, fsdp = by.get("ddp"), by.get("fsdp")
    peaks = [b and b.figure("peak_bytes") for b in (ddp, fsdp)]
    if None in peaks or cfg(fsdp).size_ref is None:
        return None
    shape = cfg(fsdp).size_ref.config  # by edition: the 2026 xl is the 2025 2.7B
    pred = acc.fsdp_peak_saving(int(fsdp.details["n_params"]), int(cfg(fsdp).world_size),
                                acc.largest_sharded_layer_numel(shape.d_model, shape.d_ff),
                                activations=fsdp.details.get("predicted_activations_bytes") or 0.0)
    return Saving(pred, *peaks)


@dataclass(frozen=True)
class Headline:
    ours: DistRow  # the headline pair (HEADLINE_PAIRS)
    anchor: DistRow
    vs_anchor: Ratio
    vs_ddp: Ratio | None  # our fp32 FSDP against our DDP (fp32): the same precision, whatever the headline pair's


def _headline(by: dict[str, Bench]) -> Headline | None:
    if (pair := headline_pair(by)) is None:
        return None
    (o, a), ddp, fp32 = (DistRow.of(by[v]) for v in pair), by.get("ddp"), by.get("fsdp")
    return Headline(o, a, o.vs(a, a.label), ddp and fp32 and of_benches(fp32, ddp, "our DDP"))


@dataclass(frozen=True)
class RunFacts:  # one [edition, size] run of a device's fsdp rows (its TP rows aside)
    run: SizeRun
    device: str  # the device folder
    config: DistConfig  # its first row's: size, context, per-rank batch, ranks, backend
    rows: list[DistRow]  # the table's, in run order
    not_yet_run: list[str]  # labels of today's grid's variants the run lacks
    sharding: list[opt_sharding.Variant]  # beside, of the same shape
    ran_ours: bool  # one of our configurations ran (so a timeline is expected)
    timelines: list[Timeline]
    figure: str | None
    saving: Saving | None
    headline: Headline | None


def _draw(ax, t: Timeline, title: str) -> None:
    """Gantt of one step on rank 0: a row per layer call, a bar per collective from issue to ready, a tick at need."""
    rows = t.calls
    n_calls = max(max((r["call"] for r in rows), default=0) + 1, 1)
    lw = max(0.5, min(5.0, 240 / n_calls))
    for r in rows:
        r["y"] = float(r["call"] if r["call"] >= 0 else n_calls + 1) + COLLECTIVE.get((r["kind"], r["phase"]), OTHER)[1]
    shades, seen = {"forward": "C0", "backward": "C1", "finish": "C7"}, set()
    for p in t.recorded["phases"]:  # a step with several forwards shades each, one legend entry per phase name
        ax.axvspan(p["start_ms"], p["end_ms"], color=shades.get(p["name"], "C4"), alpha=0.08, lw=0,
                   label=None if p["name"] in seen else WORDS.label("phase", phase=p["name"]))
        seen.add(p["name"])
    for (kind, phase), g in sorted(group(rows, lambda r: (r["kind"], r["phase"])).items()):
        color, off = COLLECTIVE.get((kind, phase), OTHER)
        ax.hlines([r["y"] for r in g], [r["issue_ms"] for r in g], [r["ready_ms"] for r in g], color=color,
                  lw=lw if off == 0 else lw / 2, label=collective_name(kind, phase))
    used = [r for r in rows if r["need_ms"] is not None]
    late = [r for r in used if (r["stall_ms"] or 0) > 0]
    ax.hlines([r["y"] for r in late], [r["need_ms"] for r in late], [r["ready_ms"] for r in late], color="red", lw=lw)
    for pts, color, stalled, z in ((used, "black", False, 3), (late, "red", True, 4)):
        ax.scatter([r["need_ms"] for r in pts], [r["y"] for r in pts], marker="|", s=max(4.0, lw * 12), color=color,
                   lw=0.8, label=WORDS.label("needed_stalled" if stalled else "needed"), zorder=z)
    ax.set_ylim(n_calls + 2, -1)
    ax.yaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
    ax.set(xlabel=WORDS.x, ylabel=WORDS.y)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _draw_timelines(tls: list[Timeline], ctx: Context, name: str) -> str:
    c = cfg(tls[0].b)
    fig, axes = figures.plt.subplots(len(tls), 2, figsize=(15, 4.6 * len(tls) + 0.4), squeeze=False,
                                     gridspec_kw=dict(width_ratios=[2.2, 1]))
    fig.suptitle(WORDS.title.format(size_label=c.size_label, context=c.context, batch_per_rank=c.batch_per_rank,
                                    world_size=c.world_size), fontsize=11, x=0.01, ha="left")
    for (gantt, slack), t in zip(axes, tls):
        _draw(gantt, t, f"{WORDS.label('rank', label=t.label)}\n{WORDS.label('exposed', **t.s)}")
        # per all-gather, need - ready (below zero its layer waited): readable where the Gantt's bars are too short
        gathers = [r for r in t.calls if r["kind"] == "all_gather" and r["need_ms"] is not None]
        for phase, color in (("forward", "C0"), ("backward", "C1")):
            pts = [(r["call"], r["need_ms"] - r["ready_ms"]) for r in gathers if r["phase"] == phase]
            slack.scatter([c for c, _ in pts], [s for _, s in pts], s=6, color=color,
                          label=WORDS.label("gather", phase=phase))
            late = [(c, s) for c, s in pts if s < 0]
            slack.scatter([c for c, _ in late], [s for _, s in late], s=10, facecolors="none", edgecolors="red",
                          lw=0.6)
        slack.axhline(0, color="0.4", lw=0.6)
        slack.xaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
        slack.set(xlabel=WORDS.label("slack_x"), ylabel=WORDS.label("slack_y"))
        slack.set_title(WORDS.label("slack_title"), fontsize=9)
        slack.legend(fontsize=7, frameon=False)
    return ctx.figure(fig, name)


def run_facts(device: str, label: str, run: SizeRun, shard: list[Bench], ctx: Context) -> RunFacts:
    """The facts of one [edition, size] run of a device's fsdp rows (its TP rows aside)."""
    rows = run.rows
    have, by = {cfg(b).variant for b in rows}, {cfg(b).variant: b for b in rows if b.measured}
    ours = [b for b in rows if cfg(b).variant in OURS and b.status is Status.MEASURED]
    tls = [Timeline(b) for b in ours if b.details.get("timeline")]
    shape = lambda b: (cfg(b).size_ref, cfg(b).context, cfg(b).batch_per_rank)  # noqa: E731
    return RunFacts(
        run.label(label), device, cfg(rows[0]), [DistRow.of(b) for b in rows],
        [DistConfig(variant=v).label for v in grid(P.FSDP, "full").variants if v not in have],
        [v for b in shard if shape(b) == shape(rows[0]) and b.status is Status.MEASURED and b.details.get("ranks")
         and (v := opt_sharding.Variant.of(b)).peak],
        bool(ours), tls,
        _draw_timelines(tls, ctx, f"{SLUG}-{device}-{run.id}_fsdp_timeline.png") if tls else None,
        _saving(by), _headline(by))


# ---- tensor parallelism beside DDP and FSDP ------------------------------------------------------

@dataclass(frozen=True)
class Side(DistRow):
    """A row of the TP section: a TP row, or one of the same model and global batch that shards the batch (DDP,
    FSDP), with the same-run TP row (the same rank count) ÷ it."""

    run: SizeRun | None = None
    vs_tp: Ratio | None = None

    where = property(lambda self: f"{device_short(self.run.device)} ({self.run.device})")  # "2×H200 (h200-141gb-x2)"
    world = property(lambda self: self.c.world_size)
    section = property(lambda self: self.b.run.section)  # the section it was read from ("fsdp", "ddp")


class TpRow(Side):
    """One TP row: measured, counted by the ranks ({"calls", "payload_bytes"}), closed form, and predicted (tp_calcs'
    terms from the run's own measured matmul rate and bus bandwidth)."""

    counted = property(lambda self: self.b.details.get("tp_traffic") or {})
    predicted = property(lambda self: self.b.details.get("tp_predicted") or {})
    bytes_per_value = property(lambda self: BYTES_PER_VALUE[self.c.dtype])  # p of the closed form
    model = property(lambda self: self.c.size_ref.config)
    closed_form_calls = property(lambda self: 4 * self.model.num_layers)
    closed_form_bytes = property(lambda self: pc.tp_step_allreduce_payload(
        self.c.shape[2] * self.c.context, self.model.d_model, self.model.num_layers, self.bytes_per_value))

    ring_bytes_per_rank = property(lambda self: pc.ring_all_reduce_bytes(
        self.counted.get("payload_bytes", self.closed_form_bytes), self.world))
    measured_over_predicted = property(
        lambda self: self.step_s / self.predicted["step_s"] if self.predicted.get("step_s") else None)


@dataclass(frozen=True)
class TpFacts:
    size: str  # described: "xl (2026): d_model 2560, 32 layers, 3.4B params"
    context: int
    batch: int  # global sequences per step
    rows: list[TpRow]  # measured TP rows, fewest ranks first
    not_run: list[TpRow]  # TP rows of a rank count no device measured
    beside: list[Side]

    dtype = property(lambda self: self.rows[0].c.dtype if self.rows else "")
    # an FSDP row (ours or fully_shard) of this model and batch stands beside TP
    has_fsdp = property(lambda self: any(b.section == "fsdp" and b.c.variant != "ddp" for b in self.beside))
    # some TP row and some row beside it come from one run (so a ratio exists)
    shared_runs = property(lambda self: any(b.vs_tp is not None for b in self.beside))
    tp_files = property(lambda self: sorted({f for r in self.rows for f in r.run.files}))
    beside_files = property(lambda self: sorted({f for b in self.beside for f in b.run.files}))


def _newest_of_shape(per_device: list[tuple[str, list[Bench]]], shape: tuple, keep) -> list[tuple]:
    """(device, its newest run of the shape's size, each measured row of that run and shape that `keep` accepts)."""
    return [(device, run, b) for device, rows in per_device
            for run in [r for r in size_runs_of(rows) if r.size == shape[0]][:1]
            for b in run.rows if b.measured and keep(b) and cfg(b).shape == shape]


def tp_facts(fsdp: list[tuple[str, list[Bench]]], ddp: list[tuple[str, list[Bench]]]) -> list[TpFacts]:
    """One TpFacts per TP shape, newest edition first. fsdp, ddp: (device, its rows) of those sections; the ddp
    section's rows stand beside TP only while the fsdp runs have no DDP row of the shape."""
    tp = [TpRow(b, cfg(b), run.label(device)) for device, rows in fsdp for run in size_runs_of(rows)
          for b in run.rows if cfg(b).variant == TP and cfg(b).size_ref is not None]
    out = []
    for shape, rows in group(tp, lambda r: r.c.shape).items():
        measured = sorted((r for r in rows if r.measured), key=lambda r: (r.world, r.run.device))
        not_run = [r for r in rows if not r.measured and r.world not in {m.world for m in measured}]
        beside = _newest_of_shape(fsdp, shape, lambda b: cfg(b).variant != TP)
        if not any(cfg(b).variant == "ddp" for _, _, b in beside):
            beside += _newest_of_shape(ddp, shape, lambda b: cfg(b).variant not in ("single", "bucketed")
                                       and cfg(b).kind != "trace")
        beside = [Side(b, cfg(b), run.label(device), next((of_benches(r.b, b) for r in measured if (
            r.b.run.datetime, r.world) == (b.run.datetime, cfg(b).world_size)), None)) for device, run, b in beside]
        out.append(TpFacts((measured or not_run)[0].run.described, *shape[1:], measured, not_run, beside))
    return sorted(out, key=lambda f: -int((f.rows or f.not_run)[0].run.edition))


# ---- per_rank_memory: the one-GPU check of the two-GPU 2026 questions ----------------------------

@dataclass(frozen=True)
class RankVariant:
    name: str  # ddp / sharded_optimizer / fsdp
    parts: dict[str, float]  # the stored closed form: parameters, gradients, optimizer_state, activations -> bytes
    total: float
    fits: bool | None  # this GPU


@dataclass(frozen=True)
class PerRankFacts:  # one rank's closed-form memory per variant, and the replicated rank's step on one GPU
    heading: str  # the device, as headings name it
    source: RunsFacts
    row: DistRow  # the measured row (its variant: the one whose rank ran on one GPU), else the first
    variants: list[RankVariant]

    config = property(lambda self: self.row.c)
    gpu_bytes = property(lambda self: self.row.b.details.get("gpu_memory_bytes"))
    measured_peak = property(lambda self: self.row.b.row.memory.peak_allocated if self.row.measured else None)

    @property
    def measured_over_closed_form(self) -> float | None:
        v = next((v for v in self.variants if v.name == self.config.variant), None)
        return self.measured_peak / v.total if v and self.measured_peak else None


def per_rank_facts(rows: list[Bench], heading: str, source: RunsFacts) -> PerRankFacts | None:
    rows = [b for b in rows if b.details.get("closed_form")]
    if not rows:
        return None
    b = next((b for b in rows if b.measured), rows[0])
    d, fits = b.details, b.details.get("fits_this_gpu") or {}
    variants = [RankVariant(n, v, v["total"], fits.get(n))
                for n, v in sorted(d["closed_form"].items(), key=lambda kv: (d.get("stages") or {}).get(kv[0], 0))]
    return PerRankFacts(heading, source, DistRow.of(b), variants)


# ---- fsdp_accounting (b) under Nsight Systems ---------------------------------------------------------------

NSYS_COLLECTIVES = ("ncclAllGather", "ncclReduceScatter")


class FsdpNsys(Profiled):
    """Our FSDP's cases, bf16 per block first: whether each rank's all-gather kernels came in time."""

    resume_us = RESUME_NS / 1e3

    ranks = property(lambda self: [r for _, t in self.timelines for r in t.ranks])  # every case's
    # every rank recorded one kernel per all-gather it issued in forward; and per collective it issued
    forward_whole = property(lambda self: all(r.whole("ncclAllGather", "forward") for r in self.ranks))
    backward_whole = property(lambda self: all(r.whole(c) for r in self.ranks for c, *_ in r.issued))
    # no rank's compute waited for a forward all-gather kernel
    forward_in_time = property(lambda self: all((w := r.wait("ncclAllGather")) is not None and w.forward_waited == 0
                                                for r in self.ranks))


def fsdp_nsys(ctx: Context) -> FsdpNsys | None:
    order = [v.value for v in FSDPVariant]
    return FsdpNsys.of(ctx, "fsdp", lambda a: f"xl ({a['edition']}), {FSDPVariant(a['variant']).label}"
                       if a.get("variant") in order else None, NSYS_COLLECTIVES, lambda a: order.index(a["variant"]))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FsdpPage:
    answers: list[RunFacts]  # answering order (impl.report.rows.answering)
    sections: list[DeviceSection]
    tps: list[TpFacts]
    per_rank: list[PerRankFacts]
    saving_run: RunFacts | None = None  # the scoreboard's runs: the newest edition's with the numbers
    headline_run: RunFacts | None = None
    headline_devices: str = "–"  # the fsdp row's devices: the headline run's and the TP rows'
    nsys: FsdpNsys | None = None

    current = current_edition(P.FSDP)  # the edition that poses fsdp

    @property
    def scores(self) -> dict[str, Scored]:
        a, h = self.saving_run, self.headline_run
        return {P.FSDP_ACCOUNTING: Scored(Kind.MEASURED, a.device, a.run.date) if a else NOT_MEASURED,
                P.FSDP: Scored(Kind.MEASURED, self.headline_devices, h.run.date) if h else NOT_MEASURED}

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.source.files}
                      | {v.b.run.file for s in self.sections for f in s.runs for v in f.sharding}
                      | {f for t in self.tps for f in t.tp_files + t.beside_files}
                      | {f for p in self.per_rank for f in p.source.files}
                      | set(self.nsys.sources if self.nsys else ()))


def facts(ctx: Context) -> FsdpPage:
    fsdp, shard = ctx.rows.per_gpu(P.FSDP), dict(ctx.rows.per_gpu(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING))
    sections = []
    for device, rows in fsdp:
        heading, rows = device_name(device, rows), [b for b in rows if cfg(b).variant != TP]  # TP: its own section
        if runs := [run_facts(device, heading, run, shard.get(device, []), ctx) for run in size_runs_of(rows)]:
            sections.append(DeviceSection(heading, runs, RunsFacts.of(device, rows)))
    found = [f for s in sections for f in s.runs]
    newest = newest_first(found)
    headline_run = next((f for f in newest if f.headline), None)
    ddp = [(dev, rows) for dev in ctx.rows.gpu_devices()
           if (rows := [b for b in ctx.rows.of(device=dev) if b.run.section == "ddp"])]
    tps = tp_facts(fsdp, ddp)
    devices = " + ".join(dict.fromkeys([headline_run.device] + [r.run.device for t in tps for r in t.rows])) \
        if headline_run else "–"  # the page's fsdp answers read the TP rows' devices too
    per_rank = [p for dev, rows in ctx.rows.per_gpu(StoredGroup.PER_RANK_MEMORY)
                if (p := per_rank_facts(rows, device_name(dev, rows), RunsFacts.of(dev, rows)))]
    return FsdpPage(answering(found, P.FSDP), sections, tps, per_rank,
                    next((f for f in newest if f.saving), None), headline_run, devices, fsdp_nsys(ctx))
