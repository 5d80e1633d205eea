"""1.1 nsys_profile (a)-(e): per size × context, the Python timer's forward (the benchmark row) and a
torch.profiler run of a few annotated training steps whose kernel tables per phase answer the
questions (extra_info["nsys"]). One config also writes its Chrome trace as an artifact."""
import os
from pathlib import Path

import pytest

from impl.profiling.attention_bench import Budget, record_not_run
from impl.profiling.harness import run_benchmark
from impl.profiling.kernels import forward_loss, nsys_answers, profile_steps
from impl.profiling.steps import ModelCache, model_and_batch
from impl.runtime import free_memory, is_oom, profile_name
from impl.sweeps import ALL_SIZES, grid

PROFILE = profile_name()
G = grid("nsys_profile", PROFILE)
MODELS = ModelCache()
BUDGET = Budget(G["budget_s"])  # rows past it are recorded as left out, so the file ends in time
ARTIFACTS = Path(os.environ.get("SUITE_ARTIFACTS_DIR", "out/artifacts"))


def _profile(model, x, y, trace_path):
    """Training-step profile; where the training step runs out of memory, a forward-only one."""
    kw = dict(dtype=G["dtype"], warmup=G["prof_warmup"], steps=G["prof_steps"], trace_path=trace_path)
    failure = None
    try:
        return profile_steps(model, x, y, **kw), None
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        failure = str(exc).splitlines()[0][:300]
    # outside the except block, so the traceback's frames (and their tensors) are already gone
    model.zero_grad(set_to_none=True)
    free_memory()
    return profile_steps(model, x, y, forward_only=True, **kw), failure


@pytest.mark.parametrize("size,context", [(s, c) for s in G["sizes"] for c in G["contexts"]])
def test_nsys_profile(benchmark, device, size, context):
    batch, dtype = G["batch"], G["dtype"]
    shape = ALL_SIZES[size]
    config = dict(size=size, context=context, dtype=dtype, batch=batch, mode="forward")
    if BUDGET.exhausted():
        record_not_run(benchmark, problem="nsys_profile", config=config, device=device, kind="left_out",
                       reason=BUDGET.reason())
        return
    got = model_and_batch(benchmark, MODELS, problem="nsys_profile", config=config, device=device, size=size,
                          context_length=max(G["contexts"]), batch=batch, context=context)
    if got is None:
        return
    model, x, y = got
    # (a) the Python timer on the same forward the profile's "forward" range holds
    res = run_benchmark(benchmark, problem="nsys_profile", config=config, fn=lambda: forward_loss(model, x, y, dtype),
                        device=device, warmup=G["timer_warmup"], rounds=G["timer_rounds"])
    if res.oom:
        return
    trace = ARTIFACTS / f"nsys_profile_{size}_ctx{context}.trace.json" if (size, context) == tuple(G["trace"]) else None
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
    try:
        (prof, parse_s), train_oom = _profile(model, x, y, trace)
    except Exception as exc:  # noqa: BLE001 - forward fits (timed above) but not under the profiler
        if not is_oom(exc):
            raise
        benchmark.extra_info.update(nsys=None, profile_oom=str(exc).splitlines()[0][:300])
        model.zero_grad(set_to_none=True)
        return
    finally:
        free_memory()
    answers = nsys_answers(prof, batch=batch, heads=shape["num_heads"], seq=context,
                           head_dim=shape["d_model"] // shape["num_heads"], layers=shape["num_layers"], top=G["top"])
    answers.update(train_oom=train_oom is not None, train_oom_message=train_oom, parse_s=parse_s,
                   python_forward_ms=res.mean_s * 1e3 if res.mean_s else None)
    benchmark.extra_info["nsys"] = answers
    if trace is not None:
        benchmark.extra_info["artifact"] = trace.name
    model.zero_grad(set_to_none=True)

    # The tables must account for what ran: forward kernels exist and the top row is the largest.
    fwd = answers["tables"]["forward"]
    assert fwd and fwd[0]["time_us"] >= fwd[-1]["time_us"]
    assert 0.0 <= answers["matmul_share_forward"] <= 1.0
