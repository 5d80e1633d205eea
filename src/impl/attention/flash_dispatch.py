"""FlashAttentionTriton's forward and backward under FlashOptions.kernels (issue 47, stage 4).

"triton" runs the Triton launchers of flash_launch, exactly as before. "auto" runs the Gluon kernel the
kernel table (impl.attention.kernel_table) names for the call where the tensors are CUDA on that kernel's
architecture, its launcher accepts their dtype, head dim and layout, and Gluon imports; otherwise the
Triton launchers. Both return what the Triton launchers return, with the LaunchRecord naming the kernel
(``LaunchRecord.kernel``). The Gluon modules are imported only when a call picks one (they need
triton.experimental.gluon and are off the default import paths). The custom ops that carry both through
torch.compile live here too, so compiled calls dispatch as eager ones do (and flash_launch, which this module
builds on, imports nothing above it). Under "auto" a Gluon call's signature that ran once gets a call plan, as
flash_launch's Triton calls do ("Gluon call plans" below).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Optional, Tuple

import torch

from impl.runtime import launch_ctx

from .flash_launch import (_aligned, _backward, _forward, _head_dim_label, _keep_plan, _logged_plan, _options_of, _plan,
                           _record)
from .flash_options import FlashOptions, LaunchRecord
from .kernel_table import Config, KernelChoice, choose, shipped_table

if TYPE_CHECKING:
    from .flash_gluon_common import LaunchLog

Tensor = torch.Tensor


@functools.cache
def gluon_imports() -> bool:
    try:
        import triton.experimental.gluon  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _device_capability(device: torch.device) -> Tuple[int, int]:
    return tuple(torch.cuda.get_device_capability(device))


def _capability(t: Tensor) -> Optional[Tuple[int, int]]:
    return _device_capability(t.device) if t.is_cuda else None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _table_choice(direction: str, q: Tensor, k: Tensor, causal: bool, options: FlashOptions) -> Optional[KernelChoice]:
    """The table's entry for this call where Gluon imports, or None (Triton). Off CUDA (no capability) nothing
    is chosen. The sequence length held against the entry's min_seq is min(N_Q, N_K): the probes measure
    N_Q == N_K only, and a call at least that long in both is at least as large in each kernel's grid (forward:
    query tiles; backward: key tiles) and in its loop over the other length as the measured wins; one shorter
    length (a short grid, or a short loop that the host path and the prologue dominate) is what lost."""
    choice = choose(shipped_table(), direction, options.kernels, _capability(q), q.shape[-1], causal,
                    _dtype_name(q.dtype), min(q.shape[-2], k.shape[-2]))
    return choice if choice is not None and gluon_imports() else None


def _refuses(accepts: Callable[[], None]) -> bool:
    """`accepts` raises ValueError where the Gluon launcher refuses the inputs (its own checks: dtype, head dim,
    TMA layout), which means Triton."""
    try:
        accepts()
    except ValueError:
        return True
    return False


def _gluon_choice(direction: str, q: Tensor, k: Tensor, causal: bool, options: FlashOptions,
                  accepts: Callable[[], None]) -> Optional[KernelChoice]:
    """The table's entry for this call, or None (Triton): none in the table, or the launcher refuses the inputs."""
    choice = _table_choice(direction, q, k, causal, options)
    return None if choice is None or _refuses(accepts) else choice


# ---------------------------------------------------------------------------
# Gluon call plans
# ---------------------------------------------------------------------------
# A Gluon call's host path once cost 3-4x the Triton path's (NOTES.md: layouts, descriptors, the checks, JIT
# argument binding per launch), which at small shapes was most of the call. As flash_launch does for Triton, a
# call *signature* (every input's shape, strides, dtype and device, causal, the options, the table's kernel and
# config) that ran once through the launcher (its checks, JITFunction.run, which compiles and returns each kernel)
# gets a plan from the launcher's LaunchLog: its buffers and each compiled kernel with its arguments. A hit with
# every pointer 16-byte aligned (Triton specializes on it) allocates the buffers, rebases the first call's
# descriptors onto the call's tensors and launches the kernels directly. The launcher's checks are functions of
# the signature and alignment, so a hit skips them and an input they refuse never hits (a miss runs them).
# direct_launch=False: every call through the launcher. The stage-1 backward (kernel "gluon") has no plans: its
# dq="triton" launches through the Triton autotuner.

def _signature(direction: str, kernel: str, config: Config, causal: bool, options: FlashOptions, *tensors: Tensor):
    """A Gluon call's plan key (None: direct_launch off, no plans)."""
    if not options.direct_launch:
        return None
    return (direction, kernel, config, causal, options.key) + tuple(
        (t.shape, t.stride(), t.dtype, t.device) for t in tensors)


