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
  pointer arithmetic with masks; ``FlashOptions(tma=False)`` forces the pointer path.
* Options are a value, :class:`impl.attention.flash_options.FlashOptions`, passed through the
  call (``FlashAttentionTriton.apply(q, k, v, is_causal, options)``, the launchers' ``options=``);
  None means the module defaults (``default_options()``; the old setters set_backward, set_tma,
  set_autotune, use_configs replace those). What each call ran comes back as a LaunchRecord
  (the ``*_recorded`` launchers return it; ``options.recorder`` receives it).
* The backward implementation is ``options.backward``: ``"triton"`` (default) or ``"compiled"``
  (the ``torch.compile``'d PyTorch backward of :mod:`impl.attention.flash_backward`).
* Launch: a shape key's first call goes through the autotuner, the next through
  ``JITFunction.run`` (which returns the compiled kernel), later ones call the compiled kernel's
  launcher directly (``_Plan``; ``options.direct_launch``), skipping Triton's per-call argument
  specialization. Under the interpreter every launch is an ordinary JIT call.
* torch.compile: the two launchers are the custom ops ``impl_flash::triton_forward`` and
  ``impl_flash::triton_backward`` (with fake implementations; options as a registered int), so a
  graph through FlashAttentionTriton (a whole model's, with ``fullgraph=True``) has no graph
  break; the kernels run as opaque nodes of it.

Autotuning: configs come from functions that check
``os.environ.get("TRITON_INTERPRET") == "1"`` at import time; under the
interpreter a single small config is used (autotuning there would run every
config through the slow interpreter, and GPU-sized tiles are slow to emulate).

Importing this module never touches CUDA.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Callable, Dict, List, Optional, Tuple

import torch
import triton
import triton.language as tl
from triton import knobs as _knobs
from triton.runtime import driver as _driver

from impl.runtime import launch_ctx

from .backward_choice import ShapeKey, resolve_backward
from .flash_backward import compiled_flash_backward, flash_backward
from .flash_options import BACKWARD_KINDS, FlashOptions, LaunchRecord, LaunchRecorder, options_by_key, with_configs
from .flash_torch import validate_inputs

Tensor = torch.Tensor

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


def _pinned_atomic_config(dtype: torch.dtype, d: int,
                          tiles: Optional[Tuple[int, int]] = None) -> Optional[triton.Config]:
    block_d, d1 = tiles or _head_dim_tiles(d)
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


def _tiles(d: int, options: "FlashOptions") -> Tuple[int, int]:
    """(BLOCK_D, D1) of head dim d under `options` (split_head_dim False: padded to a power of two)."""
    return _head_dim_tiles(d) if options.split_head_dim else (_block_d(d), 0)


def _tiles_label(d: int, block_d: int, d1: int) -> str:
    return f"{block_d}+{d1}" if d1 else f"{block_d}" if block_d == d else f"{block_d} padded"


def _head_dim_label(d: int) -> str:
    """How head dim d is tiled, for launch records: "64+16" (split), "128 padded", or "64"."""
    return _tiles_label(d, *_head_dim_tiles(d))


def _tma_ok(*tensors: Tensor, options: Optional["FlashOptions"] = None) -> bool:
    """Tensor descriptors need a unit stride along d and 16-byte aligned bases and row strides
    (true for contiguous inputs and their head/sequence transposes whenever d * itemsize is a
    multiple of 16); other layouts take the pointer path. False when `options` (default: the
    module defaults) switch descriptors off."""
    if not (options or _default_options).tma:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


def _tma_flag(scores: int, options: "FlashOptions", *tensors: Tensor) -> bool:
    """The TMA constexpr of one launch of `scores` (batch·heads·n_q·n_k) tile elements; sets Triton's
    allocator for the descriptors' scratch memory (a per-thread setting: the backward runs on
    autograd's thread). Device-side descriptors cost host time per launch (Triton allocates their
    scratch memory at every launch): +~50 us per forward call on the H100's host
    (probes/flash_host_overhead.json), so below options.tma_min_scores (one head of 8192 x 8192 by
    default) a GPU launch takes the pointer path. The interpreter has no launch cost to weigh: it
    takes descriptors whenever the layout allows, so the CPU tests run that path."""
    if not options.tma:
        return False
    cuda = tensors[0].is_cuda
    if cuda and scores < options.tma_min_scores:  # the threshold first: it skips the layout checks
        return False
    tma = _tma_ok(*tensors, options=options)
    if tma and cuda:
        device = tensors[0].device
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))
    return tma


# ---------------------------------------------------------------------------
# Options -> kernels
# ---------------------------------------------------------------------------

#: Compatibility defaults used when a call passes options=None (set_backward, set_tma, set_autotune,
#: use_configs replace this value; new code passes FlashOptions instead). Its recorder feeds
#: tuned_configs(); launches whose options carry no recorder are recorded there too.
_LAST = LaunchRecorder()
_default_options = FlashOptions()

_SAFE = {"fwd": _FWD_SAFE, "kv": _BWD_KV_SAFE, "q": _BWD_Q_SAFE, "atomic": _BWD_ATOMIC_SAFE}
# Autotuners built for config lists other than the committed ones, keyed (kernel, list); each wraps
# the same JITFunction as the module's autotuner, so compiled kernels are shared.
_TUNERS: Dict[tuple, object] = {}


def _kernels() -> Dict[str, object]:
    return {"fwd": _attn_fwd, "kv": _attn_bwd_dkdv, "q": _attn_bwd_dq, "atomic": _attn_bwd_atomic}


def _kernel(name: str, options: "FlashOptions"):
    """The autotuner launching kernel `name` ("fwd", "kv", "q", "atomic") under `options`: the
    module's (the committed list) unless options name a list or switch autotuning off. Under the
    interpreter always the module's (one small config)."""
    base = _kernels()[name]
    if _INTERPRETED:
        return base
    shapes = options.config_list(name)
    if shapes is None and not options.autotune:
        shapes = (_SAFE[name],)
    if shapes is None:
        return base
    tuner = _TUNERS.get((name, shapes))
    if tuner is None:
        extra = {"reset_to_zero": ["DQ"]} if name == "atomic" else {}
        tuner = _TUNERS[(name, shapes)] = triton.autotune(configs=[_config(s) for s in shapes], key=_AUTOTUNE_KEY,
                                                          prune_configs_by=_PRUNE, **extra)(base.fn)
    return tuner


def _options_key(options: Optional["FlashOptions"]) -> int:
    """The int the custom ops carry for `options` (FlashOptions.key; 0: the module defaults)."""
    return 0 if options is None else options.key


def _options_of(key: int) -> "FlashOptions":
    return _default_options if key == 0 else options_by_key(key)


# ---------------------------------------------------------------------------
# Launch: first calls through the autotuner / JIT, then the compiled kernel directly
# ---------------------------------------------------------------------------

# The autotuner's pick per (kernel, autotuner, shape key), resolved once: later calls skip the
# autotuner's per-call key building. Value: (config, its kwargs, str(config) for records).
_resolved: Dict[tuple, Tuple[triton.Config, dict, str]] = {}


class _Plan:
    """A compiled kernel and the constexpr tail of its arguments: launched by calling its launcher
    the way JITFunction.run does after its cache hit (triton 3.6, runtime/jit.py), minus the
    argument specialization and cache-key building that found it."""

    __slots__ = ("kernel", "tail", "function", "packed")

    def __init__(self, kernel, tail: tuple) -> None:
        if hasattr(kernel, "result"):  # an async-compile future
            kernel = kernel.result()
        self.kernel = kernel
        self.tail = tail
        kernel.run  # noqa: B018 -- loads the module (_init_handles) so .function is set
        self.function = kernel.function
        self.packed = kernel.packed_metadata

    def launch(self, grid: tuple, device_index: int, args: tuple) -> None:
        kernel = self.kernel
        stream = _driver.active.get_current_stream(device_index)
        enter = _knobs.runtime.launch_enter_hook
        full = args + self.tail
        meta = None if enter is None else kernel.launch_metadata(grid, stream, *full)
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], g1, g2, stream, self.function, self.packed, meta, enter,
                   _knobs.runtime.launch_exit_hook, *full)


