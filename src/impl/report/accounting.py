"""Report sections: communication_accounting (2.4), the ddp_overlap_bucketed (b) model, per-rank
communication volumes, and memory_accounting, from the rows perf/test_communication_accounting.py
records (closed forms of impl.accounting; every number is read from the rows' details["results"]).
The words and tables are in templates/communication_accounting.md.j2."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.model import size_rank
from impl.report.templating import environment
from impl.workloads.problems import Problem as P, StoredGroup

SECTIONS = ("xxl", "bucket_model", "comm_volumes")  # the communication_accounting cases, in page order
MACRO = {"xxl": "xxl", "bucket_model": "bucket", "comm_volumes": "volumes"}


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    if "problem" not in df:
        return None
    words = environment().get_template("communication_accounting.md.j2").module
    by = {r.config.get("case"): d for r, d in zip(df["row"], df["details"]) if r.problem == P.COMMUNICATION_ACCOUNTING}
    parts = [str(getattr(words, MACRO[c])(by[c]["results"])).strip() for c in SECTIONS if c in by]
    mem = {r.config["size"]: d["results"] for r, d in zip(df["row"], df["details"])
           if r.problem == StoredGroup.MEMORY_ACCOUNTING}
    if mem:
        parts.append(str(words.memory(sorted(mem.items(), key=lambda kv: size_rank(kv[0])))).strip())
    return "\n\n".join(parts) if parts else None
