"""The headline rule (impl.report.ratio.headline, issue 45): a headline divides the rows' CUDA-event medians of
one run; do_bench stands beside it; a side whose do_bench median lies outside its own rounds' band (median ±
2·IQR) is named; where both rows recorded their SM clock, both clocks and the ratio at equal clocks ride along.
Synthetic rows only."""
from __future__ import annotations

import pytest

from impl.bench.row import Metric
from impl.report.ratio import CLOCK_GAP, Clock, Clocks, Timers, band, clock, headline, ratio, spread, timers
from kits.report_rows import bench

SHAPE = dict(batch=1, heads=16, seq=16384, d=64, dtype="bf16", causal=True)


def _row(impl, event_ms, do_bench_ms=None, iqr_ms=0.05, mhz=None, watts=None):
    metrics = {m: v for m, v in ((Metric.DO_BENCH_MS, do_bench_ms), (Metric.SM_CLOCK_MHZ, mhz), (Metric.POWER_W, watts))
               if v is not None}
    return bench("leaderboard", dict(impl=impl, mode="fwd_bwd", **SHAPE), event_ms / 1e3, iqr=iqr_ms / 1e3,
                 metrics=metrics)


def test_band_is_median_plus_minus_two_iqr_else_three_stddev_else_none():
    assert band(10.0, stddev=1.0, iqr=0.5) == (9.0, 11.0)
    assert band(10.0, stddev=0.5) == (8.5, 11.5)
    assert band(10.0) is None and band(10.0, stddev=0.0, iqr=0.0) is None


def test_disagreement_is_do_bench_outside_the_band_and_never_for_older_format_rows():
    t = Timers(1.0, 1.1, (0.9, 1.05))
    assert t.disagrees and round(t.do_bench_over_event, 3) == 1.1
    assert not Timers(1.0, 1.05, (0.9, 1.05)).disagrees  # on the edge: inside
    assert not Timers(1.0, None, (0.9, 1.05)).disagrees and not Timers(1.0, 2.0, None).disagrees
    assert not Timers(1.0, 2.0, (0.9, 1.05), legacy=True).disagrees  # its median is do_bench's own


def test_do_bench_flattering_the_anchor_headlines_the_events_ratio_and_names_the_anchor():
    """The leaderboard's case (2026-11-24 21:04): do_bench reads cuDNN 16% above its own events and ours
    about level, so do_bench's ratio (1.01×) is kinder to ours than the events' (1.19×). The headline is the
    events'; do_bench's stands beside; cuDNN is named with both numbers, ours is not."""
    h = headline(_row("flash_triton", 5.228, 5.179), _row("sdpa_cudnn", 4.404, 5.122), "SDPA cuDNN")
    assert round(h.ratio.value, 2) == 1.19 and h.ratio.verdict == "slower" and h.timer == "CUDA-event medians"
    assert round(h.do_bench.value, 2) == 1.01
    assert [name for name, _ in h.disagreements] == ["SDPA cuDNN"]
    (_, t), = h.disagreements
    assert (t.event_s, t.do_bench_s) == (pytest.approx(4.404e-3), pytest.approx(5.122e-3))
    assert t.band == (pytest.approx(4.304e-3), pytest.approx(4.504e-3))


def test_do_bench_flattering_ours_is_not_the_headline_either():
    """The other direction: do_bench reads ours faster than its events would (ours 0.9× by do_bench), the
    headline stays the events' 1.10× and ours is named."""
    h = headline(_row("flash_triton", 5.5, 4.5), _row("sdpa_cudnn", 5.0, 5.0), "cuDNN")
    assert round(h.ratio.value, 2) == 1.1 and round(h.do_bench.value, 2) == 0.9
    assert [name for name, _ in h.disagreements] == ["ours"]


def test_rows_without_do_bench_headline_the_events_alone():
    h = headline(_row("flash_triton", 5.0), _row("sdpa_cudnn", 4.0), "cuDNN")
    assert round(h.ratio.value, 2) == 1.25 and h.do_bench is None and h.disagreements == ()


