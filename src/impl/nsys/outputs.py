"""Where a case's nsys outputs lie, the run's manifest, and the packing into the few files the
device tool returns (at most 8 files of 16 MiB, 64 MiB in all, names of letters, digits, '.', '_',
'-').

A run writes under $OUT/nsys/: manifest.json, log.txt and parts nsys-1.tar, nsys-2.tar, ... Each
part holds whole files: per case NAME.nsys-rep (the GUI's file), NAME.sqlite.gz (the trimmed
export), NAME_<report>.csv (nsys stats) and NAME.result.json (what the workload ran). Files are
packed in the order given (CSVs and results first, then exports, then .nsys-rep); one that does not
fit is left out and named in the manifest, never silently dropped.

A part the device did not return (it returns at most 8 files; other files in $OUT take slots) loses
the files it held: `unpack` then refuses, naming every case's lost files, unless `partial` is set,
when it extracts the parts that came and returns the same list.

  python -m impl.nsys.outputs unpack DIR DEST [--partial]   # on the CPU machine: the parts of DIR into DEST
"""
from __future__ import annotations

import gzip
import json
import shutil
import sys
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from impl.nsys.tables import NsysOutputError

REPORTS = ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")
MANIFEST = "manifest.json"
PART_BYTES = 15 * 2**20  # under the device's 16 MiB a file
MAX_PARTS = 6  # with manifest.json and log.txt: the device's 8 files
TOTAL_BYTES = 60 * 2**20  # under its 64 MiB in all


@dataclass(frozen=True)
class CaseFiles:
    """The outputs of case `name` in folder `root`."""

    root: Path
    name: str

    @property
    def rep(self) -> Path:
        return self.root / f"{self.name}.nsys-rep"

    @property
    def sqlite(self) -> Path:
        return self.root / f"{self.name}.sqlite"

    @property
    def sqlite_gz(self) -> Path:
        return self.root / f"{self.name}.sqlite.gz"

    @property
    def result(self) -> Path:
        return self.root / f"{self.name}.result.json"

    def csv(self, report: str) -> Path:
        """`nsys stats --output ROOT/NAME` writes ROOT/NAME_<report>.csv."""
        return self.root / f"{self.name}_{report}.csv"


@dataclass(frozen=True)
class CaseRecord:
    """One case of a run: `status` is profiled, oom (the workload ran out of memory: a result),
    failed (message says why), or left_out_by_budget."""

    name: str
    group: str
    status: str
    seconds: float = 0.0
    message: str | None = None
    reports: tuple[str, ...] = ()  # the stats CSVs written
    sqlite: bool = False
    rep: bool = False
    workload: dict = field(default_factory=dict)  # the workload's result JSON


@dataclass(frozen=True)
class Manifest:
    nsys_version: str
    device: str
    commit: str
    started_utc: str
    cases: tuple[CaseRecord, ...]
    parts: tuple[str, ...] = ()
    left_out_files: tuple[str, ...] = ()  # too large for the device's limits

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def read_manifest(path: Path) -> Manifest:
    path = Path(path)
    if not path.is_file():
        raise NsysOutputError(f"{path}: no such file (impl.nsys.run writes it beside the parts)")
    try:
        data = json.loads(path.read_text())
        cases = tuple(CaseRecord(**dict(c, reports=tuple(c.get("reports", ())))) for c in data.pop("cases"))
        return Manifest(**dict(data, cases=cases, parts=tuple(data.get("parts", ())),
                               left_out_files=tuple(data.get("left_out_files", ()))))
    except (ValueError, KeyError, TypeError) as exc:
        raise NsysOutputError(f"{path}: not an nsys run manifest ({exc})") from None


