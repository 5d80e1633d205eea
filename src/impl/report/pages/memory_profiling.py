"""memory_profiling: the 2025 edition's (a)–(e) on one size's rows ((d), (e) at the grid's reference context) beside
the 2026 edition's (a)–(f) on xl (2026) at contexts 128 and 2048. The first GPU device answers."""
from __future__ import annotations

import re
from dataclasses import dataclass, field, fields, replace

from impl import accounting as acc
from impl.bench.row import Status
from impl.model.sizes import ModelConfig, SizeRef, size_rank
from impl.nsys.extract import read_memory_extract
from impl.nsys.memory import MemoryTrace, RangeMemory
from impl.report import figures
from impl.report.pages._nsys import Filed, newest_with
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.rows import RowView, SizedView, group, newest
from impl.report.runs import RunsFacts, SourcedFromRuns, device_short, newest_date
from impl.workloads.problems import Problem as P
from impl.workloads.sweeps import grid

PROBLEMS = (P.MEMORY_PROFILING,)
PROBLEM = P.MEMORY_PROFILING
SLUG = "memory_profiling"
GRID = grid(P.MEMORY_PROFILING, "full")
CASES_2026 = {tuple(c) for c in GRID.cases_2026}  # (size, context) the 2026 sweep asks
# The 2025 handout asks (d) "at our reference hyperparameters": batch 4 for every model (its §1.1.2), the context
# left to vary; the suite takes 512, the longest context the problem profiles, as the reference (the grid's).
REFERENCE_CONTEXT, REFERENCE_BATCH = GRID.reference_context, GRID.batch
ASKED = SizeRef("2026", "xl").label
TIMELINE = figures.words("memory_timeline")  # the words drawn into the timeline figures
CELLS = (("fp32", "forward"), ("fp32", "train_step"), ("bf16", "forward"), ("bf16", "train_step"))
NAMED = {("fp32", "forward"): 0, ("bf16", "forward"): 1, ("fp32", "train_step"): 2}  # (e)'s rows, in its order


@dataclass(frozen=True)
class MemCase(SizedView, RowView):
    """One row: its config and what it measured (peaks of measured rows only)."""

    context: int | None = None
    dtype: str | None = None
    mode: str | None = None  # forward / train_step / block_probe
    batch: int | None = None

    peak_bytes = property(lambda self: self.b.row.memory.peak_allocated if self.status is Status.MEASURED else None)
    reserved_bytes = property(lambda self: self.b.row.memory.peak_reserved if self.status is Status.MEASURED else None)
    measured = property(lambda self: self.peak_bytes is not None)
    snapshot = property(lambda self: self.details.get("snapshot") or {})
    timeline = property(lambda self: self.snapshot.get("timeline"))  # {"x", "y", "markers", "blocks"}
    largest = property(lambda self: self.snapshot.get("largest") or [])  # allocations by size, with frames
    traced = property(lambda self: [x for x in self.largest if x.get("frames")])  # with a Python stack trace
    labels = property(lambda self: shape_labels(self.size_ref.config, self.batch, self.context, self.dtype))

    @property
    def need_bytes(self) -> int | None:
        """The closed form: the parameters (forward) or the fp32 training step's need."""
        key = "param_bytes" if self.mode == "forward" else "train_step_need_bytes"
        return (self.details.get("closed_form") or {}).get(key)


mem_case = MemCase.of


def newest_per_case(rows: list[MemCase]) -> list[MemCase]:
    """Each case's row of the newest run, in the rows' order: a row stored before the edition prefix (an
    edition-less row is 2025's) is the same case as the newer one."""
    keep = {id(c) for c in newest(rows, lambda c: (c.size_label, c.context, c.dtype, c.mode), lambda c: c.run.datetime)}
    return [c for c in rows if id(c) in keep]


def ordered(rows: list[MemCase]) -> list[MemCase]:
    return sorted(rows, key=lambda c: (size_rank(c.size), c.edition or "2025", c.context, c.dtype, c.mode))


