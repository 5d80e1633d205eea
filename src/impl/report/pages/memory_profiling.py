"""memory_profiling: the 2025 edition's (a)–(e) on one size's rows beside the 2026 edition's (a)–(f) on xl (2026)
at contexts 128 and 2048. The first GPU device answers; templates/memory_profiling.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass, replace

from impl import accounting as acc
from impl.bench.row import Status
from impl.model.sizes import SizeRef, size_rank
from impl.report import figures
from impl.report.output import figure_path
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, size_label, size_ref, view
from impl.report.runs import RunsFacts, device_short, newest_date
from impl.workloads.problems import Problem as P
from impl.workloads.sweeps import grid

PROBLEM = P.MEMORY_PROFILING
SLUG = "memory_profiling"
CASES_2026 = {tuple(c) for c in grid(P.MEMORY_PROFILING, "full").cases_2026}  # (size, context) the 2026 sweep asks
ASKED = size_label(SizeRef("2026", "xl"))
CELLS = (("fp32", "forward"), ("fp32", "train_step"), ("bf16", "forward"), ("bf16", "train_step"))


@dataclass(frozen=True)
class MemConfig:
    """The config keys this page reads (rows.view)."""

    size: str | None = None
    edition: str | None = None
    context: int | None = None
    dtype: str | None = None
    mode: str | None = None  # forward / train_step / block_probe
    batch: int | None = None

    @property
    def ref(self) -> SizeRef | None:
        return size_ref(self.size, self.edition)

    @property
    def label(self) -> str:
        return size_label(self.ref, self.size)


def _cfg(b: Bench) -> MemConfig:
    return view(MemConfig, b)


def _snapshot(b: Bench) -> dict:
    return b.details.get("snapshot") or {}


def ordered(rows: list[Bench]) -> list[Bench]:
    """By size (and its edition), context, dtype and mode."""
    def key(c: MemConfig):
        return size_rank(c.size), c.edition or "2025", c.context, c.dtype, c.mode
    return sorted(rows, key=lambda b: key(_cfg(b)))


@dataclass(frozen=True)
class MemCase:
    context: int
    dtype: str
    mode: str
    status: Status
    peak_bytes: int | None  # peak allocated (measured rows)
    reserved_bytes: int | None
    need_bytes: int | None  # closed form: the parameters (forward) or the fp32 training step's need
    timeline: dict | None  # {"x", "y", "markers", "blocks"}
    largest: list[dict]  # allocations by size, with frames

    @property
    def measured(self) -> bool:
        return self.status is Status.MEASURED and self.peak_bytes is not None


def mem_case(b: Bench) -> MemCase:
    c, cf, snap, ok = _cfg(b), b.details.get("closed_form") or {}, _snapshot(b), b.status is Status.MEASURED
    return MemCase(int(c.context), c.dtype, c.mode, b.status, b.row.memory.peak_allocated if ok else None,
                   b.row.memory.peak_reserved if ok else None,
                   cf.get("param_bytes" if c.mode == "forward" else "train_step_need_bytes"), snap.get("timeline"),
                   list(snap.get("largest") or []))


@dataclass(frozen=True)
class Residual:
    """A residual-stream-sized allocation (batch × context × d_model × bytes per element) looked up."""

    dtype: str
    bytes_per_elem: int
    batch: int
    context: int
    d_model: int
    nbytes: int
    found: bool | None
    count: int | None
    made_at: str | None


def residuals_seen(b: Bench, n: int | None = None) -> list[Residual]:
    """The row's looked-up residual streams (of `n` bytes per element where given)."""
    c = _cfg(b)
    return [Residual(c.dtype, int(k), c.batch, c.context, c.ref.config.d_model, x["bytes"], x["found"], x["count"],
                     (x["frames"] or ["–"])[0]) for k, x in (_snapshot(b).get("residual") or {}).items()
            if n in (None, int(k))]


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
class NamedAllocation:
    """(e): "ffn_copy" (autocast's bf16 FFN weight), "optimizer" (its temporaries) or "activation"."""

    kind: str
    nbytes: int
    count: int
    made_at: str
    label: str = ""  # the tensor of that size (activation)


@dataclass(frozen=True)
class LargestTable:
    dtype: str
    mode: str
    context: int
    rows: list[tuple[int, int, str, list[str]]]  # (bytes, count, tensor of that size, frames)


