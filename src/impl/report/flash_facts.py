"""flash_shapes as facts: its counts and ratios of ours to the faster SDPA anchor, and its host-cost
rows. templates/flash_shapes.md.j2 holds the words."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.rows import Bench, of_newest_run


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
