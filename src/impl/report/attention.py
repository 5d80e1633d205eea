"""Tables of 1.3 attention, used by impl.report.pages.flash: flash_benchmarking (grids, longest sequence reached), flash_shapes and
leaderboard.

Times are pytest-benchmark's medians: for kernel rows (flash_benchmarking, flash_shapes,
leaderboard) the kernel time (CUDA-event timer); for older files the loader puts the do_bench
median there (impl.report.legacy)."""
from __future__ import annotations

import re

import pandas as pd

from impl.bench.row import Status
from impl.report.markdown import missing, num, pct, table
from impl.report.templating import macros
import impl.report.rows  # noqa: F401  (registers the typed .cfg accessors of rows and frames)

IMPL_LABELS = {
    "flash_triton": "ours (Triton fwd + Triton bwd)",
    "flash_triton_compiled_bwd": "ours (Triton fwd + compiled bwd)",
    "flash_triton_compiled": "torch.compile(ours)",
    "naive": "naive PyTorch",
    "sdpa_flash": "SDPA flash backend",
    "sdpa_cudnn": "SDPA cuDNN backend",
}
IMPL_ORDER = list(IMPL_LABELS)
MODE_LABELS = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
DTYPE_ORDER = ["bf16", "fp16", "fp32"]


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


# --- flash_benchmarking -------------------------------------------------------------------------------

def impls_of(d):
    return [i for i in IMPL_ORDER if i in set(d.cfg.impl)]


def _kernel_cell(r) -> str:
    s = status(r)
    if s:
        return s
    return f"{median_ms(r):.3f} ({num(r.get('m.tflops'), 1)})"


def flash_grid(d: pd.DataFrame) -> pd.DataFrame:
    """Every (dtype, pass, d, seq) of a flash_benchmarking run, one column per implementation:
    "ms (TFLOP/s)" or why it did not run; the page writes it as CSV."""
    impls = impls_of(d)
    lines = []
    for (dtype, mode, dim, seq), g in d.groupby([d.cfg.dtype, d.cfg.mode, d.cfg.d, d.cfg.seq]):
        by = {r.cfg.impl: r for _, r in g.iterrows()}
        lines.append({"dtype": dtype, "pass": MODE_LABELS[mode], "d": int(dim), "seq": int(seq)}
                     | {f"{IMPL_LABELS[i]}: ms (TFLOP/s)": _kernel_cell(by[i]) if i in by else "" for i in impls})
    return pd.DataFrame(lines)


def longest_sequence(d: pd.DataFrame) -> str:
    """Per implementation, dtype and d: the longest sequence whose forward+backward ran, and what
    stopped the next one (OOM, unsupported, left out) when something did."""
    e2e = d[d.cfg.mode == "fwd_bwd"]
    dims = sorted(e2e.cfg.d.unique())
    rows = []
    for impl in impls_of(e2e):
        for dtype in sorted(e2e.cfg.dtype.unique(), key=DTYPE_ORDER.index):
            row = [IMPL_LABELS[impl], dtype]
            for dim in dims:
                g = e2e[(e2e.cfg.impl == impl) & (e2e.cfg.dtype == dtype) & (e2e.cfg.d == dim)]
                g = g.sort_values("cfg.seq")
                ok = [int(r.cfg.seq) for _, r in g.iterrows() if ran(r)]
                stop = [(int(r.cfg.seq), status(r)) for _, r in g.iterrows() if not ran(r)]
                best = str(max(ok)) if ok else "none"
                if stop and (not ok or stop[-1][0] > max(ok)):
                    first = next(s for s in stop if not ok or s[0] > max(ok))
                    best += f" ({first[1]} at {first[0]})"
                row.append(best if len(g) else "–")
            rows.append(row)
    return table(["implementation", "dtype"] + [f"d {int(x)}" for x in dims], rows)


