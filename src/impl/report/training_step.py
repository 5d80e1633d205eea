"""Report section: training_step (beyond the assignment), from perf/test_training_step.py — the
ablation of the full training step: what each config runs (read from the rows, per size where a
config's settings differ between sizes), a table of step time, tokens/s, MFU, peak memory and
compile time, tokens/s as bars, and where the time of the profiled configs' step goes (kernel
time per phase and category, host time per phase where recorded, the gap to the measured step,
the top kernels of `fast` and `fast+cudagraphs`), and ours against the anchor. The folder may hold
several runs (one file per GPU command); each (size, context, config) shows its newest measurement
(latest_rows), with the run it came from where runs mix."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from impl.bench.row import Status
from impl.model import size_rank
from impl.report import figures
from impl.report.benchmarking import ratio_cell, stat_name, step_s, timing_text
from impl.report.markdown import gib, missing, ms, ms_share, num, pct, table
from impl.report.templating import macros
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)
from impl.workloads.problems import Problem as P

W = macros("training_step.md.j2")

PROBLEM = P.TRAINING_STEP
MEASURED, OOM = Status.MEASURED.value, Status.OOM.value
CONFIG_ORDER = ["fp32", "bf16", "+flash", "+compile", "+fused_adamw", "+fused_ce", "+bf16_weights", "fast", "fast+cudagraphs", "anchor"]


def _order(d: pd.DataFrame) -> pd.DataFrame:
    rank = {c: i for i, c in enumerate(CONFIG_ORDER)}
    return d.assign(_s=d.cfg.size.map(size_rank), _c=d.cfg.config.map(lambda c: rank.get(c, 99))
                    ).sort_values(["_s", "cfg.context", "_c"])


OURS = ["fast", "fast+cudagraphs"]  # the all-speed-ups configs set against the anchor


def latest_rows(d: pd.DataFrame) -> pd.DataFrame:
    """One row per (size, context, config): from the newest run that ran it (an OOM is a result and
    counts as run), else the newest run's not-run row: a command cut at its time limit leaves rows
    "not run" that an earlier run measured, and a later command may measure only a few configs."""
    d = d.assign(_ran=d["status"].isin([MEASURED, OOM])).sort_values(["_ran", "datetime"], ascending=False, kind="stable")
    return d.drop_duplicates(["cfg.size", "cfg.context", "cfg.config"]).drop(columns="_ran")


def _run(r) -> str:
    """A row's run, as its JSON's UTC start time (MM-DD HH:MM)."""
    t = str(r["datetime"] or "")
    return f"{t[5:10]} {t[11:16]}" if len(t) >= 16 else "–"


def _runs(d: pd.DataFrame) -> list[str]:
    return sorted({_run(r) for _, r in d.iterrows()})


def runs_table(d: pd.DataFrame) -> str:
    """The runs the rows come from: files, the matmul peak that run measured (its rows' MFU divides
    by it), and how many rows it supplies."""
    rows = []
    for run, g in d.groupby(d.apply(_run, axis=1), sort=True):
        peak = next((p for p in map(_peak, g["row"]) if p), None)
        commits = ", ".join(f"`{c or '–'}`" for c in dict.fromkeys(g["commit"]))
        rows.append([run, commits, ", ".join(f"`{s}`" for s in dict.fromkeys(g["section"])),
                     num(peak / 1e12, 1) if peak else "–", len(g)])
    return table(["run (UTC)", "commit", "files", "matmul peak (TFLOP/s)", "rows shown"], rows)


def _peak(row) -> float | None:
    """The matmul peak measured in the row's run (its MFU's denominator)."""
    return row.peaks.measured_flops if row.peaks else None


def _not_run(r) -> bool:
    return r["status"] not in (MEASURED, OOM)


def _ok(r) -> bool:
    return r["status"] == MEASURED and not missing(step_s(r))


def _status(r) -> str:
    return "not run" if _not_run(r) else ("OOM" if r["status"] == OOM else "")


def _first_step_s(r):
    """The first step, timed apart: the bench layer's first_call_s metric (older format: details)."""
    v = r.get("m.first_call_s")
    return r["details"].get("first_step_s") if missing(v) else v