def shape_labels(m, batch: int, context: int, dtype: str) -> dict[int, str]:
    """Bytes → the model's (ModelConfig `m`) tensors of that size, fp32 (and bf16 under autocast), all named."""
    out: dict[int, list[str]] = {}
    for nbytes, kind in ((4, "fp32"), (2, "bf16")) if dtype == "bf16" else ((4, "fp32"),):
        for n, what in ((m.d_model * m.d_ff, "FFN-weight-sized (d_model × d_ff)"),
                        (m.vocab_size * m.d_model, "embedding / LM-head-sized (vocab × d_model)"),
                        (m.d_model * m.d_model, "attention-projection-sized (d_model²)"),
                        (batch * m.num_heads * context * context, "attention scores (batch × heads × ctx²)"),
                        (batch * context * m.d_ff, "FFN hidden (batch × ctx × d_ff)"),
                        (batch * context * m.vocab_size, "logits (batch × ctx × vocab)"),
                        (batch * context * m.d_model, "residual-stream-sized (batch × ctx × d_model)")):
            out.setdefault(n * nbytes, []).append(f"{kind}, {what}")
    return {n: " or ".join(labels) for n, labels in out.items()}


def largest_allocations(ok: list[Bench]) -> tuple[int | None, list[LargestTable], list[NamedAllocation]]:
    """(the shortest context, its rows' largest-allocation tables but the bf16 step's, (e)'s findings); entries
    without frames repeat ones with frames."""
    if not ok:
        return None, [], []
    c0, tables, named = min(_cfg(b).context for b in ok), [], []
    for b in ordered(ok):
        c = _cfg(b)
        big = [x for x in _snapshot(b).get("largest") or [] if x["frames"]][:6]
        if c.context != c0 or (c.dtype, c.mode) == ("bf16", "train_step") or not big:
            continue
        m = c.ref.config
        labels = shape_labels(m, c.batch, c0, c.dtype)
        tables.append(LargestTable(c.dtype, c.mode, c0, [(x["size"], x["count"], labels.get(x["size"], "–"), x["frames"])
                                                         for x in big]))
        ffn = [x for x in big if x["size"] == m.d_model * m.d_ff * 2]
        opt = [x for x in big if any("optim" in f for f in x["frames"])]
        if (c.dtype, c.mode) == ("bf16", "forward") and ffn:
            named.append(NamedAllocation("ffn_copy", ffn[0]["size"], ffn[0]["count"], ffn[0]["frames"][0]))
        if (c.dtype, c.mode) == ("fp32", "train_step") and opt:
            named.append(NamedAllocation("optimizer", opt[0]["size"], opt[0]["count"], opt[0]["frames"][0]))
        if (c.dtype, c.mode) == ("fp32", "forward"):
            named.append(NamedAllocation("activation", big[0]["size"], big[0]["count"], "",
                                         labels.get(big[0]["size"], "unnamed")))
    return c0, tables, named


@dataclass(frozen=True)
class Memory2025Facts:
    size: str
    param_bytes: int  # fp32 parameters
    d_model: int
    d_ff: int
    layers: int
    contexts: list[int]  # the measured fp32 training steps', ascending
    peaks: dict[tuple[int, str, str], int]  # (context, dtype, mode) -> peak allocated
    forward: Phase | None  # fp32 forward-only timeline at the longest context
    step: dict[str, Phase]  # the fp32 training step's phases at the longest context
    optimizer_spikes: list[float]  # per training-step timeline: the optimizer phase's rise
    step_forward_tops: dict[int, float]  # per context: the fp32 training step's forward-phase top
    residual: Residual | None  # of the first row (shortest context) that looked it up
    largest_context: int | None
    named: list[NamedAllocation]
    largest: list[LargestTable]

    @property
    def timelines(self) -> bool:
        return self.forward is not None and {"forward", "backward", "optimizer"} <= set(self.step)

    def series(self, dtype: str, mode: str) -> list[int | None]:
        """Peaks at each of `contexts` (None where not measured)."""
        return [self.peaks.get((c, dtype, mode)) for c in self.contexts]

    def measured(self, dtype: str, mode: str) -> list[int]:
        return [p for p in self.series(dtype, mode) if p]

    @property
    def bf16(self) -> bool:
        return all(self.series("bf16", "train_step")) and all(self.series("bf16", "forward"))

    @property
    def bf16_vs_fp32(self) -> float:
        """The largest difference of bf16's training-step peak from fp32's at one context."""
        return max(abs(a - b) for a, b in zip(self.series("bf16", "train_step"), self.series("fp32", "train_step")))


