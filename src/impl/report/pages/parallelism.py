"""The leaderboard_2026 page (not run on two GPUs: the one-GPU rows of the step with fewer layers, when
present, and the two-GPU step predicted from them, impl.leaderboard_prediction). Its W is the
parallelism_calcs page's (impl.report.pages.parallelism_calcs.nccl_bus_bandwidth).
"""
from __future__ import annotations

from impl.bench.row import Metric, Status
from impl.workloads.leaderboard_2026 import LEADERBOARD, WORLD_SIZE
from impl.leaderboard_prediction import LayerRun, predict_step
from impl.report.markdown import gib, missing, ms, ms_share, num, pct, table
from impl.report.leaderboard_2026_facts import two_gpu_facts
from impl.report.rows import benches
from impl.report.runs import runs_line
from impl.report.pages import Answer, Context, Page, Score
from impl.report.pages import gpu_rows, run_date
from impl.report.pages.parallelism_calcs import Bandwidth, nccl_bus_bandwidth
from impl.report.runs import device_label, gpu_model
from impl.report.templating import environment, macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

WORDS = "parallelism_calcs.md.j2"


def bandwidth_source(w: Bandwidth) -> str:
    """Where a W of nccl_bus_bandwidth comes from, in words."""
    return macros(WORDS).bandwidth_source(w)


LB26 = P.LEADERBOARD_2026


def one_gpu_runs(ctx: Context, like: str | None = None):
    """(device, its measured and not-run leaderboard_2026 rows) of a one-GPU device, or None: the one
    with the same GPU as `like` (the two-GPU device whose bandwidth prices the prediction) when it
    has rows, else the first that has any."""
    found = [(dev, d.sort_values(["cfg.checkpointing", "cfg.k", "cfg.layers"]))
             for dev, d in gpu_rows(ctx, LB26) if dev.endswith("-x1")]
    same = [f for f in found if like is not None and gpu_model(f[0]) == gpu_model(like)]
    return (same or found or [None])[0]


def layer_runs(d) -> tuple[str, list[LayerRun]]:
    """(policy, runs) of the checkpointing policy with the most measured layer counts (checkpointed
    first on a tie: 34 plain layers would not fit): the points the prediction fits."""
    measured = d[d.status == Status.MEASURED.value]
    best = ("", [])
    # one line per (policy, k) and run: rows of another k or another run (code, machine) are not one model
    groups = measured.groupby([measured.cfg.checkpointing, measured.cfg.k.fillna(0), measured["datetime"]],
                              sort=False)
    for (policy, k, _), m in sorted(groups, key=lambda g: g[0][0] == "none"):
        runs = [LayerRun(int(r.cfg.layers), float(r["median"]), None if missing(r["peak_alloc"]) else
                         float(r["peak_alloc"])) for _, r in m.iterrows()]
        if len({r.layers for r in runs}) > len({r.layers for r in best[1]}):
            best = (policy if policy == "none" else f"{policy} (k {int(k)})", runs)
    return best


def _rows_table(d) -> str:
    rows = []
    for _, r in d.iterrows():
        k = "" if missing(r.cfg.k) else f" (k {int(r.cfg.k)})"
        measured = r["status"] == Status.MEASURED.value
        rows.append([int(r.cfg.layers), f"{r.cfg.checkpointing}{k}",
                     ms(r["median"], r["iqr"]) if measured else r["status"],
                     f"{r['m.' + Metric.TOKENS_PER_S.value]:,.0f}" if measured else "–",
                     f"{r['m.' + Metric.MFU.value]:.1%}" if measured and not missing(r.get("m." + Metric.MFU.value))
                     else "–", gib(r["peak_alloc"], 1), "" if measured else (r["reason"] or "")[:80]])
    return table(macros("leaderboard_2026.md.j2").rows_header().split("|"), rows)


def _two_gpu_table(f) -> str:
    """The candidates of the multi-GPU rows, each with its run; the fastest of each run marked."""
    w = macros("leaderboard_2026.md.j2")
    rows = []
    for c in f.candidates:
        if not c.measured:
            rows.append([c.policy, c.run_when, c.bench.status.value, (c.bench.row.reason or "")[:80]] + [""] * 6)
            continue
        rows.append([c.policy, c.run_when, "–" if c.do_bench_s is None else f"{c.do_bench_s:.3f}",
                     f"{c.median_s:.3f} ± {c.iqr_s:.3f}" if c.iqr_s is not None else f"{c.median_s:.3f}",
                     "–" if c.first_call_s is None else f"{c.first_call_s:,.1f}",
                     " / ".join(gib(p, 1) for p in c.rank_peaks) or "–", pct(c.mfu), pct(c.mfu_measured_peak),
                     num(c.bench.metric(Metric.TOKENS_PER_S), 0), "yes" if f.fastest.get(c.run_when) is c else ""])
    return table(w.two_header().split("|"), rows)


