"""memory_profiling: CUDA allocator history (torch.cuda.memory._record_memory_history/_snapshot),
the active-memory timeline with phase markers, its downsampling for the JSON, the residual-stream
size check and the largest allocations with the frames that made them.

Phase boundaries are marked by a tiny allocation the suite makes itself inside `_phase_marker`
(block boundaries, from impl.workloads.block_memory's hooks, inside `_block_marker`); each is found
again in the allocator trace by that frame name, so no clock is compared with another (the
trace's own timestamps and Python's clock need not agree).

Everything except `MemoryRecorder` works on plain snapshot-shaped dicts, so the CPU tests feed it
synthetic snapshots and it cannot rot where no GPU runs.
"""
from __future__ import annotations

import pickle
from collections import defaultdict
from pathlib import Path

import torch

from impl.model import cross_entropy
from impl.workloads.steps import autocast_ctx
from impl.runtime import synchronize

MARKER_FUNC = "_phase_marker"
BLOCK_MARKER_FUNC = "_block_marker"
ALLOC_ROUND = 512  # the caching allocator rounds every block up to a multiple of 512 bytes
FRAME_KEEP = ("impl/", "torch/nn/")


def _residual_stream_bytes(batch: int, seq: int, d_model: int, bytes_per_elem: int) -> int:
    """One residual-stream activation (batch, seq, d_model): the tensor each block's `x + ...`
    allocates."""
    return batch * seq * d_model * bytes_per_elem


try:  # the accounting module owns the closed-form models; fall back while it is not there
    from impl.accounting import residual_stream_bytes
except ImportError:  # pragma: no cover - depends on what else is installed
    residual_stream_bytes = _residual_stream_bytes


