"""Tables of nsys_profile (read by impl.report.pages.profiling). Everything is read from the saved JSON."""
from __future__ import annotations


import pandas as pd

from impl.bench.row import Status
from impl.model import size_rank
from impl.report.benchmarking import stat_name, step_s
from impl.report.nsys_facts import forward_non_matmul
from impl.report.templating import macros
from impl.workloads.problems import Problem as P
from impl.report.markdown import ms, num, pct, table
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


NSYS = macros("nsys_profile.md.j2")


def _train_share(n: dict) -> str:
    """(d) matmul share of the training step, or what the profile fell back to (OOM)."""
    profiled = n.get("profiled") or ("forward" if n.get("train_oom") else "train_step")
    if profiled == "train_step":
        return pct(n["matmul_share_train_step"])
    if profiled == "forward_backward":  # the share over forward+backward is still a training figure
        return f"{pct(n['matmul_share_train_step'])} ({NSYS.fwd_bwd_only()})"
    return NSYS.profiled_label(profiled)


def nsys_body(df: pd.DataFrame) -> str | None:
    """The nsys_profile tables (per config, kernel tables of the middle config, category shares)."""
    d = _p(df, P.NSYS_PROFILE)
    if d.empty:
        return None
    d = sorted_by(d, "cfg.context")
    src = next((i["nsys"]["timing_source"] for i in d["details"] if i.get("nsys")), "kernels")
    parts = [NSYS.method(NSYS.unit(src == "kernels"))]
    ns = [i["nsys"] for i in d["details"] if i.get("nsys")]
    steps = sorted({n.get("steps_profiled") for n in ns})
    parse = [n["parse_s"] for n in ns if n.get("parse_s") is not None]
    if ns and parse:
        warm = sorted({n["warmup_steps"] for n in ns if n.get("warmup_steps") is not None})
        parts.append(NSYS.recorded(steps, warm, num(sum(parse), 1), len(parse), num(max(parse), 2)))
    rows = []
    for _, r in d.iterrows():
        n = r["details"].get("nsys")
        if r["status"] not in (MEASURED, OOM):
            rows.append([r.cfg.size, _i(r.cfg.context), NSYS.left_out()] + ["–"] * 9)
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
    parts.append(NSYS.per_config_intro(stat_name(d)) + "\n\n" + table(NSYS.per_config_header().split("|"), rows))
    ok = d[d["details"].map(lambda i: bool(i.get("nsys")))]
    if not ok.empty:
        r = ok.iloc[len(ok) // 2]
        n = r["details"]["nsys"]
        parts.append(NSYS.kernel_tables_head(r.cfg.size, _i(r.cfg.context)))
        for phase in ("forward", "forward+backward", "optimizer step"):
            rows_ = n["tables"].get(phase) or []
            if rows_:
                parts.append(NSYS.phase_head(phase, n["steps_profiled"]) + "\n\n"
                             + table(NSYS.kernel_header().split("|"), _kernel_rows(rows_)))
        nm = forward_non_matmul(n)
        parts.append(NSYS.non_matmul(nm.threshold, nm.kernels[:8]))
        cs = n["category_share"]
        parts.append(NSYS.category_intro() + "\n\n" + table(
            NSYS.category_header().split("|"), [[c, pct(cs["forward"][c]), pct(cs["train step"][c])]
                                                for c in cs["forward"]]))
    art = [i.get("artifact") for i in d["details"] if i.get("artifact")]
    if art:
        parts.append(NSYS.artifact(art[0]))
    skipped = [i.get("artifact_skipped") for i in d["details"] if i.get("artifact_skipped")]
    if skipped:
        parts.append(NSYS.artifact_skipped(skipped[0]))
    return "\n\n".join(parts)
