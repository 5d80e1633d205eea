"""memory_profiling of the 2026 edition as facts: xl (2026) at the contexts the sweep asks (128 and 2048),
fp32 and bf16, forward and training step: peaks (OOM rows with the closed-form need), the residual
stream derived against the allocation found, the largest allocations, and (f) one block's saved
tensors by op and its gradients from the backward's per-block change. templates/memory_profiling.md.j2
holds the words."""
from __future__ import annotations

from dataclasses import dataclass, field

from impl import accounting as acc
from impl.bench.row import Status
from impl.report.rows import Bench, size_label

MiB = 2**20


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


@dataclass(frozen=True)
class Residual:
    context: int
    batch: int
    d_model: int
    bytes_per_elem: int
    found: bool | None  # an allocation of exactly that size in the recorded forward
    count: int | None
    made_at: str | None

    @property
    def derived_bytes(self) -> int:
        return self.batch * self.context * self.d_model * self.bytes_per_elem

    @property
    def mib(self) -> float:
        return self.derived_bytes / MiB


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
    def largest(self) -> tuple[MemCase, dict] | None:
        """The fp32 forward at the longest context with an allocation trace, and its largest allocation."""
        for c in sorted(self.cases, key=lambda c: -c.context):
            if c.dtype == "fp32" and c.mode == "forward" and c.largest:
                with_frames = [a for a in c.largest if a.get("frames")] or c.largest
                return c, max(with_frames, key=lambda a: a["size"])
        return None


def mem_case(b: Bench) -> MemCase:
    d = b.details
    cf = d.get("closed_form") or {}
    snap = d.get("snapshot") or {}
    need = cf.get("param_bytes") if b.cfg.mode == "forward" else cf.get("train_step_need_bytes")
    return MemCase(int(b.cfg.context), b.cfg.dtype, b.cfg.mode, b.status,
                   b.row.memory.peak_allocated if b.status is Status.MEASURED else None,
                   b.row.memory.peak_reserved if b.status is Status.MEASURED else None, need,
                   snap.get("timeline"), list(snap.get("largest") or []))


def _residual(b: Bench) -> Residual | None:
    d = b.details
    der = d.get("residual_derivation")
    if not der:
        return None
    x = ((d.get("snapshot") or {}).get("residual") or {}).get(str(der["bytes_per_elem"])) or {}
    return Residual(int(b.cfg.context), int(der["batch"]), int(der["d_model"]), int(der["bytes_per_elem"]),
                    x.get("found"), x.get("count"), (x.get("frames") or [None])[0])


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
    ref = rows[0].cfg.size_ref
    cases = sorted((mem_case(b) for b in rows if b.cfg.mode in ("forward", "train_step")),
                   key=lambda c: (c.context, c.dtype != "fp32", c.mode))
    residuals = sorted((r for b in rows if b.cfg.mode == "forward" and b.cfg.dtype == "fp32"
                        for r in [_residual(b)] if r), key=lambda r: r.context)
    probes = sorted((p for b in rows if b.cfg.mode == "block_probe" for p in [_probe(b)] if p),
                    key=lambda p: (p.context, p.dtype))
    b0 = rows[0]
    return Memory2026Facts(size_label(ref, b0.cfg.size), int(b0.cfg.batch), ref.config.d_model,
                           ref.config.num_layers, ref.config.params, cases, residuals, probes)


@dataclass(frozen=True)
class ContextPeaks:
    """An earlier grid's rows at one of the 2026 contexts (no 2026 rows yet): the four peaks, and the fp32
    closed form's saved activations against the fp32 training state (why a step is an OOM)."""

    context: int
    fwd32: MemCase | None
    fwd16: MemCase | None
    step32: MemCase | None
    step16: MemCase | None
    saved_bytes: int  # activations saved for backward (fp32 closed form)
    state_bytes: int  # fp32 parameters, gradients and AdamW's two moments


def context_peaks(rows: list[Bench]) -> list[ContextPeaks]:
    """Per context of `rows` (one size), ascending."""
    if not rows:
        return []
    m = rows[0].cfg.size_ref.config
    batch = int(rows[0].cfg.batch)
    state = acc.training_state_bytes(m.params)
    cases = {(c.context, c.dtype, c.mode): c for c in map(mem_case, rows)}
    out = []
    for c in sorted({int(b.cfg.context) for b in rows}):
        acts = acc.checkpoint_terms(batch, c, m.d_model, m.d_ff, m.num_heads, m.vocab_size)
        out.append(ContextPeaks(c, cases.get((c, "fp32", "forward")), cases.get((c, "bf16", "forward")),
                                cases.get((c, "fp32", "train_step")), cases.get((c, "bf16", "train_step")),
                                m.num_layers * acts["a_block"] + acts["a_outside"], state))
    return out
