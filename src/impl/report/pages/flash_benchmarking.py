"""flash_benchmarking: ours against naive attention and the SDPA backends on the first GPU device with rows, and its
newest run against the previous saved one. Every ratio divides rows of one run. Tables and sections go by dtype
in name order (bf16, fp16, fp32), the order flash_rows.groups sorts its keys in."""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from impl.bench.row import Metric
from impl.report import figures
from impl.report.flash_rows import (IMPL_COLORS, IMPL_LABELS, MODE_LABELS, best_anchor, cell, groups, kernel,
                                    median_ms, not_run, ran, status_label, timers)
from impl.report.markdown import num
from impl.report.pages import Context, Scored
from impl.report.ratio import Ratio, med, of_benches
from impl.report.rows import Bench, of_newest_run
from impl.report.runs import RunsFacts, files_of
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_BENCHMARKING,)
PROBLEM = P.FLASH_BENCHMARKING
SHORT_SEQ = 4096  # up to this length a call is host-bound (NOTES.md): its times follow the host, not the kernels
DRIFT_BAND = 1.05  # a version changed only beyond this factor on the anchors' own change (the machine's drift)
WORDS = figures.words("flash_benchmarking")  # the words drawn into the TFLOP/s figure
GRID = figures.words("flash_benchmarking_grid")  # the CSV grid's column words


def _impls(rows: list[Bench]) -> list[str]:  # those present, in IMPL_LABELS' order
    return [i for i in IMPL_LABELS if any(kernel(b).impl == i for b in rows)]


def _e2e(rows: list[Bench], measured: bool = False) -> list[Bench]:  # the forward+backward rows (that ran)
    return [b for b in rows if kernel(b).mode == "fwd_bwd" and (ran(b) or not measured)]


def _of(rows: list[Bench], impl: str) -> list[Bench]:
    return [b for b in rows if kernel(b).impl == impl]


@dataclass(frozen=True)
class Longest:  # per dtype and d, forward+backward rows:
    ours: Bench  # at the longest sequence ours ran
    anchor: Bench | None  # the faster SDPA anchor at that shape
    naive: Bench | None  # naive at its own longest

    k = property(lambda self: kernel(self.ours))  # the dtype, d and sequence
    anchor_label = property(lambda self: self.anchor and IMPL_LABELS[kernel(self.anchor).impl])
    vs_anchor = property(lambda self: self.anchor and of_benches(self.ours, self.anchor, "anchor"))


def _at_longest(rows: list[Bench], impl: str) -> Bench | None:
    return max(_of(rows, impl), key=lambda b: kernel(b).seq, default=None)


def longest(rows: list[Bench]) -> list[Longest]:
    return [Longest(o, best_anchor([b for b in g if kernel(b).seq == kernel(o).seq]), _at_longest(g, "naive"))
            for _, g in groups(_e2e(rows, measured=True), "dtype", "d") if (o := _at_longest(g, "flash_triton"))]


@dataclass(frozen=True)
class VsNaive:  # one dtype: ours ÷ naive forward+backward of one run at the longest sequence both ran
    dtype: str
    seq: int
    low: float  # over d
    high: float
    ours_max: int  # the longest sequence ours ran at this dtype
    naive_max: int
    stop_reason: str | None  # why naive did not run beyond (its first row beyond naive_max)


def _shape_run(b: Bench) -> tuple:  # a pair divides rows of one shape and one run
    return kernel(b).d, kernel(b).seq, b.run.datetime


def vs_naive(rows: list[Bench]) -> tuple[VsNaive, ...]:  # per dtype where ours and naive ran one shape in one run
    out = []
    for (dtype,), g in groups(_e2e(rows), "dtype"):
        naive = sorted(_of(g, "naive"), key=lambda b: kernel(b).seq)
        ours = [b for b in _of(g, "flash_triton") if ran(b)]
        if pairs := [(o, n) for o in ours for n in naive if ran(n) and _shape_run(o) == _shape_run(n)]:
            top = max(kernel(o).seq for o, _ in pairs)
            over = sorted(o.stats.median / n.stats.median for o, n in pairs if kernel(o).seq == top)
            naive_max = max(kernel(b).seq for b in naive if ran(b))
            stop = next((b.row.reason for b in naive if not ran(b) and kernel(b).seq > naive_max), None)
            out.append(VsNaive(dtype, top, over[0], over[-1], max(kernel(b).seq for b in ours), naive_max, stop))
    return tuple(out)


