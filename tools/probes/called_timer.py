"""The short-shape timer of the Gluon probes (flash_gluon_fwd.py / flash_gluon_bwd.py --short, issue 47 stage 4's
kernel-table min_seq): a call's time as a training loop sees it.

triton.testing.do_bench (the probes' timer at their long shapes) zeroes a 256 MB buffer before each call and times
each call alone between two events recorded after that flush: the host's launch path runs while the flush still
occupies the device, so up to the flush's own time (~0.1 ms on an H100) of host cost never shows, and every call
starts with a cold L2. At 4x32x512 that hides most of what made the table's Gluon kernels lose to Triton as called
(flash_shapes, NOTES.md). called_ms times rounds of back-to-back calls instead, as impl.bench's kernel rows do
(CudaEventTimer rounds of at least 25 ms): the host cost of a call is in its time exactly where the host is slower
than the device, which is intended: the table must pick what is faster as called.
"""
from __future__ import annotations

import statistics

import torch

ROUND_S = 25e-3  # impl.bench.timers.MIN_KERNEL_ROUND_S: the round length the kernel rows use
ROUNDS = 10
MAX_CALLS = 2000  # per round: a bound on the queue depth (and on a mis-estimated round)


def called_ms(fn, round_s: float = ROUND_S, rounds: int = ROUNDS) -> float:
    """Median over `rounds` of the ms per call of a round of back-to-back calls of fn, CUDA events around each
    round (the round's first call starts on a drained device: its host latency is amortised over the round)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        fn()
    end.record()
    end.synchronize()
    calls = max(1, min(MAX_CALLS, int(round_s * 1e3 / max(start.elapsed_time(end) / 3, 1e-3))))
    per_call = []
    for _ in range(rounds):
        torch.cuda.synchronize()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / calls)
    return float(statistics.median(per_call))
