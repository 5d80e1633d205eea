"""Tables and figures of benchmarking_script (b), (c) and benchmarking_mixed_precision (c), read by
the pages in impl.report.pages.profiling; `step_s`, `stat_name` and `speedup_cell` serve the other
sections' timings too."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.bench.row import Status
from impl.bench.sweeps import MODES
from impl.model import size_rank
from impl.report import figures
from impl.report.markdown import gib, missing, ms, num, pct, table

MEASURED = Status.MEASURED.value


def study(r) -> str | None:
    """A row's study: a config key (the bench layer's rows), a details key in the older format."""
    s = r.get("cfg.study")
    return r["details"].get("study") if missing(s) else s


def _rows(df: pd.DataFrame, name: str) -> pd.DataFrame:
    d = df[df.problem == "benchmarking_script"]
    if d.empty:
        return d
    return d[d.apply(study, axis=1) == name]


def step_s(r) -> float:
    """A row's time per call: the median (the bench layer's metrics divide by it); older-format runs
    computed their tokens/s and MFU from the mean, so their tables keep showing the mean."""
    return r["mean"] if r["legacy"] else r["median"]


def stat_name(d: pd.DataFrame) -> str:
    """What step_s shows for the rows of `d`, for tables' captions."""
    ran = d[d["status"] == MEASURED]  # an OOM row of an older run times nothing
    kinds = set((ran if not ran.empty else d)["legacy"])
    return "mean" if kinds == {True} else "median" if kinds == {False} else "median (mean in older-format runs)"


def _ok(r) -> bool:
    return r is not None and r["status"] == MEASURED


def within_noise(a, b) -> bool:
    """Whether two measured rows' times are within each other's spread (medians ± std overlap)."""
    sa, sb = (0.0 if missing(r["stddev"]) else r["stddev"] for r in (a, b))
    return abs(step_s(a) - step_s(b)) <= sa + sb


def speedup_cell(slow, fast) -> str:
    """slow ÷ fast as "1.57×", or "within noise" where their spreads overlap; "–" unless both ran."""
    if not (_ok(slow) and _ok(fast)):
        return "–"
    return "within noise" if within_noise(slow, fast) else f"{step_s(slow) / step_s(fast):.2f}×"


def _cell(r) -> str:
    if _ok(r):
        return ms(step_s(r), r["stddev"])
    return "OOM" if r["status"] == Status.OOM.value else r["status"].replace("_", " ")


def timing_text(d: pd.DataFrame) -> tuple[str, str]:
    """(warm-up calls, timed rounds) of the measured rows, as text ("5", or "5–10" where rows differ:
    the harness gives short rows more rounds); the bench layer's rows carry their timing, the older
    format kept the grid's warmup and rounds in its details."""
    warm, rounds = set(), set()
    for _, r in d[d["status"] == MEASURED].iterrows():
        t = r["row"].timing
        warm.add(t.warmup_rounds if t else r["details"].get("warmup"))
        rounds.add(t.rounds if t else r["details"].get("rounds"))

    def text(xs):
        xs = sorted(x for x in xs if x is not None)
        return "–" if not xs else (str(xs[0]) if xs[0] == xs[-1] else f"{xs[0]}–{xs[-1]}")
    return text(warm), text(rounds)


def _sizes(d):
    return sorted(d["cfg.size"].unique(), key=size_rank)


def by_size(d: pd.DataFrame) -> pd.DataFrame:
    """The rows sorted by model size, smallest first (stable within a size)."""
    return d.iloc[d["cfg.size"].map(size_rank).argsort(kind="stable")]


