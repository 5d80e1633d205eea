"""pytorch_attention: naive attention's time and memory over (d, seq) on the first GPU with rows, the first OOM
case's memory accounting (impl.attention.memory beside the measured bytes) and our times against the course seed's."""
from __future__ import annotations

from dataclasses import dataclass

from impl.attention.memory import NaiveAttentionMemory, dtype_bytes, flash_saved_for_backward, naive_attention_memory
from impl.bench.row import Metric, Status
from impl.report.flash_rows import Cell, cell, not_run, ran
from impl.report.pages import Context, Scored
from impl.report.rows import Bench, View
from impl.report.runs import RunsFacts, SourcedFromRuns
from impl.workloads.problems import Problem as P

PROBLEMS = (P.PYTORCH_ATTENTION,)
PROBLEM = P.PYTORCH_ATTENTION
# naive_attention's forward passes over the (b, s, s) scores at least this often: QKᵀ writes them, the
# scaling reads and writes, softmax reads them and writes P, P·V reads P
NAIVE_FORWARD_PASSES = 6


@dataclass(frozen=True)
class SeedTimes:  # a course seed's published naive-attention times, quoted (not our data)
    batch: int
    dtype: str
    d: int
    seq: int
    forward_ms: float
    backward_ms: float


# /work/shared/seeds/000 (the course's H100 write-up), its pytorch_attention table, d 64, seq 16384
SEED_NAIVE = SeedTimes(8, "fp32", 64, 16384, 69.9, 144.6)


@dataclass(frozen=True)
class AttentionConfig(View):
    d_model: int = 0
    seq: int = 0
    mode: str = ""  # "forward" or "backward"
    batch: int = 0
    dtype: str = "fp32"


cfg = AttentionConfig.of


def if_ran(b: Bench | None, value):  # value(b) where the row ran, else None
    return value(b) if b is not None and ran(b) else None


def median(b: Bench) -> float | None:
    return b.stats.median if b.stats else None


def _above_baseline(b: Bench, v: float | None) -> float | None:
    base = b.details.get("baseline_bytes")  # allocated before the inputs
    return None if v is None or base is None else v - base


def before_backward(b: Bench) -> float | None:
    return _above_baseline(b, b.details.get("memory_before_backward_bytes"))


def peak(b: Bench) -> float | None:
    return _above_baseline(b, b.row.memory.peak_allocated)


def passes(rows: list[Bench], d: int, seq: int) -> tuple[Bench | None, Bench | None]:  # the last of a pass's rows
    by = {cfg(b).mode: b for b in rows if (cfg(b).d_model, cfg(b).seq) == (d, seq)}
    return by.get("forward"), by.get("backward")


def shapes(rows: list[Bench]) -> list[tuple[int, int]]:
    return sorted({(cfg(b).d_model, cfg(b).seq) for b in rows})


@dataclass(frozen=True)
class Case:  # one (d, seq) of the grid: its cells (bytes above the baseline) and the derived memory
    d: int
    seq: int
    forward: Cell | None  # seconds
    backward: Cell | None
    tflops: float | None  # the forward's
    before_backward: Cell | None  # bytes in use before backward (the backward row's)
    forward_peak: Cell | None
    backward_peak: Cell | None
    derived: NaiveAttentionMemory  # impl.attention.memory's, at the rows' batch and dtype

    @classmethod
    def of(cls, rows: list[Bench], d: int, seq: int, *more) -> Case:
        f, b, c = *passes(rows, d, seq), cfg(rows[0])
        return cls(d, seq, cell(f, median), cell(b, median), if_ran(f, lambda f: f.metric(Metric.TFLOPS)),
                   cell(b, before_backward), cell(f, peak), cell(b, peak),
                   naive_attention_memory(c.batch, seq, d, c.dtype), *more)


@dataclass(frozen=True)
class Accounting(Case):  # the case accounted for: the smallest that ran out of memory, else the largest
    oom: bool
    half: NaiveAttentionMemory  # the derived memory at half the sequence
    flash_bytes: int  # what FlashAttention-2 saves for backward instead


@dataclass(frozen=True)
class Seed:  # ours against the seed's times at its shape, and the bytes our forward moved
    seed: SeedTimes
    forward_s: float
    backward_s: float
    batch: int
    dtype: str
    tf32: bool
    rounds: int
    matrix_bytes: int  # one (b, s, s) matrix
    small_d: int
    small_d_bps: float  # bytes per second over the score matrix at the smallest d
    bps: float  # at the seed's d
    passes: int = NAIVE_FORWARD_PASSES

    @property
    def seed_bps(self) -> float:  # the seed's forward at the same passes
        return self.bps * self.forward_s * 1e3 / self.seed.forward_ms


@dataclass(frozen=True)
class PytorchAttentionFacts(SourcedFromRuns):
    runs: RunsFacts | None  # None: no GPU rows
    config: AttentionConfig | None = None  # the batch and dtype of the grid (its first row's)
    rounds: int = 0
    table: tuple[Case, ...] = ()
    largest: Case | None = None  # the largest case that ran
    first_oom: AttentionConfig | None = None  # the first row out of memory, by seq then d
    not_run: tuple[tuple[str, str], ...] = ()  # (status, reason), each once
    accounting: Accounting | None = None
    seed: Seed | None = None

    @property
    def scores(self) -> dict[str, Scored]:
        return {PROBLEM: Scored.of(self.runs)}


def _seed(rows: list[Bench]) -> Seed | None:
    s, ran_ = SEED_NAIVE, [b for b in rows if b.measured]
    (f, b), (small, _) = passes(ran_, s.d, s.seq), passes(ran_, min(cfg(x).d_model for x in rows), s.seq)
    if f is None or b is None or small is None:
        return None

    def bps(x: Bench) -> float:  # over its score matrix, at NAIVE_FORWARD_PASSES passes
        return NAIVE_FORWARD_PASSES * cfg(x).batch * cfg(x).seq ** 2 * dtype_bytes(cfg(x).dtype) / x.stats.median
    c = cfg(f)
    return Seed(s, f.stats.median, b.stats.median, c.batch, c.dtype, bool(f.details.get("tf32")), f.stats.rounds,
                c.batch * s.seq ** 2 * dtype_bytes(c.dtype), cfg(small).d_model, bps(small), bps(f))


def facts(ctx: Context) -> PytorchAttentionFacts:
    if not (found := ctx.rows.first_gpu(PROBLEM)):
        return PytorchAttentionFacts(None)
    device, rows = found
    c = cfg(rows[0])
    table = {(d, s): Case.of(rows, d, s) for d, s in shapes(rows)}
    largest = table[max((cfg(b).seq, cfg(b).d_model) for b in rows if b.measured)[::-1]]
    ooms = sorted((cfg(b) for b in rows if b.status is Status.OOM), key=lambda x: (x.seq, x.d_model))
    d, seq = (ooms[0].d_model, ooms[0].seq) if ooms else (largest.d, largest.seq)
    accounting = Accounting.of(rows, d, seq, bool(ooms), naive_attention_memory(c.batch, seq // 2, d, c.dtype),
                               flash_saved_for_backward(c.batch, seq, d, c.dtype))
    return PytorchAttentionFacts(RunsFacts.of(device, rows), c, max(b.stats.rounds for b in rows if b.stats),
                                 tuple(table.values()), largest, ooms[0] if ooms else None, not_run(rows),
                                 accounting, _seed(rows))
