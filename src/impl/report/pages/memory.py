"""The memory_profiling page: the 2025 edition's (a)–(e) (impl.report.memory_2025_facts) beside the
2026 edition's (a)–(f) (impl.report.memory_facts), then peak tables, timelines, the residual stream and
the largest allocations; templates/memory_profiling.md.j2 holds the words."""
from __future__ import annotations

from impl.bench.row import Status
from impl.workloads.sweeps import grid
from impl.model.sizes import SizeRef
from impl.report import figures
from impl.report.markdown import gb, gib, mib, pct, table
from impl.report.memory_2025_facts import LargestTable, memory_2025_facts, ordered, residual_seen
from impl.report.memory_facts import Memory2026Facts, context_peaks, memory_2026_facts
from impl.report.output import figure_path
from impl.report.pages import Answer, Context, Page, Score, gpu_rows, missing_page, run_date
from impl.report.pages.problems import problem
from impl.report.rows import Bench, benches, size_label
from impl.report.runs import device_short, runs_line
from impl.report.templating import macros
from impl.workloads.problems import Problem as P

SLUG, NAME = "memory_profiling", P.MEMORY_PROFILING
# The 2026 edition's variant: xl at contexts 128 and 2048 (the sweep table's cases_2026).
CASES_2026 = {tuple(c) for c in grid(P.MEMORY_PROFILING, "full").cases_2026}
W = macros("memory_profiling.md.j2")


def _status_cell(b: Bench) -> str:
    return "OOM" if b.status is Status.OOM else b.status.value.replace("_", " ")


def _peak_table(rows: list[Bench]) -> str:
    """Allocated / reserved GiB per size and context, fp32 and bf16, forward and training step."""
    by = {}
    for b in rows:
        by.setdefault((size_label(b.cfg.size_ref, b.cfg.size), b.cfg.context), {})[(b.cfg.dtype, b.cfg.mode)] = b
    out = []
    for (size, c), cells in by.items():
        row = [size, c]
        for dtype in ("fp32", "bf16"):
            for mode in ("forward", "train_step"):
                b = cells.get((dtype, mode))
                row.append("–" if b is None else f"{gib(b.row.memory.peak_allocated)} / {gib(b.row.memory.peak_reserved)}"
                           if b.status is Status.MEASURED else _status_cell(b))
        out.append(row)
    return table(["size", "context", "fp32 forward", "fp32 train step", "bf16 forward", "bf16 train step"], out)


def _residual_table(ok: list[Bench]) -> str:
    rows = [[b.cfg.context, b.cfg.dtype, f"{n} B/elem", f"{x['bytes'] / 2**20:.2f}", "yes" if x["found"] else "no",
             x["count"], f"`{(x['frames'] or ['–'])[0]}`"]
            for b in ok if b.cfg.mode == "forward"
            for n, x in ((b.details.get("snapshot") or {}).get("residual") or {}).items()]
    return W.residual_intro(table(["context", "dtype", "element", "MiB", "found", "allocations", "first made at"], rows))


def _largest_tables(tables: list[LargestTable]) -> str | None:
    if not tables:
        return None
    return "### (e) largest allocations\n\n" + "\n\n".join(
        W.largest_table(t, table(["size (MiB)", "count", "tensor of that size", "made at"],
                                 [[f"{n / 2**20:.1f}", count, label, " ← ".join(frames[:2])]
                                  for n, count, label, frames in t.rows])) for t in tables)


def _earlier_grid(rows: list[Bench], heading: str) -> tuple[list[Answer], str]:
    """The 2026 questions read from rows of another grid at the 2026 contexts (no 2026 rows yet)."""
    ok = [b for b in rows if b.status is Status.MEASURED]
    b0 = rows[0]
    size = size_label(b0.cfg.size_ref)
    residuals = [r for b in ok if b.cfg.mode == "forward" and b.cfg.dtype == "fp32" for r in [residual_seen(b)] if r]
    facts = memory_2025_facts(ok)  # its largest allocations (None without a measured row)
    a = Answer(W.q_2026_a(), W.a_2026_peaks(size, b0.cfg.batch, context_peaks(rows)))
    b = Answer(W.q_2026_b(), W.a_2026_residual(residuals, W.a_largest_2025(facts)))
    body = [W.earlier_grid(heading, size, sorted({x.cfg.context for x in rows}), _residual_table(ok)),
            (_largest_tables(facts.largest) if facts else None) or ""]
    return [a, b], "\n\n".join(x for x in body if x)


