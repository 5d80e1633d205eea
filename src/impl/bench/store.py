"""Benchmark histories: each run of a section is its own file, never overwritten.

    reports/data/<device slug>/<section>/<UTC timestamp>_<commit>.json

The slug names the GPU model, its memory and the GPU count (`h100-80gb-x1`, `h200-141gb-x2`;
`cpu` for any CPU), so a one-GPU run never lands beside two-GPU data. pytest writes a run's JSON
outside reports/ first (`--benchmark-json`); `python -m impl.bench.store RUN.json --section S`
then files it: atomically (a temporary file renamed into place), under a name no earlier run has,
and only if the run is whole: not interrupted (Ctrl-C, a session timeout), no failed or errored
test (the plugin records both in the JSON's `suite` block), every row's stats finite and positive,
every status known. A refused run stays where pytest wrote it (under out/) and reports/ is left as
it was. The same checks (`read_run`) are the only way run files are read, by the store, the
report's loader and the committed baseline of `--benchmark-compare`.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from impl.bench.repo import add_repo_arguments, find_repo, repo_from_args

NOT_RUNS = ("probes", "logs", "tests", "history")  # folders beside the sections that hold no runs (tests: test records)
STAT_KEYS = ("median", "mean", "min", "max")  # seconds per call: each finite and > 0 (the median required)
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")  # a device folder's name (gpu_slug, "cpu")

# GPU memory as marketed, where the device name does not say it (the H200 reports "NVIDIA H200").
_MARKETED_GB = {"h200": 141, "h100": 80, "a100": 80}


def gpu_slug(name: str, count: int, total_memory_bytes: int) -> str:
    """`NVIDIA H100 80GB HBM3`, 1 GPU → `h100-80gb-x1`; `NVIDIA H200`, 2 GPUs → `h200-141gb-x2`."""
    lowered = name.lower()
    model = next((m for m in re.findall(r"[a-z]+\d+[a-z]*", lowered) if m not in ("nvidia", "tesla")), None)
    model = model or re.sub(r"[^a-z0-9]+", "-", lowered).strip("-")
    stated = re.search(r"(\d+)\s*gb", lowered)
    gb = int(stated.group(1)) if stated else _MARKETED_GB.get(model, round(total_memory_bytes / 2**30))
    return f"{model}-{gb}gb-x{count}"


def device_slug() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(0)
    return gpu_slug(props.name, torch.cuda.device_count(), props.total_memory)


def run_stamp(doc: dict) -> str:
    """`<UTC timestamp>_<commit>` of a pytest-benchmark JSON: its `datetime` and commit_info
    (`+` marks a tree with uncommitted changes, as on the GPU machine, whose HEAD stays the
    session's first commit)."""
    when = datetime.fromisoformat(doc["datetime"]).astimezone(timezone.utc)
    info = doc.get("commit_info") or {}
    commit = (info.get("id") or "nocommit")[:8] + ("+" if info.get("dirty") else "")
    return f"{when:%Y%m%dT%H%M%SZ}_{commit}"


@dataclass(frozen=True)
class RunFile:
    device: str
    section: str
    path: Path

    @property
    def stamp(self) -> str:
        return self.path.stem


def _run_path(parts: tuple[str, ...]) -> tuple[str, str] | None:
    """(device, section) of a path `<device>/<section>/<name>.json` under the data folder, or None
    for what is not a run: probes and logs, and dot files (the store's own `.partial-*` leftovers)."""
    if len(parts) != 3 or parts[1] in NOT_RUNS or parts[2].startswith(".") or not parts[2].endswith(".json"):
        return None
    return parts[0], parts[1]


def run_files(data_dir: Path) -> list[RunFile]:
    """Every stored run, oldest first within each (device, section)."""
    out = []
    for path in sorted(data_dir.glob("*/*/*.json")):
        where = _run_path(path.relative_to(data_dir).parts)
        if where is not None:
            out.append(RunFile(*where, path))
    return out


def sections(perf_dir: Path) -> list[str]:
    """The suite's sections: one per perf/test_<section>.py."""
    return sorted(p.stem.removeprefix("test_") for p in perf_dir.glob("test_*.py"))


def check_section(section: str, perf_dir: Path) -> None:
    known = sections(perf_dir)
    if section not in known:
        raise ValueError(f"unknown section {section!r}: there is no perf/test_{section}.py (sections: {', '.join(known)})")


class BadRunFile(ValueError):
    """A run file that cannot be trusted: not JSON, not a run, or a row the report would misread."""

    def __init__(self, where: str, problems: list[str]):
        self.where, self.problems = where, problems
        super().__init__(f"{where}: {'; '.join(problems)}")


@dataclass(frozen=True)
class FailedTest:
    test: str  # pytest node id
    when: str  # setup, call or teardown: a failure outside "call" is an error


@dataclass(frozen=True)
class Suite:
    """The `suite` block the plugin writes beside pytest-benchmark's entries."""

    device_slug: str | None = None
    interrupted: bool = False
    why: str | None = None
    args: tuple[str, ...] = ()
    failed: tuple[FailedTest, ...] = field(default_factory=tuple)

    @classmethod
    def from_json(cls, doc: dict) -> Suite:
        s = doc.get("suite") or {}
        return cls(s.get("device_slug"), bool(s.get("interrupted")), s.get("why"), tuple(s.get("args") or ()),
                   tuple(FailedTest(f["test"], f["when"]) for f in s.get("failed") or ()))


def _positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _row_problem(row: dict) -> str | None:
    """Why a schema-2 row cannot be read, or None."""
    from impl.bench.row import Row, Status

    status = row.get("status")
    if status not in {s.value for s in Status}:
        return f"unknown status {status!r}"
    try:
        Row.from_json(row)
    except (KeyError, TypeError, ValueError) as exc:
        return f"unreadable row ({type(exc).__name__}: {exc})"
    return None


def run_problems(doc, section: str | None = None) -> list[str]:
    """Everything that makes `doc` (a parsed run file) untrustworthy, each naming its row; [] for a
    whole run. `section` is given when filing the run: then its rows must come from that perf file,
    and it needs a `datetime` (its file name); reading, a `datetime` is checked where there is one."""
    from impl.bench.row import SCHEMA

    if not isinstance(doc, dict):
        return [f"not a run: a JSON object is expected, found {type(doc).__name__}"]
    problems = []
    try:
        if section or "datetime" in doc:
            datetime.fromisoformat(doc["datetime"])
    except (KeyError, TypeError, ValueError):
        problems.append(f"no valid 'datetime' ({doc.get('datetime')!r})")
    if not isinstance(doc.get("commit_info") or {}, dict):
        problems.append("'commit_info' must be an object")
    benches, not_run = doc.get("benchmarks", []), doc.get("not_run", [])
    if not isinstance(benches, list) or not isinstance(not_run, list):
        return problems + ["'benchmarks' and 'not_run' must be lists"]
    if not benches and not not_run:
        problems.append("no rows")
    try:
        suite = Suite.from_json(doc)
    except (KeyError, TypeError, AttributeError) as exc:
        return problems + [f"unreadable 'suite' block ({exc!r})"]
    if suite.interrupted:
        problems.append(f"the run was interrupted ({suite.why})")
    if suite.failed:
        problems.append(f"{len(suite.failed)} tests failed or errored: "
                        + ", ".join(f"{f.test} ({f.when})" for f in suite.failed))
    file = f"test_{section}.py" if section else None
    for i, bench in enumerate(benches):
        if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
            problems.append(f"benchmark {i}: not a named benchmark entry")
            continue
        name, stats, info = bench["name"], bench.get("stats"), bench.get("extra_info") or {}
        if not isinstance(info, dict):
            problems.append(f"row {name}: 'extra_info' must be an object")
            continue
        if file and "fullname" in bench and not str(bench["fullname"]).split("::")[0].endswith(file):
            problems.append(f"row {name}: from {bench.get('fullname')!r}, not perf/{file}")
        if not isinstance(stats, dict):
            problems.append(f"row {name}: no stats")
            continue
        bad = [f"{k} {stats.get(k)!r}" for k in STAT_KEYS if (k == "median" or k in stats) and not _positive(stats.get(k))]
        if not (isinstance(stats.get("rounds"), int) and stats["rounds"] >= 1):
            bad.append(f"rounds {stats.get('rounds')!r}")
        if bad:
            problems.append(f"row {name}: stats must be finite and > 0: {', '.join(bad)}")
        if info.get("schema") == SCHEMA and (why := _row_problem(info)):
            problems.append(f"row {name}: {why}")
    for i, entry in enumerate(not_run):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("row"), dict):
            problems.append(f"not_run {i}: not a named row")
            continue
        if file and "fullname" in entry and not str(entry["fullname"]).split("::")[0].endswith(file):
            problems.append(f"row {entry['name']}: from {entry['fullname']!r}, not perf/{file}")
        if why := _row_problem(entry["row"]):
            problems.append(f"row {entry['name']}: {why}")
    return problems