@dataclass(frozen=True)
class Residual:
    """A residual-stream-sized allocation (batch × context × d_model × bytes per element) looked up."""

    dtype: str
    bytes_per_elem: int
    batch: int
    context: int
    d_model: int
    found: bool | None  # None: not looked up
    count: int | None
    made_at: str  # its first frame

    nbytes = property(lambda self: self.batch * self.context * self.d_model * self.bytes_per_elem)

    @classmethod
    def of(cls, c: MemCase, n: int) -> Residual:
        """The row's residual stream of `n` bytes per element, and its lookup in the row's snapshot."""
        x = (c.snapshot.get("residual") or {}).get(str(n)) or {}
        return cls(c.dtype, n, c.batch, c.context, c.size_ref.config.d_model, x.get("found"), x.get("count"),
                   (x.get("frames") or ["–"])[0])


def residuals_seen(c: MemCase, n: int | None = None) -> list[Residual]:
    """The row's looked-up residual streams (of `n` bytes per element where given)."""
    return [Residual.of(c, int(k)) for k in c.snapshot.get("residual") or {} if n in (None, int(k))]


def forward_residuals(rows: list[MemCase]) -> list[Residual]:
    return [r for c in rows if c.status is Status.MEASURED and c.mode == "forward" for r in residuals_seen(c)]


# ---- the 2025 edition's (a)-(e) -----------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One phase of a recorded timeline (bytes allocated): at its start, its highest, at its end."""

    start: float
    top: float
    end: float


def phase_levels(t: dict) -> dict[str, Phase]:
    x, y, marks = t["x"], t["y"], t.get("markers", [])
    spans = ((m["name"], [v for xi, v in zip(x, y) if m["x"] <= xi < n["x"]]) for m, n in zip(marks, marks[1:]))
    return {name: Phase(ys[0], max(ys), ys[-1]) for name, ys in spans if ys}


@dataclass(frozen=True)
class SizedAs:
    """A model tensor of an allocation's size: its dtype and which tensor (a key of the template's `TENSOR`)."""

    dtype: str
    tensor: str


@dataclass(frozen=True)
class NamedAllocation:
    """(e): "largest" (a row's largest allocation size), "ffn_copy" (autocast's bf16 FFN weight) or "optimizer"
    (its parameter-sized temporaries)."""

    kind: str
    nbytes: int
    count: int
    made_at: str
    label: tuple[SizedAs, ...] = ()  # the model's tensors of that size (none: unnamed)
    dtype: str = "fp32"
    mode: str = "forward"
    sites: tuple[tuple[str, int], ...] = ()  # (first frame, allocations) of each call site with a stack trace
    secondary: bool = False  # below the row's largest (ffn_copy, optimizer)

    @property
    def untraced(self) -> int:
        """Allocations of this size without a Python stack trace (made outside Python, e.g. by the autograd engine)."""
        return self.count - sum(n for _, n in self.sites) if self.sites else 0


def shape_labels(m: ModelConfig, batch: int, context: int, dtype: str) -> dict[int, tuple[SizedAs, ...]]:
    """Bytes → the model's tensors of that size, fp32 (and bf16 under autocast), all named."""
    out: dict[int, list[SizedAs]] = {}
    for nbytes, kind in ((4, "fp32"), (2, "bf16")) if dtype == "bf16" else ((4, "fp32"),):
        for n, what in ((m.d_model * m.d_ff, "ffn_weight"), (m.vocab_size * m.d_model, "embedding"),
                        (m.d_model * m.d_model, "projection"), (batch * m.num_heads * context * context, "scores"),
                        (batch * context * m.d_ff, "ffn_hidden"), (batch * context * m.vocab_size, "logits"),
                        (batch * context * m.d_model, "residual")):
            out.setdefault(n * nbytes, []).append(SizedAs(kind, what))
    return {n: tuple(labels) for n, labels in out.items()}


