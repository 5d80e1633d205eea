"""Report sections 2-3: distributed_communication_single_node (table, bus-bandwidth plot, o/w fit),
the DDP benchmarks (step time, communication share, overhead against the single-GPU floor and
torch DDP), the bucket model checked against the measured bucket sizes, the profiler timeline of
naive vs bucketed DDP. Every number is read from the rows of perf/test_distributed_communication.py
and perf/test_ddp.py."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from impl import accounting as acc
from impl.bench.row import Metric, Status
from impl.workloads.variants import DDPVariant
from impl.report import figures
from impl.report.templating import macros
from impl.workloads.problems import Problem as P, StoredGroup
from impl.report.markdown import gib, missing, ms, num, pct, table
from impl.report.rows import size_label  # (also registers the typed .cfg accessors of rows and frames)

DDP_PROBLEMS = [StoredGroup.DDP_BENCHMARKING_ANCHORS, P.NAIVE_DDP_BENCHMARKING, P.MINIMAL_DDP_FLAT_BENCHMARKING,
                P.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING, P.DDP_BUCKETED_BENCHMARKING]
DDP = macros("ddp.md.j2")
VARIANT_LABEL = {v.value: v.label for v in DDPVariant}
VARIANT_ORDER = list(VARIANT_LABEL)


def _info(r, key, default=None):
    return r["details"].get(key, default)


def _not_run(r) -> str | None:
    return None if r["status"] == Status.MEASURED.value else f"not run ({r['status']}: {r['reason']})"


def figure(r, key, metric: Metric | None = None):
    """A figure of a distributed row: its Metric column, the mean of its timed steps
    (details["steps"], impl.workloads.dist_steps.StepSummary), a details key, or where the older
    format kept it (its free-form metrics, impl.report.legacy)."""
    if metric is not None and not missing(r.get(f"m.{metric.value}")):
        return r[f"m.{metric.value}"]
    d = r["details"]
    for source in (d.get("steps") or {}, d, d.get("legacy_metrics") or {}):
        if source.get(key) is not None:
            return source[key]
    return None


def _mb(nbytes) -> str:
    return "–" if missing(nbytes) else f"{nbytes / 2**20:,.0f}"


def _gb(nbytes, digits=2) -> str:
    return "–" if missing(nbytes) else f"{nbytes / 1e9:,.{digits}f}"


class _Unit:
    """GiB / GB for the real model sizes, MiB / MB for the smoke model (else every cell reads 0.01)."""

    def __init__(self, typical_bytes):
        big = not missing(typical_bytes) and typical_bytes >= 2**30
        self.bin, self.bin_name = (2**30, "GiB") if big else (2**20, "MiB")
        self.dec, self.dec_name = (1e9, "GB") if big else (1e6, "MB")

    def b(self, nbytes) -> str:
        return "–" if missing(nbytes) else f"{nbytes / self.bin:,.2f}"

    def d(self, nbytes) -> str:
        return "–" if missing(nbytes) else f"{nbytes / self.dec:,.2f}"


# ---------------------------------------------------------------------------------------------
# all-reduce


def allreduce_fits(d: pd.DataFrame) -> dict:
    """{(backend, processes): {o_s, w_Bps}} of the all-reduce rows of `d`: the DDP page's bucket model
    reads them (impl.report.pages.distributed_communication.allreduce_fits)."""
    from impl.report.pages.distributed_communication import allreduce_fits as fits
    from impl.report.rows import benches

    return {(x.backend, x.processes): dict(o_s=x.o_s, w_Bps=x.w_bps) for x in fits(benches(d))}


# ---------------------------------------------------------------------------------------------
# DDP


def variant_label(r) -> str:
    v = r.cfg.variant
    return f"bucketed {r.cfg.bucket_mb:g} MB" if v == "bucketed" else VARIANT_LABEL.get(v, v)


def _gap_text(by: dict, floor, anchor) -> str | None:
    """Where the best DDP's time over the single-GPU floor goes: the exposed communication the
    ranks measured, and the rest (hooks, flattening copies, launch and sync gaps)."""
    ours = [r for (v, _), r in by.items()
            if v not in ("single", "torch_ddp") and not _not_run(r) and not missing(r["median"])]
    if not ours or floor is None or _not_run(floor) or missing(floor["median"]):
        return None
    best = min(ours, key=lambda r: r["median"])
    comm = figure(best, "comm_s")
    has_anchor = anchor is not None and not _not_run(anchor) and not missing(anchor["median"])
    return DDP.gap(variant_label(best), best["median"], best["stddev"], floor["median"], floor["stddev"],
                   None if missing(comm) else comm, anchor["median"] if has_anchor else None)


def ddp_section(d: pd.DataFrame) -> tuple[str, dict]:
    """The DDP tables; returns also {context: {bucket_mb: (step_s, comm_s)}} and the gradient bytes."""
    bench = d[d.cfg.kind != "trace"]  # older files: trace rows apart
    out, buckets = [], {}
    first = bench.iloc[0]
    out.append(DDP.method(size_label(first.cfg.size_ref, first.cfg.size), int(first.cfg.world_size), first.cfg.backend))
    grad_bytes = None
    for (ctx, batch), g in bench.groupby([bench.cfg.context, bench.cfg.batch_per_rank]):
        ctx, batch = int(ctx), int(batch)
        by = {}
        for _, r in g.iterrows():
            by[(r.cfg.variant, r.cfg.bucket_mb if r.cfg.variant == "bucketed" else None)] = r
        floor, anchor = by.get(("single", None)), by.get(("torch_ddp", None))
        rows = []
        keys = sorted(by, key=lambda k: (VARIANT_ORDER.index(k[0]) if k[0] in VARIANT_ORDER else 99, k[1] or 0))
        for k in keys:
            r = by[k]
            nr = _not_run(r)
            if nr:
                rows.append([variant_label(r), nr, "", "", "", "", ""])
                continue
            grad_bytes = grad_bytes or _info(r, "grad_bytes")
            ratio = lambda ref: ("–" if ref is None or _not_run(ref) or missing(ref["median"])
                                 else f"{r['median'] / ref['median']:.2f}×")
            rows.append([variant_label(r), ms(r["median"], r["stddev"]), ms(figure(r, "comm_s")),
                         pct(figure(r, "comm_share", Metric.COMM_SHARE)), gib(r["peak_alloc"]), ratio(floor),
                         ratio(anchor)])
            if k[0] == "bucketed":
                buckets.setdefault(ctx, {})[k[1]] = BucketRun(r["median"], r["stddev"], figure(r, "comm_s"),
                                                              _info(r, "num_buckets"))
        out.append(DDP.context_head(ctx, batch) + "\n\n" + table(DDP.variants_header().split("|"), rows))
        gap = _gap_text(by, floor, anchor)
        if gap:
            out.append(gap)
    return "\n\n".join(out), dict(buckets=buckets, grad_bytes=grad_bytes,
                                  backend=first.cfg.backend, world_size=int(first.cfg.world_size))


@dataclass(frozen=True)
class BucketRun:
    """One measured bucket size of ddp_overlap_bucketed: step median and spread, the exposed
    communication, and how many buckets DDPBucketed formed (None in files that did not record it)."""

    step_s: float
    step_std: float | None
    comm_s: float | None
    n_buckets: int | None


def within_noise(a: BucketRun, b: BucketRun) -> bool:
    """Two step times whose ± 1 std spreads overlap."""
    return abs(a.step_s - b.step_s) <= (a.step_std or 0.0) + (b.step_std or 0.0)


def overlap_shares(d: pd.DataFrame) -> dict[str, float]:
    """variant label -> share of its profiled communication that overlapped compute (timeline rows)."""
    tr = d[d["details"].map(lambda i: "timeline" in i)] if not d.empty else d
    out = {}
    for _, r in tr.iterrows():
        tl = _info(r, "timeline")
        comm = tl["busy_us"]["communication"]
        if comm:
            out[variant_label(r)] = tl["overlap_us"] / comm
    return out


def bucket_model_section(fits: dict, ddp: dict, overlap: dict[str, float] | None = None) -> str | None:
    """ddp_overlap_bucketed (b): T(n_b) with o, w fitted to the same device's all-reduces, at the
    equal buckets the model assumes and at the buckets DDPBucketed formed, against the measured
    exposed communication; why they differ, from the measurements."""
    fit = fits.get((ddp["backend"], ddp["world_size"]))
    s = ddp["grad_bytes"]
    if not ddp["buckets"] or s is None:
        return None
    u = _Unit(s)
    out = [DDP.model_intro(u.d(s), u.dec_name, ddp["backend"], ddp["world_size"], fit)]
    if fit is None:
        return "\n\n".join(out)
    o, w = fit["o_s"], fit["w_Bps"]
    best = acc.optimal_bucket_bytes(s, o, w) / 2**20
    out.append(DDP.model_optimum(best, acc.optimal_n_buckets(s, o, w), acc.min_bucketed_overhead(s, o, w)))
    for ctx, b in sorted(ddp["buckets"].items()):
        grid = sorted(b)
        rows = [[f"{mb:g}", "–" if run.n_buckets is None else run.n_buckets,
                 f"{acc.overhead_for_bucket_size(s, mb * 2**20, o, w) * 1e3:.2f}",
                 "–" if not run.n_buckets else f"{acc.bucketed_overhead(s, run.n_buckets, o, w) * 1e3:.2f}",
                 ms(run.comm_s), ms(run.step_s, run.step_std)] for mb, run in sorted(b.items())]
        fastest = min(b, key=lambda mb: b[mb].step_s)
        ties = [f"{mb:g} MB" for mb in grid if mb != fastest and within_noise(b[mb], b[fastest])]
        below, above = [mb for mb in grid if mb <= best], [mb for mb in grid if mb >= best]
        where = (DDP.where_between(below[-1], above[0]) if below and above and below[-1] != above[0]
                 else DDP.where_at((below or above)[-1 if below else 0]) if below and above
                 else DDP.where_outside(grid[0], grid[-1]))
        text = DDP.model_context(ctx, fastest, ties, best, where)
        out.append(text + "\n\n" + table(DDP.bucket_header().split("|"), rows))
    out.append(_bucket_gap_text(s, o, w, ddp["buckets"], overlap or {}))
    return "\n\n".join(x for x in out if x)


def _bucket_gap_text(s: float, o: float, w: float, buckets: dict, overlap: dict[str, float]) -> str | None:
    """Why the model and the measurements differ, in the measurements' own numbers: (1) the model's
    buckets split parameters, DDPBucketed's never do; (2) the model hides all but the last bucket,
    the profiled step shows how much communication really overlapped compute."""
    ctx = min(buckets)
    b = buckets[ctx]
    small, large = min(b), max(b)
    parts = []
    sb, lb, whole = b[small], b[large], s / w
    if sb.n_buckets:
        parts.append(DDP.model_small(small, s / (small * 2**20), sb.n_buckets, acc.bucketed_overhead(s, sb.n_buckets, o, w),
                                     acc.overhead_for_bucket_size(s, small * 2**20, o, w), ctx, sb.comm_s))
    if lb.comm_s is not None:
        parts.append(DDP.model_large(large, acc.overhead_for_bucket_size(s, large * 2**20, o, w), lb.comm_s, ctx,
                                     whole, overlap))
    return " ".join(parts) or None


def _render_timeline(rows: list, path: Path, title: str | None = None) -> None:
    """One panel per variant, a lane each for compute and communication. The JSON keeps each lane's
    kernels merged across short gaps (impl.bench.traces), so a drawn bar can span idle time; each
    lane is shaded by its busy share (busy ÷ drawn) and labelled with both, so a bar never reads as
    busier than the table says."""
    fig, axes = figures.plt.subplots(len(rows), 1, figsize=(9.5, 1.9 * len(rows) + 0.9), squeeze=False)
    if title:
        fig.suptitle(title, fontsize=10, x=0.02, ha="left")
    for k_ax, (ax, (label, tl)) in enumerate(zip(axes[:, 0], rows)):
        ticks = []
        for y, lane, color in ((1, "compute", "C0"), (0, "communication", "C3")):
            bars = tl["lanes"][lane]
            drawn = sum(dur for _, dur in bars)
            busy = tl["busy_us"][lane]
            alpha = max(0.1, min(1.0, busy / drawn)) if drawn else 1.0
            ax.broken_barh([(st / 1e3, max(dur / 1e3, 1e-3)) for st, dur in bars], (y - 0.35, 0.7), color=color,
                           alpha=alpha)
            ticks.append(f"{lane}\n{DDP.timeline_busy(f'{busy / 1e3:.0f}', f'{drawn / 1e3:.0f}')}")
        for k, p in enumerate(tl["phases"]):
            ax.axvspan(p["start_us"] / 1e3, (p["start_us"] + p["dur_us"]) / 1e3, color=f"C{k + 4}", alpha=0.12,
                       label=p["name"])
        ax.set(yticks=[1, 0], xlabel=DDP.timeline_x())
        ax.set_yticklabels(ticks, fontsize=7)
        ax.set_title(label, fontsize=9, loc="left")
        if k_ax == 0:  # the same phases in every panel: one legend, beside the first
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, title="phase",
                      title_fontsize=7)
    figures.save(fig, path)


def timeline_section(d: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    tr = d[d["details"].map(lambda i: "timeline" in i)]
    if tr.empty:
        return None
    rows, stats = [], []
    for _, r in tr.iterrows():
        tl = _info(r, "timeline")
        label = variant_label(r)
        rows.append((label, tl))
        busy = tl["busy_us"]
        stats.append([label, ms(tl["span_us"] / 1e6), ms(busy["compute"] / 1e6), ms(busy["communication"] / 1e6),
                      ms(tl["overlap_us"] / 1e6),
                      pct(tl["overlap_us"] / busy["communication"]) if busy["communication"] else "–"])
    name = f"{device}_ddp_timeline.png"
    first = tr.iloc[0]
    _render_timeline(rows, fig_dir / name, DDP.timeline_title(size_label(first.cfg.size_ref, first.cfg.size),
                                                              int(first.cfg.context), int(first.cfg.batch_per_rank)))
    src = rows[0][1]["source"]
    traced = ", ".join(label for label, _ in rows)
    variants = set(tr.cfg.variant)
    bucketed_for_overlap = "bucketed" in variants and "individual" not in variants
    return "\n\n".join([
        DDP.timeline_intro(src, int(first.cfg.context), int(first.cfg.batch_per_rank), traced, bucketed_for_overlap),
        f"![{DDP.timeline_alt()}]({fig_rel}/{name})", table(DDP.timeline_header().split("|"), stats)])