def gzip_file(path: Path) -> Path:
    """PATH.gz beside PATH (which is removed)."""
    out = path.with_name(path.name + ".gz")
    with open(path, "rb") as src, gzip.open(out, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    path.unlink()
    return out


def _tar_bytes(size: int) -> int:
    return 512 + (size + 511) // 512 * 512  # a header block and the data rounded to blocks


def plan_parts(files: list[Path], part_bytes: int = PART_BYTES, max_parts: int = MAX_PARTS,
               total_bytes: int = TOTAL_BYTES) -> tuple[list[list[Path]], list[Path]]:
    """(parts, left out): `files` in order into at most `max_parts` tar parts of at most
    `part_bytes` each and `total_bytes` together; a file that fits no part is left out."""
    parts: list[list[Path]] = []
    sizes: list[int] = []
    left: list[Path] = []
    used = 0
    for f in files:
        n = _tar_bytes(f.stat().st_size)
        slot = next((i for i, s in enumerate(sizes) if s + n + 1024 <= part_bytes), None)  # 1024: tar's end blocks
        if used + n > total_bytes or (slot is None and (len(parts) >= max_parts or n + 1024 > part_bytes)):
            left.append(f)
            continue
        if slot is None:
            parts.append([])
            sizes.append(0)
            slot = len(parts) - 1
        parts[slot].append(f)
        sizes[slot] += n
        used += n
    return parts, left


def write_parts(files: list[Path], out_dir: Path, stem: str = "nsys",
                max_parts: int = MAX_PARTS) -> tuple[list[str], list[str]]:
    """Pack `files` into out_dir/STEM-i.tar (replacing earlier parts); (part names, left-out names).
    `max_parts`: fewer where other files of the same device call take some of its 8 returned files (on
    2026-11-26 the third part of 3 did not come back for that reason)."""
    for old in out_dir.glob(f"{stem}-*.tar"):
        old.unlink()
    parts, left = plan_parts(files, max_parts=max_parts)
    names = []
    for i, members in enumerate(parts, start=1):
        name = f"{stem}-{i}.tar"
        with tarfile.open(out_dir / name, "w") as tar:
            for f in members:
                tar.add(f, arcname=f.name)
        names.append(name)
    return names, [f.name for f in left]


def expected_files(case: CaseRecord) -> list[str]:
    """The file names a case wrote into the parts, as its manifest record says (the .log beside them is not
    recorded): its stats CSVs, its workload's result, its export and its report."""
    files = CaseFiles(Path("."), case.name)
    names = [files.csv(r).name for r in case.reports]
    names += [files.result.name] if case.workload else []
    names += [files.sqlite_gz.name] if case.sqlite else []
    names += [files.rep.name] if case.rep else []
    return names


@dataclass(frozen=True)
class Lost:
    """What a set of parts lacks: the parts the manifest names that are not there, and per case the files
    the manifest promises that no present part holds (left_out_files excepted: the manifest says so)."""

    missing_parts: tuple[str, ...]
    files: dict[str, tuple[str, ...]]  # case -> its lost file names

    def __bool__(self) -> bool:
        return bool(self.missing_parts or self.files)

    def message(self, parts_dir: Path) -> str:
        lines = [f"{parts_dir}: {len(self.missing_parts)} part(s) listed in the manifest but missing: "
                 f"{', '.join(self.missing_parts)}"]
        n = sum(len(v) for v in self.files.values())
        lines.append(f"{n} file(s) of {len(self.files)} case(s) lost with them:")
        lines += [f"  {case}: {', '.join(names)}" for case, names in self.files.items()]
        return "\n".join(lines)


def lost_files(manifest: Manifest, parts_dir: Path) -> Lost:
    """What the parts present in parts_dir lack against `manifest`."""
    present: set[str] = set()
    missing = []
    for name in manifest.parts:
        part = Path(parts_dir) / name
        if not part.is_file():
            missing.append(name)
            continue
        with tarfile.open(part) as tar:
            present.update(Path(m.name).name for m in tar.getmembers())
    left = set(manifest.left_out_files)
    files = {c.name: lost for c in manifest.cases
             if (lost := tuple(f for f in expected_files(c) if f not in present and f not in left))}
    return Lost(tuple(missing), files)


def unpack(parts_dir: Path, dest: Path, partial: bool = False) -> Manifest:
    """The parts named by parts_dir's manifest, extracted into `dest` (exports gunzipped); the manifest.
    A missing part raises NsysOutputError naming each case's lost files, before anything is extracted,
    unless `partial`: then the parts present are extracted (`lost_files` says what is not)."""
    parts_dir = Path(parts_dir)
    manifest = read_manifest(parts_dir / MANIFEST)
    lost = lost_files(manifest, parts_dir)
    if lost.missing_parts and not partial:
        raise NsysOutputError(lost.message(parts_dir) + "\n(pass partial=True / --partial to extract the rest)")
    dest.mkdir(parents=True, exist_ok=True)
    for name in manifest.parts:
        part = parts_dir / name
        if not part.is_file():
            continue
        with tarfile.open(part) as tar:
            tar.extractall(dest, filter="data")
    for gz in dest.glob("*.sqlite.gz"):
        with gzip.open(gz, "rb") as src, open(gz.with_suffix(""), "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(parts_dir / MANIFEST, dest / MANIFEST)
    return manifest


def main(argv: list[str]) -> int:
    """0: every part unpacked; 1: parts missing (with --partial the rest is extracted, and every lost file is
    named either way); 2: usage; NsysOutputError's message on stderr for a bad manifest."""
    partial = "--partial" in argv
    args = [a for a in argv if a != "--partial"]
    if len(args) != 3 or args[0] != "unpack":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    parts_dir, dest = Path(args[1]), Path(args[2])
    try:
        m = unpack(parts_dir, dest, partial=partial)
    except NsysOutputError as exc:
        print(exc, file=sys.stderr)
        return 1
    lost = lost_files(m, parts_dir)
    got = len(m.parts) - len(lost.missing_parts)
    print(f"{len(m.cases)} cases, {got} of {len(m.parts)} parts into {dest}; left out on the device: "
          f"{list(m.left_out_files) or 'none'}")
    if lost:
        print("PARTIAL: " + lost.message(parts_dir), file=sys.stderr)
        return 1 if not partial else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["CaseFiles", "CaseRecord", "Lost", "MANIFEST", "Manifest", "REPORTS", "expected_files", "gzip_file",
           "lost_files", "plan_parts", "read_manifest", "unpack", "write_parts"]
