"""training_step (impl.report.pages.training_step): facts from synthetic rows, and the page's words as a
snapshot."""
from __future__ import annotations

import csv
import dataclasses

import pytest

from impl.bench.row import Metric, Peaks, Status
from impl.report.pages import Kind
from impl.report.pages import training_step as page
from impl.report.templating import render_page
from kits.report_rows import assert_snapshot, bench, context

P = "training_step"
DEV = "h100-80gb-x1"
PEAKS = Peaks(measured_flops=1e15, measured_dtype="bfloat16", measured_n=8192, datasheet_flops=None)
BF16 = dict(dtype="bf16", attn_impl="naive", compile="none", optimizer="adamw", fused_ce=False, compile_backend=None)
FAST_OLD = dict(BF16, attn_impl="flash_triton", compile="blocks", compile_backend="inductor", optimizer="adamw_fused",
                fused_ce=True)  # from before the `weights` option: fp32 weights
FAST_NEW = dict(FAST_OLD, weights="bf16", optimizer="adamw_master_fused")
CUDAGRAPHS = dict(FAST_NEW, compile="model+cudagraphs")


def _profile(step_ms: float, phase_ms: tuple, host_ms: tuple | None = None) -> dict:
    """A step_breakdown-shaped profile; host_ms=None: one from before phase_host_ms and launch_ops."""
    phases = ("forward", "backward", "optimizer step")
    kernel_ms = sum(phase_ms)
    out = dict(timing_source="kernels", steps_profiled=1, warmup_steps=1, step_ms=step_ms, kernel_ms=kernel_ms,
               gap_ms=step_ms - kernel_ms, phase_ms=dict(zip(phases, phase_ms)),
               category_ms=dict(matmul=kernel_ms, attention=0.0), top=[])
    if host_ms is not None:
        out.update(launch_ops=True, phase_host_ms=dict(zip(phases, host_ms)))
    return out


def _row(size, context, config, settings, median=0.1, mfu=0.3, when="2026-02-01T00:00:00", commit="abcdef12",
         status=Status.MEASURED, details=None, reason=None, device=DEV):
    b = bench(P, dict(size=size, context=context, config=config, batch=4, **settings), median, device=device,
              when=when, commit=commit, status=status, reason=reason, details=details,
              metrics={Metric.TOKENS_PER_S: 1e4, Metric.MFU_MEASURED_PEAK: mfu} if status is Status.MEASURED else {},
              name=f"test_training_step[{size}-{context}-{config}-{when}]")
    return dataclasses.replace(b, row=dataclasses.replace(b.row, peaks=PEAKS if status is Status.MEASURED else None))


def _facts(tmp_path, rows, history=()):
    return page.facts(context(rows, tmp_path, history))


def _by(section, config, size="xl", ctx=512):
    return next(s for s in section.rows if (s.config, s.size, s.context) == (config, size, ctx))


def _runs():
    old = [_row("xl", 512, "bf16", BF16, 0.30, when="2026-02-01T07:16:00"),
           _row("xl", 512, "+flash", BF16, 0.37, when="2026-02-01T07:16:00"),
           _row("xl", 512, "anchor", BF16, 0.10, mfu=0.34, when="2026-02-01T07:16:00")]
    new = [_row("xl", 512, "bf16", BF16, 0.25, when="2026-02-02T14:11:00"),
           _row("xl", 512, "+flash", BF16, when="2026-02-02T14:11:00", status=Status.LEFT_OUT_BY_BUDGET, reason="budget"),
           _row("xl", 512, "fast", FAST_NEW, 0.08, mfu=0.42, when="2026-02-02T14:11:00"),
           _row("xl", 512, "anchor", BF16, 0.095, mfu=0.35, when="2026-02-02T14:11:00")]
    later = [_row("xl", 512, "fast+cudagraphs", CUDAGRAPHS, 0.07, mfu=0.5, when="2026-02-02T14:30:00")]
    return old, new, later


