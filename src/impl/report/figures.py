"""Figure helpers: one place that sets the backend and writes reproducible PNGs."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def new(figsize=(7, 4.2)):
    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # no software/date metadata, so a rebuild from the same data writes the same bytes
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
