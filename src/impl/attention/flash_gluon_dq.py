"""The dQ half of the FlashAttention backward for Hopper (sm_90a) in Gluon: issue 47, stage 3c.

``flash_gluon_bwd`` with ``GluonBwdConfig(dq="gluon")`` runs this kernel first (dQ, and D for the dK/dV
kernel), then its own dK/dV kernel (``_attn_bwd_sm90`` without the dQ step): the two-pass split of
``dq="triton"`` with the Triton dQ kernel replaced by this one. Its structure is the stage-1 forward's
(``flash_gluon``), whose helpers it calls:

* **One program per (query tile, batch·head).** Q and dO of the tile (BLOCK_M rows, 16 per warp) are
  loaded once by TMA and stay in shared memory; the fp32 dQ accumulator stays in registers.
* **K and V streamed** through a ring of NUM_STAGES slots, one mbarrier per slot for K and one for V
  (``flash_gluon_common._issue_ring``, predicated off past the last tile).
* **Products per key tile** (3, the two-pass dQ kernel's): S = Q·Kᵀ and dP = dO·Vᵀ from shared memory
  (``_qk_async`` both: Kᵀ and Vᵀ are permuted slot views), P = exp2(S·scale·log2 e − lse·log2 e),
  dS = P∘(dP − D), dQ += dS·K with dS from registers (the S accumulator's layout is the A operand's,
  as the forward's P) and K the slot (``_pv_async`` without a rescale). The dQ product of tile j is
  left in flight into iteration j + 1 and retired with its S, as the forward's P·V.
* **D in the kernel.** Each program owns its query rows, so it computes D = rowsum(O·dO) for them
  once (O by pointer, dO from its shared-memory tile), uses it, and stores it for the dK/dV kernel,
  which runs after this one. No preprocessing launch (the Triton ``_attn_bwd_preprocess`` would also
  zero a dQ buffer this kernel does not need): one pass over O fewer, one launch fewer.
* **Masks only on diagonal tiles,** as in the forward: key tiles wholly below the causal diagonal
  and inside N_K run the unmasked loop instance; the tiles holding the diagonal or the ragged key
  tail run the masked one (keys past N_K and, causal, keys after the query). Padded keys need the
  mask although K = V = 0 there: their score is 0, so P = exp2(−lse·log2 e) overflows to inf when a
  row's lse < −88 and dQ = dS·K would take inf·0 = NaN. Padded query rows (zero-filled Q and dO, lse
  and D loaded as 0) give P = 1, dP = 0, dS = 0, and the TMA store drops them.
* **Head dims 64, 80, 96, 128** as the forwards hold them (80 = 64 + 16, 96 = 64 + 32: the products
  over d chained, dQ two accumulators).
* **Epilogue.** dQ·(1/sqrt d) in the input dtype into Q's shared memory, TMA store.

Causal masking is top-left aligned (query i sees keys j <= i). No warp specialization (stage 1's
structure: a CTA barrier per key tile before its slot is refilled).
"""

from __future__ import annotations

import math
from typing import Tuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (mbarrier, tma, warpgroup_mma_init,
                                                              warpgroup_mma_wait)

from .flash_gluon import _pv_async, _qk_async
from .flash_gluon_common import (LOG2E, _barriers, _copy_pair, _descriptor, _invalidate, _issue_ring, _key_tiles,
                                 _mma_layout, _query_tile, _retire, _ring_pair, _store_rows, _tile_2d, as_4d,
                                 check_shared, descriptors, dims)

Tensor = torch.Tensor
FN = "flash_gluon_backward"  # the launcher whose contract the checks state (flash_gluon_bwd.FN)


