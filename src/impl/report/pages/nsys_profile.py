"""nsys_profile: one `Profiled` per profiled config of the first GPU device, each edition's answered
apart (2025's sizes, then the 2026 study's cases); (c)'s non-matmul kernels are read from the
forward's own kernel table (the question asks about the forward; backward and the optimizer step have
their own tables). templates/nsys_profile.md.j2 holds every word."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from impl.bench.row import Status
from impl.model import size_rank
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Bench, size_label, size_ref, stat_name, view
from impl.report.runs import RunsFacts, newest_date
from impl.workloads.problems import Problem as P

PROBLEMS = (P.NSYS_PROFILE,)
PROBLEM = P.NSYS_PROFILE
PHASES = ("forward", "forward+backward", "optimizer step")  # the kernel tables the page prints
TOP_KERNELS = 8  # rows of each kernel table and of (c)'s list


@dataclass(frozen=True)
class NsysConfig:
    size: str | None = None
    edition: str | None = None
    context: int | None = None

    @property
    def label(self) -> str:
        return size_label(size_ref(self.size, self.edition), self.size)


def _cfg(b: Bench) -> NsysConfig:
    return view(NsysConfig, b)

_OP = re.compile(r"(\w+Functor|\w+_kernel\w*|softmax_warp_forward|Memcpy \w+|\w+_reduce\w*)")


@dataclass(frozen=True)
class Kernel:
    name: str  # as the profiler names it
    category: str  # matmul, elementwise, softmax, copy, reduction, ...
    share: float  # of the forward's kernel time
    calls: int

    @property
    def op(self) -> str:
        """A readable handle: the functor or kernel the long name is built around."""
        found = [m for m in _OP.findall(self.name) if m not in ("elementwise_kernel", "vectorized_elementwise_kernel")]
        return found[-1] if found else self.name[:40]


@dataclass(frozen=True)
class ForwardNonMatmul:
    threshold: float  # share of forward kernel time counted as non-trivial
    kernels: list[Kernel]  # above the threshold, largest first

    @property
    def categories(self) -> list[str]:
        return sorted({k.category for k in self.kernels})

    @property
    def total_share(self) -> float:
        return sum(k.share for k in self.kernels)


def forward_non_matmul(nsys: dict) -> ForwardNonMatmul:
    threshold = nsys.get("nontrivial_threshold", 0.01)
    rows = (nsys.get("tables") or {}).get("forward") or []
    ks = [Kernel(r["name"], r["category"], r["share"], int(r["calls"])) for r in rows
          if r["category"] != "matmul" and r["share"] >= threshold]
    return ForwardNonMatmul(threshold, sorted(ks, key=lambda k: -k.share))


@dataclass(frozen=True)
class Profiled:
    """One profiled config: its Python timer against the profiler's view of the same forward."""

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
    trained: bool  # the training step was profiled (matmul_train is its share)
    profiled: str  # what the table's training share covers: train_step, forward_backward, forward, ...
    train_share: float | None  # matmul share of what was profiled beyond the forward
    softmax_time: float  # softmax ÷ (the two attention matmuls), time
    softmax_flops: float  # the same in FLOPs
    non_matmul: ForwardNonMatmul

    @property
    def timer_ms(self) -> float:
        return self.timer_s * 1e3

    @property
    def matmul_train(self) -> float | None:
        """The matmul share of a training step; None where the training step was not profiled."""
        return self.train_share if self.trained else None

    @property
    def config(self) -> str:
        return f"{self.size} at context {self.context}"

    @property
    def busy(self) -> float:
        return self.kernel_ms / self.timer_ms

    @property
    def range_agrees(self) -> bool:
        """The profiled range within 10% of the Python timer."""
        return abs(self.range_ms / self.timer_ms - 1) <= 0.1

    @property
    def softmax_per_flop(self) -> float:
        return self.softmax_time / self.softmax_flops


