"""Pages of the 2026 edition's parallelism problems: `parallelism_calcs` (alternate_ring_all_reduce,
data_parallel_calcs, fsdp_calcs, tp_calcs, fsdp_tp_calcs: each answer's symbolic form beside the
impl.parallelism_calcs function that computes it, and the bounds evaluated for the devices measured
here and TPU v5p) and `leaderboard_2026` (not run on two GPUs: the one-GPU rows of the step with
fewer layers, when present, and the two-GPU step predicted from them, impl.leaderboard_prediction).

C and W of each device come from the data: the H100's C is the bf16 matmul peak measured in its
newest run (the rows' `peaks`); W is the NCCL all-reduce bus bandwidth at the largest size of the
2×H200 distributed_communication run (bus bandwidth = bytes each device sends per second in a ring,
the calculations' W). No H100 all-reduce was measured (one GPU), so the H100 row borrows the H200's
W and says so.
"""
from __future__ import annotations

from dataclasses import dataclass


from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Status
from impl.workloads.leaderboard_2026 import LEADERBOARD, WORLD_SIZE
from impl.leaderboard_prediction import LayerRun, predict_step
from impl.report.markdown import gib, missing, ms, ms_share, num, pct, table
from impl.report.leaderboard_2026_facts import two_gpu_facts
from impl.report.rows import benches
from impl.report.runs import runs_line
from impl.report.pages import Answer, Context, Page, Score
from impl.report.pages import gpu_rows, run_date
from impl.report.runs import device_label, gpu_model
from impl.report.templating import environment, macros
from impl.report.pages.problems import problem
from impl.workloads.problems import Problem as P

CALC_PROBLEMS = [P.ALTERNATE_RING_ALL_REDUCE, P.DATA_PARALLEL_CALCS, P.FSDP_CALCS, P.TP_CALCS, P.FSDP_TP_CALCS]
COMM = P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE
WORDS = "parallelism_calcs.md.j2"


@dataclass(frozen=True)
class Workload:
    """The FFN and batch the bounds are evaluated at: communication_accounting's XXL FFN at the global
    batch that makes it compute-bound on the TPU v5p mesh of that problem (so the two pages agree)."""

    B: float
    D: float
    D_FF: float
    source: str


def workload() -> Workload:
    return Workload(B=acc.compute_bound_batch()["global_tokens_int"], D=acc.XXL["d_model"], D_FF=acc.XXL["d_ff"],
                    source=macros(WORDS).workload_source())


def measured_peak(ctx: Context, device: str):
    """(C FLOP/s, run datetime, section) of the newest row of `device` that carries a measured matmul peak."""
    d = ctx.device_rows(device)
    rows = [(r.datetime, r.section, r.row.peaks) for r in d.itertuples() if getattr(r.row, "peaks", None)]
    if not rows:
        return None
    when, section, peaks = max(rows, key=lambda x: str(x[0]))
    return peaks.measured_flops, str(when)[:10], section


def nccl_bus_bandwidth(ctx: Context, world_size: int | None = None):
    """(W bytes/s, device, size in bytes, processes, date) of the largest measured NCCL all-reduce on a
    GPU device (bus bandwidth: the bytes each device sends per second in a ring all-reduce), of
    `world_size` processes when given."""
    best = None
    for dev, d in gpu_rows(ctx, COMM):
        for _, r in d.iterrows():
            bw = r.get(f"m.{Metric.BUS_BW.value}")
            if missing(bw):
                bw = (r["details"].get("legacy_metrics") or {}).get("busbw_GBps")
            if r["status"] != Status.MEASURED.value or r.cfg.backend != "nccl" or missing(bw):
                continue
            if world_size is not None and int(r.cfg.world_size) != world_size:
                continue
            key = (int(r.cfg.bytes), int(r.cfg.world_size))
            if best is None or key > best[2:4]:
                best = (bw * 1e9, dev, *key, str(r["datetime"])[:10])
    return best


def bandwidth_source(w) -> str:
    """Where a W of nccl_bus_bandwidth comes from, in words."""
    _, w_dev, size, procs, w_date = w
    return macros(WORDS).bandwidth_source(size, procs, w_dev, w_date)


def device_figures(ctx: Context) -> tuple[list[pc.DeviceFigures], list[str]]:
    """The table's devices (C, W with sources) and the notes on what was borrowed or is missing."""
    notes, out, words = [], [], macros(WORDS)
    w = nccl_bus_bandwidth(ctx)
    h100 = measured_peak(ctx, "h100-80gb-x1")
    if w is None:
        notes.append(words.no_bandwidth())
    else:
        w_bps, w_dev, w_src = w[0], w[1], bandwidth_source(w)
        if h100:
            c, date, section = h100
            out.append(pc.DeviceFigures("H100 (h100-80gb-x1)", C=c, W=w_bps,
                                        source=words.measured_source(section, date, w_src)))
            notes.append(words.h100_borrows_w())
        h200_c = datasheet_bf16_flops("H200")
        h200 = measured_peak(ctx, w_dev)
        if h200:
            out.append(pc.DeviceFigures(f"2×H200 ({w_dev})", C=h200[0], W=w_bps,
                                        source=words.measured_source(h200[2], h200[1], w_src)))
        elif h200_c:
            out.append(pc.DeviceFigures(f"2×H200 ({w_dev})", C=h200_c, W=w_bps,
                                        source=words.datasheet_source(w_dev, w_src)))
    out.append(pc.TPU_V5P_FIGURES)
    return out, notes


