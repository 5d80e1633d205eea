"""What the pages draw from a case's nsys export, kept small and read without SQLite.

A filed export (sqlite/NAME.sqlite.gz, a trimmed `nsys export --type sqlite`) is 0.05-3.6 MB and its GUI
report (rep/NAME.nsys-rep) up to 5 MB; the pages read only two things from the export: the kernel
timeline (impl.nsys.timeline.Timeline: kernels with their lanes, launches and open NVTX ranges, and the
NVTX ranges) and, for a memory case, the device-memory trace (impl.nsys.memory.MemoryTrace). Each is written
once, when the export is filed (impl.nsys.store), to extract/NAME.timeline.json.gz and
extract/NAME.memory.json.gz: columnar JSON (kernel and range names stored once each), gzip'd with no
timestamp so the same export always gives the same bytes. The report reads only these, so the exports and
reports can leave the working tree without changing a page.
"""
from __future__ import annotations

import gzip
import io
import json
import shutil
import sqlite3
import tempfile
from pathlib import Path

from impl.nsys.memory import MemoryTrace, read_memory
from impl.nsys.tables import NsysOutputError
from impl.nsys.timeline import Kernel, NvtxRange, Timeline, read_timeline

EXTRACT = "extract"  # the filed folder's subfolder
FORMAT = 1
TIMELINE_SUFFIX, MEMORY_SUFFIX = ".timeline.json.gz", ".memory.json.gz"

_KERNEL_COLUMNS = ("start_ns", "end_ns", "device", "stream", "pid", "launch_ns")
_RANGE_COLUMNS = ("start_ns", "end_ns", "pid", "tid")


def timeline_doc(tl: Timeline) -> dict:
    """`tl` as columns: names (kernels', ranges', and those open at each launch) by index into one table."""
    names: dict[str, int] = {}

    def index(name: str) -> int:
        return names.setdefault(name, len(names))
    kernels = {c: [getattr(k, c) for k in tl.kernels] for c in _KERNEL_COLUMNS}
    kernels.update(name=[index(k.name) for k in tl.kernels], nccl=[int(k.nccl) for k in tl.kernels],
                   ranges=[[index(r) for r in k.ranges] for k in tl.kernels])
    ranges = {c: [getattr(r, c) for r in tl.ranges] for c in _RANGE_COLUMNS}
    ranges["name"] = [index(r.name) for r in tl.ranges]
    return dict(format=FORMAT, names=list(names), gpus={str(d): n for d, n in tl.gpus.items()}, kernels=kernels,
                ranges=ranges)


def timeline_of(doc: dict, source: Path) -> Timeline:
    _check_format(doc, source)
    names, k, r = doc["names"], doc["kernels"], doc["ranges"]
    kernels = tuple(Kernel(names[n], nccl=bool(nccl), ranges=tuple(names[i] for i in open_),
                           **dict(zip(_KERNEL_COLUMNS, cols)))
                    for n, nccl, open_, *cols in zip(k["name"], k["nccl"], k["ranges"],
                                                     *(k[c] for c in _KERNEL_COLUMNS)))
    ranges = tuple(NvtxRange(names[n], *cols) for n, *cols in zip(r["name"], *(r[c] for c in _RANGE_COLUMNS)))
    return Timeline(Path(source), kernels, ranges, {int(d): n for d, n in doc["gpus"].items()})


def memory_doc(trace: MemoryTrace) -> dict:
    return dict(format=FORMAT, events=[list(e) for e in trace.events], ranges=[list(r) for r in trace.ranges])


def memory_of(doc: dict, source: Path) -> MemoryTrace:
    _check_format(doc, source)
    return MemoryTrace(Path(source), tuple(tuple(e) for e in doc["events"]), tuple(tuple(r) for r in doc["ranges"]))


def _check_format(doc: dict, source: Path) -> None:
    if doc.get("format") != FORMAT:
        raise NsysOutputError(f"{source}: extract format {doc.get('format')!r}, this code reads {FORMAT}")


def _write(doc: dict, path: Path) -> None:
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0) as gz:  # no name, no time: same bytes
        gz.write(json.dumps(doc, separators=(",", ":")).encode())
    path.write_bytes(buf.getvalue())


def _read(path: Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise NsysOutputError(f"{path}: no such extract (impl.nsys.store writes it when it files the export)")
    with gzip.open(path, "rb") as f:
        return json.load(f)


def read_timeline_extract(path: Path) -> Timeline:
    return timeline_of(_read(path), path)


def read_memory_extract(path: Path) -> MemoryTrace:
    return memory_of(_read(path), path)


def _has_memory(db: Path) -> bool:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = "
                           "'CUDA_GPU_MEMORY_USAGE_EVENTS'").fetchone() is not None
    finally:
        con.close()


def write_extracts(sqlite_gz: Path, dest: Path) -> list[Path]:
    """The extracts of one filed export (NAME.sqlite.gz) written into `dest`: its timeline (NVTX ranges alone
    where the export has no kernels) and, where it recorded device memory, its memory trace. Refuses to
    overwrite an extract (stored data is never rewritten). The paths written."""
    sqlite_gz, dest = Path(sqlite_gz), Path(dest)
    name = sqlite_gz.name.removesuffix(".sqlite.gz")
    targets = [dest / f"{name}{TIMELINE_SUFFIX}", dest / f"{name}{MEMORY_SUFFIX}"]
    taken = [p for p in targets if p.exists()]
    if taken:
        raise NsysOutputError(f"{taken[0]}: already extracted; stored data is never rewritten")
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / f"{name}.sqlite"
        with gzip.open(sqlite_gz, "rb") as src, open(db, "wb") as dst:
            shutil.copyfileobj(src, dst)
        _write(timeline_doc(read_timeline(db, kernels_required=False)), targets[0])
        written = [targets[0]]
        if _has_memory(db):
            _write(memory_doc(read_memory(db)), targets[1])
            written.append(targets[1])
    return written


__all__ = ["EXTRACT", "MEMORY_SUFFIX", "TIMELINE_SUFFIX", "memory_doc", "memory_of", "read_memory_extract",
           "read_timeline_extract", "timeline_doc", "timeline_of", "write_extracts"]
