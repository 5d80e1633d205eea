"""Report sections: benchmarking_script (b), (c) and benchmarking_mixed_precision (c)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.report import figures
from impl.report.markdown import gib, ms, num, pct, table
from impl.bench.sweeps import MODES
from impl.model import size_rank



def _rows(df: pd.DataFrame, study: str) -> pd.DataFrame:
    d = df[df.problem == "benchmarking_script"]
    if d.empty:
        return d
    return d[d["info"].map(lambda i: i.get("study")) == study]


def _cell(r) -> str:
    return "OOM" if r.oom else ms(r["mean"], r["stddev"])


def _sizes(d):
    return sorted(d["cfg.size"].unique(), key=size_rank)


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
                    "–" if train is None or train.oom else num(train["m.tokens_per_s"], 0),
                    "–" if train is None or train.oom else pct(train.get("m.mfu")),
                    "–" if train is None else ("OOM" if train.oom else gib(train["peak_alloc"]))])
        header = ["size", "context"] + [f"{m} (ms)" for m in modes] + ["train tokens/s", "train MFU", "train peak GiB"]
        out.append(f"**{dtype}** (mean ± std over the timed steps; MFU = model matmul FLOPs ÷ time ÷ measured "
                   f"matmul peak)\n\n" + table(header, rows))
    return "\n\n".join(out)


def warmup_table(d: pd.DataFrame) -> str:
    rows = []
    for (size, ctx, dtype, mode), g in d.groupby(["cfg.size", "cfg.context", "cfg.dtype", "cfg.mode"], sort=False):
        for _, r in g.sort_values("cfg.warmup").iterrows():
            first = "–" if r.oom or not r["data"] else ms(r["data"][0])
            rows.append([size, int(ctx), dtype, mode, int(r["cfg.warmup"]), _cell(r), first,
                         "–" if r.oom else ms(r["max"])])
    left_out = d["info"].iloc[0].get("left_out", "")
    return (table(["size", "context", "dtype", "mode", "warm-up steps", "mean ± std (ms)", "first timed step (ms)",
                   "slowest timed step (ms)"], rows) + (f"\n\nNot run in this study: {left_out}." if left_out else ""))


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
                speed = "–" if f is None or b is None or f.oom or b.oom else f"{f['mean'] / b['mean']:.2f}×"
                row += cells + [speed]
            rows.append(row)
    return table(["size", "context", "forward fp32 (ms)", "forward bf16 (ms)", "speed-up",
                  "train step fp32 (ms)", "train step bf16 (ms)", "speed-up"], rows)


def plot(d: pd.DataFrame, path: Path) -> None:
    fig, ax = figures.new()
    for dtype, style in (("fp32", "-o"), ("bf16", "--s")):
        for size in _sizes(d):
            sel = d[(d["cfg.size"] == size) & (d["cfg.dtype"] == dtype) & (d["cfg.mode"] == "train_step") & ~d.oom]
            if sel.empty:
                continue
            sel = sel.sort_values("cfg.context")
            ax.plot(sel["cfg.context"], sel["mean"] * 1e3, style, label=f"{size} {dtype}")
    ax.set(xscale="log", yscale="log", xlabel="context length", ylabel="train step (ms)",
           title="benchmarking_script: full training step (OOM points absent)")
    ax.set_xticks(sorted(d["cfg.context"].unique()), labels=[str(c) for c in sorted(d["cfg.context"].unique())])
    ax.legend(fontsize=7, ncol=2)
    figures.save(fig, path)


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    main, warm = _rows(df, "main"), _rows(df, "warmup")
    if main.empty and warm.empty:
        return None
    parts = ["## benchmarking_script"]
    if not main.empty:
        info = main["info"].iloc[0]
        parts.append(f"(b) batch {int(main['cfg.batch'].iloc[0])}, {info['warmup']} warm-up then {info['rounds']} "
                     f"timed steps, each synchronised. Backward is timed on its own (its forward runs untimed in "
                     f"setup). Matmul peak used for MFU: {num(info.get('peak_flops', float('nan')) / 1e12, 2)} TFLOP/s "
                     f"({info.get('peak_dtype')}, {info.get('peak_n')}³, measured in the same run).")
        parts.append(timing_tables(main))
        name = f"{device}-benchmarking_script.png"
        plot(main, fig_dir / name)
        parts.append(f"![train step vs context]({fig_rel}/{name})")
    if not warm.empty:
        parts.append("### (c) warm-up steps\n\nEach row builds a fresh model and empties the allocator cache "
                     "first, in the same process as the rest of the suite (kernels already loaded by earlier rows "
                     "stay loaded, so warm-up 0 shows the first-step costs that remain: allocation, autotuning "
                     "heuristics, lazy initialisation).")
        parts.append(warmup_table(warm))
    if not main.empty:
        mp = mixed_precision_table(main)
        if mp:
            parts.append("## benchmarking_mixed_precision (c)\n\nfp32 vs bf16 autocast (fp32 master weights), "
                         "same runs as the tables above.\n\n" + mp)
    return "\n\n".join(parts)