def largest_of(c: MemCase) -> NamedAllocation | None:
    """The row's largest allocation size: every allocation of that size, and the call sites with a stack trace."""
    if not c.largest:
        return None
    n = max(x["size"] for x in c.largest)
    same = [x for x in c.largest if x["size"] == n]
    sites = tuple((x["frames"][0], x["count"]) for x in same if x["frames"])
    return NamedAllocation("largest", n, sum(x["count"] for x in same), sites[0][0] if sites else "",
                           c.labels.get(n, ()), c.dtype, c.mode, sites)


def largest_allocations(ok: list[MemCase], at: int | None) -> tuple[list[NamedAllocation], list[tuple[MemCase, list]]]:
    """(e)'s findings at context `at`, and its rows' largest-allocation tables there but the bf16 step's: (row, its
    (bytes, count, tensors of that size, frames) with a stack trace)."""
    tables, named = [], []
    for c in ordered(ok):
        big, cell, m = c.traced[:6], (c.dtype, c.mode), c.size_ref.config
        if c.context != at or cell not in NAMED or not big:
            continue
        tables.append((c, [(x["size"], x["count"], c.labels.get(x["size"], ()), x["frames"]) for x in big]))
        top = largest_of(c)
        hits = {("bf16", "forward"): ("ffn_copy", [x for x in big if x["size"] == m.d_model * m.d_ff * 2]),
                ("fp32", "train_step"): ("optimizer", [x for x in big if any("optim" in f for f in x["frames"])])}
        kind, hit = hits.get(cell, ("largest", []))
        if hit and hit[0]["size"] == top.nbytes:  # the largest is it
            named.append(replace(top, kind=kind))
        else:
            named += [top] + [NamedAllocation(kind, x["size"], x["count"], x["frames"][0], dtype=c.dtype, mode=c.mode,
                                              secondary=True) for x in hit[:1]]
    return sorted(named, key=lambda x: (NAMED[(x.dtype, x.mode)], x.secondary)), tables


def is_reference(c: MemCase, reference: int | None = REFERENCE_CONTEXT) -> bool:
    """Whether the row is at the handout's reference hyperparameters: its mark (details.reference_context, runs
    since 2fbd353), else its config. The rows stored before the mark ran the same grid (2.7B, batch 4, contexts
    128, 256 and 512), so an unmarked row at batch 4 and the reference context is the reference row."""
    mark = c.details.get("reference_context")
    return mark if isinstance(mark, bool) else (c.batch, c.context) == (REFERENCE_BATCH, reference)


@dataclass(frozen=True)
class Gap:
    """What (d) ("d": the residual-stream lookup) or (e) ("e": the largest allocations) reads at the reference
    context and the stored rows lack. `row`: the fp32 forward there, where one is stored; `lacks`: "row" (none
    stored), "measurement" (stored, not measured: its status says why), "residual" or "largest" (its snapshot has
    no such record)."""

    part: str
    lacks: str
    row: MemCase | None = None


def gaps(rows: list[MemCase], at: int, residual_found: bool) -> tuple[Gap, ...]:
    """(d) and (e)'s gaps at context `at`: (e) reads the fp32 forward's allocation trace; (d) any row's residual
    lookup (`residual_found`), and where none has one, the fp32 forward is the row that should."""
    c = next((c for c in rows if (c.context, c.dtype, c.mode) == (at, "fp32", "forward")), None)
    why = "row" if c is None else "measurement" if c.status is not Status.MEASURED else None
    needs = (("d", residual_found, "residual"), ("e", why is None and bool(c.largest), "largest"))
    return tuple(Gap(part, why or what, c) for part, have, what in needs if not have)


