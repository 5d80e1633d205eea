"""per_rank_memory as facts: the one-GPU check of the two-GPU 2026 questions: the closed-form memory of
one rank at world size 2 for DDP, the sharded optimizer and FSDP (parameters, gradients, optimizer state,
activations), whether each fits this GPU, and the measured peak of the replicated (DDP) rank's step run
on one GPU. The words are in templates/fsdp.md.j2."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.rows import Bench, size_label
from impl.workloads.problems import StoredGroup

PARTS = ("parameters", "gradients", "optimizer_state", "activations")


@dataclass(frozen=True)
class RankVariant:
    name: str  # ddp / sharded_optimizer / fsdp
    parts: dict[str, float]  # PARTS -> bytes
    total: float
    fits: bool | None


@dataclass(frozen=True)
class PerRankFacts:
    size: str
    world_size: int
    batch_per_rank: int
    context: int
    gpu_bytes: int | None
    variants: list[RankVariant]
    measured_variant: str  # the variant whose rank ran on one GPU
    measured_peak: int | None
    mean_s: float | None

    def variant(self, name: str) -> RankVariant | None:
        return next((v for v in self.variants if v.name == name), None)

    @property
    def measured_over_closed_form(self) -> float | None:
        v = self.variant(self.measured_variant)
        return None if v is None or not self.measured_peak else self.measured_peak / v.total


def per_rank_facts(rows: list[Bench]) -> PerRankFacts | None:
    rows = [b for b in rows if b.problem == StoredGroup.PER_RANK_MEMORY and b.details.get("closed_form")]
    if not rows:
        return None
    b = next((b for b in rows if b.measured), rows[0])
    d = b.details
    fits = d.get("fits_this_gpu") or {}
    variants = [RankVariant(n, {p: v.get(p, 0.0) for p in PARTS}, v["total"], fits.get(n))
                for n, v in sorted(d["closed_form"].items(), key=lambda kv: (d.get("stages") or {}).get(kv[0], 0))]
    return PerRankFacts(size_label(b.cfg.size_ref, b.cfg.size), int(b.cfg.world_size), int(b.cfg.batch_per_rank),
                        int(b.cfg.context), d.get("gpu_memory_bytes"), variants, b.cfg.variant,
                        b.row.memory.peak_allocated if b.measured else None, b.stats.mean if b.measured else None)
