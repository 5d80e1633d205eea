"""naive_ddp … ddp_bucketed_benchmarking: per device and [edition, size] run (every ratio divides rows of one run),
our DDP variants' step against the single-GPU floor and torch DDP, the bucket model against the measured buckets and
a profiled step's timeline (ddp (b) also from Nsight Systems); the implementation problems are answered by the newest
correctness record of a multi-GPU device (impl.bench.test_record), failures included."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from impl import accounting as acc
from impl.bench.test_record import TESTS_FOLDER, TestRecord, load_records
from impl.report import figures
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages._nsys import Profiled, StepTimeline
from impl.report.pages.distributed_communication import PROBLEM as ALLREDUCE, Fit, allreduce_fits
from impl.report.ratio import Ratio, within_noise
from impl.report.rows import Bench, DistConfig, DistRow, SizeRun, answering, current_edition, group, size_runs_of
from impl.report.runs import DeviceSection, RunsFacts, device_name, files_of, gpu_count
from impl.workloads.problems import Problem as P, StoredGroup
from impl.workloads.variants import DDPVariant

PROBLEMS = (P.NAIVE_DDP, P.NAIVE_DDP_BENCHMARKING, P.MINIMAL_DDP_FLAT_BENCHMARKING, P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS,
            P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING, P.DDP_OVERLAP_BUCKETED, P.DDP_BUCKETED_BENCHMARKING)
SLUG = "ddp"
ROWS = (StoredGroup.DDP_BENCHMARKING_ANCHORS, P.NAIVE_DDP_BENCHMARKING, P.MINIMAL_DDP_FLAT_BENCHMARKING,
        P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING, P.DDP_BUCKETED_BENCHMARKING)  # the stored problems read
# the implementation problems, answered by the correctness suite
IMPLEMENTED = (P.NAIVE_DDP, P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS, P.DDP_OVERLAP_BUCKETED)
# the correctness files that run DDP, FSDP, the sharded optimizer and TP over the device's process group
DISTRIBUTED_FILES = ("correctness/test_distributed.py", "correctness/test_fsdp.py",
                     "correctness/test_sharded_optimizer.py", "correctness/test_tensor_parallel.py")
Key = tuple[str, float | None]  # (variant, bucket MB of a bucketed row)
SINGLE, TORCH, NAIVE = ("single", None), ("torch_ddp", None), ("naive", None)
# each timed problem: the variant whose row answers it (the bucketed one: its fastest bucket)
STEPS: dict[str, Key] = {P.NAIVE_DDP_BENCHMARKING: NAIVE, P.MINIMAL_DDP_FLAT_BENCHMARKING: ("flat", None),
                         P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING: ("individual", None)}
OURS = ("naive", "flat", "individual", "bucketed")
ORDER = [v.value for v in DDPVariant]  # the tables' order
# the words drawn into the figures (templates/figures.toml)
TIMELINE_WORDS, OVERHEAD_WORDS = figures.words("ddp_timeline"), figures.words("ddp_overhead")


_cfg = DistConfig.of


@dataclass(frozen=True)
class Group:  # the rows of one (context, per-rank batch), in table order
    context: int
    batch: int
    variants: tuple[DistRow, ...]

    def get(self, k: Key) -> DistRow | None:
        return next((v for v in self.variants if v.key == tuple(k) and v.measured), None)

    def ratio(self, k: Key, ref: Key, name: str = "") -> Ratio | None:  # row k ÷ row ref
        return (a := self.get(k)) and (r := self.get(ref)) and a.vs(r, name)

    buckets = property(lambda self: {v.key[1]: v for v in self.variants if v.key[0] == "bucketed" and v.measured})
    best_bucket = property(lambda self: min(self.buckets, key=lambda mb: self.buckets[mb].step_s, default=None))
    best_ours = property(lambda self: min((v for v in self.variants if v.key[0] in OURS and v.measured),
                                          key=lambda v: v.step_s, default=None))

    def ties(self, mb: float) -> list[float]:  # the other buckets whose step's ± 1 std overlaps bucket `mb`'s
        b = self.buckets
        return [x for x in sorted(b) if x != mb
                and within_noise(b[x].step_s, b[mb].step_s, b[x].step_std, b[mb].step_std)]

    # the best of ours over the single-GPU floor
    gap_s = property(lambda self: None if self.best_ours is None or self.get(SINGLE) is None
                     else self.best_ours.step_s - self.get(SINGLE).step_s)


def _groups(rows: list[Bench]) -> list[Group]:
    """The rows by (context, per-rank batch), each one row per key (the last), in the tables' order."""
    by = group(rows, lambda b: (int(_cfg(b).context), int(_cfg(b).batch_per_rank)))
    order = lambda v: (ORDER.index(v.key[0]) if v.key[0] in ORDER else 99, v.key[1] or 0)  # noqa: E731
    return [Group(c, n, tuple(sorted({v.key: v for v in map(DistRow.of, g)}.values(), key=order)))
            for (c, n), g in sorted(by.items())]


