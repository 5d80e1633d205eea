"""GPU probe for issue 10: time every candidate tile config of each FlashAttention kernel on one
shape (one config per launch, no autotuner), then the per-kernel split of the best backward.
    PYTHONPATH=src python tools/probes/flash_tune.py OUT.json [leaderboard|d128]
Writes all timings to OUT.json; the numbers feed the autotune lists in flash_configs.py."""
import itertools
import json
import sys
import time

import torch
from triton.testing import do_bench

from impl.attention import FlashOptions, LaunchRecorder, flash_triton as ft
from impl.attention.flash_options import with_configs
from impl.workloads.attention import attention_inputs

SHAPES = {
    "leaderboard": [((1, 16, 16384, 64), "bf16", True)],
    # the flash_benchmarking rows behind the d 128 seq 2048 surprise: autotuned timings only
    "d128": [((1, s, 128), "bf16", True) for s in (1024, 2048, 4096)],
}
FWD = ([(128, n, w, s) for n, w, s in itertools.product((64, 128), (4, 8), (2, 3, 4, 5))]
       + [(64, 64, 4, s) for s in (3, 4, 5)] + [(64, 128, 4, 3), (128, 32, 4, 4), (256, 64, 8, 3)])
KV = ([(m, 128, w, s) for m, w, s in itertools.product((32, 64), (4, 8), (2, 3, 4, 5))]
      + [(16, 128, 4, 4), (32, 64, 4, 4), (64, 64, 4, 3), (128, 128, 8, 2)])
Q = ([(128, n, w, s) for n, w, s in itertools.product((32, 64), (4, 8), (2, 3, 4, 5))]
     + [(128, 16, 4, 4), (64, 32, 4, 4), (64, 64, 4, 3), (128, 128, 8, 2)])


def bench(fn):
    try:
        return float(do_bench(fn, warmup=10, rep=40, return_mode="median"))
    except Exception as exc:  # noqa: BLE001 - shared memory overflow etc. is a result
        return f"{type(exc).__name__}: {str(exc)[:120]}"


def sweep(kernel: str, configs, fn, base: FlashOptions) -> list[dict]:
    """fn(options) timed with each config of one kernel launched alone (the others as in `base`)."""
    rows = []
    for c in configs:
        options = with_configs(base, **{kernel: [c]})  # one value per config: its plans are reused
        rows.append({"config": c, "ms": bench(lambda: fn(options))})
    return rows


def best(rows):
    ok = [r for r in rows if isinstance(r["ms"], float)]
    return min(ok, key=lambda r: r["ms"]) if ok else None


def kernel_split(q, k, v, o, do, lse, causal, options):
    """Per-kernel GPU time of one backward (torch.profiler), ms."""
    from torch.profiler import ProfilerActivity, profile
    for _ in range(3):
        ft.flash_attention_triton_backward(q, k, v, o, do, lse, causal, options=options)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            ft.flash_attention_triton_backward(q, k, v, o, do, lse, causal, options=options)
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA" or getattr(e, "device_time_total", 0):
            out[e.key] = getattr(e, "device_time_total", 0) / 5 / 1000
    return {k: v for k, v in out.items() if v > 0}


def autotuned(shape, dtype, causal):
    dev = torch.device("cuda")
    q, k, v, do = attention_inputs(shape, dtype, dev, grad=False)
    rec = LaunchRecorder()
    opts = FlashOptions(recorder=rec)
    o, lse = ft.flash_attention_triton_forward(q, k, v, causal, options=opts)
    res = {"shape": list(shape),
           "fwd_ms": bench(lambda: ft.flash_attention_triton_forward(q, k, v, causal, options=opts)),
           "bwd_ms": bench(lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, causal, options=opts)),
           "picked": rec.summary()}
    print(json.dumps(res), flush=True)
    return res


PARTIAL = {}


def _save(res):
    """Writes what is measured so far: a probe stopped by its time limit still leaves data."""
    if PARTIAL.get("path"):
        json.dump({"device": torch.cuda.get_device_name(), "partial": res}, open(PARTIAL["path"], "w"), default=str)


def tune(shape, dtype, causal):
    dev = torch.device("cuda")
    q, k, v, do = attention_inputs(shape, dtype, dev, grad=False)
    res = {"shape": list(shape), "dtype": dtype, "causal": causal}
    t0 = time.time()
    fwd = lambda options: ft.flash_attention_triton_forward(q, k, v, causal, options=options)  # noqa: E731
    res["fwd"] = sweep("fwd", FWD, fwd, FlashOptions())
    _save(res)
    base = with_configs(FlashOptions(), fwd=[FWD[-1]])  # the forward as the sweep left it
    o, lse = fwd(base)
    bwd = lambda options: ft.flash_attention_triton_backward(q, k, v, o, do, lse, causal, options=options)  # noqa: E731
    base = with_configs(base, q=[(128, 32, 4, 3)])  # dQ fixed while the dK/dV configs vary
    res["bwd_vary_kv"] = sweep("kv", KV, bwd, base)
    _save(res)
    kv_best = best(res["bwd_vary_kv"])["config"]
    base = with_configs(base, kv=[kv_best])
    res["bwd_vary_q"] = sweep("q", Q, bwd, base)
    q_best = best(res["bwd_vary_q"])["config"]
    base = with_configs(base, q=[q_best])
    res["best"] = {"fwd": best(res["fwd"]), "kv": kv_best, "q": q_best, "bwd_ms": best(res["bwd_vary_q"])["ms"]}
    res["bwd_kernel_split_ms"] = kernel_split(q, k, v, o, do, lse, causal, base)
    tuned = FlashOptions()  # the committed lists, autotuned, for comparison
    res["autotuned"] = {"fwd_ms": bench(lambda: fwd(tuned)),
                        "bwd_ms": bench(lambda: bwd(tuned))}
    if len(shape) == 4:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        qq, kk, vv, dd = attention_inputs(shape, dtype, dev, grad=True)
        for name, be in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
            with sdpa_kernel(be):
                f = lambda: torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)  # noqa: E731
                res[f"sdpa_{name}"] = {"fwd_ms": bench(f), "fwd_bwd_ms": bench(lambda: f().backward(dd))}
    res["seconds"] = time.time() - t0
    print(json.dumps({k: res[k] for k in ("shape", "best", "autotuned", "bwd_kernel_split_ms", "seconds")}
                     | {k: res[k] for k in res if k.startswith("sdpa")}, default=str), flush=True)
    return res


if __name__ == "__main__":
    out_path, which = sys.argv[1], sys.argv[2:] or ["leaderboard"]
    PARTIAL["path"] = out_path + ".partial"
    results = []
    for w in which:
        for shape, dtype, causal in SHAPES[w]:
            results.append((tune if w == "leaderboard" else autotuned)(shape, dtype, causal))
            json.dump({"device": torch.cuda.get_device_name(), "results": results}, open(out_path, "w"), default=str)
