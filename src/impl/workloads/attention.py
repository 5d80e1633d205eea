"""Helpers shared by the attention perf files (pytorch_attention, torch_compile, flash_benchmarking,
flash_shapes, leaderboard): random inputs, relative errors against a reference, the assignment's
`triton.testing.do_bench` median as a cross-check metric, and timed forward / backward passes with
the memory in use before backward (pytorch_attention, torch_compile (a)).
"""
from __future__ import annotations

from typing import Callable

import torch

from impl.bench.harness import Harness, reset_peak_memory
from impl.bench.row import Row
from impl.runtime import free_memory, is_oom, synchronize

PASS_ROUNDS = {"forward": "one forward pass of the attention (output dropped)",
               "backward": "one backward pass of the attention (its forward runs untimed in setup)"}


def attention_inputs(shape, dtype: str, device: torch.device, seed: int = 0, grad: bool = True):
    """Random q, k, v (requiring grad when `grad`) and an upstream gradient dO, all of `shape`;
    never zeros, which can time faster than real data."""
    from impl.workloads.steps import DTYPES

    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v, do = (torch.randn(shape, device=device, dtype=DTYPES[dtype], generator=g) for _ in range(4))
    return ([t.requires_grad_() for t in (q, k, v)] if grad else [q, k, v]) + [do]


def launch_kernels(recorder) -> dict[str, str]:
    """Which kernel family ran the last forward and backward an impl.attention.LaunchRecorder saw ("triton", or
    under kernels="auto" the kernel table's Gluon kernel, "gluon_ws" / "gluon"), for a row's details["kernels"]:
    the recorder's summary() names each kernel's config, not its family."""
    return {kind: recorder.last[kind].kernel for kind in ("fwd", "bwd") if kind in recorder.last}


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """‖x − ref‖ / ‖ref‖, in the reference's (higher) precision."""
    x = x.detach().to(ref.dtype)
    return float((x - ref).norm() / ref.norm())


def do_bench_ms(fn: Callable, device: torch.device, warmup_ms: int = 25, rep_ms: int = 100) -> float | None:
    """The assignment's `triton.testing.do_bench` median (ms), kept beside a kernel row's own stats
    as a cross-check (it flushes L2 between calls; the row's rounds do not). None on a CPU, where
    do_bench has no device events, and where do_bench's own buffers (its L2-flush buffer) run out
    of memory after the row itself fitted: the cross-check is then missing, the row stands."""
    if device.type != "cuda":
        return None
    from triton.testing import do_bench

    try:
        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    except Exception as exc:  # noqa: BLE001 - only OOM is swallowed
        if not is_oom(exc):
            raise
        free_memory()
        return None


