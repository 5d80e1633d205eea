"""training_step (perf/test_training_step.py): the full training step ablated, a section per GPU device, each
(size, context, config) its newest measurement; the first device answers. The ablation's cells are made here
(`ablation_cells`): its CSV shares them."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from impl.bench.row import Metric, Status
from impl.model import MODEL_SIZES, size_rank
from impl.report import figures
from impl.report.markdown import gib, missing, ms, num, pct
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.ratio import Ratio, ratio, within_noise
from impl.report.rows import Bench, RowView, View, group, newest, stat_name, timing_text
from impl.report.runs import RunsFacts, SourcedFromSections, device_short
from impl.report.templating import environment
from impl.workloads.problems import Problem as P

PROBLEMS = (P.TRAINING_STEP,)
PROBLEM = P.TRAINING_STEP
SLUG = "training_step"
CONFIG_ORDER = ["fp32", "bf16", "+flash", "+compile", "+fused_adamw", "+fused_ce", "+bf16_weights", "fast",
                "fast+cudagraphs", "anchor"]
OURS = ["fast", "fast+cudagraphs"]  # the all-speed-ups configs set against the anchor
INLINE_ROWS = 20  # a longer ablation goes to a CSV, the page shows its grid
WORDS = figures.words(SLUG)  # the words drawn into the ablation figure
ABLATION_HEADER = environment().get_template(f"{SLUG}.md.j2").module.ABLATION_HEADER  # the CSV's (and table's) columns


@dataclass(frozen=True)
class Settings(View):
    """What a row ran (rows.View), as the config legend's cells: normalised by step(), equal settings compare equal."""

    dtype: str | None = None
    weights: str | None = None  # rows from before the option: fp32
    attn_impl: str | None = None
    compile: str | None = None
    compile_backend: str | None = None  # only where it compiled
    optimizer: str | None = None
    fused_ce: bool | None = None


@dataclass(frozen=True)
class Step(RowView):
    """One row: its config (rows.View), its settings, and the row (`b`, rows.RowView) it reads its measurement from."""

    size: str | None = None
    context: int | None = None
    config: str | None = None
    batch: int | None = None
    settings: Settings | None = None

    mfu = property(lambda self: self.b.metric(Metric.MFU))
    mfu_measured = property(lambda self: self.b.metric(Metric.MFU_MEASURED_PEAK))
    datetime = property(lambda self: self.b.run.datetime)
    commit = property(lambda self: self.b.run.commit)
    peaks = property(lambda self: self.b.row.peaks)  # its run's measured matmul peak (MFU's), the datasheet's
    matmul_peak = property(lambda self: self.peaks and self.peaks.measured_flops)
    profile = property(lambda self: self.details.get("profile"))
    adamw_master = property(lambda self: str(self.settings.optimizer or "").startswith("adamw_master"))
    when = property(lambda self: self.b.run.when[5:] or "–")  # its run's UTC start, "MM-DD HH:MM"

    @property
    def first_step_s(self) -> float | None:
        first = self.b.metric(Metric.FIRST_CALL_S)
        return self.details.get("first_step_s") if missing(first) else first

    @property
    def ok(self) -> bool:
        return self.status is Status.MEASURED and not missing(self.step_s)

    @property
    def order(self) -> tuple:
        config = CONFIG_ORDER.index(self.config) if self.config in CONFIG_ORDER else 99
        return size_rank(self.size), self.context, config

    @property
    def unattributed(self) -> bool:
        """Profiled before launch_ops, in a config that ran one of our launchers outside a torch op (AdamWMaster,
        or FlashAttention eagerly; compiled, it ran as custom ops): those kernels are missing from the profile."""
        ours = self.adamw_master or (self.settings.attn_impl == "flash_triton" and self.settings.compile == "none")
        return ours and self.profile is not None and not self.profile.get("launch_ops")


def step(b: Bench) -> Step:
    c, x = Step.of(b), Settings.of(b)
    x = replace(x, weights=x.weights or "fp32", compile_backend=None if x.compile == "none" else x.compile_backend,
                fused_ce=bool(x.fused_ce))
    return replace(c, context=int(c.context), settings=x)


def latest(every: list[Step]) -> list[Step]:
    """One row per (size, context, config): from the newest run that ran it (an OOM is a result), else the newest
    run's not-run row: a command cut at its time limit leaves rows "not run" that an earlier run measured."""
    return newest(every, lambda s: (s.size, s.context, s.config),
                  lambda s: (s.status in (Status.MEASURED, Status.OOM), s.datetime))


