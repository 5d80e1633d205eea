"""ddp (impl.report.pages.ddp): facts from synthetic rows, and the page's words as a snapshot."""
from __future__ import annotations

import pytest

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.bench.test_record import TestRecord as Record
from impl.bench.test_record import store_record
from impl.report.pages import Kind, Scored
from impl.report.pages import ddp as page
from impl.report.templating import render_page
from impl.workloads.problems import Problem as P
from kits.nsys_outputs import CAPTURED, file_run, write_export
from kits.report_rows import assert_snapshot, bench, context

DEV = "h200-141gb-x2"
OLD, NEW = "2026-11-22T05:00:00", "2026-11-26T04:00:00"
PROBLEM = {"single": "ddp_benchmarking_anchors", "torch_ddp": "ddp_benchmarking_anchors",
           "naive": P.NAIVE_DDP_BENCHMARKING, "flat": P.MINIMAL_DDP_FLAT_BENCHMARKING,
           "individual": P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING, "bucketed": P.DDP_BUCKETED_BENCHMARKING}
O, W = 50e-6, 100e9  # the all-reduce fit: t = o + S / w
S = 4 * 2**30  # fp32 gradient bytes


def _ddp(variant, median=None, *, edition="2026", context=512, batch=4, bucket_mb=None, when=NEW, comm_s=None,
         peak=None, n_buckets=None, timeline=None, status=Status.MEASURED, reason=None):
    details = dict(grad_bytes=S, steps=dict(comm_s=comm_s), num_buckets=n_buckets)
    if timeline:
        details["timeline"] = timeline
    return bench(PROBLEM[variant], dict(size="xl", edition=edition, context=context, batch_per_rank=batch,
                                        world_size=2, backend="nccl", variant=variant, bucket_mb=bucket_mb),
                 median, device=DEV, section="ddp", when=when, details=details, peak=peak, status=status, reason=reason,
                 metrics={Metric.COMM_SHARE: comm_s / median} if comm_s and median else {})


def _timeline(compute_us, comm_us, overlap_us):
    return dict(source="cuda kernels", span_us=compute_us + comm_us - overlap_us, overlap_us=overlap_us,
                busy_us=dict(compute=compute_us, communication=comm_us),
                lanes=dict(compute=[[0, compute_us]], communication=[[compute_us - overlap_us, comm_us]]),
                phases=[dict(name="backward", start_us=0, dur_us=compute_us)])


def _new_run():
    """xl (2026): the floor, naive, flat, per-parameter overlapped and torch DDP at two contexts; a profiled
    naive and overlapped step."""
    out = []
    for context, batch, k in ((128, 2, 0.25), (512, 4, 1.0)):
        traced = context == 128  # the profiled step rides on the first context's rows
        out += [_ddp("single", 1.00 * k, context=context, batch=batch, peak=60 * 2**30),
                _ddp("naive", 1.10 * k, context=context, batch=batch, comm_s=0.08 * k, peak=61 * 2**30,
                     timeline=traced and _timeline(200e3, 50e3, 0)),
                _ddp("flat", 1.12 * k, context=context, batch=batch, comm_s=0.09 * k),
                _ddp("individual", 1.04 * k, context=context, batch=batch, comm_s=0.01 * k,
                     timeline=traced and _timeline(200e3, 60e3, 45e3)),
                _ddp("torch_ddp", 1.05 * k, context=context, batch=batch)]
    return out


def _old_run():
    """xl (2025): the floor, naive, four bucket sizes and torch DDP at one context (one bucket OOM)."""
    return [_ddp("single", 0.70, edition="2025", when=OLD),
            _ddp("naive", 0.80, edition="2025", when=OLD, comm_s=0.05),
            _ddp("bucketed", 0.78, edition="2025", when=OLD, bucket_mb=1, comm_s=0.04, n_buckets=400),
            _ddp("bucketed", 0.72, edition="2025", when=OLD, bucket_mb=100, comm_s=0.03, n_buckets=90),
            _ddp("bucketed", 0.7201, edition="2025", when=OLD, bucket_mb=1000, comm_s=0.06, n_buckets=8),
            _ddp("bucketed", edition="2025", when=OLD, bucket_mb=10, status=Status.OOM, reason="CUDA out of memory"),
            _ddp("torch_ddp", 0.75, edition="2025", when=OLD)]


