"""leaderboard_2026 (impl.report.pages.leaderboard_2026): facts from synthetic rows (the measured
multi-GPU step, the class's best, where the time goes, the one-GPU rows and the prediction), and the
page's words as a snapshot."""
from __future__ import annotations

import pytest

from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Peaks, Status
from impl.leaderboard_prediction import LayerRun, predict_step
from impl.model import MODEL_CONFIGS
from impl.report.pages import Kind, Scored
from impl.report.pages import leaderboard_2026 as page
from impl.report.templating import render_page
from impl.workloads.leaderboard_2026 import CLASS_BEST_GPU, CLASS_BEST_GPUS, CLASS_BEST_STEP_S
from kits.report_rows import assert_snapshot, bench, context

P = "leaderboard_2026"
COMM = "distributed_communication_single_node"
LINE = [(n, 0.3 + 0.2 * n, 20 + 3 * n) for n in (1, 2, 4)]  # (layers, s, GiB): 0.3 s + 0.2 s/layer, 20 GiB + 3 GiB/layer


def _one(layers, seconds, gib, policy="every_k", status=Status.MEASURED, device="h200-141gb-x1",
         when="2026-03-02T00:00:00"):
    ok = status is Status.MEASURED
    return bench(P, dict(config="8B", layers=layers, batch=1, context=32768, checkpointing=policy,
                         k=1 if policy == "every_k" else None), seconds if ok else None, device=device, when=when,
                 status=status, reason=None if ok else "CUDA out of memory", peak=int(gib * 2**30) if ok else None,
                 metrics={Metric.TOKENS_PER_S: 32768 / seconds, Metric.MFU: 0.4} if ok else {})


# step_breakdown's parts (rows since the nineteenth session): compute 5,060 ms, 130 ms of communication of which
# 50 not hidden
PARTS = {"blocks forward": 700.0, "attention forward": 500.0, "lm head forward": 250.0, "recompute": 400.0,
         "attention recompute": 0.0, "blocks backward": 1500.0, "attention backward": 1600.0, "lm head backward": 10.0,
         "optimizer": 100.0, "communication": 130.0}
EXPOSED = {"forward": 0.0, "backward": 20.0, "optimizer step": 30.0}


def _two(policy, k, median_s, do_bench_ms, first_call_s, when="2026-03-03T00:00:00", world=2, breakdown=True,
         parts=False, caches=None, run_wall_s=None, device="h200-141gb-x2"):
    details = dict(ranks=[dict(peak=100 * 2**30), dict(peak=101 * 2**30)],
                   do_bench=dict(warmup_ms=25.0, rep_ms=100.0, return_mode="median", ranks="slowest"))
    if caches is not None:  # (triton files, inductor files) at the first call, as newer rows record them
        details.update(first_call_caches=dict(triton_dir="/t", triton_files=caches[0], inductor_dir="/i",
                                              inductor_files=caches[1]), run_wall_s=run_wall_s)
    ms = median_s * 1e3
    if breakdown:
        details["breakdown"] = dict(
            timing_source="cuda", step_ms=ms, kernel_ms=ms - 300.0, gap_ms=300.0,
            phase_ms={"forward": 1500.0, "backward": ms - 2100.0, "optimizer step": 300.0},
            category_ms={"matmul": ms / 2, "attention": ms / 4, "communication": 100.0, "other": 0.0},
            top=[dict(name="nvjet_gemm", category="matmul", ms=900.0, calls=400.0)])
        if parts:
            details["breakdown"].update(parts_ms=dict(PARTS), communication_exposed_ms=dict(EXPOSED))
    b = bench(P, dict(config="8B", layers=34, batch=2, context=32768, checkpointing=policy, k=k, world_size=world),
              median_s, device=device, when=when, details=details, peak=101 * 2**30,
              metrics={Metric.DO_BENCH_MS: do_bench_ms, Metric.FIRST_CALL_S: first_call_s, Metric.FLOPS: 3.2e15,
                       Metric.TOKENS_PER_S: 65536 / median_s})
    b.row.peaks = Peaks(800e12, "bfloat16", 8192, 989.4e12)
    return b


def _allreduce(busbw_gbps=300.0):
    return [bench(COMM, dict(backend=backend, world_size=n, bytes=2**30), 0.005, device="h200-141gb-x2",
                  when="2026-03-01T00:00:00", metrics={Metric.BUS_BW: bw})
            for backend, n, bw in (("nccl", 2, busbw_gbps), ("nccl", 4, 10 * busbw_gbps), ("gloo", 2, 1.0))]


