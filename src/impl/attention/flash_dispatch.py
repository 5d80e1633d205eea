"""FlashAttentionTriton's forward and backward under FlashOptions.kernels (issue 47, stage 4).

"triton" runs the Triton launchers of flash_launch, exactly as before. "auto" runs the Gluon kernel the
kernel table (impl.attention.kernel_table) names for the call where the tensors are CUDA on that kernel's
architecture, its launcher accepts their dtype, head dim and layout, and Gluon imports; otherwise the
Triton launchers. Both return what the Triton launchers return, with the LaunchRecord naming the kernel
(``LaunchRecord.kernel``). The Gluon modules are imported only when a call picks one (they need
triton.experimental.gluon and are off the default import paths). The custom ops that carry both through
torch.compile live here too, so compiled calls dispatch as eager ones do (and flash_launch, which this module
builds on, imports nothing above it).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional, Tuple

import torch

from impl.runtime import launch_ctx

from .flash_launch import _backward, _forward, _head_dim_label, _options_of, _record
from .flash_options import FlashOptions, LaunchRecord
from .kernel_table import KernelChoice, choose, shipped_table

Tensor = torch.Tensor


@functools.cache
def gluon_imports() -> bool:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False
    return True


def _capability(t: Tensor) -> Optional[Tuple[int, int]]:
    return tuple(torch.cuda.get_device_capability(t.device)) if t.is_cuda else None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _gluon_choice(direction: str, q: Tensor, causal: bool, options: FlashOptions,
                  accepts: Callable[[], None]) -> Optional[KernelChoice]:
    """The table's entry for this call, or None (Triton). `accepts` raises ValueError where the Gluon
    launcher refuses the inputs (its own checks: dtype, head dim, TMA layout), which means Triton. Off CUDA
    (no capability) nothing is chosen."""
    choice = choose(shipped_table(), direction, options.kernels, _capability(q), q.shape[-1], causal,
                    _dtype_name(q.dtype))
    if choice is None or not gluon_imports():
        return None
    try:
        accepts()
    except ValueError:
        return None
    return choice


def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions):
    """(o, lse, LaunchRecord), as flash_launch._forward."""
    if options.kernels == "triton":
        return _forward(q, k, v, causal, options)

    def accepts() -> None:
        from .flash_gluon_common import validate
        validate(q, k, v, "flash_gluon_ws_forward")

    choice = _gluon_choice("fwd", q, causal, options, accepts)
    if choice is None:
        return _forward(q, k, v, causal, options)
    from .flash_gluon_ws import GluonWsConfig, flash_gluon_ws_forward
    config = GluonWsConfig(**dict(choice.config))
    with launch_ctx(q, "impl_flash::flash_gluon_ws_forward"):
        o, lse = flash_gluon_ws_forward(q, k, v, causal, config)
    record = LaunchRecord("fwd", (("fwd", repr(config)),), _head_dim_label(q.shape[-1]), True, kernel=choice.kernel)
    return o, lse, _record(options, record)


def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
             options: FlashOptions, variant: Optional[str] = None):
    """(dq, dk, dv, LaunchRecord), as flash_launch._backward; `variant` concerns the Triton backward only."""
    if options.kernels == "triton":
        return _backward(q, k, v, o, do, lse, causal, options, variant)

    def accepts() -> None:
        from .flash_gluon_bwd import validate_backward
        validate_backward(q, k, v, o, do, lse)

    choice = _gluon_choice("bwd", q, causal, options, accepts)
    if choice is None:
        return _backward(q, k, v, o, do, lse, causal, options, variant)
    if choice.kernel == "gluon_ws":  # the table names it at d 128 and 64 only (kernel_table.KERNEL_HEAD_DIMS)
        from .flash_gluon_bwd_ws import GluonBwdWsConfig, flash_gluon_backward_ws
        config = GluonBwdWsConfig(**dict(choice.config))
        with launch_ctx(q, "impl_flash::flash_gluon_backward_ws"):
            dq, dk, dv = flash_gluon_backward_ws(q, k, v, o, do, lse, causal, config)
    else:
        from .flash_gluon_bwd import GluonBwdConfig, flash_gluon_backward
        config = GluonBwdConfig(**dict(choice.config))
        with launch_ctx(q, "impl_flash::flash_gluon_backward"):
            dq, dk, dv = flash_gluon_backward(q, k, v, o, do, lse, causal, config, options)
    record = LaunchRecord("bwd", (("bwd", repr(config)),), _head_dim_label(q.shape[-1]), True, kernel=choice.kernel)
    return dq, dk, dv, _record(options, record)


# ---------------------------------------------------------------------------
# Custom ops (the torch.compile boundary)
# ---------------------------------------------------------------------------

# The ops (any device: CUDA tensors, or CPU tensors under the interpreter) take the options as their
# registered int (_options_key). The fakes give what the launchers return: new contiguous tensors of
# the input shapes (inputs may be strided), lse fp32.
# They run the dispatch above (options.kernels), as the eager calls do.
def _forward_op_impl(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                     options_key: int = 0) -> Tuple[Tensor, Tensor]:
    o, lse, _ = forward(q, k, v, bool(is_causal), _options_of(options_key))
    return o, lse


def _backward_op_impl(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                      is_causal: bool = False, variant: Optional[str] = None,
                      options_key: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv, _ = backward(q, k, v, o, do, lse, bool(is_causal), _options_of(options_key), variant)
    return dq, dk, dv


# Defined with torch.library.Library rather than torch.library.custom_op: a custom_op call runs its
# Python autograd wrapper, a redispatch and an aliasing check of the outputs on every call (about
# 100 us each of the two ops per compiled fwd+bwd on this CPU, NOTES.md); these ops are only ever
# called inside a compiled graph (grad mode off there: no autograd kernel is needed), where the
# dispatcher goes straight to the implementation.
_LIB = torch.library.Library("impl_flash", "DEF")
_LIB.define("triton_forward(Tensor q, Tensor k, Tensor v, bool is_causal=False, int options_key=0) -> (Tensor, Tensor)")
_LIB.define("triton_backward(Tensor q, Tensor k, Tensor v, Tensor o, Tensor do, Tensor lse, bool is_causal=False, "
            "str? variant=None, int options_key=0) -> (Tensor, Tensor, Tensor)")
for _key in ("CUDA", "CPU"):  # CPU: the interpreter
    _LIB.impl("triton_forward", _forward_op_impl, _key)
    _LIB.impl("triton_backward", _backward_op_impl, _key)

flash_forward_op = torch.ops.impl_flash.triton_forward.default
flash_backward_op = torch.ops.impl_flash.triton_backward.default


@torch.library.register_fake("impl_flash::triton_forward")
def _flash_forward_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                        options_key: int = 0) -> Tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.register_fake("impl_flash::triton_backward")
def _flash_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                         is_causal: bool = False, variant: Optional[str] = None,
                         options_key: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


__all__ = ["backward", "flash_backward_op", "flash_forward_op", "forward", "gluon_imports"]
