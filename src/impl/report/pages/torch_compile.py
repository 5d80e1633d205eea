"""torch_compile: (a) compiled naive attention against eager on the pytorch_attention configurations,
(b) the compiled Transformer against eager per size and context, the compiled optimizer step and the
compilations themselves. The first GPU device with rows answers. A ratio divides rows of one run only:
runs since issue 33 time the eager attention beside the compiled one (impl "eager"); older compiled
rows are shown beside the pytorch_attention rows of another run, undivided.
templates/torch_compile.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from impl.bench.row import Metric, Status
from impl.model import size_rank
from impl.report.pages import Context, Kind, Scored
from impl.report.pages.pytorch_attention import Cell, by_mode, cell, in_use, median, not_run, shapes
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, of_newest_run, stat_name, view
from impl.report.runs import RunsFacts, newest_date
from impl.workloads.compiled import WHY
from impl.workloads.problems import Problem as P

PROBLEMS = (P.TORCH_COMPILE,)
PROBLEM = P.TORCH_COMPILE
STEP = attrgetter("step_s")  # (b)'s time of a row: Bench.step_s (the mean in older-format runs)


@dataclass(frozen=True)
class CompileConfig:
    d_model: int | None = None
    seq: int | None = None
    mode: str = ""
    impl: str = ""  # "compiled" or "eager"
    backend: str | None = None
    size: str | None = None  # (b)
    context: int | None = None  # (b); None: the optimizer step


def _cfg(b: Bench) -> CompileConfig:
    return view(CompileConfig, b)


def _study(b: Bench) -> str | None:
    """(a) "attention" or (b) "model": a config key of the bench layer's rows, a details key in the older format."""
    return b.row.config.get("study") or b.details.get("study")


def same_run(a: Bench, b: Bench) -> bool:
    return (a.run.device, a.run.section, a.run.datetime) == (b.run.device, b.run.section, b.run.datetime)


# ---- (a) compiled vs eager attention -------------------------------------------------------------

@dataclass(frozen=True)
class Pair:
    """A compiled attention row and the eager row of its run (compiled ÷ eager: below 1, compiled is faster)."""

    d: int
    seq: int
    mode: str
    ratio: Ratio | None  # None: no eager row of the same run, or one of the two did not run


@dataclass(frozen=True)
class PassCells:
    eager: Cell | None  # seconds
    compiled: Cell | None
    ratio: float | None  # compiled ÷ eager, rows of one run only


@dataclass(frozen=True)
class AttentionRow:
    d: int
    seq: int
    forward: PassCells
    backward: PassCells
    compile_forward_s: float | None  # the first call, timed once
    compile_backward_s: float | None
    eager_before_backward: float | None  # bytes in use before backward
    compiled_before_backward: float | None


@dataclass(frozen=True)
class AttentionFacts:
    pairs: tuple[Pair, ...]  # every compiled row
    rows: tuple[AttentionRow, ...]
    backend: str | None
    not_run: tuple  # (status, reason) of compiled rows that did not run
    not_run_rows: int
    compiled_runs: RunsFacts
    eager_runs: RunsFacts | None  # the eager rows' runs (another run's where not paired)
    runs: RunsFacts  # compiled and eager rows together
    date: str

    @property
    def paired(self) -> list[Pair]:
        return [p for p in self.pairs if p.ratio is not None]

    @property
    def longest(self) -> list[Pair]:
        """The same-run pairs at the longest sequence paired."""
        seq = max((p.seq for p in self.paired), default=None)
        return [p for p in self.paired if p.seq == seq]

    @property
    def longest_range(self) -> tuple[float, float]:
        values = [p.ratio.value for p in self.longest]
        return min(values), max(values)


def newest_paired_run(rows: list[Bench]) -> list[Bench]:
    """The rows of the newest run that timed eager beside compiled (since issue 33), or all `rows`
    where no run did: such a run answers (a) alone, its ratios never mixing runs."""
    eager = [b for b in rows if _cfg(b).impl == "eager"]
    return of_newest_run(rows, among=eager) if eager else rows


def pairs(compiled: list[Bench], eager: list[Bench]) -> list[Pair]:
    """Each compiled row with the eager row of the same run and shape, where there is one."""
    out = []
    for c in compiled:
        k = _cfg(c)
        e = next((e for e in eager if same_run(c, e)
                  and (_cfg(e).d_model, _cfg(e).seq, _cfg(e).mode) == (k.d_model, k.seq, k.mode)), None)
        r = None
        if e is not None and c.measured and e.measured:
            r = ratio(c.stats.median, e.stats.median, "eager", spread(c.stats.stddev, c.stats.iqr),
                      spread(e.stats.stddev, e.stats.iqr))
        out.append(Pair(k.d_model, k.seq, k.mode, r))
    return out


def _pass(e: Bench | None, c: Bench | None) -> PassCells:
    ok = e is not None and c is not None and e.measured and c.measured and same_run(e, c)
    return PassCells(cell(e, median), cell(c, median), c.stats.median / e.stats.median if ok else None)