def ordered(steps: list[Step]) -> list[Step]:
    return sorted(steps, key=lambda s: s.order)


def groups(steps: list[Step]) -> dict[tuple[str, int], list[Step]]:
    """(size, context) -> its rows, in the page's order."""
    return group(ordered(steps), lambda s: (s.size, s.context))


def noise_ratio(ours: Step, ref: Step | None) -> str:
    """ours ÷ ref as "0.64×", "within noise" where medians ± std overlap; "–" unless both ran."""
    if ref is None or not (ours.status is Status.MEASURED and ref.status is Status.MEASURED):
        return "–"
    if within_noise(ours.step_s, ref.step_s, ours.std_s, ref.std_s):
        return "within noise"
    return f"{ours.step_s / ref.step_s:.2f}×"


def ablation_cells(s: Step, base: Step | None) -> list:
    """ABLATION_HEADER's cells of a row (the CSV's and the inline table's); `base`: bf16 of its (size, context).
    compile: compile_s where the first step compiled, "reused" where it ran an earlier context's graphs."""
    run = [s.when, f"`{s.commit or '–'}`"]
    if not s.ok:
        why = "not run" if s.not_run else "OOM" if s.status is Status.OOM else ""
        return [s.config, s.size, s.context, *["–"] * 9, why, *run]
    d = s.details
    compiled = num(d.get("compile_s"), 2) if d.get("compiled_now") else "reused" if d.get("reused_graph") else "–"
    return [s.config, s.size, s.context, ms(s.step_s, s.std_s), num(s.tokens_per_s, 0), pct(s.mfu),
            pct(s.mfu_measured), "1.00×" if s.config == "bf16" else noise_ratio(s, base),
            gib(s.b.row.memory.peak_allocated), num(s.first_step_s, 2), compiled, d.get("new_graphs", "–"), "", *run]


# ---- the tables of a device's section ------------------------------------------------------------

def legend(d: list[Step]) -> list[tuple[str, list[tuple[str, list[int] | None]], Settings]]:
    """(config, its sizes, settings), one per config and settings: a config's rows can differ between sizes (a size
    measured with older code), so each distinct settings gets a row with the sizes that ran it, each with its
    contexts where the config's others differ."""
    by = group(sorted(ordered(d), key=lambda s: s.order[2]), lambda s: s.config)

    def contexts(rows, size, settings=None):
        return sorted({s.context for s in rows if s.size == size and settings in (None, s.settings)})
    return [(config, [(size, None if contexts(rows, size, x) == contexts(rows, size) else contexts(rows, size, x))
                               for size in dict.fromkeys(s.size for s in rows if s.settings == x)], x)
            for config, rows in by.items() for x in dict.fromkeys(s.settings for s in rows)]


@dataclass(frozen=True)
class RunRow:
    """A run the rows come from: the matmul peak it measured (its rows' MFU divides by it)."""

    run: str
    commits: list[str]
    sections: list[str]
    matmul_peak: float | None
    rows: int


def repeats(every: list[Step]) -> list[tuple[Step, float | None]]:
    """Ours and the anchor, every run that measured them where a (size, context, config) ran in more than one
    (the newest-row tables hide run-to-run spread); ours with its step ÷ the anchor of its own run."""
    d = [s for s in ordered(every) if s.config in OURS + ["anchor"] and s.ok]
    anchor = {(s.size, s.context, s.datetime): s.step_s for s in d if s.config == "anchor"}
    by = group(d, lambda s: (s.size, s.context, s.config))
    return [(s, s.step_s / a if a else None) for g in by.values() if len({s.datetime for s in g}) > 1
            for s in sorted(g, key=lambda s: s.datetime)
            for a in [anchor.get((s.size, s.context, s.datetime)) if s.config != "anchor" else None]]


