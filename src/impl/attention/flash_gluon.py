"""FlashAttention forward for Hopper (sm_90a) in Gluon: issue 47, stage 1 (no warp specialization).

One program computes one query tile of one (batch, head), as the Triton forward does, but with the
Hopper machinery written out instead of left to Triton's pipeliner:

* **Loads.** Q, K and V come through host-built tensor descriptors (TMA, the bulk tensor copy
  engine) over the (B, H, N, d) tensors with their own strides: the descriptors are rank 4 with
  blocks of shape (1, 1, rows, d), so no layout needs to be contiguous, and the copy engine
  zero-fills rows past N (ragged lengths need no load masks). K and V stream through a ring of
  NUM_STAGES shared-memory slots, each slot with one mbarrier for its K tile and one for its V tile
  (Q·Kᵀ may start before V has landed). Tile t is issued NUM_STAGES - 1 iterations before it is
  used, by the same warps that compute (stage 2 moves this into a load partition).
* **Products.** ``warpgroup_mma`` (wgmma): S = Q·Kᵀ with Q and K from shared memory (Kᵀ as a
  permuted view), O += P·V with P from registers (the S accumulator's layout is the A operand's
  register layout, so P never goes through shared memory) and V from shared memory. A tile's P·V
  is left in flight into the next iteration and waited for with the next Q·Kᵀ, so the two run back
  to back on the tensor cores. Without specialization the softmax overlaps no MMA otherwise: that,
  and the CTA barriers each iteration needs, is what stage 2 (warp specialization) removes.
* **Softmax.** Online, in base 2: the scale·log2(e) is folded into the scores (one multiply-add per
  score with the running max), exp2, fp32 row statistics.
* **Masks only on diagonal tiles.** Key tiles wholly below the causal diagonal and inside N_K run
  the unmasked loop; only the tiles holding the diagonal or the ragged tail run the masked one;
  tiles above the diagonal are never loaded. Causal programs start with the heaviest query tiles.
* **Head dims 64, 80, 96, 128.** Gluon tiles are powers of two, so 80 and 96 are held as two tiles,
  64 + 16 and 64 + 32 (as the Triton kernels do, ``flash_configs._head_dim_tiles``): Q·Kᵀ is two
  chained wgmma, P·V two accumulators, each operand two descriptors. D1 = 0 compiles the hi half out.
* **Epilogue.** O = acc / l is written into Q's shared memory (free by then) and stored by TMA, which
  drops rows past N_Q; the natural-log logsumexp goes to ``lse`` (fp32, q.shape[:-1]) by pointer.

Causal masking is top-left aligned (query i sees keys j <= i), like the Triton forward and SDPA.

Nothing on the default paths imports this module (issue 47, stage 4 wires it in). Importing it needs
triton (Gluon) but no GPU; :func:`launch_args` builds a launch's arguments for CPU tensors too, which
is how correctness/test_flash_gluon.py compiles the kernel for sm_90a without a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from .flash_gluon_common import (DTYPES, HEAD_DIM_TILES, LOG2E, _barriers, _copy, _invalidate, _issue_ring, _key_tiles,
                                 _mma_layout, _query_tile, _retire, _ring_pair, _tile_2d, as_4d, check_shared, dims,
                                 descriptors, forward_outputs, validate)

Tensor = torch.Tensor


@dataclass(frozen=True)
class GluonFwdConfig:
    """One launch's tiles: block_m query rows per program (16 per warp: each warp owns whole rows of
    S and O), block_n keys per tile, num_warps (4: one warpgroup, 8: two), num_stages K/V slots."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3

    def __post_init__(self) -> None:
        if self.num_warps not in (4, 8) or self.block_m != 16 * self.num_warps:
            raise ValueError(f"block_m must be 16 x num_warps with 4 or 8 warps, got {self}")
        if self.block_n not in (64, 128) or not 2 <= self.num_stages <= 4:
            raise ValueError(f"block_n must be 64 or 128 and num_stages 2..4, got {self}")


