"""The index (reports/README.md) as facts: one scoreboard row per handout problem, the one-line summary
at its top, and the figures that tell the story; templates/index.md.j2 holds its words."""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from impl.report.pages import Kind, Page, Scored
from impl.report.rows import Bench
from impl.report.runs import device_short
from impl.report.templating import render
from impl.workloads.problems import Problem

# The story the index's figures tell, by the pages that draw them: these pages' figures first, in this
# order, then any other page's in page order.
STORY = ("training_step", "leaderboard", "ddp")


# A heading's part markers: "(a)" anywhere in it (a heading may answer several: "(a) ..., (b) ..."), or an
# edition tag "(2026)" that opens it (a part the edition adds; "leaderboard (2026): ..." is no part).
_LETTER = re.compile(r"\(([a-z])\)")
_YEAR = re.compile(r"^\((20\d\d)\)")
_ATX = re.compile(r"^(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")


def github_anchor(text: str) -> str:
    """A heading's anchor as GitHub writes it, before duplicates are numbered: the text lowercased, every
    character but letters, marks, decimal digits, connector punctuation ("_"), hyphens and spaces
    removed (Ruby's /[^\\p{Word}\\- ]/), each space a hyphen. `text` is the heading as rendered: a link
    counts by its text."""
    text = _LINK.sub(r"\1", text).lower()
    return "".join(c for c in text for cat in [unicodedata.category(c)]
                   if c in "- " or cat[0] in "LM" or cat in ("Nd", "Pc")).replace(" ", "-")


def headings(text: str) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every ATX heading of a markdown page, in order, fenced code left out;
    a repeated anchor is suffixed -1, -2, ... as GitHub numbers them (over headings of every level)."""
    seen: dict[str, int] = {}
    out, fence = [], None
    for line in text.splitlines():
        if m := _FENCE.match(line):
            mark = m.group(1)
            if fence is None:
                fence = mark
            elif mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip(mark[0] + " \t"):
                fence = None
            continue
        if fence is not None or not (m := _ATX.match(line)):
            continue
        base = github_anchor(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.append((len(m.group(1)), m.group(2), f"{base}-{n}" if n else base))
    return out


@dataclass(frozen=True)
class SubPart:
    """One sub-part of a problem as its page heads it: the part's marker ("a", "2026"; None: the heading
    names no part), its heading's place among the problem's question headings (1, 2, ...) and its anchor
    on the page."""

    marker: str | None
    number: int
    anchor: str


def markers(heading: str) -> list[str]:
    """The parts a heading answers: its "(a)"-style letters in order, else an opening "(2026)" tag."""
    letters = list(dict.fromkeys(_LETTER.findall(heading)))
    return letters or _YEAR.findall(heading)


def _named(heading: str, problems: tuple[Problem, ...]) -> Problem | None:
    """The page problem a heading names (as a whole word; the first named when several are)."""
    found = [(m.start(), p) for p in problems if (m := re.search(rf"(?<!\w){re.escape(p.value)}(?!\w)", heading))]
    return min(found, key=lambda x: x[0])[1] if found else None


def sub_parts(page: Page) -> dict[Problem, tuple[SubPart, ...]]:
    """{each problem of the page: its sub-parts}: the page's question headings are the `## ` headings it
    opens with (up to the first that is not a question); each belongs to the problem it names, else to
    the page's only problem, else to the problem of the question before it (a heading of a
    many-problem page naming none before any named one belongs to none). A heading answering several
    parts gives each its sub-part, all at its anchor."""
    heads: dict[Problem, list[tuple[str, str]]] = {p: [] for p in page.problems}
    current = page.problems[0] if len(page.problems) == 1 else None
    for level, text, anchor in headings(page.text):
        if level != 2:
            continue
        if not text.rstrip().endswith(("?", ".")):  # worded as the handout's sub-questions, a question ends so
            break
        current = _named(text, page.problems) or current
        if current is not None:
            heads[current].append((text, anchor))
    return {p: tuple(SubPart(m, i, anchor) for i, (text, anchor) in enumerate(hs, 1) for m in markers(text) or [None])
            for p, hs in heads.items()}


@dataclass(frozen=True)
class IndexRow:
    problem: str
    editions: str  # as the handouts pose it: "2025", "2026", "2025, 2026" or "suite"
    slug: str | None  # the page answering it, None when no page does yet
    score: Scored | None  # None: not answered yet (worded from `facts` by its page's template)
    device: str  # the device column, one naming for every page ("H100", "2×H200", "closed form")
    facts: object = None  # the page's facts
    parts: tuple[SubPart, ...] = ()  # its sub-parts on its page, in the page's order

    @property
    def kind(self) -> Kind | None:
        """The kind of its answer; None: no page answers it."""
        return self.score.kind if self.score is not None else None

    @property
    def answered(self) -> bool:
        return self.kind not in (None, Kind.NOT_MEASURED)

    @property
    def measured(self) -> bool:
        """Answered from stored GPU rows (not a closed form, not a prediction)."""
        return self.kind is Kind.MEASURED


@dataclass(frozen=True)
class IndexFigure:
    """A page's figure on the index (its template's `index_caption(f, path)` words the caption)."""

    slug: str
    facts: object
    path: str


@dataclass(frozen=True)
class IndexFacts:
    rows: list[IndexRow]
    older: list[str]  # "device: sections" whose newest GPU run is in the older format
    figures: list[IndexFigure]

    @property
    def answered(self) -> int:
        return sum(r.answered for r in self.rows)

    def count(self, kind: Kind) -> int:
        """The rows answered so (a prediction from other runs is answered, never counted as measured)."""
        return sum(r.kind == kind for r in self.rows)

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


def index_facts(pages: list[Page], older: list[str], names: dict[str, str]) -> IndexFacts:
    scores = {name: (page, score) for page in pages for name, score in page.scores.items()}
    parts = {p: sp for page in pages for p, sp in sub_parts(page).items()}
    rows = []
    for p in Problem:
        page, score = scores.get(p, (None, None))
        device = " + ".join(names.get(x, x) for x in score.device.split(" + ")) if score else "–"
        rows.append(IndexRow(p.value, p.edition_tag, page.slug if page else None, score, device,
                             page.facts if page else None, parts.get(p, ())))
    story = sorted(pages, key=lambda page: STORY.index(page.slug) if page.slug in STORY else len(STORY))
    figures = [IndexFigure(page.slug, page.facts, path) for page in story for path in page.index_figures]
    return IndexFacts(rows, older, figures)


def render_index(facts: IndexFacts, tests: str = "") -> str:
    """The index; `tests`: the correctness records' section (impl.report.test_records)."""
    return render("index.md.j2", f=facts, tests=tests) + "\n"
