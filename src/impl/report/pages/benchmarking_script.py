"""benchmarking_script: the (b) grid, the (c) warm-up study and the 2026 edition's split of a training
step, for each edition's sizes apart. The first GPU device answers; every device's tables follow.
templates/benchmarking_script.md.j2 holds every word (the mixed_precision page reads the same grid).

Both handouts ask for the average and the standard deviation of the timed steps, so every time here
is pytest-benchmark's mean ± stddev over the timed rounds, never the median."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.model.sizes import EDITION_SIZES, SizeRef
from impl.report import figures
from impl.report.output import figure_path
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, size_label, size_ref, timing_text, view
from impl.report.runs import RunsFacts, newest_date
from impl.workloads.problems import Problem as P
from impl.workloads.sweeps import MODES

PROBLEMS = (P.BENCHMARKING_SCRIPT,)
PROBLEM = P.BENCHMARKING_SCRIPT
SLUG = "benchmarking_script"

STABLE = 0.05  # a row whose std is under this share of its mean is called stable


@dataclass(frozen=True)
class ScriptConfig:
    """What the page reads of a row's config."""

    size: str | None = None
    edition: str | None = None
    context: int | None = None
    dtype: str | None = None
    mode: str | None = None
    study: str | None = None
    warmup: int | None = None
    batch: int | None = None

    @property
    def ref(self) -> SizeRef | None:
        return size_ref(self.size, self.edition)

    @property
    def label(self) -> str:
        return size_label(self.ref, self.size)

    @property
    def edition_or_default(self) -> str:
        """Rows stored before the 2026 table carry no edition: 2025's."""
        return str(self.edition or "2025")


def _cfg(b: Bench) -> ScriptConfig:
    return view(ScriptConfig, b)


@dataclass(frozen=True)
class Parts:
    """A training step's forward, backward and optimizer step (s), where the row kept them."""

    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None


@dataclass(frozen=True)
class Cell:
    """One row's timing: mean ± std over the timed steps (seconds), or why it has none."""

    status: Status
    mean_s: float | None = None
    std_s: float | None = None
    first_s: float | None = None  # the first timed step
    max_s: float | None = None  # the slowest timed step
    peak_bytes: int | None = None
    tokens_per_s: float | None = None
    mfu_measured_peak: float | None = None
    need_bytes: float | None = None  # the closed-form memory need (details["memory_need"]["total"])
    first_parts: Parts | None = None  # the first timed step's
    later_parts: Parts | None = None  # the mean of the other timed steps'

    @property
    def ok(self) -> bool:
        return self.status is Status.MEASURED and self.mean_s is not None

    @property
    def rel_std(self) -> float | None:
        return self.std_s / self.mean_s if self.ok and self.std_s is not None else None

    def within_noise(self, other: Cell) -> bool:
        """The two means lie within the sum of their standard deviations."""
        return abs(self.mean_s - other.mean_s) <= (self.std_s or 0.0) + (other.std_s or 0.0)


def _need(b: Bench) -> float | None:
    return (b.details.get("memory_need") or {}).get("total")


def _parts(b: Bench) -> tuple[Parts | None, Parts | None]:
    """(the first timed step's parts, the other steps' mean parts) of a row that kept details["steps"]."""
    steps = {k.removesuffix("_s"): v for k, v in (b.details.get("steps") or {}).items() if isinstance(v, list) and v
             and k.removesuffix("_s") in ("forward", "backward", "optimizer")}
    later = {k: sum(v[1:]) / len(v[1:]) for k, v in steps.items() if len(v) > 1}
    return (Parts(**{k: v[0] for k, v in steps.items()}) if steps else None), (Parts(**later) if later else None)


def cell(b: Bench) -> Cell:
    if not b.measured:
        return Cell(b.status, need_bytes=_need(b))
    s = b.stats
    data = s.data or []
    first, later = _parts(b)
    return Cell(b.status, s.mean, s.stddev, data[0] if data else None, max(data) if data else None,
                b.row.memory.peak_allocated, b.metric(Metric.TOKENS_PER_S), b.metric(Metric.MFU_MEASURED_PEAK),
                _need(b), first, later)


@dataclass(frozen=True)
class GridRow:
    size: str  # its label (impl.report.rows.size_label)
    context: int
    dtype: str
    modes: dict[str, Cell]  # mode -> cell

    @property
    def train(self) -> Cell | None:
        return self.modes.get("train_step")


