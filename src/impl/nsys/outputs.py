"""Where a case's nsys outputs lie, the run's manifest, and the packing into the few files the
device tool returns (at most 8 files of 16 MiB, 64 MiB in all, names of letters, digits, '.', '_',
'-').

A run writes under $OUT/nsys/: manifest.json, log.txt and parts nsys-1.tar, nsys-2.tar, ... Each
part holds whole files: per case NAME.nsys-rep (the GUI's file), NAME.sqlite.gz (the trimmed
export), NAME_<report>.csv (nsys stats) and NAME.result.json (what the workload ran). Files are
packed in the order given (CSVs and results first, then exports, then .nsys-rep); one that does not
fit is left out and named in the manifest, never silently dropped.

  python -m impl.nsys.outputs unpack DIR DEST   # on the CPU machine: the parts of DIR into DEST
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


def write_parts(files: list[Path], out_dir: Path, stem: str = "nsys") -> tuple[list[str], list[str]]:
    """Pack `files` into out_dir/STEM-i.tar (replacing earlier parts); (part names, left-out names)."""
    for old in out_dir.glob(f"{stem}-*.tar"):
        old.unlink()
    parts, left = plan_parts(files)
    names = []
    for i, members in enumerate(parts, start=1):
        name = f"{stem}-{i}.tar"
        with tarfile.open(out_dir / name, "w") as tar:
            for f in members:
                tar.add(f, arcname=f.name)
        names.append(name)
    return names, [f.name for f in left]


def unpack(parts_dir: Path, dest: Path) -> Manifest:
    """The parts named by parts_dir's manifest, extracted into `dest` (exports gunzipped); the manifest."""
    manifest = read_manifest(Path(parts_dir) / MANIFEST)
    dest.mkdir(parents=True, exist_ok=True)
    for name in manifest.parts:
        part = Path(parts_dir) / name
        if not part.is_file():
            raise NsysOutputError(f"{part}: listed in the manifest but missing")
        with tarfile.open(part) as tar:
            tar.extractall(dest, filter="data")
    for gz in dest.glob("*.sqlite.gz"):
        with gzip.open(gz, "rb") as src, open(gz.with_suffix(""), "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(Path(parts_dir) / MANIFEST, dest / MANIFEST)
    return manifest


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "unpack":
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    m = unpack(Path(argv[1]), Path(argv[2]))
    print(f"{len(m.cases)} cases, {len(m.parts)} parts into {argv[2]}; left out: {list(m.left_out_files) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["CaseFiles", "CaseRecord", "MANIFEST", "Manifest", "REPORTS", "gzip_file", "plan_parts", "read_manifest",
           "unpack", "write_parts"]