@dataclass(frozen=True)
class Reach:  # the longest sequence one implementation's forward+backward ran at one dtype, per d
    impl: str  # its label
    dtype: str
    # per d: (the longest sequence that ran, (the sequence, status) that stopped it); None: no rows
    cells: tuple[tuple[int | None, tuple[int, str] | None] | None, ...]


def _reach(g: list[Bench]) -> tuple[int | None, tuple[int, str] | None] | None:
    top = max((kernel(b).seq for b in g if ran(b)), default=None)
    stops = [(kernel(b).seq, status_label(b)) for b in g if not ran(b) and (top is None or kernel(b).seq > top)]
    return (top, min(stops, key=lambda s: s[0], default=None)) if g else None


def reach(rows: list[Bench]) -> list[Reach]:
    e2e = _e2e(rows)
    cells = dict(groups(e2e, "impl", "dtype", "d"))
    dims = sorted({kernel(b).d for b in e2e})
    return [Reach(IMPL_LABELS[i], t, tuple(_reach(cells.get((i, t, d), [])) for d in dims)) for i in _impls(e2e)
            for t in sorted({kernel(b).dtype for b in e2e})]


@dataclass(frozen=True)
class Odd:  # a backward row that took longer than its forward+backward row
    bwd: Bench
    e2e: Bench
    why: str  # "host-bound" (seq ≤ SHORT_SEQ), "within noise" (spreads overlap) or "unexplained"

    k = property(lambda self: kernel(self.bwd))
    impl = property(lambda self: IMPL_LABELS[self.k.impl])  # its label


def odd(rows: list[Bench]) -> list[Odd]:
    out = []
    for (*_, seq), g in groups([b for b in rows if ran(b)], "impl", "dtype", "d", "seq"):
        b, e = map({kernel(b).mode: b for b in g}.get, ("bwd", "fwd_bwd"))
        if b and e and b.stats.median > e.stats.median:  # within noise: impl.report.ratio's rule
            out.append(Odd(b, e, "host-bound" if seq <= SHORT_SEQ
                           else "within noise" if of_benches(b, e).noise else "unexplained"))
    return out


@dataclass(frozen=True)
class Drift:  # one (dtype, d, pass): median new/old of ours and of the SDPA anchors, each run's own medians
    dtype: str
    d: int
    mode: str  # MODE_LABELS'
    ours_long: float  # over the shapes both runs measured with seq > SHORT_SEQ
    anchors: float | None
    ours_short: float | None

    @property
    def change(self) -> int:  # -1 faster, 1 slower, 0 within the anchors' drift
        base = self.anchors or 1.0
        return -1 if self.ours_long < base / DRIFT_BAND else 1 if self.ours_long > base * DRIFT_BAND else 0


def drift(now_rows: list[Bench], before_rows: list[Bench]) -> list[Drift]:
    now, before = ({(k.impl, k.dtype, k.mode, k.d, k.seq): median_ms(b) for b in rows if ran(b) for k in [kernel(b)]}
                   for rows in (now_rows, before_rows))

    def change(dtype, mode, d, anchors: bool, long: bool) -> float | None:
        return med(now[k] / before[k] for k in now if k in before and k[1:4] == (dtype, mode, d)
                   and (k[4] > SHORT_SEQ) == long and (k[0].startswith("sdpa") if anchors else k[0] == "flash_triton"))
    return [Drift(dtype, d, MODE_LABELS[m], ours, change(dtype, m, d, True, True), change(dtype, m, d, False, False))
            for dtype, d in sorted({(k[1], k[3]) for k in now}) for m in MODE_LABELS
            if (ours := change(dtype, m, d, False, True)) is not None]


@dataclass(frozen=True)
class SeqTable:  # one dtype's table: a row per (implementation or pass, d), a column per sequence
    dtype: str
    what: str  # a grid table's pass (MODE_LABELS'); a ratio table's anchor: "sdpa" (the cell's faster backend), "naive"
    seqs: tuple[int, ...]
    rows: tuple[tuple[str, int, tuple], ...]  # (label, d, a cell per seq: a Cell, or a Ratio; None: no row)