@dataclass(frozen=True)
class WarmupCase:
    size: str
    context: int
    dtype: str
    mode: str
    by_warmup: dict[int, Cell]  # warm-up steps -> cell

    @property
    def cold(self) -> Cell:
        return self.by_warmup[min(self.by_warmup)]

    @property
    def warm(self) -> Cell:
        """The most warmed-up row: the reference."""
        return self.by_warmup[max(self.by_warmup)]

    @property
    def first_step_excess(self) -> float | None:
        """The cold row's first timed step over the warm row's mean."""
        return None if self.cold.first_s is None else self.cold.first_s / self.warm.mean_s

    @property
    def cold_mean_excess(self) -> float:
        """The cold row's mean over the warm row's: what no warm-up does to the average."""
        return self.cold.mean_s / self.warm.mean_s

    @property
    def warmed_in_noise(self) -> bool:
        """Whether the means after 1, 2, ... warm-up steps lie within the warm row's spread."""
        return all(c.within_noise(self.warm) for w, c in self.by_warmup.items() if 0 < w < max(self.by_warmup))


@dataclass(frozen=True)
class OptimizerSplit:
    """Forward, backward and the AdamW step timed apart beside the training step timed whole."""

    size: str
    context: int
    dtype: str
    forward_s: float
    backward_s: float
    optimizer_s: float
    train_s: float | None  # the whole step timed as one (None: the 2026 grid times only the parts)
    floor_bytes: int  # the AdamW step's least memory traffic (fp32 state)

    @property
    def parts_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def optimizer_share(self) -> float:
        return self.optimizer_s / self.parts_s

    @property
    def optimizer_gbps(self) -> float:
        return self.floor_bytes / self.optimizer_s / 1e9


@dataclass(frozen=True)
class DtypeTable:
    dtype: str
    modes: list[str]  # its columns
    rows: list[GridRow]
    train: bool  # a training step was timed whole: its tokens/s, MFU and peak columns follow


@dataclass(frozen=True)
class EditionFacts:
    """One edition's answers: its sizes (labels), the rows measured at them, or none yet."""

    edition: str
    sizes: list[str]
    grid: list[GridRow] = field(default_factory=list)
    warmup: list[WarmupCase] = field(default_factory=list)
    optimizer: list[OptimizerSplit] = field(default_factory=list)
    batch: int | None = None
    fresh_warmup: bool = False  # the warm-up rows each ran in a fresh process (2026's study)
    oom_cells: list[tuple[str, int, str, str, Cell]] = field(default_factory=list)  # (size, ctx, dtype, mode, cell)

    @property
    def measured(self) -> bool:
        return bool(self.grid)

    @property
    def tables(self) -> list[DtypeTable]:
        """The grid as one table per dtype, with the modes any of its rows has."""
        out = []
        for dtype in dict.fromkeys(r.dtype for r in self.grid):
            rows = [r for r in self.grid if r.dtype == dtype]
            out.append(DtypeTable(dtype, [m for m in MODES if any(m in r.modes for r in rows)], rows,
                                  any(r.train is not None for r in rows)))
        return out

    @property
    def warmup_parts(self) -> bool:
        """Whether the warm-up rows kept each step's forward/backward/optimizer times (a table column)."""
        return any(x.first_parts for c in self.warmup for x in c.by_warmup.values())

    def cells(self) -> list[Cell]:
        return [c for r in self.grid for c in r.modes.values() if c.ok]

    @property
    def stable(self) -> tuple[int, int]:
        """(rows whose std is under STABLE of the mean, measured rows)."""
        cs = self.cells()
        return sum(c.rel_std is not None and c.rel_std < STABLE for c in cs), len(cs)

    def noisiest(self, n: int = 3) -> list[tuple[GridRow, str, Cell]]:
        """The n measured (row, mode, cell) with the largest std ÷ mean."""
        cs = [(r, m, c) for r in self.grid for m, c in r.modes.items() if c.rel_std is not None]
        return sorted(cs, key=lambda x: -x[2].rel_std)[:n]

    def largest(self, dtype: str = "fp32") -> list[GridRow]:
        """The grid rows of the largest size measured in `dtype`, by context."""
        rows = [r for r in self.grid if r.dtype == dtype and any(c.ok for c in r.modes.values())]
        return [r for r in rows if r.size == rows[-1].size] if rows else []

    @property
    def fwd_bwd(self) -> tuple[GridRow, GridRow] | None:
        """(the smallest- and largest-context rows of the largest fp32 size whose forward and backward were
        both measured)."""
        rows = [r for r in self.grid if r.dtype == "fp32"
                and all(r.modes.get(m) and r.modes[m].ok for m in ("forward", "backward"))]
        rows = [r for r in rows if r.size == rows[-1].size] if rows else []
        return (rows[0], rows[-1]) if rows else None

    @property
    def headline(self) -> GridRow | None:
        """The largest fp32 size's training step at its largest measured context: the index's number."""
        rows = [r for r in self.largest() if r.train is not None and r.train.ok]
        return rows[-1] if rows else None

    @property
    def optimizer_bf16_over_fp32(self) -> float | None:
        by = {o.dtype: o.optimizer_s for o in self.optimizer}
        return by["bf16"] / by["fp32"] if {"bf16", "fp32"} <= set(by) else None


