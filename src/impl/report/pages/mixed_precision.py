"""mixed_precision: the four accumulation loops, the dtypes under autocast and (c) bf16 ÷ fp32 of the
benchmarking_script grid's means in one run, per edition's sizes. The first GPU device answers."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages.benchmarking_script import Cell, EditionFacts, editions, of_edition
from impl.report.ratio import Ratio
from impl.report.rows import Bench, View
from impl.report.runs import RunsFacts, SourcedFromRuns, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.MIXED_PRECISION_ACCUMULATION, P.BENCHMARKING_MIXED_PRECISION)
ACCUMULATION, DTYPES, SCRIPT = P.MIXED_PRECISION_ACCUMULATION, P.BENCHMARKING_MIXED_PRECISION, P.BENCHMARKING_SCRIPT


@dataclass(frozen=True)
class Accumulation:
    steps: int
    exact: float
    values: dict[str, float]  # loop ("fp32 += fp16") -> the sum it reached, as the run stored them
    errors: dict[str, float]  # loop -> |value - exact|

    order = property(lambda self: sorted(self.values, key=self.errors.__getitem__))  # by error, smallest first
    worst_over_best = property(lambda self: self.errors[self.order[-1]] / self.errors[self.order[0]])


@dataclass(frozen=True)
class AccumulationConfig(View):
    steps: int = 0


@dataclass(frozen=True)
class Dtypes:
    runs: list[dict]  # per autocast run, the dtypes its forward hooks saw (fc1 → ReLU → LayerNorm → fc2)
    formats: dict[str, dict]  # torch.finfo by type name (max, tiny, eps, mantissa_bits); empty where not recorded

    bf16_eps_over_fp16 = property(lambda self: self.formats["bf16"]["eps"] / self.formats["fp16"]["eps"]
                                  if self.formats else None)


@dataclass(frozen=True)
class Bf16Pair:
    size: str
    context: int
    mode: str
    fp32: Cell
    bf16: Cell

    @property
    def ratio(self) -> Ratio:  # bf16 ÷ fp32 (ours ÷ anchor): below 1 bf16 is faster
        return Ratio(float(self.bf16.mean_s), float(self.fp32.mean_s), "fp32", self.bf16.within_noise(self.fp32))


@dataclass(frozen=True)
class Bf16Trend:
    edition: str
    sizes: list[str]
    pairs: list[Bf16Pair]  # every (size, context, mode) measured in both dtypes

    def of(self, mode: str) -> list[Bf16Pair]:
        return [p for p in self.pairs if p.mode == mode]

    @property
    def largest_fb(self) -> tuple[Bf16Pair, Bf16Pair] | None:  # of the largest size and context with both
        fwd = {(p.size, p.context): p for p in self.of("forward")}
        return next(((fwd[b.size, b.context], b) for b in reversed(self.of("backward")) if (b.size, b.context) in fwd),
                    None)

    @property
    def best(self) -> Bf16Pair | None:  # the training step where bf16 gains most, outside the noise where any is
        t = self.of("train_step")
        return min([p for p in t if not p.ratio.noise] or t, key=lambda p: p.ratio.value, default=None)


def bf16_trend(e: EditionFacts) -> Bf16Trend:
    bf16 = {(r.size, r.context): r.modes for r in e.grid if r.dtype == "bf16"}
    return Bf16Trend(e.edition, e.sizes, [
        Bf16Pair(r.size, r.context, m, r.modes[m], h) for r in e.grid if r.dtype == "fp32"
        for m in ("forward", "backward", "train_step")
        if (h := bf16.get((r.size, r.context), {}).get(m)) is not None and m in r.modes and r.modes[m].ok and h.ok])


def accumulation(rows: list[Bench]) -> Accumulation | None:
    b = next((b for b in rows if b.problem == ACCUMULATION), None)
    return None if b is None else Accumulation(int(AccumulationConfig.of(b).steps), b.details["exact"],
                                               b.details["values"], b.details["errors"])


def dtypes(rows: list[Bench]) -> Dtypes | None:
    mp = [b for b in rows if b.problem == DTYPES]
    if not mp:
        return None
    formats = next((b.details["formats"] for b in mp if b.details.get("formats")), {})
    return Dtypes([b.details["dtypes"] for b in mp], formats)


@dataclass(frozen=True)
class MixedPrecisionPage(SourcedFromRuns):
    scores: dict[str, Scored]
    accumulation: Accumulation | None = None
    dtypes: Dtypes | None = None
    trends: list[Bf16Trend] = field(default_factory=list)  # 2025 then 2026
    headline: Bf16Trend | None = None  # the newest edition with a bf16 training-step pair
    headline_fb: Bf16Trend | None = None  # the newest with forward and backward pairs (2026's question)
    score_fb: bool = False  # (c) is scored by forward and backward, not the training step
    runs: RunsFacts | None = None  # its device answers; None: no GPU rows


def facts(ctx: Context) -> MixedPrecisionPage:
    if not (found := ctx.rows.first_gpu(ACCUMULATION, DTYPES, SCRIPT)):
        return MixedPrecisionPage({p: NOT_MEASURED for p in (ACCUMULATION, DTYPES)})
    device, rows = found
    trends = [bf16_trend(e) for e in editions(rows)]
    head = next((t for t in reversed(trends) if t.best is not None), None)
    fb = next((t for t in reversed(trends) if t.largest_fb is not None), None)
    score_fb = fb is not None and (head is None or fb.edition > head.edition)  # the newer edition scores

    def scored(answered, rs: list[Bench]) -> Scored:  # measured on the device, at the newest of the rows it read
        return Scored(Kind.MEASURED, device, newest_date(rs)) if answered else NOT_MEASURED
    script, acc = [b for b in rows if b.problem == SCRIPT], accumulation(rows)
    scores = {ACCUMULATION: scored(acc, [b for b in rows if b.problem == ACCUMULATION]),
              DTYPES: scored(head or score_fb, of_edition(script, fb.edition) if score_fb else script)}
    return MixedPrecisionPage(scores, acc, dtypes(rows), trends, head, fb, score_fb, RunsFacts.of(device, rows))
