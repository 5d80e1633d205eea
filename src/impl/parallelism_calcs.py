"""The 2026 edition's parallelism calculations (SPEC, "The course's 2026 edition"), closed form.

Setting (the assignment's): N devices, each pair linked, each device with egress bandwidth W bytes/s
and compute C FLOP/s; communication overlaps compute, so a pass is communication-bound when its
communication time exceeds its compute time. Values are p = 2 bytes (FP16 weights, activations and
the gradients sent). The model is one SwiGLU-style FFN on a batch of B tokens:

    x (B, D);  x1 = x W1,  x2 = x W2  (W1, W2: D × D_FF);  z = f(x1) ∗ x2;  y = z W3  (W3: D_FF × D)

FLOPs: a (m, k) × (k, n) matmul is 2·m·k·n; elementwise work (f, ∗) is ignored. Forward = 3
matmuls = 6·B·D·D_FF. Backward = two matmuls per forward matmul (the input gradient and the weight
gradient) = 12·B·D·D_FF; dx is counted because a block inside a model must pass it on (for a lone
FFN whose x is data it would be 8·B·D·D_FF). B is the global batch; "per device" values are what
one device computes or sends.

Every quantity is a `Formula`: a documented Python function (the value) with its symbolic form
beside it (`.symbolic`), so a report page can print both. `*_calcs` functions return one typed
record per problem whose fields are `Answer`s (part, formula, value); `*_bounds` evaluate the
largest device counts for given C and W (a table per device: H100/H200 figures, TPU v5p).

Ring collectives (the assignment's costs; impl.distributed.ring implements them with send/recv and
counts the bytes, and correctness/test_parallelism_calcs.py checks the counts against these):
  all-gather, reduce-scatter of S bytes: N−1 steps of S/N bytes per device → (N−1)/N · S / W
  all-reduce = reduce-scatter + all-gather: 2(N−1) steps → 2(N−1)/N · S / W
Pure Python, no torch.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable

FP16 = 2  # bytes per value in the problems' setting


@dataclass(frozen=True)
class Formula:
    """A closed-form quantity: `fn` computes it, `symbolic` is how the page writes it (p = bytes per
    value, 2 here), `unit` what it measures."""
    name: str
    symbolic: str
    unit: str
    fn: Callable[..., float]

    def __call__(self, *args, **kwargs) -> float:
        return self.fn(*args, **kwargs)

    @property
    def doc(self) -> str:
        return self.fn.__doc__ or ""


def formula(symbolic: str, unit: str) -> Callable[[Callable[..., float]], Formula]:
    def wrap(fn: Callable[..., float]) -> Formula:
        return Formula(fn.__name__, symbolic, unit, fn)
    return wrap


@dataclass(frozen=True)
class Answer:
    """One part of a problem's answer: its label, its formula and the value at the given inputs."""
    part: str
    formula: Formula
    value: float

    @property
    def symbolic(self) -> str:
        return self.formula.symbolic

    @property
    def unit(self) -> str:
        return self.formula.unit


def answers(record) -> list[Answer]:
    """The Answers of a *_calcs / *_bounds record, in field order (for a page's table)."""
    return [getattr(record, f.name) for f in dataclasses.fields(record)]


def _check(**kwargs: float) -> None:
    for name, v in kwargs.items():
        if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")


def _check_n(**kwargs: float) -> None:
    for name, v in kwargs.items():
        if not (isinstance(v, (int, float)) and v >= 1 and math.isfinite(v)):
            raise ValueError(f"{name} (a device count) must be a finite number >= 1, got {v!r}")


# ----------------------------------------------------------------------------------------------
# Ring collectives: bytes each device sends, steps, time


@formula("(N−1)/N · S", "bytes")
def ring_all_gather_bytes(S: float, N: float) -> float:
    """Per device: N−1 steps, each forwarding one S/N chunk to the next device."""
    return (N - 1) / N * S


@formula("(N−1)/N · S", "bytes")
def ring_reduce_scatter_bytes(S: float, N: float) -> float:
    """Per device: N−1 steps, each sending one partially reduced S/N chunk to the next device."""
    return (N - 1) / N * S


