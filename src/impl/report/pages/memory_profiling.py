"""memory_profiling: the 2025 edition's (a)–(e) on one size's rows (fp32 and bf16, forward and training
step, several contexts: timelines' phase levels, peaks, the residual stream found among the allocations,
the largest allocations named by the model's tensor shapes) beside the 2026 edition's (a)–(f) on xl (2026)
at the contexts its sweep asks (128 and 2048: peaks with the closed-form need of an OOM, the residual
stream derived against the allocation found, one block's saved tensors by op and its gradients from the
backward's per-block change). The first GPU device answers. templates/memory_profiling.md.j2 holds
every word."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from impl import accounting as acc
from impl.bench.row import Status
from impl.model.sizes import SizeRef, size_rank
from impl.report import figures
from impl.report.output import figure_path
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, size_label
from impl.report.runs import RunsFacts, device_short
from impl.workloads.problems import Problem as P
from impl.workloads.sweeps import grid

PROBLEMS = (P.MEMORY_PROFILING,)
PROBLEM = P.MEMORY_PROFILING
SLUG = "memory_profiling"
# The 2026 edition's variant: xl at contexts 128 and 2048 (the sweep table's cases_2026).
CASES_2026 = {tuple(c) for c in grid(P.MEMORY_PROFILING, "full").cases_2026}
ASKED = size_label(SizeRef("2026", "xl"))
MiB = 2**20


def _snapshot(b: Bench) -> dict:
    return b.details.get("snapshot") or {}


def ordered(rows: list[Bench]) -> list[Bench]:
    """By size (and its edition), context, dtype and mode (the page's order)."""
    return sorted(rows, key=lambda b: (size_rank(b.cfg.size), b.cfg.edition_or_default, b.cfg.context, b.cfg.dtype,
                                       b.cfg.mode))


def _date(rows: list[Bench]) -> str:
    return max(str(b.run.datetime) for b in rows)[:10] if rows else "–"


# ---- one row's peaks, allocations and residual stream ---------------------------------------------

@dataclass(frozen=True)
class MemCase:
    context: int
    dtype: str
    mode: str  # forward / train_step
    status: Status
    peak_bytes: int | None  # peak allocated (measured rows)
    reserved_bytes: int | None
    need_bytes: int | None  # closed form: the parameters (forward) or the fp32 training step's need
    timeline: dict | None  # {"x", "y", "markers", "blocks"}
    largest: list[dict] = field(default_factory=list)  # allocations by size, with frames

    @property
    def measured(self) -> bool:
        return self.status is Status.MEASURED and self.peak_bytes is not None


def mem_case(b: Bench) -> MemCase:
    cf, snap = b.details.get("closed_form") or {}, _snapshot(b)
    need = cf.get("param_bytes") if b.cfg.mode == "forward" else cf.get("train_step_need_bytes")
    ok = b.status is Status.MEASURED
    return MemCase(int(b.cfg.context), b.cfg.dtype, b.cfg.mode, b.status, b.row.memory.peak_allocated if ok else None,
                   b.row.memory.peak_reserved if ok else None, need, snap.get("timeline"), list(snap.get("largest") or []))


@dataclass(frozen=True)
class Residual:
    """A residual-stream-sized allocation (batch × context × d_model × bytes per element) looked up among
    a forward's allocations."""

    dtype: str
    bytes_per_elem: int
    batch: int
    context: int
    d_model: int
    nbytes: int
    found: bool | None
    count: int | None
    made_at: str | None


def residuals_seen(b: Bench) -> list[Residual]:
    return [Residual(b.cfg.dtype, int(n), b.cfg.batch, b.cfg.context, b.cfg.size_ref.config.d_model, x["bytes"],
                         x["found"], x["count"], (x["frames"] or ["–"])[0])
            for n, x in (_snapshot(b).get("residual") or {}).items()]


def residual_seen(b: Bench) -> Residual | None:
    """The fp32 residual stream of row b, None where not recorded."""
    return next((r for r in residuals_seen(b) if r.bytes_per_elem == 4), None)


# ---- the 2025 edition's (a)-(e) -----------------------------------------------------------------

@dataclass(frozen=True)
class Phase:
    """One phase of a recorded timeline (bytes allocated): at its start, its highest, at its end."""

    start: float
    top: float
    end: float


def phase_levels(t: dict) -> dict[str, Phase]:
    """phase name -> its levels, from a timeline's markers."""
    x, y, marks = t["x"], t["y"], t.get("markers", [])
    out = {}
    for k, m in enumerate(marks[:-1]):
        ys = [v for xi, v in zip(x, y) if m["x"] <= xi < marks[k + 1]["x"]]
        if ys:
            out[m["name"]] = Phase(ys[0], max(ys), ys[-1])
    return out


@dataclass(frozen=True)
class NamedAllocation:
    """One finding of (e): `kind` is "ffn_copy" (autocast's bf16 copy of an FFN weight), "optimizer" (the
    optimizer's parameter-sized temporaries) or "activation" (the fp32 forward's largest)."""

    kind: str
    nbytes: int
    count: int
    made_at: str
    label: str = ""  # the tensor of that size (activation)


@dataclass(frozen=True)
class LargestTable:
    """The largest allocations with a stack trace of one row at the shortest context."""

    dtype: str
    mode: str
    context: int
    rows: list[tuple[int, int, str, list[str]]]  # (bytes, count, tensor of that size, frames)


def shape_labels(m, batch: int, context: int, dtype: str) -> dict[int, str]:
    """Allocation sizes in bytes → the model's tensors of that size, for naming the largest allocations:
    fp32 only in an fp32 row, fp32 and bf16 under autocast; two tensors of one size are both named
    (xl (2025): fp32 logits at context 128 = bf16 FFN weight). `m`: the row's ModelConfig."""
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
    """(the shortest context, the largest-allocations tables of its rows but the bf16 training step, the
    findings of (e)); entries without frames repeat ones with frames (their frames were not kept)."""
    if not ok:
        return None, [], []
    c0 = min(b.cfg.context for b in ok)
    tables, named = [], []
    for b in ordered([b for b in ok if b.cfg.context == c0 and not (b.cfg.dtype == "bf16" and b.cfg.mode == "train_step")]):
        big = [x for x in _snapshot(b).get("largest") or [] if x["frames"]][:6]
        if not big:
            continue
        m = b.cfg.size_ref.config
        labels = shape_labels(m, b.cfg.batch, c0, b.cfg.dtype)
        tables.append(LargestTable(b.cfg.dtype, b.cfg.mode, c0,
                                   [(x["size"], x["count"], labels.get(x["size"], "–"), x["frames"]) for x in big]))
        if b.cfg.mode == "forward" and b.cfg.dtype == "bf16":
            ffn = [x for x in big if x["size"] == m.d_model * m.d_ff * 2]
            if ffn:
                named.append(NamedAllocation("ffn_copy", ffn[0]["size"], ffn[0]["count"], (ffn[0]["frames"] or ["–"])[0]))
        if b.cfg.mode == "train_step" and b.cfg.dtype == "fp32":
            opt = [x for x in big if any("optim" in f for f in x["frames"])]
            if opt:
                named.append(NamedAllocation("optimizer", opt[0]["size"], opt[0]["count"], opt[0]["frames"][0]))
        if b.cfg.mode == "forward" and b.cfg.dtype == "fp32":
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
    named: list[NamedAllocation] = field(default_factory=list)
    largest: list[LargestTable] = field(default_factory=list)

    @property
    def timeline_context(self) -> int:
        return self.contexts[-1]

    @property
    def timelines(self) -> bool:
        return self.forward is not None and {"forward", "backward", "optimizer"} <= set(self.step)

    def series(self, dtype: str, mode: str) -> list[int | None]:
        """Peaks at each context of `contexts` (None where not measured)."""
        return [self.peaks.get((c, dtype, mode)) for c in self.contexts]

    @property
    def train_fp32(self) -> list[int]:
        return [p for p in self.series("fp32", "train_step") if p]

    @property
    def forward_fp32(self) -> list[int]:
        return [p for p in self.series("fp32", "forward") if p]

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
    ref = ok[0].cfg.size_ref
    m = ref.config
    key = lambda b: (b.cfg.context, b.cfg.dtype, b.cfg.mode)  # noqa: E731
    peaks = {key(b): b.row.memory.peak_allocated for b in ok}
    tl = {key(b): phase_levels(_snapshot(b)["timeline"]) for b in ok if _snapshot(b).get("timeline")}
    contexts = sorted(b.cfg.context for b in ok if (b.cfg.dtype, b.cfg.mode) == ("fp32", "train_step"))
    last = contexts[-1] if contexts else None
    spikes = [v["optimizer"].top - v["optimizer"].start for k, v in tl.items() if k[2] == "train_step" and "optimizer" in v]
    tops = {k[0]: v["forward"].top for k, v in tl.items() if k[1:] == ("fp32", "train_step") and "forward" in v}
    c0, tables, named = largest_allocations(ok)
    return Memory2025Facts(size_label(ref), m.params * 4, m.d_model, m.d_ff, m.num_layers, contexts, peaks,
                           tl.get((last, "fp32", "forward"), {}).get("forward"), tl.get((last, "fp32", "train_step"), {}),
                           spikes, tops, next((r for b in ok for r in [residual_seen(b)] if r), None), c0, named, tables)


# ---- the 2026 edition's (a)-(f) -----------------------------------------------------------------

@dataclass(frozen=True)
class SavedOp:
    op: str
    module: str
    nbytes: int
    share: float


@dataclass(frozen=True)
class BlockProbe:
    """(f): one TransformerBlock's tensors saved for backward (by op) and its gradients, from the
    backward's per-block memory change: gradients = saved bytes freed + the change."""

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
        """The gradients a block's backward leaves: its change plus the saved tensors it freed."""
        return self.backward_change_bytes[0] + self.saved_bytes

    @property
    def grad_over_expected(self) -> float:
        return self.grad_bytes_measured / self.grad_bytes_expected


@dataclass(frozen=True)
class Memory2026Facts:
    size: str
    batch: int
    d_model: int
    layers: int
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

    @property
    def ooms(self) -> list[MemCase]:
        return [c for c in self.cases if c.status is Status.OOM]

    def probe(self, dtype: str = "fp32") -> BlockProbe | None:
        """The probe at the longest context of `dtype` (where the attention's scores dominate)."""
        ps = [p for p in self.probes if p.dtype == dtype]
        return max(ps, key=lambda p: p.context) if ps else None

    @property
    def forward_largest(self) -> list[tuple[MemCase, dict]]:
        """Each forward's three largest allocations with a stack trace."""
        return [(c, a) for c in self.cases if c.mode == "forward" for a in [x for x in c.largest if x.get("frames")][:3]]

    @property
    def largest(self) -> tuple[MemCase, dict] | None:
        """The fp32 forward at the longest context with an allocation trace, and its largest allocation."""
        for c in sorted(self.cases, key=lambda c: -c.context):
            if c.dtype == "fp32" and c.mode == "forward" and c.largest:
                with_frames = [a for a in c.largest if a.get("frames")] or c.largest
                return c, max(with_frames, key=lambda a: a["size"])
        return None


def _residual(b: Bench) -> Residual | None:
    """The 2026 rows derive the residual stream's size (details) and look it up."""
    der = b.details.get("residual_derivation")
    if not der:
        return None
    n, batch, d, c = int(der["bytes_per_elem"]), int(der["batch"]), int(der["d_model"]), int(b.cfg.context)
    x = (_snapshot(b).get("residual") or {}).get(str(n)) or {}
    return Residual(b.cfg.dtype, n, batch, c, d, batch * c * d * n, x.get("found"), x.get("count"),
                    (x.get("frames") or [None])[0])


def _probe(b: Bench) -> BlockProbe | None:
    m = b.details.get("block_memory")
    if not m:
        return None
    return BlockProbe(int(b.cfg.context), b.cfg.dtype, int(m["block"]), int(m["saved_bytes"]),
                      b.details.get("block_saved_bytes_closed_form_fp32"),
                      [SavedOp(t["op"], t["module"], int(t["nbytes"]), float(t["share"])) for t in m["top"]],
                      float(m["top_share"]), [int(x) for x in m["backward_change_bytes"]],
                      int(m["grad_bytes_measured"]), int(m["grad_bytes_expected"]), int(m["block_params"]))


def memory_2026_facts(rows: list[Bench]) -> Memory2026Facts | None:
    rows = [b for b in rows if str(b.cfg.edition) == "2026"]
    if not rows:
        return None
    ref, b0 = rows[0].cfg.size_ref, rows[0]
    cases = sorted((mem_case(b) for b in rows if b.cfg.mode in ("forward", "train_step")),
                   key=lambda c: (c.context, c.dtype != "fp32", c.mode))
    residuals = sorted((r for b in rows if b.cfg.mode == "forward" and b.cfg.dtype == "fp32"
                        for r in [_residual(b)] if r), key=lambda r: r.context)
    probes = sorted((p for b in rows if b.cfg.mode == "block_probe" for p in [_probe(b)] if p),
                    key=lambda p: (p.context, p.dtype))
    return Memory2026Facts(size_label(ref, b0.cfg.size), int(b0.cfg.batch), ref.config.d_model,
                           ref.config.num_layers, ref.config.params, cases, residuals, probes, _date(rows))


# ---- the 2026 questions without 2026 measurements: an earlier grid's rows at those contexts --------

@dataclass(frozen=True)
class ContextPeaks:
    """An earlier grid's rows at one of the 2026 contexts: the four peaks, and the fp32 closed form's
    saved activations against the fp32 training state (why a step is an OOM)."""

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
    ok = [b for b in rows if b.status is Status.MEASURED]
    m, batch = rows[0].cfg.size_ref.config, int(rows[0].cfg.batch)
    cases = {(c.context, c.dtype, c.mode): c for c in map(mem_case, rows)}
    peaks = []
    for c in sorted({int(b.cfg.context) for b in rows}):
        acts = acc.checkpoint_terms(batch, c, m.d_model, m.d_ff, m.num_heads, m.vocab_size)
        peaks.append(ContextPeaks(c, *(cases.get((c, d, mode)) for mode in ("forward", "train_step")
                                      for d in ("fp32", "bf16")),
                                  m.num_layers * acts["a_block"] + acts["a_outside"], acc.training_state_bytes(m.params)))
    fwd = [b for b in ok if b.cfg.mode == "forward"]
    return EarlierGrid(own, size_label(rows[0].cfg.size_ref), rows[0].cfg.batch, sorted({b.cfg.context for b in rows}),
                       peaks, [r for b in fwd if b.cfg.dtype == "fp32" for r in [residual_seen(b)] if r],
                       [r for b in fwd for r in residuals_seen(b)], memory_2025_facts(ok))


# ---- the page ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PeakRow:
    """One (size, context) of the peak table: a cell per (dtype, mode) of CELLS, None where not run."""

    size: str
    context: int
    cells: list[MemCase | None]


CELLS = (("fp32", "forward"), ("fp32", "train_step"), ("bf16", "forward"), ("bf16", "train_step"))


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
        by.setdefault((size_label(b.cfg.size_ref, b.cfg.size), b.cfg.context), {})[(b.cfg.dtype, b.cfg.mode)] = b
    return [PeakRow(size, c, [mem_case(cells[k]) if k in cells else None for k in CELLS])
            for (size, c), cells in by.items()]


def _draw_2025(ctx: Context, device: str, size: str, rows: list[Bench]) -> list[tuple[str, str, str]]:
    """The 2025 rows' timeline figures, one per mode and dtype (a panel per context)."""
    out = []
    for mode in ("forward", "train_step"):
        for dtype in ("fp32", "bf16"):
            g = [b for b in rows if (b.cfg.mode, b.cfg.dtype) == (mode, dtype) and _snapshot(b).get("timeline")]
            if g:
                path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, f"{device}-{mode}-{dtype}")
                figures.memory_timelines([(f"context {b.cfg.context}", _snapshot(b)["timeline"]) for b in g], path,
                                         f"{size} {dtype} {mode.replace('_', ' ')}: active memory ({device}, {_date(g)})")
                out.append((mode, dtype, link))
    return out


