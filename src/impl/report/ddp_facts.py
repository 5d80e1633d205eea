"""The DDP page as facts, per device and [edition, size] run (impl.report.rows.size_runs): each
(context, per-rank batch) group's rows by variant, the correctness log's verdict, and the profiled
overlap shares; templates/ddp.md.j2 holds the words. Every ratio divides rows of one run and size."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Metric
from impl.report.distributed import VARIANT_LABEL, overlap_shares
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, benches

Key = tuple[str, float | None]  # (variant, bucket MB for bucketed rows)
SINGLE, TORCH = ("single", None), ("torch_ddp", None)
OURS = ("naive", "flat", "individual", "bucketed")


def key(b: Bench) -> Key:
    return b.cfg.variant, b.cfg.bucket_mb if b.cfg.variant == "bucketed" else None


def label(b: Bench) -> str:
    v = b.cfg.variant
    return f"bucketed {b.cfg.bucket_mb:g} MB" if v == "bucketed" else VARIANT_LABEL.get(v, v)


@dataclass(frozen=True)
class Group:
    """The rows of one (context, per-rank batch)."""

    context: int
    batch: int
    by: dict[Key, Bench]

    def get(self, k: Key) -> Bench | None:
        b = self.by.get(tuple(k))
        return b if b is not None and b.measured else None

    def ratio(self, k: Key, ref: Key, name: str) -> Ratio | None:
        """Row k ÷ row ref (medians), the report's one convention."""
        a, r = self.get(k), self.get(ref)
        if a is None or r is None:
            return None
        return ratio(a.stats.median, r.stats.median, name, spread(a.stats.stddev, a.stats.iqr),
                     spread(r.stats.stddev, r.stats.iqr))

    def comm_share(self, k: Key) -> float | None:
        b = self.get(k)
        return None if b is None else b.figure("comm_share", Metric.COMM_SHARE)

    def peak(self, k: Key) -> float | None:
        """The row's peak allocated memory (the largest rank's), where the row recorded it."""
        b = self.get(k)
        return None if b is None else b.row.memory.peak_allocated

    @property
    def buckets(self) -> dict[float, Bench]:
        return {k[1]: b for k, b in self.by.items() if k[0] == "bucketed" and b.measured}

    @property
    def best_bucket(self) -> float | None:
        bk = self.buckets
        return min(bk, key=lambda mb: bk[mb].stats.median) if bk else None

    @property
    def best_ours(self) -> Bench | None:
        ours = [b for k, b in self.by.items() if k[0] in OURS and b.measured]
        return min(ours, key=lambda b: b.stats.median) if ours else None


@dataclass(frozen=True)
class DdpFacts:
    device: str  # named as headings name it
    date: str
    log_tail: str | None  # the last line of the NCCL correctness log
    groups: list[Group]  # by context
    overlap: dict[str, float]  # variant label -> share of its profiled communication overlapping compute
    run: RunLabel | None = None  # the [edition, size] run the facts come from

    @property
    def passed(self) -> str | None:
        return None if self.log_tail is None else self.log_tail.split(" in ")[0]

    def measured(self, k: Key) -> list[Group]:
        return [g for g in self.groups if g.get(k) is not None]

    @property
    def largest(self) -> Group | None:
        return self.groups[-1] if self.groups else None


def ddp_facts(device: str, run: SizeRun, log_tail: str | None) -> DdpFacts:
    """The facts of one [edition, size] run (impl.report.rows.size_runs) on `device`."""
    bench = [b for b in benches(run.rows) if b.cfg.kind != "trace"]  # older files: trace rows apart
    groups: dict[tuple[int, int], dict[Key, Bench]] = {}
    for b in bench:
        groups.setdefault((int(b.cfg.context), int(b.cfg.batch_per_rank)), {})[key(b)] = b
    return DdpFacts(device, run.date, log_tail, [Group(c, n, by) for (c, n), by in sorted(groups.items())],
                    overlap_shares(run.rows), run.label(device))
