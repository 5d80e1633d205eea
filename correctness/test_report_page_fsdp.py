"""fsdp and fsdp_accounting (impl.report.pages.fsdp): facts from synthetic rows and the committed runs,
and the page's words as a snapshot."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.bench.row import Metric, Status
from impl.report.pages import Kind, Scored
from impl.report.pages import fsdp as page
from impl.report.templating import render_page
from impl.workloads.variants import FSDPVariant
from kits.report_rows import assert_snapshot, bench, context

ROOT = Path(__file__).resolve().parents[1]
X2, X4, X1 = "h200-141gb-x2", "h200-141gb-x4", "h100-80gb-x1"
NEW, OLD = "2026-11-26T04:00:00", "2026-11-23T06:00:00"
GiB = 2**30


def _timeline(fwd_late: int = 0) -> dict:
    """Rank 0's instrumented step of 3 layer calls: forward and backward gathers, reduce-scatters and the
    replicated all-reduce; `fwd_late` forward gathers after the first stall."""
    rows = []
    for call in range(3):
        stall = 0.5 if call == 0 or call <= fwd_late else 0.0
        rows.append([call, "all_gather", "forward", call * 10.0, call * 10.0 + 1, call * 10.0 + 1 - stall, stall])
        rows.append([call, "all_gather", "backward", 40 + call * 10.0, 41 + call * 10.0, 42 + call * 10.0, 0.0])
        rows.append([call, "reduce_scatter", "backward", 45 + call * 10.0, 46 + call * 10.0, None, 0.0])
    rows.append([-1, "all_reduce", "finish", 80.0, 80.3, 80.0, 0.3])
    in_time = 3 - 1 - fwd_late
    groups = [dict(kind="all_gather", phase="forward", n=3, prefetched=2, used=3, in_time=in_time,
                   stall_ms=0.5 * (1 + fwd_late), max_stall_ms=0.5, max_stall_unit=0, comm_ms=3.0),
              dict(kind="all_gather", phase="backward", n=3, prefetched=3, used=3, in_time=3, stall_ms=0.0,
                   max_stall_ms=0.0, max_stall_unit=None, comm_ms=3.0),
              dict(kind="reduce_scatter", phase="backward", n=3, prefetched=3, used=3, in_time=3, stall_ms=0.0,
                   max_stall_ms=0.0, max_stall_unit=None, comm_ms=3.0),
              dict(kind="all_reduce", phase="finish", n=1, prefetched=0, used=1, in_time=0, stall_ms=0.3,
                   max_stall_ms=0.3, max_stall_unit=None, comm_ms=0.3)]
    summary = dict(groups=groups, gathers=6, gathers_in_time=in_time + 3, gather_stall_ms=0.5 * (1 + fwd_late),
                   exposed_ms=0.8 + 0.5 * fwd_late, span_ms=90.0)
    return dict(columns=["call", "kind", "phase", "issue_ms", "ready_ms", "need_ms", "stall_ms"], rows=rows,
                rows_total=len(rows), phases=[dict(name="forward", start_ms=0, end_ms=35),
                                              dict(name="backward", start_ms=35, end_ms=80)],
                summary=summary, units=["token_embeddings.weight", "layers.0.ffn.w1.weight", "lm_head.weight"],
                source="cuda events (compute stream; completion on a probe stream)")


def _fsdp(variant, median, *, device=X2, when=NEW, edition="2026", world=2, batch=4, peak=None, timeline=None,
          status=Status.MEASURED, reason=None, tp=None, dtype="fp32"):
    cfg = dict(size="xl", edition=edition, context=512, batch_per_rank=batch, world_size=world, backend="nccl",
               variant=variant, dtype=dtype)
    details = dict(n_params=3.4e9, predicted_activations_bytes=1e9, steps=dict(comm_s=0.002),
                   bytes_per_step=27.2e9, predicted_total_bytes=48 * GiB)
    if peak is not None:
        details["peak_bytes"] = peak
    if timeline is not None:
        details.update(timeline=timeline, timeline_step_s=median * 1.05,
                       timeline_ranks=[dict(summary=dict(exposed_ms=timeline["summary"]["exposed_ms"])),
                                       dict(summary=dict(exposed_ms=2.0))])
    if tp is not None:
        details.update(tp_predicted=tp, tp_traffic=dict(calls=128, payload_bytes=tp["payload_bytes_per_step"]))
    return bench("fsdp", cfg, median, device=device, section="fsdp", when=when, status=status, reason=reason,
                 details=details, peak=peak, iqr=median / 100 if median else None,
                 metrics={Metric.TOKENS_PER_S: batch * world * 512 / median} if median else {})


def _tp_pred(step_s):
    return dict(matmul_flops_per_s=48e12, allreduce_busbw_Bps=190e9, compute_s=step_s - 0.03, comm_s=0.03,
                step_s=step_s, payload_bytes_per_step=4 * 32 * 8 * 512 * 2560 * 4, max_devices_forward=31.6,
                max_devices_backward=62.3)


def _shard(variant, median, peak, *, device=X2, edition="2026", context=512):
    """An optimizer-sharding row whose ranks peak at `peak` (rank 0, during the step) and below."""
    ranks = [dict(init_peak=GiB, before_peak=b, after_peak=a, named_before=dict(parameters=0, gradients=0, buffers=0),
                  named_after=dict(optimizer_state=0)) for b, a in ((peak - GiB, peak), (peak - 2 * GiB, peak - GiB))]
    details = dict(ranks=ranks, predicted={}, predicted_ring_bytes_per_rank=dict(ddp=0, sharded_simple=0, zero1=0))
    return bench("optimizer_state_sharding_accounting",
                 dict(size="xl", edition=edition, context=context, batch_per_rank=4, world_size=2, variant=variant),
                 median, device=device, section="optimizer_sharding", when=NEW, details=details)


def _per_rank():
    cf = {v: dict(parameters=p * GiB, gradients=p * GiB, optimizer_state=o * GiB, activations=10.0 * GiB,
                  total=(2 * p + o + 10.0) * GiB)
          for v, p, o in (("fsdp", 1.0, 2.0), ("ddp", 2.0, 4.0), ("sharded_optimizer", 2.0, 2.0))}
    return bench("per_rank_memory", dict(size="xl", edition="2026", world_size=2, batch_per_rank=4, context=512,
                                         variant="ddp"), 1.1, device=X1, section="per_rank_memory", peak=9 * GiB,
                 details=dict(closed_form=cf, stages={"ddp": 0, "sharded_optimizer": 1, "fsdp": 3},
                              fits_this_gpu={"ddp": True, "sharded_optimizer": True, "fsdp": False},
                              gpu_memory_bytes=85e9))


def _rows():
    """A 2026 run of every configuration (DDP out of memory, so no 2026 saving), a 2025 run on the same
    device without the per-block row, TP over 2 ranks in the 2026 run and over 4 on another device."""
    new = [_fsdp("fsdp_block_bf16", 0.30, peak=32 * GiB, timeline=_timeline(), dtype="bf16"),
           _fsdp("torch_fsdp_bf16", 0.40, peak=32 * GiB, dtype="bf16"),
           _fsdp("fsdp", 1.10, peak=42 * GiB, timeline=_timeline(fwd_late=1)),
           _fsdp("torch_fsdp", 1.12, peak=43 * GiB),
           _fsdp("ddp", None, status=Status.OOM, reason="CUDA out of memory"),
           _fsdp("tp", 1.20, batch=8, peak=46 * GiB, tp=_tp_pred(1.0))]
    old = [_fsdp(v, m, when=OLD, edition="2025", peak=p * GiB) for v, m, p in
           (("fsdp", 0.74, 41), ("fsdp_bf16", 0.63, 28), ("ddp", 0.76, 53), ("torch_fsdp", 0.74, 34),
            ("torch_fsdp_bf16", 0.29, 24))]
    x4 = [_fsdp("tp", 0.60, device=X4, world=4, batch=8, peak=28 * GiB, tp=_tp_pred(0.5))]
    shard = [_shard("none", 1.14, 64 * GiB), _shard("sharded", 1.15, 51 * GiB), _shard("zero1", 1.13, 49 * GiB),
             _shard("none", 0.75, 45 * GiB, edition="2025")]
    return new + old + x4 + shard + [_per_rank()]


@pytest.fixture
def f(tmp_path):
    return page.facts(context(_rows(), tmp_path))


def test_headline_pair_is_the_target_configuration_not_the_best_looking_row():
    every = ["fsdp_block_bf16", "torch_fsdp_bf16", "fsdp_bf16", "torch_fsdp", "fsdp", "ddp"]
    assert page.headline_pair(every) == ("fsdp_block_bf16", "torch_fsdp_bf16")
    assert page.headline_pair([v for v in every if v != "fsdp_block_bf16"]) == ("fsdp_bf16", "torch_fsdp_bf16")
    assert page.headline_pair(["fsdp", "torch_fsdp", "ddp"]) == ("fsdp", "torch_fsdp")
    assert page.headline_pair(["fsdp", "ddp"]) is None


def test_each_edition_run_answers_apart_newest_edition_first(f):
    assert [(r.run.edition, r.device) for r in f.answers] == [("2026", X2), ("2025", X2)]
    new, old = f.answers
    assert new.headline.ours.label == "FSDP (ours), bf16 compute, a unit per block"
    assert new.headline.vs_anchor.value == pytest.approx(0.30 / 0.40) and new.headline.vs_ddp is None  # DDP OOM
    # against DDP (fp32) the fp32 FSDP row, not the bf16 headline pair: the same precision on both sides
    assert old.headline.anchor.label == "torch fully_shard, bf16" and old.headline.vs_ddp.value == pytest.approx(0.74 / 0.76)
    assert f.headline_run is new and f.headline_devices == f"{X2} + {X4}"  # the TP rows' devices too


def test_saving_needs_ddp_and_fp32_fsdp_of_one_run_and_reads_the_size_by_edition(f):
    new, old = f.answers
    assert new.saving is None and f.saving_run is old  # the 2026 DDP ran out of memory
    s = old.saving
    assert s.measured == 12 * GiB and s.of_predicted == pytest.approx(s.measured / s.predicted.saving)
    assert f.scores["fsdp_accounting"] == Scored(Kind.MEASURED, X2, "2026-11-23")
    assert f.scores["fsdp"] == Scored(Kind.MEASURED, f"{X2} + {X4}", "2026-11-26")


def test_table_rows_oom_cells_and_the_variants_a_run_lacks(f):
    new, old = f.answers
    ddp = next(r for r in new.rows if r.label.startswith("DDPBucketed"))
    assert (ddp.b.status, ddp.b.row.reason, ddp.step_s) == (Status.OOM, "CUDA out of memory", None)
    assert [r.label for r in new.rows if r.measured][0] == "FSDP (ours), bf16 compute, a unit per block"
    assert not any("TP" in r.label or r.label == "tp" for r in new.rows)  # TP rows have their own section
    rs1 = "FSDP (ours), bf16 compute, a unit per block, one reduce-scatter in flight"
    assert old.not_yet_run == ["FSDP (ours), bf16 compute, a unit per block", rs1] and new.not_yet_run == [
        rs1, "FSDP (ours), bf16 compute"]


def test_sharding_rows_beside_are_those_of_the_same_shape(f):
    new, old = f.answers
    assert [(x.name, x.peak) for x in new.sharding] == [("none", 64 * GiB), ("sharded", 51 * GiB), ("zero1", 49 * GiB)]
    assert [x.name for x in old.sharding] == ["none"]


def test_timeline_counts_gathers_in_time_per_phase_and_draws_one_figure_per_run(f, tmp_path):
    new, old = f.answers
    block, fp32 = new.timelines
    assert block.forward == (2, 3) and block.backward == (3, 3) and not block.all_in_time
    assert fp32.forward == (1, 3) and fp32.s["gather_stall_ms"] == 1.0
    (g, _, worst), *_ = block.collectives
    assert worst == "token_embeddings.weight" and g["used"] - g["in_time"] == 1  # one stalled
    assert [(g["kind"], g["phase"]) for g, *_ in block.collectives] == [("all_gather", "forward"), ("all_gather", "backward"),
                                                              ("reduce_scatter", "backward"), ("all_reduce", "finish")]
    assert block.rank_exposed_ms == (0.8, 2.0) and block.timed_s == 0.30
    assert new.figure == f"figures/fsdp-{X2}-2026-xl_fsdp_timeline.png"
    assert (tmp_path / "figures" / f"fsdp-{X2}-2026-xl_fsdp_timeline.png").is_file()
    assert old.ran_ours and old.timelines == [] and old.figure is None  # said to predate the timeline


def test_tp_divides_only_rows_of_one_run_and_checks_the_traffic_against_the_closed_form(f):
    from impl.parallelism_calcs import tp_step_allreduce_payload

    (t,) = f.tps
    assert (t.context, t.batch, [r.world for r in t.rows]) == (512, 8, [2, 4])
    assert t.size.startswith("xl (2026)") and t.has_fsdp and t.shared_runs and t.not_run == []
    by = {b.label: b for b in t.beside}
    assert by["FSDP (ours), fp32"].vs_tp.value == pytest.approx(1.20 / 1.10)
    two, four = t.rows
    assert two.closed_form_bytes == tp_step_allreduce_payload(8 * 512, 2560, 32, 4) == two.counted["payload_bytes"]
    assert two.closed_form_calls == 128 and two.ring_bytes_per_rank == two.closed_form_bytes
    assert four.ring_bytes_per_rank == pytest.approx(1.5 * four.closed_form_bytes)
    assert two.measured_over_predicted == pytest.approx(1.20) and four.measured_over_predicted == pytest.approx(1.2)
    assert four.run.files == (f"reports/data/{X4}/fsdp/20261126T0400Z_abcdef12.json",)


def test_tp_takes_the_ddp_sections_rows_only_while_the_fsdp_runs_have_no_ddp_row(tmp_path):
    naive = bench("naive_ddp_benchmarking", dict(size="xl", edition="2026", context=512, batch_per_rank=4,
                                                 world_size=2, variant="naive"), 1.05, section="ddp",
                  when="2026-11-20T00:00:00")
    rows = [_fsdp("tp", 1.2, batch=8, tp=_tp_pred(1.0)), naive]
    (t,) = page.facts(context(rows, tmp_path)).tps
    assert not t.has_fsdp and not t.shared_runs
    assert [(b.label, b.section, b.vs_tp) for b in t.beside] == [("naive (per-parameter, after backward)", "ddp", None)]
    f = page.facts(context(rows, tmp_path))
    assert f.sections == [] and f.headline_run is None and f.scores["fsdp"].kind is Kind.NOT_MEASURED


def test_per_rank_reads_each_variants_closed_form_and_the_measured_rank(f):
    (p,) = f.per_rank
    assert [v.name for v in p.variants] == ["ddp", "sharded_optimizer", "fsdp"]
    assert p.measured_peak == 9 * GiB and p.measured_over_closed_form == 0.5 and p.variants[-1].fits is False
    assert p.config.size_label.startswith("xl (2026)") and p.config.world_size == 2 and p.heading.endswith(f"({X1})")


def test_sources_name_every_run_file_read(f):
    assert f.sources == sorted({b.run.file for b in _rows()})


def test_no_gpu_rows_is_not_measured(tmp_path):
    f = page.facts(context([], tmp_path))
    assert f.answers == [] and {s.kind for s in f.scores.values()} == {Kind.NOT_MEASURED}


def test_committed_runs_headline_is_the_per_block_pair_and_saving_reads_2026_xl(tmp_path):
    """The newest committed xl (2026) run (2×H200, 2026-11-26 09:04) has the per-block row: the headline is
    ours with a unit per block against fully_shard, both bf16, from that one run; its DDP row fits the
    H200, so (a) reads the 2026 xl run's own size."""
    from impl.report import build

    ctx = build.context(ROOT / "reports" / "data", tmp_path)
    f = page.facts(ctx)
    h = f.headline_run
    med = {page.cfg(b).variant: b.stats.median for b in ctx.rows.of("fsdp", device=h.device)
           if page.cfg(b).edition == "2026" and b.measured}
    assert h.device == "h200-141gb-x2" and h.headline.ours.label == FSDPVariant.FSDP_BLOCK_BF16.label
    assert h.headline.vs_anchor.value == pytest.approx(med["fsdp_block_bf16"] / med["torch_fsdp_bf16"])
    assert (f.saving_run.run.edition, f.saving_run.run.name) == ("2026", "xl")
    (t,) = f.tps
    assert {r.run.device for r in t.rows} >= {"h200-141gb-x2", "h200-141gb-x4"} and t.not_run == []


