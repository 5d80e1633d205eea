"""Pages of sections 2-3 and FSDP: optimizer_sharding and fsdp (with the 2026 edition's
fsdp_accounting). Tables and figures come from the section helpers impl.report.distributed and .fsdp;
this module puts the answers first, GPU devices only (the CPU smoke rows have their own page), and
the run metadata last.
"""
from __future__ import annotations

from impl.report import distributed as dr
from impl.report import fsdp as fr
from impl.report.markdown import gb, gib, ms, num, table
from impl.report.per_rank_facts import per_rank_facts
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows
from impl.report.ratio import ratio_cell
from impl.report.pages.ddp import ROWS as DDP_ROWS, label as ddp_label
from impl.report.fsdp_facts import fsdp_facts
from impl.report.sharding_facts import sharding_facts
from impl.report.tp_facts import tp_facts
from impl.report.rows import answering, benches, current_edition, size_runs
from impl.report.runs import device_label, runs_line
from impl.report.templating import macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P
from impl.workloads.problems import StoredGroup

EDITIONS = macros("_editions.md.j2")


# ---- optimizer state sharding -------------------------------------------------------------------


def sharding_page(ctx: Context) -> Page:
    slug = problem(P.OPTIMIZER_STATE_SHARDING).slug
    names = [P.OPTIMIZER_STATE_SHARDING, P.OPTIMIZER_STATE_SHARDING_ACCOUNTING]
    words = macros("optimizer_sharding.md.j2")
    answers = {n: f"{NOT_ON_GPU}." for n in names}
    scores = {n: Score(NOT_ON_GPU) for n in names}
    current = current_edition(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)
    body, facts = [], []
    for dev, d in gpu_rows(ctx, dr.SHARD):
        label = device_label(dev, d)
        log_tail = ctx.log_tail(dev, "correctness-nccl-fsdp-sharding.txt")
        body.append(f"## {label}")
        for run in size_runs(d):  # each [edition, size] run apart: its ratios divide its own rows
            f = sharding_facts(label, run, log_tail)
            facts.append((dev, f))
            body += [EDITIONS.h_size_run(f.run, current), EDITIONS.size_run_intro(f.run),
                     dr.sharding_section(run.rows) or "", words.notes(f)]
        body.append(runs_line(dev, d))
        if log_tail:
            answers[P.OPTIMIZER_STATE_SHARDING] = words.a_sharding(facts[-1][1])
            scores[P.OPTIMIZER_STATE_SHARDING] = Score(words.score_correct(), facts[-1][1].passed, "–", dev, "–")
    fs = answering([f for _, f in facts], P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)
    if fs:
        answers[P.OPTIMIZER_STATE_SHARDING_ACCOUNTING] = words.a_accounting(fs, current)
    # the scoreboard: the newest edition's run that has both rows (labelled with its size)
    for dev, f in sorted(facts, key=lambda x: -int(x[1].run.edition)):
        if f.none is not None and f.sharded is not None:
            scores[P.OPTIMIZER_STATE_SHARDING_ACCOUNTING] = Score(
                words.score_answer(f, current), words.score_headline(f), str(f.sharded.vs(f.none, words.vs_what())), dev,
                f.run.date)
            break
    qs = {P.OPTIMIZER_STATE_SHARDING: words.q_sharding(), P.OPTIMIZER_STATE_SHARDING_ACCOUNTING: words.q_accounting()}
    return Page(slug, words.title(), [problem(n) for n in names],
                [Answer(qs[n], answers[n]) for n in names], "\n\n".join(x for x in body if x), score=scores)


# ---- fsdp and fsdp_accounting ----------------------------------------------------------------------


def _tp_section(words, f) -> str:
    """Tensor parallelism beside DDP and FSDP on one model and global batch (impl.report.tp_facts)."""
    ms_or = lambda x: ms(x) if x is not None else "–"  # noqa: E731
    side = [[words.tp_label(r.world), r.world, r.where, words.run_cell(r.run),
             ms(r.step_s, r.spread), gib(r.peak), num(r.tokens_per_s, 0), "–"] for r in f.rows]
    side += [[b.label, b.world, b.where, words.run_cell(b.run), ms(b.step_s, b.spread), gib(b.peak),
              num(b.tokens_per_s, 0), ratio_cell(b.vs_tp)] for b in f.beside]
    side += [[words.tp_label(r.world), r.world, r.where, words.run_cell(r.run),
              f"{r.bench.status.value}: {r.bench.row.reason or ''}", "", "", ""] for r in f.not_run]
    traffic = [[r.world, r.where, f"{r.counted.get('calls', '–')} / {r.closed_form_calls}",
                f"{gb(r.counted.get('payload_bytes'), 2)} / {gb(r.closed_form_bytes, 2)}", gb(r.ring_bytes_per_rank, 2)]
               for r in f.rows]
    pred = [[r.world, r.where, num(r.predicted.get("matmul_flops_per_s", 0) / 1e12, 1),
             num(r.predicted.get("allreduce_busbw_Bps", 0) / 1e9, 1), ms_or(r.predicted.get("compute_s")),
             ms_or(r.predicted.get("comm_s")), ms_or(r.predicted.get("step_s")), ms(r.step_s, r.spread),
             num(r.measured_over_predicted, 2) + "×" if r.measured_over_predicted else "–",
             f"{num(r.predicted.get('max_devices_forward'), 1)} / {num(r.predicted.get('max_devices_backward'), 1)}"]
            for r in f.rows]
    return "\n\n".join([words.h_tp(f), words.tp_intro(f), words.tp_runs(f),
                         table(words.tp_header().split("|"), side), words.tp_traffic_intro(f),
                         table(words.tp_traffic_header().split("|"), traffic), words.tp_prediction_intro(),
                         table(words.tp_prediction_header().split("|"), pred)])


