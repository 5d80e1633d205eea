"""flash_shapes: ours (eager, under torch.compile, and through the kernel table: flash_auto) on the attention shapes
real models use, against the faster SDPA backend of the same run and against each backend, and one call's host cost at
a tiny shape (rows with host=True). The first GPU answers."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Status
from impl.report import figures
from impl.report.flash_rows import (IMPL_COLORS, IMPL_LABELS, MODE_LABELS, Kernel, best_anchor, groups, host_bound,
                                    kernel, median_ms, not_run, ran, status_label, timers)
from impl.report.pages import Context, Scored
from impl.report.ratio import med, of_benches
from impl.report.rows import Bench, group, of_newest_run
from impl.report.runs import RunsFacts, files_of
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_SHAPES,)
PROBLEM = P.FLASH_SHAPES
OURS = ("flash_triton", "flash_triton_compiled", "flash_auto")  # eager, compiled, through the kernel table
SIDES = ("eager", "compiled", "auto")  # the GridRow fields that hold OURS' rows
ANCHORS = ("sdpa_cudnn", "sdpa_flash")  # the GridRow fields cudnn, flash (the impl less its "sdpa_")
# what a ratio divides by ("anchor": the faster of ANCHORS at the shape) and the CSV grid's name of each side and base
NAMES = {"eager": "eager", "compiled": "compiled", "auto": "kernel table", "anchor": "anchor", "sdpa_cudnn": "cuDNN",
         "sdpa_flash": "flash"}
PER_BACKEND = tuple((side, base) for side in ("eager", "auto") for base in ANCHORS)  # ours ÷ each backend's columns
WORDS, GRID = figures.words("flash_shapes"), figures.words("flash_shapes_grid")  # the figure's, the CSV grid's words
GRID_COLUMNS = ["dtype", "d", "causal", "batch×heads×seq", "pass",
                *(GRID.labels[k] for k in ("eager", "compiled", "anchor", "eager_ratio", "compiled_ratio")),
                GRID.label("ours", what=NAMES["auto"]), *(GRID.label("sdpa", what=NAMES[b]) for b in ANCHORS),
                *(GRID.label("ratio", side=NAMES[side], base=NAMES[b]) for side, b in PER_BACKEND)]


def _ms(b: Bench) -> str:  # a measured row's median, marked where it times the host's launch path
    return f"{median_ms(b):.3f}" + (" (host)" if host_bound(b) else "")


@dataclass(frozen=True)
class GridRow:  # one shape and pass: ours eager, compiled and through the kernel table, both anchors, the faster one
    k: Kernel
    eager: Bench | None
    compiled: Bench | None
    auto: Bench | None
    cudnn: Bench | None
    flash: Bench | None
    anchor: Bench | None

    def ratio(self, side: str, base: str = "anchor") -> float | None:  # ours (a SIDES field) ÷ anchor or a backend
        b, a = getattr(self, side), self.anchor if base == "anchor" else getattr(self, base.removeprefix("sdpa_"))
        r = of_benches(b, a) if b is not None and a is not None and ran(b) and ran(a) else None
        return None if r is None else r.value

    def over(self, side: str, base: str = "anchor") -> float | None:  # two decimals, as the grid prints it
        return None if (x := self.ratio(side, base)) is None else round(x, 2)

    def cells(self) -> list:
        k, a = self.k, self.anchor
        ms = lambda b: "–" if b is None else status_label(b) or _ms(b)  # noqa: E731
        x = lambda side, base="anchor": "–" if (v := self.over(side, base)) is None else f"{v:.2f}×"  # noqa: E731
        return [k.dtype, k.d, "yes" if k.causal else "no", f"{k.batch}×{k.heads}×{k.seq}", MODE_LABELS[k.mode],
                ms(self.eager), ms(self.compiled),
                "–" if a is None else f"{median_ms(a):.3f} ({IMPL_LABELS[kernel(a).impl].replace('SDPA ', '')})",
                x("eager"), x("compiled"), ms(self.auto), ms(self.cudnn), ms(self.flash),
                *(x(side, base) for side, base in PER_BACKEND)]


def grid(rows: list[Bench]) -> list[GridRow]:  # dtype, then d descending, causal first, sequence and pass
    out = [GridRow(kernel(g[0]), *map({kernel(b).impl: b for b in g}.get, OURS + ANCHORS), best_anchor(g))
           for _, g in groups(rows, "dtype", "d", "causal", "batch", "heads", "seq", "mode")]
    return sorted(out, key=lambda r: (r.k.dtype, -r.k.d, not r.k.causal, r.k.seq, list(MODE_LABELS).index(r.k.mode)))


@dataclass(frozen=True)
class Summary:  # one (dtype, d, causal, pass): ours' rows measured and left out, ours ÷ the anchor and each backend
    dtype: str
    d: int
    causal: bool
    mode: str  # MODE_LABELS'
    measured: int
    left_out: int
    cells: tuple[GridRow, ...]  # the group's shapes

    def of(self, side: str, base: str = "anchor") -> tuple[float, ...]:  # per measured shape with that base
        return tuple(x for r in self.cells if (x := r.ratio(side, base)) is not None)

    def median(self, side: str, base: str = "anchor") -> float | None:  # of one side's ratios to one base
        return med(self.of(side, base))


def summary(cells: list[GridRow]) -> list[Summary]:  # the grid's rows by (dtype, d, causal, pass)
    out = []
    for (dtype, d, causal, mode), g in sorted(group(cells, lambda r: (r.k.dtype, r.k.d, r.k.causal, r.k.mode)).items(),
                                              key=lambda kv: kv[0]):
        ours = [b for r in g for b in (getattr(r, side) for side in SIDES) if b is not None]
        out.append(Summary(dtype, d, causal, MODE_LABELS[mode], sum(map(ran, ours)), sum(not ran(b) for b in ours),
                           tuple(g)))
    return out


def _plot(rows: list[GridRow], ctx: Context, name: str) -> str | None:  # ours ÷ the faster anchor per measured shape
    meas = [r for r in rows if r.over("eager") is not None]
    if not meas:
        return None
    fig, ax = figures.new(figsize=(10, 4.8))
    for side, impl, marker in zip(SIDES, OURS, "os^"):
        if pts := [(i, x) for i, r in enumerate(meas) if (x := r.over(side)) is not None]:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, color=IMPL_COLORS[impl], ms=5,
                    label=WORDS.label("series", side=NAMES[side]))
    ax.axhline(1.0, color="0.4", lw=0.8, ls="--")  # ratios stay within one decade: linear axis
    ax.set_xticks(list(range(len(meas))), [f"{r.k.dtype} d{r.k.d} {'c' if r.k.causal else 'nc'} {r.k.batch}×{r.k.heads}"
                                           f"×{r.k.seq} {'fwd' if r.k.mode == 'fwd' else 'f+b'}" for r in meas],
                  rotation=60, ha="right", fontsize=6)
    ax.set(ylabel=WORDS.y, title=WORDS.title)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return ctx.figure(fig, name)


@dataclass(frozen=True)
class HostCost:  # host time per fwd+bwd call of one run at a tiny shape (HostTimer: one call a round, no sync)
    calls: dict[str, Bench]  # the newest run's measured rows by impl, in row order (their mean ± std)
    runs: RunsFacts  # every host-cost row's runs

    k = property(lambda self: kernel(next(iter(self.calls.values()))))  # the shape

    @property
    def anchor(self) -> str | None:  # the SDPA backend with the lower host cost
        return min((i for i in self.calls if i.startswith("sdpa")), key=lambda i: self.calls[i].stats.mean,
                   default=None)

    def over(self, impl: str, base: str | None) -> float | None:  # impl's mean host time ÷ base's
        a, b = self.calls.get(impl), self.calls.get(base)
        return a.stats.mean / b.stats.mean if a and b else None


def host_cost(device: str, rows: list[Bench]) -> HostCost | None:  # the newest run's measured ones
    host = [b for b in rows if kernel(b).host]
    newest = of_newest_run([b for b in host if b.measured])
    return HostCost({kernel(b).impl: b for b in newest}, RunsFacts.of(device, host)) if newest else None


@dataclass(frozen=True)
class FlashShapesPage:
    device: str = ""  # the device folder; "": no GPU device has rows
    gpu: str = ""  # its GPU's name
    measured: int = 0  # rows measured (every implementation)
    budget: int = 0  # rows left out by the file's time budget
    budget_reason: str | None = None
    timers: tuple[str, ...] = ()
    runs: RunsFacts | None = None
    summary: tuple[Summary, ...] = ()
    cells: tuple[GridRow, ...] = ()  # every shape and pass (the CSV grid's rows)
    grid_link: str = ""
    figure: str | None = None
    not_run: tuple[tuple[str, str], ...] = ()  # (status, reason), each once
    host: HostCost | None = None
    sources: tuple[str, ...] = ()

    host_bound_rows: int = 0  # measured rows that are host-bound (flash_rows.host_bound), "(host)" in the grid
    median = property(lambda self: med(self.ratios))  # of ours eager ÷ the faster anchor
    ratios = property(lambda self: self.over("eager"))  # ours eager ÷ the faster anchor per measured shape-pass
    auto = property(lambda self: any(r.auto is not None for r in self.cells))  # rows of flash_auto (any status)

    def over(self, side: str, base: str = "anchor") -> tuple[float, ...]:  # per measured shape-pass, ascending
        return tuple(sorted(x for r in self.cells if (x := r.over(side, base)) is not None))

    def median_of(self, side: str, base: str = "anchor") -> float | None:
        return med(self.over(side, base))

    @property
    def scores(self) -> dict[str, Scored]:  # rows without a shape of both ours and an anchor leave it unanswered
        return {PROBLEM: Scored.of(self.runs, self.gpu)} if self.ratios or self.runs is None else {}


def facts(ctx: Context) -> FlashShapesPage:
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        fs = [b for b in rows if kernel(b).host is not True]  # the host-cost rows have a table of their own
        cells, cut = grid(fs), [b for b in fs if b.status is Status.LEFT_OUT_BY_BUDGET]
        return FlashShapesPage(
            device=device, gpu=fs[0].row.env.device, measured=sum(ran(b) for b in fs),
            budget=len(cut), budget_reason=cut[0].row.reason if cut else None,
            timers=timers(fs), runs=RunsFacts.of(device, fs), summary=tuple(summary(cells)), cells=tuple(cells),
            grid_link=ctx.table_csv(f"flash_shapes-{device}", GRID_COLUMNS, [r.cells() for r in cells]),
            figure=_plot(cells, ctx, f"flash_shapes-{device}.png"), not_run=not_run(fs), host=host_cost(device, rows),
            sources=files_of(rows), host_bound_rows=sum(host_bound(b) for b in fs))
    return FlashShapesPage()
