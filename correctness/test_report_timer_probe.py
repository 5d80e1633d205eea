"""The do_bench-against-events probe beside the leaderboard and flash_forward headlines (impl.report.timer_probe):
read from a synthetic probe file and from the committed one, and the pages' words. The headline stays the
CUDA-event ratio of one run (impl.report.ratio.headline); the probe only stands beside it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.bench.row import Metric
from impl.report import timer_probe as tp
from impl.report.pages import flash_attention, leaderboard
from impl.report.ratio import headline
from impl.report.templating import render_page
from kits.report_rows import bench, context

ROOT = Path(__file__).resolve().parents[1]
DEV = "h100-80gb-x1"
SHAPE = dict(batch=1, heads=16, seq=16384, d=64, dtype="bf16", causal=True)


def _step(step, impl, mode, median, iqr=0.0):
    return dict(step=step, impl=impl, mode=mode, median=median, q1=median - iqr / 2, q3=median + iqr / 2, n=30)


def _probe_file(reports: Path, name="do_bench_vs_events_abc1234.json", shape=(1, 16, 16384, 64), fwd_bwd=1.167,
                ours=None, modes=("fwd_bwd", "fwd")):
    """ours 5.4 ms (events) and 5.2 (do_bench), cuDNN 4.55 and 4.68: both within noise; interleaved fwd+bwd
    `fwd_bwd` (IQR ± 0.03), forward 0.998. `ours`: the probe's --ours (None: a file from before the option, which
    names none and timed flash_triton); `modes`: the modes it ran."""
    impl = ours or "flash_triton"
    rows = [dict(step="setup:" + impl, impl=impl, mode=None),
            _step("events", impl, "fwd_bwd", 5.4, 0.2), _step("do_bench", impl, "fwd_bwd", 5.2),
            _step("events", "sdpa_cudnn", "fwd_bwd", 4.55, 0.3), _step("do_bench", "sdpa_cudnn", "fwd_bwd", 4.68),
            _step("events", impl, "fwd", 1.37, 0.03), _step("do_bench", impl, "fwd", 1.32),
            _step("events", "sdpa_cudnn", "fwd", 1.31, 0.02), _step("do_bench", "sdpa_cudnn", "fwd", 1.26),
            dict(step="interleaved", impl=None, mode="fwd_bwd",
                 ratio=dict(median=fwd_bwd, q1=fwd_bwd - 0.03, q3=fwd_bwd + 0.03, n=20)),
            dict(step="interleaved", impl=None, mode="fwd", ratio=dict(median=0.998, q1=0.99, q3=1.016, n=20))]
    rows = [r for r in rows if r["mode"] is None or r["mode"] in modes]
    doc = dict(device="NVIDIA H100 80GB HBM3", shape=list(shape), dtype="bf16", causal=True, rows=rows)
    if ours is not None:
        doc.update(ours=ours, modes=list(modes))
    path = reports / "data" / DEV / "probes" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def _headline():  # flash_auto's fwd+bwd against cuDNN's, events only
    ours, cudnn = (bench("leaderboard", dict(impl=i, mode="fwd_bwd", **SHAPE), ms, device=DEV, iqr=0.05e-3)
                   for i, ms in (("flash_auto", 4.6e-3), ("sdpa_cudnn", 4.5e-3)))
    return headline(ours, cudnn, "SDPA cuDNN")


def _leaderboard_rows(ours_ms=5.228, cudnn_ms=4.404, do_bench=(5.179, 5.122)):
    """The 2026-11-24 21:04 run's numbers: cuDNN's do_bench 16% above its events, ours level."""
    def row(impl, mode, ms, db):
        return bench("leaderboard", dict(impl=impl, mode=mode, **SHAPE), ms / 1e3, device=DEV,
                     when="2026-11-24T21:04:00", iqr=0.05e-3, metrics={Metric.DO_BENCH_MS: db})
    return [row("flash_triton", "fwd_bwd", ours_ms, do_bench[0]), row("sdpa_cudnn", "fwd_bwd", cudnn_ms, do_bench[1]),
            row("flash_triton", "fwd", 1.288, 1.493), row("sdpa_cudnn", "fwd", 1.281, 1.300)]


def test_the_probe_reads_interleaved_ratios_and_each_sides_timers(tmp_path):
    _probe_file(tmp_path)
    p = tp.probe_of(tmp_path, DEV, "flash_triton", "fwd_bwd", **SHAPE)
    assert p.path == f"reports/data/{DEV}/probes/do_bench_vs_events_abc1234.json" and p.at(**SHAPE)
    assert p.ours == "flash_triton"  # a file from before --ours timed the compiled Triton path
    assert not p.at(**dict(SHAPE, seq=8192)) and not p.at(**dict(SHAPE, causal=False))
    assert (p.interleaved["fwd_bwd"].median, p.interleaved["fwd"].n) == (1.167, 20)
    t = p.timers("sdpa_cudnn", "fwd_bwd")
    assert t.event_s == pytest.approx(4.55e-3) and t.do_bench_over_event == pytest.approx(4.68 / 4.55)
    assert t.band == pytest.approx((4.55e-3 - 0.6e-3, 4.55e-3 + 0.6e-3)) and not t.disagrees
    assert tp.probe_of(tmp_path, "h200-141gb-x2", "flash_triton", "fwd_bwd", **SHAPE) is None


def test_a_probe_is_read_only_for_its_own_impl_shape_and_mode(tmp_path):
    """Newer files (by name) of flash_auto at the leaderboard shape, of flash_triton at another shape and of
    flash_triton's forward alone are never read as the compiled-Triton fwd+bwd headline's probe: the older file that
    names no impl (flash_triton) at the shape is; flash_auto's headline reads flash_auto's file, its timers ours'."""
    _probe_file(tmp_path, "do_bench_vs_events_0000000.json")
    _probe_file(tmp_path, "do_bench_vs_events_fffffff-auto-1x16x16384x64.json", ours="flash_auto", fwd_bwd=1.03)
    _probe_file(tmp_path, "do_bench_vs_events_fffffff-triton-4x32x4096x128.json", ours="flash_triton",
                shape=(4, 32, 4096, 128), fwd_bwd=1.5)
    _probe_file(tmp_path, "do_bench_vs_events_fffffff-triton-fwd.json", ours="flash_triton", modes=("fwd",))
    triton = tp.probe_of(tmp_path, DEV, "flash_triton", "fwd_bwd", **SHAPE)
    assert triton.path.endswith("do_bench_vs_events_0000000.json") and triton.interleaved["fwd_bwd"].median == 1.167
    assert tp.probe_of(tmp_path, DEV, "flash_triton", "fwd", **SHAPE).path.endswith("triton-fwd.json")
    auto = tp.probe_of(tmp_path, DEV, "flash_auto", "fwd_bwd", **SHAPE)
    assert auto.path.endswith("auto-1x16x16384x64.json") and auto.interleaved["fwd_bwd"].median == 1.03
    assert tp.check(auto, _headline(), "fwd_bwd").ours.event_s == pytest.approx(5.4e-3)  # read as flash_auto's rows
    assert tp.probe_of(tmp_path, DEV, "flash_auto", "fwd_bwd", **dict(SHAPE, seq=4096, d=128, batch=4)) is None
    wide = tp.probe_of(tmp_path, DEV, "flash_triton", "fwd_bwd", **dict(SHAPE, batch=4, heads=32, seq=4096, d=128))
    assert wide.interleaved["fwd_bwd"].median == 1.5


