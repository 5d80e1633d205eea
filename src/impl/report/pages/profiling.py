"""Pages of section 1.1 (profiling and benchmarking) and the suite's training_step: each opens with
its questions answered in sentences whose numbers are read from the rows, then tables, figures,
method and the runs (device, date, commit). GPU devices only: the CPU smoke rows are on cpu_smoke.
"""
from __future__ import annotations


import pandas as pd

from impl import accounting as acc
from impl.bench.row import Status
from impl.workloads.sweeps import grid
from impl.model import MODEL_SIZES
from impl.report import benchmarking, checkpointing, figures, profiling, training_step
from impl.report import benchmarking_script as bs
from impl.report import mixed_precision as mp
from impl.workloads.sweeps import MODES
from impl.report.checkpointing_facts import single_level_facts
from impl.report.memory_facts import memory_2026_facts
from impl.report.nsys_facts import NsysFacts, nsys_cases, profiled
from impl.model.sizes import SizeRef
from impl.report.ratio import ratio, spread
from impl.report.rows import benches, size_label
from impl.report.templating import macros
from impl.report.benchmarking import step_s, study
from impl.report.markdown import gb, gib, mib, missing, ms, num, pct, table
from impl.report.output import figure_path, write_table_csv
from impl.report.pages import NOT_ON_GPU, Answer, Context, Page, Score, gpu_rows, missing_page, run_date
from impl.report.runs import device_short, runs_line
from impl.report.pages.problems import problem

MEASURED, OOM = Status.MEASURED.value, Status.OOM.value


# ------------------------------------------------------------------------------------ shared
def _i(x):
    return int(x) if not missing(x) else x


# ------------------------------------------------------------------------------ benchmarking_script
def _mean_cell(c: bs.Cell | None) -> str:
    if c is None:
        return "–"
    if c.ok:
        return ms(c.mean_s, c.std_s)
    if c.status is Status.OOM:
        return "OOM" + (f" (needs {c.need_bytes / 1e9:.0f} GB)" if c.need_bytes else "")
    return c.status.value.replace("_", " ")


def _grid_tables(e: bs.EditionFacts) -> str:
    out = []
    for dtype in dict.fromkeys(r.dtype for r in e.grid):
        rows = [r for r in e.grid if r.dtype == dtype]
        modes = [m for m in MODES if any(m in r.modes for r in rows)]
        train = any(r.train is not None for r in rows)  # the 2026 grid times the parts, not the whole step
        body = [[r.size, r.context] + [_mean_cell(r.modes.get(m)) for m in modes] + ([
            num(r.train.tokens_per_s, 0) if r.train and r.train.ok else "–",
            pct(r.train.mfu_measured_peak) if r.train and r.train.ok else "–",
            "–" if r.train is None else gib(r.train.peak_bytes) if r.train.ok else _mean_cell(r.train)] if train else [])
            for r in rows]
        header = ["size", "context"] + [f"{m} (ms)" for m in modes] + (
            ["train tokens/s", "train MFU", "train peak GiB"] if train else [])
        out.append(f"**{dtype}** (mean ± std over the timed steps)\n\n" + table(header, body))
    return "\n\n".join(out)


def _warmup_table(e: bs.EditionFacts, left_out: str) -> str:
    parts = any(x.first_parts for c in e.warmup for x in c.by_warmup.values())
    rows = [[c.size, c.context, c.dtype, c.mode, w, _mean_cell(x), ms(x.first_s), ms(x.max_s)] + (
            [" / ".join(ms(x.first_parts.get(k)) for k in ("forward", "backward", "optimizer")) if x.first_parts
             else "–"] if parts else [])
            for c in e.warmup for w, x in c.by_warmup.items()]
    return table(["size", "context", "dtype", "mode", "warm-up steps", "mean ± std (ms)", "first timed step (ms)",
                  "slowest timed step (ms)"] + (["first step: forward / backward / optimizer (ms)"] if parts else []),
                 rows) + (f"\n\nNot run in this study: {left_out}." if left_out else "")


