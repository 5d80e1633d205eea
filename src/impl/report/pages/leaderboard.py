"""The 2025 leaderboard: ours against SDPA cuDNN of one run, headlined by the rows' own CUDA-event medians
(impl.report.ratio.headline) with do_bench (the handout's timer, §1.3.3) beside, every row's ratio to each SDPA
backend, and every stored run of the device as its version history. Ours is, per run, the faster forward+backward of
our two rows: the Triton kernels (flash_triton) and the kernel table's (flash_auto, where a run has it): a leaderboard
entry is one's best."""
from __future__ import annotations

import re
from dataclasses import dataclass

from impl.report import figures
from impl.report.flash_rows import IMPL_COLORS, IMPL_LABELS, MODE_LABELS, kernel, pick, probe_check, status_label
from impl.report.pages import Context, Scored
from impl.report.ratio import Headline, Ratio, headline, of_benches, timers
from impl.report.rows import Bench, group
from impl.report.runs import RunsFacts, files_of
from impl.report.timer_probe import ProbeCheck
from impl.workloads.problems import Problem as P

PROBLEMS = (P.LEADERBOARD,)
PROBLEM = P.LEADERBOARD
OURS, ANCHOR = ("flash_triton", "flash_auto"), "sdpa_cudnn"  # flash_auto: FlashOptions(kernels="auto")
AUTO = "flash_auto"
BACKENDS = ("sdpa_cudnn", "sdpa_flash")  # every line's ratio to each, same pass
WORDS = figures.words("leaderboard")  # the words drawn into the version-history figure


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

    @classmethod
    def of(cls, b: Bench) -> Correctness | None:  # ours' row's relative errors against the test's tolerances
        err, tol = b.details.get("rel_err") or {}, b.details.get("tol") or {}
        return cls(err["out"], max(err[k] for k in ("dq", "dk", "dv") if k in err), tol["out"], tol["grad"],
                   b.details.get("graph_breaks")) if err and tol else None


@dataclass(frozen=True)
class LeaderboardFacts:  # ours and cuDNN forward+backward of the device's newest run (their run, metrics: the rows')
    device: str
    ours: Bench
    cudnn: Bench
    headline: Headline  # ours ÷ cuDNN of the CUDA-event medians, do_bench beside (impl.report.ratio)
    probe: ProbeCheck | None = None  # the do_bench-against-events probe at this shape (impl.report.timer_probe)

    kernel = property(lambda self: kernel(self.ours))  # the shape (dtype, causal, batch, heads, seq, d)
    correctness = property(lambda self: Correctness.of(self.ours))


@dataclass(frozen=True)
class Line:  # one newest row of the table (the template reads its metrics and details)
    b: Bench
    backends: tuple[Bench | None, ...] = (None, None)  # BACKENDS' measured rows of the same pass

    impl = property(lambda self: kernel(self.b).impl)
    label = property(lambda self: IMPL_LABELS.get(self.impl, self.impl))
    mode = property(lambda self: MODE_LABELS[kernel(self.b).mode])
    status = property(lambda self: status_label(self.b))  # why it did not run; None: it ran
    # its CUDA-event median and do_bench's, with the noise verdict (None: it did not run)
    timers = property(lambda self: None if self.status else timers(self.b))
    errors = property(lambda self: tuple((self.b.details.get("rel_err") or {}).get(k)  # of O, dQ, dK, dV
                                         for k in ("out", "dq", "dk", "dv")))

    @property
    def over(self) -> tuple[Ratio | None, ...]:  # its median ÷ each of BACKENDS' (None: either did not run, or itself)
        return tuple(None if a is None or a is self.b or self.status else of_benches(self.b, a) for a in self.backends)

    @classmethod
    def of(cls, b: Bench, rows: list[Bench]) -> Line:
        return cls(b, tuple(pick(rows, impl=i, mode=kernel(b).mode) for i in BACKENDS))


def short_config(text) -> str:
    """'BLOCK_M: 64, BLOCK_N: 128, num_warps: 4, ..., num_stages: 3, ...' -> '64×128 w4 s3'; a Gluon config's repr
    without its options that are off ('GluonWsConfig(block_m=64, ..., lpt=False)' -> 'GluonWsConfig(block_m=64, ...)':
    the trials, off by default); other launch-record values (the tiling label, the variant, the tma flag) as they are."""
    v = dict(re.findall(r"(\w+): (\w+)", text)) if isinstance(text, str) else {}
    if "BLOCK_M" in v:
        return f"{v['BLOCK_M']}×{v['BLOCK_N']} w{v.get('num_warps', '?')} s{v.get('num_stages', '?')}"
    return re.sub(r"(,\s)?\b\w+=False\b(,\s)?", lambda m: ", " if m[1] and m[2] else "", text) \
        if isinstance(text, str) else str(text)


