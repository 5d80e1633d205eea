"""distributed_communication (impl.report.pages.distributed_communication): facts from synthetic rows,
and the page's words as a snapshot."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.bench.row import Metric, Status
from impl.report.pages import Kind
from impl.report.pages import distributed_communication as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "distributed_communication_single_node"
O, W = 100e-6, 1e9  # t = o + S / w


def _ar(backend, n, nbytes, seconds=None, device="h200-141gb-x2", when="2026-11-26T04:00:00", status=Status.MEASURED,
        reason=None):
    busbw = nbytes / seconds / 1e9 * 2 * (n - 1) / n if seconds else None
    return bench(P, dict(backend=backend, world_size=n, bytes=nbytes), seconds, device=device, when=when,
                 status=status, reason=reason, iterations=3,
                 metrics={Metric.BUS_BW: busbw, Metric.ALG_BW: nbytes / seconds / 1e9} if seconds else {})


def _rows(device="h200-141gb-x2", when="2026-11-26T04:00:00", nccl_procs=(2,)):
    out = []
    for nbytes in (2**20, 10 * 2**20):
        out.append(_ar("gloo", 2, nbytes, (O + nbytes / W) * 50, device, when))
        for n in nccl_procs:
            out.append(_ar("nccl", n, nbytes, O + nbytes / W, device, when))
    out.append(_ar("nccl", 6, 2**20, device=device, when=when, status=Status.NEEDS_HARDWARE,
                   reason="NCCL needs one GPU per rank: 6 ranks, 2 GPU(s) here"))
    return out


def test_fit_recovers_latency_and_bandwidth_of_the_medians(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    fit = {(x.backend, x.processes): x for x in f.sections[0].fits}[("nccl", 2)]
    assert fit.o_s == pytest.approx(O) and fit.w_bps == pytest.approx(W)


def test_answer_reads_nccls_largest_size_and_gloo_at_the_same_processes(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    a = f.answer
    assert (a.size_bytes, a.nccl_procs) == (10 * 2**20, 2)
    assert a.gloo_over_nccl == pytest.approx(50)
    assert a.not_run == 1 and "needs_hardware" in a.reasons[0]
    assert f.scores[P].kind is Kind.MEASURED and f.scores[P].device == "h200-141gb-x2"


def test_the_run_with_most_nccl_process_counts_answers_and_the_other_is_history(tmp_path):
    rows = _rows() + _rows("h200-141gb-x4", "2026-11-25T00:00:00", nccl_procs=(2, 4))
    f = page.facts(context(rows, tmp_path))
    assert f.answer.nccl_procs == 4 and f.scores[P].device == "h200-141gb-x4"
    assert [h.device for h in f.history] == ["2× NVIDIA H200 (h200-141gb-x2)"]
    assert f.sources == sorted({b.run.file for b in rows})


def test_not_run_rows_are_table_cells_naming_their_reason(tmp_path):
    rows = page.facts(context(_rows(), tmp_path)).sections[0].rows
    assert [(*r.c.key, r.b.status, r.b.row.reason) for r in rows if r.b.status is not Status.MEASURED] == [
        ("nccl", 6, Status.NEEDS_HARDWARE, "NCCL needs one GPU per rank: 6 ranks, 2 GPU(s) here")]


def test_committed_fits_have_no_negative_per_call_overhead(tmp_path):
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    assert f.answer is not None and f.sections
    assert [x for s in f.sections for x in s.fits if x.o_s < 0] == []


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.answer is None and f.scores[P].kind is Kind.NOT_MEASURED


def test_page_words(request, tmp_path):
    rows = _rows() + _rows("h200-141gb-x4", "2026-11-25T00:00:00", nccl_procs=(2, 4))
    assert_snapshot(request, "distributed_communication", render_page("distributed_communication.md.j2",
                                                                      f=page.facts(context(rows, tmp_path))))
