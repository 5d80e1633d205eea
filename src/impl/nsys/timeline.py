"""The kernel timeline of an `nsys export --type sqlite` database: every kernel with its device,
stream, process, whether it is an NCCL kernel, and the NVTX ranges that enclosed its launch.

Tables read (Nsight Systems 2025.3's export schema; times in ns on one session clock):
  CUPTI_ACTIVITY_KIND_KERNEL  start, end, deviceId, streamId, correlationId, globalPid,
                              demangledName / shortName (ids into StringIds)       required
  StringIds                   id, value                                             required
  CUPTI_ACTIVITY_KIND_RUNTIME start, globalTid, correlationId: the launching call   optional
  NVTX_EVENTS                 start, end, eventType, text / textId, globalTid       optional
  TARGET_INFO_GPU             id, name                                              optional
A process or thread id is packed into globalPid / globalTid: pid = (g >> 24) & 0xFFFFFF,
tid = g & 0xFFFFFF.

Attribution: a kernel belongs to every NVTX range of its process that was open when its launching
runtime call started (correlationId links the two), whatever the thread: PyTorch launches
backward kernels from the autograd thread, outside the main thread's "backward" range, and matching
by thread (as nsys's nvtx_kern_sum does) would lose them. Without the runtime table, the kernel's
own GPU start stands in for its launch (`Kernel.launch_ns` is then None).
"""
from __future__ import annotations

import bisect
import re
import sqlite3
from dataclasses import dataclass, replace
from pathlib import Path

from impl.bench.traces import busy_length, merge_intervals, overlap_length
from impl.nsys.tables import NsysOutputError, range_name

NVTX_PUSHPOP, NVTX_STARTEND = 59, 60  # NVTX_EVENTS.eventType of ranges (ENUM_NSYS_EVENT_TYPE)
_NCCL = re.compile(r"nccl", re.IGNORECASE)
RESUME_NS = 50_000  # Timeline.waits: compute that resumes this soon after an NCCL kernel's end was waiting for it

REQUIRED = {"CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId", "globalPid"),
            "StringIds": ("id", "value")}
OPTIONAL = {"CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "globalTid", "correlationId"),
            "NVTX_EVENTS": ("start", "end", "eventType", "text", "textId", "globalTid"),
            "TARGET_INFO_GPU": ("id", "name")}
# What trim_export keeps: the tables above, GPU memory and copies (memory_profiling (f)), metadata, and
# nsys's diagnostics (where it says it dropped records: the a4ea09d captures lost stretches of backward).
KEPT_TABLES = (*REQUIRED, *OPTIONAL, "CUDA_GPU_MEMORY_USAGE_EVENTS", "CUPTI_ACTIVITY_KIND_MEMCPY",
               "CUPTI_ACTIVITY_KIND_MEMSET", "TARGET_INFO_CUDA_DEVICE", "META_DATA_EXPORT", "META_DATA_CAPTURE",
               "DIAGNOSTIC_EVENT")


def is_nccl(name: str) -> bool:
    """NCCL's kernels (ncclDevKernel_AllReduce_..., ncclKernel_...) are the communication."""
    return bool(_NCCL.search(name))


def pid_of(global_id: int) -> int:
    return (global_id >> 24) & 0xFFFFFF


def tid_of(global_tid: int) -> int:
    return global_tid & 0xFFFFFF


@dataclass(frozen=True)
class NvtxRange:
    name: str
    start_ns: int
    end_ns: int
    pid: int
    tid: int

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Lane:
    """One stream of one device: a row of the timeline figure."""

    device: int
    stream: int


@dataclass(frozen=True)
class Kernel:
    name: str
    start_ns: int
    end_ns: int
    device: int
    stream: int
    pid: int
    nccl: bool
    launch_ns: int | None  # the launching runtime call's start (None: no runtime table)
    ranges: tuple[str, ...] = ()  # NVTX ranges open at launch, outermost first

    @property
    def range(self) -> str | None:
        """The innermost enclosing NVTX range."""
        return self.ranges[-1] if self.ranges else None

    @property
    def lane(self) -> Lane:
        return Lane(self.device, self.stream)

    @property
    def duration_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True)