#: The configs the GPU probe measures (tools/probes/flash_gluon_fwd.py) and the GPU tests check; at d 128
#: those over the H100's shared memory (four 128-key slots) are refused by the launcher.
CANDIDATE_CONFIGS = (GluonFwdConfig(128, 128, 8, 3), GluonFwdConfig(128, 128, 8, 2), GluonFwdConfig(128, 64, 8, 3),
                     GluonFwdConfig(128, 64, 8, 4), GluonFwdConfig(64, 128, 4, 3), GluonFwdConfig(64, 64, 4, 4))


def default_config(d: int) -> GluonFwdConfig:
    """128 x 128 tiles on two warpgroups (the Triton sweep's best d 128 tile, NOTES.md) and three
    K/V slots, the most that fit the H100's 227 KB at d 128 (Q 32 KB + 3 x 64 KB). Not yet measured:
    the probe (tools/probes/flash_gluon_fwd.py) sweeps the alternatives."""
    return GluonFwdConfig(128, 128, 8, 3)


def shared_bytes(d: int, config: GluonFwdConfig, itemsize: int = 2) -> int:
    """Shared memory the kernel allocates: Q (reused for O), the K/V ring, and the mbarriers (8 bytes
    each in three allocations, each counted here up to a 16-byte boundary: at most 15 bytes over)."""
    q = config.block_m * d * itemsize
    ring = config.num_stages * 2 * config.block_n * d * itemsize
    barriers = 16 + 2 * (-(-8 * config.num_stages // 16) * 16)
    return q + ring + barriers


# ---------------------------------------------------------------------------
# Kernel helpers
# ---------------------------------------------------------------------------

@gluon.jit
def _qk_async(q2, qh2, k_slot, kh_slot, s_zero, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """Issue S = Q·Kᵀ for one key tile (slot views of the ring; Kᵀ a permuted view), the hi half
    chained onto the lo one; returns the accumulator token."""
    s = warpgroup_mma(q2, _tile_2d(k_slot, BLOCK_N, BLOCK_D).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if D1 > 0:
        s = warpgroup_mma(qh2, _tile_2d(kh_slot, BLOCK_N, D1).permute((1, 0)), s, is_async=True)
    return s


@gluon.jit
def _online_softmax(s, m_i, l_i, offs_m, n0, N_K, qk_scale, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    LAZY_SUM: gl.constexpr):
    """One key tile's step of the base-2 online softmax: returns (P in fp32, alpha, l, m) with alpha
    the factor that rescales what was accumulated against the old max. MASKED: bounds (keys from n0
    past N_K) and causal masks; otherwise no mask at all. LAZY_SUM: l per thread (_row_sum)."""
    s, m_new = _softmax_max(s, m_i, offs_m, n0, N_K, qk_scale, MASKED, IS_CAUSAL)
    p32, alpha, l_i = _softmax_exp(s, m_i, m_new, l_i, qk_scale, MASKED, LAZY_SUM)
    return p32, alpha, l_i, m_new


@gluon.jit
def _softmax_max(s, m_i, offs_m, n0, N_K, qk_scale, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """_online_softmax's first half: (S as _softmax_exp takes it, the new row max)."""
    if MASKED:
        offs_n = n0 + gl.arange(0, s.shape[1], layout=gl.SliceLayout(0, s.type.layout))
        valid = gl.expand_dims(offs_n < N_K, 0)
        if IS_CAUSAL:
            valid = valid & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
        # Finite, not -inf: tile 0 holds key 0, which every row sees, so no row's max stays at
        # the mask value and exp2 of a masked score is exactly 0.
        s = gl.where(valid, s * qk_scale, -1.0e6)
        m_new = gl.maximum(m_i, gl.max(s, 1))
    else:
        # The scale folds into the max and into one multiply-add per score.
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    return s, m_new


@gluon.jit
def _softmax_exp(s, m_i, m_new, l_i, qk_scale, MASKED: gl.constexpr, LAZY_SUM: gl.constexpr):
    """_online_softmax's second half: (P in fp32, alpha, l) from _softmax_max's S and max."""
    if MASKED:
        s = s - gl.expand_dims(m_new, 1)
    else:
        s = s * qk_scale - gl.expand_dims(m_new, 1)
    p32 = gl.exp2(s)
    alpha = gl.exp2(m_i - m_new)
    l_i = _row_sum(l_i, p32, alpha, LAZY_SUM)
    return p32, alpha, l_i


@gluon.jit
def _row_sum(l_i, p32, alpha, LAZY_SUM: gl.constexpr):
    """l = alpha·l + P's row sums. LAZY_SUM (a ws trial): l is per thread, (rows, 8) from _lazy_parts, updated
    with no shuffle; _lazy_total sums it across the quad once, after the last key tile (FA3's way)."""
    if LAZY_SUM:
        part = _lazy_parts(p32)
        l_i = l_i * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, part.type.layout)), 1) + part
    else:
        l_i = l_i * alpha + gl.sum(p32, 1)
    return l_i


@gluon.jit
def _lazy_parts(x):
    """x's row sums as each thread holds them, (rows, 8): a wgmma accumulator row's column c is in lane c / 2 % 4
    of its quad, register c % 2 and c / 8 (the 8-column groups), so summing the groups (axis 1 of
    (rows, cols / 8, 8)) stays in the thread's registers."""
    return gl.sum(gl.reshape(x, [x.shape[0], x.shape[1] // 8, 8]), 1)


@gluon.jit
def _lazy_total(l_i, row_layout: gl.constexpr):
    """_row_sum's per-thread l (LAZY_SUM) summed across each row's quad, in row_layout (the S rows')."""
    return gl.convert_layout(gl.sum(l_i, 1), row_layout)


@gluon.jit
def _rows(x, acc):
    """A per-row vector (S's row layout) as a column broadcastable against acc (its own layout)."""
    return gl.expand_dims(gl.convert_layout(x, gl.SliceLayout(1, acc.type.layout)), 1)


@gluon.jit
def _pv_async(p, acc, acc_h, alpha, v_slot, vh_slot, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
              D1: gl.constexpr):
    """Issue O = alpha·O + P·V for one key tile (alpha None: O as it is), P from registers (the lo
    accumulator's A-operand layout, converted for the hi one). Returns the accumulator tokens and
    the hi P, which must stay live until the product is waited for (p itself is the caller's)."""
    if alpha is not None:
        acc = acc * _rows(alpha, acc)
    acc = warpgroup_mma(p, _tile_2d(v_slot, BLOCK_N, BLOCK_D), acc, is_async=True)
    p_h = 0
    if D1 > 0:
        p_h = gl.convert_layout(p, gl.DotOperandLayout(operand_index=0, parent=acc_h.type.layout, k_width=2))
        if alpha is not None:
            acc_h = acc_h * _rows(alpha, acc_h)
        acc_h = warpgroup_mma(p_h, _tile_2d(vh_slot, BLOCK_N, D1), acc_h, is_async=True)
    return acc, acc_h, p_h


@gluon.jit
def _kv_loop(acc, acc_h, p, p_h, l_i, m_i, q2, qh2, offs_m, j_lo, j_hi, n_tiles, b, h, N_K, qk_scale,
             k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars,
             BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
             NUM_STAGES: gl.constexpr, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Online softmax over key tiles [j_lo, j_hi) (tile indices). MASKED: the diagonal / ragged
    tiles (bounds and causal masks); otherwise no mask at all.

    The P·V product of a tile is left in flight when its iteration ends: it runs on the tensor
    cores while the next iteration waits for its K tile and issues its Q·Kᵀ, and both are waited
    for together. So acc (acc_h) arrive and leave as wgmma accumulator tokens, and p (p_h), the
    register operand of the product in flight, is carried along to stay live until that wait."""
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = _mma_layout(NW, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(j_lo, j_hi):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        mbarrier.wait(k_bars.index(slot), phase)
        s = _qk_async(q2, qh2, k_smem.index(slot), kh_smem.index(slot) if D1 > 0 else 0, s_zero, BLOCK_N, BLOCK_D, D1)
        if D1 > 0:
            s, acc, acc_h, p, p_h = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc, acc_h, p, p_h))
        else:
            s, acc, p = warpgroup_mma_wait(num_outstanding=0, deps=(s, acc, p))

        # Every warp has now waited for its P·V of tile j - 1, so past this barrier that tile's
        # slot is free: refill it with tile j + NUM_STAGES - 1.
        gl.thread_barrier()
        _issue_ring(j + NUM_STAGES - 1, n_tiles, 0, b, h, k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem,
                    vh_smem, k_bars, v_bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)

        p32, alpha, l_i, m_i = _online_softmax(s, m_i, l_i, offs_m, j * BLOCK_N, N_K, qk_scale, MASKED, IS_CAUSAL,
                                               False)
        # The S accumulator's registers are the A operand's: P goes to the tensor cores from registers.
        p = gl.convert_layout(p32.to(k_smem.dtype), p_layout)
        mbarrier.wait(v_bars.index(slot), phase)
        acc, acc_h, p_h = _pv_async(p, acc, acc_h, alpha, v_smem.index(slot),
                                    vh_smem.index(slot) if D1 > 0 else 0, BLOCK_N, BLOCK_D, D1)
    return acc, acc_h, p, p_h, l_i, m_i


@gluon.jit
def _store_tile(acc, acc_h, l_i, m_i, o_smem, oh_smem, o_desc, oh_desc, L, b, h, pid_bh, start_m, offs_m, N_Q,
                BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """O = acc / l through shared memory (the query tile's, free once every warp of the caller is
    past its last wgmma on it) to a TMA store, which drops rows past N_Q; lse by pointer. The
    caller waits for the store (tma.store_wait) before it reuses o_smem."""
    inv_l = 1.0 / l_i
    dtype: gl.constexpr = o_desc.dtype
    o_smem.reshape(acc.shape).store((acc * _rows(inv_l, acc)).to(dtype))
    if D1 > 0:
        oh_smem.reshape(acc_h.shape).store((acc_h * _rows(inv_l, acc_h)).to(dtype))
    # Generic-proxy writes, then the copy engine reads them: fence in every thread, then a barrier.
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(o_desc, [b, h, start_m, 0], o_smem)
    if D1 > 0:
        tma.async_copy_shared_to_global(oh_desc, [b, h, start_m, BLOCK_D], oh_smem)
    _store_lse(L, pid_bh, N_Q, offs_m, m_i, l_i)


@gluon.jit
def _store_lse(L, bh, N_Q, offs_m, m_i, l_i):
    """The rows' natural-log logsumexp (m_i and l_i in base 2) into L (B·H, N_Q), rows past N_Q dropped."""
    lse = (m_i + gl.log2(l_i)) * 0.6931471805599453
    gl.store(L + bh.to(gl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------

@gluon.jit
def _attn_fwd_sm90(q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc, L,
                   H, N_Q, N_K, qk_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Grid (query tiles, B·H). Descriptors are rank 4 over (B, H, N, d) with blocks (1, 1, rows,
    BLOCK_D) (lo) and (1, 1, rows, D1) at column BLOCK_D (hi; None when D1 == 0)."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_M == 16 * NW, "each warp owns 16 query rows")
    s_layout: gl.constexpr = _mma_layout(NW, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    oh_layout: gl.constexpr = _mma_layout(NW, D1)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = q_desc.dtype

    pid_bh, b, h, start_m = _query_tile(H, BLOCK_M, IS_CAUSAL)

    # Shared memory: Q (later O), the K/V ring, one mbarrier for Q and one per slot for K and for V.
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    k_smem, v_smem = _ring_pair(k_desc, v_desc, NUM_STAGES, BLOCK_N, BLOCK_D)
    qh_smem = 0
    kh_smem = 0
    vh_smem = 0
    if D1 > 0:
        qh_smem = gl.allocate_shared_memory(dtype, qh_desc.block_type.shape, qh_desc.layout)
        kh_smem, vh_smem = _ring_pair(kh_desc, vh_desc, NUM_STAGES, BLOCK_N, D1)
    q_bar, k_bars, v_bars = _barriers(NUM_STAGES)

    mid, n_tiles = _key_tiles(start_m, BLOCK_M, N_K, BLOCK_N, IS_CAUSAL)
    _copy(q_desc, qh_desc, start_m, b, h, q_bar, q_smem, qh_smem, BLOCK_D, D1)
    for t in gl.static_range(NUM_STAGES - 1):
        _issue_ring(t, n_tiles, 0, b, h, k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars,
                    v_bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
    # The loops carry the accumulators as wgmma tokens and P as the operand of the product in flight.
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_layout))
    p = gl.zeros([BLOCK_M, BLOCK_N], dtype, gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2))
    acc_h = 0
    p_h = 0
    if D1 > 0:
        acc_h = warpgroup_mma_init(gl.zeros([BLOCK_M, D1], gl.float32, oh_layout))
        p_h = gl.zeros([BLOCK_M, BLOCK_N], dtype, gl.DotOperandLayout(operand_index=0, parent=oh_layout, k_width=2))
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)

    mbarrier.wait(q_bar, 0)
    q2 = _tile_2d(q_smem, BLOCK_M, BLOCK_D)
    qh2 = 0
    if D1 > 0:
        qh2 = _tile_2d(qh_smem, BLOCK_M, D1)
    acc, acc_h, p, p_h, l_i, m_i = _kv_loop(
        acc, acc_h, p, p_h, l_i, m_i, q2, qh2, offs_m, 0, mid, n_tiles, b, h, N_K, qk_scale, k_desc, v_desc, kh_desc,
        vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES,
        False, IS_CAUSAL)
    acc, acc_h, p, p_h, l_i, m_i = _kv_loop(
        acc, acc_h, p, p_h, l_i, m_i, q2, qh2, offs_m, mid, n_tiles, n_tiles, b, h, N_K, qk_scale, k_desc, v_desc,
        kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1,
        NUM_STAGES, True, IS_CAUSAL)
    # The last tile's P·V.
    acc, acc_h, p, p_h = _retire(acc, acc_h, p, p_h, D1)
    _invalidate(q_bar, k_bars, v_bars, NUM_STAGES)

    # Epilogue. Every warp is past its last wgmma on Q before any writes O over it.
    gl.thread_barrier()
    _store_tile(acc, acc_h, l_i, m_i, q_smem, qh_smem, o_desc, oh_desc, L, b, h, pid_bh, start_m, offs_m, N_Q, BLOCK_D, D1)
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------

def launch_args(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool,
                config: Optional[GluonFwdConfig] = None) -> Tuple[tuple, tuple, dict]:
    """(grid, positional arguments, launch options) of one forward launch, for tensors on any
    device (the sm_90a compile test builds them from CPU tensors). o and lse contiguous."""
    q4, k4, v4, o4 = as_4d(q), as_4d(k), as_4d(v), as_4d(o)
    B, H, n_q, n_k, d, lo, hi = dims(q4, k4)
    config = config or default_config(d)
    check_shared(shared_bytes(d, config, q.element_size()), d, config)
    bm, bn = config.block_m, config.block_n
    args = (*descriptors(q4, k4, v4, o4, bm, bn), lse, H, n_q, n_k, LOG2E / math.sqrt(d),
            bm, bn, lo, hi, bool(is_causal), config.num_stages)
    grid = (-(-n_q // bm), B * H)
    return grid, args, {"num_warps": config.num_warps}


def flash_gluon_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                        config: Optional[GluonFwdConfig] = None) -> Tuple[Tensor, Tensor]:
    """FlashAttention forward on an sm_90 GPU. q (B, H, N_Q, d) or (B, N_Q, d), k and v (.., N_K, d),
    bf16 or fp16, any strides TMA accepts (unit stride along d, 16-byte aligned start and strides).
    Returns (o, lse): o contiguous in q's shape and dtype, lse fp32 of shape q.shape[:-1], the
    natural-log logsumexp of each query's scaled scores (flash_attention_triton_forward's contract).
    Raises ValueError naming the constraint inputs break, RuntimeError off sm_90."""
    o, lse = forward_outputs(q, k, v, "flash_gluon_forward")
    grid, args, opts = launch_args(q, k, v, o, lse, is_causal, config)
    _attn_fwd_sm90[grid](*args, **opts)
    return o, lse


__all__ = ["CANDIDATE_CONFIGS", "DTYPES", "GluonFwdConfig", "HEAD_DIM_TILES", "default_config", "flash_gluon_forward",
           "launch_args", "shared_bytes", "validate"]
