"""flash_benchmarking (impl.report.pages.flash_benchmarking): facts from synthetic rows, the figure's
legend, and the page's words as a snapshot."""
from __future__ import annotations

import pytest

from impl.bench.kernel_digest import KernelDigest
from impl.bench.row import Metric, Status
from impl.report.flash_rows import IMPL_LABELS
from impl.report.pages import Kind
from impl.report.pages import flash_benchmarking as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

DEV = "h100-80gb-x1"
NEW, OLD = "2026-03-02T00:00:00", "2026-03-01T00:00:00"


def _row(impl, seq, ms=None, mode="fwd_bwd", d=64, dtype="bf16", when=NEW, status=Status.MEASURED, reason=None,
         iqr_ms=None, **run):
    return bench("flash_benchmarking", dict(impl=impl, mode=mode, batch=1, seq=seq, d=d, dtype=dtype, causal=True),
                 None if ms is None else ms / 1e3, device=DEV, when=when, status=status, reason=reason,
                 iqr=None if iqr_ms is None else iqr_ms / 1e3, metrics={Metric.TFLOPS: 100.0} if ms else {},
                 details=dict(autotune=True, left_out="naive beyond seq 8192"), **run)


def _grid(when=NEW, scale=1.0, **run):
    """bf16, d 16 and 64: ours, SDPA cuDNN and flash to seq 16384, naive to 8192 (left out beyond). run: the
    run's commit and kernels (impl.bench.kernel_digest), where a test names them."""
    rows = []
    for d in (16, 64):
        for seq in (1024, 8192, 16384):
            rows += [_row("flash_triton", seq, seq / 1000 * scale, d=d, when=when, **run),
                     _row("sdpa_cudnn", seq, seq / 1200, d=d, when=when, **run),
                     _row("sdpa_flash", seq, seq / 900, d=d, when=when, **run)]
            rows.append(_row("naive", seq, seq / 100, d=d, when=when, **run) if seq <= 8192 else
                        _row("naive", seq, d=d, when=when, status=Status.LEFT_OUT, reason="naive beyond seq 8192",
                             **run))
    return rows


def test_ours_over_naive_and_the_faster_anchor_of_one_run(tmp_path):
    f = page.facts(context(_grid(), tmp_path))
    (n,) = f.vs_naive
    assert (n.dtype, n.seq, n.ours_max, n.naive_max, n.stop_reason) == ("bf16", 8192, 16384, 8192,
                                                                        "naive beyond seq 8192")
    assert (n.low, n.high) == (pytest.approx(0.1), pytest.approx(0.1))
    h = f.headline
    assert (h.k.dtype, h.k.d, h.k.seq, h.anchor_label, h.naive.row.config["seq"]) == (
        "bf16", 64, 16384, IMPL_LABELS["sdpa_cudnn"], 8192)
    assert round(h.vs_anchor.value, 2) == 1.2 and h.vs_anchor.verdict == "slower"
    assert f.scores[page.PROBLEM] == page.Scored(Kind.MEASURED, DEV, "2026-03-02")


def test_naive_of_another_run_is_not_divided(tmp_path):
    rows = [b for b in _grid() if b.row.config["impl"] != "naive"] + \
        [b for b in _grid(OLD) if b.row.config["impl"] == "naive"]
    assert page.facts(context(rows, tmp_path)).vs_naive == ()


def test_longest_sequence_reached_names_what_stopped_each(tmp_path):
    f = page.facts(context(_grid(), tmp_path))
    reach = {(r.impl, r.dtype): r.cells for r in f.reach}
    assert f.reach_dims == (16, 64)
    assert reach[(IMPL_LABELS["naive"], "bf16")] == ((8192, (16384, "left out")),) * 2
    assert reach[(IMPL_LABELS["flash_triton"], "bf16")] == ((16384, None),) * 2
    assert f.not_run == (("left out", "naive beyond seq 8192"),)


def test_a_backward_slower_than_its_forward_backward_is_explained(tmp_path):
    rows = [_row("flash_triton", 1024, 1.2, mode="bwd"), _row("flash_triton", 1024, 1.0),
            _row("flash_triton", 16384, 10.3, mode="bwd", iqr_ms=1.0), _row("flash_triton", 16384, 10.0, iqr_ms=1.0),
            _row("sdpa_cudnn", 16384, 9.0, mode="bwd", iqr_ms=0.01), _row("sdpa_cudnn", 16384, 8.0, iqr_ms=0.01)]
    f = page.facts(context(rows, tmp_path))
    assert [(x.impl, x.k.seq, x.why) for x in f.odd] == [
        (IMPL_LABELS["flash_triton"], 1024, "host-bound"), (IMPL_LABELS["flash_triton"], 16384, "within noise"),
        (IMPL_LABELS["sdpa_cudnn"], 16384, "unexplained")]
    assert f.unexplained


