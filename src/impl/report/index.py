"""The index (reports/README.md) as facts: one scoreboard row per handout problem, the one-line summary
at its top, and the figures that tell the story; templates/index.md.j2 holds its words."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from impl.report.pages import NOT_ON_GPU, Kind, Page, Score, Scored
from impl.report.pages.problems import PROBLEMS
from impl.report.runs import device_short
from impl.report.templating import render

CLOSED_FORM = "closed form"


@dataclass(frozen=True)
class IndexRow:
    problem: str
    editions: str  # as the handouts pose it: "2025", "2026", "2025, 2026" or "suite"
    slug: str | None  # the page answering it, None when no page does yet
    score: Score | Scored | None  # None: not answered yet; Scored: a two-file page's (worded from `facts`)
    device: str  # the device column, one naming for every page ("H100", "2×H200", "closed form")
    facts: object = None  # the two-file page's facts

    @property
    def answered(self) -> bool:
        if isinstance(self.score, Scored):
            return self.score.kind is not Kind.NOT_MEASURED
        return self.score is not None and not self.score.answer.startswith(NOT_ON_GPU) \
            and not self.score.answer.startswith("not computed")

    @property
    def measured(self) -> bool:
        """Answered from stored GPU rows (not a closed form)."""
        if isinstance(self.score, Scored):
            return self.score.kind is Kind.MEASURED
        return self.answered and self.device not in ("–", CLOSED_FORM)


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


def device_names(df: pd.DataFrame) -> dict[str, str]:
    """{a device folder or a GPU's environment name: the index's short name}: pages name devices either
    way; the index says each one way."""
    out: dict[str, str] = {}
    if df.empty:
        return out
    for dev, g in df.groupby("device"):
        out[dev] = device_short(dev)
        for env in {r.env.device for r in g["row"]}:
            out.setdefault(env, device_short(dev) if dev.endswith("-x1") else env)
    return out


def _device(text: str, names: dict[str, str]) -> str:
    return " + ".join(names.get(part, part) for part in text.split(" + "))


def index_facts(pages: list[Page], older: list[str], names: dict[str, str]) -> IndexFacts:
    scores: dict[str, tuple[Page, Score]] = {}
    for page in pages:
        for name, score in page.score.items():
            scores[name] = (page, score)
    rows = []
    for p in PROBLEMS:
        page, score = scores.get(p.name, (None, None))
        rows.append(IndexRow(p.name, p.edition, page.slug if page else None, score,
                             _device(score.device, names) if score else "–", page.facts if page else None))
    figures = [f for page in pages for f in page.index_figures]
    return IndexFacts(rows, older, figures)


def render_index(facts: IndexFacts, tests: str = "") -> str:
    """The index; `tests`: the correctness records' section (impl.report.test_records), placed after the
    scoreboard."""
    return render("index.md.j2", f=facts, tests=tests) + "\n"
