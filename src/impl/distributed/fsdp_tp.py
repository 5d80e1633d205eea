"""2-D parallelism (FSDP × TP) of one SwiGLU FFN, the model of fsdp_tp_calcs.

The world is an N_FSDP × N_TP mesh, rank = fsdp_index · N_TP + tp_index: each row of N_TP ranks is
a tensor-parallel group, each column of N_FSDP ranks an FSDP group. For ``w2(silu(w1 x) * w3 x)``
(impl.model.SwiGLU; Linear weights are (d_out, d_in)):

* TP inside a row, as impl.distributed.tensor_parallel: w1, w3 column-parallel (d_ff/N_TP output
  features), w2 row-parallel, ``f`` before the FFN, ``g`` (all-reduce of y) after it;
* FSDP across rows: each TP slice is sharded again along the dimension TP did not shard, d_model
  (w1, w3: input features; w2: output features), so a rank stores 1/(N_TP·N_FSDP) of each weight.
  Each linear all-gathers its weight over the column just before use and frees it; backward
  all-gathers it again and reduce-scatters the weight gradient over the column (fsdp_calcs'
  schedule). The batch is sharded over the FSDP axis: row i gets batch slice i, the same on every
  rank of the row.

The weight gradients are summed over the FSDP axis, i.e. they are the gradients of the sum of the
rows' losses (use a loss summed over the global batch, or divide). Traffic per axis and pass is
counted (``traffic``: impl.distributed.ring.Traffic per (axis, pass)); with ``collectives="ring"``
the bytes each rank sends are counted too, to compare with fsdp_tp_calcs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from impl.distributed.agreement import verify_module
from impl.distributed.release import Released
from torch import nn

from impl.distributed.ring import TorchCollectives, Traffic, make_collectives
from impl.distributed.tensor_parallel import COLUMN, ROW, copy_to_parallel, reduce_from_parallel
from impl.model.layers import SwiGLU, silu


@dataclass
class Mesh2D:
    """This rank's place in an N_FSDP × N_TP mesh and the two process groups through it."""
    n_tp: int
    n_fsdp: int
    tp_index: int
    fsdp_index: int
    tp_group: dist.ProcessGroup
    fsdp_group: dist.ProcessGroup


