"""Report section: fsdp (our FSDP in fp32 and with bf16 compute, DDP and torch's fully_shard), and
the collective timeline of one instrumented step of our FSDP (impl.distributed.fsdp_timeline)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.bench.row import Metric, Status
from impl.workloads.sweeps import grid
from impl.workloads.variants import FSDPVariant
from impl.report import figures
from impl.report.distributed import figure
from impl.report.templating import environment, macros
from impl.report.markdown import gib, missing, ms, num, table
from impl.report.rows import line_size_ref, size_label  # (also registers the typed .cfg accessors of rows and frames)
from impl.workloads.problems import Problem as P

LABEL = {v.value: v.label for v in FSDPVariant}
OURS_FSDP = ("fsdp", "fsdp_bf16", "fsdp_block_bf16")
# The headline pair, by rule rather than by which row looks best: the target configuration (ours with
# a unit per block against fully_shard, both bf16, the grid's first pair), else the nearest pair the
# run has, bf16 before fp32.
TEMPLATE = "fsdp.md.j2"
WORDS = macros(TEMPLATE)
HEADLINE_PAIRS = (("fsdp_block_bf16", "torch_fsdp_bf16"), ("fsdp_bf16", "torch_fsdp_bf16"), ("fsdp", "torch_fsdp"))


def headline_pair(measured_variants) -> tuple[str, str] | None:
    """The first of HEADLINE_PAIRS whose two variants both have a measured row."""
    have = set(measured_variants)
    return next((p for p in HEADLINE_PAIRS if set(p) <= have), None)
KIND_LABEL = {("all_gather", "forward"): "all-gather, forward", ("all_gather", "backward"): "all-gather, backward",
              ("reduce_scatter", "backward"): "reduce-scatter", ("all_reduce", "finish"): "all-reduce (replicated)"}


def _m(r, key, metric: Metric | None = None):
    return figure(r, key, metric)


def _label(r) -> str:
    return LABEL.get(r.cfg.variant, r.cfg.variant)


def _not_run_cell(r) -> str | None:
    """Why a row has no timings: its status with the reason (an OOM's message)."""
    if r["status"] == Status.MEASURED.value:
        return None
    return "OOM" + (f" ({r['reason']})" if r["reason"] else "") if r.oom else f"{r['status']}: {r['reason'] or ''}"


def _main_table(d: pd.DataFrame) -> str:
    rows = []
    for _, r in d.iterrows():
        reason = _not_run_cell(r)
        if reason:
            rows.append([_label(r), reason, "", "", "", "", ""])
            continue
        peak = _m(r, "peak_bytes")
        rows.append([_label(r), ms(r["median"], r["stddev"]), ms(_m(r, "comm_s")),
                     "–" if missing(_m(r, "bytes_per_step")) else num(_m(r, "bytes_per_step") / 1e6, 1),
                     "–" if missing(peak) else gib(peak), gib(_m(r, "predicted_total_bytes")),
                     num(_m(r, "tokens_per_s", Metric.TOKENS_PER_S), 0)])
    return table(WORDS.main_header().split("|"), rows)


def _not_yet_run(d: pd.DataFrame, device: str) -> str | None:
    """Variants of today's grid that this device's data lacks (added after its newest run), so a
    reader sees what the next run on such a machine will measure."""
    variants = grid(P.FSDP, "smoke" if device == "cpu" else "full").variants
    absent = [LABEL.get(v, v) for v in variants if v not in set(d.cfg.variant)]
    return WORDS.not_yet_run(absent) if absent else None


SHARDING_LABEL = dict(none="DDP + AdamW (no sharding)", sharded="ShardedOptimizer(AdamW)", zero1="ZeRO1Optimizer(AdamW)",
                      torch_zero="torch ZeroRedundancyOptimizer(AdamW)")


def _sharding_table(df: pd.DataFrame, first) -> str | None:
    """The optimizer_state_sharding_accounting rows of the same device and shape (size by edition),
    for the memory comparison: peak = the largest of the peaks before and during the optimizer step,
    over ranks."""
    s = df[(df.problem == P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)]
    if s.empty:
        return None
    same_size = s.apply(lambda r: line_size_ref(r) == first.cfg.size_ref, axis=1)
    s = s[same_size & (s.cfg.context == first.cfg.context) & (s.cfg.batch_per_rank == first.cfg.batch_per_rank)]
    rows = []
    for _, r in s.iterrows():
        ranks = r["details"].get("ranks") or []
        peaks = [max(x.get("before_peak") or 0, x.get("after_peak") or 0) for x in ranks]
        if r["status"] != Status.MEASURED.value or not peaks or not max(peaks):
            continue
        rows.append([SHARDING_LABEL.get(r.cfg.variant, r.cfg.variant), ms(r["median"], r["stddev"]), gib(max(peaks))])
    if not rows:
        return None
    return WORDS.sharding_intro() + "\n\n" + table(WORDS.sharding_header().split("|"), rows)


# ---- timeline --------------------------------------------------------------------------------


def _rows(tl: dict) -> pd.DataFrame:
    return pd.DataFrame(tl["rows"], columns=tl["columns"])


STYLE = {("all_gather", "forward"): ("C0", 0.0), ("all_gather", "backward"): ("C1", 0.0),
         ("reduce_scatter", "backward"): ("C2", 0.35), ("all_reduce", "finish"): ("C7", 0.0)}


def _draw(ax, tl: dict, title: str) -> None:
    """Gantt of one step on rank 0: one row per layer call (forward order, top down; a layer's
    reduce-scatter just below its gathers); a bar from issue to ready per collective, a tick where
    it was needed (red, with the stall drawn from need to ready, when it was not ready yet)."""
    r = _rows(tl)
    n_calls = max(int(r["call"].max()) + 1, 1)
    lw = max(0.5, min(5.0, 240 / n_calls))
    dy = [STYLE.get((k, p), ("C7", 0.0))[1] for k, p in zip(r["kind"], r["phase"])]
    r = r.assign(y=r["call"].where(r["call"] >= 0, n_calls + 1).astype(float) + dy)
    shades = {"forward": "C0", "backward": "C1", "finish": "C7"}
    for p in tl["phases"]:
        ax.axvspan(p["start_ms"], p["end_ms"], color=shades.get(p["name"], "C4"), alpha=0.08, lw=0,
                   label=f"phase: {p['name']}" if p["name"] not in _seen_phases(ax) else None)
    for (kind, phase), g in r.groupby(["kind", "phase"]):
        color, off = STYLE.get((kind, phase), ("C7", 0.0))
        ax.hlines(g["y"], g["issue_ms"], g["ready_ms"], color=color, lw=lw if off == 0 else lw / 2,
                  label=KIND_LABEL.get((kind, phase), f"{kind}, {phase}"))
    used = r[r["need_ms"].notna()]
    late = used[used["stall_ms"] > 0]
    ax.hlines(late["y"], late["need_ms"], late["ready_ms"], color="red", lw=lw)
    tick = max(4.0, lw * 12)
    ax.scatter(used["need_ms"], used["y"], marker="|", s=tick, color="black", lw=0.8, label=WORDS.fig_needed(),
               zorder=3)
    ax.scatter(late["need_ms"], late["y"], marker="|", s=tick, color="red", lw=0.8,
               label=WORDS.fig_stalled(), zorder=4)
    ax.set_ylim(n_calls + 2, -1)
    ax.yaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
    ax.set(xlabel=WORDS.fig_gantt_x(), ylabel=WORDS.fig_gantt_y())
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def _seen_phases(ax) -> set[str]:
    """Phase names already in the legend (a step with several forwards shades each)."""
    return {h.get_label().removeprefix("phase: ") for h in ax.patches if h.get_label().startswith("phase: ")}


def _draw_slack(ax, tl: dict) -> None:
    """Per all-gather, how long before its layer needed it the weight was ready (need - ready):
    below zero the layer waited. Readable per gather where the Gantt's bars are too short."""
    r = _rows(tl)
    r = r[(r["kind"] == "all_gather") & r["need_ms"].notna()]
    for phase, color in (("forward", "C0"), ("backward", "C1")):
        g = r[r["phase"] == phase]
        slack = g["need_ms"] - g["ready_ms"]
        ax.scatter(g["call"], slack, s=6, color=color, label=WORDS.fig_gather(phase))
        late = slack < 0
        ax.scatter(g["call"][late], slack[late], s=10, facecolors="none", edgecolors="red", lw=0.6)
    ax.axhline(0, color="0.4", lw=0.6)
    ax.xaxis.set_major_locator(figures.plt.MaxNLocator(integer=True))
    ax.set(xlabel=WORDS.fig_slack_x(), ylabel=WORDS.fig_slack_y())
    ax.set_title(WORDS.fig_slack_title(), fontsize=9)
    ax.legend(fontsize=7, frameon=False)


def _render_figure(items: list[tuple[str, dict]], path: Path, title: str | None = None) -> None:
    fig, axes = figures.plt.subplots(len(items), 2, figsize=(15, 4.6 * len(items) + 0.4), squeeze=False,
                                     gridspec_kw=dict(width_ratios=[2.2, 1]))
    if title:
        fig.suptitle(title, fontsize=11, x=0.01, ha="left")
    for (gantt, slack), (label, tl) in zip(axes, items):
        s = tl["summary"]
        _draw(gantt, tl, f"{WORDS.fig_title(label, s)}\n{WORDS.fig_subtitle(s)}")
        _draw_slack(slack, tl)
    figures.save(fig, path)


def _group_rows(label: str, tl: dict) -> list[list]:
    units = tl.get("units") or []
    out = []
    for g in tl["summary"]["groups"]:
        worst = g["max_stall_unit"]
        name = units[worst] if isinstance(worst, int) and 0 <= worst < len(units) else "–"
        stalled = g["used"] - g["in_time"]
        out.append([label, KIND_LABEL.get((g["kind"], g["phase"]), f"{g['kind']}, {g['phase']}"), g["n"],
                    g["prefetched"], g["used"], g["in_time"], stalled, f"{g['stall_ms']:.3f}",
                    f"{g['max_stall_ms']:.3f} ({name})" if stalled else "–", f"{g['comm_ms']:.3f}"])
    return out


def phase_counts(tl: dict, phase: str) -> tuple[int, int]:
    g = [x for x in tl["summary"]["groups"] if x["kind"] == "all_gather" and x["phase"] == phase]
    return (g[0]["in_time"], g[0]["used"]) if g else (0, 0)


def _verdict(label: str, r, tl: dict) -> str:
    """What the data says, in one paragraph per variant."""
    timed = _m(r, "worker_step_s") or r["median"]  # older files: the ranks' clock beside the parent's
    return WORDS.verdict(label, tl["summary"], phase_counts(tl, "forward"), phase_counts(tl, "backward"),
                         r["details"].get("timeline_ranks") or [], _m(r, "timeline_step_s"),
                         None if missing(timed) else timed)


def timeline_section(d: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    ran = d[d.cfg.variant.isin(OURS_FSDP) & (d["status"] == Status.MEASURED.value)]
    with_tl = ran[ran["details"].map(lambda i: bool(i.get("timeline")))]
    head = WORDS.timeline_head()
    if with_tl.empty:
        return None if ran.empty else f"{head}\n\n{WORDS.no_timeline()}"
    items = [(_label(r), r["details"]["timeline"]) for _, r in with_tl.iterrows()]
    name = f"{device}_fsdp_timeline.png"
    first = with_tl.iloc[0]
    _render_figure(items, fig_dir / name, WORDS.fig_suptitle(size_label(first.cfg.size_ref, first.cfg.size),
                                                             int(first.cfg.context), int(first.cfg.batch_per_rank),
                                                             int(first.cfg.world_size)))
    tl0 = items[0][1]
    rows = [row for (label, tl) in items for row in _group_rows(label, tl)]
    parts = [head, WORDS.timeline_intro(tl0["source"], len(tl0["rows"]), tl0["rows_total"], "host clock" in tl0["source"]),
             f"![{WORDS.timeline_alt()}]({fig_rel}/{name})", table(WORDS.timeline_header().split("|"), rows)]
    parts += [_verdict(label, r, r["details"]["timeline"]) for (label, _), (_, r) in zip(items, with_tl.iterrows())]
    return "\n\n".join(parts)


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str, sharding: pd.DataFrame | None = None
           ) -> str | None:
    """The fsdp rows of `df` (one run and size; the TP rows have their own section, impl.report.tp_facts),
    beside the optimizer-sharding rows of `sharding` (default: `df`'s) of the same shape."""
    d = df[(df.problem == P.FSDP) & (df.cfg.variant != "tp")]
    if d.empty:
        return None
    first = d.iloc[0]
    head = str(environment().get_template(TEMPLATE).module.method(
        size_label(first.cfg.size_ref, first.cfg.size), int(first.cfg.context), int(first.cfg.batch_per_rank),
        int(first.cfg.world_size),
        first.cfg.backend)).strip()
    parts = [head, _main_table(d)]
    unrun = _not_yet_run(d, device)
    if unrun:
        parts.append(unrun)
    shard = _sharding_table(df if sharding is None else sharding, first)
    if shard:
        parts.append(shard)
    errors = [f"{_label(r)}: {r['details']['timeline_error']}" for _, r in d.iterrows()
              if r["details"].get("timeline_error")]  # older files
    if errors:
        parts.append(WORDS.timeline_failed(errors))
    tl = timeline_section(d, device, fig_dir, fig_rel)
    if tl:
        parts.append(tl)
    return "\n\n".join(parts)