# the 2026 edition's studies answer the same questions: its grid (every 2026 size, forward, backward and
# the optimizer step) and its warm-up study (each warm-up count in a fresh process)
STUDIES = {"main_2026": "main", "warmup_fresh_process": "warmup"}


def _study(b: Bench) -> str | None:
    s = _cfg(b).study or b.details.get("study")  # older files kept it in details
    return STUDIES.get(s, s)


def _size_order(edition: str):
    names = list(EDITION_SIZES[edition])
    return lambda b: (names.index(_cfg(b).size) if _cfg(b).size in names else len(names))


def edition_facts(edition: str, rows: list[Bench]) -> EditionFacts:
    sizes = [size_label(SizeRef(edition, n)) for n in EDITION_SIZES[edition]]
    main = sorted((b for b in rows if _study(b) == "main"), key=_size_order(edition))
    if not main:
        return EditionFacts(edition, sizes)
    grid: dict[tuple, dict[str, Cell]] = {}
    for b in main:
        c = _cfg(b)
        grid.setdefault((c.label, c.context, c.dtype), {})[c.mode] = cell(b)
    order = {"fp32": 0, "bf16": 1, "fp16": 2}
    rows_ = sorted((GridRow(s, c, d, {m: modes[m] for m in MODES if m in modes}) for (s, c, d), modes in grid.items()),
                   key=lambda r: (order.get(r.dtype, 9), sizes.index(r.size) if r.size in sizes else 99, r.context))
    oom = [(b, _cfg(b)) for b in main if b.status is Status.OOM]
    warm: dict[tuple, dict[int, Cell]] = {}
    for b in sorted((b for b in rows if _study(b) == "warmup" and b.measured), key=_size_order(edition)):
        c = _cfg(b)
        warm.setdefault((c.label, c.context, c.dtype, c.mode), {})[int(c.warmup)] = cell(b)
    cases = [WarmupCase(*k, dict(sorted(v.items()))) for k, v in warm.items() if len(v) > 1]
    return EditionFacts(edition, sizes, rows_, cases, _optimizer(main), _cfg(main[0]).batch,
                        any(_cfg(b).study == "warmup_fresh_process" for b in rows),
                        [(c.label, c.context, c.dtype, c.mode, cell(b)) for b, c in oom])


def _optimizer(main: list[Bench]) -> list[OptimizerSplit]:
    """For fp32 and bf16: the largest size with an optimizer-step row and forward and backward (and the
    training step, where timed) at the same context."""
    out = []
    for dtype in ("fp32", "bf16"):
        for b in reversed([b for b in main if b.measured and _cfg(b).mode == "optimizer_step" and _cfg(b).dtype == dtype]):
            c = _cfg(b)
            same = {_cfg(o).mode: o.stats.mean for o in main if o.measured and _cfg(o).dtype == dtype
                    and _cfg(o).size == c.size and _cfg(o).context == c.context}
            if {"forward", "backward"} <= set(same) and c.ref is not None:
                out.append(OptimizerSplit(c.label, c.context, dtype, same["forward"], same["backward"], b.stats.mean,
                                          same.get("train_step"), acc.adamw_step_bytes(c.ref.config.params)))
                break
    return out


@dataclass(frozen=True)
class BenchmarkingScriptFacts:
    device: str
    editions: list[EditionFacts]  # 2025 then 2026

    @property
    def headline(self) -> tuple[EditionFacts, GridRow] | None:
        """The newest edition's headline where it has rows, else the older one's."""
        for e in reversed(self.editions):
            if e.headline is not None:
                return e, e.headline
        return None