def test_each_row_is_its_newest_measurement(tmp_path):
    """Runs mix: a row shows its newest run that ran it (OOM counts), falls back to an older run where the
    newest left it out, and each run's peak is listed; ours against the anchor says whether the two came
    from one run."""
    old, new, later = _runs()
    s = _facts(tmp_path, later + new[1:], history=old + new[:1]).sections[0]
    assert _by(s, "bf16").step_s == 0.25 and _by(s, "+flash").step_s == 0.37 and _by(s, "+flash").when == "02-01 07:16"
    assert [(r.run, r.matmul_peak, r.rows) for r in s.runs_table] == [
        ("02-01 07:16", 1e15, 1), ("02-02 14:11", 1e15, 3), ("02-02 14:30", 1e15, 1)]
    assert [(o.config, o.datetime == a.datetime, ratio) for o, a, ratio in s.versus] == [
        ("fast", True, "0.84×"), ("fast+cudagraphs", False, "0.74×")]
    assert not any(r.not_run for r in s.rows) and s.stat == "median" and (s.warmup, s.rounds) == ("2", "5")


def test_answers_read_the_same_run_pair_and_the_shape_with_most_configs(tmp_path):
    old, new, later = _runs()
    f = _facts(tmp_path, later + new, history=old)
    assert f.pair.ours.config == "fast" and f.pair.vs.value == pytest.approx(0.08 / 0.095) and f.pair.pairs == 1
    a = f.ablation
    assert (a.size, a.context, a.base.step_s, a.best.config) == ("xl", 512, 0.25, "fast+cudagraphs")
    assert a.top[0] == "+flash" and a.top[1].value == pytest.approx(0.37 / 0.25)
    assert f.top_mfu.config == "fast+cudagraphs"  # no datasheet MFU: the measured peak's
    assert f.scores[P] == page.Scored(Kind.MEASURED, "H100", "2026-02-02")
    assert f.index_figures == (f"figures/training_step-{DEV}-ablation.png",)


def test_every_run_of_a_repeated_row_with_its_own_runs_anchor(tmp_path):
    """Ours and the anchor measured in several runs: each run listed with ours ÷ the anchor of its own run;
    rows run once and the ablation's other configs are not repeated there."""
    first = [_row("2.7B", 512, "fast+cudagraphs", CUDAGRAPHS, 0.110, when="2026-02-01T07:16:00", commit="aaaaaaaa"),
             _row("2.7B", 512, "anchor", BF16, 0.132, when="2026-02-01T07:16:00", commit="aaaaaaaa"),
             _row("2.7B", 512, "bf16", BF16, 0.3, when="2026-02-01T07:16:00", commit="aaaaaaaa")]
    second = [_row("2.7B", 512, "fast+cudagraphs", CUDAGRAPHS, 0.120, when="2026-02-02T14:11:00", commit="bbbbbbbb+"),
              _row("2.7B", 512, "bf16", BF16, 0.3, when="2026-02-02T14:11:00", commit="bbbbbbbb+"),
              _row("xl", 512, "fast", FAST_NEW, 0.08, when="2026-02-02T14:11:00", commit="bbbbbbbb+")]
    s = _facts(tmp_path, second, history=first).sections[0]
    assert [(r.config, r.commit, x) for r, x in s.repeats] == [
        ("fast+cudagraphs", "aaaaaaaa", pytest.approx(0.110 / 0.132)), ("fast+cudagraphs", "bbbbbbbb+", None)]
    assert _facts(tmp_path, first).sections[0].repeats == []  # one run each


def test_config_legend_has_a_row_per_settings(tmp_path):
    """A config whose rows ran other settings in another size (or context) gets a row per settings, with
    the sizes (and contexts) that ran them; one whose settings agree stays one row."""
    rows = [_row(size, ctx, name, settings) for size, ctx, name, settings in [
        ("xl", 512, "bf16", BF16), ("xl", 1024, "bf16", BF16), ("2.7B", 512, "bf16", BF16),
        ("xl", 512, "fast", FAST_OLD), ("xl", 1024, "fast", FAST_OLD), ("2.7B", 512, "fast", FAST_NEW),
        ("xl", 512, "+flash", dict(BF16, attn_impl="flash_triton")),
        ("xl", 1024, "+flash", dict(BF16, attn_impl="flash_torch"))]]
    legend = _facts(tmp_path, rows).sections[0].legend
    assert [(config, sizes) for config, sizes, _ in legend] == [
        ("bf16", [("xl", None), ("2.7B", None)]), ("+flash", [("xl", [512])]), ("+flash", [("xl", [1024])]),
        ("fast", [("xl", None)]), ("fast", [("2.7B", None)])]
    old, new = legend[3][2], legend[4][2]
    assert (old.weights, old.compile_backend, old.fused_ce) == ("fp32", "inductor", True) and new.weights == "bf16"