def benchmarking_script_page(ctx: Context) -> Page:
    slug = name = "benchmarking_script"
    words = macros("benchmarking_script.md.j2")
    qs = [words.q_b(), words.q_c(), words.q_opt()]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, name, [name], qs)
    body, answers, score = [], None, None
    for device, d in found:
        f = bs.benchmarking_script_facts(device, benches(d))
        if answers is None:  # the first (one-GPU) device answers; every device's tables follow
            answers = [Answer(qs[0], words.a_b(f)), Answer(qs[1], words.a_c(f)), Answer(qs[2], words.a_opt(f))]
            head, e26 = f.headline, f.editions[-1]
            score = Score(NOT_ON_GPU) if head is None else Score(
                words.score_answer(*head), words.score_headline(*head), "–", device, run_date(d))
            if e26.fwd_bwd is not None:  # a problem of both editions: the index reads the newer one's rows
                d26 = d[d.cfg.edition == e26.edition]
                score = Score(words.score_answer_fb(e26, e26.fwd_bwd[1]), words.score_headline_fb(e26, e26.fwd_bwd[1]),
                              "–", device, run_date(d26))
        body.append(f"## {device}")
        for e in (e for e in f.editions if e.measured):
            ed = d[d.cfg.edition.fillna("2025").astype(str) == e.edition]
            main = ed[ed.apply(study, axis=1).isin(["main", "main_2026"])]
            warm_n, rounds_n = benchmarking.timing_text(main)
            peaks = next((p for p in main["row"].map(lambda row: row.peaks) if p is not None), None)
            peak = ("–" if peaks is None else f"{num(peaks.measured_flops / 1e12, 2)} TFLOP/s ({peaks.measured_dtype}, "
                    f"{peaks.measured_n}³)")
            body += [f"### (b) timings, {e.edition} sizes", words.grid_intro(e, warm_n, rounds_n, peak), _grid_tables(e)]
            if any(r.train is not None for r in e.grid):
                stem = f"{device}-train-step" + ("" if e.edition == "2025" else f"-{e.edition}")
                path, link = figure_path(ctx.fig_dir, ctx.fig_rel, slug, stem)
                benchmarking.plot(e.grid, path)
                body.append(f"![train step vs context]({link})\n\n*Training step time (mean) against context, "
                            f"{device}, runs of {run_date(main)}.*")
            if e.warmup:
                warm = ed[ed.apply(study, axis=1).isin(["warmup", "warmup_fresh_process"])]
                body += [f"### (c) warm-up steps, {e.edition} sizes", words.warmup_intro(e),
                         _warmup_table(e, warm["details"].iloc[0].get("left_out", "") if not warm.empty else "")]
        body.append(runs_line(device, d))
    return Page(slug, name, [problem(name)], answers, "\n\n".join(body), score={name: score})


# ------------------------------------------------------------------------------------ nsys_profile
def _nsys_ok(d: pd.DataFrame) -> pd.DataFrame:
    return d[(d["status"] == MEASURED) & d["details"].map(lambda i: bool(i.get("nsys")))]


def nsys_page(ctx: Context) -> Page:
    slug, name = "nsys_profile", "nsys_profile"
    words = macros("nsys_profile.md.j2")
    qs = [words.q_a(), words.q_b(), words.q_c(), words.q_d(), words.q_e()]
    found = gpu_rows(ctx, name)
    if not found or _nsys_ok(found[0][1]).empty:
        return missing_page(slug, "nsys_profile", [name], qs)
    device, d_all = found[0]
    in_2026 = d_all.cfg.edition.astype(str) == "2026"
    d, d26 = d_all[~in_2026], d_all[in_2026]
    if _nsys_ok(d).empty:  # only 2026 rows: they answer alone
        d, d26 = d26, d26.iloc[0:0]

    def facts(rows: pd.DataFrame) -> NsysFacts:
        ok = profiling.sorted_by(_nsys_ok(rows), "cfg.context")
        return NsysFacts([profiled(f"{size_label(b.cfg.size_ref, b.cfg.size)} at context {b.cfg.context}",
                                   step_s(line), b.details["nsys"])
                          for (_, line), b in zip(ok.iterrows(), benches(ok))])
    f = facts(d)
    makers = (words.a_a, words.a_b, words.a_c, words.a_d, words.a_e)
    answers = [Answer(q, a(f)) for q, a in zip(qs, makers)]
    body = [f"## {device}", profiling.nsys_body(d)]
    score = Score(words.score_answer(f), words.score_headline(f), "–", device, run_date(d))
    if not _nsys_ok(d26).empty:
        f26, cases = facts(d26), nsys_cases(benches(d26))
        e25 = d.iloc[0].cfg.edition or "2025"
        sizes = lambda fx: sorted({c.config.split(" at ")[0] for c in fx.configs})  # noqa: E731
        for i, (q, a) in enumerate(zip(qs, makers)):
            extra = words.a_b_cases(cases) if i == 1 else ""
            answers[i] = Answer(q, f"{words.edition_head(e25, sizes(f))} {a(f)}\n\n"
                                   f"{words.edition_head('2026', sizes(f26))} {a(f26)}" + (f" {extra}" if extra else ""))
        rows = [[c.size, c.context, ms(c.forward_ms / 1e3, c.forward_std_ms / 1e3 if c.forward_std_ms else None),
                 num(c.kernel_ms, 1), f"`{c.top_name[:60]}`", c.top_calls, "yes" if c.top_stays else "no"]
                if c.measured else [c.size, c.context, "OOM" + (f" (needs {c.need_bytes / 1e9:.0f} GB)"
                                                                 if c.need_bytes else ""), "–", "–", "–", "–"]
                for c in cases]
        body += ["### 2026 sizes: " + ", ".join(dict.fromkeys(c.size for c in cases)),
                 words.cases_intro("2026", [c for c in cases if not c.measured and c.need_bytes]),
                 table(["size", "context", "forward (ms)", "forward kernels (ms)", "top forward kernel",
                        "calls per forward", "top for fwd+bwd"], rows)]
        score = Score(words.score_answer_2026(f26), words.score_headline(f26), "–", device, run_date(d26))
    body.append(runs_line(device, d_all))
    return Page(slug, "nsys_profile", [problem(name)], answers, "\n\n".join(x for x in body if x), score={name: score})


