"""The files a page writes beside its markdown: figures (reports/figures/<slug>-<stem>.png) and CSV
tables (reports/data-tables/<slug>-<name>.csv), each with the link the page puts in its text."""
from __future__ import annotations

import csv
from pathlib import Path


def figure_path(fig_dir: Path, fig_rel: str, slug: str, stem: str | None = None) -> tuple[Path, str]:
    """(file to write, link from the page) of figure <slug>[-<stem>].png."""
    name = f"{slug}-{stem}.png" if stem else f"{slug}.png"
    return fig_dir / name, f"{fig_rel}/{name}"


def write_table_csv(reports_dir: Path, name: str, header: list[str], rows: list[list]) -> str:
    """Writes a markdown table's cells (code backticks dropped) to reports/data-tables/<name>.csv; returns
    its markdown link from a page under reports/."""
    path = reports_dir / "data-tables" / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows([header, *([str(c).strip("`") for c in r] for r in rows)])
    return f"[data-tables/{path.name}](data-tables/{path.name})"