# (resolved key, constexprs, every runtime int, each tensor's 16-byte alignment, device) -> _Plan.
# Everything Triton specializes a compiled kernel on is in the key: the constexprs, the dtypes (in
# the resolved key), each int (exact value: covers ==1, %16, i32/i64), each pointer's alignment.
_plans: Dict[tuple, _Plan] = {}


def _plan_key(rkey: tuple, constexprs: dict, args: tuple, device_index: int) -> tuple:
    ints = []
    aligned = []
    for a in args:
        if isinstance(a, Tensor):
            aligned.append(a.data_ptr() & 15 == 0)
        elif type(a) is int:
            ints.append(a)
    return (rkey, tuple(constexprs.values()), tuple(ints), tuple(aligned), device_index)


def _launch(kernel, name: str, key: tuple, grid: Callable[[int, int], tuple], args: tuple, constexprs: dict,
            options: "FlashOptions", pinned: Optional[triton.Config] = None) -> str:
    """Launch the autotuned `kernel` on grid(BLOCK_M, BLOCK_N); returns str(config) of what ran. The
    first call of a shape key goes through the autotuner (benchmarking its list there); later ones
    launch its pick through JITFunction.run once (which compiles it and returns the compiled kernel,
    kept as a plan), then through the plan (options.direct_launch; never under the interpreter,
    which has no compiled kernel). A `pinned` config is launched as if the autotuner had picked it."""
    rkey = (name, id(kernel)) + key
    hit = _resolved.get(rkey)
    if hit is None and pinned is not None and not _INTERPRETED:
        hit = _resolved[rkey] = (pinned, pinned.all_kwargs(), str(pinned))
    if hit is None:
        kernel[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **constexprs)
        config = kernel.best_config
        hit = _resolved[rkey] = (config, config.all_kwargs(), str(config))
        return hit[2]
    config, kwargs, text = hit
    g = grid(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])
    if _INTERPRETED or not options.direct_launch:
        kernel.fn[g](*args, **constexprs, **kwargs)
        return text
    device_index = args[0].device.index
    pkey = _plan_key(rkey, constexprs, args, device_index)
    plan = _plans.get(pkey)
    if plan is not None:
        plan.launch(g, device_index, args)
        return text
    compiled = kernel.fn[g](*args, **constexprs, **kwargs)
    if compiled is not None:
        merged = {**constexprs, **config.kwargs}
        names = kernel.fn.arg_names
        _plans[pkey] = _Plan(compiled, tuple(merged[n] for n in names[len(args):]))
    return text


