"""The benchmark row: what one parametrised benchmark measured, or why it was not measured.

A measured row travels in its pytest-benchmark entry's `extra_info` (pytest-benchmark's own
`stats` hold its timings: they are the measurement); a row that did not run (OOM, unsupported,
cut by a sweep or a budget, needs more hardware) is never a timed benchmark and travels in the
same JSON's top-level `not_run` list (impl.bench.plugin). Only the harness writes rows; only
`Row.from_json` (through the report's loader) reads them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

SCHEMA = 2  # extra_info["schema"]; files without it are the older format (impl.report.legacy)


class Status(str, Enum):
    MEASURED = "measured"
    OOM = "oom"  # ran out of device memory (building, warm-up or timing)
    UNSUPPORTED = "unsupported"  # the implementation or anchor rejects this config
    LEFT_OUT = "left_out"  # a cutoff in impl.workloads.sweeps (time or memory, stated in the reason)
    LEFT_OUT_BY_BUDGET = "left_out_by_budget"  # the perf file's wall-clock budget ran out first
    NEEDS_HARDWARE = "needs_hardware"  # more GPUs (or a GPU) than this machine has
    FAILED = "failed"  # an error other than OOM that the section records instead of failing (older files)


class Metric(str, Enum):
    """Every derived figure a row may carry, named once. Rates divide by the benchmark's median."""

    FLOPS = "flops"  # model FLOPs of one call (impl.model / impl.attention counts)
    TFLOPS = "tflops"  # FLOPS / median / 1e12
    MFU = "mfu"  # FLOP/s over the device's datasheet dense bf16 peak (None on a CPU)
    MFU_MEASURED_PEAK = "mfu_measured_peak"  # FLOP/s over the bf16 matmul peak measured in this run
    TOKENS_PER_S = "tokens_per_s"
    BYTES = "bytes"  # bytes one call moves (its floor), for bandwidth rows
    GBPS = "gbps"  # BYTES / median / 1e9
    ALG_BW = "algbw_gbps"  # collectives: size / time (nccl-tests convention)
    BUS_BW = "busbw_gbps"  # collectives: algbw × 2(n-1)/n for all-reduce
    COMM_SHARE = "comm_share"  # share of a step spent in communication (slowest rank)
    FIRST_CALL_S = "first_call_s"  # the first call (compile, autotune) timed once, not benchmarked
    DO_BENCH_MS = "do_bench_ms"  # triton.testing.do_bench median, a cross-check of stats.median
    HOST_MS = "host_ms"  # a kernel row's host time to enqueue one call (impl.bench.timers.host_ms): host-bound near
    # the median, where the row times the host's launch path, not the device
    # A kernel row's GPU state while its timed rounds ran: the median of one NVML sample per round, taken while the
    # device runs the round's calls (impl.bench.timers.CudaEventTimer). An H100 at its 700 W cap moves its SM clock,
    # so two rows timed one after the other may have run at different clocks: their ratio is partly one of clocks.
    # Absent on a CPU, where NVML cannot be read, and in rows from before them.
    SM_CLOCK_MHZ = "sm_clock_mhz"
    POWER_W = "power_w"  # board power, watts (NVML's: on an H100 a trailing 1 s average, which spans earlier rounds)


@dataclass
class Env:
    device: str
    device_type: str
    torch: str
    triton: str | None
    cuda: str | None
    profile: str
    gpu_count: int = 0
    sm_count: int | None = None
    gpu_memory_bytes: int | None = None
    cpu_threads: int | None = None


@dataclass
class Peaks:
    """The denominators of MFU: the datasheet dense bf16 peak of the device (None where there is
    none, e.g. a CPU) and the bf16 matmul rate measured in this pytest run."""

    measured_flops: float
    measured_dtype: str
    measured_n: int
    datasheet_flops: float | None


@dataclass
class Timing:
    """How the row was timed: `round` says what one timed round is, in words; pytest-benchmark's
    stats are per iteration (a round's time divided by `iterations`)."""

    round: str
    timer: str
    warmup_rounds: int
    rounds: int
    iterations: int = 1


@dataclass
class Memory:
    peak_allocated: int | None = None
    peak_reserved: int | None = None


@dataclass
class Row:
    problem: str  # the course's problem name; also the benchmark group
    config: dict[str, Any]  # the swept parameters (JSON scalars)
    env: Env
    status: Status
    timing: Timing | None = None  # None when not measured
    memory: Memory = field(default_factory=Memory)
    metrics: dict[Metric, float] = field(default_factory=dict)
    peaks: Peaks | None = None
    reason: str | None = None  # why a row was not measured (status other than MEASURED)
    details: dict[str, Any] = field(default_factory=dict)  # section-specific payloads (tables, timelines)
    schema: int = SCHEMA

    def metric(self, m: Metric) -> float | None:
        return self.metrics.get(m)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["status"] = self.status.value
        out["metrics"] = {Metric(k).value: v for k, v in self.metrics.items()}
        return out

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Row:
        if doc.get("schema") != SCHEMA:
            raise ValueError(f"not a schema-{SCHEMA} row (schema {doc.get('schema')!r})")
        return cls(
            problem=doc["problem"],
            config=dict(doc.get("config") or {}),
            env=Env(**doc["env"]),
            status=Status(doc["status"]),
            timing=Timing(**doc["timing"]) if doc.get("timing") else None,
            memory=Memory(**(doc.get("memory") or {})),
            metrics={Metric(k): v for k, v in (doc.get("metrics") or {}).items()},
            peaks=Peaks(**doc["peaks"]) if doc.get("peaks") else None,
            reason=doc.get("reason"),
            details=dict(doc.get("details") or {}),
        )


@dataclass
class NotRunEntry:
    """One element of a JSON's top-level `not_run` list: the benchmark's identity and its row."""

    name: str
    fullname: str
    group: str
    row: Row

    def to_json(self) -> dict[str, Any]:
        return dict(name=self.name, fullname=self.fullname, group=self.group, row=self.row.to_json())


__all__ = ["Env", "Memory", "Metric", "NotRunEntry", "Peaks", "Row", "SCHEMA", "Status", "Timing"]
