"""Report section: training_step (beyond the assignment), from perf/test_training_step.py — the
ablation of the full training step: what each config runs (read from the rows), a table of step
time, tokens/s, MFU, peak memory and compile time, and tokens/s as bars."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from impl.report import figures
from impl.report.markdown import gib, missing, ms, num, pct, table
from impl.sweeps import ALL_SIZES

PROBLEM = "training_step"
CONFIG_ORDER = ["fp32", "bf16", "+flash", "+compile", "+fused_adamw", "+fused_ce", "fast", "anchor"]
SIZE_ORDER = list(ALL_SIZES)


def _order(d: pd.DataFrame) -> pd.DataFrame:
    rank = {c: i for i, c in enumerate(CONFIG_ORDER)}
    return d.assign(_s=d["cfg.size"].map(SIZE_ORDER.index), _c=d["cfg.config"].map(lambda c: rank.get(c, 99))
                    ).sort_values(["_s", "cfg.context", "_c"])


def _not_run(r) -> bool:
    return bool(r["info"].get("not_run"))


def _ok(r) -> bool:
    return not (r.oom or _not_run(r) or missing(r["mean"]))


def _status(r) -> str:
    return "not run" if _not_run(r) else ("OOM" if r.oom else "")


def legend(d: pd.DataFrame) -> str:
    rows = []
    for name, g in _order(d).groupby("cfg.config", sort=False):
        c = g.iloc[0]
        backend = c.get("cfg.compile_backend")
        compile_ = c["cfg.compile"] + ("" if missing(backend) or c["cfg.compile"] == "none" else f" ({backend})")
        rows.append([name, c["cfg.dtype"], c["cfg.attn_impl"], compile_, c["cfg.optimizer"],
                     "fused, chunked" if c["cfg.fused_ce"] else "logits + cross_entropy"])
    return table(["config", "dtype", "attention", "torch.compile", "optimizer", "LM head + loss"], rows)


def ablation_table(d: pd.DataFrame) -> str:
    rows = []
    for (size, ctx), g in _order(d).groupby(["cfg.size", "cfg.context"], sort=False):
        base = g[(g["cfg.config"] == "bf16")]
        base_mean = base.iloc[0]["mean"] if not base.empty and _ok(base.iloc[0]) else None
        for _, r in g.iterrows():
            ok = _ok(r)
            speedup = f"{base_mean / r['mean']:.2f}×" if ok and base_mean else "–"
            rows.append([r["cfg.config"], size, int(ctx), ms(r["mean"], r["stddev"]) if ok else "–",
                         num(r.get("m.tokens_per_s"), 0) if ok else "–", pct(r.get("m.mfu")) if ok else "–",
                         speedup, gib(r["peak_alloc"]) if ok else "–",
                         num(r["info"].get("first_step_s"), 2) if ok else "–",
                         num(r["info"].get("compile_s"), 2) if ok else "–", _status(r)])
    return table(["config", "size", "context", "step (ms)", "tokens/s", "MFU", "vs bf16", "peak GiB",
                  "first step (s)", "compile (s)", "OOM / not run"], rows)


def plot(d: pd.DataFrame, path: Path) -> bool:
    d = _order(d)
    groups = [(k, g) for k, g in d.groupby(["cfg.size", "cfg.context"], sort=False)]
    configs = [c for c in CONFIG_ORDER if c in set(d["cfg.config"])]
    if not configs or not any(_ok(r) for _, r in d.iterrows()):
        return False
    fig, ax = figures.new(figsize=(8, 4.2))
    width = 0.8 / len(configs)
    x = np.arange(len(groups))
    for i, cfg in enumerate(configs):
        heights = []
        for _, g in groups:
            sel = g[g["cfg.config"] == cfg]
            r = sel.iloc[0] if not sel.empty else None
            heights.append(r["m.tokens_per_s"] if r is not None and _ok(r) else 0.0)
        ax.bar(x + (i - (len(configs) - 1) / 2) * width, heights, width, label=cfg)
    ax.set_xticks(x, labels=[f"{s} ctx {int(c)}" for (s, c), _ in groups])
    ax.set(ylabel="tokens/s (training step)", title="training_step: ablation (missing bar = OOM / not run)")
    ax.legend(fontsize=7, ncol=4)
    figures.save(fig, path)
    return True


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    d = df[df.problem == PROBLEM]
    if d.empty:
        return None
    i, c = d["info"].iloc[0], d.iloc[0]
    parts = ["## training_step",
             f"The full training step (forward, backward, AdamW) at batch {int(c['cfg.batch'])}: fp32, bf16 "
             "autocast (fp32 master weights and optimizer state), each speed-up alone on top of bf16, all of them "
             "(fast), and PyTorch's own pieces (anchor). A fresh model per row; its first step (compilation, "
             "Triton autotuning, optimizer state) is timed apart, then "
             f"{i.get('warmup')} warm-up and {i.get('rounds')} timed steps. compile = first step − mean step, for "
             "compiled configs. MFU = model matmul FLOPs (3 × forward, full attention square) ÷ time ÷ measured "
             f"matmul peak ({num(i.get('peak_flops', float('nan')) / 1e12, 2)} TFLOP/s, {i.get('peak_dtype')}). "
             "Peak memory is CUDA's max allocated (none on the CPU).",
             legend(d), ablation_table(d)]
    name = f"{device}-training_step.png"
    if plot(d, fig_dir / name):
        parts.append(f"![training step tokens/s by config]({fig_rel}/{name})")
    left = d[d["info"].map(lambda x: x.get("not_run") == "left_out")]
    if not left.empty:
        parts.append(f"Not run: {len(left)} row(s) ({left['info'].iloc[0].get('not_run_reason')}).")
    if i.get("env", {}).get("device_type") == "cpu":
        parts.append("CPU smoke data (the stand-ins for FlashAttention and the compile backend are in the legend): "
                     "these rows check the plumbing; their timings say nothing about the speed-ups on a GPU.")
    return "\n\n".join(parts)
