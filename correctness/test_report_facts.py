"""The report as facts (impl.report.index, rows, ratio): which problems the index lists
and with which editions, which row is a page's headline, the ratio convention. Numbers and verdicts,
not wording."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from impl.report.pages import Context

ROOT = Path(__file__).resolve().parents[1]
# "Problem (<name>)" of each handout, in order (shared/handouts/cs336_assignment2_{2025,2026}.txt);
# 2025's FlashAttention leaderboard (section 1.3.3) is not headed "Problem" there.
POSED = {
    "2025": ["benchmarking_script", "nsys_profile", "mixed_precision_accumulation", "benchmarking_mixed_precision",
             "memory_profiling", "pytorch_attention", "torch_compile", "flash_forward", "flash_backward",
             "flash_benchmarking", "leaderboard", "distributed_communication_single_node", "naive_ddp",
             "naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters",
             "ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_bucketed", "ddp_bucketed_benchmarking",
             "communication_accounting", "optimizer_state_sharding", "optimizer_state_sharding_accounting"],
    "2026": ["benchmarking_script", "nsys_profile", "mixed_precision_accumulation", "benchmarking_mixed_precision",
             "memory_profiling", "gradient_checkpointing", "pytorch_attention", "torch_compile", "flash_forward",
             "flash_backward", "flash_benchmarking", "distributed_communication_single_node", "naive_ddp",
             "naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters",
             "ddp_overlap_individual_parameters_benchmarking", "optimizer_state_sharding",
             "optimizer_state_sharding_accounting", "fsdp", "fsdp_accounting", "alternate_ring_all_reduce",
             "data_parallel_calcs", "fsdp_calcs", "tp_calcs", "fsdp_tp_calcs", "leaderboard_2026"],
}


def test_index_tags_each_problem_with_the_editions_of_the_handouts():
    from impl.report.pages.problems import PROBLEMS

    listed = {p.name: p for p in PROBLEMS}
    for e, names in POSED.items():  # one index row per handout problem
        assert set(names) <= set(listed), (e, set(names) - set(listed))
    for p in PROBLEMS:
        got = {e for e, names in POSED.items() if p.name in names}
        assert (set(p.edition.split(", ")) if p.edition != "suite" else set()) == got, (p.name, p.edition, got)


def test_problem_names_are_defined_once_in_the_enum():
    import json

    from impl.report.pages.problems import PROBLEMS, SLUGS
    from impl.workloads.problems import Edition, Problem

    assert [p.name for p in PROBLEMS] == list(Problem) and set(SLUGS) == set(Problem)
    assert all(p.name == p.name.value and json.dumps(p.name) == json.dumps(p.name.value) for p in PROBLEMS)
    assert Problem("fsdp") is Problem.FSDP and Problem.FSDP.editions == (Edition.E2026,)
    assert Problem.NAIVE_DDP.edition_tag == "2025, 2026" and all(p.label for p in Problem)


def test_stored_group_alias_reads_as_the_handouts_problem(tmp_path):
    row = pd.DataFrame([dict(problem="ddp_overlap_bucketed_benchmarking", device="x")])
    ctx = Context(df=row, history=row.copy(), reports_dir=tmp_path, fig_dir=tmp_path)
    assert list(ctx.df.problem) == ["ddp_bucketed_benchmarking"]


def test_ratio_is_ours_over_anchor_with_one_verdict_word():
    from impl.report.ratio import ratio

    slow, fast, same = ratio(2.2, 1.0, "a"), ratio(0.5, 1.0, "a"), ratio(1.02, 1.0, "a", 0.01, 0.02)
    assert (slow.value, slow.verdict) == (2.2, "slower")
    assert (fast.value, fast.verdict) == (0.5, "faster")
    assert same.verdict == "within noise"
    assert ratio(None, 1.0) is None and ratio(1.0, float("nan")) is None


@pytest.fixture(scope="module")
def built_pages(tmp_path_factory):
    from impl.report import build

    ctx = build.context(ROOT / "reports" / "data", tmp_path_factory.mktemp("reports"))
    return ctx, build.collect(ctx)


def test_index_facts_one_row_per_problem_devices_named_one_way(built_pages):
    from impl.report.index import device_names, index_facts
    from impl.report.pages.problems import PROBLEMS

    ctx, pages = built_pages
    facts = index_facts(pages, [], device_names(ctx.df))
    assert [r.problem for r in facts.rows] == [p.name for p in PROBLEMS]
    shorts = {"H100", "H200", "2×H100", "2×H200", "4×H200", "closed form", "–"}
    for r in facts.rows:
        assert set(r.device.split(" + ")) <= shorts, (r.problem, r.device)
    assert facts.answered == sum(r.answered for r in facts.rows) and facts.measured <= facts.answered
    by = {r.problem: r for r in facts.rows}
    assert by["ddp_bucketed_benchmarking"].measured and by["ddp_overlap_individual_parameters_benchmarking"].measured
    # each problem names the devices its answers read: the all-reduce answer reads the 4-GPU run (2 and 4
    # processes), the fsdp page's TP rows ran on 2 and 4 GPUs, the leaderboard step on two
    assert by["distributed_communication_single_node"].device == "4×H200"
    assert "4×H200" in by["fsdp"].device.split(" + ") and "4×H200" in facts.devices
    assert by["leaderboard_2026"].device.split(" + ")[0] == "2×H200"


# ------------------------------------------------------------- every page: structure and sources
def test_every_page_answers_each_question_under_its_heading_first(built_pages):
    from impl.report.pages import render_page

    _, pages = built_pages
    for page in pages:
        text = render_page(page)
        body_at = text.find(page.body.strip()[:80]) if page.body.strip() else len(text)
        for a in page.answers:
            head = f"## {a.question}\n\n{a.text}"
            assert a.question.strip() and a.text.strip(), (page.slug, a.question)
            assert head in text and text.index(head) < body_at, (page.slug, a.question)


# ------------------------------------------------------------- rows split by [edition, size] and run
def _dist_frame(rows, device: str = "gpu-x2", section: str = "ddp"):
    """A frame of synthetic rows: (Row, run stamp "YYYYMMDDTHHMM", median s, iqr s); a measured row
    gets statistics, any other none (as a file's not_run entry)."""
    from impl.bench.row import Status
    from impl.report.data import Record, Run, Stats, frame

    records = []
    for row, stamp, med, iqr in rows:
        when = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:00+00:00"
        run = Run(device, section, f"/x/reports/data/{device}/{section}/{stamp}Z_abc.json", when, "abc", False)
        stats = Stats(med, iqr, med, med, med, iqr, 5, [med] * 5) if row.status is Status.MEASURED else None
        name = f"test_{row.problem}[{'-'.join(str(v) for v in row.config.values())}]"
        records.append(Record(name, run, row, stats))
    return frame(records)


def _ddp_row(variant, edition="2026", size="xl", context=512, batch=4, comm_s=None, peak=None, timeline=None,
             bucket_mb=None, problem=None):
    from impl.bench.row import Env, Memory, Metric, Row, Status, Timing

    cfg = dict(size=size, edition=edition, context=context, batch_per_rank=batch, world_size=2, backend="nccl",
               variant=variant, bucket_mb=bucket_mb, dtype="fp32")
    details = dict(grad_bytes=4e9, n_params=1e9, num_buckets=0, steps=dict(comm_s=comm_s))
    if timeline:
        details["timeline"] = timeline
    problem = problem or {"single": "ddp_benchmarking_anchors", "torch_ddp": "ddp_benchmarking_anchors",
                          "naive": "naive_ddp_benchmarking", "flat": "minimal_ddp_flat_benchmarking",
                          "individual": "ddp_overlap_individual_parameters_benchmarking",
                          "bucketed": "ddp_overlap_bucketed_benchmarking"}[variant]
    return Row(problem=problem, config=cfg, env=Env("NVIDIA H200", "cuda", "2", None, "13", "full"),
               status=Status.MEASURED, timing=Timing("one step", "SlowestRankClock", 2, 5),
               metrics={Metric.COMM_SHARE: 0.05} if comm_s else {}, details=details, memory=Memory(peak, None))


def test_size_runs_split_by_edition_size_and_run_2026_first_and_name_their_files():
    from impl.report.rows import newest_per_size, size_runs

    d = _dist_frame([(_ddp_row("naive", "2025"), "20260101T0000", 1.0, 0.01),
                     (_ddp_row("naive", "2026"), "20260102T0000", 2.0, 0.01),
                     (_ddp_row("flat", "2026"), "20260102T0000", 2.1, 0.01),
                     (_ddp_row("single", "2026"), "20260103T0000", 1.9, 0.01)])
    groups = size_runs(d)
    assert [(g.edition, g.date, len(g.rows)) for g in groups] == [("2026", "2026-01-03", 1), ("2026", "2026-01-02", 2),
                                                                   ("2025", "2026-01-01", 1)]
    assert groups[0].described == "xl (2026): d_model 2560, 32 layers, 3.4B params"
    assert groups[-1].described == "xl (2025): d_model 1600, 48 layers, 2.0B params"
    assert groups[1].files == ["reports/data/gpu-x2/ddp/20260102T0000Z_abc.json"]
    assert [g.datetime for g in newest_per_size(groups)] == [groups[0].datetime, groups[2].datetime]
