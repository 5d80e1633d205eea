"""The steps that benchmarking_script times: forward, backward alone, forward+backward, and a
full training step with AdamW, each as (fn, setup) for impl.profiling.harness.run_benchmark."""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from impl.model import AdamW, TransformerLM, cross_entropy
from impl.sweeps import ALL_SIZES

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_ctx(dtype: str, device: torch.device):
    """fp32 runs plainly; bf16/fp16 run under autocast with fp32 master weights."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def build_model(size: str, context: int, device: torch.device, attn_impl: str = "naive", seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(**ALL_SIZES[size], context_length=context, attn_impl=attn_impl, device=device)


def random_batch(model: TransformerLM, batch: int, context: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (batch, context + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def make_step(mode: str, model: TransformerLM, x: torch.Tensor, y: torch.Tensor, dtype: str,
              optimizer: torch.optim.Optimizer | None = None) -> tuple[Callable, Callable | None]:
    """Returns (fn, setup): fn is timed, setup runs untimed before each call."""
    device = x.device

    def loss_fn():
        with autocast_ctx(dtype, device):
            return cross_entropy(model(x), y)

    if mode == "forward":
        def forward():
            with torch.no_grad(), autocast_ctx(dtype, device):
                return model(x)
        return forward, None

    if mode == "backward":
        def setup():
            model.zero_grad(set_to_none=True)
            return (loss_fn(),), {}
        return (lambda loss: loss.backward()), setup

    if mode == "forward_backward":
        def forward_backward():
            model.zero_grad(set_to_none=True)
            loss_fn().backward()
        return forward_backward, None

    if mode == "train_step":
        if optimizer is None:
            optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def train_step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn().backward()
            optimizer.step()
        return train_step, None

    raise ValueError(f"unknown mode {mode!r}; expected forward, backward, forward_backward or train_step")


class ModelCache:
    """Keeps the last-built model so a sweep over contexts, dtypes and modes of one size builds it
    once; building another size frees the previous one first (the GPU holds one at a time)."""

    def __init__(self):
        self.key, self.model = None, None

    def get(self, size: str, context_length: int, device: torch.device, attn_impl: str = "naive") -> TransformerLM:
        key = (size, context_length, str(device), attn_impl)
        if key != self.key:
            self.clear()
            self.model = build_model(size, context_length, device, attn_impl)
            self.key = key
        self.model.zero_grad(set_to_none=True)
        return self.model

    def clear(self) -> None:
        from impl.runtime import free_memory

        self.key, self.model = None, None
        free_memory()


def model_and_batch(benchmark, models: ModelCache, *, problem: str, config: dict, device: torch.device, size: str,
                    context_length: int, batch: int, context: int, extra: dict | None = None):
    """(model, x, y) from the cache, or None after recording the config as an OOM row: building a
    large model can itself run out of memory, and that is a result, not a crash."""
    from impl.profiling.harness import record_oom
    from impl.runtime import is_oom

    try:
        model = models.get(size, context_length, device)
        return (model, *random_batch(model, batch, context, device))
    except Exception as exc:  # noqa: BLE001 - only OOM is turned into a row
        if not is_oom(exc):
            raise
        models.clear()
        record_oom(benchmark, problem=problem, config=config, device=device, message=str(exc), extra=extra)
        return None