def _settings(r) -> tuple:
    """What a row ran, as the legend's cells after config and sizes."""
    backend = r.cfg.compile_backend
    compile_ = r.cfg.compile + ("" if missing(backend) or r.cfg.compile == "none" else f" ({backend})")
    weights = r.cfg.weights  # rows from before the option: fp32
    weights = "fp32" if missing(weights) else weights
    return (r.cfg.dtype, "bf16 (fp32 masters)" if weights == "bf16" else weights, r.cfg.attn_impl, compile_,
            r.cfg.optimizer, "fused, chunked" if r.cfg.fused_ce else "logits + cross_entropy")


def _sizes_cell(rows: pd.DataFrame, config_rows: pd.DataFrame) -> str:
    """The sizes of `rows` (a config's rows with one set of settings); a size lists its contexts
    where the config's other rows of that size ran other settings."""
    cells = []
    for size, g in rows.groupby(rows.cfg.size, sort=False):
        ctxs = sorted(set(g.cfg.context))
        if ctxs == sorted(set(config_rows.loc[config_rows.cfg.size == size, "cfg.context"])):
            cells.append(size)
        else:
            cells.append(f"{size} (ctx {', '.join(str(int(c)) for c in ctxs)})")
    return ", ".join(cells)


def legend(d: pd.DataFrame) -> str:
    """One row per config and settings: the rows of one config can differ between sizes (a size
    measured with older code), so each distinct settings gets a row with the sizes that ran it."""
    d = _order(d).sort_values("_c", kind="stable")  # config order; sizes and contexts in order within
    d = d.assign(_settings=[_settings(r) for _, r in d.iterrows()])
    rows = []
    for name, g in d.groupby(d.cfg.config, sort=False):
        for settings in dict.fromkeys(g["_settings"]):
            rows.append([name, _sizes_cell(g[g["_settings"].map(settings.__eq__)], g), *settings])
    return table(["config", "sizes", "dtype", "Linear weights", "attention", "torch.compile", "optimizer",
                  "LM head + loss"], rows)


def _compile_cell(info: dict) -> str:
    """compile_s where the row's first step compiled; "reused" where it ran graphs compiled at an
    earlier context of its size; "–" for eager configs."""
    if info.get("compiled_now"):
        return num(info.get("compile_s"), 2)
    return "reused" if info.get("reused_graph") else "–"


ABLATION_HEADER = ["config", "size", "context", "step (ms)", "tokens/s", "MFU (datasheet)", "MFU (measured peak)",
                   "vs bf16", "peak GiB", "first step (s)", "compile (s)", "new graphs", "OOM / not run", "run (UTC)",
                   "commit"]


def ablation_rows(d: pd.DataFrame) -> list[list]:
    """One row per (size, context, config), ABLATION_HEADER's columns; "vs bf16" says "within noise"
    where the two steps' spreads overlap."""
    rows = []
    for (size, ctx), g in _order(d).groupby(["cfg.size", "cfg.context"], sort=False):
        base = g[(g.cfg.config == "bf16")]
        base = base.iloc[0] if not base.empty else None
        for _, r in g.iterrows():
            ok, info = _ok(r), r["details"]
            speedup = "1.00×" if ok and r.cfg.config == "bf16" else ratio_cell(r, base) if ok and base is not None else "–"
            rows.append([r.cfg.config, size, int(ctx), ms(step_s(r), r["stddev"]) if ok else "–",
                         num(r.get("m.tokens_per_s"), 0) if ok else "–",
                         pct(r.get("m.mfu")) if ok else "–", pct(r.get("m.mfu_measured_peak")) if ok else "–",
                         speedup, gib(r["peak_alloc"]) if ok else "–",
                         num(_first_step_s(r), 2) if ok else "–", _compile_cell(info) if ok else "–",
                         info.get("new_graphs", "–") if ok else "–", _status(r), _run(r), f"`{r.get('commit') or '–'}`"])
    return rows


def ablation_table(d: pd.DataFrame) -> str:
    return table(ABLATION_HEADER, ablation_rows(d))


