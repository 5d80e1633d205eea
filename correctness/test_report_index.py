"""The index (impl.report.index, templates/index.md.j2) on synthetic pages: GitHub's heading anchors, the
kinds of answer counted apart (a prediction is never counted as measured), and each problem's sub-parts
found on its page and linked from its scoreboard row."""
from __future__ import annotations

import re

import jinja2
import pytest

from impl.report import templating
from impl.report.index import IndexFacts, github_anchor, headings, index_facts, markers, render_index, sub_parts
from impl.report.pages import Kind, Page, Scored
from impl.workloads.problems import Problem as P


# ------------------------------------------------------------- GitHub's anchor rule
@pytest.mark.parametrize("text, anchor", [
    ("Dr Dre", "dr-dre"),  # html-pipeline's TableOfContentsFilter examples
    ("Eazy-E", "eazy-e"),
    ("(b) Forward and backward times at contexts 128–1024 (mean ± std)?",
     "b-forward-and-backward-times-at-contexts-1281024-mean--std"),
    ("naive_ddp: does DDP train to the same weights?", "naive_ddp-does-ddp-train-to-the-same-weights"),
    ("Ours against PyTorch's own pieces (the anchor)", "ours-against-pytorchs-own-pieces-the-anchor"),
    ("2× NVIDIA H200 (h200-141gb-x2)", "2-nvidia-h200-h200-141gb-x2"),
    ("forward+backward of torch.compile(f) at d 64.", "forwardbackward-of-torchcompilef-at-d-64"),
    ("D = rowsum(O∘dO), N/2 × the ring, N_DP ≤ 1 + 2·B", "d--rowsumodo-n2--the-ring-n_dp--1--2b"),
    ("café ünïcode ﬁne", "café-ünïcode-ﬁne"),  # letters of any script stay
    ("x² in `code` and **bold**", "x-in-code-and-bold"),  # ² is no decimal digit; markup is punctuation
    ("see [the index](README.md) first", "see-the-index-first"),  # a link counts by its text
])
def test_github_anchor(text, anchor):
    assert github_anchor(text) == anchor


def test_headings_number_repeated_anchors_over_every_level_and_skip_code():
    text = "\n".join(["# A", "", "## A", "```", "## not a heading", "```", "### a!", "####### seven", "#no space",
                      "## Closed ##", "~~~~", "# in a tilde fence", "~~~~", "## A"])
    assert headings(text) == [(1, "A", "a"), (2, "A", "a-1"), (3, "a!", "a-2"), (2, "Closed", "closed"),
                              (2, "A", "a-3")]


# ------------------------------------------------------------- sub-parts of a page's problems
def test_markers_are_the_letters_a_heading_answers_else_an_opening_edition():
    assert markers("(b) Forward times?") == ["b"]
    assert markers("data_parallel_calcs: (a) FLOPs, (b) time, (c) the largest N_DP?") == ["a", "b", "c"]
    assert markers("(f) (2026) How much memory?") == ["f"]
    assert markers("(2026) Forward, backward and the optimizer step?") == ["2026"]
    assert markers("leaderboard (2026): how fast is one step?") == []  # an edition inside a name is no part
    assert markers("What do warm-up steps change (2026: 0, 1 and 2)?") == []


MULTI = """# ddp and friends

## naive_ddp: does it train to the same weights?

text naming naive_ddp_benchmarking (not a heading)

## naive_ddp_benchmarking: (a) time per step, and (b) the share communicating?

## Which of them is faster?

## ddp_overlap_bucketed (b), (c): the buckets.

### naive_ddp: a deeper heading is no question

## 2× NVIDIA H200 (h200-141gb-x2)

## ddp_overlap_bucketed (d): after the data, no question of the index?
"""


def test_sub_parts_of_a_many_problem_page_go_to_the_problem_each_heading_names():
    page = Page("ddp", (P.NAIVE_DDP, P.NAIVE_DDP_BENCHMARKING, P.DDP_OVERLAP_BUCKETED, P.DDP_BUCKETED_BENCHMARKING),
                MULTI, {}, (), None)
    parts = {p: [(s.marker, s.number, s.anchor) for s in ps] for p, ps in sub_parts(page).items()}
    both = "naive_ddp_benchmarking-a-time-per-step-and-b-the-share-communicating"
    assert parts == {
        P.NAIVE_DDP: [(None, 1, "naive_ddp-does-it-train-to-the-same-weights")],
        # "naive_ddp" is named only as a whole word; a heading naming none continues the one before
        P.NAIVE_DDP_BENCHMARKING: [("a", 1, both), ("b", 1, both), (None, 2, "which-of-them-is-faster")],
        # the page's questions end at its first heading that is not one
        P.DDP_OVERLAP_BUCKETED: [("b", 1, "ddp_overlap_bucketed-b-c-the-buckets"),
                                 ("c", 1, "ddp_overlap_bucketed-b-c-the-buckets")],
        P.DDP_BUCKETED_BENCHMARKING: [],
    }


def test_a_one_problem_pages_questions_are_all_its_own_and_an_unnamed_first_of_many_is_nobodys():
    text = "# t\n\n## (a) One?\n\n## Two, unlettered.\n\n## (2026) Three?\n"
    assert [(s.marker, s.number) for s in sub_parts(Page("x", (P.NSYS_PROFILE,), text, {}, (), None))[P.NSYS_PROFILE]] \
        == [("a", 1), (None, 2), ("2026", 3)]
    many = sub_parts(Page("x", (P.FLASH_FORWARD, P.FLASH_BACKWARD), text, {}, (), None))
    assert many == {P.FLASH_FORWARD: (), P.FLASH_BACKWARD: ()}