def parse_run(text: str, where: str, section: str | None = None) -> dict:
    """A run file's text → its document; BadRunFile naming `where` and each problem otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRunFile(where, ["empty file" if not text.strip() else f"not JSON (truncated?): {exc}"]) from None
    problems = run_problems(doc, section)
    if problems:
        raise BadRunFile(where, problems)
    return doc


def read_run(path: Path, section: str | None = None) -> dict:
    """The one reader of run files (the store, the report's loader, the committed baseline)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise BadRunFile(str(path), [f"unreadable: {exc}"]) from None
    return parse_run(text, str(path), section)


def free_name(folder: Path, stamp: str) -> Path:
    """`<stamp>.json` in folder, or where taken `<stamp>_2.json`, `_3`...: each sorts after the one
    before it, so the later file reads as the newer (a `-2` suffix would sort before)."""
    path, n = folder / f"{stamp}.json", 1
    while path.exists():
        n += 1
        path = folder / f"{stamp}_{n}.json"
    return path


def write_atomically(dest: Path, doc: dict) -> None:
    """A reader sees the whole file or none: written beside dest as `.partial-*` (which run_files
    skips), then renamed; the partial file is removed if writing fails."""
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".partial-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=2)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _filed_before(folder: Path, stamp: str, doc: dict) -> Path | None:
    """The file that already holds this run (same start time, to the microsecond), if any."""
    for path in sorted(folder.glob(f"{stamp}*.json")):
        try:
            if json.loads(path.read_text()).get("datetime") == doc.get("datetime"):
                return path
        except (OSError, ValueError, AttributeError):
            continue
    return None


def store_run(run_json: Path, section: str, data_dir: Path, device: str | None = None,
              perf_dir: Path | None = None) -> Path:
    """File one finished run; returns its new path. Raises ValueError (naming the run and what is
    wrong) for an unknown section (perf_dir's; default: the repository run in) or device, a run
    that is not whole (read_run) or one filed before, leaving data_dir untouched."""
    check_section(section, perf_dir or find_repo().perf_dir)
    doc = read_run(run_json, section)
    device = device or Suite.from_json(doc).device_slug or device_slug()
    if not _SLUG.fullmatch(device):
        raise ValueError(f"{run_json}: device {device!r} is not a device folder name (like h100-80gb-x1 or cpu)")
    folder = data_dir / device / section
    if not folder.resolve().is_relative_to(data_dir.resolve()):  # belt and braces: names are checked above
        raise ValueError(f"{run_json}: {folder} is outside {data_dir}")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = run_stamp(doc)
    if (before := _filed_before(folder, stamp, doc)) is not None:
        raise ValueError(f"{run_json}: the same run is already stored as {before}")
    dest = free_name(folder, stamp)
    write_atomically(dest, doc)
    return dest


@dataclass
class Baseline:
    """What `--benchmark-compare` compares with: one pytest-benchmark JSON (None when nothing is
    stored), where it was read from, and the files left out, each with why."""

    doc: dict | None
    source: str
    skipped: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CommittedFile:
    parts: tuple[str, ...]  # the path under the data folder: <device>/<section>/<name>.json for a run
    text: str


def committed_files(data_dir: Path) -> tuple[list[CommittedFile], str]:
    """(every file under data_dir as git's HEAD has it, sorted; where they were read from). Where
    data_dir is not in a git checkout with a HEAD, the working tree, and the source says so."""
    def git(where: Path, *args: str, stdin: bytes | None = None) -> bytes:
        return subprocess.run(["git", "-C", str(where), *args], input=stdin, capture_output=True,
                              check=True).stdout

    try:
        top = Path(git(data_dir, "rev-parse", "--show-toplevel").decode().strip())
        rel = data_dir.resolve().relative_to(top.resolve()).as_posix()
        names = git(top, "ls-tree", "-r", "--name-only", "-z", "HEAD", "--", rel).decode().split("\0")
    except (OSError, subprocess.CalledProcessError, ValueError):
        files = sorted(data_dir.glob("*/*/*.json"))
        return ([CommittedFile(p.relative_to(data_dir).parts, p.read_text(errors="replace")) for p in files],
                f"{data_dir} (the working tree: not a git checkout with a HEAD)")
    names = sorted(n for n in names if n)
    # one `git cat-file --batch` for all files: its output is "<sha> blob <size>\n<bytes>\n" each
    out = git(top, "cat-file", "--batch", stdin="".join(f"HEAD:{n}\n" for n in names).encode())
    files, pos = [], 0
    for n in names:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        files.append(CommittedFile(Path(n).relative_to(rel).parts,
                                   out[header_end + 1:header_end + 1 + size].decode(errors="replace")))
        pos = header_end + 1 + size + 1
    return files, f"git HEAD:{rel}"


def committed_runs(device: str, data_dir: Path) -> tuple[list[tuple[RunFile, dict]], list[str], str]:
    """(the committed runs of `device`, oldest first within a section, as (file, document); the
    files skipped as not whole runs, each named with why; where they were read from)."""
    files, source = committed_files(data_dir)
    runs, skipped = [], []
    for f in files:
        where = _run_path(f.parts)
        if where is None or where[0] != device:
            continue
        try:
            runs.append((RunFile(*where, data_dir.joinpath(*f.parts)), parse_run(f.text, "/".join(f.parts))))
        except BadRunFile as exc:
            skipped.append(str(exc))
    return runs, skipped, source


def committed_baseline(device: str, data_dir: Path) -> Baseline:
    """For every row stored for `device` in the committed runs (git's HEAD, never the working tree,
    so an unfiled or uncommitted run is no baseline), its newest schema-2 measurement: what `pytest
    perf --benchmark-compare` compares with (impl.bench.plugin). Older-format rows are left out:
    their stats timed a placeholder round. A file that is not a whole run is skipped and named."""
    from impl.bench.row import SCHEMA

    runs, skipped, source = committed_runs(device, data_dir)
    newest: dict[str, dict] = {}
    head = None
    for _, doc in runs:
        for bench in doc["benchmarks"]:
            if (bench.get("extra_info") or {}).get("schema") == SCHEMA and bench.get("fullname"):
                newest[bench["fullname"]] = bench
                head = doc
    if head is None:
        return Baseline(None, source, skipped)
    return Baseline(dict(head, benchmarks=sorted(newest.values(), key=lambda b: b["fullname"]), not_run=[]),
                    source, skipped)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON of finished runs")
    ap.add_argument("--section", help="section name (default: the JSON file's stem up to its first '-')")
    ap.add_argument("--device", help="device slug (default: the run's own)")
    add_repo_arguments(ap)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    status = 0
    for run in args.runs:
        try:
            dest = store_run(run, args.section or run.stem.split("-")[0], repo.data_dir, args.device, repo.perf_dir)
            print(f"stored {run} -> {dest}")
        except ValueError as exc:  # BadRunFile included: it names the file and each row
            print(f"store: {exc}; not stored", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
