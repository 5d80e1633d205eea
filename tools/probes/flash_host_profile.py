"""GPU probe (issue 36): where the host time of one FlashAttentionTriton fwd+bwd call goes at a tiny
shape (1x1x128x64, bf16, causal), where the device work is nothing.
    PYTHONPATH=src python tools/probes/flash_host_profile.py OUT.json
Rows: host µs per call (flash_host_overhead.host_us: perf_counter over 300 calls after 20 warm-up) for an
empty Triton kernel launch (grads accumulating into .grad, and again with them reset to None
before each call as the flash_shapes host row does), a trivial elementwise fwd+bwd eager and compiled (torch.compile's own
per-call floor), SDPA's flash and cuDNN backends (and SDPA compiled), ours eager and compiled;
then cProfile of 300 eager fwd+bwd calls (own time and cumulative time, top 45 each)."""
import gc
import json
import sys
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from flash_host_overhead import cprofile_tables, host_us  # the probe beside this one (its folder is on sys.path)
from impl.attention.flash_triton import FlashAttentionTriton


@triton.jit
def _empty(x_ptr):
    pass


class _EmptyFunction(torch.autograd.Function):
    """The floor of any Python autograd.Function of (q, k, v) -> o: no kernels, fresh outputs and
    gradients (what our Function adds to the engine's cost, whatever its launchers do)."""

    @staticmethod
    def forward(ctx, q, k, v):
        ctx.save_for_backward(q, k, v)
        return torch.empty_like(q)

    @staticmethod
    def backward(ctx, do):
        q, k, v = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def main(path):
    dev = torch.device("cuda")
    shape = (1, 1, 128, 64)
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    x = torch.empty(1, device=dev)

    def sdpa(backend):
        def call():
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
        return call

    def ours():
        FlashAttentionTriton.apply(q, k, v, True).backward(do)

    def ours_fwd():
        with torch.no_grad():
            FlashAttentionTriton.apply(q, k, v, True)

    compiled = torch.compile(lambda a, b, c: FlashAttentionTriton.apply(a, b, c, True))

    def ours_compiled():
        compiled(q, k, v).backward(do)

    trivial = torch.compile(lambda a, b, c: a * b + c)

    def trivial_eager():
        (q * k + v).backward(do)

    def trivial_compiled():  # torch.compile's own per-call floor for a fwd+bwd of three inputs
        trivial(q, k, v).backward(do)

    sdpa_compiled = torch.compile(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True))

    cases = {"empty triton launch": lambda: _empty[(1,)](x),
             "trivial a*b+c fwd+bwd eager": trivial_eager,
             "trivial a*b+c fwd+bwd compiled": trivial_compiled,
             "sdpa (default backend) compiled fwd+bwd": lambda: sdpa_compiled(q, k, v).backward(do),
             "sdpa flash fwd+bwd": sdpa(SDPBackend.FLASH_ATTENTION),
             "sdpa cudnn fwd+bwd": sdpa(SDPBackend.CUDNN_ATTENTION),
             "empty Python autograd.Function fwd+bwd": lambda: _EmptyFunction.apply(q, k, v).backward(do),
             "ours fwd (no grad)": ours_fwd,
             "ours fwd+bwd": ours,
             "ours compiled fwd+bwd": ours_compiled}
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "shape": shape, "dtype": "bf16", "causal": True, "rows": []}
    def reset(fn):  # the flash_shapes host row's call: input grads cleared first (no accumulation)
        def call():
            q.grad = k.grad = v.grad = None
            fn()
        return call

    for name in ("sdpa flash fwd+bwd", "sdpa cudnn fwd+bwd", "ours fwd+bwd", "ours compiled fwd+bwd",
                 "trivial a*b+c fwd+bwd eager", "empty Python autograd.Function fwd+bwd"):
        cases[name + ", grads reset"] = reset(cases[name])
    # twice, interleaved: the host's speed drifts within a run
    cases.update({name + " (again)": cases[name] for name in list(cases) if "grads reset" in name})
    for name, fn in cases.items():
        try:
            row = {"case": name, "host_us": host_us(fn)}
        except Exception as e:  # a backend that refuses the shape is a row, not a crash
            row = {"case": name, "error": f"{type(e).__name__}: {e}"[:300]}
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    # Per-call distribution (1000 calls timed one by one, gc on and off): a uniformly slower call and
    # one with periodic spikes have the same mean; the host row's std told them apart poorly.
    res["distribution"] = []
    for name in ("sdpa flash fwd+bwd, grads reset", "ours fwd+bwd, grads reset",
                 "empty Python autograd.Function fwd+bwd, grads reset"):
        for gc_on in (True, False):
            fn = cases[name]
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            if not gc_on:
                gc.disable()
            times = []
            for _ in range(1000):
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
            gc.enable()
            torch.cuda.synchronize()
            times.sort()
            row = {"case": name, "gc": gc_on, **{f"p{p}": round(times[min(999, p * 10)], 1) for p in (10, 50, 90, 99)},
                   "max": round(times[-1], 1), "mean": round(sum(times) / len(times), 1)}
            res["distribution"].append(row)
            print(json.dumps(row), flush=True)
    # The C++ side (aten ops, autograd nodes) of 50 calls each, by self CPU time.
    from torch.profiler import ProfilerActivity, profile
    for name in ("sdpa flash fwd+bwd, grads reset", "ours fwd+bwd, grads reset",
                 "empty Python autograd.Function fwd+bwd, grads reset"):
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(50):
                cases[name]()
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
        res[f"torch_profile {name}"] = table
        print(name, "\n", table, flush=True)
    res.update(tables := cprofile_tables(ours, 300, 45))
    for text in tables.values():
        print(text[:6000])
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
