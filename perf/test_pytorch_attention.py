"""1.2 pytorch_attention: naive attention (impl.attention.naive_attention) at batch 8 with no head
dimension ((batch, seq, d) inputs), fp32, non-causal: `rounds` timed forward passes and `rounds`
timed backward passes (each backward's forward runs untimed in setup) per (d, seq). Each row also
records the memory in use before backward and the peaks, next to the derived accounting of
impl.attention.memory, which the report compares for the smallest OOM case (or the largest case)."""
import pytest
import torch

from impl.attention import attention_flops, naive_attention
from impl.attention.memory import naive_attention_memory
from impl.bench.attention import Budget, allocated_bytes, attention_inputs, record_not_run, run_attention_passes
from impl.bench.legacy_harness import record_oom
from impl.runtime import free_memory, is_oom, profile_name
from impl.bench.sweeps import grid

PROFILE = profile_name()
G = grid("pytorch_attention", PROFILE)
BUDGET = Budget(G["budget_s"])
CASES = [(d, s, m) for d in G["dims"] for s in G["seqs"] for m in ("forward", "backward")]


def naive(q, k, v):
    return naive_attention(q, k, v, is_causal=False)


@pytest.mark.parametrize("d_model,seq,mode", CASES, ids=[f"d{d}-seq{s}-{m}" for d, s, m in CASES])
def test_pytorch_attention(benchmark, device, d_model, seq, mode):
    batch, dtype = G["batch"], G["dtype"]
    config = dict(batch=batch, d_model=d_model, seq=seq, mode=mode, dtype=dtype, causal=False)
    extra = dict(derived_memory=naive_attention_memory(batch, seq, d_model, dtype).as_dict(),
                 tf32=torch.backends.cuda.matmul.allow_tf32 if device.type == "cuda" else None)
    if BUDGET.exhausted():
        record_not_run(benchmark, problem="pytorch_attention", config=config, device=device, kind="left_out",
                       reason=BUDGET.reason(), extra=extra)
        return
    free_memory()
    baseline = allocated_bytes(device)
    try:
        q, k, v, do = attention_inputs((batch, seq, d_model), dtype, device)
    except Exception as exc:
        if not is_oom(exc):
            raise
        record_oom(benchmark, problem="pytorch_attention", config=config, device=device, message=str(exc), extra=extra)
        return
    flops = attention_flops(batch, seq, seq, d_model, is_causal=False, mode="fwd" if mode == "forward" else "bwd")
    res = run_attention_passes(benchmark, problem="pytorch_attention", config=config, attn=naive, q=q, k=k, v=v,
                               grad_out=do, mode=mode, device=device, warmup=G["warmup"], rounds=G["rounds"],
                               flops=flops, baseline=baseline, extra=extra)
    if device.type == "cuda" and not res.oom:
        # The accounting must describe what really happens: a measured figure far from the derived
        # one means the formula (or the implementation's graph) changed.
        info = benchmark.extra_info
        derived = info["derived_memory"]
        if mode == "backward":
            key, expected = "memory_before_backward_bytes", derived["before_backward"]
        else:  # dO exists during the forward rows too (allocated with the inputs)
            key, expected = "peak_memory_allocated_bytes", derived["forward_peak"] + derived["grad_output"]
        measured = info[key] - baseline
        assert measured == pytest.approx(expected, rel=0.1, abs=64 << 20), (key, measured, expected)