@formula("2(N−1)/N · S", "bytes")
def ring_all_reduce_bytes(S: float, N: float) -> float:
    """Reduce-scatter then all-gather: 2(N−1) steps of S/N bytes per device."""
    return 2 * (N - 1) / N * S


@formula("(N−1) · S", "bytes")
def alternate_ring_all_reduce_bytes(S: float, N: float) -> float:
    """Per device: N−1 steps, each sending a whole S-byte input (not a chunk)."""
    return (N - 1) * S


RING_STEPS = {"all_gather": lambda n: n - 1, "reduce_scatter": lambda n: n - 1,
              "all_reduce": lambda n: 2 * (n - 1), "alternate_all_reduce": lambda n: n - 1}


@formula("(N−1)/N · S / W", "s")
def ring_all_gather_time(S: float, N: float, W: float) -> float:
    """The assignment's ring all-gather cost: each device's egress carries (N−1)/N · S bytes."""
    return ring_all_gather_bytes(S, N) / W


@formula("(N−1)/N · S / W", "s")
def ring_reduce_scatter_time(S: float, N: float, W: float) -> float:
    return ring_reduce_scatter_bytes(S, N) / W


@formula("2(N−1)/N · S / W", "s")
def ring_all_reduce_time(S: float, N: float, W: float) -> float:
    return ring_all_reduce_bytes(S, N) / W


@formula("(N−1) · S / W", "s")
def alternate_ring_all_reduce_time(S: float, N: float, W: float) -> float:
    """alternate_ring_all_reduce: at step t = 1…N−1 device i sends the whole input x^((i−t+1) mod N)
    (S bytes) to device i+1 while receiving x^((i−t) mod N) from device i−1 and adding it. The N
    sends of a step run in parallel on distinct links, each limited by its sender's egress W, so a
    step takes S/W and the N−1 steps (N−1)·S/W. After them device i has added every other input
    exactly once (x^(i−1), x^(i−2), …, x^(i+1)): a correct all-reduce, but each device sends N−1
    whole inputs where the chunked ring sends 2(N−1) chunks of S/N: N/2 times slower (equal at N = 2,
    where both send S)."""
    return alternate_ring_all_reduce_bytes(S, N) / W


# ----------------------------------------------------------------------------------------------
# FLOPs of the FFN (the model of every problem)


@formula("6·B·D·D_FF / N", "FLOP")
def ffn_forward_flops(B: float, D: float, D_FF: float, N: float = 1) -> float:
    """Per device when the work is split evenly over N devices (batch or weight shards)."""
    return 6 * B * D * D_FF / N


@formula("12·B·D·D_FF / N", "FLOP")
def ffn_backward_flops(B: float, D: float, D_FF: float, N: float = 1) -> float:
    """dz = dy W3ᵀ, dW3 = zᵀ dy, dW1 = xᵀ dx1, dW2 = xᵀ dx2, dx = dx1 W1ᵀ + dx2 W2ᵀ: six matmuls."""
    return 12 * B * D * D_FF / N


# ----------------------------------------------------------------------------------------------
# data_parallel_calcs


@formula("2(N_DP−1)/N_DP · 3·p·D·D_FF / W", "s")
def dp_backward_comm_time(D: float, D_FF: float, N: float, W: float, p: int = FP16) -> float:
    """All-reduce of the three weight gradients (3·D·D_FF values of p bytes) in the backward."""
    return ring_all_reduce_time(3 * p * D * D_FF, N, W)


@formula("1 + 2·B·W / (p·C)", "devices")
def dp_max_devices(B: float, C: float, W: float, p: int = FP16) -> float:
    """Backward not communication-bound ⇔ 2(N−1)/N · 3pD·D_FF/W ≤ 12·B·D·D_FF/(N·C)
    ⇔ N − 1 ≤ 2·B·W/(p·C) (= B·W/C at p = 2). D and D_FF cancel: both sides scale with the
    weights. Per device that is B/N ≥ (C/W)·(N−1)/N tokens: about C/W tokens per device."""
    return 1 + 2 * B * W / (p * C)


