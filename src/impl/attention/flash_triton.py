"""FlashAttention-2 in Triton: forward and backward kernels + autograd Function.

Layout / conventions
--------------------
* Inputs are ``(batch, seq, d)`` or ``(batch, heads, seq, d)`` (more leading
  dims are flattened).  Kernels take explicit strides of a 4-D
  ``(B, H, S, d)`` view, so non-contiguous inputs (e.g. ``x.transpose(1, 2)`` of a
  ``(B, S, H, d)`` tensor) are used without copies.
* Causal masking is **top-left aligned**, exactly like PyTorch's
  ``scaled_dot_product_attention(is_causal=True)``: query ``i`` attends to keys
  ``j <= i``.  ``seq_q != seq_k`` is allowed with and without masking.
* The head dim (16..128, any value) is tiled by ``_head_dim_tiles``: Triton's block
  shapes are powers of two, so d = 48, 80, 96 is split into two power-of-two tiles
  (``BLOCK_D`` + ``D1``: 32 + 16, 64 + 16, 64 + 32; the rest must be >= 16, a dot's
  least K) held as (lo, hi) pairs: products over d are two dots, products giving d
  columns two accumulators, each operand two loads or descriptors. Other head dims
  are padded to the next power of two (``BLOCK_D``, ``D1 = 0``; e.g. 24 on 32, 112
  on 128) with masked loads/stores. Sequence lengths need not be tile multiples.
* Softmax uses base-2 exponentials with ``scale * log2(e)`` folded into the
  scores; the saved ``L`` is the natural-log logsumexp in float32 with shape
  ``q.shape[:-1]``.
* The forward kernel splits the key loop in two: tiles entirely below the
  causal diagonal and inside ``seq_k`` run without any masking, only the
  diagonal / ragged-tail tiles apply masks (causal masked scores use -1e6).
  Key tiles entirely above the diagonal are skipped via the loop bound.
* Backward, two variants (chosen per shape by :mod:`impl.attention.backward_choice`):
  - two-pass (no atomics): one kernel computes dQ (grid over query tiles, looping over key tiles up
    to the diagonal) and ``D = rowsum(O * dO)`` of its rows, which it stores; then one kernel
    computes dK, dV (grid over key tiles, looping over query tiles starting at the diagonal for
    causal) reading D.  Two launches.
  - single-pass (atomic): a small kernel computes D and zeroes an fp32 dQ buffer; one kernel per
    key tile computes dK, dV and adds dS·K of each query tile to that buffer atomically (5 tile
    products per tile pair instead of 7); the buffer is cast to the input dtype (fp32 inputs
    accumulate into dQ itself).
  fp32 accumulation, outputs in the input dtype.  The key-tile loops split: full query tiles
  without row masks, then the ragged tail.
* Streamed tiles (K, V in the forward and the dQ pass; Q, dO in the dK/dV pass)
  are loaded through tensor descriptors (TMA on Hopper: the copy engine computes
  addresses and zero-fills out-of-bounds rows and padded head-dim columns) when
  the layout allows it (unit stride along d, 16-byte aligned strides), else by
  pointer arithmetic with masks; ``set_tma(False)`` forces the pointer path.
* The backward implementation is chosen by the module-level ``BACKWARD``
  (``"triton"``, the default, or ``"compiled"`` for the ``torch.compile``'d
  PyTorch backward of :mod:`impl.attention.flash_backward`).
* torch.compile: the two launchers are the custom ops ``impl_flash::triton_forward`` and
  ``impl_flash::triton_backward`` (with fake implementations), so a graph through
  FlashAttentionTriton (a whole model's, with ``fullgraph=True``) has no graph break; the
  kernels run as opaque nodes of it.

Autotuning: configs come from functions that check
``os.environ.get("TRITON_INTERPRET") == "1"`` at import time; under the
interpreter a single small config is used (autotuning there would run every
config through the slow interpreter, and GPU-sized tiles are slow to emulate).

Importing this module never touches CUDA.
"""

from __future__ import annotations

import math
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl

from impl.runtime import launch_ctx

from .backward_choice import ShapeKey, last_backward_choice, resolve_backward
from .flash_backward import compiled_flash_backward, flash_backward
from .flash_torch import validate_inputs

Tensor = torch.Tensor

#: Backward implementation used by FlashAttentionTriton: "triton" or "compiled".
BACKWARD = "triton"
_BACKWARD_KINDS = ("triton", "compiled")

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


# triton.jit decides at decoration time whether kernels run in the interpreter.
_INTERPRETED = _interpreting()


# ---------------------------------------------------------------------------
# Autotune configs
# ---------------------------------------------------------------------------

# Keyed on a power-of-two bucket of the sequence length, capped: past a few thousand keys the
# best tile no longer changes, and exact lengths would re-tune (and re-benchmark ~20 configs) for
# every new shape of a sweep. Triton adds the tensor dtypes to the key itself.
_AUTOTUNE_KEY = ["SEQ_BUCKET", "HEAD_DIM", "IS_CAUSAL"]
_SEQ_BUCKET_CAP = 4096


# Plain integer helpers for the launch path: triton.cdiv and triton.next_power_of_2 are
# constexpr_function objects whose Python wrapper (argument unwrapping) cost ~7 us per call on the
# CPU here, four per forward launch (NOTES.md, Version 4).
def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else 1


def _seq_bucket(n_q: int, n_k: int) -> int:
    return min(max(16, _next_power_of_2(max(n_q, n_k))), _SEQ_BUCKET_CAP)


# (BLOCK_M, BLOCK_N, num_warps, num_stages) that fit in shared memory for every supported
# dtype and head dim (fp32 with d=128 included); used when autotuning is switched off.
_FWD_SAFE = (64, 64, 4, 2)
_BWD_KV_SAFE = (32, 64, 4, 2)
_BWD_Q_SAFE = (64, 32, 4, 2)
_BWD_ATOMIC_SAFE = (32, 64, 4, 2)


def _config(shape) -> triton.Config:
    m, n, w, s = shape
    return triton.Config({"BLOCK_M": m, "BLOCK_N": n}, num_warps=w, num_stages=s)


def _configs(shapes, interpreter_shape) -> List[triton.Config]:
    """The autotune list; under the interpreter a single small config (autotuning there would only
    multiply the slow interpreted runs)."""
    return [_config(interpreter_shape)] if _interpreting() else [_config(shape) for shape in shapes]


# The lists hold the fastest configs of the per-kernel sweeps at the leaderboard shape (bf16, causal,
# 16 x 16384 x 64; tools/probes/flash_tune.py and flash_variants.py, their JSON under
# reports/data/nvidia-h100-80gb-hbm3/probes/; NOTES.md), first, plus the ones earlier versions kept for
# the other head dims and fp32.
def _fwd_configs() -> List[triton.Config]:
    return _configs([(64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 4), (128, 64, 8, 3), (128, 64, 4, 3),
                     (128, 128, 8, 3), (128, 32, 4, 4), (64, 32, 4, 4), _FWD_SAFE], interpreter_shape=(32, 16, 4, 1))


def _bwd_kv_configs() -> List[triton.Config]:
    # BLOCK_N: key tile held by the program; BLOCK_M: query tile of the loop.
    return _configs([(64, 64, 4, 3), (64, 128, 4, 3), (32, 64, 4, 4), (128, 128, 8, 2), (32, 128, 8, 3),
                     (64, 128, 4, 2), (32, 128, 4, 3), (32, 64, 4, 3), _BWD_KV_SAFE], interpreter_shape=(16, 32, 4, 1))