def _line_rows():
    return [_one(n, t, g) for n, t, g in LINE]


def _pred():
    return predict_step([LayerRun(n, t, g * 2**30) for n, t, g in LINE], MODEL_CONFIGS["8B"], 300e9)


def test_fastest_of_each_run_and_the_class_best_scaled_by_datasheets():
    rows = [_two("every_k", 1, 7.1, 7000.0, 50.0, when="2026-01-01T00:00:00"),
            _two("keep_attention", 0, 6.1, 6000.0, 7.0, when="2026-01-01T00:00:00"),
            _two("keep_attention", 3, 6.6, 6500.0, 50.0, when="2026-01-02T00:00:00"),
            _two("every_k", 1, 9.0, 9000.0, 50.0, when="2026-01-02T00:00:00", world=1)]
    f = page.two_gpu_facts("h200-141gb-x2", rows)
    assert len(f.candidates) == 3 and f.world == 2  # the one-GPU row is not a candidate
    assert [c.policy for c in f.fastest.values()] == ["keep_attention (k 0)", "keep_attention (k 3)"]
    assert f.newest.policy == "keep_attention (k 3)"  # the newest run answers; runs are not compared
    cb = f.class_best
    assert datasheet_bf16_flops("NVIDIA B200") == 2250e12 and datasheet_bf16_flops("NVIDIA H200") == 989.4e12
    assert (cb.step_s, cb.gpus) == (CLASS_BEST_STEP_S, CLASS_BEST_GPUS) and cb.scale == pytest.approx(2250 / 989.4)
    assert cb.ratio.value == pytest.approx(6.5 / CLASS_BEST_STEP_S)
    assert cb.mfu == pytest.approx(3.2e15 / CLASS_BEST_STEP_S / 2250e12)
    assert f.newest.mfu == pytest.approx(3.2e15 / 6.5 / 989.4e12) and f.newest.rank_peaks == (100 * 2**30, 101 * 2**30)
    assert cb.at_our_peak_s == pytest.approx(CLASS_BEST_STEP_S * 2250 / 989.4)


def test_measured_step_answers_with_the_prediction_beside(tmp_path):
    rows = _line_rows() + _allreduce() + [_two("every_k", 1, 7.5, 7450.0, 60.0), _two("keep_attention", 0, 6.9, 6880.0, 7.0)]
    f = page.facts(context(rows, tmp_path))
    m = f.multi
    assert m.newest.policy == "keep_attention (k 0)" and m.newest.step_s == pytest.approx(6.88)
    assert [c.policy for c in m.first_calls] == ["every_k (k 1)", "keep_attention (k 0)"]
    assert m.first_calls[0].from_empty_caches is None and m.answer_profile is m.newest
    assert m.breakdown.categories == ("matmul", "attention", "communication")  # "other" has no time
    assert CLASS_BEST_GPU == "B200" and m.class_best.ours.gpu == "H200"
    assert f.pred == _pred() and f.beside.policy == "every_k (k 1)" and f.beside.step_s == pytest.approx(7.45)
    assert f.scores[P] == Scored(Kind.MEASURED, "h200-141gb-x2 + h200-141gb-x1", "2026-03-03")
    assert "reports/data/h200-141gb-x2/distributed_communication_single_node/20260301T0000Z_abcdef12.json" in f.sources


@pytest.mark.parametrize("caches, words", [
    (None, "These rows do not record what the on-disk compile caches"),
    ((0, 0), "The run began from empty on-disk compile caches (Triton's kernels, Inductor's graphs): its first "
             "candidate's row ended 140 s after the run's start: within the 10 minutes"),
    ((120, 3), "The run did not begin from empty compile caches (120 files in Triton's, 3 in Inductor's at its first "
               "call), so these first calls are not the handout's cold start")])
def test_the_cold_start_is_claimed_only_from_empty_caches(tmp_path, caches, words):
    """A first call says nothing of the handout's 10 minutes from an empty cache unless the row recorded
    that the on-disk caches were empty; then the whole run's time is what counts, not the first call's."""
    rows = _line_rows() + _allreduce() + [_two("keep_attention", 0, 6.9, 6880.0, 70.0, caches=caches,
                                               run_wall_s=140.0)]
    f = page.facts(context(rows, tmp_path))
    assert f.multi.first_calls[0].from_empty_caches is (None if caches is None else caches == (0, 0))
    assert words in render_page("leaderboard_2026.md.j2", f=f)


