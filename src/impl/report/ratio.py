"""The report's one ratio convention: ours ÷ anchor, "slower" above 1 and "faster" below, or "within
noise" where the two times lie within each other's spread (`spread`: half the IQR around a
median, the standard deviation where a row kept no IQR)."""
from __future__ import annotations

import math
from dataclasses import dataclass


def _ok(x) -> bool:
    return x is not None and not (isinstance(x, float) and math.isnan(x))


@dataclass(frozen=True)
class Ratio:
    ours_s: float
    anchor_s: float
    anchor: str  # the anchor's name as the text gives it ("cuDNN", "torch DDP")
    noise: bool  # the two times are within each other's spread

    @property
    def value(self) -> float:
        return self.ours_s / self.anchor_s

    @property
    def verdict(self) -> str:
        return "within noise" if self.noise else "slower" if self.value > 1 else "faster"

    def __str__(self) -> str:
        return f"{self.value:.2f}× {self.anchor} ({self.verdict})".replace("×  (", "× (")


def ratio(ours_s, anchor_s, anchor: str = "", ours_spread=None, anchor_spread=None) -> Ratio | None:
    """Ours ÷ anchor (seconds each) with the noise verdict; None unless both times exist."""
    if not (_ok(ours_s) and _ok(anchor_s)) or anchor_s == 0:
        return None
    spread = sum(s for s in (ours_spread, anchor_spread) if _ok(s))
    return Ratio(float(ours_s), float(anchor_s), anchor, abs(ours_s - anchor_s) <= spread if spread else False)


def of_benches(ours, anchor, name: str = "") -> Ratio | None:
    """Ours ÷ anchor of two rows' medians (impl.report.rows.Bench, measured), each with its spread."""
    return ratio(ours.stats.median, anchor.stats.median, name, ours.spread, anchor.spread)


def spread(stddev, iqr) -> float | None:
    """A row's spread around its median: half its IQR (one slow round does not move it), else its
    standard deviation (older-format rows kept no IQR)."""
    return iqr / 2 if _ok(iqr) else stddev if _ok(stddev) else None


def ratio_cell(r: Ratio | None) -> str:
    return "–" if r is None else str(r)


def med(xs) -> float | None:
    """The median of ratios as the report states it: the upper middle one of an even count (a ratio
    that was measured, never the mean of two), None for none."""
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None