@dataclass(frozen=True)
class BucketModel:
    """T(n_b) = n_b·o + s/(n_b·w) (impl.accounting) with o, w fitted to the same device's all-reduces, at the equal
    buckets it assumes and at those DDPBucketed formed, beside each context's measured buckets."""

    s_bytes: float  # fp32 gradient bytes
    fit: Fit | None  # None: no all-reduce fit of that backend and process count
    groups: tuple[Group, ...]  # the contexts that ran bucketed rows

    big = property(lambda self: self.s_bytes >= 2**30)  # GB for the real model sizes, MB for the smoke model
    best_mb = property(lambda self: acc.optimal_bucket_bytes(self.s_bytes, self.fit.o_s, self.fit.w_bps) / 2**20)
    n_b = property(lambda self: acc.optimal_n_buckets(self.s_bytes, self.fit.o_s, self.fit.w_bps))
    t_star_s = property(lambda self: acc.min_bucketed_overhead(self.s_bytes, self.fit.o_s, self.fit.w_bps))
    whole_s = property(lambda self: self.s_bytes / self.fit.w_bps)  # the whole gradient all-reduce

    def t_equal(self, mb: float) -> float:
        return acc.overhead_for_bucket_size(self.s_bytes, mb * 2**20, self.fit.o_s, self.fit.w_bps)

    def t_formed(self, n_buckets: int | None) -> float | None:
        return acc.bucketed_overhead(self.s_bytes, n_buckets, self.fit.o_s, self.fit.w_bps) if n_buckets else None

    def around(self, g: Group) -> tuple[float | None, float | None]:  # the grid's buckets either side of the optimum
        return (max((mb for mb in g.buckets if mb <= self.best_mb), default=None),
                min((mb for mb in g.buckets if mb >= self.best_mb), default=None))


@dataclass(frozen=True)
class TimelineRow:  # one traced variant's profiled step as its row stored it (details["timeline"], µs)
    label: str
    tl: dict

    span_s = property(lambda self: self.tl["span_us"] / 1e6)
    compute_s = property(lambda self: self.tl["busy_us"]["compute"] / 1e6)
    comm_s = property(lambda self: self.tl["busy_us"]["communication"] / 1e6)
    overlap_s = property(lambda self: self.tl["overlap_us"] / 1e6)
    overlap_share = property(lambda self: self.overlap_s / self.comm_s if self.comm_s else None)


@dataclass(frozen=True)
class Timeline:
    source: str  # what the profiler recorded ("cuda kernels")
    context: int
    batch: int
    rows: tuple[TimelineRow, ...]
    bucketed_for_overlap: bool  # the overlapped variant traced is the bucketed one
    figure: str