def profiled(b: Bench) -> Profiled:
    nsys = b.details["nsys"]
    top = nsys["top_forward"]
    return Profiled(_cfg(b).label, _cfg(b).context, b.step_s, b.stats.stddev if b.stats else None,
                    nsys["forward_range_ms"], nsys["forward_kernel_ms"], top["name"], top["category"] == "matmul",
                    int(top["calls_per_pass"]), bool(nsys.get("top_stays_on_top")), nsys["matmul_share_forward"],
                    (nsys.get("profiled") or "train_step") == "train_step",
                    nsys.get("profiled") or ("forward" if nsys.get("train_oom") else "train_step"),
                    nsys.get("matmul_share_train_step"), nsys["softmax_to_matmuls_time_ratio"],
                    nsys["softmax_to_matmuls_flop_ratio"], forward_non_matmul(nsys))


@dataclass(frozen=True)
class NsysFacts:
    configs: list[Profiled]  # by context, as the table lists them

    @property
    def sizes(self) -> list[str]:
        return sorted({c.size for c in self.configs})

    @property
    def busiest(self) -> Profiled:
        return max(self.configs, key=lambda c: c.busy)

    @property
    def idlest(self) -> Profiled:
        return min(self.configs, key=lambda c: c.busy)

    @property
    def middle(self) -> Profiled:
        """The config whose kernel tables the page prints."""
        return self.configs[len(self.configs) // 2]

    @property
    def agree(self) -> int:
        return sum(c.range_agrees for c in self.configs)

    @property
    def top_calls(self) -> list[int]:
        return sorted({c.top_calls for c in self.configs})

    @property
    def matmul_train(self) -> list[float]:
        return [c.matmul_train for c in self.configs if c.matmul_train is not None]


@dataclass(frozen=True)
class NsysCase:
    """One (size, context) the 2026 study asked for: the forward's Python-timer mean ± std, the top forward
    kernel and its calls per forward, or the OOM with its closed-form need."""

    size: str  # its label (impl.report.rows.size_label)
    context: int
    measured: bool
    forward_ms: float | None = None
    forward_std_ms: float | None = None
    kernel_ms: float | None = None  # the forward's summed kernel time (profiler)
    top_name: str | None = None
    top_calls: int | None = None  # per forward pass
    top_stays: bool | None = None
    need_bytes: float | None = None  # closed-form fp32 training-step need (OOM rows)


def nsys_cases(rows: list[Bench]) -> list[NsysCase]:
    """The cases of `rows` (of nsys_profile), in the order the study lists them."""
    out = []
    for b in rows:
        n = b.details.get("nsys") or {}
        label, context = _cfg(b).label, int(_cfg(b).context)
        need = (b.details.get("memory_need") or {}).get("total")
        if not (b.measured and n):
            out.append(NsysCase(label, context, False, need_bytes=need))
            continue
        top = n.get("top_forward") or {}
        out.append(NsysCase(label, context, True, b.stats.mean * 1e3,
                            None if b.stats.stddev is None else b.stats.stddev * 1e3, n.get("forward_kernel_ms"),
                            top.get("name"), None if top.get("calls_per_pass") is None else int(top["calls_per_pass"]),
                            bool(n.get("top_stays_on_top")), need))
    order = [tuple(c) for c in next((b.details.get("cases") for b in rows if b.details.get("cases")), [])]
    names = {(c.size.split(" ")[0], c.context): c for c in out}
    return [names[k] for k in order if k in names] + [c for c in out if (c.size.split(" ")[0], c.context) not in order]


# ---- the device's tables -------------------------------------------------------------------------

@dataclass(frozen=True)
class ConfigRow:
    """One row of the per-config table: a profiled config, or why it has no profile."""

    size: str  # as stored ("xl", "2.7B")
    context: int
    status: str  # "measured", "oom" (or measured without a profile), "left out"
    profile: Profiled | None = None


@dataclass(frozen=True)
class KernelRow:
    name: str
    category: str
    time_us: float
    calls: int
    share: float


@dataclass(frozen=True)
class KernelTables:
    """The middle profiled config's kernel tables (top rows), (c)'s kernels and (d)'s category shares."""

    size: str
    context: int
    steps: int  # profiled steps
    phases: list[tuple[str, list[KernelRow]]]  # (phase, its top rows) of PHASES that have rows
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
    if b.status not in (Status.MEASURED, Status.OOM):
        return ConfigRow(c.size, c.context, "left out")
    if b.status is Status.OOM or not b.details.get("nsys"):
        return ConfigRow(c.size, c.context, "oom")
    return ConfigRow(c.size, c.context, "measured", profiled(b))


def _kernel_tables(b: Bench) -> KernelTables:
    n = b.details["nsys"]
    phases = [(p, [KernelRow(r["name"], r["category"], r["time_us"], r["calls"], r["share"])
                   for r in n["tables"][p][:TOP_KERNELS]]) for p in PHASES if n["tables"].get(p)]
    cs = n["category_share"]
    return KernelTables(_cfg(b).size, _cfg(b).context, n["steps_profiled"], phases, forward_non_matmul(n),
                        [(c, cs["forward"][c], cs["train step"][c]) for c in cs["forward"]])


def profile_tables(rows: list[Bench]) -> ProfileTables:
    rows = _by_context(rows)
    ns = [b.details["nsys"] for b in rows if b.details.get("nsys")]
    with_profile = [b for b in rows if b.details.get("nsys")]
    return ProfileTables(
        next((n["timing_source"] for n in ns), "kernels") == "kernels", sorted({n.get("steps_profiled") for n in ns}),
        sorted({n["warmup_steps"] for n in ns if n.get("warmup_steps") is not None}),
        [n["parse_s"] for n in ns if n.get("parse_s") is not None],
        stat_name(rows), [_config_row(b) for b in rows],
        _kernel_tables(with_profile[len(with_profile) // 2]) if with_profile else None,
        next((b.details["artifact"] for b in rows if b.details.get("artifact")), None),
        next((b.details["artifact_skipped"] for b in rows if b.details.get("artifact_skipped")), None))


# ---- the page ------------------------------------------------------------------------------------

def _profiled(rows: list[Bench]) -> list[Bench]:
    return [b for b in rows if b.status is Status.MEASURED and b.details.get("nsys")]


@dataclass(frozen=True)
class NsysPage:
    device: str | None  # the answering GPU device; None: no profiled rows
    answer: NsysFacts | None = None  # the older edition's configs (or the only edition's)
    edition: str = "2025"  # its edition
    answer26: NsysFacts | None = None  # the 2026 study's configs, where it ran beside the older edition
    cases: list[NsysCase] = field(default_factory=list)  # the 2026 study's cases, OOM ones included
    tables: ProfileTables | None = None  # of the older edition's rows
    runs: RunsFacts | None = None
    score_date: str = "–"
    index_figures: tuple = ()

    @property
    def case_sizes(self) -> list[str]:
        return list(dict.fromkeys(c.size for c in self.cases))

    @property
    def scored(self) -> NsysFacts | None:
        """What the index reads: the 2026 study where it ran."""
        return self.answer26 or self.answer

    @property
    def scores(self) -> dict[str, Scored]:
        if self.answer is None:
            return {PROBLEM: Scored(Kind.NOT_MEASURED)}
        return {PROBLEM: Scored(Kind.MEASURED, self.device, self.score_date)}

    @property
    def sources(self) -> list[str]:
        return sorted(self.runs.files) if self.runs else []


def facts(ctx: Context) -> NsysPage:
    found = ctx.rows.per_gpu(PROBLEM)
    if not found or not _profiled(found[0][1]):
        return NsysPage(None)
    device, every = found[0]  # the first (one-GPU) device answers
    older = [b for b in every if str(_cfg(b).edition) != "2026"]
    new = [b for b in every if str(_cfg(b).edition) == "2026"]
    if not _profiled(older):  # only 2026 rows: they answer alone
        older, new = new, []
    answer = NsysFacts([profiled(b) for b in _by_context(_profiled(older))])
    answer26 = NsysFacts([profiled(b) for b in _by_context(_profiled(new))]) if _profiled(new) else None
    return NsysPage(device, answer, _cfg(older[0]).edition or "2025", answer26, nsys_cases(new) if answer26 else [],
                    profile_tables(older), RunsFacts.of(device, every), newest_date(new if answer26 else older))
