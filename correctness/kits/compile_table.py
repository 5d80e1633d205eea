"""The table the sm_90a compile-figure tests print (test_flash_gluon, test_flash_gluon_bwd): one row per
compiled kernel, and for a configuration the launcher refused, its leading columns and why."""
from __future__ import annotations

from typing import Sequence


def print_compile_table(rows: Sequence[dict], columns: Sequence[tuple[str, str, str]], refused: str,
                        lead: int = 3) -> None:
    """`columns`: (header, the header's alignment and width, the cell's format over a row's keys), e.g.
    ("regs", ">4", "{regs:>4}"). A row with a "refused" key prints its first `lead` cells, then `refused`
    formatted over the row."""
    print("\n" + " ".join(format(h, spec) for h, spec, _ in columns))
    for r in rows:
        cells = [cell.format(**r) for _, _, cell in (columns[:lead] if "refused" in r else columns)]
        print(" ".join(cells + ([refused.format(**r)] if "refused" in r else [])))