def _allreduce():
    """The same device's all-reduce rows the bucket model's fit reads."""
    return [bench("distributed_communication_single_node", dict(backend="nccl", world_size=2, bytes=n), O + n / W,
                  device=DEV, when=OLD) for n in (2**20, 2**24, 2**28)]


def _record(tmp_path, device, when, commit, passed, failures=()):
    rec = Record(device, when, commit, False, "s", "k", "pytest correctness -n 12", passed, len(failures), 0, 7,
                     100.0, list(failures))
    return store_record(rec, tmp_path / "data")


RECORDS = (("h100-80gb-x1", "2026-11-26T10:00:00+00:00", "aaaaaaa", 900, ()),  # one GPU: not a multi-GPU record
           (DEV, "2026-11-26T09:02:51+00:00", "36ed28e", 1544, ()),
           (DEV, "2026-11-26T09:20:43+00:00", "897afeb", 1666, ("correctness.test_training_step::test_fast",)))


def _facts(tmp_path, rows=None, records=RECORDS):
    for r in records or ():
        _record(tmp_path, *r)
    return page.facts(context(_old_run() + _new_run() + _allreduce() if rows is None else rows, tmp_path))


def test_each_size_run_divides_only_its_own_rows(tmp_path):
    """xl (2026) and xl (2025) on one device: each [edition, size] run's groups hold its own rows only, so the
    2026 floor never divides a 2025 bucketed row; the 2026 run comes first, and its files come with it."""
    f = _facts(tmp_path)
    (s,) = f.sections
    new, old = s.runs
    assert (new.run.edition, new.run.size_short, old.run.size_short) == ("2026", "xl (2026)", "xl (2025)")
    assert new.run.files == (f"reports/data/{DEV}/ddp/20261126T0400Z_abcdef12.json",)
    g = new.largest
    assert (g.context, g.batch) == (512, 4) and not g.buckets
    assert g.ratio(("naive", None), page.SINGLE).value == pytest.approx(1.10)
    naive = g.get(("naive", None))
    assert naive.peak == 61 * 2**30 and naive.comm_share == pytest.approx(0.08 / 1.10) and naive.comm_s == 0.08
    assert old.largest.ratio(("bucketed", 100), page.SINGLE).value == pytest.approx(0.72 / 0.70)
    assert [r.run.edition for r in f.steps_runs] == ["2026", "2025"]
    assert f.bucketed_runs == (old,) and f.bucketed_current == "2025" and f.steps_current == "2026"


def test_the_gap_over_the_floor_is_the_best_of_ours(tmp_path):
    g = _facts(tmp_path).sections[0].runs[0].largest
    assert g.best_ours.label == "individual parameters (overlapped)"
    assert g.gap_s == pytest.approx(0.04) and g.best_ours.comm_s == pytest.approx(0.01)
    assert [v.key[0] for v in g.variants] == ["single", "naive", "flat", "individual", "torch_ddp"]


def test_not_run_rows_are_named_and_divide_nothing(tmp_path):
    g = _facts(tmp_path).sections[0].runs[1].largest
    oom = next(v for v in g.variants if v.key == ("bucketed", 10))
    assert (oom.b.status, oom.b.row.reason) == (Status.OOM, "CUDA out of memory") and g.get(oom.key) is None
    assert sorted(g.buckets) == [1, 100, 1000] and g.best_bucket == 100


def test_scores_read_the_current_editions_largest_context(tmp_path):
    f = _facts(tmp_path)
    new, old = f.sections[0].runs
    s = f.timed[P.NAIVE_DDP_BENCHMARKING]
    assert (s.run, s.group.context, s.key) == (new, 512, ("naive", None))
    b = f.timed[P.DDP_BUCKETED_BENCHMARKING]
    assert (b.run, b.key, b.group.best_ours.label) == (old, ("bucketed", 100), "bucketed 100 MB")
    assert b.group.ratio(b.key, page.TORCH).value == pytest.approx(0.72 / 0.75)
    assert f.scores[P.DDP_BUCKETED_BENCHMARKING] == Scored(Kind.MEASURED, DEV, "2026-11-22")
    assert f.scores[P.NAIVE_DDP] == Scored(Kind.MEASURED, DEV, "2026-11-26") and f.tests.record.passed == 1666
    assert f.index_figures == [f"figures/ddp-{DEV}-2026-xl-overhead-vs-torch-ddp.png"]  # the first run's


