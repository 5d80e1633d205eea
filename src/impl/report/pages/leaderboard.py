"""The 2025 leaderboard: ours against SDPA cuDNN of one run, headline on do_bench (the handout's timer, §1.3.3)
beside the rows' own CUDA-event medians, and every stored run of the device as its version history."""
from __future__ import annotations

import re
from dataclasses import dataclass

from impl.bench.row import Metric
from impl.report import figures
from impl.report.flash_rows import IMPL_COLORS, IMPL_LABELS, MODE_LABELS, kernel, median_ms, pick, status_label
from impl.report.output import figure_path
from impl.report.pages import Context, Scored
from impl.report.ratio import Ratio, of_benches, ratio
from impl.report.rows import Bench, group
from impl.report.runs import RunsFacts, files_of
from impl.workloads.problems import Problem as P

PROBLEMS = (P.LEADERBOARD,)
PROBLEM = P.LEADERBOARD
OURS, ANCHOR = "flash_triton", "sdpa_cudnn"


@dataclass(frozen=True)
class Timers:  # one implementation's forward+backward under the two timers of one run (seconds)
    event_s: float  # the row's CUDA-event median (rounds of back-to-back calls)
    do_bench_s: float | None  # triton.testing.do_bench's median (the course's timer)
    mfu: float | None  # against the datasheet peak, from the event median

    @property
    def do_bench_over_event(self) -> float | None:
        return None if self.do_bench_s is None else self.do_bench_s / self.event_s

    @property
    def headline_s(self) -> float:  # do_bench's where the run has it
        return self.event_s if self.do_bench_s is None else self.do_bench_s


def _timers(b: Bench) -> Timers:
    db = b.metric(Metric.DO_BENCH_MS)
    return Timers(b.stats.median, None if db is None else db / 1e3, b.metric(Metric.MFU))


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
    course_ratio: Ratio | None  # ours ÷ cuDNN on do_bench medians (the course's timer)
    event_ratio: Ratio  # on the CUDA-event medians

    @property
    def headline(self) -> Ratio:
        return self.course_ratio or self.event_ratio

    @property
    def headline_timer(self) -> str:
        return "do_bench" if self.course_ratio is not None else "CUDA events"


@dataclass(frozen=True)
class Line:  # one newest row of the table
    impl: str
    label: str  # IMPL_LABELS'
    compiled: bool  # ours under torch.compile
    mode: str  # MODE_LABELS'
    status: str | None  # why it did not run; None: it ran (the other figures are read only then)
    ms: float | None
    do_bench_ms: float | None
    tflops: float | None
    mfu: float | None
    errors: tuple[float | None, ...]  # relative errors of O, dQ, dK, dV


def _line(b: Bench) -> Line:
    c, s, err = kernel(b), status_label(b), b.details.get("rel_err") or {}
    return Line(c.impl, IMPL_LABELS.get(c.impl, c.impl), bool(b.details.get("compiled")), MODE_LABELS[c.mode], s,
                None if s else median_ms(b), b.metric(Metric.DO_BENCH_MS), b.metric(Metric.TFLOPS),
                b.metric(Metric.MFU), tuple(err.get(k) for k in ("out", "dq", "dk", "dv")))


def short_config(text) -> str:
    """'BLOCK_M: 64, BLOCK_N: 128, num_warps: 4, ..., num_stages: 3, ...' -> '64×128 w4 s3'; other launch-record
    values (the tiling label, the variant, the tma flag) as they are."""
    v = dict(re.findall(r"(\w+): (\w+)", text)) if isinstance(text, str) else {}
    return f"{v['BLOCK_M']}×{v['BLOCK_N']} w{v.get('num_warps', '?')} s{v.get('num_stages', '?')}" if "BLOCK_M" in v \
        else str(text)


@dataclass(frozen=True)
class Version:  # one stored run: ours and cuDNN forward+backward of the same run
    when: str  # UTC, "YYYY-MM-DD HH:MM"
    commit: str
    legacy: bool  # the older format: its medians are do_bench's
    ours_s: float
    ours_mfu: float | None
    cudnn_s: float | None
    cudnn_mfu: float | None
    picks: tuple[tuple[str, str], ...]  # the autotuner's (kernel, short config) of ours

    @property
    def over_cudnn(self) -> float | None:
        return None if self.cudnn_s is None else self.ours_s / self.cudnn_s