def timing_tables(d: pd.DataFrame) -> str:
    out = []
    for dtype in sorted(d["cfg.dtype"].unique(), key=["fp32", "bf16", "fp16"].index):
        dd = d[d["cfg.dtype"] == dtype]
        modes = [m for m in MODES if m in set(dd["cfg.mode"])]
        rows = []
        for size in _sizes(dd):
            for ctx in sorted(dd[dd["cfg.size"] == size]["cfg.context"].unique()):
                sel = dd[(dd["cfg.size"] == size) & (dd["cfg.context"] == ctx)].set_index("cfg.mode")
                train = sel.loc["train_step"] if "train_step" in sel.index else None
                rows.append([size, int(ctx)] + [_cell(sel.loc[m]) if m in sel.index else "–" for m in modes] + [
                    num(train["m.tokens_per_s"], 0) if _ok(train) else "–",
                    pct(train.get("m.mfu_measured_peak")) if _ok(train) else "–",
                    "–" if train is None else (gib(train["peak_alloc"]) if _ok(train) else _cell(train))])
        header = ["size", "context"] + [f"{m} (ms)" for m in modes] + ["train tokens/s", "train MFU", "train peak GiB"]
        out.append(f"**{dtype}** ({stat_name(dd)} ± std over the timed steps; MFU = model matmul FLOPs ÷ that time ÷ "
                   f"measured matmul peak)\n\n" + table(header, rows))
    return "\n\n".join(out)


def warmup_table(d: pd.DataFrame) -> str:
    rows = []
    for (size, ctx, dtype, mode), g in d.groupby(["cfg.size", "cfg.context", "cfg.dtype", "cfg.mode"], sort=False):
        for _, r in g.sort_values("cfg.warmup").iterrows():
            first = ms(r["data"][0]) if _ok(r) and r["data"] else "–"
            rows.append([size, int(ctx), dtype, mode, int(r["cfg.warmup"]), _cell(r), first,
                         ms(r["max"]) if _ok(r) else "–"])
    left_out = d["details"].iloc[0].get("left_out", "")
    return (table(["size", "context", "dtype", "mode", "warm-up steps", f"{stat_name(d)} ± std (ms)",
                   "first timed step (ms)", "slowest timed step (ms)"], rows) + (f"\n\nNot run in this study: {left_out}." if left_out else ""))


def mixed_precision_table(d: pd.DataFrame) -> str | None:
    if not {"fp32", "bf16"} <= set(d["cfg.dtype"]):
        return None
    rows = []
    for size in _sizes(d):
        for ctx in sorted(d[d["cfg.size"] == size]["cfg.context"].unique()):
            row = [size, int(ctx)]
            for mode in ("forward", "train_step"):
                sel = d[(d["cfg.size"] == size) & (d["cfg.context"] == ctx) & (d["cfg.mode"] == mode)]
                by = {r["cfg.dtype"]: r for _, r in sel.iterrows()}
                f, b = by.get("fp32"), by.get("bf16")
                cells = [_cell(x) if x is not None else "–" for x in (f, b)]
                row += cells + [speedup_cell(f, b)]
            rows.append(row)
    return table(["size", "context", "forward fp32 (ms)", "forward bf16 (ms)", "speed-up",
                  "train step fp32 (ms)", "train step bf16 (ms)", "speed-up"], rows)


def plot(d: pd.DataFrame, path: Path) -> None:
    fig, ax = figures.new(figsize=(8, 4.2))
    for dtype, style in (("fp32", "-o"), ("bf16", "--s")):
        for k, size in enumerate(_sizes(d)):  # one colour per size, the dtype by line style
            sel = d[(d["cfg.size"] == size) & (d["cfg.dtype"] == dtype) & (d["cfg.mode"] == "train_step")
                    & (d["status"] == MEASURED)]
            if sel.empty:
                continue
            sel = sel.sort_values("cfg.context")
            ax.plot(sel["cfg.context"], sel.apply(step_s, axis=1) * 1e3, style, color=f"C{k}", label=f"{size} {dtype}")
    ctxs = sorted(int(c) for c in d["cfg.context"].unique())
    ax.set(xscale="log", yscale="log", xlabel="context length", ylabel=f"train step, {stat_name(d)} (ms)",
           title="benchmarking_script: full training step (OOM points absent)")
    ax.minorticks_off()  # under a decade of contexts, log minor labels would overprint the contexts
    ax.set_xticks(ctxs, labels=[str(c) for c in ctxs])
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figures.save(fig, path)
