"""GPU probe: FlashAttention at head dim 128 (bf16, causal) against SDPA cuDNN / SDPA flash, per config.

Shapes: 4x32x4096x128 (anchors, our defaults, forward sweep with tma on and off, backward sweep),
1x16x16384x64 (the leaderboard shape, a control: anchors and defaults), 1x32x32768x128 (forward
only, 15-75 ms a call: last, if the budget allows). Anchors: SDPA cuDNN and flash forward, backward
alone, forward+backward; ours with the default options (autotuned). Forward sweep: each FWD config
alone (FlashOptions(configs={"fwd": [cfg]}, tma_min_scores=0)). Backward sweep (the two-pass launcher
alone, o and lse from one forward, tma on): each KV config with "q" at Q[0] (the default list's
first), then each Q config with "kv" at the sweep's fastest KV. do_bench medians (warmup 25, rep 100);
TFLOP/s from impl.attention.attention_flops; ratio: ms over the faster SDPA backend's (same shape,
kind). A failing config (compile, shared memory) is a row with its error text. A row starts only
while elapsed + its estimate (COMPILE_S per new compile) is within --budget-s; at the first that is
not the run stops ("stopped_by_budget", "left_out" in the JSON). Rows print as they finish, then a
table sorted by shape, kind, ms. The q sweep's Q[0] row repeats the kv winner: a noise check.

    PYTHONPATH=src python tools/probes/flash_d128.py OUT.json [--budget-s S] [--dry-run]
--dry-run prints the planned rows and their estimates without touching the GPU.
"""
from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from impl.attention import FlashOptions, LaunchRecorder, attention_flops
from impl.attention.flash_triton import (FlashAttentionTriton, flash_attention_triton_backward,
                                         flash_attention_triton_forward)

MAIN, CONTROL, LONG = (4, 32, 4096, 128), (1, 16, 16384, 64), (1, 32, 32768, 128)
SHAPES = (MAIN, CONTROL, LONG)
# (BLOCK_M, BLOCK_N, num_warps, num_stages)
FWD = [(128, 128, 8, 3), (128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 4), (128, 64, 4, 3), (64, 128, 4, 3),
       (64, 64, 4, 3), (128, 32, 8, 3), (64, 128, 8, 3), (128, 128, 4, 3)]
KV = [(64, 64, 4, 3), (32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3), (64, 128, 4, 3), (128, 128, 8, 2)]
Q = [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 4, 3), (64, 32, 4, 3), (128, 32, 4, 3)]
KINDS = ("fwd", "bwd", "fwd+bwd")
FLOP_MODE = {"fwd": "fwd", "bwd": "bwd", "fwd+bwd": "fwd_bwd"}
SDPA = {"cudnn": SDPBackend.CUDNN_ATTENTION, "sdpa flash": SDPBackend.FLASH_ATTENTION}
COMPILE_S = 5.0  # rough seconds per new Triton compile on the H100's host
AUTOTUNE_COMPILES = {"fwd": 9, "bwd": 17, "fwd+bwd": 0}  # default lists: fwd 9, kv 9 + q 8


def name(shape) -> str:
    return "x".join(map(str, shape))


def plan() -> list:
    """The rows in the order they run (most informative first); config None: SDPA, "default": ours."""
    specs = []

    def add(shape, kind, impl, config=None, tma=None, est=1.0):
        specs.append(dict(shape=name(shape), kind=kind, impl=impl, config=config, tma=tma, est=est))

    for shape, kinds in ((MAIN, KINDS), (CONTROL, KINDS), (LONG, ("fwd",))):
        for impl in SDPA:
            for kind in kinds:
                add(shape, kind, impl)
        for kind in kinds:  # LONG reuses MAIN's picks: the autotune key caps the sequence bucket
            add(shape, kind, "ours", "default", est=1.0 + COMPILE_S * AUTOTUNE_COMPILES[kind] * (shape != LONG))
        if shape == CONTROL:
            continue
        for tma in (True, False):
            for c in FWD:
                add(shape, "fwd", "ours", {"fwd": c}, tma, est=1.0 + COMPILE_S * (shape == MAIN))
        if shape == MAIN:
            for c in KV:
                add(shape, "bwd", "ours", {"kv": c, "q": Q[0]}, True, est=1.0 + COMPILE_S * (1 + (c == KV[0])))
            for c in Q:
                add(shape, "bwd", "ours", {"kv": None, "q": c}, True, est=1.0 + COMPILE_S)  # None: best kv
    return specs


