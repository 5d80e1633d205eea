"""Attention implementations: naive, FlashAttention-2 in PyTorch and in Triton.

Causal masking everywhere is top-left aligned (query ``i`` attends to keys
``j <= i``), matching ``torch.nn.functional.scaled_dot_product_attention``.
"""

from __future__ import annotations

import functools

from typing import Callable, Optional

import torch
import torch.nn.functional as F

from impl.runtime import launch_ctx

from .backward_choice import choose_backward
from .flash_backward import compiled_flash_backward, flash_backward
from .flash_options import FlashOptions, LaunchRecord, LaunchRecorder, default_options
from .flash_torch import FlashAttentionTorch, validate_inputs
from .naive import naive_attention

try:
    from . import flash_triton
    from .flash_triton import FlashAttentionTriton
except ImportError as _triton_import_error:  # triton is only a dependency on Linux
    flash_triton = None
    _TRITON_ERROR = repr(_triton_import_error)

    class FlashAttentionTriton:  # type: ignore[no-redef]
        """Placeholder used when triton cannot be imported."""

        @staticmethod
        def apply(*args, **kwargs):
            raise ImportError(f"FlashAttentionTriton needs triton, which failed to import: {_TRITON_ERROR}")

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]

ATTENTION_NAMES = ("naive", "flash_torch", "flash_triton", "flash_gluon_ws", "flash_gluon", "flash_gluon_atomic",
                   "flash_auto", "sdpa")


def _naive(q, k, v, is_causal=False):
    return naive_attention(q, k, v, is_causal)


def _flash_torch(q, k, v, is_causal=False):
    return FlashAttentionTorch.apply(q, k, v, is_causal)


def _flash_triton(q, k, v, is_causal=False):
    return FlashAttentionTriton.apply(q, k, v, is_causal)


