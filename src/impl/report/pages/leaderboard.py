"""The 2025 leaderboard: FlashAttention-2 forward+backward at bf16, causal, 16 heads × 16,384 × 64,
ours against SDPA cuDNN of the same run, and every stored run of the device as its version history.
templates/leaderboard.md.j2 holds every word.

The course times the leaderboard with `triton.testing.do_bench` (2025 handout §1.3.3), so the headline
ratio is do_bench's. The rows' own statistics come from CUDA-event rounds of back-to-back calls; both
are stored, and the page states how far apart they are for each implementation."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from impl.bench.row import Metric
from impl.report import figures
from impl.report.flash_rows import (IMPL_COLORS, IMPL_LABELS, MODE_LABELS, kernel, median_ms, newest_date, pick,
                                    status_label)
from impl.report.output import figure_path
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench
from impl.report.runs import RunsFacts
from impl.workloads.problems import Problem as P

PROBLEMS = (P.LEADERBOARD,)
PROBLEM = P.LEADERBOARD
OURS, ANCHOR = "flash_triton", "sdpa_cudnn"


@dataclass(frozen=True)
class Timers:
    """One implementation's forward+backward under the two timers of the same run (seconds)."""

    event_s: float  # the row's CUDA-event median (rounds of back-to-back calls)
    event_spread: float | None
    do_bench_s: float | None  # triton.testing.do_bench's median (the course's timer)
    mfu: float | None  # against the datasheet peak, from the event median

    @property
    def do_bench_over_event(self) -> float | None:
        return None if self.do_bench_s is None else self.do_bench_s / self.event_s

    @property
    def headline_s(self) -> float:
        """do_bench's median where the run has it (the course's timer), else the event median."""
        return self.event_s if self.do_bench_s is None else self.do_bench_s


@dataclass(frozen=True)
class Correctness:
    err_out: float
    err_grad: float  # the worst of dQ, dK, dV
    tol_out: float
    tol_grad: float
    graph_breaks: int | None

    @property
    def passes(self) -> bool:
        return self.err_out <= self.tol_out and self.err_grad <= self.tol_grad


@dataclass(frozen=True)
class LeaderboardFacts:
    device: str
    shape: str
    when: str  # the run's UTC time
    commit: str
    ours: Timers
    cudnn: Timers
    correctness: Correctness | None

    @property
    def course_ratio(self) -> Ratio | None:
        """Ours ÷ cuDNN on do_bench medians: the course's timer, the headline."""
        return ratio(self.ours.do_bench_s, self.cudnn.do_bench_s, "SDPA cuDNN")

    @property
    def event_ratio(self) -> Ratio:
        return ratio(self.ours.event_s, self.cudnn.event_s, "SDPA cuDNN", self.ours.event_spread,
                     self.cudnn.event_spread)

    @property
    def headline(self) -> Ratio:
        return self.course_ratio or self.event_ratio

    @property
    def headline_timer(self) -> str:
        return "do_bench" if self.course_ratio is not None else "CUDA events"


def _timers(b: Bench) -> Timers:
    db = b.metric(Metric.DO_BENCH_MS)
    return Timers(b.stats.median, spread(b.stats.stddev, b.stats.iqr), None if db is None else db / 1e3,
                  b.metric(Metric.MFU))


def _correctness(b: Bench) -> Correctness | None:
    err, tol = b.details.get("rel_err") or {}, b.details.get("tol") or {}
    if not (err and tol):
        return None
    return Correctness(err["out"], max(err[k] for k in ("dq", "dk", "dv") if k in err), tol["out"], tol["grad"],
                       b.details.get("graph_breaks"))


def leaderboard_facts(device: str, rows: list[Bench]) -> LeaderboardFacts | None:
    """The facts of one device's newest leaderboard rows; None unless ours and cuDNN both ran."""
    ours, cudnn = pick(rows, impl=OURS, mode="fwd_bwd"), pick(rows, impl=ANCHOR, mode="fwd_bwd")
    if ours is None or cudnn is None:
        return None
    c = kernel(ours)
    shape = f"{c.dtype}, causal, batch {c.batch} × {c.heads} heads × seq {c.seq} × d {c.d}"
    return LeaderboardFacts(device, shape, ours.run.when, ours.run.commit, _timers(ours), _timers(cudnn),
                            _correctness(ours))


# ---- the newest run's rows and every stored version --------------------------------------------------

@dataclass(frozen=True)
class Line:
    """One newest row of the table."""

    impl: str
    label: str  # IMPL_LABELS'
    compiled: bool  # ours under torch.compile
    mode: str  # MODE_LABELS'
    status: str | None  # why it did not run; None: it ran
    ms: float | None
    do_bench_ms: float | None
    tflops: float | None
    mfu: float | None
    errors: tuple[float | None, ...]  # relative errors of O, dQ, dK, dV


def _line(b: Bench) -> Line:
    c, s, err = kernel(b), status_label(b), b.details.get("rel_err") or {}
    return Line(c.impl, IMPL_LABELS.get(c.impl, c.impl), bool(b.details.get("compiled")), MODE_LABELS[c.mode], s,
                None if s else median_ms(b), None if s else b.metric(Metric.DO_BENCH_MS),
                None if s else b.metric(Metric.TFLOPS), None if s else b.metric(Metric.MFU),
                tuple(err.get(k) for k in ("out", "dq", "dk", "dv")))