class Overlap:
    """One device's kernels over a window: busy time of compute and of NCCL kernels (each merged
    across streams) and how long both ran at once."""

    device: int
    compute_ns: float
    nccl_ns: float
    both_ns: float

    @property
    def nccl_hidden_share(self) -> float | None:
        """Share of the NCCL kernels' time during which compute also ran (None without NCCL)."""
        return self.both_ns / self.nccl_ns if self.nccl_ns else None


@dataclass(frozen=True)
class Timeline:
    source: Path
    kernels: tuple[Kernel, ...]  # by start
    ranges: tuple[NvtxRange, ...]  # by start
    gpus: dict[int, str]  # device id -> name (empty without TARGET_INFO_GPU)

    def lanes(self) -> list[Lane]:
        """Every stream that ran a kernel, by device, compute streams before NCCL streams."""
        nccl = {k.lane for k in self.kernels if k.nccl}
        return sorted({k.lane for k in self.kernels}, key=lambda ln: (ln.device, ln in nccl, ln.stream))

    def nccl_lanes(self) -> set[Lane]:
        return {k.lane for k in self.kernels if k.nccl}

    def named(self, name: str, pid: int | None = None) -> list[NvtxRange]:
        """The ranges called `name` (of process `pid`), by start."""
        return [r for r in self.ranges if r.name == name and (pid is None or r.pid == pid)]

    def window(self, name: str, occurrence: int = -1) -> tuple[int, int]:
        """(start, end) spanning the `occurrence`-th instance of range `name` in every process (the
        last by default): each rank opens its own "step 2", and the window covers all of them."""
        by_pid: dict[int, list[NvtxRange]] = {}
        for r in self.named(name):
            by_pid.setdefault(r.pid, []).append(r)
        if not by_pid:
            have = sorted({r.name for r in self.ranges})
            raise NsysOutputError(f"{self.source}: no NVTX range {name!r}; the ranges are {have[:20]}")
        try:
            picked = [rs[occurrence] for rs in by_pid.values()]
        except IndexError:
            counts = {pid: len(rs) for pid, rs in by_pid.items()}
            raise NsysOutputError(f"{self.source}: range {name!r} has no instance {occurrence} "
                                  f"(instances per process: {counts})") from None
        return min(r.start_ns for r in picked), max(r.end_ns for r in picked)

    def measured_steps(self) -> list[str]:
        """The NVTX ranges of the measured steps ("step 0", "step 1", ...: impl.nsys.workloads), in order; raises
        without one."""
        names = sorted({r.name for r in self.ranges if re.fullmatch(r"step \d+", r.name)},
                       key=lambda n: int(n.split()[1]))
        if not names:
            have = sorted({r.name for r in self.ranges})
            raise NsysOutputError(f"{self.source}: no measured step range ('step N'); the ranges are {have[:20]}")
        return names

    def between(self, start_ns: int, end_ns: int) -> Timeline:
        """The kernels that ran and the ranges that were open within [start_ns, end_ns]."""
        return replace(self, kernels=tuple(k for k in self.kernels if k.end_ns > start_ns and k.start_ns < end_ns),
                       ranges=tuple(r for r in self.ranges if r.end_ns > start_ns and r.start_ns < end_ns))

    def in_range(self, name: str) -> list[Kernel]:
        """Kernels launched inside any range called `name` (at any depth)."""
        return [k for k in self.kernels if name in k.ranges]

    def waits(self, device: int, match: str, resume_ns: int = RESUME_NS) -> list[tuple[Kernel, int]]:
        """Each NCCL kernel of `device` whose name holds `match` (case-insensitive), by start, with how long the
        device's compute sat idle waiting for it (ns): 0 where compute ran at the kernel's end or did not resume
        within `resume_ns` after it (idle then for another reason), else the idle stretch from the last compute
        kernel's end up to the NCCL kernel's end."""
        busy = merge_intervals([(k.start_ns, k.end_ns) for k in self.kernels if k.device == device and not k.nccl],
                               0.0)
        starts = [s for s, _ in busy]
        out = []
        for k in (k for k in self.kernels if k.device == device and k.nccl and match.lower() in k.name.lower()):
            i = bisect.bisect_right(starts, k.end_ns)  # busy[i - 1] starts at or before the kernel's end
            running = i > 0 and busy[i - 1][1] >= k.end_ns
            resumed = i < len(busy) and busy[i][0] - k.end_ns <= resume_ns
            wait = 0 if running or not resumed else k.end_ns - (busy[i - 1][1] if i > 0 else k.start_ns)
            out.append((k, int(max(wait, 0))))
        return out

    def overlap(self) -> list[Overlap]:
        """Per device: compute and NCCL busy time and their intersection over this timeline's kernels."""
        out = []
        for dev in sorted({k.device for k in self.kernels}):
            ks = [k for k in self.kernels if k.device == dev]
            comp = merge_intervals([(k.start_ns, k.end_ns) for k in ks if not k.nccl], 0.0)
            comm = merge_intervals([(k.start_ns, k.end_ns) for k in ks if k.nccl], 0.0)
            out.append(Overlap(dev, busy_length(comp), busy_length(comm), overlap_length(comp, comm)))
        return out


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}


