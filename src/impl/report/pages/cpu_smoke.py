"""The CPU smoke page: per section, did its `smoke` rows run (a plumbing check; CPU timings answer no
problem). templates/cpu_smoke.md.j2 holds every word."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from impl.bench.row import Env, Status
from impl.report.pages import Context
from impl.report.rows import group
from impl.report.runs import files_of

PROBLEMS = ()


@dataclass(frozen=True)
class SectionRow:
    section: str
    problems: tuple[str, ...]
    measured: int
    oom: int
    not_run: tuple[tuple[str, int], ...]  # (status, rows) of the other statuses, by status
    newest: str  # the newest run, "YYYY-MM-DD HH:MM" (UTC)
    commit: str
    legacy: bool  # every row in the older format


@dataclass(frozen=True)
class CpuSmokeFacts:
    env: Env | None  # None: no CPU rows
    sections: tuple[SectionRow, ...]
    sources: tuple[str, ...]
    measured: int  # rows, all sections
    others: int  # OOM or not run, all sections
    silent: list[str]  # sections without a measured row
    scores = {}  # the page answers no problem of the index


def facts(ctx: Context) -> CpuSmokeFacts:
    rows, out, ok = ctx.rows.of(device="cpu"), [], (Status.MEASURED, Status.OOM)  # ok: not "not run"
    for sec, rs in sorted(group(rows, lambda b: b.run.section).items()):
        n = Counter(b.status for b in rs)
        newest = max(rs, key=lambda b: b.run.datetime)  # the first of the newest run
        out.append(SectionRow(sec, tuple(sorted({b.problem for b in rs})), n[Status.MEASURED], n[Status.OOM],
                              tuple(sorted((s.value, k) for s, k in n.items() if s not in ok)),
                              newest.run.when, newest.run.commit or "–", all(b.run.legacy for b in rs)))
    return CpuSmokeFacts(rows[-1].row.env if rows else None, tuple(out), files_of(rows), sum(s.measured for s in out),
                         sum(s.oom + sum(k for _, k in s.not_run) for s in out),
                         [s.section for s in out if s.measured == 0])
