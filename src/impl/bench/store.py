"""Benchmark histories: each run of a section is its own file, never overwritten.

    reports/data/<device slug>/<section>/<UTC timestamp>_<commit>.json.gz

The slug names the GPU model, its memory and the GPU count (`h100-80gb-x1`, `h200-141gb-x2`;
`cpu` for any CPU), so a one-GPU run never lands beside two-GPU data. pytest writes a run's JSON
outside reports/ first (`--benchmark-json`); `python -m impl.bench.store RUN.json --section S`
then files it: written whole beside its name, then linked to a name no other file has (two stores
at once never share one), world-readable like the committed files, and only if the run is whole
and belongs there: not interrupted (Ctrl-C, a session timeout), no failed or errored test (the
plugin records both in the JSON's `suite` block), every status known, every number one that can
be (stats finite and positive; metrics, memory, peaks and counts finite and >= 0), its rows
those of perf/test_<S>.py, its device the folder's (the suite block's slug and the rows'
env.device_type), and not filed before. A refused run stays where pytest wrote it (under out/) and
reports/ is left as it was. The same checks (`read_run`, given the folder's section and
device) are the only way run files are read, by the store, the report's loader, the gate and the
committed baseline of `--benchmark-compare`.

A run is stored gzip-compressed (`.json.gz`, the same bytes for the same run: encode_run); runs filed
before that are plain `.json` until `python -m impl.bench.store compress` packs them in place (each
checked to unpack to its file's exact bytes). read_run_text reads either; one run in both forms is an
error naming both files, never a silent pick.
"""
from __future__ import annotations

import argparse
import glob
import gzip
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from impl.bench.repo import add_repo_arguments, find_repo, repo_from_args

NOT_RUNS = ("probes", "logs", "tests", "history", "repeats")  # folders beside the sections that hold no runs
# (tests: test records; repeats: impl.bench.repeat's summaries)
STAT_KEYS = ("median", "mean", "min", "max")  # seconds per call: each finite and > 0 (the median required)
_SLUG = re.compile(r"[a-z0-9][a-z0-9-]*")  # a device folder's name (gpu_slug, "cpu")
PLAIN, PACKED = ".json", ".json.gz"  # a stored run's name ends in one: plain (filed before packing), gzip
GZIP_LEVEL = 9  # fixed, with mtime 0 and no file name in the header: one run text, one file's bytes

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


def sent_commit(info: dict, suite_commit: str | None) -> dict:
    """pytest-benchmark's commit_info as a run should record it. On a GPU machine the checkout's git
    HEAD is the session's first commit and the tree is whatever was sent since (HEAD + dirty), so
    when SUITE_COMMIT names the commit whose tree was sent, that is the run's commit (not dirty)."""
    if not suite_commit:
        return info
    return dict(info, id=suite_commit, dirty=False, source="SUITE_COMMIT", git_head=info.get("id"))


def git_output(where: Path, *args: str) -> str | None:
    """`git -C where ARGS`'s stdout, stripped; None where git fails, is missing or takes over 30 s."""
    try:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def commit_unknown(where: Path, commit: str | None) -> bool:
    """True when `where` is in a git clone that has no commit `commit` (None, or a mistyped SUITE_COMMIT: a result
    filed for code nobody can check out); False where it names one, or outside a clone, where nothing can be
    checked. `where` need not exist yet (a data folder about to be made): its nearest existing folder is asked."""
    where = next(p for p in (Path(where).absolute(), *Path(where).absolute().parents) if p.is_dir())
    if git_output(where, "rev-parse", "--git-dir") is None:
        return False
    return commit is None or git_output(where, "cat-file", "-t", f"{commit}^{{commit}}") != "commit"


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
        return run_stem(self.path)


def run_stem(path: str | Path) -> str | None:
    """`<stamp>` of a run file's name `<stamp>.json.gz` or `<stamp>.json`; None for another name."""
    name = Path(path).name
    suffix = next((s for s in (PACKED, PLAIN) if name.endswith(s)), None)
    return name[:-len(suffix)] if suffix and len(name) > len(suffix) else None


def twin(path: Path) -> Path:
    """The other form's name of a run file: X.json for X.json.gz and X.json.gz for X.json."""
    return path.with_name(path.name.removesuffix(".gz") if path.name.endswith(PACKED) else path.name + ".gz")