def test_a_flash_auto_probe_is_not_set_beside_the_compiled_triton_headline(tmp_path):
    """The only probe at the leaderboard shape timed flash_auto: the leaderboard (compiled Triton's headline) and
    flash_forward set none beside theirs."""
    _probe_file(tmp_path, "do_bench_vs_events_fffffff-auto-1x16x16384x64.json", ours="flash_auto")
    ctx = context(_leaderboard_rows(), tmp_path)
    assert leaderboard.facts(ctx).answer.probe is None and flash_attention.facts(ctx).anchor.probe is None


def test_the_leaderboard_sets_the_probe_beside_its_headline_which_stays_the_events(tmp_path):
    _probe_file(tmp_path)
    f = leaderboard.facts(context(_leaderboard_rows(), tmp_path))
    a = f.answer
    assert round(a.headline.ratio.value, 2) == 1.19  # the headline rule is unchanged
    c = a.probe
    assert c.mode == "fwd_bwd" and c.interleaved.median == 1.167
    assert c.interleaved.holds(c.event_ratio) and not c.interleaved.holds(c.do_bench_ratio)
    assert c.anchor.do_bench_over_event == pytest.approx(4.68 / 4.55) and not c.anchor.disagrees
    assert f"reports/data/{DEV}/probes/do_bench_vs_events_abc1234.json" in f.sources
    text = render_page("leaderboard.md.j2", f=f)
    assert "**1.19× SDPA cuDNN (slower)**" in text
    assert "ours ÷ SDPA cuDNN (forward+backward) read a median of **1.167× (IQR 1.137–1.197)**" in text
    assert "The headline above (1.19×) lies inside that IQR, and do_bench's same-run ratio (1.01×) outside it." in text
    assert "For SDPA cuDNN the probe's do_bench read 4.680 ms against an event median of 4.550 ms (+2.9%, " \
           "within noise); in this run +16.3% (beyond noise)." in text
    assert "This run's do_bench gap for SDPA cuDNN did not repeat in the probe." in text
    assert "is not measured yet" not in text and "cold L2" not in text