# ---------------------------------------------------------------------------------- mixed precision
def mixed_precision_page(ctx: Context) -> Page:
    slug = "mixed_precision"
    names = ["mixed_precision_accumulation", "benchmarking_mixed_precision"]
    words = macros("mixed_precision.md.j2")
    qs = [words.q_acc(), words.q_a(), words.q_b(), words.q_c()]
    found = gpu_rows(ctx, *names, "benchmarking_script")
    if not found:
        return missing_page(slug, "mixed_precision", names, qs)
    device, d = found[0]
    rows = benches(d)
    f = mp.mixed_precision_facts(rows, bs.benchmarking_script_facts(device, rows).editions)
    not_yet = f"{NOT_ON_GPU.capitalize()}."
    answers = [Answer(qs[0], words.a_acc(f.accumulation) if f.accumulation else not_yet),
               Answer(qs[1], words.a_a(f.dtypes) if f.dtypes else not_yet),
               Answer(qs[2], words.a_b(f.dtypes) if f.dtypes else not_yet),
               Answer(qs[3], words.a_c(f) if f.headline or f.headline_fb else not_yet)]
    date = lambda problem: run_date(d[d.problem == problem])  # noqa: E731
    score = {names[0]: Score(words.score_acc(f.accumulation), words.headline_acc(f.accumulation), "–", device,
                             date(names[0])) if f.accumulation else Score(NOT_ON_GPU),
             names[1]: Score(words.score_c(f.headline), words.headline_c(f.headline), "–", device,
                             date("benchmarking_script")) if f.headline else Score(NOT_ON_GPU)}
    if f.headline_fb is not None and (f.headline is None or f.headline_fb.edition > f.headline.edition):
        d26 = d[(d.problem == "benchmarking_script") & (d.cfg.edition == f.headline_fb.edition)]
        score[names[1]] = Score(words.score_fb(f.headline_fb), words.headline_fb(f.headline_fb), "–", device,
                                run_date(d26))
    body = [f"## {device}"]
    if f.accumulation:
        body += ["### mixed_precision_accumulation", words.body_acc(f.accumulation)]
    if f.dtypes:
        body += ["### benchmarking_mixed_precision (a), (b)", words.body_dtypes(f.dtypes)]
    for t in f.trends:
        if t.train():
            body += [f"### benchmarking_mixed_precision (c), {t.edition} sizes", words.body_c(t)]
        elif t.largest_fb:
            body += [f"### benchmarking_mixed_precision (c), {t.edition} sizes", words.body_c_fb(t)]
    body.append(runs_line(device, d))
    return Page(slug, "mixed_precision: accumulation and bf16 autocast", [problem(n) for n in names], answers,
                "\n\n".join(body), score=score)


# ---------------------------------------------------------------------------------- memory_profiling
def _shape_labels(m, batch: int, context: int, dtype: str) -> dict[int, str]:
    """Allocation sizes in bytes → what tensors of the model have that size, for naming the largest
    allocations: fp32 only in an fp32 row (nothing is half precision there), fp32 and bf16 under
    autocast; two tensors of one size are both named (xl (2025): fp32 logits at context 128 = bf16 FFN
    weight). `m`: the row's ModelConfig (its SizeRef's)."""
    out: dict[int, list[str]] = {}
    for nbytes, kind in ((4, "fp32"), (2, "bf16")) if dtype == "bf16" else ((4, "fp32"),):
        for n, what in ((m.d_model * m.d_ff, "FFN-weight-sized (d_model × d_ff)"),
                        (m.vocab_size * m.d_model, "embedding / LM-head-sized (vocab × d_model)"),
                        (m.d_model * m.d_model, "attention-projection-sized (d_model²)"),
                        (batch * m.num_heads * context * context, "attention scores (batch × heads × ctx²)"),
                        (batch * context * m.d_ff, "FFN hidden (batch × ctx × d_ff)"),
                        (batch * context * m.vocab_size, "logits (batch × ctx × vocab)"),
                        (batch * context * m.d_model, "residual-stream-sized (batch × ctx × d_model)")):
            out.setdefault(n * nbytes, []).append(f"{kind}, {what}")
    return {n: " or ".join(labels) for n, labels in out.items()}


def _phase_levels(t: dict) -> dict[str, tuple[float, float, float]]:
    """phase name -> (bytes at its start, its max, at its end) from a timeline's markers."""
    x, y, marks = t["x"], t["y"], t.get("markers", [])
    out = {}
    for k, m in enumerate(marks[:-1]):
        ys = [v for xi, v in zip(x, y) if m["x"] <= xi < marks[k + 1]["x"]]
        if ys:
            out[m["name"]] = (ys[0], max(ys), ys[-1])
    return out


