"""The mixed_precision page as facts: mixed_precision_accumulation's four loops, benchmarking_mixed_precision
(a)/(b) dtypes and format facts, and (c) fp32 against bf16 autocast per edition's sizes (from the
benchmarking_script grid: means ± std, bf16 ÷ fp32 in one run). templates/mixed_precision.md.j2 holds
the words."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl.report.pages.benchmarking_script import Cell, EditionFacts
from impl.report.ratio import Ratio, ratio
from impl.report.rows import Bench
from impl.workloads.problems import Problem as P


@dataclass(frozen=True)
class Accumulation:
    steps: int
    exact: float
    values: dict[str, float]  # loop -> result
    errors: dict[str, float]  # loop -> |error|

    @property
    def order(self) -> list[str]:
        """The loops by error, smallest first (the ordering the test asserts)."""
        return sorted(self.errors, key=self.errors.get)

    @property
    def worst_over_best(self) -> float:
        return self.errors[self.order[-1]] / self.errors[self.order[0]]


@dataclass(frozen=True)
class Dtypes:
    runs: list[dict]  # details["dtypes"] of each run: what forward hooks saw under autocast
    formats: dict | None  # torch.finfo facts by type name

    @property
    def bf16_eps_over_fp16(self) -> float | None:
        return None if not self.formats else self.formats["bf16"]["eps"] / self.formats["fp16"]["eps"]


@dataclass(frozen=True)
class Bf16Pair:
    size: str
    context: int
    mode: str
    fp32: Cell
    bf16: Cell

    @property
    def ratio(self) -> Ratio:
        """bf16 ÷ fp32 (ours ÷ anchor): below 1 bf16 is faster."""
        r = ratio(self.bf16.mean_s, self.fp32.mean_s, "fp32")
        return Ratio(r.ours_s, r.anchor_s, r.anchor, self.bf16.within_noise(self.fp32))


@dataclass(frozen=True)
class Bf16Trend:
    edition: str
    sizes: list[str]
    pairs: list[Bf16Pair] = field(default_factory=list)  # every (size, context, mode) measured in both dtypes

    def train(self) -> list[Bf16Pair]:
        return [p for p in self.pairs if p.mode == "train_step"]

    def of(self, mode: str) -> list[Bf16Pair]:
        return [p for p in self.pairs if p.mode == mode]

    @property
    def largest_fb(self) -> tuple[Bf16Pair, Bf16Pair] | None:
        """(forward, backward) pairs of the largest size and context with both measured in both dtypes."""
        bwd = self.of("backward")
        for b in reversed(bwd):
            f = next((p for p in self.of("forward") if (p.size, p.context) == (b.size, b.context)), None)
            if f is not None:
                return f, b
        return None

    @property
    def best(self) -> Bf16Pair | None:
        """The training step where bf16 gains most, among pairs outside the noise where there are any."""
        t = self.train()
        real = [p for p in t if not p.ratio.noise]
        return min(real or t, key=lambda p: p.ratio.value) if t else None

    @property
    def in_noise(self) -> list[Bf16Pair]:
        return [p for p in self.train() if p.ratio.noise]

    @property
    def slower(self) -> list[Bf16Pair]:
        return [p for p in self.train() if not p.ratio.noise and p.ratio.value > 1]


def bf16_trend(e: EditionFacts) -> Bf16Trend:
    pairs = []
    for r in (r for r in e.grid if r.dtype == "fp32"):
        b = next((x for x in e.grid if x.dtype == "bf16" and x.size == r.size and x.context == r.context), None)
        for mode in ("forward", "backward", "train_step"):
            f, h = r.modes.get(mode), b.modes.get(mode) if b else None
            if f is not None and h is not None and f.ok and h.ok:
                pairs.append(Bf16Pair(r.size, r.context, mode, f, h))
    return Bf16Trend(e.edition, e.sizes, pairs)


def accumulation(rows: list[Bench]) -> Accumulation | None:
    b = next((b for b in rows if b.problem == P.MIXED_PRECISION_ACCUMULATION), None)
    if b is None:
        return None
    i = b.details
    return Accumulation(int(b.cfg.steps), i["exact"], i["values"], i["errors"])


def dtypes(rows: list[Bench]) -> Dtypes | None:
    mp = [b for b in rows if b.problem == P.BENCHMARKING_MIXED_PRECISION]
    if not mp:
        return None
    return Dtypes([b.details["dtypes"] for b in mp], next((b.details["formats"] for b in mp if b.details.get("formats")),
                                                          None))


@dataclass(frozen=True)
class MixedPrecisionFacts:
    accumulation: Accumulation | None
    dtypes: Dtypes | None
    trends: list[Bf16Trend]  # 2025 then 2026

    @property
    def headline(self) -> Bf16Trend | None:
        """The newest edition with a bf16 training-step pair."""
        return next((t for t in reversed(self.trends) if t.best is not None), None)

    @property
    def headline_fb(self) -> Bf16Trend | None:
        """The newest edition with forward and backward pairs (2026's question: forward and backward)."""
        return next((t for t in reversed(self.trends) if t.largest_fb is not None), None)


def mixed_precision_facts(rows: list[Bench], editions: list[EditionFacts]) -> MixedPrecisionFacts:
    return MixedPrecisionFacts(accumulation(rows), dtypes(rows), [bf16_trend(e) for e in editions])
