"""1.3 torch_compile (b): eager vs torch.compile'd model for the forward pass, forward+backward and a
timed training step (mode train_step: zero_grad, forward, loss, backward and the AdamW step as one
timed call; compiled = the compiled model's graphs + CompiledAdamW), every size × context in fp32,
and eager vs compiled AdamW step alone for every size (it does not depend on the context). Sizes:
the 2025 table and the 2026 edition's 10B (its other sizes are the 2025 table's: xl (2026) is 2.7B).

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

Row order (a budget cut falls on the least important rows; impl.workloads.compiled.compile_model_cases):
sizes small to 2.7B, then 10B; per size the optimizer step first, then contexts ascending, forward,
forward+backward, training step, eager before compiled. Rows past `budget_s` are recorded as left out
by budget. An OOM is a row (with the closed-form need, impl.workloads.steps.memory_need, in its
details) and the sweep goes on; a row that an OOM of the same size and impl already answers (a mode
that keeps no less alive at a context no shorter: impl.workloads.compiled.implied_by_oom) is recorded
as left out with that reason instead of being run again (on one H100 the 10B's every training row),
budget or not (impl.workloads.compiled.not_run_reason)."""
import pytest
import torch

from impl.workloads.compiled import (WHY, CompiledAdamW, compile_model, compile_model_case_id, compile_model_cases,
                                     describe, graph_breaks, not_run_reason, raise_recompile_limit, record_compile_s,
                                     unique_graphs)
from impl.bench.harness import Budget
from impl.bench.timers import time_once
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.steps import ModelCache, make_step, memory_need, random_batch
from impl.model import AdamW
from impl.runtime import free_memory, is_oom, profile_name
from impl.workloads.sweeps import grid

PROBLEM = Problem.TORCH_COMPILE
G = grid("torch_compile_model", profile_name())
MODELS = ModelCache()
BUDGET = Budget(G.budget_s)
STATE = dict(size=None, target=None, rounds={}, ooms={})
COMPILED = dict(compile=G.compile, dynamic_seq=G.dynamic_seq, backend=G.backend,
                compiled_what=describe(G.compile, G.dynamic_seq, G.backend), compiled_why=WHY)
raise_recompile_limit(64)  # one entry per size and grad mode for the block function

OPTIMIZER = "optimizer_step"
CASES = compile_model_cases(G.sizes, G.contexts, G.modes)


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


def _train_optimizer(model, impl):
    """The training step's own optimizer (fresh per row: its AdamW state is allocated in the first call)."""
    kw = dict(lr=1e-4, weight_decay=0.01)
    return CompiledAdamW(model.parameters(), backend=G.backend, **kw) if impl == "compiled" else AdamW(model.parameters(), **kw)


ROUND = {OPTIMIZER: "one AdamW step on fixed gradients", "forward": "one forward pass (no grad)",
         "forward_backward": "one forward and backward pass",
         "train_step": "one training step: zero_grad, forward, loss, backward, AdamW step (one timed call)"}


@pytest.mark.parametrize("size,context,mode,impl", CASES, ids=[compile_model_case_id(*c) for c in CASES])
def test_torch_compile_model(bench, size, context, mode, impl):
    device, batch = bench.device, G.batch
    config = dict(**size.row_config(), context=context, mode=mode, impl=impl, dtype=G.dtype,
                  batch=batch, dynamic=G.dynamic_seq, part="model", study="model")
    details = dict(COMPILED)
    need = memory_need(size, mode if mode != OPTIMIZER else "train_step", G.dtype, batch, context or min(G.contexts))
    details["closed_form_need_bytes"] = need["total"] if mode != OPTIMIZER else (need["total"] - need["activations"])
    if skip := not_run_reason(STATE["ooms"], BUDGET, size, context, mode, impl):
        bench.not_run(problem=PROBLEM, config=config, status=skip[0], reason=skip[1], details=details)
        return
    model = fn = setup = opt = message = None
    try:
        model = _model(size, device)
        if mode == OPTIMIZER:
            fn, opt = _optimizer_step(model, impl, device)
            graph = "optimizer"
        elif mode == "train_step":
            x, y = random_batch(model, batch, context, device)
            opt = _train_optimizer(model, impl)
            fn, setup = make_step(mode, STATE["target"] if impl == "compiled" else model, x, y, G.dtype, optimizer=opt)
            graph = "training + optimizer"
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
        free_memory()
        STATE["ooms"].setdefault((size, impl), []).append((mode, context))
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
    if row.status is Status.OOM:  # the timed rounds ran out of memory (the harness wrote the row)
        STATE["ooms"].setdefault((size, impl), []).append((mode, context))
    if impl == "compiled" and details["compiled_now"]:
        record_compile_s(bench, row, first_s)
    model.zero_grad(set_to_none=True)
    del fn, setup, opt
    free_memory()
