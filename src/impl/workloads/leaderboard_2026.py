"""leaderboard (2026): one full training step of the 8B model (SPEC "leaderboard (2026)": zero_grad,
forward, cross-entropy summed over tokens, backward, AdamW step; context 32,768, batch 2, bf16,
causal, two GPUs), built for one rank.

The step is impl.workloads.steps.make_train_step's with: FlashAttention-2 (`flash_triton`, head dim
128), the Linear weights in bf16 with fp32 masters in AdamWMaster, the fused chunked LM head +
cross-entropy with reduction "sum" (full fp32 logits would be 32,768 × 2 × 151,936 × 4 B = 40 GB),
and activation checkpointing per block (impl.checkpointing). With a process group of world size
N > 1 it is data parallel: rank r takes its contiguous share batch/N of the global batch, the
gradients are summed over the ranks during backward (DDPBucketed with average=False: the loss is
a sum) and the optimizer states are sharded (ShardedOptimizer over AdamWMaster: each rank keeps
the masters and moments of the parameters it owns and broadcasts their new values). ZeRO-1's
reduce-scatter schedule does not compose with AdamWMaster (impl.distributed.sharded_optimizer).

`num_layers` below the config's gives the reduced-layer steps that one GPU can hold, from which
impl.leaderboard_prediction predicts the 34-layer step on two GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from impl.workloads.steps import TrainConfig, linear_weights, make_train_step, random_batch
from impl.checkpointing import POLICIES, apply_checkpointing
from impl.model import ModelConfig, TransformerLM, model_config

CONFIG = "8B"
CONTEXT = 32_768
BATCH = 2  # the global batch, over WORLD_SIZE ranks
WORLD_SIZE = 2


@dataclass(frozen=True)
class StepSpec:
    """What one leaderboard step is. Defaults: SPEC's (the 34-layer 8B model on two GPUs).

    config         a name of impl.model.MODEL_CONFIGS
    num_layers     None for the config's own; fewer for the reduced-layer runs
    batch          the global batch (sequences); each of N ranks takes batch / N
    context        tokens per sequence (the model's context_length too)
    checkpointing  impl.checkpointing policy: "none", "every_k" (with checkpoint_k) or "nested"
    attn_impl      "flash_triton" (ours); "flash_torch" for CPU checks in bf16, where the Triton
                   interpreter's bf16 dot is wrong
    """

    config: str = CONFIG
    num_layers: int | None = None
    batch: int = BATCH
    context: int = CONTEXT
    checkpointing: str = "every_k"
    checkpoint_k: int | None = 1
    attn_impl: str = "flash_triton"
    lr: float = 1e-4
    weight_decay: float = 0.01

    def __post_init__(self):
        model_config(self.config)  # a clear ValueError for an unknown name
        for name in ("num_layers", "batch", "context"):
            value = getattr(self, name)
            if value is None and name == "num_layers":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"StepSpec.{name} must be a positive int, got {value!r}")
        if self.checkpointing not in POLICIES:
            raise ValueError(f"StepSpec.checkpointing must be one of {POLICIES}, got {self.checkpointing!r}")
        k = self.checkpoint_k
        if (self.checkpointing == "every_k") != (k is not None) or \
                (k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1)):
            raise ValueError(f"StepSpec.checkpoint_k is given for checkpointing 'every_k' only (a positive int), "
                             f"got checkpointing={self.checkpointing!r}, checkpoint_k={k!r}")

    @property
    def model(self) -> ModelConfig:
        base = model_config(self.config)
        return base if self.num_layers is None else base.replace(num_layers=self.num_layers)

    def train_config(self, world_size: int) -> TrainConfig:
        """The step as a TrainConfig: bf16 weights, fp32 masters, fused LM head + summed loss."""
        distributed = world_size > 1
        return TrainConfig(dtype="bf16", weights="bf16", attn_impl=self.attn_impl,
                           optimizer="adamw_master_sharded" if distributed else "adamw_master",
                           fused_ce=True, loss="sum", grad_sync="ddp_bucketed" if distributed else "none")

    def flops(self, world_size: int = 1) -> float:
        """Model FLOPs of one rank's share of the step (impl.model.flops: matmuls, full attention square)."""
        return self.model.flops("train_step", local_batch(self.batch, world_size), self.context)


LEADERBOARD = StepSpec()


def local_batch(batch: int, world_size: int) -> int:
    """Sequences per rank: the global batch split evenly (a remainder would make the ranks' steps unequal)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if batch % world_size:
        raise ValueError(f"batch {batch} is not divisible by the world size {world_size}: every rank takes an "
                         "equal share of the global batch")
    return batch // world_size


@dataclass
class LeaderboardStep:
    """One rank's step: `step()` runs it and returns this rank's loss (summed over its tokens)."""

    spec: StepSpec
    step: Callable[[], torch.Tensor]
    model: TransformerLM
    optimizer: torch.optim.Optimizer
    x: torch.Tensor
    y: torch.Tensor
    rank: int
    world_size: int

    @property
    def tokens(self) -> int:
        return self.x.numel()


def _world(group) -> tuple[int, int]:
    if group is None:
        return 0, 1
    world_size = dist.get_world_size(group)
    if world_size != dist.get_world_size():
        raise ValueError(f"group: DDPBucketed and ShardedOptimizer work on the default process group; got a group "
                         f"of {world_size} ranks in a world of {dist.get_world_size()}")
    return dist.get_rank(group), world_size


def build_step(spec: StepSpec, device: torch.device, group=None, seed: int = 0) -> LeaderboardStep:
    """This rank's step. group: None for one process; else the default process group (every rank
    builds the same model from `seed` and the same global batch, and takes its share)."""
    rank, world_size = _world(group)
    per_rank = local_batch(spec.batch, world_size)
    torch.manual_seed(seed)
    model = TransformerLM(**spec.model, context_length=spec.context, attn_impl=spec.attn_impl, device=device)
    apply_checkpointing(model, spec.checkpointing, spec.checkpoint_k)
    x, y = random_batch(model, spec.batch, spec.context, device, seed=seed)
    x, y = x[rank * per_rank:(rank + 1) * per_rank], y[rank * per_rank:(rank + 1) * per_rank]
    step, optimizer = make_train_step(spec.train_config(world_size), model, x, y, lr=spec.lr,
                                      weight_decay=spec.weight_decay)
    return LeaderboardStep(spec, step, model, optimizer, x, y, rank, world_size)


def master_weights(built: LeaderboardStep) -> dict[str, torch.Tensor]:
    """Every parameter by name in fp32: the bf16 Linear weights' masters where this rank keeps them
    (all of them on one process, its own shard's on a rank of a sharded step), else the values."""
    opt = built.optimizer
    local = getattr(opt, "local_optimizer", opt)
    bf16 = {id(p) for p in linear_weights(built.model)}
    out = {}
    for name, p in built.model.named_parameters():
        has_master = id(p) in bf16 and "master_lo" in local.state.get(p, {})
        out[name] = local.master(p) if has_master else p.detach().float().clone()
    return out


__all__ = ["BATCH", "CONFIG", "CONTEXT", "LEADERBOARD", "LeaderboardStep", "StepSpec", "WORLD_SIZE", "build_step",
           "local_batch", "master_weights"]
