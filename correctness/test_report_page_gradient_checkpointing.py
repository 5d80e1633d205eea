"""gradient_checkpointing (impl.report.pages.gradient_checkpointing): facts from synthetic rows, and the
page's words as a snapshot."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.bench.row import Metric, Status
from impl.model.sizes import SizeRef
from impl.report import figures
from impl.report.pages import Kind
from impl.report.pages import gradient_checkpointing as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "gradient_checkpointing"
DEV = "h100-80gb-x1"
GiB = 2**30
PRED = dict(hook_terms=dict(peak=2 * GiB, activations=GiB), closed_form_fp32=dict(peak=3 * GiB))
TERMS = dict(closed_form_fp32=dict(a_block=3 * GiB, a_resid=GiB / 20),
             hook_terms=dict(a_block=3.3 * GiB, a_resid=GiB / 20, a_outside=0.75 * GiB))


def _policy(policy, k=None, dtype="bf16", peak=None, status=Status.MEASURED, median=0.3, reason=None,
            when="2026-11-23T06:44:00"):
    details = dict(predicted=PRED, predicted_block_forwards=48, measured_block_forwards=48.0, best_k=1,
                   best_k_rule="argmin", ks=[1, 2, 7], terms=TERMS)
    return bench(P, dict(size="xl", batch=4, context=2048, dtype=dtype, policy=policy, k=k, study="policies"),
                 median if status is Status.MEASURED else None, device=DEV, when=when, status=status, reason=reason,
                 details=details, peak=peak, metrics={Metric.TOKENS_PER_S: 1e4} if status is Status.MEASURED else {})


def _single(policy, k=None, peak=None, status=Status.MEASURED, pred=GiB, when="2026-11-24T15:36:00"):
    details = dict(best_k=1, best_k_rule="argmin", terms={"closed_form_fp32": {"a_block": 4.6e9, "a_resid": 8.4e7}},
                   predicted={"closed_form_fp32": {"peak": pred, "activations": pred / 2}},
                   measured_block_forwards=63.0 if k else None)
    return bench(P, dict(size="xl", edition="2026", batch=4, context=2048, dtype="fp32", study=page.STUDY_2026,
                         policy=policy, k=k), 5.7 if status is Status.MEASURED else None, device=DEV, when=when,
                 status=status, details=details, peak=peak)


def _depth(policy, layers, peak):
    details = dict(predicted=dict(hook_terms=dict(peak=peak * 1.1, activations=peak / 2)), predicted_block_forwards=layers)
    return bench(P, dict(width="xl", batch=1, context=2048, dtype="bf16", policy=policy, layers=layers, study="depth"),
                 0.1, device=DEV, details=details, peak=peak, when="2026-11-23T06:44:00")


def _older():
    return [_policy("none", status=Status.OOM, reason="CUDA out of memory"),
            _policy("nested", peak=int(2.5 * GiB)), _policy("every_k", 1, peak=int(2.4 * GiB)),
            _policy("every_k", 2, peak=int(2.6 * GiB)),
            _policy("every_k", 7, status=Status.LEFT_OUT_BY_BUDGET, reason="time budget exhausted"),
            _policy("nested", dtype="fp32", peak=int(2.7 * GiB))]


def _rows_2026():
    return [_single("every_k", 2, peak=40e9), _single("none", status=Status.OOM, pred=176e9),
            _single("every_k", 1, peak=36e9), _single("every_k", 6, peak=57e9)]


def test_single_level_reads_the_closed_forms_k_and_its_neighbours_measured_peaks(tmp_path):
    f = page.facts(context(_rows_2026() + _older(), tmp_path))
    s = f.single
    assert [c.k for c in s.cases] == [None, 1, 2, 6] and s.layers == 32 and s.first.size_label.startswith("xl (2026)")
    assert s.best.peak == 36e9 and s.confirmed and s.date == "2026-11-24"
    lo, hi = s.neighbours
    assert lo.k is None and not lo.measured and lo.closed_form == 176e9  # OOM with its need
    assert hi.k == 2 and hi.peak == 40e9
    # the 2026 study answers (b) and the index: its run's date, not the older study's
    assert f.scores[P] == page.Scored(Kind.MEASURED, DEV, "2026-11-24") and not f.note


def test_nested_answer_reads_the_bf16_rows_and_no_checkpointings_oom(tmp_path):
    f = page.facts(context(_older(), tmp_path))
    n = f.nested
    assert (n.peak, n.dtype, n.context, n.predicted, n.forwards, n.model_layers) == (
        int(2.5 * GiB), "bf16", 2048, 2 * GiB, 48, 48)
    assert f.nested_none.status is Status.OOM and n.size_label == SizeRef("2025", "xl").label
    assert f.best_k.peaks == [(1, int(2.4 * GiB)), (2, int(2.6 * GiB))] and f.best_k.lowest == 1 == f.best_k.best_k
    # no 2026 study: the older rows answer, noted as another size than the question's
    assert f.single is None and f.note and f.older_sizes == [SizeRef("2025", "xl").label]
    assert f.scores[P] == page.Scored(Kind.MEASURED, DEV, "2026-11-23")


def test_policy_table_rows_ooms_and_rows_not_run_are_named(tmp_path):
    """Bench-layer rows: the measured peak from the row's memory, predictions and block forwards from
    details, the step's median; an OOM and a budget cut."""
    p = page.facts(context(_older(), tmp_path))
    assert [b.name for b in p.not_run] == [_older()[4].name] and p.not_run[0].reason == "time budget exhausted"
    pol = p.policies
    assert pol.unit == "GiB" and pol.stat == "median" and pol.first.details["ks"] == [1, 2, 7]
    assert [d for d, _ in pol.by_dtype] == ["bf16", "fp32"]
    rows = dict(pol.by_dtype)["bf16"]
    assert [(r.policy, r.k) for r in rows] == [("none", None), ("nested", None), ("every_k", 1), ("every_k", 2),
                                               ("every_k", 7)]
    nested = rows[1]
    assert (nested.peak / GiB, nested.predicted / GiB, nested.over_predicted, nested.closed_form / GiB) == (
        2.5, 2.0, 1.25, 3.0)
    assert (nested.step_s, nested.tokens_per_s, nested.forwards, nested.forwards_predicted) == (0.3, 1e4, 48.0, 48)
    assert rows[0].status is Status.OOM and rows[0].over_predicted is None and rows[4].not_run
    assert list(pol.hooks) == ["bf16", "fp32"] and pol.closed_form["a_block"] == 3 * GiB


