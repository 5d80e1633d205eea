"""Pages of section 1.1 (profiling and benchmarking) and the suite's training_step: each opens with
its questions answered in sentences whose numbers are read from the rows, then tables, figures,
method and the runs (device, date, commit). GPU devices only: the CPU smoke rows are on cpu_smoke.
"""
from __future__ import annotations


import pandas as pd

from impl.bench.row import Status
from impl.model import MODEL_SIZES
from impl.report import training_step
from impl.report.ratio import ratio, spread
from impl.report.templating import macros
from impl.report.benchmarking import step_s
from impl.report.markdown import missing, ms, num
from impl.report.output import write_table_csv
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows, missing_page, run_date
from impl.report.runs import device_short, runs_line
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

MEASURED, OOM = Status.MEASURED.value, Status.OOM.value


# ------------------------------------------------------------------------------------ shared
def _i(x):
    return int(x) if not missing(x) else x


# ------------------------------------------------------------------------------------ training_step
def training_step_page(ctx: Context) -> Page:
    slug, name = "training_step", P.TRAINING_STEP
    qs = [TS.q_ablation(), TS.q_mfu(), TS.q_anchor()]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, P.TRAINING_STEP, [name], qs)
    index_figs, body, answers, score = [], [], None, None
    for device, newest in found:
        # every run of the device: a later command may have left a row "not run" that an earlier one
        # measured, and repeated rows show their spread (training_step.latest_rows, repeats_table)
        h = ctx.history
        every = newest if h.empty else pd.concat([newest, h[(h.device == device) & (h.problem == name)]])
        d = training_step.latest_rows(every)
        ok = d[d.apply(training_step._ok, axis=1)]
        if answers is None:
            answers, score = _training_answers(device, d, ok, qs)
        fig_name = f"{slug}-{device}-ablation.png"
        parts = training_step.body(every, ctx.fig_dir, ctx.fig_rel, fig_name, csv=lambda name, header, rows: write_table_csv(ctx.reports_dir, f"{slug}-{device}-{name}", header, rows))
        body += [f"## {device}"] + parts + [runs_line(device, every)]
        if not index_figs and (ctx.fig_dir / fig_name).exists():
            index_figs.append((TS.index_figure(device), f"{ctx.fig_rel}/{fig_name}"))
    return Page(slug, TS.title(), [problem(name)], answers, "\n\n".join(body),
                score={name: score}, index_figures=index_figs)


TS = macros("training_step.md.j2")


def _vs(r, ref, name: str):
    """Row r ÷ row ref (their step times), the report's one convention."""
    return ratio(step_s(r), step_s(ref), name, spread(r["stddev"], r.get("iqr")), spread(ref["stddev"], ref.get("iqr")))


def _training_answers(device: str, d: pd.DataFrame, ok: pd.DataFrame, qs: list[str]):
    if ok.empty:
        return [Answer(q, f"{NOT_ON_GPU.capitalize()}.") for q in qs], Score(NOT_ON_GPU)
    # the (size, context) with the most measured configs, largest size first
    counts = ok.groupby([ok.cfg.size, ok.cfg.context]).size()
    size, c = max(counts.index, key=lambda k: (counts[k], MODEL_SIZES[k[0]].params, -k[1]))
    g = ok[(ok.cfg.size == size) & (ok.cfg.context == c)].set_index("cfg.config")
    where = f"{size} at context {_i(c)}"
    a = []
    if "bf16" in g.index:
        base = g.loc["bf16"]
        vs = lambda x: _vs(g.loc[x], base, "bf16")  # noqa: E731
        singles = [x for x in g.index if x.startswith("+")]
        top = min(singles, key=lambda x: vs(x).value, default=None)
        best = min((x for x in g.index if x not in ("anchor",)), key=lambda x: step_s(g.loc[x]))
        product = 1.0
        for x in singles:
            product *= vs(x).value
        a.append(Answer(qs[0], TS.a_ablation(where, step_s(base), (top, vs(top)) if top else None,
                                             [x for x in singles if vs(x).noise], f"{best} at {ms(step_s(g.loc[best]))} ms",
                                             vs(best), product)))
    else:
        a.append(Answer(qs[0], TS.no_bf16()))
    ours = ok[ok.cfg.config.isin(training_step.OURS)]
    key = next((k for k in ("m.mfu", "m.mfu_measured_peak") if k in ours and ours[k].notna().any()), None)
    top = ours.loc[ours[key].idxmax()] if key else None
    if top is not None:
        peak = top["row"].peaks
        a.append(Answer(qs[1], TS.a_mfu(
            top.cfg.config, top.cfg.size, _i(top.cfg.context), top.get("m.mfu"),
            num(peak.datasheet_flops / 1e12, 1) if peak and peak.datasheet_flops else "–",
            top.get("m.mfu_measured_peak"), num(peak.measured_flops / 1e12, 1) if peak else "–")))
    else:
        a.append(Answer(qs[1], TS.no_ours()))
    pairs = []
    for (s_, c_), gg in ok.groupby([ok.cfg.size, ok.cfg.context]):
        by = {r.cfg.config: r for _, r in gg.iterrows()}
        an = by.get("anchor")
        for o in training_step.OURS:
            if an is not None and o in by and by[o]["datetime"] == an["datetime"]:
                pairs.append((s_, _i(c_), o, by[o], an))
    if pairs:
        s_, c_, o, r, an = max(pairs, key=lambda p: (MODEL_SIZES[p[0]].params, p[1]))
        vs_anchor = _vs(r, an, "the anchor's step")
        a.append(Answer(qs[2], TS.a_anchor(s_, c_, o, step_s(r), r["stddev"], step_s(an), an["stddev"], vs_anchor,
                                           len(pairs))))
        score = Score(TS.score_answer(o, s_, c_, r.get("m.mfu")),
                      TS.score_headline(step_s(r), r.get("m.mfu"), r.get("m.mfu_measured_peak")),
                      TS.score_vs(vs_anchor, o), device_short(device), str(r["datetime"])[:10])
    else:
        a.append(Answer(qs[2], TS.no_pair()))
        score = Score(TS.score_no_pair(), "–", "–", device_short(device), run_date(d))
    return a, score


def pages(ctx: Context) -> list[Page]:
    return [training_step_page(ctx)]
