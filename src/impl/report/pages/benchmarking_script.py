"""benchmarking_script: the (b) grid, the (c) warm-up study and the 2026 split of a training step, per
edition's sizes; the first GPU device answers (the mixed_precision page reads the same grid). Every time is
pytest-benchmark's mean ± stddev over the timed rounds, as both handouts ask, never the median."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from impl import accounting as acc
from impl.bench.row import Metric, Peaks, Status
from impl.model.sizes import EDITION_SIZES, SizeRef
from impl.report import figures
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.ratio import within_noise
from impl.report.rows import Bench, RowView, SizedView, group, timing_text
from impl.report.runs import RunsFacts, SourcedFromSections, newest_date
from impl.workloads.problems import Problem as P
from impl.workloads.sweeps import MODES

PROBLEMS = (P.BENCHMARKING_SCRIPT,)
PROBLEM = P.BENCHMARKING_SCRIPT
SLUG = "benchmarking_script"
WORDS = figures.words(SLUG)  # the words drawn into the training-step figure
STABLE = 0.05  # a row whose std is under this share of its mean is called stable
STUDIES = {"main_2026": "main", "warmup_fresh_process": "warmup"}  # 2026's studies answer the same questions


@dataclass(frozen=True)
class Parts:  # a training step's forward, backward and optimizer step (s), where the row kept them
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None


def _measured(f):  # a Cell's property read from its row where the row was measured, else None
    return property(lambda self: f(self.b) if self.b.measured else None)


@dataclass(frozen=True)
class Cell(SizedView, RowView):  # one row's config and timing: mean ± std over the timed steps (s), or why none
    context: int | None = None
    dtype: str | None = None
    mode: str | None = None
    study: str | None = None
    warmup: int | None = None
    batch: int | None = None

    need_bytes = property(lambda self: (self.details.get("memory_need") or {}).get("total"))  # the closed form's
    mean_s = _measured(lambda b: b.stats.mean)
    std_s = _measured(lambda b: b.stats.stddev)
    first_s = _measured(lambda b: b.stats.data[0] if b.stats.data else None)  # the first timed step
    max_s = _measured(lambda b: max(b.stats.data) if b.stats.data else None)  # the slowest timed step
    peak_bytes = _measured(lambda b: b.row.memory.peak_allocated)
    tokens_per_s = _measured(lambda b: b.metric(Metric.TOKENS_PER_S))
    mfu_measured_peak = _measured(lambda b: b.metric(Metric.MFU_MEASURED_PEAK))

    @property
    def steps(self) -> dict[str, list[float]]:  # the timed steps' forward, backward and optimizer times (s)
        kept = (self.b.details.get("steps") or {}) if self.b.measured else {}
        return {k.removesuffix("_s"): v for k, v in kept.items()
                if isinstance(v, list) and v and k.removesuffix("_s") in ("forward", "backward", "optimizer")}

    @property
    def first_parts(self) -> Parts | None:  # the first timed step's
        return Parts(**{k: v[0] for k, v in self.steps.items()}) if self.steps else None

    @property
    def later_parts(self) -> Parts | None:  # the mean of the other timed steps'
        later = {k: sum(v[1:]) / len(v[1:]) for k, v in self.steps.items() if len(v) > 1}
        return Parts(**later) if later else None

    ok = property(lambda self: self.status is Status.MEASURED and self.mean_s is not None)
    rel_std = property(lambda self: self.std_s / self.mean_s if self.ok and self.std_s is not None else None)

    def within_noise(self, other: Cell) -> bool:
        return within_noise(self.mean_s, other.mean_s, self.std_s, other.std_s)


@dataclass(frozen=True)
class GridRow:
    size: str  # its label (impl.report.rows.size_label)
    context: int
    dtype: str
    modes: dict[str, Cell]

    train = property(lambda self: self.modes.get("train_step"))


@dataclass(frozen=True)
class WarmupCase:
    size: str
    context: int
    dtype: str
    mode: str
    by_warmup: dict[int, Cell]  # warm-up steps -> cell
    cold = property(lambda self: self.by_warmup[min(self.by_warmup)])  # the fewest warm-up steps
    warm = property(lambda self: self.by_warmup[max(self.by_warmup)])  # the most: the reference
    first_step_excess = property(  # the coldest row's first timed step over the warm row's mean
        lambda self: None if self.cold.first_s is None else self.cold.first_s / self.warm.mean_s)

    @property
    def warmed_in_noise(self) -> bool:  # the means after 1, 2, ... warm-up steps lie within the warm row's spread
        return all(c.within_noise(self.warm) for w, c in self.by_warmup.items() if 0 < w < max(self.by_warmup))


@dataclass(frozen=True)
class OptimizerSplit:  # forward, backward and the AdamW step timed apart, beside the whole training step
    size: str
    context: int
    dtype: str
    forward_s: float
    backward_s: float
    optimizer_s: float
    train_s: float | None  # None: the 2026 grid times only the parts
    floor_bytes: int  # the AdamW step's least memory traffic (fp32 state)

    parts_s = property(lambda self: self.forward_s + self.backward_s + self.optimizer_s)
    optimizer_share = property(lambda self: self.optimizer_s / self.parts_s)


def _largest(rows: list[GridRow]) -> list[GridRow]:
    return [r for r in rows if r.size == rows[-1].size]


@dataclass(frozen=True)
class EditionFacts:  # one edition's answers on one device: its sizes (labels) and the rows measured at them
    edition: str
    sizes: list[str]
    grid: list[GridRow] = field(default_factory=list)
    warmup: list[WarmupCase] = field(default_factory=list)
    optimizer: list[OptimizerSplit] = field(default_factory=list)
    batch: int | None = None
    fresh_warmup: bool = False  # each warm-up row ran in a fresh process (2026's study)
    oom_cells: list[Cell] = field(default_factory=list)
    warmup_steps: str = "–"  # "5", or "5–10" where rows differ
    timed_steps: str = "–"
    peak: Peaks | None = None  # the matmul peak measured in the run (MFU's denominator)
    date: str = "–"  # the grid's newest run date
    left_out: str = ""  # what the warm-up study did not run
    figure: str | None = None  # the training-step figure's link (set per device section)

    @property
    def tables(self) -> list[tuple[str, list[str], list[GridRow], bool]]:
        """(dtype, its columns: the modes any of its rows has, its rows, whether a training step was timed whole:
        its tokens/s, MFU and peak columns follow), one per dtype."""
        return [(d, [m for m in MODES if any(m in r.modes for r in rows)], rows, any(r.train is not None for r in rows))
                for d, rows in group(self.grid, lambda r: r.dtype).items()]

    warmup_parts = property(lambda self: any(x.first_parts for c in self.warmup for x in c.by_warmup.values()))
    stable_share = STABLE  # the page names the threshold it counts by

    @property
    def stable(self) -> tuple[int, int]:  # (rows whose std is under STABLE of the mean, measured rows)
        rel = [c.rel_std for r in self.grid for c in r.modes.values() if c.ok]
        return sum(x is not None and x < STABLE for x in rel), len(rel)

    @property
    def noisiest(self) -> list[tuple[GridRow, str, Cell]]:
        cs = [(r, m, c) for r in self.grid for m, c in r.modes.items() if c.rel_std is not None]
        return sorted(cs, key=lambda x: -x[2].rel_std)[:3]

    @property
    def fwd_bwd(self) -> tuple[GridRow, GridRow] | None:
        # the smallest- and largest-context fp32 rows of the largest size with forward and backward measured
        rows = _largest([r for r in self.grid if r.dtype == "fp32" and all(
            r.modes.get(m) and r.modes[m].ok for m in ("forward", "backward"))])
        return (rows[0], rows[-1]) if rows else None

    @property
    def headline(self) -> GridRow | None:
        # the largest fp32 size's training step at its largest measured context: the index's number
        rows = _largest([r for r in self.grid if r.dtype == "fp32" and any(c.ok for c in r.modes.values())])
        return next((r for r in reversed(rows) if r.train is not None and r.train.ok), None)

    @property
    def optimizer_bf16_over_fp32(self) -> float | None:
        by = {o.dtype: o.optimizer_s for o in self.optimizer}
        return by["bf16"] / by["fp32"] if {"bf16", "fp32"} <= set(by) else None


def _study(b: Bench) -> str | None:
    s = Cell.of(b).study or b.details.get("study")  # older files kept it in details
    return STUDIES.get(s, s)


def of_edition(rows: list[Bench], edition: str) -> list[Bench]:
    return [b for b in rows if str(Cell.of(b).edition or "2025") == edition]


def edition_facts(edition: str, rows: list[Bench]) -> EditionFacts:
    names = list(EDITION_SIZES[edition])
    sizes = [SizeRef(edition, n).label for n in names]
    main_rows, warm_rows = ([b for b in rows if _study(b) == s] for s in ("main", "warmup"))

    def by_size(bs) -> list[Cell]:  # the rows' cells, smallest size first
        return sorted(map(Cell.of, bs), key=lambda c: names.index(c.size) if c.size in names else len(names))
    main = by_size(main_rows)
    if not main:
        return EditionFacts(edition, sizes)
    key = lambda c: (c.size_label, c.context, c.dtype)  # noqa: E731
    grid = {k: {c.mode: c for c in g} for k, g in group(main, key).items()}
    warm = {k: {int(c.warmup): c for c in g} for k, g in group(by_size(b for b in warm_rows if b.measured),
                                                              lambda c: (*key(c), c.mode)).items()}
    order = {"fp32": 0, "bf16": 1, "fp16": 2}
    grid_rows = sorted((GridRow(*k, {m: v[m] for m in MODES if m in v}) for k, v in grid.items()),
                       key=lambda r: (order.get(r.dtype, 9), sizes.index(r.size) if r.size in sizes else 99, r.context))
    return EditionFacts(
        edition, sizes, grid_rows, [WarmupCase(*k, dict(sorted(v.items()))) for k, v in warm.items() if len(v) > 1],
        _optimizer(main), main[0].batch, any(Cell.of(b).study == "warmup_fresh_process" for b in rows),
        [c for c in main if c.status is Status.OOM],
        *timing_text(main_rows), next((b.row.peaks for b in main_rows if b.row.peaks is not None), None),
        newest_date(main_rows), warm_rows[0].details.get("left_out", "") if warm_rows else "")


def _optimizer(main: list[Cell]) -> list[OptimizerSplit]:
    """Per dtype (fp32, bf16): the largest size with optimizer-step, forward and backward rows at one context."""
    done = [c for c in main if c.b.measured]
    out = []
    for dtype in ("fp32", "bf16"):
        for c in reversed([c for c in done if c.mode == "optimizer_step" and c.dtype == dtype]):
            same = {o.mode: o.mean_s for o in done if (o.dtype, o.size, o.context) == (dtype, c.size, c.context)}
            if {"forward", "backward"} <= set(same) and (ref := c.size_ref) is not None:
                out.append(OptimizerSplit(c.size_label, c.context, dtype, same["forward"], same["backward"], c.mean_s,
                                          same.get("train_step"), acc.adamw_step_bytes(ref.config.params)))
                break
    return out


def editions(rows: list[Bench]) -> list[EditionFacts]:  # 2025 then 2026
    return [edition_facts(e, of_edition(rows, e)) for e in EDITION_SIZES]


def _plot(e: EditionFacts, device: str, ctx: Context) -> str | None:
    """Training-step mean against context (a colour per size, a line style per dtype); its link, or None."""
    if not any(r.train is not None for r in e.grid):
        return None
    fig, ax = figures.new(figsize=(8, 4.2))
    for dtype, style in (("fp32", "-o"), ("bf16", "--s")):
        for k, size in enumerate(dict.fromkeys(r.size for r in e.grid)):
            pts = [(r.context, r.train.mean_s * 1e3) for r in e.grid
                   if r.size == size and r.dtype == dtype and r.train is not None and r.train.ok]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{k}",
                        label=WORDS.label("series", size=size, dtype=dtype))
    ctxs = sorted({r.context for r in e.grid})
    ax.set(xscale="log", yscale="log", xlabel=WORDS.x, ylabel=WORDS.y, title=WORDS.title)
    ax.minorticks_off()  # under a decade of contexts, log minor labels would overprint the contexts
    ax.set_xticks(ctxs, labels=[str(c) for c in ctxs])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ctx.figure(fig, f"{SLUG}-{device}-train-step" + ("" if e.edition == "2025" else f"-{e.edition}") + ".png")


@dataclass(frozen=True)
class DeviceSection:
    runs: RunsFacts  # its .device heads the section
    editions: list[EditionFacts]  # the measured ones, with their figures


@dataclass(frozen=True)
class ScriptPage(SourcedFromSections):  # its sources: its sections' run files
    answer: list[EditionFacts] | None  # the first GPU device's editions; None: no GPU rows
    sections: list[DeviceSection]
    scores: dict[str, Scored]
    score_row: tuple[EditionFacts, GridRow] | None = None  # what the index words
    score_fb: bool = False  # score_row is 2026's forward and backward, not a training step


def facts(ctx: Context) -> ScriptPage:
    found = [(device, rows, editions(rows)) for device, rows in ctx.rows.per_gpu(PROBLEM)]
    if not found:
        return ScriptPage(None, [], {PROBLEM: NOT_MEASURED})
    sections = [DeviceSection(RunsFacts.of(device, rows), [replace(e, figure=_plot(e, device, ctx)) for e in eds
                                                           if e.grid]) for device, rows, eds in found]
    device, rows, eds = found[0]  # the first (one-GPU) device answers
    fb = eds[-1].fwd_bwd  # a problem of both editions: the index reads the newer one's rows
    head = (eds[-1], fb[1]) if fb else next(((e, e.headline) for e in reversed(eds) if e.headline is not None), None)
    date = newest_date(of_edition(rows, eds[-1].edition) if fb else rows)
    score = Scored(Kind.MEASURED, device, date) if head else NOT_MEASURED
    return ScriptPage(eds, sections, {PROBLEM: score}, head, fb is not None)