def _e(x: float) -> str:
    return f"{x:.3g}"


def bounds_table(devices: list[pc.DeviceFigures], wl: Workload) -> str:
    rows = []
    for dev in devices:
        b = pc.parallelism_bounds(dev, wl.B, wl.D_FF)
        rows.append([dev.name, _e(dev.C / 1e12), _e(dev.W / 1e9), f"{b.dp.value:,.1f}", f"{b.fsdp.value:,.1f}",
                     f"{b.tp_forward.value:,.1f} / {b.tp_backward.value:,.1f}",
                     f"{b.fsdp_tp.value:,.0f} ({b.fsdp_tp_split.n_tp:,.1f} × {b.fsdp_tp_split.n_fsdp:,.1f})",
                     f"{b.fsdp_tp_serial.value:,.0f} ({b.fsdp_tp_serial_split.n_tp:,.1f} × "
                     f"{b.fsdp_tp_serial_split.n_fsdp:,.1f})"])
    return table(macros(WORDS).bounds_header().split("|"), rows)


def _formulas(record) -> str:
    return table(macros(WORDS).formulas_header().split("|"),
                 [[a.part, f"`{a.symbolic}`", f"`{a.formula.name}`"] for a in pc.answers(record)])


@dataclass(frozen=True)
class CalcsFacts:
    """The closed forms at the workload (symbolic forms: any device would do; TPU v5p's figures) and
    the devices whose bounds the page evaluates."""

    wl: Workload
    devices: list
    dp: object
    fs: object
    tp: object
    ft: object
    ar: object = pc.alternate_ring_all_reduce_time
    ring: object = pc.ring_all_reduce_time
    fp16: int = pc.FP16

    @property
    def first(self):
        return pc.parallelism_bounds(self.devices[0], self.wl.B, self.wl.D_FF)


def calcs_facts(devices: list[pc.DeviceFigures]) -> CalcsFacts:
    wl, tpu, n = workload(), pc.TPU_V5P_FIGURES, 4
    return CalcsFacts(wl, devices, pc.data_parallel_calcs(wl.B, wl.D, wl.D_FF, n, tpu.C, tpu.W),
                      pc.fsdp_calcs(wl.B, wl.D, wl.D_FF, n, tpu.C, tpu.W), pc.tp_calcs(wl.B, wl.D, wl.D_FF, n, tpu.C, tpu.W),
                      pc.fsdp_tp_calcs(wl.B, wl.D, wl.D_FF, 2, 2, tpu.C, tpu.W))


def calcs_page(ctx: Context) -> Page:
    slug = problem(P.DATA_PARALLEL_CALCS).slug
    devices, notes = device_figures(ctx)
    c = calcs_facts(devices)
    w = macros(WORDS)
    answers = [Answer(w.q_ring(), w.a_ring(c)), Answer(w.q_dp(), w.a_dp(c)), Answer(w.q_fsdp(), w.a_fsdp(c)),
               Answer(w.q_tp(), w.a_tp(c)), Answer(w.q_fsdp_tp(), w.a_fsdp_tp(c))]
    formulas = {k: _formulas(getattr(c, k)) for k in ("dp", "fs", "tp", "ft")}
    body = environment().get_template(WORDS).module.body(
        c, bounds_table(devices, c.wl), notes, formulas, pc.TP_BACKWARD_EQUATIONS)
    first, closed = c.first, "closed form"
    scores = {
        P.ALTERNATE_RING_ALL_REDUCE: Score(w.score_ring(c), "–", "–", closed),
        P.DATA_PARALLEL_CALCS: Score(w.score_dp(c), w.on_first(c, first.dp.value, 1), "–", closed),
        P.FSDP_CALCS: Score(w.score_fsdp(c), w.on_first(c, first.fsdp.value, 1), "–", closed),
        P.TP_CALCS: Score(w.score_tp(c), w.on_first(c, first.tp_forward.value, 1), "–", closed),
        P.FSDP_TP_CALCS: Score(w.score_fsdp_tp(c), w.on_first(c, first.fsdp_tp.value, 0), "–", closed),
    }
    return Page(slug, w.title(), [problem(p) for p in CALC_PROBLEMS], answers,
                str(body).strip(), score=scores)


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
    w = nccl_bus_bandwidth(ctx, world_size=WORLD_SIZE)
    found = one_gpu_runs(ctx, like=None if w is None else w[1])
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
            w_bps, w_dev, w_src = w[0], w[1], bandwidth_source(w)
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
    return [calcs_page(ctx), leaderboard_2026_page(ctx)]
