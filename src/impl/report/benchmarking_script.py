"""benchmarking_script as facts: the (b) grid, the (c) warm-up study and the 2026 edition's split of
a training step, for each edition's sizes apart; templates/benchmarking_script.md.j2 holds the words.

Both handouts ask for the average and the standard deviation of the timed steps, so every time here
is pytest-benchmark's mean ± stddev over the timed rounds, never the median."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.workloads.sweeps import MODES
from impl.model.sizes import EDITION_SIZES, SizeRef
from impl.report.rows import Bench, by_edition, size_label

STABLE = 0.05  # a row whose std is under this share of its mean is called stable


@dataclass(frozen=True)
class Cell:
    """One row's timing: mean ± std over the timed steps (seconds), or why it has none."""

    status: Status
    mean_s: float | None = None
    std_s: float | None = None
    first_s: float | None = None  # the first timed step
    max_s: float | None = None  # the slowest timed step
    peak_bytes: int | None = None
    tokens_per_s: float | None = None
    mfu_measured_peak: float | None = None
    need_bytes: float | None = None  # the closed-form memory need (details["memory_need"]["total"])
    first_parts: dict[str, float] | None = None  # the first timed step's forward/backward/optimizer (s)
    later_parts: dict[str, float] | None = None  # the mean of the other timed steps' parts (s)

    @property
    def ok(self) -> bool:
        return self.status is Status.MEASURED and self.mean_s is not None

    @property
    def rel_std(self) -> float | None:
        return self.std_s / self.mean_s if self.ok and self.std_s is not None else None

    def within_noise(self, other: Cell) -> bool:
        """The two means lie within the sum of their standard deviations."""
        return abs(self.mean_s - other.mean_s) <= (self.std_s or 0.0) + (other.std_s or 0.0)


def _need(b: Bench) -> float | None:
    return (b.details.get("memory_need") or {}).get("total")


def _parts(b: Bench) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """(the first timed step's parts, the other steps' mean parts) of a row that kept details["steps"]."""
    steps = {k.removesuffix("_s"): v for k, v in (b.details.get("steps") or {}).items() if isinstance(v, list) and v}
    if not steps:
        return None, None
    return ({k: v[0] for k, v in steps.items()},
            {k: sum(v[1:]) / len(v[1:]) for k, v in steps.items() if len(v) > 1})


def cell(b: Bench) -> Cell:
    if not b.measured:
        return Cell(b.status, need_bytes=_need(b))
    s = b.stats
    data = s.data or []
    first, later = _parts(b)
    return Cell(b.status, s.mean, s.stddev, data[0] if data else None, max(data) if data else None,
                b.row.memory.peak_allocated, b.metric(Metric.TOKENS_PER_S), b.metric(Metric.MFU_MEASURED_PEAK),
                _need(b), first, later)


@dataclass(frozen=True)
class GridRow:
    size: str  # its label (impl.report.rows.size_label)
    context: int
    dtype: str
    modes: dict[str, Cell]  # mode -> cell

    @property
    def train(self) -> Cell | None:
        return self.modes.get("train_step")


@dataclass(frozen=True)
class WarmupCase:
    size: str
    context: int
    dtype: str
    mode: str
    by_warmup: dict[int, Cell]  # warm-up steps -> cell

    @property
    def cold(self) -> Cell:
        return self.by_warmup[min(self.by_warmup)]

    @property
    def warm(self) -> Cell:
        """The most warmed-up row: the reference."""
        return self.by_warmup[max(self.by_warmup)]

    @property
    def first_step_excess(self) -> float | None:
        """The cold row's first timed step over the warm row's mean."""
        return None if self.cold.first_s is None else self.cold.first_s / self.warm.mean_s

    @property
    def cold_mean_excess(self) -> float:
        """The cold row's mean over the warm row's: what no warm-up does to the average."""
        return self.cold.mean_s / self.warm.mean_s

    @property
    def warmed_in_noise(self) -> bool:
        """Whether the means after 1, 2, ... warm-up steps lie within the warm row's spread."""
        return all(c.within_noise(self.warm) for w, c in self.by_warmup.items() if 0 < w < max(self.by_warmup))


