"""What the five Gluon kernels for Hopper share (issue 47): flash_gluon (stage-1 forward), flash_gluon_ws
(warp-specialized forward), flash_gluon_bwd (dK/dV, one-pass backward), flash_gluon_bwd_ws (its
warp-specialized experiment) and flash_gluon_dq (the dQ kernel).

Kernel side (``@gluon.jit``, inlined into each kernel): the wgmma accumulator layout, the rank-4 TMA
block as a matrix, the shared memory of a pair of rings, the TMA copies of a lo/hi head-dim pair onto
an mbarrier (one block, two blocks on one barrier, a ring slot of two operands), the program's query
tile and its key-tile range (which tiles need masks), the three-array mbarrier set of the
non-specialized kernels, retiring a product left in flight, the epilogue's store of an accumulator
through shared memory, and the backwards' per-row lse and D and their Pᵀ masks.

Host side: the head-dim tiles and dtypes, the input checks (shapes, dtypes, TMA's layout rules, the
device, shared memory) whose messages name the launcher, the 4-D views and shapes, the TMA descriptors
and the forwards' outputs.

Every kernel compiled from these pieces has the PTX it had when each kernel wrote them out itself
(tools/probes/gluon_ptx_same.py compares; NOTES.md, "Issue 47: one prologue for the Gluon kernels").
Where a piece is written in an order that looks arbitrary (_issue_ring, _store_rows' scale), that
order is the one that keeps the PTX: shared-memory allocations and the order of ops reach the PTX.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .flash_configs import SM90_MAX_SHARED

Tensor = torch.Tensor

LOG2E = 1.4426950408889634
#: Head dims the kernels support, as (lo, hi) tiles; hi 0: one tile.
HEAD_DIM_TILES = {64: (64, 0), 80: (64, 16), 96: (64, 32), 128: (128, 0)}
#: Input dtypes the kernels take.
DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
#: Element types a descriptor may have: the inputs' and fp32 (the dQ buffer of the TMA reduce-add).
_DESC_DTYPES = {**DTYPES, torch.float32: gl.float32}


# ---------------------------------------------------------------------------
# Kernel side
# ---------------------------------------------------------------------------

@gluon.constexpr_function
def _mma_layout(num_warps, n):
    """wgmma accumulator layout of a (16 x num_warps, n) tile: warps stacked along the rows (each
    warp owns 16 whole rows, so row max and row sum stay inside a warp), instructions m16 n k16.
    None for n == 0 (no hi tile)."""
    if n == 0:
        return None
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _tile_2d(smem, ROWS: gl.constexpr, COLS: gl.constexpr):
    """A (1, 1, ROWS, COLS) TMA block as the (ROWS, COLS) matrix wgmma reads."""
    return smem.reshape([ROWS, COLS])


@gluon.jit
def _ring_pair(a_desc, b_desc, NUM_STAGES: gl.constexpr, ROWS: gl.constexpr, COLS: gl.constexpr):
    """Shared memory of two rings of NUM_STAGES (1, 1, ROWS, COLS) TMA blocks (K and V, or Q and dO), in
    a_desc's dtype, each in its descriptor's layout: a's first."""
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, 1, 1, ROWS, COLS], a_desc.layout)
    b_smem = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES, 1, 1, ROWS, COLS], b_desc.layout)
    return a_smem, b_smem


@gluon.jit
def _slot(buf, i, D1: gl.constexpr):
    """Slot i of a hi-half ring (0 when there is no hi half, D1 == 0)."""
    view = 0
    if D1 > 0:
        view = buf.index(i)
    return view


@gluon.jit
def _copy(desc, desc_h, row, b, h, bar, dst, dst_h, BLOCK_D: gl.constexpr, D1: gl.constexpr, pred=True):
    """TMA of one block at row `row` of (b, h), its lo and hi halves, onto bar with its byte count;
    pred (a scalar) predicates the byte count and the copies."""
    nbytes: gl.constexpr = desc.block_type.nbytes + (desc_h.block_type.nbytes if D1 > 0 else 0)
    mbarrier.expect(bar, nbytes, pred=pred)
    tma.async_copy_global_to_shared(desc, [b, h, row, 0], bar, dst, pred=pred)
    if D1 > 0:
        tma.async_copy_global_to_shared(desc_h, [b, h, row, BLOCK_D], bar, dst_h, pred=pred)


