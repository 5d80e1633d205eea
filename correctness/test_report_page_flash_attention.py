"""flash_attention (impl.report.pages.flash_attention): facts from synthetic rows and a synthetic
probe file, and the page's words as a snapshot."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from impl.bench.row import Metric, Status
from impl.report.flash_rows import Kernel
from impl.report.pages import Kind
from impl.report.pages import flash_attention as page
from impl.report.templating import render_page
from kits.report_rows import template_macros as macros
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
DEV = "h100-80gb-x1"
SHAPE = dict(batch=1, heads=16, seq=16384, d=64, dtype="bf16", causal=True)


def _lb(impl, mode, seconds, when="2026-11-24T21:00:00", status=Status.MEASURED, do_bench_ms=None):
    metrics = {Metric.DO_BENCH_MS: do_bench_ms} if do_bench_ms is not None else None
    return bench("leaderboard", dict(impl=impl, mode=mode, **SHAPE), seconds, device=DEV, when=when, status=status,
                 metrics=metrics)


def _leaderboard(when="2026-11-24T21:00:00", ours_bwd=True):
    rows = [_lb("flash_triton", "fwd", 1.2e-3, when), _lb("sdpa_cudnn", "fwd", 1.0e-3, when),
            _lb("sdpa_cudnn", "fwd_bwd", 4.0e-3, when)]
    return rows + [_lb("flash_triton", "fwd_bwd", 5.2e-3, when) if ours_bwd
                   else _lb("flash_triton", "fwd_bwd", None, when, Status.OOM)]


def _ms(b2, ba, e2, ea):
    return {"ours bwd two_pass": b2, "ours bwd atomic": ba, "ours fwd+bwd two_pass": e2, "ours fwd+bwd atomic": ea}


def _probe(reports: Path, device: str = DEV) -> None:
    shape = dict(batch=1, heads=2, seq=4096, d=64, causal=True)
    path = reports / "data" / device / "probes" / page.PROBE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dict(device="NVIDIA H100", rows=[
        dict(shape=dict(shape, label="leaderboard"), ms=_ms(1.0, 0.9, 2.0, 2.2)),
        dict(shape=dict(shape, causal=False), ms=_ms(1.0, 1.1, 2.0, 1.8)),
        dict(shape=shape, ms={"ours bwd two_pass": 1.0})])))


def test_backward_probe_counts_shapes_where_atomic_was_slower(tmp_path):
    _probe(tmp_path)
    p = page.facts(context(_leaderboard(), tmp_path)).probe
    assert len(p.shapes) == 2 and (p.slower_e2e, p.slower_bwd) == (1, 1)  # the half-timed shape is left out
    assert p.shapes[0].shape == dict(batch=1, heads=2, seq=4096, d=64, causal=True, label="leaderboard")
    assert round(p.shapes[0].atomic_over_two_pass, 2) == 1.1
    assert p.path == f"reports/data/{DEV}/probes/{page.PROBE}"


def test_scores_read_ours_over_cudnn_of_the_newest_leaderboard_rows(tmp_path):
    f = page.facts(context(_leaderboard(), tmp_path, history=_leaderboard("2026-11-20T00:00:00")))
    a = f.anchor
    assert (a.forward.ours.event_s, a.date) == (pytest.approx(1.2e-3), "2026-11-24")
    assert round(a.forward.ratio.value, 2) == 1.2 and a.forward.ratio.verdict == "slower"
    assert (a.backward.ours_s, a.backward.anchor_s) == (pytest.approx(4e-3), pytest.approx(3e-3))  # fwd+bwd − fwd
    assert f.scores[page.P.FLASH_FORWARD] == f.scores[page.P.FLASH_BACKWARD] == page.Scored(
        Kind.MEASURED, "NVIDIA H200", "2026-11-24")


def test_do_bench_flattering_cudnn_forward_headlines_the_events_and_shows_both(tmp_path):
    """flash_forward's headline follows the report's one rule: where do_bench reads ours' forward 16% above
    its events (the 2026-11-24 21:04 run: 1.493 against 1.288 ms) and cuDNN's level, do_bench's ratio
    (1.15×) stands beside the events' (1.01×, within noise), and ours is named with both numbers."""
    rows = [_lb("flash_triton", "fwd", 1.288e-3, do_bench_ms=1.493),
            _lb("sdpa_cudnn", "fwd", 1.281e-3, do_bench_ms=1.283)]
    f = page.facts(context(rows, tmp_path))
    h = f.anchor.forward
    assert round(h.ratio.value, 2) == 1.01 and h.ratio.verdict == "within noise" and round(h.do_bench.value, 2) == 1.16
    assert [name for name, _ in h.disagreements] == ["ours"]
    assert f.sources == (f"reports/data/{DEV}/leaderboard/20261124T2100Z_abcdef12.json",)
    vs = macros("flash_attention.md.j2").score_vs(f, "flash_forward")
    assert vs.startswith("1.01× cuDNN (within noise); do_bench beside: 1.16×") and "ours (+15.9%)" in vs
    ours = h.disagreements[0][1]  # named with both its numbers (the words: the page's snapshot)
    assert (ours.do_bench_s, ours.event_s) == (pytest.approx(1.493e-3), pytest.approx(1.288e-3))
    assert f.anchor.kernel == Kernel("flash_triton", "fwd", **SHAPE)  # the shape the page names


