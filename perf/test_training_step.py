"""training_step (issue 8, beyond the assignment): the full training step (forward, backward,
AdamW) of one model under each speed-up alone on top of bf16 autocast — FlashAttention-2, regional
torch.compile, our AdamW through the fused kernel, the fused chunked LM head + loss, bf16 Linear
weights with their fp32 masters in the optimizer (impl.model.adamw_master) — all of them together
("fast", compiling the whole model; "fast+cudagraphs", the same replayed as CUDA graphs), and
PyTorch's own pieces ("anchor": SDPA, torch.compile of the whole model, torch.optim.AdamW fused).
Configs: impl.workloads.steps.TRAIN_CONFIGS; grid:
impl.workloads.sweeps.

Each row builds a fresh model and optimizer, runs one first step timed apart (compilation, Triton
autotuning, optimizer-state allocation: the row's first_call_s metric), then warm-up and timed steps
through the harness (step time, tokens/s, MFU against the datasheet and the measured matmul peak,
CUDA peak memory). OOM anywhere is a not-run row with status OOM; rows past the file's time budget
are left out by budget.

Compilation is paid once per size: dynamo is reset only when the size changes, every model of a
size is built with the grid's largest context (the RoPE tables, static graph inputs, keep one
shape) and the compiled graphs take the sequence dimension as dynamic, so the rows of the next
context reuse them. A compiled row records the graphs its first step compiled (`new_graphs`;
`compiled_now` / `reused_graph`) and, when it compiled, `compile_s` = first step − median step.
Parameters are graph inputs (inline_inbuilt_nn_modules), so the kept graphs hold no model.

Where the time goes: the `profiled` configs get, after their timed steps, one profiled step
(impl.workloads.kernels.profile_calls, after `prof_warmup` unrecorded ones) whose kernel time per
phase and per category, top kernels and gap to the measured step time are in details["profile"]
(kernels.step_breakdown); a failed profile leaves its error in details["profile_error"] and the
timed row stands."""
import time
from dataclasses import asdict

import pytest
import torch

from impl.workloads.compiled import graph_breaks, raise_recompile_limit, record_compile_s, unique_graphs
from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import time_once
from impl.workloads.kernels import profile_calls, step_breakdown
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.steps import build_model, make_train_step, named_train_config, random_batch
from impl.runtime import first_line, free_memory, profile_name
from impl.workloads.sweeps import grid
from impl.model import SizeRef

PROBLEM = Problem.TRAINING_STEP
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G.budget_s)
CASES = [(s, c, n) for s in G.sizes for c in G.contexts for n in G.configs]
STATE = dict(size=None)  # the size whose compiled graphs dynamo holds
raise_recompile_limit(64)  # per size: the blocks' graphs of +compile, fast's and the anchor's, recompiles


def _enter_size(size: str) -> None:
    """Compiled graphs are kept across the contexts of a size and dropped when it changes."""
    if STATE["size"] != size:
        torch._dynamo.reset()
        STATE["size"] = size


def _where_the_time_goes(step, device, step_s: float) -> dict:
    """One profiled training step, phases annotated, as kernels.step_breakdown (plus its cost)."""
    start = time.perf_counter()
    prof, parse_s = profile_calls(lambda: step(annotated=True), device, warmup=G.prof_warmup, steps=1)
    out = step_breakdown(prof, step_s, top=G.top_kernels)
    out.update(warmup_steps=G.prof_warmup, parse_s=parse_s, profile_s=time.perf_counter() - start)
    return out


@pytest.mark.parametrize("size,context,config", CASES)
def test_training_step(bench, size, context, config):
    device = bench.device
    cfg = named_train_config(config, flash_impl=G.flash_impl)
    batch, compiled = G.batch, cfg.compile != "none"
    ref = SizeRef("2025", size)
    row_config = dict(**ref.row_config(), context=context, config=config, batch=batch, **asdict(cfg),
                      compile_backend=G.compile_backend if compiled else None, study="ablation")
    details = dict(model_context_length=max(G.contexts))
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=row_config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    _enter_size(size)

    def set_up():  # what it builds lives in its frame until it returns: an OOM frees all of it
        model = build_model(ref, max(G.contexts), device, cfg.attn_impl)
        x, y = random_batch(model, batch, context, device)
        step, optimizer = make_train_step(cfg, model, x, y, backend=G.compile_backend)
        counts = unique_graphs(), graph_breaks()
        first_s = time_once(step, device)  # compiles here, not in warm-up or timed rounds
        return dict(model=model, step=step, optimizer=optimizer), counts, first_s
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=row_config, details=details)
    if got is None:
        return
    state, (graphs, breaks), first_s = got
    del got
    if compiled:
        new = unique_graphs() - graphs
        details.update(new_graphs=new, compiled_now=new > 0, reused_graph=new == 0,
                       graph_breaks=graph_breaks() - breaks)
    row = bench.measure(problem=PROBLEM, config=row_config, fn=state["step"], round="one training step (forward, "
                        "backward, optimizer step)", warmup=G.warmup, rounds=G.rounds,
                        flops=ref.config.flops("train_step", batch, context), tokens=batch * context,
                        metrics={Metric.FIRST_CALL_S: first_s}, details=details)
    if compiled and details["compiled_now"]:
        record_compile_s(bench, row, first_s)
    if config in G.profiled and row.status is Status.MEASURED and not bench.benchmark.disabled:
        try:
            row.details["profile"] = _where_the_time_goes(state["step"], device, bench.benchmark.stats.stats.median)
        except Exception as exc:  # noqa: BLE001 - a failed profile (OOM included) must not lose the timed row
            row.details["profile_error"] = f"{type(exc).__name__}: {first_line(exc)}"
        bench.save(row)
    state.clear()
    free_memory()