def test_a_probe_at_another_shape_is_not_set_beside_the_headline(tmp_path):
    _probe_file(tmp_path, shape=(1, 16, 8192, 64))
    f = leaderboard.facts(context(_leaderboard_rows(), tmp_path))
    assert f.answer.probe is None
    text = render_page("leaderboard.md.j2", f=f)
    assert "Why do_bench moves for SDPA cuDNN is not measured yet" in text and "separate probe" not in text


def test_flash_forward_sets_the_probes_forward_beside_its_headline(tmp_path):
    _probe_file(tmp_path)
    f = flash_attention.facts(context(_leaderboard_rows(), tmp_path))
    c = f.anchor.probe
    assert c.mode == "fwd" and c.interleaved.median == 0.998
    assert c.interleaved.holds(c.event_ratio) and not c.interleaved.holds(c.do_bench_ratio)
    text = render_page("flash_attention.md.j2", f=f)
    assert "ours ÷ cuDNN (forward) read a median of **0.998× (IQR 0.990–1.016)**" in text
    assert "This run's do_bench gap for ours did not repeat in the probe." in text
    assert f"reports/data/{DEV}/probes/do_bench_vs_events_abc1234.json" in f.sources


def test_the_committed_probe_is_at_the_leaderboard_shape_and_both_pages_read_it(tmp_path):
    """The committed probe (2fbd353) ran at the leaderboard's shape: both pages set it beside their headlines, the
    leaderboard's still the CUDA-event ratio of its run."""
    from impl.report import build

    ctx = build.context(ROOT / "reports" / "data", tmp_path)
    ctx = type(ctx)(reports_dir=ROOT / "reports", fig_dir=tmp_path / "figures", rows=ctx.rows)
    lb = leaderboard.facts(ctx).answer
    assert lb.probe is not None and lb.probe.mode == "fwd_bwd"
    h = lb.headline
    assert lb.probe.event_ratio == h.ratio.value  # beside the headline, not in its place
    i = lb.probe.interleaved
    assert i.q1 <= i.median <= i.q3 and i.n >= 10
    fa = flash_attention.facts(ctx).anchor
    assert fa.probe is not None and fa.probe.mode == "fwd"