def fsdp_page(ctx: Context) -> Page:
    slug = problem(P.FSDP).slug
    words = macros("fsdp.md.j2")
    current = current_edition(P.FSDP)
    scores = {P.FSDP_ACCOUNTING: Score(NOT_ON_GPU), P.FSDP: Score(NOT_ON_GPU)}
    shard_rows = dict(gpu_rows(ctx, dr.SHARD))
    body, facts = [], []
    for dev, d in gpu_rows(ctx, P.FSDP):
        label = device_label(dev, d)
        sections = []
        for run in size_runs(d):  # each [edition, size] run apart: its ratios divide its own rows
            fsdp_text = fr.render(run.rows, f"{slug}-{dev}-{run.id}", ctx.fig_dir, ctx.fig_rel,
                                  sharding=shard_rows.get(dev))
            if not fsdp_text:
                continue  # a run of TP rows only: the TP section below
            f = fsdp_facts(dev, label, run)
            facts.append((dev, f))
            sections += [EDITIONS.h_size_run(f.run, current), EDITIONS.size_run_intro(f.run),
                         fsdp_text.split("\n\n", 1)[1] if fsdp_text.startswith("## ") else fsdp_text]
        if sections:
            body += [f"## {label}", *sections, runs_line(dev, d[d.cfg.variant != "tp"])]
    fs = answering([f for _, f in facts], P.FSDP)
    ta, tb, tf = words.a_a(fs, current), words.a_b(fs, current), words.a_f(fs, current)
    # the scoreboard: the newest edition's run that has the numbers (labelled with its size)
    for dev, f in sorted(facts, key=lambda x: -int(x[1].run.edition)):
        if f.saving and scores[P.FSDP_ACCOUNTING].answer == NOT_ON_GPU:
            scores[P.FSDP_ACCOUNTING] = Score(words.score_a(f, current), words.headline_a(f), words.vs_a(f), dev,
                                              f.date)
        if f.headline and scores[P.FSDP].answer == NOT_ON_GPU:
            scores[P.FSDP] = Score(words.score_f(f, current), words.headline_f(f), str(f.headline.vs_anchor), dev,
                                   f.date)
    answers = [Answer(words.q_a(), ta), Answer(words.q_b(), tb), Answer(words.q_f(), tf)]
    tps = tp_facts(gpu_rows(ctx, P.FSDP), gpu_rows(ctx, *DDP_ROWS), fr.LABEL, ddp_label)
    if tps:
        answers.append(Answer(words.q_tp(), words.a_tp(tps)))
        body += [_tp_section(words, f) for f in tps]
        fs_score = scores[P.FSDP]
        if fs_score.answer != NOT_ON_GPU:  # the page's fsdp answers read the TP rows' devices too
            devices = dict.fromkeys([fs_score.device] + [r.run.device for f in tps for r in f.rows])
            scores[P.FSDP] = Score(fs_score.answer, fs_score.headline, fs_score.vs_anchor, " + ".join(devices),
                                   fs_score.date)
    for dev, d in gpu_rows(ctx, StoredGroup.PER_RANK_MEMORY):
        pr = per_rank_facts(benches(d))
        if pr is None:
            continue
        parts = ("parameters", "gradients", "optimizer_state", "activations")
        rows = [[v.name.replace("_", " ")] + [gib(v.parts[k]) for k in parts] + [gib(v.total), words.fits(v.fits)]
                for v in pr.variants]
        body += [words.h_per_rank(device_label(dev, d)), words.per_rank(pr, device_label(dev, d)),
                 table(words.per_rank_header().split("|"), rows), runs_line(dev, d)]
    return Page(slug, words.title(), [problem(P.FSDP_ACCOUNTING), problem(P.FSDP)], answers, "\n\n".join(body),
                score=scores)


def pages(ctx: Context) -> list[Page]:
    return [sharding_page(ctx), fsdp_page(ctx)]
