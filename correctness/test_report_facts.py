"""The report as facts (impl.report.index, rows, ratio, fsdp headline): which problems the index lists
and with which editions, which row is a page's headline, the ratio convention. Numbers and verdicts,
not wording."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from impl.report.data import load, load_history
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


def test_fsdp_headline_pair_is_the_target_configuration_not_the_best_looking_row():
    from impl.report.fsdp import headline_pair

    every = ["fsdp_block_bf16", "torch_fsdp_bf16", "fsdp_bf16", "torch_fsdp", "fsdp", "ddp"]
    assert headline_pair(every) == ("fsdp_block_bf16", "torch_fsdp_bf16")
    assert headline_pair([v for v in every if v != "fsdp_block_bf16"]) == ("fsdp_bf16", "torch_fsdp_bf16")
    assert headline_pair(["fsdp", "torch_fsdp", "ddp"]) == ("fsdp", "torch_fsdp")
    assert headline_pair(["fsdp", "ddp"]) is None


@pytest.fixture(scope="module")
def built_pages(tmp_path_factory):
    from impl.report import build

    reports = tmp_path_factory.mktemp("reports")
    data = ROOT / "reports" / "data"
    ctx = Context(df=load(data), history=load_history(data), reports_dir=reports, fig_dir=reports / "figures")
    return ctx, build.collect(ctx)


def test_committed_fsdp_headline_reads_the_bf16_pair(built_pages):
    """The committed 2×H200 run has no per-block row: the headline is ours bf16 against fully_shard bf16
    (ours slower), not the fp32 pair that sits within noise."""
    ctx, pages = built_pages
    fsdp = next(p for p in pages if p.slug == "fsdp").score["fsdp"]
    d = ctx.df[(ctx.df.problem == "fsdp") & (ctx.df.device == "h200-141gb-x2")]
    med = {r.config["variant"]: m for r, m in zip(d["row"], d["median"])}
    assert f"{med['fsdp_bf16'] / med['torch_fsdp_bf16']:.2f}×" in fsdp.vs_anchor
    assert "slower" in fsdp.vs_anchor


def test_index_facts_one_row_per_problem_devices_named_one_way(built_pages):
    from impl.report.index import device_names, index_facts
    from impl.report.pages.problems import PROBLEMS

    ctx, pages = built_pages
    facts = index_facts(pages, [], device_names(ctx.df))
    assert [r.problem for r in facts.rows] == [p.name for p in PROBLEMS]
    shorts = {"H100", "H200", "2×H200", "closed form", "–"}
    for r in facts.rows:
        assert set(r.device.split(" + ")) <= shorts, (r.problem, r.device)
    assert facts.answered == sum(r.answered for r in facts.rows) and facts.measured <= facts.answered
    by = {r.problem: r for r in facts.rows}
    assert by["ddp_bucketed_benchmarking"].measured and by["ddp_overlap_individual_parameters_benchmarking"].measured
