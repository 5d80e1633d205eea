"""torch_compile (impl.report.pages.torch_compile): facts from synthetic rows, and the page's words as a
snapshot."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from impl.bench.row import Metric, Status
from impl.report.pages import Kind
from impl.report.pages import torch_compile as page
from impl.report.templating import render_page
from impl.workloads.compiled import WHY
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "torch_compile"
DEVICE = "h100-80gb-x1"
SHAPE = dict(d_model=64, seq=4096, mode="forward")


def _att(impl, seconds, when="2026-12-02T00:00:00", status=Status.MEASURED, **shape):
    cfg = dict(SHAPE, **shape)
    problem, section = (P, "torch_compile_attention") if impl else ("pytorch_attention", "pytorch_attention")
    return bench(problem, dict(cfg, impl=impl, backend="inductor") if impl else cfg,
                 seconds if status is Status.MEASURED else None, device=DEVICE, section=section, when=when,
                 status=status, reason=None if status is Status.MEASURED else "CUDA out of memory",
                 details=dict(study="attention", compile_forward_s=1.5, compile_backward_s=0.5, baseline_bytes=0,
                              memory_before_backward_bytes=2**30) if impl else dict(baseline_bytes=0))


def _model(size, context, impl, seconds, mode="forward", status=Status.MEASURED, details=None, first=None,
           reason="time budget exhausted"):
    return bench(P, dict(size=size, context=context, mode=mode, impl=impl, study="model"),
                 seconds if status is Status.MEASURED else None, device=DEVICE, section="torch_compile_model",
                 when="2026-12-01T00:00:00", status=status,
                 reason=None if status is Status.MEASURED else reason,
                 metrics={Metric.FIRST_CALL_S: first} if first else {},
                 details=dict(compiled_what="regional", **(details or {})))


def _model_rows():
    return [_model("small", 128, "eager", 0.02),
            _model("small", 128, "compiled", 0.01, details=dict(compiled_now=True, compile_s=9.99, graph="inference",
                                                                graph_breaks=0), first=10.0),
            _model("small", 256, "eager", 0.04), _model("small", 256, "compiled", 0.03,
                                                        details=dict(graph="inference", reused_graph=True)),
            _model("xl", 128, "eager", 0.2), _model("xl", 128, "compiled", 0.18),
            _model("xl", 256, "eager", 0.4), _model("xl", 256, "compiled", status=Status.LEFT_OUT_BY_BUDGET,
                                                    seconds=None),
            _model("small", None, "eager", 0.001, mode="optimizer_step"),
            _model("small", None, "compiled", 0.002, mode="optimizer_step")]


def test_a_ratio_pairs_rows_of_one_run_only(tmp_path):
    compiled = _att("compiled", 1.0)
    same = _att("eager", 2.0)
    other = _att(None, 4.0, when="2026-12-01T00:00:00")
    (r,) = page.facts(context([compiled, other], tmp_path)).attention.rows
    assert r.forward.ratio is None
    (r,) = page.facts(context([compiled, same, other], tmp_path)).attention.rows
    assert r.forward.ratio.value == 0.5 and r.forward.ratio.verdict == "faster"


def test_a_answers_from_the_newest_run_that_timed_eager_beside_compiled(tmp_path):
    rows = [_att("compiled", 1.0), _att("eager", 2.0), _att("compiled", 3.0, when="2026-11-01T00:00:00", seq=1024),
            _att("eager", 9.0, when="2026-11-01T00:00:00", seq=1024), _att(None, 4.0, when="2026-11-30T00:00:00")]
    a = page.facts(context(rows, tmp_path)).attention
    assert [(seq, r.value) for seq, r in a.paired] == [(4096, 0.5)]  # the older run is left out
    assert a.longest_range == (0.5, 0.5) and len(a.runs.runs) == 1
    (r,) = a.rows
    assert r.forward.ratio.value == 0.5 and r.forward.eager.value == 2.0 and r.backward.eager is None
    assert (r.compile_forward_s, r.eager_before_backward) == (1.5, None)


def test_a_without_eager_in_its_run_shows_another_runs_eager_undivided(tmp_path):
    rows = [_att("compiled", 1.0), _att("compiled", None, status=Status.OOM, seq=16384),
            _att(None, 4.0, when="2026-11-30T00:00:00")]
    f = page.facts(context(rows, tmp_path))
    a = f.attention
    assert a.paired == [] and a.eager_runs is not None and a.not_run_rows == 1
    assert a.rows[0].forward.eager.value == 4.0 and a.rows[0].forward.ratio is None
    assert a.rows[1].forward.compiled.status == "OOM"
    assert f.scores[P].kind is Kind.MEASURED and f.scores[P].date == "2026-12-02"


def test_b_is_compiled_over_eager_of_one_run():
    def row(size, ctx, impl, t, when="2026-12-02T00:00:00"):
        return bench(P, dict(size=size, context=ctx, mode="forward", impl=impl), t, when=when)
    rows = [row("small", 128, "eager", 2.0), row("small", 128, "compiled", 1.0),
            row("xl", 128, "eager", 2.0), row("xl", 128, "compiled", 1.8),
            row("xl", 256, "compiled", 0.1, when="2026-12-03T00:00:00")]  # another run's row: no pair
    (m,) = page.mode_ratios(rows)
    assert m.by_size == {"small": 0.5, "xl": 0.9} and m.gain_shrinks


def test_b_tables_read_medians_first_calls_reused_graphs_and_budget_cuts(tmp_path):
    m = page.facts(context(_model_rows(), tmp_path)).model
    assert m.modes == ("forward",) and m.stat == "median"
    small = m.rows[0]
    assert (small.size, small.context, small.modes[0].eager.value, small.modes[0].ratio.value) == ("small", 128, 0.02, 0.5)
    assert small.train_step == page.Times(None, None, None)  # no forward_backward rows to add the optimizer step to
    cut = m.rows[-1]
    assert (cut.size, cut.context, cut.modes[0].compiled.status) == ("xl", 256, "left out (budget)")
    (c,) = m.compilations
    assert (c.size, c.graph, c.context, c.first_call_s, c.compile_s, c.reused_at, c.graph_breaks) == \
        ("small", "inference", 128, 10.0, 9.99, (256,), 0)
    ((reason, left_out),) = m.left_out_by_reason
    assert reason == "time budget exhausted"
    assert [(x.size, x.context, x.parts) for x in left_out] == [("xl", 256, (("forward", "compiled"),))]
    assert [(size, c.ratio.value) for size, c in m.optimizer] == [("small", 2.0)]


def test_b_says_why_from_the_code_never_a_stored_copy(tmp_path):
    """An older run stored prose with hand-typed compile times as `compiled_why`: the page says the
    code's WHY, which carries no figures."""
    rows = [_model("small", 128, "eager", 0.02, details=dict(compiled_why="the whole small model took 31 + 65 s"))]
    m = page.facts(context(rows, tmp_path)).model
    assert m.why == WHY and not re.search(r"\d", WHY)