def _bwd_q_configs() -> List[triton.Config]:
    # BLOCK_M: query tile held by the program; BLOCK_N: key tile of the loop.
    return _configs([(64, 64, 4, 3), (128, 64, 4, 4), (128, 64, 8, 5), (128, 64, 8, 3), (128, 64, 4, 3),
                     (128, 32, 4, 3), (64, 32, 4, 3), _BWD_Q_SAFE], interpreter_shape=(32, 16, 4, 1))


def _bwd_atomic_configs() -> List[triton.Config]:
    # BLOCK_N: key tile held by the program; BLOCK_M: query tile of the loop. Not yet measured on a
    # GPU (NOTES.md, Version 4): the dK/dV kernel's winner and wide key tiles, which halve the atomic
    # dQ traffic per tile product (one BLOCK_M x d reduction per BLOCK_M x BLOCK_N tile); 128-wide
    # key tiles with 4 warps spill 0.2-7 KB of registers at sm_90 (ptxas), so they are left out.
    return _configs([(64, 64, 4, 3), (64, 128, 8, 2), (32, 128, 8, 3), (32, 64, 4, 3), _BWD_ATOMIC_SAFE],
                    interpreter_shape=(16, 32, 4, 1))


# fp32 tiles take twice the shared memory and registers of 16-bit ones and three tensor-core passes
# each (tf32x3): the large tiles spill or overflow shared memory and are slow to compile (the first
# fp32 flash_benchmarking runs on the H100 spent minutes autotuning before a row finished), so fp32
# autotunes over tiles of at most 64 x 64 only.
_FP32_MAX_TILE = 64 * 64


