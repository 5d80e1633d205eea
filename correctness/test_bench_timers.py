"""impl.bench.timers' host clock for kernel rows: host_ms (the host's time to issue one call), how many calls it
takes (host_calls) and when a row counts as host-bound (host_bound), on the CPU (synchronize is a no-op there)."""
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