def test_newest_run_against_the_previous_one_beside_the_anchors_drift(tmp_path):
    f = page.facts(context(_grid(), tmp_path, history=_grid(OLD, scale=1.25)))
    assert [r.when for r in f.previous.runs] == ["2026-03-01 00:00"]
    fb = {(x.d, x.mode): x for x in f.drift}
    x = fb[(64, "forward+backward")]
    assert (x.ours_long, x.anchors, x.ours_short, x.change) == (pytest.approx(0.8), 1.0, pytest.approx(0.8), -1)
    assert f.changes(-1) == 2 and len(f.sources) == 2


def test_plot_legend_lists_every_series_drawn(tmp_path):
    """A panel with one more implementation than the first (the H100's d = 64 had the compiled backward)
    still gets a legend entry, in the colour its line has on every panel."""
    rows = [_row(i, s, 1.0 + k, d=16) for k, i in enumerate(["flash_triton", "sdpa_cudnn"]) for s in (1024, 2048)]
    rows += [_row(i, s, 1.0 + k) for k, i in enumerate(["flash_triton", "flash_triton_compiled_bwd", "sdpa_flash",
                                                         "sdpa_cudnn"]) for s in (1024, 2048)]
    legend = page.plot(rows, tmp_path / "f.png")
    assert sorted(legend) == sorted(IMPL_LABELS[i] for i in ("flash_triton", "flash_triton_compiled_bwd",
                                                             "sdpa_flash", "sdpa_cudnn"))
    assert (tmp_path / "f.png").exists()


def test_no_rows_is_not_measured(tmp_path):
    assert page.facts(context([], tmp_path)).scores[page.PROBLEM].kind is Kind.NOT_MEASURED


def _oom():
    return _row("naive", 16384, d=16, dtype="fp32", status=Status.OOM, reason="CUDA out of memory")


def _other_commit(**run):  # a cell of an older run (of other code, unless its kernels say otherwise)
    return bench("flash_benchmarking", dict(impl="naive", mode="fwd", batch=1, seq=128, d=16, dtype="fp32",
                                            causal=True), 1e-3, device=DEV, when=OLD, **(dict(commit="0123abcd") | run))


K1, K2 = KernelDigest("1111aaaa2222bbbb", "3333cccc4444dddd"), KernelDigest("5555eeee6666ffff", "3333cccc4444dddd")


@pytest.mark.parametrize("case", ["one commit", "stitched", "one version", "two versions"])
def test_page_words(request, tmp_path, case):
    """One commit with a compared previous run; cells stitched from two commits, one out of memory; two commits
    whose runs recorded the same kernels; one commit whose runs recorded different kernels."""
    if case == "one commit":
        rows = _grid() + [_row("flash_triton", 1024, 1.5, mode="bwd")]  # slower than its forward+backward
        f = page.facts(context(rows, tmp_path, history=_grid(OLD, scale=1.25)))
        assert_snapshot(request, "flash_benchmarking", render_page("flash_benchmarking.md.j2", f=f))
    elif case == "stitched":
        f = page.facts(context(_grid() + [_oom(), _other_commit()], tmp_path))
        assert_snapshot(request, "flash_benchmarking-stitched", render_page("flash_benchmarking.md.j2", f=f))
    else:
        if case == "one version":  # another commit, the same kernels
            rows = _grid(kernels=K1) + [_other_commit(kernels=K1)]
        else:  # one commit with changes, other kernels in each run
            rows = _grid(commit="abcdef12+", kernels=K1) + [_other_commit(commit="abcdef12+", kernels=K2)]
        f = page.facts(context(rows, tmp_path))
        assert_snapshot(request, f"flash_benchmarking-{case.replace(' ', '_')}",
                        render_page("flash_benchmarking.md.j2", f=f))


def test_cells_name_their_commits_and_count_ooms(tmp_path):
    """Issue 45: the page says whether the grid is one version of the kernels (one commit) or a
    stitch of runs of different code, and how many cells ran out of memory."""
    one = _grid() + [_oom()]
    f = page.facts(context(one, tmp_path))
    assert f.commits == ("abcdef12",) and f.cells == len(one) and f.oom_cells == 1
    two = _grid() + [_other_commit()]
    f = page.facts(context(two, tmp_path))
    assert f.commits == ("0123abcd", "abcdef12") and f.cells == len(two) and f.oom_cells == 0  # oldest run first
    assert f.versions == f.commits  # runs without a kernel digest: one commit, one version


