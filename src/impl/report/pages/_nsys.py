"""Nsight Systems outputs as the pages read them: the folders impl.nsys.store files under
reports/data/<device>/nsys/<started UTC>_<commit>/ (the captures themselves are kept in the repository's history,
only named here, by each folder's CAPTURES.json: no git call), and the two-GPU cases' per-rank phase timelines
from their exports' extracts (never the SQLite)."""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Self

from impl.nsys.figure import draw_timeline
from impl.nsys.outputs import MANIFEST, CaseRecord, Manifest, read_manifest
from impl.nsys.extract import EXTRACT, MEMORY_SUFFIX, TIMELINE_SUFFIX, read_timeline_extract
from impl.nsys.store import CAPTURES, FILED, FOLDER, REP, TABLES
from impl.nsys.timeline import NvtxRange, Overlap, Timeline
from impl.report import figures
from impl.report.pages import Context
from impl.report.rows import group


SHORT = 12  # hex digits of a commit as the pages name it (unambiguous here: correctness/test_nsys_captures.py)


@dataclass(frozen=True)
class Capture:
    """A capture a filing kept (FILED.json) and the commit of the repository's history holding it, as its run
    folder's CAPTURES.json records it (None: not recorded, so the pages cannot say where it is)."""

    path: str  # in the tree, reports/data/...
    commit: str | None

    name = property(lambda self: self.path.rsplit("/", 1)[-1])
    short = property(lambda self: self.commit[:SHORT] if self.commit else None)

    def __str__(self) -> str:
        """What `git show` takes (`<commit>:<path>`), the path alone where the commit is not recorded."""
        return f"{self.short}:{self.path}" if self.commit else self.path


@dataclass(frozen=True)
class Filed:
    """One filed device call: its folder reports/data/<device>/nsys/<started UTC>_<commit>/ and the records there."""

    folder: Path
    manifest: Manifest
    filed: dict  # FILED.json
    captures: dict  # CAPTURES.json: {"<subfolder>/<name>": "<commit>"}

    device = property(lambda self: self.folder.parent.parent.name)
    stamp = property(lambda self: self.folder.name)  # <started UTC>_<commit>
    rel = property(lambda self: f"reports/data/{self.device}/{FOLDER}/{self.stamp}")  # as sources name the folder
    when = property(lambda self: f"{self.stamp[:4]}-{self.stamp[4:6]}-{self.stamp[6:8]} {self.stamp[9:11]}:"
                                 f"{self.stamp[11:13]}")
    commit = property(lambda self: self.manifest.commit)
    note = property(lambda self: self.filed.get("note", ""))
    lost = property(lambda self: self.filed.get("lost_files", {}))

    @classmethod
    def read(cls, folder: Path) -> Filed:
        records = (json.loads((folder / f).read_text()) if (folder / f).is_file() else {} for f in (FILED, CAPTURES))
        return cls(folder, read_manifest(folder / MANIFEST), *records)

    def cases(self, group: str) -> list[CaseRecord]:
        return [c for c in self.manifest.cases if c.group == group]

    def _file(self, sub: str, name: str) -> Path | None:
        return p if (p := self.folder / sub / name).is_file() else None

    def table(self, case: str, report: str) -> Path | None:
        return self._file(TABLES, f"{case}_{report}.csv")

    def timeline(self, case: str) -> Path | None:  # the export's kernel timeline (impl.nsys.extract)
        return self._file(EXTRACT, f"{case}{TIMELINE_SUFFIX}")

    def memory(self, case: str) -> Path | None:  # its device-memory trace, for a memory case
        return self._file(EXTRACT, f"{case}{MEMORY_SUFFIX}")

    @property
    def reps(self) -> list[Capture]:
        """The GUI reports the filing kept (FILED.json), in the filing's order, each with the commit CAPTURES.json
        records for it (impl.nsys.captures)."""
        return [Capture(f"{self.rel}/{REP}/{n}", self.captures.get(f"{REP}/{n}"))
                for n in self.filed.get("kept", {}).get(REP, [])]

    def rep(self, case: str) -> Capture | None:
        """The case's kept GUI report, None if none (from the folder's records alone: no git call)."""
        return next((r for r in self.reps if r.name == f"{case}.nsys-rep"), None)

    def rel_of(self, path: Path) -> str:
        return f"{self.rel}/{Path(path).relative_to(self.folder).as_posix()}"


def newest_with(reports_dir: Path, group: str) -> Filed | None:
    """The newest filed nsys call under reports_dir/data (by stamp) with a profiled case of `group`."""
    folders = [p for p in sorted(Path(reports_dir, "data").glob(f"*/{FOLDER}/*/"))
               if not p.name.startswith(".") and (p / MANIFEST).is_file()]
    found = [f for f in map(Filed.read, folders) if any(c.status == "profiled" for c in f.cases(group))]
    return max(found, key=lambda f: (f.stamp, f.folder), default=None)


