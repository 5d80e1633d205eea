"""FlashAttention-2 (Triton): the autotune lists, the autotuner's key, and the interpreter switch.

Each kernel's list holds the fastest configs of the per-kernel sweeps first (NOTES.md, FlashAttention-2);
under the Triton interpreter every kernel has one small config. Pure data and small integer helpers:
importing this module compiles nothing.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import torch
import triton


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