def _check(db: sqlite3.Connection, path: Path, kernels_required: bool = True) -> dict[str, bool]:
    """Raises naming the file and what is missing from the required tables; returns which optional
    tables are complete (and, as "CUPTI_ACTIVITY_KIND_KERNEL", whether kernels are there)."""
    if not kernels_required and not _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL"):
        if not {"id", "value"} <= _columns(db, "StringIds"):
            raise NsysOutputError(f"{path}: table StringIds is missing")
        return {t: set(cols) <= _columns(db, t) for t, cols in OPTIONAL.items()} | {"CUPTI_ACTIVITY_KIND_KERNEL": False}
    for table, cols in REQUIRED.items():
        have = _columns(db, table)
        if not have:
            raise NsysOutputError(f"{path}: table {table} is missing (was the profile run with -t cuda and did a "
                                  "kernel run?)")
        missing = [c for c in cols if c not in have]
        if missing:
            raise NsysOutputError(f"{path}: table {table} lacks the columns {missing}")
    names = _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL") & {"demangledName", "shortName"}
    if not names:
        raise NsysOutputError(f"{path}: table CUPTI_ACTIVITY_KIND_KERNEL has neither demangledName nor shortName")
    return {t: set(cols) <= _columns(db, t) for t, cols in OPTIONAL.items()} | {"CUPTI_ACTIVITY_KIND_KERNEL": True}


def _attribute(kernels: list[Kernel], ranges: list[NvtxRange]) -> list[Kernel]:
    """Each kernel with the ranges of its process open at its launch (outermost first): one sweep
    over kernels and ranges sorted by time, per process."""
    by_pid: dict[int, list[NvtxRange]] = {}
    for r in sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns)):
        by_pid.setdefault(r.pid, []).append(r)
    out = []
    cursor = {pid: 0 for pid in by_pid}
    open_: dict[int, list[NvtxRange]] = {pid: [] for pid in by_pid}
    for k in sorted(kernels, key=lambda k: (k.launch_ns if k.launch_ns is not None else k.start_ns)):
        t = k.launch_ns if k.launch_ns is not None else k.start_ns
        rs = by_pid.get(k.pid)
        if not rs:
            out.append(k)
            continue
        i = cursor[k.pid]
        while i < len(rs) and rs[i].start_ns <= t:
            open_[k.pid].append(rs[i])
            i += 1
        cursor[k.pid] = i
        open_[k.pid] = [r for r in open_[k.pid] if r.end_ns >= t]
        out.append(replace(k, ranges=tuple(r.name for r in open_[k.pid])))
    return sorted(out, key=lambda k: (k.start_ns, k.device, k.stream))