def _timeline(rows: list[Bench], ctx: Context, name: str) -> Timeline | None:
    traced = [b for b in rows if "timeline" in b.details]
    if not traced:
        return None
    c, variants = _cfg(traced[0]), {_cfg(b).variant for b in traced}
    tls = tuple(TimelineRow(_cfg(b).label, b.details["timeline"]) for b in traced)
    title = TIMELINE_WORDS.title.format(size_label=c.size_label, context=c.context, batch_per_rank=c.batch_per_rank)
    return Timeline(tls[0].tl["source"], int(c.context), int(c.batch_per_rank), tls,
                    "bucketed" in variants and "individual" not in variants, _draw_timeline(tls, ctx, name, title))


def _draw_timeline(rows: tuple[TimelineRow, ...], ctx: Context, png: str, title: str) -> str:
    """A panel per variant, a lane each for compute and communication; the stored lanes merge kernels across short
    gaps, so a lane is shaded by its busy share and labelled busy ÷ drawn (a bar never reads busier than the table)."""
    fig, axes = figures.plt.subplots(len(rows), 1, figsize=(9.5, 1.9 * len(rows) + 0.9), squeeze=False)
    fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    for k_ax, (ax, (name, tl)) in enumerate(zip(axes[:, 0], ((r.label, r.tl) for r in rows))):
        ticks = []
        for y, lane, color in ((1, "compute", "C0"), (0, "communication", "C3")):
            bars, busy = tl["lanes"][lane], tl["busy_us"][lane]
            drawn = sum(dur for _, dur in bars)
            ax.broken_barh([(st / 1e3, max(dur / 1e3, 1e-3)) for st, dur in bars], (y - 0.35, 0.7), color=color,
                           alpha=max(0.1, min(1.0, busy / drawn)) if drawn else 1.0)
            ticks.append(TIMELINE_WORDS.label("lane", lane=lane, busy_ms=busy / 1e3, drawn_ms=drawn / 1e3))
        for k, p in enumerate(tl["phases"]):
            ax.axvspan(p["start_us"] / 1e3, (p["start_us"] + p["dur_us"]) / 1e3, color=f"C{k + 4}", alpha=0.12,
                       label=p["name"])
        ax.set(yticks=[1, 0], xlabel=TIMELINE_WORDS.x)
        ax.set_yticklabels(ticks, fontsize=7)
        ax.set_title(name, fontsize=9, loc="left")
        if k_ax == 0:  # the same phases in every panel: one legend, beside the first
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
                      title=TIMELINE_WORDS.label("phase"), title_fontsize=7)
    return ctx.figure(fig, png)


def _draw_overhead(groups: list[Group], ctx: Context, name: str, title: str) -> str:
    """Step time over the single-GPU floor, per variant and context, torch DDP beside ours (±1 std); its link."""
    fig, ax = figures.new(figsize=(8.5, 4.2))
    width, labels = 0.8 / max(len(groups), 1), []
    for k, g in enumerate(groups):
        if (floor := g.get(SINGLE)) is None:
            continue
        vs = [v for v in g.variants if v.key != SINGLE]
        labels = labels or [v.label.split(" (")[0] for v in vs]
        vals = [100 * (v.step_s / floor.step_s - 1) if v.measured else float("nan") for v in vs]
        errs = [100 * ((v.step_std or 0) + (floor.step_std or 0)) / floor.step_s if v.measured else 0 for v in vs]
        xs = [i + (k - (len(groups) - 1) / 2) * width for i in range(len(vs))]
        bars = ax.bar(xs, vals, width, yerr=errs, capsize=2, color=f"C{k}",
                      label=OVERHEAD_WORDS.label("series", context=g.context, batch=g.batch))
        for bar, v in zip(bars, vs):
            if v.key == TORCH:
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set(ylabel=OVERHEAD_WORDS.y, title=title)
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    return ctx.figure(fig, name)


