"""1.1 mixed_precision_accumulation and benchmarking_mixed_precision (a)/(b): the accumulation
loops' results, the toy model's observed dtypes under autocast and the half types' format facts,
recorded in extra_info so the report prints them from the JSON. (c), the bf16 timings, lives in
test_benchmarking_script.py."""
import pytest

from impl.bench.legacy_harness import run_benchmark
from impl.bench.steps import DTYPES
from impl.model.toy import EXACT_SUM, accumulation_errors, accumulation_loops, format_facts, toy_autocast_dtypes
from impl.runtime import profile_name
from impl.bench.sweeps import grid

G = grid("mixed_precision", profile_name())


def test_mixed_precision_accumulation(benchmark, device):
    """Times the four loops together (one round: they are a numerics demo, not a kernel), and keeps
    their results."""
    out = {}

    def loops():
        out.update(accumulation_loops(G["steps"]))

    run_benchmark(benchmark, problem="mixed_precision_accumulation", config=dict(steps=G["steps"]), fn=loops,
                  device=device, warmup=0, rounds=1)
    errors = accumulation_errors(out)
    benchmark.extra_info.update(values=out, errors=errors, exact=EXACT_SUM)
    assert errors["fp32 += fp32"] < errors["fp32 += fp16"] < errors["fp16 += fp16"]


@pytest.mark.parametrize("autocast_dtype", G["autocast_dtypes"])
def test_benchmarking_mixed_precision_dtypes(benchmark, device, autocast_dtype):
    """(a) dtypes seen under autocast on this run's device; (b)'s format facts from torch.finfo."""
    seen = {}

    def run():
        seen.update(toy_autocast_dtypes(device, DTYPES[autocast_dtype]))

    run_benchmark(benchmark, problem="benchmarking_mixed_precision", config=dict(autocast_dtype=autocast_dtype),
                  fn=run, device=device, warmup=1, rounds=3)
    benchmark.extra_info.update(dtypes=seen, formats=format_facts())
    assert seen["parameters"] == ["float32"] and seen["gradients"] == ["float32"]
