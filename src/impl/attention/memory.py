"""Memory accounting for `naive_attention` (pytorch_attention): what its forward keeps alive for
backward, and the peaks of forward and backward, derived from the autograd graph of
`impl.attention.naive.naive_attention` rather than from a rule of thumb.

The graph, for `scores = (Q K^T) / sqrt(d)`, optional `masked_fill(~mask)`, `P = softmax`,
`O = P V`:
- the score matmul saves Q and K (views of the inputs: no new memory);
- dividing by a Python scalar saves nothing, so the raw product is freed as soon as it is scaled;
- softmax saves its *output* P (its backward is P * (dP - rowsum(P * dP))), so the scaled scores
  are not needed by backward and die when the function returns;
- `masked_fill` (causal only) saves its boolean mask, one byte per (query, key) pair shared over
  the batch;
- the final matmul saves P (the same tensor softmax saved) and V.
So besides Q, K, V the forward leaves exactly one (batch, seq_q, seq_k) matrix for backward (plus
the causal mask), not two: the correctness test checks this against the tensors autograd really
saves (saved_tensors_hooks), and the GPU benchmark against torch.cuda.memory_allocated.

Backward peak: dP = dO V^T is materialised while P is alive, then softmax backward runs. On CUDA
that op (`softmax_backward_cuda_out`) first forms the product dP * P as a temporary of its own and
then writes dS from it: four (batch, seq_q, seq_k) matrices at once (P, dP, dP * P, dS), one more
than the autograd graph shows. Seen on the H100 with the allocator's C++ stacks
(tools/probes/naive_memory.py; reports/data/nvidia-h100-80gb-hbm3/probes/naive_memory_probe.txt);
the same one-matrix gap was in pytorch_attention's measured peaks. Later steps hold at most two.
(The first backward of a process also allocates the autograd thread's cuBLAS workspace, 32 MiB on
the H100: a one-off, not attention's memory.)
Forward peak: two such matrices (the scaled scores stay alive in the function's scope while
softmax writes P), plus the two boolean masks (mask and ~mask) when causal.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "fp64": 8}


def dtype_bytes(dtype) -> int:
    if isinstance(dtype, torch.dtype):
        return torch.empty((), dtype=dtype).element_size()
    return DTYPE_BYTES[str(dtype).replace("torch.", "")]


@dataclass(frozen=True)
class NaiveAttentionMemory:
    """Bytes, by component; the totals below are sums of these (all derived, none measured)."""

    qkv: int            # Q, K, V inputs
    output: int         # O, held by the caller
    grad_output: int    # dO, allocated by the caller before backward
    scores_matrix: int  # one (batch, seq_q, seq_k) matrix in the compute dtype
    mask: int           # causal boolean mask (seq_q, seq_k), 1 byte per element; 0 if not causal
    saved_for_backward: int   # what autograd keeps: Q, K, V, P (+ ~mask)
    before_backward: int      # saved + O + dO: what is in use when backward starts
    forward_peak: int         # Q, K, V + 2 matrices (+ 2 masks) + O (no dO: forward-only runs have none)
    softmax_backward_temp: int  # CUDA softmax backward's dP * P temporary (one matrix)
    backward_peak: int        # before_backward + dP, the dP * P temporary, dS + dV

    def as_dict(self) -> dict:
        return asdict(self)


def naive_attention_memory(batch: int, seq_q: int, d: int, dtype="fp32", *, seq_k: int | None = None,
                           is_causal: bool = False, with_grad_output: bool = True) -> NaiveAttentionMemory:
    """Derived memory of one naive_attention forward (+ backward) on (batch, seq, d) inputs."""
    seq_k = seq_q if seq_k is None else seq_k
    e = dtype_bytes(dtype)
    q_bytes, kv_bytes = batch * seq_q * d * e, batch * seq_k * d * e
    qkv = q_bytes + 2 * kv_bytes
    output = q_bytes
    grad_output = q_bytes if with_grad_output else 0
    matrix = batch * seq_q * seq_k * e
    mask = seq_q * seq_k if is_causal else 0
    saved = qkv + matrix + mask
    before = saved + output + grad_output
    forward_peak = qkv + 2 * matrix + 2 * mask + output
    # At softmax backward: P (counted in `before`), dP, the dP * P temporary and dS alive, dV
    # already written (size of V).
    backward_peak = before + 3 * matrix + kv_bytes
    return NaiveAttentionMemory(qkv=qkv, output=output, grad_output=grad_output, scores_matrix=matrix, mask=mask,
                                saved_for_backward=saved, before_backward=before, forward_peak=forward_peak,
                                softmax_backward_temp=matrix, backward_peak=backward_peak)


def flash_saved_for_backward(batch: int, seq: int, d: int, dtype="fp32") -> int:
    """What FlashAttention-2 keeps for backward instead: Q, K, V, O and the fp32 logsumexp L
    (one value per query): linear in seq, where naive attention's P is quadratic."""
    return 4 * batch * seq * d * dtype_bytes(dtype) + batch * seq * 4


__all__ = ["NaiveAttentionMemory", "dtype_bytes", "flash_saved_for_backward", "naive_attention_memory"]
