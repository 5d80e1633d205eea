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


def memory_timeline(data: dict, path: Path, title: str) -> None:
    """PNG of a timeline_data dict (from the JSON), phases shaded between their markers."""
    fig, ax = new(figsize=(7.5, 3.6))
    ax.plot(data["x"], [y / 2**30 for y in data["y"]], lw=1.0, color="C0")
    markers = data.get("markers", [])
    end = data["x"][-1] if data["x"] else 0
    for k, m in enumerate(markers):
        ax.axvline(m["x"], color="0.4", lw=0.6, ls="--")
        if m["name"] == "end":
            continue
        stop = markers[k + 1]["x"] if k + 1 < len(markers) else end
        ax.axvspan(m["x"], stop, color=f"C{k + 1}", alpha=0.12, label=m["name"])
    ax.set(xlabel="allocator event index", ylabel="active memory (GiB)", title=title)
    if markers:
        ax.legend(fontsize=7, loc="upper left")
    save(fig, path)