@dataclass(frozen=True)
class Memory2025Facts:
    size: str
    model: ModelConfig  # its dimensions
    contexts: list[int]  # the measured fp32 training steps', ascending
    peaks: dict[tuple[int, str, str], int]  # (context, dtype, mode) -> peak allocated
    forward: Phase | None  # fp32 forward-only timeline at the longest context
    step: dict[str, Phase]  # the fp32 training step's phases at the longest context
    optimizer_spikes: list[float]  # per training-step timeline: the optimizer phase's rise
    step_forward_tops: dict[int, float]  # per context: the fp32 training step's forward-phase top
    reference_context: int | None  # the handout's reference context for (d), (e) (the grid's, or the rows' mark)
    answer_context: int | None  # where (d), (e) are answered: the reference (without one: the shortest measured)
    residuals: list[Residual]  # fp32, one per context (forward rows first), ascending
    named: list[NamedAllocation]  # (e) at answer_context
    largest: list[tuple[MemCase, list]]  # (e)'s tables at answer_context
    largest_rows: list[tuple[int, NamedAllocation]] = field(default_factory=list)  # (context, every row's largest)
    batch: int | None = None
    gaps: tuple[Gap, ...] = ()  # what (d), (e) lack at the reference context

    # fp32 at answer_context: the lookup, and (d)'s closed form batch × context × d_model × 4 B
    residual = property(lambda self: next((r for r in self.residuals if r.context == self.answer_context), None))
    residual_bytes = property(lambda self: self.batch * self.answer_context * self.model.d_model * 4)
    at_reference = property(lambda self: self.reference_context is not None)
    bf16 = property(lambda self: all(self.series("bf16", "train_step")) and all(self.series("bf16", "forward")))

    @property
    def timelines(self) -> bool:
        return self.forward is not None and {"forward", "backward", "optimizer"} <= set(self.step)

    def gap(self, part: str) -> Gap | None:
        return next((g for g in self.gaps if g.part == part), None)

    def series(self, dtype: str, mode: str) -> list[int | None]:
        """Peaks at each of `contexts` (None where not measured)."""
        return [self.peaks.get((c, dtype, mode)) for c in self.contexts]

    def measured(self, dtype: str, mode: str) -> list[int]:
        return [p for p in self.series(dtype, mode) if p]

    @property
    def bf16_vs_fp32(self) -> float:
        """The largest difference of bf16's training-step peak from fp32's at one context."""
        return max(abs(a - b) for a, b in zip(self.series("bf16", "train_step"), self.series("fp32", "train_step")))


def memory_2025_facts(rows: list[MemCase], reference: int | None = REFERENCE_CONTEXT) -> Memory2025Facts | None:
    """The facts of one size's rows (None without a measured row); (d) and (e) at `reference` (or the context
    the rows mark), never at another context: what the rows lack there is a gap the page names. Without a
    reference (an earlier grid's rows) at the shortest measured context."""
    ok = ordered([c for c in rows if c.status is Status.MEASURED])
    if not ok:
        return None
    tl = {(c.context, c.dtype, c.mode): phase_levels(c.timeline) for c in ok if c.timeline}
    contexts = sorted(c.context for c in ok if (c.dtype, c.mode) == ("fp32", "train_step"))
    last, m = contexts[-1] if contexts else None, ok[0].size_ref.config
    ref = min((c.context for c in ok if is_reference(c, reference)), default=reference)  # the mark wins
    at = ref if ref is not None else min({c.context for c in ok if c.mode == "forward"} or {c.context for c in ok})
    # the fp32 residual per context: the fp32 forward's lookup, else any row's (the last one written wins)
    res = {c.context: replace(r, dtype="fp32")
           for c in sorted(ok, key=lambda c: (c.mode == "forward", c.dtype == "fp32")) for r in residuals_seen(c, 4)}
    tops = sorted(((c.context, t) for c in ok if (c.dtype, c.mode) != ("bf16", "train_step") and (t := largest_of(c))),
                  key=lambda x: (x[0], x[1].mode != "forward", x[1].dtype != "fp32"))
    return Memory2025Facts(
        ok[0].size_label, m, contexts,
        {(c.context, c.dtype, c.mode): c.peak_bytes for c in ok}, tl.get((last, "fp32", "forward"), {}).get("forward"),
        tl.get((last, "fp32", "train_step"), {}),
        [v["optimizer"].top - v["optimizer"].start for k, v in tl.items() if k[2] == "train_step" and "optimizer" in v],
        {k[0]: v["forward"].top for k, v in tl.items() if k[1:] == ("fp32", "train_step") and "forward" in v},
        ref, at, [res[x] for x in sorted(res)], *largest_allocations(ok, at), tops, ok[0].batch,
        gaps(rows, at, at in res) if ref is not None else ())