@dataclass(frozen=True)
class DataParallelCalcs:
    backward_flops: Answer
    backward_comm_time: Answer
    max_devices: Answer


def data_parallel_calcs(B: float, D: float, D_FF: float, N: float, C: float, W: float,
                        p: int = FP16) -> DataParallelCalcs:
    """N data-parallel devices, B/N tokens each, gradients all-reduced in the backward."""
    _check(B=B, D=D, D_FF=D_FF, C=C, W=W)
    _check_n(N=N)
    return DataParallelCalcs(
        backward_flops=Answer("(a) backward FLOPs per device", ffn_backward_flops, ffn_backward_flops(B, D, D_FF, N)),
        backward_comm_time=Answer("(b) backward communication time", dp_backward_comm_time,
                                  dp_backward_comm_time(D, D_FF, N, W, p)),
        max_devices=Answer("(c) largest N_DP before the backward is communication-bound", dp_max_devices,
                           dp_max_devices(B, C, W, p)),
    )


# ----------------------------------------------------------------------------------------------
# fsdp_calcs


@formula("(N_FSDP−1)/N_FSDP · 3·p·D·D_FF / W", "s")
def fsdp_forward_comm_time(D: float, D_FF: float, N: float, W: float, p: int = FP16) -> float:
    """All-gather of the three weights (shards of D·D_FF/N values each) before the forward."""
    return ring_all_gather_time(3 * p * D * D_FF, N, W)


@formula("2(N_FSDP−1)/N_FSDP · 3·p·D·D_FF / W", "s")
def fsdp_backward_comm_time(D: float, D_FF: float, N: float, W: float, p: int = FP16) -> float:
    """All-gather of the weights again, then reduce-scatter of their gradients: the same volume as
    DP's all-reduce."""
    s = 3 * p * D * D_FF
    return ring_all_gather_time(s, N, W) + ring_reduce_scatter_time(s, N, W)


@formula("1 + 2·B·W / (p·C)", "devices")
def fsdp_max_devices(B: float, C: float, W: float, p: int = FP16) -> float:
    """Forward: (N−1)/N · 3pD·D_FF/W ≤ 6·B·D·D_FF/(N·C); backward: twice both sides. Either way
    N − 1 ≤ 2·B·W/(p·C): FSDP's bound is DP's (it sends 1.5× DP's bytes but the forward adds
    half of the compute to hide them in)."""
    return 1 + 2 * B * W / (p * C)


@dataclass(frozen=True)
class ShardedCalcs:
    """The answers of fsdp_calcs and tp_calcs: both shard across N devices and ask the same six
    questions (FLOPs, communication time and the largest N, forward and backward)."""

    forward_flops: Answer
    backward_flops: Answer
    forward_comm_time: Answer
    backward_comm_time: Answer
    max_devices_forward: Answer
    max_devices_backward: Answer


def fsdp_calcs(B: float, D: float, D_FF: float, N: float, C: float, W: float, p: int = FP16) -> ShardedCalcs:
    """N FSDP devices: batch, weights, gradients and optimizer state sharded (B/N tokens each)."""
    _check(B=B, D=D, D_FF=D_FF, C=C, W=W)
    _check_n(N=N)
    bound = fsdp_max_devices(B, C, W, p)
    return ShardedCalcs(
        forward_flops=Answer("(a) forward FLOPs per device", ffn_forward_flops, ffn_forward_flops(B, D, D_FF, N)),
        backward_flops=Answer("(a) backward FLOPs per device", ffn_backward_flops,
                              ffn_backward_flops(B, D, D_FF, N)),
        forward_comm_time=Answer("(b) forward communication time", fsdp_forward_comm_time,
                                 fsdp_forward_comm_time(D, D_FF, N, W, p)),
        backward_comm_time=Answer("(b) backward communication time", fsdp_backward_comm_time,
                                  fsdp_backward_comm_time(D, D_FF, N, W, p)),
        max_devices_forward=Answer("(c) largest N_FSDP, forward", fsdp_max_devices, bound),
        max_devices_backward=Answer("(c) largest N_FSDP, backward", fsdp_max_devices, bound),
    )


# ----------------------------------------------------------------------------------------------
# tp_calcs

