"""Tables of 1.2 attention, used by impl.report.pages.attention: pytorch_attention (+ memory accounting)
and torch_compile (a); times are pytest-benchmark's medians. (The FlashAttention pages read their rows
through impl.report.flash_rows.)"""
from __future__ import annotations

import pandas as pd

from impl.attention.memory import flash_saved_for_backward, naive_attention_memory
from impl.bench.row import Status
from impl.report.markdown import gib, missing, ms, num, table
from impl.report.templating import macros
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)

STATUS_LABELS = {Status.OOM.value: "OOM", Status.UNSUPPORTED.value: "unsupported", Status.LEFT_OUT.value: "left out",
                 Status.LEFT_OUT_BY_BUDGET.value: "left out (budget)", Status.NEEDS_HARDWARE.value: "needs hardware",
                 Status.FAILED.value: "failed"}


def detail_of(r, key, default=None):
    return (r["details"] or {}).get(key, default)


def status(r) -> str | None:
    """Cell text for a row that has no timing: OOM, unsupported, left out; None if it ran."""
    return None if r["status"] == Status.MEASURED.value else STATUS_LABELS.get(r["status"], r["status"])


def ran(r) -> bool:
    return status(r) is None


def median_ms(r) -> float:
    """The row's median in milliseconds."""
    return r["median"] * 1e3


def problem_rows(df, problem, study=None) -> pd.DataFrame:
    d = df[df.problem == problem]
    if study is not None and not d.empty:
        d = d[d["details"].map(lambda i: (i or {}).get("study")) == study]
    return d


def newest_date(d: pd.DataFrame) -> str:
    """The newest row's date (UTC, YYYY-MM-DD)."""
    return str(d["datetime"].max())[:10]


def pick(d: pd.DataFrame, **cfg):
    """The one ran row whose config keys equal the given values, or None."""
    sel = d[d.apply(ran, axis=1)] if not d.empty else d
    for k, v in cfg.items():
        sel = sel[getattr(sel.cfg, k) == v]  # a key no row has reads as None: nothing matches
    return None if sel.empty else sel.iloc[0]


def not_run_reasons(d: pd.DataFrame) -> str:
    """The distinct reasons rows were not run, listed once each."""
    seen = []
    for _, r in d.iterrows():
        if r["reason"] and status(r) and (status(r), r["reason"]) not in seen:
            seen.append((status(r), r["reason"]))
    return "\n".join(f"- {s}: {reason}" for s, reason in seen)


# --- pytorch_attention -------------------------------------------------------------------------

def _rel(r, key):
    v, base = detail_of(r, key), detail_of(r, "baseline_bytes")
    return None if v is None or base is None else v - base


def pytorch_attention_table(d: pd.DataFrame) -> str:
    rows = []
    for (dm, seq), g in d.groupby([d.cfg.d_model, d.cfg.seq]):
        by = {r.cfg.mode: r for _, r in g.iterrows()}
        f, b = by.get("forward"), by.get("backward")
        cell = lambda r: "–" if r is None else (status(r) or ms(r["median"]))  # noqa: E731
        mem = "–" if b is None else (status(b) or gib(_rel(b, "memory_before_backward_bytes")))
        base = None if b is None else detail_of(b, "baseline_bytes")
        peak = ("–" if b is None or not ran(b) or missing(b["peak_alloc"]) or base is None
                else gib(b["peak_alloc"] - base))
        derived = naive_attention_memory(int(g.cfg.batch.iloc[0]), int(seq), int(dm), g.cfg.dtype.iloc[0])
        rows.append([int(dm), int(seq), cell(f), cell(b),
                     "–" if f is None or not ran(f) else num(f.get("m.tflops"), 2),
                     mem, gib(derived.before_backward), peak, gib(derived.backward_peak)])
    return table(macros("pytorch_attention.md.j2").table_header().split("|"), rows)


