"""The report as pages: `reports/README.md` is an index (one scoreboard row per problem of both
course editions, then the few figures that tell the story); each problem has its page
`reports/<slug>.md` that opens with its questions answered, then tables, figures and method.

A page is two files: `pages/<slug>.py` with `facts(ctx) -> <PageFacts>` (a frozen dataclass holding
every number, table row and figure path the page shows, and its `scores` and `index_figures` for the
index) and `templates/<slug>.md.j2`, which renders the whole page from it in one call. Every number
comes from `ctx.rows` (the stored rows), never typed. Pages not yet rewritten so (issue 44) expose
`pages(ctx) -> list[Page]` and read the frame `ctx.df`; build.PAGE_MODULES lists both kinds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pandas as pd

from impl.report.runs import run_date  # noqa: F401  (pages import it from here)
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)
from impl.report.rows import Rows
from impl.report.pages.problems import STORED_ALIASES, PageProblem as Problem, problem  # noqa: F401


@dataclass
class Answer:
    question: str  # as the course asks it (heading)
    text: str  # 1-3 sentences whose numbers come from the data


class Kind(StrEnum):
    """What kind of answer a scoreboard row is (the index counts them apart)."""

    MEASURED = "measured"
    CLOSED_FORM = "closed form"
    PREDICTED = "predicted"
    NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Scored:
    """A two-file page's scoreboard row of one problem: the kind of answer, its device and run date.
    Its words are the page template's `score_answer`, `score_headline` and `score_vs` macros, called
    with the page's facts and the problem by the index template."""

    kind: Kind
    device: str = "–"
    date: str = "–"


@dataclass
class Score:
    """The problem's scoreboard row in the index."""

    answer: str  # one line
    headline: str = "–"  # the headline number, with its unit
    vs_anchor: str = "–"  # ours / the best anchor of the same run, e.g. "1.21× cuDNN (slower)"
    device: str = "–"
    date: str = "–"  # the run's UTC date


@dataclass
class Page:
    slug: str
    title: str
    problems: list[Problem]
    answers: list[Answer]
    body: str  # tables, figures, method, run metadata (markdown)
    score: dict[str, Score] = field(default_factory=dict)  # problem name -> its scoreboard row
    index_figures: list[tuple[str, str]] = field(default_factory=list)  # (caption, png path rel. to reports/)
    text: str | None = None  # the whole page, rendered by its template (a two-file page)
    facts: object = None  # a two-file page's facts (the index words its scores from them)


@dataclass
class Context:
    """What a page module reads: the newest row of every benchmark (`df`), every earlier run of
    each (`history`), and where figures and CSVs go."""

    df: pd.DataFrame
    history: pd.DataFrame
    reports_dir: Path
    fig_dir: Path  # reports/figures
    fig_rel: str = "figures"  # figure paths as a page links them
    rows: Rows = Rows(())  # the same rows, typed: what a two-file page reads

    def __post_init__(self):
        for frame in (self.df, self.history):  # stored group names -> the handout's problem names
            if not frame.empty:
                frame["problem"] = frame["problem"].replace(STORED_ALIASES)

    def log_tail(self, device: str, name: str) -> str | None:
        """The last line of reports/data/<device>/logs/<name> (a correctness suite's verdict), None without one."""
        path = self.reports_dir / "data" / device / "logs" / name
        lines = [x.strip() for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        return lines[-1] if lines else None

    def device_rows(self, device: str) -> pd.DataFrame:
        return self.df[self.df.device == device] if not self.df.empty else self.df

    def gpu_devices(self) -> list[str]:
        """GPU device folders, one-GPU kinds first; the CPU smoke data has its own page."""
        devs = [] if self.df.empty else sorted(d for d in self.df.device.unique() if d != "cpu")
        return sorted(devs, key=lambda d: (not d.endswith("-x1"), d))


def gpu_rows(ctx: Context, *problems: str) -> list[tuple[str, pd.DataFrame]]:
    """(device, its newest rows of `problems`) for each GPU device that has any, one-GPU kinds first."""
    out = []
    for device in ctx.gpu_devices():
        d = ctx.device_rows(device)
        d = d[d.problem.isin(problems)]
        if not d.empty:
            out.append((device, d))
    return out


NOT_ON_GPU = "not measured on a GPU yet"


def missing_page(slug: str, title: str, names: list[str], questions: list[str], where: str | None = None) -> Page:
    """The page of problems with no GPU rows: each question answered "not measured on a GPU yet" (naming
    the section whose rows are missing, where given), and so is each problem's scoreboard row."""
    text = NOT_ON_GPU.capitalize() + (f" (no `{where}` rows under reports/data/<gpu>/)." if where else ".")
    return Page(slug, title, [problem(n) for n in names], [Answer(q, text) for q in questions], "",
                score={n: Score(NOT_ON_GPU) for n in names})


def render_page(page: Page) -> str:
    if page.text is not None:
        return page.text
    out = [f"# {page.title}", "[← index](README.md)"]
    out += [f"## {a.question}\n\n{a.text}" for a in page.answers]
    out.append(page.body)
    return "\n\n".join(x for x in out if x) + "\n"
