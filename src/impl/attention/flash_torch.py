"""Tiled FlashAttention-2 forward in pure PyTorch, plus shared input checks.

The forward pass walks over query tiles and, for each, over key tiles with an
online softmax (running max ``m``, running denominator ``l`` and an unnormalised
accumulator), never materialising the full ``Sq x Sk`` score matrix.  It saves
the natural-log logsumexp ``L`` (shape ``q.shape[:-1]``, float32) and the
backward pass is the shared :mod:`impl.attention.flash_backward` function.

Causal masking is top-left aligned (query ``i`` sees keys ``j <= i``), like
``scaled_dot_product_attention(is_causal=True)``; ``Sq != Sk`` is allowed.
"""

from __future__ import annotations

import math
import os
from typing import Tuple

import torch

from .flash_backward import flash_backward

Tensor = torch.Tensor

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
TRITON_MIN_HEAD_DIM = 16
TRITON_MAX_HEAD_DIM = 128


def validate_inputs(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False, *, for_triton: bool = False,
                    dtypes: tuple = SUPPORTED_DTYPES) -> None:
    """Check q/k/v for the attention implementations; raise ``ValueError`` on problems.

    Shapes are ``(..., seq, d)`` with at least 3 dims; ``dtypes`` are the accepted
    dtypes.  ``for_triton`` adds the Triton restrictions (head dim in 16..128, CUDA
    tensors unless the Triton interpreter is active, no bfloat16 in the interpreter).
    """
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool (True or False), got {is_causal!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() < 3:
            raise ValueError(
                f"{name} must have at least 3 dims (batch, seq, head_dim), got shape {tuple(t.shape)}"
            )
    if not (q.dim() == k.dim() == v.dim()):
        raise ValueError(f"q, k, v rank mismatch: {q.dim()}, {k.dim()}, {v.dim()}")
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        raise ValueError(
            f"q, k, v batch dims mismatch: {tuple(q.shape[:-2])}, {tuple(k.shape[:-2])}, {tuple(v.shape[:-2])}"
        )
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1]):
        raise ValueError(f"head dim mismatch: q {q.shape[-1]}, k {k.shape[-1]}, v {v.shape[-1]}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v seq length mismatch: {k.shape[-2]} vs {v.shape[-2]}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"seq lengths must be >= 1, got q {q.shape[-2]}, k {k.shape[-2]}")
    if q.shape[-1] < 1:
        raise ValueError("head dim must be >= 1")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v dtype mismatch: {q.dtype}, {k.dtype}, {v.dtype}")
    if q.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise ValueError(f"unsupported dtype {q.dtype}; supported: {names}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v device mismatch: {q.device}, {k.device}, {v.device}")
    if for_triton:
        d = q.shape[-1]
        if not (TRITON_MIN_HEAD_DIM <= d <= TRITON_MAX_HEAD_DIM):
            raise ValueError(
                f"head dim {d} unsupported by the Triton kernels (must be in "
                f"{TRITON_MIN_HEAD_DIM}..{TRITON_MAX_HEAD_DIM})"
            )
        if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(
                f"Triton FlashAttention needs CUDA tensors, got device {q.device}; "
                "set TRITON_INTERPRET=1 (before importing triton) to run on CPU"
            )
        if not q.is_cuda and q.dtype == torch.bfloat16:
            # The interpreter's bf16 tl.dot returns wrong (finite, ~1e9) values, silently.
            raise ValueError(
                "dtype bfloat16 is not supported by Triton FlashAttention under the Triton interpreter "
                "(CPU); supported there: float32, float16 (bfloat16 needs a CUDA GPU)"
            )


def _tile(n: int, preferred: int = 64) -> int:
    # Tiles are at least 16 wide (when the sequence is), at most `preferred`.
    return max(1, min(preferred, n))


def flash_forward_torch(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                        block_q: int = 64, block_k: int = 64) -> Tuple[Tensor, Tensor]:
    """Tiled online-softmax forward. Returns ``(o, lse)``; lse is float32."""
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    bq, bk = _tile(n_q, block_q), _tile(n_k, block_k)
    lead = q.shape[:-2]

    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lead + (n_q,), dtype=torch.float32, device=q.device)

    for qs in range(0, n_q, bq):
        qe = min(qs + bq, n_q)
        q_tile = q[..., qs:qe, :].to(cdt) * scale
        m = torch.full(lead + (qe - qs,), -math.inf, dtype=cdt, device=q.device)
        l = torch.zeros(lead + (qe - qs,), dtype=cdt, device=q.device)
        acc = torch.zeros(lead + (qe - qs, d), dtype=cdt, device=q.device)
        # Causal: key tiles starting after the last query of this tile are fully masked.
        k_end = min(n_k, qe) if is_causal else n_k
        for ks in range(0, k_end, bk):
            ke = min(ks + bk, n_k)
            s = torch.matmul(q_tile, k[..., ks:ke, :].to(cdt).transpose(-2, -1))
            if is_causal and ke - 1 > qs:  # tile touches the diagonal
                rows = torch.arange(qs, qe, device=q.device)[:, None]
                cols = torch.arange(ks, ke, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, -math.inf)
            m_new = torch.maximum(m, s.amax(dim=-1))
            # Every query row sees key 0 (top-left causal), and key 0 is in the
            # first tile, so m_new is finite and no (-inf) - (-inf) appears.
            p = torch.exp(s - m_new.unsqueeze(-1))
            alpha = torch.exp(m - m_new)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha.unsqueeze(-1) * acc + torch.matmul(p, v[..., ks:ke, :].to(cdt))
            m = m_new
        o[..., qs:qe, :] = (acc / l.unsqueeze(-1)).to(q.dtype)
        lse[..., qs:qe] = (m + torch.log(l)).to(torch.float32)
    return o, lse


class FlashAttentionTorch(torch.autograd.Function):
    """FlashAttention-2 with a tiled PyTorch forward and the PyTorch backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        validate_inputs(q, k, v, is_causal)
        is_causal = bool(is_causal)
        o, lse = flash_forward_torch(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, o, do, lse, ctx.is_causal)
        return dq, dk, dv, None


__all__ = ["FlashAttentionTorch", "flash_forward_torch", "validate_inputs"]