TP_BACKWARD_EQUATIONS = """\
Device i holds W1_i, W2_i (D × D_FF/N, columns i of W1, W2), W3_i (D_FF/N × D, rows i of W3) and the
whole x (B × D). Forward: x1_i = x W1_i, x2_i = x W2_i, z_i = f(x1_i) ∗ x2_i, y = all-reduce_i(z_i W3_i).
Backward, given dy (B × D, the same on every device: the all-reduce's gradient is the identity):
  dz_i  = dy W3_iᵀ                                  (B × D_FF/N)       2·B·D·D_FF/N FLOP
  dW3_i = z_iᵀ dy                                   (D_FF/N × D)       2·B·D·D_FF/N
  dx1_i = dz_i ∗ x2_i ∗ f'(x1_i),  dx2_i = dz_i ∗ f(x1_i)              elementwise
  dW1_i = xᵀ dx1_i,  dW2_i = xᵀ dx2_i               (D × D_FF/N)       2 · 2·B·D·D_FF/N
  dx    = all-reduce_i(dx1_i W1_iᵀ + dx2_i W2_iᵀ)   (B × D)            2 · 2·B·D·D_FF/N + all-reduce
The weight gradients stay local (each device owns its shard and sees the whole batch): the one
collective of the backward is the all-reduce of dx (Megatron-LM's "f" operator: identity forward,
all-reduce backward, conjugate to the forward's "g" on y)."""


@formula("2(N_TP−1)/N_TP · p·B·D / W", "s")
def tp_forward_comm_time(B: float, D: float, N: float, W: float, p: int = FP16) -> float:
    """All-reduce of y (B × D) after the row-parallel W3."""
    return ring_all_reduce_time(p * B * D, N, W)


@formula("2(N_TP−1)/N_TP · p·B·D / W", "s")
def tp_backward_comm_time(B: float, D: float, N: float, W: float, p: int = FP16) -> float:
    """All-reduce of dx (B × D), the sum of the column-parallel layers' partial input gradients."""
    return ring_all_reduce_time(p * B * D, N, W)


@formula("4·L·p·B·D", "bytes")
def tp_step_allreduce_payload(B: float, D: float, L: float, p: int = FP16) -> float:
    """The activation bytes a TP training step hands to its all-reduces (each device): every one of the
    L blocks has two sublayers (attention, FFN) that each all-reduce one B × D activation in forward
    (y) and one in backward (dx). The ring moves 2(N−1)/N of it per device (ring_all_reduce_bytes)."""
    return 4 * L * p * B * D


@formula("1 + 3·D_FF·W / (p·C)", "devices")
def tp_max_devices_forward(D_FF: float, C: float, W: float, p: int = FP16) -> float:
    """2(N−1)/N · p·B·D/W ≤ 6·B·D·D_FF/(N·C) ⇔ N − 1 ≤ 3·D_FF·W/(p·C). B and D cancel: TP's bound
    is set by the width of the layer, not the batch."""
    return 1 + 3 * D_FF * W / (p * C)


@formula("1 + 6·D_FF·W / (p·C)", "devices")
def tp_max_devices_backward(D_FF: float, C: float, W: float, p: int = FP16) -> float:
    """The same all-reduce volume against twice the compute: N − 1 ≤ 6·D_FF·W/(p·C)."""
    return 1 + 6 * D_FF * W / (p * C)


def tp_calcs(B: float, D: float, D_FF: float, N: float, C: float, W: float, p: int = FP16) -> ShardedCalcs:
    """N tensor-parallel devices, W1, W2 column-parallel, W3 row-parallel, the whole batch on each.
    (a), the backward equations, is TP_BACKWARD_EQUATIONS."""
    _check(B=B, D=D, D_FF=D_FF, C=C, W=W)
    _check_n(N=N)
    return ShardedCalcs(
        forward_flops=Answer("(b) forward FLOPs per device", ffn_forward_flops, ffn_forward_flops(B, D, D_FF, N)),
        backward_flops=Answer("(b) backward FLOPs per device", ffn_backward_flops,
                              ffn_backward_flops(B, D, D_FF, N)),
        forward_comm_time=Answer("(c) forward communication time", tp_forward_comm_time,
                                 tp_forward_comm_time(B, D, N, W, p)),
        backward_comm_time=Answer("(c) backward communication time", tp_backward_comm_time,
                                  tp_backward_comm_time(B, D, N, W, p)),
        max_devices_forward=Answer("(d) largest N_TP, forward", tp_max_devices_forward,
                                   tp_max_devices_forward(D_FF, C, W, p)),
        max_devices_backward=Answer("(d) largest N_TP, backward", tp_max_devices_backward,
                                    tp_max_devices_backward(D_FF, C, W, p)),
    )


