"""Optional per-step timeline of FSDP's collectives (``FSDP(..., record_timeline=True)``).

Each all-gather (forward and backward), reduce-scatter and replicated-gradient all-reduce of one
step gets four timestamps:

  issue  the compute stream reached the call that launched it (NCCL cannot start it earlier: its
         stream waits for the compute stream at launch)
  ready  the collective completed
  need   the compute stream reached the point that needs the result: the layer's forward, the
         unpack of its saved weight in backward, the fold of a reduce-scatter into the shard's grad
  start  the compute stream went on past the wait

and stall = max(0, ready - need): compute time lost waiting for that collective.

CUDA (NCCL): timestamps are CUDA events; issue / need / start are recorded on the current
(compute) stream. ``work.wait()`` does not block the host: it makes the *current* stream wait on
NCCL's end event, so an event recorded on the compute stream after it marks max(need, ready), not
ready. For ready the work is also waited on from a private probe stream that runs nothing else;
an event recorded there fires when the collective completes. NCCL's ``wait`` releases its stash of
the input tensors, which is safe only after the compute stream has waited; the caller keeps the
inputs alive until then (``released`` in fsdp.py's _Pending and _PendingReduce). Nothing is read back during the step: the
events are resolved against the step's first event afterwards (finish_gradient_synchronization
has synchronised the device by then).

CPU (gloo): the host clock; ready comes from the work's future callback (run by gloo's thread when
the collective finishes). Works without a future (gloo's reduce-scatter) get ready = the time the
wait returned, an upper bound. Everywhere ready is clamped to start: the wait returned, so the
collective was complete.

The resolved timeline is plain JSON: ``columns`` names the fields of each row in ``rows``;
``summary`` is computed from every row, ``rows`` may be downsampled (stalled rows first).
"""
from __future__ import annotations

import time

import torch

COLUMNS = ("kind", "phase", "call", "unit", "prefetched", "issue_ms", "ready_ms", "need_ms", "start_ms", "stall_ms")
_IDX = {c: i for i, c in enumerate(COLUMNS)}


class Clock:
    """Timestamps on the compute stream (CUDA events) or the host (perf_counter)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self._probe = torch.cuda.Stream(device) if self.cuda else None
        self.source = "cuda events (compute stream; completion on a probe stream)" if self.cuda else "host clock"

    def now(self):
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream(self.device))
        return ev

    def on_complete(self, work, entry: dict) -> None:
        """Set entry["ready"] to when `work` completes, independent of when anyone waits on it."""
        if self.cuda:
            with torch.cuda.stream(self._probe):
                work.wait()  # the probe stream, not the compute stream, waits for NCCL
                entry["ready"] = self.now()
            return
        try:
            fut = work.get_future()
        except RuntimeError:  # not implemented for this work: resolved from the wait
            return
        fut.add_done_callback(lambda _f: entry.__setitem__("ready", time.perf_counter()))

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def ms(self, t0, mark) -> float | None:
        if mark is None:
            return None
        return t0.elapsed_time(mark) if self.cuda else (mark - t0) * 1e3


class StepRecorder:
    """Marks of one step; created by FSDP at the step's first forward, closed by its finish."""

    def __init__(self, clock: Clock, unit_names: list[str]):
        self.clock, self.unit_names = clock, unit_names
        self.t0 = clock.now()
        self.entries: list[dict] = []
        self.phases: list[tuple] = []
        self._open: tuple | None = None

    def now(self):
        return self.clock.now()

    def begin(self, phase: str) -> None:
        """Phases are consecutive: beginning one ends the previous."""
        mark = self.now()
        self.end(mark)
        self._open = (phase, mark)

    def end(self, mark=None) -> None:
        if self._open is not None:
            self.phases.append((*self._open, mark if mark is not None else self.now()))
            self._open = None

    def issue(self, kind: str, phase: str, call: int, unit: int, prefetched: bool) -> dict:
        entry = dict(kind=kind, phase=phase, call=call, unit=unit, prefetched=prefetched, issue=self.now())
        self.entries.append(entry)
        return entry

    def launched(self, entry: dict, work) -> None:
        """After the collective call: a blocking one is complete once the compute stream passes
        this point (CUDA: the stream was made to wait for it), an asynchronous one is watched."""
        if work is None:
            entry["ready"] = self.now()
        else:
            self.clock.on_complete(work, entry)

    def waited(self, entry: dict, need) -> None:
        entry["need"], entry["start"] = need, self.now()

    def resolve(self, max_rows: int | None = None) -> dict:
        self.clock.sync()
        self.end()
        rows = [self._row(e) for e in self.entries]
        span = self.clock.ms(self.t0, self.phases[-1][2]) if self.phases else None
        return dict(source=self.clock.source, columns=list(COLUMNS), units=self.unit_names,
                    phases=[dict(name=n, start_ms=self._ms(s), end_ms=self._ms(e)) for n, s, e in self.phases],
                    summary=summarize(rows, span), rows_total=len(rows), rows=downsample(rows, max_rows))

    def _ms(self, mark) -> float | None:
        v = self.clock.ms(self.t0, mark)
        return None if v is None else round(v, 4)

    def _row(self, e: dict) -> list:
        issue, need, start = self._ms(e["issue"]), self._ms(e.get("need")), self._ms(e.get("start"))
        ready = self._ms(e.get("ready"))
        if start is not None:
            ready = start if ready is None else min(ready, start)
        stall = None if ready is None or need is None else round(max(0.0, ready - need), 4)
        return [e["kind"], e["phase"], e["call"], e["unit"], e["prefetched"], issue, ready, need, start, stall]