def test_depth_rows_and_the_figures_legend_are_the_series_drawn(tmp_path, monkeypatch):
    legends, save = [], figures.save

    def recording(fig, path):
        ax = fig.axes[0]
        legends.append(([t.get_text() for t in ax.get_legend().get_texts()], [x.get_label() for x in ax.lines]))
        save(fig, path)
    monkeypatch.setattr(figures, "save", recording)
    rows = [_depth(p, n, n * GiB / (4 if p == "nested" else 1)) for n in (16, 8) for p in ("none", "nested")]
    d = page.facts(context(rows, tmp_path)).depth
    assert [(r.layers, r.policy) for r in d.by_dtype[0][1]] == [(8, "nested"), (8, "none"), (16, "nested"), (16, "none")]
    assert d.figure == f"figures/gradient_checkpointing-{DEV}-depth.png" and (tmp_path / d.figure).is_file()
    assert legends == [(["none predicted", "none measured", "nested predicted", "nested measured"],) * 2]


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([bench(P, dict(policy="none"), 0.1, device="cpu")], tmp_path))
    assert f.runs is None and f.scores[P].kind is Kind.NOT_MEASURED and f.sources == []


def test_committed_rows_name_each_size_by_edition(tmp_path):
    """The policies study's rows are the 2025 table's xl (d_model 1600); the single_level_2026 rows
    are xl (2026), and they answer the index."""
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    assert f.older_sizes == [SizeRef("2025", "xl").label] and f.single.first.size_label == SizeRef("2026", "xl").label
    assert f.scores[P].kind is Kind.MEASURED and f.single.confirmed


def test_page_words(request, tmp_path):
    rows = _rows_2026() + _older() + [_depth(p, n, n * GiB / 2) for n in (8, 16) for p in ("none", "nested")]
    assert_snapshot(request, P, render_page(f"{P}.md.j2", f=page.facts(context(rows, tmp_path))))
