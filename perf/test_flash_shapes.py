"""flash_shapes (issue 24): our FlashAttention on the shapes models use, beside the SDPA anchors in
the same run. Causal and not, d ∈ {64, 80, 128}, batch × heads ≥ 64 at seq 512 … 16384 plus a
length that is not a tile multiple; forward and forward+backward; for each:

  flash_triton           FlashAttentionTriton.apply, eager (autotuned, Triton backward)
  flash_auto             the same with kernels="auto": each half the Gluon kernel the kernel table
                         (impl.attention.kernel_table) names for (arch, d, causal, dtype), Triton
                         otherwise (always on the CPU interpreter); details["kernels"] names what ran
  flash_triton_compiled  torch.compile(FlashAttentionTriton.apply): the path a compiled model pays
  sdpa_cudnn / sdpa_flash  scaled_dot_product_attention restricted to one backend

Kernel rows (kernel=True: CUDA-event timer, rounds of ≥ 1 ms, stats.median is the time; do_bench's
median beside it as the do_bench_ms cross-check). Every row of one (shape, d, causal, mode, dtype)
shares its inputs, so ours over either anchor is the ratio of two rows' medians. Ours' rows record
details["tuned_configs"] (GPU: the launch records' configs; a Gluon half gives its config) and
details["kernels"] (which kernel family ran the forward and the backward), from this row's calls only.

Correctness per row: the first call's output (and input gradients, forward+backward) against SDPA
in higher precision on the same inputs (fp32 on the GPU, fp64 math on the CPU); ours must stay
within the grid's relative-error tolerances or the test fails, the anchors' errors are recorded.

Host-cost rows (test_flash_host_cost, issue 36): one fwd+bwd call at the grid's tiny `host` shape
(1 x 1 x 128, d 64, bf16, causal), each impl timed by impl.bench.timers.HostTimer (the host clock,
no device synchronisation, one call per round): what the host pays to issue a call, where the
device is idle most of it. config host=True tells them from kernel rows.

Not run (the JSON's not_run list): OOM, a backend that rejects the config (unsupported), the
compiled rows where the grid turns compilation off (the CPU smoke: compiling an interpreter kernel
would time the interpreter; left out), and rows past the grid's budget (left out by budget; the
grid orders configs so a cut falls on the least asked-for ones).
"""
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

from impl.attention import FlashAttentionTriton, LaunchRecorder, attention_flops
from impl.workloads.attention import (attention_inputs, attention_step, flash_options, launch_kernels, measure_kernel,
                                      rel_err, sdpa_anchor, sdpa_rejects)
from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import HostTimer, time_once
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.runtime import free_memory, profile_name

PROBLEM = Problem.FLASH_SHAPES
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G.budget_s)
OURS = ("flash_triton", "flash_auto", "flash_triton_compiled")
ROUND = {"fwd": "one attention forward (batch × heads × seq × d)",
         "fwd_bwd": "one attention forward and backward, input gradients reset first"}

# One compiled function serves every shape; each (d, causal, dtype) and the first seq changes are
# recompiles, beyond dynamo's default limit of 8.
_LIMIT = "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
setattr(torch._dynamo.config, _LIMIT, max(getattr(torch._dynamo.config, _LIMIT), 256))
# Ours: autotuned, Triton backward, passed per call; RECORDER keeps what each call ran.
RECORDER = LaunchRecorder()
OPTIONS = flash_options("flash_triton", RECORDER)
AUTO = flash_options("flash_auto", RECORDER)  # the kernel table's pick per half, else the same Triton path

CASES = [(d, causal, tuple(shape), mode, impl) for d in G.dims for causal in G.causal
         for shape in G.shapes for mode in G.modes for impl in G.impls]
_STATE: dict = {}  # the compiled function; the inputs and reference of the current problem key


def _ids(case) -> str:
    d, causal, (b, h, s), mode, impl = case
    return f"d{d}-{'causal' if causal else 'full'}-{b}x{h}x{s}-{mode}-{impl}"


def attention_fn(impl: str, causal: bool):
    if impl == "flash_triton":
        return lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal, OPTIONS)
    if impl == "flash_auto":
        return lambda q, k, v: FlashAttentionTriton.apply(q, k, v, causal, AUTO)
    if impl == "flash_triton_compiled":
        if "compiled" not in _STATE:
            _STATE["compiled"] = torch.compile(FlashAttentionTriton.apply)
        compiled = _STATE["compiled"]
        return lambda q, k, v: compiled(q, k, v, causal, OPTIONS)
    return sdpa_anchor(impl, causal)


def problem_tensors(shape, d, causal, dtype, device):
    """Inputs (q, k, v, dO) and the reference (O, dQ, dK, dV) of one (shape, d, causal, dtype),
    built once and shared by every impl and mode of it; the previous key's are dropped first."""
    key = (shape, d, causal, dtype)
    if _STATE.get("key") != key:
        _STATE.pop("tensors", None)
        _STATE["key"] = None
        free_memory()
        q, k, v, do = attention_inputs((*shape, d), dtype, device)
        hi = torch.float32 if device.type == "cuda" else torch.float64
        qh, kh, vh = (t.detach().to(hi).requires_grad_() for t in (q, k, v))
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
        out.backward(do.to(hi))
        ref = [t.detach() for t in (out, qh.grad, kh.grad, vh.grad)]
        del qh, kh, vh, out
        _STATE["tensors"], _STATE["key"] = ((q, k, v, do), ref), key
    return _STATE["tensors"]



