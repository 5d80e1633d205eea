"""nsys_profile: one `Case` per row of the first GPU device (its torch.profiler profile where it has one), each
edition answered apart; beside them, an `NsysRow` per case of the newest filed nsys call (impl.nsys.store), read
from Nsight Systems' own tables and matched to torch.profiler's row of the same edition, size and context."""
from __future__ import annotations

import re
from dataclasses import dataclass

from impl.bench.row import Status
from impl.model import SizeRef, size_rank
from impl.nsys.outputs import CaseRecord
from impl.nsys.tables import read_kernel_summary, read_nvtx_kernels, read_nvtx_summary
from impl.report.markdown import missing
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages._nsys import Filed, newest_with
from impl.report.rows import RowView, SizedView, group, stat_name
from impl.report.runs import RunsFacts, SourcedFromRuns, newest_date
from impl.workloads.kernels import attention_part_flops, classify_kernel
from impl.workloads.problems import Problem as P

PROBLEMS = (P.NSYS_PROFILE,)
PROBLEM = P.NSYS_PROFILE
PHASES = ("forward", "forward+backward", "optimizer step")  # the kernel tables the page prints
TOP_KERNELS = 8  # rows of each kernel table
_OP = re.compile(r"(\w+Functor|\w+_kernel\w*|softmax_warp_forward|Memcpy \w+|\w+_reduce\w*)")


@dataclass(frozen=True)
class Kernel:
    name: str  # as the profiler names it
    category: str  # matmul, elementwise, softmax, copy, reduction, ...
    share: float  # of its phase's kernel time
    calls: int
    time_us: float | None = None

    of = classmethod(lambda cls, r: cls(r["name"], r["category"], r["share"], int(r["calls"]), r.get("time_us")))

    @property
    def op(self) -> str:  # a readable handle: the functor or kernel the long name is built around
        found = [m for m in _OP.findall(self.name) if m not in ("elementwise_kernel", "vectorized_elementwise_kernel")]
        return found[-1] if found else self.name[:40]


@dataclass(frozen=True)
class ForwardNonMatmul:
    threshold: float  # share of the forward's kernel time counted as non-trivial
    kernels: list[Kernel]  # above it, largest first

    total_share = property(lambda self: sum(k.share for k in self.kernels))


def forward_non_matmul(nsys: dict) -> ForwardNonMatmul:
    threshold = nsys.get("nontrivial_threshold", 0.01)
    ks = [Kernel.of(r) for r in (nsys.get("tables") or {}).get("forward") or []
          if r["category"] != "matmul" and r["share"] >= threshold]
    return ForwardNonMatmul(threshold, sorted(ks, key=lambda k: -k.share))


@dataclass(frozen=True)
class Case(SizedView, RowView):
    """One row and, where it ran, its torch.profiler profile `n` (details["nsys"] as perf/test_nsys_profile.py stores
    it; the template reads its keys) against the Python timer of the same forward."""

    context: int | None = None

    n = property(lambda self: self.details.get("nsys") if self.status is Status.MEASURED else None)
    timer_ms = property(lambda self: self.step_s * 1e3)  # pytest-benchmark's time of the same forward
    top_calls = property(lambda self: int(self.n["top_forward"]["calls_per_pass"]))  # the top kernel's, per forward
    busy = property(lambda self: self.n["forward_kernel_ms"] / self.timer_ms)  # kernel time ÷ the timer
    range_agrees = property(lambda self: abs(self.n["forward_range_ms"] / self.timer_ms - 1) <= 0.1)  # within 10%
    softmax_per_flop = property(lambda self: self.n["softmax_to_matmuls_time_ratio"]
                                / self.n["softmax_to_matmuls_flop_ratio"])
    non_matmul = property(lambda self: forward_non_matmul(self.n))
    need_bytes = property(lambda self: (self.details.get("memory_need") or {}).get("total"))  # closed-form fp32 step

    @property
    def outcome(self) -> str:  # "measured" (profiled), "oom" (or measured without a profile), "left out"
        return "measured" if self.n else "oom" if self.status in (Status.MEASURED, Status.OOM) else "left out"

    @property
    def profiled(self) -> str:  # what the profile covers beyond the forward: train_step, forward_backward, forward...
        return self.n.get("profiled") or ("forward" if self.n.get("train_oom") else "train_step")

    @property
    def matmul_train(self) -> float | None:  # the training step's matmul share; None where it was not profiled
        return self.n.get("matmul_share_train_step") if self.profiled == "train_step" else None

    @property
    def phases(self) -> list[tuple[str, list[Kernel]]]:  # (phase, its top rows) of PHASES that have rows
        tables = self.n["tables"]
        return [(p, [Kernel.of(r) for r in tables[p][:TOP_KERNELS]]) for p in PHASES if tables.get(p)]