def field(row: list, name: str):
    return row[_IDX[name]]


def summarize(rows: list[list], span_ms: float | None) -> dict:
    """Per (kind, phase): how many collectives, how many a consumer waited on (used), how many of
    those were ready in time (stall 0), the stall total and the largest stall; plus the step's
    exposed communication (every stall) and its span (first forward to the end of finish)."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        g = groups.setdefault((field(r, "kind"), field(r, "phase")),
                              dict(kind=field(r, "kind"), phase=field(r, "phase"), n=0, used=0, in_time=0,
                                   prefetched=0, stall_ms=0.0, max_stall_ms=0.0, max_stall_unit=None, comm_ms=0.0))
        g["n"] += 1
        g["prefetched"] += bool(field(r, "prefetched"))
        if field(r, "ready_ms") is not None:
            g["comm_ms"] += field(r, "ready_ms") - field(r, "issue_ms")
        stall = field(r, "stall_ms")
        if stall is None:
            continue  # nobody waited on it (a prefetch the call order did not use)
        g["used"] += 1
        g["in_time"] += stall == 0
        g["stall_ms"] += stall
        if stall > g["max_stall_ms"]:
            g["max_stall_ms"], g["max_stall_unit"] = stall, field(r, "unit")
    out = [dict(g, stall_ms=round(g["stall_ms"], 4), comm_ms=round(g["comm_ms"], 4)) for g in groups.values()]
    gathers = [g for g in out if g["kind"] == "all_gather"]
    return dict(groups=out, span_ms=None if span_ms is None else round(span_ms, 4),
                gathers=sum(g["used"] for g in gathers), gathers_in_time=sum(g["in_time"] for g in gathers),
                gather_stall_ms=round(sum(g["stall_ms"] for g in gathers), 4),
                exposed_ms=round(sum(g["stall_ms"] for g in out), 4))


def downsample(rows: list[list], max_rows: int | None) -> list[list]:
    """At most `max_rows` rows in their original order: the stalled ones (largest first, up to
    half) and evenly spaced others."""
    if max_rows is None or len(rows) <= max_rows:
        return rows
    stalled = sorted((i for i, r in enumerate(rows) if field(r, "stall_ms")), key=lambda i: -field(rows[i], "stall_ms"))
    keep = set(stalled[: max_rows // 2])
    rest = [i for i in range(len(rows)) if i not in keep]
    step = len(rest) / (max_rows - len(keep))
    keep.update(rest[int(k * step)] for k in range(max_rows - len(keep)))
    return [rows[i] for i in sorted(keep)]