# ------------------------------------------------------------- kinds counted apart, rendered
PAGE = """# fake

## naive_ddp_benchmarking (a): time per step?

## (b) Its share communicating?

## leaderboard_2026: how fast is the step?

## tp_calcs: (a) the backward, (b) its FLOPs?

## fsdp: measured one day?

## h100
"""
SCORES = {P.NAIVE_DDP_BENCHMARKING: Scored(Kind.MEASURED, "h200-141gb-x2", "2026-11-26"),
          P.LEADERBOARD_2026: Scored(Kind.PREDICTED, "h200-141gb-x1 + h200-141gb-x2", "2026-11-24"),
          P.TP_CALCS: Scored(Kind.CLOSED_FORM, "closed form"),
          P.FSDP: Scored(Kind.NOT_MEASURED)}
NAMES = {"h200-141gb-x2": "2×H200", "h200-141gb-x1": "H200"}


def _facts() -> IndexFacts:
    page = Page("fake", tuple(SCORES), PAGE, dict(SCORES), (), None)
    return index_facts([page], [], NAMES)


def test_a_prediction_is_answered_but_never_counted_as_measured():
    f = _facts()
    by = {r.problem: r for r in f.rows}
    assert (f.answered, *map(f.count, (Kind.MEASURED, Kind.CLOSED_FORM, Kind.PREDICTED))) == (3, 1, 1, 1)
    assert by[P.LEADERBOARD_2026].answered and not by[P.LEADERBOARD_2026].measured
    assert by[P.LEADERBOARD_2026].kind is Kind.PREDICTED and by[P.LEADERBOARD_2026].device == "H200 + 2×H200"
    assert not by[P.FSDP].answered and by[P.FSDP].kind is Kind.NOT_MEASURED
    assert by[P.NAIVE_DDP].kind is None and not by[P.NAIVE_DDP].answered  # no page answers it
    assert f.devices == ["2×H200"]  # only measured rows' devices; the prediction's are not "measured on"
    assert [s.marker for s in by[P.TP_CALCS].parts] == ["a", "b"] and by[P.FSDP].parts[0].number == 1


@pytest.fixture
def fake_template(monkeypatch):
    """templates/fake.md.j2, the three score macros of a page, beside the real templates."""
    env = templating.environment()
    fake = ('{% macro score_answer(f, problem) %}answer of {{ problem }}{% endmacro %}'
            '{% macro score_headline(f, problem) %}headline{% endmacro %}'
            '{% macro score_vs(f, problem) %}–{% endmacro %}'
            '{% macro index_caption(f, path) %}{{ f[path] }} ({{ path }}){% endmacro %}')
    monkeypatch.setattr(env, "loader", jinja2.ChoiceLoader([jinja2.DictLoader({"fake.md.j2": fake}), env.loader]))


def test_the_index_marks_and_counts_each_kind_and_links_each_part_to_its_anchor(fake_template):
    text = render_index(_facts())
    summary = next(x for x in text.splitlines() if x.startswith("**"))
    assert re.search(r"\b3 of \d+ problems answered: 1 measured on GPUs \(2×H200; newest 2026-11-26\), "
                     r"1 in closed form, 1 predicted", summary), summary
    rows = {x.split("]")[0][3:]: [c.strip() for c in x.split(" | ")] for x in text.splitlines() if x.startswith("| [")}
    assert rows["leaderboard_2026"][2] == "predicted" and rows["naive_ddp_benchmarking"][2] == "measured"
    assert rows["tp_calcs"][2] == "closed form" and rows["tp_calcs"][6] == "–"  # the kind says it, not the device
    assert rows["fsdp"][2] == "not measured yet"
    assert rows["naive_ddp_benchmarking"][0] == ("| [naive_ddp_benchmarking](fake.md) [(a)][naive_ddp_benchmarking-1] "
                                                 "[(b)][naive_ddp_benchmarking-2]")
    assert rows["leaderboard_2026"][0].endswith("[Q1][leaderboard_2026-1]")
    assert rows["tp_calcs"][0].endswith("[(a)][tp_calcs-1] [(b)][tp_calcs-1]")  # one heading, one reference
    refs = dict(re.findall(r"^\[([^\]]+)\]: (\S+)$", text, re.M))
    anchors = {a for _, _, a in headings(PAGE)}
    used = set(re.findall(r"\]\[([^\]]+)\]", text))
    assert used == set(refs) and all(url.split("#")[0] == "fake.md" and url.split("#")[1] in anchors
                                     for url in refs.values())
    assert refs["tp_calcs-1"] == "fake.md#tp_calcs-a-the-backward-b-its-flops"


def test_the_page_template_words_its_index_figures_captions(fake_template):
    """A page's facts name its index figures by path; its template's `index_caption(f, path)` words each
    caption (no caption in Python), and the index shows them in the story's order."""
    facts = {"figures/a.png": "first story", "figures/b.png": "second story"}
    page = Page("fake", tuple(SCORES), PAGE, dict(SCORES), tuple(facts), facts)
    f = index_facts([page], [], NAMES)
    assert [(x.slug, x.path) for x in f.figures] == [("fake", "figures/a.png"), ("fake", "figures/b.png")]
    text = render_index(f)
    assert "**first story (figures/a.png)**\n\n![first story (figures/a.png)](figures/a.png)" in text
    assert text.index("second story") > text.index("first story")