def test_cells_are_one_kernel_version_when_their_runs_recorded_one_kernel_digest(tmp_path):
    """Runs at two commits with the same kernel digest are one version of the kernels; two runs at one
    (dirty) commit with different digests are two; a run without one counts by its commit."""
    f = page.facts(context(_grid(kernels=K1) + [_other_commit(kernels=K1)], tmp_path))
    assert f.commits == ("0123abcd", "abcdef12") and f.versions == (K1.label,)
    f = page.facts(context(_grid(commit="abcdef12+", kernels=K1) + [_other_commit(commit="abcdef12+", kernels=K2)],
                           tmp_path))
    assert f.commits == ("abcdef12+",) and f.versions == (K2.label, K1.label)  # oldest run first
    f = page.facts(context(_grid(kernels=K1) + [_other_commit(commit="abcdef12")], tmp_path))
    assert f.commits == ("abcdef12",) and f.versions == ("abcdef12", K1.label)  # not known to be the same
    assert f.undigested


def test_naive_is_compared_per_dtype_at_its_own_longest(tmp_path):
    """bf16 naive reached ours' longest sequence, fp32 naive ran out of memory before it: each dtype's
    sentence names its own longest shared sequence and what stopped naive (2026-11-26's H100 grid)."""
    rows = _grid() + [_row("flash_triton", s, s / 1000, d=64, dtype="fp32") for s in (1024, 8192, 16384)]
    rows += [_row("naive", 1024, 5.0, d=64, dtype="fp32"),
             _row("naive", 8192, d=64, dtype="fp32", status=Status.OOM, reason="CUDA out of memory")]
    f = page.facts(context(rows, tmp_path))
    assert [(n.dtype, n.seq, n.ours_max, n.naive_max, n.stop_reason) for n in f.vs_naive] == [
        ("bf16", 8192, 16384, 8192, "naive beyond seq 8192"), ("fp32", 1024, 16384, 1024, "CUDA out of memory")]


def test_the_whole_grid_and_ours_over_each_anchor_of_one_run(tmp_path):
    """Issue 45: every cell on the page (a table per dtype and pass), and ours ÷ the faster SDPA backend
    and ÷ naive at each shape, both rows of one run; a variant of another run is in the grid, never divided."""
    rows = _grid() + [_row("flash_triton_compiled_bwd", s, s / 800, d=64, when=OLD) for s in (1024, 8192)]
    f = page.facts(context(rows, tmp_path))
    (t,) = f.grid
    assert (t.dtype, t.what, t.seqs) == ("bf16", "forward+backward", (1024, 8192, 16384))
    by = {(label, d): cells for label, d, cells in t.rows}
    assert [c.value for c in by[(IMPL_LABELS["flash_triton"], 64)]] == [pytest.approx(1.024), pytest.approx(8.192),
                                                                     pytest.approx(16.384)]
    assert [(c.value, c.status) for c in by[(IMPL_LABELS["naive"], 16)]][2] == (None, "left out")
    assert by[(IMPL_LABELS["flash_triton_compiled_bwd"], 64)][2] is None  # no row at 16384
    sdpa, naive = f.ratios
    assert (sdpa.what, naive.what) == ("sdpa", "naive")
    (_, d, cells), _ = sdpa.rows
    assert d == 16 and [round(r.value, 2) for r in cells] == [1.2, 1.2, 1.2]  # cuDNN's seq/1200 is the faster
    assert [None if r is None else round(r.value, 2) for r in naive.rows[0][2]] == [0.1, 0.1, None]


def test_a_newer_run_without_ours_leaves_the_comparison_to_ours_newest(tmp_path):
    """A run of the compiled-backward variant alone (newer than ours') compares nothing of ours: the
    version comparison is of the newest run with our kernel's rows."""
    extra = [_row("flash_triton_compiled_bwd", 8192, 7.0, when="2026-03-03T00:00:00")]
    f = page.facts(context(_grid() + extra, tmp_path, history=_grid(OLD, scale=1.25)))
    assert [r.when for r in f.newest.runs] == ["2026-03-02 00:00"]
    assert [r.when for r in f.previous.runs] == ["2026-03-01 00:00"] and f.changes(-1) == 2
