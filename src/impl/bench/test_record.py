"""The correctness suite's result on one machine at one commit, as a committed record.

CI has no GPU, so the GPU path is checked by a record: `make test` writes pytest's junit XML and
this module turns it into a `TestRecord`; `make test-record` (or `python -m impl.bench.test_record
--file RECORD.json` for one made on the GPU machine) files it as

    reports/data/<device slug>/tests/<UTC timestamp>_<commit>.json

never overwriting an earlier one. A record names the code it tested by digests read from the
working tree (`source_digest`: src/, correctness/, conftest.py; `kernel_digest` and
`kernel_table_digest`: the GPU kernels' files and the kernel table's choices, impl.bench.kernel_digest),
so the report can tell whether the kernels changed after the newest record, also for a run on the GPU
machine, whose git HEAD stays the session's first commit while later commits arrive as changes.
Records filed before `kernel_table_digest` existed load with it None and are judged by their
`kernel_digest` alone (KernelDigest.changed_since); a stored record is never rewritten.

A suite longer than one device call runs in shards (`make test SHARD=K/N`: pytest --shard,
impl.bench.shards), each making a record with `shard` "K/N"; `python -m impl.bench.test_record merge
A.json B.json ... --out M.json` merges shards 1..N of one device, commit and code into one record
with `shards` N, which files as a whole run does. A lone shard is never filed (store_record says
why). Records without the shard fields (all made before them) load as whole runs.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from impl.bench.kernel_digest import KernelDigest, digest, kernel_digest
from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.bench.shards import Shard
from impl.bench.store import commit_unknown, device_slug, git_output, write_new

TESTS_FOLDER = "tests"  # beside the sections under reports/data/<device>/
SOURCE_PATHS = ("src", "correctness", "conftest.py", "pyproject.toml")


@dataclass
class TestRecord:
    device: str  # the device slug (`h100-80gb-x1`, `cpu`)
    datetime: str  # UTC, ISO 8601, when the record was made
    commit: str | None  # SUITE_COMMIT if set (the commit whose tree was sent to a GPU machine), else HEAD
    dirty: bool  # the working tree differed from `commit` (always so for a GPU run without SUITE_COMMIT)
    source_digest: str
    kernel_digest: str  # the kernel files (KERNEL_PATHS), the value records have held from the first
    command: str  # what ran, e.g. "pytest correctness -n 8"
    passed: int
    failed: int
    errors: int
    skipped: int
    duration_s: float
    failures: list[str] = field(default_factory=list)  # node ids of failed and errored tests
    kernel_table_digest: str | None = None  # the kernel table's choices; None in records filed before it was recorded
    shard: str | None = None  # "K/N" for the K-th of N shards of the suite (impl.bench.shards); None for a whole run
    shards: int | None = None  # a whole run merged from this many shard records (merge_records); None if run at once
    shard_commands: list[str] = field(default_factory=list)  # the merged shards' commands, shard 1 first

    def __post_init__(self) -> None:
        self.part  # noqa: B018 (a shard that is not "K/N" is refused at construction: ValueError naming it)

    @property
    def kernels(self) -> KernelDigest:
        return KernelDigest(self.kernel_digest, self.kernel_table_digest)

    @property
    def part(self) -> Shard | None:
        return None if self.shard is None else Shard.parse(self.shard)

    @property
    def green(self) -> bool:
        return self.failed == 0 and self.errors == 0 and self.passed > 0

    @property
    def commit_label(self) -> str:
        """The commit as file names and pages show it: 8 hex digits, "+" when the tree was dirty."""
        return f"{(self.commit or 'nocommit')[:8]}{'+' if self.dirty else ''}"

    def stamp(self) -> str:
        when = datetime.fromisoformat(self.datetime)
        return f"{when:%Y%m%dT%H%M%SZ}_{self.commit_label}"

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict) -> TestRecord:
        return cls(**doc)


def parse_junit(path: Path) -> tuple[dict[str, int], float, list[str]]:
    """(counts, seconds, failed node ids) of a pytest junit XML; raises ValueError naming the file
    when it is not one (a run killed before pytest wrote it leaves none or a partial one)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise ValueError(f"{path}: not a junit XML report ({exc})") from None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    if not suites:
        raise ValueError(f"{path}: no <testsuite> in it")
    counts = dict(tests=0, failures=0, errors=0, skipped=0)
    seconds, failures = 0.0, []
    for suite in suites:
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        seconds += float(suite.get("time", 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failures.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return counts, seconds, failures


def tested_commit(root: Path) -> tuple[str | None, bool]:
    """(commit, dirty) of the code a run tested: SUITE_COMMIT where set (the commit whose tree was
    sent to a GPU machine, whose own HEAD is the session's first commit), else git's HEAD, dirty
    when the tested paths differ from it."""
    commit = os.environ.get("SUITE_COMMIT") or git_output(root, "rev-parse", "HEAD")
    dirty = not os.environ.get("SUITE_COMMIT") and bool(git_output(root, "status", "--porcelain", "--", *SOURCE_PATHS))
    return commit, dirty


def record_from_junit(path: Path, command: str, root: Path, device: str | None = None,
                      shard: Shard | None = None) -> TestRecord:
    """The record of a run of the tests of the repository `root` (its commit and digests); `shard`
    where the run was one shard of the suite (pytest --shard)."""
    counts, seconds, failures = parse_junit(path)
    commit, dirty = tested_commit(root)
    kernels = kernel_digest(root)
    return TestRecord(
        device=device or device_slug(), datetime=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        commit=commit, dirty=dirty, source_digest=digest(SOURCE_PATHS, root), kernel_digest=kernels.sources,
        command=command,
        passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
        failed=counts["failures"], errors=counts["errors"], skipped=counts["skipped"], duration_s=round(seconds, 1),
        failures=failures, kernel_table_digest=kernels.table, shard=None if shard is None else str(shard))


def store_record(record: TestRecord, data_dir: Path) -> Path:
    """File a record under <device>/tests/, atomically and under a name no earlier record has.

    A lone shard is refused (ValueError): the index shows each device's newest record as the
    suite's result there, and every filed record means the whole suite, so that neither the index
    nor any later reader has to tell parts from wholes (or look past a newer part for an older
    whole). Shards are merged first (merge_records) and the merge is filed."""
    if record.shard is not None:
        raise ValueError(f"record of shard {record.shard} ({record.device}, {record.commit_label}) is part of the "
                         f"suite, not filed: merge all {record.part.count} shards "
                         "(python -m impl.bench.test_record merge A.json B.json ... --out M.json) and file that")
    folder = data_dir / record.device / TESTS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return write_new(folder, record.stamp(), record.to_json())


def check_commit_known(record: TestRecord, root: Path, path: Path) -> None:
    """ValueError naming the file unless the record's commit is a commit of the repository at `root`: a record filed
    from elsewhere names its commit by hand (SUITE_COMMIT), and a mistyped one would file a result for code nobody
    can check out. Outside a git clone nothing can be checked."""
    if commit_unknown(root, record.commit):
        raise ValueError(f"{path}: commit {record.commit!r} is not a commit of {root} (a mistyped SUITE_COMMIT?); "
                         f"its source_digest {record.source_digest} says which tree it tested")


def read_record(path: Path) -> TestRecord:
    """The record in `path`; ValueError naming the file when it is not one (another JSON, a run
    file, a record without a valid datetime, which its file name needs)."""
    try:
        record = TestRecord.from_json(json.loads(path.read_text()))
        record.stamp()
        return record
    except (OSError, UnicodeDecodeError, ValueError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a test record ({type(exc).__name__}: {exc})") from None


def load_records(data_dir: Path) -> list[TestRecord]:
    """Every committed record, oldest first per device (the file names sort by time)."""
    return [read_record(p) for p in sorted(data_dir.glob(f"*/{TESTS_FOLDER}/*.json")) if not p.name.startswith(".")]


# What every shard of one merged record must share: the machine and the code it tested.
SAME_IN_SHARDS = ("device", "commit", "source_digest", "kernel_digest", "kernel_table_digest")


def _unsharded_command(record: TestRecord) -> str:
    return record.command.replace(f" --shard {record.shard}", "")


def merge_records(paths: list[Path]) -> TestRecord:
    """One whole-suite record from the records of shards 1..N of one run (each in exactly one file):
    counts, seconds and failures summed, `shards` = N, the shards' commands kept, made when the last
    shard was. ValueError naming the file and the field for a file that is not a shard record, a
    shard whose device, commit, digests (SAME_IN_SHARDS) or command (less its --shard) differ from
    the first file's, mixed N, and a shard repeated or missing."""
    if not paths:
        raise ValueError("merge: no shard records given")
    by_index: dict[int, tuple[Path, TestRecord]] = {}
    first_path, first = paths[0], read_record(paths[0])
    for path in paths:
        rec = read_record(path)
        if rec.part is None:
            raise ValueError(f"{path}: field shard is None: a whole-suite record, not a shard to merge")
        if rec.part.count != first.part.count:
            raise ValueError(f"{path}: field shard is {rec.shard}, but {first_path} is one of {first.part.count}")
        for name in SAME_IN_SHARDS:
            if getattr(rec, name) != getattr(first, name):
                raise ValueError(f"{path}: field {name} is {getattr(rec, name)!r}, "
                                 f"but {first_path} has {getattr(first, name)!r}")
        if _unsharded_command(rec) != _unsharded_command(first):
            raise ValueError(f"{path}: field command is {rec.command!r} (other tests than {first_path}'s "
                             f"{first.command!r})")
        if rec.part.index in by_index:
            raise ValueError(f"{path}: field shard {rec.shard} repeats {by_index[rec.part.index][0]}")
        by_index[rec.part.index] = (path, rec)
    count = first.part.count
    missing = [f"{k}/{count}" for k in range(1, count + 1) if k not in by_index]
    if missing:
        raise ValueError(f"merge: field shard: {', '.join(missing)} missing (given: {', '.join(map(str, paths))})")
    parts = [by_index[k][1] for k in range(1, count + 1)]
    return TestRecord(
        device=first.device, datetime=max(r.datetime for r in parts), commit=first.commit,
        dirty=any(r.dirty for r in parts), source_digest=first.source_digest, kernel_digest=first.kernel_digest,
        command=_unsharded_command(first), passed=sum(r.passed for r in parts), failed=sum(r.failed for r in parts),
        errors=sum(r.errors for r in parts), skipped=sum(r.skipped for r in parts),
        duration_s=round(sum(r.duration_s for r in parts), 1), failures=[f for r in parts for f in r.failures],
        kernel_table_digest=first.kernel_table_digest, shards=count, shard_commands=[r.command for r in parts])


def _summary(record: TestRecord, where: Path) -> str:
    part = f", shard {record.shard}" if record.shard else f", {record.shards} shards" if record.shards else ""
    return (f"test record ({record.device}, {record.commit_label}{part}): "
            f"{record.passed} passed, {record.failed} failed, {record.errors} errors, {record.skipped} skipped "
            f"-> {where}")


def _write(record: TestRecord, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record.to_json(), indent=2))


def merge_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m impl.bench.test_record merge",
                                 description="Merge the records of shards 1..N of one run into one record.")
    ap.add_argument("records", nargs="+", type=Path, help="the shards' record.json files, each shard once")
    ap.add_argument("--out", type=Path, required=True, help="write the merged record here (file it with --file)")
    args = ap.parse_args(argv)
    try:
        record = merge_records(args.records)
    except ValueError as exc:  # each names its file or the missing shards
        print(f"test_record: {exc}", file=sys.stderr)
        return 2
    _write(record, args.out)
    print(_summary(record, args.out))
    return 0 if record.green else 1


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["merge"]:
        return merge_main(argv[1:])
    ap = argparse.ArgumentParser(description="Turn pytest's junit XML into a test record, or file one "
                                             "(`merge A.json B.json ... --out M.json`: merge shard records).")
    ap.add_argument("junit", nargs="?", type=Path, help="pytest --junitxml output")
    ap.add_argument("--command", default="pytest correctness", help="what ran, for the record")
    ap.add_argument("--out", type=Path, help="write the record here (JSON) instead of filing it")
    ap.add_argument("--file", type=Path, help="file an existing record (e.g. one made on the GPU machine)")
    ap.add_argument("--shard", help="K/N: the junit XML is of shard K of N (pytest --shard)")
    add_repo_arguments(ap)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    if not (args.file or args.junit):
        ap.error("give a junit XML or --file RECORD.json")
    try:
        shard = None if args.shard is None else Shard.parse(args.shard)
        record = read_record(args.file) if args.file else record_from_junit(args.junit, args.command, repo.root,
                                                                            shard=shard)
        if args.file and not args.out:
            check_commit_known(record, repo.root, args.file)
        if args.out:
            _write(record, args.out)
            where = args.out
        else:
            where = store_record(record, repo.data_dir)
    except ValueError as exc:  # each names its file, the shard value or the lone shard
        print(f"test_record: {exc}", file=sys.stderr)
        return 2
    print(_summary(record, where))
    return 0 if record.green else 1


if __name__ == "__main__":
    sys.exit(main())
