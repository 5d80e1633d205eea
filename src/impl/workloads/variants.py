"""The names a perf row's config carries (its variant, its step mode), each defined once with the
words a table shows for it. str-valued (StrEnum): a row's config serialises a member as its value,
so stored benchmark JSON and test ids read exactly as the plain strings did."""
from __future__ import annotations

from enum import StrEnum


class Labelled(StrEnum):
    """A StrEnum whose members are declared as (value, label)."""

    label: str

    def __new__(cls, value: str, label: str):
        member = str.__new__(cls, value)
        member._value_ = value
        member.label = label
        return member

    @classmethod
    def of(cls, name: str):
        """The member called `name`, or a ValueError listing the members: worker commands and
        wrappers are called with plain names too."""
        if name not in tuple(cls):
            raise ValueError(f"variant must be one of {[m.value for m in cls]}, got {name!r}")
        return cls(name)


class StepMode(Labelled):
    """What one timed call of benchmarking_script runs (impl.workloads.steps.make_step)."""

    FORWARD = "forward", "forward"
    BACKWARD = "backward", "backward"
    FORWARD_BACKWARD = "forward_backward", "forward+backward"
    OPTIMIZER_STEP = "optimizer_step", "optimizer step"
    TRAIN_STEP = "train_step", "training step"


class DDPVariant(Labelled):
    """ddp_benchmarking's rows, in run order (impl.workloads.dist_steps.ddp_wrapper)."""

    SINGLE = "single", "single GPU (floor, no wrapper)"
    NAIVE = "naive", "naive (per-parameter, after backward)"
    FLAT = "flat", "flat (one all-reduce)"
    INDIVIDUAL = "individual", "individual parameters (overlapped)"
    BUCKETED = "bucketed", "bucketed"
    TORCH_DDP = "torch_ddp", "torch DDP (bucket_cap_mb 25)"


class ShardVariant(Labelled):
    """optimizer_state_sharding_accounting's rows (impl.workloads.dist_steps.sharding)."""

    NONE = "none", "no sharding (DDP + AdamW)"
    SHARDED = "sharded", "ShardedOptimizer(AdamW)"
    ZERO1 = "zero1", "ZeRO1Optimizer(AdamW)"
    TORCH_ZERO = "torch_zero", "torch ZeroRedundancyOptimizer(AdamW)"


class FSDPVariant(Labelled):
    """The fsdp section's rows, in run order: the target's pair (ours per block vs fully_shard, bf16)
    first, so a budget cut drops the fp32 and DDP reference rows, not the comparison
    (impl.workloads.fsdp_steps.fsdp_wrapper)."""

    FSDP_BLOCK_BF16 = "fsdp_block_bf16", "FSDP (ours), bf16 compute, a unit per block"
    TORCH_FSDP_BF16 = "torch_fsdp_bf16", "torch fully_shard, bf16"
    FSDP_BLOCK_BF16_RS1 = ("fsdp_block_bf16_rs1",
                           "FSDP (ours), bf16 compute, a unit per block, one reduce-scatter in flight")
    FSDP_BF16 = "fsdp_bf16", "FSDP (ours), bf16 compute"
    TORCH_FSDP = "torch_fsdp", "torch fully_shard, fp32"
    FSDP = "fsdp", "FSDP (ours), fp32"
    DDP = "ddp", "DDPBucketed 100 MB (ours)"

    @property
    def ours(self) -> bool:
        """Our FSDP: the rows with an instrumented step (the collective timeline)."""
        return self in (FSDPVariant.FSDP, FSDPVariant.FSDP_BF16, FSDPVariant.FSDP_BLOCK_BF16,
                        FSDPVariant.FSDP_BLOCK_BF16_RS1)


__all__ = ["DDPVariant", "FSDPVariant", "Labelled", "ShardVariant", "StepMode"]
