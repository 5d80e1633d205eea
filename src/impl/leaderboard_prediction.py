"""leaderboard (2026): the 34-layer 8B step on two GPUs predicted from one-GPU runs of the same step
with fewer layers (perf/test_leaderboard_2026.py, one rank's share of the batch). Pure: the caller
passes the runs and the bus bandwidth; nothing here reads files or measures.

Model of the two-GPU step (impl.workloads.leaderboard_2026's: data parallel, DDPBucketed summing the
gradients, ShardedOptimizer over AdamWMaster):
  compute    a + b·L fitted to the one-GPU step times at L layers (least squares), at L = 34. It
             includes the optimizer step over every parameter; sharded, each rank steps half of
             them, so this overstates the step by half an optimizer step (its share is not timed apart)
  gradients  ring all-reduce of Ψ gradient bytes (bf16 Linear weights, fp32 embedding and gains):
             2(N−1)/N · Ψ / W, W the all-reduce bus bandwidth (nccl-tests convention)
  params     ShardedOptimizer broadcasts each owner's updated parameters, one owner after another:
             each broadcast of Ψ/N bytes crosses the links at W, Ψ / W in all (no all-reduce measures
             a broadcast; W is the all-reduce's bus bandwidth, stated as such)
  total      compute + gradients + params with nothing overlapped (an upper bound); DDPBucketed
             all-reduces buckets during backward, so the gradients' time may hide: `overlapped`
Memory per rank: c + d·L fitted to the one-GPU peaks, at L = 34, minus the optimizer state of the
parameters the other ranks own ((N−1)/N of it), plus DDPBucketed's buckets (one copy of Ψ), plus the
flat message of one owner's parameters that ShardedOptimizer broadcasts while the gradients are
still alive (Ψ/N; parameters and gradients have the same dtypes, so Ψ counts both).
grad_sync_cost: what each StepSpec.grad_sync costs a rank in bytes sent and gradient memory (the
all-reduce above, or each gradient reduced only to its owner), from the parameter split alone.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from impl.model import ModelConfig
from impl.parallelism_calcs import ring_all_reduce_time

# AdamWMaster: per bf16 Linear weight 2 B of master remainder + fp32 moments; per fp32 parameter
# (embedding, RMSNorm gains) the two fp32 moments (impl.model.adamw_master)
STATE_BYTES_BF16, STATE_BYTES_FP32 = 2 + 4 + 4, 4 + 4


@dataclass(frozen=True)
class LayerRun:
    """One measured one-GPU step: its layer count, median step time and CUDA peak allocation."""

    layers: int
    step_s: float
    peak_bytes: float | None = None


@dataclass(frozen=True)
class LinearFit:
    """y = intercept + slope · x, least squares over `points` runs."""

    intercept: float
    slope: float
    points: int

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> LinearFit:
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError(f"fit_line needs matching lists with at least two distinct layer counts, got {list(xs)}")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return LinearFit(my - slope * mx, slope, n)


@dataclass(frozen=True)
class ParamSplit:
    """The model's parameters by the dtype the leaderboard step stores them in."""

    bf16: int  # every Linear weight, the LM head included
    fp32: int  # the embedding and the RMSNorm gains

    @property
    def grad_bytes(self) -> int:
        return 2 * self.bf16 + 4 * self.fp32

    @property
    def optimizer_state_bytes(self) -> int:
        return STATE_BYTES_BF16 * self.bf16 + STATE_BYTES_FP32 * self.fp32


def param_split(config: ModelConfig) -> ParamSplit:
    d, L = config.d_model, config.num_layers
    bf16 = L * (4 * d * d + 3 * d * config.d_ff) + config.vocab_size * d
    return ParamSplit(bf16=bf16, fp32=config.params - bf16)


@dataclass(frozen=True)
class GradSyncCost:
    """What one step's gradient sync costs a rank (impl.workloads.leaderboard_2026's StepSpec.grad_sync),
    from the parameter split alone, ownership balanced (ShardedOptimizer's greedy split: within one
    parameter of Ψ/N). Bytes on the wire by the ring algorithms (nccl-tests' convention).

    sent_bytes           sent by each rank: a ring all-reduce sends 2(N−1)/N · Ψ; a ring reduce to
                         each bucket's owner sends the bucket once from every rank but its owner, (N−1)/N · Ψ
    persistent_bytes     gradient memory kept across steps: DDPBucketed's buckets (Ψ); none for
                         DDPReduceToOwner (its buckets live within a step)
    after_backward_bytes gradient memory when backward ends: the grads and the buckets (2Ψ); the
                         owned buckets (Ψ/N), the others freed as their reduces complete
    """

    grad_sync: str
    sent_bytes: float
    persistent_bytes: float
    after_backward_bytes: float