def memory_page(ctx: Context) -> Page:
    slug, name = "memory_profiling", "memory_profiling"
    qs = ["(a) What do the active-memory timelines of a forward and of a full training step show?",
          "(b) Peak memory, forward against a full training step?",
          "(c) The same under bf16 autocast?",
          "(d) How large is the residual stream, and is it found among the allocations?",
          "(e) Which are the largest allocations, and where do they come from?"]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, "memory_profiling", [name], qs + QS_2026)
    device, d_all = found[0]
    d_all = profiling.sorted_by(d_all, "cfg.context", "cfg.dtype", "cfg.mode")
    in_2026 = d_all.cfg.edition == "2026"
    earlier = ~in_2026 & d_all.apply(lambda r: (r.cfg.size, _i(r.cfg.context)) in CASES_2026, axis=1)
    d, d26, d_old = d_all[~in_2026 & ~earlier], d_all[in_2026], d_all[earlier]
    if d.empty:
        return missing_page(slug, "memory_profiling", [name], qs + QS_2026)
    ok = d[d["status"] == MEASURED]
    ref = ok.iloc[0].cfg.size_ref
    size, m = size_label(ref), ref.config
    param_b = m.params * 4
    G = 2**30

    def sel(dtype, mode):
        return ok[(ok.cfg.dtype == dtype) & (ok.cfg.mode == mode)].sort_values("cfg.context")
    train, fwd = sel("fp32", "train_step"), sel("fp32", "forward")
    ctxs = [_i(c) for c in train.cfg.context]
    answers = []
    # (a) from the timelines' phase levels
    tl = {(_i(r.cfg.context), r.cfg.dtype, r.cfg.mode): _phase_levels(r["details"]["snapshot"]["timeline"])
          for _, r in ok.iterrows() if r["details"].get("snapshot")}
    last = ctxs[-1]
    tr = tl.get((last, "fp32", "train_step"), {})
    fw = tl.get((last, "fp32", "forward"), {})
    if tr and fw and {"forward", "backward", "optimizer"} <= set(tr):
        spikes = [v["optimizer"][1] - v["optimizer"][0] for k, v in tl.items() if k[2] == "train_step" and "optimizer" in v]
        answers.append(Answer(qs[0], (
            f"Forward only ({size}, fp32, context {last}): memory sits at {fw['forward'][0] / G:.1f} GiB, the "
            f"parameters ({param_b / G:.1f} GiB), and the forward adds only {(fw['forward'][1] - fw['forward'][0]) / G:.2f} "
            "GiB on top: without autograd each activation is freed once used. Training step: from "
            f"{tr['forward'][0] / G:.1f} GiB (parameters and AdamW's two moments) the forward stacks saved activations "
            f"to {tr['forward'][1] / G:.1f} GiB, backward frees them as it makes the gradients (ending at "
            f"{tr['backward'][2] / G:.1f} GiB), and the optimizer step spikes by "
            f"{min(spikes) / G:.1f}–{max(spikes) / G:.1f} GiB before settling.")))
    else:
        answers.append(Answer(qs[0], "No timeline recorded on a GPU yet."))
    # (b), (c) peaks
    peaks = {(_i(r.cfg.context), r.cfg.dtype, r.cfg.mode): r["peak_alloc"] for _, r in ok.iterrows()}
    tp = [peaks[(c, "fp32", "train_step")] for c in ctxs]
    fp_ = [peaks.get((c, "fp32", "forward")) for c in ctxs]
    fwd_peak = {c: v["forward"][1] for (c, dt, mo), v in tl.items() if mo == "train_step" and dt == "fp32" and "forward" in v}
    flat = (f"The training-step peak is flat across contexts ({min(tp) / G:.1f}–{max(tp) / G:.1f} GiB) because it is "
            f"the optimizer step's: parameters, gradients and both moments ({4 * param_b / G:.1f} GiB, 4 × "
            f"{param_b / G:.1f}) plus one more parameter-sized fp32 temporary (`torch._foreach_sqrt` of the second "
            f"moment, the denominator of the update: {param_b / G:.1f} GiB), {5 * param_b / G:.1f} GiB in all; the "
            "activations are gone by then, and the forward's own peak stays below it "
            f"({', '.join(f'{fwd_peak[c] / G:.1f}' for c in ctxs if c in fwd_peak)} GiB at contexts "
            f"{', '.join(str(c) for c in ctxs if c in fwd_peak)}).")
    answers.append(Answer(qs[1], (
        f"{size}, fp32: forward {min(x for x in fp_ if x) / G:.1f}–{max(x for x in fp_ if x) / G:.1f} GiB against "
        f"{min(tp) / G:.1f}–{max(tp) / G:.1f} GiB for a training step (contexts {', '.join(map(str, ctxs))}). " + flat)))
    bt = [peaks.get((c, "bf16", "train_step")) for c in ctxs]
    bf = [peaks.get((c, "bf16", "forward")) for c in ctxs]
    if all(bt) and all(bf):
        answers.append(Answer(qs[2], (
            f"Under bf16 autocast: forward {min(bf) / G:.1f}–{max(bf) / G:.1f} GiB, training step "
            f"{min(bt) / G:.1f}–{max(bt) / G:.1f} GiB, within {max(abs(a - b) for a, b in zip(bt, tp)) / G:.2f} GiB of "
            "fp32: the fp32 master weights, gradients and optimizer state dominate, and the activations autocast "
            "halves are partly offset by its bf16 copies of the weights.")))
    else:
        answers.append(Answer(qs[2], f"{NOT_ON_GPU.capitalize()}."))
    # (d) residual stream
    r0 = ok.iloc[0]
    res = (r0["details"].get("snapshot") or {}).get("residual", {})
    if "4" in res:
        answers.append(Answer(qs[3], (
            f"batch × context × d_model × 4 B = {_i(r0.cfg.batch)} × {_i(r0.cfg.context)} × {m.d_model} × 4 = "
            f"{res['4']['bytes'] / 2**20:.2f} MiB at context {_i(r0.cfg.context)}; allocations of exactly that size "
            f"{'were found' if res['4']['found'] else 'were not found'} ({res['4']['count']} in the recorded step, first "
            f"made at `{(res['4']['frames'] or ['–'])[0]}`). It doubles with the context (table below).")))
    else:
        answers.append(Answer(qs[3], "Not recorded."))
    # (e) largest allocations, named by shape
    big_rows, e_text = _largest(ok)
    answers.append(Answer(qs[4], e_text))
    body = [f"## {device}", "### peak memory\n\nAllocated / reserved GiB (train step = forward, backward, "
            "AdamW step, optimizer state included):\n\n" + _peak_table(d_all)]
    figs = []
    for mode in ("forward", "train_step"):
        for dtype in ("fp32", "bf16"):
            g = d[(d.cfg.mode == mode) & (d.cfg.dtype == dtype) & d["details"].map(lambda i: bool(i.get("snapshot")))]
            if g.empty:
                continue
            path, link = figure_path(ctx.fig_dir, ctx.fig_rel, slug, f"{device}-{mode}-{dtype}")
            figures.memory_timelines([(f"context {_i(r.cfg.context)}", r["details"]["snapshot"]["timeline"])
                                      for _, r in g.iterrows()], path,
                                     f"{size} {dtype} {mode.replace('_', ' ')}: active memory ({device}, {run_date(g)})")
            figs.append(f"![{mode} {dtype}]({link})")
    if figs:
        body.append("### (a) timelines\n\nActive memory over one recorded step, rebuilt from the downsampled "
                    "timeline in the JSON (x = allocator event index; shaded = phases marked by the suite; y from "
                    "zero).\n\n" + "\n\n".join(figs))
    body.append("### (d) residual stream\n\n" + _residual_table(ok))
    if big_rows:
        body.append(big_rows)
    art = [i["snapshot"]["artifact"] for i in d["details"] if i.get("snapshot") and i["snapshot"].get("artifact")]
    if art:
        body.append(f"Raw snapshot saved as artifact `{art[0]}` (drag onto pytorch.org/memory_viz).")
    m26 = memory_2026_facts(benches(d26))
    if m26 is not None and any(c.measured for c in m26.cases):
        for i, more in enumerate((MEM26.a_timeline, MEM26.a_peaks, MEM26.a_bf16, MEM26.a_residual, MEM26.a_largest)):
            if i == 4 and m26.largest is None:
                continue
            answers[i] = Answer(answers[i].question, f"**{size} (2025 rows):** {answers[i].text}\n\n{more(m26)}")
        answers.append(Answer(MEM26.q_f(), MEM26.a_block(m26)))
        body.append(_memory_2026_body(ctx, slug, device, m26, d26))
    else:
        a26, b26 = _memory_2026(d26, d_old)
        answers += a26
        if b26:
            body.append(b26)
    body.append(runs_line(device, d_all))
    score = Score(f"{size} training-step peak {min(tp) / G:.1f}–{max(tp) / G:.1f} GiB, flat over contexts (optimizer "
                  "step)", f"{max(tp) / G:.1f} GiB peak (fp32 train step)", "–", device_short(device), run_date(d))
    if m26 is not None and any(c.measured for c in m26.cases):  # a problem of both editions: the newer one's rows
        score = Score(MEM26.score_2026(m26), MEM26.headline_2026(m26), "–", device_short(device), run_date(d26))
    return Page(slug, "memory_profiling", [problem(name)], answers, "\n\n".join(body), score={name: score})


