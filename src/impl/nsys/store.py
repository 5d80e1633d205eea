"""Filing one device call's nsys outputs under reports/data/<device>/nsys/<started UTC>_<commit>/, beside the
benchmark runs (their `*/*/*.json[.gz]` listing does not reach these folders), for the report to read:

  manifest.json, log.txt          the run's manifest and log, as the device wrote them
  tables/                         every case's nsys stats CSVs, its workload's result.json and its nsys log
  extract/NAME.*.json.gz          what the pages read from each kept export (impl.nsys.extract), written from it
                                  as it is filed
  FILED.json                      what was filed from where, what was not kept, and what the device lost
  CAPTURES.json                   where each capture is kept: {"<subfolder>/<name>": "<commit>"}

The captures themselves go to the history of the checked-out branch of the repository holding the data folder
(impl.nsys.captures: one commit holding them, then one taking them out of the tree again, never through the
working tree or the index), at the paths they would have here:

  sqlite/NAME.sqlite.gz           the trimmed exports of the cases a page draws (`--sqlite`)
  rep/NAME.nsys-rep               the reports a reader opens in the Nsight Systems GUI (`--rep`, default all):
                                  git show <commit>:<folder>/rep/NAME.nsys-rep > NAME.nsys-rep

so the tracked tree stays small (the device tool copies at most 64 MiB of it). FILED.json's "kept" names them and
CAPTURES.json the commit holding each, so the pages name them from files alone. The captures filed before
2026-11-27 were in main's tree until adc835b; `--record FOLDER` writes their CAPTURES.json from the history (the
commit that added each, checked to hold it).

A folder is never overwritten and stored data is never rewritten: filing into an existing folder fails, and so does
adding a capture the history already holds. An export left out at filing (not_kept) can be added later from the
same parts (`--into FOLDER`): only exports not yet stored, from parts whose manifest.json is byte-identical to the
folder's; ADDED.json lists each addition, CAPTURES.json gains its commit.

  python -m impl.nsys.store PARTS_DIR [--data reports/data] [--device SLUG] [--note TEXT] [--partial]
                                      [--sqlite GLOB ...] [--rep GLOB ...]
  python -m impl.nsys.store PARTS_DIR --into FOLDER --sqlite GLOB ... [--note TEXT]
  python -m impl.nsys.store --extract FOLDER ...   # the extracts of a folder's exports that it lacks
  python -m impl.nsys.store --record FOLDER ...    # CAPTURES.json of captures kept in history before it existed

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
from impl.nsys import captures
from impl.nsys.extract import EXTRACT, TIMELINE_SUFFIX, write_extracts
from impl.nsys.outputs import MANIFEST, REPORTS, CaseFiles, lost_files, read_manifest, unpack
from impl.nsys.tables import NsysOutputError

FOLDER = "nsys"  # reports/data/<device>/nsys/
TABLES, SQLITE, REP = "tables", "sqlite", "rep"
FILED = "FILED.json"
ADDED = "ADDED.json"
CAPTURES = "CAPTURES.json"


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
    repo = _repo(dest)
    with tempfile.TemporaryDirectory() as tmp:
        work, held = Path(tmp) / "work", Path(tmp) / "captures"  # held: what goes to the history
        unpack(parts_dir, work, partial=partial)  # raises on a missing part unless partial
        staging = dest.with_name(f".{dest.name}.partial")
        if staging.exists():
            shutil.rmtree(staging)
        (staging / TABLES).mkdir(parents=True)
        for sub in (SQLITE, REP):
            (held / sub).mkdir(parents=True)
        shutil.copy(parts_dir / MANIFEST, staging / MANIFEST)
        if (parts_dir / "log.txt").is_file():
            shutil.copy(parts_dir / "log.txt", staging / "log.txt")
        kept: dict[str, list[str]] = {TABLES: [], SQLITE: [], REP: [], EXTRACT: []}
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
                    shutil.copy(p, held / sub / p.name)
                    kept[sub].append(p.name)
                    if sub == SQLITE:
                        kept[EXTRACT] += [x.name for x in write_extracts(p, staging / EXTRACT)]
                else:
                    not_kept[sub].append(p.name)
        filed = dict(filed_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), device=slug,
                     manifest_device=manifest.device, note=note, source=str(parts_dir),
                     missing_parts=list(lost.missing_parts), lost_files={k: list(v) for k, v in lost.files.items()},
                     left_out_on_device=list(manifest.left_out_files), kept=kept,
                     not_kept=not_kept, not_kept_reason="kept only the exports the pages draw and the reports "
                                                        "asked for, to keep the repository small")
        names = [(SQLITE, kept[SQLITE]), (REP, kept[REP])]
        commit = _store_captures(repo, dest, held, names)
        if commit:
            _record_captures(staging, {f"{sub}/{n}": commit for sub, ns in names for n in ns})
        (staging / FILED).write_text(json.dumps(filed, indent=1) + "\n")
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging.rename(dest)  # fails if dest appeared meanwhile (a non-empty folder)
    return dest


def add_exports(parts_dir: Path, folder: Path, sqlite: list[str], note: str = "") -> list[str]:
    """Add to the filed `folder` the exports of the cases matching `sqlite` (fnmatch) that its filing left out,
    from the same device call's parts; the names added. Refuses parts of another call (manifest.json differs) and
    a name the folder already holds (stored data is never rewritten); appends a record to folder/ADDED.json."""
    parts_dir, folder = Path(parts_dir), Path(folder)
    if not (folder / MANIFEST).is_file():
        raise NsysOutputError(f"{folder}: no {MANIFEST}; not a filed nsys folder")
    if (parts_dir / MANIFEST).read_bytes() != (folder / MANIFEST).read_bytes():
        raise NsysOutputError(f"{parts_dir / MANIFEST} differs from {folder / MANIFEST}: parts of another call")
    manifest = read_manifest(folder / MANIFEST)
    names = [c.name for c in manifest.cases if _matches(c.name, list(sqlite))]
    if not names:
        raise NsysOutputError(f"no case of {folder} matches {list(sqlite)}")
    repo = _repo(folder)
    recorded = recorded_captures(folder)
    taken = [n for n in names if (folder / SQLITE / f"{n}.sqlite.gz").exists() or f"{SQLITE}/{n}.sqlite.gz" in
             recorded or _stored(repo, folder / SQLITE / f"{n}.sqlite.gz")]
    if taken:
        raise NsysOutputError(f"{folder / SQLITE}: the exports of {taken} are already stored (in the folder or in "
                              f"the history); stored data is never rewritten")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        unpack(parts_dir, work, partial=True)
        missing = [n for n in names if not CaseFiles(work, n).sqlite_gz.is_file()]
        if missing:
            raise NsysOutputError(f"{parts_dir}: the parts hold no export of {missing}")
        extracts = []
        for n in names:
            extracts += [x.name for x in write_extracts(CaseFiles(work, n).sqlite_gz, folder / EXTRACT)]
        sqlite_names = [f"{n}.sqlite.gz" for n in names]
        commit = _store_captures(repo, folder, work, [(SQLITE, sqlite_names)], flat=True)
    _record_captures(folder, {f"{SQLITE}/{n}": commit for n in sqlite_names})
    _record_added(folder, dict(source=str(parts_dir), note=note, sqlite=sqlite_names, extract=extracts))
    return names


def _repo(path: Path) -> Path:
    """The git repository whose history takes the captures filed under `path`; NsysOutputError if none."""
    try:
        return captures.repo_root(path)
    except captures.CapturesError as exc:
        raise NsysOutputError(str(exc)) from None


def _stored(repo: Path, path: Path) -> str | None:
    """captures.stored for a path under the data folder; NsysOutputError on a git failure."""
    try:
        return captures.stored(repo, path.resolve())
    except captures.CapturesError as exc:
        raise NsysOutputError(str(exc)) from None


def _store_captures(repo: Path, folder: Path, held: Path, names: list[tuple[str, list[str]]],
                    flat: bool = False) -> str | None:
    """Add the captures `names` ((subfolder, file names)) of the filed `folder` to the branch's history, at
    folder/<subfolder>/<name>, from held/<subfolder>/<name> (held/<name> if flat): the commit holding them, its
    message naming the folder; None if there is nothing to add."""
    files = {folder / sub / n: (held / n if flat else held / sub / n) for sub, ns in names for n in ns}
    if not files:
        return None
    try:
        rel = captures.relative(repo, folder.resolve())
        return captures.add_files(repo, {f.resolve(): src for f, src in files.items()},
                                  f"captures of {rel}: {len(files)} files (impl.nsys.store)")
    except captures.CapturesError as exc:
        raise NsysOutputError(str(exc)) from None


def recorded_captures(folder: Path) -> dict[str, str]:
    """folder/CAPTURES.json: {"<subfolder>/<name>": "<commit>"} for each capture kept in history, {} if none."""
    p = Path(folder) / CAPTURES
    return json.loads(p.read_text()) if p.is_file() else {}


def _record_captures(folder: Path, entries: dict[str, str]) -> None:
    """Add `entries` to folder/CAPTURES.json (sorted); a name it already records is never rewritten."""
    recorded = recorded_captures(folder)
    if taken := sorted(set(entries) & set(recorded)):
        raise NsysOutputError(f"{folder / CAPTURES} already records {taken}; stored data is never rewritten")
    (Path(folder) / CAPTURES).write_text(json.dumps(dict(sorted({**recorded, **entries}.items())), indent=1) + "\n")


def record_history(folder: Path) -> dict[str, str]:
    """Write into folder/CAPTURES.json where the branch's history keeps each capture its FILED.json and ADDED.json
    name that it does not record yet (the commit that added it, checked to hold it as a file): for folders whose
    captures were in the tree before CAPTURES.json existed. Returns what it added; a capture the history does not
    hold is refused, naming it."""
    folder = Path(folder)
    if not (folder / FILED).is_file():
        raise NsysOutputError(f"{folder}: no {FILED}; not a filed nsys folder")
    kept = json.loads((folder / FILED).read_text()).get("kept", {})
    added = json.loads((folder / ADDED).read_text()) if (folder / ADDED).is_file() else []
    named = [f"{sub}/{n}" for entry in (kept, *added) for sub in (SQLITE, REP) for n in entry.get(sub, [])]
    recorded = recorded_captures(folder)
    repo = _repo(folder)
    at = {n: _stored(repo, folder / n) for n in dict.fromkeys(named) if n not in recorded}
    if missing := [n for n, where in at.items() if where is None]:
        raise NsysOutputError(f"{folder}: the history of {repo} holds no {missing}")
    found = {n: where.split(":", 1)[0] for n, where in at.items()}
    if found:
        _record_captures(folder, found)
    return found


def _record_added(folder: Path, entry: dict) -> None:
    """Append `entry`, stamped, to folder/ADDED.json: what was added to a filed folder, when and from where."""
    added = json.loads((folder / ADDED).read_text()) if (folder / ADDED).is_file() else []
    added.append(dict(added_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"), **entry))
    (folder / ADDED).write_text(json.dumps(added, indent=1) + "\n")


def add_extracts(folder: Path, note: str = "") -> list[str]:
    """Write the extracts (impl.nsys.extract) of the filed `folder`'s exports that have none yet, for folders
    filed before extracts existed; the names written (none: nothing to do, nothing recorded). An extract that
    exists is never rewritten."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        raise NsysOutputError(f"{folder}: no {MANIFEST}; not a filed nsys folder")
    exports: dict[str, Path | str] = {gz.name: gz for gz in (folder / SQLITE).glob("*.sqlite.gz")}  # in the tree
    exports.update({n.split("/", 1)[1]: commit for n, commit in recorded_captures(folder).items()
                    if n.startswith(f"{SQLITE}/") and n.split("/", 1)[1] not in exports})  # in history
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(exports):
            if (folder / EXTRACT / name.replace(".sqlite.gz", TIMELINE_SUFFIX)).exists():
                continue
            gz = exports[name]
            if not isinstance(gz, Path):  # kept in history: its bytes, read without a checkout
                gz = Path(tmp) / name
                try:
                    repo = captures.repo_root(folder)
                    rel = captures.relative(repo, (folder / SQLITE / name).resolve())
                    gz.write_bytes(captures.read_bytes(repo, captures.spec(exports[name], rel)))
                except captures.CapturesError as exc:
                    raise NsysOutputError(str(exc)) from None
            written += [x.name for x in write_extracts(gz, folder / EXTRACT)]
    if written:
        _record_added(folder, dict(source="the folder's own exports (impl.nsys.store --extract)", note=note,
                                   extract=written))
    return written


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m impl.nsys.store", description=__doc__.split("\n\n")[0])
    ap.add_argument("parts_dir", type=Path, nargs="?")
    ap.add_argument("--data", type=Path, default=Path("reports/data"))
    ap.add_argument("--device")
    ap.add_argument("--note", default="")
    ap.add_argument("--partial", action="store_true")
    ap.add_argument("--sqlite", nargs="*", default=[])
    ap.add_argument("--rep", nargs="*", default=["*"])
    ap.add_argument("--into", type=Path, help="a filed folder: add the --sqlite exports its filing left out")
    ap.add_argument("--extract", type=Path, nargs="+", metavar="FOLDER",
                    help="filed folders: write the extracts of their exports that they lack (no PARTS_DIR)")
    ap.add_argument("--record", type=Path, nargs="+", metavar="FOLDER",
                    help="filed folders: record in CAPTURES.json where the history keeps their captures (no PARTS_DIR)")
    a = ap.parse_args(argv)
    for folders, act, done, flag in ((a.record, record_history, f"captures recorded in {CAPTURES}", "--record"),
                                     (a.extract, lambda f: add_extracts(f, a.note), "extracts written", "--extract")):
        if not folders:
            continue
        if a.parts_dir is not None:
            ap.error(f"{flag} works on filed folders alone: give no PARTS_DIR")
        for folder in folders:
            try:
                print(f"{folder}: {len(act(folder))} {done}")
            except NsysOutputError as exc:
                print(exc, file=sys.stderr)
                return 1
        return 0
    if a.parts_dir is None:
        ap.error("PARTS_DIR is required (or --extract/--record FOLDER ...)")
    if a.into is not None:
        try:
            names = add_exports(a.parts_dir, a.into, a.sqlite, a.note)
        except NsysOutputError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"added {len(names)} exports to {a.into} ({folder_bytes(a.into) / 1e6:.2f} MB now)")
        return 0
    rep = [] if a.rep == ["none"] else a.rep
    try:
        dest = file_outputs(a.parts_dir, a.data, device=a.device, note=a.note, partial=a.partial, sqlite=a.sqlite,
                            rep=rep)
    except NsysOutputError as exc:
        print(exc, file=sys.stderr)
        return 1
    filed = json.loads((dest / FILED).read_text())
    print(f"filed into {dest} ({folder_bytes(dest) / 1e6:.2f} MB): {len(filed['kept'][TABLES])} tables, "
          f"{len(filed['kept'][EXTRACT])} extracts; {len(filed['kept'][SQLITE])} exports and "
          f"{len(filed['kept'][REP])} reports kept in history ({CAPTURES})")
    if filed["lost_files"]:
        print(f"lost on the device (missing {filed['missing_parts']}): {filed['lost_files']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["ADDED", "CAPTURES", "FILED", "FOLDER", "add_exports", "add_extracts", "device_of", "file_outputs",
           "folder_bytes", "main", "record_history", "recorded_captures", "stamp_of"]
