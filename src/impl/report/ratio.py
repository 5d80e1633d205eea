"""The report's one ratio convention: ours ÷ anchor, "slower" above 1 and "faster" below, or "within
noise" where the two times lie within each other's spread (`spread`: half the IQR around a
median, the standard deviation where a row kept no IQR).

A headline ratio follows one rule, written once here (`headline`, issue 45): it divides the suite's primary
measurement, each row's CUDA-event median of the same run; do_bench's figures stand beside it, and a side
whose do_bench median lies beyond the noise of its own rounds (`Timers`) is named with both numbers. Where both rows
recorded the SM clock their rounds ran at (`Clocks`), the headline carries both clocks and the ratio at equal clocks."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.markdown import missing


@dataclass(frozen=True)
class Ratio:
    ours_s: float
    anchor_s: float
    anchor: str  # the anchor's name as the text gives it ("cuDNN", "torch DDP")
    noise: bool  # the two times are within each other's spread

    @property
    def value(self) -> float:
        return self.ours_s / self.anchor_s

    @property
    def verdict(self) -> str:
        return "within noise" if self.noise else "slower" if self.value > 1 else "faster"

    def __str__(self) -> str:
        return f"{self.value:.2f}× {self.anchor} ({self.verdict})".replace("×  (", "× (")


def ratio(ours_s, anchor_s, anchor: str = "", ours_spread=None, anchor_spread=None) -> Ratio | None:
    """Ours ÷ anchor (seconds each) with the noise verdict; None unless both times exist."""
    if missing(ours_s) or missing(anchor_s) or anchor_s == 0:
        return None
    spread = sum(s for s in (ours_spread, anchor_spread) if not missing(s))
    return Ratio(float(ours_s), float(anchor_s), anchor, abs(ours_s - anchor_s) <= spread if spread else False)


def within_noise(a_s: float, b_s: float, a_std: float | None, b_std: float | None) -> bool:
    """Two means (or medians) within each other's standard deviation, |a − b| ≤ std_a + std_b (a missing std
    counts 0): equal times with no std are within noise, where `ratio` (no spread: no verdict) says not."""
    return abs(a_s - b_s) <= (a_std or 0.0) + (b_std or 0.0)


def of_benches(ours, anchor, name: str = "") -> Ratio | None:
    """Ours ÷ anchor of two rows' medians (impl.report.rows.Bench, measured), each with its spread."""
    return ratio(ours.stats.median, anchor.stats.median, name, ours.spread, anchor.spread)


def spread(stddev, iqr) -> float | None:
    """A row's spread around its median: half its IQR (one slow round does not move it), else its
    standard deviation (older-format rows kept no IQR)."""
    return iqr / 2 if not missing(iqr) else None if missing(stddev) else stddev