def cfg_text(cfg) -> str:
    if isinstance(cfg, dict):  # kernel -> (BLOCK_M, BLOCK_N, warps, stages); None: the kv sweep's best
        return " ".join(f"{k} {v[0]}x{v[1]} w{v[2]} s{v[3]}" if v else f"{k} best" for k, v in cfg.items())
    return cfg or ""


def label(row) -> str:
    tma = {None: "", True: " tma", False: " no-tma"}[row["tma"]]
    return f"{row['shape']} {row['kind']} {row['impl']} {cfg_text(row['config'])}".rstrip() + tma


def resolve(config: dict, best_kv) -> dict:
    """A sweep row's configs, the kv sweep's best (best_kv) in place of None."""
    return {kn: tuple(c or best_kv) for kn, c in config.items()}


def ratios(rows) -> None:
    """Fill tflops and ratio (ms / the faster SDPA backend's ms, same shape and kind) in place."""
    best = {}
    for r in rows:
        if r["impl"] in SDPA and r.get("ms") is not None:
            key = (r["shape"], r["kind"])
            best[key] = min(best.get(key, float("inf")), r["ms"])
    for r in rows:
        if r.get("ms") is None:
            r["tflops"] = r["ratio"] = None
            continue
        b, h, n, d = map(int, r["shape"].split("x"))
        r["tflops"] = attention_flops(b * h, n, n, d, True, FLOP_MODE[r["kind"]]) / r["ms"] * 1e-9
        anchor = best.get((r["shape"], r["kind"]))
        r["ratio"] = r["ms"] / anchor if anchor else None


HEAD = f"{'shape':<16}{'kind':<8}{'impl':<11}{'config':<32}{'tma':<6}{'ms':>9}{'TF/s':>7}{'/sdpa':>7}  error"


def line(r) -> str:
    num = (lambda x, f: f"{x:{f}}" if x is not None else "-")
    return (f"{r['shape']:<16}{r['kind']:<8}{r['impl']:<11}{cfg_text(r['config']):<32}{str(r.get('tma')):<6}"
            f"{num(r.get('ms'), '9.3f'):>9}{num(r.get('tflops'), '7.0f'):>7}{num(r.get('ratio'), '7.2f'):>7}"
            f"  {(r.get('error') or '')[:60]}")


def table(rows) -> str:
    order = {name(s): i for i, s in enumerate(SHAPES)}
    key = (lambda r: (order.get(r["shape"], 99), r["shape"], KINDS.index(r["kind"]),
                      r["ms"] if r.get("ms") is not None else float("inf")))
    return "\n".join([HEAD] + [line(r) for r in sorted(rows, key=key)])


def bench(fn, leaves=None) -> float:
    return float(do_bench(fn, warmup=25, rep=100, grad_to_none=leaves, return_mode="median"))


def inputs(shape: str) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(*map(int, shape.split("x")), device="cuda", dtype=torch.bfloat16, generator=g)
                   for _ in range(4))
    return {"qkv": (q, k, v), "do": do, "leaves": [t.clone().requires_grad_() for t in (q, k, v)]}


