"""The 2025 leaderboard page (FlashAttention-2 forward+backward at bf16, causal, 16 heads × 16,384 × 64)
as facts; templates/leaderboard.md.j2 holds its words.

The course times the leaderboard with `triton.testing.do_bench` (2025 handout §1.3.3), so the headline
ratio is do_bench's. The rows' own statistics come from CUDA-event rounds of back-to-back calls; both
are stored, and the page states how far apart they are for each implementation."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Metric
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench

OURS, ANCHOR = "flash_triton", "sdpa_cudnn"


@dataclass(frozen=True)
class Timers:
    """One implementation's forward+backward under the two timers of the same run (seconds)."""

    label: str
    event_s: float  # the row's CUDA-event median (rounds of back-to-back calls)
    event_spread: float | None
    do_bench_s: float | None  # triton.testing.do_bench's median (the course's timer)
    mfu: float | None  # against the datasheet peak, from the event median

    @property
    def do_bench_over_event(self) -> float | None:
        return None if self.do_bench_s is None else self.do_bench_s / self.event_s


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


def _timers(b: Bench, label: str) -> Timers:
    db = b.metric(Metric.DO_BENCH_MS)
    return Timers(label, b.stats.median, spread(b.stats.stddev, b.stats.iqr),
                  None if db is None else db / 1e3, b.metric(Metric.MFU))


def _correctness(b: Bench) -> Correctness | None:
    err, tol = b.details.get("rel_err") or {}, b.details.get("tol") or {}
    if not (err and tol):
        return None
    return Correctness(err["out"], max(err[k] for k in ("dq", "dk", "dv") if k in err), tol["out"], tol["grad"],
                       b.details.get("graph_breaks"))


def fwd_bwd(rows: list[Bench], impl: str) -> Bench | None:
    return next((b for b in rows if b.measured and b.cfg.impl == impl and b.cfg.mode == "fwd_bwd"), None)


def leaderboard_facts(device: str, rows: list[Bench]) -> LeaderboardFacts | None:
    """The facts of one device's newest leaderboard rows; None unless ours and cuDNN both ran."""
    ours, cudnn = fwd_bwd(rows, OURS), fwd_bwd(rows, ANCHOR)
    if ours is None or cudnn is None:
        return None
    c = ours.cfg
    shape = f"{c.dtype}, causal, batch {c.batch} × {c.heads} heads × seq {c.seq} × d {c.d}"
    return LeaderboardFacts(device, shape, ours.run.when, ours.run.commit,
                            _timers(ours, "torch.compile(FlashAttentionTriton.apply)"),
                            _timers(cudnn, "SDPA cuDNN"), _correctness(ours))