def check(errors: dict, tol: dict) -> None:
    for name, err in errors.items():
        limit = tol.out if name == "out" else tol.grad
        assert err <= limit, f"{name} relative error {err:.2e} > {limit:.0e}"


@pytest.mark.parametrize("d,causal,shape,mode,impl", CASES, ids=[_ids(c) for c in CASES])
def test_flash_shapes(bench, d, causal, shape, mode, impl):
    device = bench.device
    batch, heads, seq = shape
    dtype = G.dtype
    config = dict(impl=impl, mode=mode, batch=batch, heads=heads, seq=seq, d=d, causal=causal, dtype=dtype)
    details = dict(tol=asdict(G.tol))
    if impl in OURS:
        details["backward"] = OPTIONS.backward
    if impl == "flash_triton_compiled" and not G.compile:
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT, details=details,
                      reason=f"torch.compile off in the {profile_name()} profile (impl.workloads.sweeps): compiling "
                             "an interpreter kernel would time the interpreter")
        return
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    attn = attention_fn(impl, causal)

    def set_up():
        (q, k, v, do), ref = problem_tensors(shape, d, causal, dtype, device)
        out = {}

        def first():  # compilation and autotuning happen here; its outputs are what is checked
            q.grad = k.grad = v.grad = None
            RECORDER.clear()  # the launch records in details are this row's (a fwd row keeps no older bwd)
            out["out"] = attn(q, k, v)
            if mode == "fwd_bwd":
                out["out"].backward(do)
        return (q, k, v, do), ref, out, time_once(first, device)
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=config, details=details,
                        unsupported=sdpa_rejects(impl))
    if got is None:
        return
    (q, k, v, do), ref, res, first_s = got
    del got
    got = [res.pop("out")] + ([q.grad, k.grad, v.grad] if mode == "fwd_bwd" else [])
    errors = {name: rel_err(x, r) for name, x, r in zip(("out", "dq", "dk", "dv"), got, ref)}
    details["rel_err"] = errors
    del got
    if impl in OURS:
        details["kernels"] = launch_kernels(RECORDER)
        if device.type == "cuda":
            details["tuned_configs"] = RECORDER.summary()
    fn = attention_step(attn, mode, q, k, v, do)
    flops = attention_flops(batch * heads, seq, seq, d, is_causal=causal, mode=mode)
    measure_kernel(bench, fn=fn, first_call_s=first_s, problem=PROBLEM, config=config, round=ROUND[mode],
                   warmup=G.warmup, rounds=G.rounds, flops=flops, details=details,
                   do_bench_warmup_ms=G.warmup_ms, do_bench_rep_ms=G.rep_ms)
    if impl in OURS:
        check(errors, G.tol)


HOST = G.host


@pytest.mark.parametrize("impl", G.impls)
def test_flash_host_cost(bench, impl):
    """Host time per fwd+bwd call at the tiny shape (HostTimer: no synchronisation, one call a round)."""
    device = bench.device
    batch, heads, seq = HOST.shape
    d, causal, dtype = HOST.d, HOST.causal, HOST.dtype
    config = dict(impl=impl, mode="fwd_bwd", batch=batch, heads=heads, seq=seq, d=d, causal=causal, dtype=dtype,
                  host=True)
    details = {"backward": OPTIONS.backward} if impl in OURS else {}
    if impl == "flash_triton_compiled" and not G.compile:
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT, details=details,
                      reason=f"torch.compile off in the {profile_name()} profile (impl.workloads.sweeps): compiling "
                             "an interpreter kernel would time the interpreter")
        return
    attn = attention_fn(impl, causal)

    def set_up():
        (q, k, v, do), ref = problem_tensors((batch, heads, seq), d, causal, dtype, device)
        fn = attention_step(attn, "fwd_bwd", q, k, v, do)
        RECORDER.clear()
        first_s = time_once(fn, device)  # compilation and autotuning happen here
        return fn, first_s, (q, k, v), ref
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=config, details=details,
                        unsupported=sdpa_rejects(impl))
    if got is None:
        return
    fn, first_s, (q, k, v), ref = got
    details["rel_err"] = {name: rel_err(x, r) for name, x, r in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad),
                                                                     ref[1:])}
    if impl in OURS:
        details["kernels"] = launch_kernels(RECORDER)
        if device.type == "cuda":
            details["tuned_configs"] = RECORDER.summary()
    bench.measure(problem=PROBLEM, config=config, fn=fn, round="one attention forward and backward (host time)",
                  warmup=HOST.warmup, rounds=HOST.rounds, details=details, clock=HostTimer(),
                  metrics={Metric.FIRST_CALL_S: first_s})
