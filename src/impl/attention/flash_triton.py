"""FlashAttention-2 in Triton: forward and backward kernels + autograd Function.

Layout / conventions
--------------------
* Inputs are ``(batch, seq, d)`` or ``(batch, heads, seq, d)`` (more leading
  dims are flattened).  Kernels take explicit strides of a 4-D
  ``(B, H, S, d)`` view, so non-contiguous inputs (e.g. ``x.transpose(1, 2)`` of a
  ``(B, S, H, d)`` tensor) are used without copies.
* Causal masking is **top-left aligned**, exactly like PyTorch's
  ``scaled_dot_product_attention(is_causal=True)``: query ``i`` attends to keys
  ``j <= i``.  ``seq_q != seq_k`` is allowed with and without masking.
* The head dim (16..128, any value) is tiled by ``_head_dim_tiles``: Triton's block
  shapes are powers of two, so d = 48, 80, 96 is split into two power-of-two tiles
  (``BLOCK_D`` + ``D1``: 32 + 16, 64 + 16, 64 + 32; the rest must be >= 16, a dot's
  least K) held as (lo, hi) pairs: products over d are two dots, products giving d
  columns two accumulators, each operand two loads or descriptors. Other head dims
  are padded to the next power of two (``BLOCK_D``, ``D1 = 0``; e.g. 24 on 32, 112
  on 128) with masked loads/stores. Sequence lengths need not be tile multiples.
* Softmax uses base-2 exponentials with ``scale * log2(e)`` folded into the
  scores; the saved ``L`` is the natural-log logsumexp in float32 with shape
  ``q.shape[:-1]``.
* The forward kernel splits the key loop in two: tiles entirely below the
  causal diagonal and inside ``seq_k`` run without any masking, only the
  diagonal / ragged-tail tiles apply masks (causal masked scores use -1e6).
  Key tiles entirely above the diagonal are skipped via the loop bound.
* Backward, two variants (chosen per shape by :mod:`impl.attention.backward_choice`):
  - two-pass (no atomics): one kernel computes dQ (grid over query tiles, looping over key tiles up
    to the diagonal) and ``D = rowsum(O * dO)`` of its rows, which it stores; then one kernel
    computes dK, dV (grid over key tiles, looping over query tiles starting at the diagonal for
    causal) reading D.  Two launches.
  - single-pass (atomic): a small kernel computes D and zeroes an fp32 dQ buffer; one kernel per
    key tile computes dK, dV and adds dS·K of each query tile to that buffer atomically (5 tile
    products per tile pair instead of 7); the buffer is cast to the input dtype (fp32 inputs
    accumulate into dQ itself).
  fp32 accumulation, outputs in the input dtype.  The key-tile loops split: full query tiles
  without row masks, then the ragged tail.
* Streamed tiles (K, V in the forward and the dQ pass; Q, dO in the dK/dV pass)
  are loaded through tensor descriptors (TMA on Hopper: the copy engine computes
  addresses and zero-fills out-of-bounds rows and padded head-dim columns) when
  the layout allows it (unit stride along d, 16-byte aligned strides), else by
  pointer arithmetic with masks; ``FlashOptions(tma=False)`` forces the pointer path.
* Options are a value, :class:`impl.attention.flash_options.FlashOptions`, passed through the
  call (``FlashAttentionTriton.apply(q, k, v, is_causal, options)``, the launchers' ``options=``);
  None means ``default_options()``, the dataclass defaults. There are no module-level settings:
  a caller that wants other options passes them. What each call ran comes back as a LaunchRecord
  (the ``*_recorded`` launchers return it; ``options.recorder`` receives it).
* The backward implementation is ``options.backward``: ``"triton"`` (default) or ``"compiled"``
  (the ``torch.compile``'d PyTorch backward of :mod:`impl.attention.flash_backward`).
* ``options.kernels``: ``"triton"`` (default) runs the Triton kernels; ``"auto"`` the Gluon kernel the
  measured kernel table names for the call's architecture, head dim, causal and dtype where the tensors
  are CUDA on it (H100/H200) and the Gluon launcher accepts them, else the Triton kernels
  (:mod:`~impl.attention.flash_dispatch`, :mod:`~impl.attention.kernel_table`). Eager and compiled calls
  dispatch alike; the launch record's ``kernel`` names what ran.
* Modules: :mod:`~impl.attention.flash_configs` (autotune lists), :mod:`~impl.attention.flash_kernels`
  (the @triton.jit code), :mod:`~impl.attention.flash_launch` (signatures, plans, launchers, custom
  ops), this module (the autograd Function).
* Launch (:mod:`impl.attention.flash_launch`): a call whose signature (shapes, strides, dtype,
  device, options, alignment) was seen before runs its *call plan*: the outputs allocated and each
  compiled kernel's launcher called with its arguments already bound, no autotuner and no Triton
  argument specialization. A signature's first calls go through the autotuner (a shape key's
  first) and ``JITFunction.run`` (which compiles and returns the kernel), then store the plan.
  Under the interpreter (or ``direct_launch=False``) a plan's kernels are ordinary JIT calls.
* torch.compile: the two launchers are the custom ops ``impl_flash::triton_forward`` and
  ``impl_flash::triton_backward`` (with fake implementations; options as a registered int), so a
  graph through FlashAttentionTriton (a whole model's, with ``fullgraph=True``) has no graph
  break; the kernels run as opaque nodes of it.

Autotuning: configs come from functions that check
``os.environ.get("TRITON_INTERPRET") == "1"`` at import time; under the
interpreter a single small config is used (autotuning there would run every
config through the slow interpreter, and GPU-sized tiles are slow to emulate).

Importing this module never touches CUDA.
"""