def _memory_2026(d26: list[Bench], earlier: list[Bench]) -> tuple[list[Answer], str | None]:
    """The 2026 questions without 2026 measurements: said so, and rows of an earlier grid at those
    contexts (the 2025 table's xl, another model) shown under their own label, never as the answer."""
    if d26:
        return _earlier_grid(d26, "2026 edition")
    old = sorted({size_label(b.cfg.size_ref, b.cfg.size) for b in earlier})
    text = W.no_rows(size_label(SizeRef("2026", "xl")), old, sorted({b.cfg.context for b in earlier}))
    answers = [Answer(q, text) for q in (W.q_2026_a(), W.q_2026_b())]
    return answers, (_earlier_grid(earlier, "An earlier grid's rows (not the 2026 size)")[1] if earlier else None)


def _memory_2026_body(ctx: Context, device: str, m: Memory2026Facts, date: str) -> str:
    """The 2026 section: timelines (zoomed, block starts marked), peaks with OOM needs, residual stream,
    the block probe's saved ops and gradients."""
    out = [W.body_2026_head(m)]
    for mode in ("forward", "train_step"):
        panels = [(f"{c.dtype}, context {c.context}", c.timeline) for c in m.cases if c.mode == mode and c.timeline]
        if not panels:
            continue
        path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, f"{device}-2026-{mode}")
        figures.memory_timelines(panels, path, W.timeline_2026_title(m, mode, device, date), from_zero=False)
        out.append(W.timeline_2026(m, mode, link))
    rows = [[c.context, c.dtype, c.mode.replace("_", " "),
             gib(c.peak_bytes) if c.measured else ("OOM" if c.status is Status.OOM else c.status.value),
             gib(c.reserved_bytes) if c.measured else "–", gb(c.need_bytes, 0) if c.need_bytes else "–"]
            for c in m.cases]
    out.append(W.peaks_2026(table(["context", "dtype", "mode", "peak allocated GiB", "peak reserved GiB",
                                   "closed-form need GB"], rows)))
    rows = [[c.context, c.dtype, mib(a["size"]), a["count"], " ← ".join(f"`{x}`" for x in a["frames"][:2])]
            for c in m.cases if c.mode == "forward" for a in [x for x in c.largest if x.get("frames")][:3]]
    if rows:
        out.append(W.largest_2026(table(["context", "dtype", "size MiB", "count", "made at"], rows)))
    rows = [[r.context, f"{r.batch} × {r.context} × {r.d_model} × {r.bytes_per_elem} B", f"{r.mib:.2f}",
             "yes" if r.found else "no", r.count if r.count is not None else "–", f"`{r.made_at or '–'}`"]
            for r in m.residuals]
    out.append(W.residual_2026(table(["context", "derivation", "MiB", "found", "allocations", "first made at"], rows)))
    rows = [[p.context, p.dtype, mib(p.saved_bytes)] + [f"`{o.op}` ({o.module}) {mib(o.nbytes)} MiB, {pct(o.share)}"
                                                        for o in p.top[:5]] + [pct(p.top_share)] for p in m.probes]
    out.append(W.saved_2026(m, table(["context", "dtype", "saved MiB", "1st", "2nd", "3rd", "4th", "5th",
                                      "top 5 share"], rows)))
    rows = [[p.context, p.dtype, mib(p.saved_bytes), ", ".join(mib(x) for x in p.backward_change_bytes),
             mib(p.grad_from_change), mib(p.grad_bytes_measured), mib(p.grad_bytes_expected),
             f"{p.grad_over_expected:.3f}"] for p in m.probes]
    out.append(W.grads_2026(table(["context", "dtype", "saved MiB", "backward change per block MiB",
                                   "gradients (change + saved) MiB", "gradients measured MiB", "4 B × params MiB",
                                   "measured ÷ predicted"], rows)))
    return "\n\n".join(out)