def test_the_cold_start_is_judged_by_the_whole_run(tmp_path):
    """A run from empty caches is within the handout's 10 minutes only if its last candidate is: the first
    row ending early says nothing of the candidates after it."""
    rows = _line_rows() + _allreduce() + [
        _two("keep_attention", 0, 6.9, 6880.0, 70.0, caches=(0, 0), run_wall_s=140.0),
        _two("keep_attention", 2, 7.1, 7080.0, 5.0, caches=(150, 40), run_wall_s=650.0)]
    text = render_page("leaderboard_2026.md.j2", f=page.facts(context(rows, tmp_path)))
    assert ("its first candidate's row ended 140 s after the run's start, and its last, the run's 2 candidates "
            "done (the fastest among them), 650 s after: over the 10 minutes") in text


@pytest.mark.parametrize("winner_in_cold_run", [False, True])
def test_a_later_warm_run_keeps_the_newest_cold_run_on_the_page(tmp_path, winner_in_cold_run):
    """A later run from warm caches must not hide the newest run from empty caches: the page names it, its
    whole-run time (superseded rows included), and whether the newest fastest configuration was among its
    candidates."""
    cold_day, warm_day = "2026-03-02T00:00:00", "2026-03-03T00:00:00"
    cold = [_two("keep_attention", 0, 7.0, 6950.0, 70.0, when=cold_day, caches=(0, 0), run_wall_s=160.0),
            _two("keep_attention", 2, 6.9, 6900.0, 5.0, when=cold_day, caches=(300, 40), run_wall_s=450.0)]
    warm = [_two("keep_attention", 6, 6.95, 6950.0, 30.0, caches=(400, 0), run_wall_s=150.0),
            _two("keep_attention", 2 if winner_in_cold_run else 4, 6.8, 6800.0, 5.0, caches=(400, 0),
                 run_wall_s=300.0)]
    rows = _line_rows() + _allreduce() + [cold[0]] + warm  # the cold run's k 2 row superseded (when the warm run has k 2)
    f = page.facts(context(rows, tmp_path, history=[cold[1]]))
    m = f.multi
    assert [c.policy for c in m.cold] == ["keep_attention (k 0)", "keep_attention (k 2)"]
    assert m.cold[-1].run_wall_s == 450.0 and m.cold_has_answer is winner_in_cold_run
    text = render_page("leaderboard_2026.md.j2", f=f)
    assert ("The newest run that began from empty compile caches, of 2026-03-02 00:00 UTC (2 candidates), ended its "
            "first candidate's row 160 s after its start and its last 450 s after: within the 10 minutes.") in text
    assert ("The fastest configuration above was among its candidates." if winner_in_cold_run else
            "The fastest configuration above was not among its candidates, so its own cold start is not measured."
            ) in text


def test_a_run_whose_fastest_was_measured_again_marks_no_other_row_fastest(tmp_path):
    """The table shows each candidate's newest row; the older run whose fastest candidate ran again later keeps
    that candidate as its fastest (in history), so none of its remaining rows is marked the fastest of its run."""
    first, second = "2026-03-02T00:00:00", "2026-03-03T00:00:00"
    again = _two("keep_attention", 0, 6.9, 6900.0, 5.0, when=first)  # run 1's fastest, superseded by run 2's
    rows = _line_rows() + _allreduce() + [_two("keep_attention", 2, 7.0, 7000.0, 5.0, when=first),
                                          _two("keep_attention", 0, 6.8, 6800.0, 5.0, when=second),
                                          _two("keep_attention", 4, 6.95, 6950.0, 5.0, when=second)]
    m = page.facts(context(rows, tmp_path, history=[again])).multi
    assert m.fastest["2026-03-02 00:00"].step_s == pytest.approx(6.9)
    assert not any(m.fastest["2026-03-02 00:00"] is c for c in m.candidates)
    assert m.newest.policy == "keep_attention (k 0)" and m.fastest["2026-03-03 00:00"] is m.newest
    text = render_page("leaderboard_2026.md.j2", f=page.facts(context(rows, tmp_path, history=[again])))
    k2 = next(line for line in text.splitlines() if line.startswith("| keep_attention (k 2) | 2026-03-02"))
    assert k2.endswith("|  |")


def test_the_newest_run_from_empty_caches_is_not_named_twice(tmp_path):
    rows = _line_rows() + _allreduce() + [_two("keep_attention", 0, 6.9, 6880.0, 70.0, caches=(0, 0),
                                               run_wall_s=140.0)]
    f = page.facts(context(rows, tmp_path))
    assert f.multi.cold == () and "The newest run that began from empty" not in render_page(
        "leaderboard_2026.md.j2", f=f)


