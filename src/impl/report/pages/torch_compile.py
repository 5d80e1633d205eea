"""torch_compile on the first GPU with rows: (a) compiled naive attention against eager, (b) the compiled model and
optimizer step against eager. A ratio divides rows of one run only (runs since issue 33 time eager beside compiled;
older compiled rows sit beside another run's pytorch_attention rows, undivided)."""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter

from impl.bench.row import Metric, Status
from impl.model import size_rank
from impl.report.pages import Context, Scored
from impl.report.flash_rows import Cell, cell, not_run, ran
from impl.report.pages.pytorch_attention import AttentionConfig, before_backward, if_ran, median, passes, shapes
from impl.report.ratio import Ratio, med, of_benches, ratio
from impl.report.rows import Bench, group, of_newest_run, stat_name
from impl.report.runs import RunsFacts
from impl.workloads.compiled import WHY
from impl.workloads.problems import Problem as P

PROBLEMS = (P.TORCH_COMPILE,)
PROBLEM = P.TORCH_COMPILE
STEP = attrgetter("step_s")  # (b)'s time of a row (the mean in older-format runs)
RAN = (Status.MEASURED, Status.OOM)  # any other status: left out
MODES_B = ("forward", "forward_backward", "optimizer_step", "train_step")  # the answer's modes, where rows have them
GRID_MODES = ("forward", "forward_backward", "train_step")  # the table's, where the rows have them


@dataclass(frozen=True)
class CompileConfig(AttentionConfig):  # (a)'s d_model, seq and pass as pytorch_attention's, (b)'s mode, and:
    impl: str = ""  # "compiled" or "eager"
    backend: str | None = None
    size: str | None = None  # (b)
    context: int | None = None  # (b); None: the optimizer step


_cfg = CompileConfig.of


def _at(b: Bench) -> tuple:  # (b)'s (size, context)
    return _cfg(b).size, _cfg(b).context


def same_run(a: Bench, b: Bench) -> bool:
    return (a.run.device, a.run.section, a.run.datetime) == (b.run.device, b.run.section, b.run.datetime)


@dataclass(frozen=True)
class Times:  # a configuration's eager and compiled cells (seconds)
    eager: Cell | None
    compiled: Cell | None
    ratio: Ratio | None  # compiled ÷ eager (below 1: compiled is faster); in (a) of one run's rows, noise judged


@dataclass(frozen=True)
class AttentionRow:
    d: int
    seq: int
    forward: Times
    backward: Times
    compile_forward_s: float | None  # the first call, timed once
    compile_backward_s: float | None
    eager_before_backward: float | None  # bytes in use before backward
    compiled_before_backward: float | None


@dataclass(frozen=True)
class AttentionFacts:
    compiled: int  # compiled rows (every status)
    rows: tuple[AttentionRow, ...]
    backend: str | None
    not_run: tuple  # (status, reason) of compiled rows that did not run
    not_run_rows: int
    compiled_runs: RunsFacts
    eager_runs: RunsFacts | None  # the eager rows' runs (another run's where not paired)
    runs: RunsFacts  # compiled and eager rows together

    @property
    def paired(self) -> list[tuple[int, Ratio]]:  # (seq, compiled ÷ eager) of each shape and pass paired in one run
        return [(r.seq, t.ratio) for r in self.rows for t in (r.forward, r.backward) if t.ratio is not None]

    @property
    def longest(self) -> list[tuple[int, Ratio]]:  # those at the longest sequence paired
        return [p for p in self.paired if p[0] == max(q for q, _ in self.paired)]

    @property
    def longest_range(self) -> tuple[float, float] | None:  # their lowest and highest ratio
        values = [r.value for _, r in self.longest]
        return (min(values), max(values)) if values else None


def _pass(e: Bench | None, c: Bench | None) -> Times:
    ok = e is not None and c is not None and e.measured and c.measured and same_run(e, c)
    return Times(cell(e, median), cell(c, median), of_benches(c, e, "eager") if ok else None)


def attention_facts(device: str, compiled: list[Bench], attention: list[Bench]) -> AttentionFacts:
    """`compiled`: the device's (a) rows; `attention`: its pytorch_attention rows, the eager side where no
    run of (a) timed eager (else the newest such run answers alone)."""
    eager = attention
    if any(_cfg(b).impl == "eager" for b in compiled):
        run = of_newest_run(compiled, among=[b for b in compiled if _cfg(b).impl == "eager"])
        compiled, eager = [b for b in run if _cfg(b).impl != "eager"], [b for b in run if _cfg(b).impl == "eager"]
    rows = []
    for d, s in shapes(compiled):
        (cf, cb), (ef, eb) = passes(compiled, d, s), passes(eager, d, s)
        first = next(b for b in compiled if (_cfg(b).d_model, _cfg(b).seq) == (d, s)).details
        rows.append(AttentionRow(d, s, _pass(ef, cf), _pass(eb, cb), first.get("compile_forward_s"),
                                 first.get("compile_backward_s"), if_ran(eb, before_backward),
                                 if_ran(cb, before_backward)))
    return AttentionFacts(len(compiled), tuple(rows), _cfg(compiled[0]).backend, not_run(compiled),
                          sum(not ran(b) for b in compiled), RunsFacts.of(device, compiled),
                          RunsFacts.of(device, eager) if eager else None, RunsFacts.of(device, compiled + eager))


