"""flash_shapes (impl.report.pages.flash_shapes): facts from synthetic rows, the CSV grid, and the
page's words as a snapshot."""
from __future__ import annotations

import csv

from impl.bench.row import Metric, Status
from impl.report.pages import Kind
from impl.report.pages import flash_shapes as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

DEV = "h100-80gb-x1"
NEW, OLD = "2026-03-02T00:00:00", "2026-03-01T00:00:00"


def _cfg(impl, seq, mode="fwd", **kw):
    return dict(impl=impl, mode=mode, batch=4, heads=32, seq=seq, d=80, causal=True, dtype="bf16") | kw


def _row(impl, seq, ms=None, status=Status.MEASURED, reason=None, when=NEW, host_ms=None, **kw):
    return bench("flash_shapes", _cfg(impl, seq, **kw), None if ms is None else ms / 1e3, device=DEV, when=when,
                 status=status, reason=reason, metrics=None if host_ms is None else {Metric.HOST_MS: host_ms})


def _rows():
    return [_row("flash_triton", 512, 0.9), _row("flash_triton_compiled", 512, 1.8), _row("sdpa_cudnn", 512, 0.3),
            _row("sdpa_flash", 512, 0.45), _row("flash_triton", 3000, 2.0), _row("sdpa_flash", 3000, 2.5),
            _row("sdpa_cudnn", 3000, status=Status.OOM, reason="OOM"),
            _row("flash_triton_compiled", 3000, status=Status.LEFT_OUT_BY_BUDGET, reason="time budget")]


def _host(impl, mean_us, when):
    return bench("flash_shapes", dict(impl=impl, mode="fwd_bwd", batch=1, heads=1, seq=128, d=64, dtype="bf16",
                                      causal=True, host=True), mean_us / 1e6, device=DEV, when=when)


def _hosts():
    return ([_host("flash_triton", 300, NEW), _host("flash_triton_compiled", 900, NEW), _host("sdpa_cudnn", 200, NEW),
             _host("sdpa_flash", 250, NEW)])


