"""Small formatting helpers: markdown tables without extra dependencies, units, OOM cells."""
from __future__ import annotations

import math


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(map(str, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join("" if c is None else str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def missing(x) -> bool:
    """No number: None or NaN (a cell shows "–"; the report's one test of a number's absence)."""
    return x is None or (isinstance(x, float) and math.isnan(x))


def ms(seconds, std=None, digits=None) -> str:
    if missing(seconds):
        return "–"
    v = seconds * 1e3
    d = digits if digits is not None else (2 if v < 10 else 1 if v < 1000 else 0)
    s = f"{v:.{d}f}"
    if not missing(std):
        s += f" ± {std * 1e3:.{d}f}"
    return s


def gib(nbytes, digits: int = 2) -> str:
    """GiB; with fewer than 2 digits (large sizes) thousands are grouped."""
    return "–" if missing(nbytes) else f"{nbytes / 2**30:,.{digits}f}" if digits < 2 else f"{nbytes / 2**30:.{digits}f}"


def gb(nbytes, digits: int = 1) -> str:
    """Decimal GB (1e9 bytes), as device capacities are quoted."""
    return "–" if missing(nbytes) else f"{nbytes / 1e9:,.{digits}f}"


def mib(nbytes) -> str:
    return "–" if missing(nbytes) else f"{nbytes / 2**20:,.1f}"


def mb0(nbytes) -> str:
    """Whole MiB, grouped: a buffer size."""
    return "–" if missing(nbytes) else f"{nbytes / 2**20:,.0f}"


def pct(x, digits=1) -> str:
    return "–" if missing(x) else f"{100 * x:.{digits}f}%"


def num(x, digits=1) -> str:
    return "–" if missing(x) else f"{x:,.{digits}f}"

