"""1.3 flash_benchmarking: triton.testing.do_bench (median), batch 1, causal, seq 128…65536 × d × {bf16,
fp32}: forward, backward and end-to-end (forward+backward) for

  flash_triton               FlashAttentionTriton, Triton backward kernels
  flash_triton_compiled_bwd  FlashAttentionTriton, torch.compile'd PyTorch backward (bwd, fwd_bwd only:
                             its forward is flash_triton's)
  naive                      naive_attention (OOM recorded)
  sdpa_flash / sdpa_cudnn    anchors: scaled_dot_product_attention restricted to the flash / cuDNN
                             backend on (1, 1, seq, d) inputs; a config the backend rejects (fp32) is a
                             row marked unsupported

Timing (see impl.bench.attention): each row first calls its function once (autotuning,
compilation; that first call's time is `first_call_s`), registers a pytest-benchmark row with one
synchronised call through run_benchmark (which records OOM), then stores the do_bench median in
extra_info["do_bench_ms"] and TFLOP/s in metrics (causal FLOPs counted as half: attention_flops).
Backward alone: the graph is built once, do_bench replays `backward(retain_graph=True)` with the
input grads reset. Rows cut by impl.bench.sweeps cutoffs or this file's time budget are recorded as
left out. On the GPU the grid runs as two commands: `-k bf16` and `-k fp32`.
"""
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import (FlashAttentionTriton, attention_flops, naive_attention, set_flash_autotune,
                            set_flash_backward)
from impl.attention.memory import naive_attention_memory
from impl.bench.attention import Budget, attention_inputs, kernel_time_ms, record_not_run
from impl.bench.legacy_harness import record_oom, run_benchmark, time_once
from impl.runtime import first_line, free_memory, is_oom, profile_name
from impl.bench.sweeps import grid

PROBLEM = "flash_benchmarking"
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
BUDGET = Budget(G["budget_s"])
BACKENDS = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}

# Every shape is its own static-shape compile of the backward; dynamo's default recompile limit (8)
# would silently fall back to eager after a few sequence lengths.
_LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
setattr(torch._dynamo.config, _LIMIT, max(getattr(torch._dynamo.config, _LIMIT), 256))
set_flash_autotune(G["autotune"])

CASES = [(dt, impl, d, s, m) for dt in G["dtypes"] for impl in G["impls"] for d in G["dims"] for s in G["seqs"]
         for m in G["modes"] if not (impl == "flash_triton_compiled_bwd" and m == "fwd")]


def left_out_summary() -> str:
    return (f"naive beyond seq {G['naive_max_seq']}; flash_triton_compiled_bwd for d not in "
            f"{G['compiled_bwd_dims']}; rows past the {G['budget_s']} s budget (marked per row)")


def cutoff(impl, dtype, d, seq) -> str | None:
    """Why impl.bench.sweeps leaves this config out, or None."""
    if impl == "naive" and seq > G["naive_max_seq"]:
        mem = naive_attention_memory(G["batch"], seq, d, dtype, is_causal=True)
        return (f"naive beyond seq {G['naive_max_seq']} (impl.bench.sweeps cutoff, time): derived backward peak "
                f"{mem.backward_peak / 2**30:.1f} GiB")
    if impl == "flash_triton_compiled_bwd" and d not in G["compiled_bwd_dims"]:
        return f"compiled backward only for d in {G['compiled_bwd_dims']} (one torch.compile per shape; time)"
    return None


def forward_fn(impl, q, k, v):
    """(batch, seq, d) inputs; the SDPA anchors see them as (batch, 1, seq, d)."""
    if impl.startswith("flash_triton"):
        return lambda: FlashAttentionTriton.apply(q, k, v, True)
    if impl == "naive":
        return lambda: naive_attention(q, k, v, True)
    backend = BACKENDS[impl]

    def sdpa():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), is_causal=True)
    return sdpa


def timed_fn(mode, fwd, do):
    """The function do_bench times; building it runs the forward once for mode "bwd"."""
    if mode == "fwd":
        return fwd
    if mode == "fwd_bwd":
        return lambda: fwd().backward(do)
    out = fwd()
    return lambda: out.backward(do, retain_graph=True)


@pytest.mark.parametrize("dtype,impl,d,seq,mode", CASES, ids=[f"{dt}-{i}-d{d}-seq{s}-{m}" for dt, i, d, s, m in CASES])
def test_flash_benchmarking(benchmark, device, matmul_peak, dtype, impl, d, seq, mode):
    batch = G["batch"]
    config = dict(impl=impl, dtype=dtype, d=d, seq=seq, mode=mode, batch=batch, causal=True)
    extra = dict(left_out=left_out_summary(), autotune=G["autotune"], **matmul_peak)
    reason = cutoff(impl, dtype, d, seq) or (BUDGET.reason() if BUDGET.exhausted() else None)
    if reason:
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device, kind="left_out", reason=reason,
                       extra=extra)
        return
    set_flash_backward("compiled" if impl == "flash_triton_compiled_bwd" else "triton")
    if impl == "flash_triton_compiled_bwd" and device.type != "cuda":
        extra["note"] = "compiled_flash_backward runs the plain PyTorch backward on the CPU (no torch.compile)"
    if impl == "naive":  # its (seq, seq) matrices are the only large leftovers worth collecting
        free_memory()
    try:
        q, k, v, do = attention_inputs((batch, seq, d), dtype, device)
        fwd = forward_fn(impl, q, k, v)
        if impl.startswith("sdpa"):
            do = do.unsqueeze(1)
        fn = timed_fn(mode, fwd, do)
        extra["first_call_s"] = time_once(fn, device)  # autotuning / compilation happen here
    except Exception as exc:
        if is_oom(exc):
            record_oom(benchmark, problem=PROBLEM, config=config, device=device, message=str(exc), extra=extra)
            return
        if impl.startswith("sdpa") and isinstance(exc, RuntimeError):  # the backend rejects this config
            record_not_run(benchmark, problem=PROBLEM, config=config, device=device, kind="unsupported",
                           reason=first_line(exc), extra=extra)
            return
        raise
    grads = [q, k, v] if mode != "fwd" else None
    res = run_benchmark(benchmark, problem=PROBLEM, config=config, fn=fn, device=device, warmup=0, rounds=1,
                        extra=extra)
    info = benchmark.extra_info
    if res.oom:
        return
    try:
        ms, timer = kernel_time_ms(fn, device, warmup_ms=G["warmup_ms"], rep_ms=G["rep_ms"], grad_to_none=grads,
                                   cpu_repeats=G["cpu_repeats"])
    except Exception as exc:
        if not is_oom(exc):
            raise
        info.update(oom=True, oom_message=first_line(exc))
        return
    flops = attention_flops(batch, seq, seq, d, is_causal=True, mode=mode)
    tflops = flops / (ms * 1e-3) / 1e12
    info.update(do_bench_ms=ms, timer=timer)
    info.setdefault("metrics", {}).update(do_bench_ms=ms, flops=flops, tflops=tflops,
                                          mfu=tflops * 1e12 / matmul_peak["peak_flops"])
    assert ms > 0
