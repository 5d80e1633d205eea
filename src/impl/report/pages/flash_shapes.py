"""flash_shapes: ours (eager and under torch.compile) on the attention shapes real models use, against
the faster SDPA backend of the same run, and what one call costs the host at a tiny shape (the rows
with config host=True). The first GPU device with rows answers. templates/flash_shapes.md.j2 holds
every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Status
from impl.report import figures
from impl.report.flash_rows import (IMPL_COLORS, IMPL_LABELS, MODE_LABELS, Kernel, best_anchor, groups, kernel,
                                    median_ms, newest_date, not_run, ran, status_label, timers)
from impl.report.output import figure_path, write_table_csv
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import med
from impl.report.rows import Bench, of_newest_run
from impl.report.runs import RunsFacts
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_SHAPES,)
PROBLEM = P.FLASH_SHAPES
OURS = ("flash_triton", "flash_triton_compiled")  # eager, compiled
#: The CSV grid's columns (a data file beside the page).
GRID_COLUMNS = ["dtype", "d", "causal", "batch×heads×seq", "pass", "ours eager (ms)", "ours compiled (ms)",
                "faster anchor (ms)", "eager / anchor", "compiled / anchor"]


@dataclass(frozen=True)
class GridRow:
    """One shape and pass: ours eager and compiled, and the faster anchor of the same run."""

    k: Kernel
    eager: Bench | None
    compiled: Bench | None
    anchor: Bench | None

    def over(self, b: Bench | None) -> float | None:
        """Ours ÷ the faster anchor, as the grid prints it (two decimals)."""
        if b is None or self.anchor is None or not ran(b):
            return None
        return round(b.stats.median / self.anchor.stats.median, 2)

    def cells(self) -> list:
        def cell(b):
            return "–" if b is None else (status_label(b) or f"{median_ms(b):.3f}")

        def ratio(b):
            return "–" if self.over(b) is None else f"{self.over(b):.2f}×"
        a = self.anchor
        k = self.k
        return [k.dtype, k.d, "yes" if k.causal else "no", f"{k.batch}×{k.heads}×{k.seq}", MODE_LABELS[k.mode],
                cell(self.eager), cell(self.compiled),
                "–" if a is None else f"{median_ms(a):.3f} ({IMPL_LABELS[kernel(a).impl].replace('SDPA ', '')})",
                ratio(self.eager), ratio(self.compiled)]


def grid(rows: list[Bench]) -> list[GridRow]:
    """Per shape and pass, dtype first, then d descending, causal first, then sequence and pass."""
    order = {m: i for i, m in enumerate(MODE_LABELS)}
    out = []
    for key, g in groups(rows, "dtype", "d", "causal", "batch", "heads", "seq", "mode"):
        by = {kernel(b).impl: b for b in g}
        out.append(GridRow(kernel(g[0]), by.get(OURS[0]), by.get(OURS[1]), best_anchor(g)))
    return sorted(out, key=lambda r: (r.k.dtype, -r.k.d, not r.k.causal, r.k.seq, order[r.k.mode]))


@dataclass(frozen=True)
class Summary:
    """One (dtype, d, causal, pass): ours' rows measured and left out, and ours ÷ the faster anchor."""

    dtype: str
    d: int
    causal: bool
    mode: str  # MODE_LABELS'
    measured: int
    left_out: int
    eager: tuple[float, ...]  # per measured shape with an anchor
    compiled: tuple[float, ...]

    @property
    def eager_median(self) -> float | None:
        return med(self.eager)

    @property
    def compiled_median(self) -> float | None:
        return med(self.compiled)


def summary(rows: list[Bench]) -> list[Summary]:
    out = []
    for (dtype, d, causal, mode), g in groups(rows, "dtype", "d", "causal", "mode"):
        ratios: dict[str, list[float]] = {impl: [] for impl in OURS}
        measured = left = 0
        for _, shape in groups(g, "batch", "heads", "seq"):
            best = best_anchor(shape)
            for impl in OURS:
                r = next((b for b in shape if kernel(b).impl == impl), None)
                if r is None:
                    continue
                if ran(r):
                    measured += 1
                    if best is not None:
                        ratios[impl].append(r.stats.median / best.stats.median)
                else:
                    left += 1
        out.append(Summary(dtype, d, causal, MODE_LABELS[mode], measured, left, *(tuple(ratios[i]) for i in OURS)))
    return out


