"""optimizer_state_sharding and optimizer_state_sharding_accounting: the correctness suite's verdict over NCCL, then
per GPU device and [edition, size] run each variant's per-rank memory, step time and collective payload against the
closed form, and the two oddities the table shows. Every ratio divides rows of one run."""
from __future__ import annotations

from dataclasses import dataclass

from impl.report.pages import NOT_MEASURED, Context, Kind, Scored
from impl.report.rows import DistConfig, DistRow, SizeRun, answering, current_edition, newest_first, size_runs_of
from impl.report.runs import DeviceSection, RunsFacts, device_name
from impl.workloads.problems import Problem as P

PROBLEMS = (P.OPTIMIZER_STATE_SHARDING, P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)
# impl.accounting.comm_volume_per_rank's schedule of each variant (predicted_ring_bytes_per_rank's keys)
VOLUME = dict(none="ddp", sharded="sharded_simple", zero1="zero1", torch_zero="sharded_simple")
LOG = "correctness-nccl-fsdp-sharding.txt"  # the sharded optimizer's correctness suite over NCCL


class Variant(DistRow):
    """A row of the run's two tables and the answer. Its ranks' memory is read as stored
    (impl.workloads.dist_steps.sharding's per-rank record, bytes: peaks, named tensors before and after)."""

    name = property(lambda self: self.c.variant)
    predicted = property(lambda self: self.b.details["predicted"])  # memory_breakdown's parts: parameters, ...
    # the optimizer step, slowest rank (older files: opt_step_s)
    opt_s = property(lambda self: self.b.figure("opt_s") or self.b.figure("opt_step_s"))
    payload_bytes = property(lambda self: self.b.details.get("comm_bytes_per_step"))
    payload_source = property(lambda self: self.b.details.get("comm_bytes_source"))
    predicted_volume = property(  # ring bytes per rank
        lambda self: self.b.details["predicted_ring_bytes_per_rank"][VOLUME.get(self.name, "ddp")])
    ranks = property(lambda self: tuple(self.b.details.get("ranks", ())))  # none where it did not run
    # per rank, the largest rank's: optimizer state after the step, peaks before and during it
    state = property(lambda self: max(r["named_after"]["optimizer_state"] for r in self.ranks))
    before_peak = property(lambda self: max(r["before_peak"] for r in self.ranks))
    after_peak = property(lambda self: None if self.ranks[0]["after_peak"] is None
                          else max(r["after_peak"] for r in self.ranks))
    peak = property(lambda self: max(self.before_peak, self.after_peak or 0))  # the fsdp page's
    grad_gb = property(lambda self: self.b.details["n_params"] * 4 / 1e9)  # the fp32 gradients Ψ in GB


@dataclass(frozen=True)
class RunFacts:  # one [edition, size] run of a device's sharding rows
    run: SizeRun
    device: str  # the device folder
    config: DistConfig  # its first row's
    psi: float  # the fp32 gradients' bytes (= the parameters')
    variants: list[Variant]  # every row of the run
    none: Variant | None
    sharded: Variant | None
    zero1: Variant | None
    init: dict | None  # the first measured variant's rank 0, where it kept its peak after init

    big = property(lambda self: self.psi >= 2**30)  # GiB / GB for the real model sizes, MiB / MB for the smoke model

    @property
    def zero1_held_twice(self) -> tuple[dict, dict] | None:
        """(ZeRO-1's rank 0, the simple version's) where ZeRO-1's transient exceeds the simple one's by over half
        the gradients: the gradients held twice through backward (an older ZeRO-1's flat buffer)."""
        if self.zero1 is None or self.sharded is None:
            return None
        za, sa = self.zero1.ranks[0], self.sharded.ranks[0]
        z, s = za.get("activations"), sa.get("activations")
        twice = None not in (z, s) and z - s > za["named_before"]["gradients"] / 2
        return (za, sa) if twice else None


def run_facts(device: str, label: str, run) -> RunFacts:
    """The facts of one [edition, size] run (rows.SizeRun)."""
    variants = [Variant.of(b) for b in run.rows]
    by = {v.name: v for v in variants if v.measured}
    r0 = next(iter(by.values())).ranks[0] if by else None
    init = r0 if r0 and r0["init_peak"] and r0.get("init_allocated") else None
    return RunFacts(run.label(label), device, DistConfig.of(run.rows[0]), run.rows[0].details.get("n_params", 0) * 4,
                    variants, by.get("none"), by.get("sharded"), by.get("zero1"), init)


@dataclass(frozen=True)
class ShardSection(DeviceSection):
    log_tail: str | None = None  # the correctness suite's last line over NCCL on this device

    device = property(lambda self: self.source.device)
    passed = property(lambda self: None if self.log_tail is None else self.log_tail.split(" in ")[0])


@dataclass(frozen=True)
class ShardingPage:
    sections: list[ShardSection]
    answers: list[RunFacts]  # answering order (impl.report.rows.answering)
    verdict: ShardSection | None = None  # the device whose correctness log answers optimizer_state_sharding
    scored: RunFacts | None = None  # the newest edition's run with both rows

    current = current_edition(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)  # the newest edition that poses it

    @property
    def scores(self) -> dict[str, Scored]:
        v, s = self.verdict, self.scored
        return {P.OPTIMIZER_STATE_SHARDING: Scored(Kind.MEASURED, v.device) if v else NOT_MEASURED,
                P.OPTIMIZER_STATE_SHARDING_ACCOUNTING: Scored(Kind.MEASURED, s.device, s.run.date) if s
                else NOT_MEASURED}

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.source.files})


def facts(ctx: Context) -> ShardingPage:
    sections = [ShardSection(heading, [run_facts(device, heading, run) for run in size_runs_of(rows)],
                             RunsFacts.of(device, rows), ctx.log_tail(device, LOG))
                for device, rows in ctx.rows.per_gpu(P.OPTIMIZER_STATE_SHARDING_ACCOUNTING)
                for heading in [device_name(device, rows)]]
    found = [f for s in sections for f in s.runs]
    scored = next((f for f in newest_first(found) if f.none is not None and f.sharded is not None), None)
    return ShardingPage(sections, answering(found, P.OPTIMIZER_STATE_SHARDING_ACCOUNTING),
                        next((s for s in reversed(sections) if s.log_tail), None), scored)