def test_without_a_multi_gpu_record_the_implementations_are_not_measured(tmp_path):
    f = _facts(tmp_path, records=RECORDS[:1])
    assert f.tests is None and f.scores[P.NAIVE_DDP].kind is Kind.NOT_MEASURED


def test_the_newest_multi_gpu_record_answers_failures_and_all(tmp_path):
    """The newest record of a two-GPU device, not the newest green one; its failure is not in a distributed file."""
    f = _facts(tmp_path)
    t = f.tests
    assert (t.device, t.record.commit, t.when) == (DEV, "897afeb", "2026-11-26 09:20")
    assert (t.record.passed, t.record.failed, t.record.errors) == (1666, 1, 0)
    assert t.distributed_failures == () and t.other_failures == ("correctness.test_training_step::test_fast",)
    assert t.file == f"reports/data/{DEV}/tests/20261126T092043Z_897afeb.json" and t.file in f.sources


def test_a_failure_in_a_distributed_file_is_named(tmp_path):
    recs = ((DEV, "2026-11-26T09:20:43+00:00", "897afeb", 10,
             ("correctness.test_distributed::test_overlapped_ddp_ranks_exit_cleanly[bucketed]",)),)
    t = _facts(tmp_path, records=recs).tests
    assert t.distributed_failures == ("correctness.test_distributed::test_overlapped_ddp_ranks_exit_cleanly[bucketed]",)
    assert t.other_failures == ()


def test_page_words_with_a_distributed_failure(request, tmp_path):
    """The implementation answers when the newest two-GPU record failed a distributed test: not shown to hold."""
    recs = ((DEV, "2026-11-26T09:20:43+00:00", "897afeb", 10,
             ("correctness.test_distributed::test_overlapped_ddp_ranks_exit_cleanly[bucketed]",)),)
    assert_snapshot(request, "ddp-distributed_failure", render_page("ddp.md.j2", f=_facts(tmp_path, records=recs)))


def test_bucket_model_fits_the_devices_allreduce_and_reads_the_buckets_formed(tmp_path):
    f = _facts(tmp_path)
    m = f.sections[0].runs[1].model
    assert m.fit.o_s == pytest.approx(O) and m.fit.w_bps == pytest.approx(W)
    assert m.best_mb == pytest.approx(acc.optimal_bucket_bytes(S, O, W) / 2**20) and m.whole_s == pytest.approx(S / W)
    (g,) = m.groups
    assert (g.best_bucket, g.ties(g.best_bucket), m.around(g)) == (100, [1000], (100, 1000))
    assert m.t_formed(g.buckets[1].n_buckets) == pytest.approx(acc.bucketed_overhead(S, 400, O, W))
    assert m.t_equal(1) == pytest.approx(acc.overhead_for_bucket_size(S, 2**20, O, W))
    assert f.sections[0].runs[0].model is None  # the 2026 run has no bucketed rows
    assert any("distributed_communication" in x for x in f.sources)


def test_bucket_model_without_allreduce_rows_names_no_fit(tmp_path):
    f = _facts(tmp_path, _old_run(), records=())
    m = f.sections[0].runs[0].model
    assert m.fit is None and sorted(m.groups[0].buckets) == [1, 100, 1000] and all("/ddp/" in x for x in f.sources)


def test_timeline_reads_the_profiled_steps(tmp_path):
    r = _facts(tmp_path).sections[0].runs[0]
    t = r.timeline
    assert [x.label for x in t.rows] == ["naive (per-parameter, after backward)", "individual parameters (overlapped)"]
    assert t.rows[1].overlap_share == pytest.approx(0.75) and not t.bucketed_for_overlap
    assert dict(r.overlap) == {"individual parameters (overlapped)": pytest.approx(0.75),
                               "naive (per-parameter, after backward)": 0.0}
    assert (tmp_path / t.figure).is_file() and (tmp_path / r.figure).is_file()


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.sections == () and {s.kind for s in f.scores.values()} == {Kind.NOT_MEASURED}
    assert len(f.scores) == 7 and f.index_figures == []


