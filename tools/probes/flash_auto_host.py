"""GPU probe (issue 47, stage 4): the host cost of FlashOptions(kernels="auto") against the Triton path,
where the twenty-sixth session's flash_shapes rows showed flash_auto 3-4x slower than flash_triton at
4x32x512 and 4x32x1024 (d 128 causal) and level at 4096 and above: a per-call host cost, not the kernels.
    PYTHONPATH=src python tools/probes/flash_auto_host.py OUT.json
Per shape (bf16, causal): host µs per call (flash_host_overhead.host_us: 300 calls after 20 warm-up, no sync
inside) and device ms (do_bench median) of the forward alone and of forward+backward (grads reset first, as
flash_shapes does), for kernels "triton", "auto" (the Gluon call plans: direct launches after a signature's first
call) and "auto, direct_launch=False" (every call through the Gluon launchers, the path before the plans), and of
the Gluon launchers called directly; then cProfile of 200 auto fwd+bwd calls (own and cumulative time, top 40
each). The JSON records which kernels each case ran (its launch records), so a row that fell back to Triton shows."""
import json
import sys

import torch
import triton
from triton.testing import do_bench

from flash_host_overhead import cprofile_tables, host_us  # the probe beside this one (its folder is on sys.path)
from impl.attention import FlashAttentionTriton, FlashOptions, LaunchRecorder
from impl.attention.flash_gluon_bwd_ws import flash_gluon_backward_ws
from impl.attention.flash_gluon_ws import flash_gluon_ws_forward

SHAPES = ((4, 32, 512, 128), (4, 32, 1024, 128), (4, 32, 4096, 128))


def cases(shape):
    dev = torch.device("cuda")
    q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    do = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    with torch.no_grad():
        o, lse = flash_gluon_ws_forward(q, k, v, True)
    out, recorders = {}, {}
    for name, kw in (("triton", {}), ("auto", dict(kernels="auto")),
                     ("auto, direct_launch=False", dict(kernels="auto", direct_launch=False))):
        rec = LaunchRecorder()
        opts = FlashOptions(recorder=rec, **kw)

        def fwd(opts=opts):
            with torch.no_grad():
                FlashAttentionTriton.apply(q, k, v, True, opts)

        def fwd_bwd(opts=opts):
            q.grad = k.grad = v.grad = None
            FlashAttentionTriton.apply(q, k, v, True, opts).backward(do)
        out[f"{name} fwd"], out[f"{name} fwd+bwd"] = fwd, fwd_bwd
        recorders[f"{name} fwd"] = recorders[f"{name} fwd+bwd"] = rec
    out["ws forward launcher"] = lambda: flash_gluon_ws_forward(q.detach(), k.detach(), v.detach(), True)
    out["ws backward launcher"] = lambda: flash_gluon_backward_ws(q.detach(), k.detach(), v.detach(), o, do, lse, True)
    return out, recorders


def main(path):
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "dtype": "bf16", "causal": True, "rows": []}
    for shape in SHAPES:
        fns, recorders = cases(shape)
        for name, fn in fns.items():
            rec = recorders.get(name)
            if rec is not None:
                rec.clear()
            row = {"shape": "x".join(map(str, shape)), "case": name, "host_us": host_us(fn),
                   "device_ms": do_bench(fn, warmup=25, rep=100)}
            if rec is not None:
                row["kernels"] = {kind: r.kernel for kind, r in sorted(rec.last.items())}
            res["rows"].append(row)
            print(json.dumps(row), flush=True)
        if shape == SHAPES[0]:
            res.update(tables := cprofile_tables(fns["auto fwd+bwd"], 200, 40))
            for text in tables.values():
                print(text[:5000], flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