def ablation_grid(d: pd.DataFrame) -> str:
    """The ablation at a glance: one row per config, one column per (size, context): the step and
    its ratio to bf16 (÷ bf16) of the same (size, context) (ablation_rows' cells)."""
    rows = ablation_rows(d)
    groups = list(dict.fromkeys((r[1], r[2]) for r in rows))
    configs = [c for c in CONFIG_ORDER if any(r[0] == c for r in rows)]
    cell = {(r[0], r[1], r[2]): r for r in rows}
    out = []
    for c in configs:
        line = [c]
        for g in groups:
            r = cell.get((c, *g))
            if r is None:
                line.append("–")
            elif r[12]:  # OOM / not run
                line.append(r[12])
            else:
                line.append(f"{r[3].split(' ±')[0]} ({r[7]})")
        out.append(line)
    return table(["config"] + [f"{s} ctx {c}: step ms (vs bf16)" for s, c in groups], out)


def versus_anchor(d: pd.DataFrame) -> str | None:
    """Per (size, context): each of OURS that ran beside the anchor, their step and MFU, and
    whether the two were measured in the same run (same machine, same matmul peak)."""
    rows = []
    for (size, ctx), g in _order(d).groupby(["cfg.size", "cfg.context"], sort=False):
        anchor = g[g.cfg.config == "anchor"]
        if anchor.empty or not _ok(anchor.iloc[0]):
            continue
        a = anchor.iloc[0]
        for name in OURS:
            sel = g[g.cfg.config == name]
            if sel.empty or not _ok(sel.iloc[0]):
                continue
            r = sel.iloc[0]
            same = "yes" if r["datetime"] == a["datetime"] else f"no ({_run(r)} / {_run(a)})"
            rows.append([size, int(ctx), name, ms(step_s(r), r["stddev"]), _mfus(r), ms(step_s(a), a["stddev"]),
                         _mfus(a), ratio_cell(r, a), same])
    if not rows:
        return None
    return table(["size", "context", "ours", "step (ms)", "MFU datasheet / measured peak", "anchor step (ms)",
                  "anchor MFU datasheet / measured peak", "÷ anchor", "same run"], rows)


def _mfus(r) -> str:
    return f"{pct(r.get('m.mfu'))} / {pct(r.get('m.mfu_measured_peak'))}"


def repeats_table(d: pd.DataFrame) -> str | None:
    """Ours and the anchor, every run that measured them where a (size, context, config) ran in more
    than one: the newest-row tables hide run-to-run spread (machines, matmul peak, code version), and
    a target read off one run should be read beside the others. Ours gets its ratio to the anchor
    of its own run, where that run had one."""
    d = _order(d[d.cfg.config.isin(OURS + ["anchor"])])
    d = d[pd.Series([_ok(r) for _, r in d.iterrows()], index=d.index, dtype=bool)]  # a list [] would pick columns
    anchor_ms = {(r.cfg.size, r.cfg.context, r["datetime"]): step_s(r)
                 for _, r in d[d.cfg.config == "anchor"].iterrows()}
    rows = []
    for (size, ctx, config), g in d.groupby([d.cfg.size, d.cfg.context, d.cfg.config], sort=False):
        if g["datetime"].nunique() < 2:
            continue
        for _, r in g.sort_values("datetime").iterrows():
            a = anchor_ms.get((size, ctx, r["datetime"])) if config != "anchor" else None
            vs = f"{step_s(r) / a:.2f}×" if a else "–"  # ours ÷ the anchor of the same run
            peak = _peak(r["row"])
            rows.append([size, int(ctx), config, _run(r), f"`{r.get('commit') or '–'}`", ms(step_s(r), r["stddev"]),
                         pct(r.get("m.mfu_measured_peak")), num(peak / 1e12, 1) if peak else "–", vs])
    if not rows:
        return None
    return table(["size", "context", "config", "run (UTC)", "commit", "step (ms)", "MFU", "matmul peak (TFLOP/s)",
                  "÷ anchor, same run"], rows)


# ------------------------------------------------------------------------------ where the time goes
def _profiled(d: pd.DataFrame) -> pd.DataFrame:
    d = _order(d)
    return d[d["details"].map(lambda i: "profile" in i or "profile_error" in i)]


# Profiles from before step_breakdown recorded "launch_ops" missed the kernels of our own Triton
# launchers (impl.runtime.launch_ctx); their rows are marked and footnoted.
UNATTRIBUTED = "†"
_SHORT = {"forward": "fwd", "backward": "bwd", "optimizer step": "opt"}