@dataclass(frozen=True)
class Version:  # one stored run: ours' and cuDNN's forward+backward rows of it
    ours: Bench
    cudnn: Bench | None

    run = property(lambda self: self.ours.run)  # its UTC time, commit, format (older: the medians are do_bench's)
    impl = property(lambda self: kernel(self.ours).impl)  # which of OURS was the faster
    ours_s = property(lambda self: self.ours.stats.median)
    cudnn_s = property(lambda self: self.cudnn and self.cudnn.stats.median)
    over_cudnn = property(lambda self: None if self.cudnn_s is None else self.ours_s / self.cudnn_s)

    @property
    def picks(self) -> tuple[tuple[str, str], ...]:  # the autotuner's (kernel, short config) of ours
        return tuple((k, short_config(c)) for k, c in (self.ours.details.get("tuned_configs") or {}).items())


def fastest_ours(rows: list[Bench]) -> Bench | None:  # ours' faster forward+backward row of one run
    ran = [b for impl in OURS if (b := pick(rows, impl=impl, mode="fwd_bwd")) is not None]
    return min(ran, key=lambda b: b.stats.median, default=None)


def versions(rows: list[Bench]) -> list[Version]:  # every run in which ours ran, oldest first
    runs = group(rows, lambda b: (b.run.datetime, b.run.commit))
    return [Version(o, pick(g, impl=ANCHOR, mode="fwd_bwd")) for _, g in sorted(runs.items())
            if (o := fastest_ours(g)) is not None]


def _plot(vs: list[Version], ctx: Context, name: str) -> str:
    fig, ax = figures.new(figsize=(8, 4.2))
    for impl, label, times in ((OURS[0], WORDS.labels["ours"], [v.ours_s for v in vs]),
                               (ANCHOR, IMPL_LABELS[ANCHOR], [v.cudnn_s for v in vs])):
        pts = [(i, s * 1e3, v.run.legacy) for i, (v, s) in enumerate(zip(vs, times)) if s is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "-", color=IMPL_COLORS[impl], label=label, lw=1.2)
        for legacy, marker in ((True, "o"), (False, "s")):  # open: the older format's do_bench median
            sel = [p for p in pts if p[2] == legacy]
            ax.plot([p[0] for p in sel], [p[1] for p in sel], marker, color=IMPL_COLORS[impl], ms=5,
                    mfc="none" if legacy else IMPL_COLORS[impl])
    ax.set_xticks(list(range(len(vs))), [f"{v.run.when[5:]}\n{v.run.commit}" for v in vs], fontsize=7, rotation=30,
                  ha="right")
    ax.set(ylabel=WORDS.y, title=WORDS.title)
    ax.title.set_fontsize(9)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, loc="lower left")
    return ctx.figure(fig, name)


@dataclass(frozen=True)
class LeaderboardPage:
    answer: LeaderboardFacts | None  # None: no GPU device ran ours and cuDNN
    lines: tuple[Line, ...] = ()
    runs: RunsFacts | None = None
    versions: tuple[Version, ...] = ()
    notes: tuple[str, ...] = ()  # the rows' `note` details
    sources: tuple[str, ...] = ()
    gpu: str = ""  # the device's GPU, as its rows' environment names it
    figure: str | None = None  # the version history's png (the index shows it too)
    index_figures = property(lambda self: (self.figure,) if self.figure else ())
    auto = property(lambda self: any(x.impl == AUTO for x in self.lines))  # rows of flash_auto (any status)
    scores = property(lambda self: {PROBLEM: Scored.of(self.runs)})

    @property
    def noise(self) -> tuple[float, float, int, str] | None:
        """(lowest, highest ours/cuDNN, runs, commit) of the commit with the most newer-format runs (two or more,
        the newest such commit on a tie): runs of one code, so their spread is the noise; None without one."""
        by_commit = group([v for v in self.versions if not v.run.legacy and v.cudnn_s is not None],
                          lambda v: v.run.commit)
        runs = max(by_commit.values(), key=lambda g: (len(g), g[-1].run.datetime), default=[])
        rs = [v.over_cudnn for v in runs]
        return (min(rs), max(rs), len(rs), runs[0].run.commit) if len(rs) > 1 else None


def facts(ctx: Context) -> LeaderboardPage:  # the first GPU device whose newest rows have ours and cuDNN
    for device, lb in ctx.rows.per_gpu(PROBLEM):
        ours, cudnn = fastest_ours(lb), pick(lb, impl=ANCHOR, mode="fwd_bwd")
        if ours is None or cudnn is None:
            continue
        h = headline(ours, cudnn, "SDPA cuDNN")
        pc = probe_check(ctx.reports_dir, device, ours, h, "fwd_bwd")
        answer = LeaderboardFacts(device, ours, cudnn, h, pc)
        rows = [b for b in ctx.rows.history if b.problem == PROBLEM and b.run.device == device] + lb
        rel = _plot(vs := versions(rows), ctx, f"leaderboard-{device}.png")
        return LeaderboardPage(answer, tuple(Line.of(b, lb) for b in lb), RunsFacts.of(device, lb), tuple(vs),
                               tuple(sorted({b.details["note"] for b in lb if b.details.get("note")})),
                               tuple(files_of(rows)) + ((pc.probe.path,) if pc else ()), ours.row.env.device, rel)
    return LeaderboardPage(None)