# ----------------------------------------------------------------------------------------------
# fsdp_tp_calcs: N = N_TP · N_FSDP; forward only


@formula("6·B·D·D_FF / (N_TP·N_FSDP)", "FLOP")
def fsdp_tp_forward_flops(B: float, D: float, D_FF: float, N_TP: float, N_FSDP: float) -> float:
    """B/N_FSDP tokens per device, D_FF/N_TP of each weight's width."""
    return ffn_forward_flops(B, D, D_FF, N_TP * N_FSDP)


@formula("(N_FSDP−1)/N_FSDP · 3·p·D·D_FF / (N_TP·W)", "s")
def fsdp_tp_fsdp_comm_time(D: float, D_FF: float, N_TP: float, N_FSDP: float, W: float, p: int = FP16) -> float:
    """FSDP axis: all-gather over N_FSDP devices of each weight's TP slice (3·D·D_FF/N_TP values)."""
    return ring_all_gather_time(3 * p * D * D_FF / N_TP, N_FSDP, W)


@formula("2(N_TP−1)/N_TP · p·B·D / (N_FSDP·W)", "s")
def fsdp_tp_tp_comm_time(B: float, D: float, N_TP: float, N_FSDP: float, W: float, p: int = FP16) -> float:
    """TP axis: all-reduce over N_TP devices of y for this FSDP row's B/N_FSDP tokens."""
    return ring_all_reduce_time(p * B * D / N_FSDP, N_TP, W)


@formula("max(T_FSDP, T_TP)", "s")
def fsdp_tp_forward_comm_time(B: float, D: float, D_FF: float, N_TP: float, N_FSDP: float, W: float,
                              p: int = FP16) -> float:
    """(b) The two axes' collectives run at once on different links: the slower one is exposed."""
    return max(fsdp_tp_fsdp_comm_time(D, D_FF, N_TP, N_FSDP, W, p), fsdp_tp_tp_comm_time(B, D, N_TP, N_FSDP, W, p))


@formula("T_FSDP + T_TP", "s")
def fsdp_tp_forward_comm_time_serial(B: float, D: float, D_FF: float, N_TP: float, N_FSDP: float, W: float,
                                     p: int = FP16) -> float:
    """(d) The collectives share the device's egress: their times add."""
    return fsdp_tp_fsdp_comm_time(D, D_FF, N_TP, N_FSDP, W, p) + fsdp_tp_tp_comm_time(B, D, N_TP, N_FSDP, W, p)


@dataclass(frozen=True)
class MeshSplit:
    """The best real-valued split N = N_TP · N_FSDP of a bound."""
    n: float
    n_tp: float
    n_fsdp: float


@formula("(1 + 2·B·W/(p·C)) · (1 + 3·D_FF·W/(p·C))", "devices")
def fsdp_tp_max_devices(B: float, D_FF: float, C: float, W: float, p: int = FP16) -> float:
    """(c) Overlapping axes. Multiply both conditions by N_TP·N_FSDP·W:
      FSDP: (N_FSDP−1)·3pD·D_FF ≤ 6·B·D·D_FF·W/C   ⇔ N_FSDP − 1 ≤ 2·B·W/(p·C)
      TP:   2(N_TP−1)·p·B·D    ≤ 6·B·D·D_FF·W/C   ⇔ N_TP − 1 ≤ 3·D_FF·W/(p·C)
    Each condition involves only its own axis (the other count cancels), so the best split takes
    each axis to its own limit — fsdp_calcs' and tp_calcs' forward bounds — and N is their product."""
    return fsdp_tp_best_split(B, D_FF, C, W, p).n