def memory_2025_facts(rows: list[Bench]) -> Memory2025Facts | None:
    """The facts of one size's rows (None without a measured row)."""
    ok = ordered([b for b in rows if b.status is Status.MEASURED])
    if not ok:
        return None
    key = {id(b): (c.context, c.dtype, c.mode) for b in ok for c in [_cfg(b)]}
    tl = {key[id(b)]: phase_levels(_snapshot(b)["timeline"]) for b in ok if _snapshot(b).get("timeline")}
    contexts = sorted(k[0] for k in key.values() if k[1:] == ("fp32", "train_step"))
    last, m = contexts[-1] if contexts else None, _cfg(ok[0]).ref.config
    c0, tables, named = largest_allocations(ok)
    return Memory2025Facts(
        _cfg(ok[0]).label, m.params * 4, m.d_model, m.d_ff, m.num_layers, contexts,
        {key[id(b)]: b.row.memory.peak_allocated for b in ok}, tl.get((last, "fp32", "forward"), {}).get("forward"),
        tl.get((last, "fp32", "train_step"), {}),
        [v["optimizer"].top - v["optimizer"].start for k, v in tl.items() if k[2] == "train_step" and "optimizer" in v],
        {k[0]: v["forward"].top for k, v in tl.items() if k[1:] == ("fp32", "train_step") and "forward" in v},
        next((r for b in ok for r in residuals_seen(b, 4)), None), c0, named, tables)


# ---- the 2026 edition's (a)-(f) -----------------------------------------------------------------

@dataclass(frozen=True)
class SavedOp:
    op: str
    module: str
    nbytes: int
    share: float


@dataclass(frozen=True)
class BlockProbe:
    """(f): one TransformerBlock's tensors saved for backward (by op) and its gradients, from the backward's
    per-block memory change: gradients = saved bytes freed + the change."""

    context: int
    dtype: str
    block: int
    saved_bytes: int
    closed_form_bytes: int | None
    top: list[SavedOp]
    top_share: float
    backward_change_bytes: list[int]  # per probed block, allocated after − before its backward
    grad_bytes_measured: int
    grad_bytes_expected: int  # 4 B × the block's parameters
    block_params: int

    @property
    def grad_from_change(self) -> int:
        return self.backward_change_bytes[0] + self.saved_bytes

    @property
    def grad_over_expected(self) -> float:
        return self.grad_bytes_measured / self.grad_bytes_expected


def _probe(b: Bench) -> BlockProbe | None:
    m, c = b.details.get("block_memory"), _cfg(b)
    return None if not m else BlockProbe(
        int(c.context), c.dtype, int(m["block"]), int(m["saved_bytes"]), b.details.get("block_saved_bytes_closed_form_fp32"),
        [SavedOp(t["op"], t["module"], int(t["nbytes"]), float(t["share"])) for t in m["top"]], float(m["top_share"]),
        [int(x) for x in m["backward_change_bytes"]], int(m["grad_bytes_measured"]), int(m["grad_bytes_expected"]),
        int(m["block_params"]))


def _residual(b: Bench) -> Residual | None:
    """The 2026 rows derive the residual stream's size (details) and look it up."""
    der, c = b.details.get("residual_derivation"), _cfg(b)
    if not der:
        return None
    n, batch, d = int(der["bytes_per_elem"]), int(der["batch"]), int(der["d_model"])
    x = (_snapshot(b).get("residual") or {}).get(str(n)) or {}
    return Residual(c.dtype, n, batch, int(c.context), d, batch * int(c.context) * d * n, x.get("found"), x.get("count"),
                    (x.get("frames") or [None])[0])


