"""1.3 torch_compile (b): eager vs torch.compile'd model for the forward pass and forward+backward,
every size × context in fp32, and eager vs compiled AdamW step for every size (the step does not
depend on the context; the report adds it to forward+backward for the training step).

What is compiled (impl.workloads.sweeps `compile`, `dynamic_seq`, `backend`; impl.workloads.compiled): with
"regional", every Transformer block runs through one compiled function that serves all blocks, and
with `dynamic_seq` the sequence dimension is dynamic, so each size compiles one inference graph
(forward under no_grad) and one training graph (forward+backward) that every context reuses. The
optimizer is impl.workloads.compiled.CompiledAdamW (our AdamW's update, one fused kernel per
parameter; its two graphs serve every size). Dynamo is not reset between sizes (the recompile limit
is raised instead), so the optimizer compiles once per file.

Compile cost is kept out of the timed rounds: every row's first call is timed alone (time_once) and
recorded as the first_call_s metric; for a compiled row whose first call compiled a graph
(compiled_now, from dynamo's graph counter) details["compile_s"] = first_call_s - the row's timed
median; other compiled rows reused a graph (reused_graph). Then `warmup` untimed calls and the
timed rounds: rounds = row_s / (the eager first call), within [rounds_min, rounds_max] (small,
host-bound steps get more rounds, the 2.7B model's 2-second steps the minimum; the harness raises
short rows to its own floor).

Row order (a budget cut falls on the least important rows): sizes small to 2.7B; per size the
optimizer step first, then contexts ascending, forward before forward+backward, eager before
compiled. Rows past `budget_s` are recorded as left out by budget."""
import pytest
import torch

from impl.workloads.compiled import (WHY, CompiledAdamW, compile_model, describe, graph_breaks, raise_recompile_limit,
                                 record_compile_s, unique_graphs)
from impl.bench.harness import Budget
from impl.bench.timers import time_once
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.steps import ModelCache, make_step, random_batch
from impl.model import AdamW, SizeRef
from impl.runtime import free_memory, is_oom, profile_name
from impl.workloads.sweeps import grid

PROBLEM = Problem.TORCH_COMPILE
G = grid("torch_compile_model", profile_name())
MODELS = ModelCache()
BUDGET = Budget(G.budget_s)
STATE = dict(size=None, target=None, rounds={})
COMPILED = dict(compile=G.compile, dynamic_seq=G.dynamic_seq, backend=G.backend,
                compiled_what=describe(G.compile, G.dynamic_seq, G.backend), compiled_why=WHY)
raise_recompile_limit(64)  # one entry per size and grad mode for the block function

OPTIMIZER = "optimizer_step"
CASES = []
for _s in G.sizes:
    CASES += [(_s, None, OPTIMIZER, impl) for impl in ("eager", "compiled")]
    CASES += [(_s, c, m, impl) for c in G.contexts for m in G.modes for impl in ("eager", "compiled")]


def _model(size, device):
    if STATE["size"] != size:
        STATE.update(size=None, target=None)
        MODELS.clear()
        # what the previous sizes left allocated (compiled graphs are kept across sizes: a leak
        # of their models would show here)
        STATE["allocated_before_bytes"] = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
    model = MODELS.get(size, max(G.contexts), device)
    if STATE["size"] != size:
        STATE.update(size=size, target=compile_model(model, G.compile, backend=G.backend,
                                                     dynamic_seq=G.dynamic_seq))
    return model


def _rounds(first_s: float) -> int:
    return max(G.rounds_min, min(G.rounds_max, int(G.row_s / max(first_s, 1e-9))))


def _optimizer_step(model, impl, device):
    """(fn, optimizer): one AdamW step on fixed random gradients (set once, kept)."""
    gen = torch.Generator(device=device).manual_seed(0)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, device=device, dtype=p.dtype, generator=gen)
    kw = dict(lr=1e-4, weight_decay=0.01)
    opt = CompiledAdamW(model.parameters(), backend=G.backend, **kw) if impl == "compiled" else AdamW(model.parameters(), **kw)
    return opt.step, opt


ROUND = {OPTIMIZER: "one AdamW step on fixed gradients", "forward": "one forward pass (no grad)",
         "forward_backward": "one forward and backward pass"}


@pytest.mark.parametrize("size,context,mode,impl", CASES)
def test_torch_compile_model(bench, size, context, mode, impl):
    device, batch = bench.device, G.batch
    config = dict(**SizeRef("2025", size).row_config(), context=context, mode=mode, impl=impl, dtype=G.dtype,
                  batch=batch, dynamic=G.dynamic_seq, part="model", study="model")
    details = dict(COMPILED)
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    model = fn = setup = opt = message = None
    try:
        model = _model(size, device)
        if mode == OPTIMIZER:
            fn, opt = _optimizer_step(model, impl, device)
            graph = "optimizer"
        else:
            x, y = random_batch(model, batch, context, device)
            fn, setup = make_step(mode, STATE["target"] if impl == "compiled" else model, x, y, G.dtype)
            graph = "inference" if mode == "forward" else "training"
        before = unique_graphs()
        first_s = time_once(fn, device)
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        message = str(exc)
    if message is not None:  # handled outside the except block, whose traceback holds the tensors
        fn = setup = opt = None
        if model is None:  # building the model ran out of memory
            MODELS.clear()
            STATE.update(size=None, target=None)
        else:
            model.zero_grad(set_to_none=True)
        model = None
        bench.oom(problem=PROBLEM, config=config, exc=message, details=details)
        return
    details["allocated_before_size_bytes"] = STATE.get("allocated_before_bytes")
    key = (size, context, mode)
    if impl == "eager":
        STATE["rounds"][key] = _rounds(first_s)
    rounds = STATE["rounds"].get(key) or _rounds(first_s)
    if impl == "compiled":
        new = unique_graphs() - before
        details.update(new_graphs=new, compiled_now=new > 0, reused_graph=new == 0, graph=graph,
                       graph_breaks=graph_breaks())
    row = bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=G.warmup,
                        rounds=rounds, metrics={Metric.FIRST_CALL_S: first_s}, details=details)
    if impl == "compiled" and details["compiled_now"]:
        record_compile_s(bench, row, first_s)
    model.zero_grad(set_to_none=True)
    del fn, setup, opt
    free_memory()