def _table(dtype: str, what: str, cells: dict[tuple, object], labels: dict[str, str]) -> list[SeqTable]:
    # cells by (x, d, seq): a row (labels[x], d) per x of `labels` and d with any cell, a column per sequence
    seqs, dims = (sorted({key[i] for key in cells}) for i in (2, 1))
    rows = tuple((label, d, cs) for x, label in labels.items() for d in dims
                 if any(cs := tuple(cells.get((x, d, q)) for q in seqs)))
    return [SeqTable(dtype, what, tuple(seqs), rows)] if rows else []


def grid(rows: list[Bench]) -> list[SeqTable]:  # every cell (its newest row), a table per dtype and pass (issue 45)
    out = []
    for (dtype, mode), g in sorted(groups(rows, "dtype", "mode"),
                                   key=lambda kv: (kv[0][0], list(MODE_LABELS).index(kv[0][1]))):
        cells = {(kernel(b).impl, kernel(b).d, kernel(b).seq): cell(b, median_ms) for b in g}
        out += _table(dtype, MODE_LABELS[mode], cells, IMPL_LABELS)
    return out


def _vs(rows: list[Bench], anchor: str) -> Ratio | None:  # ours ÷ "sdpa" (the faster backend) or "naive", one run
    o = next(iter(_of(rows, "flash_triton")), None)
    same = [b for b in rows if o is not None and b.run.datetime == o.run.datetime]
    a = best_anchor(same) if anchor == "sdpa" else next(iter(_of(same, "naive")), None)
    return of_benches(o, a) if o and a else None


def ratio_tables(rows: list[Bench]) -> list[SeqTable]:  # ours ÷ each anchor kind per dtype, both rows of one run
    out = []
    for (dtype,), g in groups([b for b in rows if ran(b)], "dtype"):
        cells = groups(g, "mode", "d", "seq")
        for anchor in ("sdpa", "naive"):
            out += _table(dtype, anchor, {k: _vs(bs, anchor) for k, bs in cells}, MODE_LABELS)
    return out


def _grid_csv(ctx: Context, device: str, rows: list[Bench]) -> str:  # every cell: "ms (TFLOP/s)" or why not run
    impls = _impls(rows)

    def text(b: Bench | None) -> str:
        return "" if b is None else status_label(b) or f"{median_ms(b):.3f} ({num(b.metric(Metric.TFLOPS), 1)})"
    lines = [[dtype, MODE_LABELS[mode], d, seq, *map(text, map({kernel(b).impl: b for b in g}.get, impls))]
             for (dtype, mode, d, seq), g in groups(rows, "dtype", "mode", "d", "seq")]
    header = ["dtype", "pass", "d", "seq", *(GRID.label("impl", impl=IMPL_LABELS[i]) for i in impls)]
    return ctx.table_csv(f"flash_benchmarking-{device}", header, lines)


def plot(rows: list[Bench], path) -> list[str] | None:  # TFLOP/s of fwd+bwd rows by seq, a panel per d; legend labels
    e2e = _e2e(rows, measured=True)
    if not e2e:
        return None
    dtype = min({kernel(b).dtype for b in e2e}, key=lambda t: (t != "bf16", t))  # bf16 where it ran
    e2e = [b for b in e2e if kernel(b).dtype == dtype]
    dims, seqs = sorted({kernel(b).d for b in e2e}), sorted({kernel(b).seq for b in e2e})
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
            if sel:  # ours solid, others dashed
                tflops = [float("nan") if (t := b.metric(Metric.TFLOPS)) is None else t for b in sel]
                (line,) = ax.plot([kernel(b).seq for b in sel], tflops,
                                  "-o" if impl.startswith("flash_triton") else "--s", ms=3, color=IMPL_COLORS[impl],
                                  label=IMPL_LABELS[impl])
                handles.setdefault(IMPL_LABELS[impl], line)
        ax.set_xscale("log", base=2)  # labelled at every other power of two: neighbours' labels overlap
        ax.xaxis.set_major_locator(FixedLocator(seqs[::2]))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(x) // 1024}K" if x >= 1024 else f"{int(x)}"))
        ax.set_yscale("log")
        ax.set(xlabel=WORDS.x, ylabel=WORDS.y, title=WORDS.label("panel", d=d))
    ax = fig.add_subplot(gs[nrow, :])  # the legend's own row keeps tight_layout clear of the axis labels
    ax.axis("off")
    legend = ax.legend(list(handles.values()), list(handles), loc="center", ncol=min(3, len(handles)), fontsize=8,
                       frameon=False)
    fig.suptitle(WORDS.title.format(dtype=dtype, batch=kernel(e2e[0]).batch))
    figures.save(fig, path)
    return [t.get_text() for t in legend.get_texts()]


