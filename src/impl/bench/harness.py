"""The suite's one harness: every perf test times through `Harness.measure` (pytest-benchmark's
pedantic mode with a device-synchronising timer) or records why a config did not run through
`Harness.not_run`. It alone writes rows (impl.bench.row).

measure():
  1. `warmup` untimed calls (each after its `setup`), guarded against OOM; the last one's time
     sizes the row (impl.bench.timers.plan_rounds: ≥ 5 rounds, ≥ 10 for short rounds, kernel rows
     looped to ≥ 1 ms a round).
  2. pytest-benchmark pedantic with the row's timer (SyncTimer, or CudaEventTimer for kernel rows
     on a GPU) and no warm-up of its own; its stats are the measurement.
  3. Metrics from stats.median: TFLOP/s, both MFUs (impl.bench.row.Metric), tokens/s, GB/s; a kernel row on a
     GPU also its host enqueue time and the SM clock and board power sampled during its rounds.
An OOM anywhere turns the row into a not-run row with status OOM; the benchmark entry is then
dropped from the JSON (pytest-benchmark omits entries with has_error).
"""
from __future__ import annotations

import time
from typing import Any, Callable, TypeVar

import torch

from impl.bench.recorder import Recorder
from impl.bench.row import Env, Memory, Metric, NotRunEntry, Peaks, Row, Status, Timing
from impl.bench.timers import CudaEventTimer, SyncTimer, host_calls, host_ms, make_timer, plan_rounds
from impl.runtime import env_info, first_line, free_memory, is_oom, synchronize

T = TypeVar("T")


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> Memory:
    if device.type != "cuda":
        return Memory()
    return Memory(torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))