def _timelines(ctx: Context, device: str, size: str, rows: list[Bench], date) -> list[str]:
    """The 2025 rows' timeline figures, one per mode and dtype (a panel per context); their links."""
    figs = []
    for mode in ("forward", "train_step"):
        for dtype in ("fp32", "bf16"):
            g = [b for b in rows if (b.cfg.mode, b.cfg.dtype) == (mode, dtype) and b.details.get("snapshot")]
            if not g:
                continue
            path, link = figure_path(ctx.fig_dir, ctx.fig_rel, SLUG, f"{device}-{mode}-{dtype}")
            figures.memory_timelines([(f"context {b.cfg.context}", b.details["snapshot"]["timeline"]) for b in g], path,
                                     W.timeline_2025_title(size, dtype, mode, device, date(g)))
            figs.append(f"![{mode} {dtype}]({link})")
    return figs


def memory_page(ctx: Context) -> Page:
    qs = [W.q_a(), W.q_b(), W.q_c(), W.q_d(), W.q_e()]
    found = gpu_rows(ctx, NAME)
    if not found:
        return missing_page(SLUG, NAME, [NAME], qs + [W.q_2026_a(), W.q_2026_b()])
    device, d_all = found[0]
    rows = ordered(benches(d_all))
    d26 = [b for b in rows if b.cfg.edition == "2026"]
    # 2025 rows at the 2026 contexts are another grid's (the 2025 table's xl): kept apart from (a)–(e)
    at_2026 = [b.cfg.edition != "2026" and (b.cfg.size, b.cfg.context) in CASES_2026 for b in rows]
    earlier = [b for b, x in zip(rows, at_2026) if x]
    d = [b for b, x in zip(rows, at_2026) if not x and b.cfg.edition != "2026"]
    f = memory_2025_facts(d)
    if f is None:
        return missing_page(SLUG, NAME, [NAME], qs + [W.q_2026_a(), W.q_2026_b()])
    ok = [b for b in d if b.status is Status.MEASURED]
    frame = lambda bs: d_all[d_all["name"].isin({b.name for b in bs})]  # noqa: E731  (run dates, runs line)
    answers = [Answer(q, a(f)) for q, a in zip(qs, (W.a_timeline_2025, W.a_peaks_2025, W.a_bf16_2025,
                                                    W.a_residual_2025, W.a_largest_2025))]
    body = [f"## {device}", W.peak_tables(_peak_table(rows))]
    figs = _timelines(ctx, device, f.size, d, lambda bs: run_date(frame(bs)))
    if figs:
        body.append(W.timelines_2025(figs))
    body.append("### (d) residual stream\n\n" + _residual_table(ok))
    body.append(_largest_tables(f.largest) or "")
    art = [b.details["snapshot"]["artifact"] for b in d if (b.details.get("snapshot") or {}).get("artifact")]
    if art:
        body.append(W.artifact(art[0]))
    score = Score(W.score_2025(f), W.headline_2025(f), "–", device_short(device), run_date(frame(d)))
    m26 = memory_2026_facts(d26)
    if m26 is not None and any(c.measured for c in m26.cases):
        more = (W.a_timeline, W.a_peaks, W.a_bf16, W.a_residual, W.a_largest)
        for i, a26 in enumerate(more):
            if i == 4 and m26.largest is None:
                continue
            answers[i] = Answer(answers[i].question, f"{W.head_2025(f)} {answers[i].text}\n\n{a26(m26)}")
        answers.append(Answer(W.q_f(), W.a_block(m26)))
        body.append(_memory_2026_body(ctx, device, m26, run_date(frame(d26))))
        # a problem of both editions: the index reads the newer one's rows
        score = Score(W.score_2026(m26), W.headline_2026(m26), "–", device_short(device), run_date(frame(d26)))
    else:
        a26, b26 = _memory_2026(d26, earlier)
        answers += a26
        if b26:
            body.append(b26)
    body.append(runs_line(device, d_all))
    return Page(SLUG, NAME, [problem(NAME)], answers, "\n\n".join(x for x in body if x), score={NAME: score})

