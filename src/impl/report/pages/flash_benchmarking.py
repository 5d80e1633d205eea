"""flash_benchmarking: ours against the naive attention and the SDPA backends over batch 1, causal,
sequence × d × dtype × pass, from the first GPU device with rows; its newest run against the previous
saved one. Every ratio divides rows of one run. templates/flash_benchmarking.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from impl.bench.row import Metric
from impl.report import figures
from impl.report.flash_rows import (IMPL_COLORS, IMPL_LABELS, IMPL_ORDER, MODE_LABELS, SHORT_SEQ, Kernel,
                                    best_anchor, groups, kernel, median_ms, newest_date, not_run, over, ran, spread_of,
                                    status_label, timers)
from impl.report.markdown import num
from impl.report.output import figure_path, write_table_csv
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import Ratio, med
from impl.report.rows import Bench, of_newest_run
from impl.report.runs import RunsFacts
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_BENCHMARKING,)
PROBLEM = P.FLASH_BENCHMARKING
#: A version counts as faster or slower only beyond this factor on top of the anchors' own change
#: between the same two runs (the anchors' code did not change, so their change is the machine's).
DRIFT_BAND = 1.05
DTYPE_ORDER = ["bf16", "fp16", "fp32"]


def _impls(rows: list[Bench]) -> list[str]:
    present = {kernel(b).impl for b in rows}
    return [i for i in IMPL_ORDER if i in present]


def _e2e(rows: list[Bench]) -> list[Bench]:
    return [b for b in rows if kernel(b).mode == "fwd_bwd"]


# ---- the answers ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Longest:
    """At the longest sequence ours' forward+backward ran, per dtype and d: ours, the faster SDPA anchor
    of the same shape, and the naive attention at its own longest."""

    dtype: str
    d: int
    seq: int
    ours_ms: float
    ours_tflops: float | None
    anchor_ms: float | None
    anchor: str | None  # its label
    vs_anchor: Ratio | None
    naive_seq: int | None
    naive_ms: float | None


def longest(rows: list[Bench]) -> list[Longest]:
    e2e = [b for b in _e2e(rows) if ran(b)]
    out = []
    for (dtype, d), g in groups(e2e, "dtype", "d"):
        ours = [b for b in g if kernel(b).impl == "flash_triton"]
        if not ours:
            continue
        seq = max(kernel(b).seq for b in ours)
        at = [b for b in g if kernel(b).seq == seq]
        o = next(b for b in at if kernel(b).impl == "flash_triton")
        best = best_anchor(at)
        naive = max((b for b in g if kernel(b).impl == "naive"), key=lambda b: kernel(b).seq, default=None)
        out.append(Longest(dtype, d, seq, median_ms(o), o.metric(Metric.TFLOPS),
                           best and median_ms(best), best and IMPL_LABELS[kernel(best).impl],
                           best and over(o, best, "anchor"), naive and kernel(naive).seq, naive and median_ms(naive)))
    return out


@dataclass(frozen=True)
class VsNaive:
    """Ours ÷ naive forward+backward of one run at the longest sequence both ran."""

    seq: int
    low: float  # over d and dtype
    high: float
    ours_max: int  # the longest sequence ours ran
    naive_max: int
    stop_reason: str | None  # why naive did not run beyond


def vs_naive(rows: list[Bench]) -> VsNaive | None:
    e2e = _e2e(rows)
    naive = [b for b in e2e if kernel(b).impl == "naive"]
    naive_ok = [b for b in naive if ran(b)]
    ours = [b for b in e2e if kernel(b).impl == "flash_triton" and ran(b)]

    def key(b):  # a pair is of one shape and one run
        return kernel(b).dtype, kernel(b).d, kernel(b).seq, b.run.datetime
    pairs = [(o, n) for o in ours for n in naive_ok if key(o) == key(n)]
    if not pairs:
        return None
    top = max(kernel(o).seq for o, _ in pairs)
    sp = sorted(o.stats.median / n.stats.median for o, n in pairs if kernel(o).seq == top)
    stop = next((b.row.reason for b in naive if not ran(b)), None)
    return VsNaive(top, sp[0], sp[-1], max(kernel(b).seq for b in ours), max(kernel(b).seq for b in naive_ok), stop)


# ---- the tables ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reach:
    """The longest sequence one implementation's forward+backward ran at one dtype, per d."""

    impl: str  # its label
    dtype: str
    # per d: (the longest sequence that ran, (the sequence, status) that stopped it); None: no rows
    cells: tuple[tuple[int | None, tuple[int, str] | None] | None, ...]