class Budget:
    """Wall-clock budget of one perf file: rows past it are recorded as left out by budget, so a
    run that would overrun the GPU machine's 10-minute command limit still ends and writes its JSON.
    A perf file makes its budgets at import, i.e. at collection, but their clock starts with the
    file's first test (impl.bench.plugin starts every Budget a test module holds): a session that
    collects several files (`pytest perf -k flash`) spends no later file's budget while the earlier
    ones run. A budget made elsewhere (a fixture's) starts at its first check."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.deadline: float | None = None  # time.monotonic() when it runs out, once started

    def start(self) -> None:
        """Starts the clock; a started budget keeps its deadline."""
        if self.deadline is None:
            self.deadline = time.monotonic() + self.seconds

    def exhausted(self) -> bool:
        self.start()
        return time.monotonic() > self.deadline

    def reason(self) -> str:
        return f"time budget of this perf file ({self.seconds:.0f} s, impl.workloads.sweeps) exhausted"


class _OOM(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _Guard:
    """Wraps setup and step inside pytest-benchmark's loop: an OOM is remembered and later calls
    become no-ops (pedantic cannot be stopped from inside), anything else propagates."""

    def __init__(self):
        self.oom: str | None = None

    def wrap(self, fn: Callable | None) -> Callable | None:
        if fn is None:
            return None

        def guarded(*args, **kwargs):
            if self.oom is not None:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - only OOM is swallowed
                if not is_oom(exc):
                    raise
                self.oom = first_line(exc)
                return None

        return guarded


def _call(fn: Callable, setup: Callable | None):
    args, kwargs = (setup() or ((), {})) if setup is not None else ((), {})
    return fn(*args, **kwargs)


class Harness:
    """Bound to one test's `benchmark` fixture (the `bench` fixture of impl.bench.plugin)."""

    def __init__(self, benchmark, device: torch.device, peaks: Callable[[], Peaks], recorder: Recorder):
        self.benchmark = benchmark
        self.device = device
        self._peaks = peaks
        self._recorder = recorder
        self.row: Row | None = None

    def env(self) -> Env:
        return Env(**env_info(self.device))

    # ----------------------------------------------------------------------------------------
    def measure(self, *, problem: str, config: dict, fn: Callable, round: str, setup: Callable | None = None,
                warmup: int = 5, rounds: int = 10, kernel: bool = False, flops: float | None = None,
                tokens: int | None = None, nbytes: float | None = None, metrics: dict[Metric, float] | None = None,
                details: dict[str, Any] | None = None, clock: Callable[[], float] | None = None) -> Row:
        """Time `fn` (after `setup`, untimed, when given) and write its row. `round` says in words
        what one call of `fn` is ("one training step", "forward+backward of the attention").
        `clock`: the timer to read instead of this process's device clock, for work done elsewhere
        (the slowest rank's time, impl.bench.worker_group); this process's device is then not
        touched and the caller records the memory."""
        bm = self.benchmark
        bm.group = problem
        here = clock is None
        device = self.device if here else torch.device("cpu")
        row = Row(problem=problem, config=dict(config), env=self.env(), status=Status.MEASURED,
                  metrics=dict(metrics or {}), details=dict(details or {}))
        reset_peak_memory(device)
        timer = make_timer(device, kernel, sample_gpu=True) if here else clock
        clock = SyncTimer(device) if here else clock
        call_s = None
        try:
            for _ in range(warmup):
                start = clock()
                _call(fn, setup)
                call_s = clock() - start
        except Exception as exc:  # noqa: BLE001 - only OOM is recorded
            if not is_oom(exc):
                raise
            return self._oom(row, first_line(exc))
        plan = plan_rounds(rounds, call_s, kernel=kernel, has_setup=setup is not None)
        guard = _Guard()
        bm._timer = timer
        reset_peak_memory(device)
        bm.pedantic(guard.wrap(fn), setup=guard.wrap(setup), rounds=plan.rounds, iterations=plan.iterations,
                    warmup_rounds=0)
        row.memory = peak_memory(device)
        if guard.oom is not None:
            bm.has_error = True  # partial rounds: the entry leaves the JSON; the not-run list says why
            return self._oom(row, guard.oom)
        row.timing = Timing(round=round, timer=timer.__name__, warmup_rounds=warmup, rounds=plan.rounds,
                            iterations=plan.iterations)
        if bm.disabled or bm.stats is None:  # --benchmark-disable: ran once, untimed
            self.row = row
            return row
        median = bm.stats.stats.median
        if flops:
            peaks = self._peaks()
            row.peaks = peaks
            row.metrics[Metric.FLOPS] = flops
            row.metrics[Metric.TFLOPS] = flops / median / 1e12
            row.metrics[Metric.MFU_MEASURED_PEAK] = flops / median / peaks.measured_flops
            if peaks.datasheet_flops:
                row.metrics[Metric.MFU] = flops / median / peaks.datasheet_flops
        if tokens:
            row.metrics[Metric.TOKENS_PER_S] = tokens / median
        if nbytes:
            row.metrics[Metric.BYTES] = nbytes
            row.metrics[Metric.GBPS] = nbytes / median / 1e9
        if kernel and here and setup is None and device.type == "cuda":  # is the device waiting on the host?
            row.metrics[Metric.HOST_MS] = host_ms(fn, device, host_calls(median))
        if isinstance(timer, CudaEventTimer):  # the clock and power the rounds ran at (None: NVML unreadable)
            for metric, value in zip((Metric.SM_CLOCK_MHZ, Metric.POWER_W), timer.gpu_median()):
                if value is not None:
                    row.metrics[metric] = value
        self.save(row)
        self._recorder.progress(bm.name, row, median)
        return row

    def save(self, row: Row) -> None:
        """(Re)write the row into the benchmark's extra_info, e.g. after adding details."""
        self.row = row
        self.benchmark.extra_info.clear()
        self.benchmark.extra_info.update(row.to_json())

    # ----------------------------------------------------------------------------------------
    def not_run(self, *, problem: str, config: dict, status: Status, reason: str,
                details: dict[str, Any] | None = None, memory: Memory | None = None) -> Row:
        """A config that was not timed: listed in the JSON's `not_run`, never a benchmark entry."""
        if status is Status.MEASURED:
            raise ValueError("not_run() takes a status other than MEASURED")
        row = Row(problem=problem, config=dict(config), env=self.env(), status=status, reason=reason,
                  details=dict(details or {}), memory=memory or Memory())
        self.benchmark.group = problem
        self.row = row
        self._recorder.add(NotRunEntry(name=self.benchmark.name, fullname=self.benchmark.fullname, group=problem,
                                       row=row))
        return row

    def oom(self, *, problem: str, config: dict, exc: BaseException | str,
            details: dict[str, Any] | None = None) -> Row:
        """For an OOM outside measure() (building a model, say)."""
        row = Row(problem=problem, config=dict(config), env=self.env(), status=Status.OOM,
                  details=dict(details or {}))
        return self._oom(row, first_line(exc))

    def _oom(self, row: Row, message: str) -> Row:
        memory = peak_memory(self.device)
        free_memory()
        return self.not_run(problem=row.problem, config=row.config, status=Status.OOM, reason=message,
                            details=row.details, memory=memory)


def set_up_or_oom(harness: Harness, build: Callable[[], T], *, problem: str, config: dict,
                  details: dict | None = None,
                  unsupported: Callable[[Exception], bool] | None = None) -> T | None:
    """build()'s result (a model, its step, first calls), or None once an OOM in it is recorded as
    the row's not-run record, or an error `unsupported` accepts (a backend that rejects the config)
    as an unsupported row; other errors propagate. The record is made after the exception is gone:
    its traceback holds the half-built tensors, whose memory the record's free_memory() gets back
    for the next rows. `build` should keep what it makes in its own frame (not in an outer dict),
    so that an OOM frees all of it."""
    message, status = None, None
    try:
        return build()
    except Exception as exc:  # noqa: BLE001 - only OOM and what `unsupported` names become rows
        if is_oom(exc):
            status = Status.OOM
        elif unsupported is not None and unsupported(exc):
            status = Status.UNSUPPORTED
        else:
            raise
        message = first_line(exc)
    if status is Status.OOM:
        harness.oom(problem=problem, config=config, exc=message, details=details)
    else:
        harness.not_run(problem=problem, config=config, status=status, reason=message, details=details)
    return None


__all__ = ["Budget", "Harness", "peak_memory", "reset_peak_memory", "set_up_or_oom"]
