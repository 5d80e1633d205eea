"""PyTorch implementation of the FlashAttention-2 backward pass.

Given Q, K, V, the forward output O, the upstream gradient dO and the per-row
natural-log logsumexp L saved by the forward pass, the backward recomputes
the attention probabilities ``P = exp(S - L)`` (``S = Q K^T * scale``) instead
of storing them, and uses ``D = rowsum(O * dO)`` so that

    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - D)
    dQ = dS K * scale
    dK = dS^T Q * scale

All arithmetic is done in float32 (float64 stays float64); the gradients are
returned in the dtype of the corresponding input.

Causal masking is *top-left aligned* (query ``i`` attends to keys ``j <= i``),
the same convention as ``torch.nn.functional.scaled_dot_product_attention``
with ``is_causal=True``.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, Tuple

import torch

Tensor = torch.Tensor


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def flash_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    do: Tensor,
    lse: Tensor,
    is_causal: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Plain PyTorch backward. Shapes ``(..., S, d)``; ``lse`` is ``(..., Sq)``."""
    cdt = _compute_dtype(q.dtype)
    scale = 1.0 / math.sqrt(q.shape[-1])
    qf, kf, vf = q.to(cdt), k.to(cdt), v.to(cdt)
    of, dof = o.to(cdt), do.to(cdt)
    lf = lse.to(cdt)

    d_row = (of * dof).sum(dim=-1)  # D = rowsum(O * dO), (..., Sq)
    s = torch.matmul(qf, kf.transpose(-2, -1)) * scale
    p = torch.exp(s - lf.unsqueeze(-1))
    if is_causal:
        n_q, n_k = q.shape[-2], k.shape[-2]
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
        p = p.masked_fill(~mask, 0.0)

    dv = torch.matmul(p.transpose(-2, -1), dof)
    dp = torch.matmul(dof, vf.transpose(-2, -1))
    ds = p * (dp - d_row.unsqueeze(-1))
    dq = torch.matmul(ds, kf) * scale
    dk = torch.matmul(ds.transpose(-2, -1), qf) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@functools.cache
def _compiled_backward() -> Callable[..., Tuple[Tensor, Tensor, Tensor]]:
    """flash_backward under torch.compile, made on first use (a cache, not a module setting)."""
    return torch.compile(flash_backward, dynamic=False)


def compiled_flash_backward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    do: Tensor,
    lse: Tensor,
    is_causal: bool = False,
) -> Tuple[Tensor, Tensor, Tensor]:
    """``torch.compile``'d version of :func:`flash_backward`.

    Design choice: the function is compiled lazily, and only the first time it
    is called with CUDA tensors.  On CPU we deliberately call the plain
    function instead: torch.compile on CPU needs a working C++ toolchain and
    takes tens of seconds per shape, which makes CPU-only CI slow and fragile,
    while buying nothing we measure (performance is only measured on the GPU).
    """
    if not q.is_cuda:
        return flash_backward(q, k, v, o, do, lse, is_causal)
    return _compiled_backward()(q, k, v, o, do, lse, is_causal)


__all__ = ["flash_backward", "compiled_flash_backward"]