def _breakdown_tables(f) -> list[str]:
    """Per profiled candidate: the measured step, kernel time per phase and per kind (ms and share), the
    gap; then the top kernels of the fastest profiled candidate."""
    profiled = f.profiled
    if not profiled:
        return []
    w = macros("leaderboard_2026.md.j2")
    phases = list(profiled[0].breakdown["phase_ms"])
    cats = [k for k in profiled[0].breakdown["category_ms"]
            if any(c.breakdown["category_ms"].get(k, 0.0) > 0 for c in profiled)]
    rows = []
    for c in profiled:
        b = c.breakdown
        step = b["step_ms"]
        rows.append([c.policy, c.run_when, num(step, 0)] + [ms_share(b["phase_ms"].get(ph), step, 0) for ph in phases]
                    + [ms_share(b["category_ms"].get(k, 0.0), step, 0) for k in cats]
                    + [ms_share(b["kernel_ms"], step, 0), ms_share(b["gap_ms"], step, 0)])
    head = ["checkpointing", "run (UTC)", "step (ms)"] + [f"{ph} (ms)" for ph in phases] + cats + ["kernels", "gap"]
    best = min((c for c in profiled if c.run_when == f.newest.run_when), key=lambda c: c.step_s,
               default=profiled[-1])
    top = [[f"`{k['name'][:70]}`", k["category"], num(k["ms"], 1), num(k["calls"], 0)] for k in best.breakdown["top"]]
    return [w.h_breakdown(), w.breakdown_intro(), table(head, rows), w.top_intro(best),
            table(w.top_header().split("|"), top)]


def leaderboard_2026_page(ctx: Context) -> Page:
    name, spec = LB26, LEADERBOARD
    env = environment().get_template("leaderboard_2026.md.j2").module
    w_ = macros("leaderboard_2026.md.j2")
    two_gpu = [f"{device_label(dev, d)}: {', '.join(sorted(d.section.unique()))}"
               for dev, d in gpu_rows(ctx, *(ctx.df.problem.unique() if not ctx.df.empty else []))
               if not dev.endswith("-x1")]
    multi = None  # (device, rows, facts) of the first multi-GPU device with rows of the step
    for dev, d in gpu_rows(ctx, name):
        f = None if dev.endswith("-x1") else two_gpu_facts(device_label(dev, d), benches(d))
        if f is not None and multi is None:
            multi = (dev, d[d.cfg.world_size.fillna(1).astype(int) > 1], f)
    w = nccl_bus_bandwidth(ctx.rows, world_size=WORLD_SIZE)
    found = one_gpu_runs(ctx, like=None if w is None else w.device)
    body = [str(env.intro(spec, WORLD_SIZE, two_gpu)).strip()]
    answers, score = [], Score(w_.score_not_run())
    best = multi[2].newest if multi else None
    if best is not None:
        dev, d, f = multi
        lead = w_.measured(f, best, f.slowest_first_call)
        if f.class_best is not None:
            lead += "\n\n" + w_.class_best(f.class_best)
        score = Score(w_.score_measured(best, f.world), w_.score_measured_headline(best, f.class_best), "–", dev, run_date(d))
        body += [w_.h_two(f), w_.two_intro(f), _two_gpu_table(f)]
        body += _breakdown_tables(f) or [w_.no_breakdown(f)]
        if f.class_best is not None:
            body += [w_.h_class_best(), w_.class_best(f.class_best)]
        body.append(runs_line(dev, d))
        profiled = [c for c in f.profiled if c.run_when == best.run_when]
        fastest = min(profiled, key=lambda c: c.step_s) if profiled else None
        time_text = (w_.breakdown(fastest, [c for c in f.profiled if c is not fastest]) if fastest
                     else w_.no_breakdown(f))
    else:
        lead = w_.not_run(spec)
        time_text = None
    if found is None:
        text = f"{lead} {w_.no_rows()}"
    else:
        dev1, d1 = found
        body += [str(env.one_gpu(spec, device_label(dev1, d1), run_date(d1), int(d1.cfg.batch.iloc[0]),
                                 int(d1.cfg.context.iloc[0]))).strip(), _rows_table(d1)]
        policy, runs = layer_runs(d1)
        if len({r.layers for r in runs}) < 2:
            text = f"{lead} {w_.no_fit(dev1)}"
        elif w is None:
            text = f"{lead} {w_.no_bandwidth()}"
        else:
            w_bps, w_dev, w_src = w.bps, w.device, bandwidth_source(w)
            pred = predict_step(runs, spec.model, w_bps, WORLD_SIZE)
            prediction = w_.prediction(pred, policy, dev1, w_src)
            body.append(str(env.prediction_table(pred)).strip())
            if best is not None:  # the measured step answers; the prediction stands beside it
                same = [c for c in multi[2].candidates if c.measured and c.policy == policy]
                beside = w_.versus_prediction(pred, policy, same[-1] if same else None)
                text = f"{lead}\n\n{beside}"
                body += [prediction, beside]
                score = Score(score.answer, score.headline, score.vs_anchor, f"{score.device} + {dev1}", score.date)
            else:
                text = f"{lead} {prediction}"
                score = Score(w_.score_predicted_answer(), w_.score_predicted(pred), "–", f"{dev1} + {w_dev}",
                              run_date(d1))
    answers.append(Answer(w_.question(spec), text))
    if time_text:
        answers.append(Answer(w_.q_time(), time_text))
    return Page(name, w_.title(), [problem(name)], answers, "\n\n".join(body), score={name: score})


def pages(ctx: Context) -> list[Page]:
    return [leaderboard_2026_page(ctx)]