# The 2026 edition's variant: xl at contexts 128 and 2048 (the sweep table's cases_2026).
CASES_2026 = set(grid("memory_profiling", "full").cases_2026)
MEM26 = macros("memory_profiling.md.j2")
QS_2026 = ["(2026 a) xl (2026) at contexts 128 and 2048: peak memory of the forward and of a full training step, "
           "with and without bf16 autocast?",
           "(2026 b) xl (2026)'s residual stream, and the largest allocations?"]


def _memory_2026(d: pd.DataFrame, earlier: pd.DataFrame, heading: str = "2026 edition"
                 ) -> tuple[list[Answer], str | None]:
    """The 2026 questions from the 2026 edition's rows at CASES_2026: peaks (OOM explained by the
    closed-form activation bytes against the fp32 training state), residual stream, largest
    allocations. Without such rows the answers say so; rows of an earlier grid at those contexts
    (the 2025 table's xl, another model) are shown under their own label, never as the answer."""
    asked = size_label(SizeRef("2026", "xl"))
    if d.empty:
        old = sorted({size_label(r.cfg.size_ref, r.cfg.size) for _, r in earlier.iterrows()})
        text = MEM26.no_rows(asked, old, sorted({_i(c) for c in earlier.cfg.context}))
        answers = [Answer(q, text) for q in QS_2026]
        if earlier.empty:
            return answers, None
        return answers, _memory_2026(earlier, earlier.iloc[0:0], "An earlier grid's rows (not the 2026 size)")[1]
    G = 2**30
    ref = d.iloc[0].cfg.size_ref
    size, m = size_label(ref), ref.config
    batch = _i(d.cfg.batch.iloc[0])
    state = acc.training_state_bytes(m.params)  # fp32 parameters, gradients and AdamW's two moments

    def peak(c, dtype, mode):
        s = d[(d.cfg.context == c) & (d.cfg.dtype == dtype) & (d.cfg.mode == mode)]
        if s.empty:
            return "not run"
        r = s.iloc[0]
        return (f"{r['peak_alloc'] / G:.1f} GiB" if r["status"] == MEASURED
                else "OOM" if r["status"] == OOM else r["status"].replace("_", " "))
    parts = []
    for c in sorted({_i(c) for c in d.cfg.context}):
        acts = acc.checkpoint_terms(batch, c, m.d_model, m.d_ff, m.num_heads, m.vocab_size)
        saved = m.num_layers * acts["a_block"] + acts["a_outside"]
        parts.append(
            f"context {c}: forward {peak(c, 'fp32', 'forward')} (fp32) / {peak(c, 'bf16', 'forward')} (bf16 "
            f"autocast), training step {peak(c, 'fp32', 'train_step')} / {peak(c, 'bf16', 'train_step')}; the fp32 "
            f"closed form puts the activations saved for backward at {saved / G:.1f} GiB on top of "
            f"{state / G:.1f} GiB of fp32 parameters, gradients and moments")
    a = Answer(QS_2026[0], f"{size}, batch {batch}: " + "; ".join(parts) + ". A training step at a context "
               "whose saved activations and state exceed the GPU's memory is an OOM whatever the autocast: "
               "autocast halves the matmul outputs, not the fp32 residual stream or the naive attention's "
               "softmax, and adds bf16 copies of the weights.")
    ok = d[d["status"] == MEASURED]
    res = []
    for _, r in ok[(ok.cfg.mode == "forward") & (ok.cfg.dtype == "fp32")].iterrows():
        x = ((r["details"].get("snapshot") or {}).get("residual") or {}).get("4")
        if x:
            res.append(f"{_i(r.cfg.batch)} × {_i(r.cfg.context)} × {m.d_model} × 4 B = "
                       f"{x['bytes'] / 2**20:.2f} MiB ({'found' if x['found'] else 'not found'} among the "
                       f"allocations, {x['count']} times)")
    big_rows, e_text = _largest(ok)
    b = Answer(QS_2026[1], ("Residual stream (fp32): " + "; ".join(res) + ". " if res else "") + e_text)
    body = [f"### {heading}: {size} at contexts {', '.join(str(c) for c in sorted({_i(c) for c in d.cfg.context}))}",
            "Peaks are in the table above. " + _residual_table(ok)]
    if big_rows:
        body.append(big_rows)
    return [a, b], "\n\n".join(body)


