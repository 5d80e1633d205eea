"""The CPU smoke page: the `smoke` profile's rows of every section as a check of the plumbing (did
each section run, how many rows were measured or listed as not run, when, at which commit). No
problem is answered here: CPU timings say nothing about the GPU questions."""
from __future__ import annotations

import pandas as pd

from impl.bench.row import Status
from impl.report.pages import Answer, Context, Page
from impl.report.templating import environment, macros

DEVICE = "cpu"
SLUG = "cpu_smoke"


def section_rows(d: pd.DataFrame) -> list[list]:
    """One row per section: its problems, rows measured, OOM, not run (by status), newest run, commit."""
    rows = []
    for section, g in d.groupby("section", sort=True):
        not_run = g[~g["status"].isin([Status.MEASURED.value, Status.OOM.value])]
        kinds = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in not_run["status"].value_counts().sort_index().items())
        newest = g.loc[g["datetime"].astype(str).idxmax()]
        rows.append([f"`{section}`", ", ".join(sorted(set(g["problem"]))),
                     int((g["status"] == Status.MEASURED.value).sum()), int((g["status"] == Status.OOM.value).sum()),
                     kinds or "0", str(newest["datetime"])[:16].replace("T", " "), f"`{newest['commit'] or '–'}`",
                     "older" if g["legacy"].all() else "bench layer"])
    return rows


def pages(ctx: Context) -> list[Page]:
    words = macros("cpu_smoke.md.j2")
    d = ctx.device_rows(DEVICE)
    if d.empty:
        return [Page(SLUG, words.title(), [], [Answer(words.question(), words.no_data())], "")]
    rows = section_rows(d)
    measured = sum(r[2] for r in rows)
    answer = words.answer(len(rows), measured, len(d) - measured, [r[0] for r in rows if r[2] == 0])
    body = str(environment().get_template("cpu_smoke.md.j2").module.body(d["row"].iloc[-1].env, rows)).strip()
    return [Page(SLUG, words.title(), [], [Answer(words.question(), answer)], body)]
