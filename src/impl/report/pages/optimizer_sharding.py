"""optimizer_state_sharding and optimizer_state_sharding_accounting: the correctness suite's verdict over
NCCL, then per GPU device and [edition, size] run (impl.report.rows.size_runs_of) each variant's per-rank
memory at the points the handout names, its step time and collective payload against the closed form,
and the two oddities the table shows with the numbers that explain them. Every ratio divides rows of
one run. templates/optimizer_sharding.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Status
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import Ratio, ratio, spread
from impl.report.rows import Bench, RunLabel, SizeRun, answering, current_edition, size_label, size_ref, \
    size_runs_of, view
from impl.report.runs import RunsFacts, device_name
from impl.workloads.problems import Problem as P
from impl.workloads.variants import ShardVariant

PROBLEMS = (P.OPTIMIZER_STATE_SHARDING, P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)
LABEL = {v.value: v.label for v in ShardVariant}
# impl.accounting.comm_volume_per_rank's schedule of each variant (predicted_ring_bytes_per_rank's keys)
VOLUME = dict(none="ddp", sharded="sharded_simple", zero1="zero1", torch_zero="sharded_simple")
LOG = "correctness-nccl-fsdp-sharding.txt"  # the sharded optimizer's correctness suite over NCCL


@dataclass(frozen=True)
class ShardConfig:
    variant: str = ""
    size: str | None = None
    edition: str | None = None
    context: int = 0
    batch_per_rank: int = 0
    world_size: int = 0
    backend: str = ""


def cfg(b: Bench) -> ShardConfig:
    return view(ShardConfig, b)


@dataclass(frozen=True)
class InitPeak:
    peak: float
    allocated: float
    params: float


@dataclass(frozen=True)
class Zero1Activations:
    """ZeRO-1's forward/backward transient against the simple sharded optimizer's, where it exceeds
    it by more than half the gradients: the signature of the flat gradient buffer ZeRO-1 kept
    through backward before the bucketed step (`commit`: the ZeRO-1 row's run)."""

    zero1: float
    sharded: float
    grads: float
    commit: str


@dataclass(frozen=True)
class RankMemory:
    """One rank of a variant (impl.workloads.dist_steps.sharding's per-rank record), bytes."""

    rank: int
    init_peak: float | None
    before_peak: float | None
    after_peak: float | None
    parameters: float | None  # the named tensors directly before the step
    gradients: float | None
    optimizer_state: float | None  # directly after the step
    buffers: float | None
    activations: float | None
    other: float | None


@dataclass(frozen=True)
class Variant:
    """A variant's row of the run's two tables and the answer; `not_run`: "status: reason" where it did not run."""

    row: Bench
    label: str
    not_run: str | None
    ranks: tuple[RankMemory, ...] = ()
    predicted: dict | None = None  # impl.accounting.memory_breakdown's parts: parameters, gradients, ...
    opt_s: float | None = None  # the optimizer step, slowest rank
    payload_bytes: float | None = None
    payload_source: str | None = None
    predicted_volume: float | None = None  # ring bytes per rank

    @property
    def median(self) -> float:
        return self.row.stats.median

    @property
    def stddev(self) -> float | None:
        return self.row.stats.stddev

    @property
    def state(self) -> float:
        """Optimizer state per rank (the largest rank's), after the step."""
        return max(r.optimizer_state for r in self.ranks)

    @property
    def before_peak(self) -> float:
        return max(r.before_peak for r in self.ranks)

    @property
    def after_peak(self) -> float | None:
        return None if self.ranks[0].after_peak is None else max(r.after_peak for r in self.ranks)

    @property
    def peak(self) -> float:
        """The largest of the peaks before and during the optimizer step, over ranks (the fsdp page's)."""
        return max(self.before_peak, self.after_peak or 0)

    @property
    def name(self) -> str:
        return cfg(self.row).variant

    @property
    def grad_gb(self) -> float:
        """The fp32 gradients Ψ in GB."""
        return self.row.details["n_params"] * 4 / 1e9

    def vs(self, other: Variant, name: str) -> Ratio:
        s, o = self.row.stats, other.row.stats
        return ratio(s.median, o.median, name, spread(s.stddev, s.iqr), spread(o.stddev, o.iqr))


def variant(b: Bench) -> Variant:
    v = cfg(b).variant
    if b.status is not Status.MEASURED:
        return Variant(b, LABEL.get(v, v), f"{b.status.value}: {b.row.reason}")
    d = b.details
    ranks = tuple(RankMemory(k, m["init_peak"], m["before_peak"], m["after_peak"], m["named_before"]["parameters"],
                             m["named_before"]["gradients"], m["named_after"]["optimizer_state"],
                             m["named_before"]["buffers"], m.get("activations"), m.get("other_before"))
                  for k, m in enumerate(d["ranks"]))
    return Variant(b, LABEL.get(v, v), None, ranks, d["predicted"], b.figure("opt_s") or b.figure("opt_step_s"),
                   d.get("comm_bytes_per_step"), d.get("comm_bytes_source"),  # older files: opt_step_s
                   d["predicted_ring_bytes_per_rank"][VOLUME.get(v, "ddp")])


@dataclass(frozen=True)
class RunFacts:
    """One [edition, size] run of a device's sharding rows."""

    run: RunLabel
    size: str  # size_label: "xl (2026) = 2.7B (2025)"
    batch: int  # per rank
    context: int
    world: int
    backend: str
    psi: float  # the fp32 gradients' bytes (= the parameters')
    variants: list[Variant]  # every row of the run
    none: Variant | None
    sharded: Variant | None
    zero1: Variant | None
    init: InitPeak | None
    zero1_activations: Zero1Activations | None

    @property
    def big(self) -> bool:
        """GiB / GB for the real model sizes, MiB / MB for the smoke model (else every cell reads 0.01)."""
        return self.psi >= 2**30


def run_facts(label: str, run: SizeRun) -> RunFacts:
    variants = [variant(b) for b in run.rows]
    by = {cfg(v.row).variant: v for v in variants if v.row.measured}
    init = z1 = None
    if by:
        r0 = next(iter(by.values())).row.details["ranks"][0]
        if r0.get("init_peak") and r0.get("init_allocated"):
            init = InitPeak(r0["init_peak"], r0["init_allocated"], r0["named_before"]["parameters"])
    if "zero1" in by and "sharded" in by:
        za, sa = by["zero1"].ranks[0], by["sharded"].ranks[0]
        if None not in (za.activations, sa.activations) and za.activations - sa.activations > za.gradients / 2:
            z1 = Zero1Activations(za.activations, sa.activations, za.gradients, by["zero1"].row.run.commit)
    first, c = run.rows[0], cfg(run.rows[0])
    return RunFacts(run.label(label), size_label(size_ref(c.size, c.edition), c.size), c.batch_per_rank, c.context,
                    c.world_size, c.backend, first.details.get("n_params", 0) * 4, variants, by.get("none"),
                    by.get("sharded"), by.get("zero1"), init, z1)


@dataclass(frozen=True)
class DeviceSection:
    device: str  # the device folder
    heading: str  # "2× NVIDIA H200 (h200-141gb-x2)"
    runs: list[RunFacts]
    source: RunsFacts
    log_tail: str | None  # the correctness suite's last line over NCCL on this device

    @property
    def passed(self) -> str | None:
        return None if self.log_tail is None else self.log_tail.split(" in ")[0]


@dataclass(frozen=True)
class ShardingPage:
    current: str  # the newest edition that poses the accounting problem
    sections: list[DeviceSection]
    answers: list[RunFacts]  # answering order (impl.report.rows.answering)
    verdict: DeviceSection | None = None  # the device whose correctness log answers optimizer_state_sharding
    scored: tuple[str, RunFacts] | None = None  # (device, run): the newest edition's run with both rows
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        v, s = self.verdict, self.scored
        return {P.OPTIMIZER_STATE_SHARDING: Scored(Kind.MEASURED, v.device) if v else Scored(Kind.NOT_MEASURED),
                P.OPTIMIZER_STATE_SHARDING_ACCOUNTING: Scored(Kind.MEASURED, s[0], s[1].run.date) if s
                else Scored(Kind.NOT_MEASURED)}

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.source.files})


def facts(ctx: Context) -> ShardingPage:
    sections = []
    for device, rows in ctx.rows.per_gpu(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING):
        heading = device_name(device, rows[0].row.env.device)
        sections.append(DeviceSection(device, heading, [run_facts(heading, run) for run in size_runs_of(rows)],
                                      RunsFacts.of(device, rows), ctx.log_tail(device, LOG)))
    found = [(s.device, f) for s in sections for f in s.runs]
    scored = next(((d, f) for d, f in sorted(found, key=lambda x: -int(x[1].run.edition))
                   if f.none is not None and f.sharded is not None), None)
    return ShardingPage(current_edition(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING), sections,
                        answering([f for _, f in found], P.OPTIMIZER_STATE_SHARDING_ACCOUNTING),
                        next((s for s in reversed(sections) if s.log_tail), None), scored)
