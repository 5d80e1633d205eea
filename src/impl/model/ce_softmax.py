"""The fused LM head's softmax step as one Triton kernel (impl.model.fused_ce, softmax="triton").

Per token, from its row of compute-dtype logits: the log-sum-exp, the token's loss (lse − z_target), and,
written back over the logits in their own dtype, the gradient d loss / d logits = (softmax − onehot)·scale.

The torch path makes the chunk's fp32 logits (a copy of the bf16 matmul output), reads them for the
log-sum-exp, subtracts and exponentiates in place, scatters the −1 and casts the result to bf16: about eight
fp32 passes over rows × vocab a chunk (~2.3 GB at 441 × 151,936). Here the bf16 row is read twice and written
once (~0.4 GB), and no fp32 copy exists, so a chunk costs only its logits' memory. The arithmetic is the
torch path's (fp32 from the same bf16 values); the log-sum-exp's sum runs in another order.

On CUDA tensors the kernel runs on the GPU; on CPU tensors only through the Triton interpreter, which needs
TRITON_INTERPRET=1 before this module is imported (impl.model.adamw_master's convention).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from impl.runtime import launch_ctx

_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# A 4,096-wide tile is 8 KB of bf16 a read with 8 warps (16-byte loads); the interpreter runs a program's
# tiles one after another as numpy ops: there one tile covers a vocabulary.
BLOCK_V = 2**17 if _INTERPRETED else 4096
NUM_WARPS = 8


@triton.jit
def _softmax_xent_kernel(z_ptr, target_ptr, loss_ptr, stride, V, scale, BLOCK_V: tl.constexpr,
                         WRITE_GRAD: tl.constexpr):
    """Row program_id of z (V logits at z_ptr + row·stride): its loss to loss_ptr[row] and, with WRITE_GRAD,
    (softmax − onehot(target))·scale over the row in z's dtype."""
    row = tl.program_id(0).to(tl.int64)
    base = z_ptr + row * stride
    target = tl.load(target_ptr + row)
    offs = tl.arange(0, BLOCK_V)
    # the running max and sum of exponentials, one tile at a time (a row is finite: every tile holds a
    # finite logit, so the max is finite after the first and exp(-inf - max) = 0 for the masked lanes)
    m = tl.max(tl.full([BLOCK_V], float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK_V], tl.float32), axis=0)
    for start in range(0, V, BLOCK_V):
        z = tl.load(base + start + offs, mask=start + offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    tl.store(loss_ptr + row, lse - tl.load(base + target).to(tl.float32))
    if WRITE_GRAD:
        for start in range(0, V, BLOCK_V):
            cols = start + offs
            z = tl.load(base + cols, mask=cols < V, other=0.0).to(tl.float32)
            g = tl.exp(z - lse)
            g = tl.where(cols == target, g - 1.0, g) * scale  # the torch path's order: −1, then the scale
            tl.store(base + cols, g.to(z_ptr.dtype.element_ty), mask=cols < V)


def softmax_xent_(logits: torch.Tensor, targets: torch.Tensor, scale: float, grad: bool = True) -> torch.Tensor:
    """The per-token losses (fp32, shape (rows,)) of `logits` (rows × V, rows contiguous) against `targets`
    (rows,) integer ids; with `grad`, `logits` is overwritten by (softmax − onehot)·scale in its dtype."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"softmax_xent_: logits must be 2-D with contiguous rows, got shape {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    if targets.shape != logits.shape[:1] or targets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"softmax_xent_: targets must be int32/int64 of shape ({logits.shape[0]},), got "
                         f"{targets.dtype} {tuple(targets.shape)}")
    if targets.device != logits.device:
        raise ValueError(f"softmax_xent_: targets on {targets.device}, logits on {logits.device}")
    if logits.device.type != "cuda" and not _INTERPRETED:
        raise ValueError(f"softmax_xent_: the Triton kernel needs CUDA tensors (or TRITON_INTERPRET=1 set before "
                         f"impl.model.ce_softmax is imported), got {logits.device}")
    rows, vocab = logits.shape
    loss = torch.empty(rows, dtype=torch.float32, device=logits.device)
    if rows:
        with launch_ctx(logits, "impl::softmax_xent_"):
            _softmax_xent_kernel[(rows,)](logits, targets, loss, logits.stride(0), vocab, float(scale),
                                          BLOCK_V=BLOCK_V, WRITE_GRAD=grad, num_warps=NUM_WARPS)
    return loss


__all__ = ["BLOCK_V", "softmax_xent_"]
