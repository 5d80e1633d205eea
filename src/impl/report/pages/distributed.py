"""Pages of sections 2-3 and FSDP: distributed_communication, ddp, communication_accounting,
optimizer_sharding and fsdp (with the 2026 edition's fsdp_accounting). Tables and figures come from
the section helpers impl.report.distributed, .fsdp and .accounting; this module puts the answers
first, GPU devices only (the CPU smoke rows have their own page), and the run metadata last.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.bench.row import Metric, Status
from impl.report import accounting as acc_r
from impl.report import distributed as dr
from impl.report import figures
from impl.report import fsdp as fr
from impl.report.markdown import gib, missing, ms, table
from impl.report.per_rank_facts import per_rank_facts
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows, run_date
from impl.report.ratio import ratio, spread
from impl.report.comm_facts import comm_facts
from impl.report.ddp_facts import TORCH, ddp_facts
from impl.report.ddp_facts import label as ddp_label
from impl.report.fsdp_facts import fsdp_facts
from impl.report.sharding_facts import sharding_facts
from impl.report.rows import benches
from impl.report.runs import device_label, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem

DDP_VARIANTS = ("naive", "flat", "individual", "bucketed")


# ---- shared ------------------------------------------------------------------------------------


def measured(r) -> bool:
    return r is not None and r["status"] == Status.MEASURED.value and not missing(r["median"])


# ---- distributed_communication_single_node -------------------------------------------------------


def _comm_points(d: pd.DataFrame) -> dict[tuple[str, int], dict[int, float]]:
    """(backend, processes) -> {bytes: (bus bandwidth GB/s, seconds per all-reduce)} of the measured rows."""
    out: dict = {}
    for _, r in dr.comm_rows(d).iterrows():
        bw = dr.figure(r, "busbw_GBps", Metric.BUS_BW)
        if measured(r) and not missing(bw):
            out.setdefault((r.cfg.backend, int(r.cfg.world_size)), {})[int(r.cfg.bytes)] = (bw, dr.per_op(r))
    return out


def comm_page(ctx: Context) -> Page:
    name = "distributed_communication_single_node"
    slug = problem(name).slug
    words = macros("distributed_communication.md.j2")
    body, score, text = [], Score(NOT_ON_GPU), f"{NOT_ON_GPU}."
    for dev, d in gpu_rows(ctx, name):
        f = comm_facts(device_label(dev, d), _comm_points(d),
                       int((dr.comm_rows(d).status != Status.MEASURED.value).sum()))
        if f:
            text = words.answer(f)
            score = Score(words.score_answer(f), words.score_headline(f), words.score_vs(f), dev, run_date(d))
        body += [f"## {device_label(dev, d)}",
                 dr.allreduce_section(d, f"{slug}-{dev}", ctx.fig_dir, ctx.fig_rel), runs_line(dev, d)]
    return Page(slug, "distributed_communication_single_node: all-reduce latency and bandwidth", [problem(name)],
                [Answer(words.question(), text)], "\n\n".join(body), score={name: score})


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
        bars = ax.bar(xs, vals, width, yerr=errs, capsize=2, label=f"context {int(ctx)}, per-rank batch {int(batch)}",
                      color=f"C{k}")
        for bar, key in zip(bars, keys):
            if key[0] == "torch_ddp":
                bar.set_hatch("//")
                bar.set_edgecolor("black")
    ax.axhline(0, color="0.3", lw=0.6)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=25, ha="right", fontsize=8)
    ax.set(ylabel="step time over the single-GPU floor (%)",
           title=f"DDP overhead, ours vs torch DDP (hatched); ±1 std of both\n{caption_run}")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    figures.save(fig, path)



def _log_tail(ctx: Context, dev: str, name: str) -> str | None:
    path = ctx.reports_dir / "data" / dev / "logs" / name
    if not path.exists():
        return None
    lines = [x.strip() for x in path.read_text().splitlines() if x.strip()]
    return lines[-1] if lines else None


def ddp_page(ctx: Context) -> Page:
    slug = problem("naive_ddp").slug
    names = ["naive_ddp", "naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking",
             "ddp_overlap_individual_parameters", "ddp_overlap_individual_parameters_benchmarking",
             "ddp_overlap_bucketed", "ddp_bucketed_benchmarking"]
    # the implementation problems: answered by the correctness suite (benchmarks: their own problems)
    implemented = {"naive_ddp": "naive", "ddp_overlap_individual_parameters": "DDPIndividualParameters",
                   "ddp_overlap_bucketed": "DDPBucketed"}
    words = macros("ddp.md.j2")
    runs = gpu_rows(ctx, *dr.DDP_PROBLEMS)
    comm_runs = dict(gpu_rows(ctx, dr.COMM_PROBLEM))
    answers: dict[str, str] = {n: f"{NOT_ON_GPU}." for n in names}
    scores = {n: Score(NOT_ON_GPU) for n in names}
    body, index_figures = [], []
    steps = {"naive_ddp_benchmarking": ("naive", None), "minimal_ddp_flat_benchmarking": ("flat", None),
             "ddp_overlap_individual_parameters_benchmarking": ("individual", None)}
    for dev, d in runs:
        label, date = device_label(dev, d), run_date(d)
        bench = d[d.cfg.kind != "trace"]
        overlap = dr.overlap_shares(d)
        f = ddp_facts(label, date, benches(d), _log_tail(ctx, dev, "correctness-nccl.txt"), overlap)
        if f.log_tail:
            for n, what in implemented.items():
                answers[n] = words.a_implemented(f, what)
                scores[n] = Score("weights match single-process training", f.passed, "–", dev, "–")
        answers["naive_ddp_benchmarking"] = words.a_naive_bench(f)
        answers["minimal_ddp_flat_benchmarking"] = words.a_flat(f)
        answers["ddp_overlap_individual_parameters_benchmarking"] = words.a_individual_bench(f)
        answers["ddp_bucketed_benchmarking"] = words.a_bucketed_bench(f)
        g = f.largest  # scoreboard: each variant's own row at the largest context, against torch DDP
        if g is not None:
            for n, k in steps.items():
                b = g.get(k)
                if b is not None:
                    scores[n] = Score(words.score_step(g, k, ddp_label(b)), f"{ms(b.stats.median)} ms/step",
                                      str(g.ratio(k, TORCH, "torch DDP") or "–"), dev, date)
            if g.best_bucket is not None:
                b = g.buckets[g.best_bucket]
                scores["ddp_bucketed_benchmarking"] = Score(
                    words.score_bucket(g, ddp_label(g.best_ours)), f"{ms(b.stats.median)} ms/step",
                    str(g.ratio(("bucketed", g.best_bucket), TORCH, "torch DDP") or "–"), dev, date)
        # body
        fig_name = f"{slug}-{dev}-overhead-vs-torch-ddp.png"
        ddp_overhead_figure(bench, ctx.fig_dir / fig_name, f"{label}, run {date}")
        index_figures.append((f"DDP overhead against torch DDP ({label}, run {date})", f"{ctx.fig_rel}/{fig_name}"))
        text, data = dr.ddp_section(d)
        comm = comm_runs.get(dev)
        fits = dr.allreduce_fits(comm) if comm is not None else {}
        body += [f"## {label}", "### Our DDP against torch DDP",
                 f"![DDP overhead against torch DDP]({ctx.fig_rel}/{fig_name})", text,
                 "### ddp_bucketed_benchmarking (b): the bucket model against the measurements",
                 dr.bucket_model_section(fits, data, overlap) or "No bucketed rows.",
                 "### ddp_overlap_individual_parameters_benchmarking (b): naive vs overlapped DDP, profiler timeline",
                 dr.timeline_section(d, f"{slug}-{dev}", ctx.fig_dir, ctx.fig_rel) or "No profiled step in this run.",
                 runs_line(dev, d)]
    questions = {"naive_ddp": words.q_naive(), "naive_ddp_benchmarking": words.q_naive_bench(),
                 "minimal_ddp_flat_benchmarking": words.q_flat(),
                 "ddp_overlap_individual_parameters": words.q_individual(),
                 "ddp_overlap_individual_parameters_benchmarking": words.q_individual_bench(),
                 "ddp_overlap_bucketed": words.q_bucketed(), "ddp_bucketed_benchmarking": words.q_bucketed_bench()}
    return Page(slug, "DDP: naive, flat, overlapped, bucketed, against torch DDP", [problem(n) for n in names],
                [Answer(questions[n], answers[n]) for n in names], "\n\n".join(body), score=scores,
                index_figures=index_figures[:1])


# ---- communication_accounting ---------------------------------------------------------------------


def accounting_page(ctx: Context) -> Page:
    """Closed forms (impl.accounting), the same on every device: read from the rows of
    perf/test_communication_accounting.py, which carry the computed tables."""
    name = "communication_accounting"
    slug = problem(name).slug
    rows = ctx.df[ctx.df.problem == name] if not ctx.df.empty else ctx.df
    if not rows.empty:  # the same closed forms wherever they ran: one device's rows
        rows = rows[rows.device == rows.device.iloc[0]]
    by = {r.cfg.case: r["details"]["results"] for _, r in rows.iterrows()} if not rows.empty else {}
    qs = ["(a) How much memory do the XXL model's FP32 master weights, gradients and optimizer state take, and "
          "how many H100 80GB is that?",
          "(b) With weights, optimizer state, gradients and half the activations sharded over N_FSDP devices, how "
          "many are needed to fit 95 GB per device?",
          "(c) On TPU v5p (W_ici = 2·9e10, C = 4.6e14, M_X = 2, M_Y = 1, X = 16, Y = 4), what per-device and overall "
          "batch makes the model compute-bound?",
          "(d) How could the batch be lowered while keeping high throughput?"]
    if "xxl" not in by:
        return Page(slug, "communication_accounting", [problem(name)], [Answer(q, "not computed yet.") for q in qs],
                    "", score={name: Score("not computed yet")})
    r = by["xxl"]
    st, cb = r["state"], r["compute_bound"]
    n0 = next((x for x in r["fsdp"] if x["tokens"] == 0), r["fsdp"][0])
    texts = [
        f"{st['total'] / 1e9:,.0f} GB ({st['total'] / 2**30:,.0f} GiB) for P = {r['n_params']:,} parameters at 16 "
        f"bytes each (4 master weight + 4 gradient + 8 AdamW moments): {r['h100_needed']} H100 80GB GPUs before any "
        "activation.",
        f"Weights and state alone need N_FSDP = {n0['n_fsdp']} (M = 16P/N + A/(2N) + A/2 < 95 GB); every 1,024 tokens "
        f"add {r['activation_bytes_per_token'] * 1024 / 1e9:,.1f} GB of BF16 activations, and above "
        f"{r['fsdp_max_tokens']:,} tokens the unsharded half alone exceeds 95 GB, so no N_FSDP suffices.",
        f"T_math ≥ T_FSDP needs B/N ≥ α/(M_X·Y) = {cb['per_device_tokens']:,.1f} tokens per device "
        f"(α = C/W_ici = {cb['alpha']:,.0f}), i.e. {cb['per_device_tokens_int']} per device and "
        f"{cb['global_tokens_int']:,} tokens overall on N = {cb['n_chips']} chips; the TP condition "
        f"{'holds' if cb['tp_compute_bound'] else 'fails'} at this d_ff independently of the batch.",
        "Move ways from FSDP to tensor / sequence or pipeline parallelism (no weight re-gathers), put fewer bytes on "
        "the wire (fp8 or compressed all-gathers), keep gathered weights across gradient-accumulation micro-batches, "
        "prefetch to overlap all-gathers with the previous layer, and map sharded axes onto the fastest links "
        "(detail and the optimal-X row below).",
    ]
    worked = acc_r.render(rows, "all", ctx.fig_dir, ctx.fig_rel) or ""
    body = [worked.removeprefix("## communication_accounting\n\n"),
            "These are closed forms (impl.accounting, tested in correctness/test_accounting.py), identical on every "
            "device; they are read from the rows of perf/test_communication_accounting.py, which carry the tables."]
    score = Score(f"XXL: {r['h100_needed']} H100s for weights+state; compute-bound at "
                  f"{cb['per_device_tokens_int']} tokens/device on v5p", f"{cb['global_tokens_int']:,} tokens/step",
                  "–", "closed form", "–")
    return Page(slug, "communication_accounting: the XXL model on FSDP × TP", [problem(name)],
                [Answer(q, t) for q, t in zip(qs, texts)], "\n\n".join(body), score={name: score})


# ---- optimizer state sharding -------------------------------------------------------------------


def sharding_page(ctx: Context) -> Page:
    slug = problem("optimizer_state_sharding").slug
    names = ["optimizer_state_sharding", "optimizer_state_sharding_accounting"]
    words = macros("optimizer_sharding.md.j2")
    answers = {n: f"{NOT_ON_GPU}." for n in names}
    scores = {n: Score(NOT_ON_GPU) for n in names}
    body = []
    for dev, d in gpu_rows(ctx, dr.SHARD):
        label, date = device_label(dev, d), run_date(d)
        f = sharding_facts(label, benches(d), _log_tail(ctx, dev, "correctness-nccl-fsdp-sharding.txt"))
        if f.log_tail:
            answers["optimizer_state_sharding"] = words.a_sharding(f)
            scores["optimizer_state_sharding"] = Score("matches unsharded AdamW", f.passed, "–", dev, "–")
        if f.none is not None and f.sharded is not None:
            answers["optimizer_state_sharding_accounting"] = words.a_accounting(f)
            scores["optimizer_state_sharding_accounting"] = Score(
                words.score_answer(f), words.score_headline(f), str(f.sharded.vs(f.none, "unsharded step")), dev, date)
        body += [f"## {label}", dr.sharding_section(d) or "", words.notes(f), runs_line(dev, d)]
    qs = {"optimizer_state_sharding": words.q_sharding(), "optimizer_state_sharding_accounting": words.q_accounting()}
    return Page(slug, "Optimizer state sharding and ZeRO-1", [problem(n) for n in names],
                [Answer(qs[n], answers[n]) for n in names], "\n\n".join(x for x in body if x), score=scores)


# ---- fsdp and fsdp_accounting ----------------------------------------------------------------------


def fsdp_page(ctx: Context) -> Page:
    slug = problem("fsdp").slug
    words = macros("fsdp.md.j2")
    qa, qb, qf = words.q_a(), words.q_b(), words.q_f()
    ta = tb = tf = f"{NOT_ON_GPU}."
    scores = {"fsdp_accounting": Score(NOT_ON_GPU), "fsdp": Score(NOT_ON_GPU)}
    body = []
    for dev, d in gpu_rows(ctx, "fsdp"):
        f = fsdp_facts(dev, device_label(dev, d), run_date(d), benches(d))
        if f.saving:
            ta = words.a_a(f)
            scores["fsdp_accounting"] = Score(words.score_a(f), words.headline_a(f), words.vs_a(f), dev, f.date)
        if f.gathers:
            tb = words.a_b(f)
        if f.headline:
            tf = words.a_f(f)
            scores["fsdp"] = Score(words.score_f(f), words.headline_f(f), str(f.headline.vs_anchor), dev, f.date)
        label = f.label
        fsdp_text = fr.render(d, f"{slug}-{dev}", ctx.fig_dir, ctx.fig_rel) or ""
        body += [f"## {label}", fsdp_text.split("\n\n", 1)[1] if fsdp_text.startswith("## ") else fsdp_text,
                 runs_line(dev, d)]
    for dev, d in gpu_rows(ctx, "per_rank_memory"):
        pr = per_rank_facts(benches(d))
        if pr is None:
            continue
        rows = [[v.name.replace("_", " ")] + [gib(v.parts[k]) for k in ("parameters", "gradients", "optimizer_state",
                                                                       "activations")]
                + [gib(v.total), "–" if v.fits is None else "yes" if v.fits else "no"] for v in pr.variants]
        body += [f"## per_rank_memory: the one-GPU check of the two-GPU 2026 questions ({device_label(dev, d)})",
                 words.per_rank(pr, device_label(dev, d)),
                 table(["variant (per rank, world 2)", "parameters GiB", "gradients GiB", "optimizer state GiB",
                        "activations GiB", "total GiB", "fits this GPU"], rows), runs_line(dev, d)]
    return Page(slug, "FSDP and fsdp_accounting", [problem("fsdp_accounting"), problem("fsdp")],
                [Answer(qa, ta), Answer(qb, tb), Answer(qf, tf)], "\n\n".join(body), score=scores)


def pages(ctx: Context) -> list[Page]:
    return [comm_page(ctx), ddp_page(ctx), accounting_page(ctx), sharding_page(ctx), fsdp_page(ctx)]
