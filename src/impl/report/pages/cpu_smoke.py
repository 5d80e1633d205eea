"""The CPU smoke page: the `smoke` profile's rows of every section as a check of the plumbing (did
each section run, how many rows were measured or listed as not run, when, at which commit). No
problem is answered here: CPU timings say nothing about the GPU questions."""
from __future__ import annotations

import pandas as pd

from impl.bench.row import Status
from impl.report.markdown import table
from impl.report.pages import Answer, Context, Page

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
    d = ctx.device_rows(DEVICE)
    if d.empty:
        return [Page(SLUG, "CPU smoke runs (plumbing check)", [], [Answer(
            "Did every section run on the CPU?", "No CPU smoke data yet: run `make smoke`.")], "")]
    rows = section_rows(d)
    measured = sum(r[2] for r in rows)
    silent = [r[0] for r in rows if r[2] == 0]
    env = d["row"].iloc[-1].env
    answer = (f"{len(rows)} sections ran under the `smoke` profile: {measured} rows measured, "
              f"{len(d) - measured} listed as OOM or not run with their reason"
              + (f"; sections without a measured row: {', '.join(silent)}." if silent else
                 "; every section measured at least one row."))
    body = ("These rows check that each section runs end to end and writes its file (tiny configs on the "
            f"machine's CPU: {env.device}, torch {env.torch}); their timings answer no question. Not run = "
            "needs a GPU (or more GPUs), unsupported on the CPU, or left out by the smoke grid.\n\n"
            + table(["section", "problems", "measured", "OOM", "not run", "newest run (UTC)", "commit", "format"],
                    rows))
    return [Page(SLUG, "CPU smoke runs (plumbing check)", [], [Answer("Did every section run on the CPU?", answer)],
                 body)]
