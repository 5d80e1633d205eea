"""distributed_communication_single_node: all-reduce time and bandwidth per backend, process count and size.
The answer reads one run (the one with the most NCCL process counts); every GPU device's rows follow."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.report import figures
from impl.report.markdown import missing
from impl.report.pages import Context, Scored
from impl.report.rows import Bench, View, group, of_newest_run
from impl.report.runs import RunsFacts, SourcedFromSections, device_name, files_of
from impl.workloads.problems import Problem as P

PROBLEMS = (P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE,)
PROBLEM = P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE
SLUG = "distributed_communication"
WORDS = figures.words("all_reduce")  # the words drawn into the bus-bandwidth figure


@dataclass(frozen=True)
class AllReduceConfig(View):
    backend: str = ""
    world_size: int = 0
    bytes: int = 0
    kind: str | None = None  # older files also held "fit" rows

    @property
    def key(self) -> tuple[str, int]:
        return self.backend, int(self.world_size)


_cfg = AllReduceConfig.of


def per_op(b: Bench) -> float | None:
    """Seconds per all-reduce: the median (a call is one all-reduce); the older format kept time_s."""
    return b.figure("time_s") or (b.stats.median if b.stats else None)


def comm_rows(rows: list[Bench]) -> list[Bench]:
    return [b for b in rows if _cfg(b).kind != "fit"]


@dataclass(frozen=True)
class Fit:  # t = o + S/w of one (backend, processes)
    backend: str
    processes: int
    o_s: float
    w_bps: float


def allreduce_fits(rows: list[Bench]) -> list[Fit]:
    """t = o + S/w per (backend, processes) by relative least squares (the absolute fit's intercept goes negative)."""
    timed = group((b for b in comm_rows(rows) if b.status is Status.MEASURED and not missing(per_op(b))),
                  lambda b: _cfg(b).key)
    return [Fit(*k, *acc.fit_latency_bandwidth([_cfg(b).bytes for b in g], list(map(per_op, g)), relative=True))
            for k, g in sorted(timed.items()) if len({_cfg(b).bytes for b in g}) >= 2]


@dataclass(frozen=True)
class TableRow:  # a row of a device's table and of the answer: the stored row and its config
    b: Bench
    c: AllReduceConfig

    of = classmethod(lambda cls, b: cls(b, _cfg(b)))
    seconds = property(lambda self: per_op(self.b) if self.b.status is Status.MEASURED else None)
    algbw_gbps = property(lambda self: self.b.figure("algbw_GBps", Metric.ALG_BW))
    busbw_gbps = property(lambda self: self.b.figure("busbw_GBps", Metric.BUS_BW))
    iterations = property(  # per round (older files: details["inner"])
        lambda self: self.b.row.timing.iterations if self.b.row.timing else self.b.details.get("inner"))


@dataclass(frozen=True)
class CommFacts:  # the answer: one run of one device, at the largest size NCCL ran
    device: str  # named as headings name it
    runs: RunsFacts  # the device's
    nccl_by_procs: list[TableRow]  # every NCCL process count at that size, the most (the answer's) last
    gloo_by_procs: list[TableRow]  # every Gloo process count at that size
    smallest: TableRow | None  # NCCL at the most processes at the smallest size it ran; None: that is the same
    not_run: int
    reasons: tuple[tuple, ...]  # why configurations did not run: (backend, processes, status, reason), each once
    files: tuple[str, ...]
    when: str  # the run, UTC

    nccl = property(lambda self: self.nccl_by_procs[-1])
    nccl_procs = property(lambda self: self.nccl.c.key[1])
    size_bytes = property(lambda self: int(self.nccl.c.bytes))
    # Gloo at the same size and process count
    gloo_same = property(lambda self: next((g for g in self.gloo_by_procs if g.c.key[1] == self.nccl_procs), None))

    @property
    def gloo_over_nccl(self) -> float | None:
        return None if self.gloo_same is None else self.gloo_same.seconds / self.nccl.seconds

    def algbw_gbps(self, p: TableRow) -> float:  # bytes / time at the headline size (GB = 1e9 bytes)
        return self.size_bytes / p.seconds / 1e9


@dataclass(frozen=True)
class DeviceSection:
    heading: str  # "2× NVIDIA H200 (h200-141gb-x2)"
    rows: list[TableRow]
    left_out: list[str]
    figure: str | None  # the bus-bandwidth figure's link
    fits: list[Fit]
    runs: RunsFacts


def _run_facts(s: DeviceSection, rows: list[Bench]) -> CommFacts | None:
    """The device's newest all-reduce run (of its non-fit `rows`); None unless both backends ran."""
    run = of_newest_run(rows)
    points: dict[tuple[str, int], dict[int, TableRow]] = {}  # the measured rows by (backend, processes), bytes
    for r in (TableRow.of(b) for b in run if b.measured):
        if not missing(r.busbw_gbps):
            points.setdefault(r.c.key, {})[int(r.c.bytes)] = r
    nccl = max((k for k in points if k[0] == "nccl"), default=None)
    if not (nccl and any(k[0] == "gloo" for k in points)):
        return None
    big, small = max(points[nccl]), min(points[nccl])
    at = [(backend, by[big]) for (backend, _), by in sorted(points.items()) if big in by]
    not_run = [b for b in run if b.status is not Status.MEASURED]
    reasons = dict.fromkeys((*_cfg(b).key, b.status.value, b.row.reason) for b in not_run)
    return CommFacts(s.heading, s.runs, [r for k, r in at if k == "nccl"], [r for k, r in at if k == "gloo"],
                     points[nccl][small] if small != big else None, len(not_run), tuple(reasons),
                     files_of(run), run[0].run.when)


def _draw(rows: list[TableRow], ctx: Context, name: str) -> str | None:
    """The bus bandwidth per size, a line per (backend, processes); its link, None without points."""
    pts = sorted((*r.c.key, r.c.bytes, r.busbw_gbps) for r in rows
                 if r.b.status is Status.MEASURED and not missing(r.busbw_gbps))
    if not pts:
        return None
    fig, ax = figures.new()
    for (backend, n), g in group(pts, lambda p: p[:2]).items():
        ax.plot([p[2] / 2**20 for p in g], [p[3] for p in g], marker="o", ls="-" if backend == "nccl" else "--",
                label=WORDS.label("series", backend=backend, n=n))
    ax.set(xscale="log", yscale="log", xlabel=WORDS.x, ylabel=WORDS.y, title=WORDS.title)
    ax.legend(fontsize=8)
    return ctx.figure(fig, name)


@dataclass(frozen=True)
class CommPage(SourcedFromSections):  # its sources: its sections' run files
    answer: CommFacts | None  # None: no GPU device ran both backends
    history: list[CommFacts]  # the other devices' runs, kept below
    sections: list[DeviceSection]

    @property
    def scores(self) -> dict[str, Scored]:
        return {PROBLEM: Scored.of(self.answer and self.answer.runs)}


def facts(ctx: Context) -> CommPage:
    sections, found = [], []
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        comm = comm_rows(rows)
        table = sorted(map(TableRow.of, comm), key=lambda r: (r.c.backend, r.c.world_size, r.c.bytes))
        s = DeviceSection(device_name(device, rows), table,
                          sorted({b.details["left_out"] for b in comm if b.details.get("left_out")}),
                          _draw(table, ctx, f"{SLUG}-{device}_allreduce_busbw.png"), allreduce_fits(rows),
                          RunsFacts.of(device, rows))
        sections.append(s)
        if f := _run_facts(s, comm):
            found.append(f)
    # the run that measured the most NCCL process counts answers (the newest on a tie)
    answer = max(found, key=lambda f: (len(f.nccl_by_procs), f.nccl_procs, f.when), default=None)
    return CommPage(answer, [o for o in found if o is not answer], sections)
