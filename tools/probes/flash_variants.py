"""GPU probe for issue 10 (v3): flash_triton's loads through tensor descriptors (TMA) or pointers x
tile configs, per-kernel device time from torch.profiler on the leaderboard shape (one kernel's
config varied, the others pinned), plus the error against an fp32 reference at the pinned configs.
Its first two rounds also switched kernel variants that lost and were removed (warp specialization,
a pre-scaled held operand, the dK/dV loop's load order; NOTES.md, probes/flash_variants-v3*.json).
    PYTHONPATH=src python tools/probes/flash_variants.py OUT.json
Writes every row as it is measured (a probe stopped at its time limit still leaves data)."""
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from impl.attention import FlashOptions, flash_triton as ft
from impl.attention.flash_options import with_configs
from impl.workloads.attention import attention_inputs

SHAPE, DTYPE = (1, 16, 16384, 64), "bf16"
VARIANTS = [dict(tma=False), dict(tma=True)]
SWEEP = {
    "fwd": [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 128, 4, 4), (128, 64, 8, 3), (128, 64, 8, 4),
            (128, 128, 8, 3), (128, 64, 4, 3), (64, 32, 4, 3), (128, 32, 4, 3)],
    "kv": [(64, 64, 4, 2), (64, 64, 4, 3), (64, 64, 4, 4), (64, 64, 4, 5), (64, 64, 8, 3), (32, 64, 4, 3),
           (32, 64, 4, 4), (32, 128, 8, 3), (32, 128, 4, 3), (32, 128, 4, 5), (64, 128, 8, 3), (64, 128, 4, 3),
           (128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (16, 64, 4, 4)],
    "q": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 8, 5), (128, 64, 4, 3), (128, 64, 4, 4), (128, 32, 4, 3),
          (128, 32, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3), (128, 128, 8, 2)],
}
SHORT = {"fwd": "fwd", "kv": "dkdv", "q": "dq"}
PINNED = {"fwd": (64, 128, 4, 3), "kv": (64, 64, 4, 3), "q": (64, 64, 4, 3)}
KERNELS = {"_attn_fwd": "fwd", "_attn_bwd_dkdv": "dkdv", "_attn_bwd_dq": "dq", "_attn_bwd_preprocess": "pre"}


def per_kernel_ms(fn, iters=10):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        for name, short in KERNELS.items():
            if e.key.startswith(name):
                out[short] = out.get(short, 0.0) + e.device_time_total / iters / 1000
    return out


def errors(q, k, v, do, ref, options):
    qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = ft.FlashAttentionTriton.apply(qq, kk, vv, True, options)
    o.backward(do)
    return {n: float((x.float() - r).norm() / r.norm()) for n, x, r in
            zip(("o", "dq", "dk", "dv"), (o, qq.grad, kk.grad, vv.grad), ref)}


def main(path):
    dev = torch.device("cuda")
    q, k, v, do = attention_inputs(SHAPE, DTYPE, dev)
    qh, kh, vh = (t.detach().float().requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True)
    out.backward(do.float())
    ref = [t.detach() for t in (out, qh.grad, kh.grad, vh.grad)]
    del qh, kh, vh, out
    res = {"device": torch.cuda.get_device_name(), "shape": SHAPE, "dtype": DTYPE, "rows": []}

    def step(options):
        o, lse = ft.flash_attention_triton_forward(q, k, v, True, options=options)
        ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, options=options)

    for opts in VARIANTS:
        for kernel, configs in SWEEP.items():
            for c in configs:
                options = with_configs(FlashOptions(tma=opts["tma"]),
                                       **{n: [x] for n, x in {**PINNED, kernel: c}.items()})
                row = {"options": dict(opts), "kernel": kernel, "config": c}
                t0 = time.time()
                try:
                    row["ms"] = per_kernel_ms((lambda: step(options)) if kernel != "fwd" else
                                              lambda: ft.flash_attention_triton_forward(q, k, v, True,
                                                                                       options=options))[SHORT[kernel]]
                    if c == PINNED[kernel]:
                        row["errors"] = errors(q, k, v, do, ref, options)
                except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is a result
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                row["seconds"] = round(time.time() - t0, 1)
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
                json.dump(res, open(path, "w"), indent=1)
    # anchors in the same process
    from torch.nn.attention import SDPBackend, sdpa_kernel
    qq, kk, vv, dd = attention_inputs(SHAPE, DTYPE, dev)
    for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        with sdpa_kernel(be):
            f = lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)  # noqa: E731
            res[f"sdpa_{name}"] = {"fwd_ms": do_bench(f, return_mode="median"),
                                   "fwd_bwd_ms": do_bench(lambda: f().backward(dd), return_mode="median")}
    print(json.dumps({k: res[k] for k in res if k.startswith("sdpa")}), flush=True)
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
