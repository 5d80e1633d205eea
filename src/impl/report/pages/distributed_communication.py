"""distributed_communication_single_node: all-reduce time and bus bandwidth per backend, process count
and size. The answer reads one run of one device (the run that measured the most NCCL process counts;
a ratio between backends divides rows of that run); every GPU device's rows follow as a table, a
figure and the latency-bandwidth fit. templates/distributed_communication.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.report import figures
from impl.report.markdown import missing
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, view
from impl.report.runs import RunsFacts, device_name
from impl.workloads.problems import Problem as P

PROBLEMS = (P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE,)
PROBLEM = P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE
SLUG = "distributed_communication"
FIGURE_WORDS = dict(x="buffer size (MB)", y="bus bandwidth (GB/s)")  # the figure's axes (its title is the page's)


@dataclass(frozen=True)
class AllReduceConfig:
    backend: str = ""
    world_size: int = 0
    bytes: int = 0
    kind: str | None = None  # older files also held "fit" rows


def _cfg(b: Bench) -> AllReduceConfig:
    return view(AllReduceConfig, b)


def per_op(b: Bench) -> float | None:
    """Seconds per all-reduce: the median (the rows are kernel-level: the stats are one all-reduce);
    the older format kept it as time_s."""
    return b.figure("time_s") or (b.stats.median if b.stats else None)


def comm_rows(rows: list[Bench]) -> list[Bench]:
    return [b for b in rows if _cfg(b).kind != "fit"]


@dataclass(frozen=True)
class Fit:
    """t = o + S/w of one (backend, processes)."""

    backend: str
    processes: int
    o_s: float
    w_bps: float


def allreduce_fits(rows: list[Bench]) -> list[Fit]:
    """t = o + S/w over each (backend, processes) run's measured sizes, by relative least squares
    (impl.accounting.fit_latency_bandwidth, relative=True: the absolute fit is a line through the
    1 GB point alone and its intercept went negative for gloo at 4 and 6 processes). Sorted by key."""
    points: dict[tuple[str, int], list] = {}
    for b in comm_rows(rows):
        c = _cfg(b)
        if b.status is Status.MEASURED and not missing(per_op(b)):
            points.setdefault((c.backend, int(c.world_size)), []).append((c.bytes, per_op(b)))
    out = []
    for (backend, n), pts in sorted(points.items()):
        if len({s for s, _ in pts}) >= 2:
            sizes, times = zip(*pts)
            o, w = acc.fit_latency_bandwidth(sizes, times, relative=True)
            out.append(Fit(backend, n, o, w))
    return out


# ---- the answer: one run of one device -----------------------------------------------------------

@dataclass(frozen=True)
class Point:
    busbw_gbps: float
    seconds: float  # per all-reduce


@dataclass(frozen=True)
class CommFacts:
    device: str  # named as headings name it
    size_bytes: int  # the largest size NCCL ran
    nccl_procs: int  # the most NCCL processes measured
    nccl: Point  # at that size and process count
    gloo_same: Point | None  # Gloo at the same size and process count
    gloo_by_procs: list[tuple[int, float]]  # (processes, bus bandwidth GB/s) at that size
    not_run: int
    nccl_by_procs: list[tuple[int, Point]] = ()  # every NCCL process count at that size
    smallest: tuple[int, Point] | None = None  # (bytes, NCCL at nccl_procs) at the smallest size it ran
    reasons: tuple[str, ...] = ()  # why configurations did not run ("nccl, 6 processes: ...")
    files: tuple[str, ...] = ()  # the run files read
    when: str = "–"  # the run, UTC

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 2**20

    @property
    def gloo_over_nccl(self) -> float | None:
        return None if self.gloo_same is None else self.gloo_same.seconds / self.nccl.seconds

    def algbw_gbps(self, p: Point) -> float:
        """Algorithm bandwidth at the headline size: bytes / time (GB = 1e9 bytes)."""
        return self.size_bytes / p.seconds / 1e9


def comm_facts(device: str, points: dict[tuple[str, int], dict[int, tuple[float, float]]], not_run: int,
               reasons: tuple[str, ...] = (), files: tuple[str, ...] = (), when: str = "–") -> CommFacts | None:
    """points: (backend, processes) -> {bytes: (bus bandwidth GB/s, seconds)} of one run; None unless both
    backends ran."""
    nccl = max((k for k in points if k[0] == "nccl"), default=None)
    gloo = [k for k in sorted(points) if k[0] == "gloo"]
    if not (nccl and gloo):
        return None
    big = max(points[nccl])
    same = points.get(("gloo", nccl[1]), {}).get(big)
    by_procs = [(k[1], Point(*points[k][big])) for k in sorted(points) if k[0] == "nccl" and big in points[k]]
    small = min(points[nccl])
    return CommFacts(device, big, nccl[1], Point(*points[nccl][big]), Point(*same) if same else None,
                     [(k[1], points[k][big][0]) for k in gloo if big in points[k]], not_run, by_procs,
                     (small, Point(*points[nccl][small])) if small != big else None, tuple(reasons), tuple(files),
                     when)


def _run_facts(device: str, rows: list[Bench]) -> CommFacts | None:
    """The facts of the device's newest all-reduce run."""
    rows = comm_rows(rows)
    if not rows:
        return None
    newest = max(str(b.run.datetime) for b in rows)
    run = [b for b in rows if str(b.run.datetime) == newest]
    points: dict = {}
    for b in run:
        bw = b.figure("busbw_GBps", Metric.BUS_BW)
        if b.measured and not missing(bw):
            c = _cfg(b)
            points.setdefault((c.backend, int(c.world_size)), {})[int(c.bytes)] = (bw, per_op(b))
    not_run = [b for b in run if b.status is not Status.MEASURED]
    reasons = tuple(dict.fromkeys(f"{_cfg(b).backend}, {int(_cfg(b).world_size)} processes: {b.status.value} "
                                  f"({b.row.reason})" for b in not_run))
    return comm_facts(device, points, len(not_run), reasons, tuple(sorted({b.run.file for b in run})),
                      run[0].run.when)