def measure(spec, t) -> dict:
    """Time one row (config resolved); returns ms, and for ours the launch record summary and tma."""
    kind, (q, k, v), do, leaves = spec["kind"], t["qkv"], t["do"], t["leaves"]
    if spec["impl"] in SDPA:
        with sdpa_kernel(SDPA[spec["impl"]]):
            if kind == "fwd":
                return {"ms": bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))}
            if kind == "bwd":
                o = F.scaled_dot_product_attention(*leaves, is_causal=True)
                return {"ms": bench(lambda: o.backward(do, retain_graph=True), leaves)}
            return {"ms": bench(lambda: F.scaled_dot_product_attention(*leaves, is_causal=True).backward(do), leaves)}
    rec, cfg = LaunchRecorder(), spec["config"]
    options = FlashOptions(recorder=rec) if cfg == "default" else FlashOptions(
        configs={kn: [c] for kn, c in cfg.items()}, tma=spec["tma"], tma_min_scores=0, recorder=rec,
        variant="two_pass" if kind == "bwd" else None)
    if kind == "fwd":
        ms = bench(lambda: flash_attention_triton_forward(q, k, v, True, options=options))
    elif kind == "bwd":
        if "o_lse" not in t:
            t["o_lse"] = flash_attention_triton_forward(q, k, v, True)
        o, lse = t["o_lse"]
        ms = bench(lambda: flash_attention_triton_backward(q, k, v, o, do, lse, True, options=options))
    else:
        ms = bench(lambda: FlashAttentionTriton.apply(*leaves, True, options).backward(do), leaves)
    picked = rec.summary()
    return {"ms": ms, "picked": picked, "tma": picked.get("tma")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON output path")
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no row that would end past this")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, touch no GPU")
    args = ap.parse_args()
    specs = plan()
    if args.dry_run:
        for s in specs:
            print(f"{label(s):<70} est {s['est']:5.0f} s")
        print(f"{len(specs)} rows, estimate {sum(s['est'] for s in specs):.0f} s; budget {args.budget_s:.0f} s")
        return
    start, rows, t, best_kv = time.time(), [], {"shape": None}, (KV[0], float("inf"))
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "budget_s": args.budget_s, "stopped_by_budget": False, "left_out": [], "rows": rows}
    print(HEAD, flush=True)
    for i, spec in enumerate(specs):
        if time.time() - start + spec["est"] > args.budget_s:
            res["stopped_by_budget"], res["left_out"] = True, [label(s) for s in specs[i:]]
            print(f"budget: stopped after {time.time() - start:.0f} s, {len(specs) - i} rows left out", flush=True)
            break
        if t["shape"] != spec["shape"]:
            t = None  # free the last shape's tensors first
            torch.cuda.empty_cache()
            t = inputs(spec["shape"]) | {"shape": spec["shape"]}
        row = {k: v for k, v in spec.items() if k != "est"} | dict(ms=None, tflops=None, ratio=None, error=None)
        if isinstance(spec["config"], dict):
            row["config"] = resolve(spec["config"], best_kv[0])
        t0 = time.time()
        try:
            row.update(measure(row, t))
        except Exception as e:  # noqa: BLE001 - a failed config is a result; the sweep goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["s"] = round(time.time() - t0, 1)
        kv = spec["config"].get("kv") if isinstance(spec["config"], dict) else None  # set: a kv sweep row
        if kv and row["ms"] is not None and row["ms"] < best_kv[1]:
            best_kv = (kv, row["ms"])
        rows.append(row)
        ratios(rows)
        print(line(row), flush=True)
        res["seconds"] = time.time() - start
        json.dump(res, open(args.out, "w"), indent=1, default=str)
    res["seconds"] = time.time() - start
    json.dump(res, open(args.out, "w"), indent=1, default=str)
    print(table(rows))
    print(f"{res['seconds']:.0f} s; {res['device']}, torch {res['torch']}, triton {res['triton']}"
          + (f"; budget stop, {len(res['left_out'])} rows left out" if res["stopped_by_budget"] else ""))


if __name__ == "__main__":
    main()
