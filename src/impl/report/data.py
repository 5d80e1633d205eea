"""Loads reports/data/<device>/*.json (saved pytest-benchmark JSON) into one flat table, and the
earlier versions under reports/data/<device>/history/ into another.

One row per benchmark; columns: device (folder), section (file stem), name, group, problem,
oom, the timing stats in seconds (mean, stddev, median, min, max, rounds), `data` (the raw
round times), every config key as `cfg.<key>`, every metric as `m.<key>`, and `info` (the whole
extra_info dict) for sections that need more.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

STAT_KEYS = ("mean", "stddev", "median", "min", "max", "rounds")


def _commit(info: dict) -> str:
    """The run's commit, short, with "+" where its tree had changes: on the lent GPU machine git's
    HEAD stays the commit the session started at and later commits arrive as changes to it."""
    return (info.get("id") or "")[:8] + ("+" if info.get("dirty") else "")


def load_file(path: Path, device: str | None = None) -> list[dict]:
    doc = json.loads(path.read_text())
    rows = []
    for bench in doc.get("benchmarks", []):
        info = bench.get("extra_info", {})
        stats = bench.get("stats", {})
        row = dict(device=device or path.parent.name, section=path.stem, name=bench["name"], group=bench.get("group"),
                   datetime=doc.get("datetime"), commit=_commit(doc.get("commit_info") or {}),
                   problem=info.get("problem", bench.get("group")), oom=bool(info.get("oom", False)),
                   data=stats.get("data"), info=info,
                   peak_alloc=info.get("peak_memory_allocated_bytes"))
        for k in STAT_KEYS:
            row[k] = stats.get(k)
        if row["oom"]:  # an OOM row's timings time nothing
            for k in STAT_KEYS[:-1]:
                row[k] = None
        for k, v in (info.get("config") or {}).items():
            row[f"cfg.{k}"] = v
        for k, v in (info.get("metrics") or {}).items():
            row[f"m.{k}"] = v
        rows.append(row)
    return rows


def load(data_dir: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(data_dir.glob("*/*.json")):
        rows.extend(load_file(path))
    return pd.DataFrame(rows)


def load_history(data_dir: Path) -> pd.DataFrame:
    """Earlier versions' JSON kept under reports/data/<device>/history/ (e.g. leaderboard-v1.json: the
    same benchmark before a kernel change), for version tables; `section` is the file stem."""
    rows = []
    for path in sorted(data_dir.glob("*/history/*.json")):
        rows.extend(load_file(path, device=path.parent.parent.name))
    return pd.DataFrame(rows)
