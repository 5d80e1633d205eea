"""1.2 pytorch_attention: naive attention (impl.attention.naive_attention) at batch 8 with no head
dimension ((batch, seq, d) inputs), fp32, non-causal: `rounds` timed forward passes and `rounds`
timed backward passes (each backward's forward runs untimed in setup) per (d, seq), the
assignment's 100 of each on the GPU. Each row also records the memory in use before backward and
the peaks (details), next to the derived accounting of impl.attention.memory, which the report
compares for the smallest OOM case (or the largest case)."""
import pytest
import torch

from impl.attention import attention_flops, naive_attention
from impl.attention.memory import naive_attention_memory
from impl.workloads.attention import allocated_bytes, attention_inputs, run_attention_passes
from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.row import Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.runtime import free_memory, profile_name

PROBLEM = Problem.PYTORCH_ATTENTION
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G.budget_s)
CASES = [(d, s, m) for d in G.dims for s in G.seqs for m in ("forward", "backward")]


def naive(q, k, v):
    return naive_attention(q, k, v, is_causal=False)


@pytest.mark.parametrize("d_model,seq,mode", CASES, ids=[f"d{d}-seq{s}-{m}" for d, s, m in CASES])
def test_pytorch_attention(bench, d_model, seq, mode):
    device = bench.device
    batch, dtype = G.batch, G.dtype
    config = dict(batch=batch, d_model=d_model, seq=seq, mode=mode, dtype=dtype, causal=False)
    details = dict(derived_memory=naive_attention_memory(batch, seq, d_model, dtype).as_dict(),
                   tf32=torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None)
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    free_memory()
    baseline = allocated_bytes(device)
    inputs = set_up_or_oom(bench, lambda: attention_inputs((batch, seq, d_model), dtype, device), problem=PROBLEM,
                           config=config, details=details)
    if inputs is None:
        return
    q, k, v, do = inputs
    del inputs
    flops = attention_flops(batch, seq, seq, d_model, is_causal=False, mode="fwd" if mode == "forward" else "bwd")
    row = run_attention_passes(bench, problem=PROBLEM, config=config, attn=naive, q=q, k=k, v=v, grad_out=do,
                               mode=mode, warmup=G.warmup, rounds=G.rounds, flops=flops, baseline=baseline,
                               details=details)
    if device.type == "cuda" and row.status is Status.MEASURED:
        # The accounting must describe what really happens: a measured figure far from the derived
        # one means the formula (or the implementation's graph) changed.
        derived = details["derived_memory"]
        if mode == "backward":
            measured, expected = row.details["memory_before_backward_bytes"], derived["before_backward"]
        else:  # dO exists during the forward rows too (allocated with the inputs)
            measured, expected = row.memory.peak_allocated, derived["forward_peak"] + derived["grad_output"]
        assert measured - baseline == pytest.approx(expected, rel=0.1, abs=64 << 20), (mode, measured, expected)
