"""Which Triton backward FlashAttentionTriton runs, per shape.

Two implementations exist (both tested, SPEC "flash_backward"):

* ``"two_pass"``: a dQ kernel (which also computes D = rowsum(O * dO)) then a dK/dV kernel, no
  atomics; 7 tile products per (query tile, key tile) pair.
* ``"atomic"``: one kernel per key tile computes dK, dV and adds its share of dQ atomically into
  an fp32 buffer (then cast); 5 tile products, plus a small kernel for D and zeroing that buffer.

The choice is the call's options (``FlashOptions.variant``: ``"auto"``, the default, or one variant
forced; a launcher's per-call ``variant=`` overrides it); under ``"auto"`` :func:`choose_backward`
applies the rule with ``FlashOptions.atomic_min_work``. Nothing is kept here: the variant a call ran
is in its LaunchRecord (``options.recorder``), which a benchmark row reports.

Pure Python: importing this module never touches Triton or CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from .flash_options import FlashOptions

BACKWARD_VARIANTS = ("two_pass", "atomic")
BACKWARD_SETTINGS = ("auto",) + BACKWARD_VARIANTS


@dataclass(frozen=True)
class ShapeKey:
    """What the choice depends on: one backward call's problem."""

    batch_heads: int
    n_q: int
    n_k: int
    head_dim: int
    dtype: torch.dtype
    causal: bool

    @property
    def work(self) -> float:
        """Score elements of the call (batch·heads·n_q·n_k), halved when causal."""
        scores = float(self.batch_heads) * self.n_q * self.n_k
        return scores / 2 if self.causal else scores


def choose_backward(key: ShapeKey, min_work: float) -> str:
    """The variant "auto" runs for `key`: "atomic" from `min_work` (FlashOptions.atomic_min_work)
    on, else "two_pass"."""
    return "atomic" if key.work >= min_work else "two_pass"


def _check(kind: str, allowed: Tuple[str, ...], what: str) -> str:
    if kind not in allowed:
        raise ValueError(f"unknown {what} {kind!r}; expected one of {allowed}")
    return kind


def resolve_backward(key: ShapeKey, options: FlashOptions, variant: Optional[str] = None) -> str:
    """The variant a backward call of `key` runs: `variant` when given (a per-call override), else
    options.variant, "auto" resolved by choose_backward with options.atomic_min_work."""
    kind = options.variant if variant is None else _check(variant, BACKWARD_SETTINGS, "flash backward variant")
    if kind == "auto":
        kind = choose_backward(key, options.atomic_min_work)
    return kind


__all__ = [
    "BACKWARD_SETTINGS",
    "BACKWARD_VARIANTS",
    "ShapeKey",
    "choose_backward",
    "resolve_backward",
]
