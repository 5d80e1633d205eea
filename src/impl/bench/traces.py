"""Profiler traces of distributed steps, as timelines: when compute and communication ran in one
profiled step, as merged busy intervals per lane with the annotated phases, and how much of the
communication overlapped compute.

On a GPU the lanes are kernels from the profiler's Chrome trace (NCCL kernels on the
communication lane); on the CPU (gloo smoke runs) no kernels exist, so top-level aten ops stand in
for compute and c10d / gloo ops for communication.
"""
from __future__ import annotations

import json
import os
import re
import tempfile

from impl.annotate import PHASES as ANNOTATED

_COMM = re.compile(r"nccl|gloo|c10d|all_?reduce|broadcast|all_?gather|reduce_?scatter", re.IGNORECASE)


def merge_intervals(intervals: list[tuple[float, float]], gap: float) -> list[list[float]]:
    """Union of (start, end) intervals, joining neighbours closer than `gap`."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def busy_length(iv: list[list[float]]) -> float:
    return sum(e - s for s, e in iv)


def overlap_length(a: list[list[float]], b: list[list[float]]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


SYNC = "finish_gradient_synchronization"  # the annotated wait for a DDP's / FSDP's collectives
# A distributed step's annotated phases (impl.workloads.dist_steps.train_step), in order.
PHASES = (*ANNOTATED[:2], SYNC, ANNOTATED[2])


def build_timeline(ops, phases, start_us: float, max_intervals: int, source: str) -> dict:
    """Lanes of one profiled step from `ops` = [(lane, start_us, end_us)] and the annotated
    `phases` = [(name, start_us, end_us)], both on the profiler's clock, from `start_us` on.

    Each lane is merged (gaps below span / max_intervals joined) so the JSON stays small; busy
    and overlap totals are computed before that coarsening."""
    lanes: dict[str, list] = {"compute": [], "communication": []}
    for lane, s, e in ops:
        if s >= start_us:
            lanes[lane].append((s, e))
    exact = {k: merge_intervals(v, 0.0) for k, v in lanes.items()}
    end = max([iv[-1][1] for iv in exact.values() if iv] + [start_us])
    span = end - start_us
    out = dict(span_us=span, busy_us={k: busy_length(v) for k, v in exact.items()},
               overlap_us=overlap_length(exact["compute"], exact["communication"]), source=source, lanes={},
               phases=[dict(name=n, start_us=s - start_us, dur_us=e - s) for n, s, e in phases if s >= start_us])
    for k, iv in exact.items():
        gap, coarse = 0.0, iv
        while len(coarse) > max_intervals:
            gap = max(gap * 2, span / max_intervals)
            coarse = merge_intervals([tuple(x) for x in iv], gap)
        out["lanes"][k] = [[round(s - start_us, 1), round(e - s, 1)] for s, e in coarse]
    return out


def cuda_timeline(prof, last_step: str, max_intervals: int) -> dict:
    """GPU: every kernel from the profiler's Chrome trace (kernel events carry start and
    duration there; NCCL kernels on the "communication" lane, all others on "compute"); every
    step ends in a device sync, so kernels starting after the last step's CPU start belong to it."""
    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    ann = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in spans
           if e.get("cat") == "user_annotation"]
    start = max(s for n, s, _ in ann if n == last_step)
    ops = [("communication" if "nccl" in e["name"].lower() else "compute", float(e["ts"]), float(e["ts"]) + float(e["dur"]))
           for e in spans if e.get("cat") == "kernel"]
    return build_timeline(ops, [a for a in ann if a[0] in PHASES], start, max_intervals, "cuda kernels")


def cpu_timeline(prof, last_step: str, max_intervals: int) -> dict:
    """CPU (gloo smoke runs): no kernels exist, so top-level aten ops stand in for compute and
    c10d / gloo ops for communication."""
    events = prof.events()
    start = max(e.time_range.start for e in events if e.name == last_step)
    ops, phases = [], []
    for e in events:
        s, t = e.time_range.start, e.time_range.end
        if e.name in PHASES:
            phases.append((e.name, s, t))
        elif _COMM.search(e.name):
            ops.append(("communication", s, t))
        elif e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops.append(("compute", s, t))
    return build_timeline(ops, phases, start, max_intervals, "cpu ops (no kernels on this device)")


def step_timeline(prof, last_step: str, max_intervals: int, cuda: bool) -> dict:
    """The timeline of the profiled step annotated `last_step`."""
    return (cuda_timeline if cuda else cpu_timeline)(prof, last_step, max_intervals)


__all__ = ["PHASES", "SYNC", "build_timeline", "busy_length", "merge_intervals", "overlap_length", "step_timeline"]
