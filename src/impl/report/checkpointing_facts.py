"""gradient_checkpointing (b) of the 2026 edition as facts: single-level checkpointing of xl (2026) at
batch 4 × 2048 (study `single_level_2026`), the k the closed form picks, and the measured peaks of it
and of its neighbours (no checkpointing stands for the next smaller block count's limit: it keeps every
block); templates/gradient_checkpointing.md.j2 holds the words."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Status
from impl.report.rows import Bench, size_label

STUDY_2026 = "single_level_2026"


@dataclass(frozen=True)
class KCase:
    """One policy's row: every_k at k, or none (k None)."""

    k: int | None
    status: Status
    peak_bytes: int | None  # measured peak allocated (None unless measured)
    predicted_peak_bytes: int | None  # the fp32 closed form's step peak (parameters, gradients, activations)
    predicted_activation_bytes: int | None
    mean_s: float | None
    block_forwards: float | None  # measured block forwards per step

    @property
    def measured(self) -> bool:
        return self.status is Status.MEASURED and self.peak_bytes is not None

    @property
    def label(self) -> str:
        return "no checkpointing" if self.k is None else f"k = {self.k}"


@dataclass(frozen=True)
class SingleLevelFacts:
    size: str  # its label
    batch: int
    context: int
    layers: int
    best_k: int  # the closed form's argmin
    rule: str
    block_bytes: int  # B: one block's saved activations (fp32 closed form)
    resid_bytes: int  # R: one residual stream
    cases: list[KCase]  # none first, then by k

    def case(self, k: int | None) -> KCase | None:
        return next((c for c in self.cases if c.k == k), None)

    @property
    def best(self) -> KCase | None:
        return self.case(self.best_k)

    @property
    def measured_lowest(self) -> KCase | None:
        ok = [c for c in self.cases if c.measured]
        return min(ok, key=lambda c: c.peak_bytes) if ok else None

    @property
    def confirmed(self) -> bool:
        """The closed form's k has the lowest measured peak."""
        return self.best is not None and self.measured_lowest is self.best

    @property
    def neighbours(self) -> tuple[KCase | None, KCase | None]:
        """(the next smaller block size measured, else no checkpointing; the next larger k measured)."""
        ks = sorted(c.k for c in self.cases if c.k is not None)
        smaller = [k for k in ks if k < self.best_k]
        larger = [k for k in ks if k > self.best_k]
        return (self.case(smaller[-1]) if smaller else self.case(None), self.case(larger[0]) if larger else None)


def _case(b: Bench) -> KCase:
    pred = ((b.details.get("predicted") or {}).get("closed_form_fp32") or {})
    return KCase(b.cfg.k if b.cfg.policy != "none" else None, b.status,
                 b.row.memory.peak_allocated if b.measured else None, pred.get("peak"), pred.get("activations"),
                 b.stats.mean if b.measured else None, b.details.get("measured_block_forwards"))


def single_level_facts(rows: list[Bench]) -> SingleLevelFacts | None:
    rows = [b for b in rows if b.cfg.study == STUDY_2026]
    if not rows:
        return None
    b0 = rows[0]
    terms = (b0.details.get("terms") or {}).get("closed_form_fp32") or {}
    cases = sorted((_case(b) for b in rows), key=lambda c: -1 if c.k is None else c.k)
    ref = b0.cfg.size_ref
    return SingleLevelFacts(size_label(ref, b0.cfg.size), int(b0.cfg.batch), int(b0.cfg.context),
                            ref.config.num_layers if ref else int(b0.cfg.num_layers), int(b0.details["best_k"]),
                            b0.details.get("best_k_rule", ""), terms.get("a_block"), terms.get("a_resid"), cases)
