"""Which Triton backward FlashAttentionTriton runs, per shape.

Two implementations exist (both tested, SPEC "flash_backward"):

* ``"two_pass"``: a dQ kernel (which also computes D = rowsum(O * dO)) then a dK/dV kernel, no
  atomics; 7 tile products per (query tile, key tile) pair.
* ``"atomic"``: one kernel per key tile computes dK, dV and adds its share of dQ atomically into
  an fp32 buffer (then cast); 5 tile products, plus a small kernel for D and zeroing that buffer.

The choice is the setting (:func:`set_backward_variant`: ``"auto"``, the default, or one variant
forced); under ``"auto"`` :func:`choose_backward` applies the rule below. Every resolution is
recorded per shape (:func:`backward_choices`, :func:`last_backward_choice`) so a benchmark row can
report which variant it timed.

Pure Python: importing this module never touches Triton or CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import torch

BACKWARD_VARIANTS = ("two_pass", "atomic")
BACKWARD_SETTINGS = ("auto",) + BACKWARD_VARIANTS

#: The rule of "auto": the atomic backward from this much work per call on (batch·heads·n_q·n_k
#: scores, halved when causal), the two-pass one below it. Small problems are launch-bound (the
#: atomic path launches 3 kernels against 2, and pays the dQ cast), large ones compute-bound, where
#: 5 products against 7 can win if the fp32 reductions keep up. Not yet measured on a GPU
#: (NOTES.md, Version 4), so infinite: always two-pass. To flip it once
#: tools/probes/flash_bwd_variants.py has measured the crossover, set the threshold it prints.
ATOMIC_MIN_WORK: float = math.inf


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


def choose_backward(key: ShapeKey, min_work: Optional[float] = None) -> str:
    """The variant "auto" runs for `key`: "atomic" from `min_work` (default ATOMIC_MIN_WORK) on,
    else "two_pass"."""
    threshold = ATOMIC_MIN_WORK if min_work is None else min_work
    return "atomic" if key.work >= threshold else "two_pass"


_setting = "auto"
_choices: Dict[ShapeKey, str] = {}
_last: Optional[Tuple[ShapeKey, str]] = None


def _check(kind: str, allowed: Tuple[str, ...], what: str) -> str:
    if kind not in allowed:
        raise ValueError(f"unknown {what} {kind!r}; expected one of {allowed}")
    return kind


def set_backward_variant(kind: str) -> None:
    """Force a variant ("two_pass", "atomic") for every shape, or "auto" (the rule)."""
    global _setting
    _setting = _check(kind, BACKWARD_SETTINGS, "flash backward variant")


def backward_variant() -> str:
    """The current setting: "auto", "two_pass" or "atomic"."""
    return _setting


def resolve_backward(key: ShapeKey, variant: Optional[str] = None) -> str:
    """The variant a backward call of `key` runs: `variant` when given (a per-call override), else
    the setting, "auto" resolved by choose_backward. Recorded for backward_choices()."""
    global _last
    kind = _setting if variant is None else _check(variant, BACKWARD_SETTINGS, "flash backward variant")
    if kind == "auto":
        kind = choose_backward(key)
    _choices[key] = kind
    _last = (key, kind)
    return kind


def record_choice(key: ShapeKey, kind: str) -> None:
    """Record that a backward call of `key` ran `kind` (what resolve_backward records), for a caller
    that resolved it earlier for the same key and settings (the flash launcher's call plans)."""
    global _last
    _choices[key] = kind
    _last = (key, kind)


def settings_key(variant: Optional[str] = None) -> tuple:
    """Everything resolve_backward's answer depends on besides the shape: a per-call override, the
    setting, the threshold. Equal keys and shapes give the same variant."""
    return (variant, _setting, ATOMIC_MIN_WORK)


def backward_choices() -> Dict[ShapeKey, str]:
    """The variant each shape's last backward call ran."""
    return dict(_choices)


def last_backward_choice() -> Optional[Tuple[ShapeKey, str]]:
    """(shape, variant) of the last backward call, None before any."""
    return _last


__all__ = [
    "ATOMIC_MIN_WORK",
    "BACKWARD_SETTINGS",
    "BACKWARD_VARIANTS",
    "ShapeKey",
    "backward_choices",
    "backward_variant",
    "choose_backward",
    "last_backward_choice",
    "record_choice",
    "resolve_backward",
    "set_backward_variant",
    "settings_key",
]
