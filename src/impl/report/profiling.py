"""Tables of torch_compile (b) (read by impl.report.pages.attention). Everything is read from the
saved JSON."""
from __future__ import annotations


import pandas as pd

from impl.workloads.compiled import WHY
from impl.bench.row import Status
from impl.model import size_rank
from impl.report.benchmarking import stat_name, step_s, study
from impl.report.templating import macros
from impl.workloads.problems import Problem as P
from impl.report.markdown import missing, ms, num, table
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


def compile_section(df: pd.DataFrame, heading: str | None = None) -> str | None:
    d = _p(df, P.TORCH_COMPILE)
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
    header = ["size", "context"] + [h for m in modes for h in WORDS.b_mode_header(WORDS.mode_label(m)).split("|")]
    if by_size_opt:
        header += WORDS.b_train_header().split("|")
    info0 = next((i for i in d["details"] if i.get("compiled_what")), None)
    # the code's reason (WHY), not the run's stored copy: older runs stored prose with hand-typed
    # compile times; the measured ones are in the compilation table below
    what = WORDS.b_what_regional(info0["compiled_what"], WHY) if info0 else WORDS.b_what_whole()
    parts = [heading or WORDS.b_heading(), f"{what} {WORDS.b_times(stat_name(d))}\n\n" + table(header, rows)]
    if not opt.empty:
        orows = []
        for size, o in by_size_opt.items():
            e, c = o.get("eager"), o.get("compiled")
            orows.append([size, _cell(e), _cell(c), _speedup(e, c)])
        parts.append(WORDS.b_optimizer_intro() + "\n\n"
                     + table(WORDS.b_optimizer_header().split("|"), orows))
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
                         ", ".join(map(str, reused)) or (WORDS.b_every_later_step() if graph == "optimizer" else "–"),
                         i.get("graph_breaks", "–")])
        parts.append(WORDS.b_compilation_intro() + "\n\n"
                     + table(WORDS.b_compilation_header().split("|"), crow))
    if not left.empty:
        reason = left["reason"].iloc[0]
        cfgs = []
        opt_step = WORDS.b_optimizer_step()
        for (size, ctx), g in d.assign(_c=d.cfg.context.map(lambda c: opt_step if missing(c) else _i(c))
                                       ).groupby(["cfg.size", "_c"], sort=False):
            out = g[g.index.isin(left.index)]
            if out.empty:
                continue
            name = f"{size} {ctx}" if ctx == opt_step else f"{size}@{ctx}"
            if len(out) < len(g):
                name += " (" + ", ".join(f"{r.cfg.mode} {r.cfg.impl}" for _, r in out.iterrows()) + ")"
            cfgs.append(name)
        parts.append(WORDS.b_left_out(reason, cfgs))
    return "\n\n".join(parts)
