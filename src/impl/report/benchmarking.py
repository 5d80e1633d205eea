"""Timing conventions of the frame's lines (`study`, `step_s`, `stat_name`, `ratio_cell`, `timing_text`),
read by the pages not yet rewritten on typed rows (impl.report.rows has their typed forms)."""
from __future__ import annotations

import pandas as pd

from impl.bench.row import Status
from impl.model import size_rank
from impl.report.markdown import missing, ms
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)
from impl.workloads.problems import Problem as P

MEASURED = Status.MEASURED.value


def study(r) -> str | None:
    """A row's study: a config key (the bench layer's rows), a details key in the older format."""
    s = r.cfg.study
    return r["details"].get("study") if missing(s) else s


def _rows(df: pd.DataFrame, name: str) -> pd.DataFrame:
    d = df[df.problem == P.BENCHMARKING_SCRIPT]
    if d.empty:
        return d
    return d[d.apply(study, axis=1) == name]


def step_s(r) -> float:
    """A row's time per call: the median (the bench layer's metrics divide by it); older-format runs
    computed their tokens/s and MFU from the mean, so their tables keep showing the mean."""
    return r["mean"] if r["legacy"] else r["median"]


def stat_name(d: pd.DataFrame) -> str:
    """What step_s shows for the rows of `d`, for tables' captions."""
    ran = d[d["status"] == MEASURED]  # an OOM row of an older run times nothing
    kinds = set((ran if not ran.empty else d)["legacy"])
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


def _cell(r) -> str:
    if _ok(r):
        return ms(step_s(r), r["stddev"])
    return "OOM" if r["status"] == Status.OOM.value else r["status"].replace("_", " ")


def timing_text(d: pd.DataFrame) -> tuple[str, str]:
    """(warm-up calls, timed rounds) of the measured rows, as text ("5", or "5–10" where rows differ:
    the harness gives short rows more rounds); the bench layer's rows carry their timing, the older
    format kept the grid's warmup and rounds in its details."""
    warm, rounds = set(), set()
    for _, r in d[d["status"] == MEASURED].iterrows():
        t = r["row"].timing
        warm.add(t.warmup_rounds if t else r["details"].get("warmup"))
        rounds.add(t.rounds if t else r["details"].get("rounds"))

    def text(xs):
        xs = sorted(x for x in xs if x is not None)
        return "–" if not xs else (str(xs[0]) if xs[0] == xs[-1] else f"{xs[0]}–{xs[-1]}")
    return text(warm), text(rounds)


def _sizes(d):
    return sorted(d.cfg.size.unique(), key=size_rank)
