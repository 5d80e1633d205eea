"""FlashAttention backward for Hopper (sm_90a) in Gluon: issue 47, stage 3 (one pass, dQ by TMA reduce-add).

One program owns one key tile (BLOCK_N keys) of one (batch, head) and walks the query tiles that see
it, as the Triton single-pass backward (``flash_kernels._attn_bwd_atomic``) does, with the Hopper
machinery written out:

* **Resident K and V.** The key tile's K and V are loaded once by TMA and stay in shared memory; the
  dK and dV accumulators (fp32, BLOCK_N x d) stay in registers for the whole program.
* **Streamed Q and dO.** Query tiles (BLOCK_M rows) stream through a ring of NUM_STAGES slots, one
  mbarrier per slot for Q and one for dO; lse and D = rowsum(O·dO) come by pointer (BLOCK_M floats).
* **Transposed products** (keys are the wgmma M dimension, 16 key rows per warp, so dK and dV need
  no transposes): Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ from shared memory (Qᵀ, dOᵀ permuted views);
  Pᵀ = exp2(Sᵀ·scale·log2 e − lse·log2 e); dV += Pᵀ·dO with Pᵀ from registers (the Sᵀ accumulator's
  layout is the A operand's); dSᵀ = Pᵀ∘(dPᵀ − D); dK += dSᵀ·Q, dSᵀ from registers.
* **dQ by TMA reduce-add.** dSᵀ also goes to shared memory (bf16/fp16), dQ_tile = dS·K runs as a
  wgmma with the transposed dSᵀ view as A and the resident K as B (query rows on M: two warpgroups
  split d), is scaled by 1/sqrt(d), written to an fp32 staging tile and added into an fp32 dQ buffer
  by the copy engine (``cp.reduce.async.bulk.tensor.add``, what FlashAttention-3 does; Triton's
  ``desc.atomic_add``, exposed in Gluon 3.6 only as the builder's ``create_async_tma_reduce``, wrapped
  here as :func:`_tma_reduce_add`). The buffer is zeroed, and D computed, by the Triton backward's
  preprocessing kernel (``_attn_bwd_preprocess``), and cast to the input dtype at the end.
  5 tile products per (query tile, key tile) pair, against the two-pass Triton backward's 7.
* **Masks only on diagonal tiles** (causal, top-left aligned: query i sees keys j <= i). Query tiles
  before the key tile's first key are never loaded; rows past N_Q / N_K are zero-filled by TMA, which
  makes their contributions exactly zero (Q = dO = 0 rows; K = V = 0 rows add 0 to dQ), and dropped on
  the stores and the reduce.
* **Head dims 64, 80, 96, 128** as the forwards hold them (80 = 64 + 16, 96 = 64 + 32): every product
  over d is two chained wgmma, every d-wide accumulator two, every operand two descriptors.
* **Epilogue.** dK·(1/sqrt d) and dV into K's and V's shared memory, then TMA stores.

No warp specialization yet (stage 1's structure: CTA barriers in the loop, the elementwise work
overlaps only the wgmma left in flight). The contract is the Triton backward's: it consumes the
natural-log lse (fp32, q.shape[:-1]) and o of either forward (Triton, stage 1 or stage 2 Gluon).

``GluonBwdConfig(dq="gluon")`` (stage 3c): this kernel for dK and dV, dQ and D from the Gluon dQ kernel
(:mod:`impl.attention.flash_gluon_dq`: one program per query tile, K and V streamed), launched first.

Nothing on the default paths imports this module (stage 4 wires it in). Importing it needs triton
(Gluon) but no GPU; :func:`launch_args` builds a launch for CPU tensors (the sm_90a compile test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Optional, Tuple

import torch
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from .flash_configs import SM90_MAX_SHARED
from .flash_gluon_common import (HEAD_DIM_TILES, LOG2E, LaunchLog, _barriers, _check_layout, _copy_pair, _descriptor,
                                 _invalidate, _issue_ring, _masked_pt, _mma_layout, _ring_pair, _row_stats, _store_rows,
                                 _tile_2d, as_4d, check_device, check_shared, dims, launch, validate)

if TYPE_CHECKING:
    from .flash_options import FlashOptions

Tensor = torch.Tensor
FN = "flash_gluon_backward"


@dataclass(frozen=True)
class GluonBwdConfig:
    """One launch's tiles: block_n keys per program (16 per warp: each warp owns whole key rows of
    Sᵀ, dK and dV), block_m query rows per streamed tile, num_warps (4 or 8), num_stages Q/dO slots."""

    block_m: int = 64
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 2
    #: "reduce": dQ in this kernel, added by TMA reduce-add (one pass, 5 products); "triton": this
    #: kernel computes dK and dV only (4 products) and dQ comes from the Triton two-pass backward's
    #: dQ kernel (3 products), the issue's alternative "if that measures faster"; "gluon": dK and dV
    #: as with "triton", dQ (and D) from the Gluon dQ kernel (flash_gluon_dq, stage 3c, 3 products);
    #: "atomic" (stage 3e): one pass as "reduce", but each thread adds its dQ partial straight from the
    #: wgmma accumulator's registers into the fp32 buffer by relaxed atomic adds (red.global), with no
    #: staging tile, fence, TMA reduce or bulk-group wait.
    dq: str = "reduce"
    #: The Gluon dQ kernel's tiles (dq "gluon" only): block_m query rows per program (16 per warp:
    #: block_m / 16 warps), block_n keys per streamed tile, num_stages K/V slots.
    dq_tiles: Tuple[int, int, int] = (128, 64, 3)
    #: dq "reduce" only (stage 3d): fp32 dQ staging tiles, used in turn by successive query tiles. 1: one
    #: tile, and before writing it the loop waits for the previous tile's reduce-add to have read it; 2: the
    #: wait is for the reduce two tiles back (the last one stays in flight), at one more staging tile of
    #: block_m x d x 4 bytes of shared memory.
    dq_stages: int = 1
    #: One-pass kernel only (dq "reduce" or "atomic"; stage 4b): rebuild the wgmma shared-memory
    #: descriptors of the resident K and V and of the dSᵀ tile every query tile, from a view indexed by a
    #: loop-variant zero, instead of letting the compiler hoist them out of the loop. At d 128 the hoisted
    #: descriptors (8 k-steps x 64 bits for each of K·Qᵀ, V·dOᵀ and dS·K) are what pushed the kernel past
    #: 255 registers into spills; rebuilt, they cost a few integer ops a tile and the kernel does not spill.
    rebuild: bool = False
    #: Stage 4c: the next query tile's row statistics (lse and D, BLOCK_M floats each) are copied by cp.async
    #: into a two-slot shared-memory ring while the current tile computes, instead of loaded from global
    #: memory at the head of each tile (their latency then sits before the first exp2). Any dq mode.
    prefetch: bool = False
    #: Stage 4c, dq "reduce" only: refill the Q/dO slot (the TMA loads of the tile NUM_STAGES ahead) before
    #: the current tile's dQ staging and TMA reduce-add instead of after, so the loads start earlier; dK's
    #: product, which reads the slot, is then waited for before the dQ epilogue rather than under it.
    refill_first: bool = False

    def __post_init__(self) -> None:
        if self.num_warps not in (4, 8) or self.block_n != 16 * self.num_warps:
            raise ValueError(f"block_n must be 16 x num_warps with 4 or 8 warps, got {self}")
        if self.block_m not in (64, 128) or self.block_n % self.block_m or not 2 <= self.num_stages <= 4:
            raise ValueError(f"block_m must be 64 or 128 and divide block_n, num_stages 2..4, got {self}")
        if self.dq not in ("reduce", "triton", "gluon", "atomic"):
            raise ValueError(f"dq must be 'reduce', 'triton', 'gluon' or 'atomic', got {self}")
        if self.dq_stages not in (1, 2) or (self.dq_stages > 1 and self.dq != "reduce"):
            raise ValueError(f"dq_stages must be 1 or 2, and 2 only with dq='reduce' (dq='atomic' stages nothing), "
                             f"got {self}")
        if self.rebuild and self.dq not in ("reduce", "atomic"):
            raise ValueError(f"rebuild is for the one-pass kernel (dq='reduce' or 'atomic'), got {self}")
        if not all(isinstance(x, bool) for x in (self.rebuild, self.prefetch, self.refill_first)):
            raise ValueError(f"rebuild, prefetch and refill_first must be bools, got {self}")
        if self.refill_first and self.dq != "reduce":
            raise ValueError(f"refill_first reorders the refill around the dQ TMA reduce-add: dq='reduce' only, got "
                             f"{self}")
        object.__setattr__(self, "dq_tiles", tuple(self.dq_tiles))  # hashable as a dict key / test id
        bm, bn, stages = self.dq_tiles
        if bm not in (64, 128) or bn not in (64, 128) or not 2 <= stages <= 4:
            raise ValueError(f"dq_tiles must be (block_m 64 or 128, block_n 64 or 128, num_stages 2..4), got {self}")


#: The configs the GPU probe measures and the GPU tests check (those over 227 KB are refused). The
#: dq "gluon" ones (stage 3c) pair the dK/dV kernel of dq "triton" with two tilings of the dQ kernel; then
#: the one-pass kernel with two dQ staging tiles (stage 3d), with dQ by atomics (stage 3e), and the last two
#: are the one-pass kernels (reduce, atomic) with their descriptors rebuilt each query tile (stage 4b: no spills);
#: then stage 4c's: the split with the row statistics prefetched, the rebuilt reduce kernel with them (and with the
#: refill before the dQ reduce-add), the rebuilt atomic kernel with them.
CANDIDATE_CONFIGS = (GluonBwdConfig(64, 128, 8, 2), GluonBwdConfig(64, 128, 8, 3), GluonBwdConfig(64, 64, 4, 2),
                     GluonBwdConfig(64, 64, 4, 3), GluonBwdConfig(64, 128, 8, 2, dq="triton"),
                     GluonBwdConfig(64, 128, 8, 2, dq="gluon"),
                     GluonBwdConfig(64, 128, 8, 2, dq="gluon", dq_tiles=(128, 128, 2)),
                     GluonBwdConfig(64, 128, 8, 2, dq_stages=2), GluonBwdConfig(64, 128, 8, 2, dq="atomic"),
                     GluonBwdConfig(64, 128, 8, 2, rebuild=True),
                     GluonBwdConfig(64, 128, 8, 2, dq="atomic", rebuild=True),
                     GluonBwdConfig(64, 128, 8, 2, dq="triton", prefetch=True),
                     GluonBwdConfig(64, 128, 8, 2, rebuild=True, prefetch=True),
                     GluonBwdConfig(64, 128, 8, 2, rebuild=True, prefetch=True, refill_first=True),
                     GluonBwdConfig(64, 128, 8, 2, dq="atomic", rebuild=True, prefetch=True))


def default_config(d: int) -> GluonBwdConfig:
    """128 keys on two warpgroups, 64-row query tiles (FA3's d 128 backward tile), two Q/dO slots.
    At d 128, dK/dV here and dQ from the Triton dQ kernel: the one-pass kernel spills there, and on an
    H100 (probes/flash_gluon_bwd_2fbd353-bwd.json) the split ran 50.9 against 67.0 ms at
    1x32x32768x128 and 3.69 against 4.97 ms at 4x32x4096x128, causal. Below d 128 one pass (unswept)."""
    return GluonBwdConfig(64, 128, 8, 2, dq="triton" if d == 128 else "reduce")


def shared_bytes(d: int, config: GluonBwdConfig, itemsize: int = 2) -> int:
    """Shared memory the dK/dV kernel allocates: K and V (later dK and dV), the Q/dO ring, dSᵀ (dq "reduce"
    and "atomic") and the fp32 dQ staging tile(s) (dq "reduce" only: dq_stages of them), the prefetched
    row statistics (prefetch: two slots of lse and of D, fp32) and the mbarriers (three allocations, each
    up to a 16-byte boundary).
    The dQ kernel of dq "gluon": flash_gluon_dq.dq_shared_bytes."""
    kv = 2 * config.block_n * d * itemsize
    ring = config.num_stages * 2 * config.block_m * d * itemsize
    reduce = config.dq == "reduce"
    ds = config.block_n * config.block_m * itemsize if config.dq in ("reduce", "atomic") else 0
    dq = config.dq_stages * config.block_m * d * 4 if reduce else 0
    stats = 2 * 2 * config.block_m * 4 if config.prefetch else 0
    barriers = 16 + 2 * (-(-8 * config.num_stages // 16) * 16)
    return kv + ring + ds + dq + stats + barriers


# ---------------------------------------------------------------------------
# Gluon pieces
# ---------------------------------------------------------------------------

@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """Add the shared-memory tile src into global memory at coord through the descriptor, by the
    copy engine (cp.reduce.async.bulk.tensor .add); completion as a TMA store's (tma.store_wait)."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.constexpr_function
def _dq_layout(num_warps, n):
    """wgmma accumulator layout of a (64, n) dQ tile: one warpgroup's 4 warps along the 64 rows, the
    warpgroups (num_warps // 4) splitting the n columns. None for n == 0."""
    if n == 0:
        return None
    wg = num_warps // 4
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, wg], instr_shape=[16, n // wg, 16])


@gluon.jit
def _t_product(a2, ah2, x_slot, xh_slot, zero, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """Issue A·Xᵀ over d (Sᵀ = K·Qᵀ or dPᵀ = V·dOᵀ): A resident (keys x d), X a ring slot (queries x
    d) read as a permuted view; the hi half chained. Returns the accumulator token."""
    acc = warpgroup_mma(a2, _tile_2d(x_slot, BLOCK_M, BLOCK_D).permute((1, 0)), zero, use_acc=False, is_async=True)
    if D1 > 0:
        acc = warpgroup_mma(ah2, _tile_2d(xh_slot, BLOCK_M, D1).permute((1, 0)), acc, is_async=True)
    return acc


@gluon.jit
def _acc_product(a, acc, acc_h, x_slot, xh_slot, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """Issue acc += A·X (dV += Pᵀ·dO or dK += dSᵀ·Q): A from registers (keys x queries, the lo
    accumulator's A-operand layout; converted for the hi one), X a ring slot. Returns the tokens and
    the hi A, which must stay live until the product is waited for."""
    acc = warpgroup_mma(a, _tile_2d(x_slot, BLOCK_M, BLOCK_D), acc, is_async=True)
    a_h = 0
    if D1 > 0:
        a_h = gl.convert_layout(a, gl.DotOperandLayout(operand_index=0, parent=acc_h.type.layout, k_width=2))
        acc_h = warpgroup_mma(a_h, _tile_2d(xh_slot, BLOCK_M, D1), acc_h, is_async=True)
    return acc, acc_h, a_h


@gluon.jit
def _dq_issue(ds_smem, k2, kh2, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """Issue dQ_tile = dS·K for one query tile (lo and hi halves): dS is the transposed view of the
    dSᵀ tile in shared memory (A), K the resident tile (B); query rows on M (the two warpgroups split
    d). The caller has made dSᵀ visible to the async proxy. Returns the accumulator tokens."""
    NW: gl.constexpr = gl.num_warps()
    ds2 = ds_smem.permute((1, 0))
    dq = warpgroup_mma(ds2, k2, gl.zeros([BLOCK_M, BLOCK_D], gl.float32, _dq_layout(NW, BLOCK_D)), use_acc=False,
                       is_async=True)
    dq_h = 0
    if D1 > 0:
        dq_h = warpgroup_mma(ds2, kh2, gl.zeros([BLOCK_M, D1], gl.float32, _dq_layout(NW, D1)), use_acc=False,
                             is_async=True)
    return dq, dq_h


@gluon.jit
def _dq_reduce(dq, dq_h, dq_smem, dqh_smem, dq_desc, dqh_desc, b, h, m0, sm_scale, t, BLOCK_M: gl.constexpr,
               BLOCK_D: gl.constexpr, D1: gl.constexpr, DQ_STAGES: gl.constexpr):
    """dQ_tile·(1/sqrt d) (fp32, waited for) into the staging tile(s), then added into the fp32 dQ
    buffer by TMA reduce-add (rows past N_Q dropped). The reduce that last read the staging tile must
    be done first: the issuing threads wait for it and a barrier tells every thread.

    DQ_STAGES 1: one staging tile (lo, hi), whose last reader is the previous query tile's reduce:
    wait for every bulk group. DQ_STAGES 2: tile t uses staging tile t % 2, last read by the reduce of
    tile t - 2; every thread commits one bulk group per reduce call (the commit is not predicated: one
    group a tile at d 64 / 128, two at split d), so leaving the last tile's groups pending suffices."""
    if DQ_STAGES == 1:
        tma.store_wait(pendings=0)
    else:
        tma.store_wait(pendings=(DQ_STAGES - 1) * (2 if D1 > 0 else 1))
        dq_smem = dq_smem.index(t % DQ_STAGES)
        if D1 > 0:
            dqh_smem = dqh_smem.index(t % DQ_STAGES)
    gl.thread_barrier()
    dq_smem.reshape([BLOCK_M, BLOCK_D]).store(dq * sm_scale)
    if D1 > 0:
        dqh_smem.reshape([BLOCK_M, D1]).store(dq_h * sm_scale)
    # Generic-proxy writes, then the copy engine reads them: fence in every thread, then a barrier.
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, [b, h, m0, 0], dq_smem)
    if D1 > 0:
        _tma_reduce_add(dqh_desc, [b, h, m0, BLOCK_D], dqh_smem)


@gluon.jit
def _atomic_rows(dq_base, x, m0, N_Q, C0: gl.constexpr, HEAD_D: gl.constexpr, MASK: gl.constexpr):
    """x (fp32, BLOCK_M rows x n columns in the dQ accumulator's layout) added at dq_base, rows m0..,
    columns C0.. of a row-major buffer HEAD_D wide, by relaxed atomic adds whose results are unused
    (ptxas: REDG); MASK: rows past N_Q dropped."""
    layout: gl.constexpr = x.type.layout
    rows = m0 + gl.arange(0, x.shape[0], layout=gl.SliceLayout(1, layout))
    cols = C0 + gl.arange(0, x.shape[1], layout=gl.SliceLayout(0, layout))
    ptrs = dq_base + gl.expand_dims(rows * HEAD_D, 1) + gl.expand_dims(cols, 0)
    if MASK:
        gl.atomic_add(ptrs, x, mask=gl.expand_dims(rows < N_Q, 1) & gl.expand_dims(cols < HEAD_D, 0), sem="relaxed")
    else:
        gl.atomic_add(ptrs, x, sem="relaxed")


@gluon.jit
def _dq_atomic(dq, dq_h, dq_base, m0, N_Q, sm_scale, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
               D1: gl.constexpr):
    """dQ_tile·(1/sqrt d) (fp32, waited for) added from the accumulator's registers into the fp32 dQ
    buffer (dq_base: this (batch, head)'s rows, contiguous, BLOCK_D + D1 columns) by atomic adds
    (_atomic_rows). Nothing is staged, fenced or waited for: the adds are fire-and-forget and the buffer
    is read only after the kernel. Only the query tile that runs past N_Q masks (a uniform branch): a
    predicated atomic costs ptxas a branch around each REDG (BSSY / BRA / BSYNC, ~60 instructions a tile
    at d 128), which the full tiles skip."""
    HEAD_D: gl.constexpr = BLOCK_D + D1
    dq = dq * sm_scale
    if D1 > 0:
        dq_h = dq_h * sm_scale
    if m0 + BLOCK_M <= N_Q:
        _atomic_rows(dq_base, dq, m0, N_Q, 0, HEAD_D, False)
        if D1 > 0:
            _atomic_rows(dq_base, dq_h, m0, N_Q, BLOCK_D, HEAD_D, False)
    else:
        _atomic_rows(dq_base, dq, m0, N_Q, 0, HEAD_D, True)
        if D1 > 0:
            _atomic_rows(dq_base, dq_h, m0, N_Q, BLOCK_D, HEAD_D, True)


@gluon.jit
def _stats_rings(BLOCK_M: gl.constexpr):
    """Stage 4c's two-slot shared-memory rings of the query tiles' lse and D (fp32, BLOCK_M each)."""
    layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    lse = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], layout)
    delta = gl.allocate_shared_memory(gl.float32, [2, BLOCK_M], layout)
    return lse, delta


@gluon.jit
def _stats_issue(L_base, D_base, stats_rings, t, j0, N_Q, BLOCK_M: gl.constexpr):
    """Start the cp.async copies of query tile j0 + t's lse and D into slot t % 2 (rows past N_Q, and
    every row of a tile past the last, zero-filled: the copies are masked), one commit group per thread.
    The slot's previous contents (tile t - 2's) were read before a barrier the caller has passed."""
    layout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
    lse_ring, delta_ring = stats_rings
    offs = (j0 + t) * BLOCK_M + gl.arange(0, BLOCK_M, layout=layout)
    in_q = offs < N_Q
    async_copy.async_copy_global_to_shared(lse_ring.index(t % 2), L_base + offs, mask=in_q)
    async_copy.async_copy_global_to_shared(delta_ring.index(t % 2), D_base + offs, mask=in_q)
    async_copy.commit_group()


@gluon.jit
def _stat(ring, t, layout: gl.constexpr):
    """Tile t's lse or D (BLOCK_M fp32 in `layout`) from slot t % 2 of its ring, whose copies every thread
    waited for before a barrier. Read where it is used: from shared memory the read is short, and neither
    row vector is held in registers across the products before it (at d 128, 16 registers each)."""
    return ring.index(t % 2).load(layout)


@gluon.jit
def _resident_pair(a_desc, b_desc, ROWS: gl.constexpr, COLS: gl.constexpr, REBUILD: gl.constexpr):
    """Shared memory of the resident K and V (or their hi halves), in a_desc's dtype: (a, b, a_ring, b_ring).
    REBUILD: one-slot rings, a and b their slot 0, the rings returned for _q_loop's loop-variant views;
    otherwise plain tiles and the rings 0."""
    a_ring = 0
    b_ring = 0
    if REBUILD:
        a_ring, b_ring = _ring_pair(a_desc, b_desc, 1, ROWS, COLS)
        a_smem = a_ring.index(0)
        b_smem = b_ring.index(0)
    else:
        a_smem = gl.allocate_shared_memory(a_desc.dtype, a_desc.block_type.shape, a_desc.layout)
        b_smem = gl.allocate_shared_memory(a_desc.dtype, b_desc.block_type.shape, b_desc.layout)
    return a_smem, b_smem, a_ring, b_ring


@gluon.jit
def _q_loop(dk, dk_h, dv, dv_h, t_lo, t_hi, n_t, j0, b, h, N_Q, N_K, L_base, D_base, qk_scale, sm_scale, offs_n,
            k2, kh2, v2, vh2, q_desc, do_desc, qh_desc, doh_desc, dq_desc, dqh_desc,
            q_smem, do_smem, qh_smem, doh_smem, ds_smem, dq_smem, dqh_smem, q_bars, do_bars,
            BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
            NUM_STAGES: gl.constexpr, MASKED: gl.constexpr, KEY_MASK: gl.constexpr, DQ: gl.constexpr,
            DQ_STAGES: gl.constexpr, dq_base=0, DQ_ATOMIC: gl.constexpr = False, kv_rings=0,
            REBUILD: gl.constexpr = False, stats_rings=0, PREFETCH: gl.constexpr = False,
            REFILL_FIRST: gl.constexpr = False):
    """The key tile's work over its query tiles t in [t_lo, t_hi) (query tile index j0 + t). MASKED:
    the tiles holding the causal diagonal (causal mask); KEY_MASK: the key tile runs past N_K (P of
    the padded keys set to 0); neither: no mask at all. DQ: also dQ, by TMA reduce-add from DQ_STAGES
    staging tiles used in turn (t counts on across the loop instances, so t % DQ_STAGES alternates), or with
    DQ_ATOMIC by atomic adds from registers at dq_base (no staging). REBUILD (stage 4b): kv_rings holds K, V
    and their hi halves as one-slot rings and ds_smem is a one-slot ring too; each tile views them through
    slot z = m0 >> 30, which is 0 (query rows are below 2^30, as the launcher checks) but neither provably
    0 nor loop-invariant to the compiler: their wgmma descriptors are rebuilt each tile (a few integer ops)
    instead of being hoisted out of the loop and held in registers (24 of 64 bits at d 128, which spilled).
    PREFETCH (stage 4c): tile t's lse and D come from slot t % 2 of stats_rings (each read where it is used),
    and tile t + 1's are copied into the other slot under tile t's work (waited for before the barrier that
    ends the tile). REFILL_FIRST (stage 4c, TMA reduce-add only): the slot's refill is issued before the dQ
    staging and reduce-add.

    Why padded keys need a mask although K = V = 0 there: their score is 0, so P = exp(-lse), which
    overflows to inf when a row's lse < -88 (all its scores very negative), and dQ = dS·K would
    take inf·0 = NaN from them."""
    NW: gl.constexpr = gl.num_warps()
    st_layout: gl.constexpr = _mma_layout(NW, BLOCK_M)
    kv_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    dtype: gl.constexpr = q_desc.dtype
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    for t in range(t_lo, t_hi):
        slot = t % NUM_STAGES
        phase = (t // NUM_STAGES) & 1
        m0 = (j0 + t) * BLOCK_M
        if PREFETCH:
            offs_m = m0 + gl.arange(0, BLOCK_M, layout=col_layout)
            _stats_issue(L_base, D_base, stats_rings, t + 1, j0, N_Q, BLOCK_M)
        else:
            offs_m, lse2, delta = _row_stats(L_base, D_base, m0, N_Q, BLOCK_M, col_layout)
        if REBUILD:
            z = m0 >> 30
            k_ring, v_ring, kh_ring, vh_ring = kv_rings
            k2 = _tile_2d(k_ring.index(z), BLOCK_N, BLOCK_D)
            v2 = _tile_2d(v_ring.index(z), BLOCK_N, BLOCK_D)
            if D1 > 0:
                kh2 = _tile_2d(kh_ring.index(z), BLOCK_N, D1)
                vh2 = _tile_2d(vh_ring.index(z), BLOCK_N, D1)
        q_slot = q_smem.index(slot)
        do_slot = do_smem.index(slot)
        qh_slot = qh_smem.index(slot) if D1 > 0 else 0
        doh_slot = doh_smem.index(slot) if D1 > 0 else 0

        mbarrier.wait(q_bars.index(slot), phase)
        st = _t_product(k2, kh2, q_slot, qh_slot, st_zero, BLOCK_M, BLOCK_D, D1)
        mbarrier.wait(do_bars.index(slot), phase)
        dpt = _t_product(v2, vh2, do_slot, doh_slot, st_zero, BLOCK_M, BLOCK_D, D1)
        # Groups retire in order (one per wgmma): 1 (d 64/128) or 2 (split d) left = dPᵀ's.
        st = warpgroup_mma_wait(num_outstanding=2 if D1 > 0 else 1, deps=(st,))
        if PREFETCH:
            lse2 = _stat(stats_rings[0], t, col_layout) * 1.4426950408889634  # as _row_stats scales it
        pt = _masked_pt(gl.exp2(st * qk_scale - gl.expand_dims(lse2, 0)), offs_m, offs_n, N_K, MASKED, KEY_MASK)
        # dV += Pᵀ·dO runs while dSᵀ is formed.
        pt16 = gl.convert_layout(pt.to(dtype), a_layout)
        dv, dv_h, pt16_h = _acc_product(pt16, dv, dv_h, do_slot, doh_slot, BLOCK_M, BLOCK_D, D1)
        if D1 > 0:
            dpt, pt16, pt16_h = warpgroup_mma_wait(num_outstanding=2, deps=(dpt, pt16, pt16_h))
        else:
            dpt, pt16 = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt16))
        if PREFETCH:
            delta = _stat(stats_rings[1], t, col_layout)
        dst16 = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
        if DQ:
            # Every warp is past the previous tile's dQ product on ds_smem (the barrier ending the
            # last iteration): overwrite it, make it visible to the async proxy, then use it.
            ds_tile = ds_smem.index(z) if REBUILD else ds_smem
            ds_tile.store(dst16)
            fence_async_shared()
            gl.thread_barrier()
            dq, dq_h = _dq_issue(ds_tile, k2, kh2, BLOCK_M, BLOCK_D, D1)
        ds16 = gl.convert_layout(dst16, a_layout)
        dk, dk_h, ds16_h = _acc_product(ds16, dk, dk_h, q_slot, qh_slot, BLOCK_M, BLOCK_D, D1)
        if DQ:
            # Groups retire in order: wait for dQ with dK's group(s) left in flight under its
            # epilogue. dV's product is retired with it: Pᵀ's registers are free from here.
            if D1 > 0:
                dq, dq_h, dv, dv_h, pt16, pt16_h = warpgroup_mma_wait(num_outstanding=2,
                                                                       deps=(dq, dq_h, dv, dv_h, pt16, pt16_h))
            else:
                dq, dv, pt16 = warpgroup_mma_wait(num_outstanding=1, deps=(dq, dv, pt16))
            if DQ_ATOMIC:
                _dq_atomic(dq, dq_h, dq_base, m0, N_Q, sm_scale, BLOCK_M, BLOCK_D, D1)
            elif not REFILL_FIRST:
                _dq_reduce(dq, dq_h, dq_smem, dqh_smem, dq_desc, dqh_desc, b, h, m0, sm_scale, t, BLOCK_M, BLOCK_D,
                           D1, DQ_STAGES)
        if D1 > 0:
            dv, dv_h, dk, dk_h, pt16, pt16_h, ds16, ds16_h = warpgroup_mma_wait(
                num_outstanding=0, deps=(dv, dv_h, dk, dk_h, pt16, pt16_h, ds16, ds16_h))
        else:
            dv, dk, pt16, ds16 = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt16, ds16))
        if PREFETCH:
            async_copy.wait_group(0)  # tile t + 1's statistics: visible to every thread after the barrier
        # Every warp has waited for its products on this slot and on dSᵀ; the barrier below (no
        # other orders the last wait before the refill and the next tile's dSᵀ store) frees both.
        gl.thread_barrier()
        # Refill the slot with the tile NUM_STAGES ahead.
        _issue_ring(t + NUM_STAGES, n_t, j0, b, h, q_desc, do_desc, qh_desc, doh_desc, q_smem, do_smem, qh_smem,
                    doh_smem, q_bars, do_bars, BLOCK_M, BLOCK_D, D1, NUM_STAGES)
        if REFILL_FIRST:
            # dQ was waited for above; its staging waits for the previous reduce-add behind its own barriers.
            _dq_reduce(dq, dq_h, dq_smem, dqh_smem, dq_desc, dqh_desc, b, h, m0, sm_scale, t, BLOCK_M, BLOCK_D, D1,
                       DQ_STAGES)
    return dk, dk_h, dv, dv_h


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------

