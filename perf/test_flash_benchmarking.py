"""1.3 flash_benchmarking: batch 1, causal, seq 128…65536 × d × {bf16, fp32}: forward, backward and
end-to-end (forward+backward) for

  flash_triton               FlashAttentionTriton, Triton backward kernels
  flash_triton_compiled_bwd  FlashAttentionTriton, torch.compile'd PyTorch backward (bwd, fwd_bwd only:
                             its forward is flash_triton's)
  naive                      naive_attention (OOM recorded)
  sdpa_flash / sdpa_cudnn    anchors: scaled_dot_product_attention restricted to the flash / cuDNN
                             backend on (1, 1, seq, d) inputs; a config the backend rejects (fp32) is a
                             row marked unsupported

Kernel rows (impl.bench.harness, kernel=True): on the GPU a CUDA-event timer with enough calls per
round that a round is ≥ 1 ms, so stats.median is the kernel time; the assignment's
`triton.testing.do_bench` median stays beside it as the do_bench_ms cross-check metric. Each row
first calls its function once (autotuning, compilation: `first_call_s`). Backward alone: the graph
is built once and every call replays `backward(retain_graph=True)`; each timed call resets the
input gradients first, so no call adds into the previous one's. TFLOP/s count causal FLOPs as
half (attention_flops). The kernels' correctness is pinned by correctness/test_attention.py on the
same code paths, not re-checked per row here (flash_shapes and leaderboard check theirs).

Rows cut by impl.workloads.sweeps cutoffs are left out, rows past this file's time budget left out by
budget, OOM and a backend's rejection recorded as such: all of them in the JSON's not_run list. On
the GPU the whole grid (every cell: naive to the longest sequence, the compiled backward at every d)
runs as four `-k` pieces at one commit, each inside one 540 s section (impl.workloads.sweeps, with
their estimates): "bf16 and not compiled_bwd", "fp32 and not compiled_bwd", "bf16 and compiled_bwd",
"fp32 and compiled_bwd".
"""
import pytest
import torch

from impl.attention import FlashAttentionTriton, FlashOptions, LaunchRecorder, attention_flops, naive_attention
from impl.attention.memory import naive_attention_memory
from impl.workloads.attention import attention_inputs, measure_kernel, sdpa_anchor, sdpa_rejects
from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import time_once
from impl.bench.row import Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.runtime import free_memory, profile_name

PROBLEM = Problem.FLASH_BENCHMARKING
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G.budget_s)
ROUND = {"fwd": "one causal attention forward",
         "bwd": "one causal attention backward (graph built once, replayed with retain_graph; input grads reset)",
         "fwd_bwd": "one causal attention forward and backward (input grads reset)"}

# Every shape is its own static-shape compile of the backward; dynamo's default recompile limit (8)
# would silently fall back to eager after a few sequence lengths.
_LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
setattr(torch._dynamo.config, _LIMIT, max(getattr(torch._dynamo.config, _LIMIT), 256))
# Ours, per impl: the Triton backward, or the torch.compile'd PyTorch one; passed per call. RECORDER keeps what
# each call ran (autotune's configs), for the rows' details: a row that moves between grids then says whether
# autotune picked another config (the 01f39cc grid's d 64 rows could not: NOTES.md, twenty-fourth session).
RECORDER = LaunchRecorder()
OPTIONS = {"flash_triton": FlashOptions(backward="triton", autotune=G.autotune, recorder=RECORDER),
           "flash_triton_compiled_bwd": FlashOptions(backward="compiled", autotune=G.autotune, recorder=RECORDER)}

CASES = [(dt, impl, d, s, m) for dt in G.dtypes for impl in G.impls for d in G.dims for s in G.seqs
         for m in G.modes if not (impl == "flash_triton_compiled_bwd" and m == "fwd")]