def _before_backward(b: Bench | None) -> float | None:
    return in_use(b, "memory_before_backward_bytes") if b is not None and b.status is Status.MEASURED else None


def _attention_row(compiled: list[Bench], eager: list[Bench], d: int, seq: int) -> AttentionRow:
    c, e = by_mode(compiled, d, seq), by_mode(eager, d, seq)
    first = next(b for b in compiled if (_cfg(b).d_model, _cfg(b).seq) == (d, seq))
    return AttentionRow(d, seq, _pass(e.get("forward"), c.get("forward")), _pass(e.get("backward"), c.get("backward")),
                        first.details.get("compile_forward_s"), first.details.get("compile_backward_s"),
                        _before_backward(e.get("backward")), _before_backward(c.get("backward")))


def attention_facts(device: str, compiled: list[Bench], attention: list[Bench]) -> AttentionFacts:
    """`compiled`: the device's torch_compile (a) rows; `attention`: its pytorch_attention rows (the
    eager side where no run of (a) timed eager)."""
    if any(_cfg(b).impl == "eager" for b in compiled):
        run = newest_paired_run(compiled)
        compiled, eager = [b for b in run if _cfg(b).impl != "eager"], [b for b in run if _cfg(b).impl == "eager"]
    else:
        eager = attention
    return AttentionFacts(tuple(pairs(compiled, eager)),
                          tuple(_attention_row(compiled, eager, d, s) for d, s in shapes(compiled)),
                          _cfg(compiled[0]).backend, tuple(not_run(compiled)),
                          sum(b.status is not Status.MEASURED for b in compiled), RunsFacts.of(device, compiled),
                          RunsFacts.of(device, eager) if eager else None, RunsFacts.of(device, compiled + eager),
                          newest_date(compiled))


# ---- (b) compiled model vs eager -------------------------------------------------------------------

MODES_B = ("forward", "forward_backward", "optimizer_step")  # the answer's modes
GRID_MODES = ("forward", "forward_backward", "train_step")  # the table's, where the rows have them


@dataclass(frozen=True)
class ModeRatios:
    """One mode: compiled ÷ eager (same run), the median over contexts, of the smallest and largest size."""

    mode: str
    by_size: dict[str, float]

    @property
    def gain_shrinks(self) -> bool:
        """The compiled gain is smaller on the largest size than on the smallest."""
        vals = list(self.by_size.values())
        return len(vals) == 2 and vals[-1] > vals[0]