# ---- the 2026 edition's (a)-(f) -----------------------------------------------------------------

@dataclass(frozen=True)
class BlockProbe:
    """(f): one TransformerBlock's tensors saved for backward (by op) and its gradients, from the backward's
    per-block memory change: gradients = saved bytes freed + the change."""

    context: int
    dtype: str
    closed_form_bytes: int | None
    top: list[dict]  # the ops saving most, as stored: op, module, nbytes, share
    block: int  # this and the fields below: details["block_memory"]'s keys
    saved_bytes: int
    top_share: float
    backward_change_bytes: list[int]  # per probed block, allocated after − before its backward
    grad_bytes_measured: int
    grad_bytes_expected: int  # 4 B × the block's parameters
    block_params: int

    # what a block's backward leaves: its change plus the saved tensors it freed
    grad_from_change = property(lambda self: self.backward_change_bytes[0] + self.saved_bytes)
    grad_over_expected = property(lambda self: self.grad_bytes_measured / self.grad_bytes_expected)


def _probe(c: MemCase) -> BlockProbe | None:
    m = c.details.get("block_memory")
    return None if not m else BlockProbe(c.context, c.dtype, c.details.get("block_saved_bytes_closed_form_fp32"),
                                         m["top"], **{x.name: m[x.name] for x in fields(BlockProbe)[4:]})


@dataclass(frozen=True)
class Memory2026Facts:
    rows: list[MemCase]  # the 2026 edition's
    figures: tuple[tuple[str, str], ...] = ()  # (mode, link) of the timeline figures

    size = property(lambda self: self.rows[0].size_label)
    batch = property(lambda self: int(self.rows[0].batch))
    params = property(lambda self: self.rows[0].size_ref.config.params)
    date = property(lambda self: newest_date(self.rows))  # the newest of its rows' runs
    cases = property(lambda self: sorted((c for c in self.rows if c.mode in ("forward", "train_step")),
                                         key=lambda c: (c.context, c.dtype != "fp32", c.mode)))
    contexts = property(lambda self: sorted({c.context for c in self.cases}))
    # the fp32 forwards' residual streams, by context: the 2026 rows derive its size (details) and look it up
    residuals = property(lambda self: sorted(
        (Residual.of(c, int(der["bytes_per_elem"])) for c in self.rows if (c.mode, c.dtype) == ("forward", "fp32")
         and (der := c.details.get("residual_derivation"))), key=lambda r: r.context))
    probes = property(lambda self: sorted(filter(None, (_probe(c) for c in self.rows if c.mode == "block_probe")),
                                          key=lambda p: (p.context, p.dtype)))

    def case(self, context: int, dtype: str, mode: str) -> MemCase | None:
        return next((c for c in self.cases if (c.context, c.dtype, c.mode) == (context, dtype, mode)), None)

    def probe(self, dtype: str = "fp32") -> BlockProbe | None:
        """The probe at the longest context of `dtype` (where the attention's scores dominate)."""
        return max((p for p in self.probes if p.dtype == dtype), key=lambda p: p.context, default=None)

    @property
    def forward_largest(self) -> list[tuple[MemCase, dict]]:
        """Each forward's three largest allocations with a stack trace."""
        return [(c, a) for c in self.cases if c.mode == "forward" for a in c.traced[:3]]

    @property
    def largest(self) -> tuple[MemCase, dict] | None:
        """The fp32 forward at the longest context with an allocation trace, and its largest allocation."""
        c = next((c for c in sorted(self.cases, key=lambda c: -c.context)
                  if c.dtype == "fp32" and c.mode == "forward" and c.largest), None)
        return c and (c, max(c.traced or c.largest, key=lambda a: a["size"]))