# ---- (a)-(e) from Nsight Systems' own tables ------------------------------------------------------------------

ATTENTION = ("computing attention scores", "computing softmax", "final matmul")


@dataclass(frozen=True)
class NsysRow:
    """One profiled case from its three nsys stats tables, times per step. Backward's kernels run on PyTorch's
    autograd thread, which opens no NVTX range, so nvtx_kern_sum lists them under no range, not under "backward"."""

    edition: str
    size: str  # its label
    context: int
    steps: int
    forward_range_ms: float  # nvtx_sum: the "forward" range (host time), mean
    forward_kernel_ms: float  # nvtx_kern_sum: kernels launched inside "forward", per step
    top_forward: str  # the forward's largest kernel by time
    top_forward_calls: float  # its calls per forward
    top_step: str  # cuda_gpu_kern_sum's first row: the largest kernel over the whole captured steps
    matmul_forward: float  # matmul share of the forward's kernel time
    matmul_step: float  # matmul share of every kernel captured (the training step, where profiled is train_step)
    non_matmul: tuple[tuple[str, float, int], ...]  # (kernel, share of forward, calls) above 1% of the forward
    softmax_time: float | None  # softmax ÷ (scores + final matmul ranges' kernels), time
    softmax_flops: float
    backward_range_ms: float  # nvtx_kern_sum's kernels inside "backward", per step
    unranged_ms: float  # its kernels under no range (the autograd thread's), per step
    step_kernel_ms: float  # every kernel, per step (cuda_gpu_kern_sum)

    top_stays = property(lambda self: self.top_forward == self.top_step)
    busy = property(lambda self: self.forward_kernel_ms / self.forward_range_ms)  # (a): kernels ÷ the range
    # (c)'s kernels by the readable handle the torch.profiler tables use (Kernel.op)
    non_matmul_ops = property(lambda self: [(Kernel(n, classify_kernel(n), sh, c).op, sh, c)
                                            for n, sh, c in self.non_matmul])


def _ns(kernels) -> float:
    return sum(k.time.total_ns for k in kernels)