@dataclass(frozen=True)
class Memory2026Facts:
    size: str
    batch: int
    params: int
    cases: list[MemCase]
    residuals: list[Residual]  # fp32 forward rows, by context
    probes: list[BlockProbe]
    date: str = "–"  # the newest of its rows' runs
    figures: tuple[tuple[str, str], ...] = ()  # (mode, link) of the timeline figures

    @property
    def contexts(self) -> list[int]:
        return sorted({c.context for c in self.cases})

    def case(self, context: int, dtype: str, mode: str) -> MemCase | None:
        return next((c for c in self.cases if (c.context, c.dtype, c.mode) == (context, dtype, mode)), None)

    def probe(self, dtype: str = "fp32") -> BlockProbe | None:
        """The probe at the longest context of `dtype` (where the attention's scores dominate)."""
        return max((p for p in self.probes if p.dtype == dtype), key=lambda p: p.context, default=None)

    @property
    def forward_largest(self) -> list[tuple[MemCase, dict]]:
        """Each forward's three largest allocations with a stack trace."""
        return [(c, a) for c in self.cases if c.mode == "forward" for a in [x for x in c.largest if x.get("frames")][:3]]

    @property
    def largest(self) -> tuple[MemCase, dict] | None:
        """The fp32 forward at the longest context with an allocation trace, and its largest allocation."""
        c = next((c for c in sorted(self.cases, key=lambda c: -c.context)
                  if c.dtype == "fp32" and c.mode == "forward" and c.largest), None)
        return c and (c, max([a for a in c.largest if a.get("frames")] or c.largest, key=lambda a: a["size"]))


def memory_2026_facts(rows: list[Bench]) -> Memory2026Facts | None:
    rows = [b for b in rows if str(_cfg(b).edition) == "2026"]
    if not rows:
        return None
    c0 = _cfg(rows[0])
    by = [(b, _cfg(b)) for b in rows]
    return Memory2026Facts(
        c0.label, int(c0.batch), c0.ref.config.params,
        sorted((mem_case(b) for b, c in by if c.mode in ("forward", "train_step")),
               key=lambda c: (c.context, c.dtype != "fp32", c.mode)),
        sorted(filter(None, (_residual(b) for b, c in by if (c.mode, c.dtype) == ("forward", "fp32"))),
               key=lambda r: r.context),
        sorted(filter(None, (_probe(b) for b, c in by if c.mode == "block_probe")), key=lambda p: (p.context, p.dtype)),
        newest_date(rows))


# ---- the 2026 questions without 2026 measurements: an earlier grid's rows at those contexts --------

@dataclass(frozen=True)
class ContextPeaks:
    """An earlier grid's peaks at one 2026 context, and the fp32 closed form's saved activations against the
    fp32 training state (why a step is an OOM)."""

    context: int
    fwd32: MemCase | None
    fwd16: MemCase | None
    step32: MemCase | None
    step16: MemCase | None
    saved_bytes: int  # activations saved for backward (fp32 closed form)
    state_bytes: int  # fp32 parameters, gradients and AdamW's two moments


@dataclass(frozen=True)
class EarlierGrid:
    """Rows of another grid at the 2026 contexts, shown under their own label, never as the answer."""

    own: bool  # the rows are the 2026 edition's own (measured nothing yet) rather than another grid's
    size: str
    batch: int
    contexts: list[int]
    peaks: list[ContextPeaks]
    residuals: list[Residual]  # fp32 forward rows'
    residual_rows: list[Residual]  # every forward row's, for the table
    facts: Memory2025Facts | None  # its largest allocations


def _earlier_grid(rows: list[Bench], own: bool) -> EarlierGrid:
    c0, m = _cfg(rows[0]), _cfg(rows[0]).ref.config
    cases = {(c.context, c.dtype, c.mode): c for c in map(mem_case, rows)}
    contexts = sorted({int(_cfg(b).context) for b in rows})
    acts = {c: acc.checkpoint_terms(int(c0.batch), c, m.d_model, m.d_ff, m.num_heads, m.vocab_size) for c in contexts}
    fwd = [b for b in rows if b.status is Status.MEASURED and _cfg(b).mode == "forward"]
    return EarlierGrid(own, c0.label, c0.batch, contexts, [
        ContextPeaks(c, *(cases.get((c, d, mode)) for mode in ("forward", "train_step") for d in ("fp32", "bf16")),
                     m.num_layers * acts[c]["a_block"] + acts[c]["a_outside"], acc.training_state_bytes(m.params))
        for c in contexts], [r for b in fwd if _cfg(b).dtype == "fp32" for r in residuals_seen(b, 4)],
        [r for b in fwd for r in residuals_seen(b)],
        memory_2025_facts([b for b in rows if b.status is Status.MEASURED]))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeakRow:
    """One (size, context) of the peak table: a cell per (dtype, mode) of CELLS, None where not run."""

    size: str
    context: int
    cells: list[MemCase | None]


