"""The index (reports/README.md) as facts: one scoreboard row per handout problem, the one-line summary
at its top, and the figures that tell the story; templates/index.md.j2 holds its words."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.pages import Kind, Page, Scored
from impl.report.rows import Bench
from impl.report.runs import device_short
from impl.report.templating import render
from impl.workloads.problems import Problem

CLOSED_FORM = "closed form"
# The story the index's figures tell, by the pages that draw them: these pages' figures first, in this
# order, then any other page's in page order.
STORY = ("training_step", "leaderboard", "ddp")


@dataclass(frozen=True)
class IndexRow:
    problem: str
    editions: str  # as the handouts pose it: "2025", "2026", "2025, 2026" or "suite"
    slug: str | None  # the page answering it, None when no page does yet
    score: Scored | None  # None: not answered yet (worded from `facts` by its page's template)
    device: str  # the device column, one naming for every page ("H100", "2×H200", "closed form")
    facts: object = None  # the page's facts

    @property
    def answered(self) -> bool:
        return self.score is not None and self.score.kind is not Kind.NOT_MEASURED

    @property
    def measured(self) -> bool:
        """Answered from stored GPU rows (not a closed form)."""
        return self.score is not None and self.score.kind is Kind.MEASURED


@dataclass(frozen=True)
class IndexFacts:
    rows: list[IndexRow]
    older: list[str]  # "device: sections" whose newest GPU run is in the older format
    figures: list[tuple[str, str]]  # (caption, png path relative to reports/)

    @property
    def answered(self) -> int:
        return sum(r.answered for r in self.rows)

    @property
    def measured(self) -> int:
        return sum(r.measured for r in self.rows)

    @property
    def closed_form(self) -> int:
        return sum(r.answered and r.device == CLOSED_FORM for r in self.rows)

    @property
    def devices(self) -> list[str]:
        return sorted({part for r in self.rows if r.measured for part in r.device.split(" + ")})

    @property
    def newest(self) -> str:
        dates = [r.score.date for r in self.rows if r.score is not None and r.score.date[:1].isdigit()]
        return max(dates) if dates else "–"


def device_names(rows: list[Bench]) -> dict[str, str]:
    """{a device folder or a GPU's environment name: the index's short name}: pages name devices either
    way; the index says each one way."""
    by: dict[str, set[str]] = {}
    for b in rows:
        by.setdefault(b.run.device, set()).add(b.row.env.device)
    out: dict[str, str] = {}
    for dev in sorted(by):
        out[dev] = device_short(dev)
        for env in by[dev]:
            out.setdefault(env, device_short(dev) if dev.endswith("-x1") else env)
    return out


def _device(text: str, names: dict[str, str]) -> str:
    return " + ".join(names.get(part, part) for part in text.split(" + "))


def _story(page: Page) -> int:
    return STORY.index(page.slug) if page.slug in STORY else len(STORY)


def index_facts(pages: list[Page], older: list[str], names: dict[str, str]) -> IndexFacts:
    scores: dict[str, tuple[Page, Scored]] = {}
    for page in pages:
        for name, score in page.scores.items():
            scores[name] = (page, score)
    rows = []
    for p in Problem:
        page, score = scores.get(p, (None, None))
        rows.append(IndexRow(p.value, p.edition_tag, page.slug if page else None, score,
                             _device(score.device, names) if score else "–", page.facts if page else None))
    figures = [f for page in sorted(pages, key=_story) for f in page.index_figures]
    return IndexFacts(rows, older, figures)


def render_index(facts: IndexFacts, tests: str = "") -> str:
    """The index; `tests`: the correctness records' section (impl.report.test_records), placed after the
    scoreboard."""
    return render("index.md.j2", f=facts, tests=tests) + "\n"