def _profiles(p: pd.DataFrame) -> list[dict]:
    return [i["profile"] for i in p["details"] if "profile" in i]


def _has_host(profiles: list[dict]) -> bool:
    return any("phase_host_ms" in pr for pr in profiles)


def _host_cell(pr: dict, phases: list[str]) -> str:
    host = pr.get("phase_host_ms")
    return "–" if host is None else " / ".join(num(host.get(ph), 2) for ph in phases)


def _ran_adamw_master(r) -> bool:
    return str(r["row"].config.get("optimizer", "")).startswith("adamw_master")


def _unattributed(r) -> bool:
    """A profile recorded before launch_ops, of a config that ran one of our launchers outside a
    torch op: AdamWMaster, or FlashAttention eagerly (compiled, it ran as custom ops)."""
    cfg, info = r["row"].config, r["details"]
    ours = _ran_adamw_master(r) or (cfg.get("attn_impl") == "flash_triton" and cfg.get("compile") == "none")
    return ours and "profile" in info and not info["profile"].get("launch_ops")


def _config_cell(r) -> str:
    return f"{r.cfg.config} {UNATTRIBUTED}" if _unattributed(r) else r.cfg.config


def time_table(d: pd.DataFrame) -> str | None:
    """Per profiled row: measured step, kernel time per phase, host time per phase (where
    recorded), per category (ms and share of the measured step), kernel total and the gap.
    Categories: those with time in any row, in the JSON's order."""
    p = _profiled(d)
    profiles = _profiles(p)
    if not profiles:
        return None
    cats = [c for c in profiles[0]["category_ms"] if any(pr["category_ms"].get(c, 0.0) > 0 for pr in profiles)]
    phases = list(profiles[0]["phase_ms"])
    host = _has_host(profiles)
    rows = []
    for _, r in p.iterrows():
        pr = r["details"].get("profile")
        head = [r.cfg.size, int(r.cfg.context), _config_cell(r)]
        if pr is None:
            rows.append(head + ["profile failed"] + [""] * (len(phases) + host + len(cats) + 2))
            continue
        step = pr["step_ms"]
        rows.append(head + [num(step, 2)] + [num(pr["phase_ms"][ph], 2) for ph in phases]
                    + ([_host_cell(pr, phases)] if host else [])
                    + [ms_share(pr["category_ms"][c], step) for c in cats]
                    + [ms_share(pr["kernel_ms"], step), ms_share(pr["gap_ms"], step)])
    host_head = [f"host {' / '.join(_SHORT.get(ph, ph) for ph in phases)} (ms)"] if host else []
    return table(["size", "context", "config", "step (ms)"] + [f"{ph} (ms)" for ph in phases] + host_head + cats
                 + ["kernels", "gap"], rows)


def _unattributed_note(p: pd.DataFrame) -> str | None:
    """The footnote of the marked rows, with the optimizer step of one that ran AdamWMaster as the
    example of what was missed (None where no row is marked)."""
    marked = p[[_unattributed(r) for _, r in p.iterrows()]] if not p.empty else p
    if marked.empty:
        return None
    master = marked[[_ran_adamw_master(r) for _, r in marked.iterrows()]]
    example = None
    if not master.empty:
        r = master.iloc[0]
        opt_ms = r["details"]["profile"]["phase_ms"].get("optimizer step")
        example = (r.cfg.size, int(r.cfg.context), r.cfg.config, num(opt_ms, 2))
    return W.unattributed(UNATTRIBUTED, example)


def top_kernels_table(d: pd.DataFrame, configs: list[str]) -> str | None:
    p = _profiled(d)
    rows = []
    for _, r in p[p.cfg.config.isin(configs)].iterrows():
        pr = r["details"].get("profile")
        for k in (pr or {}).get("top", []):
            rows.append([r.cfg.size, int(r.cfg.context), r.cfg.config, f"`{k['name'][:90].replace('|', '/')}`",
                         k["category"], num(k["ms"], 3), num(k["calls"], 0), pct(k["ms"] / pr["step_ms"])])
    if not rows:
        return None
    return table(["size", "context", "config", "kernel", "category", "ms per step", "calls per step",
                  "share of step"], rows)