def reach(rows: list[Bench]) -> tuple[list[int], list[Reach]]:
    """(the d's, a row per implementation and dtype)."""
    e2e = _e2e(rows)
    dims = sorted({kernel(b).d for b in e2e})
    out = []
    for impl in _impls(e2e):
        for dtype in sorted({kernel(b).dtype for b in e2e}, key=DTYPE_ORDER.index):
            cells = []
            for d in dims:
                g = sorted((b for b in e2e if (kernel(b).impl, kernel(b).dtype, kernel(b).d) == (impl, dtype, d)),
                           key=lambda b: kernel(b).seq)
                ok = [kernel(b).seq for b in g if ran(b)]
                stops = [(kernel(b).seq, status_label(b)) for b in g if not ran(b)]
                stop = next((s for s in stops if not ok or s[0] > max(ok)), None)
                cells.append((max(ok) if ok else None, stop) if g else None)
            out.append(Reach(IMPL_LABELS[impl], dtype, tuple(cells)))
    return dims, out


@dataclass(frozen=True)
class Odd:
    """A backward that took longer than its forward+backward."""

    impl: str  # its label
    k: Kernel
    bwd_ms: float
    e2e_ms: float
    why: str  # "host-bound" (seq ≤ SHORT_SEQ), "within noise" (spreads overlap) or "unexplained"


def odd(rows: list[Bench]) -> list[Odd]:
    out = []
    for (impl, _, _, seq), g in groups([b for b in rows if ran(b)], "impl", "dtype", "d", "seq"):
        modes = {kernel(b).mode: b for b in g}
        b, e = modes.get("bwd"), modes.get("fwd_bwd")
        if b is None or e is None or b.stats.median <= e.stats.median:
            continue
        sb, se = spread_of(b), spread_of(e)
        noise = sb is not None and se is not None and b.stats.median - sb <= e.stats.median + se
        out.append(Odd(IMPL_LABELS[impl], kernel(b), median_ms(b), median_ms(e),
                       "host-bound" if seq <= SHORT_SEQ else "within noise" if noise else "unexplained"))
    return out


@dataclass(frozen=True)
class Drift:
    """One (dtype, d, pass): median new/old of ours over the shapes both runs measured, long and short
    sequences apart, beside the SDPA anchors' own median new/old (each run's own medians)."""

    dtype: str
    d: int
    mode: str  # MODE_LABELS'
    ours_long: float
    anchors: float | None
    ours_short: float | None

    @property
    def change(self) -> int:
        """-1 faster, 1 slower, 0 within the anchors' drift (DRIFT_BAND around their change)."""
        base = self.anchors or 1.0
        return -1 if self.ours_long < base / DRIFT_BAND else 1 if self.ours_long > base * DRIFT_BAND else 0


def drift(now_rows: list[Bench], before_rows: list[Bench]) -> list[Drift]:
    def times(rows):
        return {(k.impl, k.dtype, k.mode, k.d, k.seq): median_ms(b) for b in rows if ran(b) for k in [kernel(b)]}
    now, before = times(now_rows), times(before_rows)
    out = []
    for dtype in sorted({k[1] for k in now}):
        for d in sorted({k[3] for k in now if k[1] == dtype}):
            for mode in MODE_LABELS:
                common = [k for k in now if k in before and k[1:4] == (dtype, mode, d)]

                def change(anchors: bool, long: bool):
                    return med(now[k] / before[k] for k in common if (k[4] > SHORT_SEQ) == long
                               and (k[0].startswith("sdpa") if anchors else k[0] == "flash_triton"))
                ours_long = change(False, True)
                if ours_long is not None:
                    out.append(Drift(dtype, d, MODE_LABELS[mode], ours_long, change(True, True), change(False, False)))
    return out


