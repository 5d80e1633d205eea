"""The report's pages: one per problem (`reports/<slug>.md`), each two files, `pages/<slug>.py` (its `PROBLEMS` and
`facts(ctx)`: every number, table row and figure path the page shows, its `scores` and any `index_figures`) and
`templates/<slug>.md.j2` (every word, and the index's score and caption macros). A helper module's name starts
with "_"; impl.report.build finds the rest by themselves.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from impl.report import figures
from impl.report.rows import Rows
from impl.report.runs import RunsFacts
from impl.workloads.problems import Problem


class Kind(StrEnum):
    """What kind of answer a scoreboard row is (the index counts them apart)."""

    MEASURED = "measured"
    CLOSED_FORM = "closed form"
    PREDICTED = "predicted"
    NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class Scored:
    """A page's scoreboard row of one problem: the kind of answer, its device and run date (worded by the page
    template's `score_*` macros)."""

    kind: Kind
    device: str = "–"
    date: str = "–"

    @classmethod
    def of(cls, runs: RunsFacts | None, device: str | None = None) -> Scored:
        """Measured by the rows `runs` names (on its device, unless `device` words it otherwise; at its newest
        run's date); not measured where no rows answered (`runs` None)."""
        return NOT_MEASURED if runs is None else cls(Kind.MEASURED, device or runs.device, runs.date)


NOT_MEASURED = Scored(Kind.NOT_MEASURED)


@dataclass(frozen=True)
class Page:
    """A built page, and the facts it was rendered from (the index words its scores from them)."""

    slug: str
    problems: tuple[Problem, ...]
    text: str
    scores: dict[str, Scored]  # problem name -> its scoreboard row
    index_figures: tuple[str, ...]  # png paths rel. to reports/ (the page template's `index_caption` words each)
    facts: object


@dataclass
class Context:
    """What a page module reads: the stored rows, and where figures and CSVs go."""

    reports_dir: Path
    fig_dir: Path  # reports/figures
    fig_rel: str = "figures"  # figure paths as a page links them
    rows: Rows = Rows(())

    def log_tail(self, device: str, name: str) -> str | None:
        """The last line of reports/data/<device>/logs/<name> (a correctness suite's verdict), None without one."""
        path = self.reports_dir / "data" / device / "logs" / name
        lines = [x.strip() for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
        return lines[-1] if lines else None

    def figure_file(self, name: str) -> tuple[Path, str]:
        """(file to write, link from the page) of figure reports/figures/<name>."""
        return self.fig_dir / name, f"{self.fig_rel}/{name}"

    def figure(self, fig, name: str) -> str:
        """Writes `fig` to reports/figures/<name>; its link from the page."""
        path, link = self.figure_file(name)
        figures.save(fig, path)
        return link

    def table_csv(self, name: str, header: list[str], rows: list[list]) -> str:
        """Writes a table's cells (code backticks dropped) to reports/data-tables/<name>.csv; its link."""
        path = self.reports_dir / "data-tables" / f"{name}.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("w", newline="") as f:
            csv.writer(f, lineterminator="\n").writerows([header, *([str(c).strip("`") for c in r] for r in rows)])
        return f"[data-tables/{path.name}](data-tables/{path.name})"