def mode_ratios(rows: list[Bench]) -> list[ModeRatios]:
    """`rows` in load order (the smallest size first)."""
    rows = [b for b in rows if b.measured]
    sizes = list(dict.fromkeys(_cfg(b).size for b in rows))
    out = []
    for mode in MODES_B:
        per = {}
        for size in dict.fromkeys((sizes[0], sizes[-1])) if sizes else ():
            sel = [b for b in rows if _cfg(b).mode == mode and _cfg(b).size == size]
            rs = sorted(c.stats.median / e.stats.median for c in sel if _cfg(c).impl == "compiled"
                        for e in sel if _cfg(e).impl == "eager" and same_run(c, e) and _cfg(e).context == _cfg(c).context)
            if rs:
                per[size] = rs[len(rs) // 2]
        if per:
            out.append(ModeRatios(mode, per))
    return out


@dataclass(frozen=True)
class ModelCells:
    """Eager and compiled time of one configuration (a mode's rows, or the derived training step)."""

    eager: Cell | None
    compiled: Cell | None

    @classmethod
    def of(cls, eager: Bench | None, compiled: Bench | None) -> ModelCells:
        return cls(cell(eager, STEP), cell(compiled, STEP))

    @property
    def ratio(self) -> float | None:
        """Compiled ÷ eager (below 1: compiled is faster)."""
        e, c = (x.value if x else None for x in (self.eager, self.compiled))
        return c / e if e and c is not None else None


def _train_step(fb: Bench | None, opt: Bench | None) -> Cell | None:
    """forward+backward + the size's optimizer step (derived, not timed together); None unless both ran."""
    parts = [cell(x, STEP) for x in (fb, opt)]
    return Cell(sum(p.value for p in parts)) if all(p and p.value is not None for p in parts) else None


@dataclass(frozen=True)
class ModelRow:
    size: str
    context: int
    modes: tuple[ModelCells, ...]  # per the table's modes
    train_step: ModelCells | None  # None: no optimizer-step rows


@dataclass(frozen=True)
class Compilation:
    size: str
    graph: str  # "inference", "training" or "optimizer"
    context: int | None
    first_call_s: float | None
    compile_s: float | None
    reused_at: tuple[int, ...]  # the contexts whose rows reused the graph
    graph_breaks: int | None


@dataclass(frozen=True)
class LeftOut:
    size: str
    context: int | None  # None: the optimizer step
    parts: tuple[tuple[str, str], ...]  # (mode, impl) where only some of the configuration's rows were left out


@dataclass(frozen=True)
class ModelFacts:
    modes: tuple[str, ...]  # the table's grid modes
    rows: tuple[ModelRow, ...]
    optimizer: tuple[tuple[str, ModelCells], ...]  # (size, its optimizer step)
    compiled_what: str | None  # the row's record of what was compiled (regional); None: the whole model
    why: str  # impl.workloads.compiled.WHY: the code's reason (an older run's stored copy typed its compile times)
    stat: str  # what the times are (rows.stat_name)
    compilations: tuple[Compilation, ...]
    left_out_reason: str | None
    left_out: tuple[LeftOut, ...]
    answer: tuple[ModeRatios, ...]
    runs: RunsFacts


def _compilations(rows: list[Bench]) -> list[Compilation]:
    out = []
    for b in rows:
        k, i = _cfg(b), b.details
        if k.impl != "compiled" or not i.get("compiled_now"):
            continue
        graph = i.get("graph") or ("inference" if k.mode == "forward" else "training")
        reused = sorted({_cfg(x).context for x in rows if _cfg(x).impl == "compiled" and _cfg(x).size == k.size
                         and x.details.get("graph") == graph and x.details.get("reused_graph")
                         and _cfg(x).context is not None})
        first = b.metric(Metric.FIRST_CALL_S)
        out.append(Compilation(k.size, graph, k.context, i.get("first_call_s") if first is None else first,
                               i.get("compile_s"), tuple(reused), i.get("graph_breaks")))
    return out


def _left_out(rows: list[Bench]) -> list[LeftOut]:
    groups: dict[tuple, list[Bench]] = {}
    for b in rows:
        groups.setdefault((_cfg(b).size, _cfg(b).context), []).append(b)
    out = []
    for (size, context), g in groups.items():
        left = [b for b in g if b.status not in (Status.MEASURED, Status.OOM)]
        if left:
            out.append(LeftOut(size, context, () if len(left) == len(g) else
                               tuple((_cfg(b).mode, _cfg(b).impl) for b in left)))
    return out


def model_facts(device: str, rows: list[Bench]) -> ModelFacts:
    """`rows`: the device's torch_compile (b) rows, in load order."""
    ordered = sorted(rows, key=lambda b: (size_rank(_cfg(b).size), _cfg(b).context is None, _cfg(b).context or 0))
    grid = [b for b in ordered if _cfg(b).mode != "optimizer_step"]
    modes = tuple(m for m in GRID_MODES if any(_cfg(b).mode == m for b in grid))
    opt: dict[str, dict[str, Bench]] = {}
    for b in ordered:
        if _cfg(b).mode == "optimizer_step":
            opt.setdefault(_cfg(b).size, {})[_cfg(b).impl] = b
    cells: dict[tuple[str, int], dict[tuple[str, str], Bench]] = {}
    for b in grid:
        cells.setdefault((_cfg(b).size, _cfg(b).context), {})[(_cfg(b).mode, _cfg(b).impl)] = b
    table = []
    for (size, context), sel in cells.items():
        o = opt.get(size, {})
        train = ModelCells(*(_train_step(sel.get(("forward_backward", i)), o.get(i)) for i in ("eager", "compiled"))) \
            if opt else None
        table.append(ModelRow(size, context, tuple(ModelCells.of(sel.get((m, "eager")), sel.get((m, "compiled")))
                                                   for m in modes), train))
    left = [b for b in ordered if b.status not in (Status.MEASURED, Status.OOM)]
    return ModelFacts(modes, tuple(table),
                      tuple((s, ModelCells.of(o.get("eager"), o.get("compiled"))) for s, o in opt.items()),
                      next((b.details["compiled_what"] for b in ordered if b.details.get("compiled_what")), None), WHY,
                      stat_name(ordered), tuple(_compilations(ordered)), left[0].row.reason if left else None,
                      tuple(_left_out(ordered)), tuple(mode_ratios(rows)), RunsFacts.of(device, rows))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TorchCompileFacts:
    device: str | None  # None: no GPU device has rows of either part
    attention: AttentionFacts | None = None
    model: ModelFacts | None = None
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        if self.device is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        a = self.attention
        return {PROBLEM: Scored(Kind.MEASURED, self.device, a.date)} if a else {}

    @property
    def sources(self) -> list[str]:
        runs = [r for r in (self.attention and self.attention.runs, self.model and self.model.runs) if r]
        return sorted({f for r in runs for f in r.files})


def facts(ctx: Context) -> TorchCompileFacts:
    for device in ctx.rows.gpu_devices():
        rows = ctx.rows.of(PROBLEM, device=device)
        compiled = [b for b in rows if _study(b) == "attention"]
        model = [b for b in rows if _study(b) == "model"]
        if compiled or model:  # the first GPU with rows answers
            return TorchCompileFacts(
                device, attention_facts(device, compiled, ctx.rows.of(P.PYTORCH_ATTENTION, device=device))
                if compiled else None, model_facts(device, model) if model else None)
    return TorchCompileFacts(None)
