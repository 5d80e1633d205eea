"""compile="pointwise": torch.compile of the model's memory-bound parts only (the RMSNorms, the RoPE
rotation and the SwiGLU), leaving attention and the checkpointing around each block eager.

Why: in the 8B leaderboard step (2×H200, keep_attention 3) elementwise kernels took 1.24 s of 6.9 s
on rank 0 (18%): each RMSNorm is seven kernels over a (32,768 × 4,096) fp32 tensor, RoPE a gather,
strided slices, six arithmetic kernels and a stack, SwiGLU's gate three kernels over two (32,768 ×
11,008) bf16 tensors; their backwards and the checkpoint's recompute repeat them. Inductor fuses each
into one or two kernels. Compiling whole blocks instead would trace through keep_attention's
AttentionKeeper (Python state shared between a checkpoint's forward and its recompute), which these
pure functions avoid.

Each part is one compiled function shared by every instance (the module is an argument: dynamo lifts
its parameters to graph inputs, so one graph per part and grad mode serves every layer), as in
impl.workloads.compiled.compile_blocks_in_place. Shapes are static: the leaderboard step has one.
"""
from __future__ import annotations

import types

import torch

from impl.model.layers import RMSNorm, RotaryEmbedding, SwiGLU
from impl.model.transformer import TransformerLM
from impl.workloads.compiled import raise_recompile_limit


def _rmsnorm(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    return RMSNorm.forward(norm, x)


def _rope(rope: RotaryEmbedding, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return RotaryEmbedding.forward(rope, x, positions)


def _swiglu(ffn: SwiGLU, x: torch.Tensor) -> torch.Tensor:
    return SwiGLU.forward(ffn, x)


def compile_pointwise_in_place(lm: TransformerLM, *, backend: str = "inductor") -> list[str]:
    """Routes every RMSNorm, RotaryEmbedding and SwiGLU of `lm` through one compiled function per
    kind (their results and parameters unchanged); the names of the modules routed."""
    raise_recompile_limit()  # a graph per grad mode and input dtype: under the default limit; never silently eager
    fns = {RMSNorm: torch.compile(_rmsnorm, backend=backend), RotaryEmbedding: torch.compile(_rope, backend=backend),
           SwiGLU: torch.compile(_swiglu, backend=backend)}
    routed = []
    for name, module in lm.named_modules():
        fn = fns.get(type(module))
        if fn is None:
            continue
        module.forward = types.MethodType(lambda self, *args, _fn=fn: _fn(self, *args), module)
        routed.append(name)
    return routed


__all__ = ["compile_pointwise_in_place"]