@dataclass(frozen=True)
class ModeRatios:
    mode: str
    by_size: dict[str, float]  # compiled ÷ eager (same run), median over contexts: smallest, largest size of the mode
    contexts: dict[str, tuple[int, ...]] = field(default_factory=dict)  # per size: the contexts of its pairs

    @property
    def gain_shrinks(self) -> bool:  # smaller on the largest size than on the smallest
        vals = list(self.by_size.values())
        return len(vals) == 2 and vals[-1] > vals[0]

    def only_context(self, size: str) -> int | None:  # its one context, where another size of the mode reads more
        xs = self.contexts.get(size, ())
        wider = any(len(v) > 1 for v in self.contexts.values())
        return xs[0] if len(xs) == 1 and xs[0] is not None and wider else None


def mode_ratios(rows: list[Bench]) -> list[ModeRatios]:
    """Per mode, the smallest and the largest size that have same-run eager and compiled rows of that mode (a size
    whose larger modes ran out of memory, e.g. the 10B's training steps, does not stand in as the largest)."""
    rows = sorted((b for b in rows if b.measured), key=lambda b: size_rank(_cfg(b).size))
    out = []
    for mode in MODES_B:
        per, ctxs = {}, {}
        for size in dict.fromkeys(_cfg(b).size for b in rows):
            sel = [b for b in rows if _cfg(b).mode == mode and _cfg(b).size == size]
            pairs = [(c, e) for c in sel if _cfg(c).impl == "compiled" for e in sel if _cfg(e).impl == "eager"
                     and same_run(c, e) and _cfg(e).context == _cfg(c).context]
            if pairs:
                per[size] = med([c.stats.median / e.stats.median for c, e in pairs])
                ctxs[size] = tuple(sorted({_cfg(c).context for c, _ in pairs}, key=lambda x: (x is None, x or 0)))
        ends = list(per)[:1] + list(per)[-1:]  # the smallest and the largest size (one where one size has pairs)
        if ends:
            out.append(ModeRatios(mode, {k: per[k] for k in ends}, {k: ctxs[k] for k in ends}))
    return out


def _times(eager: Cell | None, compiled: Cell | None) -> Times:
    return Times(eager, compiled, ratio(*(x.value if x else None for x in (compiled, eager))))


def _cells(eager: Bench | None, compiled: Bench | None) -> Times:
    return _times(cell(eager, STEP), cell(compiled, STEP))


def _train_step(fb: Bench | None, opt: Bench | None) -> Cell | None:  # fwd+bwd + optimizer step, derived; both ran
    steps = [x.step_s if x is not None and ran(x) else None for x in (fb, opt)]
    return None if None in steps else Cell(sum(steps))


@dataclass(frozen=True)
class ModelRow:
    size: str
    context: int
    modes: tuple[Times, ...]  # per the table's modes (train_step: the timed training step, where rows have it)
    train_step: Times | None  # the derived fwd+bwd + optimizer step; None: timed train_step rows, or no optimizer rows


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
    reason: str | None = None  # the first left-out row's reason


@dataclass(frozen=True)
class OutOfMemory:  # the rows of one (size, context, mode) that ran out of memory
    size: str
    context: int | None  # None: the optimizer step
    mode: str
    impls: tuple[str, ...]  # eager, compiled
    need_bytes: float | None  # details.closed_form_need_bytes (the eager step's count)
    other_ran: Bench | None = None  # the other impl's measured row of the same cell, where one ran

    @property
    def other_peak(self) -> int | None:
        return self.other_ran.row.memory.peak_allocated if self.other_ran and self.other_ran.row.memory else None


def out_of_memory(ordered: list[Bench]) -> list[OutOfMemory]:  # per (size, context, mode), in the table's order
    cells = group((b for b in ordered if _cfg(b).mode in MODES_B), lambda b: (*_at(b), _cfg(b).mode))
    return [OutOfMemory(size, context, mode, tuple(_cfg(b).impl for b in oom),
                        next(filter(None, (b.details.get("closed_form_need_bytes") for b in oom)), None),
                        next((b for b in g if b.measured), None))
            for (size, context, mode), g in cells.items() if (oom := [b for b in g if b.status is Status.OOM])]


