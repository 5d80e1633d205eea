"""The report's one row type, `Bench` (a stored row with its `RunRef` and `Stats`), `Rows` (each row's newest, and
every earlier one), the typed views a page reads a row's config through (`View`), and the shared selections.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Hashable, Iterable, Self, TypeVar

from impl.bench.kernel_digest import KernelDigest
from impl.bench.row import Metric, Row, Status
from impl.model.sizes import EDITION_SIZES, SizeRef
from impl.report.markdown import missing
from impl.report.ratio import Ratio, of_benches, spread
from impl.workloads.variants import DDPVariant, FSDPVariant, ShardVariant

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)


def group(items: Iterable[T], key: Callable[[T], K]) -> dict[K, list[T]]:
    """The items by `key`: keys in the order they first appear, each group in the items' order."""
    out: dict[K, list[T]] = {}
    for x in items:
        out.setdefault(key(x), []).append(x)
    return out


def newest(items: Iterable[T], key: Callable[[T], Hashable], rank: Callable[[T], Any]) -> list[T]:
    """Per key, the item of the highest rank (of equal ranks, the first), highest first: the report's one
    newest-per-key selection (rank by run time, or by (measured, run time))."""
    out: dict = {}
    for x in sorted(items, key=rank, reverse=True):
        out.setdefault(key(x), x)
    return list(out.values())


def size_ref(size: str | None, edition: str | None) -> SizeRef | None:
    """(edition, name) of a row's model size (no edition: 2025's); None for sizes outside both tables (tiny)."""
    if size is None:
        return None
    try:
        return SizeRef.from_row({"size": size, "edition": edition})
    except ValueError:
        return None


@dataclass(frozen=True)
class SizeRun:
    """The rows of one model size (edition and name) that came from one stored run: the unit a
    distributed page answers from, so that every ratio it prints divides rows of one run and size. As an answer
    names it (`label`, templates/_editions.md.j2), it carries the device."""

    size: SizeRef | None
    datetime: str
    rows: tuple[Bench, ...] = field(compare=False)
    device: str = ""  # as the answer names it: a heading, or the device folder

    @property
    def edition(self) -> str:
        return self.size.edition if self.size is not None else "2025"

    @property
    def described(self) -> str:
        """The size with its edition and dimensions, as the distributed answers name it:
        "xl (2026): d_model 2560, 32 layers, 3.4B params"."""
        if self.size is None:
            return "–"
        c = self.size.config
        params = f"{c.params / 1e9:.1f}B" if c.params >= 1e9 else f"{c.params / 1e6:.1f}M"
        return f"{self.size.name} ({self.edition}): d_model {c.d_model}, {c.num_layers} layers, {params} params"

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({b.run.file for b in self.rows}))

    @property
    def date(self) -> str:
        return self.rows[0].run.date

    @property
    def when(self) -> str:
        return self.rows[0].run.when

    @property
    def id(self) -> str:
        """For figure names: "2026-xl"."""
        return f"{self.edition}-{self.size.name}" if self.size is not None else "nosize"

    name = property(lambda self: self.size.name if self.size is not None else "–")  # in its edition: "xl"
    size_short = property(lambda self: f"{self.name} ({self.edition})" if self.size is not None else "–")

    def label(self, device: str) -> SizeRun:
        return replace(self, device=device)


def newest_first(items, label=lambda x: x.run):
    """`items` ordered newest edition first, then newest run (UTC) first: an answer headlines the latest
    run of the current edition, whichever device folder it sits in."""
    return sorted(items, key=lambda x: (int(label(x).edition), label(x).when), reverse=True)


def current_edition(problem) -> str:
    """The newest edition that poses a problem: its rows answer, an older edition's are history."""
    return max(str(e) for e in problem.editions)


def answering(facts: list, problem) -> list:
    """The facts (each with `.run`, a labelled SizeRun) that answer `problem`, newest edition first (older editions' as
    history); a newer edition's rows never answer an older edition's problem."""
    current = int(current_edition(problem))
    return sorted((f for f in facts if f.run is not None and int(f.run.edition) <= current),
                  key=lambda f: -int(f.run.edition))


def _edition_order(ref: SizeRef | None) -> tuple:
    """2026 first (the current edition answers; 2025 is history), then the edition's table order."""
    if ref is None:
        return (1, 99, "")
    names = list(EDITION_SIZES.get(ref.edition, {}))
    return (-int(ref.edition), names.index(ref.name) if ref.name in names else len(names), ref.name)


def size_runs_of(rows: Iterable[Bench]) -> list[SizeRun]:
    """The rows split by [edition, size] and by run: each edition's sizes (2026 first), within a size its
    runs newest first."""
    keyed = [((SizedView.of(b).size_ref, b.run.datetime), b) for b in rows]
    out = [SizeRun(ref, when, tuple(b for k, b in keyed if k == (ref, when)))
           for ref, when in dict.fromkeys(k for k, _ in keyed)]
    newest_first = sorted(out, key=lambda g: g.datetime, reverse=True)
    return sorted(newest_first, key=lambda g: _edition_order(g.size))