def test_ratio_is_against_the_faster_anchor_and_budget_cuts_are_counted(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    assert (f.measured, f.budget, f.budget_reason, f.ratios, f.median) == (6, 1, "time budget", (0.8, 3.0), 3.0)
    [s] = f.summary
    assert (s.mode, s.measured, s.left_out, s.median("eager"), s.of("compiled")) == ("forward", 3, 1, 3.0, (6.0,))
    assert f.not_run == (("OOM", "OOM"), ("left out (budget)", "time budget"))
    assert f.scores[page.PROBLEM] == page.Scored(Kind.MEASURED, "NVIDIA H200", "2026-03-02")
    assert f.figure and (tmp_path / f.figure).exists()


def test_grid_csv_names_the_anchor_and_the_left_out_cells(tmp_path):
    page.facts(context(_rows(), tmp_path))
    with open(tmp_path / "data-tables" / f"flash_shapes-{DEV}.csv") as fh:
        grid = {r["batch×heads×seq"]: r for r in csv.DictReader(fh)}
    first = grid["4×32×512"]
    assert (first["faster anchor (ms)"], first["eager / anchor"], first["compiled / anchor"]) == \
        ("0.300 (cuDNN backend)", "3.00×", "6.00×")
    cut = grid["4×32×3000"]
    assert (cut["ours compiled (ms)"], cut["eager / anchor"]) == ("left out (budget)", "0.80×")
    assert list(first) == page.GRID_COLUMNS
    assert [first[c] for c in ("SDPA cuDNN (ms)", "SDPA flash (ms)", "eager / cuDNN", "eager / flash")] == \
        ["0.300", "0.450", "3.00×", "2.00×"]
    assert [cut[c] for c in ("SDPA cuDNN (ms)", "eager / cuDNN", "eager / flash", "ours kernel table (ms)")] == \
        ["OOM", "–", "0.80×", "–"]


def test_ratios_to_each_backend_not_only_the_faster(tmp_path):
    """Per shape, ours ÷ SDPA cuDNN and ÷ SDPA flash each (a backend that did not run gives none), and the
    group's medians of each; the faster-anchor ratio stays the headline."""
    f = page.facts(context(_rows(), tmp_path))
    assert (f.over("eager", "sdpa_cudnn"), f.over("eager", "sdpa_flash")) == ((3.0,), (0.8, 2.0))
    [s] = f.summary
    assert (s.of("eager", "sdpa_cudnn"), s.median("eager", "sdpa_flash")) == ((3.0,), 2.0)
    assert f.ratios == (0.8, 3.0)  # ÷ the faster anchor: cuDNN at 512, flash at 3000 (cuDNN OOM)


def test_flash_auto_rows_present_get_their_columns_and_sentence(tmp_path):
    """Rows of ours through the kernel table (flash_auto) count as ours and get ratios to each backend."""
    auto = [_row("flash_auto", 512, 0.6), _row("flash_auto", 3000, status=Status.LEFT_OUT_BY_BUDGET,
                                                reason="time budget")]
    f = page.facts(context(_rows() + auto, tmp_path))
    assert f.auto and f.over("auto") == (2.0,)
    assert (f.over("auto", "sdpa_cudnn"), f.over("auto", "sdpa_flash")) == ((2.0,), (1.33,))
    [s] = f.summary
    assert (s.measured, s.left_out, s.of("auto", "sdpa_flash")) == (4, 2, (0.6 / 0.45,))
    assert f.ratios == (0.8, 3.0) and f.median == 3.0  # the headline (index) stays ours eager's
    with open(tmp_path / "data-tables" / f"flash_shapes-{DEV}.csv") as fh:
        grid = {r["batch×heads×seq"]: r for r in csv.DictReader(fh)}
    assert [grid["4×32×512"][c] for c in ("ours kernel table (ms)", "kernel table / cuDNN", "kernel table / flash")] \
        == ["0.600", "2.00×", "1.33×"]
    assert grid["4×32×3000"]["ours kernel table (ms)"] == "left out (budget)"
    text = render_page("flash_shapes.md.j2", f=f)
    assert "kernel table / cuDNN" in text and "2.00× (one shape-pass) SDPA cuDNN's time" in text
    assert "No run of this device has rows of ours through the kernel table" not in text


def test_host_bound_rows_are_counted_and_marked_in_the_grid(tmp_path):
    """A row whose host time to issue a call (host_ms) is at least 80% of its median times the host: counted, and
    its cell marked; a row without the metric (stored before it) or under 80% is not."""
    auto = [_row("flash_auto", 512, 0.6, host_ms=0.55), _row("flash_auto", 3000, 1.5, host_ms=0.4)]
    f = page.facts(context(_rows() + auto, tmp_path))
    assert f.host_bound_rows == 1
    with open(tmp_path / "data-tables" / f"flash_shapes-{DEV}.csv") as fh:
        grid = {r["batch×heads×seq"]: r for r in csv.DictReader(fh)}
    assert grid["4×32×512"]["ours kernel table (ms)"] == "0.600 (host)"
    assert grid["4×32×3000"]["ours kernel table (ms)"] == "1.500" and grid["4×32×512"]["ours eager (ms)"] == "0.900"
    assert page.facts(context(_rows(), tmp_path)).host_bound_rows == 0


def test_without_flash_auto_rows_one_sentence_says_so_and_no_column(tmp_path):
    f = page.facts(context(_rows(), tmp_path))
    text = render_page("flash_shapes.md.j2", f=f)
    assert not f.auto and "kernel table /" not in text
    assert text.count("No run of this device has rows of ours through the kernel table (flash_auto") == 1


def test_host_cost_rows_are_their_own_table_from_the_newest_run(tmp_path):
    """The host-cost rows (config host=True) answer from the newest run: the anchor is the SDPA backend
    with the lower host cost; they never enter the kernel grid's counts."""
    older = [_host("sdpa_flash", 100, OLD)]  # another run's row: not compared with the newest run's
    f = page.facts(context(_rows() + _hosts() + older, tmp_path))
    h = f.host
    assert list(h.calls) == ["flash_triton", "flash_triton_compiled", "sdpa_cudnn", "sdpa_flash"]
    assert h.anchor == "sdpa_cudnn" and round(h.over("flash_triton", h.anchor), 2) == 1.5
    assert round(h.over("flash_triton_compiled", "flash_triton"), 2) == 3.0
    assert f.measured == 6 and len(h.runs.runs) == 2


def test_no_shape_with_an_anchor_leaves_the_problem_unanswered_and_no_rows_not_measured(tmp_path):
    f = page.facts(context([_row("flash_triton", 512, 0.9)], tmp_path))
    assert f.ratios == () and f.scores == {} and f.figure is None
    assert page.facts(context([], tmp_path)).scores[page.PROBLEM].kind is Kind.NOT_MEASURED


def test_page_words(request, tmp_path):
    f = page.facts(context(_rows() + _hosts(), tmp_path))
    assert_snapshot(request, "flash_shapes", render_page("flash_shapes.md.j2", f=f))


def test_page_words_with_flash_auto(request, tmp_path):
    auto = [_row("flash_auto", 512, 0.6, host_ms=0.55), _row("flash_auto", 3000, 1.5)]
    f = page.facts(context(_rows() + auto + _hosts() + [_host("flash_auto", 320, NEW)], tmp_path))
    assert_snapshot(request, "flash_shapes-kernel_table", render_page("flash_shapes.md.j2", f=f))
