"""1.3 torch_compile (b): eager vs torch.compile'd whole model for the forward pass, forward+backward
and a full training step (compiled model, eager AdamW), every size × context in fp32.

The model is compiled once per size with dynamic=True, so one compilation (an inference graph and
a training graph) serves every context; static shapes would recompile per context and the grid
would not fit one 10-minute command. Compile time is the first call's time (time_once), kept
beside the timed row. Rows left when the time budget is spent are recorded as left out."""
import time

import pytest
import torch

from impl.profiling.attention_bench import record_not_run
from impl.profiling.harness import record_oom, run_benchmark, time_once
from impl.profiling.steps import ModelCache, make_step, random_batch
from impl.runtime import free_memory, is_oom, profile_name
from impl.sweeps import grid

PROBLEM = "torch_compile"
G = grid("torch_compile_model", profile_name())
MODELS = ModelCache()
STATE = dict(start=None, key=None, compiled=None, graphs_seen=set())

CASES = [(s, c, m, impl) for s in G["sizes"] for c in G["contexts"] for m in G["modes"] for impl in ("eager", "compiled")]


def _compiled(model, size):
    """One compiled wrapper per size (the cached eager model's weights are shared)."""
    if STATE["key"] != size:
        STATE.update(key=None, compiled=None, graphs_seen=set())
        torch._dynamo.reset()  # drop the previous size's graphs and their memory
        STATE.update(key=size, compiled=torch.compile(model, dynamic=True))
    return STATE["compiled"]


@pytest.mark.parametrize("size,context,mode,impl", CASES)
def test_torch_compile_model(benchmark, device, size, context, mode, impl):
    STATE["start"] = STATE["start"] or time.perf_counter()
    batch = G["batch"]
    config = dict(size=size, context=context, mode=mode, impl=impl, dtype=G["dtype"], batch=batch,
                  dynamic=True, part="model")
    elapsed = time.perf_counter() - STATE["start"]
    if elapsed > G["budget_s"]:
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device, kind="left_out",
                       reason=f"time budget of {G['budget_s']} s (impl.sweeps) spent", extra=dict(study="model"))
        return
    try:
        model = MODELS.get(size, max(G["contexts"]), device)
        x, y = random_batch(model, batch, context, device)
        target = _compiled(model, size) if impl == "compiled" else model
        fn, setup = make_step(mode, target, x, y, G["dtype"])
        extra = dict(study="model")
        if impl == "compiled":
            # the first call of each graph (inference / training) for a size compiles it
            graph = "inference" if mode == "forward" else "training"
            before = sum(torch._dynamo.utils.counters["stats"].values())
            extra["first_call_s"] = time_once(fn, device)
            extra["compiled_now"] = graph not in STATE["graphs_seen"]
            STATE["graphs_seen"].add(graph)
            extra["dynamo_stats_delta"] = sum(torch._dynamo.utils.counters["stats"].values()) - before
            extra["graph_breaks"] = sum(torch._dynamo.utils.counters["graph_break"].values())
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        message = str(exc)
    else:
        message = None
    if message is not None:
        MODELS.clear()
        STATE.update(key=None, compiled=None)
        record_oom(benchmark, problem=PROBLEM, config=config, device=device, message=message, extra=dict(study="model"))
        return
    res = run_benchmark(benchmark, problem=PROBLEM, config=config, fn=fn, setup=setup, device=device,
                        warmup=G["warmup"], rounds=G["rounds"], extra=extra)
    model.zero_grad(set_to_none=True)
    del fn, setup
    free_memory()
    if not res.oom and res.mean_s is not None:
        assert res.mean_s > 0
