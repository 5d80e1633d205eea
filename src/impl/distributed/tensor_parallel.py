"""Tensor parallelism for impl.model.TransformerLM (Megatron-LM's layout).

``TensorParallel(module, group=None)`` shards every ``TransformerBlock`` over the ranks of `group`
(default: the whole world); rank i of N keeps:

* attention: the q/k/v projections column-parallel by heads (rows i of their (d_out, d_in) weights:
  heads i·h/N … (i+1)·h/N − 1), attention over those heads only, the output projection row-parallel
  (its input columns of the same heads);
* SwiGLU ``w2(silu(w1 x) * w3 x)``: w1, w3 column-parallel (d_ff/N output features each), w2
  row-parallel (the same d_ff/N input features).

Each sharded sublayer is wrapped in the conjugate pair of operators of Megatron-LM:
``f`` (identity forward, all-reduce of the input gradient in backward: each rank's column-parallel
projections see only part of the output, so the gradient w.r.t. their shared input is a sum over
ranks) and ``g`` (all-reduce of the row-parallel output's partial sums in forward, identity
backward). Two all-reduces per sublayer per pass, 4 per block per step, each of one
(batch, seq, d_model) activation — tp_calcs' volume (impl.parallelism_calcs).

The embedding, norms and LM head stay replicated. Every rank must get the same input batch: the
replicated layers then compute the same values and the same gradients on every rank, with no
gradient synchronisation (the ``f`` all-reduce already makes the residual stream's gradient whole).
Rank 0's parameters are broadcast first, so ranks may build the module from different seeds.

Instrumentation: ``forward_traffic`` / ``backward_traffic`` (impl.distributed.ring.Traffic) count
the all-reduces of each pass; with ``collectives="ring"`` they go through our send/recv ring, which
also counts the bytes each rank really sends. ``gather_full_params()`` (a collective) returns the
unsharded state dict under the original names, like FSDP's.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from impl.distributed.agreement import verify_module
from impl.distributed.release import Released
from torch import nn

from impl.distributed.ring import TorchCollectives, Traffic, make_collectives
from impl.model.layers import Linear, SwiGLU, silu
from impl.model.transformer import CausalSelfAttention, TransformerBlock

COLUMN, ROW = 0, 1  # the dimension of a Linear's (d_out, d_in) weight that a rank keeps a slice of


class _CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity forward; backward all-reduces the input gradient over the group."""

    @staticmethod
    def forward(ctx, x, comm: TorchCollectives):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad.contiguous().clone()), None