def make_mesh(n_tp: int, n_fsdp: int) -> Mesh2D:
    """Build the row (TP) and column (FSDP) groups; every rank of the world must call it."""
    world = dist.get_world_size()
    if not (isinstance(n_tp, int) and isinstance(n_fsdp, int) and n_tp >= 1 and n_fsdp >= 1):
        raise ValueError(f"n_tp and n_fsdp must be positive ints, got n_tp={n_tp!r}, n_fsdp={n_fsdp!r}")
    if n_tp * n_fsdp != world:
        raise ValueError(f"n_tp·n_fsdp must equal the world size {world}, got n_tp={n_tp}, n_fsdp={n_fsdp}")
    rank = dist.get_rank()
    tp_group = fsdp_group = None
    # new_group is collective: every rank creates every group, in the same order.
    for i in range(n_fsdp):
        g = dist.new_group([i * n_tp + j for j in range(n_tp)])
        if rank // n_tp == i:
            tp_group = g
    for j in range(n_tp):
        g = dist.new_group([i * n_tp + j for i in range(n_fsdp)])
        if rank % n_tp == j:
            fsdp_group = g
    return Mesh2D(n_tp, n_fsdp, rank % n_tp, rank // n_tp, tp_group, fsdp_group)


def _gather_along(comm: TorchCollectives, shard: torch.Tensor, dim: int) -> torch.Tensor:
    """All-gather equal shards over comm's group and concatenate them along `dim`."""
    flat = comm.all_gather(shard.contiguous())
    return torch.cat(flat.view(comm.size, *shard.shape).unbind(0), dim)


def _scatter_along(comm: TorchCollectives, full: torch.Tensor, dim: int) -> torch.Tensor:
    """Reduce-scatter (sum) `full` split along `dim`: this rank's slice of the sum."""
    parts = torch.stack(full.chunk(comm.size, dim))
    return comm.reduce_scatter(parts).view(parts.shape[1:])


class _FSDPLinear(torch.autograd.Function):
    """y = x Wᵀ with W all-gathered along `dim` over the FSDP group for the forward and again for
    the backward (not kept in between), its gradient reduce-scattered back to the shard."""

    @staticmethod
    def forward(ctx, x, shard, dim: int, fwd: TorchCollectives, bwd: TorchCollectives):
        ctx.save_for_backward(x, shard)
        ctx.dim, ctx.bwd = dim, bwd
        return x @ _gather_along(fwd, shard.detach(), dim).t()

    @staticmethod
    def backward(ctx, grad):
        x, shard = ctx.saved_tensors
        w = _gather_along(ctx.bwd, shard.detach(), ctx.dim)
        grad_x = grad @ w
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ x.reshape(-1, x.shape[-1])
        return grad_x, _scatter_along(ctx.bwd, grad_w, ctx.dim), None, None, None


# The dimension FSDP shards each weight along: the one TP did not shard.
FSDP_DIM = {"w1": ROW, "w3": ROW, "w2": COLUMN}
TP_DIM = {"w1": COLUMN, "w3": COLUMN, "w2": ROW}
AXES, PASSES = ("fsdp", "tp"), ("forward", "backward")


class FSDPTPFeedForward(nn.Module):
    """A SwiGLU FFN sharded over `mesh`. Parameters: ``w1``, ``w2``, ``w3``, this rank's
    (TP slice, FSDP shard) block of each weight. Input: this row's slice of the batch."""

    def __init__(self, ffn: SwiGLU, mesh: Mesh2D, collectives: str = "torch"):
        super().__init__()
        # Every rank cuts its block from its own copy of the full FFN (nothing is broadcast): the
        # whole mesh (the world) must hold the same one.
        verify_module("FSDPTPFeedForward", ffn)
        d_ff, d_model = ffn.w1.weight.shape
        if d_ff % mesh.n_tp or d_model % mesh.n_fsdp:
            raise ValueError(f"FSDPTPFeedForward: d_ff={d_ff} must be divisible by n_tp={mesh.n_tp} and "
                             f"d_model={d_model} by n_fsdp={mesh.n_fsdp}")
        self.mesh = mesh
        self.comm = {(axis, phase): make_collectives(collectives, mesh.tp_group if axis == "tp" else mesh.fsdp_group)
                     for axis in AXES for phase in PASSES}
        self.traffic: dict[tuple[str, str], Traffic] = {k: c.traffic for k, c in self.comm.items()}
        for name in ("w1", "w2", "w3"):
            self.register_parameter(name, nn.Parameter(self.shard_of(getattr(ffn, name).weight.detach(), name)))

    def shard_of(self, full: torch.Tensor, name: str) -> torch.Tensor:
        """This rank's block of a full (d_out, d_in) weight (or of its gradient)."""
        m = self.mesh
        tp_slice = full.chunk(m.n_tp, TP_DIM[name])[m.tp_index]
        return tp_slice.chunk(m.n_fsdp, FSDP_DIM[name])[m.fsdp_index].clone()

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return _FSDPLinear.apply(x, getattr(self, name), FSDP_DIM[name], self.comm["fsdp", "forward"],
                                 self.comm["fsdp", "backward"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_parallel(x, self.comm["tp", "backward"])
        z = silu(self._linear(x, "w1")) * self._linear(x, "w3")
        return reduce_from_parallel(self._linear(z, "w2"), self.comm["tp", "forward"])

    def reset_traffic(self) -> None:
        for t in self.traffic.values():
            t.reset()

    @torch.no_grad()
    def gather_full_params(self) -> dict[str, torch.Tensor]:
        """name -> full weight, gathered over both axes (a collective over the world; uncounted)."""
        out = {}
        for name in ("w1", "w2", "w3"):
            out[name] = self._gather_plain(self._gather_plain(getattr(self, name), FSDP_DIM[name],
                                                              self.mesh.fsdp_group), TP_DIM[name], self.mesh.tp_group)
        return out

    @staticmethod
    def _gather_plain(t: torch.Tensor, dim: int, group) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        with Released() as keep:  # gloo's worker must let go first (impl.distributed.release)
            dist.all_gather([keep(p) for p in parts], keep(t.contiguous()), group=group)
        return torch.cat(parts, dim)