#: Sequences up to this length are host-bound in flash_benchmarking (NOTES.md): one call's Python,
#: autotuner lookup and launches cost more than its kernels, so their times follow the host.
SHORT_SEQ = 4096


# --- flash_shapes ----------------------------------------------------------------------------------------

def timer_name(r) -> str | None:
    """The clock of a row: its timing record, or the older format's `timer` detail."""
    timing = r["row"].timing
    return timing.timer if timing is not None else detail_of(r, "timer")


def flash_shapes_table(d: pd.DataFrame) -> pd.DataFrame:
    """Per shape and pass: ours eager and compiled, the faster anchor of the same run, and each of
    ours over it (< 1: ours is faster); the page writes it as CSV."""
    rows = []
    key = ["cfg.dtype", "cfg.d", "cfg.causal", "cfg.batch", "cfg.heads", "cfg.seq", "cfg.mode"]
    order = {m: i for i, m in enumerate(MODE_LABELS)}
    for (dtype, dim, causal, b, h, seq, mode), g in sorted(
            d.groupby(key), key=lambda kv: (kv[0][0], -kv[0][1], not kv[0][2], kv[0][5], order[kv[0][6]])):
        by = {r.cfg.impl: r for _, r in g.iterrows()}
        anchors = [by[i] for i in ("sdpa_cudnn", "sdpa_flash") if i in by and ran(by[i])]
        best = min(anchors, key=lambda r: r["median"]) if anchors else None

        def cell(impl):
            r = by.get(impl)
            return "–" if r is None else (status(r) or f"{median_ms(r):.3f}")

        def ratio(impl):
            r = by.get(impl)
            return "–" if r is None or best is None or not ran(r) else f"{r['median'] / best['median']:.2f}×"
        anchor = "–" if best is None else f"{median_ms(best):.3f} ({IMPL_LABELS[best.cfg.impl].replace('SDPA ', '')})"
        rows.append([dtype, int(dim), "yes" if causal else "no", f"{int(b)}×{int(h)}×{int(seq)}", MODE_LABELS[mode],
                     cell("flash_triton"), cell("flash_triton_compiled"), anchor, ratio("flash_triton"),
                     ratio("flash_triton_compiled")])
    return pd.DataFrame(rows, columns=["dtype", "d", "causal", "batch×heads×seq", "pass", "ours eager (ms)",
                                       "ours compiled (ms)", "faster anchor (ms)", "eager / anchor",
                                       "compiled / anchor"])


# --- leaderboard ---------------------------------------------------------------------------------------------

def leaderboard_table(d: pd.DataFrame) -> str:
    rows = []
    for _, r in d.iterrows():
        err = detail_of(r, "rel_err") or {}
        impl = r.cfg.impl
        label = IMPL_LABELS.get(impl, impl)
        if impl == "flash_triton":
            label = macros("leaderboard.md.j2").ours_label(bool(detail_of(r, "compiled")))
        s = status(r)
        rows.append([label, MODE_LABELS[r.cfg.mode], s or f"{median_ms(r):.3f}",
                     "–" if s else num(r.get("m.do_bench_ms"), 3), "–" if s else num(r.get("m.tflops"), 1),
                     "–" if s else pct(r.get("m.mfu")),
                     *[("–" if missing(err.get(k)) else f"{err[k]:.1e}") for k in ("out", "dq", "dk", "dv")]])
    return table(macros("leaderboard.md.j2").table_header().split("|"), rows)


def short_config(text) -> str:
    """'BLOCK_M: 64, BLOCK_N: 128, num_warps: 4, ..., num_stages: 3, ...' -> '64×128 w4 s3'; other
    launch-record values (the tiling label, the variant, the tma flag) as they are."""
    if not isinstance(text, str):
        return str(text)
    v = dict(re.findall(r"(\w+): (\w+)", text))
    if "BLOCK_M" not in v:
        return text
    return f"{v['BLOCK_M']}×{v['BLOCK_N']} w{v.get('num_warps', '?')} s{v.get('num_stages', '?')}"
