"""Pages of section 1.1 (profiling and benchmarking) and the suite's training_step: each opens with
its questions answered in sentences whose numbers are read from the rows, then tables, figures,
method and the runs (device, date, commit). GPU devices only: the CPU smoke rows are on cpu_smoke.
"""
from __future__ import annotations


import pandas as pd

from impl.bench.row import Status
from impl.model import MODEL_SIZES
from impl.report import checkpointing, training_step
from impl.report.checkpointing_facts import single_level_facts
from impl.model.sizes import SizeRef
from impl.report.ratio import ratio, spread
from impl.report.rows import benches, size_label
from impl.report.templating import macros
from impl.report.benchmarking import step_s, study
from impl.report.markdown import gib, missing, ms, num, table
from impl.report.output import figure_path, write_table_csv
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows, missing_page, run_date
from impl.report.runs import device_short, runs_line
from impl.report.pages.problems import problem
from impl.report.pages.memory import memory_page
from impl.workloads.problems import Problem as P

MEASURED, OOM = Status.MEASURED.value, Status.OOM.value


# ------------------------------------------------------------------------------------ shared
def _i(x):
    return int(x) if not missing(x) else x


# ---------------------------------------------------------------------------- gradient_checkpointing
def checkpointing_page(ctx: Context) -> Page:
    slug, name = "gradient_checkpointing", P.GRADIENT_CHECKPOINTING
    words = macros("gradient_checkpointing.md.j2")
    qs = [words.q_a(), words.q_b()]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, P.GRADIENT_CHECKPOINTING, [name], qs)
    device, d = found[0]
    pol = d[d.apply(study, axis=1) == "policies"]
    ok = pol[pol["status"] == MEASURED]
    label = lambda r: size_label(r.cfg.size_ref, r.cfg.size)  # noqa: E731
    note = words.edition_note(sorted({label(r) for _, r in ok.iterrows()}), size_label(SizeRef("2026", "xl")))
    note = f" {note}" if note else ""
    answers, score = [], Score(NOT_ON_GPU)
    bf = ok[ok.cfg.dtype == "bf16"] if "bf16" in set(ok.cfg.dtype) else ok
    nested = bf[bf.cfg.policy == "nested"]
    none = pol[(pol.cfg.policy == "none") & (pol.cfg.dtype == (bf.cfg.dtype.iloc[0] if not bf.empty else None))]
    if not nested.empty:
        r = nested.iloc[0]
        n0 = none.iloc[0] if not none.empty else None
        none_txt = (words.none_oom() if n0 is not None and n0["status"] == OOM else
                    words.none_peak(n0["peak_alloc"]) if n0 is not None else words.none_not_run())
        layers = r.cfg.size_ref.config.num_layers if r.cfg.size_ref else "–"
        answers.append(Answer(qs[0], words.a_nested(
            r["peak_alloc"], r.cfg.dtype, label(r), _i(r.cfg.context), checkpointing.predicted_peak(r), none_txt,
            checkpointing.predicted_peak(n0) if n0 is not None else None,
            checkpointing.forwards_cell(r).split(" /")[0], layers) + note))
        score = Score(words.score_answer(label(r), _i(r.cfg.context), r["peak_alloc"]),
                      words.score_headline(r["peak_alloc"], r.cfg.dtype),
                      words.score_vs_oom() if n0 is not None and n0["status"] == OOM else "–", device, run_date(d))
    else:
        answers.append(Answer(qs[0], f"{NOT_ON_GPU.capitalize()}."))
    if not ok.empty and "best_k" in ok["details"].iloc[0]:
        i = ok["details"].iloc[0]
        ks = bf[bf.cfg.policy == "every_k"].sort_values("cfg.k")
        best = ks.loc[ks["peak_alloc"].idxmin()] if not ks.empty else None
        answers.append(Answer(qs[1], words.a_best_k(
            i.get("best_k"), i.get("best_k_rule"), bf.cfg.dtype.iloc[0],
            [(_i(r.cfg.k), r["peak_alloc"]) for _, r in ks.iterrows()], None if best is None else _i(best.cfg.k))
            + note))
    else:
        answers.append(Answer(qs[1], f"{NOT_ON_GPU.capitalize()}."))
    sl = single_level_facts(benches(d))
    earlier = words.earlier_rows(sorted({label(r) for _, r in ok.iterrows()}))
    if sl is not None and sl.best is not None and sl.best.measured:
        answers = [Answer(a.question, a.text.replace(note, "") if note else a.text) for a in answers]
        answers[1] = Answer(qs[1], words.a_single_level(sl) + "\n\n" + earlier + " " + answers[1].text)
        d26 = d[d.cfg.study == "single_level_2026"]
        score = Score(words.score_single_level(sl), words.headline_single_level(sl), "–", device, run_date(d26))
    answers[0] = Answer(qs[0], words.a_strategy() + "\n\n" + (earlier + " " if sl else "") + answers[0].text)
    path, link = figure_path(ctx.fig_dir, ctx.fig_rel, slug, f"{device}-depth")
    b = checkpointing.body(d, path.parent, link.rsplit("/", 1)[0], path.name)
    body = [f"## {device}", _single_level_table(sl) if sl else "", b or "", runs_line(device, d)]
    return Page(slug, P.GRADIENT_CHECKPOINTING, [problem(name)], answers, "\n\n".join(x for x in body if x),
                score={name: score})


def _single_level_table(f) -> str:
    rows = [[c.label, gib(c.peak_bytes) if c.measured else ("OOM" if c.status is Status.OOM else c.status.value),
             gib(c.predicted_peak_bytes), gib(c.predicted_activation_bytes), ms(c.mean_s) if c.mean_s else "–",
             num(c.block_forwards, 0) if c.block_forwards else "–"] for c in f.cases]
    words = macros("gradient_checkpointing.md.j2")
    return words.single_level_head(f) + "\n\n" + table(words.single_level_header().split("|"), rows)


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
    return [memory_page(ctx),
            checkpointing_page(ctx), training_step_page(ctx)]