def memory_2026_facts(rows: list[MemCase]) -> Memory2026Facts | None:
    rows = [c for c in rows if str(c.edition) == "2026"]
    return Memory2026Facts(rows) if rows else None


# ---- the 2026 questions without 2026 measurements: an earlier grid's rows at those contexts --------

@dataclass(frozen=True)
class PeakRow:
    """One (size, context) of the peak table: a cell per (dtype, mode) of CELLS, None where not run; an earlier
    grid's rows add the fp32 closed form's saved activations against the fp32 training state (why a step OOMs)."""

    size: str
    context: int
    cells: list[MemCase | None]
    saved_bytes: int | None = None  # activations saved for backward
    state_bytes: int | None = None  # fp32 parameters, gradients and AdamW's two moments


@dataclass(frozen=True)
class EarlierGrid:
    """Rows of another grid at the 2026 contexts, shown under their own label, never as the answer."""

    own: bool  # the rows are the 2026 edition's own (measured nothing yet) rather than another grid's
    size: str
    batch: int
    contexts: list[int]
    peaks: list[PeakRow]  # with the fp32 closed form's saved activations and training state
    residual_rows: list[Residual]  # every forward row's
    facts: Memory2025Facts | None  # its largest allocations


def peak_rows(rows: list[MemCase]) -> list[PeakRow]:
    """One per (size, context), in the rows' order."""
    return [PeakRow(size, x, [next((c for c in g if (c.dtype, c.mode) == k), None) for k in CELLS])
            for (size, x), g in group(rows, lambda c: (c.size_label, c.context)).items()]


def _earlier_grid(rows: list[MemCase], own: bool) -> EarlierGrid:
    """`rows`: one size's, ordered (by context)."""
    m, batch = rows[0].size_ref.config, int(rows[0].batch)
    peaks = [replace(p, saved_bytes=m.num_layers * a["a_block"] + a["a_outside"],
                     state_bytes=acc.training_state_bytes(m.params)) for p in peak_rows(rows)
             for a in [acc.checkpoint_terms(batch, p.context, m.d_model, m.d_ff, m.num_heads, m.vocab_size)]]
    return EarlierGrid(own, rows[0].size_label, rows[0].batch, [p.context for p in peaks], peaks,
                       forward_residuals(rows), memory_2025_facts(rows, None))


# ---- (f) under Nsight Systems (--cuda-memory-usage=true, caching allocator off) ---------------------------------

@dataclass(frozen=True)
class NsysMemCase:
    """One memory_profiling case under nsys: the `layers`-block stack's forward and backward, every device
    allocation and free nsys saw (one cudaMalloc per tensor), per NVTX range."""

    context: int
    dtype: str
    batch: int
    blocks: tuple[RangeMemory, ...]  # "block 0", "block 1", ... of the forward
    forward: RangeMemory
    backward: RangeMemory
    figure: str
    files: tuple[str, ...]
    torch_saved: int | None = None  # torch.profiler's block probe: bytes block 1 saved for backward, same case

    per_block = property(lambda self: self.blocks[1] if len(self.blocks) > 1 else self.blocks[0])
    # nsys's bytes left by a block against torch.profiler's saved bytes, within 1%
    agrees = property(lambda self: self.torch_saved is not None
                      and abs(self.per_block.net / self.torch_saved - 1) <= 0.01)


@dataclass(frozen=True)
class NsysMemory:
    filed: Filed
    size: str
    cases: tuple[NsysMemCase, ...]

    # the GUI reports its cases name, in the cases' order
    reps = property(lambda self: [r for c in self.cases for r in self.filed.reps if str(r) in c.files])
    sources = property(lambda self: [f"{self.filed.rel}/manifest.json"] + [x for c in self.cases for x in c.files])


