"""training_step (issue 8, beyond the assignment): the full training step (forward, backward,
AdamW) of one model under each speed-up alone on top of bf16 autocast — FlashAttention-2, regional
torch.compile, our AdamW through the fused kernel, the fused chunked LM head + loss — all of them
together ("fast"), and PyTorch's own pieces ("anchor": SDPA, torch.compile of the whole model,
torch.optim.AdamW fused). Configs: impl.profiling.steps.TRAIN_CONFIGS; grid: impl.sweeps.

Each row builds a fresh model and optimizer, runs one untimed first step (compilation, Triton
autotuning, optimizer-state allocation: its time is `first_step_s`, and `compile_s` = first step −
mean step for compiled configs), then warm-up and timed steps through run_benchmark (step time,
tokens/s, MFU against the measured matmul peak, CUDA peak memory). OOM anywhere is a row; rows
past the file's time budget are recorded as left out."""
from dataclasses import asdict

import pytest
import torch

from impl.model import mode_flops
from impl.profiling.attention_bench import Budget, record_not_run
from impl.profiling.harness import record_oom, run_benchmark, time_once
from impl.profiling.steps import build_model, make_train_step, named_train_config, random_batch
from impl.runtime import free_memory, is_oom, profile_name
from impl.sweeps import ALL_SIZES, grid

PROBLEM = "training_step"
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G["budget_s"])
CASES = [(s, c, n) for s in G["sizes"] for c in G["contexts"] for n in G["configs"]]


def _release(state: dict, compiled: bool) -> None:
    """Drops the row's model, optimizer and step (and compiled graphs) before the next row."""
    state.clear()
    if compiled:
        torch._dynamo.reset()
    free_memory()


@pytest.mark.parametrize("size,context,config", CASES)
def test_training_step(benchmark, device, matmul_peak, size, context, config):
    cfg = named_train_config(config, flash_impl=G["flash_impl"])
    batch, compiled = G["batch"], cfg.compile != "none"
    row = dict(size=size, context=context, config=config, batch=batch, **asdict(cfg),
               compile_backend=G["compile_backend"] if compiled else None)
    extra = dict(study="ablation", **matmul_peak)
    if BUDGET.exhausted():
        record_not_run(benchmark, problem=PROBLEM, config=row, device=device, kind="left_out", reason=BUDGET.reason(),
                       extra=extra)
        return
    state, message = {}, None
    try:
        state["model"] = build_model(size, context, device, cfg.attn_impl)
        x, y = random_batch(state["model"], batch, context, device)
        state["step"], state["optimizer"] = make_train_step(cfg, state["model"], x, y, backend=G["compile_backend"])
        first_s = time_once(state["step"], device)  # compiles here, not in warm-up or timed rounds
    except Exception as exc:  # noqa: BLE001 - only OOM becomes a row
        if not is_oom(exc):
            raise
        message = str(exc)
    if message is not None:
        _release(state, compiled)
        record_oom(benchmark, problem=PROBLEM, config=row, device=device, message=message, extra=extra)
        return
    res = run_benchmark(benchmark, problem=PROBLEM, config=row, fn=state["step"], device=device, warmup=G["warmup"],
                        rounds=G["rounds"], flops=mode_flops("train_step", **ALL_SIZES[size], batch=batch, seq=context),
                        tokens=batch * context, peak_flops=matmul_peak["peak_flops"],
                        extra={**extra, "first_step_s": first_s})
    if compiled and res.mean_s is not None:
        res.info["compile_s"] = max(first_s - res.mean_s, 0.0)
    _release(state, compiled)
