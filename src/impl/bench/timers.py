"""The clocks pytest-benchmark reads, and how many rounds and iterations a row gets.

pytest-benchmark's pedantic mode calls `timer()` before and after each round (of `iterations`
calls) and records the difference divided by `iterations`. Device work is asynchronous, so each
clock here first waits for the device:

- `SyncTimer`: the host clock after a device synchronisation; the default for steps (training
  steps, forward passes), whose time includes the host's launch work, as a user meets it.
- `CudaEventTimer`: a CUDA event recorded on the current stream and waited for; the time
  between two events is device time. For kernel-level rows (attention kernels, collectives),
  with enough iterations per round that a round is at least `MIN_KERNEL_ROUND_S` (≥ 1 ms, as
  the bench layer's contract asks, and long enough to pipeline the host's launches). With
  `sample_gpu` it also samples the SM clock and board power once per round (`gpu_sample`).
- `HostTimer`: the host clock alone, no synchronisation: the host's cost per call (host-cost rows).
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from impl.runtime import synchronize

MIN_ROUNDS = 5  # every timed row
MIN_ROUNDS_SHORT = 10  # rows whose round is under SHORT_ROUND_S
SHORT_ROUND_S = 10e-3
# A kernel row's round: long enough for the clock to resolve it, and enough back-to-back calls that
# the host's launch latency before a round's first kernel (a round starts on an idle device) is
# amortised as it is in a training loop. With one 5 ms call per round the H100 leaderboard rows
# read 0.2-0.35 ms above do_bench's median (same run, 2026-11-23 22:31 UTC).
MIN_KERNEL_ROUND_S = 25e-3


class SyncTimer:
    __name__ = "SyncTimer"

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self) -> float:
        synchronize(self.device)
        return time.perf_counter()


class HostTimer:
    """The host clock without any device synchronisation: a round of calls timed by it is the
    host's own cost of issuing them (argument handling, allocations, launches), not the device's
    time; for host-cost rows, where the device is idle most of a call (flash_shapes' host row)."""

    __name__ = "HostTimer"

    def __call__(self) -> float:
        return time.perf_counter()


def _nvml(query: Callable, device: torch.device, scale: float) -> float | None:
    try:
        value = float(query(device)) * scale
    except Exception:  # noqa: BLE001 - pynvml missing, no driver, or the query unsupported on this board
        return None
    return value if math.isfinite(value) and value > 0 else None


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def gpu_sample(device: torch.device) -> tuple[float | None, float | None]:
    """The SM clock (MHz) and board power (W) of `device` now, through torch's NVML wrappers (pynvml); each None
    where it cannot be read (a CPU, pynvml missing, the query unsupported), never an error or a made-up number.
    Why: an H100 at its 700 W cap moves its SM clock, and rows timed one after another can run at different clocks
    (the timer probe at ffd9816: ~1,740-1,965 MHz around our steps, ~1,560-1,875 around cuDNN's, run later)."""
    if device.type != "cuda":
        return None, None
    return _nvml(torch.cuda.clock_rate, device, 1.0), _nvml(torch.cuda.power_draw, device, 1e-3)  # power_draw: mW


class CudaEventTimer:
    """Seconds of device time since construction, read from CUDA events.

    `sample_gpu`: pytest-benchmark's pedantic runner reads the timer in pairs, before and after each round; each
    second (end-of-round) read takes a `gpu_sample` after recording the round's end event and before waiting for it,
    so the host samples while the device still runs the round's enqueued calls (a round is >= MIN_KERNEL_ROUND_S of
    them). The sample is outside the timed interval: the end event is already queued behind the calls, and the
    device's time to it does not depend on when the host waits. Its cost (two NVML queries, the first of a process
    also initialising NVML) is host time; only where it outlasts the round's queued work does the device idle, and
    then after the end event, between rounds, like the round's own synchronisation. `gpu_median()`: the medians."""

    __name__ = "CudaEventTimer"

    def __init__(self, device: torch.device, sample_gpu: bool = False):
        if device.type != "cuda":
            raise ValueError(f"CudaEventTimer needs a CUDA device, got {device}")
        self.device = device
        self.samples: list[tuple[float | None, float | None]] | None = [] if sample_gpu else None
        self._reads = 0
        with torch.cuda.device(device):
            self._origin = torch.cuda.Event(enable_timing=True)
            self._origin.record()
            self._origin.synchronize()

    def __call__(self) -> float:
        with torch.cuda.device(self.device):
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._reads += 1
            if self.samples is not None and self._reads % 2 == 0:  # a round's end: its calls are still running
                self.samples.append(gpu_sample(self.device))
            event.synchronize()
        return self._origin.elapsed_time(event) / 1e3

    def gpu_median(self) -> tuple[float | None, float | None]:
        """The median SM clock (MHz) and board power (W) over the rounds' samples; None where none was read."""
        samples = self.samples or []
        return _median([clock for clock, _ in samples]), _median([power for _, power in samples])


def time_once(fn: Callable, device: torch.device) -> float:
    """Seconds for one synchronised call: for one-off costs (compilation, autotuning) recorded as
    a metric beside a benchmark, never as its measurement."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


# host_ms: enough calls to average the host's launch path, few enough that the device's launch queue never fills
# (the host would then wait for the device, and the time be the device's), and no more than HOST_BUDGET_S of calls
# (one at least) at the row's median: a long row cannot be host-bound unless one call's host time is as long.
HOST_CALLS = 20
HOST_BUDGET_S = 20e-3
# A row whose host enqueue time is at least this share of its median keeps the device waiting on the host: its
# median times the host's launch path (which moved by up to 2.5x between machines, NOTES.md), not its kernels.
HOST_BOUND_SHARE = 0.8


def host_calls(median_s: float) -> int:
    """How many calls host_ms times for a row whose calls take median_s: HOST_CALLS within HOST_BUDGET_S."""
    return max(1, min(HOST_CALLS, int(HOST_BUDGET_S / median_s))) if median_s > 0 else HOST_CALLS


def host_ms(fn: Callable, device: torch.device, calls: int = HOST_CALLS) -> float:
    """Milliseconds the host takes to issue one call of `fn`: `calls` back-to-back calls on a drained device, timed
    by the host clock without waiting for the device (drained again after, untimed)."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    synchronize(device)
    return elapsed / calls * 1e3


def host_bound(median_s: float, host_ms_per_call: float | None) -> bool:
    """Whether a row whose calls take median_s (seconds) and the host host_ms_per_call (ms; None: not measured) to
    issue is host-bound (HOST_BOUND_SHARE)."""
    return host_ms_per_call is not None and host_ms_per_call >= HOST_BOUND_SHARE * median_s * 1e3


def make_timer(device: torch.device, kernel: bool, sample_gpu: bool = False):
    """CUDA events for kernel rows on a GPU (`sample_gpu`: CudaEventTimer's); the synchronised host clock otherwise
    (a CPU has no events, and its host clock is its device clock)."""
    return CudaEventTimer(device, sample_gpu) if kernel and device.type == "cuda" else SyncTimer(device)


@dataclass(frozen=True)
class RoundPlan:
    rounds: int
    iterations: int


def plan_rounds(requested: int, call_s: float | None, *, kernel: bool, has_setup: bool) -> RoundPlan:
    """Rounds and iterations for a row whose one call took `call_s` (None: not known, e.g. a
    warm-up study row with no warm-up): kernel rows loop enough iterations that a round is at
    least MIN_KERNEL_ROUND_S (not with a setup, which pytest-benchmark runs once per round);
    every row gets at least MIN_ROUNDS rounds, and MIN_ROUNDS_SHORT where a round is short or of
    unknown length."""
    iterations = 1
    if kernel and not has_setup and call_s is not None and call_s > 0:
        iterations = max(1, math.ceil(MIN_KERNEL_ROUND_S / call_s))
    round_s = None if call_s is None else call_s * iterations
    # A margin of 2x: the warm-up call that sized the row may have been slower than the timed ones.
    floor = MIN_ROUNDS_SHORT if round_s is None or round_s < 2 * SHORT_ROUND_S else MIN_ROUNDS
    return RoundPlan(rounds=max(requested, floor), iterations=iterations)