def _tune_key(q: Tensor, n_q: int, n_k: int, d: int, causal: bool) -> tuple:
    """The autotuner's own key (sequence bucket, head dim, causal, dtypes: all inputs share q's)."""
    return (_seq_bucket(n_q, n_k), d, causal, q.dtype)


def _record(options: "FlashOptions", record: LaunchRecord) -> LaunchRecord:
    (options.recorder or _LAST)(record)
    return record


# ---------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------

def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: "FlashOptions"):
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    o4 = torch.empty((B, H, n_q, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _tiles(d, options)
    tma = _tma_flag(B * H * n_q * n_k, options, k4, v4)
    with launch_ctx(q, "impl_flash::forward_kernel"):
        text = _launch(_kernel("fwd", options), "fwd", _tune_key(q, n_q, n_k, d, causal),
                       lambda m, n: (_cdiv(n_q, m), B * H),
                       (q4, k4, v4, o4, lse, *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(),
                        H, n_q, n_k, _seq_bucket(n_q, n_k), sm_scale * LOG2E),
                       dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma), options)
    record = _record(options, LaunchRecord("fwd", (("fwd", text),), _tiles_label(d, block_d, d1), tma))
    return o4.reshape(q.shape), lse.reshape(q.shape[:-1]), record


def _backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
              options: "FlashOptions", variant: Optional[str] = None):
    q4, k4, v4, o4, do4 = (_as_4d(t) for t in (q, k, v, o, do))
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    kind = resolve_backward(ShapeKey(B * H, n_q, n_k, d, q.dtype, causal),
                            variant if variant is not None else options.variant)
    lse3 = lse.reshape(B, H, n_q).contiguous()
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    dk4 = torch.empty((B, H, n_k, d), dtype=k.dtype, device=k.device)
    dv4 = torch.empty((B, H, n_k, d), dtype=v.dtype, device=v.device)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _tiles(d, options)
    key = _tune_key(q, n_q, n_k, d, causal)
    tma = _tma_flag(B * H * n_q * n_k, options, q4, k4, v4, do4)
    bucket = _seq_bucket(n_q, n_k)

    def grid_kv(m, n):
        return (_cdiv(n_k, n), B * H)

    with launch_ctx(q, "impl_flash::backward_kernels"):
        if kind == "two_pass":
            dq4 = torch.empty((B, H, n_q, d), dtype=q.dtype, device=q.device)
            const = dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma)
            # dQ first: it writes D, which the dK/dV kernel reads.
            dq_text = _launch(_kernel("q", options), "dq", key, lambda m, n: (_cdiv(n_q, m), B * H),
                              (q4, k4, v4, o4, do4, dq4, lse3, delta,
                               *q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *dq4.stride(),
                               H, n_q, n_k, bucket, sm_scale, sm_scale * LOG2E), const, options)
            kv_text = _launch(_kernel("kv", options), "dkdv", key, grid_kv,
                              (q4, k4, v4, do4, dk4, dv4, lse3, delta,
                               *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dv4.stride(),
                               H, n_q, n_k, bucket, sm_scale, sm_scale * LOG2E), const, options)
            configs = (("dq", dq_text), ("dkdv", kv_text))
        else:
            # fp32 inputs accumulate into dQ itself; 16-bit ones into an fp32 buffer, cast at the end.
            acc = torch.empty((B, H, n_q, d), dtype=torch.float32, device=q.device)
            _attn_bwd_preprocess[(_cdiv(n_q, _PRE_BLOCK_M), B * H)](
                o4, do4, delta, acc, *o4.stride(), *do4.stride(), *acc.stride(), H, n_q,
                HEAD_DIM=d, BLOCK_D=block_d, D1=d1, BLOCK_M=_PRE_BLOCK_M)
            dq_tma = tma and options.atomic_dq_tma and not _INTERPRETED and _tma_ok(acc, options=options)
            text = _launch(_kernel("atomic", options), "atomic", key, grid_kv,
                           (q4, k4, v4, do4, acc, dk4, dv4, lse3, delta,
                            *q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *acc.stride(), *dk4.stride(),
                            *dv4.stride(), H, n_q, n_k, bucket, sm_scale, sm_scale * LOG2E),
                           dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma, DQ_TMA=dq_tma),
                           options, pinned=_pinned_atomic_config(q.dtype, d, (block_d, d1)))
            configs = (("atomic", text),)
            dq4 = acc if q.dtype == torch.float32 else acc.to(q.dtype)
    record = _record(options, LaunchRecord("bwd", configs, _tiles_label(d, block_d, d1), tma, kind))
    return dq4.reshape(q.shape), dk4.reshape(k.shape), dv4.reshape(v.shape), record


