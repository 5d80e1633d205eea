"""Figure helpers: one place that sets the backend and writes reproducible PNGs, and the words drawn into
the figures (templates/figures.toml, read once: `words(figure)`)."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


@dataclass(frozen=True)
class Words:
    """One figure's words: title, axis labels and other str.format strings (`w.label("tick", size=s)`)."""

    title: str = ""
    x: str = ""
    y: str = ""
    labels: dict[str, str] = field(default_factory=dict)

    def label(self, name: str, **values) -> str:
        return self.labels[name].format(**values)


@cache
def _words() -> dict[str, Words]:
    doc = tomllib.loads((Path(__file__).resolve().parent / "templates" / "figures.toml").read_text())
    return {name: Words(t.pop("title", ""), t.pop("x", ""), t.pop("y", ""), t) for name, t in doc.items()}


def words(figure: str) -> Words:
    """The words of one figure (a table of templates/figures.toml, the file read once)."""
    return _words()[figure]


def new(figsize=(7, 4.2)):
    fig, ax = plt.subplots(figsize=figsize)
    return fig, ax


def save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # no software/date metadata, so a rebuild from the same data writes the same bytes
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _timeline_panel(ax, data: dict, title: str, from_zero: bool = True) -> None:
    ax.plot(data["x"], [y / 2**30 for y in data["y"]], lw=1.0, color="C0")
    markers = data.get("markers", [])
    end = data["x"][-1] if data["x"] else 0
    for k, m in enumerate(markers):
        ax.axvline(m["x"], color="0.4", lw=0.6, ls="--")
        if m["name"] == "end":
            continue
        stop = markers[k + 1]["x"] if k + 1 < len(markers) else end
        ax.axvspan(m["x"], stop, color=f"C{k + 1}", alpha=0.12, label=m["name"])
    blocks = data.get("blocks") or []
    if blocks:  # each TransformerBlock's start (forward and backward), so its rise and fall can be read
        ax.vlines([b["x"] for b in blocks], 0, 1, transform=ax.get_xaxis_transform(), colors="0.55", lw=0.4,
                  alpha=0.6, label=words("memory_timeline").label("blocks"))
    if from_zero:  # a forward that moves 0.1 GiB on top of 13 GiB of weights is flat, not a cliff
        ax.set_ylim(0, max(data["y"], default=0) / 2**30 * 1.08 or 1)
    else:  # zoomed on the data's range: each block's rise and fall is readable
        lo, hi = min(data["y"], default=0) / 2**30, max(data["y"], default=0) / 2**30
        pad = (hi - lo) * 0.06 or 0.1
        ax.set_ylim(lo - pad, hi + pad)
    ax.set(xlabel=words("memory_timeline").x, title=title)
    if markers or blocks:
        ax.legend(fontsize=7, loc="lower right")


def memory_timelines(panels: list[tuple[str, dict]], path: Path, title: str, from_zero: bool = True) -> None:
    """PNG of timeline_data dicts (from the JSON) side by side, sharing a y axis from zero; each
    panel's phases shaded between their markers (legend: the phases drawn). `from_zero=False`: each
    panel's own y range (zoomed on the blocks' rise and fall), axes not shared."""
    fig, axes = plt.subplots(1, len(panels), figsize=(3.4 * len(panels) + 0.8, 3.4), sharey=from_zero, squeeze=False)
    for ax, (panel_title, data) in zip(axes[0], panels):
        _timeline_panel(ax, data, panel_title, from_zero)
    axes[0][0].set_ylabel(words("memory_timeline").y)
    fig.suptitle(title, fontsize=10)
    save(fig, path)