def _memory_2026_body(ctx: Context, slug: str, device: str, m, d26: pd.DataFrame) -> str:
    """The 2026 section: timelines (zoomed, block starts marked), peaks with OOM needs, residual stream,
    the block probe's saved ops and gradients."""
    out = [f"### 2026 edition: {m.size}, batch {m.batch}, contexts {', '.join(map(str, m.contexts))}"]
    for mode in ("forward", "train_step"):
        panels = [(f"{c.dtype}, context {c.context}", c.timeline) for c in m.cases if c.mode == mode and c.timeline]
        if not panels:
            continue
        path, link = figure_path(ctx.fig_dir, ctx.fig_rel, slug, f"{device}-2026-{mode}")
        figures.memory_timelines(panels, path, f"{m.size} {mode.replace('_', ' ')}: active memory ({device}, "
                                 f"{run_date(d26)})", from_zero=False)
        out.append(f"![{mode} 2026]({link})\n\n*Active memory of one recorded {mode.replace('_', ' ')} of {m.size} "
                   "(x = allocator event index, y zoomed on each panel's range; grey ticks = a block's start, "
                   "shaded = the phases marked by the suite).*")
    rows = [[c.context, c.dtype, c.mode.replace("_", " "),
             gib(c.peak_bytes) if c.measured else ("OOM" if c.status is Status.OOM else c.status.value),
             gib(c.reserved_bytes) if c.measured else "–", gb(c.need_bytes, 0) if c.need_bytes else "–"]
            for c in m.cases]
    out.append("**(b), (c) peaks** (allocated; the closed form: the parameters for a forward, the fp32 training "
               "step's whole need for a step)\n\n" + table(["context", "dtype", "mode", "peak allocated GiB",
                                                              "peak reserved GiB", "closed-form need GB"], rows))
    rows = [[c.context, c.dtype, mib(a["size"]), a["count"], " ← ".join(f"`{x}`" for x in a["frames"][:2])]
            for c in m.cases if c.mode == "forward" for a in [x for x in c.largest if x.get("frames")][:3]]
    if rows:
        out.append("**(e) largest allocations of the forward** (the three largest sizes with a stack trace)\n\n"
                   + table(["context", "dtype", "size MiB", "count", "made at"], rows))
    rows = [[r.context, f"{r.batch} × {r.context} × {r.d_model} × {r.bytes_per_elem} B", f"{r.mib:.2f}",
             "yes" if r.found else "no", r.count if r.count is not None else "–", f"`{r.made_at or '–'}`"]
            for r in m.residuals]
    out.append("**(d) residual stream** (fp32)\n\n" + table(["context", "derivation", "MiB", "found", "allocations",
                                                               "first made at"], rows))
    rows = [[p.context, p.dtype, mib(p.saved_bytes)] + [f"`{o.op}` ({o.module}) {mib(o.nbytes)} MiB, {pct(o.share)}"
                                                        for o in p.top[:5]] + [pct(p.top_share)] for p in m.probes]
    out.append("**(f) one block's saved tensors** (block " + str(m.probes[0].block if m.probes else "–") + ", top 5 "
               "ops by bytes saved for backward)\n\n" + table(
                   ["context", "dtype", "saved MiB", "1st", "2nd", "3rd", "4th", "5th", "top 5 share"], rows))
    rows = [[p.context, p.dtype, mib(p.saved_bytes), ", ".join(mib(x) for x in p.backward_change_bytes),
             mib(p.grad_from_change), mib(p.grad_bytes_measured), mib(p.grad_bytes_expected),
             f"{p.grad_over_expected:.3f}"] for p in m.probes]
    out.append("**(f) gradients per block** (backward change per probed block + the saved bytes it frees, against "
               "4 B × the block's parameters)\n\n" + table(
                   ["context", "dtype", "saved MiB", "backward change per block MiB", "gradients (change + saved) MiB",
                    "gradients measured MiB", "4 B × params MiB", "measured ÷ predicted"], rows))
    return "\n\n".join(out)