def test_page_words(request, tmp_path):
    assert_snapshot(request, "fsdp", render_page("fsdp.md.j2", f=page.facts(context(_rows(), tmp_path))))


FSDP_RANGES = [("step 1", 0, 1000), ("forward", 0, 300), ("backward", 300, 800), ("optimizer step", 900, 1000),
               ("ncclAllGather", 10, 12), ("ncclAllGather", 150, 152), ("ncclAllGather", 400, 402),
               ("ncclReduceScatter", 500, 502)]


def _nsys(tmp_path):
    from kits.nsys_outputs import file_run, write_export

    cases = [(f"fsdp_2026_xl_{v}_ctx512", "fsdp", dict(edition="2026", size="xl", variant=v, context=512, batch=4),
              write_export(tmp_path / f"{v}.sqlite", drop_table="CUPTI_ACTIVITY_KIND_KERNEL", ranges=FSDP_RANGES))
             for v in ("fsdp", "fsdp_block_bf16")]
    file_run(tmp_path / "data", X2, "20261126T090839Z", cases)


def test_nsys_timelines_count_the_gathers_issued_per_phase(tmp_path):
    _nsys(tmp_path)
    n = page.facts(context(_rows(), tmp_path)).nsys
    assert [a["variant"] for a, _ in n.timelines] == ["fsdp_block_bf16", "fsdp"]  # the run order: per block first
    assert (n.context, n.batch, n.kernels) == (512, 4, 0)
    r = n.timelines[0][1].ranks[0]
    assert r.issued == (("ncclAllGather", 3, 2, 1), ("ncclReduceScatter", 1, 0, 1)) and r.phase("backward") == 0.5
    assert (tmp_path / n.timelines[0][1].figure).is_file()
    assert page.facts(context(_rows(), tmp_path / "none")).nsys is None