@dataclass(frozen=True)
class MemoryPage:
    device: str | None  # None: no GPU rows answer
    facts_2025: Memory2025Facts | None
    facts_2026: Memory2026Facts | None  # None unless a 2026 row was measured
    earlier: EarlierGrid | None  # without facts_2026: rows at the 2026 contexts (None: none stored)
    no_2026_sizes: list[str]  # without 2026 rows: the earlier grid's sizes, named in the answer
    peaks: list[PeakRow]
    timelines: list[tuple[str, str, str]]  # (mode, dtype, link) of the 2025 rows' figures
    residual_rows: list[Residual]  # the 2025 forward rows'
    artifact: str | None
    runs: RunsFacts | None
    date_2025: str = "–"
    asked: str = ASKED
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        if self.facts_2025 is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        # a problem of both editions: the index reads the newer one's rows
        return {PROBLEM: Scored(Kind.MEASURED, device_short(self.device),
                                self.facts_2026.date if self.facts_2026 else self.date_2025)}

    @property
    def sources(self) -> list[str]:
        return self.runs.files if self.runs else []


def _peak_rows(rows: list[Bench]) -> list[PeakRow]:
    by: dict[tuple, dict] = {}
    for b in rows:
        c = _cfg(b)
        by.setdefault((c.label, c.context), {})[(c.dtype, c.mode)] = b
    return [PeakRow(size, c, [mem_case(cells[k]) if k in cells else None for k in CELLS])
            for (size, c), cells in by.items()]


def _draw(ctx: Context, stem: str, title: str, panels: list[tuple[str, dict]], from_zero: bool = True) -> str | None:
    """A figure of timeline panels; its link, None without panels."""
    if not panels:
        return None
    path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, stem)
    figures.memory_timelines(panels, path, title, from_zero=from_zero)
    return link


def facts(ctx: Context) -> MemoryPage:
    found = ctx.rows.per_gpu(PROBLEM)
    missing = MemoryPage(None, None, None, None, [], [], [], [], None, None)
    if not found:
        return missing
    device, every = found[0]  # the first (one-GPU) device answers
    rows = ordered(every)
    d26 = [b for b in rows if _cfg(b).edition == "2026"]
    # 2025 rows at the 2026 contexts are another grid's (the 2025 table's xl): kept apart from (a)–(e)
    old = [b for b in rows if _cfg(b).edition != "2026"]
    earlier = [b for b in old if (_cfg(b).size, _cfg(b).context) in CASES_2026]
    d = [b for b in old if (_cfg(b).size, _cfg(b).context) not in CASES_2026]
    f = memory_2025_facts(d)
    if f is None:
        return missing
    m26 = memory_2026_facts(d26)
    if m26 is not None and any(c.measured for c in m26.cases):
        m26 = replace(m26, figures=tuple((mode, link) for mode in ("forward", "train_step") for link in [_draw(
            ctx, f"{device}-2026-{mode}", f"{m26.size} {mode.replace('_', ' ')}: active memory ({device}, {m26.date})",
            [(f"{c.dtype}, context {c.context}", c.timeline) for c in m26.cases if c.mode == mode and c.timeline],
            from_zero=False)] if link))
        grid_rows = []
    else:
        m26, grid_rows = None, d26 or earlier
    timelines = []
    for mode, dtype in (("forward", "fp32"), ("forward", "bf16"), ("train_step", "fp32"), ("train_step", "bf16")):
        g = [b for b in d if (_cfg(b).mode, _cfg(b).dtype) == (mode, dtype) and _snapshot(b).get("timeline")]
        link = _draw(ctx, f"{device}-{mode}-{dtype}", f"{f.size} {dtype} {mode.replace('_', ' ')}: active memory "
                     f"({device}, {newest_date(g)})", [(f"context {_cfg(b).context}", _snapshot(b)["timeline"]) for b in g])
        timelines += [(mode, dtype, link)] if link else []
    return MemoryPage(device, f, m26, _earlier_grid(grid_rows, bool(d26)) if grid_rows else None,
                      sorted({_cfg(b).label for b in earlier}) if not (m26 or d26) else [], _peak_rows(rows), timelines,
                      [r for b in d if b.status is Status.MEASURED and _cfg(b).mode == "forward" for r in residuals_seen(b)],
                      next((_snapshot(b)["artifact"] for b in d if _snapshot(b).get("artifact")), None),
                      RunsFacts.of(device, every), newest_date(d))
