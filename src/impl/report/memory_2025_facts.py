"""memory_profiling (a)–(e) of the 2025 edition as facts: one size's fp32 and bf16 forward and
training-step rows at several contexts: the timelines' phase levels, the peaks, the residual stream
found among the allocations, and the largest allocations named by the model's tensor shapes.
templates/memory_profiling.md.j2 holds the words; the 2026 variant is impl.report.memory_facts."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl.bench.row import Status
from impl.model.sizes import size_rank
from impl.report.rows import Bench, size_label

MODES = ("forward", "train_step")


@dataclass(frozen=True)
class Phase:
    """One phase of a recorded timeline (bytes allocated): at its start, its highest, at its end."""

    start: float
    top: float
    end: float


@dataclass(frozen=True)
class ResidualSeen:
    """The fp32 residual stream's size (batch × context × d_model × 4 B) looked up among the allocations."""

    batch: int
    context: int
    d_model: int
    nbytes: int
    found: bool
    count: int
    made_at: str


@dataclass(frozen=True)
class NamedAllocation:
    """One finding of (e), in the order of the rows read: `kind` is "ffn_copy" (autocast's bf16 copy of
    an FFN weight), "optimizer" (the optimizer's parameter-sized temporaries) or "activation" (the fp32
    forward's largest)."""

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
    residual: ResidualSeen | None  # of the first row (shortest context) that looked it up
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


def shape_labels(m, batch: int, context: int, dtype: str) -> dict[int, str]:
    """Allocation sizes in bytes → what tensors of the model have that size, for naming the largest
    allocations: fp32 only in an fp32 row (nothing is half precision there), fp32 and bf16 under
    autocast; two tensors of one size are both named (xl (2025): fp32 logits at context 128 = bf16 FFN
    weight). `m`: the row's ModelConfig (its SizeRef's)."""
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


def phase_levels(t: dict) -> dict[str, Phase]:
    """phase name -> its levels, from a timeline's markers."""
    x, y, marks = t["x"], t["y"], t.get("markers", [])
    out = {}
    for k, m in enumerate(marks[:-1]):
        ys = [v for xi, v in zip(x, y) if m["x"] <= xi < marks[k + 1]["x"]]
        if ys:
            out[m["name"]] = Phase(ys[0], max(ys), ys[-1])
    return out


def ordered(rows: list[Bench]) -> list[Bench]:
    """By size (and its edition), context, dtype and mode (the page's order)."""
    return sorted(rows, key=lambda b: (size_rank(b.cfg.size), b.cfg.edition_or_default, b.cfg.context, b.cfg.dtype,
                                       b.cfg.mode))


def _snapshot(b: Bench) -> dict:
    return b.details.get("snapshot") or {}


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


def residual_seen(b: Bench) -> ResidualSeen | None:
    """The fp32 residual stream of row b looked up among its allocations, None where not recorded."""
    x = (_snapshot(b).get("residual") or {}).get("4")
    if not x:
        return None
    return ResidualSeen(b.cfg.batch, b.cfg.context, b.cfg.size_ref.config.d_model, x["bytes"], x["found"], x["count"],
                        (x["frames"] or ["–"])[0])


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