def dq_shared_bytes(d: int, dq_tiles: Tuple[int, int, int], itemsize: int = 2) -> int:
    """Shared memory the dQ kernel allocates with tiles (block_m, block_n, num_stages): Q (later dQ)
    and dO, the K/V ring and the mbarriers (three allocations, each up to a 16-byte boundary)."""
    block_m, block_n, stages = dq_tiles
    return 2 * block_m * d * itemsize + stages * 2 * block_n * d * itemsize + 16 + 2 * (-(-8 * stages // 16) * 16)


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------

@gluon.jit
def _load_o(O, o_base, stride_om, stride_od, offs_m, N_Q, COL0: gl.constexpr, layout: gl.constexpr,
            COLS: gl.constexpr):
    """O's (BLOCK_M, COLS) block from head-dim column COL0 by pointer (rows past N_Q as 0), in the
    accumulator layout `layout`."""
    rows = gl.convert_layout(offs_m, gl.SliceLayout(1, layout))
    cols = COL0 + gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    ptrs = O + o_base + gl.expand_dims(rows.to(gl.int64) * stride_om, 1) + gl.expand_dims(cols * stride_od, 0)
    return gl.load(ptrs, mask=gl.expand_dims(rows < N_Q, 1), other=0.0)


@gluon.jit
def _row_dot(o, do_smem, row_layout: gl.constexpr):
    """rowsum(O·dO) in fp32 of a loaded O block and the matching resident dO tile, in row_layout."""
    do = do_smem.reshape(o.shape).load(o.type.layout)
    return gl.convert_layout(gl.sum(o.to(gl.float32) * do.to(gl.float32), 1), row_layout)


@gluon.jit
def _k_loop(dq, dq_h, ds, ds_h, q2, qh2, do2, doh2, lse2, delta, offs_m, j_lo, j_hi, n_tiles, b, h, N_K, qk_scale,
            k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
            NUM_STAGES: gl.constexpr, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """dQ over key tiles [j_lo, j_hi) (tile indices). MASKED: the diagonal / ragged tiles (keys past
    N_K and, causal, after the query); otherwise no mask at all.

    The dQ product of a tile is left in flight when its iteration ends and retired with the next
    tile's S (wgmma groups retire in order), so dq (dq_h) arrive and leave as accumulator tokens and
    ds (ds_h), the register operand of the product in flight, is carried along to stay live."""
    NW: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = _mma_layout(NW, BLOCK_N)
    dq_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(j_lo, j_hi):
        slot = j % NUM_STAGES
        phase = (j // NUM_STAGES) & 1
        k_slot = k_smem.index(slot)
        kh_slot = kh_smem.index(slot) if D1 > 0 else 0
        mbarrier.wait(k_bars.index(slot), phase)
        s = _qk_async(q2, qh2, k_slot, kh_slot, s_zero, BLOCK_N, BLOCK_D, D1)
        mbarrier.wait(v_bars.index(slot), phase)
        dp = _qk_async(do2, doh2, v_smem.index(slot), vh_smem.index(slot) if D1 > 0 else 0, s_zero, BLOCK_N,
                       BLOCK_D, D1)
        # In flight, in order: dQ of tile j - 1, S, dP (one group per wgmma; two each at split d).
        # Waiting for S with dP's group(s) left retires the previous dQ product too.
        if D1 > 0:
            s, dq, dq_h, ds, ds_h = warpgroup_mma_wait(num_outstanding=2, deps=(s, dq, dq_h, ds, ds_h))
        else:
            s, dq, ds = warpgroup_mma_wait(num_outstanding=1, deps=(s, dq, ds))

        # Every warp has now retired its products on tile j - 1 (dP in iteration j - 1, dQ above), so
        # past this barrier that tile's slot is free: refill it with tile j + NUM_STAGES - 1.
        gl.thread_barrier()
        _issue_ring(j + NUM_STAGES - 1, n_tiles, 0, b, h, k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem,
                    vh_smem, k_bars, v_bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)

        p = gl.exp2(s * qk_scale - gl.expand_dims(lse2, 1))
        if MASKED:
            offs_n = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
            valid = gl.expand_dims(offs_n < N_K, 0)
            if IS_CAUSAL:
                valid = valid & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
            # A select, not a product: P of a padded key may be inf (lse < -88), and must become 0.
            p = gl.where(valid, p, 0.0)
        dp = warpgroup_mma_wait(num_outstanding=0, deps=(dp,))
        ds = gl.convert_layout((p * (dp - gl.expand_dims(delta, 1))).to(k_smem.dtype), a_layout)
        dq, dq_h, ds_h = _pv_async(ds, dq, dq_h, None, k_slot, kh_slot, BLOCK_N, BLOCK_D, D1)
    return dq, dq_h, ds, ds_h


@gluon.jit
def _attn_bwd_dq_sm90(q_desc, k_desc, v_desc, dq_desc, qh_desc, kh_desc, vh_desc, dqh_desc, do_desc, doh_desc,
                      O, L, Delta, stride_ob, stride_oh, stride_om, stride_od,
                      H, N_Q, N_K, qk_scale, sm_scale,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Grid (query tiles, B·H). Descriptors are rank 4 over (B, H, N, d) with blocks (1, 1, rows,
    BLOCK_D) (lo) and (1, 1, rows, D1) at column BLOCK_D (hi; None when D1 == 0). O by pointer with
    its strides; L (natural-log lse, read) and Delta (D, written) are (B·H, N_Q) fp32."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_M == 16 * NW, "each warp owns 16 query rows")
    s_layout: gl.constexpr = _mma_layout(NW, BLOCK_N)
    dq_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    dqh_layout: gl.constexpr = _mma_layout(NW, D1)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    dtype: gl.constexpr = q_desc.dtype

    pid_bh, b, h, start_m = _query_tile(H, BLOCK_M, IS_CAUSAL)

    # Shared memory: Q (later dQ) and dO, the K/V ring; one mbarrier for Q and dO, one per slot for K and for V.
    q_smem = gl.allocate_shared_memory(dtype, q_desc.block_type.shape, q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, do_desc.block_type.shape, do_desc.layout)
    k_smem, v_smem = _ring_pair(k_desc, v_desc, NUM_STAGES, BLOCK_N, BLOCK_D)
    qh_smem = 0
    doh_smem = 0
    kh_smem = 0
    vh_smem = 0
    if D1 > 0:
        qh_smem = gl.allocate_shared_memory(dtype, qh_desc.block_type.shape, qh_desc.layout)
        doh_smem = gl.allocate_shared_memory(dtype, doh_desc.block_type.shape, doh_desc.layout)
        kh_smem, vh_smem = _ring_pair(kh_desc, vh_desc, NUM_STAGES, BLOCK_N, D1)
    q_bar, k_bars, v_bars = _barriers(NUM_STAGES)

    # Key tiles [0, mid) unmasked, [mid, n_tiles) masked (the forward's split).
    mid, n_tiles = _key_tiles(start_m, BLOCK_M, N_K, BLOCK_N, IS_CAUSAL)
    _copy_pair(q_bar, q_desc, do_desc, qh_desc, doh_desc, q_smem, do_smem, qh_smem, doh_smem, b, h, start_m, BLOCK_D,
               D1)
    for t in gl.static_range(NUM_STAGES - 1):
        _issue_ring(t, n_tiles, 0, b, h, k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars,
                    v_bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    in_q = offs_m < N_Q
    row_base = pid_bh.to(gl.int64) * N_Q
    # Rows past N_Q: lse = D = 0 with Q = dO = 0 (zero-filled), so their dS is exactly 0.
    lse2 = gl.load(L + row_base + offs_m, mask=in_q, other=0.0) * 1.4426950408889634

    # D = rowsum(O·dO) for this tile's rows, stored for the dK/dV kernel. O's loads are issued before
    # the wait for Q and dO, so the two fetches overlap.
    o_base = b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh
    o_lo = _load_o(O, o_base, stride_om, stride_od, offs_m, N_Q, 0, dq_layout, BLOCK_D)
    o_hi = 0
    if D1 > 0:
        o_hi = _load_o(O, o_base, stride_om, stride_od, offs_m, N_Q, BLOCK_D, dqh_layout, D1)
    mbarrier.wait(q_bar, 0)
    delta = _row_dot(o_lo, do_smem, row_layout)
    if D1 > 0:
        delta += _row_dot(o_hi, doh_smem, row_layout)
    gl.store(Delta + row_base + offs_m, delta, mask=in_q)

    # The loops carry dQ as wgmma tokens and dS as the operand of the product in flight.
    dq = warpgroup_mma_init(gl.zeros([BLOCK_M, BLOCK_D], gl.float32, dq_layout))
    ds = gl.zeros([BLOCK_M, BLOCK_N], dtype, gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2))
    dq_h = 0
    ds_h = 0
    qh2 = 0
    doh2 = 0
    if D1 > 0:
        dq_h = warpgroup_mma_init(gl.zeros([BLOCK_M, D1], gl.float32, dqh_layout))
        ds_h = gl.zeros([BLOCK_M, BLOCK_N], dtype, gl.DotOperandLayout(operand_index=0, parent=dqh_layout, k_width=2))
        qh2 = _tile_2d(qh_smem, BLOCK_M, D1)
        doh2 = _tile_2d(doh_smem, BLOCK_M, D1)
    q2 = _tile_2d(q_smem, BLOCK_M, BLOCK_D)
    do2 = _tile_2d(do_smem, BLOCK_M, BLOCK_D)
    dq, dq_h, ds, ds_h = _k_loop(
        dq, dq_h, ds, ds_h, q2, qh2, do2, doh2, lse2, delta, offs_m, 0, mid, n_tiles, b, h, N_K, qk_scale, k_desc,
        v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1,
        NUM_STAGES, False, IS_CAUSAL)
    dq, dq_h, ds, ds_h = _k_loop(
        dq, dq_h, ds, ds_h, q2, qh2, do2, doh2, lse2, delta, offs_m, mid, n_tiles, n_tiles, b, h, N_K, qk_scale,
        k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, k_bars, v_bars, BLOCK_M, BLOCK_N,
        BLOCK_D, D1, NUM_STAGES, True, IS_CAUSAL)
    # The last tile's dQ product.
    dq, dq_h, ds, ds_h = _retire(dq, dq_h, ds, ds_h, D1)
    _invalidate(q_bar, k_bars, v_bars, NUM_STAGES)

    # Epilogue: every warp is past its last product on Q before any writes dQ over it.
    gl.thread_barrier()
    _store_rows(dq, dq_h, q_smem, qh_smem, dq_desc, dqh_desc, b, h, start_m, BLOCK_M, BLOCK_D, D1, sm_scale)
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------

def dq_launch_args(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, delta: Tensor, dq: Tensor,
                   is_causal: bool, dq_tiles: Tuple[int, int, int]) -> Tuple[tuple, tuple, dict]:
    """(grid, positional arguments, launch options) of the dQ kernel's launch with tiles (block_m,
    block_n, num_stages; block_m / 16 warps), for tensors on any device (the compile test builds them
    from CPU tensors). lse and delta contiguous (B·H·N_Q fp32), dq in q's shape and dtype, TMA's
    layout (the launcher's is contiguous). ValueError (naming flash_gluon_backward) when the tiles need
    more shared memory than an H100 block may use."""
    q4, k4, v4, o4, do4, dq4 = (as_4d(t) for t in (q, k, v, o, do, dq))
    B, H, n_q, n_k, d, lo, hi = dims(q4, k4)
    bm, bn, stages = dq_tiles
    check_shared(dq_shared_bytes(d, dq_tiles, q.element_size()), d, f"the dQ kernel's tiles {tuple(dq_tiles)}", FN)
    sm_scale = 1.0 / math.sqrt(d)
    args = (*descriptors(q4, k4, v4, dq4, bm, bn), _descriptor(do4, bm, 0, lo), _descriptor(do4, bm, lo, hi),
            o4, lse, delta, *o4.stride(), H, n_q, n_k, sm_scale * LOG2E, sm_scale, bm, bn, lo, hi, bool(is_causal),
            stages)
    grid = (-(-n_q // bm), B * H)
    return grid, args, {"num_warps": bm // 16}


__all__ = ["dq_launch_args", "dq_shared_bytes"]
