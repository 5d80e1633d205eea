"""Pages of sections 2-3: ddp and communication_accounting (distributed_communication, optimizer_sharding
and fsdp are two-file pages of their own). Tables and figures come from the section helpers
impl.report.distributed and .accounting; this module puts the answers
first, GPU devices only (the CPU smoke rows have their own page), and the run metadata last.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.bench.row import Metric, Status
from impl.report import accounting as acc_r
from impl.report import distributed as dr
from impl.report import figures
from impl.report.markdown import missing, ms
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows, run_date
from impl.report.ratio import ratio, spread
from impl.report.ddp_facts import TORCH, ddp_facts
from impl.report.ddp_facts import label as ddp_label
from impl.report.rows import answering, current_edition, size_runs
from impl.report.runs import device_label, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

DDP_VARIANTS = ("naive", "flat", "individual", "bucketed")


# ---- shared ------------------------------------------------------------------------------------


def measured(r) -> bool:
    return r is not None and r["status"] == Status.MEASURED.value and not missing(r["median"])


# ---- DDP ------------------------------------------------------------------------------------------



def _ratio(r, ref, name: str) -> str:
    """Ours ÷ the reference row, the report's one convention (impl.report.ratio)."""
    if not (measured(r) and measured(ref)):
        return "–"
    return str(ratio(r["median"], ref["median"], name, spread(r["stddev"], r["iqr"]), spread(ref["stddev"], ref["iqr"])))


def _by_variant(g: pd.DataFrame) -> dict:
    return {(r.cfg.variant, r.cfg.bucket_mb if r.cfg.variant == "bucketed" else None): r
            for _, r in g.iterrows() if r.cfg.kind != "trace"}


def ddp_overhead_figure(d: pd.DataFrame, path: Path, caption_run: str) -> None:
    """Step time over the single-GPU floor, per variant and context, torch DDP beside ours (±1 std)."""
    words = macros("ddp.md.j2")
    groups = sorted(d.groupby([d.cfg.context, d.cfg.batch_per_rank]), key=lambda x: x[0])
    fig, ax = figures.new(figsize=(8.5, 4.2))
    width = 0.8 / max(len(groups), 1)
    labels: list[str] = []
    for k, ((ctx, batch), g) in enumerate(groups):
        by = _by_variant(g)
        floor = by.get(("single", None))
        if not measured(floor):
            continue
        keys = [key for key in sorted(by, key=lambda x: (dr.VARIANT_ORDER.index(x[0]) if x[0] in dr.VARIANT_ORDER
                                                          else 99, x[1] or 0)) if key[0] != "single"]
        labels = labels or [dr.variant_label(by[key]).split(" (")[0] for key in keys]
        vals = [100 * (by[key]["median"] / floor["median"] - 1) if measured(by[key]) else float("nan") for key in keys]
        errs = [100 * ((by[key]["stddev"] or 0) + (floor["stddev"] or 0)) / floor["median"] if measured(by[key])
                else 0 for key in keys]
        xs = [i + (k - (len(groups) - 1) / 2) * width for i in range(len(keys))]
        bars = ax.bar(xs, vals, width, yerr=errs, capsize=2, label=words.fig_legend(int(ctx), int(batch)),
                      color=f"C{k}")
        for bar, key in zip(bars, keys):
            if key[0] == "torch_ddp":
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set(ylabel=words.fig_ylabel(), title=f"{words.fig_title()}\n{caption_run}")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    figures.save(fig, path)



def _log_tail(ctx: Context, dev: str, name: str) -> str | None:
    path = ctx.reports_dir / "data" / dev / "logs" / name
    if not path.exists():
        return None
    lines = [x.strip() for x in path.read_text().splitlines() if x.strip()]
    return lines[-1] if lines else None


EDITIONS = macros("_editions.md.j2")


