"""pytorch_attention: naive attention's time and memory over (d, seq), the first out-of-memory case,
its memory accounting (derived by impl.attention.memory beside the measured bytes) and our times
against the course seed's published ones. The first GPU device with rows answers.
templates/pytorch_attention.md.j2 holds every word.

The cells, not-run reasons and memory reads here are torch_compile (a)'s too (its eager side is
these configurations): impl.report.pages.torch_compile imports them."""
from __future__ import annotations

from dataclasses import dataclass

from impl.attention.memory import NaiveAttentionMemory, flash_saved_for_backward, naive_attention_memory
from impl.bench.row import Env, Metric, Status
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, view
from impl.report.runs import RunsFacts, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.PYTORCH_ATTENTION,)
PROBLEM = P.PYTORCH_ATTENTION
#: Bytes per element of the naive attention's dtypes.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Memory passes over the (b, s, s) score matrix in naive_attention's forward: QKᵀ writes it, the
#: scaling reads and writes it, softmax reads it and writes P, P·V reads P (at least; softmax may
#: read its row more than once).
NAIVE_FORWARD_PASSES = 6


@dataclass(frozen=True)
class SeedTimes:
    """A course seed's published naive-attention times (not our data: quoted for comparison; the
    template names the source)."""

    batch: int
    dtype: str
    d: int
    seq: int
    forward_ms: float
    backward_ms: float


# /work/shared/seeds/000 (the course's H100 write-up), its pytorch_attention table, d 64, seq 16384
SEED_NAIVE = SeedTimes(8, "fp32", 64, 16384, 69.9, 144.6)


@dataclass(frozen=True)
class AttentionConfig:
    d_model: int = 0
    seq: int = 0
    mode: str = ""  # "forward" or "backward"
    batch: int = 0
    dtype: str = "fp32"


def cfg(b: Bench) -> AttentionConfig:
    return view(AttentionConfig, b)


@dataclass(frozen=True)
class Cell:
    """A table cell of one row: its value (seconds or bytes), or the status it did not run with."""

    value: float | None
    status: Status | None = None  # None: the row ran


def cell(b: Bench | None, value) -> Cell | None:
    """The cell of `b` (None: no row): `value(b)` where it ran, else its status."""
    if b is None:
        return None
    return Cell(value(b)) if b.status is Status.MEASURED else Cell(None, b.status)


def median(b: Bench) -> float | None:
    return b.stats.median if b.stats else None


def in_use(b: Bench, key: str) -> float | None:
    """Bytes of a details key above what was allocated before the inputs (details["baseline_bytes"])."""
    v, base = b.details.get(key), b.details.get("baseline_bytes")
    return None if v is None or base is None else v - base


def peak(b: Bench) -> float | None:
    """The row's peak allocated bytes above the baseline."""
    v, base = b.row.memory.peak_allocated, b.details.get("baseline_bytes")
    return None if v is None or base is None else v - base


def not_run(rows: list[Bench]) -> list[tuple[Status, str]]:
    """The distinct (status, reason) of the rows that did not run."""
    return list(dict.fromkeys((b.status, b.row.reason) for b in rows if b.row.reason and b.status is not Status.MEASURED))


def by_mode(rows: list[Bench], d: int, seq: int) -> dict[str, Bench]:
    """The rows of one (d, seq) by pass (the last row of a pass where it has several)."""
    return {cfg(b).mode: b for b in rows if (cfg(b).d_model, cfg(b).seq) == (d, seq)}


def shapes(rows: list[Bench]) -> list[tuple[int, int]]:
    """The (d, seq) of the rows, sorted."""
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
class Accounting:
    """The memory accounting of one case: derived (impl.attention.memory) and measured."""

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
class Seed:
    """Ours against the seed's times at its shape, and the bytes our forward moved."""

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
    def seed_bps(self) -> float:
        """The seed's forward at the same passes."""
        return self.bps * self.forward_s * 1e3 / self.seed.forward_ms


