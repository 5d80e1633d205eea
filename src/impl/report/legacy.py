"""Rows of the older JSON format (before the bench layer's schema 2), read as typed rows so the
report can still show them as history; and rows stored under an older group name, read under the
handout's problem name (`handout_name`). impl.report.data applies both at load time.

In that format a row was a free-form extra_info dict: `oom` and `not_run` flags instead of a
status, kernel-level rows timed one placeholder round with the real figure in
`extra_info["do_bench_ms"]`, and `metrics.mfu` divided by the measured matmul peak. This module is
the one place that knows those conventions.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Env, Memory, Metric, Peaks, Row, Status
from impl.workloads.problems import Problem, StoredGroup

# Benchmark groups stored under another name than the handout's problem (runs before issue 33)
_RENAMED = {StoredGroup.DDP_OVERLAP_BUCKETED_BENCHMARKING.value: Problem.DDP_BUCKETED_BENCHMARKING.value}

_NOT_RUN = {"unsupported": Status.UNSUPPORTED, "failed": Status.FAILED, "needs_hardware": Status.NEEDS_HARDWARE}
_METRICS = {"flops": Metric.FLOPS, "tflops": Metric.TFLOPS, "mfu": Metric.MFU_MEASURED_PEAK,
            "tokens_per_s": Metric.TOKENS_PER_S, "do_bench_ms": Metric.DO_BENCH_MS}
_MOVED = {"problem", "config", "env", "oom", "oom_message", "not_run", "not_run_reason", "metrics",
          "peak_memory_allocated_bytes", "peak_memory_reserved_bytes", "peak_flops", "peak_dtype", "peak_n"}


def _status(info: dict[str, Any]) -> tuple[Status, str | None]:
    if info.get("oom"):
        return Status.OOM, info.get("oom_message")
    kind = info.get("not_run")
    if not kind:
        return Status.MEASURED, None
    reason = info.get("not_run_reason")
    if kind == "left_out":
        return (Status.LEFT_OUT_BY_BUDGET if reason and "budget" in reason else Status.LEFT_OUT), reason
    return _NOT_RUN.get(kind, Status.FAILED), reason


def legacy_row(info: dict[str, Any], group: str | None) -> tuple[Row, float | None]:
    """(row, kernel seconds): the second is the do_bench median where the old row kept its real
    figure there (its pytest-benchmark stats then timed one placeholder round), else None."""
    status, reason = _status(info)
    env = info.get("env") or {}
    cuda = env.get("cuda") and "cpu" not in str(env.get("device")).lower()
    known = {"device": "unknown", "device_type": "cuda" if cuda else "cpu", "torch": "", "triton": None, "cuda": None,
             "profile": "", **{k: env[k] for k in Env.__dataclass_fields__ if k in env}}
    given = (info.get("metrics") or {}).items()
    metrics = {_METRICS[k]: v for k, v in given if k in _METRICS and v is not None}
    extra_metrics = {k: v for k, v in given if not (k in _METRICS and v is not None)}
    peaks = None
    if info.get("peak_flops"):
        datasheet = datasheet_bf16_flops(known["device"]) if known["device_type"] == "cuda" else None
        peaks = Peaks(measured_flops=info["peak_flops"], measured_dtype=info.get("peak_dtype", ""),
                      measured_n=info.get("peak_n", 0), datasheet_flops=datasheet)
        if datasheet and Metric.TFLOPS in metrics:
            metrics[Metric.MFU] = metrics[Metric.TFLOPS] * 1e12 / datasheet
    details = {k: v for k, v in info.items() if k not in _MOVED}
    if extra_metrics:
        details["legacy_metrics"] = extra_metrics
    row = Row(problem=info.get("problem") or group or "", config=dict(info.get("config") or {}), env=Env(**known),
              status=status, reason=reason, metrics=metrics, peaks=peaks, details=details,
              memory=Memory(info.get("peak_memory_allocated_bytes"), info.get("peak_memory_reserved_bytes")))
    kernel_ms = info.get("do_bench_ms")
    return row, (kernel_ms / 1e3 if kernel_ms is not None else None)


def handout_name(row: Row) -> Row:
    """`row` under its handout problem's name where it was stored under an older group name."""
    return replace(row, problem=_RENAMED[row.problem]) if row.problem in _RENAMED else row