def _both_forms(path: Path) -> BadRunFile:
    return BadRunFile(str(path), [f"one run name in both forms, {path.name} and {twin(path).name}: "
                                  "keep the one that is whole and remove the other"])


def _run_path(parts: tuple[str, ...]) -> tuple[str, str] | None:
    """(device, section) of a path `<device>/<section>/<name>.json[.gz]` under the data folder, or
    None for what is not a run: probes and logs, and dot files (the store's own `.partial-*` leftovers)."""
    if len(parts) != 3 or parts[1] in NOT_RUNS or parts[2].startswith(".") or run_stem(parts[2]) is None:
        return None
    return parts[0], parts[1]


def run_files(data_dir: Path) -> list[RunFile]:
    """Every stored run file, either form, oldest first within each (device, section); both forms of
    one name are listed (read_run_text refuses each, naming both)."""
    found = (RunFile(*where, path) for path in data_dir.glob("*/*/*")
             if (where := _run_path(path.relative_to(data_dir).parts)) is not None and path.is_file())
    return sorted(found, key=lambda rf: (rf.device, rf.section, rf.stamp, rf.path.name))


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


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _positive(v) -> bool:
    return _real(v) and math.isfinite(v) and v > 0


def _bad(field_name: str, v, *, least: int = 0, whole: bool = False, optional: bool = False) -> str | None:
    """`field_name v` where v is not a finite number >= least (a whole one if `whole`; None allowed
    if `optional`), else None."""
    if v is None and optional:
        return None
    number = (isinstance(v, int) and not isinstance(v, bool)) if whole else (_real(v) and math.isfinite(v))
    if number and v >= least:
        return None
    return f"{field_name} {v!r} is not a {'whole' if whole else 'finite'} number >= {least}"