def _peak_table(d: pd.DataFrame) -> str:
    rows = []
    for (size, c), g in d.groupby([d.cfg.size, d.cfg.context], sort=False):
        row = [size_label(g.iloc[0].cfg.size_ref, size), _i(c)]
        for dtype in ("fp32", "bf16"):
            for mode in ("forward", "train_step"):
                s = g[(g.cfg.dtype == dtype) & (g.cfg.mode == mode)]
                if s.empty:
                    row.append("–")
                    continue
                r = s.iloc[0]
                row.append(f"{gib(r['peak_alloc'])} / {gib(r['row'].memory.peak_reserved)}" if r["status"] == MEASURED
                           else "OOM" if r["status"] == OOM else r["status"].replace("_", " "))
        rows.append(row)
    return table(["size", "context", "fp32 forward", "fp32 train step", "bf16 forward", "bf16 train step"], rows)


def _residual_table(ok: pd.DataFrame) -> str:
    rows = []
    for _, r in ok[ok.cfg.mode == "forward"].iterrows():
        for b, x in ((r["details"].get("snapshot") or {}).get("residual") or {}).items():
            rows.append([_i(r.cfg.context), r.cfg.dtype, f"{b} B/elem", f"{x['bytes'] / 2**20:.2f}",
                         "yes" if x["found"] else "no", x["count"], f"`{(x['frames'] or ['–'])[0]}`"])
    return ("batch · context · d_model · bytes per element, looked up as an exact allocation size in the recorded "
            "forward (4 bytes: the fp32 residual stream, also under autocast; 2 bytes: half-precision outputs of "
            "the same shape):\n\n" + table(["context", "dtype", "element", "MiB", "found", "allocations",
                                             "first made at"], rows))


def _largest(ok: pd.DataFrame) -> tuple[str | None, str]:
    """(the largest-allocations tables of the forward rows at the shortest context, (e)'s answer)."""
    c0 = ok.cfg.context.min()
    parts, facts = [], []
    for _, r in ok[(ok.cfg.context == c0) & ~((ok.cfg.dtype == "bf16") & (ok.cfg.mode == "train_step"))].iterrows():
        # entries without frames repeat ones with frames (their frames were not kept): left out
        big = [b for b in (r["details"].get("snapshot") or {}).get("largest") or [] if b["frames"]][:6]
        if not big:
            continue
        labels = _shape_labels(r.cfg.size_ref.config, _i(r.cfg.batch), _i(r.cfg.context), r.cfg.dtype)
        rows = [[f"{b['size'] / 2**20:.1f}", b["count"], labels.get(b["size"], "–"),
                 " ← ".join(b["frames"][:2])] for b in big]
        parts.append(f"**{r.cfg.dtype} {r.cfg.mode.replace('_', ' ')}, context {_i(c0)}**\n\n"
                     + table(["size (MiB)", "count", "tensor of that size", "made at"], rows))
        if r.cfg.mode == "forward" and r.cfg.dtype == "bf16":
            m = r.cfg.size_ref.config
            ffn = [b for b in big if b["size"] == m.d_model * m.d_ff * 2]
            if ffn:
                facts.append(f"in the bf16 forward the {ffn[0]['size'] / 2**20:.0f} MiB allocations ({ffn[0]['count']} of "
                             f"them = 3 FFN weights × {m.num_layers} blocks) are autocast's bf16 copies of the FFN "
                             f"weights ({m.d_model} × {m.d_ff} × 2 B), made at each Linear call "
                             f"(`{(ffn[0]['frames'] or ['–'])[0]}`)")
        if r.cfg.mode == "train_step" and r.cfg.dtype == "fp32":
            opt = [b for b in big if any("optim" in f for f in b["frames"])]
            if opt:
                facts.append(f"in the training step the largest are the optimizer's parameter-sized temporaries "
                             f"({opt[0]['size'] / 2**20:.0f} MiB × {opt[0]['count']}, `{opt[0]['frames'][0]}`)")
        if r.cfg.mode == "forward" and r.cfg.dtype == "fp32":
            facts.append(f"in the fp32 forward the largest are activations ({big[0]['size'] / 2**20:.0f} MiB: "
                         f"{labels.get(big[0]['size'], 'unnamed')})")
    text = ("At context " + str(_i(c0)) + ": " + "; ".join(facts) + ". Sizes are matched to the model's tensor "
            "shapes in the tables below." if facts else "No allocation trace recorded.")
    return ("### (e) largest allocations\n\n" + "\n\n".join(parts)) if parts else None, text


