"""The report's one loader: a stored pytest-benchmark run file → a list of impl.report.rows.Bench, read once
(the pages, `make gate` and `make compare` all read rows from here). A row that did not run (the file's `not_run`
list) has no statistics. Older-format files, and rows stored under an older group name, are read through
impl.report.legacy, the one adapter; a stored file is never rewritten.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from impl.bench.kernel_digest import KernelDigest
from impl.bench.row import SCHEMA, Row, Status
from impl.bench.store import (BadRunFile, RunFile, read_run, row_number_problems, run_files, run_identity,
                              run_stem)
from impl.report.legacy import handout_name, legacy_row
from impl.report.rows import Bench, RunRef, Stats

_UNREADABLE = (AttributeError, KeyError, TypeError, ValueError)  # an older-format row read_run cannot check


def run_file_name(path: str | Path) -> str:
    """A stored run's path under the repository (impl.bench.store's layout <device>/<section>/<name>.json.gz,
    or .json for one filed before runs were packed)."""
    return "/".join(("reports", "data", *Path(path).parts[-3:]))


def load_file(path: Path, device: str | None = None, section: str | None = None) -> list[Bench]:
    """One run file's rows; BadRunFile (naming the file and each bad row) for a file that is not a
    whole run (impl.bench.store.read_run: truncated, empty, failed tests, NaN stats...) or, where
    `device` and `section` are given, not a run of them."""
    return load_doc(read_run(path, section, device), path, device, section)


def load_doc(doc: dict, path: Path, device: str | None = None, section: str | None = None) -> list[Bench]:
    """The rows of a run already read (impl.bench.store.read_run or parse_run) from `path`."""
    legacy = "not_run" not in doc and not any((b.get("extra_info") or {}).get("schema") == SCHEMA
                                              for b in doc["benchmarks"])
    info = doc.get("commit_info") or {}
    # the commit, short, "+" where its tree had changes (on the lent GPU machine later commits arrive as changes)
    commit = (info.get("id") or "")[:8] + ("+" if info.get("dirty") else "")
    run = RunRef(device or path.parent.name, section or run_stem(path) or path.stem, doc.get("datetime") or "", commit,
                 legacy, run_file_name(path), KernelDigest.from_json(info))
    rows = [(b["name"], *_measured(b, path)) for b in doc["benchmarks"]]
    rows += [(e["name"], Row.from_json(e["row"]), None) for e in doc.get("not_run", [])]
    return [Bench(name, handout_name(row), run, stats) for name, row, stats in rows]


def _measured(bench: dict, path: Path) -> tuple[Row, Stats | None]:
    """A `benchmarks` entry's row and statistics; an older-format row is read by impl.report.legacy and
    its numbers checked as the store checks a schema-2 row's (read_run checked those already)."""
    info, s = bench.get("extra_info") or {}, bench.get("stats") or {}
    stats = Stats(s.get("mean"), s.get("stddev"), s.get("median"), s.get("iqr"), s.get("rounds"), s.get("data") or None)
    if info.get("schema") == SCHEMA:
        return Row.from_json(info), stats
    try:
        row, kernel_s = legacy_row(info, bench.get("group"))
        problems = row_number_problems(row)
    except _UNREADABLE as exc:
        problems = [f"unreadable ({type(exc).__name__}: {exc})"]
    if problems:
        raise BadRunFile(str(path), [f"row {bench['name']}: {p}" for p in problems])
    if row.status is not Status.MEASURED:
        return row, None  # its one round timed a no-op
    if kernel_s is not None:  # the real figure was do_bench's; the stats timed one round
        return row, Stats(kernel_s, None, kernel_s, None, None, None)
    return row, stats


@dataclass(frozen=True)
class StoredRun:
    """A whole run of its folder's device and section, and its rows."""

    file: RunFile
    rows: list[Bench]


@dataclass(frozen=True)
class Copy:
    """A file holding a run already read from another file of its folder (impl.bench.store.run_identity)."""

    path: Path
    original: Path

    def __str__(self) -> str:
        return f"{self.path}: the same run as {self.original} (the same start time)"


@dataclass
class Stored:
    """Every stored run file read once: the whole runs (oldest first within a folder), the bad files, and the
    copies of a run already read (kept out so a run counts once)."""

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
            rows = load_doc(doc, rf.path, rf.device, rf.section)
        except BadRunFile as exc:
            stored.bad.append(exc)
            continue
        key = (rf.device, rf.section, run_identity(doc))
        if key in first:
            stored.copies.append(Copy(rf.path, first[key]))
            continue
        first[key] = rf.path
        stored.runs.append(StoredRun(rf, rows))
    return stored


def load_rows(data_dir: Path) -> list[Bench]:
    """Every stored run of every device and section (impl.bench.store's layout), oldest first. A
    file that is not a whole run of its folder, or a copy of a run already read, is left out with
    a warning naming it (`make gate` fails on the first)."""
    stored = load_stored(data_dir)
    for line in stored.warnings():
        print(line, file=sys.stderr)
    return [b for run in stored.runs for b in run.rows]
