"""impl.bench.timers: the host clock for kernel rows (host_ms, the host's time to issue one call; how many calls it
takes, host_calls; when a row counts as host-bound, host_bound), on the CPU (synchronize is a no-op there); and the
SM clock and board power a kernel row's rounds ran at (gpu_sample, CudaEventTimer's samples), torch.cuda faked."""
import contextlib
import time

import pytest
import torch

from impl.bench import timers


def test_host_ms_is_the_mean_host_time_of_the_calls():
    calls = []

    def fn():
        calls.append(1)
        time.sleep(2e-3)
    ms = timers.host_ms(fn, torch.device("cpu"), calls=5)
    assert len(calls) == 5
    assert 2.0 <= ms < 20.0  # each call sleeps 2 ms; a loaded machine may add, never take away


@pytest.mark.parametrize("median_s,calls", [(1e-4, timers.HOST_CALLS), (1e-3, timers.HOST_CALLS), (2e-3, 10),
                                            (0.04, 1), (0.0, timers.HOST_CALLS)])
def test_host_calls_stay_within_the_budget_and_are_at_least_one(median_s, calls):
    assert timers.host_calls(median_s) == calls


def test_host_bound_is_the_host_at_80_percent_of_the_median_or_more():
    assert timers.host_bound(1e-3, 0.8) and timers.host_bound(1e-3, 1.3)
    assert not timers.host_bound(1e-3, 0.79)
    assert not timers.host_bound(1e-3, None)  # not measured: a row from before the metric


# --- the GPU state a kernel row ran at: gpu_sample and CudaEventTimer's samples, with torch.cuda faked ------------
CUDA = torch.device("cuda", 0)


def _fake_nvml(monkeypatch, log: list, clocks=None, powers_mw=None):
    """torch.cuda.clock_rate / power_draw answering from the given lists (a list None: the query raises, as without
    pynvml), each call logged."""
    def query(name, values):
        answers = iter(values or ())

        def read(device=None):
            log.append(name)
            if values is None:
                raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed")
            return next(answers)
        return read
    monkeypatch.setattr(torch.cuda, "clock_rate", query("clock", clocks))
    monkeypatch.setattr(torch.cuda, "power_draw", query("power", powers_mw))


class _FakeEvent:
    """torch.cuda.Event on the host clock, each record and synchronize logged."""
    log: list = []

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()
        self.log.append("record")

    def synchronize(self):
        self.log.append("sync")

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def _fake_events(monkeypatch, log: list):
    monkeypatch.setattr(_FakeEvent, "log", log)
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())


def test_gpu_sample_reads_mhz_and_watts_and_none_where_a_query_fails(monkeypatch):
    log = []
    _fake_nvml(monkeypatch, log, clocks=[1755], powers_mw=[699_500])
    assert timers.gpu_sample(CUDA) == (1755.0, 699.5)
    _fake_nvml(monkeypatch, log, clocks=[1980], powers_mw=None)  # one query unsupported: the other still read
    assert timers.gpu_sample(CUDA) == (1980.0, None)
    _fake_nvml(monkeypatch, log, clocks=[0], powers_mw=[float("nan")])  # no number to trust
    assert timers.gpu_sample(CUDA) == (None, None)
    log.clear()
    assert timers.gpu_sample(torch.device("cpu")) == (None, None) and log == []  # a CPU is never queried


def test_event_timer_samples_once_per_round_while_the_rounds_calls_run(monkeypatch):
    """pytest-benchmark reads the timer before and after each round: only the after-read samples, between recording
    the end event (queued behind the round's calls) and waiting for it; the medians are the samples'."""
    log = []
    _fake_events(monkeypatch, log)
    _fake_nvml(monkeypatch, log, clocks=[1900, 1500, 1700], powers_mw=[700_000, 650_000, 690_000])
    timer = timers.CudaEventTimer(CUDA, sample_gpu=True)
    log.clear()
    for _ in range(3):  # pytest-benchmark's pedantic runner: start = timer(); the calls; end = timer()
        start = timer()
        log.append("call")
        assert timer() >= start
    assert log == ["record", "sync", "call", "record", "clock", "power", "sync"] * 3
    assert timer.gpu_median() == (1700.0, 690.0)


def test_event_timer_samples_nothing_unless_asked_and_tolerates_no_nvml(monkeypatch):
    log = []
    _fake_events(monkeypatch, log)
    _fake_nvml(monkeypatch, log, clocks=None, powers_mw=None)
    quiet = timers.make_timer(CUDA, kernel=True)  # worker ranks' clocks (impl.bench.worker_group)
    sampled = timers.make_timer(CUDA, kernel=True, sample_gpu=True)
    for timer in (quiet, sampled):
        timer(), timer()
    assert log.count("clock") == 1 and quiet.gpu_median() == (None, None)
    assert sampled.samples == [(None, None)] and sampled.gpu_median() == (None, None)