def rounded(nbytes: int) -> int:
    return max(ALLOC_ROUND, -(-nbytes // ALLOC_ROUND) * ALLOC_ROUND)


# --------------------------------------------------------------------------------------------
# Recording (CUDA only)
class MemoryRecorder:
    """Context manager around torch.cuda.memory._record_memory_history; `mark(name)` puts a phase
    boundary into the allocation trace."""

    def __init__(self, device: torch.device, max_entries: int = 1_000_000):
        self.device, self.max_entries = device, max_entries
        self.marks: list[str] = []
        self.block_marks: list[str] = []
        self.snapshot: dict | None = None

    def __enter__(self):
        synchronize(self.device)
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=self.max_entries, clear_history=True)
        return self

    def mark(self, name: str) -> None:
        self.marks.append(name)
        _phase_marker(self.device)

    def mark_block(self, name: str) -> None:
        self.block_marks.append(name)
        _block_marker(self.device)

    def __exit__(self, *exc):
        try:
            if exc[0] is None:
                synchronize(self.device)
                self.snapshot = torch.cuda.memory._snapshot()
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        return False

    def dump(self, path: Path) -> None:
        """The raw snapshot as pickle: drag it onto pytorch.org/memory_viz."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            pickle.dump(self.snapshot, f)


def _phase_marker(device: torch.device) -> None:
    # One 1-byte block, allocated and freed at once: its frame names the boundary in the trace.
    torch.empty(1, dtype=torch.uint8, device=device)


def _block_marker(device: torch.device) -> None:
    torch.empty(1, dtype=torch.uint8, device=device)  # as _phase_marker, under its own frame name


def phased_step(model, x, y, dtype: str, mode: str, optimizer=None, mark=lambda name: None) -> None:
    """forward (inference, no_grad) or a full training step, with `mark` at each phase boundary."""
    device = x.device
    if mode == "forward":
        mark("forward")
        with torch.no_grad(), autocast_ctx(dtype, device):
            model(x)
        mark("end")
        return
    if mode != "train_step":
        raise ValueError(f"mode must be forward or train_step, got {mode!r}")
    optimizer.zero_grad(set_to_none=True)
    mark("forward")
    with autocast_ctx(dtype, device):
        loss = cross_entropy(model(x), y)
    mark("backward")
    loss.backward()
    mark("optimizer")
    optimizer.step()
    mark("end")


# --------------------------------------------------------------------------------------------
# Analysis of snapshot-shaped data
def device_trace(snapshot: dict, device_index: int = 0) -> list[dict]:
    traces = snapshot.get("device_traces") or []
    return traces[device_index] if device_index < len(traces) else []


def end_active_bytes(snapshot: dict, device_index: int = 0) -> int:
    """Bytes held by live tensors when the snapshot was taken (blocks not yet freed)."""
    total = 0
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device_index:
            continue
        for b in seg.get("blocks", []):
            if b.get("state") in ("active_allocated", "active_pending_free"):
                total += b["size"]
    return total


def active_timeline(snapshot: dict, device_index: int = 0) -> tuple[list[int], list[int]]:
    """Active bytes after each trace entry. Allocation adds, completed free subtracts; memory
    that was live before recording started (the model's weights, say) is the baseline, found as
    the live total at the end minus the net change over the trace."""
    trace = device_trace(snapshot, device_index)
    deltas = []
    for e in trace:
        a = e.get("action")
        deltas.append(e["size"] if a == "alloc" else -e["size"] if a == "free_completed" else 0)
    level = end_active_bytes(snapshot, device_index) - sum(deltas)
    xs, ys = [], []
    for i, d in enumerate(deltas):
        level += d
        xs.append(i)
        ys.append(level)
    return xs, ys


def marker_indices(snapshot: dict, device_index: int = 0, func: str = MARKER_FUNC) -> list[int]:
    """Trace indices of the suite's marker allocations made inside `func`, in order."""
    return [i for i, e in enumerate(device_trace(snapshot, device_index))
            if e.get("action") == "alloc" and any(f.get("name") == func for f in e.get("frames", []))]


def downsample(xs: list, ys: list, max_points: int = 2000) -> tuple[list, list]:
    """At most `max_points` points: the first and last, and from each bucket its minimum and its
    maximum in the order they happened, so every rise and fall wider than a bucket (one layer's
    activations, the optimizer's spike) keeps both its top and its bottom; a max-only or mean
    downsample flattens them into a few straight segments."""
    n = len(xs)
    if n <= max_points:
        return list(xs), list(ys)
    if max_points < 4:
        raise ValueError(f"max_points must be at least 4, got {max_points}")
    buckets = (max_points - 2) // 2
    keep = {0, n - 1}
    for b in range(buckets):
        lo, hi = 1 + b * (n - 2) // buckets, 1 + (b + 1) * (n - 2) // buckets
        if hi > lo:
            keep.add(min(range(lo, hi), key=ys.__getitem__))
            keep.add(max(range(lo, hi), key=ys.__getitem__))
    order = sorted(keep)
    return [xs[j] for j in order], [ys[j] for j in order]


def timeline_data(snapshot: dict, marks: list[str], max_points: int = 2000, device_index: int = 0,
                  block_marks: list[str] = ()) -> dict:
    """JSON-ready timeline: x = allocator-trace index, y = active bytes, the phase markers and the
    block boundaries (`blocks`) by name, and the exact peak (before downsampling)."""
    xs, ys = active_timeline(snapshot, device_index)
    idx = marker_indices(snapshot, device_index)
    bidx = marker_indices(snapshot, device_index, BLOCK_MARKER_FUNC)
    dx, dy = downsample(xs, ys, max_points)
    return dict(x=dx, y=dy, markers=[dict(name=name, x=i) for name, i in zip(marks, idx)],
                blocks=[dict(name=name, x=i) for name, i in zip(block_marks, bidx)],
                n_events=len(xs), peak_bytes=max(ys) if ys else None,
                markers_found=len(idx), markers_expected=len(marks),
                blocks_found=len(bidx), blocks_expected=len(block_marks))


def _frames(entry: dict, keep=FRAME_KEEP, limit: int = 4) -> list[str]:
    out = []
    for f in entry.get("frames", []):
        fn = str(f.get("filename", ""))
        if any(k in fn for k in keep) and f.get("name") not in (MARKER_FUNC, BLOCK_MARKER_FUNC):
            short = fn.split("site-packages/")[-1].split("src/")[-1]
            out.append(f"{short}:{f.get('line')} {f.get('name')}")
        if len(out) >= limit:
            break
    return out


def largest_allocations(snapshot: dict, top: int = 10, device_index: int = 0) -> list[dict]:
    """The largest allocations in the trace, grouped by (size, call site): size, count and the
    impl/ or torch.nn frames that made them (innermost first)."""
    groups: dict = defaultdict(lambda: dict(count=0))
    for e in device_trace(snapshot, device_index):
        if e.get("action") != "alloc":
            continue
        frames = _frames(e)
        g = groups[(e["size"], tuple(frames))]
        g.update(size=e["size"], frames=frames)
        g["count"] += 1
    return sorted(groups.values(), key=lambda g: (-g["size"], -g["count"]))[:top]


def match_allocation(snapshot: dict, nbytes: int, device_index: int = 0) -> dict:
    """Whether the trace holds allocations of exactly `nbytes` (as the allocator rounds it), how
    many, and where the first was made."""
    want = rounded(nbytes)
    hits = [e for e in device_trace(snapshot, device_index) if e.get("action") == "alloc" and e["size"] == want]
    return dict(bytes=nbytes, allocator_bytes=want, found=bool(hits), count=len(hits),
                frames=_frames(hits[0]) if hits else [])