def test_the_backward_headlines_the_events_differences_with_do_bench_beside(tmp_path):
    """The backward (forward+backward less the forward): the 2026-11-24 21:04 run's rows read 1.26× cuDNN by the
    events and 0.96× by do_bench (ours' forward and cuDNN's forward+backward both moved by do_bench). The
    headline is the events' with a noise verdict; do_bench's stands beside, with the moved rows named."""
    rows = [_lb("flash_triton", "fwd", 1.288e-3, do_bench_ms=1.493),
            _lb("sdpa_cudnn", "fwd", 1.281e-3, do_bench_ms=1.300),
            _lb("flash_triton", "fwd_bwd", 5.228e-3, do_bench_ms=5.179),
            _lb("sdpa_cudnn", "fwd_bwd", 4.404e-3, do_bench_ms=5.122)]
    a = page.facts(context(rows, tmp_path)).anchor
    assert round(a.backward.value, 2) == 1.26 and a.backward.verdict == "slower"
    assert round(a.backward_do_bench.value, 2) == 0.96
    assert [n for n, _ in a.forward_backward.disagreements] == ["cuDNN"]
    f = page.facts(context(rows, tmp_path))
    vs = macros("flash_attention.md.j2").score_vs(f, "flash_backward")
    assert vs.endswith("1.26× cuDNN (slower); do_bench beside: 0.96×")
    assert [n for n, _ in a.forward.disagreements] == ["ours"]  # the rows do_bench moved, named beside
    assert round(a.forward.ours.do_bench_over_event - 1, 3) == 0.159


def test_a_missing_forward_backward_row_leaves_the_backward_answered_from_the_code(tmp_path):
    f = page.facts(context(_leaderboard(ours_bwd=False), tmp_path))
    assert f.anchor.backward is None
    assert f.scores[page.P.FLASH_FORWARD].kind is Kind.MEASURED
    assert f.scores[page.P.FLASH_BACKWARD] == page.Scored(Kind.CLOSED_FORM)


def test_no_rows_and_no_probe(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.anchor is None and f.probe is None and f.sources == ()
    assert all(s.kind is Kind.CLOSED_FORM for s in f.scores.values())


def test_code_facts_and_the_tests_of_the_built_repository(tmp_path):
    (tmp_path / "correctness").mkdir()
    (tmp_path / "correctness" / "test_attention.py").write_text(
        "def test_other():\n    pass\ndef test_triton_backward_variants_x(a):\n    pass\n"
        "def test_flash_y():\n    pass\n")
    f = page.facts(context([], tmp_path / "reports"))
    assert f.block_q > 0 and f.block_k > 0
    assert f.tests == ("test_flash_y", "test_triton_backward_variants_x")


def test_page_words(request, tmp_path):
    _probe(tmp_path)
    rows = [_lb("flash_triton", "fwd", 1.2e-3, do_bench_ms=1.4), _lb("sdpa_cudnn", "fwd", 1.0e-3, do_bench_ms=1.01),
            _lb("sdpa_cudnn", "fwd_bwd", 4.0e-3, do_bench_ms=4.5),
            _lb("flash_triton", "fwd_bwd", 5.2e-3, do_bench_ms=5.2)]
    f = page.facts(context(rows, tmp_path))
    assert_snapshot(request, "flash_attention", render_page("flash_attention.md.j2", f=f))
