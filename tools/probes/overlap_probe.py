"""GPU probe (issue 25): how much of the master AdamW update can hide under the backward's matmuls
when it runs on a side stream, block by block, as each block's gradients become final?

Stand-ins for the 2.7B step at context 512, batch 4 (2048 tokens): per block, the backward's
weight and input gradients of its seven Linear layers (14 bf16 GEMMs, 0.86 TFLOP), and the
AdamWMaster kernel over the block's 104.9 M Linear parameters (26 B each, 2.7 GB). Timed with CUDA events,
median of `reps`, each variant over all 32 blocks:
  gemm        the GEMMs alone
  adamw       the 32 per-block updates alone
  serial      both on one stream, block after block (what the step does now, the optimizer last)
  overlap     GEMMs on the main stream; after block i an event, and block i's update on a side stream
  overlap_pri the same with the main stream at high priority and the side stream at low
  persistentK_wW_tT / overlap_...   a stand-in update with a fixed grid of K programs of W warps
              and T elements per iteration (so it holds at most K SMs), alone and under the GEMMs
              (high/low priority streams)
The floor of an overlapped step is max(gemm, adamw); `hidden` = (serial − overlap) / adamw is the
share of the update that disappears.
    PYTHONPATH=src python tools/probes/overlap_probe.py OUT.json
"""
import json
import statistics
import sys

import torch
import triton
import triton.language as tl

from impl.model.adamw_master import master_update, split_master

TOKENS, D, DFF, BLOCKS = 4 * 512, 2560, 10240, 32
# the persistent update's (programs, warps, elements per program and iteration): the H100 has 132
# SMs; one 4-warp program per SM reached ~27 GB/s per SM (first run), so more warps and wider tiles
# put more bytes in flight per SM
PERSISTENT = [(k, 4, 1024) for k in (8, 33, 66, 132)] + [(k, w, b) for k in (16, 33, 66) for w, b in ((16, 4096), (32, 8192))]
SHAPES = [(D, D)] * 4 + [(DFF, D)] * 2 + [(D, DFF)]  # q, k, v, o, w1, w3, w2 as (out, in)


class Block:
    """One block's weights, its update's state, and the activations of its backward GEMMs."""

    def __init__(self, dev):
        bf = dict(device=dev, dtype=torch.bfloat16)
        self.w = [torch.randn(s, **bf) * 0.02 for s in SHAPES]
        self.x = [torch.randn(TOKENS, s[1], **bf) for s in SHAPES]
        self.dy = [torch.randn(TOKENS, s[0], **bf) for s in SHAPES]
        self.dw = [torch.empty_like(w) for w in self.w]
        self.dx = [torch.empty_like(x) for x in self.x]
        masters = [w.float() for w in self.w]
        self.opt = []
        for w, m in zip(self.w, masters):
            hi, lo = split_master(m)
            w.copy_(hi)
            self.opt.append((w, torch.randn_like(w) * 1e-3, lo, torch.zeros_like(m), torch.zeros_like(m)))
        self.tables: dict = {}

    def backward(self):
        for w, x, dy, dw, dx in zip(self.w, self.x, self.dy, self.dw, self.dx):
            torch.mm(dy, w, out=dx)
            torch.mm(dy.t(), x, out=dw)

    def update(self):
        master_update(self.opt, 1, 1e-4, 0.9, 0.999, 1e-8, 0.01, tables=self.tables)


@triton.jit
def _persistent_update(p_ptr, g_ptr, lo_ptr, m_ptr, v_ptr, n, BLOCK: tl.constexpr):
    """A stand-in for the master update with a grid of fixed size: each program strides over the
    tensor, so the update holds only as many SMs as it has programs (AdamW's arithmetic, the same
    26 bytes per element; the master's split is approximated by a plain rounding)."""
    for start in range(tl.program_id(0) * BLOCK, n, tl.num_programs(0) * BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
        w = tl.load(p_ptr + offs, mask=mask).to(tl.float32) + tl.load(lo_ptr + offs, mask=mask).to(tl.float32) * 1e-7
        m = tl.load(m_ptr + offs, mask=mask) * 0.9 + 0.1 * g
        v = tl.load(v_ptr + offs, mask=mask) * 0.999 + 0.001 * g * g
        w = w * 0.99999 - 1e-4 * m / (tl.sqrt(v) + 1e-8)
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        tl.store(p_ptr + offs, w.to(tl.bfloat16), mask=mask)
        tl.store(lo_ptr + offs, (w * 1e3).to(tl.int16), mask=mask)


def persistent_update(block: "Block", programs: int, warps: int, tile: int) -> None:
    for p, g, lo, m, v in block.opt:
        _persistent_update[(programs,)](p, g, lo, m, v, p.numel(), BLOCK=tile, num_warps=warps)


def timed(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(path: str, reps: int = 7) -> None:
    dev = torch.device("cuda")
    blocks = [Block(dev) for _ in range(BLOCKS)]
    low, high = torch.cuda.Stream.priority_range()  # (lowest priority, highest): larger number = lower
    side, side_low = torch.cuda.Stream(), torch.cuda.Stream(priority=low)
    main_high = torch.cuda.Stream(priority=high)

    def gemm():
        for b in blocks:
            b.backward()

    def adamw():
        for b in blocks:
            b.update()

    def serial():
        for b in blocks:
            b.backward()
        for b in blocks:
            b.update()

    def overlapped(main_stream, side_stream, update=Block.update):
        def run():
            cur = torch.cuda.current_stream()
            main_stream.wait_stream(cur)
            with torch.cuda.stream(main_stream):
                for b in blocks:
                    b.backward()
                    ev = torch.cuda.Event()
                    ev.record(main_stream)
                    side_stream.wait_event(ev)
                    with torch.cuda.stream(side_stream):
                        update(b)
            cur.wait_stream(main_stream)
            cur.wait_stream(side_stream)
        return run

    variants = dict(gemm=gemm, adamw=adamw, serial=serial,
                    overlap=overlapped(torch.cuda.current_stream(), side),
                    overlap_pri=overlapped(main_high, side_low))
    # the update confined to k SMs (k programs, one per SM): alone, and under the GEMMs
    for k, w, t in PERSISTENT:
        def alone(cfg=(k, w, t)):
            for b in blocks:
                persistent_update(b, *cfg)
        variants[f"persistent{k}_w{w}_t{t}"] = alone
        variants[f"overlap_persistent{k}_w{w}_t{t}"] = overlapped(main_high, side_low,
                                                                  lambda b, cfg=(k, w, t): persistent_update(b, *cfg))
    for fn in variants.values():  # warm: autotune, tables, cuBLAS handles
        fn()
    torch.cuda.synchronize()
    ms = {k: timed(fn, reps) for k, fn in variants.items()}
    flops = BLOCKS * sum(2 * 2 * TOKENS * o * i for o, i in SHAPES)
    params = BLOCKS * sum(o * i for o, i in SHAPES)
    res = dict(device=torch.cuda.get_device_name(), blocks=BLOCKS, tokens=TOKENS, gemm_flops=flops,
               params=params, update_bytes=26 * params, ms=ms,
               gemm_tflops=flops / ms["gemm"] / 1e9, adamw_tb_per_s=26 * params / ms["adamw"] / 1e9,
               floor_ms=max(ms["gemm"], ms["adamw"]),
               hidden=dict((k, (ms["serial"] - ms[k]) / ms["adamw"]) for k in ms if k.startswith("overlap")),
               priority_range=[low, high])
    print(json.dumps(res, indent=1))
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