def previous_run(newest: list[Bench], history: tuple[Bench, ...]) -> list[Bench]:
    """The newest earlier run of the same problem, device and dtypes as `newest` (empty if none)."""
    dtypes, device = {kernel(b).dtype for b in newest}, newest[0].run.device
    first = min(str(b.run.datetime) for b in newest)
    return of_newest_run([b for b in history if b.problem == PROBLEM and b.run.device == device
                          and kernel(b).dtype in dtypes and str(b.run.datetime) < first])


# ---- the files beside the page -------------------------------------------------------------------------

def _grid_csv(ctx: Context, device: str, rows: list[Bench]) -> str:
    """Every (dtype, pass, d, seq), one column per implementation: "ms (TFLOP/s)" or why it did not run."""
    impls = _impls(rows)

    def cell(b: Bench | None) -> str:
        return "" if b is None else status_label(b) or f"{median_ms(b):.3f} ({num(b.metric(Metric.TFLOPS), 1)})"
    lines = []
    for (dtype, mode, d, seq), g in groups(rows, "dtype", "mode", "d", "seq"):
        by = {kernel(b).impl: b for b in g}
        lines.append([dtype, MODE_LABELS[mode], d, seq, *(cell(by.get(i)) for i in impls)])
    header = ["dtype", "pass", "d", "seq", *(f"{IMPL_LABELS[i]}: ms (TFLOP/s)" for i in impls)]
    return write_table_csv(ctx.reports_dir, f"flash_benchmarking-{device}", header, lines)


def _pow2_axis(ax, values) -> None:
    """Log₂ x axis labelled at every other power of two present (labels of neighbours overlap)."""
    ticks = sorted(set(values))
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks[::2]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(x) // 1024}K" if x >= 1024 else f"{int(x)}"))