def versions(rows: list[Bench]) -> list[Version]:  # every run in which ours ran, oldest first
    runs = group(rows, lambda b: (str(b.run.datetime), b.run.commit))
    out = []
    for (when, commit), g in sorted(runs.items()):
        ours, cudnn = (pick(g, impl=i, mode="fwd_bwd") for i in (OURS, ANCHOR))
        if ours is not None:
            picks = tuple((k, short_config(c)) for k, c in (ours.details.get("tuned_configs") or {}).items())
            out.append(Version(when[:16].replace("T", " "), commit, g[0].run.legacy, ours.stats.median,
                               ours.metric(Metric.MFU), cudnn and cudnn.stats.median,
                               cudnn and cudnn.metric(Metric.MFU), picks))
    return out


def _plot(vs: list[Version], path) -> None:
    fig, ax = figures.new(figsize=(8, 4.2))
    for impl, label, times in ((OURS, "ours: torch.compile(FlashAttentionTriton.apply)", [v.ours_s for v in vs]),
                               (ANCHOR, IMPL_LABELS[ANCHOR], [v.cudnn_s for v in vs])):
        pts = [(i, s * 1e3, v.legacy) for i, (v, s) in enumerate(zip(vs, times)) if s is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=IMPL_COLORS[impl], label=label, lw=1.2)
        for legacy, marker in ((True, "o"), (False, "s")):  # open: the older format's do_bench median
            sel = [p for p in pts if p[2] == legacy]
            ax.plot([p[0] for p in sel], [p[1] for p in sel], marker, color=IMPL_COLORS[impl], ms=5,
                    mfc="none" if legacy else IMPL_COLORS[impl])
    ax.set_xticks(list(range(len(vs))), [f"{v.when[5:]}\n{v.commit}" for v in vs], fontsize=7, rotation=30,
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
    lines: tuple[Line, ...] = ()
    runs: RunsFacts | None = None
    versions: tuple[Version, ...] = ()
    notes: tuple[str, ...] = ()  # the rows' `note` details
    sources: tuple[str, ...] = ()
    index_figures: tuple[tuple[str, str], ...] = ()  # the version history's (caption, link)

    @property
    def noise(self) -> tuple[float, float, int] | None:  # (lowest, highest ours/cuDNN, runs) of the newer format
        rs = [v.over_cudnn for v in self.versions if not v.legacy and v.cudnn_s is not None]
        return (min(rs), max(rs), len(rs)) if len(rs) > 1 else None

    @property
    def scores(self) -> dict[str, Scored]:
        return {PROBLEM: Scored.of(self.runs)}


def facts(ctx: Context) -> LeaderboardPage:  # the first GPU device whose newest rows have ours and cuDNN
    for device in ctx.rows.gpu_devices():
        lb = ctx.rows.of(PROBLEM, device=device)
        ours, cudnn = (pick(lb, impl=i, mode="fwd_bwd") for i in (OURS, ANCHOR))
        if ours is None or cudnn is None:
            continue
        c, t, tc = kernel(ours), _timers(ours), _timers(cudnn)
        err, tol = ours.details.get("rel_err") or {}, ours.details.get("tol") or {}
        right = Correctness(err["out"], max(err[k] for k in ("dq", "dk", "dv") if k in err), tol["out"], tol["grad"],
                            ours.details.get("graph_breaks")) if err and tol else None
        shape = f"{c.dtype}, causal, batch {c.batch} × {c.heads} heads × seq {c.seq} × d {c.d}"
        answer = LeaderboardFacts(device, shape, ours.run.when, ours.run.commit, t, tc, right,
                                  ratio(t.do_bench_s, tc.do_bench_s, "SDPA cuDNN"),
                                  of_benches(ours, cudnn, "SDPA cuDNN"))
        rows = [b for b in ctx.rows.history if b.problem == PROBLEM and b.run.device == device] + lb
        png, rel = figure_path(ctx.fig_dir, ctx.fig_rel, f"leaderboard-{device}")
        _plot(vs := versions(rows), png)
        caption = f"leaderboard versions on {ours.row.env.device}: ours forward+backward vs SDPA cuDNN per stored run"
        return LeaderboardPage(answer, tuple(map(_line, lb)), RunsFacts.of(device, lb), tuple(vs),
                               tuple(sorted({b.details["note"] for b in lb if b.details.get("note")})),
                               files_of(rows), ((caption, rel),))
    return LeaderboardPage(None)
