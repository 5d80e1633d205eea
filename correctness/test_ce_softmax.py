"""impl.model.ce_softmax: the fused LM head's softmax step in one Triton kernel (on the GPU where there is one,
else the interpreter on the CPU), against the torch path's arithmetic on the same compute-dtype logits."""
from __future__ import annotations

import pytest
import torch

from impl.model.ce_softmax import BLOCK_V, softmax_xent_

# CPU tensors need the interpreter (conftest sets it where there is no GPU); with a GPU the kernel compiles
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _torch_path(z: torch.Tensor, t: torch.Tensor, scale: float):
    """impl.model.fused_ce's torch steps: fp32 copy, log-sum-exp, loss, (softmax − onehot)·scale cast back."""
    zf = z.float()
    lse = torch.logsumexp(zf, dim=-1)
    loss = lse - zf.gather(1, t.unsqueeze(1)).squeeze(1)
    g = (zf - lse.unsqueeze(1)).exp()
    g.scatter_add_(1, t.unsqueeze(1), torch.full_like(lse, -1.0).unsqueeze(1))
    return loss, (g * scale).to(z.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 1000, BLOCK_V + 3])  # one tile, several (GPU), a ragged last tile
def test_losses_and_gradient_follow_the_torch_path(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    z = (torch.randn(5, vocab, generator=g) * 4).to(dtype).to(DEVICE)
    t = torch.randint(0, vocab, (5,), generator=g).to(DEVICE)
    t[0] = vocab - 1  # the last column, in the last (ragged) tile
    want_loss, want_grad = _torch_path(z, t, 0.25)
    got = z.clone()
    loss = softmax_xent_(got, t, 0.25)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-5)
    # the same fp32 values rounded once to the logits' dtype; the lse's sum order may move one ulp
    torch.testing.assert_close(got.float(), want_grad.float(), rtol=torch.finfo(dtype).eps * 2, atol=1e-6)


def test_loss_only_leaves_the_logits_alone():
    z = torch.randn(3, 50, device=DEVICE)
    before, t = z.clone(), torch.tensor([0, 49, 7], device=DEVICE)
    loss = softmax_xent_(z, t, 1.0, grad=False)
    assert torch.equal(z, before)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(before, t, reduction="none"))


def test_bad_input_is_refused_by_name():
    z = torch.randn(4, 10)
    with pytest.raises(ValueError, match="logits must be 2-D with contiguous rows"):
        softmax_xent_(z.t(), torch.zeros(10, dtype=torch.long), 1.0)
    with pytest.raises(ValueError, match=r"targets must be int32/int64 of shape \(4,\)"):
        softmax_xent_(z, torch.zeros(4), 1.0)
    with pytest.raises(ValueError, match=r"targets must be int32/int64 of shape \(4,\)"):
        softmax_xent_(z, torch.zeros(3, dtype=torch.long), 1.0)


def test_the_kernel_compiles_for_the_h100_with_vector_loads():
    """Compiled for sm_90 on the CPU (PTX needs no GPU): the bf16 row moves in 16-byte vectors (16 elements a
    thread a tile, two vectors: BLOCK_V over NUM_WARPS warps) in both passes, and the gradient's store too."""
    from kits.sm90_compile import run_without_interpreter

    code = r"""
import re, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from impl.model.ce_softmax import BLOCK_V, NUM_WARPS, _softmax_xent_kernel
assert BLOCK_V == 32 * NUM_WARPS * 16, "two 16-byte vectors of bf16 a thread a tile"
sig = {"z_ptr": "*bf16", "target_ptr": "*i64", "loss_ptr": "*fp32", "stride": "i64", "V": "i32", "scale": "fp32",
       "BLOCK_V": "constexpr", "WRITE_GRAD": "constexpr"}
src = ASTSource(fn=_softmax_xent_kernel, signature=sig, constexprs={"BLOCK_V": BLOCK_V, "WRITE_GRAD": True},
                attrs={(i,): [["tt.divisibility", 16]] for i in (0, 3, 4)})  # as a launch specialises them
ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS}).asm["ptx"]
print(len(re.findall(r"ld\.global(?:\.\w+)*\.v4\.b32", ptx)), len(re.findall(r"st\.global(?:\.\w+)*\.v4\.b32", ptx)),
      len(re.findall(r"\bld\.local|\bst\.local", ptx)))
"""
    loads, stores, local = map(int, run_without_interpreter(code).split())
    assert loads >= 4 and stores >= 2 and local == 0, (loads, stores, local)