def plot(rows: list[Bench], path) -> list[str] | None:
    """TFLOP/s against sequence length of the forward+backward rows, one panel per head dimension, one
    colour per implementation on every panel, one legend (below the panels) built from the lines drawn;
    its labels, None where nothing ran."""
    e2e = [b for b in _e2e(rows) if ran(b)]
    if not e2e:
        return None
    dtypes = {kernel(b).dtype for b in e2e}
    dtype = "bf16" if "bf16" in dtypes else sorted(dtypes)[0]
    e2e = [b for b in e2e if kernel(b).dtype == dtype]
    dims = sorted({kernel(b).d for b in e2e})
    ncol = 2 if len(dims) > 1 else 1
    nrow = (len(dims) + ncol - 1) // ncol
    fig, _ = figures.new(figsize=(10, 3.2 * nrow + 0.9))
    fig.clf()
    gs = fig.add_gridspec(nrow + 1, ncol, height_ratios=[1] * nrow + [0.22])
    handles = {}
    for idx, d in enumerate(dims):
        ax = fig.add_subplot(gs[idx // ncol, idx % ncol])
        for impl in _impls(e2e):
            sel = sorted((b for b in e2e if (kernel(b).impl, kernel(b).d) == (impl, d)), key=lambda b: kernel(b).seq)
            if not sel:
                continue
            style = "-o" if impl.startswith("flash_triton") else "--s"  # ours solid, others dashed
            tflops = [b.metric(Metric.TFLOPS) for b in sel]
            (line,) = ax.plot([kernel(b).seq for b in sel], [float("nan") if t is None else t for t in tflops], style,
                              ms=3, color=IMPL_COLORS[impl], label=IMPL_LABELS[impl])
            handles.setdefault(IMPL_LABELS[impl], line)
        _pow2_axis(ax, [kernel(b).seq for b in e2e])
        ax.set_yscale("log")
        ax.set(xlabel="sequence length", ylabel="TFLOP/s", title=f"d = {d}")
    ax = fig.add_subplot(gs[nrow, :])  # the legend's own row keeps tight_layout clear of the axis labels
    ax.axis("off")
    legend = ax.legend(list(handles.values()), list(handles), loc="center", ncol=min(3, len(handles)), fontsize=8,
                       frameon=False)
    fig.suptitle(f"flash_benchmarking: {dtype}, causal, batch {kernel(e2e[0]).batch}, forward+backward "
                 "(median kernel times)")
    figures.save(fig, path)
    return [t.get_text() for t in legend.get_texts()]


# ---- the page ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FlashBenchmarkingPage:
    device: str = ""  # the device folder; "": no GPU device has rows
    first: Kernel | None = None  # the first row's config (its batch)
    seqs: tuple[int, int] = (0, 0)  # the grid's shortest and longest sequence
    dims: tuple[int, ...] = ()  # every d of the grid
    dtypes: tuple[str, ...] = ()
    vs_naive: VsNaive | None = None
    longest: tuple[Longest, ...] = ()
    timers: tuple[str, ...] = ()
    autotune: bool | None = None
    left_out: str = "–"  # the bench's own list of what it leaves out by design
    grid_link: str = ""
    figure: str | None = None
    runs: RunsFacts | None = None
    reach_dims: tuple[int, ...] = ()  # the d's of the forward+backward rows
    reach: tuple[Reach, ...] = ()
    odd: tuple[Odd, ...] = ()
    newest: RunsFacts | None = None  # the newest run, and the previous one it is compared with
    previous: RunsFacts | None = None
    drift: tuple[Drift, ...] = ()
    not_run: tuple[tuple[str, str], ...] = ()
    date: str = "–"
    files: tuple[str, ...] = ()
    index_figures: tuple = ()
    short_seq = SHORT_SEQ  # the constants the words state
    band = DRIFT_BAND

    @property
    def headline(self) -> Longest | None:
        """bf16 at d 64 where it ran, else the first dtype and d."""
        return next((x for x in self.longest if (x.dtype, x.d) == ("bf16", 64)), None) or \
            (self.longest[0] if self.longest else None)

    @property
    def unexplained(self) -> bool:
        return any(x.why == "unexplained" for x in self.odd)

    def changes(self, change: int) -> int:
        return sum(x.change == change for x in self.drift)

    @property
    def scores(self) -> dict[str, Scored]:
        if not self.device:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        # without a longest-sequence row (ours never ran) the problem stays unanswered in the index
        return {PROBLEM: Scored(Kind.MEASURED, self.device, self.date)} if self.headline else {}

    @property
    def sources(self) -> list[str]:
        return list(self.files)


def facts(ctx: Context) -> FlashBenchmarkingPage:
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        ks = [kernel(b) for b in rows]
        png, rel = figure_path(ctx.fig_dir, ctx.fig_rel, f"flash_benchmarking-{device}")
        newest = of_newest_run(rows)
        prev = previous_run(newest, ctx.rows.history)
        dims, reached = reach(rows)
        return FlashBenchmarkingPage(
            device=device, first=ks[0], seqs=(min(k.seq for k in ks), max(k.seq for k in ks)),
            dims=tuple(sorted({k.d for k in ks})), dtypes=tuple(sorted({k.dtype for k in ks})),
            vs_naive=vs_naive(rows), longest=tuple(longest(rows)), timers=tuple(timers(rows)),
            autotune=rows[0].details.get("autotune"), left_out=rows[0].details.get("left_out", "–"),
            grid_link=_grid_csv(ctx, device, rows), figure=rel if plot(rows, png) else None,
            runs=RunsFacts.of(device, rows), reach_dims=tuple(dims), reach=tuple(reached), odd=tuple(odd(rows)),
            newest=RunsFacts.of(device, newest), previous=RunsFacts.of(device, prev) if prev else None,
            drift=tuple(drift(newest, prev)), not_run=tuple(not_run(rows)), date=newest_date(rows),
            files=tuple(sorted({b.run.file for b in rows + prev if b.run.file})))
    return FlashBenchmarkingPage()
