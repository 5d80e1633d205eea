"""The report's one loader: saved pytest-benchmark JSON → typed records, read once.

A record is a benchmark row (impl.bench.row.Row), the pytest-benchmark stats that measured it
(None for rows that did not run: they come from the file's `not_run` list), and the run it came
from (device folder, section, date, commit, whether the file is in the older format: read through
impl.report.legacy, the one adapter, and never rewritten). `split_newest` splits the records into
each row's newest and every earlier one; impl.report.rows turns them into the rows pages read.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from impl.bench.row import SCHEMA, Row, Status
from impl.bench.store import BadRunFile, RunFile, read_run, row_number_problems, run_files, run_identity
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

    @property
    def file(self) -> str:
        """The run file as the report names it: reports/data/<device>/<section>/<name>.json."""
        return run_file_name(self.path)


def run_file_name(path: str | Path) -> str:
    """A stored run's path under the repository (impl.bench.store's layout <device>/<section>/<name>.json)."""
    return "/".join(("reports", "data", *Path(path).parts[-3:]))


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
    """One run file's records; BadRunFile (naming the file and each bad row) for a file that is
    not a whole run (impl.bench.store.read_run: truncated, empty, failed tests, NaN stats...) or,
    where `device` and `section` are given, not a run of them."""
    return load_doc(read_run(path, section, device), path, device, section)


def load_doc(doc: dict, path: Path, device: str | None = None, section: str | None = None) -> list[Record]:
    """The records of a run already read (impl.bench.store.read_run or parse_run) from `path`."""
    try:
        return _records(doc, path, device, section)
    except BadRunFile:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # an older-format row read_run cannot check
        raise BadRunFile(str(path), [f"unreadable row ({type(exc).__name__}: {exc})"]) from None


def _legacy_record(bench: dict, stats: Stats, path: Path) -> tuple[Row, Stats | None]:
    """An older-format row, its numbers checked as the store checks a schema-2 row's."""
    row, kernel_s = legacy_row(bench.get("extra_info") or {}, bench.get("group"))
    if problems := row_number_problems(row):
        raise BadRunFile(str(path), [f"row {bench['name']}: {p}" for p in problems])
    if row.status is not Status.MEASURED:
        return row, None  # its one round timed a no-op
    if kernel_s is not None:  # the real figure was do_bench's; the stats timed one round
        return row, Stats(kernel_s, None, kernel_s, None, None, None, None, None)
    return row, stats


def _records(doc: dict, path: Path, device: str | None, section: str | None) -> list[Record]:
    benches = doc["benchmarks"]
    legacy = not any((b.get("extra_info") or {}).get("schema") == SCHEMA for b in benches) and "not_run" not in doc
    run = Run(device=device or path.parent.name, section=section or path.stem, path=str(path),
              datetime=doc.get("datetime"), commit=_commit(doc.get("commit_info") or {}), legacy=legacy)
    out = []
    for bench in benches:
        info = bench.get("extra_info") or {}
        stats = Stats.from_json(bench.get("stats") or {})
        row, stats = (Row.from_json(info), stats) if info.get("schema") == SCHEMA else _legacy_record(bench, stats, path)
        out.append(Record(bench["name"], run, row, stats))
    for entry in doc.get("not_run", []):
        out.append(Record(entry["name"], run, Row.from_json(entry["row"]), None))
    return out


@dataclass(frozen=True)
class StoredRun:
    """A whole run of its folder's device and section, and its records."""

    file: RunFile
    records: list[Record]


@dataclass(frozen=True)
class Copy:
    """A file holding a run already read from another file of its folder (impl.bench.store.run_identity)."""

    path: Path
    original: Path

    def __str__(self) -> str:
        return f"{self.path}: the same run as {self.original} (the same start time)"


@dataclass
class Stored:
    """Every stored run file read once: the whole runs in their folders, oldest first within each
    (device, section); the files that are not whole runs or not runs of their folder's device and
    section; the copies of a run already read, each kept out so a run counts once."""

    runs: list[StoredRun]
    bad: list[BadRunFile]
    copies: list[Copy]

    def warnings(self) -> list[str]:
        return [f"warning: skipped {exc}" for exc in self.bad] + [f"warning: skipped {c}" for c in self.copies]


def load_stored(data_dir: Path) -> Stored:
    stored, first = Stored([], [], []), {}
    for rf in run_files(data_dir):
        try:
            doc = read_run(rf.path, rf.section, rf.device)
            records = load_doc(doc, rf.path, rf.device, rf.section)
        except BadRunFile as exc:
            stored.bad.append(exc)
            continue
        key = (rf.device, rf.section, run_identity(doc))
        if key in first:
            stored.copies.append(Copy(rf.path, first[key]))
            continue
        first[key] = rf.path
        stored.runs.append(StoredRun(rf, records))
    return stored


def load_records(data_dir: Path) -> list[Record]:
    """Every stored run of every device and section (impl.bench.store's layout), oldest first. A
    file that is not a whole run of its folder, or a copy of a run already read, is left out with
    a warning naming it (`make gate` fails on the first)."""
    stored = load_stored(data_dir)
    for line in stored.warnings():
        print(line, file=sys.stderr)
    return [rec for run in stored.runs for rec in run.records]


def split_newest(records: list[Record]) -> tuple[list[Record], list[Record]]:
    """(each row's newest record, every earlier one): a row is a (device, benchmark name); run
    files sort by their UTC timestamp, so the last seen is the newest."""
    newest: dict[tuple[str, str], Record] = {}
    for rec in records:
        newest[(rec.run.device, rec.name)] = rec
    keep = {id(r) for r in newest.values()}
    return list(newest.values()), [r for r in records if id(r) not in keep]