class _ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: forward all-reduces the partial outputs; identity backward."""

    @staticmethod
    def forward(ctx, x, comm: TorchCollectives):
        return comm.all_reduce(x.contiguous().clone())

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_parallel(x: torch.Tensor, comm: TorchCollectives) -> torch.Tensor:
    return _CopyToParallel.apply(x, comm)


def reduce_from_parallel(x: torch.Tensor, comm: TorchCollectives) -> torch.Tensor:
    return _ReduceFromParallel.apply(x, comm)


@torch.no_grad()
def shard_linear(layer: Linear, dim: int, rank: int, world: int) -> None:
    """Keep slice `rank` of `world` of the weight along `dim` (COLUMN: output features, ROW: input
    features), in place: the parameter keeps its name."""
    w = layer.weight
    layer.weight = nn.Parameter(w.chunk(world, dim)[rank].clone(), requires_grad=w.requires_grad)
    layer.d_out, layer.d_in = layer.weight.shape


class ParallelAttention(nn.Module):
    """CausalSelfAttention over num_heads / N local heads (same submodule names, sharded weights)."""

    def __init__(self, attn: CausalSelfAttention, rank: int, world: int, fwd: TorchCollectives,
                 bwd: TorchCollectives):
        super().__init__()
        self.head_dim = attn.q_proj.d_out // attn.num_heads
        self.num_heads = attn.num_heads // world  # local heads
        for name in ("q_proj", "k_proj", "v_proj"):
            shard_linear(getattr(attn, name), COLUMN, rank, world)
        shard_linear(attn.output_proj, ROW, rank, world)
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.output_proj = attn.output_proj
        self.attn_impl, self.attend = attn.attn_impl, attn.attend
        self._fwd, self._bwd = fwd, bwd

    def forward(self, x: torch.Tensor, rope, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h, hd = self.num_heads, self.head_dim
        x = copy_to_parallel(x, self._bwd)

        def heads(t):  # (b, s, h·hd) -> (b, h, s, hd)
            return t.view(b, s, h, hd).transpose(1, 2)

        q = rope(heads(self.q_proj(x)), positions)
        k = rope(heads(self.k_proj(x)), positions)
        v = heads(self.v_proj(x))
        o = self.attend(q, k, v, True)
        return reduce_from_parallel(self.output_proj(o.transpose(1, 2).reshape(b, s, h * hd)), self._fwd)


class ParallelSwiGLU(nn.Module):
    """SwiGLU with w1, w3 column-parallel and w2 row-parallel (same submodule names)."""

    def __init__(self, ffn: SwiGLU, rank: int, world: int, fwd: TorchCollectives, bwd: TorchCollectives):
        super().__init__()
        shard_linear(ffn.w1, COLUMN, rank, world)
        shard_linear(ffn.w3, COLUMN, rank, world)
        shard_linear(ffn.w2, ROW, rank, world)
        self.w1, self.w2, self.w3 = ffn.w1, ffn.w2, ffn.w3
        self._fwd, self._bwd = fwd, bwd

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_parallel(x, self._bwd)
        return reduce_from_parallel(self.w2(silu(self.w1(x)) * self.w3(x)), self._fwd)


# Which weights are sharded, by their name inside a block, and along which dimension.
BLOCK_SHARDING = {"attn.q_proj.weight": COLUMN, "attn.k_proj.weight": COLUMN, "attn.v_proj.weight": COLUMN,
                  "attn.output_proj.weight": ROW, "ffn.w1.weight": COLUMN, "ffn.w3.weight": COLUMN,
                  "ffn.w2.weight": ROW}


def _group_ranks(group) -> list[int]:
    return dist.get_process_group_ranks(group) if group is not None else list(range(dist.get_world_size()))


class TensorParallel(nn.Module):
    def __init__(self, module: nn.Module, group=None, collectives: str = "torch"):
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("TensorParallel needs an initialised default process group (dist.init_process_group)")
        if group is not None and not isinstance(group, dist.ProcessGroup):
            raise ValueError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
        # First: ranks whose modules disagree all raise here, before the checks that read the module.
        verify_module("TensorParallel", module, group)
        blocks = [(name, m) for name, m in module.named_modules() if isinstance(m, TransformerBlock)]
        if not blocks:
            raise ValueError("TensorParallel: the module has no impl.model TransformerBlock to shard")
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        for name, block in blocks:
            heads, d_ff = block.attn.num_heads, block.ffn.w1.d_out
            if heads % self.world_size or d_ff % self.world_size:
                raise ValueError(f"TensorParallel: block {name} has num_heads={heads} and d_ff={d_ff}; both must "
                                 f"be divisible by the group's world size {self.world_size}")
        self.module = module
        fwd, bwd = make_collectives(collectives, group), make_collectives(collectives, group)
        self.forward_traffic: Traffic = fwd.traffic
        self.backward_traffic: Traffic = bwd.traffic
        self._broadcast_from_first_rank()
        self._state_keys = list(module.state_dict().keys())
        self.sharded: dict[str, int] = {}  # state-dict key -> dimension it is sharded along
        for name, block in blocks:
            block.attn = ParallelAttention(block.attn, self.rank, self.world_size, fwd, bwd)
            block.ffn = ParallelSwiGLU(block.ffn, self.rank, self.world_size, fwd, bwd)
            prefix = f"{name}." if name else ""
            self.sharded.update({prefix + key: dim for key, dim in BLOCK_SHARDING.items()})

    @torch.no_grad()
    def _broadcast_from_first_rank(self) -> None:
        src = _group_ranks(self.group)[0]
        for t in list(self.module.parameters()) + list(self.module.buffers()):
            with Released() as keep:  # gloo's worker must let go first (impl.distributed.release)
                dist.broadcast(keep(t.data), src=src, group=self.group)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def reset_traffic(self) -> None:
        self.forward_traffic.reset()
        self.backward_traffic.reset()

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """The unsharded state dict (original keys and order). A collective over the group."""
        state = self.module.state_dict()
        out = {}
        for key in self._state_keys:
            t = state[key].detach()
            dim = self.sharded.get(key)
            if dim is None:
                out[key] = t.clone()
                continue
            parts = [torch.empty_like(t) for _ in range(self.world_size)]
            with Released() as keep:
                dist.all_gather([keep(p) for p in parts], keep(t.contiguous()), group=self.group)
            out[key] = torch.cat(parts, dim)
        return out