@dataclass(frozen=True)
class CollectiveKernels:
    """One rank's NCCL kernels of one collective in the step, and how long its compute sat waiting for them
    (impl.nsys.timeline.Timeline.waits): in the whole step and among those launched inside forward."""

    collective: str  # its NVTX name ("ncclAllGather")
    kernels: int
    waited: int  # kernels its compute sat waiting for
    wait_ms: float
    forward: int  # kernels launched inside forward
    forward_waited: int
    forward_wait_ms: float

    @classmethod
    def of(cls, collective: str, waits) -> CollectiveKernels:
        fwd = [(k, w) for k, w in waits if "forward" in k.ranges]
        return cls(collective, len(waits), sum(w > 0 for _, w in waits), sum(w for _, w in waits) / 1e6, len(fwd),
                   sum(w > 0 for _, w in fwd), sum(w for _, w in fwd) / 1e6)


@dataclass(frozen=True)
class RankPhases:
    """One rank's phases in one step (NVTX ranges, host time: each ends in whatever wait its code does), the
    collectives its NCCL ranges show it issuing, and, where the export holds its kernels, what its GPU ran."""

    rank: int  # by process start order (the ranks' pids in order)
    step_ms: float
    phases: tuple[tuple[str, float], ...]  # (phase, ms), in the step's order
    issued: tuple[tuple[str, int, int, int], ...]  # (collective, calls, inside forward, inside backward)
    device: int | None = None  # the GPU its kernels ran on (None: none recorded)
    kernels: int = 0  # kernels recorded in the step (started inside the rank's step range)
    nccl_kernels: int = 0
    recorded_share: float | None = None  # kernels ÷ the most any rank recorded in a measured step (None: no kernels)
    overlap: Overlap | None = None  # its GPU over the step: compute, NCCL and both (ns)
    waited: tuple[CollectiveKernels, ...] = ()  # per collective issued
    backward_gap_ms: float | None = None  # the longest stretch of its backward without a kernel launch recorded

    def phase(self, name: str) -> float | None:
        return next((ms for n, ms in self.phases if n == name), None)

    def wait(self, collective: str) -> CollectiveKernels | None:
        return next((w for w in self.waited if w.collective == collective), None)

    exposed_ms = property(lambda self: None if self.overlap is None  # NCCL kernel time its compute did not overlap
                          else (self.overlap.nccl_ns - self.overlap.both_ns) / 1e6)

    @property
    def complete(self) -> bool:
        """Its kernels look whole: the most kernels a measured step recorded (to 1%), one NCCL kernel per
        collective call issued, and no stretch of backward longer than LAUNCH_GAP_MS without a kernel launch."""
        return (self.recorded_share is not None and self.recorded_share >= COMPLETE_SHARE
                and all(self.whole(c) for c, *_ in self.issued)
                and (self.backward_gap_ms is None or self.backward_gap_ms <= LAUNCH_GAP_MS))

    def whole(self, collective: str, phase: str | None = None) -> bool:
        """One kernel recorded per call of `collective` issued (inside `phase`: "forward" only, or the whole step)."""
        i, w = next((x for x in self.issued if x[0] == collective), None), self.wait(collective)
        return i is not None and w is not None and (w.forward == i[2] if phase == "forward" else w.kernels == i[1])


COMPLETE_SHARE = 0.99  # RankPhases.complete: the share of the most kernels a measured step recorded
# RankPhases.complete: a backward launches kernels without pause (2026-11-26's whole ranks: at most 7 ms between
# launches; the ranks that lost records: 49.7 ms and more, with as many kernels as their peer in the naive 2025 case)
LAUNCH_GAP_MS = 25.0


@dataclass(frozen=True)
class StepTimeline:
    """One two-GPU case's measured step (the one whose kernel trace is most complete; the last without kernels):
    each rank's phases and kernels, and the figure."""

    label: str
    ranks: tuple[RankPhases, ...]
    figure: str
    kernels: int  # kernels the export holds in the step's window (0: NVTX only)
    overlap: tuple[Overlap, ...]
    sources: tuple[str, ...]  # the extract and the GUI report, as sources name them
    rep: Capture | None  # the GUI report (Filed.rep), None if not kept
    step: str = "step 1"  # the measured step shown

    step_ms = property(lambda self: max(r.step_ms for r in self.ranks))
    complete = property(lambda self: bool(self.kernels) and all(r.complete for r in self.ranks))


# The phases a distributed step's ranks mark (impl.nsys.workloads), in step order.
STEP_PHASES = ("forward", "backward", "finish_gradient_synchronization", "optimizer step")


def _launch_gap_ms(kernels: list, span: NvtxRange | None) -> float | None:
    """The longest stretch of `span` (host time) in which none of `kernels` was launched (ms; None: no span)."""
    if span is None:
        return None
    ts = sorted([span.start_ns, span.end_ns] + [t for k in kernels if span.start_ns <= (
        t := k.launch_ns if k.launch_ns is not None else k.start_ns) <= span.end_ns])
    return max(b - a for a, b in zip(ts, ts[1:])) / 1e6