def flash_attention_triton_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                   options: Optional["FlashOptions"] = None) -> Tuple[Tensor, Tensor]:
    """Run the forward kernel. Returns ``(o, lse)`` with ``lse`` of shape q.shape[:-1], fp32.
    `options` None: the module defaults. The launch record goes to options.recorder (see
    flash_attention_triton_forward_recorded for it returned)."""
    o, lse, _ = _forward(q, k, v, bool(is_causal), options or _default_options)
    return o, lse


def flash_attention_triton_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                                    is_causal: bool = False, variant: Optional[str] = None,
                                    options: Optional["FlashOptions"] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Run the backward kernels. Returns ``(dq, dk, dv)`` in the input dtypes.

    `variant` ("two_pass", "atomic", "auto"; None: options.variant, then the module setting,
    impl.attention.backward_choice.set_backward_variant) picks the implementation; the choice is
    recorded per shape (backward_choice.backward_choices) and in the launch record."""
    dq, dk, dv, _ = _backward(q, k, v, o, do, lse, bool(is_causal), options or _default_options, variant)
    return dq, dk, dv


def flash_attention_triton_forward_recorded(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                            options: Optional["FlashOptions"] = None):
    """flash_attention_triton_forward returning ``(o, lse, LaunchRecord)``."""
    return _forward(q, k, v, bool(is_causal), options or _default_options)


def flash_attention_triton_backward_recorded(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                                             is_causal: bool = False, variant: Optional[str] = None,
                                             options: Optional["FlashOptions"] = None):
    """flash_attention_triton_backward returning ``(dq, dk, dv, LaunchRecord)``."""
    return _backward(q, k, v, o, do, lse, bool(is_causal), options or _default_options, variant)


# The ops (any device: CUDA tensors, or CPU tensors under the interpreter) take the options as their
# registered int (_options_key). The fakes give what the launchers return: new contiguous tensors of
# the input shapes (inputs may be strided), lse fp32.
def _forward_op_impl(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                     options_key: int = 0) -> Tuple[Tensor, Tensor]:
    o, lse, _ = _forward(q, k, v, bool(is_causal), _options_of(options_key))
    return o, lse


def _backward_op_impl(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                      is_causal: bool = False, variant: Optional[str] = None,
                      options_key: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv, _ = _backward(q, k, v, o, do, lse, bool(is_causal), _options_of(options_key), variant)
    return dq, dk, dv


flash_forward_op = torch.library.custom_op("impl_flash::triton_forward", _forward_op_impl, mutates_args=())
flash_backward_op = torch.library.custom_op("impl_flash::triton_backward", _backward_op_impl, mutates_args=())


@flash_forward_op.register_fake
def _flash_forward_fake(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                        options_key: int = 0) -> Tuple[Tensor, Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@flash_backward_op.register_fake
def _flash_backward_fake(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                         is_causal: bool = False, variant: Optional[str] = None,
                         options_key: int = 0) -> Tuple[Tensor, Tensor, Tensor]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---------------------------------------------------------------------------
# Compatibility: module-default setters (new code passes FlashOptions)
# ---------------------------------------------------------------------------

def default_options() -> "FlashOptions":
    """The options a call with options=None runs with."""
    return _default_options


def set_default_options(options: "FlashOptions") -> None:
    """Replace the module defaults (what set_backward/set_tma/set_autotune/use_configs change)."""
    global _default_options
    _default_options = options


def set_backward(kind: str) -> None:
    """Select the default backward of FlashAttentionTriton: "triton" or "compiled"."""
    set_default_options(dataclasses.replace(_default_options, backward=kind))


def set_tma(enabled: bool) -> None:
    """Default tensor-descriptor loads on/off (FlashOptions.tma)."""
    set_default_options(dataclasses.replace(_default_options, tma=bool(enabled)))


def set_autotune(enabled: bool) -> None:
    """Switch autotuning on (default) or off in the defaults (FlashOptions.autotune; clears any
    use_configs lists). Off, every kernel uses one shared-memory-safe config: this keeps test suites
    that launch many different shapes / head dims / dtypes from compiling and benchmarking every
    config for each. Under the interpreter there is only one config either way."""
    set_default_options(dataclasses.replace(_default_options, autotune=bool(enabled), configs=None))


def use_configs(fwd=None, kv=None, q=None, atomic=None) -> None:
    """Replace the default autotune lists of the forward, dK/dV, dQ and single-pass backward kernels
    (``None`` keeps a list; FlashOptions.configs); entries are (BLOCK_M, BLOCK_N, num_warps,
    num_stages) or triton.Config. Forgets the picks resolved so far."""
    def shapes(lst):
        if lst is None:
            return None
        return [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages)
                if isinstance(c, triton.Config) else tuple(c) for c in lst]
    _resolved.clear()
    _plans.clear()
    _LAST.clear()
    lists = {"fwd": shapes(fwd), "kv": shapes(kv), "q": shapes(q), "atomic": shapes(atomic)}
    set_default_options(with_configs(_default_options, **lists))


def tuned_configs() -> dict:
    """What the last calls ran (records of calls whose options carry no recorder), for a benchmark
    row's JSON: the config of each kernel of the last forward and backward, "bwd" the backward
    variant, "d_tiles" the head-dim tiling, "tma". Prefer a LaunchRecorder in FlashOptions."""
    return _LAST.summary()


def autotune_enabled() -> bool:
    return _INTERPRETED or len(_kernel("fwd", _default_options).configs) > 1


class FlashAttentionTriton(torch.autograd.Function):
    """FlashAttention-2 with Triton forward and (by default) Triton backward.

    ``apply(q, k, v, is_causal=False, options=None)``: `options` a FlashOptions (None: the module
    defaults)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                options: Optional["FlashOptions"] = None) -> Tensor:
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
        if torch.compiler.is_compiling():
            o, lse = flash_forward_op(q, k, v, is_causal, _options_key(options))
        else:
            o, lse, _ = _forward(q, k, v, is_causal, options or _default_options)
        ctx.save_for_backward(lse, q, k, v, o)
        ctx.is_causal = is_causal
        ctx.options_key = _options_key(options)  # ints and strs on ctx: plain for Dynamo
        ctx.backward_kind = (options or _default_options).backward
        return o

    @staticmethod
    def backward(ctx, do: Tensor):
        lse, q, k, v, o = ctx.saved_tensors
        kind = ctx.backward_kind
        if kind == "triton":
            if torch.compiler.is_compiling():
                dq, dk, dv = flash_backward_op(q, k, v, o, do, lse, ctx.is_causal, None, ctx.options_key)
            else:
                dq, dk, dv, _ = _backward(q, k, v, o, do, lse, ctx.is_causal, _options_of(ctx.options_key))
        elif kind == "compiled":
            # Being compiled, the PyTorch backward is traced into the outer graph: Dynamo rejects
            # compiled_flash_backward's lazy torch.compile (a global store) inside the Function.
            backward = flash_backward if torch.compiler.is_compiling() else compiled_flash_backward
            dq, dk, dv = backward(q, k, v, o, do, lse, ctx.is_causal)
        else:
            raise ValueError(f"unknown flash backward {kind!r}; expected one of {BACKWARD_KINDS}")
        return dq, dk, dv, None, None


def __getattr__(name: str):
    # BACKWARD, _USE_TMA, TMA_MIN_SCORES, ATOMIC_DQ_TMA were module settings; read-only views now.
    views = {"BACKWARD": "backward", "_USE_TMA": "tma", "TMA_MIN_SCORES": "tma_min_scores",
             "ATOMIC_DQ_TMA": "atomic_dq_tma"}
    if name in views:
        return getattr(_default_options, views[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "FlashAttentionTriton",
    "FlashOptions",
    "LaunchRecord",
    "LaunchRecorder",
    "autotune_enabled",
    "default_options",
    "flash_attention_triton_backward",
    "flash_attention_triton_backward_recorded",
    "flash_attention_triton_forward",
    "flash_attention_triton_forward_recorded",
    "flash_backward_op",
    "flash_forward_op",
    "set_autotune",
    "set_backward",
    "set_default_options",
    "set_tma",
    "tuned_configs",
    "use_configs",
    "with_configs",
]