@gluon.jit
def _attn_bwd_sm90(q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc,
                   qh_desc, kh_desc, vh_desc, doh_desc, dqh_desc, dkh_desc, dvh_desc, L, Delta,
                   H, N_Q, N_K, qk_scale, sm_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, DQ: gl.constexpr, DQ_STAGES: gl.constexpr = 1,
                   dq_ptr=None, DQ_ATOMIC: gl.constexpr = False, REBUILD: gl.constexpr = False,
                   PREFETCH: gl.constexpr = False, REFILL_FIRST: gl.constexpr = False):
    """Grid (key tiles, B·H). Descriptors are rank 4 over (B, H, N, d) with blocks (1, 1, rows, BLOCK_D)
    (lo) and (1, 1, rows, D1) at column BLOCK_D (hi; None when D1 == 0); dq_desc over the fp32 dQ
    buffer (None without DQ: dK and dV only). L (natural-log lse) and Delta are (B·H, N_Q) fp32.
    DQ_STAGES: the fp32 dQ staging tiles (1 or 2; GluonBwdConfig.dq_stages). DQ_ATOMIC (dq "atomic"):
    dq_desc is None and dq_ptr the fp32 dQ buffer itself (contiguous (B, H, N_Q, d)), added into by atomics
    from registers; no staging tile is allocated. REBUILD (GluonBwdConfig.rebuild, one pass only): K, V
    (and hi halves) and dSᵀ allocated as one-slot rings, viewed in the loop through a loop-variant zero
    index so that their wgmma descriptors are rebuilt each tile (_q_loop). PREFETCH, REFILL_FIRST
    (GluonBwdConfig.prefetch, .refill_first; stage 4c): see _q_loop."""
    NW: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_N == 16 * NW, "each warp owns 16 key rows")
    gl.static_assert(BLOCK_N % BLOCK_M == 0, "query tiles nest in the key tile")
    gl.static_assert(not REFILL_FIRST or (DQ and not DQ_ATOMIC), "REFILL_FIRST reorders the TMA reduce-add's epilogue")
    kv_layout: gl.constexpr = _mma_layout(NW, BLOCK_D)
    kvh_layout: gl.constexpr = _mma_layout(NW, D1)
    row_layout: gl.constexpr = gl.SliceLayout(1, _mma_layout(NW, BLOCK_M))
    dtype: gl.constexpr = q_desc.dtype

    pid_n = gl.program_id(0)  # causal: key tile 0 sees every query tile, the heaviest start first
    pid_bh = gl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    n0 = pid_n * BLOCK_N

    k_smem, v_smem, k_ring, v_ring = _resident_pair(k_desc, v_desc, BLOCK_N, BLOCK_D, REBUILD)
    q_smem, do_smem = _ring_pair(q_desc, do_desc, NUM_STAGES, BLOCK_M, BLOCK_D)
    ds_smem = 0
    dq_smem = 0
    if DQ:
        if REBUILD:
            ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M],
                                                gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
        else:
            ds_smem = gl.allocate_shared_memory(dtype, [BLOCK_N, BLOCK_M],
                                                gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype))
        if not DQ_ATOMIC:
            if DQ_STAGES == 1:
                dq_smem = gl.allocate_shared_memory(gl.float32, dq_desc.block_type.shape, dq_desc.layout)
            else:
                dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, 1, 1, BLOCK_M, BLOCK_D], dq_desc.layout)
    kh_smem = 0
    vh_smem = 0
    kh_ring = 0
    vh_ring = 0
    qh_smem = 0
    doh_smem = 0
    dqh_smem = 0
    if D1 > 0:
        kh_smem, vh_smem, kh_ring, vh_ring = _resident_pair(kh_desc, vh_desc, BLOCK_N, D1, REBUILD)
        qh_smem, doh_smem = _ring_pair(qh_desc, doh_desc, NUM_STAGES, BLOCK_M, D1)
        if DQ and not DQ_ATOMIC:
            if DQ_STAGES == 1:
                dqh_smem = gl.allocate_shared_memory(gl.float32, dqh_desc.block_type.shape, dqh_desc.layout)
            else:
                dqh_smem = gl.allocate_shared_memory(gl.float32, [DQ_STAGES, 1, 1, BLOCK_M, D1], dqh_desc.layout)
    stats_rings = 0
    if PREFETCH:
        stats_rings = _stats_rings(BLOCK_M)
    kv_bar, q_bars, do_bars = _barriers(NUM_STAGES)

    # Query tiles j0 + t, t in [0, n_t): causal ones start at the tile holding query n0; the first
    # n_diag hold the diagonal (masked), the rest see the whole key tile.
    n_m = gl.cdiv(N_Q, BLOCK_M)
    if IS_CAUSAL:
        j0 = gl.minimum(n0 // BLOCK_M, n_m)
        n_t = n_m - j0
        n_diag = gl.minimum(BLOCK_N // BLOCK_M, n_t)
    else:
        j0 = 0
        n_t = n_m
        n_diag = 0

    _copy_pair(kv_bar, k_desc, v_desc, kh_desc, vh_desc, k_smem, v_smem, kh_smem, vh_smem, b, h, n0, BLOCK_D, D1)
    for t in gl.static_range(NUM_STAGES):
        _issue_ring(t, n_t, j0, b, h, q_desc, do_desc, qh_desc, doh_desc, q_smem, do_smem, qh_smem, doh_smem, q_bars,
                    do_bars, BLOCK_M, BLOCK_D, D1, NUM_STAGES)

    dk = gl.zeros([BLOCK_N, BLOCK_D], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, BLOCK_D], gl.float32, kv_layout)
    dk_h = 0
    dv_h = 0
    kh2 = 0
    vh2 = 0
    if D1 > 0:
        dk_h = gl.zeros([BLOCK_N, D1], gl.float32, kvh_layout)
        dv_h = gl.zeros([BLOCK_N, D1], gl.float32, kvh_layout)
        kh2 = _tile_2d(kh_smem, BLOCK_N, D1)
        vh2 = _tile_2d(vh_smem, BLOCK_N, D1)
    k2 = _tile_2d(k_smem, BLOCK_N, BLOCK_D)
    v2 = _tile_2d(v_smem, BLOCK_N, BLOCK_D)
    offs_n = n0 + gl.arange(0, BLOCK_N, layout=row_layout)
    L_base = L + pid_bh.to(gl.int64) * N_Q
    D_base = Delta + pid_bh.to(gl.int64) * N_Q
    dq_base = 0
    if DQ_ATOMIC:
        dq_base = dq_ptr + pid_bh.to(gl.int64) * N_Q * (BLOCK_D + D1)
    if PREFETCH:
        _stats_issue(L_base, D_base, stats_rings, 0, j0, N_Q, BLOCK_M)

    mbarrier.wait(kv_bar, 0)
    if PREFETCH:
        async_copy.wait_group(0)  # the first tile's statistics, for every thread after the barrier
        gl.thread_barrier()
    # The diagonal tiles (causal only) with every mask; then the rest, with the key mask only in
    # the program whose key tile is ragged (a uniform branch: the hot loop carries no mask).
    if IS_CAUSAL:
        dk, dk_h, dv, dv_h = _q_loop(
            dk, dk_h, dv, dv_h, 0, n_diag, n_t, j0, b, h, N_Q, N_K, L_base, D_base, qk_scale, sm_scale, offs_n, k2,
            kh2, v2, vh2, q_desc, do_desc, qh_desc, doh_desc, dq_desc, dqh_desc, q_smem, do_smem, qh_smem, doh_smem,
            ds_smem, dq_smem, dqh_smem, q_bars, do_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, True, True, DQ,
            DQ_STAGES, dq_base, DQ_ATOMIC, (k_ring, v_ring, kh_ring, vh_ring), REBUILD, stats_rings, PREFETCH,
            REFILL_FIRST)
    if n0 + BLOCK_N > N_K:
        dk, dk_h, dv, dv_h = _q_loop(
            dk, dk_h, dv, dv_h, n_diag, n_t, n_t, j0, b, h, N_Q, N_K, L_base, D_base, qk_scale, sm_scale, offs_n, k2,
            kh2, v2, vh2, q_desc, do_desc, qh_desc, doh_desc, dq_desc, dqh_desc, q_smem, do_smem, qh_smem, doh_smem,
            ds_smem, dq_smem, dqh_smem, q_bars, do_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, False, True, DQ,
            DQ_STAGES, dq_base, DQ_ATOMIC, (k_ring, v_ring, kh_ring, vh_ring), REBUILD, stats_rings, PREFETCH,
            REFILL_FIRST)
    else:
        dk, dk_h, dv, dv_h = _q_loop(
            dk, dk_h, dv, dv_h, n_diag, n_t, n_t, j0, b, h, N_Q, N_K, L_base, D_base, qk_scale, sm_scale, offs_n, k2,
            kh2, v2, vh2, q_desc, do_desc, qh_desc, doh_desc, dq_desc, dqh_desc, q_smem, do_smem, qh_smem, doh_smem,
            ds_smem, dq_smem, dqh_smem, q_bars, do_bars, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, False, False, DQ,
            DQ_STAGES, dq_base, DQ_ATOMIC, (k_ring, v_ring, kh_ring, vh_ring), REBUILD, stats_rings, PREFETCH,
            REFILL_FIRST)

    _invalidate(kv_bar, q_bars, do_bars, NUM_STAGES)

    # Epilogue: every warp is past its last product on K and V (the loop's last barrier, or none ran).
    gl.thread_barrier()
    _store_rows(dk * sm_scale, dk_h * sm_scale if D1 > 0 else 0, k_smem, kh_smem, dk_desc, dkh_desc, b, h, n0,
                BLOCK_N, BLOCK_D, D1)
    _store_rows(dv, dv_h, v_smem, vh_smem, dv_desc, dvh_desc, b, h, n0, BLOCK_N, BLOCK_D, D1)
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------

def validate_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, fn: str = FN) -> None:
    """Raise ValueError naming the first constraint the inputs break (any device)."""
    validate(q, k, v, fn)
    for name, t in (("o", o), ("do", do)):
        if t.shape != q.shape or t.dtype != q.dtype:
            raise ValueError(f"{fn}: {name} must match q's shape {tuple(q.shape)} and dtype {q.dtype}, got "
                             f"{tuple(t.shape)} {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{fn}: {name} on {t.device}, q on {q.device}")
    _check_layout("do", do, fn)
    if lse.shape != q.shape[:-1] or lse.dtype != torch.float32:
        raise ValueError(f"{fn}: lse must be float32 of shape {tuple(q.shape[:-1])} (the forward's natural-log "
                         f"logsumexp), got {lse.dtype} {tuple(lse.shape)}")
    if lse.device != q.device:
        raise ValueError(f"{fn}: lse on {lse.device}, q on {q.device}")


