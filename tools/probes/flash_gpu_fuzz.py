"""Find the inputs on which a FlashAttention kernel faults on the GPU (an illegal memory access kills
the process's CUDA context, so the hypothesis test that hit one cannot say which case it was).

Draws cases like correctness/test_attention.py's attention_case (causal, n_q/n_k up to --max-seq, the
test's head dims, 3-D/4-D) × dtype × backward variant, with autotuning off as in the tests, and runs
each forward+backward with CUDA_LAUNCH_BLOCKING=1 in a child process; a child that faults reports its
case and the launch that faulted, and the parent restarts a child after it. Writes $OUT/flash_gpu_fuzz.json.

    python tools/probes/flash_gpu_fuzz.py [--cases 400] [--seconds 200]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

HEAD_DIMS = [16, 24, 32, 48, 64, 80, 96, 128]
DTYPES = ["float32", "float16", "bfloat16"]
VARIANTS = ["two_pass", "atomic"]


def cases(n: int, max_seq: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        four_d = rng.random() < 0.5
        out.append(dict(causal=rng.random() < 0.5, n_q=rng.randint(1, max_seq), n_k=rng.randint(1, max_seq),
                        d=rng.choice(HEAD_DIMS), lead=[1, rng.randint(1, 2)] if four_d else [rng.randint(1, 2)],
                        dtype=rng.choice(DTYPES), variant=rng.choice(VARIANTS), seed=rng.randint(0, 2**16)))
    return out


def child(todo: list[dict], start: int, deadline: float) -> None:
    import torch

    from impl.attention import FlashAttentionTriton, FlashOptions

    by_variant = {variant: FlashOptions(autotune=False, variant=variant) for variant in VARIANTS}
    for i in range(start, len(todo)):
        if time.time() > deadline:
            return
        c = todo[i]
        print(f"START {i}", flush=True)
        g = torch.Generator().manual_seed(c["seed"])
        dt = getattr(torch, c["dtype"])
        q = torch.randn(*c["lead"], c["n_q"], c["d"], generator=g).to("cuda", dt).requires_grad_()
        k = torch.randn(*c["lead"], c["n_k"], c["d"], generator=g).to("cuda", dt).requires_grad_()
        v = torch.randn(*c["lead"], c["n_k"], c["d"], generator=g).to("cuda", dt).requires_grad_()
        o = FlashAttentionTriton.apply(q, k, v, c["causal"], by_variant[c["variant"]])
        o.backward(torch.randn_like(o))
        torch.cuda.synchronize()
        finite = all(bool(torch.isfinite(t).all()) for t in (o, q.grad, k.grad, v.grad))
        print(f"DONE {i} {int(finite)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=400)
    ap.add_argument("--max-seq", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=200)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    todo = cases(args.cases, args.max_seq)
    if args.child is not None:
        child(todo, args.child, args.deadline)
        return 0
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1")
    faults, not_finite, done, start, t0 = [], [], 0, 0, time.time()
    while start < len(todo) and time.time() - t0 < args.seconds:
        proc = subprocess.run([sys.executable, __file__, "--cases", str(args.cases), "--max-seq", str(args.max_seq),
                               "--child", str(start), "--deadline", str(t0 + args.seconds)], env=env,
                              capture_output=True, text=True)
        last = None
        for line in proc.stdout.splitlines():
            word, i, *rest = line.split()
            if word == "START":
                last = int(i)
            elif word == "DONE":
                done += 1
                if rest == ["0"]:
                    not_finite.append(todo[int(i)])
        if proc.returncode == 0:
            break  # every case, or the deadline
        if last is None:
            print(proc.stderr[-3000:])
            return 1
        err = [ln for ln in proc.stderr.splitlines() if "Error" in ln or "line" in ln][-6:]
        faults.append(dict(case=todo[last], index=last, error=err))
        print("FAULT", last, todo[last], err[-1:] if err else "", flush=True)
        start = last + 1
    report = dict(cases=args.cases, run=done + len(faults), faults=faults, not_finite=not_finite)
    out = Path(os.environ.get("OUT", "out")) / "flash_gpu_fuzz.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"{report['run']} cases run, {len(faults)} faults, {len(not_finite)} non-finite -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