def test_timers_of_a_row_read_its_median_do_bench_and_band():
    t = timers(_row("flash_triton", 2.0, 2.5, iqr_ms=0.1))
    assert (t.event_s, t.do_bench_s) == (pytest.approx(2e-3), pytest.approx(2.5e-3)) and t.disagrees
    assert t.band == (pytest.approx(1.8e-3), pytest.approx(2.2e-3))


def test_a_missing_number_is_none_or_nan_in_ratios_spreads_and_bands():
    """One test of a number's absence (impl.report.markdown.missing) serves ratio, spread, band and the rows."""
    nan = float("nan")
    assert ratio(1.0, nan) is None and ratio(None, 1.0) is None and ratio(1.0, 0.0) is None
    assert ratio(1.0, 2.0, "x", nan, 0.5).noise is False and ratio(1.0, 2.0, "x", nan, 1.0).noise is True
    assert spread(nan, 0.4) == 0.2 and spread(0.3, nan) == 0.3 and spread(nan, None) is None
    assert spread(0.3, 0.0) == 0.0  # a zero IQR is a number: half of it
    assert band(nan, stddev=1.0) is None and band(10.0, stddev=nan, iqr=nan) is None


def test_a_headline_carries_both_clocks_and_the_ratio_at_equal_clocks():
    """The thirty-second session's H100 at its 700 W cap: ours' rounds near 1,870 MHz, cuDNN's (timed later) near
    1,720. Ours' time at cuDNN's clock would be 1,870 / 1,720 of its own (compute-bound), so the 1.03× headline reads
    about 1.12× at equal clocks; the clocks lie 8.7% apart, beyond CLOCK_GAP (3%): the ratio mixes clock and kernel."""
    h = headline(_row("flash_triton", 5.15, mhz=1870.0, watts=690.0), _row("sdpa_cudnn", 5.0, mhz=1720.0, watts=698.0),
                 "SDPA cuDNN")
    assert h.clocks == Clocks(Clock(1870.0, 690.0), Clock(1720.0, 698.0))
    assert round(h.ratio.value, 2) == 1.03 and h.at_equal_clocks == pytest.approx(1.03 * 1870 / 1720)
    assert round(h.at_equal_clocks, 2) == 1.12
    assert h.clocks.gap == pytest.approx(1870 / 1720 - 1) and h.clocks.differ and h.clocks.limit == CLOCK_GAP == 0.03


def test_clocks_within_three_percent_do_not_differ_and_the_gap_is_symmetric():
    near = Clocks(Clock(1800.0), Clock(1750.0))  # 2.9% apart
    assert not near.differ and near.gap == pytest.approx(1800 / 1750 - 1)
    assert Clocks(Clock(1750.0), Clock(1800.0)).gap == pytest.approx(near.gap)  # either side the faster clock
    assert Clocks(Clock(1750.0), Clock(1810.0)).differ  # 3.4%
    h = headline(_row("flash_triton", 4.0, mhz=1750.0), _row("sdpa_cudnn", 4.0, mhz=1750.0), "cuDNN")
    assert h.at_equal_clocks == pytest.approx(h.ratio.value) == pytest.approx(1.0) and h.clocks.gap == 0


def test_no_clocks_unless_both_rows_recorded_one_and_power_is_optional():
    """A row from before the clocks (or a CPU's, or one where NVML failed) has none: the headline carries no
    clocks at all and its words add nothing; a row with the clock but no power keeps the clock."""
    ours, cudnn = _row("flash_triton", 5.0, mhz=1870.0, watts=690.0), _row("sdpa_cudnn", 4.0)
    assert headline(ours, cudnn, "cuDNN").clocks is None and headline(cudnn, ours, "x").clocks is None
    assert headline(ours, cudnn, "cuDNN").at_equal_clocks is None
    assert headline(_row("a", 5.0), _row("b", 4.0), "cuDNN").clocks is None  # the stored runs so far
    assert clock(_row("flash_triton", 5.0, mhz=1870.0)) == Clock(1870.0, None)
    assert clock(_row("flash_triton", 5.0, mhz=float("nan"), watts=690.0)) is None
    assert clock(_row("flash_triton", 5.0, mhz=0.0)) is None  # not a clock a ratio can be scaled by
