"""GPU probe (issue 36): the warp-specialized forward (`FlashOptions(warp_specialize=True)`, kernel
`_attn_fwd_ws`) against the ordinary forward and SDPA cuDNN, bf16, causal.
    PYTHONPATH=src python tools/probes/flash_ws.py OUT.json
Per shape: SDPA cuDNN forward and forward+backward; ours with the default options (autotuned) and
with warp_specialize=True (autotuned over its list, then each of its configs alone), forward and
forward+backward; max |o - o_default| as a check. do_bench medians (warmup 25, rep 100)."""
import json
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from impl.attention import FlashOptions, LaunchRecorder
from impl.attention.flash_configs import _fwd_ws_configs
from impl.attention.flash_triton import FlashAttentionTriton, flash_attention_triton_forward

SHAPES = [(4, 32, 4096, 128), (1, 32, 32768, 128), (1, 16, 16384, 64), (4, 32, 4096, 64)]


def ms(fn):
    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def main(path):
    dev = torch.device("cuda")
    rows = []
    for shape in SHAPES:
        q, k, v, do = (torch.randn(shape, device=dev, dtype=torch.bfloat16) for _ in range(4))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        cases = {"ours default": FlashOptions(),
                 "ours ws": FlashOptions(warp_specialize=True)}
        for c in _fwd_ws_configs():
            cfg = (c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
            cases[f"ours ws {cfg}"] = FlashOptions(warp_specialize=True, configs={"fwd_ws": [cfg]})

        def row(name, kind, fn, **extra):
            try:
                r = {"shape": shape, "impl": name, "kind": kind, "ms": ms(fn), **extra}
            except Exception as e:  # a config that fails is a row
                r = {"shape": shape, "impl": name, "kind": kind, "error": f"{type(e).__name__}: {e}"[:300]}
            rows.append(r)
            print(json.dumps(r), flush=True)
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows},
                      open(path, "w"), indent=1)

        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            row("sdpa cudnn", "fwd", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
            row("sdpa cudnn", "fwd+bwd",
                lambda: F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do))
        ref = flash_attention_triton_forward(q, k, v, True)[0]
        for name, opts in cases.items():
            rec = LaunchRecorder()
            opts = FlashOptions(**{f: getattr(opts, f) for f in ("warp_specialize", "configs")}, recorder=rec)
            try:
                o = flash_attention_triton_forward(q, k, v, True, options=opts)[0]
                err = float((o.float() - ref.float()).abs().max())
            except Exception as e:
                rows.append({"shape": shape, "impl": name, "error": f"{type(e).__name__}: {e}"[:300]})
                print(rows[-1], flush=True)
                continue
            row(name, "fwd", lambda: flash_attention_triton_forward(q, k, v, True, options=opts),
                max_abs_diff_vs_default=err, configs=dict(rec.last["fwd"].configs))
            if name in ("ours default", "ours ws") and shape[2] <= 16384:
                row(name, "fwd+bwd", lambda: FlashAttentionTriton.apply(qg, kg, vg, True, opts).backward(do))
        del q, k, v, do, qg, kg, vg
        torch.cuda.empty_cache()
    print(f"{'shape':18} {'kind':8} {'impl':34} {'ms':>8} {'/cudnn':>7}")
    for r in rows:
        if "ms" not in r:
            continue
        base = next(x["ms"] for x in rows if x["shape"] == r["shape"] and x["kind"] == r["kind"]
                    and x["impl"] == "sdpa cudnn" and "ms" in x)
        print(f"{'x'.join(map(str, r['shape'])):18} {r['kind']:8} {r['impl']:34} {r['ms']:8.3f} {r['ms'] / base:7.2f}")


if __name__ == "__main__":
    main(sys.argv[1])