def test_page_words_with_nsys(request, tmp_path):
    _nsys(tmp_path)
    assert_snapshot(request, "fsdp_nsys", render_page("fsdp.md.j2", f=page.facts(context(_rows(), tmp_path))))


def test_nsys_kernels_say_which_forward_gathers_compute_waited_for_and_a_lost_backward(tmp_path):
    """fsdp_accounting (b) from kernels: both forward all-gathers recorded and compute waited for both (for the
    first from its start, 12 us, to its end at 20, no compute having run; for the second idle from 120 us until it
    ended at 160, resuming at 165): 48 us; backward's all-gather and reduce-scatter kernels are missing (records
    lost), so no backward verdict."""
    from kits.nsys_outputs import file_run, write_export

    ag = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    kernels = [(p, dev, s, 1, launch, start, end, name) for p, dev in ((100, 0), (200, 1)) for s, launch, start, end, name
               in ((20, 11, 12, 20, ag), (7, 21, 22, 120, "gemm"), (20, 151, 152, 160, ag), (7, 161, 165, 290, "gemm"))]
    cases = [("fsdp_2026_xl_fsdp_block_bf16_ctx512", "fsdp",
              dict(edition="2026", size="xl", variant="fsdp_block_bf16", context=512, batch=4),
              write_export(tmp_path / "k.sqlite", kernels=kernels, ranges=FSDP_RANGES))]
    file_run(tmp_path / "data", X2, "20261126T143456Z", cases)
    n = page.facts(context(_rows(), tmp_path)).nsys
    r = n.timelines[0][1].ranks[0]
    w = r.wait("ncclAllGather")
    assert (w.kernels, w.forward, w.forward_waited, w.forward_wait_ms) == (2, 2, 2, pytest.approx(0.048))
    assert n.forward_whole and not n.forward_in_time and not n.backward_whole and not r.complete