# ---------------------------------------------------------------------------- gradient_checkpointing
def checkpointing_page(ctx: Context) -> Page:
    slug, name = "gradient_checkpointing", "gradient_checkpointing"
    words = macros("gradient_checkpointing.md.j2")
    qs = [words.q_a(), words.q_b()]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, "gradient_checkpointing", [name], qs)
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
        none_txt = ("runs out of memory" if n0 is not None and n0["status"] == OOM else
                    f"peaks at {gib(n0['peak_alloc'])} GiB" if n0 is not None else "was not run")
        layers = r.cfg.size_ref.config.num_layers if r.cfg.size_ref else "–"
        answers.append(Answer(qs[0], words.a_nested(
            r["peak_alloc"], r.cfg.dtype, label(r), _i(r.cfg.context), checkpointing.predicted_peak(r), none_txt,
            checkpointing.predicted_peak(n0) if n0 is not None else None,
            checkpointing.forwards_cell(r).split(" /")[0], layers) + note))
        score = Score(words.score_answer(label(r), _i(r.cfg.context), r["peak_alloc"]),
                      words.score_headline(r["peak_alloc"], r.cfg.dtype),
                      "no checkpointing: OOM" if n0 is not None and n0["status"] == OOM else "–", device, run_date(d))
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
    return Page(slug, "gradient_checkpointing", [problem(name)], answers, "\n\n".join(x for x in body if x),
                score={name: score})


def _single_level_table(f) -> str:
    rows = [[c.label, gib(c.peak_bytes) if c.measured else ("OOM" if c.status is Status.OOM else c.status.value),
             gib(c.predicted_peak_bytes), gib(c.predicted_activation_bytes), ms(c.mean_s) if c.mean_s else "–",
             num(c.block_forwards, 0) if c.block_forwards else "–"] for c in f.cases]
    return (f"### 2026 (b): single-level checkpointing, {f.size}, batch {f.batch} × context {f.context}, fp32\n\n"
            + table(["policy", "measured peak GiB", "predicted peak GiB (fp32 closed form)",
                     "predicted activations GiB", "forward+backward (ms)", "block forwards"], rows))


# ------------------------------------------------------------------------------------ training_step
def training_step_page(ctx: Context) -> Page:
    slug, name = "training_step", "training_step"
    qs = ["Which speed-up buys the most, alone and together?",
          "What MFU does the fastest configuration reach (datasheet peak and measured peak)?",
          "Ours against PyTorch's own pieces (the anchor) in the same run?"]
    found = gpu_rows(ctx, name)
    if not found:
        return missing_page(slug, "training_step", [name], qs)
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
            index_figs.append((f"training_step ablation: tokens/s per config ({device})", f"{ctx.fig_rel}/{fig_name}"))
    return Page(slug, "training_step: the full training step, ablated", [problem(name)], answers, "\n\n".join(body),
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
        a.append(Answer(qs[0], "bf16 not measured at this shape."))
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
        a.append(Answer(qs[1], "No measured run of ours yet."))
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
        vs = f"{vs_anchor} ({o} vs compiled PyTorch, same run)"
        score = Score(f"{o} trains {s_} ctx {c_} at {pct(r.get('m.mfu'))} MFU", f"{ms(step_s(r))} ms/step, "
                      f"{pct(r.get('m.mfu'))} MFU (datasheet) / {pct(r.get('m.mfu_measured_peak'))} (measured peak)", vs,
                      device_short(device), str(r["datetime"])[:10])
    else:
        a.append(Answer(qs[2], "Ours and the anchor were not measured in the same run yet."))
        score = Score("ablation measured; no same-run anchor pair", "–", "–", device_short(device), run_date(d))
    return a, score


def pages(ctx: Context) -> list[Page]:
    return [benchmarking_script_page(ctx), nsys_page(ctx), mixed_precision_page(ctx), memory_page(ctx),
            checkpointing_page(ctx), training_step_page(ctx)]