@dataclass(frozen=True)
class Stats:
    """pytest-benchmark's statistics of a measured row, seconds per call."""

    mean: float | None
    stddev: float | None
    median: float | None
    iqr: float | None
    rounds: int | None
    data: list[float] | None


@dataclass(frozen=True)
class RunRef:
    """The stored run a row comes from."""

    device: str
    section: str
    datetime: str  # the run's start, ISO UTC (pytest-benchmark's); "" where the file has none
    commit: str
    legacy: bool
    file: str = ""  # reports/data/<device>/<section>/<name>.json.gz (.json: filed before packing)
    kernels: KernelDigest | None = None  # the kernels it ran; None in runs stored before runs recorded them

    @property
    def date(self) -> str:
        return self.datetime[:10] if self.datetime else "–"

    @property
    def when(self) -> str:
        """'YYYY-MM-DD HH:MM' (UTC)."""
        return self.datetime[:16].replace("T", " ") if self.datetime else "–"


@dataclass(frozen=True)
class Bench:
    """One stored row as the report reads it."""

    name: str
    row: Row
    run: RunRef
    stats: Stats | None

    @property
    def problem(self) -> str:
        return self.row.problem

    @property
    def status(self) -> Status:
        return self.row.status

    @property
    def measured(self) -> bool:
        return self.row.status is Status.MEASURED and self.stats is not None and not missing(self.stats.median)

    @property
    def details(self) -> dict[str, Any]:
        return self.row.details

    def metric(self, m: Metric) -> float | None:
        return self.row.metric(m)

    @property
    def spread(self) -> float | None:
        """Its spread around the median (impl.report.ratio.spread); None without statistics."""
        return None if self.stats is None else spread(self.stats.stddev, self.stats.iqr)

    @property
    def step_s(self) -> float | None:
        """Time per call: the median (the bench layer's metrics divide by it); older-format runs computed
        their tokens/s and MFU from the mean, so their tables keep showing the mean."""
        return None if self.stats is None else self.stats.mean if self.run.legacy else self.stats.median

    def figure(self, key: str, metric: Metric | None = None):
        """A figure of a (distributed) row: its Metric, else the mean of its timed steps
        (details["steps"]), a details key, or where the older format kept it (its free-form metrics)."""
        if metric is not None and not missing(self.metric(metric)):
            return self.metric(metric)
        d = self.details
        for source in (d.get("steps") or {}, d, d.get("legacy_metrics") or {}):
            if source.get(key) is not None:
                return source[key]
        return None


@dataclass(frozen=True)
class Rows:
    """What a page reads: each stored benchmark's newest row (per device), and every earlier one."""

    newest: tuple[Bench, ...]
    history: tuple[Bench, ...] = ()

    @classmethod
    def loaded(cls, rows: list[Bench]) -> Rows:
        """Stored rows (oldest run first) split by (device, benchmark name) into the last seen and the rest."""
        newest = {(b.run.device, b.name): b for b in rows}
        keep = {id(b) for b in newest.values()}
        return cls(tuple(newest.values()), tuple(b for b in rows if id(b) not in keep))

    def of(self, *problems: str, device: str | None = None) -> list[Bench]:
        """The newest rows of `problems` (all where none is named), on `device` where given."""
        return [b for b in self.newest if (not problems or b.problem in problems)
                and (device is None or b.run.device == device)]

    def gpu_devices(self) -> list[str]:
        """GPU device folders that have rows, one-GPU kinds first (the CPU smoke rows have their own page)."""
        devs = sorted({b.run.device for b in self.newest} - {"cpu"})
        return sorted(devs, key=lambda d: (not d.endswith("-x1"), d))

    def per_gpu(self, *problems: str) -> list[tuple[str, list[Bench]]]:
        """(device, its newest rows of `problems`) for each GPU device that has any, one-GPU kinds first."""
        return [(dev, rows) for dev in self.gpu_devices() if (rows := self.of(*problems, device=dev))]

    def first_gpu(self, *problems: str) -> tuple[str, list[Bench]] | None:
        """The first GPU device with rows of `problems` (a one-GPU kind where one has them) and its rows."""
        return next(iter(self.per_gpu(*problems)), None)


def stat_name(rows: Iterable[Bench]) -> str:
    """What Bench.step_s shows for `rows` (their measured ones, else all), for tables' captions."""
    rows = list(rows)
    kinds = {b.run.legacy for b in ([b for b in rows if b.status is Status.MEASURED] or rows)}
    return "mean" if kinds == {True} else "median" if kinds == {False} else "median (mean in older-format runs)"