def allocated_bytes(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def run_attention_passes(bench: Harness, *, problem: str, config: dict, attn: Callable, q, k, v, grad_out,
                         mode: str, warmup: int, rounds: int, flops: float, baseline: int | None,
                         details: dict | None = None) -> Row:
    """`rounds` timed forward passes (mode "forward") or backward passes (mode "backward") of
    `attn(q, k, v)`, through the harness.

    Backward: setup (untimed) clears the input grads and runs the forward, then records
    torch.cuda.memory_allocated (the memory in use before backward) and resets the peak counter,
    so the row's peak memory is the peak of the last backward alone. The output travels to the
    timed call in a list that the call empties, so no round keeps the previous round's output
    alive (pedantic holds the last arguments while it runs the next setup). Byte figures go to
    details, absolute; `baseline_bytes` (allocated before the inputs existed) lets the report
    subtract what the rest of the process holds."""
    device = bench.device
    measured: dict = {}
    if mode == "forward":
        def fn():
            attn(q, k, v)  # output dropped at once, as its graph is
        setup = None
    elif mode == "backward":
        def setup():
            for t in (q, k, v):
                t.grad = None
            out = attn(q, k, v)
            synchronize(device)
            measured["memory_before_backward_bytes"] = allocated_bytes(device)
            reset_peak_memory(device)
            return ([out],), {}

        def fn(holder):
            holder.pop().backward(grad_out)
    else:
        raise ValueError(f"mode must be 'forward' or 'backward', got {mode!r}")
    details = dict(details or {}, baseline_bytes=baseline)
    row = bench.measure(problem=problem, config=config, fn=fn, setup=setup, round=PASS_ROUNDS[mode], warmup=warmup,
                        rounds=rounds, flops=flops, details=details)
    if measured:
        row.details.update(measured)
        if row.timing is not None:  # measured (not an OOM row): rewrite its extra_info with the figure
            bench.save(row)
    return row


STEP_MODES = ("fwd", "fwd_bwd", "bwd")  # attention_step's


def attention_step(attn: Callable, mode: str, q, k, v, do) -> Callable:
    """The call a kernel row times: the forward ("fwd"), forward and backward ("fwd_bwd"), or the backward
    alone through autograd ("bwd": one forward runs here, each call walks its saved graph again, retain_graph);
    the input gradients reset first (so no round adds into the previous round's gradients)."""
    if mode not in STEP_MODES:
        raise ValueError(f"attention_step: mode {mode!r} is none of {STEP_MODES}")
    if mode == "fwd":
        return lambda: attn(q, k, v)
    out = attn(q, k, v) if mode == "bwd" else None

    def fwd_bwd():
        q.grad = k.grad = v.grad = None
        attn(q, k, v).backward(do)

    def bwd():
        q.grad = k.grad = v.grad = None
        out.backward(do, retain_graph=True)
    return bwd if mode == "bwd" else fwd_bwd


FLASH_IMPLS = ("flash_triton", "flash_auto")  # flash_options'


def flash_options(impl: str, recorder=None):
    """Ours' FlashOptions as the attention perf files run them (leaderboard, flash_shapes; eager or under
    torch.compile): autotuned, Triton backward; "flash_auto" the same under kernels="auto" (each half the kernel
    table's pick, else the same Triton path). `recorder`: an impl.attention.LaunchRecorder, or None."""
    from impl.attention import FlashOptions

    if impl not in FLASH_IMPLS:
        raise ValueError(f"flash_options: impl {impl!r} is none of {FLASH_IMPLS}")
    return FlashOptions(backward="triton", autotune=True, recorder=recorder,
                        kernels="auto" if impl == "flash_auto" else "triton")


def measure_kernel(bench, *, fn: Callable, first_call_s: float, do_bench_warmup_ms: int = 25,
                   do_bench_rep_ms: int = 100, **measure_kwargs):
    """A kernel row (CUDA-event rounds) with its first call's time as a metric and, on a GPU,
    do_bench's median beside its own as a cross-check."""
    from impl.bench.row import Metric, Status

    metrics = {Metric.FIRST_CALL_S: first_call_s, **measure_kwargs.pop("metrics", {})}
    row = bench.measure(fn=fn, kernel=True, metrics=metrics, **measure_kwargs)
    if row.status is Status.MEASURED:
        cross = do_bench_ms(fn, bench.device, warmup_ms=do_bench_warmup_ms, rep_ms=do_bench_rep_ms)
        if cross is not None:
            row.metrics[Metric.DO_BENCH_MS] = cross
            bench.save(row)
    return row


def sdpa_rejects(impl: str) -> Callable[[Exception], bool]:
    """For set_up_or_oom's `unsupported`: an SDPA anchor whose backend refuses the config raises a
    RuntimeError (no kernel for that head dim or dtype); our kernels' errors are failures."""
    return lambda exc: impl.startswith("sdpa") and isinstance(exc, RuntimeError)


def sdpa_anchor(impl: str, causal: bool) -> Callable:
    """`scaled_dot_product_attention` restricted to one backend ("sdpa_flash" or "sdpa_cudnn"), the
    anchors every attention benchmark runs beside ours; a config the backend rejects raises."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"sdpa_flash": SDPBackend.FLASH_ATTENTION, "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}[impl]

    def sdpa(q, k, v):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return sdpa


__all__ = ["FLASH_IMPLS", "PASS_ROUNDS", "STEP_MODES", "allocated_bytes", "attention_inputs", "attention_step",
           "do_bench_ms", "flash_options", "launch_kernels", "measure_kernel", "rel_err", "run_attention_passes",
           "sdpa_anchor", "sdpa_rejects"]
