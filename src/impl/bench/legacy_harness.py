"""The suite's one timer: pytest-benchmark's pedantic mode around device-synchronised steps, with
peak memory, OOM capture and the extra_info schema every report reads.

extra_info schema (every benchmark row):
    problem   the assignment's problem name (also the benchmark group)
    config    dict of the swept parameters (size, context, dtype, mode, ...)
    env       device, torch/triton/cuda versions, profile (impl.runtime.env_info)
    warmup, rounds
    oom       True if the config ran out of memory; its timings are then meaningless
    peak_memory_allocated_bytes / peak_memory_reserved_bytes   (CUDA only, else None)
    metrics   derived figures: tokens_per_s, tflops, mfu, ... (absent when oom)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from impl.runtime import env_info, first_line, free_memory, is_oom, synchronize


@dataclass
class _OOMGuard:
    """Wraps the setup and the step so an OOM inside pytest-benchmark's loop is caught, turns
    later calls into no-ops, and leaves a benchmark row (flagged oom) instead of losing the test."""

    device: torch.device
    oom: bool = False
    message: str = ""

    def wrap(self, fn: Callable | None) -> Callable | None:
        if fn is None:
            return None

        def guarded(*args, **kwargs):
            if self.oom:
                return None
            try:
                out = fn(*args, **kwargs)
                synchronize(self.device)  # the timed region ends when the device is done
                return out
            except Exception as exc:  # noqa: BLE001 - only OOM is swallowed
                if not is_oom(exc):
                    raise
                self.oom, self.message = True, first_line(exc)
                return None

        return guarded


@dataclass
class BenchResult:
    oom: bool
    mean_s: float | None
    median_s: float | None
    peak_allocated: int | None
    info: dict[str, Any] = field(default_factory=dict)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> tuple[int | None, int | None]:
    if device.type != "cuda":
        return None, None
    return torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)


def run_benchmark(
    benchmark,
    *,
    problem: str,
    config: dict,
    fn: Callable,
    device: torch.device,
    setup: Callable | None = None,
    warmup: int = 5,
    rounds: int = 10,
    flops: float | None = None,
    tokens: int | None = None,
    peak_flops: float | None = None,
    extra: dict | None = None,
) -> BenchResult:
    """Time `fn` with `warmup` untimed and `rounds` timed calls, each ending in a device sync.

    `setup` (optional) runs untimed before every call and returns the (args, kwargs) for it, as
    pytest-benchmark's pedantic mode defines. flops/tokens/peak_flops give TFLOP/s, tokens/s
    and MFU in `metrics`."""
    benchmark.group = problem
    info = benchmark.extra_info
    info.update(problem=problem, config=dict(config), env=env_info(device), warmup=warmup, rounds=rounds)
    if extra:
        info.update(extra)
    guard = _OOMGuard(device)
    reset_peak_memory(device)
    benchmark.pedantic(guard.wrap(fn), setup=guard.wrap(setup), warmup_rounds=warmup, rounds=rounds, iterations=1)
    allocated, reserved = peak_memory(device)
    info.update(oom=guard.oom, peak_memory_allocated_bytes=allocated, peak_memory_reserved_bytes=reserved)
    if guard.oom:
        info["oom_message"] = guard.message
        free_memory()
        return BenchResult(True, None, None, allocated, info)
    if benchmark.disabled or benchmark.stats is None:  # --benchmark-disable: ran once, untimed
        return BenchResult(False, None, None, allocated, info)
    stats = benchmark.stats.stats
    metrics = info.setdefault("metrics", {})
    if tokens:
        metrics["tokens_per_s"] = tokens / stats.mean
    if flops:
        metrics["flops"] = flops
        metrics["tflops"] = flops / stats.mean / 1e12
        if peak_flops:
            metrics["mfu"] = flops / stats.mean / peak_flops
    return BenchResult(False, stats.mean, stats.median, allocated, info)


def record_oom(benchmark, *, problem: str, config: dict, device: torch.device, message: str,
               extra: dict | None = None) -> BenchResult:
    """For an OOM before timing could start (building the model, say): a row flagged oom, whose
    one recorded round times nothing, so the JSON still holds the config."""
    free_memory()
    benchmark.group = problem
    info = benchmark.extra_info
    info.update(problem=problem, config=dict(config), env=env_info(device), oom=True,
                oom_message=first_line(message), peak_memory_allocated_bytes=None,
                peak_memory_reserved_bytes=None, **(extra or {}))
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)
    return BenchResult(True, None, None, None, info)


def time_once(fn: Callable, device: torch.device) -> float:
    """Seconds for one synchronised call: for one-off costs (compilation) that are recorded
    beside a benchmark rather than benchmarked."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start