def _non_finite(x, where: str):
    """(path, value) of every NaN or infinity in a JSON payload."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from _non_finite(v, f"{where}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from _non_finite(v, f"{where}[{i}]")
    elif isinstance(x, float) and not math.isfinite(x):
        yield where, x


def row_number_problems(row) -> list[str]:
    """Each number of a row (impl.bench.row.Row) that cannot be, naming its field. Metrics are
    counts, rates, shares and times; memory is bytes; peaks are FLOP rates; timing counts rounds:
    none can be negative or non-finite. `details` are section payloads that hold signed figures (a
    backward pass's memory change, a saving, a host gap, -1 for none): there only NaN and infinity
    are refused."""
    from impl.bench.row import Metric

    found = [_bad(f"metrics.{Metric(m).value}", v) for m, v in row.metrics.items()]
    found += [_bad(f"memory.{k}", v, optional=True) for k, v in vars(row.memory).items()]
    if row.peaks is not None:
        found += [_bad("peaks.measured_flops", row.peaks.measured_flops, least=1),
                  _bad("peaks.datasheet_flops", row.peaks.datasheet_flops, least=1, optional=True)]
    if row.timing is not None:
        found += [_bad("timing.warmup_rounds", row.timing.warmup_rounds, whole=True),
                  _bad("timing.rounds", row.timing.rounds, least=1, whole=True),
                  _bad("timing.iterations", row.timing.iterations, least=1, whole=True)]
    found += [f"{where} {v!r} is not finite" for where, v in _non_finite(row.details, "details")]
    return [f for f in found if f]


def _row_problems(row: dict) -> list[str]:
    """Why a schema-2 row cannot be read or cannot be true; [] for a good one."""
    from impl.bench.row import Row, Status

    status = row.get("status")
    if status not in {s.value for s in Status}:
        return [f"unknown status {status!r}"]
    try:
        return row_number_problems(Row.from_json(row))
    except (KeyError, TypeError, ValueError) as exc:
        return [f"unreadable row ({type(exc).__name__}: {exc})"]


def _stats_problems(stats: dict) -> list[str]:
    """pytest-benchmark's stats: the times per call finite and > 0 (the median required), at least
    one round, and every other figure (spreads, quartiles, outlier counts, ops, the raw rounds)
    finite and >= 0."""
    bad = [f"{k} {stats.get(k)!r}" for k in STAT_KEYS if (k == "median" or k in stats) and not _positive(stats.get(k))]
    if not (isinstance(stats.get("rounds"), int) and stats["rounds"] >= 1):
        bad.append(f"rounds {stats.get('rounds')!r}")
    out = [f"stats must be finite and > 0: {', '.join(bad)}"] if bad else []
    others = [(k, v) for k, v in stats.items() if k not in (*STAT_KEYS, "rounds", "data") and _real(v)]
    data = stats.get("data")
    others += [(f"data[{i}]", v) for i, v in enumerate(data)] if isinstance(data, list) else []
    if bad_others := [f"{k} {v!r}" for k, v in others if _bad(k, v)]:
        out.append(f"stats must be finite and >= 0: {', '.join(bad_others)}")
    return out


def _section_problem(entry: dict, section: str) -> str | None:
    """A row that names its test file (pytest's fullname `perf/test_<section>.py::test[...]`) must
    name this section's; a hand-made name without one says nothing."""
    fullname = str(entry.get("fullname", ""))
    if "::" in fullname and not fullname.split("::")[0].endswith(f"test_{section}.py"):
        return f"row {entry['name']}: from {fullname!r}, not perf/test_{section}.py"
    return None


def _suite_problems(doc: dict) -> list[str]:
    try:
        suite = Suite.from_json(doc)
    except (KeyError, TypeError, AttributeError) as exc:
        return [f"unreadable 'suite' block ({exc!r})"]
    problems = [f"the run was interrupted ({suite.why})"] if suite.interrupted else []
    if suite.failed:
        problems.append(f"{len(suite.failed)} tests failed or errored: "
                        + ", ".join(f"{f.test} ({f.when})" for f in suite.failed))
    return problems


def _bench_problems(bench, i: int) -> list[str]:
    """One pytest-benchmark entry: named, its stats sane, its row (schema 2) readable and true."""
    from impl.bench.row import SCHEMA

    if not isinstance(bench, dict) or not isinstance(bench.get("name"), str):
        return [f"benchmark {i}: not a named benchmark entry"]
    name, stats, info = bench["name"], bench.get("stats"), bench.get("extra_info") or {}
    if not isinstance(info, dict):
        return [f"row {name}: 'extra_info' must be an object"]
    if not isinstance(stats, dict):
        return [f"row {name}: no stats"]
    problems = [f"row {name}: {p}" for p in _stats_problems(stats)]
    if info.get("schema") == SCHEMA:
        problems += [f"row {name}: {p}" for p in _row_problems(info)]
    return problems


def _not_run_problems(entry, i: int) -> list[str]:
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not isinstance(entry.get("row"), dict):
        return [f"not_run {i}: not a named row"]
    return [f"row {entry['name']}: {p}" for p in _row_problems(entry["row"])]


def _row_kinds(doc: dict) -> list[tuple[str, str | None, bool]]:
    """(name, env.device_type, whether it is a schema-2 row) of each row of a whole run."""
    from impl.bench.row import SCHEMA

    rows = [(b["name"], b.get("extra_info") or {}) for b in doc["benchmarks"]]
    rows += [(e["name"], e["row"]) for e in doc.get("not_run", [])]
    out = []
    for name, info in rows:
        env = info.get("env") if isinstance(info.get("env"), dict) else {}
        out.append((name, env.get("device_type"), info.get("schema") == SCHEMA))
    return out


def device_problems(doc: dict, device: str) -> list[str]:
    """Why a whole run does not belong under `device`'s folder: its own device slug (the suite
    block's) is another, or its rows ran on another kind of device (env.device_type: `cpu` for
    the cpu folder, `cuda` for a GPU's)."""
    own = Suite.from_json(doc).device_slug
    problems = [f"the run's own device is {own!r}, not {device!r}"] if own and own != device else []
    want = "cpu" if device == "cpu" else "cuda"
    kinds = _row_kinds(doc)
    problems += [f"row {name}: env.device_type {kind!r}, where a {device} run's is {want!r}"
                 for name, kind, current in kinds if current and kind != want]
    # an older-format file recorded a GPU run's host-side rows (distributed_communication's fits)
    # with the host's env: it ran on the GPU when any row did (a row without an env tells nothing)
    older = {kind for _, kind, current in kinds if not current and kind is not None}
    if older and ("cuda" if "cuda" in older else "cpu") != want:
        problems.append(f"its rows' env.device_type {', '.join(sorted(map(repr, older)))}, where a {device} run's is {want!r}")
    return problems


def run_problems(doc, section: str | None = None, device: str | None = None) -> list[str]:
    """Everything that makes `doc` (a parsed run file) untrustworthy, each naming its row; [] for a
    whole run. `section` and `device` are where the run is filed or found: then its rows must come
    from that perf file and that device (device_problems), and it needs a `datetime` (its file
    name, its identity); otherwise a `datetime` is checked where there is one."""
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
    problems += _suite_problems(doc)
    for i, bench in enumerate(benches):
        problems += _bench_problems(bench, i)
    for i, entry in enumerate(not_run):
        problems += _not_run_problems(entry, i)
    if problems:  # where a row cannot be read, neither can its section or device
        return problems
    if section:
        problems += [p for e in benches + not_run if (p := _section_problem(e, section))]
    return problems + (device_problems(doc, device) if device else [])


def run_identity(doc: dict) -> str | None:
    """What tells one run from another: its start time to the microsecond (pytest-benchmark's
    `datetime`). Two files with one are copies of one run."""
    return doc.get("datetime")


def parse_run(text: str, where: str, section: str | None = None, device: str | None = None) -> dict:
    """A run file's text → its document; BadRunFile naming `where` and each problem otherwise."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRunFile(where, ["empty file" if not text.strip() else f"not JSON (truncated?): {exc}"]) from None
    problems = run_problems(doc, section, device)
    if problems:
        raise BadRunFile(where, problems)
    return doc


def encode_run(text: bytes) -> bytes:
    """A run file's bytes as stored: gzip at GZIP_LEVEL with a header of its own (no file name, mtime 0,
    OS "unknown": gzip.compress's varies with the Python version and the OS), so the same run gives
    the same bytes (with one zlib)."""
    packer = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)  # a raw deflate stream
    header = bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 2 if GZIP_LEVEL == 9 else 0, 0xFF])  # XFL 2: the best level
    return header + packer.compress(text) + packer.flush() + struct.pack("<II", zlib.crc32(text), len(text) % 2**32)


def decode_run(raw: bytes, where: str) -> str:
    """A run file's bytes -> its JSON text, unpacked where `where` ends in .gz; BadRunFile naming it
    for a .gz that is not whole gzip (truncated, corrupt) or text that is not UTF-8."""
    try:
        return (gzip.decompress(raw) if where.endswith(".gz") else raw).decode()
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:  # BadGzipFile is an OSError
        raise BadRunFile(where, [f"unreadable ({type(exc).__name__}: {exc})"]) from None


def read_run_text(path: Path) -> str:
    """The one reader of a run file's text, either form (`.json`, `.json.gz`). BadRunFile naming
    the file where it cannot be read and, for a run name, where its other form lies beside it
    (both named: neither is picked)."""
    if run_stem(path) is not None and twin(path).exists():
        raise _both_forms(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadRunFile(str(path), [f"unreadable: {exc}"]) from None
    return decode_run(raw, str(path))


def read_run(path: Path, section: str | None = None, device: str | None = None) -> dict:
    """The one reader of run files (the store, the report's loader, the gate, the committed
    baseline), either form; `section` and `device` where the file is filed or found."""
    return parse_run(read_run_text(path), str(path), section, device)


def _json_bytes(doc: dict) -> bytes:
    return json.dumps(doc, indent=2).encode()


def _write_partial(folder: Path, data: bytes) -> Path:
    """data written whole beside its final name as `.partial-*` (which run_files skips), readable by
    all like the committed files (mkstemp makes it 0600); removed if writing fails."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".partial-")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return Path(tmp)


def write_atomically(dest: Path, doc: dict) -> None:
    """Replaces dest, a reader seeing the old file or the whole new one: for what is rewritten on
    purpose (--benchmark-compare's baseline); runs and records are filed by write_new."""
    tmp = _write_partial(dest.parent, _json_bytes(doc))
    try:
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)


def _claim_number(path: Path, stamp: str) -> int | None:
    """n of a name write_new claims: 1 for `<stamp>.json[.gz]`, n for `<stamp>_<n>.json[.gz]`, else None."""
    stem = run_stem(path)
    if stem is None or not stem.startswith(stamp):
        return None
    rest = stem[len(stamp):]
    if not rest:
        return 1
    return int(rest[1:]) if rest[0] == "_" and rest[1:].isdigit() else None


def _link_new(tmp: Path, folder: Path, stamp: str, suffix: str) -> Path:
    """Links tmp to the first free name `<stamp><suffix>`, `<stamp>_2<suffix>`...: a link fails where
    the name exists, so two writers at once never share a file; a name whose other form (twin) is
    there is taken too."""
    n = 1
    while True:
        dest = folder / (f"{stamp}{suffix}" if n == 1 else f"{stamp}_{n}{suffix}")
        try:
            if not twin(dest).exists():
                os.link(tmp, dest)
                return dest
        except FileExistsError:
            pass
        n += 1


def write_new(folder: Path, stamp: str, doc: dict, packed: bool = False) -> Path:
    """Writes doc as a new file, `<stamp>.json` (`.json.gz` if packed: encode_run) or where taken
    `<stamp>_2.json`, `_3`..., and returns it. The file is written whole first, then hard-linked to
    the name (a rename would silently replace another writer's), so a reader never sees a partial one."""
    tmp = _write_partial(folder, encode_run(_json_bytes(doc)) if packed else _json_bytes(doc))
    try:
        return _link_new(tmp, folder, stamp, PACKED if packed else PLAIN)
    finally:
        tmp.unlink(missing_ok=True)


def _filed_before(dest: Path, stamp: str, doc: dict) -> Path | None:
    """A file claimed before dest that holds the same run (run_identity), if any, in either form.
    Only earlier claims count: of two stores of one run at once, the first claim stays and the
    second yields."""
    mine = _claim_number(dest, stamp)
    for path in sorted(dest.parent.glob(f"{glob.escape(stamp)}*")):
        n = _claim_number(path, stamp)
        if n is None or n >= mine:
            continue
        try:
            if run_identity(json.loads(read_run_text(path))) == run_identity(doc):
                return path
        except (ValueError, AttributeError):  # BadRunFile and JSONDecodeError are ValueErrors
            continue
    return None


def store_run(run_json: Path, section: str, data_dir: Path, device: str | None = None,
              perf_dir: Path | None = None) -> Path:
    """File one finished run; returns its new path. Raises ValueError (naming the run and what is
    wrong) for an unknown section (perf_dir's; default: the repository run in) or device, a run
    that is not whole (read_run), one that is not from `device` (device_problems: the device given
    against the run's own), one whose SUITE_COMMIT this repository lacks (commit_unknown) or one filed
    before, leaving data_dir as it was."""
    check_section(section, perf_dir or find_repo().perf_dir)
    doc = read_run(run_json, section)
    device = device or Suite.from_json(doc).device_slug or device_slug()
    if not _SLUG.fullmatch(device):
        raise ValueError(f"{run_json}: device {device!r} is not a device folder name (like h100-80gb-x1 or cpu)")
    if problems := device_problems(doc, device):
        raise BadRunFile(str(run_json), problems)
    info = doc.get("commit_info") or {}
    if info.get("source") == "SUITE_COMMIT" and commit_unknown(data_dir, info.get("id")):
        raise ValueError(f"{run_json}: its SUITE_COMMIT {info.get('id')!r} is not a commit of the repository holding "
                         f"{data_dir} (mistyped?); the run is not filed")
    folder = data_dir / device / section
    if not folder.resolve().is_relative_to(data_dir.resolve()):  # belt and braces: names are checked above
        raise ValueError(f"{run_json}: {folder} is outside {data_dir}")
    folder.mkdir(parents=True, exist_ok=True)
    stamp = run_stamp(doc)
    dest = write_new(folder, stamp, doc, packed=True)
    if (before := _filed_before(dest, stamp, doc)) is not None:
        dest.unlink()
        raise ValueError(f"{run_json}: the same run is already stored as {before}")
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
    parts: tuple[str, ...]  # the path under the data folder: <device>/<section>/<name>.json[.gz] for a run
    data: bytes  # as stored (decode_run gives a run's text)


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
        files = [rf.path for rf in run_files(data_dir)]
        return ([CommittedFile(p.relative_to(data_dir).parts, p.read_bytes()) for p in files],
                f"{data_dir} (the working tree: not a git checkout with a HEAD)")
    names = sorted(n for n in names if n)
    # one `git cat-file --batch` for all files: its output is "<sha> blob <size>\n<bytes>\n" each
    out = git(top, "cat-file", "--batch", stdin="".join(f"HEAD:{n}\n" for n in names).encode())
    files, pos = [], 0
    for n in names:
        header_end = out.index(b"\n", pos)
        size = int(out[pos:header_end].split()[2])
        files.append(CommittedFile(Path(n).relative_to(rel).parts, out[header_end + 1:header_end + 1 + size]))
        pos = header_end + 1 + size + 1
    return files, f"git HEAD:{rel}"


def committed_runs(device: str, data_dir: Path) -> tuple[list[tuple[RunFile, dict]], list[str], str]:
    """(the committed runs of `device`, oldest first within a section, as (file, document); the
    files skipped as not whole runs, each named with why; where they were read from)."""
    files, source = committed_files(data_dir)
    names = {f.parts for f in files}
    runs, skipped = [], []
    for f in files:
        where = _run_path(f.parts)
        if where is None or where[0] != device:
            continue
        name = "/".join(f.parts)
        try:
            if (*f.parts[:-1], twin(Path(f.parts[-1])).name) in names:
                raise _both_forms(Path(name))
            runs.append((RunFile(*where, data_dir.joinpath(*f.parts)),
                         parse_run(decode_run(f.data, name), name, section=where[1], device=where[0])))
        except BadRunFile as exc:
            skipped.append(str(exc))
    runs.sort(key=lambda run: (run[0].section, run[0].stamp))  # oldest first, whatever the files' forms
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


@dataclass(frozen=True)
class Packed:
    """One run file compress_runs packed (or, in a dry run, would pack): its path and sizes."""

    path: Path  # the plain file it was
    before: int  # bytes
    after: int


def pack_file(path: Path) -> Path:
    """Packs one plain run file in place as `<name>.gz` (encode_run of its exact bytes) and removes the
    original; ValueError naming it, with the original left as it was, where the packed file is there
    already or does not unpack to the original's exact bytes (read back from disk before anything is
    removed)."""
    if twin(path).exists():
        raise _both_forms(path)
    raw = path.read_bytes()
    tmp = _write_partial(path.parent, encode_run(raw))
    try:
        if (back := gzip.decompress(tmp.read_bytes())) != raw:
            raise ValueError(f"{path}: its packed copy unpacks to {len(back)} bytes that differ from the file's "
                             f"{len(raw)}; left as it was")
        os.link(tmp, twin(path))  # fails where the name exists: nothing is replaced
    finally:
        tmp.unlink(missing_ok=True)
    path.unlink()
    return twin(path)


def compress_runs(data_dir: Path, min_bytes: int = 0, dry_run: bool = False) -> list[Packed]:
    """Every plain run file (run_files: the sections' folders only, never probes, logs, tests or
    repeats) of at least min_bytes packed in place by pack_file, or in a dry run only sized."""
    done = []
    for rf in run_files(data_dir):
        if rf.path.name.endswith(PACKED) or (size := rf.path.stat().st_size) < min_bytes:
            continue
        after = len(encode_run(rf.path.read_bytes())) if dry_run else pack_file(rf.path).stat().st_size
        done.append(Packed(rf.path, size, after))
    return done


def compress_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m impl.bench.store compress",
                                 description="Pack the stored plain .json runs in place as .json.gz, each checked "
                                             "to unpack to its file's exact bytes before the file is removed.")
    ap.add_argument("--min-kib", type=float, default=0.0, help="only files of at least this many KiB (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print what would be packed and its sizes; change nothing")
    add_repo_arguments(ap)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    try:
        done = compress_runs(repo.data_dir, int(args.min_kib * 1024), args.dry_run)
    except ValueError as exc:  # BadRunFile included: each names its file; those packed before it stay packed
        print(f"store compress: {exc}", file=sys.stderr)
        return 1
    verb = "would pack" if args.dry_run else "packed"
    for p in done:
        print(f"{verb} {p.path.relative_to(repo.data_dir)}: {p.before / 1024:.1f} -> {p.after / 1024:.1f} KiB")
    before, after = sum(p.before for p in done), sum(p.after for p in done)
    print(f"store compress: {verb} {len(done)} runs, {before / 2**20:.2f} -> {after / 2**20:.2f} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compress"]:
        return compress_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] + " (`compress`: pack the plain "
                                 "stored runs in place; `compress --help`)")
    ap.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON of finished runs")
    ap.add_argument("--section", help="section name (default: the JSON file's stem up to its first '-')")
    ap.add_argument("--device", help="device slug (default: the run's own)")
    add_repo_arguments(ap)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    status = 0
    for run in args.runs:
        try:
            section = args.section or (run_stem(run) or run.stem).split("-")[0]
            dest = store_run(run, section, repo.data_dir, args.device, repo.perf_dir)
            print(f"stored {run} -> {dest}")
        except ValueError as exc:  # BadRunFile included: it names the file and each row
            print(f"store: {exc}; not stored", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