@dataclass(frozen=True)
class PytorchAttentionFacts:
    device: str | None  # None: no GPU rows
    env: Env | None = None
    batch: int = 0
    dtype: str = ""
    rounds: int = 0
    largest: tuple[int, int] = (0, 0)  # (d, seq) of the largest case that ran
    largest_s: tuple[float | None, float | None] = (None, None)  # its forward and backward seconds
    first_oom: tuple[int, int, str] | None = None  # (d, seq, pass)
    table: tuple[TableRow, ...] = ()
    not_run: tuple[tuple[Status, str], ...] = ()
    accounting: Accounting | None = None
    seed: Seed | None = None
    runs: RunsFacts | None = None
    date: str = "–"
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        if self.device is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        return {PROBLEM: Scored(Kind.MEASURED, self.device, self.date)}

    @property
    def sources(self) -> list[str]:
        return self.runs.files if self.runs else []


def _bandwidth(b: Bench) -> float:
    """Bytes per second the forward row moved over its score matrix, at NAIVE_FORWARD_PASSES passes."""
    c = cfg(b)
    return NAIVE_FORWARD_PASSES * c.batch * c.seq * c.seq * DTYPE_BYTES[c.dtype] / b.stats.median


def _seed(rows: list[Bench]) -> Seed | None:
    s = SEED_NAIVE
    ran = [b for b in rows if b.measured]
    f, b = (by_mode(ran, s.d, s.seq).get(m) for m in ("forward", "backward"))
    small = by_mode(ran, min(cfg(x).d_model for x in rows), s.seq).get("forward")
    if f is None or b is None or small is None:
        return None
    c = cfg(f)
    return Seed(s, f.stats.median, b.stats.median, c.batch, c.dtype, bool(f.details.get("tf32")), f.stats.rounds,
                c.batch * s.seq ** 2 * DTYPE_BYTES[c.dtype], cfg(small).d_model, _bandwidth(small), _bandwidth(f))


def _accounting(rows: list[Bench], d: int, seq: int, oom: bool, batch: int, dtype: str) -> Accounting:
    by = by_mode(rows, d, seq)
    f, b = by.get("forward"), by.get("backward")
    return Accounting(d, seq, oom, naive_attention_memory(batch, seq, d, dtype),
                      naive_attention_memory(batch, seq // 2, d, dtype), flash_saved_for_backward(batch, seq, d, dtype),
                      cell(b, lambda x: in_use(x, "memory_before_backward_bytes")), cell(f, peak), cell(b, peak))


def _table_row(rows: list[Bench], d: int, seq: int, batch: int, dtype: str) -> TableRow:
    by = by_mode(rows, d, seq)
    f, b = by.get("forward"), by.get("backward")
    return TableRow(d, seq, cell(f, median), cell(b, median),
                    f.metric(Metric.TFLOPS) if f is not None and f.status is Status.MEASURED else None,
                    cell(b, lambda x: in_use(x, "memory_before_backward_bytes")),
                    peak(b) if b is not None and b.status is Status.MEASURED else None,
                    naive_attention_memory(batch, seq, d, dtype))


def facts(ctx: Context) -> PytorchAttentionFacts:
    found = ctx.rows.per_gpu(PROBLEM)
    if not found:
        return PytorchAttentionFacts(None)
    device, rows = found[0]  # the first GPU with rows answers; the others have none for this problem
    c0 = cfg(rows[0])
    ran = [b for b in rows if b.measured]
    ooms = sorted((b for b in rows if b.status is Status.OOM), key=lambda b: (cfg(b).seq, cfg(b).d_model))
    d, seq = max((cfg(b).seq, cfg(b).d_model) for b in ran)[::-1]
    largest = by_mode(ran, d, seq)
    # the accounting's case: the smallest that ran out of memory, else the largest that ran
    case = (cfg(ooms[0]).d_model, cfg(ooms[0]).seq) if ooms else (d, seq)
    return PytorchAttentionFacts(
        device, rows[0].row.env, c0.batch, c0.dtype, max(b.stats.rounds for b in rows if b.stats), (d, seq),
        tuple(median(b) if b else None for b in (largest.get("forward"), largest.get("backward"))),
        (cfg(ooms[0]).d_model, cfg(ooms[0]).seq, cfg(ooms[0]).mode) if ooms else None,
        tuple(_table_row(rows, x, s, c0.batch, c0.dtype) for x, s in shapes(rows)), tuple(not_run(rows)),
        _accounting(rows, *case, bool(ooms), c0.batch, c0.dtype), _seed(rows), RunsFacts.of(device, rows),
        newest_date(rows))
