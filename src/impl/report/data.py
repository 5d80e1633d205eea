"""The report's one loader: saved pytest-benchmark JSON → typed records → one flat table.

A record is a benchmark row (impl.bench.row.Row), the pytest-benchmark stats that measured it
(None for rows that did not run: they come from the file's `not_run` list), and the run it came
from (device folder, section, date, commit, whether the file is in the older format).

The table (`frame`) has one line per record; columns: device, section, name, group, problem,
status (a Status value), reason, oom (status is OOM), datetime, commit, legacy, the stats in
seconds per call (mean, stddev, median, min, max, iqr, rounds, data), peak_alloc, every config
key as `cfg.<key>`, every metric as `m.<Metric value>`, `details` (the row's section-specific
payloads) and `row` (the Row itself).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from impl.bench.row import SCHEMA, Row, Status
from impl.report.legacy import legacy_row

STAT_KEYS = ("mean", "stddev", "median", "min", "max", "iqr", "rounds")


@dataclass(frozen=True)
class Run:
    device: str  # the folder under reports/data/
    section: str  # the file's stem (older layout) or its section folder
    path: str
    datetime: str | None
    commit: str  # short, "+" where the tree had changes
    legacy: bool  # the older format (no schema-2 rows)


@dataclass
class Stats:
    """pytest-benchmark's statistics, seconds per call."""

    mean: float | None
    stddev: float | None
    median: float | None
    min: float | None
    max: float | None
    iqr: float | None
    rounds: int | None
    data: list[float] | None

    @classmethod
    def from_json(cls, s: dict) -> Stats:
        return cls(*(s.get(k) for k in STAT_KEYS), data=s.get("data"))


@dataclass
class Record:
    name: str
    run: Run
    row: Row
    stats: Stats | None


def _commit(info: dict) -> str:
    """The run's commit, short, with "+" where its tree had changes: on the lent GPU machine git's
    HEAD stays the commit the session started at and later commits arrive as changes to it."""
    return (info.get("id") or "")[:8] + ("+" if info.get("dirty") else "")


def load_file(path: Path, device: str | None = None, section: str | None = None) -> list[Record]:
    doc = json.loads(path.read_text())
    benches = doc.get("benchmarks", [])
    legacy = not any((b.get("extra_info") or {}).get("schema") == SCHEMA for b in benches) and "not_run" not in doc
    run = Run(device=device or path.parent.name, section=section or path.stem, path=str(path),
              datetime=doc.get("datetime"), commit=_commit(doc.get("commit_info") or {}), legacy=legacy)
    out = []
    for bench in benches:
        info = bench.get("extra_info") or {}
        stats = Stats.from_json(bench.get("stats") or {})
        if info.get("schema") == SCHEMA:
            row = Row.from_json(info)
        else:
            row, kernel_s = legacy_row(info, bench.get("group"))
            if row.status is not Status.MEASURED:
                stats = None  # its one round timed a no-op
            elif kernel_s is not None:  # the real figure was do_bench's; the stats timed one round
                stats = Stats(kernel_s, None, kernel_s, None, None, None, None, None)
        out.append(Record(bench["name"], run, row, stats))
    for entry in doc.get("not_run", []):
        out.append(Record(entry["name"], run, Row.from_json(entry["row"]), None))
    return out


def frame(records: list[Record]) -> pd.DataFrame:
    lines = []
    for rec in records:
        row, run = rec.row, rec.run
        line = dict(device=run.device, section=run.section, name=rec.name, group=row.problem, problem=row.problem,
                    status=row.status.value, reason=row.reason, oom=row.status is Status.OOM,
                    datetime=run.datetime, commit=run.commit, legacy=run.legacy,
                    peak_alloc=row.memory.peak_allocated, details=row.details, info=row.details, row=row,
                    data=rec.stats.data if rec.stats else None)
        for k in STAT_KEYS:
            line[k] = getattr(rec.stats, k) if rec.stats else None
        for k, v in row.config.items():
            line[f"cfg.{k}"] = v
        for k, v in row.metrics.items():
            line[f"m.{k.value}"] = v
        lines.append(line)
    return pd.DataFrame(lines)


def load_records(data_dir: Path) -> list[Record]:
    """Every run file of every device, except history/ and probes/."""
    records = []
    for path in sorted(data_dir.glob("*/*.json")):
        records.extend(load_file(path))
    return records


def load(data_dir: Path) -> pd.DataFrame:
    return frame(load_records(data_dir))


def load_history(data_dir: Path) -> pd.DataFrame:
    """Earlier versions' JSON kept under reports/data/<device>/history/ (e.g. leaderboard-v1.json: the
    same benchmark before a kernel change), for version tables; `section` is the file stem."""
    records = []
    for path in sorted(data_dir.glob("*/history/*.json")):
        records.extend(load_file(path, device=path.parent.parent.name))
    return frame(records)
