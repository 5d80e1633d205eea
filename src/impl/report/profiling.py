"""Tables of nsys_profile (read by
impl.report.pages.profiling) and torch_compile (b). Everything is read from the saved JSON."""
from __future__ import annotations


import pandas as pd

from impl.workloads.compiled import WHY
from impl.bench.row import Status
from impl.model import size_rank
from impl.report.benchmarking import stat_name, step_s, study
from impl.report.nsys_facts import forward_non_matmul
from impl.report.templating import macros
from impl.report.markdown import missing, ms, num, pct, table
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)

MEASURED, OOM = Status.MEASURED.value, Status.OOM.value


def _p(df, problem):
    return df[df.problem == problem] if not df.empty else df


def _i(x):
    """Config integers come back as floats when a column has gaps."""
    try:
        return int(x)
    except (TypeError, ValueError):
        return x


def sorted_by(d, *keys):
    if "cfg.size" in d:
        d = d.assign(_s=d.cfg.size.map(lambda s: size_rank(s)))
        return d.sort_values(["_s", *keys])
    return d


# ------------------------------------------------------------------------------------------ nsys
def _kernel_rows(rows, n=8):
    return [[r["name"][:90].replace("|", "/"), r["category"], num(r["time_us"] / 1e3, 3), r["calls"], pct(r["share"])]
            for r in rows[:n]]


_PROFILED_LABEL = {"forward_backward": "fwd+bwd only", "forward": "fwd only", "forward_no_grad": "fwd only (no grad)"}


def _train_share(n: dict) -> str:
    """(d) matmul share of the training step, or what the profile fell back to (OOM)."""
    profiled = n.get("profiled") or ("forward" if n.get("train_oom") else "train_step")
    if profiled == "train_step":
        return pct(n["matmul_share_train_step"])
    if profiled == "forward_backward":  # the share over forward+backward is still a training figure
        return f"{pct(n['matmul_share_train_step'])} (fwd+bwd only)"
    return _PROFILED_LABEL[profiled]