def test_committed_a_divides_within_one_run(tmp_path):
    """(a) answers from the newest run that timed eager beside compiled: the whole grid (4 d x 5 seq x
    forward/backward) paired, from that one run."""
    from impl.report import build

    a = page.facts(build.context(ROOT / "reports" / "data", tmp_path)).attention
    assert len(a.paired) == 40 and len(a.runs.runs) == 1


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.device is None and f.scores[P].kind is Kind.NOT_MEASURED


def _attention_rows():
    return [_att("compiled", 1.0), _att("eager", 2.0), _att("compiled", 0.5, mode="backward"),
            _att("eager", 0.6, mode="backward"), _att("compiled", None, status=Status.OOM, seq=16384)]


def test_page_words(request, tmp_path):  # (b) without a timed training step: the derived column
    assert_snapshot(request, P, render_page("torch_compile.md.j2",
                                            f=page.facts(context(_attention_rows() + _model_rows(), tmp_path))))


@pytest.mark.parametrize("case", ["timed", "one context", "oom"])
def test_page_words_of_b(request, tmp_path, case):
    """(b)'s other wordings: a timed training step with rows left out by reason; a size that ran one context;
    out-of-memory rows with their closed-form need and the other implementation that ran."""
    rows = {"timed": _timed_rows, "one context": _one_context_rows, "oom": _oom_rows}[case]()
    assert_snapshot(request, f"{P}-{case.replace(' ', '_')}",
                    render_page("torch_compile.md.j2", f=page.facts(context(_attention_rows() + rows, tmp_path))))


OOM_IMPLIED = "not run: forward_backward eager ran out of memory at context 128"


def _timed_rows():
    """A run with timed training steps (issue 45): fwd+bwd, train_step, and an OOM-answered row."""
    rows = _model_rows()[:2] + [
        _model("small", 128, "eager", 0.05, mode="forward_backward"),
        _model("small", 128, "compiled", 0.04, mode="forward_backward"),
        _model("small", 128, "eager", 0.06, mode="train_step"),
        _model("small", 128, "compiled", 0.045, mode="train_step"),
        _model("small", None, "eager", 0.001, mode="optimizer_step"),
        _model("small", None, "compiled", 0.002, mode="optimizer_step"),
        _model("10B", 128, "eager", None, mode="train_step", status=Status.LEFT_OUT, reason=OOM_IMPLIED),
    ]
    return rows


def test_b_timed_train_step_is_its_own_column_not_a_sum(tmp_path):
    rows = _timed_rows()
    m = page.facts(context(rows, tmp_path)).model
    assert m.timed_train_step and m.modes == ("forward", "forward_backward", "train_step")
    small = m.rows[0]
    assert small.train_step is None  # no derived fwd+bwd + optimizer column beside the timed one
    assert small.modes[2].eager.value == 0.06 and small.modes[2].ratio.value == pytest.approx(0.75)
    assert [r.mode for r in m.answer] == ["forward", "forward_backward", "optimizer_step", "train_step"]