def fsdp_tp_best_split(B: float, D_FF: float, C: float, W: float, p: int = FP16) -> MeshSplit:
    t = tp_max_devices_forward(D_FF, C, W, p)
    f = fsdp_max_devices(B, C, W, p)
    return MeshSplit(t * f, t, f)


@formula("(K + 3·D_FF + 2·B)² / (24·B·D_FF),  K = 6·B·D_FF·W/(p·C)", "devices")
def fsdp_tp_max_devices_serial(B: float, D_FF: float, C: float, W: float, p: int = FP16) -> float:
    """(d) Shared network: T_FSDP + T_TP ≤ T_compute. Multiplying by N_TP·N_FSDP·W/(p·D):
        3·D_FF·(N_FSDP − 1) + 2·B·(N_TP − 1) ≤ K,   K = 6·B·D_FF·W/(p·C)
    a budget linear in the two counts. Maximising the product N_TP·N_FSDP on that line
    (Lagrange, or AM-GM) equalises the two terms' marginal costs: 3·D_FF·N_FSDP = 2·B·N_TP =
    (K + 3·D_FF + 2·B)/2, so
        N_FSDP* = (K + 3·D_FF + 2·B)/(6·D_FF),  N_TP* = (K + 3·D_FF + 2·B)/(4·B),
        N* = (K + 3·D_FF + 2·B)² / (24·B·D_FF).
    When one optimum falls below 1 that axis is 1 and the other takes the whole budget (the
    product is log-concave on the segment, so clamping is optimal)."""
    return fsdp_tp_best_split_serial(B, D_FF, C, W, p).n


def fsdp_tp_best_split_serial(B: float, D_FF: float, C: float, W: float, p: int = FP16) -> MeshSplit:
    k = 6 * B * D_FF * W / (p * C)
    total = k + 3 * D_FF + 2 * B
    f, t = total / (6 * D_FF), total / (4 * B)
    if f < 1:
        f, t = 1.0, 1 + k / (2 * B)
    elif t < 1:
        f, t = 1 + k / (3 * D_FF), 1.0
    return MeshSplit(t * f, t, f)


@dataclass(frozen=True)
class FSDPTPCalcs:
    forward_flops: Answer
    fsdp_comm_time: Answer
    tp_comm_time: Answer
    forward_comm_time: Answer
    max_devices: Answer
    forward_comm_time_serial: Answer
    max_devices_serial: Answer


def fsdp_tp_calcs(B: float, D: float, D_FF: float, N_TP: float, N_FSDP: float, C: float, W: float,
                  p: int = FP16) -> FSDPTPCalcs:
    """The 2-D mesh: TP over N_TP as tp_calcs, FSDP over N_FSDP sharding the batch and each weight
    along the dimension TP did not shard. (c) and (d) do not depend on the given split."""
    _check(B=B, D=D, D_FF=D_FF, C=C, W=W)
    _check_n(N_TP=N_TP, N_FSDP=N_FSDP)
    return FSDPTPCalcs(
        forward_flops=Answer("(a) forward FLOPs per device", fsdp_tp_forward_flops,
                             fsdp_tp_forward_flops(B, D, D_FF, N_TP, N_FSDP)),
        fsdp_comm_time=Answer("(b) T_FSDP: weight all-gather over the FSDP axis", fsdp_tp_fsdp_comm_time,
                              fsdp_tp_fsdp_comm_time(D, D_FF, N_TP, N_FSDP, W, p)),
        tp_comm_time=Answer("(b) T_TP: activation all-reduce over the TP axis", fsdp_tp_tp_comm_time,
                            fsdp_tp_tp_comm_time(B, D, N_TP, N_FSDP, W, p)),
        forward_comm_time=Answer("(b) forward communication time, axes overlapping", fsdp_tp_forward_comm_time,
                                 fsdp_tp_forward_comm_time(B, D, D_FF, N_TP, N_FSDP, W, p)),
        max_devices=Answer("(c) largest N, best split, axes overlapping", fsdp_tp_max_devices,
                           fsdp_tp_max_devices(B, D_FF, C, W, p)),
        forward_comm_time_serial=Answer("(d) forward communication time, shared network",
                                        fsdp_tp_forward_comm_time_serial,
                                        fsdp_tp_forward_comm_time_serial(B, D, D_FF, N_TP, N_FSDP, W, p)),
        max_devices_serial=Answer("(d) largest N, best split, shared network", fsdp_tp_max_devices_serial,
                                  fsdp_tp_max_devices_serial(B, D_FF, C, W, p)),
    )