def _store_plan(sig, inputs: tuple, log: Optional[LaunchLog], record: LaunchRecord) -> None:
    """Keep the plan of a Gluon launcher call under sig (aligned pointers only: Triton specialized on them)."""
    if sig is not None and log is not None and _aligned(*inputs):
        plan = _logged_plan(inputs[0].device, inputs, log, record)
        if plan is not None:
            _keep_plan(sig, plan)  # flash_launch's: clear_plans() clears both kinds, MAX_PLANS caps both


def forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions):
    """(o, lse, LaunchRecord), as flash_launch._forward."""
    if options.kernels == "triton":
        return _forward(q, k, v, causal, options)
    choice = _table_choice("fwd", q, k, causal, options)
    if choice is None:
        return _forward(q, k, v, causal, options)
    return gluon_forward(q, k, v, causal, options, choice.kernel, choice.config)


def gluon_forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions, kernel: str,
                  config: Config):
    """forward's path once the table named (kernel, config) for the call: its plan, else the launcher (Triton
    where the launcher refuses the inputs). tools/probes/flash_gluon_fwd.py --short times the kernels through
    this, the host path a kernels="auto" call takes."""
    sig = _signature("gluon fwd", kernel, config, causal, options, q, k, v)
    plan = _plan(sig)
    if plan is not None and _aligned(q, k, v):
        o, lse = plan.run((q, k, v))[:2]  # (dynamic's counter follows them)
        return o, lse, _record(options, plan.record)

    def accepts() -> None:
        from .flash_gluon_common import validate
        validate(q, k, v, "flash_gluon_ws_forward")

    if _refuses(accepts):
        return _forward(q, k, v, causal, options)
    from .flash_gluon_common import LaunchLog
    from .flash_gluon_ws import GluonWsConfig, flash_gluon_ws_forward
    cfg = GluonWsConfig(**dict(config))
    log = None if sig is None else LaunchLog()
    with launch_ctx(q, "impl_flash::flash_gluon_ws_forward"):
        o, lse = flash_gluon_ws_forward(q, k, v, causal, cfg, log)
    record = LaunchRecord("fwd", (("fwd", repr(cfg)),), _head_dim_label(q.shape[-1]), True, kernel=kernel)
    _store_plan(sig, (q, k, v), log, record)
    return o, lse, _record(options, record)


def backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
             options: FlashOptions, variant: Optional[str] = None):
    """(dq, dk, dv, LaunchRecord), as flash_launch._backward; `variant` concerns the Triton backward only."""
    if options.kernels == "triton":
        return _backward(q, k, v, o, do, lse, causal, options, variant)
    choice = _table_choice("bwd", q, k, causal, options)
    if choice is None:
        return _backward(q, k, v, o, do, lse, causal, options, variant)
    return gluon_backward(q, k, v, o, do, lse, causal, options, choice.kernel, choice.config, variant)


def gluon_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
                   options: FlashOptions, kernel: str, config: Config, variant: Optional[str] = None):
    """backward's path once the table named (kernel, config) for the call, as gluon_forward (the Triton
    backward, at `variant`, where the launcher refuses the inputs; tools/probes/flash_gluon_bwd.py --short)."""
    sig = _signature("gluon bwd", kernel, config, causal, options, q, k, v, o, do, lse)
    plan = _plan(sig)
    if plan is not None and _aligned(q, k, v, o, do, lse):
        dq, dk, dv = plan.grads((q, k, v, o, do, lse))
        return dq, dk, dv, _record(options, plan.record)

    def accepts() -> None:
        from .flash_gluon_bwd import validate_backward
        validate_backward(q, k, v, o, do, lse)

    if _refuses(accepts):
        return _backward(q, k, v, o, do, lse, causal, options, variant)
    log = None
    if kernel == "gluon_ws":  # the table names it at d 128 and 64 only (kernel_table.KERNEL_HEAD_DIMS)
        from .flash_gluon_bwd_ws import GluonBwdWsConfig, flash_gluon_backward_ws
        from .flash_gluon_common import LaunchLog
        cfg = GluonBwdWsConfig(**dict(config))
        log = None if sig is None else LaunchLog()
        with launch_ctx(q, "impl_flash::flash_gluon_backward_ws"):
            dq, dk, dv = flash_gluon_backward_ws(q, k, v, o, do, lse, causal, cfg, log)
    else:
        from .flash_gluon_bwd import GluonBwdConfig, flash_gluon_backward
        cfg = GluonBwdConfig(**dict(config))
        with launch_ctx(q, "impl_flash::flash_gluon_backward"):
            dq, dk, dv = flash_gluon_backward(q, k, v, o, do, lse, causal, cfg, options)
    record = LaunchRecord("bwd", (("bwd", repr(cfg)),), _head_dim_label(q.shape[-1]), True, kernel=kernel)
    _store_plan(sig, (q, k, v, o, do, lse), log, record)
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


__all__ = ["backward", "flash_backward_op", "flash_forward_op", "forward", "gluon_backward", "gluon_forward",
           "gluon_imports"]