def _draw_2026(ctx: Context, device: str, m: Memory2026Facts) -> tuple[tuple[str, str], ...]:
    """The 2026 rows' timelines, one figure per mode (a panel per dtype and context, zoomed, block starts marked)."""
    out = []
    for mode in ("forward", "train_step"):
        panels = [(f"{c.dtype}, context {c.context}", c.timeline) for c in m.cases if c.mode == mode and c.timeline]
        if panels:
            path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, f"{device}-2026-{mode}")
            figures.memory_timelines(panels, path, f"{m.size} {mode.replace('_', ' ')}: active memory ({device}, {m.date})",
                                     from_zero=False)
            out.append((mode, link))
    return tuple(out)


def facts(ctx: Context) -> MemoryPage:
    found = ctx.rows.per_gpu(PROBLEM)
    missing = MemoryPage(None, None, None, None, [], [], [], [], None, None)
    if not found:
        return missing
    device, every = found[0]  # the first (one-GPU) device answers
    rows = ordered(every)
    d26 = [b for b in rows if b.cfg.edition == "2026"]
    # 2025 rows at the 2026 contexts are another grid's (the 2025 table's xl): kept apart from (a)–(e)
    at_2026 = [b.cfg.edition != "2026" and (b.cfg.size, b.cfg.context) in CASES_2026 for b in rows]
    earlier = [b for b, x in zip(rows, at_2026) if x]
    d = [b for b, x in zip(rows, at_2026) if not x and b.cfg.edition != "2026"]
    f = memory_2025_facts(d)
    if f is None:
        return missing
    m26 = memory_2026_facts(d26)
    if m26 is not None and any(c.measured for c in m26.cases):
        m26 = replace(m26, figures=_draw_2026(ctx, device, m26))
        grid_rows = []
    else:
        m26, grid_rows = None, d26 or earlier
    ok = [b for b in d if b.status is Status.MEASURED]
    artifact = next((_snapshot(b)["artifact"] for b in d if _snapshot(b).get("artifact")), None)
    return MemoryPage(device, f, m26, _earlier_grid(grid_rows, bool(d26)) if grid_rows else None,
                      sorted({size_label(b.cfg.size_ref, b.cfg.size) for b in earlier}) if not (m26 or d26) else [],
                      _peak_rows(rows), _draw_2025(ctx, device, f.size, d),
                      [r for b in ok if b.cfg.mode == "forward" for r in residuals_seen(b)], artifact,
                      RunsFacts.of(device, every), _date(d))
