"""Report section: gradient_checkpointing (beyond the assignment), from the rows of
perf/test_gradient_checkpointing.py. Every number is read from the JSON: measured peaks (the rows'
peak allocated memory, CUDA only), predictions and terms (details), step times."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.bench.row import Status
from impl.report import figures
from impl.report.benchmarking import stat_name, step_s, study
from impl.report.markdown import missing, ms, num, table
from impl.report.templating import macros
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)
from impl.workloads.problems import Problem as P

W = macros("gradient_checkpointing.md.j2")

PROBLEM = P.GRADIENT_CHECKPOINTING
POLICY_ORDER = {"none": 0, "nested": 1, "every_k": 2}


UNIT = {"GiB": 2**30, "MiB": 2**20}


def _unit(d: pd.DataFrame) -> str:
    """GiB on a GPU; the CPU smoke's tiny model would print zeros, so MiB there."""
    peaks = [p for p in d.apply(lambda r: predicted_peak(r), axis=1) if not missing(p)] if not d.empty else []
    return "GiB" if peaks and max(peaks) >= 2**30 else "MiB"


def _fmt(nbytes, unit: str) -> str:
    return "–" if missing(nbytes) else f"{nbytes / UNIT[unit]:,.2f}"


def _study(df: pd.DataFrame, name: str) -> pd.DataFrame:
    d = df[df.problem == PROBLEM]
    if d.empty:
        return d
    return d[d.apply(study, axis=1) == name]


def _oom(r) -> bool:
    return r["status"] == Status.OOM.value


def _not_run(r) -> bool:
    """Not measured for another reason than OOM (left out by the budget, say)."""
    return r["status"] not in (Status.MEASURED.value, Status.OOM.value)


def predicted_peak(r, which: str = "hook_terms", part: str = "peak"):
    return (r["details"].get("predicted") or {}).get(which, {}).get(part)


def _label(r) -> str:
    k = r.cfg.k
    return r.cfg.policy + ("" if missing(k) else f" k={int(k)}")


def _peak_cell(r, unit: str) -> str:
    if _not_run(r):
        return "not run"
    if _oom(r):
        return "OOM"
    return "– (no CPU counter)" if missing(r["peak_alloc"]) else _fmt(r["peak_alloc"], unit)


def _ratio(r) -> str:
    p = predicted_peak(r)
    if _oom(r) or _not_run(r) or missing(r["peak_alloc"]) or not p:
        return "–"
    return f"{r['peak_alloc'] / p:.2f}"


def _time(r) -> str:
    return "not run" if _not_run(r) else ("OOM" if _oom(r) else ms(step_s(r), r["stddev"]))


def forwards_cell(r) -> str:
    i = r["details"]
    got, want = i.get("measured_block_forwards"), i.get("predicted_block_forwards")
    if want is None:
        return "–"
    return f"{'–' if got is None else int(got)} / {want}"


def sorted_by(d: pd.DataFrame) -> pd.DataFrame:
    key = d.cfg.policy.map(POLICY_ORDER) * 10_000 + d.cfg.k.fillna(0)
    return d.assign(_key=key).sort_values("_key")


def policy_table(d: pd.DataFrame) -> str:
    out, u = [], _unit(d)
    for dtype, dd in d.groupby(d.cfg.dtype, sort=False):
        rows = []
        for _, r in sorted_by(dd).iterrows():
            rows.append([_label(r), _peak_cell(r, u), _fmt(predicted_peak(r), u), _ratio(r),
                         _fmt(predicted_peak(r, "closed_form_fp32"), u), _fmt(predicted_peak(r, "hook_terms", "activations"), u), _time(r),
                         "–" if _oom(r) or _not_run(r) else num(r.get("m.tokens_per_s"), 0), forwards_cell(r)])
        out.append(W.dtype_head(dtype) + "\n\n" + table(
            ["policy", f"measured peak {u}", f"predicted peak {u}", "measured / predicted",
             f"predicted, fp32 closed form {u}", f"predicted block-stack activations {u}",
             f"step, {stat_name(d)} (ms)", "tokens/s",
             "block forwards measured / predicted"], rows))
    return "\n\n".join(out)