def short_config(text) -> str:
    """'BLOCK_M: 64, BLOCK_N: 128, num_warps: 4, ..., num_stages: 3, ...' -> '64×128 w4 s3'; other
    launch-record values (the tiling label, the variant, the tma flag) as they are."""
    if not isinstance(text, str):
        return str(text)
    v = dict(re.findall(r"(\w+): (\w+)", text))
    if "BLOCK_M" not in v:
        return text
    return f"{v['BLOCK_M']}×{v['BLOCK_N']} w{v.get('num_warps', '?')} s{v.get('num_stages', '?')}"


@dataclass(frozen=True)
class Version:
    """One stored leaderboard run: ours and cuDNN forward+backward from the same run."""

    datetime: str
    commit: str
    legacy: bool  # the older format: its medians are do_bench's
    ours_s: float
    ours_mfu: float | None
    cudnn_s: float | None
    cudnn_mfu: float | None
    picks: tuple[tuple[str, str], ...]  # the autotuner's (kernel, short config) of ours

    @property
    def when(self) -> str:
        return self.datetime[:16].replace("T", " ")

    @property
    def over_cudnn(self) -> float | None:
        return None if self.cudnn_s is None else self.ours_s / self.cudnn_s


def versions(rows: list[Bench]) -> list[Version]:
    """Every run of `rows` (load order) in which ours ran, oldest first."""
    runs: dict[tuple[str, str], list[Bench]] = {}
    for b in rows:
        runs.setdefault((str(b.run.datetime), b.run.commit), []).append(b)
    out = []
    for (when, commit), g in sorted(runs.items()):
        ours, cudnn = pick(g, impl=OURS, mode="fwd_bwd"), pick(g, impl=ANCHOR, mode="fwd_bwd")
        if ours is not None:
            picks = tuple((k, short_config(c)) for k, c in (ours.details.get("tuned_configs") or {}).items())
            out.append(Version(when, commit, g[0].run.legacy, ours.stats.median, ours.metric(Metric.MFU),
                               cudnn and cudnn.stats.median, cudnn and cudnn.metric(Metric.MFU), picks))
    return out


def _plot(vs: list[Version], path: Path) -> None:
    fig, ax = figures.new(figsize=(8, 4.2))
    x = list(range(len(vs)))
    for key, label, color in (("ours", "ours: torch.compile(FlashAttentionTriton.apply)", IMPL_COLORS[OURS]),
                              ("cudnn", IMPL_LABELS[ANCHOR], IMPL_COLORS[ANCHOR])):
        pts = [(i, getattr(v, f"{key}_s") * 1e3, v.legacy) for i, v in zip(x, vs) if getattr(v, f"{key}_s") is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=color, label=label, lw=1.2)
        for legacy, marker in ((True, "o"), (False, "s")):
            sel = [p for p in pts if p[2] == legacy]
            ax.plot([p[0] for p in sel], [p[1] for p in sel], marker, color=color, ms=5,
                    mfc="none" if legacy else color)
    ax.set_xticks(x, [f"{v.datetime[5:16].replace('T', ' ')}\n{v.commit}" for v in vs], fontsize=7, rotation=30,
                  ha="right")
    ax.set(ylabel="forward+backward (ms, median)", title="leaderboard: every stored run (open marker: do_bench median, "
                                                          "older format; filled: CUDA-event median)")
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower left")
    figures.save(fig, path)


@dataclass(frozen=True)
class LeaderboardPage:
    answer: LeaderboardFacts | None  # None: no GPU device ran ours and cuDNN
    gpu: str = ""  # the GPU's name
    lines: tuple[Line, ...] = ()
    runs: RunsFacts | None = None
    versions: tuple[Version, ...] = ()
    figure: str = ""
    notes: tuple[str, ...] = ()  # the rows' `note` details
    date: str = "–"
    files: tuple[str, ...] = ()

    @property
    def noise(self) -> tuple[float, float, int] | None:
        """(lowest, highest ours/cuDNN, runs) over the newer-format runs: the spread between runs."""
        rs = [v.over_cudnn for v in self.versions if not v.legacy and v.cudnn_s is not None]
        return (min(rs), max(rs), len(rs)) if len(rs) > 1 else None

    @property
    def caption(self) -> str:
        return f"leaderboard versions on {self.gpu}: ours forward+backward vs SDPA cuDNN per stored run"

    @property
    def index_figures(self) -> list[tuple[str, str]]:
        return [(self.caption, self.figure)] if self.answer else []

    @property
    def scores(self) -> dict[str, Scored]:
        if self.answer is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        return {PROBLEM: Scored(Kind.MEASURED, self.answer.device, self.date)}

    @property
    def sources(self) -> list[str]:
        return list(self.files)


def facts(ctx: Context) -> LeaderboardPage:
    """The first GPU device whose newest rows have ours and cuDNN answers."""
    for device in ctx.rows.gpu_devices():
        lb = ctx.rows.of(PROBLEM, device=device)
        f = leaderboard_facts(device, lb) if lb else None
        if f is None:
            continue
        earlier = [b for b in ctx.rows.history if b.problem == PROBLEM and b.run.device == device]
        vs = versions(earlier + lb)
        png, rel = figure_path(ctx.fig_dir, ctx.fig_rel, f"leaderboard-{device}")
        _plot(vs, png)
        ours = pick(lb, impl=OURS, mode="fwd_bwd")
        notes = sorted({b.details["note"] for b in lb if b.details.get("note")})
        return LeaderboardPage(f, ours.row.env.device, tuple(_line(b) for b in lb), RunsFacts.of(device, lb),
                               tuple(vs), rel, tuple(notes), newest_date(lb),
                               tuple(sorted({b.run.file for b in earlier + lb if b.run.file})))
    return LeaderboardPage(None)