def _rank_phases(tl: Timeline, rank: int, st: NvtxRange, ks: list, most: int, collectives: Sequence[str]) -> RankPhases:
    """The rank's phases from its step range `st` and the kernels `ks` it launched inside it."""
    inside = group((r for r in tl.ranges if r.pid == st.pid and r.start_ns >= st.start_ns and r.end_ns <= st.end_ns),
                   lambda r: r.name)  # the rank's ranges in its step, by name
    got = tuple((n, sum(r.duration_ns for r in inside[n]) / 1e6) for n in STEP_PHASES if n in inside)
    fwd, bwd = inside.get("forward", []), inside.get("backward", [])

    def within(r, spans):
        return any(s.start_ns <= r.start_ns <= s.end_ns for s in spans)

    issued = tuple((c, len(rs), sum(within(r, fwd) for r in rs), sum(within(r, bwd) for r in rs))
                   for c in collectives if (rs := inside.get(c)))
    dev = Counter(x.device for x in ks).most_common(1)[0][0] if ks else None
    own = replace(tl, kernels=tuple(ks))
    waited = tuple(CollectiveKernels.of(c, own.waits(dev, c.removeprefix("nccl")))
                   for c, *_ in issued if dev is not None)
    return RankPhases(rank, st.duration_ns / 1e6, got, issued, dev, len(ks), sum(x.nccl for x in ks),
                      len(ks) / most if most else None, own.overlap()[0] if ks else None, waited,
                      _launch_gap_ms(ks, bwd[0] if bwd and ks else None))


def step_timeline(filed: Filed, case: str, label: str, ctx: Context, collectives: Sequence[str]) -> StepTimeline | None:
    """A measured step of `case` from its filed export, drawn into ctx.fig_dir; None without one. The step shown has
    the most whole ranks, then the most kernels in its least complete rank, then in all, the later on a tie."""
    path = filed.timeline(case)
    if path is None:
        return None
    tl = read_timeline_extract(path)  # an NVTX-only export's (no kernels) still has its phases
    steps = tl.measured_steps()
    # per step, each rank's step range and the kernels it launched inside it (the step open at the launch)
    ranks = {s: [(tl.named(s, pid)[-1], [k for k in tl.kernels if k.pid == pid and s in k.ranges])
                 for pid in sorted({r.pid for r in tl.named(s)})] for s in steps}
    most = max((len(ks) for s in steps for _, ks in ranks[s]), default=0)
    per_step = {s: [_rank_phases(tl, k, st, ks, most, collectives) for k, (st, ks) in enumerate(ranks[s])]
                for s in steps}
    step = max(steps, key=lambda s: (sum(r.complete for r in per_step[s]), min(r.kernels for r in per_step[s]),
                                     sum(r.kernels for r in per_step[s]), steps.index(s)))
    start, end = tl.window(step)
    win = tl.between(start, end)
    title = figures.words("nsys_step").title.format(label=label, step=step)
    png, link = ctx.figure_file(f"nsys-{case}.png")
    draw_timeline(win, png, title, window=(start, end), range_names=(step, *STEP_PHASES, *collectives))
    rep = filed.rep(case)
    srcs = (filed.rel_of(path), str(rep)) if rep else (filed.rel_of(path),)
    return StepTimeline(label, tuple(per_step[step]), link, len(win.kernels),
                        tuple(win.overlap()) if win.kernels else (), srcs, rep, step)


def profiled_steps(ctx: Context, group: str, label_of: Callable[[dict], str | None],
                   collectives: Sequence[str]) -> tuple[Filed | None, list[tuple[dict, StepTimeline]]]:
    """The newest filed call of `group` and, per profiled case whose workload args `label_of` names
    (None: skipped), its args and last measured step (step_timeline, drawn into ctx.fig_dir)."""
    filed, found = newest_with(ctx.reports_dir, group), []
    for c in filed.cases(group) if filed else []:
        args = c.workload.get("args", {})
        if c.status == "profiled" and (label := label_of(args)) is not None:
            t = step_timeline(filed, c.name, label, ctx, collectives)
            found += [(args, t)] if t is not None else []
    return filed, found


@dataclass(frozen=True)
class Profiled:
    """A section's newest Nsight Systems call: each profiled case's workload args and its last measured step, in the
    page's order (ddp, fsdp and leaderboard_2026 subclass it)."""

    filed: Filed
    timelines: tuple[tuple[dict, StepTimeline], ...]  # (workload args, timeline)

    complete_share = COMPLETE_SHARE  # the words state them
    launch_gap_ms = LAUNCH_GAP_MS
    context = property(lambda self: int(self.timelines[0][0]["context"]))  # the first case's
    batch = property(lambda self: int(self.timelines[0][0]["batch"]))
    kernels = property(lambda self: sum(t.kernels for _, t in self.timelines))

    @property
    def sources(self) -> list[str]:
        return [f"{self.filed.rel}/manifest.json"] + [x for _, t in self.timelines for x in t.sources]

    @classmethod
    def of(cls, ctx: Context, section: str, label, collectives: tuple[str, ...], order) -> Self | None:
        """`label(args)` names a case's figure (None: not read); `order(args)` sorts the cases."""
        filed, steps = profiled_steps(ctx, section, label, collectives)
        return cls(filed, tuple(sorted(steps, key=lambda s: order(s[0])))) if steps else None