def _descriptors(q4, k4, v4, do4, dq4, dk4, dv4, rows_q: int, rows_k: int) -> tuple:
    """The kernel's fourteen descriptors: Q, K, V, dO, dQ (fp32), dK, dV lo halves, then the hi halves
    (None at d 64 and 128)."""
    lo, hi = HEAD_DIM_TILES[q4.shape[-1]]
    out = []
    for col0, width in ((0, lo), (lo, hi)):
        for t, rows in ((q4, rows_q), (k4, rows_k), (v4, rows_k), (do4, rows_q), (dq4, rows_q), (dk4, rows_k),
                        (dv4, rows_k)):
            out.append(None if t is None else _descriptor(t, rows, col0, width))
    return tuple(out)


def check_dq_stages(d: int, config: GluonBwdConfig, itemsize: int = 2) -> None:
    """ValueError naming dq_stages when the config fits the H100's shared memory with one dQ staging
    tile but not with config.dq_stages of them (the generic shared-memory refusal covers the rest)."""
    nbytes = shared_bytes(d, config, itemsize)
    one = shared_bytes(d, replace(config, dq_stages=1), itemsize)
    if config.dq_stages > 1 and nbytes > SM90_MAX_SHARED >= one:
        raise ValueError(f"{FN}: dq_stages={config.dq_stages} needs {nbytes} bytes of shared memory at head dim {d} "
                         f"({config.dq_stages} fp32 dQ staging tiles of {config.block_m * d * 4} B), more than the "
                         f"{SM90_MAX_SHARED} an H100 block may use; dq_stages=1 needs {one}: {config}")