@dataclass(frozen=True)
class TimeSection:
    """Where the time of the profiled steps goes (a folded part of the section); its columns are the first
    profile's."""

    rows: list[Step]  # profiled, or whose profile failed

    profiles = property(lambda self: [s.profile for s in self.rows if s.profile])
    first = property(lambda self: (self.profiles or [{}])[0])
    phases = property(lambda self: list(self.first.get("phase_ms", {})))
    categories = property(lambda self: [c for c in self.first.get("category_ms", {})  # with time in any profile
                                        if any(p["category_ms"].get(c, 0.0) > 0 for p in self.profiles)])
    host = property(lambda self: any("phase_host_ms" in p for p in self.profiles))  # host time per phase
    warmup = property(lambda self: self.first.get("warmup_steps", "–"))
    kernels = property(lambda self: self.first.get("timing_source") == "kernels")  # else CPU ops
    # a marked row that ran AdamWMaster (the footnote's example)
    example = property(lambda self: next((s for s in self.rows if s.unattributed and s.adamw_master), None))
    top = property(lambda self: [(s, k) for s in self.rows if s.config in OURS  # ours' top kernels
                                 for k in (s.profile or {}).get("top", [])])
    marked = property(lambda self: any(s.unattributed for s in self.rows))
    failed = property(lambda self: [s for s in self.rows if "profile_error" in s.details])


