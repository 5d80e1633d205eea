"""FlashAttention-2 (Triton): the kernels and their small @triton.jit helpers.

Forward (`_attn_fwd`), two-pass backward (`_attn_bwd_dq`, which also stores D = rowsum(O·dO), then
`_attn_bwd_dkdv`), single-pass backward (`_attn_bwd_preprocess`, then `_attn_bwd_atomic`). Every
option is a constexpr argument (head-dim tiling BLOCK_D + D1, causal, TMA, tiles); the autotune
lists come from :mod:`impl.attention.flash_configs`. The layout and numerics are described in
:mod:`impl.attention.flash_triton`; how the kernels are launched in :mod:`impl.attention.flash_launch`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .flash_configs import (_AUTOTUNE_KEY, _PRUNE, _bwd_atomic_configs, _bwd_kv_configs, _bwd_q_configs,
                            _fwd_configs)

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
                         HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, D1: tl.constexpr, BLOCK_M: tl.constexpr,
                         L=None, NL2=None, STATS_STRIDE=None):
    """Delta = rowsum(O * dO) in fp32, shape (B*H, N_Q), and zeros into the single-pass backward's
    fp32 dQ accumulator DQ (one launch for both: no separate memset). With L (the logsumexp) and NL2 given (both
    (B*H, N_Q) fp32; None, a constexpr to Triton, everywhere else): NL2 = -L·log2 e, the ws backward's prescaled
    row statistic (flash_gluon_bwd_ws, GluonBwdWsConfig.prescaled_lse). STATS_STRIDE (None: N_Q): the row stride of
    Delta and NL2 (L's stays N_Q), a multiple of 4 for the ws backward's TMA descriptors over them
    (GluonBwdWsConfig.stats_smem); None, a constexpr, leaves every other launch's code as it was."""
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    o = _load_pair(O + b * stride_ob + h * stride_oh, offs_m, N_Q, stride_os, stride_od, True, HEAD_DIM, BLOCK_D, D1)
    do = _load_pair(DO + b * stride_dob + h * stride_doh, offs_m, N_Q, stride_dos, stride_dod, True,
                    HEAD_DIM, BLOCK_D, D1)
    if STATS_STRIDE is None:
        stats_row = pid_bh.to(tl.int64) * N_Q
    else:
        stats_row = pid_bh.to(tl.int64) * STATS_STRIDE
    tl.store(Delta + stats_row + offs_m, _rowsum_product(o, do, D1), mask=offs_m < N_Q)
    if NL2 is not None:  # fp32 lse times fp32(-LOG2E), flash_gluon_common's: the bits of torch's lse * -LOG2E
        rows = pid_bh.to(tl.int64) * N_Q + offs_m
        out = NL2 + rows if STATS_STRIDE is None else NL2 + stats_row + offs_m
        tl.store(out, tl.load(L + rows, mask=offs_m < N_Q) * -1.4426950408889634, mask=offs_m < N_Q)
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