def test_profiles_host_time_and_the_unattributed_marker(tmp_path):
    """Host time per phase where a profile has it; a profile without launch_ops of a config that ran one of
    our launchers outside a torch op is marked, with an AdamWMaster row's optimizer step as the example."""
    rows = [_row("xl", 512, "bf16", BF16, details=dict(profile=_profile(100.0, (20.0, 40.0, 10.0), (30.0, 45.0, 5.0)))),
            _row("2.7B", 512, "fast", FAST_NEW, details=dict(profile=_profile(160.0, (25.0, 52.0, 0.34)))),
            _row("2.7B", 512, "bf16", BF16, details=dict(profile=_profile(200.0, (50.0, 100.0, 40.0))))]
    w = _facts(tmp_path, rows).sections[0].time
    assert w.host and w.phases == ["forward", "backward", "optimizer step"] and w.categories == ["matmul"]
    assert [(r.size, r.config, r.unattributed) for r in w.rows] == [("xl", "bf16", False), ("2.7B", "bf16", False),
                                                                    ("2.7B", "fast", True)]
    assert w.marked and w.example.config == "fast"
    # old profiles only: no host column; old fast ran flash compiled and torch's fused AdamW (nothing missed)
    old = [_row("xl", 512, "fast", FAST_OLD, details=dict(profile=_profile(100.0, (20.0, 40.0, 10.0)))),
           _row("xl", 512, "+flash", dict(BF16, attn_impl="flash_triton"),
                details=dict(profile=_profile(90.0, (20.0, 40.0, 10.0))))]
    w = _facts(tmp_path, old).sections[0].time
    assert not w.host and [r.unattributed for r in w.rows] == [True, False] and w.example is None


def test_where_the_time_goes_from_step_breakdown(tmp_path):
    """The profiles step_breakdown records: a 10 ms step with 6 ms of matmul, 1 ms of attention, 0.5 ms of
    elementwise; a failed profile is listed; a row without profile keys is not part of it."""
    from impl.workloads import kernels as K

    prof = K.PhaseProfile(steps=1, device_type="cuda", kernels={
        "forward": {"sm90_xmma_gemm_bf16": [2000.0, 8], "_attn_fwd": [400.0, 2]},
        "backward": {"sm90_xmma_gemm_bf16": [4000.0, 16], "_attn_bwd_dkdv": [600.0, 2]},
        "optimizer step": {"multi_tensor_apply_kernel": [500.0, 3]}})
    rows = [_row("xl", 512, "bf16", BF16), _row("xl", 512, "fast", FAST_NEW, 0.01,
                                                details=dict(profile=K.step_breakdown(prof, step_s=0.01))),
            _row("xl", 512, "anchor", BF16, details=dict(profile_error="OOM: boom"))]
    w = _facts(tmp_path, rows).sections[0].time
    assert [r.config for r in w.rows] == ["fast", "anchor"] and [r.config for r in w.failed] == ["anchor"]
    pr = w.rows[0].profile
    assert (pr["step_ms"], pr["phase_ms"]["forward"], pr["kernel_ms"], pr["gap_ms"]) == pytest.approx((10, 2.4, 7.5, 2.5))
    assert "communication" not in w.categories and {"matmul", "attention", "elementwise"} <= set(w.categories)
    (r, k), *_ = w.top
    assert (r.config, k["name"], k["calls"]) == ("fast", "sm90_xmma_gemm_bf16", 24)
    assert _facts(tmp_path, rows[:1]).sections[0].time is None


