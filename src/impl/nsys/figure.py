"""The per-stream timeline figure of an nsys export: ddp (b) and fsdp_accounting (b) ask for a
picture in which a reader sees whether communication ran while compute did.

One time axis (ms from the window's start). Below: one lane per stream per device (rank), compute
kernels in blue, NCCL kernels in orange, each lane's kernels merged where closer than a pixel. Above:
each process's NVTX ranges, nested ranges one row lower, coloured by name (legend: the names
drawn). The backend and the PNG metadata match impl.report.figures (Agg, no software/date stamp),
so a rebuild from the same data writes the same bytes.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from impl.bench.traces import merge_intervals  # noqa: E402
from impl.nsys.timeline import NvtxRange, Timeline  # noqa: E402

COMPUTE, NCCL = "C0", "C1"
_RANGE_COLOURS = ("C2", "C4", "C6", "C8", "C9", "C5", "C3", "C7")
PIXELS = 1800  # horizontal resolution the lanes are merged to (the figure is ~16 in at 110 dpi)


def _levels(ranges: list[NvtxRange]) -> list[int]:
    """Nesting row of each range (by start): the first row whose last range has ended."""
    ends: list[int] = []
    out = []
    for r in ranges:
        row = next((i for i, e in enumerate(ends) if e <= r.start_ns), None)
        if row is None:
            ends.append(r.end_ns)
            row = len(ends) - 1
        else:
            ends[row] = r.end_ns
        out.append(row)
    return out


def _pid_devices(tl: Timeline) -> dict[int, int]:
    """Each process's device: the one most of its kernels ran on (rank r drives GPU r)."""
    counts: dict[int, Counter] = {}
    for k in tl.kernels:
        counts.setdefault(k.pid, Counter())[k.device] += 1
    return {pid: c.most_common(1)[0][0] for pid, c in counts.items()}


def draw_timeline(tl: Timeline, path: Path, title: str, *, window: tuple[int, int] | None = None,
                  range_names: Sequence[str] | None = None, max_levels: int = 3) -> Path:
    """PNG of `tl` within `window` (ns, default: its kernels' span) at `path`. `range_names`: only
    these NVTX ranges are drawn (default: all), at most `max_levels` nested rows per process."""
    start, end = window or (min((k.start_ns for k in tl.kernels), default=0), max((k.end_ns for k in tl.kernels), default=0))
    tl = tl.between(start, end)
    if not tl.kernels and not any(range_names is None or r.name in range_names for r in tl.ranges):
        raise ValueError(f"{tl.source}: no kernel ran and no range was open in the window [{start}, {end}] ns: "
                         "nothing to draw")
    ms = lambda t: (t - start) / 1e6  # noqa: E731
    span_ms = ms(end)
    gap = span_ms / PIXELS
    lanes = tl.lanes()
    # a lane is labelled NCCL where most of its kernels are (a stray NCCL kernel on the compute stream does not count)
    per_lane = Counter((k.lane, k.nccl) for k in tl.kernels)
    nccl_lanes = {ln for ln in tl.nccl_lanes() if per_lane[(ln, True)] > per_lane[(ln, False)]}
    devices = _pid_devices(tl)
    shown = [r for r in tl.ranges if range_names is None or r.name in range_names]
    # top to bottom, per device: its process's NVTX rows, then its streams
    blocks: list[tuple[str, object]] = []
    pids_of: dict[int | None, list[int]] = {}
    for pid in sorted({r.pid for r in shown}):
        pids_of.setdefault(devices.get(pid), []).append(pid)
    for dev in sorted({ln.device for ln in lanes} | {d for d in pids_of if d is not None}):
        for pid in pids_of.get(dev, []):
            rs = [r for r in shown if r.pid == pid]
            blocks.append((f"NVTX, GPU {dev}", [(r, lv) for r, lv in zip(rs, _levels(rs)) if lv < max_levels]))
        blocks += [(f"GPU {ln.device} stream {ln.stream} ({'NCCL' if ln in nccl_lanes else 'compute'})", ln)
                   for ln in lanes if ln.device == dev]
    for pid in pids_of.get(None, []):  # a process that ran no kernel in the window
        rs = [r for r in shown if r.pid == pid]
        blocks.append((f"NVTX, pid {pid}", [(r, lv) for r, lv in zip(rs, _levels(rs)) if lv < max_levels]))
    height = sum(max((lv for _, lv in b), default=0) + 1 if isinstance(b, list) else 1 for _, b in blocks)

    fig, ax = plt.subplots(figsize=(16, 1.2 + 0.42 * height))
    y, ticks, labels = 0.0, [], []
    # a range keeps its colour from figure to figure: range_names' order first, then as met
    colour_of: dict[str, str] = {n: _RANGE_COLOURS[i % len(_RANGE_COLOURS)] for i, n in enumerate(range_names or ())}
    for label, block in reversed(blocks):  # drawn bottom-up
        if not isinstance(block, list):  # a stream
            ks = [k for k in tl.kernels if k.lane == block]
            for nccl, colour in ((False, COMPUTE), (True, NCCL)):
                iv = merge_intervals([(ms(k.start_ns), ms(k.end_ns)) for k in ks if k.nccl == nccl], gap)
                if iv:
                    ax.broken_barh([(s, max(e - s, gap)) for s, e in iv], (y + 0.1, 0.8), color=colour, lw=0)
            ticks.append(y + 0.5)
            labels.append(label)
            y += 1
            continue
        depth = max((lv for _, lv in block), default=0) + 1
        bars: dict[tuple[float, str], list[tuple[float, float]]] = {}  # one collection a row and colour: thousands
        for r, lv in block:                                              # of ranges drew in seconds one by one
            colour = colour_of.setdefault(r.name, _RANGE_COLOURS[len(colour_of) % len(_RANGE_COLOURS)])
            row_y = y + (depth - 1 - lv)  # outermost range on top
            x0, w = ms(max(r.start_ns, start)), ms(min(r.end_ns, end)) - ms(max(r.start_ns, start))
            bars.setdefault((row_y, colour), []).append((x0, max(w, gap)))
            if w > span_ms / 25:  # label ranges wide enough to hold their name
                ax.text(x0 + w / 2, row_y + 0.5, r.name, ha="center", va="center", fontsize=7, clip_on=True)
        for (row_y, colour), xs in bars.items():
            ax.broken_barh(xs, (row_y + 0.1, 0.8), color=colour, alpha=0.55, lw=0.5, edgecolor="0.3")
        ticks.append(y + depth / 2)
        labels.append(label)
        y += depth
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.set_ylim(0, y)
    ax.set_xlim(0, span_ms)
    ax.set_xlabel("time (ms) from the window's start")
    ax.grid(axis="x", color="0.85", lw=0.5)
    ax.set_axisbelow(True)
    handles = [Patch(color=COMPUTE, label="compute kernels"), Patch(color=NCCL, label="NCCL kernels")] if tl.kernels else []
    drawn = {r.name for _, b in blocks if isinstance(b, list) for r, _ in b}
    handles += [Patch(color=c, alpha=0.55, label=n) for n, c in colour_of.items() if n in drawn]
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    names = sorted(set(tl.gpus.values()))
    ax.set_title(title + (f" ({', '.join(names)})" if names else ""), fontsize=10)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path


__all__ = ["draw_timeline"]