@dataclass(frozen=True)
class OptimizerSplit:
    """Forward, backward and the AdamW step timed apart beside the training step timed whole."""

    size: str
    context: int
    dtype: str
    forward_s: float
    backward_s: float
    optimizer_s: float
    train_s: float | None  # the whole step timed as one (None: the 2026 grid times only the parts)
    floor_bytes: int  # the AdamW step's least memory traffic (fp32 state)

    @property
    def parts_s(self) -> float:
        return self.forward_s + self.backward_s + self.optimizer_s

    @property
    def optimizer_share(self) -> float:
        return self.optimizer_s / self.parts_s

    @property
    def optimizer_gbps(self) -> float:
        return self.floor_bytes / self.optimizer_s / 1e9


@dataclass(frozen=True)
class EditionFacts:
    """One edition's answers: its sizes (labels), the rows measured at them, or none yet."""

    edition: str
    sizes: list[str]
    grid: list[GridRow] = field(default_factory=list)
    ooms: list[str] = field(default_factory=list)  # "size ctx N dtype mode"
    warmup: list[WarmupCase] = field(default_factory=list)
    optimizer: list[OptimizerSplit] = field(default_factory=list)
    batch: int | None = None
    fresh_warmup: bool = False  # the warm-up rows each ran in a fresh process (2026's study)
    oom_cells: list[tuple[str, int, str, str, Cell]] = field(default_factory=list)  # (size, ctx, dtype, mode, cell)

    @property
    def measured(self) -> bool:
        return bool(self.grid)

    def cells(self) -> list[Cell]:
        return [c for r in self.grid for c in r.modes.values() if c.ok]

    @property
    def stable(self) -> tuple[int, int]:
        """(rows whose std is under STABLE of the mean, measured rows)."""
        cs = self.cells()
        return sum(c.rel_std is not None and c.rel_std < STABLE for c in cs), len(cs)

    def noisiest(self, n: int = 3) -> list[tuple[GridRow, str, Cell]]:
        """The n measured (row, mode, cell) with the largest std ÷ mean."""
        cs = [(r, m, c) for r in self.grid for m, c in r.modes.items() if c.rel_std is not None]
        return sorted(cs, key=lambda x: -x[2].rel_std)[:n]

    def largest(self, dtype: str = "fp32") -> list[GridRow]:
        """The grid rows of the largest size measured in `dtype`, by context."""
        rows = [r for r in self.grid if r.dtype == dtype and any(c.ok for c in r.modes.values())]
        return [r for r in rows if r.size == rows[-1].size] if rows else []

    @property
    def fwd_bwd(self) -> tuple[GridRow, GridRow] | None:
        """(the smallest- and largest-context rows of the largest fp32 size whose forward and backward were
        both measured)."""
        rows = [r for r in self.grid if r.dtype == "fp32"
                and all(r.modes.get(m) and r.modes[m].ok for m in ("forward", "backward"))]
        rows = [r for r in rows if r.size == rows[-1].size] if rows else []
        return (rows[0], rows[-1]) if rows else None

    @property
    def headline(self) -> GridRow | None:
        """The largest fp32 size's training step at its largest measured context: the index's number."""
        rows = [r for r in self.largest() if r.train is not None and r.train.ok]
        return rows[-1] if rows else None

    @property
    def optimizer_bf16_over_fp32(self) -> float | None:
        by = {o.dtype: o.optimizer_s for o in self.optimizer}
        return by["bf16"] / by["fp32"] if {"bf16", "fp32"} <= set(by) else None


# the 2026 edition's studies answer the same questions: its grid (every 2026 size, forward, backward and
# the optimizer step) and its warm-up study (each warm-up count in a fresh process)
STUDIES = {"main_2026": "main", "warmup_fresh_process": "warmup"}


def _study(b: Bench) -> str | None:
    s = b.cfg.study or b.details.get("study")  # older files kept it in details
    return STUDIES.get(s, s)


