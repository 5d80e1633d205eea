"""tools/probes/path_kernels.py on the CPU: a profiler window's kernels read per call, warm (back to back) and cold
(each call after an L2 flush, whose kernels are left out), and its options' errors."""
import argparse

import pytest

from kits.probes import probe_module


def test_a_warm_window_sums_kernels_per_call_and_spans_the_window():
    with probe_module("path_kernels") as pk:
        K = pk.KernelTime
        w = pk.summarise("ours", 2, [K("main", 0, 1000), K("prep", 1000, 1500), K("main", 2000, 3000)])
        other = pk.summarise("ours", 2, [K("main", 0, 3000)], gpu=(1800.0, 690.0))
        m = pk.medians([w, other, w])["ours"]
    assert m["sum_ms"] == 1.25 and m["clock_mhz"] == 1800.0  # the windows that sampled it and m["kernels"]["main"] == {"ms": 1.0, "launches": 1.0}
    assert m["kernels"]["prep"] == {"ms": 0.25, "launches": 0.5}  # a window without the kernel counts 0
    assert w.kernel_ms == {"main": 1.0, "prep": 0.25} and w.launches == {"main": 1.0, "prep": 0.5}
    assert w.sum_ms == 1.25 and w.span_ms == 1.5  # 3 ms from the first start to the last end, over 2 calls


def test_a_cold_window_leaves_the_flushes_out_of_the_sums_and_the_gaps_between_calls_out_of_the_span():
    with probe_module("path_kernels") as pk:
        K = pk.KernelTime
        kernels = [K("flush", 0, 400), K("main", 500, 1500), K("flush", 1600, 2000), K("main", 5000, 5800)]
        w = pk.summarise("ours", 2, kernels, frozenset({"flush"}))
    assert w.kernel_ms == {"main": 0.9} and w.sum_ms == 0.9
    assert w.span_ms == pytest.approx(0.9)  # each call's own span (1.0, 0.8), not the 5.3 ms window


def test_a_call_launching_a_kernel_named_like_the_flush_is_refused():
    with probe_module("path_kernels") as pk:
        K = pk.KernelTime
        kernels = [K("flush", 0, 400), K("main", 500, 1500), K("flush", 1500, 1600)]
        with pytest.raises(ValueError, match="2 kernels named like the L2 flush .* window of 1 calls"):
            pk.summarise("ours", 1, kernels, frozenset({"flush"}))
        with pytest.raises(ValueError, match="no kernels in a window of 3 calls"):
            pk.summarise("ours", 3, [K("flush", 0, 1)] * 3, frozenset({"flush"}))


def test_the_l2_option_takes_distinct_known_states():
    with probe_module("path_kernels") as pk:
        assert pk.parse_l2("cold, warm") == ("cold", "warm")
        for bad in ("", "warm,warm", "hot"):
            with pytest.raises(argparse.ArgumentTypeError, match="--l2"):
                pk.parse_l2(bad)