def test_a_candidate_measured_again_shows_its_earlier_runs(tmp_path):
    """The table keeps each candidate's newest row; its earlier measured runs on the same device stay on
    the page as the spread between runs (another device's or an unmeasured row does not count)."""
    old = _two("keep_attention", 0, 7.0, 6950.0, 7.0, when="2026-03-02T00:00:00")
    elsewhere = _two("keep_attention", 0, 9.0, 8950.0, 7.0, when="2026-03-01T00:00:00", device="h100-80gb-x2")
    oom = _two("keep_attention", 0, 7.0, 6950.0, 7.0, when="2026-03-01T12:00:00")
    oom.row.status = Status.OOM
    new = _two("keep_attention", 0, 6.9, 6880.0, 7.0)
    f = page.facts(context(_line_rows() + _allreduce() + [new], tmp_path, history=[elsewhere, oom, old]))
    assert f.multi.newest.earlier == (("2026-03-02 00:00", pytest.approx(6.95)),)
    assert "| 6.880 | 6.950 (2026-03-02 00:00) |" in render_page("leaderboard_2026.md.j2", f=f)


def test_one_gpu_rows_alone_predict_with_the_two_process_bus_bandwidth(tmp_path):
    oom = _one(8, None, 0, "none", status=Status.OOM)
    f = page.facts(context(_line_rows() + [_one(1, 0.25, 26, "none"), oom] + _allreduce(), tmp_path))
    assert f.multi is None and f.w.processes == 2 and f.w.bps == 300e9  # not the 4-process one
    assert f.one.fit_policy == "every_k (k 1)" and len(f.one.fit_runs) == 3  # the policy with most layer counts
    assert f.pred == _pred() and f.pred.compute_s == pytest.approx(0.3 + 0.2 * 34)
    assert [(r.layers, r.policy, r.status) for r in f.one.rows] == [
        (1, "every_k (k 1)", Status.MEASURED), (2, "every_k (k 1)", Status.MEASURED),
        (4, "every_k (k 1)", Status.MEASURED), (1, "none", Status.MEASURED), (8, "none", Status.OOM)]
    assert f.one.rows[-1].reason == "CUDA out of memory" and f.one.rows[2].median_s == pytest.approx(1.1)
    assert f.scores[P] == Scored(Kind.PREDICTED, "h200-141gb-x1 + h200-141gb-x2", "2026-03-02")


def test_without_rows_or_a_fit_nothing_is_predicted(tmp_path):
    f = page.facts(context(_allreduce(), tmp_path))
    assert f.one is None and f.pred is None and f.scores[P].kind is Kind.NOT_MEASURED
    f = page.facts(context(_allreduce() + [_one(2, 0.7, 26)], tmp_path))
    assert not f.fits and f.pred is None and [r.layers for r in f.one.rows] == [2]
    f = page.facts(context(_line_rows(), tmp_path))
    assert f.fits and f.w is None and f.pred is None


def test_the_newest_winner_by_part_and_old_rows_without(tmp_path):
    """Where the newest winner's row has step_breakdown's parts, the facts give every part, communication
    not hidden and the rest, summing to the measured step, and the blocks' cost per layer; an older row
    (no parts_ms) gives none, and the page then says nothing of parts."""
    rows = _allreduce() + [_two("every_k", 1, 7.5, 7450.0, 60.0), _two("keep_attention", 0, 6.9, 6880.0, 7.0, parts=True)]
    s = page.facts(context(rows, tmp_path)).multi.parts
    assert s.of.policy == "keep_attention (k 0)" and s.step_ms == 6900.0
    rows_ms = dict(s.rows)
    assert list(rows_ms)[:-2] == [k for k in PARTS if k != "communication"]
    assert rows_ms["communication exposed"] == 50.0 and rows_ms["rest"] == pytest.approx(6900.0 - 5060.0 - 50.0)
    assert sum(rows_ms.values()) == pytest.approx(s.step_ms)
    assert (s.communication_ms, s.hidden_ms) == (130.0, 80.0)
    assert s.per_layer_ms == pytest.approx(4700.0 / 34) and s.attention_per_layer_ms == pytest.approx(2100.0 / 34)
    old = page.facts(context(rows[:-1] + [_two("keep_attention", 0, 6.9, 6880.0, 7.0)], tmp_path / "old"))
    assert old.multi.parts is None
    assert "part by part" not in render_page("leaderboard_2026.md.j2", f=old)


