"""MFU's denominators: the device's datasheet dense bf16 peak, and the bf16 matmul rate measured
on the device in the same pytest run (it moves by ~8% between H100 machines, so both are kept)."""
from __future__ import annotations

import statistics

import torch

from impl.bench.timers import time_once
from impl.bench.row import Peaks
from impl.runtime import device_name

# Dense bf16 tensor-core peaks from the vendors' datasheets (no sparsity), by a name fragment;
# the first match wins, so the PCIe H100 comes before the SXM one.
DATASHEET_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.5e12),
    ("H100", 989.4e12),
    ("H200", 989.4e12),
    ("B200", 2250e12),
    ("A100", 312e12),
)


def datasheet_bf16_flops(name: str) -> float | None:
    for fragment, flops in DATASHEET_BF16_FLOPS:
        if fragment.lower() in name.lower():
            return flops
    return None


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


def measure_peaks(device: torch.device, warmup: int = 3, repeats: int = 10) -> Peaks:
    a, b, flops = matmul_operands(device)
    for _ in range(warmup):
        a @ b
    seconds = statistics.median(time_once(lambda: a @ b, device) for _ in range(repeats))
    datasheet = datasheet_bf16_flops(device_name(device)) if device.type == "cuda" else None
    return Peaks(measured_flops=flops / seconds, measured_dtype=str(a.dtype).replace("torch.", ""),
                 measured_n=a.shape[0], datasheet_flops=datasheet)
