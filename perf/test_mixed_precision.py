"""1.1 mixed_precision_accumulation and benchmarking_mixed_precision (a)/(b): the accumulation
loops' results, the toy model's observed dtypes under autocast and the half types' format facts,
kept in the rows' details so the report prints them from the JSON. (c), the bf16 timings, lives in
test_benchmarking_script.py.

Both rows time the real computation whose results they carry (the four loops; the toy model's
forward and backward under autocast with its dtype hooks): the results are the point, the timings
are what those computations cost on this device."""
import pytest

from impl.workloads.problems import Problem
from impl.workloads.steps import DTYPES
from impl.workloads.sweeps import grid
from impl.model.toy import EXACT_SUM, accumulation_errors, accumulation_loops, format_facts, toy_autocast_dtypes
from impl.runtime import profile_name

G = grid("mixed_precision", profile_name())


def test_mixed_precision_accumulation(bench):
    steps = G.steps
    values = accumulation_loops(steps)
    errors = accumulation_errors(values)
    bench.measure(problem=Problem.MIXED_PRECISION_ACCUMULATION, config=dict(steps=steps),
                  fn=lambda: accumulation_loops(steps), round=f"the four accumulation loops, {steps} additions each",
                  warmup=G.warmup, rounds=G.rounds, details=dict(values=values, errors=errors, exact=EXACT_SUM))
    assert errors["fp32 += fp32"] < errors["fp32 += fp16"] < errors["fp16 += fp16"]


@pytest.mark.parametrize("autocast_dtype", G.autocast_dtypes)
def test_benchmarking_mixed_precision_dtypes(bench, autocast_dtype):
    """(a) dtypes seen under autocast on this run's device; (b)'s format facts from torch.finfo."""
    dtype = DTYPES[autocast_dtype]
    seen = toy_autocast_dtypes(bench.device, dtype)
    bench.measure(problem=Problem.BENCHMARKING_MIXED_PRECISION, config=dict(autocast_dtype=autocast_dtype),
                  fn=lambda: toy_autocast_dtypes(bench.device, dtype),
                  round="the toy model built, then one forward and backward under autocast with dtype hooks",
                  warmup=G.warmup, rounds=G.rounds, details=dict(dtypes=seen, formats=format_facts()))
    assert seen["parameters"] == ["float32"] and seen["gradients"] == ["float32"]