def _draw_memory(ctx: Context, trace: MemoryTrace, blocks: list[str], png: str, title: str) -> str:
    """Bytes live (counted from the first recorded event) over the step, the forward's blocks and backward shaded."""
    start, end = trace.range("step 0") if any(n == "step 0" for n, _, _ in trace.ranges) else trace.range("measured")
    pts = [(t, v) for t, v in trace.live() if start <= t <= end]
    fig, ax = figures.new(figsize=(9, 3.6))
    ax.step([(t - start) / 1e6 for t, _ in pts], [v / 2**30 for _, v in pts], where="post", color="C0", lw=1)
    for k, name in enumerate([*blocks, "backward"]):
        a, b = trace.range(name)
        ax.axvspan((a - start) / 1e6, (b - start) / 1e6, color=f"C{k + 1}", alpha=0.15, label=name)
    ax.set(xlabel=figures.words("memory_nsys").x, ylabel=figures.words("memory_nsys").y)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ctx.figure(fig, png)


def nsys_memory(ctx: Context, probes: list[BlockProbe]) -> NsysMemory | None:
    filed = newest_with(ctx.reports_dir, "memory_profiling")
    if filed is None:
        return None
    out, size = [], "–"
    for c in filed.cases("memory_profiling"):
        extract = filed.memory(c.name)
        if c.status != "profiled" or extract is None:
            continue
        a = c.workload.get("args", {})
        context, size = int(a["context"]), SizeRef(str(a["edition"]), str(a["size"])).label
        trace = read_memory_extract(extract)
        blocks = [n for n in dict.fromkeys(n for n, _, _ in trace.ranges) if re.fullmatch(r"block \d+", n)]
        link = _draw_memory(ctx, trace, blocks, f"{SLUG}-nsys-{c.name}.png", figures.words("memory_nsys").title.format(
            size=size, blocks=len(blocks), context=a["context"], batch=a["batch"], dtype=a["dtype"],
            device=filed.device, when=filed.when))
        probe = next((p for p in probes if (p.context, p.dtype) == (context, a["dtype"])), None)
        out.append(NsysMemCase(context, a["dtype"], int(a["batch"]), tuple(trace.in_range(n) for n in blocks),
                               trace.in_range("forward"), trace.in_range("backward"), link,
                               (filed.rel_of(extract), *(str(r) for r in filter(None, [filed.rep(c.name)]))),
                               probe.saved_bytes if probe else None))
    return NsysMemory(filed, size, tuple(sorted(out, key=lambda x: x.context))) if out else None


@dataclass(frozen=True)
class Snapshot:
    """A raw allocator snapshot a row kept (for pytorch.org/memory_viz)."""

    name: str
    context: int
    dtype: str
    mode: str
    link: str | None  # its path under reports/ where the file is stored there, else None
    reference: bool = False  # at the context (d) and (e) are answered at


def snapshots(rows: list[MemCase], reports_dir, at: int | None) -> list[Snapshot]:
    """The rows' kept snapshots, those at context `at` first (fp32 and forwards first within a context)."""
    out = [Snapshot(n, c.context, c.dtype, c.mode, f"artifacts/{n}" if (reports_dir / "artifacts" / n).is_file()
                    else None, c.context == at) for c in rows for n in [c.snapshot.get("artifact")] if n]
    return sorted(out, key=lambda x: (not x.reference, x.context, x.dtype != "fp32", x.mode != "forward"))


