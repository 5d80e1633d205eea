"""mixed_precision_accumulation and benchmarking_mixed_precision (a)/(b): the four accumulation
loops, the toy model's dtypes under autocast, and the fp16/bf16 format facts from torch.finfo."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

EXACT_SUM = 10.0  # 1000 × 0.01 in exact arithmetic
STEPS = 1000


def accumulation_loops(steps: int = STEPS) -> dict:
    """The assignment's four loops, each adding 0.01 `steps` times; values as Python floats."""
    out = {}
    s = torch.tensor(0, dtype=torch.float32)
    for _ in range(steps):
        s += torch.tensor(0.01, dtype=torch.float32)
    out["fp32 += fp32"] = s.item()

    s = torch.tensor(0, dtype=torch.float16)
    for _ in range(steps):
        s += torch.tensor(0.01, dtype=torch.float16)
    out["fp16 += fp16"] = s.item()

    s = torch.tensor(0, dtype=torch.float32)
    for _ in range(steps):
        s += torch.tensor(0.01, dtype=torch.float16)  # in-place add promotes the fp16 addend
    out["fp32 += fp16"] = s.item()

    s = torch.tensor(0, dtype=torch.float32)
    for _ in range(steps):
        x = torch.tensor(0.01, dtype=torch.float16)
        s += x.type(torch.float32)
    out["fp32 += fp16 cast to fp32"] = s.item()
    return out


def accumulation_errors(values: dict) -> dict:
    return {k: abs(v - EXACT_SUM) for k, v in values.items()}


def format_facts() -> dict:
    """Range and precision of the half types next to fp32, from torch.finfo (for (b))."""
    facts = {}
    for name, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        fi = torch.finfo(dt)
        facts[name] = dict(max=float(fi.max), tiny=float(fi.tiny), eps=float(fi.eps), bits=fi.bits,
                           mantissa_bits=int(round(-torch.log2(torch.tensor(fi.eps)).item())))
    return facts


class ToyModel(nn.Module):
    """The assignment's toy model: fc1 → ReLU → LayerNorm → fc2."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        return self.fc2(x)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def toy_autocast_dtypes(device: torch.device, dtype: torch.dtype = torch.float16, batch: int = 8,
                        in_features: int = 16, out_features: int = 5, seed: int = 0) -> dict:
    """dtypes of parameters, fc1 output, LayerNorm output, logits, loss and gradients of the toy
    model under autocast(dtype), observed with forward hooks (not predicted)."""
    torch.manual_seed(seed)
    model = ToyModel(in_features, out_features).to(device)
    seen = {}

    def hook(name):
        def fn(_module, _inputs, output):
            seen[name] = _name(output.dtype)
        return fn

    handles = [model.fc1.register_forward_hook(hook("fc1 output")), model.ln.register_forward_hook(hook("layernorm output"))]
    x = torch.randn(batch, in_features, device=device)
    y = torch.randint(0, out_features, (batch,), device=device)
    try:
        with torch.autocast(device_type=device.type, dtype=dtype):
            logits = model(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    return {"parameters": sorted({_name(p.dtype) for p in model.parameters()}),
            "fc1 output": seen["fc1 output"], "layernorm output": seen["layernorm output"],
            "logits": _name(logits.dtype), "loss": _name(loss.dtype),
            "gradients": sorted({_name(p.grad.dtype) for p in model.parameters()}),
            "device_type": device.type, "autocast_dtype": _name(dtype)}
