"""GPU probe for the head-dim split (issue 24): head dims 80 and 96 computed as two power-of-two
tiles (64 + 16, 64 + 32; FlashOptions(split_head_dim=True), the default) against the same kernels padded
to 128 columns (the tiling before the split: FlashOptions(split_head_dim=False)), in one
process, at one fixed config per kernel (the leaderboard picks, as flash_bwd_variants.py --quick)
so that only the tiling differs. d 64 is the control (the same kernels either way).

Per shape (bf16) and tiling: do_bench medians of the forward launcher, the backward launcher per
variant (two-pass; atomic, dQ by descriptor bulk reduce-add at these sizes) and the relative error
of O and dQ against fp32 SDPA on the first heads.

    PYTHONPATH=src python tools/probes/flash_head_dim_split.py [--smoke]
writes $OUT/flash_head_dim_split.json (or ./) and prints a table. --smoke: a tiny fp16 shape on the
CPU through the interpreter (TRITON_INTERPRET=1), one timed call each: checks the probe, not speed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if "--smoke" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from impl.attention import FlashOptions, LaunchRecorder, attention_flops  # noqa: E402
from impl.attention.flash_options import with_configs  # noqa: E402
from impl.attention import flash_triton as ft  # noqa: E402

CONFIGS = dict(fwd=[(64, 128, 4, 3)], kv=[(64, 64, 4, 3)], q=[(64, 64, 4, 3)], atomic=[(64, 128, 8, 2)])
# (batch, heads, seq, d, causal): the 2.7B model's attention, long sequences, the d 64 control.
SHAPES = [(4, 32, 512, 80, True), (1, 16, 8192, 80, True), (1, 16, 8192, 96, True),
          (1, 16, 8192, 64, True)]
SMOKE_SHAPES = [(1, 2, 40, 80, True), (1, 2, 40, 64, False)]


def timer(smoke: bool):
    if smoke:
        def once(fn):
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        return once
    from triton.testing import do_bench
    return lambda fn: do_bench(fn, return_mode="median")


def rel(x, ref) -> float:
    return float((x.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def measure(shape, tiling: str, smoke: bool) -> dict:
    b, h, n, d, causal = shape
    recorder = LaunchRecorder()
    options = with_configs(FlashOptions(split_head_dim=tiling == "split", recorder=recorder),
                           **({} if smoke else CONFIGS))
    device, dtype = ("cpu", torch.float16) if smoke else ("cuda", torch.bfloat16)
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v, do = (torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g) for _ in range(4))
    bench = timer(smoke)
    row = {"shape": list(shape), "tiling": tiling, "ms": {}, "err": {}}
    row["ms"]["fwd"] = bench(lambda: ft.flash_attention_triton_forward(q, k, v, causal, options=options))
    o, lse = ft.flash_attention_triton_forward(q, k, v, causal, options=options)
    row["d_tiles"] = recorder.summary()["d_tiles"]
    refs = [t[:, :2].float().requires_grad_() for t in (q, k, v)]
    o_ref = F.scaled_dot_product_attention(*refs, is_causal=causal)
    o_ref.backward(do[:, :2].float())
    row["err"]["o"] = rel(o[:, :2], o_ref.detach())
    for variant in ("two_pass", "atomic"):
        def bwd():
            return ft.flash_attention_triton_backward(q, k, v, o, do, lse, causal, variant=variant, options=options)
        row["ms"][variant] = bench(bwd)
        dq = bwd()[0]
        row["err"][f"dq {variant}"] = rel(dq[:, :2], refs[0].grad)
    row["fwd_tflops"] = attention_flops(b * h, n, n, d, causal, "fwd") / row["ms"]["fwd"] * 1e-9
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny fp16 shapes on the CPU interpreter")
    args = ap.parse_args()
    start = time.time()
    rows = []
    for shape in SMOKE_SHAPES if args.smoke else SHAPES:
        for tiling in ("padded", "split"):
            rows.append(measure(shape, tiling, args.smoke))
            print(json.dumps(rows[-1]), flush=True)
    res = {"device": "cpu (interpreter)" if args.smoke else torch.cuda.get_device_name(), "configs": CONFIGS,
           "rows": rows, "seconds": time.time() - start}
    json.dump(res, open(os.path.join(os.environ.get("OUT", "."), "flash_head_dim_split.json"), "w"), indent=1)
    print(f"{'shape':>22} {'tiles':>11} {'fwd ms':>8} {'2-pass ms':>9} {'atomic ms':>9} {'fwd TF/s':>8}  "
          f"split/padded (fwd, 2-pass, atomic)")
    for pad, split in zip(rows[::2], rows[1::2]):
        for r in (pad, split):
            ms = r["ms"]
            print(f"{'x'.join(map(str, r['shape'][:4])) + (' c' if r['shape'][4] else ''):>22} {r['d_tiles']:>11} "
                  f"{ms['fwd']:8.3f} {ms['two_pass']:9.3f} {ms['atomic']:9.3f} {r['fwd_tflops']:8.0f}")
        print(" " * 22, "split/padded:", "  ".join(f"{split['ms'][c] / pad['ms'][c]:.2f}"
                                                    for c in ("fwd", "two_pass", "atomic")))
    print(f"{res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
