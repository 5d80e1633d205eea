"""flash_attention and flash_shapes as facts: the code's tile defaults and backward choice, the
backward-variants probe (two-pass against atomic), and flash_shapes' counts and ratios of ours to the
faster SDPA anchor. templates/flash_attention.md.j2 and flash_shapes.md.j2 hold the words."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from impl.attention import backward_choice, flash_torch
from impl.report.rows import Bench, of_newest_run


@dataclass(frozen=True)
class FlashAttentionFacts:
    block_q: int  # flash_forward_torch's default tiles
    block_k: int
    atomic_min_work: float | None  # score elements from which the atomic backward is picked; None: never
    tests: list[str]  # correctness/test_attention.py's tests of both implementations


def _tests(root: Path, *patterns: str) -> list[str]:
    """Names of the tests in root's correctness/test_attention.py containing each pattern, in turn."""
    path = root / "correctness" / "test_attention.py"
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("def test_")]
    return [ln.split("(")[0][4:] for p in patterns for ln in lines if p in ln]


def flash_attention_facts(root: Path) -> FlashAttentionFacts:
    """The facts of the code, with the tests of the repository at `root` (the one whose report is built)."""
    sig = inspect.signature(flash_torch.flash_forward_torch).parameters
    threshold = backward_choice.ATOMIC_MIN_WORK
    return FlashAttentionFacts(sig["block_q"].default, sig["block_k"].default,
                               None if threshold == float("inf") else threshold,
                               _tests(root, "flash", "backward_variants"))


@dataclass(frozen=True)
class ProbeShape:
    """One probe shape's times (ms): each backward alone and with its forward."""

    shape: str  # b×h×s×d [causal]
    label: str
    bwd_two_pass: float
    bwd_atomic: float
    e2e_two_pass: float
    e2e_atomic: float

    @property
    def atomic_over_two_pass(self) -> float:
        return self.e2e_atomic / self.e2e_two_pass


@dataclass(frozen=True)
class BackwardProbe:
    device: str
    shapes: list[ProbeShape]

    @property
    def slower_e2e(self) -> int:
        """Shapes where the atomic backward's forward+backward was slower than the two-pass one's."""
        return sum(s.e2e_atomic > s.e2e_two_pass for s in self.shapes)

    @property
    def slower_bwd(self) -> int:
        return sum(s.bwd_atomic > s.bwd_two_pass for s in self.shapes)


def backward_probe(doc: dict) -> BackwardProbe:
    """The backward-variants probe file's shapes that timed both variants both ways."""
    shapes = []
    for r in doc["rows"]:
        ms, s = r["ms"], r["shape"]
        times = [ms.get(k) for k in ("ours bwd two_pass", "ours bwd atomic", "ours fwd+bwd two_pass",
                                     "ours fwd+bwd atomic")]
        if None in times:
            continue
        shapes.append(ProbeShape(f"{s['batch']}×{s['heads']}×{s['seq']}×{s['d']}" + (" causal" if s["causal"] else ""),
                                 s.get("label") or "", *times))
    return BackwardProbe(doc["device"], shapes)


@dataclass(frozen=True)
class FlashShapesFacts:
    measured: int  # rows measured (every implementation)
    budget: int  # rows left out by the file's time budget
    budget_reason: str | None
    ratios: list[float]  # ours eager ÷ the faster anchor per measured shape-pass, ascending

    @property
    def median(self) -> float | None:
        return self.ratios[len(self.ratios) // 2] if self.ratios else None


@dataclass(frozen=True)
class HostCall:
    impl: str
    mean_us: float
    stddev_us: float
    rounds: int


@dataclass(frozen=True)
class HostCostFacts:
    """flash_shapes' host-cost rows of one run: host time per fwd+bwd call at a tiny shape, where the
    device work is nothing (HostTimer: one call a round, no synchronisation)."""

    shape: str  # "1×1×128×64 bf16 causal"
    calls: dict[str, HostCall]  # by impl

    def _ratio(self, ours: str, anchor: str) -> float | None:
        a, b = self.calls.get(ours), self.calls.get(anchor)
        return a.mean_us / b.mean_us if a and b else None

    @property
    def anchor(self) -> str | None:
        """The SDPA backend with the lower host cost."""
        sdpa = [c for c in self.calls.values() if c.impl.startswith("sdpa")]
        return min(sdpa, key=lambda c: c.mean_us).impl if sdpa else None

    @property
    def eager_vs_anchor(self) -> float | None:
        return self._ratio("flash_triton", self.anchor) if self.anchor else None

    @property
    def compiled_vs_eager(self) -> float | None:
        return self._ratio("flash_triton_compiled", "flash_triton")


def host_cost_facts(rows: list[Bench]) -> HostCostFacts | None:
    """The newest run's measured host-cost rows (config host=True), or None where no run has them."""
    rows = of_newest_run([b for b in rows if b.cfg.host and b.measured])
    if not rows:
        return None
    c = rows[0].cfg
    shape = f"{c.batch}×{c.heads}×{c.seq}×{c.d} {c.dtype}" + (" causal" if c.causal else "")
    return HostCostFacts(shape, {b.cfg.impl: HostCall(b.cfg.impl, b.stats.mean * 1e6, (b.stats.stddev or 0) * 1e6,
                                                      int(b.stats.rounds or 0)) for b in rows})