@dataclass(frozen=True)
class RunFacts:  # one [edition, size] run of one device
    device: str  # folder
    run: SizeRun  # its device: as headings name it
    config: DistConfig  # the run's first row's: size, ranks, backend
    groups: tuple[Group, ...]  # by context
    figure: str  # the overhead figure's link
    model: BucketModel | None
    timeline: Timeline | None
    fit_files: tuple[str, ...]  # the all-reduce runs the bucket model's fit read

    largest = property(lambda self: self.groups[-1] if self.groups else None)

    @property
    def overlap(self) -> list[tuple[str, float]]:  # (variant, share of its profiled communication overlapped)
        return sorted(((r.label, r.overlap_share) for r in (self.timeline.rows if self.timeline else ())
                       if r.overlap_share is not None), key=lambda x: x[0].lower())

    def measured(self, k: Key) -> list[Group]:
        return [g for g in self.groups if g.get(k) is not None]


def _run_facts(dev: str, heading: str, run, fits: list[Fit], fit_files: tuple[str, ...], ctx: Context) -> RunFacts:
    rows = [b for b in run.rows if _cfg(b).kind != "trace"]  # older files: trace rows apart
    groups, c, named, name = _groups(rows), _cfg(rows[0]), run.label(heading), f"{SLUG}-{dev}-{run.id}"
    figure = _draw_overhead(groups, ctx, f"{name}-overhead-vs-torch-ddp.png",
                            OVERHEAD_WORDS.title.format(heading=heading, size=named.size_short, date=named.date))
    # the bucket model: None without bucketed rows
    s = next((v.b.details["grad_bytes"] for g in groups for v in g.variants
              if v.measured and v.b.details.get("grad_bytes")), None)
    fit = next((x for x in fits if (x.backend, x.processes) == (c.backend, int(c.world_size))), None)
    with_buckets = tuple(g for g in groups if g.buckets)
    model = BucketModel(s, fit, with_buckets) if with_buckets and s is not None else None
    return RunFacts(dev, named, c, tuple(groups), figure, model, _timeline(run.rows, ctx, f"{name}_ddp_timeline.png"),
                    fit_files if model and fit else ())


def _distributed(node_id: str) -> bool:
    """Whether a failure (`correctness.test_fsdp::test_x[a]` or `correctness/test_fsdp.py::test_x`) is in a
    DISTRIBUTED_FILES file."""
    mod = node_id.split("::")[0]
    return (mod if mod.endswith(".py") else mod.replace(".", "/") + ".py") in DISTRIBUTED_FILES


@dataclass(frozen=True)
class Tests:  # the newest correctness record of any multi-GPU device (newest by its datetime, green or not)
    record: TestRecord
    file: str  # the record, as sources name it

    device = property(lambda self: self.record.device)
    date = property(lambda self: self.record.datetime[:10])
    when = property(lambda self: self.record.datetime[:16].replace("T", " "))
    distributed_failures = property(lambda self: tuple(f for f in self.record.failures if _distributed(f)))
    other_failures = property(lambda self: tuple(f for f in self.record.failures if not _distributed(f)))


NSYS_COLLECTIVES = ("ncclAllReduce",)
NSYS_VARIANTS = ("naive", "individual")  # ddp (b): not overlapped, then overlapped


class DdpNsys(Profiled):
    """ddp (b): naive and per-parameter overlapped DDP, each edition's xl (2026 first)."""

    def get(self, edition: str, variant: str) -> StepTimeline | None:
        return next((t for a, t in self.timelines if (a["edition"], a["variant"]) == (edition, variant)), None)

    editions = property(lambda self: list(dict.fromkeys(a["edition"] for a, _ in self.timelines)))

    def of_edition(self, edition: str) -> list[StepTimeline]:  # its profiled variants, naive first
        return [t for v in NSYS_VARIANTS if (t := self.get(edition, v))]


def ddp_nsys(ctx: Context) -> DdpNsys | None:
    return DdpNsys.of(ctx, "ddp", lambda a: f"xl ({a['edition']}), {DistConfig(variant=a['variant']).label}"
                      if a.get("variant") in NSYS_VARIANTS else None, NSYS_COLLECTIVES,
                      lambda a: (-int(a["edition"]), NSYS_VARIANTS.index(a["variant"])))