def test_b_without_timed_rows_the_training_step_is_derived(tmp_path):
    """No timed training step: the table's derived column (forward+backward + the optimizer step) stands
    in for it (the words: the `derived` snapshot)."""
    m = page.facts(context(_model_rows(), tmp_path)).model
    assert not m.timed_train_step and "train_step" not in m.modes and m.optimizer


def test_b_left_out_rows_are_grouped_by_reason(tmp_path):
    rows = _model_rows() + [_model("10B", 128, "eager", None, mode="train_step", status=Status.LEFT_OUT,
                                   reason=OOM_IMPLIED)]
    m = page.facts(context(rows, tmp_path)).model
    assert [(r, [(x.size, x.context) for x in xs]) for r, xs in m.left_out_by_reason] == \
        [("time budget exhausted", [("xl", 256)]), (OOM_IMPLIED, [("10B", 128)])]


def _one_context_rows():
    """The 10B's forward ran at context 128 only and its fwd+bwd ran out of memory."""
    return _model_rows()[:6] + [
        _model("small", 128, "eager", 0.05, mode="forward_backward"),
        _model("small", 128, "compiled", 0.04, mode="forward_backward"),
        _model("xl", 128, "eager", 0.5, mode="forward_backward"),
        _model("xl", 128, "compiled", 0.45, mode="forward_backward"),
        _model("10B", 128, "eager", 1.0), _model("10B", 128, "compiled", 0.96),
        _model("10B", 128, "eager", None, mode="forward_backward", status=Status.OOM, reason="CUDA out of memory",
               details=dict(closed_form_need_bytes=114e9)),
        _model("10B", 128, "compiled", None, mode="forward_backward", status=Status.OOM, reason="CUDA out of memory",
               details=dict(closed_form_need_bytes=114e9))]


def test_b_answer_takes_each_modes_largest_size_that_ran_both(tmp_path):
    """The forward's largest size is the 10B (its one context named), forward+backward's the largest size that
    ran it (xl), not a missing 10B."""
    m = page.facts(context(_one_context_rows(), tmp_path)).model
    fwd, fb = m.answer
    assert list(fwd.by_size) == ["small", "10B"] and fwd.by_size["10B"] == pytest.approx(0.96)
    assert fwd.only_context("10B") == 128 and fwd.only_context("small") is None
    assert list(fb.by_size) == ["small", "xl"] and fb.by_size["xl"] == pytest.approx(0.9)
    assert fb.only_context("xl") is None is fb.only_context("small")  # one context each: none is marked


def test_b_out_of_memory_rows_are_listed_with_their_closed_form_need(tmp_path):
    """OOM rows are listed per (size, context, mode) with the need they recorded; where the other impl of the same
    cell ran, the page says so with its time and peak."""
    m = page.facts(context(_oom_rows(), tmp_path)).model
    assert [(x.size, x.context, x.mode, x.impls, x.need_bytes) for x in m.oom] == [
        ("xl", 1024, "train_step", ("eager",), 90.3e9), ("2.7B", 1024, "train_step", ("eager", "compiled"), 112.5e9)]
    assert m.oom[0].other_peak == 70_553_039_872 and m.oom[1].other_ran is None
    assert (m.oom[0].other_ran.step_s, m.oom[0].other_ran.row.config["impl"]) == (1.35, "compiled")


def _oom_rows():
    oom = dict(status=Status.OOM, reason="CUDA out of memory", mode="train_step")
    return _model_rows() + [
        _model("xl", 1024, "eager", None, details=dict(closed_form_need_bytes=90.3e9), **oom),
        bench(P, dict(size="xl", context=1024, mode="train_step", impl="compiled", study="model"), 1.35,
              device=DEVICE, section="torch_compile_model", when="2026-12-01T00:00:00", peak=70_553_039_872,
              details=dict(compiled_what="regional")),
        _model("2.7B", 1024, "eager", None, details=dict(closed_form_need_bytes=112.5e9), **oom),
        _model("2.7B", 1024, "compiled", None, details=dict(closed_form_need_bytes=112.5e9), **oom)]


def test_committed_b_uses_the_timed_training_step(tmp_path):
    """The 2fbd353 run timed training steps: the table's column and the answer read them (largest size that ran
    both: 2.7B), no derived sum or "no timed step" sentence is left, and its OOM rows are listed."""
    from impl.report import build

    f = page.facts(build.context(ROOT / "reports" / "data", tmp_path))
    m = f.model
    assert m.timed_train_step and "train_step" in m.modes
    step = next(r for r in m.answer if r.mode == "train_step")
    assert list(step.by_size) == ["small", "2.7B"]
    assert all(r.train_step is None for r in m.rows)
    assert ("xl", 1024, "train_step") in {(x.size, x.context, x.mode) for x in m.oom}
