"""Pages of 1.3 FlashAttention-2: flash_attention (flash_forward and flash_backward), flash_benchmarking,
leaderboard and flash_shapes. Tables come from impl.report.attention; every number in the prose is read
from the rows, the code or the probe files under reports/data/<device>/probes/."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

from impl.report import figures
from impl.report.attention import (IMPL_LABELS, IMPL_ORDER, MODE_LABELS, SHORT_SEQ, detail_of, impls_of, median_ms,
                                   newest_date, problem_rows, not_run_reasons,
                                   flash_grid, longest_sequence, ran)
from impl.report import flash_rows
from impl.report.markdown import num, table
from impl.report.rows import benches
from impl.report.output import figure_path, write_csv
from impl.report.pages import Answer, Context, Page, Score, missing_page
from impl.report.ratio import ratio, spread
from impl.report.runs import run_ids, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

#: A version counts as faster or slower only beyond this factor on top of the anchors' own change
#: between the same two runs (the anchors' code did not change, so their change is the machine's).
DRIFT_BAND = 1.05
#: IMPL_LABELS[impl] colour in every figure, so one implementation has one colour on every panel.
IMPL_COLORS = {impl: f"C{i}" for i, impl in enumerate(IMPL_ORDER)}


@dataclass
class PlotInfo:
    """What a figure drew and what its legend lists (the tests compare them)."""

    path: Path
    drawn: list[str]
    legend: list[str]


# --- shared ------------------------------------------------------------------------------------------------

def _spread(r) -> tuple[float, float] | None:
    """The row's median ± half its IQR (seconds), None where the run kept no spread (older format)."""
    iqr = r.get("iqr")
    return None if iqr is None or pd.isna(iqr) else (r["median"] - iqr / 2, r["median"] + iqr / 2)


def ratio_text(a, b, name: str) -> str:
    """Ours (a) ÷ the anchor (b), medians of two rows of one run, in the report's one convention."""
    return str(ratio(a["median"], b["median"], name, spread(a.get("stddev"), a.get("iqr")),
                     spread(b.get("stddev"), b.get("iqr"))))


def _legend_below(fig, gs_row, handles: dict) -> list[str]:
    """One legend for the whole figure in its own row under the panels (so tight_layout keeps it
    clear of the axis labels), built from the series drawn."""
    labels = list(handles)
    ax = fig.add_subplot(gs_row)
    ax.axis("off")
    legend = ax.legend([handles[k] for k in labels], labels, loc="center", ncol=min(3, len(labels)), fontsize=8,
                       frameon=False)
    return [t.get_text() for t in legend.get_texts()]


