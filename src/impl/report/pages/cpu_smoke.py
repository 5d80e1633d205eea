"""The CPU smoke page: the `smoke` profile's rows of every section as a check of the plumbing (did
each section run, how many rows were measured or listed as not run, when, at which commit). No
problem is answered here: CPU timings say nothing about the GPU questions.
templates/cpu_smoke.md.j2 holds every word."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from impl.bench.row import Env, Status
from impl.report.pages import Context
from impl.report.rows import Bench

PROBLEMS = ()
DEVICE = "cpu"


@dataclass(frozen=True)
class SectionRow:
    """One section's CPU rows."""

    section: str
    problems: tuple[str, ...]
    measured: int
    oom: int
    not_run: tuple[tuple[str, int], ...]  # (status, rows) of the other statuses, by status
    newest: str  # the newest row's run, "YYYY-MM-DD HH:MM" (UTC)
    commit: str
    legacy: bool  # every row in the older format


@dataclass(frozen=True)
class CpuSmokeFacts:
    env: Env | None  # None: no CPU rows
    sections: tuple[SectionRow, ...]
    sources: tuple[str, ...]
    index_figures: tuple = ()

    @property
    def scores(self) -> dict:
        """None: the page answers no problem of the index."""
        return {}

    @property
    def measured(self) -> int:
        return sum(s.measured for s in self.sections)

    @property
    def others(self) -> int:
        return sum(s.oom + sum(n for _, n in s.not_run) for s in self.sections)

    @property
    def silent(self) -> list[str]:
        """Sections without a measured row."""
        return [s.section for s in self.sections if s.measured == 0]


def _section(section: str, rows: list[Bench]) -> SectionRow:
    statuses = Counter(b.status for b in rows)
    newest = max(rows, key=lambda b: str(b.run.datetime))  # the first of the newest run
    return SectionRow(section, tuple(sorted({b.problem for b in rows})), statuses[Status.MEASURED],
                      statuses[Status.OOM],
                      tuple(sorted((s.value, n) for s, n in statuses.items() if s not in (Status.MEASURED, Status.OOM))),
                      newest.run.when, newest.run.commit or "–", all(b.run.legacy for b in rows))


def facts(ctx: Context) -> CpuSmokeFacts:
    rows = ctx.rows.of(device=DEVICE)
    by: dict[str, list[Bench]] = {}
    for b in rows:
        by.setdefault(b.run.section, []).append(b)
    return CpuSmokeFacts(rows[-1].row.env if rows else None, tuple(_section(s, by[s]) for s in sorted(by)),
                         tuple(sorted({b.run.file for b in rows if b.run.file})))