def launch_args(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, dq32: Tensor, dk: Tensor,
                dv: Tensor, is_causal: bool, config: Optional[GluonBwdConfig] = None) -> Tuple[tuple, tuple, dict]:
    """(grid, positional arguments, launch options) of the Gluon kernel's launch, for tensors on any
    device (the compile test builds them from CPU tensors). lse, delta contiguous (B·H·N_Q fp32);
    dq32 an fp32 buffer in q's shape, contiguous (dq "reduce" and "atomic"; None otherwise); dk, dv
    contiguous. The kernel's trailing optional arguments (dq_ptr, DQ_ATOMIC, REBUILD, PREFETCH, REFILL_FIRST)
    are passed up to the last one the config sets (dq "atomic" sets the first two: the buffer, True), so a
    config without the later options launches exactly as before them."""
    q4, k4, v4, do4, dk4, dv4 = (as_4d(t) for t in (q, k, v, do, dk, dv))
    dq4 = None if dq32 is None else as_4d(dq32)
    B, H, n_q, n_k, d, lo, hi = dims(q4, k4)
    config = config or default_config(d)
    check_dq_stages(d, config, q.element_size())
    check_shared(shared_bytes(d, config, q.element_size()), d, config, FN)
    atomic = config.dq == "atomic"
    if config.rebuild and n_q >= 1 << 30:
        raise ValueError(f"{FN}: rebuild views the resident tiles through slot (query row >> 30), so it needs fewer "
                         f"than 2^30 query rows, got {n_q}: {config}")
    if (config.dq in ("reduce", "atomic")) != (dq32 is not None):
        raise ValueError(f"{FN}: dq32 is the fp32 dQ buffer of dq='reduce' or 'atomic' and None otherwise; "
                         f"config {config}")
    if atomic and (dq32.dtype != torch.float32 or not dq32.is_contiguous() or dq32.shape != q.shape):
        raise ValueError(f"{FN}: dq='atomic' adds into dq32 by row offsets: it must be float32, contiguous, in q's "
                         f"shape {tuple(q.shape)}, got {dq32.dtype} {tuple(dq32.shape)} strides {dq32.stride()}")
    bm, bn = config.block_m, config.block_n
    sm_scale = 1.0 / math.sqrt(d)
    args = (*_descriptors(q4, k4, v4, do4, None if atomic else dq4, dk4, dv4, bm, bn), lse, delta, H, n_q, n_k,
            sm_scale * LOG2E, sm_scale, bm, bn, lo, hi, bool(is_causal), config.num_stages,
            config.dq in ("reduce", "atomic"), config.dq_stages)
    # The kernel's optional trailing arguments, passed up to the last one not at its default: a config
    # without the later options launches with the arguments it had before them.
    tail = (dq4 if atomic else None, atomic, config.rebuild, config.prefetch, config.refill_first)
    while tail and (tail[-1] is None or tail[-1] is False):
        tail = tail[:-1]
    args += tail  # dq_ptr, DQ_ATOMIC, REBUILD, PREFETCH, REFILL_FIRST
    grid = (-(-n_k // bn), B * H)
    return grid, args, {"num_warps": config.num_warps}


_PRE_BLOCK_M = 64


def _preprocess(o4: Tensor, do4: Tensor, delta: Tensor, dq4: Tensor, log: Optional[LaunchLog] = None,
                lse: Optional[Tensor] = None, nl2: Optional[Tensor] = None, stats_stride: Optional[int] = None) -> None:
    """D = rowsum(O·dO) into delta and a zeroed fp32 dQ buffer dq4, by the Triton backward's
    preprocessing kernel (4-D o, do, dq); the launch logged into `log` when one is given. With nl2 (and lse, both
    contiguous fp32 of B·H·n_q values): −lse·log2 e into nl2 in the same launch (flash_gluon_bwd_ws's
    prescaled_lse); None leaves the kernel's L and NL2 at None, the launch it always was. stats_stride (with nl2
    only; None: n_q): delta's and nl2's row stride, B·H rows of it each (flash_gluon_bwd_ws's stats_smem: rows of
    16-byte multiples for its TMA descriptors); lse's stays n_q."""
    from .flash_kernels import _attn_bwd_preprocess  # triton.jit: imported only where it runs

    B, H, n_q, d = o4.shape
    lo, hi = HEAD_DIM_TILES[d]
    if (lse is None) != (nl2 is None):
        raise ValueError(f"_preprocess: lse and nl2 go together (−lse·log2 e from lse), got lse "
                         f"{'None' if lse is None else 'a tensor'} and nl2 {'None' if nl2 is None else 'a tensor'}")
    if stats_stride is not None and (nl2 is None or type(stats_stride) is not int or stats_stride < n_q):
        raise ValueError(f"_preprocess: stats_stride needs nl2 and an int of at least n_q = {n_q}, got "
                         f"{stats_stride!r} with nl2 {'None' if nl2 is None else 'a tensor'}")
    scaled = {} if nl2 is None else dict(L=lse, NL2=nl2)
    if stats_stride is not None:
        scaled["STATS_STRIDE"] = stats_stride
    launch(_attn_bwd_preprocess, (-(-n_q // _PRE_BLOCK_M), B * H),
           (o4, do4, delta, dq4, *o4.stride(), *do4.stride(), *dq4.stride(), H, n_q),
           dict(HEAD_DIM=d, BLOCK_D=lo, D1=hi, BLOCK_M=_PRE_BLOCK_M, **scaled), log)


def _triton_dq(q4: Tensor, k4: Tensor, v4: Tensor, o4: Tensor, do4: Tensor, dq4: Tensor, lse3: Tensor, delta: Tensor,
               causal: bool, options: Optional["FlashOptions"] = None) -> None:
    """dQ (and D, which it stores for the dK/dV kernel) by the Triton two-pass backward's dQ kernel,
    launched as flash_launch launches it under `options` (a FlashOptions; None: the defaults, autotuned,
    descriptors by its rule; a pinned "q" config list skips the autotuning)."""
    import impl.attention.flash_launch as fl  # only where it runs: the Triton launch machinery (not `from .`, which
    # imports the package, impl.attention, whose attention_halves imports this module: a cycle)

    options = options or fl.default_options()
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    block_d, d1 = fl._tiles(d, options)
    sm_scale = 1.0 / math.sqrt(d)
    tail = (H, n_q, n_k, fl._seq_bucket(n_q, n_k), sm_scale, sm_scale * LOG2E)
    tma = fl._tma_flag(B * H * n_q * n_k, options, q4, k4, v4, do4)
    fl._run_kernel(fl._kernel("q", options), "dq", fl._tune_key(q4, n_q, n_k, d, causal),
                   lambda m, n: (-(-n_q // m), B * H), (q4, k4, v4, o4, do4, dq4, lse3, delta),
                   (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *dq4.stride()) + tail,
                   dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma), options)


def flash_gluon_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, is_causal: bool = False,
                         config: Optional[GluonBwdConfig] = None,
                         options: Optional["FlashOptions"] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """FlashAttention backward on an sm_90 GPU: (dq, dk, dv) in q's, k's, v's shapes and dtypes
    (contiguous). q (B, H, N_Q, d) or (B, N_Q, d), k and v (.., N_K, d), o and do in q's shape, bf16
    or fp16 with TMA's layout constraints (unit stride along d, 16-byte aligned start and strides) on
    q, k, v, do; lse fp32 of shape q.shape[:-1], the natural-log logsumexp of each query's scaled
    scores as flash_attention_triton_forward and the Gluon forwards return it. Raises ValueError
    naming the constraint inputs break, RuntimeError off sm_90.

    config.dq "reduce" (default below d 128): D and a zeroed fp32 dQ buffer from the Triton preprocessing
    kernel, then this kernel (dK, dV, dQ by reduce-add), then the buffer's cast; "atomic" the same with dQ
    added by atomics from registers (stage 3e). "triton": the Triton dQ
    kernel (which writes D), then this kernel for dK and dV. "gluon": the Gluon dQ kernel
    (flash_gluon_dq, which writes D), then this kernel for dK and dV. options (a FlashOptions; None: the
    defaults) reach only the Triton dQ kernel of "triton"."""
    validate_backward(q, k, v, o, do, lse)
    check_device(q.device, FN)
    config = config or default_config(q.shape[-1])
    q4, k4, v4, o4, do4 = (as_4d(t) for t in (q, k, v, o, do))
    B, H, n_q, d = q4.shape
    lse = lse.contiguous()
    dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    if config.dq == "gluon":
        from .flash_gluon_dq import _attn_bwd_dq_sm90, dq_launch_args

        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        # Both launches' arguments (and shared-memory checks) before either kernel runs. The dQ kernel
        # first: it writes D, which the dK/dV kernel reads.
        dq_grid, dq_args, dq_opts = dq_launch_args(q, k, v, o, do, lse, delta, dq, is_causal, config.dq_tiles)
        grid, args, opts = launch_args(q, k, v, do, lse, delta, None, dk, dv, is_causal, config)
        _attn_bwd_dq_sm90[dq_grid](*dq_args, **dq_opts)
        _attn_bwd_sm90[grid](*args, **opts)
        return dq, dk, dv
    if config.dq == "triton":
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        _triton_dq(q4, k4, v4, o4, do4, as_4d(dq), lse.reshape(B, H, n_q), delta, bool(is_causal), options)
        grid, args, opts = launch_args(q, k, v, do, lse, delta, None, dk, dv, is_causal, config)
        _attn_bwd_sm90[grid](*args, **opts)
        return dq, dk, dv
    dq32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    _preprocess(o4, do4, delta, as_4d(dq32))
    grid, args, opts = launch_args(q, k, v, do, lse, delta, dq32, dk, dv, is_causal, config)
    _attn_bwd_sm90[grid](*args, **opts)
    return dq32.to(q.dtype), dk, dv


__all__ = ["CANDIDATE_CONFIGS", "GluonBwdConfig", "check_dq_stages", "default_config", "flash_gluon_backward",
           "launch_args", "shared_bytes", "validate_backward"]