@dataclass(frozen=True)
class ModelFacts:
    modes: tuple[str, ...]  # the table's grid modes
    rows: tuple[ModelRow, ...]
    timed_train_step: bool  # the rows have timed training steps (mode train_step); else the column is derived
    optimizer: tuple[tuple[str, Times], ...]  # (size, its optimizer step)
    compiled_what: str | None  # the row's record of what was compiled (regional); None: the whole model
    stat: str  # what the times are (rows.stat_name)
    compilations: tuple[Compilation, ...]
    left_out_by_reason: tuple[tuple[str | None, tuple[LeftOut, ...]], ...]  # grouped, first appearance first
    answer: tuple[ModeRatios, ...]
    runs: RunsFacts
    oom: tuple[OutOfMemory, ...] = ()
    device_bytes: int | None = None  # the GPU's memory (the rows' environment)
    why = WHY  # the code's reason, never a stored copy (an older run's typed its compile times)


def _compilation(b: Bench, rows: list[Bench]) -> Compilation:
    k, i = _cfg(b), b.details
    graph = i.get("graph") or ("inference" if k.mode == "forward" else "training")
    reused = {_cfg(x).context for x in rows if _cfg(x).impl == "compiled" and _cfg(x).size == k.size
              and x.details.get("graph") == graph and x.details.get("reused_graph") and _cfg(x).context is not None}
    first = b.metric(Metric.FIRST_CALL_S)
    return Compilation(k.size, graph, k.context, i.get("first_call_s") if first is None else first,
                       i.get("compile_s"), tuple(sorted(reused)), i.get("graph_breaks"))


def model_facts(device: str, rows: list[Bench]) -> ModelFacts:
    """`rows`: the device's (b) rows, in load order."""
    ordered = sorted(rows, key=lambda b: (size_rank(_cfg(b).size), _cfg(b).context is None, _cfg(b).context or 0))
    grid = [b for b in ordered if _cfg(b).mode != "optimizer_step"]
    modes = tuple(m for m in GRID_MODES if any(_cfg(b).mode == m for b in grid))
    timed = "train_step" in modes
    opt = {size: {_cfg(b).impl: b for b in g} for size, g in
           group((b for b in ordered if _cfg(b).mode == "optimizer_step"), lambda b: _cfg(b).size).items()}
    cells = {k: {(_cfg(b).mode, _cfg(b).impl): b for b in g} for k, g in group(grid, _at).items()}
    table = [ModelRow(size, context, tuple(_cells(sel.get((m, "eager")), sel.get((m, "compiled"))) for m in modes),
                      _times(*(_train_step(sel.get(("forward_backward", i)), opt.get(size, {}).get(i))
                                   for i in ("eager", "compiled"))) if opt and not timed else None)
             for (size, context), sel in cells.items()]
    left_out = [LeftOut(size, context, () if len(cut) == len(g) else tuple((_cfg(b).mode, _cfg(b).impl) for b in cut),
                        cut[0].row.reason)
                for (size, context), g in group(ordered, _at).items() if (cut := [b for b in g if b.status not in RAN])]
    what = next((b.details["compiled_what"] for b in ordered if b.details.get("compiled_what")), None)
    compilations = [_compilation(b, ordered) for b in ordered
                    if _cfg(b).impl == "compiled" and b.details.get("compiled_now")]
    optimizer = tuple((s, _cells(o.get("eager"), o.get("compiled"))) for s, o in opt.items())
    return ModelFacts(modes, tuple(table), timed, optimizer, what, stat_name(ordered), tuple(compilations),
                      tuple((r, tuple(xs)) for r, xs in group(left_out, lambda x: x.reason).items()),
                      tuple(mode_ratios(rows)), RunsFacts.of(device, rows), tuple(out_of_memory(ordered)),
                      next((b.row.env.gpu_memory_bytes for b in ordered if b.row.env.gpu_memory_bytes), None))


@dataclass(frozen=True)
class TorchCompileFacts:
    device: str | None  # None: no GPU device has rows of either part
    attention: AttentionFacts | None = None
    model: ModelFacts | None = None

    @property
    def scores(self) -> dict[str, Scored]:  # not measured without a GPU device; (b)'s rows alone leave it unanswered
        a = self.attention
        return {PROBLEM: Scored.of(a.compiled_runs if a else None)} if a or self.device is None else {}

    @property
    def sources(self) -> list[str]:
        return sorted({f for part in (self.attention, self.model) if part for f in part.runs.files})


def facts(ctx: Context) -> TorchCompileFacts:
    for device, rows in ctx.rows.per_gpu(PROBLEM):
        # (a) "attention" or (b) "model": a config key of the bench layer's rows, a details key in older ones
        a, m = ([b for b in rows if (b.row.config.get("study") or b.details.get("study")) == s]
                for s in ("attention", "model"))
        if a or m:  # the first GPU with rows answers
            eager = ctx.rows.of(P.PYTORCH_ATTENTION, device=device)
            return TorchCompileFacts(device, attention_facts(device, a, eager) if a else None,
                                     model_facts(device, m) if m else None)
    return TorchCompileFacts(None)