def test_page_words(request, tmp_path):
    _nsys(tmp_path)
    f = _facts(tmp_path)
    assert_snapshot(request, "ddp", render_page("ddp.md.j2", f=f))


DDP_RANGES = [("step 1", 0, 1000), ("forward", 0, 300), ("backward", 300, 700), ("finish_gradient_synchronization", 700, 900),
              ("optimizer step", 900, 1000)]


def _nsys(tmp_path, captured=CAPTURED):
    """Two filed NVTX-only DDP cases of the 2026 xl: naive issues its all-reduce after backward, the overlapped one
    inside it; their captures kept at the commit `captured` (None: not recorded)."""
    cases = []
    for variant, nccl_at, wait in (("naive", 710, (700, 900)), ("individual", 400, (700, 720))):
        ranges = [r if r[0] != "finish_gradient_synchronization" else (r[0], *wait) for r in DDP_RANGES]
        ranges += [("ncclAllReduce", nccl_at, nccl_at + 5)]
        export = write_export(tmp_path / f"{variant}.sqlite", drop_table="CUPTI_ACTIVITY_KIND_KERNEL", ranges=ranges)
        cases.append((f"ddp_2026_xl_{variant}_ctx128", "ddp",
                      dict(edition="2026", size="xl", variant=variant, context=128, batch=2), export))
    file_run(tmp_path / "data", DEV, "20261126T090839Z", cases, captured=captured)


def test_nsys_timelines_read_the_filed_exports(tmp_path):
    _nsys(tmp_path)
    n = _facts(tmp_path).nsys
    assert (n.context, n.batch, n.editions, n.kernels) == (128, 2, ["2026"], 0)
    naive, ind = n.get("2026", "naive"), n.get("2026", "individual")
    assert naive.ranks[0].phase("finish_gradient_synchronization") == pytest.approx(0.2)
    assert naive.ranks[0].issued == (("ncclAllReduce", 1, 0, 0),) and ind.ranks[0].issued == (("ncclAllReduce", 1, 0, 1),)
    assert ind.ranks[0].phase("finish_gradient_synchronization") == pytest.approx(0.02) and len(ind.ranks) == 2
    assert (tmp_path / naive.figure).is_file() and naive.overlap == ()
    assert any(x.endswith("ddp_2026_xl_individual_ctx128.nsys-rep") for x in _facts(tmp_path / "x").sources) is False
    assert any(x.endswith("extract/ddp_2026_xl_naive_ctx128.timeline.json.gz") for x in _facts(tmp_path).sources)
    # the GUI report named where it is kept (a commit of the history), from the folder's records alone: no rep/
    rep = f"{CAPTURED[:12]}:reports/data/{DEV}/nsys/20261126T090839Z_abcdef1/rep/ddp_2026_xl_naive_ctx128.nsys-rep"
    assert str(naive.rep) == rep and naive.rep.commit == CAPTURED and rep in _facts(tmp_path).sources
    assert not (tmp_path / "data" / DEV / "nsys" / "20261126T090839Z_abcdef1" / "rep").exists()


def test_a_gui_report_its_folder_does_not_record_is_named_as_possibly_lost(tmp_path):
    """The pages name a capture's commit from the run folder's CAPTURES.json alone: one the filing kept but the record
    does not name gets no `git show` (it would be false), only a sentence saying so."""
    from impl.report.pages._nsys import Capture
    from impl.report.templating import environment
    open_captures = environment().get_template("_runs.md.j2").module.open_captures
    run = f"reports/data/{DEV}/nsys/20261126T090839Z_abcdef1/rep"
    kept, lost = Capture(f"{run}/a.nsys-rep", CAPTURED), Capture(f"{run}/b.nsys-rep", None)
    assert str(open_captures([kept, lost])) == (
        "Open the `.nsys-rep` file in the Nsight Systems GUI; it is kept in this repository's history (commit "
        f"`{CAPTURED[:12]}`), out of main's tree: `git show {CAPTURED[:12]}:{run}/a.nsys-rep > a.nsys-rep`; "
        "`b.nsys-rep` was kept by its filing, but the run folder's CAPTURES.json names no commit holding it, so it "
        "may be lost")
    assert "git show" not in str(open_captures([lost, lost]))
    # a folder without the record: the page says so and names the report by its path alone
    _nsys(tmp_path, captured=None)
    f = _facts(tmp_path)
    assert f.nsys.get("2026", "naive").rep.commit is None and f"{run}/ddp_2026_xl_naive_ctx128.nsys-rep" in f.sources
    page = render_page("ddp.md.j2", f=f)
    assert "names no commit holding them, so they may be lost" in page and "git show" not in page


