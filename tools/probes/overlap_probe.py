"""GPU probe (issue 25): how much of the master AdamW update can hide under the backward's matmuls
when it runs on a side stream, block by block, as each block's gradients become final?

Stand-ins for the 2.7B step at context 512, batch 4 (2048 tokens): per block, the backward's
weight and input gradients of its seven Linear layers (14 bf16 GEMMs, ~0.6 TFLOP), and the
AdamWMaster kernel over the block's 78.6 M parameters (26 B each, ~2 GB). Timed with CUDA events,
median of `reps`, each variant over all 32 blocks:
  gemm        the GEMMs alone
  adamw       the 32 per-block updates alone
  serial      both on one stream, block after block (what the step does now, the optimizer last)
  overlap     GEMMs on the main stream; after block i an event, and block i's update on a side stream
  overlap_pri the same with the main stream at high priority and the side stream at low
The floor of an overlapped step is max(gemm, adamw); `hidden` = (serial − overlap) / adamw is the
share of the update that disappears.
    PYTHONPATH=src python tools/probes/overlap_probe.py OUT.json
"""
import json
import statistics
import sys

import torch

from impl.model.adamw_master import master_update, split_master

TOKENS, D, DFF, BLOCKS = 4 * 512, 2560, 10240, 32
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

    def overlapped(main_stream, side_stream):
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
                        b.update()
            cur.wait_stream(main_stream)
            cur.wait_stream(side_stream)
        return run

    variants = dict(gemm=gemm, adamw=adamw, serial=serial,
                    overlap=overlapped(torch.cuda.current_stream(), side),
                    overlap_pri=overlapped(main_high, side_low))
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
               hidden=dict((k, (ms["serial"] - ms[k]) / ms["adamw"]) for k in ("overlap", "overlap_pri")),
               priority_range=[low, high])
    print(json.dumps(res, indent=1))
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:2])