def med(xs) -> float | None:
    """The median of ratios as the report states it: the upper middle one of an even count (a ratio
    that was measured, never the mean of two), None for none."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


# --- The headline rule (issue 45): one rule for every headline ratio, written once. -------------------------

PRIMARY = "CUDA-event medians"  # what a headline divides: each row's own rounds (impl.bench.timers)


@dataclass(frozen=True)
class Timers:
    """One row's CUDA-event median (`event_s`; do_bench's in an older-format run) and do_bench's median beside it,
    in one run (seconds). They disagree beyond noise where do_bench lies outside `band`: median ± 2·IQR of the
    row's own rounds (Tukey's fences, for rounds spread evenly about their median: no ordinary round reads as far),
    else ± 3·stddev (the same fences for normally spread rounds); without either, no verdict."""

    event_s: float
    do_bench_s: float | None = None
    band: tuple[float, float] | None = None
    legacy: bool = False

    @property
    def do_bench_over_event(self) -> float | None:
        return None if self.do_bench_s is None else self.do_bench_s / self.event_s

    @property
    def disagrees(self) -> bool:
        """do_bench's median lies outside the band of the row's ordinary rounds (beyond noise)."""
        if self.do_bench_s is None or self.band is None or self.legacy:
            return False
        return not self.band[0] <= self.do_bench_s <= self.band[1]


def band(median, stddev=None, iqr=None) -> tuple[float, float] | None:
    """The band of a row's ordinary rounds about its median (`Timers`' definition of noise)."""
    half = 2 * iqr if not missing(iqr) and iqr > 0 else 3 * stddev if not missing(stddev) and stddev > 0 else None
    return None if half is None or missing(median) else (median - half, median + half)


def timers(b) -> Timers:
    """The `Timers` of a measured row (impl.report.rows.Bench)."""
    from impl.bench.row import Metric  # the bench layer's names; ratio.py stays importable by rows.py

    db = b.metric(Metric.DO_BENCH_MS)
    s = b.stats
    return Timers(s.median, None if db is None else db / 1e3, band(s.median, s.stddev, s.iqr), b.run.legacy)


# --- The clocks beside a headline: an H100 at its 700 W cap moves its SM clock, and the suite times rows one after
# the other, so a ratio of two rows' medians is partly one of clocks (impl.bench.row.Metric.SM_CLOCK_MHZ). ---------

CLOCK_GAP = 0.03  # two sides' clocks further apart than this: the headline mixes clock and kernel, and says so


@dataclass(frozen=True)
class Clock:
    """One row's GPU state over its timed rounds: the median of its per-round NVML samples of the SM clock (MHz)
    and of the board power (W; None where the row has the clock but not the power)."""

    mhz: float
    watts: float | None = None


@dataclass(frozen=True)
class Clocks:
    """Both sides' clocks of a headline. `scale` turns its ratio into the ratio at equal clocks (`Headline.
    at_equal_clocks`): an estimate that holds for a compute-bound kernel, whose time scales as 1 / clock."""

    ours: Clock
    anchor: Clock
    limit = CLOCK_GAP  # not a field: the templates name the threshold

    @property
    def scale(self) -> float:
        """Ours' time at the anchor's clock over ours' time at its own: ours' clock ÷ the anchor's."""
        return self.ours.mhz / self.anchor.mhz

    @property
    def gap(self) -> float:
        """How far apart the two clocks are: the higher over the lower, less 1 (symmetric in the sides)."""
        return max(self.scale, 1 / self.scale) - 1

    @property
    def differ(self) -> bool:
        return self.gap > self.limit


def clock(b) -> Clock | None:
    """The `Clock` of a row (impl.report.rows.Bench); None where it recorded no SM clock (older runs, a CPU, NVML
    failed)."""
    from impl.bench.row import Metric  # the bench layer's names; ratio.py stays importable by rows.py

    mhz, watts = b.metric(Metric.SM_CLOCK_MHZ), b.metric(Metric.POWER_W)
    return None if missing(mhz) or mhz <= 0 else Clock(float(mhz), None if missing(watts) else float(watts))


def clocks(ours, anchor) -> Clocks | None:
    """Both rows' clocks, None unless both recorded one."""
    o, a = clock(ours), clock(anchor)
    return None if o is None or a is None else Clocks(o, a)


@dataclass(frozen=True)
class Headline:
    """A headline ratio by the module's one rule (`ratio`), do_bench's of the same run beside it, never in its
    place (a headline must not pick the kindest timer), and the sides whose timers disagree (`disagreements`)."""

    ratio: Ratio
    ours: Timers
    anchor: Timers
    ours_name: str = "ours"
    clocks: Clocks | None = None  # both sides' SM clock and power, where both rows recorded the clock

    @property
    def at_equal_clocks(self) -> float | None:
        """The ratio were ours timed at the anchor's clock (`Clocks.scale`: an estimate for a compute-bound kernel);
        None without both clocks."""
        return None if self.clocks is None else self.ratio.value * self.clocks.scale

    @property
    def do_bench(self) -> Ratio | None:
        """do_bench's ratio of the same run (no noise verdict: the rows keep only do_bench's median)."""
        o, a = self.ours, self.anchor
        return None if o.legacy or a.legacy else ratio(o.do_bench_s, a.do_bench_s, self.ratio.anchor)

    @property
    def timer(self) -> str:
        """What the ratio divides, as the text names it."""
        return "do_bench medians (older-format run)" if self.ours.legacy or self.anchor.legacy else PRIMARY

    @property
    def disagreements(self) -> tuple[tuple[str, Timers], ...]:
        """(name, timers) of each side whose do_bench median lies beyond noise of its event rounds."""
        return tuple((n, t) for n, t in ((self.ours_name, self.ours), (self.ratio.anchor, self.anchor))
                     if t.disagrees)


def headline(ours, anchor, name: str, ours_name: str = "ours") -> Headline | None:
    """The headline of two measured rows (impl.report.rows.Bench) of one run: ours ÷ anchor of their
    primary-timer medians (`of_benches`), do_bench and both sides' clocks (`clocks`) beside; None unless both have
    medians."""
    r = of_benches(ours, anchor, name)
    return None if r is None else Headline(r, timers(ours), timers(anchor), ours_name, clocks(ours, anchor))