def time_section(d: pd.DataFrame, top_configs: list[str] = OURS) -> list[str]:
    """The "where the time goes" part: its tables and the failed profiles, if any."""
    p = _profiled(d)
    if p.empty:
        return []
    tt, profiles = time_table(d), _profiles(p)
    pr = next(iter(profiles), {})
    configs = ", ".join(dict.fromkeys(p.cfg.config))
    parts = ["### Where the time goes", W.time_method(configs, pr.get("warmup_steps", "–"),
                                                     pr.get("timing_source") == "kernels", _has_host(profiles))]
    if tt is not None:
        parts.append(tt)
    note = _unattributed_note(p)
    if note:
        parts.append(note)
    failed = [f"{r.cfg.size} ctx {int(r.cfg.context)} {r.cfg.config}: {r['details']['profile_error']}"
              for _, r in p.iterrows() if "profile_error" in r["details"]]
    if failed:
        parts.append(W.failed(failed))
    top = top_kernels_table(d, top_configs)
    if top is not None:
        parts.append(W.top_intro(top_configs, top))
    return parts


def plot(d: pd.DataFrame, path: Path) -> bool:
    d = _order(d)
    groups = [(k, g) for k, g in d.groupby([d.cfg.size, d.cfg.context], sort=False)]
    configs = [c for c in CONFIG_ORDER if c in set(d.cfg.config)]
    if not configs or not any(_ok(r) for _, r in d.iterrows()):
        return False
    fig, ax = figures.new(figsize=(8, 4.2))
    width = 0.8 / len(configs)
    x = np.arange(len(groups))
    for i, cfg in enumerate(configs):
        heights = []
        for _, g in groups:
            sel = g[g.cfg.config == cfg]
            r = sel.iloc[0] if not sel.empty else None
            heights.append(r["m.tokens_per_s"] if r is not None and _ok(r) else 0.0)
        ax.bar(x + (i - (len(configs) - 1) / 2) * width, heights, width, label=cfg)
    ax.set_xticks(x, labels=[f"{s} ctx {int(c)}" for (s, c), _ in groups])
    ax.set(ylabel="tokens/s (training step)", title="training_step: ablation (missing bar = OOM / not run)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the bars, not over them
    figures.save(fig, path)
    return True


def body(every: pd.DataFrame, fig_dir: Path, fig_rel: str, fig_name: str,
         csv: "callable | None" = None) -> list[str]:
    """The page's tables and figures for one device's training_step rows (every run): method, the
    ablation (a grid; the full table as CSV through `csv(name, header, rows) -> link` where given,
    else inline), runs with dates and commits, ours against the anchor, repeats, the figure, and
    where the time goes (folded)."""
    d = latest_rows(every)
    c = d.iloc[0]
    runs = _runs(d)
    peaks = next((row.peaks for row in d["row"] if row.peaks), None)
    dtype = peaks.measured_dtype if peaks else "–"
    peak = (W.peak_one_run(num(peaks.measured_flops / 1e12, 2) if peaks else "–", dtype) if len(runs) == 1
            else W.peak_per_run(dtype))
    warm_n, rounds_n = timing_text(d)
    parts = [W.method(int(c.cfg.batch), warm_n, rounds_n, stat_name(d), peak),
             legend(d)]
    rows = ablation_rows(d)
    if csv is not None and len(rows) > 20:
        parts.append(W.ablation_csv(ablation_grid(d), csv("ablation", ABLATION_HEADER, rows)))
    else:
        parts.append(table(ABLATION_HEADER, rows))
    parts.append(W.runs_intro(runs_table(d)))
    vs = versus_anchor(d)
    if vs is not None:
        parts.append(W.vs_intro(vs))
    reps = repeats_table(every)
    if reps is not None:
        parts.append(W.repeats_intro(reps))
    if plot(d, fig_dir / fig_name):
        parts.append(W.figure(f"{fig_rel}/{fig_name}", runs[0], runs[-1]))
    time = time_section(d)
    if time:
        parts.append("<details><summary>Where the time goes (profiled steps)</summary>\n\n"
                     + "\n\n".join(time[1:]) + "\n\n</details>")
    left = d[d.apply(_not_run, axis=1)]
    if not left.empty:
        parts.append(W.not_run(len(left), left["reason"].iloc[0]))
    return parts