@dataclass(frozen=True)
class FlashBenchmarkingPage:
    device: str = ""  # the device folder; "": no GPU device has rows
    batch: int = 0
    seqs: tuple[int, int] = (0, 0)  # the grid's shortest and longest sequence
    dims: tuple[int, ...] = ()
    dtypes: tuple[str, ...] = ()
    vs_naive: tuple[VsNaive, ...] = ()  # per dtype
    grid: tuple[SeqTable, ...] = ()
    ratios: tuple[SeqTable, ...] = ()
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
    sources: tuple[str, ...] = ()
    cells: int = 0  # the grid's cells with a row (every status)
    oom_cells: int = 0  # of them, those that ran out of memory ("OOM" in the CSV)
    short_seq = SHORT_SEQ  # the constants the words state
    band = DRIFT_BAND

    # the commits and the kernel versions (RunId.version) the cells' rows come from, oldest run first; undigested:
    # some run recorded no kernel digest (`versions` names it by its commit)
    commits = property(lambda self: tuple(dict.fromkeys(r.commit for r in self.runs.runs)))
    versions = property(lambda self: tuple(dict.fromkeys(r.version for r in self.runs.runs)))
    undigested = property(lambda self: any(r.kernels is None for r in self.runs.runs))
    unexplained = property(lambda self: any(x.why == "unexplained" for x in self.odd))

    @property
    def headline(self) -> Longest | None:  # bf16 at d 64 where it ran, else the first
        return next((x for x in self.longest if (x.k.dtype, x.k.d) == ("bf16", 64)), (self.longest or [None])[0])

    def changes(self, change: int) -> int:
        return sum(x.change == change for x in self.drift)

    @property
    def scores(self) -> dict[str, Scored]:  # rows without ours' longest-sequence row leave the problem unanswered
        return {PROBLEM: Scored.of(self.runs)} if self.headline or self.runs is None else {}


def _versions(ctx: Context, device: str, rows: list[Bench]) -> tuple[list[Bench], list[Bench]]:
    """Per dtype, the newest run with our kernel's rows and the previous saved run with them (a run of the other
    implementations alone compares nothing of ours): (the newest runs' rows, the previous runs')."""
    newest, prev = [], []
    history = [b for b in ctx.rows.history if b.problem == PROBLEM and b.run.device == device]
    for (dtype,), g in groups(rows, "dtype"):
        if now := of_newest_run(g, among=_of(g, "flash_triton")):
            first = min(b.run.datetime for b in now)
            older = [b for b in history if kernel(b).dtype == dtype and b.run.datetime < first]
            newest, prev = newest + now, prev + of_newest_run(older, among=_of(older, "flash_triton"))
    return newest, prev


def facts(ctx: Context) -> FlashBenchmarkingPage:
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        ks = [kernel(b) for b in rows]
        newest, prev = _versions(ctx, device, rows)
        png, rel = ctx.figure_file(f"flash_benchmarking-{device}.png")
        return FlashBenchmarkingPage(
            device=device, batch=ks[0].batch, seqs=(min(k.seq for k in ks), max(k.seq for k in ks)),
            dims=tuple(sorted({k.d for k in ks})), dtypes=tuple(sorted({k.dtype for k in ks})), vs_naive=vs_naive(rows),
            grid=tuple(grid(rows)), ratios=tuple(ratio_tables(rows)),
            longest=tuple(longest(rows)), timers=timers(rows), autotune=rows[0].details.get("autotune"),
            left_out=rows[0].details.get("left_out", "–"), grid_link=_grid_csv(ctx, device, rows),
            figure=rel if plot(rows, png) else None, runs=RunsFacts.of(device, rows),
            reach_dims=tuple(sorted({k.d for k in ks if k.mode == "fwd_bwd"})), reach=tuple(reach(rows)),
            odd=tuple(odd(rows)), newest=RunsFacts.of(device, newest),
            previous=RunsFacts.of(device, prev) if prev else None, drift=tuple(drift(newest, prev)),
            not_run=not_run(rows), sources=files_of(rows + prev), cells=len(rows),
            oom_cells=sum(status_label(b) == "OOM" for b in rows))
    return FlashBenchmarkingPage()