def test_bench_layer_cells_and_rows_not_run(tmp_path):
    """The ablation's cells (the CSV's): the step is the median, the first step the first_call_s metric,
    compile_s from details; a budget cut is counted with its reason."""
    bf16 = _row("xl", 512, "bf16", BF16, 0.2)
    bf16 = dataclasses.replace(bf16, row=dataclasses.replace(bf16.row, metrics={**bf16.row.metrics, Metric.MFU: 0.15,
                                                                                Metric.FIRST_CALL_S: 1.5}))
    fast = _row("xl", 512, "fast", FAST_NEW, 0.1, details=dict(compiled_now=True, compile_s=12.0, new_graphs=2))
    cut = _row("xl", 512, "anchor", BF16, status=Status.LEFT_OUT_BY_BUDGET, reason="time budget exhausted")
    s = _facts(tmp_path, [bf16, fast, cut]).sections[0]
    cells = {r[0]: r for r in s.ablation}
    assert cells["bf16"][3:12] == ["200.0 ± 2.0", "10,000", "15.0%", "30.0%", "1.00×", "–", "1.50", "–", "–"]
    assert cells["fast"][7] == "0.50×" and cells["fast"][10:12] == ["12.00", 2]
    assert cells["anchor"][3] == "–" and cells["anchor"][12] == "not run"
    assert [(x.config, x.reason) for x in s.rows if x.not_run] == [("anchor", "time budget exhausted")]
    assert s.csv is None and s.peaks == PEAKS


def test_a_long_ablation_is_a_csv_beside_its_grid(tmp_path):
    rows = [_row(size, ctx, cfg, BF16, 0.1 + i / 100) for i, (size, ctx, cfg) in enumerate(
        (size, ctx, cfg) for size in ("xl", "2.7B") for ctx in (256, 512, 1024) for cfg in ("bf16", "+flash", "+compile", "fp32"))]
    s = _facts(tmp_path, rows).sections[0]
    assert len(s.ablation) == 24 and s.csv == f"[data-tables/training_step-{DEV}-ablation.csv](data-tables/training_step-{DEV}-ablation.csv)"
    with open(tmp_path / "data-tables" / f"training_step-{DEV}-ablation.csv") as fh:
        assert list(csv.reader(fh))[0] == page.ABLATION_HEADER
    cols, lines = s.grid
    assert cols[0] == ("xl", 256) and [c for c, _ in lines] == ["fp32", "bf16", "+flash", "+compile"]


def test_within_noise_where_the_spreads_overlap():
    def step(median, std, status=Status.MEASURED):
        b = _row("xl", 512, "bf16", BF16, median, status=status)
        return page.step(dataclasses.replace(b, stats=b.stats and dataclasses.replace(b.stats, stddev=std)))
    assert page.noise_ratio(step(0.25, 0.03), step(0.30, 0.05)) == "within noise"
    assert page.noise_ratio(step(0.15, 0.01), step(0.30, 0.01)) == "0.50×"  # ours ÷ reference
    assert page.noise_ratio(step(None, None, Status.OOM), step(0.30, 0.01)) == "–"


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = _facts(tmp_path, [_row("xl", 512, "bf16", BF16, device="cpu")])
    assert f.sections == [] and f.scores[P].kind is Kind.NOT_MEASURED and f.sources == []
    oom = _facts(tmp_path, [_row("xl", 512, "bf16", BF16, status=Status.OOM)])
    assert not oom.measured and oom.scores[P].kind is Kind.NOT_MEASURED and len(oom.sections) == 1


def test_page_words(request, tmp_path):
    old, new, later = _runs()
    prof = dict(profile=_profile(100.0, (20.0, 40.0, 10.0), (30.0, 45.0, 5.0)))
    rows = later + new + [_row("2.7B", 512, "fast", FAST_NEW, 0.12, details=prof, when="2026-02-02T14:11:00"),
                          _row("2.7B", 512, "anchor", BF16, 0.13, when="2026-02-02T14:11:00"),
                          _row("2.7B", 512, "bf16", BF16, 0.3, when="2026-02-02T14:11:00")]
    assert_snapshot(request, P, render_page(f"{P}.md.j2", f=_facts(tmp_path, rows, history=old)))