def terms_text(d: pd.DataFrame) -> str:
    u = _unit(d)
    has = d[d["details"].map(lambda x: "terms" in x)]
    t = has.iloc[0]["details"]["terms"] if not has.empty else {}
    hooks = []
    for dtype, dd in d.groupby(d.cfg.dtype, sort=False):
        ok = dd[dd["details"].map(lambda x: "terms" in x)]
        if ok.empty:
            continue
        h = ok.iloc[0]["details"]["terms"]["hook_terms"]
        hooks.append((dtype, _fmt(h["a_block"], u), _fmt(h["a_resid"], u), _fmt(h["a_outside"], u),
                      h["a_block"] / h["a_resid"]))
    cf = t.get("closed_form_fp32")
    return W.terms(u, cf and (_fmt(cf["a_block"], u), _fmt(cf["a_resid"], u), cf["a_block"] / cf["a_resid"]), hooks)


def depth_table(d: pd.DataFrame) -> str:
    rows, u = [], _unit(d)
    for _, r in d.sort_values(["cfg.layers", "cfg.policy"]).iterrows():
        rows.append([int(r.cfg.layers), r.cfg.policy, _peak_cell(r, u), _fmt(predicted_peak(r), u), _ratio(r),
                     _fmt(predicted_peak(r, "hook_terms", "activations"), u), _time(r), forwards_cell(r)])
    return table(["layers", "policy", f"measured peak {u}", f"predicted peak {u}", "measured / predicted",
                  f"predicted block-stack activations {u}", f"step, {stat_name(d)} (ms)",
                  "block forwards measured / predicted"],
                 rows)


def depth_plot(d: pd.DataFrame, path: Path) -> bool:
    fig, ax = figures.new()
    drawn = False
    for policy, style in (("none", "o"), ("nested", "s")):
        sel = d[(d.cfg.policy == policy)].sort_values("cfg.layers")
        if sel.empty:
            continue
        pred = sel.apply(lambda r: predicted_peak(r), axis=1).astype(float)
        ax.plot(sel.cfg.layers, pred / 2**30, "--" + style, label=f"{policy} predicted")
        meas = sel[(sel["status"] == Status.MEASURED.value) & sel["peak_alloc"].notna()]
        if not meas.empty:
            ax.plot(meas.cfg.layers, meas["peak_alloc"] / 2**30, "-" + style, label=f"{policy} measured")
        drawn = True
    if not drawn:
        return False
    ax.set(xlabel="layers", ylabel="peak GiB (forward+backward step)",
           title="gradient_checkpointing: nested vs none over depth")
    ax.legend(fontsize=8)
    figures.save(fig, path)
    return True


def body(df: pd.DataFrame, fig_dir: Path, fig_rel: str, fig_name: str) -> str | None:
    """The page's method, tables and depth figure for one device's rows."""
    pol, dep = _study(df, "policies"), _study(df, "depth")
    if pol.empty and dep.empty:
        return None
    parts = [W.method()]
    if not pol.empty:
        i = pol["details"].iloc[0]
        c = pol.iloc[0]
        parts.append(W.best_k(c.cfg.size, int(c.cfg.batch), int(c.cfg.context), i.get("best_k"), i.get("best_k_rule"),
                              i.get("ks"), terms_text(pol)))
        parts.append(policy_table(pol))
    left = pd.concat([pol, dep])
    left = left[left.apply(_not_run, axis=1)] if not left.empty else left
    if not dep.empty:
        c = dep.iloc[0]
        parts.append(W.depth_head(c.cfg.width, int(c.cfg.batch), int(c.cfg.context), c.cfg.dtype))
        parts.append(depth_table(dep))
        if depth_plot(dep, fig_dir / fig_name):
            parts.append(f"![peak vs layers]({fig_rel}/{fig_name})")
    if not left.empty:
        parts.append(W.not_run(list(left.name), left["reason"].iloc[0]))
    return "\n\n".join(parts)
