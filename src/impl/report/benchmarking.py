"""The timing conventions the pages share: `study`, `step_s`, `stat_name`, `timing_text` and
`ratio_cell` (frame lines), with typed-row forms (`bench_step_s`, `stat_of`, `rows_timing_text`)."""
from __future__ import annotations

import pandas as pd

from impl.bench.row import Row, Status
from impl.report.markdown import missing, ms
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)
from impl.report.rows import Bench

MEASURED = Status.MEASURED.value


def study(r) -> str | None:
    """A row's study: a config key (the bench layer's rows), a details key in the older format."""
    s = r.cfg.study
    return r["details"].get("study") if missing(s) else s


def step_s(r) -> float:
    """A row's time per call: the median (the bench layer's metrics divide by it); older-format runs
    computed their tokens/s and MFU from the mean, so their tables keep showing the mean."""
    return r["mean"] if r["legacy"] else r["median"]


def bench_step_s(b: Bench) -> float | None:
    """step_s of a typed row (None where it has no statistics)."""
    return None if b.stats is None else b.stats.mean if b.run.legacy else b.stats.median


def stat_name(d: pd.DataFrame) -> str:
    """What step_s shows for the rows of `d`, for tables' captions."""
    return stat_of([(s == MEASURED, bool(legacy)) for s, legacy in zip(d["status"], d["legacy"])])


def stat_of(rows: list[tuple[bool, bool]]) -> str:
    """stat_name of rows given as (measured, older format): an OOM row of an older run times nothing."""
    ran = [legacy for measured, legacy in rows if measured] or [legacy for _, legacy in rows]
    kinds = set(ran)
    return "mean" if kinds == {True} else "median" if kinds == {False} else "median (mean in older-format runs)"


def _ok(r) -> bool:
    return r is not None and r["status"] == MEASURED


def within_noise(a, b) -> bool:
    """Whether two measured rows' times are within each other's spread (medians ± std overlap)."""
    sa, sb = (0.0 if missing(r["stddev"]) else r["stddev"] for r in (a, b))
    return abs(step_s(a) - step_s(b)) <= sa + sb


def ratio_cell(ours, ref) -> str:
    """ours ÷ ref as "0.64×" (the report's one convention: below 1, ours is faster), or "within noise"
    where their spreads overlap; "–" unless both ran."""
    if not (_ok(ours) and _ok(ref)):
        return "–"
    return "within noise" if within_noise(ours, ref) else f"{step_s(ours) / step_s(ref):.2f}×"


def timing_text(d: pd.DataFrame) -> tuple[str, str]:
    return rows_timing_text(list(d["row"]))


def rows_timing_text(rows: list[Row]) -> tuple[str, str]:
    """(warm-up calls, timed rounds) of the measured rows, as text ("5", or "5–10" where rows differ:
    the harness gives short rows more rounds); the bench layer's rows carry their timing, the older
    format kept the grid's warmup and rounds in its details."""
    warm, rounds = set(), set()
    for row in rows:
        if row.status is not Status.MEASURED:
            continue
        t = row.timing
        warm.add(t.warmup_rounds if t else row.details.get("warmup"))
        rounds.add(t.rounds if t else row.details.get("rounds"))

    def text(xs):
        xs = sorted(x for x in xs if x is not None)
        return "–" if not xs else (str(xs[0]) if xs[0] == xs[-1] else f"{xs[0]}–{xs[-1]}")
    return text(warm), text(rounds)