def _plot(rows: list[GridRow], path) -> bool:
    """Ours (eager, compiled) over the faster anchor per measured shape and pass; False: nothing to draw."""
    meas = [r for r in rows if r.over(r.eager) is not None]
    if not meas:
        return False
    labels = [f"{r.k.dtype} d{r.k.d} {'c' if r.k.causal else 'nc'} {r.k.batch}×{r.k.heads}×{r.k.seq} "
              f"{'fwd' if r.k.mode == 'fwd' else 'f+b'}" for r in meas]
    fig, ax = figures.new(figsize=(10, 4.8))
    x = range(len(meas))
    for impl, label, marker in ((OURS[0], "ours eager / faster anchor", "o"),
                                (OURS[1], "ours compiled / faster anchor", "s")):
        pts = [(i, r.over(getattr(r, "eager" if impl == OURS[0] else "compiled"))) for i, r in zip(x, meas)]
        pts = [p for p in pts if p[1] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=IMPL_COLORS[impl], label=label, ms=5)
    ax.axhline(1.0, color="0.4", lw=0.8, ls="--")  # ratios stay within one decade: linear axis
    ax.set_xticks(list(x), labels, rotation=60, ha="right", fontsize=6)
    ax.set(ylabel="time / faster SDPA anchor (< 1: ours faster)", title="flash_shapes: measured shapes")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figures.save(fig, path)
    return True


# ---- the host-cost rows ------------------------------------------------------------------------------

@dataclass(frozen=True)
class HostCall:
    impl: str
    mean_us: float
    stddev_us: float
    rounds: int


@dataclass(frozen=True)
class HostCostFacts:
    """The host-cost rows of one run: host time per fwd+bwd call at a tiny shape, where the device work
    is nothing (HostTimer: one call a round, no synchronisation)."""

    k: Kernel  # the shape
    calls: dict[str, HostCall]  # by impl, in row order
    runs: RunsFacts  # every host-cost row's runs

    def _ratio(self, ours: str, anchor: str) -> float | None:
        a, b = self.calls.get(ours), self.calls.get(anchor)
        return a.mean_us / b.mean_us if a and b else None

    @property
    def anchor(self) -> str | None:
        """The SDPA backend with the lower host cost."""
        sdpa = [c for c in self.calls.values() if c.impl.startswith("sdpa")]
        return min(sdpa, key=lambda c: c.mean_us).impl if sdpa else None

    @property
    def eager_vs_anchor(self) -> float | None:
        return self._ratio(OURS[0], self.anchor) if self.anchor else None

    @property
    def compiled_vs_eager(self) -> float | None:
        return self._ratio(OURS[1], OURS[0])


def host_cost_facts(device: str, rows: list[Bench]) -> HostCostFacts | None:
    """The newest run's measured host-cost rows, or None where no run has them."""
    host = [b for b in rows if kernel(b).host]
    newest = of_newest_run([b for b in host if b.measured])
    if not newest:
        return None
    calls = {kernel(b).impl: HostCall(kernel(b).impl, b.stats.mean * 1e6, (b.stats.stddev or 0) * 1e6,
                                      int(b.stats.rounds or 0)) for b in newest}
    return HostCostFacts(kernel(newest[0]), calls, RunsFacts.of(device, host))


# ---- the page ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FlashShapesPage:
    device: str = ""  # the device folder; "": no GPU device has rows
    gpu: str = ""  # its GPU's name
    date: str = "–"
    measured: int = 0  # rows measured (every implementation)
    budget: int = 0  # rows left out by the file's time budget
    budget_reason: str | None = None
    ratios: tuple[float, ...] = ()  # ours eager ÷ the faster anchor per measured shape-pass, ascending
    timers: tuple[str, ...] = ()
    runs: RunsFacts | None = None
    summary: tuple[Summary, ...] = ()
    grid_link: str = ""
    figure: str | None = None
    not_run: tuple[tuple[str, str], ...] = ()  # (status, reason), each once
    host: HostCostFacts | None = None
    files: tuple[str, ...] = ()
    index_figures: tuple = ()

    @property
    def median(self) -> float | None:
        return med(self.ratios)

    @property
    def scores(self) -> dict[str, Scored]:
        if not self.device:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        # no shape with both ours and an anchor: the problem stays unanswered in the index
        return {PROBLEM: Scored(Kind.MEASURED, self.gpu, self.date)} if self.ratios else {}

    @property
    def sources(self) -> list[str]:
        return list(self.files)


def facts(ctx: Context) -> FlashShapesPage:
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        fs = [b for b in rows if kernel(b).host is not True]  # the host-cost rows have a table of their own
        cells = grid(fs)
        cut = [b for b in fs if b.status is Status.LEFT_OUT_BY_BUDGET]
        link = write_table_csv(ctx.reports_dir, f"flash_shapes-{device}", GRID_COLUMNS, [r.cells() for r in cells])
        png, rel = figure_path(ctx.fig_dir, ctx.fig_rel, f"flash_shapes-{device}")
        return FlashShapesPage(
            device=device, gpu=fs[0].row.env.device, date=newest_date(fs), measured=sum(ran(b) for b in fs),
            budget=len(cut), budget_reason=cut[0].row.reason if cut else None,
            ratios=tuple(sorted(r.over(r.eager) for r in cells if r.over(r.eager) is not None)),
            timers=tuple(timers(fs)), runs=RunsFacts.of(device, fs), summary=tuple(summary(fs)), grid_link=link,
            figure=rel if _plot(cells, png) else None, not_run=tuple(not_run(fs)),
            host=host_cost_facts(device, rows), files=tuple(sorted({b.run.file for b in rows if b.run.file})))
    return FlashShapesPage()