def nsys_body(df: pd.DataFrame) -> str | None:
    """The nsys_profile tables (per config, kernel tables of the middle config, category shares)."""
    d = _p(df, "nsys_profile")
    if d.empty:
        return None
    d = sorted_by(d, "cfg.context")
    src = next((i["nsys"]["timing_source"] for i in d["details"] if i.get("nsys")), "kernels")
    unit = "GPU kernels" if src == "kernels" else "CPU ops' self time (no GPU: ops stand in for kernels)"
    parts = [f"torch.profiler over annotated training steps (warm-up excluded); times are {unit}, attributed "
             "to a phase by the launch time of the op that issued them. Forward = the training forward "
             "(loss included). Where the training step ran out of memory the profile fell back to "
             "forward+backward without the optimizer step (*fwd+bwd only*), then to the forward (*fwd only*), "
             "then to the forward without autograd (*no grad*; the Python timer then times that forward too)."]
    ns = [i["nsys"] for i in d["details"] if i.get("nsys")]
    steps = sorted({n.get("steps_profiled") for n in ns})
    parse = [n["parse_s"] for n in ns if n.get("parse_s") is not None]
    if ns and parse:
        warm = sorted({n["warmup_steps"] for n in ns if n.get("warmup_steps") is not None})
        how = (f"after {'/'.join(map(str, warm))} warm-up step(s) the profiler ran through without recording, "
               "tables built from the raw kineto events" if warm else
               "warm-up steps recorded and excluded, tables built from torch's FunctionEvents")
        parts.append(f"Recorded steps per config: {'/'.join(map(str, steps))} ({how}); building the tables took "
                     f"{num(sum(parse), 1)} s over {len(parse)} configs (max {num(max(parse), 2)} s).")
    rows = []
    for _, r in d.iterrows():
        n = r["details"].get("nsys")
        if r["status"] not in (MEASURED, OOM):
            rows.append([r.cfg.size, _i(r.cfg.context), "left out"] + ["–"] * 9)
            continue
        if r["status"] == OOM or not n:
            rows.append([r.cfg.size, _i(r.cfg.context), "OOM"] + ["–"] * 9)
            continue
        top = n.get("top_forward", {})
        rows.append([r.cfg.size, _i(r.cfg.context), ms(step_s(r), r["stddev"]), num(n["forward_range_ms"], 2),
                     num(n["forward_kernel_ms"], 2), top.get("name", "–")[:60].replace("|", "/"),
                     num(top.get("calls_per_pass"), 0), "yes" if n.get("top_stays_on_top") else "no",
                     pct(n["matmul_share_forward"]), _train_share(n),
                     num(n["softmax_to_matmuls_time_ratio"], 2), num(n["softmax_to_matmuls_flop_ratio"], 3)])
    parts.append(f"(a)–(e) per config. *Python timer* = pytest-benchmark {stat_name(d)} ± std of the same forward; "
                 "*profiled range* = the annotated forward range (ends in a sync); *kernel sum* = summed "
                 "kernel time in it. Softmax ratios: softmax ÷ (scores matmul + final matmul) in time and in "
                 "FLOPs (5 FLOPs per score for softmax, 2·d per score per matmul).\n\n" + table(
                     ["size", "context", "Python timer (ms)", "profiled range (ms)", "kernel sum (ms)",
                      "(b) top forward kernel", "calls / pass", "top in fwd+bwd too", "(d) matmul share fwd",
                      "matmul share train", "(e) softmax/matmul time", "softmax/matmul FLOPs"], rows))
    ok = d[d["details"].map(lambda i: bool(i.get("nsys")))]
    if not ok.empty:
        r = ok.iloc[len(ok) // 2]
        n = r["details"]["nsys"]
        cfg = f"{r.cfg.size}, context {_i(r.cfg.context)}"
        parts.append(f"### Kernel tables for {cfg} (top rows; all tables are in the JSON)")
        for phase in ("forward", "forward+backward", "optimizer step"):
            rows_ = n["tables"].get(phase) or []
            if rows_:
                parts.append(f"**{phase}** ({n['steps_profiled']} steps)\n\n" + table(
                    ["kernel", "category", "total (ms)", "calls", "share"], _kernel_rows(rows_)))
        nm = forward_non_matmul(n)
        parts.append(f"(c) non-matmul kernels above {pct(nm.threshold)} of the forward's kernel time: "
                     + (", ".join(f"`{x.name[:60]}` ({x.category}, {pct(x.share)})" for x in nm.kernels[:8]) or "none"))
        cs = n["category_share"]
        parts.append("(d) time share by category, forward vs full training step:\n\n" + table(
            ["category", "forward", "train step"], [[c, pct(cs["forward"][c]), pct(cs["train step"][c])] for c in cs["forward"]]))
    art = [i.get("artifact") for i in d["details"] if i.get("artifact")]
    if art:
        parts.append(f"Chrome trace saved as artifact `{art[0]}` (open in chrome://tracing or ui.perfetto.dev).")
    skipped = [i.get("artifact_skipped") for i in d["details"] if i.get("artifact_skipped")]
    if skipped:
        parts.append(f"Chrome trace not kept: {skipped[0]}.")
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------- mixed precision
# ------------------------------------------------------------------------------- torch_compile (b)
WORDS = macros("torch_compile.md.j2")


def _cell(x) -> str:
    if x is None:
        return "–"
    if x["status"] not in (MEASURED, OOM):
        return "left out"
    return "OOM" if x["status"] == OOM else ms(step_s(x))


def _ok(x) -> bool:
    return x is not None and x["status"] == MEASURED and not missing(step_s(x))


def _speedup(e, c) -> str:
    """Compiled ÷ eager, the report's one convention (ours ÷ anchor: below 1, compiled is faster)."""
    return f"{step_s(c) / step_s(e):.2f}×" if _ok(e) and _ok(c) else "–"


def _first_call_s(r):
    """The bench layer's first_call_s metric; a details key in the older format."""
    v = r.get("m.first_call_s")
    return r["details"].get("first_call_s") if missing(v) else v


def compile_section(df: pd.DataFrame, heading: str = "## torch_compile (b): compiled model vs eager") -> str | None:
    d = _p(df, "torch_compile")
    if d.empty:
        return None
    d = d[d.apply(study, axis=1) == "model"]  # (a), attention, is another section
    if d.empty:
        return None
    d = sorted_by(d, "cfg.context")
    left = d[~d["status"].isin([MEASURED, OOM])]
    opt = d[d.cfg.mode == "optimizer_step"]
    grid_rows = d[d.cfg.mode != "optimizer_step"]
    modes = [m for m in ("forward", "forward_backward", "train_step") if m in set(grid_rows.cfg.mode)]
    labels = {"forward": "forward", "forward_backward": "fwd+bwd", "train_step": "train step"}
    by_size_opt = {}
    for size, g in opt.groupby(opt.cfg.size, sort=False):
        by_size_opt[size] = {r.cfg.impl: r for _, r in g.iterrows()}
    rows = []
    for (size, ctx), g in grid_rows.groupby([grid_rows.cfg.size, grid_rows.cfg.context], sort=False):
        row = [size, _i(ctx)]
        sel = {(r.cfg.mode, r.cfg.impl): r for _, r in g.iterrows()}
        for mode in modes:
            e, c = sel.get((mode, "eager")), sel.get((mode, "compiled"))
            row += [_cell(e), _cell(c), _speedup(e, c)]
        if by_size_opt:  # training step = forward+backward + the size's optimizer step (derived)
            o = by_size_opt.get(size, {})
            cells = []
            for impl in ("eager", "compiled"):
                fb, st = sel.get(("forward_backward", impl)), o.get(impl)
                cells.append(step_s(fb) + step_s(st) if _ok(fb) and _ok(st) else None)
            row += [ms(cells[0]), ms(cells[1]),
                    f"{cells[1] / cells[0]:.2f}×" if cells[0] is not None and cells[1] is not None else "–"]
        rows.append(row)
    header = ["size", "context"] + [h for m in modes for h in (f"{labels[m]} eager (ms)", f"{labels[m]} compiled (ms)",
                                                               "compiled ÷ eager")]
    if by_size_opt:
        header += ["train step eager (ms) = fwd+bwd + opt", "train step compiled (ms)", "compiled ÷ eager"]
    info0 = next((i for i in d["details"] if i.get("compiled_what")), None)
    # the code's reason (WHY), not the run's stored copy: older runs stored prose with hand-typed
    # compile times; the measured ones are in the compilation table below
    what = WORDS.b_what_regional(info0["compiled_what"], WHY) if info0 else WORDS.b_what_whole()
    parts = [heading,
             what + f" fp32; times are pytest-benchmark {stat_name(d)}s.\n\n"
             + table(header, rows)]
    if not opt.empty:
        orows = []
        for size, o in by_size_opt.items():
            e, c = o.get("eager"), o.get("compiled")
            orows.append([size, _cell(e), _cell(c), _speedup(e, c)])
        parts.append(WORDS.b_optimizer_intro() + "\n\n"
                     + table(["size", "eager (ms)", "compiled (ms)", "compiled ÷ eager"], orows))
    comp = d[(d.cfg.impl == "compiled") & d["details"].map(lambda i: bool(i.get("compiled_now")))]
    if not comp.empty:
        crow = []
        for _, r in comp.iterrows():
            i = r["details"]
            graph = i.get("graph") or ("inference" if r.cfg.mode == "forward" else "training")
            same = d[(d.cfg.impl == "compiled") & (d.cfg.size == r.cfg.size)
                     & d["details"].map(lambda j, g=graph: j.get("graph") == g and bool(j.get("reused_graph")))]
            reused = sorted({_i(x) for x in same.cfg.context if not missing(x)})
            crow.append([r.cfg.size, graph, "–" if missing(r.cfg.context) else _i(r.cfg.context),
                         num(_first_call_s(r), 1), num(i.get("compile_s"), 1),
                         ", ".join(map(str, reused)) or ("every later step" if graph == "optimizer" else "–"),
                         i.get("graph_breaks", "–")])
        parts.append(WORDS.b_compilation_intro() + "\n\n"
                     + table(["size", "graph", "compiled at context", "first call (s)", "compile (s)",
                              "reused at contexts", "graph breaks"], crow))
    if not left.empty:
        reason = left["reason"].iloc[0]
        cfgs = []
        for (size, ctx), g in d.assign(_c=d.cfg.context.map(lambda c: "optimizer step" if missing(c) else _i(c))
                                       ).groupby(["cfg.size", "_c"], sort=False):
            out = g[g.index.isin(left.index)]
            if out.empty:
                continue
            name = f"{size} {ctx}" if ctx == "optimizer step" else f"{size}@{ctx}"
            if len(out) < len(g):
                name += " (" + ", ".join(f"{r.cfg.mode} {r.cfg.impl}" for _, r in out.iterrows()) + ")"
            cfgs.append(name)
        parts.append(f"Left out ({reason}): " + ", ".join(cfgs) + ".")
    return "\n\n".join(parts)
