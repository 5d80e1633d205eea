"""mixed_precision: mixed_precision_accumulation's four loops, benchmarking_mixed_precision (a)/(b)
dtypes and format facts, and (c) fp32 against bf16 autocast per edition's sizes (from the
benchmarking_script grid: means ± std, bf16 ÷ fp32 in one run). The first GPU device answers.
templates/mixed_precision.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from impl.report.pages import Context, Kind, Scored
from impl.report.pages.benchmarking_script import Cell, EditionFacts, benchmarking_script_facts, of_edition
from impl.report.ratio import Ratio, ratio
from impl.report.rows import Bench, view
from impl.report.runs import RunsFacts, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.MIXED_PRECISION_ACCUMULATION, P.BENCHMARKING_MIXED_PRECISION)
ACCUMULATION, DTYPES, SCRIPT = P.MIXED_PRECISION_ACCUMULATION, P.BENCHMARKING_MIXED_PRECISION, P.BENCHMARKING_SCRIPT


@dataclass(frozen=True)
class Loop:
    name: str  # "fp32 += fp16"
    value: float  # the sum it reached
    error: float  # |value - exact|


@dataclass(frozen=True)
class Accumulation:
    steps: int
    exact: float
    loops: list[Loop]  # as the run stored them

    @property
    def order(self) -> list[Loop]:
        """The loops by error, smallest first (the ordering the test asserts)."""
        return sorted(self.loops, key=lambda x: x.error)

    @property
    def worst_over_best(self) -> float:
        return self.order[-1].error / self.order[0].error


@dataclass(frozen=True)
class AccumulationConfig:
    steps: int = 0


@dataclass(frozen=True)
class Observed:
    """The dtypes forward hooks saw in one autocast run of the toy model (fc1 → ReLU → LayerNorm → fc2)."""

    device_type: str
    autocast_dtype: str
    parameters: list[str]
    fc1_output: str
    layernorm_output: str
    logits: str
    loss: str
    gradients: list[str]


@dataclass(frozen=True)
class Format:
    """torch.finfo of one floating-point type."""

    name: str
    max: float
    tiny: float  # smallest normal
    eps: float
    mantissa_bits: int


@dataclass(frozen=True)
class Dtypes:
    runs: list[Observed]
    formats: list[Format]  # empty where the run did not record them

    def format(self, name: str) -> Format:
        return next(x for x in self.formats if x.name == name)

    @property
    def bf16_eps_over_fp16(self) -> float | None:
        return self.format("bf16").eps / self.format("fp16").eps if self.formats else None


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
    b = next((b for b in rows if b.problem == ACCUMULATION), None)
    if b is None:
        return None
    i = b.details
    return Accumulation(int(view(AccumulationConfig, b).steps), i["exact"],
                        [Loop(k, v, i["errors"][k]) for k, v in i["values"].items()])


def _observed(d: dict) -> Observed:
    return Observed(d["device_type"], d["autocast_dtype"], d["parameters"], d["fc1 output"], d["layernorm output"],
                    d["logits"], d["loss"], d["gradients"])


def dtypes(rows: list[Bench]) -> Dtypes | None:
    mp = [b for b in rows if b.problem == DTYPES]
    if not mp:
        return None
    formats = next((b.details["formats"] for b in mp if b.details.get("formats")), {})
    return Dtypes([_observed(b.details["dtypes"]) for b in mp],
                  [Format(k, v["max"], v["tiny"], v["eps"], v["mantissa_bits"]) for k, v in formats.items()])


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MixedPrecisionPage:
    device: str | None  # the answering GPU device; None: no GPU rows
    accumulation: Accumulation | None = None
    dtypes: Dtypes | None = None
    trends: list[Bf16Trend] = field(default_factory=list)  # 2025 then 2026
    runs: RunsFacts | None = None
    accumulation_date: str = "–"
    score_fb: bool = False  # (c) is scored by forward and backward (2026's question), not the training step
    score_date: str = "–"  # of (c)'s rows
    index_figures: tuple = ()

    @property
    def headline(self) -> Bf16Trend | None:
        """The newest edition with a bf16 training-step pair."""
        return next((t for t in reversed(self.trends) if t.best is not None), None)

    @property
    def headline_fb(self) -> Bf16Trend | None:
        """The newest edition with forward and backward pairs (2026's question: forward and backward)."""
        return next((t for t in reversed(self.trends) if t.largest_fb is not None), None)

    @property
    def scores(self) -> dict[str, Scored]:
        acc = Scored(Kind.MEASURED, self.device, self.accumulation_date) if self.accumulation else None
        c = Scored(Kind.MEASURED, self.device, self.score_date) if self.headline or self.score_fb else None
        return {ACCUMULATION: acc or Scored(Kind.NOT_MEASURED), DTYPES: c or Scored(Kind.NOT_MEASURED)}

    @property
    def sources(self) -> list[str]:
        return sorted(self.runs.files) if self.runs else []


def facts(ctx: Context) -> MixedPrecisionPage:
    found = ctx.rows.per_gpu(ACCUMULATION, DTYPES, SCRIPT)
    if not found:
        return MixedPrecisionPage(None)
    device, rows = found[0]
    trends = [bf16_trend(e) for e in benchmarking_script_facts(device, rows).editions]
    script = [b for b in rows if b.problem == SCRIPT]
    f = MixedPrecisionPage(device, accumulation(rows), dtypes(rows), trends, RunsFacts.of(device, rows),
                           newest_date([b for b in rows if b.problem == ACCUMULATION]), False, newest_date(script))
    fb = f.headline_fb
    if fb is not None and (f.headline is None or fb.edition > f.headline.edition):  # the newer edition scores
        return replace(f, score_fb=True, score_date=newest_date(of_edition(script, fb.edition)))
    return f
