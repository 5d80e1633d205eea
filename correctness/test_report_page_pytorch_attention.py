"""pytorch_attention (impl.report.pages.pytorch_attention): facts from synthetic rows, and the page's
words as a snapshot."""
from __future__ import annotations

import pytest

from impl.attention.memory import naive_attention_memory
from impl.bench.row import Metric, Status
from impl.report.pages import Kind, Scored
from impl.report.pages import pytorch_attention as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

P = "pytorch_attention"
DEVICE = "h100-80gb-x1"
BASE = 1000  # bytes allocated before the inputs


def _row(d, seq, mode, seconds=None, status=Status.MEASURED, device=DEVICE, when="2026-11-22T04:55:00"):
    m = naive_attention_memory(8, seq, d, "fp32")
    details = dict(baseline_bytes=BASE, tf32=False)
    if mode == "backward":
        details["memory_before_backward_bytes"] = BASE + m.before_backward
    peak = BASE + (m.backward_peak if mode == "backward" else m.forward_peak + m.grad_output)
    measured = status is Status.MEASURED
    return bench(P, dict(d_model=d, seq=seq, mode=mode, batch=8, dtype="fp32"), seconds if measured else None,
                 device=device, when=when, status=status, details=details, peak=peak if measured else None,
                 metrics={Metric.TFLOPS: 4 * 8 * seq * seq * d / seconds / 1e12} if measured and mode == "forward" else {},
                 reason=None if measured else "CUDA out of memory")


def _grid(oom=(), dims=(16, 64)):
    """`dims` at seq 4096 and 16384: forward t, backward 2t; the (d, seq) cases in `oom` run out of memory."""
    out = []
    for d in dims:
        for seq in (4096, 16384):
            t = 1e-3 * (seq / 4096) ** 2 * (1 + d / 64)
            oom_ = (d, seq) in oom
            out += [_row(d, seq, "forward", t, Status.OOM if oom_ else Status.MEASURED),
                    _row(d, seq, "backward", 2 * t, Status.OOM if oom_ else Status.MEASURED)]
    return out


def test_without_oom_the_largest_case_answers_and_is_accounted(tmp_path):
    f = page.facts(context(_grid(), tmp_path))
    assert f.first_oom is None and (f.largest.d, f.largest.seq) == (64, 16384)
    assert (f.largest.forward.value, f.largest.backward.value) == pytest.approx((32e-3, 64e-3))
    a = f.accounting
    assert (a.d, a.seq, a.oom) == (64, 16384, False)
    assert a.derived == naive_attention_memory(8, 16384, 64, "fp32")
    assert a.half == naive_attention_memory(8, 8192, 64, "fp32")
    assert a.before_backward.value == a.derived.before_backward  # measured = allocated minus the baseline
    assert a.backward_peak.value == a.derived.backward_peak
    assert f.scores[P] == Scored(Kind.MEASURED, DEVICE, "2026-11-22")
    assert f.runs.files == [f"reports/data/{DEVICE}/{P}/20261122T0455Z_abcdef12.json"]


def test_the_smallest_oom_case_is_named_and_accounted_with_its_own_memory(tmp_path):
    f = page.facts(context(_grid(oom={(16, 16384), (64, 16384)}), tmp_path))
    assert (f.first_oom.d_model, f.first_oom.seq, f.first_oom.mode) == (16, 16384, "forward")
    assert (f.largest.d, f.largest.seq) == (64, 4096)  # the largest case that ran
    a = f.accounting
    assert (a.d, a.seq, a.oom) == (16, 16384, True)
    assert a.derived == naive_attention_memory(8, 16384, 16, "fp32")
    assert a.before_backward.status == "OOM" == a.backward_peak.status
    row = next(r for r in f.table if (r.d, r.seq) == (16, 16384))
    assert row.forward.status == "OOM" and row.tflops is None and row.backward_peak.value is None
    assert f.not_run == (("OOM", "CUDA out of memory"),)


def test_table_cells_read_each_rows_median_and_bytes_above_the_baseline(tmp_path):
    rows = _grid()
    f = page.facts(context(rows, tmp_path))
    assert [(r.d, r.seq) for r in f.table] == [(16, 4096), (16, 16384), (64, 4096), (64, 16384)]
    r = f.table[0]
    assert r.forward.value == pytest.approx(1.25e-3) and r.backward.value == pytest.approx(2.5e-3)
    assert r.before_backward.value == naive_attention_memory(8, 4096, 16, "fp32").before_backward
    assert r.tflops == pytest.approx(4 * 8 * 4096 ** 2 * 16 / 1.25e-3 / 1e12)


def test_times_come_from_the_rows(tmp_path):
    """Every timed number scales with the rows' medians: no time is typed."""
    f = page.facts(context(_grid(), tmp_path))
    scaled = [_row(page.cfg(b).d_model, page.cfg(b).seq, page.cfg(b).mode, b.stats.median * 1.37) for b in _grid()]
    g = page.facts(context(scaled, tmp_path))
    assert g.largest.forward.value == pytest.approx(f.largest.forward.value * 1.37)
    assert g.largest.backward.value == pytest.approx(f.largest.backward.value * 1.37)
    assert g.seed.forward_s == pytest.approx(f.seed.forward_s * 1.37)


def test_seed_comparison_reads_its_shape_and_the_smallest_d(tmp_path):
    f = page.facts(context(_grid(), tmp_path))
    s = f.seed
    assert (s.batch, s.dtype, s.small_d, s.tf32) == (8, "fp32", 16, False)
    assert s.forward_s == pytest.approx(32e-3) and s.backward_s == pytest.approx(64e-3)
    assert s.bps == pytest.approx(6 * 8 * 16384 ** 2 * 4 / 32e-3)
    assert s.seed_bps == pytest.approx(s.bps * 32 / page.SEED_NAIVE.forward_ms)


def test_the_first_gpu_with_rows_answers(tmp_path):
    rows = _grid() + [_row(16, 4096, "forward", 1.0, device="h200-141gb-x2")]
    assert page.facts(context(rows, tmp_path)).runs.device == DEVICE


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.scores[P].kind is Kind.NOT_MEASURED and f.runs is None


def test_page_words(request, tmp_path):
    assert_snapshot(request, P, render_page("pytorch_attention.md.j2", f=page.facts(context(_grid(oom={(128, 16384)}, dims=(16, 64, 128)), tmp_path))))