def newest_multi_gpu_tests(reports_dir: Path) -> Tests | None:
    data = Path(reports_dir) / "data"
    multi = (r for r in load_records(data) if (gpu_count(r.device) or 0) > 1)
    rec = max(multi, key=lambda r: r.datetime, default=None)
    if rec is None:
        return None
    found = sorted((data / rec.device / TESTS_FOLDER).glob(f"{rec.stamp()}*.json"))
    name = found[0].name if found else f"{rec.stamp()}.json"
    return Tests(rec, f"reports/data/{rec.device}/{TESTS_FOLDER}/{name}")


@dataclass(frozen=True)
class Score:  # a timed problem's scoreboard row: the current edition's run, its largest context's row
    run: RunFacts
    group: Group
    key: Key  # the row (the bucketed problem: its fastest bucket)


@dataclass(frozen=True)
class DdpPage:
    sections: tuple[DeviceSection, ...]
    steps_runs: tuple[RunFacts, ...]  # the runs answering the step problems, current edition first
    bucketed_runs: tuple[RunFacts, ...]
    timed: dict[str, Score]  # the timed problems answered: problem -> its scoreboard row
    tests: Tests | None = None  # the implementation problems' answer
    nsys: DdpNsys | None = None  # ddp (b) in Nsight Systems

    steps_current = current_edition(P.NAIVE_DDP_BENCHMARKING)  # the newest edition posing the three step problems
    bucketed_current = current_edition(P.DDP_BUCKETED_BENCHMARKING)

    @property
    def scores(self) -> dict[str, Scored]:
        found = {p: Scored(Kind.MEASURED, s.run.device, s.run.run.date) for p, s in self.timed.items()}
        if t := self.tests:
            found |= {p: Scored(Kind.MEASURED, t.device, t.date) for p in IMPLEMENTED}
        return {p: found.get(p, NOT_MEASURED) for p in PROBLEMS}

    @property
    def index_figures(self) -> list[str]:  # the first run's overhead figure
        return [r.figure for s in self.sections for r in s.runs][:1]

    @property
    def sources(self) -> list[str]:  # the DDP runs, and the all-reduce runs a bucket model's fit read
        return sorted({f for s in self.sections for f in s.source.files}
                      | {f for s in self.sections for r in s.runs for f in r.fit_files}
                      | ({self.tests.file} if self.tests else set())
                      | (set(self.nsys.sources) if self.nsys else set()))


def _score(runs: list[RunFacts], problem: str) -> Score | None:
    """A timed problem's scoreboard row: the first current-edition run whose largest context has its row."""
    for f in runs:
        if f.run.edition == current_edition(problem) and (g := f.largest) is not None:
            k = STEPS.get(problem) or ("bucketed", g.best_bucket)  # the bucketed problem: its fastest bucket
            if g.get(k) is not None:
                return Score(f, g, k)
    return None


def facts(ctx: Context) -> DdpPage:
    sections = []
    for dev, rows in ctx.rows.per_gpu(*ROWS):
        heading, comm = device_name(dev, rows), ctx.rows.of(ALLREDUCE, device=dev)
        fits, fit_files = allreduce_fits(comm), files_of(comm)
        found = tuple(_run_facts(dev, heading, run, fits, fit_files, ctx) for run in size_runs_of(rows))
        sections.append(DeviceSection(heading, found, RunsFacts.of(dev, rows)))
    runs = [r for s in sections for r in s.runs]
    timed = {p: s for p in (*STEPS, P.DDP_BUCKETED_BENCHMARKING) if (s := _score(runs, p))}
    return DdpPage(tuple(sections), tuple(answering(runs, P.NAIVE_DDP_BENCHMARKING)),
                   tuple(answering(runs, P.DDP_BUCKETED_BENCHMARKING)), timed,
                   newest_multi_gpu_tests(ctx.reports_dir), ddp_nsys(ctx))