def accounting_case(d: pd.DataFrame):
    """The smallest OOM case, else the largest case that ran (by seq, then d)."""
    ooms = d[d.status == Status.OOM.value]
    if not ooms.empty:
        r = ooms.sort_values(["cfg.seq", "cfg.d_model"]).iloc[0]
        return int(r.cfg.d_model), int(r.cfg.seq), True
    ok = d[d.apply(ran, axis=1)]
    if ok.empty:
        return None
    r = ok.sort_values(["cfg.seq", "cfg.d_model"]).iloc[-1]
    return int(r.cfg.d_model), int(r.cfg.seq), False


def memory_accounting(d: pd.DataFrame) -> str | None:
    case = accounting_case(d)
    if case is None:
        return None
    dm, seq, is_oom = case
    batch, dtype = int(d.cfg.batch.iloc[0]), d.cfg.dtype.iloc[0]
    m = naive_attention_memory(batch, seq, dm, dtype)
    sel = d[(d.cfg.d_model == dm) & (d.cfg.seq == seq)]
    by = {r.cfg.mode: r for _, r in sel.iterrows()}
    b, f = by.get("backward"), by.get("forward")

    def measured(r, key, minus=0):
        if r is None:
            return "–"
        if not ran(r):
            return status(r)
        v = r["peak_alloc"] if key == "peak" else detail_of(r, key)
        base = detail_of(r, "baseline_bytes")
        return "–" if v is None or base is None else gib(v - base - minus)

    words = macros("pytorch_attention.md.j2")
    derived = [m.qkv, m.output + m.grad_output, m.scores_matrix, m.saved_for_backward, m.before_backward,
               m.forward_peak + m.grad_output, m.backward_peak]
    measured_ = ["", "", "", "", measured(b, "memory_before_backward_bytes"), measured(f, "peak"), measured(b, "peak")]
    rows = [[what, gib(x), y] for what, x, y in zip(words.accounting_rows().split("|"), derived, measured_)]
    share = m.scores_matrix / m.before_backward
    flash = flash_saved_for_backward(batch, seq, dm, dtype)
    total = d["row"].iloc[0].env.gpu_memory_bytes
    return "\n\n".join([words.accounting_head(dm, seq, is_oom), words.accounting_text(batch, dtype, share, flash, total),
                        table(words.accounting_header().split("|"), rows)])


# --- torch_compile (a) ---------------------------------------------------------------------------

def torch_compile_table(comp: pd.DataFrame, eager: pd.DataFrame) -> str:
    rows = []
    for (dm, seq), g in comp.groupby([comp.cfg.d_model, comp.cfg.seq]):
        row = [int(dm), int(seq)]
        cby = {r.cfg.mode: r for _, r in g.iterrows()}
        e = eager[(eager.cfg.d_model == dm) & (eager.cfg.seq == seq)]
        eby = {r.cfg.mode: r for _, r in e.iterrows()}
        for mode in ("forward", "backward"):
            er, cr = eby.get(mode), cby.get(mode)
            cells = ["–" if x is None else (status(x) or ms(x["median"])) for x in (er, cr)]
            same = er is not None and cr is not None and (er["section"], er["datetime"]) == (cr["section"], cr["datetime"])
            speed = ("–" if not same or not ran(er) or not ran(cr)  # a ratio within one run only
                     else f"{cr['median'] / er['median']:.2f}×")
            row += cells + [speed]
        anyc = next(iter(cby.values()))
        row += [num(detail_of(anyc, "compile_forward_s"), 1), num(detail_of(anyc, "compile_backward_s"), 1)]
        cb, eb = cby.get("backward"), eby.get("backward")
        row += ["–" if x is None or not ran(x) or _rel(x, "memory_before_backward_bytes") is None
                else gib(_rel(x, "memory_before_backward_bytes")) for x in (eb, cb)]
        rows.append(row)
    return table(macros("torch_compile.md.j2").a_table_header().split("|"), rows)
