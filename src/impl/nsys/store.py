"""Filing one device call's nsys outputs under reports/data/<device>/nsys/<started UTC>_<commit>/, beside the
benchmark runs (their `*/*/*.json` glob does not reach these folders), for the report to read:

  manifest.json, log.txt          the run's manifest and log, as the device wrote them
  tables/                         every case's nsys stats CSVs, its workload's result.json and its nsys log
  sqlite/NAME.sqlite.gz           the trimmed exports of the cases a page draws (`--sqlite`)
  rep/NAME.nsys-rep               the reports a reader opens in the Nsight Systems GUI (`--rep`, default all)
  FILED.json                      what was filed from where, what was not kept, and what the device lost

A folder is never overwritten and stored data is never rewritten: filing into an existing folder fails.

  python -m impl.nsys.store PARTS_DIR [--data reports/data] [--device SLUG] [--note TEXT] [--partial]
                                      [--sqlite GLOB ...] [--rep GLOB ...]

PARTS_DIR holds the device's manifest.json, log.txt and nsys-*.tar. A part the device did not return fails the
filing (naming each case's lost files) unless --partial: FILED.json then lists the lost files. --device overrides
the slug read from the manifest's "<n>x <GPU name>" (a group run with CUDA_VISIBLE_DEVICES on a bigger machine);
--note says why. --sqlite and --rep take fnmatch patterns of case names ("ddp_*"); --rep none keeps none.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from impl.bench.store import gpu_slug
from impl.nsys.outputs import MANIFEST, REPORTS, CaseFiles, lost_files, read_manifest, unpack
from impl.nsys.tables import NsysOutputError

FOLDER = "nsys"  # reports/data/<device>/nsys/
TABLES, SQLITE, REP = "tables", "sqlite", "rep"
FILED = "FILED.json"


def device_of(manifest_device: str) -> str:
    """The slug of a manifest's device, "2x NVIDIA H200" -> h200-141gb-x2."""
    m = re.fullmatch(r"\s*(\d+)x\s+(.+?)\s*", manifest_device)
    if not m:
        raise NsysOutputError(f"manifest device {manifest_device!r} is not '<n>x <GPU name>': pass --device")
    return gpu_slug(m.group(2), int(m.group(1)), 0)


def stamp_of(started_utc: str, commit: str) -> str:
    return f"{started_utc}_{commit[:8]}"


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def file_outputs(parts_dir: Path, data_dir: Path, *, device: str | None = None, note: str = "",
                 partial: bool = False, sqlite: list[str] = (), rep: list[str] = ("*",)) -> Path:
    """File the outputs in parts_dir (see the module's doc); the new folder."""
    parts_dir = Path(parts_dir)
    manifest = read_manifest(parts_dir / MANIFEST)
    slug = device or device_of(manifest.device)
    dest = Path(data_dir) / slug / FOLDER / stamp_of(manifest.started_utc, manifest.commit)
    if dest.exists():
        raise NsysOutputError(f"{dest}: already filed; stored data is never rewritten (remove it by hand only if "
                              f"it was filed wrongly and never committed)")
    lost = lost_files(manifest, parts_dir)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        unpack(parts_dir, work, partial=partial)  # raises on a missing part unless partial
        staging = dest.with_name(f".{dest.name}.partial")
        if staging.exists():
            shutil.rmtree(staging)
        for sub in (TABLES, SQLITE, REP):
            (staging / sub).mkdir(parents=True)
        shutil.copy(parts_dir / MANIFEST, staging / MANIFEST)
        if (parts_dir / "log.txt").is_file():
            shutil.copy(parts_dir / "log.txt", staging / "log.txt")
        kept: dict[str, list[str]] = {TABLES: [], SQLITE: [], REP: []}
        not_kept: dict[str, list[str]] = {SQLITE: [], REP: []}
        for case in manifest.cases:
            f = CaseFiles(work, case.name)
            for p in (*(f.csv(r) for r in REPORTS), f.result, work / f"{case.name}.log"):
                if p.is_file():
                    shutil.copy(p, staging / TABLES / p.name)
                    kept[TABLES].append(p.name)
            for sub, p, patterns in ((SQLITE, f.sqlite_gz, sqlite), (REP, f.rep, rep)):
                if not p.is_file():
                    continue
                if _matches(case.name, list(patterns)):
                    shutil.copy(p, staging / sub / p.name)
                    kept[sub].append(p.name)
                else:
                    not_kept[sub].append(p.name)
        filed = dict(filed_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), device=slug,
                     manifest_device=manifest.device, note=note, source=str(parts_dir),
                     missing_parts=list(lost.missing_parts), lost_files={k: list(v) for k, v in lost.files.items()},
                     left_out_on_device=list(manifest.left_out_files), kept=kept,
                     not_kept=not_kept, not_kept_reason="kept only the exports the pages draw and the reports "
                                                        "asked for, to keep the repository small")
        (staging / FILED).write_text(json.dumps(filed, indent=1) + "\n")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(dest)  # fails if dest appeared meanwhile (a non-empty folder)
    return dest


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m impl.nsys.store", description=__doc__.split("\n\n")[0])
    ap.add_argument("parts_dir", type=Path)
    ap.add_argument("--data", type=Path, default=Path("reports/data"))
    ap.add_argument("--device")
    ap.add_argument("--note", default="")
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--sqlite", nargs="*", default=[])
    ap.add_argument("--rep", nargs="*", default=["*"])
    a = ap.parse_args(argv)
    rep = [] if a.rep == ["none"] else a.rep
    try:
        dest = file_outputs(a.parts_dir, a.data, device=a.device, note=a.note, partial=a.partial, sqlite=a.sqlite,
                            rep=rep)
    except NsysOutputError as exc:
        print(exc, file=sys.stderr)
        return 1
    filed = json.loads((dest / FILED).read_text())
    print(f"filed into {dest} ({folder_bytes(dest) / 1e6:.2f} MB): {len(filed['kept'][TABLES])} tables, "
          f"{len(filed['kept'][SQLITE])} exports, {len(filed['kept'][REP])} reports")
    if filed["lost_files"]:
        print(f"lost on the device (missing {filed['missing_parts']}): {filed['lost_files']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["FILED", "FOLDER", "device_of", "file_outputs", "folder_bytes", "main", "stamp_of"]
