"""benchmarking_script (impl.report.pages.benchmarking_script): facts from synthetic and committed rows,
and the page's words as a snapshot."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from impl.bench.row import Metric, Peaks, Status
from impl.report.pages import Kind
from impl.report.pages import benchmarking_script as page
from impl.report.rows import Stats
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
P = "benchmarking_script"
DEV = "h100-80gb-x1"


def _b(edition, size, mode, mean, study="main", status=Status.MEASURED, details=None, warmup=None, data=None,
       dtype="fp32", context_=512, median=None, device=DEV, when="2026-12-01T00:00:00", metrics=None, peak=None):
    """A benchmarking_script row whose stats mean is `mean` (the median `median`, by default the mean)."""
    cfg = dict(size=size, edition=edition, context=context_, dtype=dtype, mode=mode, study=study, batch=4)
    if warmup is not None:
        cfg["warmup"] = warmup
    b = bench(P, cfg, None if mean is None else median or mean, status=status, details=details, device=device,
              when=when, metrics=metrics, peak=peak)
    if mean is None:
        return b
    return replace(b, stats=Stats(mean, mean / 100, median or mean, 0.0, 10, data or [mean] * 10))


def _grid(device=DEV, when="2026-12-01T00:00:00"):
    """2026: xl forward, backward and optimizer step at 512 in fp32 and bf16, 10B's backward OOM; 2025: a
    small training-step grid (two contexts) with its tokens/s and MFU."""
    rows = []
    for dtype, k in (("fp32", 1.0), ("bf16", 0.4)):
        rows += [_b("2026", "xl", m, t * k, "main_2026", dtype=dtype, device=device, when=when)
                 for m, t in (("forward", 0.3), ("backward", 0.6), ("optimizer_step", 0.1))]
    rows.append(_b("2026", "10B", "forward", 1.2, "main_2026", device=device, when=when))
    rows.append(_b("2026", "10B", "backward", None, "main_2026", Status.OOM, {"memory_need": {"total": 154.5e9}},
                   device=device, when=when))
    for ctx_, t in ((256, 0.05), (512, 0.09)):
        for mode, k in (("forward", 1.0), ("train_step", 3.0)):
            rows.append(_b(None, "small", mode, t * k, context_=ctx_, device=device, when="2026-11-30T00:00:00",
                           metrics={Metric.TOKENS_PER_S: 4 * ctx_ / (t * k), Metric.MFU_MEASURED_PEAK: 0.05},
                           peak=int(2e9)))
    return rows


def _fresh_warmup():
    """2026's fresh-process warm-up study of xl: 0, 1 and 2 warm-up steps; the cold row kept its steps' parts."""
    steps = {"steps": {"forward_s": [0.5, 0.1, 0.1], "backward_s": [0.4, 0.2, 0.2], "optimizer_s": [0.2, 0.05, 0.05]}}
    return [_b("2026", "xl", "train_step", (first + 0.35 * 9) / 10, "warmup_fresh_process",
               details=steps if w == 0 else {}, warmup=w, data=[first] + [0.35] * 9)
            for w, first in ((0, 1.1), (1, 0.36), (2, 0.35))]


def test_cells_are_the_rows_mean_and_std_not_their_median():
    """Both handouts ask for the average and standard deviation: every cell is the row's stats mean and
    stddev, not its median."""
    rows = [_b("2026", "xl", m, t, median=2 * t) for m, t in (("forward", 0.3), ("backward", 0.6), ("train_step", 1.0))]
    rows.append(_b(None, "xl", "forward", 0.1))  # no edition: a 2025 row (the 2025 xl is another model)
    e25, e26 = page.editions(rows)
    assert [r.size for r in e26.grid] == ["xl (2026) = 2.7B (2025)"] and [r.size for r in e25.grid] == ["xl (2025)"]
    assert e26.headline.train.mean_s == 1.0  # the mean, not the median (2.0)
    assert e26.headline.train.std_s == pytest.approx(0.01)
    lo, hi = e26.fwd_bwd
    assert hi.modes["backward"].mean_s == 0.6


def test_2026_oom_rows_carry_their_need_and_fresh_warmup_its_first_step():
    e26 = page.editions([b for b in _grid() if page.Cell.of(b).edition == "2026"] + _fresh_warmup())[1]
    cell, = e26.oom_cells
    assert (cell.size_label, cell.mode, cell.need_bytes) == ("10B (2026)", "backward", 154.5e9)
    assert e26.fwd_bwd[1].size == "xl (2026) = 2.7B (2025)" and e26.fwd_bwd[1].modes["backward"].mean_s == 0.6
    case, = e26.warmup
    assert e26.fresh_warmup and sorted(case.by_warmup) == [0, 1, 2]
    assert case.cold.first_s == 1.1 and case.first_step_excess == pytest.approx(1.1 / case.warm.mean_s)
    assert case.cold.first_parts == page.Parts(0.5, 0.4, 0.2)
    assert case.cold.later_parts.forward == pytest.approx(0.1) and case.warm.later_parts is None
    assert e26.warmup_parts


def test_optimizer_split_adds_the_rows_means():
    e26 = page.editions(_grid())[1]
    assert [(o.size, o.dtype) for o in e26.optimizer] == [("xl (2026) = 2.7B (2025)", "fp32"),
                                                          ("xl (2026) = 2.7B (2025)", "bf16")]
    fp32 = e26.optimizer[0]
    assert (fp32.forward_s, fp32.backward_s, fp32.optimizer_s, fp32.train_s) == (0.3, 0.6, 0.1, None)
    assert fp32.optimizer_share == pytest.approx(0.1) and e26.optimizer_bf16_over_fp32 == pytest.approx(0.4)


def test_tables_split_the_grid_by_dtype_with_the_modes_it_has():
    e25, e26 = page.editions(_grid())
    assert [(dtype, modes, train) for dtype, modes, _, train in e26.tables] == [
        ("fp32", ["forward", "backward", "optimizer_step"], False), ("bf16", ["forward", "backward", "optimizer_step"],
                                                                     False)]
    ((_, modes, rows, train),) = e25.tables
    assert modes == ["forward", "train_step"] and train and [r.context for r in rows] == [256, 512]
    assert e25.headline.context == 512 and e25.headline.train.mean_s == pytest.approx(0.27)


def test_2026_forward_and_backward_score_the_index_with_the_2026_rows_date(tmp_path):
    f = page.facts(context(_grid(), tmp_path))
    e, r = f.score_row
    assert f.score_fb and e.edition == "2026" and r.size == "xl (2026) = 2.7B (2025)"
    s = f.scores[P]
    assert s.kind is Kind.MEASURED and (s.device, s.date) == (DEV, "2026-12-01")


def test_without_2026_forward_and_backward_the_training_step_scores(tmp_path):
    f = page.facts(context([b for b in _grid() if b.row.config.get("edition") != "2026"], tmp_path))
    e, r = f.score_row
    assert not f.score_fb and e.edition == "2025" and (r.size, r.context) == ("small", 512)
    assert f.scores[P].date == "2026-11-30"


def test_each_gpu_device_has_its_tables_the_first_answers_cpu_is_left_out(tmp_path):
    rows = _grid() + _grid("h100-80gb-x2") + _grid("cpu")
    f = page.facts(context(rows, tmp_path))
    assert [s.runs.device for s in f.sections] == [DEV, "h100-80gb-x2"] and f.scores[P].device == DEV
    t25 = f.sections[0].editions[0]
    assert t25.figure == f"figures/{P}-{DEV}-train-step.png" and (tmp_path / t25.figure).is_file()
    assert f.sections[0].editions[1].figure is None  # the 2026 grid times the parts, not the whole step
    assert (t25.warmup_steps, t25.timed_steps, t25.peak) == ("2", "5", None)
    assert not any("cpu" in s for s in f.sources) and len(f.sources) == 4


def test_the_matmul_peak_is_the_runs_own():
    rows = _grid()
    rows[-1] = replace(rows[-1], row=replace(rows[-1].row, peaks=Peaks(700e12, "bfloat16", 8192, 989e12)))
    assert page.editions(rows)[0].peak == Peaks(700e12, "bfloat16", 8192, 989e12)


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context(_grid("cpu"), tmp_path))
    assert f.answer is None and f.sections == [] and f.scores[P].kind is Kind.NOT_MEASURED


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    from impl.report import build

    ctx = build.context(ROOT / "reports" / "data", tmp_path_factory.mktemp("reports"))
    rows = ctx.rows.of(P, device=DEV)
    return page.editions(rows), rows


def test_committed_headline_is_the_mean_of_its_row(committed):
    (e25, e26), rows = committed
    head = e25.headline  # 2026 times forward and backward apart: no training-step headline
    assert e26.headline is None and head.dtype == "fp32" and head.size == "2.7B (2025) = xl (2026)"
    src, = [b for b in rows if b.measured and b.row.config.get("size") == "2.7B" and b.row.config.get("dtype") == "fp32"
            and b.row.config.get("mode") == "train_step" and b.row.config.get("context") == head.context
            and b.row.config.get("study") in (None, "main")]
    assert head.train.mean_s == src.stats.mean and head.train.std_s == src.stats.stddev
    assert head.context == max(r.context for r in e25.grid if (r.size, r.dtype) == (head.size, "fp32") and r.train
                               and r.train.ok)


def test_committed_2026_edition_reads_its_own_studies(committed):
    """The committed 2026 rows (study main_2026, warmup_fresh_process) answer the 2026 edition: every
    size in its grid, 10B's OOM rows with their closed-form need, a fresh-process warm-up study."""
    (e25, e26), _ = committed
    assert e26.sizes == ["small", "medium", "large", "xl (2026) = 2.7B (2025)", "10B (2026)"]
    assert {r.size for r in e26.grid} == set(e26.sizes) and e26.fresh_warmup
    assert all(c.need_bytes and c.need_bytes > 80e9 for c in e26.oom_cells) and e26.oom_cells
    assert e26.fwd_bwd[1].size == "xl (2026) = 2.7B (2025)"  # 10B's backward is OOM: the largest size with both
    assert {c.size for c in e26.warmup} >= {"small", "xl (2026) = 2.7B (2025)"}
    assert {o.dtype for o in e25.optimizer} == {"fp32", "bf16"}
    for o in e25.optimizer:
        row = next(r for r in e25.grid if r.size == o.size and r.context == o.context and r.dtype == o.dtype)
        assert o.forward_s == row.modes["forward"].mean_s and o.optimizer_s == row.modes["optimizer_step"].mean_s


def test_page_words(request, tmp_path):
    assert_snapshot(request, P, render_page(f"{P}.md.j2", f=page.facts(context(_grid() + _fresh_warmup(), tmp_path))))