@dataclass(frozen=True)
class MemoryPage(SourcedFromRuns):
    facts_2025: Memory2025Facts | None
    facts_2026: Memory2026Facts | None  # None unless a 2026 row was measured
    earlier: EarlierGrid | None  # without facts_2026: rows at the 2026 contexts (None: none stored)
    no_2026_sizes: list[str]  # without 2026 rows: the earlier grid's sizes, named in the answer
    peaks: list[PeakRow]
    timelines: list[tuple[str, str, str]]  # (mode, dtype, link) of the 2025 rows' figures
    residual_rows: list[Residual]  # the 2025 forward rows'
    artifacts: list[Snapshot]  # the 2025 rows' raw snapshots, at (d)/(e)'s context first
    runs: RunsFacts | None  # its device answers; None: no GPU rows answer
    date_2025: str = "–"
    asked: str = ASKED
    nsys: NsysMemory | None = None

    @property
    def sources(self) -> list[str]:
        return sorted(set(super().sources) | set(self.nsys.sources if self.nsys else ()))

    @property
    def scores(self) -> dict[str, Scored]:
        if self.facts_2025 is None:
            return {PROBLEM: NOT_MEASURED}
        # a problem of both editions: the index reads the newer one's rows
        return {PROBLEM: Scored(Kind.MEASURED, device_short(self.runs.device),
                                self.facts_2026.date if self.facts_2026 else self.date_2025)}


def _draw(ctx: Context, stem: str, cases: list[MemCase], panel: str, from_zero: bool = True, **words) -> str | None:
    """A figure of the cases' timelines, a panel each (TIMELINE's `panel` label), titled by `words` (size, mode,
    device, date, and dtype for one dtype's); its link, None without a timeline."""
    panels = [(TIMELINE.label(panel, dtype=c.dtype, context=c.context), c.timeline) for c in cases if c.timeline]
    if not panels:
        return None
    path, link = ctx.figure_file(f"{SLUG}-{stem}.png")
    words["mode"] = words["mode"].replace("_", " ")
    title = TIMELINE.label("title_dtype", **words) if "dtype" in words else TIMELINE.title.format(**words)
    figures.memory_timelines(panels, path, title, from_zero=from_zero)
    return link


def facts(ctx: Context) -> MemoryPage:
    missing = MemoryPage(None, None, None, [], [], [], [], [], None)
    if not (found := ctx.rows.first_gpu(PROBLEM)):
        return missing
    device, cases = found[0], newest_per_case([mem_case(b) for b in found[1]])
    rows = ordered(cases)
    d26 = [c for c in rows if c.edition == "2026"]
    # 2025 rows at the 2026 contexts are another grid's (the 2025 table's xl): kept apart from (a)–(e)
    earlier = [c for c in rows if c.edition != "2026" and (c.size, c.context) in CASES_2026]
    d = [c for c in rows if c.edition != "2026" and (c.size, c.context) not in CASES_2026]
    if (f := memory_2025_facts(d)) is None:
        return missing
    m26 = memory_2026_facts(d26)
    if m26 is None or not any(c.measured for c in m26.cases):  # the earlier grid's rows stand in
        m26, grid = None, d26 or earlier
    else:
        drawn = [(mode, link) for mode in ("forward", "train_step")
                 if (link := _draw(ctx, f"{device}-2026-{mode}", [c for c in m26.cases if c.mode == mode],
                                   "panel_dtype", False, size=m26.size, mode=mode, device=device, date=m26.date))]
        m26, grid = replace(m26, figures=tuple(drawn)), []
    timelines = [(mode, dtype, link) for mode in ("forward", "train_step") for dtype in ("fp32", "bf16")
                 for g in [[c for c in d if (c.mode, c.dtype) == (mode, dtype) and c.timeline]]
                 if (link := _draw(ctx, f"{device}-{mode}-{dtype}", g, "panel", size=f.size, mode=mode,
                                   device=device, date=newest_date(g), dtype=dtype))]
    return MemoryPage(f, m26, _earlier_grid(grid, bool(d26)) if grid else None,
                      sorted({c.size_label for c in earlier}) if not (m26 or d26) else [], peak_rows(rows),
                      timelines, forward_residuals(d), snapshots(d, ctx.reports_dir, f.answer_context),
                      RunsFacts.of(device, [c.b for c in cases]), newest_date(d),
                      nsys=nsys_memory(ctx, m26.probes if m26 else []))
