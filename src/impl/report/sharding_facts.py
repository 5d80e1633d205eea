"""optimizer_state_sharding(_accounting) as facts, per device and [edition, size] run
(impl.report.rows.size_runs): each variant's per-rank memory at the points the handout names and its
step time, and the two oddities the table shows, with the numbers that explain them;
templates/optimizer_sharding.md.j2 holds the words."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, benches


@dataclass(frozen=True)
class Variant:
    row: Bench

    def _ranks(self, key: str) -> float:
        return max(x[key] for x in self.row.details["ranks"])

    @property
    def state(self) -> float:
        """Optimizer state per rank (the largest rank's), after the step."""
        return max(x["named_after"]["optimizer_state"] for x in self.row.details["ranks"])

    @property
    def before_peak(self) -> float:
        return self._ranks("before_peak")

    @property
    def after_peak(self) -> float:
        return self._ranks("after_peak")

    @property
    def median(self) -> float:
        return self.row.stats.median

    @property
    def stddev(self) -> float | None:
        return self.row.stats.stddev

    @property
    def grad_gb(self) -> float:
        """The fp32 gradients Ψ in GB."""
        return self.row.details["n_params"] * 4 / 1e9

    def vs(self, other: Variant, name: str) -> Ratio:
        s = self.row.stats
        o = other.row.stats
        return ratio(s.median, o.median, name, spread(s.stddev, s.iqr), spread(o.stddev, o.iqr))


@dataclass(frozen=True)
class InitPeak:
    peak: float
    allocated: float
    params: float


@dataclass(frozen=True)
class Zero1Activations:
    """ZeRO-1's forward/backward transient against the simple sharded optimizer's, where it exceeds
    it by more than half the gradients: the signature of the flat gradient buffer ZeRO-1 kept
    through backward before the bucketed step (`commit`: the ZeRO-1 row's run)."""

    zero1: float
    sharded: float
    grads: float
    commit: str


@dataclass(frozen=True)
class ShardingFacts:
    device: str
    log_tail: str | None
    none: Variant | None
    sharded: Variant | None
    zero1: Variant | None
    init: InitPeak | None
    zero1_activations: Zero1Activations | None
    run: RunLabel | None = None  # the [edition, size] run the facts come from

    @property
    def passed(self) -> str | None:
        return None if self.log_tail is None else self.log_tail.split(" in ")[0]


def sharding_facts(device: str, run: SizeRun, log_tail: str | None) -> ShardingFacts:
    by = {b.cfg.variant: Variant(b) for b in benches(run.rows) if b.measured}
    init = z1 = None
    if by:
        r0 = next(iter(by.values())).row.details["ranks"][0]
        if r0.get("init_peak") and r0.get("init_allocated"):
            init = InitPeak(r0["init_peak"], r0["init_allocated"], r0["named_before"]["parameters"])
    if "zero1" in by and "sharded" in by:
        za = by["zero1"].row.details["ranks"][0]
        ba = by["sharded"].row.details["ranks"][0]["activations"]
        grads = za["named_before"]["gradients"]
        if za["activations"] is not None and ba is not None and za["activations"] - ba > grads / 2:
            z1 = Zero1Activations(za["activations"], ba, grads, by["zero1"].row.run.commit)
    return ShardingFacts(device, log_tail, by.get("none"), by.get("sharded"), by.get("zero1"), init, z1,
                         run.label(device))