def _fresh(rows: list[Bench]) -> bool:
    return any((b.cfg.study or "") == "warmup_fresh_process" for b in rows)


def _size_order(edition: str):
    names = list(EDITION_SIZES[edition])
    return lambda b: (names.index(b.cfg.size) if b.cfg.size in names else len(names))


def edition_facts(edition: str, rows: list[Bench]) -> EditionFacts:
    sizes = [size_label(SizeRef(edition, n)) for n in EDITION_SIZES[edition]]
    main = sorted((b for b in rows if _study(b) == "main"), key=_size_order(edition))
    if not main:
        return EditionFacts(edition, sizes)
    grid: dict[tuple, dict[str, Cell]] = {}
    for b in main:
        key = (size_label(b.cfg.size_ref, b.cfg.size), b.cfg.context, b.cfg.dtype)
        grid.setdefault(key, {})[b.cfg.mode] = cell(b)
    order = {"fp32": 0, "bf16": 1, "fp16": 2}
    rows_ = sorted((GridRow(s, c, d, {m: modes[m] for m in MODES if m in modes}) for (s, c, d), modes in grid.items()),
                   key=lambda r: order.get(r.dtype, 9))  # stable: sizes stay in table order within a dtype
    rows_ = sorted(rows_, key=lambda r: (order.get(r.dtype, 9), sizes.index(r.size) if r.size in sizes else 99,
                                         r.context))
    ooms = [f"{size_label(b.cfg.size_ref, b.cfg.size)} ctx {b.cfg.context} {b.cfg.dtype} {b.cfg.mode}"
            for b in main if b.status is Status.OOM]
    warm: dict[tuple, dict[int, Cell]] = {}
    for b in sorted((b for b in rows if _study(b) == "warmup" and b.measured), key=_size_order(edition)):
        key = (size_label(b.cfg.size_ref, b.cfg.size), b.cfg.context, b.cfg.dtype, b.cfg.mode)
        warm.setdefault(key, {})[int(b.cfg.warmup)] = cell(b)
    cases = [WarmupCase(*k, dict(sorted(v.items()))) for k, v in warm.items() if len(v) > 1]
    oom_cells = [(size_label(b.cfg.size_ref, b.cfg.size), b.cfg.context, b.cfg.dtype, b.cfg.mode, cell(b))
                 for b in main if b.status is Status.OOM]
    return EditionFacts(edition, sizes, rows_, ooms, cases, _optimizer(main), main[0].cfg.batch,
                        _fresh(rows), oom_cells)


def _optimizer(main: list[Bench]) -> list[OptimizerSplit]:
    """For fp32 and bf16: the largest size with an optimizer-step row and forward and backward (and the
    training step, where timed) at the same context."""
    out = []
    for dtype in ("fp32", "bf16"):
        for b in reversed([b for b in main if b.measured and b.cfg.mode == "optimizer_step" and b.cfg.dtype == dtype]):
            same = {o.cfg.mode: o.stats.mean for o in main if o.measured and o.cfg.dtype == dtype
                    and o.cfg.size == b.cfg.size and o.cfg.context == b.cfg.context}
            if {"forward", "backward"} <= set(same) and b.cfg.size_ref is not None:
                out.append(OptimizerSplit(size_label(b.cfg.size_ref), b.cfg.context, dtype, same["forward"],
                                          same["backward"], b.stats.mean, same.get("train_step"),
                                          acc.adamw_step_bytes(b.cfg.size_ref.config.params)))
                break
    return out


@dataclass(frozen=True)
class BenchmarkingScriptFacts:
    device: str
    editions: list[EditionFacts]  # 2025 then 2026

    @property
    def headline(self) -> tuple[EditionFacts, GridRow] | None:
        """The newest edition's headline where it has rows, else the older one's."""
        for e in reversed(self.editions):
            if e.headline is not None:
                return e, e.headline
        return None


def benchmarking_script_facts(device: str, rows: list[Bench]) -> BenchmarkingScriptFacts:
    per = by_edition(rows)
    return BenchmarkingScriptFacts(device, [edition_facts(e, per.get(e, [])) for e in EDITION_SIZES])