# ---- each device's section ----------------------------------------------------------------------

@dataclass(frozen=True)
class TableRow:
    backend: str
    processes: int
    bytes: int
    not_run: str | None  # "unsupported: ..." where the configuration did not run
    seconds: float | None = None  # per all-reduce
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    iterations: int | None = None  # per round


@dataclass(frozen=True)
class DeviceSection:
    heading: str  # "2× NVIDIA H200 (h200-141gb-x2)"
    rows: list[TableRow]
    left_out: list[str]
    figure: str | None  # the bus-bandwidth figure's link
    fits: list[Fit]
    runs: RunsFacts


def _table_row(b: Bench) -> TableRow:
    c = _cfg(b)
    head = (c.backend, int(c.world_size), c.bytes)
    if b.status is not Status.MEASURED:
        return TableRow(*head, f"{b.status.value}: {b.row.reason}")
    timing = b.row.timing
    return TableRow(*head, None, per_op(b), b.figure("algbw_GBps", Metric.ALG_BW), b.figure("busbw_GBps", Metric.BUS_BW),
                    timing.iterations if timing else b.details.get("inner"))


def _draw(rows: list[TableRow], title: str, ctx: Context, name: str) -> str | None:
    """The bus bandwidth per size, a line per (backend, processes); its link, None without points."""
    series: dict[tuple[str, int], list] = {}
    for r in rows:
        if r.not_run is None and not missing(r.busbw_gbps):
            series.setdefault((r.backend, r.processes), []).append((r.bytes, r.busbw_gbps))
    if not series:
        return None
    fig, ax = figures.new()
    for (backend, n), pts in sorted(series.items()):
        xs, ys = zip(*sorted(pts))
        ax.plot([x / 2**20 for x in xs], ys, marker="o", ls="-" if backend == "nccl" else "--",
                label=f"{backend}, {n} processes")
    ax.set(xscale="log", yscale="log", xlabel=FIGURE_WORDS["x"], ylabel=FIGURE_WORDS["y"], title=title)
    ax.legend(fontsize=8)
    figures.save(fig, ctx.fig_dir / name)
    return f"{ctx.fig_rel}/{name}"


def _section(device: str, rows: list[Bench], ctx: Context) -> DeviceSection:
    ordered = sorted(comm_rows(rows), key=lambda b: (_cfg(b).backend, _cfg(b).world_size, _cfg(b).bytes))
    table = [_table_row(b) for b in ordered]
    left_out = sorted({b.details["left_out"] for b in ordered if b.details.get("left_out")})
    return DeviceSection(device_name(device, rows[0].row.env.device), table, left_out,
                         _draw(table, "all-reduce bus bandwidth", ctx, f"{SLUG}-{device}_allreduce_busbw.png"),
                         allreduce_fits(rows), RunsFacts.of(device, rows))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommPage:
    answer: CommFacts | None  # None: no GPU device ran both backends
    history: list[CommFacts]  # the other devices' runs, kept below
    sections: list[DeviceSection]
    score_device: str = "–"
    score_date: str = "–"
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        if self.answer is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        return {PROBLEM: Scored(Kind.MEASURED, self.score_device, self.score_date)}

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.runs.files})


def facts(ctx: Context) -> CommPage:
    found, sections = [], []
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        sections.append(_section(device, rows, ctx))
        f = _run_facts(sections[-1].heading, rows)
        if f:
            found.append((device, rows, f))
    if not found:
        return CommPage(None, [], sections)
    # the run that measured the most NCCL process counts answers (the newest on a tie)
    device, rows, f = max(found, key=lambda x: (len(x[2].nccl_by_procs), x[2].nccl_procs, x[2].when))
    return CommPage(f, [o for _, _, o in found if o is not f], sections, device,
                    max(str(b.run.datetime) for b in rows)[:10])