def ddp_page(ctx: Context) -> Page:
    slug = problem(P.NAIVE_DDP).slug
    names = [P.NAIVE_DDP, P.NAIVE_DDP_BENCHMARKING, P.MINIMAL_DDP_FLAT_BENCHMARKING,
             P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS, P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING,
             P.DDP_OVERLAP_BUCKETED, P.DDP_BUCKETED_BENCHMARKING]
    # the implementation problems: answered by the correctness suite (benchmarks: their own problems)
    implemented = {P.NAIVE_DDP: "naive", P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS: "DDPIndividualParameters",
                   P.DDP_OVERLAP_BUCKETED: "DDPBucketed"}
    words = macros("ddp.md.j2")
    comm_runs = dict(gpu_rows(ctx, P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE))
    answers: dict[str, str] = {n: f"{NOT_ON_GPU}." for n in names}
    scores = {n: Score(NOT_ON_GPU) for n in names}
    body, index_figures, facts = [], [], []
    steps = {P.NAIVE_DDP_BENCHMARKING: ("naive", None), P.MINIMAL_DDP_FLAT_BENCHMARKING: ("flat", None),
             P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING: ("individual", None)}
    for dev, d in gpu_rows(ctx, *dr.DDP_PROBLEMS):
        label = device_label(dev, d)
        log_tail = _log_tail(ctx, dev, "correctness-nccl.txt")
        if log_tail:
            f0 = ddp_facts(label, size_runs(d)[0], log_tail)
            for n, what in implemented.items():
                answers[n] = words.a_implemented(f0, what)
                scores[n] = Score(words.score_implemented(), f0.passed, "–", dev, "–")
        body.append(f"## {label}")
        comm = comm_runs.get(dev)
        fits = dr.allreduce_fits(comm) if comm is not None else {}
        for run in size_runs(d):  # each [edition, size] run apart: its ratios divide its own rows
            f = ddp_facts(label, run, log_tail)
            facts.append((dev, f))
            current = current_edition(P.NAIVE_DDP_BENCHMARKING)
            fig_name = f"{slug}-{dev}-{run.id}-overhead-vs-torch-ddp.png"
            bench = run.rows[run.rows.cfg.kind != "trace"]
            ddp_overhead_figure(bench, ctx.fig_dir / fig_name, f"{label}, {f.run.size_short}, run {f.date}")
            index_figures.append((words.fig_caption(label, f.run.size_short, f.date), f"{ctx.fig_rel}/{fig_name}"))
            text, data = dr.ddp_section(run.rows)
            body += [EDITIONS.h_size_run(f.run, current), EDITIONS.size_run_intro(f.run), words.h_vs_torch(),
                     f"![{words.fig_alt()}]({ctx.fig_rel}/{fig_name})", text,
                     words.h_bucket_model(), dr.bucket_model_section(fits, data, f.overlap) or words.no_bucketed(f),
                     words.h_timeline(),
                     dr.timeline_section(run.rows, f"{slug}-{dev}-{run.id}", ctx.fig_dir, ctx.fig_rel)
                     or words.no_timeline()]
        body.append(runs_line(dev, d))
    for n in (*steps, P.DDP_BUCKETED_BENCHMARKING):
        current = current_edition(P(n))
        fs = answering([f for _, f in facts], P(n))
        answers[n] = getattr(words, {P.NAIVE_DDP_BENCHMARKING: "a_naive_bench", P.MINIMAL_DDP_FLAT_BENCHMARKING: "a_flat",
                                     P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING: "a_individual_bench",
                                     P.DDP_BUCKETED_BENCHMARKING: "a_bucketed_bench"}[n])(fs, current)
        # the scoreboard: the current edition's run, each variant's own row at the largest context vs torch DDP
        for dev, f in facts:
            g = f.largest
            if f.run.edition != current or g is None:
                continue
            if n in steps and g.get(steps[n]) is not None:
                b = g.get(steps[n])
                scores[n] = Score(words.score_step(f, g, steps[n], ddp_label(b)), f"{ms(b.stats.median)} ms/step",
                                  str(g.ratio(steps[n], TORCH, "torch DDP") or "–"), dev, f.date)
                break
            if n == P.DDP_BUCKETED_BENCHMARKING and g.best_bucket is not None:
                b = g.buckets[g.best_bucket]
                scores[n] = Score(words.score_bucket(f, g, ddp_label(g.best_ours)), f"{ms(b.stats.median)} ms/step",
                                  str(g.ratio(("bucketed", g.best_bucket), TORCH, "torch DDP") or "–"), dev, f.date)
                break
    questions = {P.NAIVE_DDP: words.q_naive(), P.NAIVE_DDP_BENCHMARKING: words.q_naive_bench(),
                 P.MINIMAL_DDP_FLAT_BENCHMARKING: words.q_flat(),
                 P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS: words.q_individual(),
                 P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING: words.q_individual_bench(),
                 P.DDP_OVERLAP_BUCKETED: words.q_bucketed(), P.DDP_BUCKETED_BENCHMARKING: words.q_bucketed_bench()}
    return Page(slug, words.title(), [problem(n) for n in names],
                [Answer(questions[n], answers[n]) for n in names], "\n\n".join(body), score=scores,
                index_figures=index_figures[:1])


# ---- communication_accounting ---------------------------------------------------------------------


def accounting_page(ctx: Context) -> Page:
    """Closed forms (impl.accounting), the same on every device: read from the rows of
    perf/test_communication_accounting.py, which carry the computed tables."""
    name = P.COMMUNICATION_ACCOUNTING
    slug = problem(name).slug
    rows = ctx.df[ctx.df.problem == name] if not ctx.df.empty else ctx.df
    if not rows.empty:  # the same closed forms wherever they ran: one device's rows
        rows = rows[rows.device == rows.device.iloc[0]]
    by = {r.cfg.case: r["details"]["results"] for _, r in rows.iterrows()} if not rows.empty else {}
    words = macros("communication_accounting.md.j2")
    qs = [words.q_a(), words.q_b(), words.q_c(), words.q_d()]
    if "xxl" not in by:
        return Page(slug, name, [problem(name)], [Answer(q, f"{words.not_computed()}.") for q in qs],
                    "", score={name: Score(words.not_computed())})
    r = by["xxl"]
    n0 = next((x for x in r["fsdp"] if x["tokens"] == 0), r["fsdp"][0])  # the FSDP row without activations
    texts = [words.a_a(r), words.a_b(r, n0), words.a_c(r), words.a_d()]
    worked = acc_r.render(rows, "all", ctx.fig_dir, ctx.fig_rel) or ""
    body = [worked.removeprefix(f"## {name}\n\n"), words.closed_form_note()]
    score = Score(words.score_answer(r), words.score_headline(r), "–", "closed form", "–")
    return Page(slug, words.title(), [problem(name)],
                [Answer(q, t) for q, t in zip(qs, texts)], "\n\n".join(body), score={name: score})


def pages(ctx: Context) -> list[Page]:
    return [ddp_page(ctx), accounting_page(ctx)]
