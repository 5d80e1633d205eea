"""Reference (naive) scaled dot-product attention with profiler annotations."""

from __future__ import annotations

import math

import torch

from impl.annotate import annotate
from impl.attention.flash_torch import SUPPORTED_DTYPES, validate_inputs

Tensor = torch.Tensor


def naive_attention(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
    """``softmax(Q K^T / sqrt(d)) V`` on ``(..., seq, d)`` tensors.

    Causal masking is top-left aligned (query ``i`` sees keys ``j <= i``), like
    ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``.
    Inputs are checked like the Flash ones' (float64 allowed: it is the reference).
    """
    validate_inputs(q, k, v, is_causal, dtypes=SUPPORTED_DTYPES + (torch.float64,))
    d = q.shape[-1]
    with annotate("computing attention scores"):
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(d)
        if is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            mask = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
    with annotate("computing softmax"):
        probs = torch.softmax(scores, dim=-1)
    with annotate("final matmul"):
        out = torch.matmul(probs, v)
    return out


__all__ = ["naive_attention"]