def _pow2_axis(ax, values) -> None:
    """Log₂ x axis labelled at every other power of two present (labels of neighbours overlap)."""
    ticks = sorted({int(v) for v in values})
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(FixedLocator(ticks[::2]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{int(x) // 1024}K" if x >= 1024 else f"{int(x)}"))


# --- flash_benchmarking ------------------------------------------------------------------------------------

def flash_plot(d: pd.DataFrame, path: Path) -> PlotInfo | None:
    """TFLOP/s against sequence length of the forward+backward rows, one panel per head dimension, one
    colour per implementation on every panel, one legend built from the lines drawn."""
    e2e = d[(d.cfg.mode == "fwd_bwd") & d.apply(ran, axis=1)]
    if e2e.empty:
        return None
    dtype = "bf16" if "bf16" in set(e2e.cfg.dtype) else sorted(e2e.cfg.dtype.unique())[0]
    e2e = e2e[e2e.cfg.dtype == dtype]
    dims = sorted(e2e.cfg.d.unique())
    ncol = 2 if len(dims) > 1 else 1
    nrow = (len(dims) + ncol - 1) // ncol
    fig, _ = figures.new(figsize=(10, 3.2 * nrow + 0.9))
    fig.clf()
    gs = fig.add_gridspec(nrow + 1, ncol, height_ratios=[1] * nrow + [0.22])
    handles, drawn = {}, []
    for idx, dim in enumerate(dims):
        ax = fig.add_subplot(gs[idx // ncol, idx % ncol])
        for impl in impls_of(e2e):
            sel = e2e[(e2e.cfg.impl == impl) & (e2e.cfg.d == dim)].sort_values("cfg.seq")
            if sel.empty:
                continue
            style = "-o" if impl.startswith("flash_triton") else "--s"  # ours solid, others dashed
            (line,) = ax.plot(sel.cfg.seq, sel["m.tflops"], style, ms=3, color=IMPL_COLORS[impl],
                              label=IMPL_LABELS[impl])
            handles.setdefault(IMPL_LABELS[impl], line)
            drawn.append(IMPL_LABELS[impl])
        _pow2_axis(ax, e2e.cfg.seq)
        ax.set_yscale("log")
        ax.set(xlabel="sequence length", ylabel="TFLOP/s", title=f"d = {int(dim)}")
    legend = _legend_below(fig, gs[nrow, :], handles)
    batch = int(e2e.cfg.batch.iloc[0])
    fig.suptitle(f"flash_benchmarking: {dtype}, causal, batch {batch}, forward+backward (median kernel times)")
    figures.save(fig, path)
    return PlotInfo(path, sorted(set(drawn)), legend)


def previous_run(cur: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """The newest earlier run of the same problem, device and dtype as `cur` (empty if none)."""
    if history.empty:
        return history
    h = history[(history.problem == cur.problem.iloc[0]) & (history.device == cur.device.iloc[0])
                & history.cfg.dtype.isin(cur.cfg.dtype.unique()) & (history.datetime < cur.datetime.min())]
    return h[h.datetime == h.datetime.max()] if not h.empty else h


def version_drift(cur: pd.DataFrame, prev: pd.DataFrame) -> tuple[str, list[list]]:
    """Per (dtype, d, pass): our median new/old over the shapes both runs measured, short and long
    sequences apart, beside the SDPA anchors' own median new/old. Each run's own medians: the anchors'
    change then holds the machine's drift and any change of clock between the runs."""
    key = ["cfg.impl", "cfg.dtype", "cfg.mode", "cfg.d", "cfg.seq"]

    def times(d):
        return {tuple(r[k] for k in key): median_ms(r) for _, r in d.iterrows() if ran(r)}

    now, before = times(cur), times(prev)
    rows, verdicts = [], {"faster": 0, "slower": 0, "within the anchors' drift": 0}
    for dtype in sorted({k[1] for k in now}):
        for dim in sorted({k[3] for k in now if k[1] == dtype}):
            for mode in MODE_LABELS:
                common = [k for k in now if k in before and k[1] == dtype and k[3] == dim and k[2] == mode]

                def med(sel):
                    xs = sorted(now[k] / before[k] for k in sel)
                    return xs[len(xs) // 2] if xs else None
                ours_long = med([k for k in common if k[0] == "flash_triton" and k[4] > SHORT_SEQ])
                ours_short = med([k for k in common if k[0] == "flash_triton" and k[4] <= SHORT_SEQ])
                anchors = med([k for k in common if str(k[0]).startswith("sdpa") and k[4] > SHORT_SEQ])
                if ours_long is None:
                    continue
                base = anchors or 1.0
                verdict = ("faster" if ours_long < base / DRIFT_BAND else "slower" if ours_long > base * DRIFT_BAND
                           else "within the anchors' drift")
                verdicts[verdict] += 1
                rows.append([dtype, int(dim), MODE_LABELS[mode], f"{ours_long:.2f}",
                             "–" if anchors is None else f"{anchors:.2f}", verdict,
                             "–" if ours_short is None else f"{ours_short:.2f}"])
    summary = ", ".join(f"{n} {v}" for v, n in verdicts.items() if n)
    return summary, rows


def bwd_over_e2e(d: pd.DataFrame) -> list[tuple]:
    """(impl, dtype, d, seq, bwd ms, fwd+bwd ms, why) where a backward took longer than its forward+
    backward: why = 'host-bound' (seq ≤ SHORT_SEQ), 'within noise' (spreads overlap) or 'unexplained'."""
    out = []
    for (impl, dtype, dim, seq), g in d[d.apply(ran, axis=1)].groupby(["cfg.impl", "cfg.dtype", "cfg.d", "cfg.seq"]):
        by = {r.cfg.mode: r for _, r in g.iterrows()}
        b, e = by.get("bwd"), by.get("fwd_bwd")
        if b is None or e is None or b["median"] <= e["median"]:
            continue
        sb, se = _spread(b), _spread(e)
        why = ("host-bound" if seq <= SHORT_SEQ else "within noise" if sb and se and sb[0] <= se[1]
               else "unexplained")
        out.append((impl, dtype, int(dim), int(seq), median_ms(b), median_ms(e), why))
    return out


def _best_anchor(g: pd.DataFrame):
    anchors = g[g.cfg.impl.str.startswith("sdpa") & g.apply(ran, axis=1)]
    return None if anchors.empty else anchors.loc[anchors["median"].idxmin()]


def flash_headline(fb: pd.DataFrame) -> list[list]:
    """Per dtype and d, at the longest sequence our forward+backward ran: ours, naive, the faster SDPA anchor."""
    rows = []
    e2e = fb[(fb.cfg.mode == "fwd_bwd") & fb.apply(ran, axis=1)]
    for (dtype, dim), g in e2e.groupby([e2e.cfg.dtype, e2e.cfg.d]):
        ours = g[g.cfg.impl == "flash_triton"]
        if ours.empty:
            continue
        seq = ours.cfg.seq.max()
        at = g[g.cfg.seq == seq]
        o = at[at.cfg.impl == "flash_triton"].iloc[0]
        best = _best_anchor(at)
        naive = g[g.cfg.impl == "naive"].sort_values("cfg.seq")
        nlong = naive.iloc[-1] if not naive.empty else None
        rows.append([dtype, int(dim), int(seq), f"{median_ms(o):.3f}", num(o.get("m.tflops"), 0),
                     "–" if best is None else f"{median_ms(best):.3f} ({IMPL_LABELS[best.cfg.impl]})",
                     "–" if best is None else ratio_text(o, best, "anchor"),
                     "–" if nlong is None else f"seq {int(nlong.cfg.seq)}: {median_ms(nlong):.3f}"])
    return rows


FB = macros("flash_benchmarking.md.j2")


def flash_benchmarking_page(ctx: Context) -> Page:
    name, answers, body, score = P.FLASH_BENCHMARKING, [], [], {}
    for dev in ctx.gpu_devices():
        fb = problem_rows(ctx.device_rows(dev), name)
        if fb.empty:
            continue
        head = flash_headline(fb)
        e2e = fb[(fb.cfg.mode == "fwd_bwd")]
        naive = e2e[(e2e.cfg.impl == "naive")]
        naive_ok = naive[naive.apply(ran, axis=1)]
        naive_stop = naive[~naive.apply(ran, axis=1)]
        ours = e2e[(e2e.cfg.impl == "flash_triton") & e2e.apply(ran, axis=1)]
        pair = ours.merge(naive_ok, on=["cfg.dtype", "cfg.d", "cfg.seq", "datetime"], suffixes=("", "_n"))  # one run
        text, sp = "Not measured on a GPU yet.", None
        if not pair.empty:
            top = pair[pair.cfg.seq == pair.cfg.seq.max()]
            sp = sorted(top["median"] / top["median_n"])  # ours ÷ naive, the one convention
            text = FB.a_compare(int(top.cfg.seq.iloc[0]), sp[0], sp[-1], int(ours.cfg.seq.max()),
                                int(naive_ok.cfg.seq.max()), naive_stop["reason"].iloc[0] if not naive_stop.empty else None)
        answers.append(Answer(FB.q_compare(int(fb.cfg.batch.iloc[0]), int(fb.cfg.seq.min()), int(fb.cfg.seq.max()),
                                           int(fb.cfg.d.min()), int(fb.cfg.d.max()), sorted(fb.cfg.dtype.unique())), text))
        bf = [r for r in head if r[0] == "bf16" and r[1] == 64] or head
        if bf:
            answers.append(Answer(FB.q_anchor(), FB.a_anchor(bf[0])))
            score[name] = Score(answer=FB.score_answer(int(ours.cfg.seq.max()), sp[0], sp[-1]) if sp
                                else "ours against SDPA on the page", headline=FB.score_headline(bf[0]),
                                vs_anchor=bf[0][6], device=dev, date=newest_date(fb))
        timers = flash_rows.timers(benches(fb))
        png, rel = figure_path(ctx.fig_dir, ctx.fig_rel, f"flash_benchmarking-{dev}")
        plot = flash_plot(fb, png)
        grid_link = write_csv(ctx.reports_dir, f"flash_benchmarking-{dev}", flash_grid(fb))
        body += [f"### {dev}", FB.method(int(fb.cfg.batch.iloc[0]), timers, detail_of(fb.iloc[0], "autotune"),
                                         detail_of(fb.iloc[0], "left_out", "–"), grid_link)]
        if plot:
            body.append(f"![TFLOP/s against sequence length, forward+backward]({rel})\n\n*Runs: {run_ids(fb)}.*")
        body += ["#### At the longest sequence ours ran (forward+backward)",
                 table(["dtype", "d", "seq", "ours (ms)", "ours TFLOP/s", "faster SDPA anchor (ms)", "ours / anchor",
                        "naive at its longest (ms)"], head),
                 "#### Longest sequence reached (forward+backward)", longest_sequence(fb)]
        odd = bwd_over_e2e(fb)
        if odd:
            whys = sorted({x[-1] for x in odd})
            body.append(FB.odd([f"{IMPL_LABELS[i]} {t} d {dm} seq {s} ({b:.3f} vs {e:.3f} ms, {w})"
                                for i, t, dm, s, b, e, w in odd], SHORT_SEQ, "unexplained" in whys))
        newest = fb[fb.datetime == fb.datetime.max()]
        prev = previous_run(newest, ctx.history)
        if not prev.empty:
            summary, rows = version_drift(newest, prev)
            body += ["#### Against the previous version",
                     FB.drift(run_ids(newest), run_ids(prev), SHORT_SEQ, DRIFT_BAND, summary),
                     table(["dtype", "d", "pass", f"ours new/old (seq > {SHORT_SEQ})", "anchors new/old", "verdict",
                            f"ours new/old (seq ≤ {SHORT_SEQ})"], rows)]
        if not_run_reasons(fb):
            body.append("Cells not run:\n" + not_run_reasons(fb))
        break
    if not answers:
        return missing_page(name, name, [name], [name], where=name)
    return Page(name, "flash_benchmarking: ours against naive attention and SDPA", [problem(name)], answers,
                "\n\n".join(body), score)


# --- pages -------------------------------------------------------------------------------------------------

def pages(ctx: Context) -> list[Page]:
    return [flash_benchmarking_page(ctx)]