def _plot(d: list[Step], ctx: Context, name: str) -> str | None:
    """Tokens/s per config, a group of bars per (size, context); False (nothing drawn) without a measured row."""
    gs = groups(d)
    configs = [c for c in CONFIG_ORDER if any(s.config == c for s in d)]
    if not configs or not any(s.ok for s in d):
        return None
    fig, ax = figures.new(figsize=(8, 4.2))
    width, x = 0.8 / len(configs), np.arange(len(gs))
    for i, cfg in enumerate(configs):
        cells = [next((s for s in g if s.config == cfg and s.ok), None) for g in gs.values()]
        ax.bar(x + (i - (len(configs) - 1) / 2) * width, [0.0 if r is None else float("nan") if r.tokens_per_s is None
                                                          else r.tokens_per_s for r in cells], width, label=cfg)
    ax.set_xticks(x, labels=[WORDS.label("tick", size=s, context=c) for s, c in gs])
    ax.set(ylabel=WORDS.y, title=WORDS.title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    return ctx.figure(fig, name)


@dataclass(frozen=True)
class Section:
    rows: list[Step]  # each (size, context, config)'s newest row, newest runs first
    stat: str
    warmup: str
    rounds: str
    legend: list[tuple[str, list[tuple[str, list[int] | None]], Settings]]  # (config, sizes, settings)
    ablation: list[list]  # ABLATION_HEADER's cells, in the page's order
    csv: str | None  # the ablation's CSV link where it is too long to show inline
    runs_table: list[RunRow]
    versus: list[tuple[Step, Step, str]]  # (one of OURS, the anchor of its (size, context), noise_ratio of the two)
    repeats: list[tuple[Step, float | None]]
    figure: str | None
    time: TimeSection | None
    runs: RunsFacts  # its device heads the section
    # the first row's run's peaks: the method names its measured matmul peak where the rows come from one run
    peaks = property(lambda self: next((s.peaks for s in self.rows if s.peaks), None))

    @property
    def grid(self) -> tuple[list[tuple[str, int]], list[tuple[str, list[list | None]]]]:
        """The ablation at a glance: (size, context) columns, and per config its cells of each."""
        cols = list(dict.fromkeys((r[1], r[2]) for r in self.ablation))
        cell = {(r[0], r[1], r[2]): r for r in self.ablation}
        return cols, [(c, [cell.get((c, *g)) for g in cols]) for c in CONFIG_ORDER
                      if any(r[0] == c for r in self.ablation)]


def _section(ctx: Context, device: str, benches: list[Bench]) -> Section:
    every = [step(b) for b in benches]
    d = latest(every)
    by_config = [{s.config: s for s in g} for g in groups(d).values()]  # per (size, context): config -> its row
    cells = [ablation_cells(s, g.get("bf16")) for g in by_config for s in g.values()]
    ran = [s.b for s in d]
    by_run = group(d, lambda s: s.when)
    profiled = [s for s in ordered(d) if "profile" in s.details or "profile_error" in s.details]
    return Section(
        d, stat_name(ran), *timing_text(ran), legend(d), cells,
        ctx.table_csv(f"{SLUG}-{device}-ablation", ABLATION_HEADER, cells)
        if len(cells) > INLINE_ROWS else None,
        [RunRow(run, list(dict.fromkeys(s.commit for s in g)), list(dict.fromkeys(s.b.run.section for s in g)),
                next((s.matmul_peak for s in g if s.matmul_peak), None), len(g)) for run, g in sorted(by_run.items())],
        [(g[o], g["anchor"], noise_ratio(g[o], g["anchor"])) for g in by_config if "anchor" in g and g["anchor"].ok
         for o in OURS if o in g and g[o].ok],
        repeats(every), _plot(d, ctx, f"{SLUG}-{device}-ablation.png"), TimeSection(profiled) if profiled else None,
        RunsFacts.of(device, benches))


# ---- the answers (the first device) ------------------------------------------------------------

def vs(ours: Step, ref: Step, name: str) -> Ratio | None:
    """Row ours ÷ row ref (their step times), the report's one convention."""
    return ratio(ours.step_s, ref.step_s, name, ours.b.spread, ref.b.spread)


@dataclass(frozen=True)
class Ablation:
    """At the (size, context) with the most measured configs: each speed-up against bf16."""

    size: str
    context: int
    base: Step | None  # bf16 (None: not measured there)
    top: tuple[str, Ratio] | None  # the single speed-up that buys the most
    noisy: list[str]  # single speed-ups within noise of bf16
    best: Step | None  # the fastest of ours
    best_vs: Ratio | None
    product: float  # the single speed-ups' ratios multiplied


def _ablation(ok: list[Step]) -> Ablation:
    counts = {k: len(g) for k, g in group(ok, lambda s: (s.size, s.context)).items()}
    size, c = max(counts, key=lambda k: (counts[k], MODEL_SIZES[k[0]].params, -k[1]))
    g = {s.config: s for s in ok if (s.size, s.context) == (size, c)}
    base = g.get("bf16")
    if base is None:
        return Ablation(size, c, None, None, [], None, None, 1.0)
    singles, r = [x for x in g if x.startswith("+")], {x: vs(g[x], base, "bf16") for x in g}
    top = min(singles, key=lambda x: r[x].value, default=None)
    best = min((x for x in g if x != "anchor"), key=lambda x: g[x].step_s)
    return Ablation(size, c, base, (top, r[top]) if top else None, [x for x in singles if r[x].noise], g[best],
                    r[best], math.prod(r[x].value for x in singles))


@dataclass(frozen=True)
class Pair:
    """Ours and the anchor measured in the same run, at the largest such (size, context)."""

    ours: Step
    anchor: Step
    vs: Ratio
    pairs: int  # how many same-run pairs there are


@dataclass(frozen=True)
class TrainingStepPage(SourcedFromSections):  # its sources: its sections' run files
    ablation: Ablation | None  # None: the first device measured no row
    top_mfu: Step | None  # the highest MFU of ours
    pair: Pair | None
    sections: list[Section]
    index_figures: tuple[str, ...] = ()  # the first device's ablation figure
    ours = OURS
    measured = property(lambda self: self.ablation is not None)

    @property
    def scores(self) -> dict[str, Scored]:
        if not self.sections or not self.measured:
            return {PROBLEM: NOT_MEASURED}
        s = self.sections[0]
        date = self.pair.ours.datetime[:10] if self.pair else max(x.datetime for x in s.rows)[:10]
        return {PROBLEM: Scored(Kind.MEASURED, device_short(s.runs.device), date)}


def facts(ctx: Context) -> TrainingStepPage:
    # every run of each device: a later command may have left a row "not run" that an earlier one measured, and
    # repeated rows show their spread
    sections = [_section(ctx, device, newest + [b for b in ctx.rows.history if b.run.device == device
                                                 and b.problem == PROBLEM])
                for device, newest in ctx.rows.per_gpu(PROBLEM)]
    figs = tuple(s.figure for s in sections if s.figure)[:1]
    ok = [s for s in sections[0].rows if s.ok] if sections else []
    if not ok:
        return TrainingStepPage(None, None, None, sections, figs)
    ours = [s for s in ok if s.config in OURS]
    mfu = next((k for k in ("mfu", "mfu_measured") if any(getattr(s, k) is not None for s in ours)), None)
    top = max((s for s in ours if getattr(s, mfu) is not None), key=lambda s: getattr(s, mfu)) if mfu else None
    # the section's pairs of ours and the anchor that ran in the same run; the largest (size, context) answers
    same = [(o, a) for o, a, _ in sections[0].versus if o.datetime == a.datetime]
    o, a = max(same, key=lambda p: (MODEL_SIZES[p[0].size].params, p[0].context), default=(None, None))
    return TrainingStepPage(_ablation(ok), top, o and Pair(o, a, vs(o, a, ""), len(same)), sections, figs)