def timing_text(rows: Iterable[Bench]) -> tuple[str, str]:
    """(warm-up calls, timed rounds) of the measured rows, as "5", or "5–10" where rows differ (the harness
    gives short rows more rounds); the older format kept the grid's warmup and rounds in its details."""
    warm, rounds = set(), set()
    for b in rows:
        if b.status is Status.MEASURED:
            t = b.row.timing
            warm.add(t.warmup_rounds if t else b.details.get("warmup"))
            rounds.add(t.rounds if t else b.details.get("rounds"))

    def text(xs):
        xs = sorted(x for x in xs if x is not None)
        return "–" if not xs else str(xs[0]) if xs[0] == xs[-1] else f"{xs[0]}–{xs[-1]}"
    return text(warm), text(rounds)


class View:
    """A page's typed view of a row's config: a frozen dataclass of the keys it reads, each with a default."""

    @classmethod
    def of(cls, b: Bench) -> Self:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in b.row.config.items() if k in names})


@dataclass(frozen=True)
class RowView(View):
    """A view that holds its row (`b`, set by `of`) and reads what the row measured through it, not copied."""

    b: Bench | None = field(default=None, repr=False, kw_only=True)

    status = property(lambda self: self.b.status)
    reason = property(lambda self: self.b.row.reason)
    details = property(lambda self: self.b.details)
    run = property(lambda self: self.b.run)
    step_s = property(lambda self: self.b.step_s)
    std_s = property(lambda self: self.b.stats and self.b.stats.stddev)
    tokens_per_s = property(lambda self: self.b.metric(Metric.TOKENS_PER_S))

    @classmethod
    def of(cls, b: Bench) -> Self:
        return replace(super().of(b), b=b)

    @property
    def not_run(self) -> bool:
        return self.status not in (Status.MEASURED, Status.OOM)


@dataclass(frozen=True)
class SizedView(View):
    """A view of a row that names its model size: its size and edition keys, and the size's one label."""

    size: str | None = None
    edition: str | None = None  # None: stored before the 2026 table, 2025's

    @property
    def size_ref(self) -> SizeRef | None:
        return size_ref(self.size, self.edition)

    @property
    def size_label(self) -> str:  # SizeRef.label ("xl (2026) = 2.7B (2025)"); its own name where in neither table
        return self.size_ref.label if self.size_ref is not None else self.size


@dataclass(frozen=True)
class DistConfig(SizedView):
    """The config of a distributed row (ddp, fsdp, optimizer sharding, per_rank_memory): one view, so that
    the pages that set these rows side by side read one shape and one label."""

    variant: str = ""
    context: int = 0
    batch_per_rank: int = 0
    world_size: int = 0
    backend: str = ""
    dtype: str = ""
    bucket_mb: float | None = None  # a bucketed DDP row's bucket cap
    kind: str | None = None  # older ddp files: "trace" rows beside the benchmarks

    @property
    def key(self) -> tuple[str, float | None]:
        """The row within its run: the variant, and a bucketed row's bucket size."""
        return self.variant, self.bucket_mb if self.variant == "bucketed" else None

    @property
    def label(self) -> str:
        """The variant as the tables name it (its enum's label; "bucketed 100 MB"; else its own name)."""
        if self.variant == "bucketed":
            return f"bucketed {self.bucket_mb:g} MB"
        return next((v.label for e in (DDPVariant, FSDPVariant, ShardVariant) for v in e if v == self.variant),
                    self.variant)

    @property
    def shape(self) -> tuple[SizeRef | None, int, int]:
        """The workload: size, context and global batch (a TP row's ranks all take the whole batch)."""
        return self.size_ref, self.context, self.batch_per_rank * (1 if self.variant == "tp" else self.world_size)


@dataclass(frozen=True)
class DistRow:  # a distributed row as the ddp, fsdp and optimizer_sharding tables read it
    b: Bench
    c: DistConfig

    of = classmethod(lambda cls, b: cls(b, DistConfig.of(b)))
    key = property(lambda self: self.c.key)
    label = property(lambda self: self.c.label)
    measured = property(lambda self: self.b.measured)
    step_s = property(lambda self: self.b.stats.median if self.b.stats else None)
    step_std = property(lambda self: self.b.stats.stddev if self.b.stats else None)
    spread = property(lambda self: self.b.spread)
    comm_s = property(lambda self: self.b.figure("comm_s"))  # exposed communication, mean over the timed steps
    comm_share = property(lambda self: self.b.figure("comm_share", Metric.COMM_SHARE))
    peak = property(lambda self: self.b.row.memory.peak_allocated or self.b.figure("peak_bytes"))  # largest rank's
    tokens_per_s = property(lambda self: self.b.figure("tokens_per_s", Metric.TOKENS_PER_S))
    n_buckets = property(lambda self: self.b.details.get("num_buckets"))  # None in files that did not record it

    def vs(self, other: DistRow, name: str = "") -> Ratio:  # this row's median ÷ other's
        return of_benches(self.b, other.b, name)


def of_newest_run(rows: list[Bench], among: list[Bench] | None = None) -> list[Bench]:
    """The `rows` of the newest run that `among` (default: `rows`) has rows of: a page answering from
    one run divides only numbers of that run."""
    among = rows if among is None else among
    if not among:
        return []
    newest = max(b.run.datetime for b in among)
    return [b for b in rows if b.run.datetime == newest]