def grad_sync_cost(config: ModelConfig, grad_sync: str, world_size: int = 2) -> GradSyncCost:
    psi, n = param_split(config).grad_bytes, world_size
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"world_size must be an int >= 2, got {world_size!r}")
    if grad_sync == "ddp_bucketed":
        return GradSyncCost(grad_sync, 2 * (n - 1) / n * psi, float(psi), 2.0 * psi)
    if grad_sync == "reduce_to_owner":
        return GradSyncCost(grad_sync, (n - 1) / n * psi, 0.0, psi / n)
    raise ValueError(f"grad_sync must be 'ddp_bucketed' or 'reduce_to_owner', got {grad_sync!r}")


@dataclass(frozen=True)
class StepPrediction:
    layers: int
    world_size: int
    bus_bandwidth: float  # bytes/s
    time_fit: LinearFit  # seconds per one-GPU step at L layers
    memory_fit: LinearFit | None  # peak bytes at L layers (None: no peaks in the runs)
    params: ParamSplit
    compute_s: float
    grad_allreduce_s: float
    param_broadcast_s: float

    @property
    def total_s(self) -> float:
        """Nothing overlapped: an upper bound."""
        return self.compute_s + self.grad_allreduce_s + self.param_broadcast_s

    @property
    def overlapped_s(self) -> float:
        """The gradients' all-reduce hidden behind backward."""
        return self.compute_s + self.param_broadcast_s

    @property
    def one_gpu_peak_bytes(self) -> float | None:
        return None if self.memory_fit is None else self.memory_fit.at(self.layers)

    @property
    def sharded_state_saving_bytes(self) -> float:
        return (self.world_size - 1) / self.world_size * self.params.optimizer_state_bytes

    @property
    def bucket_bytes(self) -> float:
        return float(self.params.grad_bytes)

    @property
    def broadcast_bytes(self) -> float:
        """The flat copy of one owner's parameters during ShardedOptimizer's broadcast (module doc)."""
        return self.params.grad_bytes / self.world_size

    @property
    def per_rank_peak_bytes(self) -> float | None:
        one = self.one_gpu_peak_bytes
        return None if one is None else (one - self.sharded_state_saving_bytes + self.bucket_bytes
                                         + self.broadcast_bytes)


def predict_step(runs: Sequence[LayerRun], config: ModelConfig, bus_bandwidth: float,
                 world_size: int = 2) -> StepPrediction:
    """The step of `config` (its own num_layers) on `world_size` GPUs from one-GPU `runs` of the same
    step with fewer layers at one rank's share of the batch (module doc). bus_bandwidth: the
    all-reduce bus bandwidth measured on those GPUs, bytes/s."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2 (the prediction adds communication), got {world_size!r}")
    if isinstance(bus_bandwidth, bool) or not isinstance(bus_bandwidth, (int, float)) \
            or not math.isfinite(bus_bandwidth) or bus_bandwidth <= 0:
        raise ValueError(f"bus_bandwidth must be a positive finite number of bytes/s, got {bus_bandwidth!r}")
    for r in runs:
        if r.layers < 1 or not r.step_s > 0:
            raise ValueError(f"runs: every run needs layers >= 1 and step_s > 0, got {r}")
    time_fit = fit_line([r.layers for r in runs], [r.step_s for r in runs])
    peaks = [r for r in runs if r.peak_bytes is not None]
    memory_fit = fit_line([r.layers for r in peaks], [r.peak_bytes for r in peaks]) \
        if len({r.layers for r in peaks}) >= 2 else None
    params = param_split(config)
    return StepPrediction(
        layers=config.num_layers, world_size=world_size, bus_bandwidth=float(bus_bandwidth), time_fit=time_fit,
        memory_fit=memory_fit, params=params, compute_s=time_fit.at(config.num_layers),
        grad_allreduce_s=ring_all_reduce_time(params.grad_bytes, world_size, bus_bandwidth),
        param_broadcast_s=params.grad_bytes / bus_bandwidth)


__all__ = ["GradSyncCost", "LayerRun", "LinearFit", "ParamSplit", "StepPrediction", "fit_line", "grad_sync_cost",
           "param_split", "predict_step"]
