"""LM head + cross-entropy fused, chunked over tokens, so the (tokens × vocab) logits never exist
in full and never in fp32 beyond one chunk.

The unfused path (`cross_entropy(model(x), y)`) keeps the compute-dtype logits, their fp32 copy and
the fp32 softmax alive from forward to backward. Here forward walks over chunks of tokens: logits
of a chunk (compute dtype), the fp32 log-sum-exp and loss, and at once the gradient wrt the chunk's
hidden states and its share of the weight gradient (summed in fp32). Only those two gradients are
saved; backward scales them by grad_output. The numerics follow the unfused autocast path step by
step (cast h and W to the compute dtype, matmul, softmax in fp32, gradient of the logits cast back
to the compute dtype); the one difference is that dW is summed per chunk in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.annotate import part

from .loss import check_reduction

# One chunk's fp32 logits stay within this; with the compute-dtype logits and their gradient a
# chunk holds about twice it (bf16).
MAX_CHUNK_BYTES = 256 * 2**20


def chunk_rows(vocab_size: int, max_bytes: int = MAX_CHUNK_BYTES) -> int:
    return max(1, max_bytes // (4 * vocab_size))


SOFTMAXES = ("torch", "triton")


@dataclass(frozen=True)
class LMHead:
    """How the fused LM head runs: chunks of `chunk_bytes` of fp32 logits (chunk_rows tokens), and its softmax
    step in torch ops ("torch": an fp32 copy of the chunk's logits and about eight passes over it) or in one
    Triton kernel ("triton", impl.model.ce_softmax: two reads of the compute-dtype logits and one write of the
    gradient over them, no fp32 copy)."""

    chunk_bytes: int = MAX_CHUNK_BYTES
    softmax: str = "torch"

    def __post_init__(self):
        if isinstance(self.chunk_bytes, bool) or not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 1:
            raise ValueError(f"LMHead.chunk_bytes must be a positive int, got {self.chunk_bytes!r}")
        if self.softmax not in SOFTMAXES:
            raise ValueError(f"LMHead.softmax must be one of {SOFTMAXES}, got {self.softmax!r}")

    def rows(self, vocab_size: int) -> int:
        return chunk_rows(vocab_size, self.chunk_bytes)


def _check(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> None:
    if not hidden.dtype.is_floating_point:
        raise ValueError(f"fused_linear_cross_entropy: hidden must be floating point, got {hidden.dtype}")
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"fused_linear_cross_entropy: weight {tuple(weight.shape)} must be (vocab, d_model) with "
                         f"d_model = hidden's last dim {hidden.shape[-1]}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"fused_linear_cross_entropy: hidden {tuple(hidden.shape)} and targets "
                         f"{tuple(targets.shape)} must agree on every dim but the last")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"fused_linear_cross_entropy: targets must be integer class ids, got {targets.dtype}")
    if targets.numel() == 0:
        raise ValueError("fused_linear_cross_entropy: no tokens")


class FusedLinearCrossEntropy(torch.autograd.Function):
    """apply(hidden (N, d), weight (V, d), targets (N,), compute_dtype, rows, reduction, softmax) -> the mean or
    sum (REDUCTIONS) of the per-token losses (fp32 scalar); softmax one of SOFTMAXES (LMHead)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, compute_dtype, rows, reduction="mean", softmax="torch"):
        with part("lm head forward"):  # a profiled step's LM head apart from the blocks (impl.annotate)
            return FusedLinearCrossEntropy._forward(ctx, hidden, weight, targets, compute_dtype, rows, reduction,
                                                    softmax)

    @staticmethod
    def _forward(ctx, hidden, weight, targets, compute_dtype, rows, reduction, softmax):
        check_reduction(reduction)  # apply() is public too: anything but "mean" must not pass as a sum
        if softmax not in SOFTMAXES:
            raise ValueError(f"fused_linear_cross_entropy: softmax must be one of {SOFTMAXES}, got {softmax!r}")
        n = hidden.shape[0]
        scale = 1.0 / n if reduction == "mean" else 1.0
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        h_c, w_c = hidden.to(compute_dtype), weight.to(compute_dtype)  # W cast once, as autocast does
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for i in range(0, n, rows):
            h_i, t_i = h_c[i:i + rows], targets[i:i + rows]
            if softmax == "triton":  # the loss, and the gradient written over the compute-dtype logits
                from .ce_softmax import softmax_xent_

                g = h_i @ w_c.t()
                loss += softmax_xent_(g, t_i, scale, grad=need_h or need_w).sum()
                if not (need_h or need_w):
                    continue
            else:
                z = (h_i @ w_c.t()).float()  # this chunk's logits, fp32 for the softmax
                lse = torch.logsumexp(z, dim=-1)
                loss += (lse - z.gather(1, t_i.unsqueeze(1)).squeeze(1)).sum()
                if not (need_h or need_w):
                    continue
                # d loss/d logits = (softmax - onehot) · scale (1/N for the mean), in place in z
                g = z.sub_(lse.unsqueeze(1)).exp_()
                g.scatter_add_(1, t_i.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
                g = (g.mul_(scale) if scale != 1.0 else g).to(compute_dtype)
            if need_h:
                grad_h[i:i + rows] = g @ w_c
            if need_w:
                grad_w.add_(g.t() @ h_i)  # compute-dtype product, fp32 sum over chunks
        ctx.save_for_backward(grad_h, None if grad_w is None else grad_w.to(weight.dtype))
        return loss * scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        with part("lm head backward"):
            return (None if grad_h is None else grad_h * grad_out.to(grad_h.dtype),
                    None if grad_w is None else grad_w * grad_out.to(grad_w.dtype), None, None, None, None, None)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               rows: int | None = None, reduction: str = "mean", softmax: str = "torch") -> torch.Tensor:
    """Cross-entropy of the logits hidden @ weight^T against targets, equal to
    `cross_entropy(hidden @ weight.T, targets, reduction)` (impl.model) without materialising the logits.

    hidden (..., d_model) — the LM's final-norm output, `model(x, return_hidden=True)`; weight
    (vocab, d_model) — `model.lm_head.weight`; targets (...) integer ids. Under autocast the
    matmuls run in the autocast dtype (fp32 softmax), as the unfused path would; `rows` overrides
    the tokens per chunk (default: fp32 logits of a chunk ≤ MAX_CHUNK_BYTES); reduction "mean" or
    "sum" over the tokens (the 2026 leaderboard sums: its gradients are then N× the mean's); softmax
    "torch" or "triton" (LMHead)."""
    _check(hidden, weight, targets)
    check_reduction(reduction)
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        compute_dtype = torch.get_autocast_dtype(device_type)
    else:
        compute_dtype = torch.promote_types(hidden.dtype, weight.dtype)
    rows = rows or chunk_rows(weight.shape[0])
    # Autocast off inside: the Function casts explicitly, so autocast's op lists change nothing.
    with torch.autocast(device_type, enabled=False):
        return FusedLinearCrossEntropy.apply(hidden.reshape(-1, hidden.shape[-1]), weight, targets.reshape(-1).long(),
                                             compute_dtype, int(rows), reduction, softmax)