def _prune_for_dtype(configs, nargs, **kwargs) -> List[triton.Config]:
    if nargs["Q"].dtype != torch.float32:
        return configs
    small = [c for c in configs if c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"] <= _FP32_MAX_TILE]
    return small or configs[-1:]


_PRUNE = {"early_config_prune": _prune_for_dtype}

# fp32 in the single-pass backward at a 128-wide head-dim tile (d 128, and the padded 65-79, 97-127):
# every listed config asks for more shared memory than the H100's 227 KB per block (32 x 64 tiles:
# 262 KB; sm_90 compiles on the CPU, NOTES.md), so the launcher pins 32 x 32 tiles there (131-148 KB),
# bypassing the autotuner. The split d 80 / 96 (64 + 16 / 32) fit the listed tiles: 160 / 189 KB at
# 32 x 64. correctness/test_attention.py compiles each pick for sm_90 and checks its shared memory.
_FP32_WIDE_ATOMIC = (32, 32, 4, 2)
SM90_MAX_SHARED = 232_448  # bytes a block may opt into on the H100 (227 KB)


def _pinned_atomic_config(dtype: torch.dtype, d: int) -> Optional[triton.Config]:
    block_d, d1 = _head_dim_tiles(d)
    return _config(_FP32_WIDE_ATOMIC) if dtype == torch.float32 and block_d + d1 > 96 else None

_PRE_BLOCK_M = 32 if _interpreting() else 64


# ---------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------

@triton.jit
def _dot(a, b, acc=None):
    """Tile product with fp32 accumulation (into `acc` when given). fp32 operands take three TF32
    passes (close to fp32 accuracy): Triton's default for an fp32 dot is one TF32 pass, whose ~1e-3
    relative error on the scores is far outside fp32 tolerances (seen on the H100: large scores, a
    single key)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, acc, input_precision="tf32x3")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _load_tile(ptrs, offs_r, n_r, offs_d, CHECK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Load a (rows, BLOCK_D) tile; rows masked when CHECK_R, d masked when padded."""
    if CHECK_R:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs, mask=offs_r[:, None] < n_r, other=0.0)
        else:
            x = tl.load(ptrs, mask=(offs_r[:, None] < n_r) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    else:
        if BLOCK_D == HEAD_DIM:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def _store_tile(ptrs, x, offs_r, n_r, offs_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    if BLOCK_D == HEAD_DIM:
        tl.store(ptrs, x, mask=offs_r[:, None] < n_r)
    else:
        tl.store(ptrs, x, mask=(offs_r[:, None] < n_r) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _atomic_add_tile(ptrs, x, offs_r, n_r, offs_d, CHECK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    """Relaxed fp32 atomic adds of a tile (no fences: only the sum matters), masked like _load_tile."""
    if CHECK_R:
        if BLOCK_D == HEAD_DIM:
            tl.atomic_add(ptrs, x, mask=offs_r[:, None] < n_r, sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=(offs_r[:, None] < n_r) & (offs_d[None, :] < HEAD_DIM), sem="relaxed")
    else:
        if BLOCK_D == HEAD_DIM:
            tl.atomic_add(ptrs, x, sem="relaxed")
        else:
            tl.atomic_add(ptrs, x, mask=offs_d[None, :] < HEAD_DIM, sem="relaxed")


# ---------------------------------------------------------------------------
# Head-dim tiles
# ---------------------------------------------------------------------------
# Triton's block shapes are powers of two, so a head dim is held either as one tile of BLOCK_D
# columns, the next power of two, masked past HEAD_DIM (D1 == 0), or split (D1 > 0) into a lo tile
# of BLOCK_D columns and a hi tile of D1 columns at column BLOCK_D, both powers of two >= 16 (80 =
# 64 + 16): a K = 16 dot is one wgmma, so the split computes on d columns, not on the padding.
# Every d-wide value is a (lo, hi) pair; without a split hi is the constant 0 and every `if D1 > 0`
# is compiled out, which leaves the one-tile code. _head_dim_tiles (host) picks BLOCK_D and D1.

@triton.jit
def _pair_ptrs(base, offs_r, stride_r, stride_d, COL0: tl.constexpr, WIDTH: tl.constexpr):
    """Pointers to columns [COL0, COL0 + WIDTH) of rows offs_r, and the tile's column offsets."""
    offs_d = tl.arange(0, WIDTH)
    return base + offs_r[:, None] * stride_r + (COL0 + offs_d)[None, :] * stride_d, offs_d


@triton.jit
def _load_pair(base, offs_r, n_r, stride_r, stride_d, CHECK_R: tl.constexpr, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, D1: tl.constexpr):
    """Rows offs_r of a (n_r, HEAD_DIM) operand as its (lo, hi) tiles; zeros past n_r (CHECK_R)
    and in the padded columns."""
    ptrs, offs_d = _pair_ptrs(base, offs_r, stride_r, stride_d, 0, BLOCK_D)
    lo = _load_tile(ptrs, offs_r, n_r, offs_d, CHECK_R, HEAD_DIM - D1, BLOCK_D)
    hi = 0
    if D1 > 0:
        ptrs, offs_d = _pair_ptrs(base, offs_r, stride_r, stride_d, BLOCK_D, D1)
        hi = _load_tile(ptrs, offs_r, n_r, offs_d, CHECK_R, D1, D1)
    return lo, hi


@triton.jit
def _store_pair(base, x, offs_r, n_r, stride_r, stride_d, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                D1: tl.constexpr):
    """Store the pair x (cast to base's element type) into rows offs_r < n_r."""
    ptrs, offs_d = _pair_ptrs(base, offs_r, stride_r, stride_d, 0, BLOCK_D)
    _store_tile(ptrs, x[0].to(base.dtype.element_ty), offs_r, n_r, offs_d, HEAD_DIM - D1, BLOCK_D)
    if D1 > 0:
        ptrs, offs_d = _pair_ptrs(base, offs_r, stride_r, stride_d, BLOCK_D, D1)
        _store_tile(ptrs, x[1].to(base.dtype.element_ty), offs_r, n_r, offs_d, D1, D1)


@triton.jit
def _rows_source(base, n_r, stride_r, BLOCK_R: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 D1: tl.constexpr, TMA: tl.constexpr):
    """What _load_rows reads a streamed (rows, d) operand from: tensor descriptors of its lo and hi
    tiles (TMA: the copy engine computes the addresses and zero-fills rows >= n_r and columns >=
    HEAD_DIM), or the base pointer itself."""
    if TMA:
        lo = tl.make_tensor_descriptor(base, shape=[n_r, HEAD_DIM], strides=[stride_r, 1],
                                       block_shape=[BLOCK_R, BLOCK_D])
        hi = 0
        if D1 > 0:
            hi = tl.make_tensor_descriptor(base, shape=[n_r, HEAD_DIM], strides=[stride_r, 1],
                                           block_shape=[BLOCK_R, D1])
        return lo, hi
    else:
        return base, 0


@triton.jit
def _load_rows(src, start, offs_r0, n_r, stride_r, stride_d, CHECK_R: tl.constexpr,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, TMA: tl.constexpr):
    """Rows [start, start + len(offs_r0)) of a (n_r, HEAD_DIM) operand as its (lo, hi) tiles,
    zeros outside (masks only where CHECK_R / the head dim is padded)."""
    if TMA:
        lo = src[0].load([start, 0])
        hi = 0
        if D1 > 0:
            hi = src[1].load([start, BLOCK_D])
        return lo, hi
    else:
        return _load_pair(src[0], start + offs_r0, n_r, stride_r, stride_d, CHECK_R, HEAD_DIM, BLOCK_D, D1)


@triton.jit
def _atomic_add_rows(dst, x, start, offs_r0, n_r, stride_r, stride_d, CHECK_R: tl.constexpr,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, TMA: tl.constexpr):
    """Add the fp32 pair x to rows [start, ...) of dst (a _rows_source): one bulk reduce-add per tile
    through descriptors (TMA; rows past n_r dropped by their bounds), else element atomics."""
    if TMA:
        dst[0].atomic_add([start, 0], x[0])
        if D1 > 0:
            dst[1].atomic_add([start, BLOCK_D], x[1])
    else:
        offs_r = start + offs_r0
        ptrs, offs_d = _pair_ptrs(dst[0], offs_r, stride_r, stride_d, 0, BLOCK_D)
        _atomic_add_tile(ptrs, x[0], offs_r, n_r, offs_d, CHECK_R, HEAD_DIM - D1, BLOCK_D)
        if D1 > 0:
            ptrs, offs_d = _pair_ptrs(dst[0], offs_r, stride_r, stride_d, BLOCK_D, D1)
            _atomic_add_tile(ptrs, x[1], offs_r, n_r, offs_d, CHECK_R, D1, D1)


@triton.jit
def _zeros_pair(ROWS: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr):
    """fp32 zeros shaped like a pair of ROWS rows."""
    lo = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    hi = 0
    if D1 > 0:
        hi = tl.zeros([ROWS, D1], dtype=tl.float32)
    return lo, hi


@triton.jit
def _scale_pair(x, s, D1: tl.constexpr):
    """x * s for both tiles (s a scalar or a [:, None] column)."""
    lo = x[0] * s
    hi = 0
    if D1 > 0:
        hi = x[1] * s
    return lo, hi


@triton.jit
def _dot_d(a, b, D1: tl.constexpr):
    """a · bᵀ contracted over the head dim (pairs a, b of equal widths): fp32 (rows_a, rows_b); split,
    the hi tiles' product accumulates onto the lo tiles'."""
    s = _dot(a[0], tl.trans(b[0]))
    if D1 > 0:
        s = _dot(a[1], tl.trans(b[1]), s)
    return s


@triton.jit
def _dot_cols(p, x, D1: tl.constexpr):
    """p · x for each tile of the pair x: a pair of fp32 products."""
    lo = _dot(p, x[0])
    hi = 0
    if D1 > 0:
        hi = _dot(p, x[1])
    return lo, hi


@triton.jit
def _dot_cols_acc(p, x, acc, D1: tl.constexpr):
    """acc + p · x for each tile of the pairs x and acc."""
    lo = _dot(p, x[0], acc[0])
    hi = 0
    if D1 > 0:
        hi = _dot(p, x[1], acc[1])
    return lo, hi


@triton.jit
def _rowsum_product(a, b, D1: tl.constexpr):
    """rowsum(a * b) over the head dim in fp32 (D = rowsum(O * dO))."""
    s = tl.sum(a[0].to(tl.float32) * b[0].to(tl.float32), axis=1)
    if D1 > 0:
        s += tl.sum(a[1].to(tl.float32) * b[1].to(tl.float32), axis=1)
    return s


# ---------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------

@triton.jit
def _attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_kn, stride_kd, stride_vn, stride_vd,
                    offs_m, lo, hi, N_K, qk_scale,
                    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr,
                    MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """Online-softmax loop over key tiles [lo, hi).  MASKED: apply bounds/causal masks."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(k_src, start_n, offs_n0, N_K, stride_kn, stride_kd, MASKED, HEAD_DIM, BLOCK_D, D1, TMA)
        qk = _dot_d(q, k, D1)
        if MASKED:
            offs_n = start_n + offs_n0
            valid = offs_n[None, :] < N_K
            if IS_CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            qk = tl.where(valid, qk * qk_scale, -1.0e6)  # base-2 scaled scores
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_new[:, None]
        else:
            # the scale folds into the max and one fused multiply-add per score
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_new[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _load_rows(v_src, start_n, offs_n0, N_K, stride_vn, stride_vd, MASKED, HEAD_DIM, BLOCK_D, D1, TMA)
        acc = _dot_cols_acc(p.to(v[0].dtype), v, _scale_pair(acc, alpha[:, None], D1), D1)
        m_i = m_new
    return acc, l_i, m_i


@triton.autotune(configs=_fwd_configs(), key=_AUTOTUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit
def _attn_fwd(Q, K, V, O, L,
              stride_qb, stride_qh, stride_qs, stride_qd,
              stride_kb, stride_kh, stride_ks, stride_kd,
              stride_vb, stride_vh, stride_vs, stride_vd,
              stride_ob, stride_oh, stride_os, stride_od,
              H, N_Q, N_K, SEQ_BUCKET, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, IS_CAUSAL: tl.constexpr,
              TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    if IS_CAUSAL:
        # Causal work grows with the query tile index: launch the heaviest tiles first.
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    k_src = _rows_source(K + b * stride_kb + h * stride_kh, N_K, stride_ks, BLOCK_N, HEAD_DIM, BLOCK_D, D1, TMA)
    v_src = _rows_source(V + b * stride_vb + h * stride_vh, N_K, stride_vs, BLOCK_N, HEAD_DIM, BLOCK_D, D1, TMA)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_pair(Q + b * stride_qb + h * stride_qh, offs_m, N_Q, stride_qs, stride_qd, True, HEAD_DIM, BLOCK_D, D1)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = _zeros_pair(BLOCK_M, BLOCK_D, D1)

    # Key tiles [0, mid) are full and (for causal) entirely below the diagonal:
    # no masks.  Tiles [mid, hi) hold the diagonal and/or the ragged tail.
    n_full = (N_K // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        mid = tl.minimum((start_m // BLOCK_N) * BLOCK_N, n_full)
        hi = tl.minimum(start_m + BLOCK_M, N_K)  # skip tiles above the diagonal
    else:
        mid = n_full
        hi = N_K
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_kd, stride_vs, stride_vd,
                                    offs_m, 0, mid, N_K, qk_scale,
                                    BLOCK_N, HEAD_DIM, BLOCK_D, D1, False, IS_CAUSAL, TMA)
    acc, l_i, m_i = _attn_fwd_inner(acc, l_i, m_i, q, k_src, v_src, stride_ks, stride_kd, stride_vs, stride_vd,
                                    offs_m, mid, hi, N_K, qk_scale,
                                    BLOCK_N, HEAD_DIM, BLOCK_D, D1, True, IS_CAUSAL, TMA)

    o = (acc[0] / l_i[:, None], acc[1] / l_i[:, None] if D1 > 0 else 0)
    _store_pair(O + b * stride_ob + h * stride_oh, o, offs_m, N_Q, stride_os, stride_od, HEAD_DIM, BLOCK_D, D1)
    lse = (m_i + tl.math.log2(l_i)) * 0.6931471805599453  # natural-log logsumexp
    tl.store(L + pid_bh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


# ---------------------------------------------------------------------------
# Backward
# ---------------------------------------------------------------------------

@triton.jit
def _attn_bwd_preprocess(O, DO, Delta, DQ,
                         stride_ob, stride_oh, stride_os, stride_od,
                         stride_dob, stride_doh, stride_dos, stride_dod,
                         stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                         H, N_Q,
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr):
    """Delta = rowsum(O * dO) in fp32, shape (B*H, N_Q), and zeros into the single-pass backward's
    fp32 dQ accumulator DQ (one launch for both: no separate memset)."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load_pair(O + b * stride_ob + h * stride_oh, offs_m, N_Q, stride_os, stride_od, True, HEAD_DIM, BLOCK_D, D1)
    do = _load_pair(DO + b * stride_dob + h * stride_doh, offs_m, N_Q, stride_dos, stride_dod, True,
                    HEAD_DIM, BLOCK_D, D1)
    tl.store(Delta + pid_bh.to(tl.int64) * N_Q + offs_m, _rowsum_product(o, do, D1), mask=offs_m < N_Q)
    _store_pair(DQ + b * stride_dqb + h * stride_dqh, _zeros_pair(BLOCK_M, BLOCK_D, D1), offs_m, N_Q,
                stride_dqs, stride_dqd, HEAD_DIM, BLOCK_D, D1)


@triton.jit
def _load_query_tile(q_src, do_src, l_base, d_base, start_m, offs_m0, offs_m, N_Q,
                     stride_qs, stride_qd, stride_dos, stride_dod,
                     CHECK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr,
                     TMA: tl.constexpr):
    """One query tile's Q, dO, logsumexp and D, for the key-tile backward loops (all four loads
    issued together, before the tile's first product)."""
    q = _load_rows(q_src, start_m, offs_m0, N_Q, stride_qs, stride_qd, CHECK_M, HEAD_DIM, BLOCK_D, D1, TMA)
    do = _load_rows(do_src, start_m, offs_m0, N_Q, stride_dos, stride_dod, CHECK_M, HEAD_DIM, BLOCK_D, D1, TMA)
    if CHECK_M:
        lse = tl.load(l_base + offs_m, mask=offs_m < N_Q, other=0.0)
        delta = tl.load(d_base + offs_m, mask=offs_m < N_Q, other=0.0)
    else:
        lse = tl.load(l_base + offs_m)
        delta = tl.load(d_base + offs_m)
    return q, do, lse, delta


@triton.jit
def _attn_bwd_kv_inner(dk, dv, k, v, q_src, do_src, l_base, d_base,
                       stride_qs, stride_qd, stride_dos, stride_dod,
                       offs_n, lo, hi, N_Q, qk_scale,
                       BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr,
                       CAUSAL_MASK: tl.constexpr, CHECK_M: tl.constexpr, TMA: tl.constexpr):
    """Accumulate dK, dV of one key tile over query tiles [lo, hi).

    Works on transposed scores (keys x queries).  Out-of-range query rows (CHECK_M: the ragged tail) are loaded as zeros (Q, dO, L,
    Delta), which makes their contribution exactly 0.  Out-of-range key rows (K = V = 0) may
    produce large/inf values, but only in their own rows of dK/dV, which are never stored.
    CAUSAL_MASK applies the causal mask (the diagonal tiles).  All four loads of an iteration are
    issued before its first tile product (measured on the H100: 2.35 ms for this kernel on the
    leaderboard shape, against 2.99 ms with dO loaded after the exponentials; NOTES.md).
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        q, do, lse, delta = _load_query_tile(q_src, do_src, l_base, d_base, start_m, offs_m0, offs_m, N_Q,
                                             stride_qs, stride_qd, stride_dos, stride_dod,
                                             CHECK_M, HEAD_DIM, BLOCK_D, D1, TMA)
        pT = tl.math.exp2(_dot_d(k, q, D1) * qk_scale - lse[None, :] * 1.4426950408889634)
        if CAUSAL_MASK:
            pT = tl.where(offs_m[None, :] >= offs_n[:, None], pT, 0.0)
        dv = _dot_cols_acc(pT.to(do[0].dtype), do, dv, D1)
        dsT = pT * (_dot_d(v, do, D1) - delta[None, :])
        dk = _dot_cols_acc(dsT.to(q[0].dtype), q, dk, D1)
    return dk, dv


@triton.jit
def _key_tile_setup(Q, K, V, DO, L, Delta, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_kd,
                    stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh, stride_dos, H, N_Q, N_K,
                    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, TMA: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """What both key-tile backward kernels (two-pass dK/dV and single-pass) start from: this
    program's (batch, head), its key tile (K and V loaded, dK and dV zeroed), and where its loop
    reads the query side from (Q and dO sources, the rows of L and D)."""
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    q_src = _rows_source(Q + b * stride_qb + h * stride_qh, N_Q, stride_qs, BLOCK_M, HEAD_DIM, BLOCK_D, D1, TMA)
    do_src = _rows_source(DO + b * stride_dob + h * stride_doh, N_Q, stride_dos, BLOCK_M, HEAD_DIM, BLOCK_D, D1,
                          TMA)
    l_base = L + pid_bh.to(tl.int64) * N_Q
    d_base = Delta + pid_bh.to(tl.int64) * N_Q
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    k = _load_pair(K + b * stride_kb + h * stride_kh, offs_n, N_K, stride_ks, stride_kd, True, HEAD_DIM, BLOCK_D, D1)
    v = _load_pair(V + b * stride_vb + h * stride_vh, offs_n, N_K, stride_vs, stride_vd, True, HEAD_DIM, BLOCK_D, D1)
    dk = _zeros_pair(BLOCK_N, BLOCK_D, D1)
    dv = _zeros_pair(BLOCK_N, BLOCK_D, D1)
    return b, h, pid_bh, start_n, offs_n, q_src, do_src, l_base, d_base, k, v, dk, dv


@triton.jit
def _store_dk_dv(DK, DV, dk, dv, b, h, offs_n, N_K, sm_scale, stride_dkb, stride_dkh, stride_dks, stride_dkd,
                 stride_dvb, stride_dvh, stride_dvs, stride_dvd,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr):
    """A key tile's dK (scaled by sm_scale here, once, not per product) and dV."""
    _store_pair(DK + b * stride_dkb + h * stride_dkh, _scale_pair(dk, sm_scale, D1), offs_n, N_K,
                stride_dks, stride_dkd, HEAD_DIM, BLOCK_D, D1)
    _store_pair(DV + b * stride_dvb + h * stride_dvh, dv, offs_n, N_K, stride_dvs, stride_dvd, HEAD_DIM, BLOCK_D, D1)


@triton.autotune(configs=_bwd_kv_configs(), key=_AUTOTUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, L, Delta,
                   stride_qb, stride_qh, stride_qs, stride_qd,
                   stride_kb, stride_kh, stride_ks, stride_kd,
                   stride_vb, stride_vh, stride_vs, stride_vd,
                   stride_dob, stride_doh, stride_dos, stride_dod,
                   stride_dkb, stride_dkh, stride_dks, stride_dkd,
                   stride_dvb, stride_dvh, stride_dvs, stride_dvd,
                   H, N_Q, N_K, SEQ_BUCKET, sm_scale, qk_scale,
                   HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, IS_CAUSAL: tl.constexpr,
                   TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    b, h, pid_bh, start_n, offs_n, q_src, do_src, l_base, d_base, k, v, dk, dv = _key_tile_setup(
        Q, K, V, DO, L, Delta, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh, stride_dos, H, N_Q, N_K,
        HEAD_DIM, BLOCK_D, D1, TMA, BLOCK_M, BLOCK_N)

    if IS_CAUSAL:
        # Query tiles before the one containing query `start_n` see none of
        # these keys: skip them.  Tiles [lo, mid) straddle the diagonal
        # (masked); tiles from mid on have every query >= every key (unmasked).
        lo = (start_n // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N_Q)
        dk, dv = _attn_bwd_kv_inner(dk, dv, k, v, q_src, do_src, l_base, d_base,
                                    stride_qs, stride_qd, stride_dos, stride_dod,
                                    offs_n, lo, mid, N_Q, qk_scale,
                                    BLOCK_M, HEAD_DIM, BLOCK_D, D1, True, True, TMA)
    else:
        mid = 0
    # Full query tiles without row masks, then the ragged tail (if any) with them.
    full = tl.maximum((N_Q // BLOCK_M) * BLOCK_M, mid)
    dk, dv = _attn_bwd_kv_inner(dk, dv, k, v, q_src, do_src, l_base, d_base,
                                stride_qs, stride_qd, stride_dos, stride_dod,
                                offs_n, mid, full, N_Q, qk_scale,
                                BLOCK_M, HEAD_DIM, BLOCK_D, D1, False, False, TMA)
    dk, dv = _attn_bwd_kv_inner(dk, dv, k, v, q_src, do_src, l_base, d_base,
                                stride_qs, stride_qd, stride_dos, stride_dod,
                                offs_n, full, N_Q, N_Q, qk_scale,
                                BLOCK_M, HEAD_DIM, BLOCK_D, D1, False, True, TMA)

    _store_dk_dv(DK, DV, dk, dv, b, h, offs_n, N_K, sm_scale, stride_dkb, stride_dkh, stride_dks, stride_dkd,
                 stride_dvb, stride_dvh, stride_dvs, stride_dvd, HEAD_DIM, BLOCK_D, D1)


@triton.jit
def _attn_bwd_q_inner(dq, q, do, lse2, delta, k_src, v_src,
                      stride_ks, stride_kd, stride_vs, stride_vd,
                      offs_m, lo, hi, N_K, qk_scale,
                      BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr,
                      MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, TMA: tl.constexpr):
    """Accumulate dQ of one query tile over key tiles [lo, hi); `lse2` is L in base 2."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = _load_rows(k_src, start_n, offs_n0, N_K, stride_ks, stride_kd, MASKED, HEAD_DIM, BLOCK_D, D1, TMA)
        v = _load_rows(v_src, start_n, offs_n0, N_K, stride_vs, stride_vd, MASKED, HEAD_DIM, BLOCK_D, D1, TMA)
        p = tl.math.exp2(_dot_d(q, k, D1) * qk_scale - lse2[:, None])
        if MASKED:
            offs_n = start_n + offs_n0
            valid = offs_n[None, :] < N_K
            if IS_CAUSAL:
                valid = valid & (offs_m[:, None] >= offs_n[None, :])
            p = tl.where(valid, p, 0.0)
        ds = p * (_dot_d(do, v, D1) - delta[:, None])
        dq = _dot_cols_acc(ds.to(k[0].dtype), k, dq, D1)
    return dq


@triton.autotune(configs=_bwd_q_configs(), key=_AUTOTUNE_KEY, prune_configs_by=_PRUNE)
@triton.jit
def _attn_bwd_dq(Q, K, V, O, DO, DQ, L, Delta,
                 stride_qb, stride_qh, stride_qs, stride_qd,
                 stride_kb, stride_kh, stride_ks, stride_kd,
                 stride_vb, stride_vh, stride_vs, stride_vd,
                 stride_ob, stride_oh, stride_os, stride_od,
                 stride_dob, stride_doh, stride_dos, stride_dod,
                 stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                 H, N_Q, N_K, SEQ_BUCKET, sm_scale, qk_scale,
                 HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, IS_CAUSAL: tl.constexpr,
                 TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dQ of one query tile. Runs first: it computes D = rowsum(O * dO) of its rows itself (it holds
    dO already) and stores it for the dK/dV kernel, so the backward needs no preprocessing launch."""
    if IS_CAUSAL:
        pid_m = tl.num_programs(0) - 1 - tl.program_id(0)  # heaviest query tiles first
    else:
        pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    k_src = _rows_source(K + b * stride_kb + h * stride_kh, N_K, stride_ks, BLOCK_N, HEAD_DIM, BLOCK_D, D1, TMA)
    v_src = _rows_source(V + b * stride_vb + h * stride_vh, N_K, stride_vs, BLOCK_N, HEAD_DIM, BLOCK_D, D1, TMA)

    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    m_mask = offs_m < N_Q
    q = _load_pair(Q + b * stride_qb + h * stride_qh, offs_m, N_Q, stride_qs, stride_qd, True, HEAD_DIM, BLOCK_D, D1)
    do = _load_pair(DO + b * stride_dob + h * stride_doh, offs_m, N_Q, stride_dos, stride_dod, True,
                    HEAD_DIM, BLOCK_D, D1)
    o = _load_pair(O + b * stride_ob + h * stride_oh, offs_m, N_Q, stride_os, stride_od, True, HEAD_DIM, BLOCK_D, D1)
    delta = _rowsum_product(o, do, D1)
    tl.store(Delta + pid_bh.to(tl.int64) * N_Q + offs_m, delta, mask=m_mask)
    lse2 = tl.load(L + pid_bh.to(tl.int64) * N_Q + offs_m, mask=m_mask, other=0.0) * 1.4426950408889634
    dq = _zeros_pair(BLOCK_M, BLOCK_D, D1)

    n_full = (N_K // BLOCK_N) * BLOCK_N
    if IS_CAUSAL:
        mid = tl.minimum((start_m // BLOCK_N) * BLOCK_N, n_full)
        hi = tl.minimum(start_m + BLOCK_M, N_K)
    else:
        mid = n_full
        hi = N_K
    dq = _attn_bwd_q_inner(dq, q, do, lse2, delta, k_src, v_src, stride_ks, stride_kd, stride_vs, stride_vd,
                           offs_m, 0, mid, N_K, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D, D1, False, IS_CAUSAL, TMA)
    dq = _attn_bwd_q_inner(dq, q, do, lse2, delta, k_src, v_src, stride_ks, stride_kd, stride_vs, stride_vd,
                           offs_m, mid, hi, N_K, qk_scale, BLOCK_N, HEAD_DIM, BLOCK_D, D1, True, IS_CAUSAL, TMA)
    _store_pair(DQ + b * stride_dqb + h * stride_dqh, _scale_pair(dq, sm_scale, D1), offs_m, N_Q,
                stride_dqs, stride_dqd, HEAD_DIM, BLOCK_D, D1)


@triton.jit
def _attn_bwd_atomic_inner(dk, dv, k, v, q_src, do_src, dq_dst, l_base, d_base,
                           stride_qs, stride_qd, stride_dos, stride_dod, stride_dqs, stride_dqd,
                           offs_n, lo, hi, N_Q, N_K, sm_scale, qk_scale,
                           BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr,
                           MASKED: tl.constexpr, CHECK_M: tl.constexpr, IS_CAUSAL: tl.constexpr,
                           TMA: tl.constexpr, DQ_TMA: tl.constexpr):
    """The dK/dV loop of _attn_bwd_kv_inner plus a fifth tile product per query tile, dQ += dS·K,
    added atomically in fp32 to `dq_dst` (already scaled by sm_scale).

    MASKED zeroes the probabilities of key rows >= N_K (and, causal, of keys after the query):
    unlike the two-pass dK/dV kernel, whose rows past N_K are never stored, here those rows of dS
    reach dQ through the product, where exp2(-L) of a row with very negative scores could make
    inf * 0 = NaN. Query rows past N_Q (CHECK_M) load as zeros, so their dS is 0; their dQ rows are
    masked (pointers) or dropped by the descriptor's bounds (DQ_TMA: a bulk reduce-add,
    cp.reduce.async.bulk, instead of one atomic per element)."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        start_m = tl.multiple_of(start_m, BLOCK_M)
        offs_m = start_m + offs_m0
        q, do, lse, delta = _load_query_tile(q_src, do_src, l_base, d_base, start_m, offs_m0, offs_m, N_Q,
                                             stride_qs, stride_qd, stride_dos, stride_dod,
                                             CHECK_M, HEAD_DIM, BLOCK_D, D1, TMA)
        pT = tl.math.exp2(_dot_d(k, q, D1) * qk_scale - lse[None, :] * 1.4426950408889634)
        if MASKED:
            valid = offs_n[:, None] < N_K
            if IS_CAUSAL:
                valid = valid & (offs_m[None, :] >= offs_n[:, None])
            pT = tl.where(valid, pT, 0.0)
        dv = _dot_cols_acc(pT.to(do[0].dtype), do, dv, D1)
        dsT = (pT * (_dot_d(v, do, D1) - delta[None, :])).to(q[0].dtype)
        dk = _dot_cols_acc(dsT, q, dk, D1)
        dq = _scale_pair(_dot_cols(tl.trans(dsT), k, D1), sm_scale, D1)
        _atomic_add_rows(dq_dst, dq, start_m, offs_m0, N_Q, stride_dqs, stride_dqd, CHECK_M, HEAD_DIM, BLOCK_D, D1,
                         DQ_TMA)
    return dk, dv


@triton.autotune(configs=_bwd_atomic_configs(), key=_AUTOTUNE_KEY, prune_configs_by=_PRUNE,
                 reset_to_zero=["DQ"])
@triton.jit
def _attn_bwd_atomic(Q, K, V, DO, DQ, DK, DV, L, Delta,
                     stride_qb, stride_qh, stride_qs, stride_qd,
                     stride_kb, stride_kh, stride_ks, stride_kd,
                     stride_vb, stride_vh, stride_vs, stride_vd,
                     stride_dob, stride_doh, stride_dos, stride_dod,
                     stride_dqb, stride_dqh, stride_dqs, stride_dqd,
                     stride_dkb, stride_dkh, stride_dks, stride_dkd,
                     stride_dvb, stride_dvh, stride_dvs, stride_dvd,
                     H, N_Q, N_K, SEQ_BUCKET, sm_scale, qk_scale,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, IS_CAUSAL: tl.constexpr,
                     TMA: tl.constexpr, DQ_TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Single-pass backward: one program per key tile computes its dK, dV and adds its share of
    dQ to the zeroed fp32 buffer DQ (5 tile products per tile pair instead of the two-pass 7)."""
    b, h, pid_bh, start_n, offs_n, q_src, do_src, l_base, d_base, k, v, dk, dv = _key_tile_setup(
        Q, K, V, DO, L, Delta, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_kd,
        stride_vb, stride_vh, stride_vs, stride_vd, stride_dob, stride_doh, stride_dos, H, N_Q, N_K,
        HEAD_DIM, BLOCK_D, D1, TMA, BLOCK_M, BLOCK_N)
    dq_dst = _rows_source(DQ + b * stride_dqb + h * stride_dqh, N_Q, stride_dqs, BLOCK_M, HEAD_DIM, BLOCK_D, D1,
                          DQ_TMA)

    # Query tiles [lo, mid) masked, [mid, full) not, [full, N_Q) the ragged tail (masked). Causal:
    # tiles before the diagonal see none of these keys; [lo, mid) straddle it. A key tile past N_K
    # (the last one, ragged) masks all its iterations.
    full = (N_Q // BLOCK_M) * BLOCK_M
    if IS_CAUSAL:
        lo = (start_n // BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.cdiv(start_n + BLOCK_N - 1, BLOCK_M) * BLOCK_M, N_Q)
    else:
        lo = 0
        mid = 0
    if start_n + BLOCK_N > N_K:
        mid = tl.maximum(mid, full)
    full = tl.maximum(full, mid)
    dk, dv = _attn_bwd_atomic_inner(dk, dv, k, v, q_src, do_src, dq_dst, l_base, d_base,
                                    stride_qs, stride_qd, stride_dos, stride_dod, stride_dqs, stride_dqd,
                                    offs_n, lo, mid, N_Q, N_K, sm_scale, qk_scale,
                                    BLOCK_M, HEAD_DIM, BLOCK_D, D1, True, True, IS_CAUSAL, TMA, DQ_TMA)
    dk, dv = _attn_bwd_atomic_inner(dk, dv, k, v, q_src, do_src, dq_dst, l_base, d_base,
                                    stride_qs, stride_qd, stride_dos, stride_dod, stride_dqs, stride_dqd,
                                    offs_n, mid, full, N_Q, N_K, sm_scale, qk_scale,
                                    BLOCK_M, HEAD_DIM, BLOCK_D, D1, False, False, IS_CAUSAL, TMA, DQ_TMA)
    dk, dv = _attn_bwd_atomic_inner(dk, dv, k, v, q_src, do_src, dq_dst, l_base, d_base,
                                    stride_qs, stride_qd, stride_dos, stride_dod, stride_dqs, stride_dqd,
                                    offs_n, full, N_Q, N_Q, N_K, sm_scale, qk_scale,
                                    BLOCK_M, HEAD_DIM, BLOCK_D, D1, True, True, IS_CAUSAL, TMA, DQ_TMA)

    _store_dk_dv(DK, DV, dk, dv, b, h, offs_n, N_K, sm_scale, stride_dkb, stride_dkh, stride_dks, stride_dkd,
                 stride_dvb, stride_dvh, stride_dvs, stride_dvd, HEAD_DIM, BLOCK_D, D1)


# ---------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------

# The two launchers below are registered as torch.library custom ops (after them): torch.compile
# keeps each as one opaque node (output metadata from its fake), so a graph through
# FlashAttentionTriton has no break, and Dynamo never traces the autotuned or interpreted launches.


def _as_4d(x: Tensor) -> Tensor:
    """(B, S, d) -> (B, 1, S, d) view; (B, H, S, d) as is; more dims flattened."""
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() == 4:
        return x
    return x.reshape(-1, x.shape[-2], x.shape[-1]).unsqueeze(1)


def _block_d(d: int) -> int:
    return max(16, _next_power_of_2(d))


def _head_dim_tiles(d: int) -> Tuple[int, int]:
    """The kernels' (BLOCK_D, D1) for head dim d: split into the largest power of two below d and the
    rest where the rest is a power of two >= 16 (a dot's K is at least 16): 48 = 32 + 16, 80 = 64 + 16,
    96 = 64 + 32; otherwise one tile padded to the next power of two (24 on 32, 112 on 128), D1 = 0."""
    lo = 1 << (d.bit_length() - 1)
    hi = d - lo
    if hi >= 16 and hi & (hi - 1) == 0:
        return lo, hi
    return _block_d(d), 0


def _head_dim_label(d: int) -> str:
    """How head dim d is tiled, for tuned_configs(): "64+16" (split), "128 padded", or "64"."""
    block_d, d1 = _head_dim_tiles(d)
    return f"{block_d}+{d1}" if d1 else f"{block_d}" if block_d == d else f"{block_d} padded"


#: Tensor-descriptor (TMA) loads of the streamed tiles where the layout allows them (_tma_ok);
#: switched off (set_tma), every launch takes the pointer path, which tests and probes compare.
_USE_TMA = True


def set_tma(enabled: bool) -> None:
    global _USE_TMA
    _USE_TMA = bool(enabled)


#: Device-side descriptors cost host time per launch (Triton allocates their scratch memory at
#: every launch): +~50 us per forward call on the H100's host, against kernels of a few us at
#: small shapes (probes/flash_host_overhead.json). Below this many scores (batch·heads·n_q·n_k,
#: i.e. one head of 8192 x 8192) the pointer path is used; above it the kernels run long enough
#: for the copy engine's gain (5-15% of kernel time at the leaderboard shape) to win.
TMA_MIN_SCORES = 1 << 26


def _tma_ok(*tensors: Tensor) -> bool:
    """Tensor descriptors need a unit stride along d and 16-byte aligned bases and row strides
    (true for contiguous inputs and their head/sequence transposes whenever d * itemsize is a
    multiple of 16); other layouts take the pointer path."""
    if not _USE_TMA:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


def _tma_flag(scores: int, *tensors: Tensor) -> bool:
    """The TMA constexpr of one launch of `scores` (batch·heads·n_q·n_k) tile elements; sets Triton's
    allocator for the descriptors' scratch memory (a per-thread setting: the backward runs on
    autograd's thread). The interpreter has no launch cost to weigh: it takes descriptors whenever
    the layout allows, so the CPU tests run that path."""
    tma = _tma_ok(*tensors) and (scores >= TMA_MIN_SCORES or not tensors[0].is_cuda)
    if tma and tensors[0].is_cuda:
        device = tensors[0].device
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
    return tma


#: The single-pass backward adds dQ through a descriptor (one bulk reduce-add of the tile,
#: cp.reduce.async.bulk on Hopper) when its loads use descriptors; False: one atomic per element.
#: The interpreter has no descriptor reductions, so the CPU tests run the pointer atomics only.
ATOMIC_DQ_TMA = True

# The autotuner's pick per (kernel, shape key), resolved once: later calls launch the JIT function
# with it directly, skipping the autotuner's per-call key building (dicts of every argument, the
# dtype of each tensor) and the grid lambda. Cleared with the lists (use_configs).
_resolved: Dict[tuple, Tuple[triton.Config, dict]] = {}
_last_config: Dict[str, triton.Config] = {}
_last_head_dim: Dict[str, int] = {}  # "d": the head dim of the last forward or backward call


def _launch(kernel, name: str, key: tuple, grid: Callable[[int, int], tuple], *args,
            pinned: Optional[triton.Config] = None, **constexprs) -> None:
    """Launch the autotuned `kernel` on grid(BLOCK_M, BLOCK_N). The first call of a shape key goes
    through the autotuner (benchmarking its list there); later ones launch its pick. A `pinned`
    config is launched as if the autotuner had picked it."""
    hit = _resolved.get((name,) + key)
    if hit is None and pinned is not None and not _INTERPRETED:
        hit = _resolved[(name,) + key] = (pinned, pinned.all_kwargs())
    if hit is None:
        kernel[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **constexprs)
        config = kernel.best_config
        _resolved[(name,) + key] = (config, config.all_kwargs())
    else:
        config, kwargs = hit
        kernel.fn[grid(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])](*args, **constexprs, **kwargs)
    _last_config[name] = config


def _tune_key(q: Tensor, n_q: int, n_k: int, d: int, causal: bool) -> tuple:
    """The autotuner's own key (sequence bucket, head dim, causal, dtypes: all inputs share q's)."""
    return (_seq_bucket(n_q, n_k), d, causal, q.dtype)


def flash_attention_triton_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tuple[Tensor, Tensor]:
    """Run the forward kernel. Returns ``(o, lse)`` with ``lse`` of shape q.shape[:-1], fp32."""
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    causal = bool(is_causal)
    o4 = torch.empty((B, H, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _head_dim_tiles(d)
    _last_head_dim["d"] = d

    with launch_ctx(q, "impl_flash::forward_kernel"):
        _launch(_attn_fwd, "fwd", _tune_key(q, n_q, n_k, d, causal), lambda m, n: (_cdiv(n_q, m), B * H),
                q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
                H, n_q, n_k, _seq_bucket(n_q, n_k), sm_scale * LOG2E,
                HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=_tma_flag(B * H * n_q * n_k, k4, v4))
    return o4.reshape(q.shape), lse.reshape(q.shape[:-1])


def flash_attention_triton_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                                    is_causal: bool = False,
                                    variant: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Run the backward kernels. Returns ``(dq, dk, dv)`` in the input dtypes.

    `variant` ("two_pass", "atomic", "auto"; None: the module setting,
    impl.attention.backward_choice.set_backward_variant) picks the implementation; the choice is
    recorded per shape (backward_choice.backward_choices)."""
    q4, k4, v4, o4, do4 = (_as_4d(t) for t in (q, k, v, o, do))
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    causal = bool(is_causal)
    kind = resolve_backward(ShapeKey(B * H, n_q, n_k, d, q.dtype, causal), variant)
    for name in ("dq", "dkdv", "atomic"):  # tuned_configs() then names only this call's kernels
        _last_config.pop(name, None)
    lse3 = lse.reshape(B, H, n_q).contiguous()
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    dk4 = torch.empty((B, H, n_k, d), dtype=k.dtype, device=k.device)
    dv4 = torch.empty((B, H, n_k, d), dtype=v.dtype, device=v.device)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _head_dim_tiles(d)
    _last_head_dim["d"] = d
    key = _tune_key(q, n_q, n_k, d, causal)
    tma = _tma_flag(B * H * n_q * n_k, q4, k4, v4, do4)

    def grid_kv(m, n):
        return (_cdiv(n_k, n), B * H)

    with launch_ctx(q, "impl_flash::backward_kernels"):
        if kind == "two_pass":
            dq4 = torch.empty((B, H, n_q, d), dtype=q.dtype, device=q.device)
            # dQ first: it writes D, which the dK/dV kernel reads.
            _launch(_attn_bwd_dq, "dq", key, lambda m, n: (_cdiv(n_q, m), B * H),
                    q4, k4, v4, o4, do4, dq4, lse3, delta,
                    *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *dq4.stride(),
                    H, n_q, n_k, _seq_bucket(n_q, n_k), sm_scale, sm_scale * LOG2E,
                    HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma)
            _launch(_attn_bwd_dkdv, "dkdv", key, grid_kv,
                    q4, k4, v4, do4, dk4, dv4, lse3, delta,
                    *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dv4.stride(),
                    H, n_q, n_k, _seq_bucket(n_q, n_k), sm_scale, sm_scale * LOG2E,
                    HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma)
        else:
            # fp32 inputs accumulate into dQ itself; 16-bit ones into an fp32 buffer, cast at the end.
            acc = torch.empty((B, H, n_q, d), dtype=torch.float32, device=q.device)
            _attn_bwd_preprocess[(_cdiv(n_q, _PRE_BLOCK_M), B * H)](
                o4, do4, delta, acc, *o4.stride(), *do4.stride(), *acc.stride(), H, n_q,
                HEAD_DIM=d, BLOCK_D=block_d, D1=d1, BLOCK_M=_PRE_BLOCK_M)
            dq_tma = tma and ATOMIC_DQ_TMA and not _INTERPRETED and _tma_ok(acc)
            _launch(_attn_bwd_atomic, "atomic", key, grid_kv,
                    q4, k4, v4, do4, acc, dk4, dv4, lse3, delta,
                    *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *acc.stride(), *dk4.stride(),
                    *dv4.stride(), H, n_q, n_k, _seq_bucket(n_q, n_k), sm_scale, sm_scale * LOG2E,
                    pinned=_pinned_atomic_config(q.dtype, d),
                    HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma, DQ_TMA=dq_tma)
            dq4 = acc if q.dtype == torch.float32 else acc.to(q.dtype)
    return dq4.reshape(q.shape), dk4.reshape(k.shape), dv4.reshape(v.shape)


# The ops (any device: CUDA tensors, or CPU tensors under the interpreter). The fakes give what the
# launchers return: new contiguous tensors of the input shapes (inputs may be strided), lse fp32.
flash_forward_op = torch.library.custom_op("impl_flash::triton_forward", flash_attention_triton_forward,
                                           mutates_args=())
flash_backward_op = torch.library.custom_op("impl_flash::triton_backward", flash_attention_triton_backward,
                                            mutates_args=())


@flash_forward_op.register_fake
def _flash_forward_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@flash_backward_op.register_fake
def _flash_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                         is_causal: bool = False, variant: Optional[str] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def set_backward(kind: str) -> None:
    """Select the backward used by FlashAttentionTriton: "triton" or "compiled"."""
    global BACKWARD
    if kind not in _BACKWARD_KINDS:
        raise ValueError(f"unknown flash backward {kind!r}; expected one of {_BACKWARD_KINDS}")
    BACKWARD = kind


def set_autotune(enabled: bool) -> None:
    """Switch autotuning on (default) or off.

    Off, every kernel uses one shared-memory-safe config: this keeps test suites that launch
    many different shapes / head dims / dtypes from compiling and benchmarking every config for
    each.  Under the interpreter there is only one config either way.
    """
    if enabled:
        use_configs(**_FULL_CONFIGS)
    else:
        use_configs(fwd=[_config(_FWD_SAFE)], kv=[_config(_BWD_KV_SAFE)], q=[_config(_BWD_Q_SAFE)],
                    atomic=[_config(_BWD_ATOMIC_SAFE)])


def _kernels() -> Dict[str, object]:
    return {"fwd": _attn_fwd, "kv": _attn_bwd_dkdv, "q": _attn_bwd_dq, "atomic": _attn_bwd_atomic}


def use_configs(fwd=None, kv=None, q=None, atomic=None) -> None:
    """Replace the autotune lists of the forward, dK/dV, dQ and single-pass backward kernels
    (``None`` keeps a list); entries are triton.Config or (BLOCK_M, BLOCK_N, num_warps, num_stages).
    A one-entry list launches that config without benchmarking: how tools/probes/flash_tune.py
    times each shape. Forgets the picks resolved so far."""
    _resolved.clear()
    _last_config.clear()
    _last_head_dim.clear()
    if _INTERPRETED:
        return
    lists = {"fwd": fwd, "kv": kv, "q": q, "atomic": atomic}
    for name, kernel in _kernels().items():
        if lists[name] is not None:
            kernel.configs = [c if isinstance(c, triton.Config) else _config(c) for c in lists[name]]
            kernel.cache.clear()


def tuned_configs() -> dict:
    """What the last calls ran, for a benchmark row's JSON: the config of each kernel launched
    ("BLOCK_M: .., num_warps: .."; fwd, dq, dkdv for the two-pass backward, atomic for the
    single-pass one), under "bwd", the backward variant of the last backward call, and under
    "d_tiles" how the last call tiled its head dim (_head_dim_label: "64+16" split, "128 padded")."""
    picks = {name: str(config) for name, config in _last_config.items()}
    if "d" in _last_head_dim:
        picks["d_tiles"] = _head_dim_label(_last_head_dim["d"])
    last = last_backward_choice()
    if last is not None:
        picks["bwd"] = last[1]
    return picks


def autotune_enabled() -> bool:
    return _INTERPRETED or len(_attn_fwd.configs) > 1


_FULL_CONFIGS = {name: list(kernel.configs) for name, kernel in _kernels().items()}


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton forward and (by default) Triton backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False) -> Tensor:
        validate_inputs(q, k, v, is_causal, for_triton=True)
        if not q.is_cuda and not _INTERPRETED:
            raise ValueError(
                "Triton FlashAttention got CPU tensors but its kernels were compiled for the GPU: "
                "set TRITON_INTERPRET=1 before impl.attention.flash_triton is first imported to run on CPU"
            )
        is_causal = bool(is_causal)
        # The ops for torch.compile (one opaque graph node); eager calls the launcher itself: the
        # dispatcher's round trip cost ~110 us per call on the H100's host (probes/flash_host_overhead.json),
        # more than the kernel at small shapes.
        forward = flash_forward_op if torch.compiler.is_compiling() else flash_attention_triton_forward
        o, lse = forward(q, k, v, is_causal)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        kind = BACKWARD
        if kind == "triton":
            backward = flash_backward_op if torch.compiler.is_compiling() else flash_attention_triton_backward
            dq, dk, dv = backward(q, k, v, o, do, lse, ctx.is_causal)
        elif kind == "compiled":
            # Being compiled, the PyTorch backward is traced into the outer graph: Dynamo rejects
            # compiled_flash_backward's lazy torch.compile (a global store) inside the Function.
            backward = flash_backward if torch.compiler.is_compiling() else compiled_flash_backward
            dq, dk, dv = backward(q, k, v, o, do, lse, ctx.is_causal)
        else:
            raise ValueError(f"unknown flash backward {kind!r}; expected one of {_BACKWARD_KINDS}")
        return dq, dk, dv, None


__all__ = [
    "BACKWARD",
    "FlashAttentionTriton",
    "flash_attention_triton_backward",
    "flash_attention_triton_forward",
    "flash_backward_op",
    "flash_forward_op",
    "autotune_enabled",
    "set_autotune",
    "set_backward",
    "set_tma",
    "tuned_configs",
    "use_configs",
]
