"""Helpers shared by the attention perf files (pytorch_attention, torch_compile, flash_benchmarking,
leaderboard): timed forward / backward passes with the memory in use before backward,
kernel-level timing where the assignment asks for `triton.testing.do_bench`, rows for configs that
did not run, and a wall-clock budget for a perf file.

Why do_bench and not the pedantic timer here: do_bench times with device events, flushes L2
before every repeat, sizes its warm-up and repeat counts from a runtime estimate and returns the
median, which is the method the FlashAttention numbers of the assignment are defined by.
pytest-benchmark still gets one row per config (the suite's JSON is the only data source): the
test runs `run_benchmark` for a single synchronised call (which also catches OOM and triggers
autotuning / compilation in its warm-up), then stores the do_bench median in
`extra_info["do_bench_ms"]`; the report reads only that figure.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Iterable

import torch

from impl.bench.legacy_harness import BenchResult, reset_peak_memory, run_benchmark, time_once
from impl.runtime import env_info, synchronize

DO_BENCH = "triton.testing.do_bench"


def attention_inputs(shape, dtype: str, device: torch.device, seed: int = 0, grad: bool = True):
    """Random q, k, v (requiring grad when `grad`) and an upstream gradient dO, all of `shape`;
    never zeros, which can time faster than real data."""
    from impl.bench.steps import DTYPES

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, device=device, dtype=DTYPES[dtype], generator=g) for _ in range(4))
    return ([t.requires_grad_() for t in (q, k, v)] if grad else [q, k, v]) + [do]


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖, in the reference's (higher) precision."""
    x = x.detach().to(ref.dtype)
    return float((x - ref).norm() / ref.norm())


def do_bench_ms(fn: Callable, device: torch.device, warmup_ms: int = 25, rep_ms: int = 100) -> float | None:
    """The assignment's `triton.testing.do_bench` median (ms), kept beside a kernel row's own stats
    as a cross-check (it flushes L2 between calls; the row's rounds do not). None on a CPU, where
    do_bench has no device events."""
    if device.type != "cuda":
        return None
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def kernel_time_ms(fn: Callable, device: torch.device, *, warmup_ms: int = 25, rep_ms: int = 100,
                   grad_to_none: Iterable[torch.Tensor] | None = None, cpu_repeats: int = 3) -> tuple[float, str]:
    """Median milliseconds of `fn` and the name of the timer used.

    CUDA: triton.testing.do_bench(return_mode="median"). CPU (smoke runs, Triton interpreter):
    do_bench needs device events, so the median of `cpu_repeats` synchronised calls after one
    warm-up call; the timer name says which one produced the number."""
    grads = list(grad_to_none) if grad_to_none is not None else None
    if device.type == "cuda":
        from triton.testing import do_bench

        ms = do_bench(fn, warmup=warmup_ms, rep=rep_ms, grad_to_none=grads, return_mode="median")
        return float(ms), DO_BENCH
    fn()
    times = []
    for _ in range(cpu_repeats):
        for x in grads or ():
            x.grad = None
        times.append(time_once(fn, device))
    return statistics.median(times) * 1e3, f"median of {cpu_repeats} synchronised calls (CPU fallback for do_bench)"


def record_not_run(benchmark, *, problem: str, config: dict, device: torch.device, kind: str, reason: str,
                   extra: dict | None = None) -> None:
    """A row for a config that was not timed: kind "unsupported" (the implementation rejects it)
    or "left_out" (a trim: time budget, a cutoff in impl.bench.sweeps). Its one round times nothing;
    extra_info["not_run"] says so, and the report shows the cell as such."""
    benchmark.group = problem
    benchmark.extra_info.update(problem=problem, config=dict(config), env=env_info(device), oom=False,
                                not_run=kind, not_run_reason=reason, **(extra or {}))
    benchmark.pedantic(lambda: None, rounds=1, iterations=1)


class Budget:
    """Wall-clock budget of one perf file (started at import, i.e. at collection): rows past it
    are recorded as left out, so a run that would overrun the GPU machine's 10-minute command
    limit still ends and writes its JSON."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds

    def exhausted(self) -> bool:
        return time.monotonic() > self.deadline

    def reason(self) -> str:
        return f"time budget of this perf file ({self.seconds:.0f} s, impl.bench.sweeps) exhausted"


def allocated_bytes(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def run_attention_passes(benchmark, *, problem: str, config: dict, attn: Callable, q, k, v, grad_out,
                         mode: str, device: torch.device, warmup: int, rounds: int, flops: float,
                         baseline: int | None, extra: dict | None = None) -> BenchResult:
    """`rounds` timed forward passes (mode "forward") or backward passes (mode "backward") of
    `attn(q, k, v)`, pytest-benchmark pedantic.

    Backward: setup (untimed) clears the input grads and runs the forward, then records
    torch.cuda.memory_allocated (the memory in use before backward) and resets the peak counter,
    so the row's peak_memory_allocated_bytes is the peak of the last backward alone. The output
    travels to the timed call in a list that the call empties, so no round keeps the previous
    round's output alive (pedantic holds the last arguments while it runs the next setup).
    Byte figures are absolute; `baseline_bytes` (allocated before the inputs existed) lets the
    report subtract what the rest of the process holds."""
    measured: dict = {}

    if mode == "forward":
        def fn():
            attn(q, k, v)  # output dropped at once, as its graph is
        setup = None
    elif mode == "backward":
        def setup():
            for t in (q, k, v):
                t.grad = None
            out = attn(q, k, v)
            synchronize(device)
            measured["memory_before_backward_bytes"] = allocated_bytes(device)
            reset_peak_memory(device)
            return ([out],), {}

        def fn(holder):
            holder.pop().backward(grad_out)
    else:
        raise ValueError(f"mode must be 'forward' or 'backward', got {mode!r}")
    res = run_benchmark(benchmark, problem=problem, config=config, fn=fn, setup=setup, device=device,
                        warmup=warmup, rounds=rounds, flops=flops, extra=extra)
    benchmark.extra_info.update(baseline_bytes=baseline, **measured)
    return res


__all__ = ["Budget", "DO_BENCH", "allocated_bytes", "kernel_time_ms", "record_not_run", "run_attention_passes"]