@gluon.jit
def _copy_pair(bar, a_desc, b_desc, ah_desc, bh_desc, a_smem, b_smem, ah_smem, bh_smem, b, h, row,
               BLOCK_D: gl.constexpr, D1: gl.constexpr):
    """TMA of two blocks of the same shape at row `row` (Q and dO, or K and V), lo and hi halves, onto
    one barrier with their byte count."""
    nbytes: gl.constexpr = 2 * (a_desc.block_type.nbytes + (ah_desc.block_type.nbytes if D1 > 0 else 0))
    mbarrier.expect(bar, nbytes)
    tma.async_copy_global_to_shared(a_desc, [b, h, row, 0], bar, a_smem)
    tma.async_copy_global_to_shared(b_desc, [b, h, row, 0], bar, b_smem)
    if D1 > 0:
        tma.async_copy_global_to_shared(ah_desc, [b, h, row, BLOCK_D], bar, ah_smem)
        tma.async_copy_global_to_shared(bh_desc, [b, h, row, BLOCK_D], bar, bh_smem)


@gluon.jit
def _issue_ring(t, n_t, j0, b, h, a_desc, b_desc, ah_desc, bh_desc, a_smem, b_smem, ah_smem, bh_smem, a_bars, b_bars,
                ROWS: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Start the TMA loads of a ring's t-th tile, tile j0 + t of ROWS rows (two operands: K and V, or Q
    and dO, each onto its own barrier), into slot t % NUM_STAGES; a no-op from t = n_t on (the copies
    and byte counts are predicated, so the ring's phases stay in step without a branch)."""
    slot = t % NUM_STAGES
    live = t < n_t
    row = (j0 + t) * ROWS
    # Written out, not as two _copy: both barrier views first, each slot view after its expect, the
    # order the kernels were measured with (the PTX of two _copy calls differs; NOTES.md).
    a_bar = a_bars.index(slot)
    b_bar = b_bars.index(slot)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + (ah_desc.block_type.nbytes if D1 > 0 else 0)
    mbarrier.expect(a_bar, nbytes, pred=live)
    tma.async_copy_global_to_shared(a_desc, [b, h, row, 0], a_bar, a_smem.index(slot), pred=live)
    if D1 > 0:
        tma.async_copy_global_to_shared(ah_desc, [b, h, row, BLOCK_D], a_bar, ah_smem.index(slot), pred=live)
    mbarrier.expect(b_bar, nbytes, pred=live)
    tma.async_copy_global_to_shared(b_desc, [b, h, row, 0], b_bar, b_smem.index(slot), pred=live)
    if D1 > 0:
        tma.async_copy_global_to_shared(bh_desc, [b, h, row, BLOCK_D], b_bar, bh_smem.index(slot), pred=live)


@gluon.jit
def _query_tile(H, BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(batch·head, batch, head, first row) of this program's query tile, grid (query tiles, B·H):
    causal programs take the heaviest query tiles first."""
    if IS_CAUSAL:
        # Causal work grows with the query tile index: the heaviest tiles start first.
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    else:
        pid_m = gl.program_id(0)
    pid_bh = gl.program_id(1)
    return pid_bh, pid_bh // H, pid_bh % H, pid_m * BLOCK_M


@gluon.jit
def _key_tiles(start_m, ROWS: gl.constexpr, N_K, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """(mid, n_tiles) of the ROWS query rows from start_m: key tiles [0, mid) are full and wholly below
    the causal diagonal (no masks); [mid, n_tiles) hold the diagonal and/or the ragged tail. Tiles
    above the diagonal are never loaded."""
    n_full = N_K // BLOCK_N
    if IS_CAUSAL:
        mid = gl.minimum(start_m // BLOCK_N, n_full)
        n_tiles = gl.cdiv(gl.minimum(start_m + ROWS, N_K), BLOCK_N)
    else:
        mid = n_full
        n_tiles = gl.cdiv(N_K, BLOCK_N)
    return mid, n_tiles


@gluon.jit
def _barriers(NUM_STAGES: gl.constexpr):
    """The non-specialized kernels' mbarriers (count 1): one for the resident tile(s), and one per
    ring slot for each of the ring's two operands; initialised and fenced (the copy engine must see
    them initialised before the first copy signals one)."""
    one = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    a_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    b_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(one, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(a_bars.index(i), count=1)
        mbarrier.init(b_bars.index(i), count=1)
    fence_async_shared()
    return one, a_bars, b_bars


@gluon.jit
def _invalidate(one, a_bars, b_bars, NUM_STAGES: gl.constexpr):
    """Invalidate what _barriers made."""
    mbarrier.invalidate(one)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(a_bars.index(i))
        mbarrier.invalidate(b_bars.index(i))


@gluon.jit
def _retire(acc, acc_h, a, a_h, D1: gl.constexpr):
    """Wait for every wgmma in flight: the accumulators (hi: D1 > 0 only) and the register A operands
    they read (kept live up to here), returned."""
    if D1 > 0:
        acc, acc_h, a, a_h = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc_h, a, a_h))
    else:
        acc, a = warpgroup_mma_wait(num_outstanding=0, deps=(acc, a))
    return acc, acc_h, a, a_h


@gluon.jit
def _store_rows(acc, acc_h, smem, smem_h, desc, desc_h, b, h, row0, ROWS: gl.constexpr, BLOCK_D: gl.constexpr,
                D1: gl.constexpr, scale=None):
    """An fp32 (ROWS, d) accumulator, lo and hi halves, times scale (None: as it is), in desc's dtype
    into its shared-memory tile (free: the caller has passed a barrier after every product that read
    it), then a TMA store (rows past N dropped). The caller waits for the store (tma.store_wait)."""
    dtype: gl.constexpr = desc.dtype
    if scale is not None:
        acc = acc * scale
    smem.reshape([ROWS, BLOCK_D]).store(acc.to(dtype))
    if D1 > 0:
        if scale is not None:
            acc_h = acc_h * scale
        smem_h.reshape([ROWS, D1]).store(acc_h.to(dtype))
    # Generic-proxy writes, then the copy engine reads them: fence in every thread, then a barrier.
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(desc, [b, h, row0, 0], smem)
    if D1 > 0:
        tma.async_copy_shared_to_global(desc_h, [b, h, row0, BLOCK_D], smem_h)


@gluon.jit
def _masked_pt(pt, offs_m, offs_n, N_K, MASKED: gl.constexpr, KEY_MASK: gl.constexpr):
    """The backward's Pᵀ (keys x queries) with its masks: MASKED, the causal one (query before key:
    0); KEY_MASK, keys past N_K (0: P of a padded key may be inf, a select is needed, not a product)."""
    if MASKED:
        pt = gl.where(gl.expand_dims(offs_m, 0) >= gl.expand_dims(offs_n, 1), pt, 0.0)
    if KEY_MASK:
        pt = gl.where(gl.expand_dims(offs_n < N_K, 1), pt, 0.0)
    return pt


@gluon.jit
def _row_stats(L_base, D_base, m0, N_Q, BLOCK_M: gl.constexpr, layout: gl.constexpr,
               PRESCALED: gl.constexpr = False):
    """The backward's per-query-row inputs of rows m0 .. m0 + BLOCK_M (in `layout`): (offs_m, lse·log2 e,
    D); rows past N_Q read as lse = D = 0 (with Q = dO = 0, zero-filled, their terms vanish). PRESCALED: L holds
    −lse·log2 e already (flash_gluon_bwd_ws's prescaled_lse), returned as loaded, with no multiply."""
    offs_m = m0 + gl.arange(0, BLOCK_M, layout=layout)
    in_q = offs_m < N_Q
    lse2 = gl.load(L_base + offs_m, mask=in_q, other=0.0)
    if not PRESCALED:
        lse2 = lse2 * 1.4426950408889634
    delta = gl.load(D_base + offs_m, mask=in_q, other=0.0)
    return offs_m, lse2, delta


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------

def _check_layout(name: str, t: Tensor, fn: str) -> None:
    """TMA's constraints on a (B, H, N, d) operand, each named (with the launcher fn) when it fails."""
    size = t.element_size()
    if t.stride(-1) != 1:
        raise ValueError(f"{fn}: {name} needs unit stride along the head dim (TMA), got strides "
                         f"{tuple(t.stride())}")
    if t.data_ptr() % 16:
        raise ValueError(f"{fn}: {name}'s data must start 16-byte aligned (TMA), got address "
                         f"{t.data_ptr():#x}")
    bad = [s for s in t.stride()[:-1] if (s * size) % 16]
    if bad:
        raise ValueError(f"{fn}: {name}'s strides must be multiples of 16 bytes (TMA), got strides "
                         f"{tuple(t.stride())} of {size}-byte elements")


def as_4d(x: Tensor) -> Tensor:
    return x.unsqueeze(1) if x.dim() == 3 else x


def validate(q: Tensor, k: Tensor, v: Tensor, fn: str = "flash_gluon_forward") -> None:
    """Raise ValueError naming the first constraint the inputs break (any device); fn, the launcher
    whose contract it checks, starts the message."""
    if q.dim() not in (3, 4) or k.dim() != q.dim() or v.dim() != q.dim():
        raise ValueError(f"{fn}: q, k, v must all be (B, H, N, d) or (B, N, d), got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"{fn}: q, k, v must share one dtype of bf16/fp16, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    d = q.shape[-1]
    if d not in HEAD_DIM_TILES:
        raise ValueError(f"{fn}: head dim must be one of {sorted(HEAD_DIM_TILES)}, got {d}")
    if k.shape != v.shape or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != d:
        raise ValueError(f"{fn}: k and v must be {tuple(q.shape[:-2])} x N_K x {d}, got "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[-2] < 1 or k.shape[-2] < 1:
        raise ValueError(f"{fn}: sequence lengths must be at least 1")
    if not (q.device == k.device == v.device):
        raise ValueError(f"{fn}: q, k, v on different devices: {q.device}, {k.device}, {v.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_layout(name, t, fn)


def check_device(device: torch.device, fn: str = "flash_gluon_forward") -> None:
    """RuntimeError off an sm_90 GPU, naming the launcher fn."""
    if device.type != "cuda":
        raise RuntimeError(f"{fn} runs on an sm_90 GPU (H100/H200); got a {device.type} tensor")
    cap = torch.cuda.get_device_capability(device)
    if cap != (9, 0):
        raise RuntimeError(f"{fn} is written for sm_90a (wgmma, TMA: H100/H200); "
                           f"{torch.cuda.get_device_name(device)} is sm_{cap[0]}{cap[1]}")


def check_shared(nbytes: int, d: int, config, fn: str = "flash_gluon_forward") -> None:
    """ValueError when a config needs more shared memory than an H100 block may use."""
    if nbytes > SM90_MAX_SHARED:
        raise ValueError(f"{fn}: {config} needs {nbytes} bytes of shared memory at head dim {d}, more than the "
                         f"{SM90_MAX_SHARED} an H100 block may use")


def dims(q4: Tensor, k4: Tensor) -> tuple:
    """(B, H, N_Q, N_K, d, lo, hi) of 4-D q and k: lo, hi the head-dim tiles."""
    B, H, n_q, d = q4.shape
    return (B, H, n_q, k4.shape[2], d, *HEAD_DIM_TILES[d])


def _descriptor(t: Tensor, rows: int, col0: int, width: int,
                swizzle: Optional[int] = None) -> Optional[TensorDescriptor]:
    """A rank-4 descriptor of blocks (1, 1, rows, width) over the 4-D t (bf16, fp16 or fp32; width 0:
    none). col0, the block's first column, is the kernel's coordinate, not the descriptor's. swizzle: the
    shared layout's swizzle width in bytes (None: the widest the block allows)."""
    if width == 0:
        return None
    block = [1, 1, rows, width]
    return TensorDescriptor(t, list(t.shape), list(t.stride()), block, shared_layout(rows, width, t.dtype, swizzle))


def shared_layout(rows: int, width: int, dtype: torch.dtype, swizzle: Optional[int] = None) -> gl.NVMMASharedLayout:
    """The shared layout of a (1, 1, rows, width) block of dtype (swizzle in bytes; None: the widest the block
    allows), built once: deriving it (get_default_for) was a tenth of a Gluon call's host time (NOTES.md). The
    layouts are frozen values, so descriptors may share one."""
    return _shared_layout(rows, width, dtype, swizzle)


@functools.cache  # every argument positional: one key per layout
def _shared_layout(rows: int, width: int, dtype: torch.dtype, swizzle: Optional[int]) -> gl.NVMMASharedLayout:
    gl_dtype = _DESC_DTYPES[dtype]
    block = [1, 1, rows, width]
    return (gl.NVMMASharedLayout.get_default_for(block, gl_dtype) if swizzle is None
            else gl.NVMMASharedLayout(swizzle, gl_dtype.primitive_bitwidth, rank=len(block)))


class LaunchLog:
    """What one launcher call allocated and launched, for flash_dispatch's call plans (flash_launch._logged_plan):
    `buffers`, the tensors it allocated, in order (the forwards' (o, lse); the ws backward's (fp32 dQ, dK, dV, D));
    `launches`, each kernel launch as (JIT function, grid, arguments, keyword arguments, the compiled kernel
    JITFunction.run returned); `cast`, the dtype the first buffer is returned in (the backward's fp32 dQ; None: as
    it is); `zeroed`, the indices of buffers a launch needs zeroed (the ws forward's dynamic tile counter), which a
    plan zeroes each call."""

    __slots__ = ("buffers", "launches", "cast", "zeroed")

    def __init__(self) -> None:
        self.buffers: list = []
        self.launches: list = []
        self.cast: Optional[torch.dtype] = None
        self.zeroed: list = []

    def add_zeroed(self, t: torch.Tensor) -> torch.Tensor:
        """Log t (a zeroed buffer the launch counts in) as a buffer a plan allocates zeroed again each call."""
        self.zeroed.append(len(self.buffers))
        self.buffers.append(t)
        return t


def launch(fn, grid: tuple, args: tuple, opts: dict, log: Optional[LaunchLog] = None) -> None:
    """fn[grid](*args, **opts), logged into `log` when one is given."""
    kernel = fn[grid](*args, **opts)
    if log is not None:
        log.launches.append((fn, grid, args, opts, kernel))


def descriptors(q4: Tensor, k4: Tensor, v4: Tensor, o4: Tensor, rows_q: int, rows_kv: int) -> tuple:
    """The forwards' and the dQ kernel's eight descriptors over 4-D q, k, v, o: Q, K, V, O lo halves,
    then the hi halves (None at d 64 and 128), with blocks of rows_q query rows and rows_kv key rows."""
    lo, hi = HEAD_DIM_TILES[q4.shape[-1]]
    return tuple(_descriptor(t, rows, col0, width) for col0, width in ((0, lo), (lo, hi))
                 for t, rows in ((q4, rows_q), (k4, rows_kv), (v4, rows_kv), (o4, rows_q)))


def forward_outputs(q: Tensor, k: Tensor, v: Tensor, fn: str, log: Optional[LaunchLog] = None) -> tuple:
    """The forwards' checks (ValueError, RuntimeError off sm_90, naming fn) and outputs: (o, lse), o
    contiguous in q's shape and dtype, lse fp32 of shape q.shape[:-1] (logged as buffers into `log`)."""
    validate(q, k, v, fn)
    check_device(q.device, fn)
    out = (torch.empty(q.shape, dtype=q.dtype, device=q.device),
           torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device))
    if log is not None:
        log.buffers.extend(out)
    return out
