"""pytorch_attention: naive attention's time and memory over (d, seq) on the first GPU with rows, the
first OOM case's memory accounting (impl.attention.memory beside the measured bytes) and our times
against the course seed's. torch_compile imports the cell helpers. The template holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl.attention.memory import NaiveAttentionMemory, flash_saved_for_backward, naive_attention_memory
from impl.bench.row import Env, Metric, Status
from impl.report.flash_rows import Cell, cell, not_run
from impl.report.pages import Context, Scored
from impl.report.rows import Bench, View
from impl.report.runs import RunsFacts, SourcedFromRuns
from impl.workloads.problems import Problem as P

PROBLEMS = (P.PYTORCH_ATTENTION,)
PROBLEM = P.PYTORCH_ATTENTION
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
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


def if_ran(b: Bench | None, value):
    """value(b) where the row ran, else None."""
    return value(b) if b is not None and b.status is Status.MEASURED else None


def median(b: Bench) -> float | None:
    return b.stats.median if b.stats else None


def _above_baseline(b: Bench, v: float | None) -> float | None:
    base = b.details.get("baseline_bytes")  # allocated before the inputs
    return None if v is None or base is None else v - base


def before_backward(b: Bench) -> float | None:
    return _above_baseline(b, b.details.get("memory_before_backward_bytes"))


def peak(b: Bench) -> float | None:
    return _above_baseline(b, b.row.memory.peak_allocated)


def passes(rows: list[Bench], d: int, seq: int) -> tuple[Bench | None, Bench | None]:
    """The (forward, backward) rows of one (d, seq), the last where a pass has several."""
    by = {cfg(b).mode: b for b in rows if (cfg(b).d_model, cfg(b).seq) == (d, seq)}
    return by.get("forward"), by.get("backward")


def shapes(rows: list[Bench]) -> list[tuple[int, int]]:
    return sorted({(cfg(b).d_model, cfg(b).seq) for b in rows})


@dataclass(frozen=True)
class TableRow:
    d: int
    seq: int
    forward: Cell | None  # seconds
    backward: Cell | None
    tflops: float | None  # the forward's
    before_backward: Cell | None  # bytes in use before backward (the backward row's)
    backward_peak: float | None  # bytes
    derived: NaiveAttentionMemory


@dataclass(frozen=True)
class Accounting:  # one case's memory, derived (impl.attention.memory) and measured
    d: int
    seq: int
    oom: bool  # the smallest case that ran out of memory; else the largest case
    derived: NaiveAttentionMemory
    half: NaiveAttentionMemory  # the same at half the sequence
    flash_bytes: int  # what FlashAttention-2 saves for backward instead
    before_backward: Cell | None
    forward_peak: Cell | None
    backward_peak: Cell | None


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
    device: str | None  # None: no GPU rows
    env: Env | None = None
    batch: int = 0
    dtype: str = ""
    rounds: int = 0
    largest: tuple[int, int] = (0, 0)  # (d, seq) of the largest case that ran
    largest_s: tuple[float | None, float | None] = (None, None)  # its forward and backward seconds
    first_oom: tuple[int, int, str] | None = None  # (d, seq, pass)
    table: tuple[TableRow, ...] = ()
    not_run: tuple[tuple[str, str], ...] = ()  # (status, reason), each once
    accounting: Accounting | None = None
    seed: Seed | None = None
    runs: RunsFacts | None = None

    @property
    def scores(self) -> dict[str, Scored]:
        return {PROBLEM: Scored.of(self.runs)}


def _seed(rows: list[Bench]) -> Seed | None:
    s, ran_ = SEED_NAIVE, [b for b in rows if b.measured]
    (f, b), (small, _) = passes(ran_, s.d, s.seq), passes(ran_, min(cfg(x).d_model for x in rows), s.seq)
    if f is None or b is None or small is None:
        return None

    def bps(x: Bench) -> float:  # over its score matrix, at NAIVE_FORWARD_PASSES passes
        return NAIVE_FORWARD_PASSES * cfg(x).batch * cfg(x).seq ** 2 * DTYPE_BYTES[cfg(x).dtype] / x.stats.median
    c = cfg(f)
    return Seed(s, f.stats.median, b.stats.median, c.batch, c.dtype, bool(f.details.get("tf32")), f.stats.rounds,
                c.batch * s.seq ** 2 * DTYPE_BYTES[c.dtype], cfg(small).d_model, bps(small), bps(f))


def facts(ctx: Context) -> PytorchAttentionFacts:
    found = ctx.rows.per_gpu(PROBLEM)
    if not found:
        return PytorchAttentionFacts(None)
    device, rows = found[0]  # the first GPU with rows answers; the others have none for this problem
    batch, dtype = cfg(rows[0]).batch, cfg(rows[0]).dtype
    ooms = sorted((b for b in rows if b.status is Status.OOM), key=lambda b: (cfg(b).seq, cfg(b).d_model))
    d, seq = max((cfg(b).seq, cfg(b).d_model) for b in rows if b.measured)[::-1]
    table = []
    for x, s in shapes(rows):
        f, b = passes(rows, x, s)
        table.append(TableRow(x, s, cell(f, median), cell(b, median), if_ran(f, lambda f: f.metric(Metric.TFLOPS)),
                              cell(b, before_backward), if_ran(b, peak), naive_attention_memory(batch, s, x, dtype)))
    # the accounting's case: the smallest that ran out of memory, else the largest that ran
    x, s = (cfg(ooms[0]).d_model, cfg(ooms[0]).seq) if ooms else (d, seq)
    f, b = passes(rows, x, s)
    accounting = Accounting(x, s, bool(ooms), naive_attention_memory(batch, s, x, dtype),
                            naive_attention_memory(batch, s // 2, x, dtype),
                            flash_saved_for_backward(batch, s, x, dtype), cell(b, before_backward), cell(f, peak),
                            cell(b, peak))
    return PytorchAttentionFacts(
        device, rows[0].row.env, batch, dtype, max(b.stats.rounds for b in rows if b.stats), (d, seq),
        tuple(median(b) if b else None for b in passes([b for b in rows if b.measured], d, seq)),
        (cfg(ooms[0]).d_model, cfg(ooms[0]).seq, cfg(ooms[0]).mode) if ooms else None, tuple(table),
        not_run(rows), accounting, _seed(rows), RunsFacts.of(device, rows))