def left_out_summary() -> str:
    """What the grid leaves out by design (only the cutoffs that cut something), and the budget."""
    parts = []
    if G.naive_max_seq < max(G.seqs):
        parts.append(f"naive beyond seq {G.naive_max_seq}")
    if set(G.dims) - set(G.compiled_bwd_dims):
        parts.append(f"flash_triton_compiled_bwd for d not in {G.compiled_bwd_dims}")
    return "; ".join(parts + [f"rows past the {G.budget_s} s budget (marked per row)"])


def cutoff(impl, dtype, d, seq) -> str | None:
    """Why impl.workloads.sweeps leaves this config out, or None."""
    if impl == "naive" and seq > G.naive_max_seq:
        mem = naive_attention_memory(G.batch, seq, d, dtype, is_causal=True)
        return (f"naive beyond seq {G.naive_max_seq} (impl.workloads.sweeps cutoff, time): derived backward peak "
                f"{mem.backward_peak / 2**30:.1f} GiB")
    if impl == "flash_triton_compiled_bwd" and d not in G.compiled_bwd_dims:
        return f"compiled backward only for d in {G.compiled_bwd_dims} (one torch.compile per shape; time)"
    return None


def forward_fn(impl, q, k, v):
    """(batch, seq, d) inputs; the SDPA anchors see them as (batch, 1, seq, d)."""
    if impl.startswith("flash_triton"):
        options = OPTIONS[impl]
        return lambda: FlashAttentionTriton.apply(q, k, v, True, options)
    if impl == "naive":
        return lambda: naive_attention(q, k, v, True)
    sdpa = sdpa_anchor(impl, causal=True)
    return lambda: sdpa(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1))


def timed_fn(mode, fwd, do, inputs):
    """One call of the row; building it runs the forward once for mode "bwd"."""
    if mode == "fwd":
        return fwd

    def reset():
        for t in inputs:
            t.grad = None
    if mode == "fwd_bwd":
        def fwd_bwd():
            reset()
            fwd().backward(do)
        return fwd_bwd
    out = fwd()

    def bwd():
        reset()
        out.backward(do, retain_graph=True)
    return bwd


@pytest.mark.parametrize("dtype,impl,d,seq,mode", CASES, ids=[f"{dt}-{i}-d{d}-seq{s}-{m}" for dt, i, d, s, m in CASES])
def test_flash_benchmarking(bench, dtype, impl, d, seq, mode):
    device = bench.device
    batch = G.batch
    config = dict(impl=impl, dtype=dtype, d=d, seq=seq, mode=mode, batch=batch, causal=True)
    details = dict(left_out=left_out_summary(), autotune=G.autotune)
    reason = cutoff(impl, dtype, d, seq)
    if reason:
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT, reason=reason, details=details)
        return
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    if impl == "flash_triton_compiled_bwd" and device.type != "cuda":
        details["note"] = "compiled_flash_backward runs the plain PyTorch backward on the CPU (no torch.compile)"
    if impl == "naive":  # its (seq, seq) matrices are the only large leftovers worth collecting
        free_memory()
    RECORDER.clear()  # so the row's details name this row's launches only, not an earlier row's backward

    def set_up():
        q, k, v, do = attention_inputs((batch, seq, d), dtype, device)
        fwd = forward_fn(impl, q, k, v)
        fn = timed_fn(mode, fwd, do.unsqueeze(1) if impl.startswith("sdpa") else do, (q, k, v))
        return fn, time_once(fn, device)  # autotuning / compilation happen here
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=config, details=details,
                        unsupported=sdpa_rejects(impl))
    if got is None:
        return
    fn, first_s = got
    del got
    if impl.startswith("flash_triton"):
        details["tuned_configs"] = RECORDER.summary()  # set_up's first call ran (and autotuned) them
    flops = attention_flops(batch, seq, seq, d, is_causal=True, mode=mode)
    measure_kernel(bench, fn=fn, first_call_s=first_s, problem=PROBLEM, config=config, round=ROUND[mode],
                   warmup=G.warmup, rounds=G.rounds, flops=flops, details=details,
                   do_bench_warmup_ms=G.warmup_ms, do_bench_rep_ms=G.rep_ms)
