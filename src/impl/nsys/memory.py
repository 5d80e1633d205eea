"""GPU memory of an `nsys profile --cuda-memory-usage=true` export: every device allocation and free
(CUDA_GPU_MEMORY_USAGE_EVENTS, memKind Device; with the caching allocator off each tensor is one cudaMalloc)
and the NVTX ranges they fall in (memory_profiling (f): the "block k" ranges of the forward).

Tables read: CUDA_GPU_MEMORY_USAGE_EVENTS (start, bytes, memKind, memoryOperationType: 0 allocation,
1 deallocation) and NVTX_EVENTS (start, end, text / textId via StringIds)."""
from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from impl.nsys.tables import NsysOutputError, range_name
from impl.nsys.timeline import NVTX_PUSHPOP, NVTX_STARTEND

DEVICE_KIND = 2  # ENUM_CUDA_MEM_KIND: CUDA_MEMOPR_MEMORY_KIND_DEVICE
ALLOC, FREE = 0, 1


@dataclass(frozen=True)
class RangeMemory:
    """The device allocations and frees inside one NVTX range."""

    name: str
    allocations: int
    allocated: int  # bytes
    freed: int
    peak_live: int  # the most bytes live at any event inside it

    net = property(lambda self: self.allocated - self.freed)  # bytes the range leaves allocated


@dataclass(frozen=True)
class MemoryTrace:
    source: Path
    events: tuple[tuple[int, int, int], ...]  # (start ns, bytes, ALLOC / FREE), device memory, by time
    ranges: tuple[tuple[str, int, int], ...]  # (name, start, end), the first instance of each name

    def range(self, name: str) -> tuple[int, int]:
        found = [(s, e) for n, s, e in self.ranges if n == name]
        if not found:
            raise NsysOutputError(f"{self.source}: no NVTX range {name!r}; the ranges are "
                                  f"{sorted({n for n, _, _ in self.ranges})[:20]}")
        return found[0]

    def live(self) -> list[tuple[int, int]]:
        """(time, bytes live after the event) for every event, counted from the trace's start."""
        out, live = [], 0
        for t, b, op in self.events:
            live += b if op == ALLOC else -b
            out.append((t, live))
        return out

    def in_range(self, name: str) -> RangeMemory:
        start, end = self.range(name)
        inside = [(t, b, op) for t, b, op in self.events if start <= t <= end]
        lives = [v for t, v in self.live() if start <= t <= end]
        return RangeMemory(name, sum(op == ALLOC for _, _, op in inside),
                           sum(b for _, b, op in inside if op == ALLOC), sum(b for _, b, op in inside if op == FREE),
                           max(lives, default=0))


def read_memory(path: Path) -> MemoryTrace:
    path = Path(path)
    if not path.is_file():
        raise NsysOutputError(f"{path}: no such file")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "CUDA_GPU_MEMORY_USAGE_EVENTS" not in tables:
            raise NsysOutputError(f"{path}: no CUDA_GPU_MEMORY_USAGE_EVENTS (profile with --cuda-memory-usage=true)")
        events = tuple(db.execute("SELECT start, bytes, memoryOperationType FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                                  "WHERE memKind = ? ORDER BY start", (DEVICE_KIND,)))
        strings = dict(db.execute("SELECT id, value FROM StringIds")) if "StringIds" in tables else {}
        ranges = []
        if "NVTX_EVENTS" in tables:
            for start, end, text, text_id in db.execute(
                    "SELECT start, end, text, textId FROM NVTX_EVENTS WHERE eventType IN (?, ?) ORDER BY start",
                    (NVTX_PUSHPOP, NVTX_STARTEND)):
                name = text if text is not None else strings.get(text_id)
                if name is not None and end is not None:
                    ranges.append((range_name(name), start, end))
    finally:
        db.close()
    return MemoryTrace(path, events, tuple(ranges))


__all__ = ["ALLOC", "DEVICE_KIND", "FREE", "MemoryTrace", "RangeMemory", "read_memory"]