from __future__ import annotations

from typing import Optional

import torch

from .flash_backward import compiled_flash_backward, flash_backward
from .flash_configs import _INTERPRETED
from .flash_dispatch import backward as dispatch_backward
from .flash_dispatch import flash_backward_op, flash_forward_op
from .flash_dispatch import forward as dispatch_forward
from .flash_launch import (_kernel, _options_key, _options_of, clear_plans,
                           flash_attention_triton_backward, flash_attention_triton_backward_recorded,
                           flash_attention_triton_forward, flash_attention_triton_forward_recorded)
from .flash_options import BACKWARD_KINDS, FlashOptions, LaunchRecord, LaunchRecorder, default_options, with_configs
from .flash_torch import validate_inputs

Tensor = torch.Tensor


def autotune_enabled(options: Optional[FlashOptions] = None) -> bool:
    """Whether calls with `options` (None: default_options()) autotune the forward (more than one
    config to benchmark); under the interpreter always (one config, nothing to switch off)."""
    return _INTERPRETED or len(_kernel("fwd", options or default_options()).configs) > 1


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton forward and (by default) Triton backward.

    ``apply(q, k, v, is_causal=False, options=None)``: `options` a FlashOptions (None:
    default_options())."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                options: Optional["FlashOptions"] = None) -> Tensor:
        validate_inputs(q, k, v, is_causal, for_triton=True)
        if not q.is_cuda and not _INTERPRETED:
            raise ValueError(
                "Triton FlashAttention got CPU tensors but its kernels were compiled for the GPU: "
                "set TRITON_INTERPRET=1 before impl.attention.flash_triton is first imported to run on CPU"
            )
        is_causal = bool(is_causal)
        # The ops for torch.compile (one opaque graph node); eager calls the launcher itself: the
        # dispatcher's round trip cost ~110 us per call on the H100's host (probes/flash_host_overhead.json),
        # more than the kernel at small shapes.
        if torch.compiler.is_compiling():
            o, lse = flash_forward_op(q, k, v, is_causal, _options_key(options))
        else:
            o, lse, _ = dispatch_forward(q, k, v, is_causal, options or default_options())
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        ctx.options_key = _options_key(options)  # ints and strs on ctx: plain for Dynamo
        ctx.backward_kind = (options or default_options()).backward
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        kind = ctx.backward_kind
        if kind == "triton":
            if torch.compiler.is_compiling():
                dq, dk, dv = flash_backward_op(q, k, v, o, do, lse, ctx.is_causal, None, ctx.options_key)
            else:
                dq, dk, dv, _ = dispatch_backward(q, k, v, o, do, lse, ctx.is_causal,
                                                  _options_of(ctx.options_key))
        elif kind == "compiled":
            # Being compiled, the PyTorch backward is traced into the outer graph: Dynamo rejects
            # compiled_flash_backward's lazy torch.compile (a cached factory) inside the Function.
            backward = flash_backward if torch.compiler.is_compiling() else compiled_flash_backward
            dq, dk, dv = backward(q, k, v, o, do, lse, ctx.is_causal)
        else:
            raise ValueError(f"unknown flash backward {kind!r}; expected one of {BACKWARD_KINDS}")
        return dq, dk, dv, None, None


__all__ = [
    "FlashAttentionTriton",
    "FlashOptions",
    "LaunchRecord",
    "LaunchRecorder",
    "autotune_enabled",
    "default_options",
    "flash_attention_triton_backward",
    "flash_attention_triton_backward_recorded",
    "flash_attention_triton_forward",
    "flash_attention_triton_forward_recorded",
    "flash_backward_op",
    "flash_forward_op",
    "clear_plans",
    "with_configs",
]