def read_timeline(path: Path, kernels_required: bool = True) -> Timeline:
    """The timeline of the export at `path` (read-only). An export without a kernel table raises, unless
    `kernels_required` is False: then its NVTX ranges alone (no kernels), as in a profile whose CUDA trace of
    spawned processes came back empty (2026-11-26's two-GPU cases: nsys followed the ranks' NVTX only)."""
    path = Path(path)
    if not path.is_file():
        raise NsysOutputError(f"{path}: no such file (nsys export --type sqlite writes it)")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        db.execute("SELECT 1 FROM sqlite_master LIMIT 1")
    except sqlite3.DatabaseError as exc:
        raise NsysOutputError(f"{path}: not an SQLite database ({exc})") from None
    try:
        has = _check(db, path, kernels_required)
        strings = dict(db.execute("SELECT id, value FROM StringIds"))
        name_col = "demangledName" if "demangledName" in _columns(db, "CUPTI_ACTIVITY_KIND_KERNEL") else "shortName"
        launches: dict[tuple[int, int], int] = {}
        if has["CUPTI_ACTIVITY_KIND_RUNTIME"] and has["CUPTI_ACTIVITY_KIND_KERNEL"]:
            for start, gtid, corr in db.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
                launches[(pid_of(gtid), corr)] = start
        kernels = []
        rows = db.execute(f"SELECT start, end, deviceId, streamId, correlationId, globalPid, {name_col} "
                          "FROM CUPTI_ACTIVITY_KIND_KERNEL") if has["CUPTI_ACTIVITY_KIND_KERNEL"] else ()
        for start, end, dev, stream, corr, gpid, name_id in rows:
            name = strings.get(name_id)
            if name is None:
                raise NsysOutputError(f"{path}: kernel name id {name_id} is not in StringIds")
            pid = pid_of(gpid)
            kernels.append(Kernel(name=name, start_ns=start, end_ns=end, device=dev, stream=stream, pid=pid,
                                  nccl=is_nccl(name), launch_ns=launches.get((pid, corr))))
        ranges = []
        if has["NVTX_EVENTS"]:
            last = max((k.end_ns for k in kernels), default=0)
            for start, end, text, text_id, gtid in db.execute(
                    "SELECT start, end, text, textId, globalTid FROM NVTX_EVENTS WHERE eventType IN (?, ?)",
                    (NVTX_PUSHPOP, NVTX_STARTEND)):
                name = text if text is not None else strings.get(text_id)
                if name is None:
                    continue  # a range without a message names nothing
                # a range still open when the capture stopped runs to the end of the data
                stop = end if end is not None and end >= start else max(last, start)
                ranges.append(NvtxRange(range_name(name), start, stop, pid_of(gtid), tid_of(gtid)))
        gpus = dict(db.execute("SELECT id, name FROM TARGET_INFO_GPU")) if has["TARGET_INFO_GPU"] else {}
    finally:
        db.close()
    return Timeline(source=path, kernels=tuple(_attribute(kernels, ranges)),
                    ranges=tuple(sorted(ranges, key=lambda r: (r.start_ns, -r.end_ns))), gpus=gpus)


def trim_export(path: Path) -> int:
    """Drop every table but KEPT_TABLES and the ENUM_* lookups from the export at `path` and compact
    it, so it fits the few MB a device run returns; returns the bytes saved."""
    path = Path(path)
    before = path.stat().st_size
    db = sqlite3.connect(path)
    try:
        tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for t in tables:
            if t not in KEPT_TABLES and not t.startswith("ENUM_") and not t.startswith("sqlite_"):
                db.execute(f'DROP TABLE "{t}"')
        db.commit()
        db.execute("VACUUM")
    finally:
        db.close()
    return before - path.stat().st_size


__all__ = ["KEPT_TABLES", "RESUME_NS", "Kernel", "Lane", "NVTX_PUSHPOP", "NVTX_STARTEND", "NvtxRange", "OPTIONAL", "Overlap",
           "REQUIRED", "Timeline", "is_nccl", "pid_of", "read_timeline", "tid_of", "trim_export"]