def nsys_row(filed: Filed, case) -> NsysRow | None:
    a = case.workload.get("args", {})
    paths = [filed.table(case.name, r) for r in ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")]
    if case.status != "profiled" or None in paths:
        return None
    ksum, nsum, nk = read_kernel_summary(paths[0]), read_nvtx_summary(paths[1]), read_nvtx_kernels(paths[2])
    steps = int(a.get("steps") or 2)
    fwd = [k for k in nk if k.range == "forward"]
    fwd_total, all_total = _ns(fwd), _ns(ksum)
    ranked = sorted(((_ns(v), sum(x.kernel_instances for x in v), n)
                     for n, v in group(fwd, lambda k: k.kernel).items()), reverse=True)
    fwd_range = next((r for r in nsum if r.name == "forward"), None)
    ref = SizeRef(str(a["edition"]), str(a["size"]))
    cfg = ref.config
    flops = attention_part_flops(1, cfg.num_heads, int(a["context"]), cfg.d_model // cfg.num_heads)
    scores, softmax, final = ATTENTION
    part = {p: _ns(k for k in nk if k.range == p) for p in ATTENTION}
    mm = part[scores] + part[final]
    return NsysRow(
        str(a["edition"]), ref.label, int(a["context"]), steps,
        (fwd_range.time.avg_ns if fwd_range else float("nan")) / 1e6, fwd_total / steps / 1e6,
        ranked[0][2] if ranked else "–", ranked[0][1] / steps if ranked else 0.0, ksum[0].name if ksum else "–",
        sum(t for t, _, n in ranked if classify_kernel(n) == "matmul") / fwd_total if fwd_total else float("nan"),
        _ns(k for k in ksum if k.category == "matmul") / all_total if all_total else float("nan"),
        tuple((n, t / fwd_total, c // steps) for t, c, n in ranked if classify_kernel(n) != "matmul"
              and t / fwd_total > 0.01) if fwd_total else (),
        part[softmax] / mm if mm else None, flops[softmax] / (flops[scores] + flops[final]),
        _ns(k for k in nk if k.range == "backward") / steps / 1e6,
        _ns(k for k in nk if not k.range) / steps / 1e6, all_total / steps / 1e6)


@dataclass(frozen=True)
class NsysTables:
    filed: Filed
    rows: tuple[NsysRow, ...]  # 2026 first, then by size and context
    not_profiled: tuple[CaseRecord, ...]  # the filed cases without a profile or its tables

    sources = property(lambda self: [  # the three tables of every case, named once by their pattern
        f"{self.filed.rel}/manifest.json",
        f"{self.filed.rel}/tables/nsys_profile_*_{{cuda_gpu_kern_sum,nvtx_sum,nvtx_kern_sum}}.csv"])

    editions = property(lambda self: list(dict.fromkeys(r.edition for r in self.rows)))

    @staticmethod
    def span(values) -> tuple[float, float]:
        vs = [v for v in values if not missing(v)]
        return (min(vs), max(vs)) if vs else (float("nan"), float("nan"))

    top_matmul = property(lambda self: sum(classify_kernel(r.top_forward) == "matmul" for r in self.rows))
    top_stays = property(lambda self: sum(r.top_stays for r in self.rows))
    backward_ms = property(lambda self: sum(r.backward_range_ms for r in self.rows))


def nsys_tables(ctx: Context) -> NsysTables | None:
    if (filed := newest_with(ctx.reports_dir, "nsys_profile")) is None:
        return None
    rows = [(c, nsys_row(filed, c)) for c in filed.cases("nsys_profile")]
    return NsysTables(filed, tuple(r for _, r in rows if r), tuple(c for c, r in rows if r is None))


@dataclass(frozen=True)
class NsysPage(SourcedFromRuns):
    device: str | None  # the answering GPU device; None: no profiled rows
    scores: dict[str, Scored]
    rows: tuple[Case, ...] = ()  # the older edition's (or the only edition's), by size and context
    cases: tuple[Case, ...] = ()  # the 2026 study's, in its order, where it ran beside the older edition
    runs: RunsFacts | None = None
    nsys: NsysTables | None = None

    answer = property(lambda self: [c for c in self.rows if c.n])  # the profiled ones
    answer26 = property(lambda self: sorted((c for c in self.cases if c.n), key=_by_context))
    edition = property(lambda self: self.rows[0].edition or "2025")  # the answer's
    stat = property(lambda self: stat_name(c.b for c in self.rows))  # what the Python timer shows
    middle = property(lambda self: self.answer[len(self.answer) // 2])  # the profiled config whose tables are shown

    def profiles(self, key: str) -> list:  # the answer's profiles' values of `key`, where they have one
        return [c.n[key] for c in self.answer if c.n.get(key) is not None]

    def detail(self, key: str):  # details[key] of the first of `rows` that has it (the kept Chrome trace)
        return next((c.b.details[key] for c in self.rows if c.b.details.get(key)), None)

    @property
    def sources(self) -> list[str]:
        return sorted(set(super().sources) | set(self.nsys.sources if self.nsys else ()))

    def beside(self, r: NsysRow) -> Case | None:
        """torch.profiler's profiled row of the same edition, size and context (None: it has none)."""
        pool = (self.answer26 if r.edition == "2026" and self.answer26
                else self.answer if self.edition == r.edition else [])
        return next((p for p in pool if (p.size_label, p.context) == (r.size, r.context)), None)

    @property
    def nsys_alone(self) -> list[NsysRow]:  # nsys cases without a torch.profiler row of the same config
        return [r for r in (self.nsys.rows if self.nsys else ()) if self.beside(r) is None]


def _by_context(c: Case) -> tuple:
    return size_rank(c.size), c.context


def _study_order(cases: list[Case]) -> list[Case]:
    """The 2026 study's rows in the order its `cases` detail lists them (size, context)."""
    order = [tuple(c) for c in next((c.details.get("cases") for c in cases if c.details.get("cases")), [])]
    key = lambda c: (c.size_label.split(" ")[0], c.context)  # noqa: E731
    return sorted(cases, key=lambda c: order.index(key(c)) if key(c) in order else len(order))


def facts(ctx: Context) -> NsysPage:
    device, every = ctx.rows.first_gpu(PROBLEM) or (None, [])
    cases = [Case.of(b) for b in every]
    older = sorted((c for c in cases if str(c.edition) != "2026"), key=_by_context)
    new = _study_order([c for c in cases if str(c.edition) == "2026"])
    if not any(c.n for c in older):  # only 2026 rows: they answer alone, by size and context
        older, new = sorted(new, key=_by_context), []
    if not any(c.n for c in older):
        return NsysPage(None, {PROBLEM: NOT_MEASURED}, nsys=nsys_tables(ctx))
    new = new if any(c.n for c in new) else []
    date = newest_date([c.b for c in (new or older)])
    return NsysPage(device, {PROBLEM: Scored(Kind.MEASURED, device, date)}, tuple(older), tuple(new),
                    RunsFacts.of(device, every), nsys_tables(ctx))