def test_page_words(request, tmp_path):
    """The newest winner has parts; the other profiled candidate is an older row without them."""
    rows = _line_rows() + [_one(8, None, 0, "none", status=Status.OOM)] + _allreduce() + [
        _two("every_k", 1, 7.5, 7450.0, 60.0), _two("keep_attention", 0, 6.9, 6880.0, 7.0, parts=True)]
    assert_snapshot(request, P, render_page("leaderboard_2026.md.j2", f=page.facts(context(rows, tmp_path))))


def test_policy_label_names_every_option_away_from_the_default():
    from impl.report.pages.leaderboard_2026 import StepConfig, policy_label

    assert policy_label(StepConfig(checkpointing="every_k", k=1)) == "every_k (k 1)"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=5, compile="pointwise", attn_impl="flash_gluon",
                                   allocator="expandable_segments")) == \
        "keep_attention (k 5), pointwise compiled, flash_gluon, expandable segments"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=7, compile="pointwise", attn_impl="flash_gluon",
                                   grad_sync="reduce_to_owner")) == \
        "keep_attention (k 7), pointwise compiled, flash_gluon, reduce to owner"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=5, nccl_high_priority=True)) == \
        "keep_attention (k 5), nccl high priority"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=5, nccl_max_ctas=8)) == \
        "keep_attention (k 5), nccl max ctas 8"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=10, residual="bf16")) == \
        "keep_attention (k 10), bf16 residual"
    assert policy_label(StepConfig(checkpointing="keep_attention", k=12, lm_head_chunk_mib=1024,
                                   lm_head_softmax="triton")) == \
        "keep_attention (k 12), lm_head_chunk 1024 MiB, triton softmax"


def test_the_step_in_nsys_names_its_candidate_and_says_a_trace_that_lost_records(tmp_path, request):
    """The 8B step's nsys capture (impl.nsys's leaderboard_2026 case): its candidate's label, each rank's
    kernels; a rank with fewer all-reduce kernels than calls issued lost records, and the page says so."""
    from kits.nsys_outputs import RANGES, file_run, write_export

    export = write_export(tmp_path / "lb.sqlite", ranges=RANGES + [("ncclAllReduce", 395, 405),
                                                                   ("ncclAllReduce", 500, 505)])
    file_run(tmp_path / "data", "h200-141gb-x2", "20261126T143456Z", [(
        "leaderboard_2026_keep_attention-3-pointwise-flash_gluon", "leaderboard_2026",
        dict(config="8B", checkpointing="keep_attention", k=3, compile="pointwise", attn="flash_gluon"), export)])
    rows = _line_rows() + _allreduce() + [_two("keep_attention", 0, 6.9, 6880.0, 7.0)]
    f = page.facts(context(rows, tmp_path))
    t = f.nsys.timeline
    assert t.label == "keep_attention (k 3), pointwise compiled, flash_gluon" and t.step == "step 0"
    assert [r.wait("ncclAllReduce").kernels for r in t.ranks] == [1, 1] and not t.complete
    assert any(s.endswith("extract/leaderboard_2026_keep_attention-3-pointwise-flash_gluon.timeline.json.gz")
               for s in f.sources)
    assert "This capture lost kernel records" in render_page("leaderboard_2026.md.j2", f=f)


def test_kernels_linked_to_no_op_are_named_beside_the_gap(tmp_path):
    """A row whose profile has unlinked kernel time (> 5% of the step) says so beside the gap; a flash_gluon row
    without parts (recorded before the Gluon halves ran inside an op) says its forward attention is among them."""
    def rows(unlinked, attn_impl):
        b = _two("keep_attention", 0, 6.9, 6880.0, 7.0)
        b.details["breakdown"]["unlinked_kernel_ms"] = unlinked
        b.row.config["attn_impl"] = attn_impl
        return _allreduce() + [b]

    text = render_page("leaderboard_2026.md.j2", f=page.facts(context(rows(700.0, "flash_gluon"), tmp_path / "a")))
    assert "linked to no launching op ran 0.70 s" in text and "Gluon forward attention" in text
    text = render_page("leaderboard_2026.md.j2", f=page.facts(context(rows(700.0, "flash_triton"), tmp_path / "b")))
    assert "linked to no launching op ran 0.70 s" in text and "Gluon forward attention" not in text
    text = render_page("leaderboard_2026.md.j2", f=page.facts(context(rows(100.0, "flash_gluon"), tmp_path / "c")))
    assert "linked to no launching op" not in text