def of_edition(rows: list[Bench], edition: str) -> list[Bench]:
    return [b for b in rows if _cfg(b).edition_or_default == edition]


def benchmarking_script_facts(device: str, rows: list[Bench]) -> BenchmarkingScriptFacts:
    return BenchmarkingScriptFacts(device, [edition_facts(e, of_edition(rows, e)) for e in EDITION_SIZES])


# ---- each device's tables -----------------------------------------------------------------------

@dataclass(frozen=True)
class Peak:
    """The matmul peak measured in the run (MFU's denominator)."""

    tflops: float
    dtype: str
    n: int  # the n of its n³ matmul


@dataclass(frozen=True)
class EditionTables:
    """One edition's (b) grid and (c) warm-up study on one device."""

    e: EditionFacts
    warmup_steps: str  # "5", or "5–10" where rows differ
    timed_steps: str
    peak: Peak | None
    figure: str | None  # the training-step figure's link (where the grid timed the whole step)
    date: str  # the grid's newest run date
    left_out: str  # what the warm-up study did not run


@dataclass(frozen=True)
class DeviceSection:
    device: str
    editions: list[EditionTables]
    runs: RunsFacts


def plot(grid: list[GridRow], path) -> None:
    """Training-step mean against context, one colour per size, the dtype by line style (OOM points absent)."""
    fig, ax = figures.new(figsize=(8, 4.2))
    sizes = list(dict.fromkeys(r.size for r in grid))
    for dtype, style in (("fp32", "-o"), ("bf16", "--s")):
        for k, size in enumerate(sizes):
            pts = [(r.context, r.train.mean_s * 1e3) for r in grid
                   if r.size == size and r.dtype == dtype and r.train is not None and r.train.ok]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{k}", label=f"{size} {dtype}")
    ctxs = sorted({r.context for r in grid})
    ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="train step, mean (ms)",
           title="benchmarking_script: full training step (OOM points absent)")
    ax.minorticks_off()  # under a decade of contexts, log minor labels would overprint the contexts
    ax.set_xticks(ctxs, labels=[str(c) for c in ctxs])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figures.save(fig, path)


def _tables(e: EditionFacts, rows: list[Bench], device: str, ctx: Context) -> EditionTables:
    ed = of_edition(rows, e.edition)
    main = [b for b in ed if _study(b) == "main"]
    warm_n, rounds_n = timing_text(main)
    p = next((b.row.peaks for b in main if b.row.peaks is not None), None)
    figure = None
    if any(r.train is not None for r in e.grid):
        path, figure = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG,
                                   f"{device}-train-step" + ("" if e.edition == "2025" else f"-{e.edition}"))
        plot(e.grid, path)
    warm = [b for b in ed if _study(b) == "warmup"]
    return EditionTables(e, warm_n, rounds_n, None if p is None else Peak(p.measured_flops / 1e12, p.measured_dtype,
                                                                        p.measured_n),
                         figure, newest_date(main), warm[0].details.get("left_out", "") if warm else "")


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ScriptPage:
    answer: BenchmarkingScriptFacts | None  # the first GPU device's; None: no GPU rows
    sections: list[DeviceSection]
    score_row: tuple[EditionFacts, GridRow] | None = None  # what the index words
    score_fb: bool = False  # score_row is 2026's forward and backward, not a training step
    score_device: str = "–"
    score_date: str = "–"
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        if self.score_row is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        return {PROBLEM: Scored(Kind.MEASURED, self.score_device, self.score_date)}

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.runs.files})


def facts(ctx: Context) -> ScriptPage:
    found = [(device, rows, benchmarking_script_facts(device, rows)) for device, rows in ctx.rows.per_gpu(PROBLEM)]
    if not found:
        return ScriptPage(None, [])
    sections = [DeviceSection(device, [_tables(e, rows, device, ctx) for e in f.editions if e.measured],
                              RunsFacts.of(device, rows)) for device, rows, f in found]
    device, rows, f = found[0]  # the first (one-GPU) device answers
    e26 = f.editions[-1]
    if e26.fwd_bwd is not None:  # a problem of both editions: the index reads the newer one's rows
        return ScriptPage(f, sections, (e26, e26.fwd_bwd[1]), True, device, newest_date(of_edition(rows, e26.edition)))
    return ScriptPage(f, sections, f.headline, False, device, newest_date(rows))
