"""The report as facts (impl.report.index, rows, ratio): which problems the index lists
and with which editions, which row is a page's headline, the ratio convention. Numbers and verdicts,
not wording."""
from __future__ import annotations

from pathlib import Path

import pytest

from impl.workloads.problems import Problem

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
    for e, names in POSED.items():  # one index row per handout problem
        assert set(names) <= set(Problem), (e, set(names) - set(Problem))
    for p in Problem:
        got = {e for e, names in POSED.items() if p in names}
        assert (set(p.edition_tag.split(", ")) if p.edition_tag != "suite" else set()) == got, (p, p.edition_tag, got)


def test_problem_names_are_defined_once_in_the_enum_and_each_is_on_one_page():
    import json

    from impl.report.build import slugs
    from impl.workloads.problems import Edition

    assert set(slugs()) == set(Problem)
    assert all(json.dumps(p) == json.dumps(p.value) for p in Problem)
    assert Problem("fsdp") is Problem.FSDP and Problem.FSDP.editions == (Edition.E2026,)
    assert Problem.NAIVE_DDP.edition_tag == "2025, 2026" and all(p.label for p in Problem)


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
    from impl.report.pages import Kind

    ctx, pages = built_pages
    facts = index_facts(pages, [], device_names(list(ctx.rows.newest)))
    assert [r.problem for r in facts.rows] == list(Problem)
    shorts = {"H100", "H200", "2×H100", "2×H200", "4×H200", "closed form", "–"}
    for r in facts.rows:
        assert set(r.device.split(" + ")) <= shorts, (r.problem, r.device)
    assert facts.answered == sum(r.answered for r in facts.rows) and facts.count(Kind.MEASURED) <= facts.answered
    by = {r.problem: r for r in facts.rows}
    assert by["ddp_bucketed_benchmarking"].measured and by["ddp_overlap_individual_parameters_benchmarking"].measured
    # each problem names the devices its answers read: the all-reduce answer reads the 4-GPU run (2 and 4
    # processes), the fsdp page's TP rows ran on 2 and 4 GPUs, the leaderboard step on two
    assert by["distributed_communication_single_node"].device == "4×H200"
    assert "4×H200" in by["fsdp"].device.split(" + ") and "4×H200" in facts.devices
    assert by["leaderboard_2026"].device.split(" + ")[0] == "2×H200"


# ------------------------------------------------------------- rows split by [edition, size] and run
def _ddp_row(variant, edition, when, median):
    from kits.report_rows import bench

    cfg = dict(size="xl", edition=edition, context=512, batch_per_rank=4, world_size=2, backend="nccl", variant=variant)
    problem = {"single": "ddp_benchmarking_anchors", "naive": "naive_ddp_benchmarking",
               "flat": "minimal_ddp_flat_benchmarking"}[variant]
    stamp = f"{when[:4]}-{when[4:6]}-{when[6:8]}T{when[9:11]}:{when[11:13]}:00"
    return bench(problem, cfg, median, device="gpu-x2", section="ddp", when=stamp, commit="abc")


def test_size_runs_split_by_edition_size_and_run_2026_first_and_name_their_files():
    from impl.report.rows import size_runs_of

    groups = size_runs_of([_ddp_row("naive", "2025", "20260101T0000", 1.0),
                           _ddp_row("naive", "2026", "20260102T0000", 2.0),
                           _ddp_row("flat", "2026", "20260102T0000", 2.1),
                           _ddp_row("single", "2026", "20260103T0000", 1.9)])
    assert [(g.edition, g.date, len(g.rows)) for g in groups] == [("2026", "2026-01-03", 1), ("2026", "2026-01-02", 2),
                                                                   ("2025", "2026-01-01", 1)]
    assert groups[0].described == "xl (2026): d_model 2560, 32 layers, 3.4B params"
    assert groups[-1].described == "xl (2025): d_model 1600, 48 layers, 2.0B params"
    assert groups[1].files == ("reports/data/gpu-x2/ddp/20260102T0000Z_abc.json",)


def test_facts_sourced_from_sections_name_each_run_file_once_sorted():
    """runs.SourcedFromSections: a page of device sections (benchmarking_script, distributed_communication,
    training_step) names the run files of every section's runs, each once."""
    from dataclasses import dataclass
    from types import SimpleNamespace

    from impl.report.pages import benchmarking_script, distributed_communication, training_step
    from impl.report.runs import SourcedFromSections

    @dataclass(frozen=True)
    class Facts(SourcedFromSections):
        sections: list

    def section(*files):
        return SimpleNamespace(runs=SimpleNamespace(files=list(files)))

    assert Facts([section("b.json", "a.json"), section("a.json", "c.json")]).sources == ["a.json", "b.json", "c.json"]
    assert Facts([]).sources == []
    for page in (benchmarking_script.ScriptPage, distributed_communication.CommPage, training_step.TrainingStepPage):
        assert issubclass(page, SourcedFromSections)