# ----------------------------------------------------------------------------------------------
# Bounds for a device's C and W (one table row per device)


@dataclass(frozen=True)
class DeviceFigures:
    """C (FLOP/s) and W (egress bytes/s) of one device, with where they come from."""
    name: str
    C: float
    W: float
    source: str = ""


# communication_accounting's TPU v5p numbers: C = 4.6e14 bf16 FLOP/s, W = W_ici = 2·9e10 B/s (one
# axis' bidirectional link; the course's figure, not the chip's total egress over its six links).
TPU_V5P_FIGURES = DeviceFigures("TPU v5p", C=4.6e14, W=2 * 9e10, source="communication_accounting (W_ici, C)")


@dataclass(frozen=True)
class ParallelismBounds:
    """The largest device counts (real-valued; floor them for whole devices) before each strategy's
    pass is communication-bound, for one device's C and W and one FFN and batch."""
    device: str
    dp: Answer
    fsdp: Answer
    tp_forward: Answer
    tp_backward: Answer
    fsdp_tp: Answer
    fsdp_tp_split: MeshSplit
    fsdp_tp_serial: Answer
    fsdp_tp_serial_split: MeshSplit


def data_parallel_bounds(B: float, C: float, W: float, p: int = FP16) -> Answer:
    _check(B=B, C=C, W=W)
    return Answer("largest N_DP (backward)", dp_max_devices, dp_max_devices(B, C, W, p))


def fsdp_bounds(B: float, C: float, W: float, p: int = FP16) -> Answer:
    _check(B=B, C=C, W=W)
    return Answer("largest N_FSDP (forward and backward)", fsdp_max_devices, fsdp_max_devices(B, C, W, p))


def tp_bounds(D_FF: float, C: float, W: float, p: int = FP16) -> tuple[Answer, Answer]:
    _check(D_FF=D_FF, C=C, W=W)
    return (Answer("largest N_TP (forward)", tp_max_devices_forward, tp_max_devices_forward(D_FF, C, W, p)),
            Answer("largest N_TP (backward)", tp_max_devices_backward, tp_max_devices_backward(D_FF, C, W, p)))


def fsdp_tp_bounds(B: float, D_FF: float, C: float, W: float, p: int = FP16) -> tuple[Answer, Answer]:
    _check(B=B, D_FF=D_FF, C=C, W=W)
    return (Answer("largest N = N_TP·N_FSDP (overlapping axes)", fsdp_tp_max_devices,
                   fsdp_tp_max_devices(B, D_FF, C, W, p)),
            Answer("largest N = N_TP·N_FSDP (shared network)", fsdp_tp_max_devices_serial,
                   fsdp_tp_max_devices_serial(B, D_FF, C, W, p)))


def parallelism_bounds(device: DeviceFigures, B: float, D_FF: float, p: int = FP16) -> ParallelismBounds:
    """Every bound for one device (a row of the page's table). D does not appear: it cancels in each."""
    tp_f, tp_b = tp_bounds(D_FF, device.C, device.W, p)
    both, serial = fsdp_tp_bounds(B, D_FF, device.C, device.W, p)
    return ParallelismBounds(
        device=device.name, dp=data_parallel_bounds(B, device.C, device.W, p),
        fsdp=fsdp_bounds(B, device.C, device.W, p), tp_forward=tp_f, tp_backward=tp_b,
        fsdp_tp=both, fsdp_tp_split=fsdp_tp_best_split(B, D_FF, device.C, device.W, p),
        fsdp_tp_serial=serial, fsdp_tp_serial_split=fsdp_tp_best_split_serial(B, D_FF, device.C, device.W, p))