def _sdpa(q, k, v, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


class PrecomputedAttention(torch.autograd.Function):
    """Attention whose forward already ran: returns the given o and saves what a FlashAttention
    backward reads (the same five tensors as the flash Functions save, so a checkpoint's recompute
    saves tensors of the same metadata as its forward did); `backward(q, k, v, o, do, lse, is_causal)`
    gives the gradients. Pairs a forward and a backward of different kernels (the Gluon pairs) and
    serves impl.checkpointing's keep_attention."""

    @staticmethod
    def forward(ctx, q, k, v, o, lse, backward, is_causal):
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.backward, ctx.is_causal = backward, is_causal
        return o.view_as(o)

    @staticmethod
    def backward(ctx, do):
        lse, q, k, v, o = ctx.saved_tensors
        dq, dk, dv = ctx.backward(q, k, v, o, do, lse, ctx.is_causal)
        return dq, dk, dv, None, None, None, None


def _halves_attention(name: str) -> AttentionFn:
    """Attention from a pair of halves: the forward without autograd, then PrecomputedAttention."""
    def attention(q, k, v, is_causal=False):
        forward, backward = attention_halves(name)
        with torch.no_grad():
            o, lse = forward(q, k, v, bool(is_causal))
        return PrecomputedAttention.apply(q, k, v, o, lse, backward, bool(is_causal))
    return attention


_BY_NAME = {"naive": _naive, "flash_torch": _flash_torch, "flash_triton": _flash_triton,
            "flash_gluon_ws": _halves_attention("flash_gluon_ws"), "flash_gluon": _halves_attention("flash_gluon"),
            "flash_gluon_atomic": _halves_attention("flash_gluon_atomic"),
            "flash_auto": _halves_attention("flash_auto"), "sdpa": _sdpa}


# FlashAttention split in its two halves: forward(q, k, v, is_causal) -> (o, lse) and
# backward(q, k, v, o, do, lse, is_causal) -> (dq, dk, dv), for callers that keep o and lse themselves
# (impl.checkpointing's keep_attention policy).
AttentionHalves = tuple[Callable[..., tuple], Callable[..., tuple]]


def _launched_as(op: str, half: Callable[..., tuple]) -> Callable[..., tuple]:
    """`half` inside impl.runtime.launch_ctx: the Gluon launchers call their kernels from Python outside
    any torch op, so under a profiler the kernels had no launching op, fell out of the phase tables and
    their time read as host gap (the 8B step's forward attention, ~0.48 s a step, until 2026-11-26)."""
    def launched(q: torch.Tensor, *args, **kwargs):
        with launch_ctx(q, op):
            return half(q, *args, **kwargs)
    launched.op, launched.half = op, half
    return launched


def attention_halves(name: str) -> AttentionHalves:
    """(forward, backward) of a FlashAttention implementation: "flash_torch", "flash_triton",
    "flash_gluon_ws" (issue 47 stage 2's warp-specialized Hopper forward with the Triton backward:
    its lse is the Triton forward's, natural log, shape q.shape[:-1], fp32), "flash_gluon" (that
    forward with stage 3's Gluon backward at its default config; sm_90, bf16/fp16, d 64/80/96/128) or
    "flash_gluon_atomic" (the same with the one-pass backward adding dQ by atomics, stage 3e, at every d:
    a name of its own so the 8B step can run it beside the default before the default changes) or "flash_auto"
    (each half the kernel the kernel table names for the call, as FlashOptions(kernels="auto") gives
    FlashAttentionTriton: the Gluon kernels where the table has an entry and the launcher accepts the inputs, our
    Triton kernels elsewhere, the CPU interpreter included; so the 8B step runs what the table picked)."""
    if name == "flash_torch":
        from .flash_torch import flash_forward_torch
        return flash_forward_torch, flash_backward
    if name == "flash_triton":
        if flash_triton is None:
            raise ImportError(f"flash_triton needs triton, which failed to import: {_TRITON_ERROR}")
        return flash_triton.flash_attention_triton_forward, flash_triton.flash_attention_triton_backward
    if name in ("flash_gluon_ws", "flash_gluon", "flash_gluon_atomic"):
        if flash_triton is None:
            raise ImportError(f"{name} needs triton, which failed to import: {_TRITON_ERROR}")
        from .flash_gluon_ws import flash_gluon_ws_forward  # late: Gluon, Hopper only
        if name == "flash_gluon_ws":
            return _launched_as(f"impl_flash::{name}_forward", flash_gluon_ws_forward), \
                flash_triton.flash_attention_triton_backward
        from .flash_gluon_bwd import GluonBwdConfig, flash_gluon_backward
        backward = flash_gluon_backward if name == "flash_gluon" else \
            functools.partial(flash_gluon_backward, config=GluonBwdConfig(dq="atomic"))
        return (_launched_as(f"impl_flash::{name}_forward", flash_gluon_ws_forward),
                _launched_as(f"impl_flash::{name}_backward", backward))
    if name == "flash_auto":
        return _table_halves()
    raise ValueError(f"attention {name!r} has no separate forward and backward halves (o, lse); expected "
                     "'flash_torch', 'flash_triton', 'flash_gluon_ws', 'flash_gluon', 'flash_gluon_atomic' or "
                     "'flash_auto'")


def _table_halves() -> AttentionHalves:
    """flash_auto's halves: flash_dispatch under FlashOptions(kernels="auto"), its launch records dropped. The
    dispatch opens the Gluon kernels' ops itself, and the Triton launchers run inside theirs."""
    if flash_triton is None:
        raise ImportError(f"flash_auto needs triton, which failed to import: {_TRITON_ERROR}")
    from . import flash_dispatch
    options = FlashOptions(kernels="auto")

    def forward(q, k, v, is_causal=False):
        o, lse, _ = flash_dispatch.forward(q, k, v, bool(is_causal), options)
        return o, lse

    def backward(q, k, v, o, do, lse, is_causal=False):
        dq, dk, dv, _ = flash_dispatch.backward(q, k, v, o, do, lse, bool(is_causal), options)
        return dq, dk, dv
    return forward, backward


def attention_by_name(name: str, options: Optional[FlashOptions] = None) -> AttentionFn:
    """Return ``f(q, k, v, is_causal) -> o`` for one of ATTENTION_NAMES. `options`: the FlashOptions
    every call of "flash_triton" passes (None: default_options()); the other names take none."""
    try:
        fn = _BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown attention implementation {name!r}; expected one of {ATTENTION_NAMES}") from None
    if options is None:
        return fn
    if name != "flash_triton":
        raise ValueError(f"attention {name!r} takes no FlashOptions (only 'flash_triton' does)")

    def flash_triton_with_options(q, k, v, is_causal=False):
        return FlashAttentionTriton.apply(q, k, v, is_causal, options)
    return flash_triton_with_options


def attention_flops(batch_heads: int, seq_q: int, seq_k: int, d: int, is_causal: bool = False,
                    mode: str = "fwd") -> float:
    """Matmul FLOPs of attention.

    Forward = 4 * B * Sq * Sk * d (QK^T and PV, 2 FLOPs per MAC), halved when
    causal; backward = 2.5x forward; "fwd_bwd" = 3.5x forward.
    """
    fwd = 4.0 * batch_heads * seq_q * seq_k * d
    if is_causal:
        fwd /= 2.0
    mode_l = mode.lower()
    if mode_l in ("fwd", "forward"):
        return fwd
    if mode_l in ("bwd", "backward"):
        return 2.5 * fwd
    if mode_l in ("fwd_bwd", "fwd+bwd", "forward_backward", "both"):
        return 3.5 * fwd
    raise ValueError(f"unknown mode {mode!r}; expected 'fwd', 'bwd' or 'fwd_bwd'")


__all__ = [
    "ATTENTION_NAMES",
    "FlashAttentionTorch",
    "FlashAttentionTriton",
    "FlashOptions",
    "LaunchRecord",
    "LaunchRecorder",
    "PrecomputedAttention",
    "AttentionHalves",
    "attention_by_name",
    "attention_halves",
    "attention_flops",
    "choose_backward",
    "compiled_flash_backward",
    "default_options",
    "flash_backward",
    "naive_attention",
    "validate_inputs",
]