def test_nsys_kernels_per_rank_and_a_rank_with_lost_records_is_incomplete(tmp_path):
    """2026-11-26 14:34's exports hold both ranks' kernels, some with records lost: a rank whose step launched
    fewer kernels than the most a measured step recorded is incomplete, one with every kernel and one NCCL kernel
    per all-reduce issued is whole; each rank's NCCL time under compute comes from its own GPU."""
    from kits.nsys_outputs import RANGES
    export = write_export(tmp_path / "k.sqlite", ranges=RANGES + [("ncclAllReduce", 395, 405)])
    file_run(tmp_path / "data", DEV, "20261126T143456Z", [("ddp_2026_xl_individual_ctx128", "ddp",
                                                            dict(edition="2026", size="xl", variant="individual",
                                                                 context=128, batch=2), export)])
    t = _facts(tmp_path).nsys.get("2026", "individual")
    r0, r1 = t.ranks
    assert t.step == "step 0" and (r0.device, r1.device) == (0, 1)
    assert (r0.kernels, r0.nccl_kernels, r0.recorded_share, r0.complete) == (5, 1, 1.0, True)
    assert (r1.kernels, r1.recorded_share, r1.complete) == (3, pytest.approx(0.6), False) and not t.complete
    # rank 0: AllReduce 450-700 us, compute 320-600: 150 us of its 250 under compute
    assert r0.overlap.nccl_hidden_share == pytest.approx(0.6) and r0.exposed_ms == pytest.approx(0.1)
    w = r0.wait("ncclAllReduce")
    assert (w.kernels, w.forward, w.waited) == (1, 0, 0)
    assert r0.backward_gap_ms == pytest.approx(0.4)  # backward 300-800 us, its last launch at 400


def test_a_rank_whose_backward_pauses_launching_past_the_bound_is_incomplete():
    """2025 xl naive: both ranks recorded as many kernels as each other and every all-reduce, yet a 91 and a 156
    ms stretch of backward without a launch: records lost on both, which the counts alone did not show."""
    from dataclasses import replace

    from impl.report.pages._nsys import LAUNCH_GAP_MS, CollectiveKernels, RankPhases
    whole = CollectiveKernels("ncclAllReduce", 1, 0, 0.0, 0, 0, 0.0)
    r = RankPhases(0, 1.0, (), (("ncclAllReduce", 1, 0, 1),), 0, 10, 1, 1.0, None, (whole,), LAUNCH_GAP_MS)
    assert r.complete and not replace(r, backward_gap_ms=LAUNCH_GAP_MS + 1).complete


def test_the_index_answer_says_not_shown_when_a_distributed_test_failed(tmp_path):
    """The index row of an implementation problem follows the page: a failure in the distributed files at the
    newest multi-GPU record's commit is not "weights match" (2xH200 a4ea09d: test_the_store_outlives_every_rank)."""
    from kits.report_rows import template_macros as macros

    recs = ((DEV, "2026-11-26T14:27:42+00:00", "a4ea09d", 10,
             ("correctness.test_distributed::test_the_store_outlives_every_rank",)),)
    f = _facts(tmp_path, records=recs)
    assert macros("ddp.md.j2").score_answer(f, "naive_ddp") == \
        "not shown at `a4ea09d`: 1 failed in the distributed tests"
    assert macros("ddp.md.j2").score_answer(_facts(tmp_path / "g"), "naive_ddp") == \
        "weights match single-process training"
