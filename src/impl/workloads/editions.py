"""A sweep grid's model sizes: [edition, name] pairs, each a SizeRef (("2026", "xl") is the 2025
table's 2.7B; the smoke profile's `tiny` stands in for any edition's size)."""
from __future__ import annotations

from impl.model.sizes import SMOKE_SIZES, SizeRef

GridSize = SizeRef  # the name the perf files use for a grid's size
SMOKE_STAND_INS = tuple(SMOKE_SIZES)


__all__ = ["GridSize", "SMOKE_STAND_INS"]
