"""GPU probe for issue 24 (flash Version 4): the two-pass and the single-pass (atomic dQ) backward
of flash_triton per shape, against an fp32 reference and beside SDPA cuDNN / SDPA flash.

Per shape (bf16): the relative error (Frobenius) of o, dq, dk, dv of each variant against fp32 SDPA
on the same inputs (at most 8 heads of them); do_bench medians of our forward, our backward alone
(the launcher, per variant: two_pass, atomic with descriptor bulk reductions of dQ, atomic with
element atomics), our eager forward+backward per variant, and SDPA cuDNN / flash forward and
forward+backward. Then the host time per call of the forward launcher against an empty Triton
kernel's launch (the floor). Shapes: the leaderboard (1x16x16384x64 causal), the 2.7B model's
attention (4x32x512x80), then d in {64, 80, 128} x seq in {512, 1024, 2048, 4096, 16384} x causal
and not at batch x heads 64, and a length that is not a tile multiple (1000).

Autotune lists are cut to 1-2 configs per kernel (below; every call's FlashOptions carries them) and
the element-atomics variant runs on
the named shapes only: compiles, not timings, would otherwise fill the time. Stops starting new shapes after --budget-s (default 300 s; the call's limit is
10 minutes, the start of a machine takes up to 2); every finished row is in the JSON.

    PYTHONPATH=src python tools/probes/flash_bwd_variants.py [--quick] [--budget-s 300]
writes $OUT/flash_bwd_variants.json (or ./flash_bwd_variants.json) and prints a table.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

from impl.attention import FlashOptions, LaunchRecorder, attention_flops, backward_choice
from impl.attention import flash_triton as ft
from impl.attention.flash_options import with_configs


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    d: int
    causal: bool
    label: str = ""

    @property
    def name(self) -> str:
        return f"{self.batch}x{self.heads}x{self.seq}x{self.d}{' causal' if self.causal else ''}"


@dataclass
class Row:
    shape: Shape
    ms: Dict[str, float] = field(default_factory=dict)       # case -> do_bench median (ms)
    errors: Dict[str, Dict[str, float]] = field(default_factory=dict)  # variant -> tensor -> rel error
    configs: Dict[str, Dict[str, str]] = field(default_factory=dict)   # case -> LaunchRecorder.summary()
    failed: Dict[str, str] = field(default_factory=dict)      # case -> error text
    seconds: float = 0.0


# (BLOCK_M, BLOCK_N, warps, stages).
# Full: the v3 leaderboard picks for the two-pass kernels and the forward (one compile each per head
# dim, causal, descriptor setting), two for the atomic kernel: the unspilled ones of the sm_90 compile
# check at d 64 (NOTES.md, Version 4).
CONFIGS_FULL = dict(fwd=[(64, 128, 4, 3)], kv=[(64, 64, 4, 3)], q=[(64, 64, 4, 3)],
                    atomic=[(64, 128, 8, 2), (32, 128, 8, 3)])
CONFIGS_QUICK = {name: configs[:1] for name, configs in CONFIGS_FULL.items()}

# Variants of the backward: (name, FlashOptions.variant, FlashOptions.atomic_dq_tma).
VARIANTS = [("two_pass", "two_pass", True), ("atomic", "atomic", True), ("atomic_elem", "atomic", False)]


def shapes(quick: bool) -> List[Shape]:
    first = [Shape(1, 16, 16384, 64, True, "leaderboard"), Shape(4, 32, 512, 80, True, "2.7B attention")]
    if quick:
        return first + [Shape(4, 16, 2048, 128, True), Shape(4, 16, 1000, 80, False, "not a tile multiple"),
                        Shape(4, 16, 4096, 64, False)]
    grid = [Shape(4 if seq < 16384 else 1, 16 if seq < 16384 else 64, seq, d, causal)
            for d in (64, 80, 128) for seq in (512, 1024, 2048, 4096, 16384) for causal in (True, False)]
    # the short sequences first: they are the host-bound rows the issue lists
    grid.sort(key=lambda s: (s.seq, s.d, not s.causal))
    return first + [Shape(4, 16, 1000, 80, True, "not a tile multiple")] + grid


def inputs(s: Shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(s.batch, s.heads, s.seq, s.d, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.float() - ref).norm() / ref.norm().clamp_min(1e-30))


def check(s: Shape, q, k, v, do, base: FlashOptions) -> Dict[str, Dict[str, float]]:
    """Errors of each variant on at most 8 heads against fp32 SDPA (memory-efficient or math)."""
    q, k, v, do = (t.flatten(0, 1)[:8].unsqueeze(0).contiguous() for t in (q, k, v, do))
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        o_ref = F.scaled_dot_product_attention(*leaves, is_causal=s.causal)
    o_ref.backward(do.float())
    refs = [o_ref.detach()] + [t.grad for t in leaves]
    out = {}
    for name, variant, dq_tma in VARIANTS:
        options = replace(base, variant=variant, atomic_dq_tma=dq_tma)
        ours = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        o = ft.FlashAttentionTriton.apply(*ours, s.causal, options)
        o.backward(do)
        out[name] = {n: rel(x, r) for n, x, r in zip(("o", "dq", "dk", "dv"), [o] + [t.grad for t in ours], refs)}
    return out


def bench(fn, leaves=None) -> float:
    return do_bench(fn, grad_to_none=leaves, return_mode="median")


def measure(s: Shape, base: FlashOptions) -> Row:
    row = Row(s)
    t0 = time.time()
    q, k, v, do = inputs(s)
    try:
        row.errors = check(s, q, k, v, do, base)
    except Exception as e:  # noqa: BLE001 - a probe records what failed and goes on
        row.failed["check"] = repr(e)[:300]
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]

    recorder = LaunchRecorder()
    fwd_options = replace(base, recorder=recorder)

    def fwd():
        return ft.flash_attention_triton_forward(q, k, v, s.causal, options=fwd_options)

    row.ms["ours fwd"] = bench(fwd)
    row.configs["ours fwd"] = recorder.summary()
    o, lse = fwd()
    for name, variant, dq_tma in VARIANTS:
        if name == "atomic_elem" and not s.label:
            continue
        options = replace(base, variant=variant, atomic_dq_tma=dq_tma, recorder=recorder)
        try:
            row.ms[f"ours bwd {name}"] = bench(
                lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, s.causal, options=options))
            row.ms[f"ours fwd+bwd {name}"] = bench(
                lambda: ft.FlashAttentionTriton.apply(*leaves, s.causal, options).backward(do), leaves)
            row.configs[f"ours {name}"] = recorder.summary()
        except Exception as e:  # noqa: BLE001
            row.failed[name] = repr(e)[:300]
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                row.ms[f"{name} fwd"] = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=s.causal))
                row.ms[f"{name} fwd+bwd"] = bench(
                    lambda: F.scaled_dot_product_attention(*leaves, is_causal=s.causal).backward(do), leaves)
        except Exception as e:  # noqa: BLE001
            row.failed[name] = repr(e)[:300]
    row.seconds = time.time() - t0
    return row


@triton.jit
def _empty_kernel(X, n, BLOCK: tl.constexpr):
    pass


def host_us(fn, n=300) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def host_overhead(base: FlashOptions) -> Dict[str, float]:
    """Host microseconds per call at the 2.7B shape (kernels short enough that the host sets the
    pace): the bare launch of an empty Triton kernel (the floor of one launch), our forward launcher,
    each backward launcher and the eager forward+backward."""
    s = Shape(4, 32, 512, 80, True)
    q, k, v, do = inputs(s)
    o, lse = ft.flash_attention_triton_forward(q, k, v, True, options=base)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    res = {"empty triton launch": host_us(lambda: _empty_kernel[(1,)](q, 1, BLOCK=16)),
           "forward launcher": host_us(lambda: ft.flash_attention_triton_forward(q, k, v, True, options=base))}
    for name, variant, _ in VARIANTS[:2]:
        res[f"backward launcher {name}"] = host_us(
            lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant=variant, options=base))
        options = replace(base, variant=variant)
        res[f"apply fwd+bwd {name}"] = host_us(
            lambda: ft.FlashAttentionTriton.apply(*leaves, True, options).backward(do))
    return res


def best(row: Row, prefix: str, names) -> Optional[float]:
    vals = [row.ms.get(f"{prefix} {n}") for n in names]
    vals = [x for x in vals if x is not None]
    return min(vals) if vals else None


def suggest_min_work(rows: List[Row]) -> float:
    """The smallest work (backward_choice.ShapeKey.work) from which the atomic backward (best of its
    two dQ paths) beat the two-pass one in every measured row of at least that work: the value for
    FlashOptions.atomic_min_work (inf: never)."""
    pts = []
    for r in rows:
        two, atom = r.ms.get("ours fwd+bwd two_pass"), best(r, "ours fwd+bwd", ("atomic", "atomic_elem"))
        if two is not None and atom is not None:
            key = backward_choice.ShapeKey(r.shape.batch * r.shape.heads, r.shape.seq, r.shape.seq, r.shape.d,
                                           torch.bfloat16, r.shape.causal)
            pts.append((key.work, atom < two))
    threshold = math.inf
    for work, _ in sorted(pts, reverse=True):
        if all(wins for w, wins in pts if w >= work):
            threshold = work
    return threshold


def table(rows: List[Row]) -> str:
    head = (f"{'shape':<28}{'fwd':>8}{'cuDNN':>8}{'2pass':>8}{'atomic':>8}{'at.elem':>8}{'cuDNN':>8}{'flash':>8}"
            f"{'ours/best':>10}{'TF/s':>7}  max err")
    lines = [head, f"{'':<28}{'(ms)':>8}{'fwd':>8}{'f+b':>8}{'f+b':>8}{'f+b':>8}{'f+b':>8}{'f+b':>8}"]
    for r in rows:
        def f(key):
            x = r.ms.get(key)
            return f"{x:8.3f}" if x is not None else f"{'-':>8}"
        ours = best(r, "ours fwd+bwd", ("two_pass", "atomic", "atomic_elem"))
        anchor = min([x for x in (r.ms.get("cudnn fwd+bwd"), r.ms.get("sdpa flash fwd+bwd")) if x is not None],
                     default=None)
        ratio = f"{ours / anchor:10.2f}" if ours and anchor else f"{'-':>10}"
        s = r.shape
        tf = attention_flops(s.batch * s.heads, s.seq, s.seq, s.d, s.causal, "fwd_bwd") / (ours * 1e9) if ours else 0
        err = max((e for errs in r.errors.values() for e in errs.values()), default=float("nan"))
        lines.append(f"{s.name:<28}{f('ours fwd')}{f('cudnn fwd')}{f('ours fwd+bwd two_pass')}"
                     f"{f('ours fwd+bwd atomic')}{f('ours fwd+bwd atomic_elem')}{f('cudnn fwd+bwd')}"
                     f"{f('sdpa flash fwd+bwd')}{ratio}{tf:7.0f}  {err:.1e}{'  FAILED ' + ','.join(r.failed) if r.failed else ''}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 shapes, one config per kernel (~1-2 min)")
    ap.add_argument("--budget-s", type=float, default=300.0, help="start no new shape after this many seconds")
    args = ap.parse_args()
    start = time.time()
    path = os.path.join(os.environ.get("OUT", "."), "flash_bwd_variants.json")
    # Every call's options carry the cut lists (the old module setter use_configs reached only the
    # calls without options: after the port to FlashOptions the rows autotuned the committed lists).
    base = with_configs(FlashOptions(), **(CONFIGS_QUICK if args.quick else CONFIGS_FULL))
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "quick": args.quick, "configs": CONFIGS_QUICK if args.quick else CONFIGS_FULL, "rows": [],
           "left_out": []}
    rows: List[Row] = []
    todo = shapes(args.quick)
    for i, s in enumerate(todo):
        if time.time() - start > args.budget_s:
            res["left_out"] = [x.name for x in todo[i:]]
            break
        row = measure(s, base)
        rows.append(row)
        res["rows"].append(asdict(row))
        print(json.dumps({"shape": s.name, "ms": {k: round(v, 4) for k, v in row.ms.items()},
                          "errors": row.errors, "failed": row.failed, "s": round(row.seconds, 1)}), flush=True)
        json.dump(res, open(path, "w"), indent=1)
    res["host_us"] = host_overhead(base)
    res["suggested_atomic_min_work"] = suggest_min_work(rows)
    res["seconds"] = time.time() - start
    json.dump(res, open(path, "w"), indent=1)
    print(table(rows))
    print("host us per call:", {k: round(v, 1) for k, v in res["host_us"].items()})
    print("suggested FlashOptions.atomic_min_work:", res["suggested_atomic_min_work"],
          "| left out:", res["left_out"] or "none", f"| {res['seconds']:.0f} s")


if __name__ == "__main__":
    main()
