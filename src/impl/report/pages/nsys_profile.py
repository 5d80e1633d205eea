"""nsys_profile: one `Profiled` per profiled config of the first GPU device, each edition answered apart
(2025's sizes, then the 2026 study's cases); (c) reads the forward's own kernel table, as the question asks.
Beside them, (a)-(e) from Nsight Systems' own tables (cuda_gpu_kern_sum, nvtx_sum, nvtx_kern_sum) of the newest
filed nsys call (impl.nsys.store), `NsysRow` per profiled case, matched to torch.profiler's row of the same
edition, size and context where there is one."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from impl.bench.row import Status
from impl.model import SizeRef
from impl.nsys.tables import read_kernel_summary, read_nvtx_kernels, read_nvtx_summary
from impl.workloads.kernels import attention_part_flops, classify_kernel
from impl.model import size_rank
from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.pages._nsys import Filed, newest_with
from impl.report.rows import Bench, SizedView, stat_name
from impl.report.runs import RunsFacts, SourcedFromRuns, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.NSYS_PROFILE,)
PROBLEM = P.NSYS_PROFILE
PHASES = ("forward", "forward+backward", "optimizer step")  # the kernel tables the page prints
TOP_KERNELS = 8  # rows of each kernel table
_OP = re.compile(r"(\w+Functor|\w+_kernel\w*|softmax_warp_forward|Memcpy \w+|\w+_reduce\w*)")


@dataclass(frozen=True)
class NsysConfig(SizedView):
    context: int | None = None


_cfg = NsysConfig.of


@dataclass(frozen=True)
class Kernel:
    name: str  # as the profiler names it
    category: str  # matmul, elementwise, softmax, copy, reduction, ...
    share: float  # of its phase's kernel time
    calls: int
    time_us: float | None = None

    @property
    def op(self) -> str:  # a readable handle: the functor or kernel the long name is built around
        found = [m for m in _OP.findall(self.name) if m not in ("elementwise_kernel", "vectorized_elementwise_kernel")]
        return found[-1] if found else self.name[:40]


def _kernel(r: dict) -> Kernel:
    return Kernel(r["name"], r["category"], r["share"], int(r["calls"]), r.get("time_us"))


@dataclass(frozen=True)
class ForwardNonMatmul:
    threshold: float  # share of the forward's kernel time counted as non-trivial
    kernels: list[Kernel]  # above it, largest first

    @property
    def total_share(self) -> float:
        return sum(k.share for k in self.kernels)


def forward_non_matmul(nsys: dict) -> ForwardNonMatmul:
    threshold = nsys.get("nontrivial_threshold", 0.01)
    ks = [_kernel(r) for r in (nsys.get("tables") or {}).get("forward") or []
          if r["category"] != "matmul" and r["share"] >= threshold]
    return ForwardNonMatmul(threshold, sorted(ks, key=lambda k: -k.share))


@dataclass(frozen=True)
class Profiled:  # one profiled config: its Python timer against the profiler's view of the same forward
    size: str  # its label (impl.report.rows.size_label)
    context: int
    timer_s: float  # pytest-benchmark's time of the same forward (Bench.step_s)
    timer_std_s: float | None
    range_ms: float  # the annotated forward range
    kernel_ms: float  # kernel time inside it
    top_name: str
    top_is_matmul: bool
    top_calls: int  # per forward
    top_stays: bool  # still on top for forward+backward
    matmul_fwd: float
    profiled: str  # what train_share covers: train_step, forward_backward, forward, forward_no_grad
    train_share: float | None  # matmul share of what was profiled beyond the forward
    matmul_train: float | None  # the training step's matmul share; None where it was not profiled
    softmax_time: float  # softmax ÷ (the two attention matmuls), time
    softmax_flops: float  # the same in FLOPs
    non_matmul: ForwardNonMatmul

    @property
    def timer_ms(self) -> float:
        return self.timer_s * 1e3

    @property
    def busy(self) -> float:
        return self.kernel_ms / self.timer_ms

    @property
    def range_agrees(self) -> bool:  # the profiled range within 10% of the Python timer
        return abs(self.range_ms / self.timer_ms - 1) <= 0.1

    @property
    def softmax_per_flop(self) -> float:
        return self.softmax_time / self.softmax_flops


def profiled(b: Bench) -> Profiled:
    n, c = b.details["nsys"], _cfg(b)
    top, share = n["top_forward"], n.get("matmul_share_train_step")
    return Profiled(c.size_label, c.context, b.step_s, b.stats.stddev if b.stats else None, n["forward_range_ms"],
                    n["forward_kernel_ms"], top["name"], top["category"] == "matmul", int(top["calls_per_pass"]),
                    bool(n.get("top_stays_on_top")), n["matmul_share_forward"],
                    n.get("profiled") or ("forward" if n.get("train_oom") else "train_step"), share,
                    share if (n.get("profiled") or "train_step") == "train_step" else None,
                    n["softmax_to_matmuls_time_ratio"], n["softmax_to_matmuls_flop_ratio"], forward_non_matmul(n))


@dataclass(frozen=True)
class NsysCase:  # one (size, context) the 2026 study asked for, or its OOM with the closed-form need
    size: str  # its label
    context: int
    measured: bool
    forward_s: float | None = None  # the Python timer's mean ± std
    forward_std_s: float | None = None
    kernel_ms: float | None = None  # the forward's summed kernel time (profiler)
    top_name: str | None = None
    top_calls: int | None = None  # per forward pass
    top_stays: bool | None = None
    need_bytes: float | None = None  # closed-form fp32 training-step need


def nsys_cases(rows: list[Bench]) -> list[NsysCase]:
    """The cases of `rows` (of nsys_profile), in the order the study lists them."""
    out = []
    for b in rows:
        n, head = b.details.get("nsys"), (_cfg(b).size_label, int(_cfg(b).context))
        need = (b.details.get("memory_need") or {}).get("total")
        if not (b.measured and n):
            out.append(NsysCase(*head, False, need_bytes=need))
            continue
        top = n.get("top_forward") or {}
        calls = top.get("calls_per_pass")
        out.append(NsysCase(*head, True, b.stats.mean, b.stats.stddev, n.get("forward_kernel_ms"), top.get("name"),
                            None if calls is None else int(calls), bool(n.get("top_stays_on_top")), need))
    order = [tuple(c) for c in next((b.details.get("cases") for b in rows if b.details.get("cases")), [])]
    key = lambda c: (c.size.split(" ")[0], c.context)  # noqa: E731
    return sorted(out, key=lambda c: order.index(key(c)) if key(c) in order else len(order))


@dataclass(frozen=True)
class ConfigRow:  # a row of the per-config table: a profiled config, or why it has none
    size: str  # as stored ("xl", "2.7B")
    context: int
    status: str  # "measured", "oom" (or measured without a profile), "left out"
    profile: Profiled | None = None


@dataclass(frozen=True)
class KernelTables:  # the middle profiled config's kernel tables (top rows), (c)'s kernels, (d)'s category shares
    size: str
    context: int
    steps: int  # profiled steps
    phases: list[tuple[str, list[Kernel]]]  # (phase, its top rows) of PHASES that have rows
    non_matmul: ForwardNonMatmul
    categories: list[tuple[str, float, float]]  # (category, share of the forward, of the training step)


@dataclass(frozen=True)
class ProfileTables:
    kernels_timed: bool  # the timing source: GPU kernels (else CPU ops stand in)
    steps: list[int]  # recorded steps per config
    warmup: list[int]  # warm-up steps run through unrecorded ([]: recorded and excluded)
    parse_s: list[float]  # building each config's tables
    stat: str  # what the Python timer shows (impl.report.rows.stat_name)
    rows: list[ConfigRow]
    kernels: KernelTables | None
    artifact: str | None  # the kept Chrome trace
    artifact_skipped: str | None  # why none was kept


def _by_context(rows: list[Bench]) -> list[Bench]:
    return sorted(rows, key=lambda b: (size_rank(_cfg(b).size), _cfg(b).context))


def _config_row(b: Bench) -> ConfigRow:
    c = _cfg(b)
    if b.status is Status.MEASURED and b.details.get("nsys"):
        return ConfigRow(c.size, c.context, "measured", profiled(b))
    return ConfigRow(c.size, c.context, "oom" if b.status in (Status.MEASURED, Status.OOM) else "left out")


def _kernel_tables(b: Bench) -> KernelTables:
    n, cs = b.details["nsys"], b.details["nsys"]["category_share"]
    return KernelTables(_cfg(b).size, _cfg(b).context, n["steps_profiled"],
                        [(p, [_kernel(r) for r in n["tables"][p][:TOP_KERNELS]]) for p in PHASES if n["tables"].get(p)],
                        forward_non_matmul(n), [(c, cs["forward"][c], cs["train step"][c]) for c in cs["forward"]])


def profile_tables(rows: list[Bench]) -> ProfileTables:
    rows = _by_context(rows)
    ns = [b.details["nsys"] for b in rows if b.details.get("nsys")]
    return ProfileTables(
        next((n["timing_source"] for n in ns), "kernels") == "kernels", sorted({n.get("steps_profiled") for n in ns}),
        sorted({n["warmup_steps"] for n in ns if n.get("warmup_steps") is not None}),
        [n["parse_s"] for n in ns if n.get("parse_s") is not None], stat_name(rows), [_config_row(b) for b in rows],
        _kernel_tables([b for b in rows if b.details.get("nsys")][len(ns) // 2]) if ns else None,
        next((b.details["artifact"] for b in rows if b.details.get("artifact")), None),
        next((b.details["artifact_skipped"] for b in rows if b.details.get("artifact_skipped")), None))


def _profiled(rows: list[Bench]) -> list[Bench]:  # by context
    return _by_context([b for b in rows if b.status is Status.MEASURED and b.details.get("nsys")])


# ---- (a)-(e) from Nsight Systems' own tables ------------------------------------------------------------------

ATTENTION = ("computing attention scores", "computing softmax", "final matmul")


@dataclass(frozen=True)
class NsysRow:
    """One profiled case of the nsys_profile group, read from its three nsys stats tables. Times per step (the
    capture holds `steps` measured steps). The forward's kernels are nvtx_kern_sum's rows of range "forward"
    (launched from the main thread); backward's kernels run on PyTorch's autograd thread, which holds no NVTX range,
    so nvtx_kern_sum gives the "backward" range (almost) nothing and lists them under no range."""

    edition: str
    size: str  # its label
    context: int
    profiled: str  # what each measured step ran (train_step, or a fallback)
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
    unranged_tids: tuple[int, ...]
    step_kernel_ms: float  # every kernel, per step (cuda_gpu_kern_sum)

    top_stays = property(lambda self: self.top_forward == self.top_step)
    # (c)'s kernels by the readable handle the torch.profiler tables use (Kernel.op)
    non_matmul_ops = property(lambda self: [(Kernel(n, classify_kernel(n), sh, c).op, sh, c)
                                            for n, sh, c in self.non_matmul])
    softmax_per_flop = property(lambda self: None if self.softmax_time is None else self.softmax_time / self.softmax_flops)


def nsys_row(filed: Filed, case) -> NsysRow | None:
    a = case.workload.get("args", {})
    paths = [filed.table(case.name, r) for r in ("cuda_gpu_kern_sum", "nvtx_sum", "nvtx_kern_sum")]
    if case.status != "profiled" or None in paths:
        return None
    ksum, nsum, nk = read_kernel_summary(paths[0]), read_nvtx_summary(paths[1]), read_nvtx_kernels(paths[2])
    steps = int(a.get("steps") or 2)
    fwd = [k for k in nk if k.range == "forward"]
    fwd_total = sum(k.time.total_ns for k in fwd)
    by_kernel: dict[str, list] = {}
    for k in fwd:
        by_kernel.setdefault(k.kernel, []).append(k)
    ranked = sorted(((sum(x.time.total_ns for x in v), sum(x.kernel_instances for x in v), n)
                     for n, v in by_kernel.items()), reverse=True)
    fwd_range = next((r for r in nsum if r.name == "forward"), None)
    ref = SizeRef(str(a["edition"]), str(a["size"]))
    cfg = ref.config
    head_dim = cfg.d_model // cfg.num_heads
    flops = attention_part_flops(1, cfg.num_heads, int(a["context"]), head_dim)
    part = {p: sum(k.time.total_ns for k in nk if k.range == p) for p in ATTENTION}
    scores, softmax, final = ATTENTION
    mm = part[scores] + part[final]
    main_tids = {k.tid for k in nk if k.range == "forward"}
    unranged = [k for k in nk if not k.range]
    all_total = sum(k.time.total_ns for k in ksum)
    return NsysRow(
        str(a["edition"]), ref.label, int(a["context"]), (filed.result(case.name) or {}).get("profiled") or "train_step",
        steps, (fwd_range.time.avg_ns if fwd_range else float("nan")) / 1e6, fwd_total / steps / 1e6,
        ranked[0][2] if ranked else "–", ranked[0][1] / steps if ranked else 0.0, ksum[0].name if ksum else "–",
        sum(t for t, _, n in ranked if classify_kernel(n) == "matmul") / fwd_total if fwd_total else float("nan"),
        sum(k.time.total_ns for k in ksum if k.category == "matmul") / all_total if all_total else float("nan"),
        tuple((n, t / fwd_total, c // steps) for t, c, n in ranked if classify_kernel(n) != "matmul"
              and t / fwd_total > 0.01) if fwd_total else (),
        part[softmax] / mm if mm else None, flops[softmax] / (flops[scores] + flops[final]),
        sum(k.time.total_ns for k in nk if k.range == "backward") / steps / 1e6,
        sum(k.time.total_ns for k in unranged) / steps / 1e6,
        tuple(sorted({k.tid for k in unranged} - main_tids)), all_total / steps / 1e6)


@dataclass(frozen=True)
class NsysTables:
    filed: Filed
    rows: tuple[NsysRow, ...]  # 2026 first, then by size and context
    not_profiled: tuple[tuple[str, str], ...]  # (case, status: reason)

    @property
    def sources(self) -> list[str]:
        # the three tables of every case, named once by their pattern
        return [f"{self.filed.rel}/manifest.json",
                f"{self.filed.rel}/tables/nsys_profile_*_{{cuda_gpu_kern_sum,nvtx_sum,nvtx_kern_sum}}.csv"]

    def edition(self, e: str) -> list[NsysRow]:
        return [r for r in self.rows if r.edition == e]

    editions = property(lambda self: list(dict.fromkeys(r.edition for r in self.rows)))

    @staticmethod
    def span(values) -> tuple[float, float]:
        vs = [v for v in values if v is not None and v == v]
        return (min(vs), max(vs)) if vs else (float("nan"), float("nan"))

    @property
    def busy(self) -> tuple[NsysRow, NsysRow]:  # (a) the least and the most busy forward range
        key = lambda r: r.forward_kernel_ms / r.forward_range_ms  # noqa: E731
        return min(self.rows, key=key), max(self.rows, key=key)

    top_matmul = property(lambda self: sum(classify_kernel(r.top_forward) == "matmul" for r in self.rows))
    top_stays = property(lambda self: sum(r.top_stays for r in self.rows))
    backward_ms = property(lambda self: sum(r.backward_range_ms for r in self.rows))
    unranged_ms = property(lambda self: sum(r.unranged_ms for r in self.rows))


def nsys_tables(ctx: Context) -> NsysTables | None:
    filed = newest_with(ctx.reports_dir, "nsys_profile")
    if filed is None:
        return None
    rows, skipped = [], []
    for c in filed.cases("nsys_profile"):
        r = nsys_row(filed, c)
        if r is None:
            skipped.append((c.name, f"{c.status}: {c.message or 'no tables'}"))
        else:
            rows.append(r)
    return NsysTables(filed, tuple(rows), tuple(skipped))


@dataclass(frozen=True)
class NsysPage(SourcedFromRuns):
    device: str | None  # the answering GPU device; None: no profiled rows
    scores: dict[str, Scored]
    answer: list[Profiled] = field(default_factory=list)  # the older edition's configs (or the only edition's)
    edition: str = "2025"  # its edition
    answer26: list[Profiled] = field(default_factory=list)  # the 2026 study's, where it ran beside the older edition
    cases: list[NsysCase] = field(default_factory=list)  # the 2026 study's cases, OOM ones included
    tables: ProfileTables | None = None  # of the older edition's rows
    runs: RunsFacts | None = None
    nsys: NsysTables | None = None

    @property
    def sources(self) -> list[str]:
        return sorted(set(super().sources) | set(self.nsys.sources if self.nsys else ()))

    def beside(self, r: NsysRow) -> Profiled | None:
        """torch.profiler's Profiled row of the same edition, size and context (None: it has none)."""
        pool = (self.answer26 if r.edition == "2026" and self.answer26
                else self.answer if self.edition == r.edition else [])
        return next((p for p in pool if (p.size, p.context) == (r.size, r.context)), None)

    @property
    def nsys_alone(self) -> list[NsysRow]:  # nsys cases without a torch.profiler row of the same config
        return [r for r in (self.nsys.rows if self.nsys else ()) if self.beside(r) is None]


def facts(ctx: Context) -> NsysPage:
    found = ctx.rows.per_gpu(PROBLEM)
    if not found or not _profiled(found[0][1]):
        return NsysPage(None, {PROBLEM: NOT_MEASURED}, nsys=nsys_tables(ctx))
    device, every = found[0]  # the first (one-GPU) device answers
    older = [b for b in every if str(_cfg(b).edition) != "2026"]
    new = [b for b in every if str(_cfg(b).edition) == "2026"]
    if not _profiled(older):  # only 2026 rows: they answer alone
        older, new = new, []
    answer26 = [profiled(b) for b in _profiled(new)]
    return NsysPage(device, {PROBLEM: Scored(Kind.MEASURED, device, newest_date(new if answer26 else older))},
                    [profiled(b) for b in _profiled(older)], _cfg(older[0]).edition or "2025", answer26,
                    nsys_cases(new) if answer26 else [], profile_tables(older), RunsFacts.of(device, every),
                    nsys_tables(ctx))
