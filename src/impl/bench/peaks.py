"""The device's ceilings, measured rather than taken from a datasheet: the bf16 matmul rate that
MFU divides by, and device-to-device copy bandwidth."""
from __future__ import annotations

import statistics

import torch

from impl.bench.legacy_harness import time_once


def peak_shapes(device: torch.device) -> dict:
    """A product large enough to fill an H100 (8192³ bf16), and a modest fp32 one on the CPU,
    where bf16 matmul has no fast path and MFU is only a smoke-test figure."""
    if device.type == "cuda":
        return dict(n=8192, dtype=torch.bfloat16, copy_bytes=2 << 30)
    return dict(n=512, dtype=torch.float32, copy_bytes=64 << 20)


def matmul_operands(device: torch.device):
    s = peak_shapes(device)
    g = torch.Generator(device=device).manual_seed(0)
    # Random data, never zeros: zeros run measurably faster on Hopper tensor cores.
    a = torch.randn(s["n"], s["n"], device=device, dtype=s["dtype"], generator=g)
    b = torch.randn(s["n"], s["n"], device=device, dtype=s["dtype"], generator=g)
    return a, b, 2.0 * s["n"] ** 3


def measure_matmul_peak(device: torch.device, warmup: int = 3, repeats: int = 10) -> dict:
    a, b, flops = matmul_operands(device)
    for _ in range(warmup):
        a @ b
    seconds = statistics.median(time_once(lambda: a @ b, device) for _ in range(repeats))
    return dict(peak_flops=flops / seconds, peak_dtype=str(a.dtype).replace("torch.", ""), peak_n=a.shape[0])
