"""FlashAttention backward for Hopper in Gluon, warp-specialized: issue 47, stage 3b (head dims 128 and 64).

The stage-3 kernel (:mod:`impl.attention.flash_gluon_bwd`) runs every step in the same 8 warps with CTA
barriers between them. Here (stage 2's structure, :mod:`impl.attention.flash_gluon_ws`) the work is split
with ``gl.warp_specialize``:

* **Load warp** (1 warp, 24 registers): K and V of the CTA's 128-key tile once, then the Q and dO tiles
  (64 rows) of each query tile through a ring of NUM_STAGES slots, each slot with ready barriers for Q
  and for dO and an empty barrier of count 2 (both consumers arrive after their dK / dV products).
* **Two consumer warpgroups** (the default partition and a 4-warp worker, 240 registers each): consumer
  c owns keys n0 + 64c … + 63, holds its dK and dV (64 × d fp32: 64 + 64 registers at d 128) and per query
  tile computes Sᵀ, dPᵀ, Pᵀ, dSᵀ, dV += Pᵀ·dO, dK += dSᵀ·Q as stage 3 does, on its 64 keys.
* **dQ across the consumers.** dQ_tile = dS·K needs every key's dS: each consumer stores its 64 rows of
  dSᵀ into the shared tile, fences and arrives at ``ds_ready`` (count 2), waits for it, computes dQ for
  its half of d (64 × d / 2: the A operand the whole transposed dSᵀ, B its columns of K), and arrives at
  ``ds_free`` (count 2) once that product is done: the next tile's dSᵀ store waits for ``ds_free``.
  Each consumer adds its half through its own fp32 staging tile by TMA reduce-add.

D and the zeroed fp32 dQ buffer come from the Triton preprocessing kernel, as in stage 3. Masks as in
stage 3 (diagonal query tiles masked; the ragged key tile's program with a key mask).

Head dims 128 and 64 (HEAD_DIMS), bf16/fp16. The dQ halves are column slices of K's tile, and a wgmma
shared-memory descriptor must start on a swizzle atom: at d 128 a 64-column half is a whole 128-byte atom of K's
default (128-byte) swizzle; at d 64 a half is 32 columns, 64 bytes, so K (and dK, stored through K's tile) get a
64-byte swizzle there (K_SWIZZLE), whose atoms are 32 columns wide: each consumer's dQ product is N = 32.

Issue 47, ws d 64 (the dQ split's design): of (a) the same column split on a 64-byte-swizzled K, (b) one consumer
computing the whole 64 × 64 dQ tile on alternate query tiles and (c) larger key tiles, (a) is kept: the kernel
is unchanged but for K's layout (d 128 PTX-identical) and both consumers keep equal work each tile. Under (b) a
tile's whole dQ step (two K = 64 products of N = 64, a 16 KB staging store and reduce-add) falls on one consumer,
on the tile's critical path, and the other's next dSᵀ store still waits at ds_free for it: hiding it needs a second
dSᵀ buffer and per-parity barriers, a new protocol to prove. (a)'s only costs: dQ's products at N = 32 (dQ is
one fifth of the products) and K read through a 64-byte swizzle (Sᵀ's A operand, dQ's B). (c): a consumer owning
128 keys would hold dK and dV (128 × 64 fp32: 64 + 64 registers) and Sᵀ, dPᵀ of 128 × 64 (64 + 64): 256 > 240
before any operand or address, so not without 32-row query tiles (twice the barriers and statistics a key): not
built.

Stage 4d (``GluonBwdWsConfig.rebuild``, the default): stage 4b's rebuilt descriptors in the consumers, and on
the diagonal tiles dPᵀ issued after Pᵀ: no spills (stage 3b's kernel, ``rebuild=False``, spilled ~300 B of stack
under the 240-register budget; it ran 59 ms at 1x32x32768x128 causal on an H100). The kernel table may name
this kernel for the backward ("gluon_ws", impl.attention.flash_dispatch).

Issue 47, ws refill (``num_stages``, ``release_before_dq``; off by default): the one-pass kernel's refill_first has
no twin here (the load warp refills a slot when both consumers free it, before their dQ epilogue and its bulk
wait); these two give the refill more lead instead (a third slot; the slot freed before dQ's product retires).

Issue 47, ws 128-row query tiles (``block_m=128``, d 64 only; a TRIAL_CONFIGS entry, off by default): the query
tile's height is the kernel's BLOCK_M constexpr, apart from a consumer's 64 keys (KEYS). At d 64 the products of a
(query tile, key tile) step are half of d 128's while its fixed costs (ds_ready / ds_free, the dQ staging store and
reduce-add, the ring's barriers, the row statistics) are not; 128-row tiles pay them once per 128 rows (FA3's
kBlockM = 128 at d 64). The causal diagonal is one tile (_program). A consumer holds Sᵀ and dPᵀ of 64 × 128 (64 + 64
registers) beside dK and dV (32 + 32), so the row statistics (32 registers each, with 64-bit addresses per value
through _row_stats) did not fit: lse and D are folded into the Sᵀ and dPᵀ accumulators, loaded through one address
(_tile_stat), and dSᵀ is formed from the rounded Pᵀ. Full attention compiles without spills, causal with 64 B of
stack (NOTES.md): hence a trial config, timed by the probe on request, not a candidate.

Issue 47, ws dQ over a consumer's own keys (``dq_own_keys``, d 64 only; a TRIAL_CONFIGS entry, off by default):
dQ_tile = dS·K is a sum over keys, so each consumer may add its own 64 keys' share, dS_c·K_c, instead of its half
of d over all 128 keys. Neither consumer then reads the other's dSᵀ or K half: the ds_ready / ds_free handshake,
which holds the two consumers in lockstep each tile (so that their exp2 / dS phases coincide and the tensor core
idles through them), is gone, and each consumer runs its tiles as far as the Q/dO ring lets it. The products are
the same instructions (two N = 32 halves of d, K = 64 instead of 128: the same 8 m64n32k16 a consumer); the cost
is twice the dQ reduce-adds (each consumer adds a whole 64 × 64 fp32 tile: two 32-column staging tiles of its
own) and one more 16-register accumulator half live across the products (NOTES.md).

Issue 47, ws ping-pong (``pingpong``, with dq_own_keys; a TRIAL_CONFIGS entry, off by default): the own-keys
consumers take turns issuing their products, two issue groups a query tile (Sᵀ and dPᵀ; dV, dK and dQ), through
flash_gluon_ws's turn mbarriers, so that each one's exp2 / dS and staging phases get the other's products by
construction instead of by drift (_consumer_loop: the protocol and why it cannot deadlock).

Issue 47, ws prescaled lse (``prescaled_lse``, 64-row query tiles, d 128 and 64; a TRIAL_CONFIGS entry, off by
default): ncu's PC sampling of the default at 1x16x16384x64 causal put 9.5% of all warp samples on the FMUL of lse by
log2 e, stalled on the long scoreboard of lse's global load: ptxas places it (or, with lse loaded already scaled, the
negation of ``st * qk_scale - lse2``) after the tile's WARPGROUP.ARRIVE, before its wgmma issue, so each tile's
products wait for a global load's latency. The preprocessing launch (flash_kernels._attn_bwd_preprocess, beside D)
writes −lse·log2 e instead, and P's exponent adds it (_p_exponent): the load's first consumer is then the FFMA after
the product's wait. Bitwise the default's results (dQ up to its reduce-adds' order, which varies from run to run for
both): fp32(lse·−log2 e) is the default's lse2 negated, an exact operation, which ptxas folds into the same FFMA. No
spills at d 64; at d 128 (consumers at 238 of 240 registers) one 4-byte stack slot (NOTES.md).

Issue 47, ws stats in shared memory (``stats_smem``, with prescaled_lse; CANDIDATE_CONFIGS entries with two and
three ring slots, which the kernel table may name; off in the default config): FA3's
producer loads LSE and dPsum. The load warp copies each query tile's −lse·log2 e row and D row (BLOCK_M fp32 each) by
TMA into that tile's Q/dO ring slot, on the slot's Q and dO barriers (their expected bytes include them); the consumers
read each from shared memory right where it is used (_ring_stat: before the exponent, before dPᵀ − D), so the consumer
loop has no global load and holds neither statistic across the tile's products: d 128 compiles without the prescaled
trial's stack slot. TMA wants 16-byte row strides: the launcher allocates both buffers with rows padded to a multiple
of 4 (stats_stride; the preprocessing launch writes them at that stride) and describes them as (B·H, n_q), so TMA
zero-fills the rows past n_q as the masked loads did. The slot is freed after both statistics are read (each
consumer's release follows a warpgroup-wide wgmma or barrier that orders every warp's reads before it).

Issue 47, the d 64 backward's handshakes (``lean_sync``, the default dQ split only; a TRIAL_CONFIGS entry with
stats_smem, off by default): no ds_free. In the default split both consumers arrive at ds_free and at the tile's
slot_empty together, after dQ's products, so the next dSᵀ store waits on the previous tile's slot_empty completion
instead (_ds_rows_free, with the parity argument): one single-thread arrive fewer a consumer and query tile, and with
it the warpgroup bar.sync Triton 3.6 puts before each (NOTES.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .flash_gluon_bwd import _tma_reduce_add
from .flash_gluon_ws import _pass_turn, _take_turn
from .flash_gluon_common import (LOG2E, LaunchLog, _descriptor, _masked_pt, _mma_layout, _ring_pair, _row_stats,
                                 _tile_2d, as_4d, check_shared, launch)

Tensor = torch.Tensor
FN = "flash_gluon_backward_ws"
BLOCK_N = gl.constexpr(128)
#: A consumer's keys (half the key tile): K's, V's, dK's and dV's TMA blocks, the consumers' Sᵀ / dPᵀ rows.
KEYS = gl.constexpr(64)
#: Query-tile heights (GluonBwdWsConfig.block_m) -> the head dims they run at: 128 at d 64 only (module docstring).
BLOCK_M_HEAD_DIMS = {64: (64, 128), 128: (64,)}
#: The head dims GluonBwdWsConfig.dq_own_keys runs at: its two dQ halves are 2 × d / 2 × 64 / 128 fp32 registers.
DQ_OWN_KEYS_HEAD_DIMS = (64,)
NUM_STAGES = gl.constexpr(2)
CONSUMER_REGS = gl.constexpr(240)
LOAD_REGS = gl.constexpr(24)
WS_CAPTURE_BYTES = 512
#: Head dims the kernel is written for -> K's (and dK's) shared-memory swizzle in bytes (None: the default, the
#: widest). A dQ half is d / 2 columns of K; a wgmma descriptor starts on a swizzle atom (module docstring).
K_SWIZZLE = {64: 64, 128: None}
HEAD_DIMS = tuple(K_SWIZZLE)
#: GluonBwdWsConfig.stats_smem: the row statistics' buffers have rows of a multiple of this many fp32 (TMA's 16-byte
#: row strides), and their (1, block_m) TMA blocks lie unswizzled in the ring: a row as it is in memory, which the
#: consumers read in any layout (_ring_stat).
STATS_ALIGN = 4
STATS_LAYOUT = gl.NVMMASharedLayout(0, 32)


@dataclass(frozen=True)
class GluonBwdWsConfig:
    """The ws backward's options (its key tile is fixed: 128 keys on two consumer warpgroups; query tiles of block_m
    rows, num_stages Q/dO slots).

    rebuild (stage 4d): the consumers rebuild the wgmma shared-memory descriptors of their resident K / V
    halves and of the dSᵀ halves every query tile (stage 4b's technique, _consumer_loop): under the
    240-register budget the hoisted ones spilled (stage 3b: ~300 B of stack); rebuilt, nothing spills. The
    default; False keeps stage 3b's kernel, PTX-identical, as the A/B twin its 59 ms was measured with.

    num_stages (issue 47, ws refill): Q/dO ring slots, 2 (the default) or 3 (+32 KB of shared memory: 213,488 B
    compiled): the load warp refills a slot 2 tiles ahead of its use instead of 1, for when one tile of products
    does not hide the TMA load's latency (the one-pass kernel's refill_first, 48.3 -> 42.5 ms, says it may not).

    release_before_dq (issue 47, ws refill): each consumer frees its Q/dO slot (slot_empty) as soon as dV's and dK's
    products, the last readers of Q and dO, have retired, with dQ's two products still in flight, instead of after
    dQ's; the load warp's refill starts that much earlier. Both off by default (the default kernel PTX-identical).

    block_m (issue 47, ws 128-row query tiles): the query tile's rows, 64 (the default) or 128 at head dim 64 only
    (BLOCK_M_HEAD_DIMS; the launcher refuses it at d 128): each (query tile, key tile) step's fixed costs (the
    ds_ready / ds_free handshakes, the dQ staging store and reduce-add, the ring's barriers, the row statistics) are
    paid once per 128 query rows instead of per 64, FA3's kBlockM = 128 at d 64. At d 128 a consumer would hold Sᵀ
    and dPᵀ (64 × 128 fp32: 64 + 64 registers) beside dK and dV (64 × 128: 64 + 64), 256 of its 240, and the CTA
    295,568 B of shared memory: not possible.

    dq_own_keys (issue 47, ws dQ over a consumer's own keys; d 64, rebuild, block_m 64 only): each consumer adds
    dS_c·K_c over its 64 keys to dQ (both 32-column halves, by reduce-add) instead of its 32-column half over all
    128 keys, with no ds_ready / ds_free handshake: the consumers no longer run each tile in lockstep (module
    docstring). Refused at d 128 (two 64 × 64 fp32 dQ halves, +32 registers, over the budget), with block_m 128 and
    without rebuild (both nearer the 240-register budget than the +16 it needs).

    pingpong (issue 47, ws ping-pong of the own-keys consumers; needs dq_own_keys): the two consumers take turns
    issuing their products, two issue groups a query tile (Sᵀ and dPᵀ; then dV, dK and dQ once dSᵀ is formed and
    stored), handing the turn over through a pair of mbarriers after each group (flash_gluon_ws's ping-pong): each
    consumer's exp2 / dS and dQ staging then run under the other's products instead of beside its own (_turn).

    prescaled_lse (issue 47, ws prescaled lse; 64-row query tiles only): the kernel reads −lse·log2 e, written by the
    preprocessing launch beside D, instead of lse, and adds it in P's exponent: nothing of the load is used before
    the tile's products are issued (module docstring). Bitwise the default's results. Refused with block_m=128,
    whose tiles fold lse / sm_scale into Sᵀ's accumulator instead (_tile_stat).

    stats_smem (issue 47, ws stats in shared memory; needs prescaled_lse): the load warp copies each query tile's
    −lse·log2 e and D rows by TMA into its Q/dO ring slot (on the slot's Q and dO barriers), and the consumers read
    them from shared memory where they are used (_ring_stat): no global load in the consumer loop, no row statistic
    held in registers across the products. TMA needs 16-byte row strides, so both buffers are the launcher's own,
    rows padded to a multiple of 4 (STATS_ALIGN): D always is, −lse·log2 e only with prescaled_lse (the caller's lse
    is not). +2 · 64 · 4 B of shared memory per ring slot. Bitwise prescaled_lse's results.

    dq_one_consumer (issue 47, ws dQ by one consumer; d 64, rebuild, block_m 64, not dq_own_keys): consumer 1 computes
    each tile's whole 64 × 64 dQ (two K = 64 products of N = 64 over both dSᵀ halves; K in the default 128-byte
    swizzle) and adds it through both staging halves; consumer 0 computes none and goes on to its next tile
    (_one_dq_tile). cuDNN's d 64 backward does this: its shared operands a tile are 32 KB instead of the split's 48
    (two N = 32 products each re-reading the whole dSᵀ), 4 HGMMA fewer a step and warp, and one consumer's dQ
    staging and reduce-add instead of two (NOTES.md). dK and dV bitwise the split's; dQ's tile sums are the same
    products in the same order.

    lean_sync (issue 47, the d 64 backward's handshakes; the default dQ split only: refused with block_m=128,
    dq_own_keys, pingpong, dq_one_consumer and release_before_dq): no ds_free. Each consumer arrives at ds_free and
    at its Q/dO slot's slot_empty (count 2) at the same point, after dQ's products, so the slot's completion for a
    tile is ds_free's: the next tile's dSᵀ store (and dK's store over K) waits on it instead (_ds_rows_free: the
    parity argument). In Triton 3.6 an mbarrier arrive is one thread's, behind a warpgroup bar.sync: one arrive
    fewer is one bar.sync fewer a consumer and query tile (6 -> 5, NOTES.md), where ncu put the default's barrier
    stalls at 33.5% of its warp cycles at 1x16x16384x64 causal (cuDNN 21.6%). Not built: ds_ready split per
    consumer into two allocations, meant to drop the bar.sync membar puts between the arrive and the wait; Triton
    3.6's membar puts one between any arrive and a later wait, whatever the allocation (NOTES.md). The same products
    in the same order: dK and dV bitwise the config's without it, dQ up to its reduce-adds' order."""

    rebuild: bool = True
    num_stages: int = 2
    release_before_dq: bool = False
    block_m: int = 64
    dq_own_keys: bool = False
    pingpong: bool = False
    prescaled_lse: bool = False
    stats_smem: bool = False
    dq_one_consumer: bool = False
    lean_sync: bool = False

    def __post_init__(self) -> None:
        for name in ("rebuild", "release_before_dq", "dq_own_keys", "pingpong", "prescaled_lse", "stats_smem",
                     "dq_one_consumer", "lean_sync"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GluonBwdWsConfig: {name} must be a bool, got {getattr(self, name)!r}")
        if type(self.num_stages) is not int or self.num_stages not in (2, 3):
            raise ValueError(f"GluonBwdWsConfig: num_stages must be 2 or 3 (3 fills shared memory), "
                             f"got {self.num_stages!r}")
        if type(self.block_m) is not int or self.block_m not in BLOCK_M_HEAD_DIMS:
            raise ValueError(f"GluonBwdWsConfig: block_m must be one of {tuple(BLOCK_M_HEAD_DIMS)} (query rows a "
                             f"tile), got {self.block_m!r}")
        if self.dq_own_keys and (self.block_m != 64 or not self.rebuild):
            raise ValueError(f"GluonBwdWsConfig: dq_own_keys needs block_m=64 and rebuild=True (registers: its second "
                             f"dQ accumulator half does not fit beside the others), got block_m={self.block_m}, "
                             f"rebuild={self.rebuild}")
        if self.pingpong and not self.dq_own_keys:
            raise ValueError("GluonBwdWsConfig: pingpong needs dq_own_keys=True (the turns hand the tensor core "
                             "between consumers that no ds_ready / ds_free handshake holds in lockstep), got "
                             "dq_own_keys=False")
        if self.prescaled_lse and self.block_m != 64:
            raise ValueError(f"GluonBwdWsConfig: prescaled_lse needs block_m=64 ({self.block_m}-row query tiles fold "
                             f"lse into Sᵀ's accumulator: no row statistic to prescale), got block_m={self.block_m}")
        if self.stats_smem and not self.prescaled_lse:
            raise ValueError("GluonBwdWsConfig: stats_smem needs prescaled_lse=True (the load warp's TMA copies need "
                             "row statistics in buffers of 16-byte row strides, which the launcher allocates: D and "
                             "−lse·log2 e, not the caller's lse), got prescaled_lse=False")
        if self.dq_one_consumer and (self.block_m != 64 or not self.rebuild or self.dq_own_keys):
            raise ValueError(f"GluonBwdWsConfig: dq_one_consumer needs block_m=64, rebuild=True and "
                             f"dq_own_keys=False (it changes the shared dQ split those replace or lack), got "
                             f"block_m={self.block_m}, rebuild={self.rebuild}, dq_own_keys={self.dq_own_keys}")
        if self.lean_sync:
            conflicts = [f"{name}={getattr(self, name)!r}" for name, off in (
                ("block_m", 64), ("dq_own_keys", False), ("pingpong", False), ("dq_one_consumer", False),
                ("release_before_dq", False)) if getattr(self, name) != off]
            if conflicts:
                raise ValueError(f"GluonBwdWsConfig: lean_sync needs the default dQ split (block_m=64, dq_own_keys, "
                                 f"pingpong, dq_one_consumer and release_before_dq False: its slot_empty wait stands "
                                 f"for ds_free only where both consumers free the slot after dQ's products), got "
                                 f"{', '.join(conflicts)}")

    @property
    def head_dims(self) -> Tuple[int, ...]:
        """The head dims this config runs at (HEAD_DIMS, or d 64 alone with 128-row query tiles, dq_own_keys or
        dq_one_consumer)."""
        if self.dq_own_keys or self.dq_one_consumer:
            return DQ_OWN_KEYS_HEAD_DIMS
        return BLOCK_M_HEAD_DIMS[self.block_m]


#: What the GPU probe (tools/probes/flash_gluon_bwd.py, rows "ws+gluon-bwd-ws") and the GPU tests run, and what the
#: kernel table may name: the default (rebuild) first, then stage 3b's kernel, then the ws refill variants (each with
#: rebuild); then the row statistics through the ring (stats_smem, 0.93-0.99x the default's backward in every round
#: at four shapes, H100, NOTES.md) with two and three slots, the table's refill variants with it.
_STATS = dict(prescaled_lse=True, stats_smem=True)
CANDIDATE_CONFIGS = (GluonBwdWsConfig(), GluonBwdWsConfig(rebuild=False), GluonBwdWsConfig(release_before_dq=True),
                     GluonBwdWsConfig(num_stages=3), GluonBwdWsConfig(num_stages=3, release_before_dq=True),
                     GluonBwdWsConfig(**_STATS), GluonBwdWsConfig(num_stages=3, **_STATS),
                     GluonBwdWsConfig(num_stages=3, release_before_dq=True, **_STATS))
#: Configs that run but compile with spills (read in NOTES.md): never a candidate, so never in the kernel table; the
#: probe times them with --ws-trials and the GPU tests check them. Issue 47, ws 128-row query tiles (d 64 only);
#: ws dQ over a consumer's own keys (d 64 only; no spills, but unmeasured: a trial until a GPU run says otherwise),
#: alone and with the consumers' ping-pong; the prescaled lse (d 128 and 64; alone 1.02-1.07x the default's
#: backward), alone and with own-keys dQ (d 64). (The prescaled lse with the row statistics through the ring is a
#: candidate.) The whole dQ by one consumer (d 64; unmeasured) beside the table's d 64 entry, the statistics through
#: the ring with two slots. The dSᵀ handshake without ds_free (lean_sync; unmeasured) on that same entry.
TRIAL_CONFIGS = (GluonBwdWsConfig(block_m=128), GluonBwdWsConfig(dq_own_keys=True),
                 GluonBwdWsConfig(dq_own_keys=True, pingpong=True), GluonBwdWsConfig(prescaled_lse=True),
                 GluonBwdWsConfig(dq_own_keys=True, prescaled_lse=True),
                 GluonBwdWsConfig(dq_one_consumer=True, **_STATS), GluonBwdWsConfig(lean_sync=True, **_STATS))


def shared_bytes(d: int, itemsize: int = 2, num_stages: int = NUM_STAGES.value, block_m: int = 64,
                 dq_own_keys: bool = False, pingpong: bool = False, stats_smem: bool = False) -> int:
    """K, V; the Q/dO ring; dSᵀ; two fp32 dQ staging halves (four with dq_own_keys); mbarriers (two more, the
    turns, with pingpong); with stats_smem a row of −lse·log2 e and one of D (block_m fp32 each) per ring slot; the
    ws captures (bound). At d 64: 98,960 B (64-row query tiles), 115,344 B (dq_own_keys), 115,376 B (and pingpong),
    164,496 B (128-row); at d 128 with 128-row tiles 295,568 B, over the H100's 232,448."""
    bm, bn, ns, nq = block_m, BLOCK_N.value, num_stages, 2 if dq_own_keys else 1
    return ((2 * bn * d + ns * 2 * bm * d + bn * bm) * itemsize + nq * bm * d * 4 + 16 * (3 + 2 * pingpong)
            + 3 * 16 * ns + stats_smem * ns * 2 * bm * 4 + WS_CAPTURE_BYTES)


def check_head_dim(d: int, config: Optional[GluonBwdWsConfig] = None) -> None:
    """ValueError unless the kernel is written for head dim d (HEAD_DIMS) and config (None: the default) runs there."""
    if d not in K_SWIZZLE:
        raise ValueError(f"{FN}: head dim must be one of {HEAD_DIMS}, got {d}")
    if config is not None and d not in config.head_dims:
        why = "dq_own_keys" if config.dq_own_keys else f"{config.block_m}-row query tiles"
        raise ValueError(f"{FN}: {config} runs at head dims {config.head_dims} only ({why}: "
                         f"registers and shared memory), got head dim {d}")


@gluon.jit
def _load_partition(descs, smem, bars, sched, STAGES: gl.constexpr, BLOCK_M: gl.constexpr,
                    STATS_SMEM: gl.constexpr = False):
    """One warp: K and V once, then each query tile's Q and dO (BLOCK_M rows) into the ring of STAGES slots once
    both consumers have freed the slot. STATS_SMEM (GluonBwdWsConfig.stats_smem): with the tile's −lse·log2 e row
    (L's descriptor) on Q's barrier and its D row (Delta's) on dO's, each into the slot's row of its ring; rows past
    N_Q are zero-filled by TMA, as the masked loads of _row_stats read them."""
    q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc = descs
    k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, nl2_smem, d_smem = smem
    kv_bar, q_ready, do_ready, slot_empty, ds_ready, ds_free, turn = bars
    L, Delta, H, N_Q, N_K, qk_scale, sm_scale, causal = sched
    b, h, n0, j0, n_t, n_diag = _program(H, N_Q, sched, BLOCK_M)
    q_bytes: gl.constexpr = q_desc.block_type.nbytes + (L.block_type.nbytes if STATS_SMEM else 0)
    do_bytes: gl.constexpr = do_desc.block_type.nbytes + (Delta.block_type.nbytes if STATS_SMEM else 0)
    mbarrier.expect(kv_bar, 4 * k_desc.block_type.nbytes)
    for c in gl.static_range(2):  # each consumer's 64 keys in their own half (one TMA block each)
        tma.async_copy_global_to_shared(k_desc, [b, h, n0 + c * KEYS, 0], kv_bar, k_smem.index(c))
        tma.async_copy_global_to_shared(v_desc, [b, h, n0 + c * KEYS, 0], kv_bar, v_smem.index(c))
    for t in range(n_t):
        slot = t % STAGES
        mbarrier.wait(slot_empty.index(slot), ((t // STAGES) & 1) ^ 1)  # fresh: phase -1 complete
        row = (j0 + t) * BLOCK_M
        mbarrier.expect(q_ready.index(slot), q_bytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, row, 0], q_ready.index(slot), q_smem.index(slot))
        if STATS_SMEM:  # the statistics' descriptors are over (B·H, N_Q)
            tma.async_copy_global_to_shared(L, [gl.program_id(1), row], q_ready.index(slot), nl2_smem.index(slot))
        mbarrier.expect(do_ready.index(slot), do_bytes)
        tma.async_copy_global_to_shared(do_desc, [b, h, row, 0], do_ready.index(slot), do_smem.index(slot))
        if STATS_SMEM:
            tma.async_copy_global_to_shared(Delta, [gl.program_id(1), row], do_ready.index(slot),
                                            d_smem.index(slot))


@gluon.jit
def _ring_use(t, STAGES: gl.constexpr):
    """(slot, phase) of a consumer's ring use t >= 0. 3 slots: one unsigned division (the signed one's sign fix-ups
    cost the consumers 4 spilled registers in full attention); 2: the mask and shift of the default kernel."""
    if STAGES == 3:
        u = t.to(gl.uint32)
        q = u // STAGES
        slot = (u - q * STAGES).to(gl.int32)
        phase = (q & 1).to(gl.int32)
    else:
        slot = t % STAGES
        phase = (t // STAGES) & 1
    return slot, phase


@gluon.jit
def _ds_rows_free(slot_empty, t, STAGES: gl.constexpr):
    """GluonBwdWsConfig.lean_sync's stand-in for ds_free: returns once both consumers' dQ products of tile t - 1 have
    retired (t = 0: at once), before tile t's dSᵀ store (t = n_t: before dK overwrites K). Each consumer arrives at
    slot_empty for ring use t - 1 right after those products (release_before_dq, which arrives before them, is
    refused), so that completion of the slot (count 2) is ds_free's of tile t - 1: the wait is the load warp's before
    it refills the slot for use t - 1 + STAGES (_load_partition; t = 0: slot STAGES - 1, phase -1, complete).
    Parity: the slot's completions so far are neither (i) past use t - 1's (use t - 1 + STAGES's needs this consumer's
    own arrival at tile t - 1 + STAGES >= t) nor (ii) short of use t - 1 - STAGES's (that needed the other consumer's
    arrival, made before it stored its dSᵀ rows of tile t - 1 and arrived at its ds_ready, which this consumer waited
    for at tile t - 1): so the parity names use t - 1's completion alone."""
    slot, phase = _ring_use(t + STAGES - 1, STAGES)
    mbarrier.wait(slot_empty.index(slot), phase ^ 1)


@gluon.jit
def _program(H, N_Q, sched, BLOCK_M: gl.constexpr):
    """(b, h, n0, j0, n_t, n_diag) of this program: its key tile and its query tiles j0 + t (BLOCK_M rows each),
    t < n_t, the first n_diag of them on the causal diagonal (sched's last entry: 1 causal, 0 full). Causal, top-left
    aligned: the first tile holding query n0 is j0 (tiles before see none of the keys); BLOCK_M divides BLOCK_N and
    n0, so tiles j0 .. j0 + BLOCK_N / BLOCK_M - 1 (2 of 64 rows, 1 of 128) hold a query before some key, the rest
    none."""
    pid_bh = gl.program_id(1)
    n0 = gl.program_id(0) * BLOCK_N
    n_m = gl.cdiv(N_Q, BLOCK_M)
    j0 = gl.minimum(n0 // BLOCK_M, n_m) * sched[7]  # IS_CAUSAL as 0/1: full attention starts at 0
    n_t = n_m - j0
    n_diag = gl.minimum(BLOCK_N // BLOCK_M, n_t) * sched[7]
    return pid_bh // H, pid_bh % H, n0, j0, n_t, n_diag


@gluon.jit
def _resident_views(k_smem, v_smem, ds_smem, z, C: gl.constexpr, KEYS: gl.constexpr, BLOCK_D: gl.constexpr,
                    DQ_ONE: gl.constexpr = False):
    """Consumer C's views through slot offset z (0; a loop-variant 0 under REBUILD): its K and V halves, its dQ
    columns of both K halves (the dQ product over keys is two chained wgmma; DQ_ONE: all of their columns), both
    dSᵀ halves (dQ's A) and its own (where it stores)."""
    HALF: gl.constexpr = BLOCK_D // 2
    k2 = _tile_2d(k_smem.index(C + z), KEYS, BLOCK_D)
    v2 = _tile_2d(v_smem.index(C + z), KEYS, BLOCK_D)
    if DQ_ONE:
        kq0 = _tile_2d(k_smem.index(z), KEYS, BLOCK_D)
        kq1 = _tile_2d(k_smem.index(1 + z), KEYS, BLOCK_D)
    else:
        kq0 = _tile_2d(k_smem.index(z), KEYS, BLOCK_D).slice(C * HALF, HALF, dim=1)
        kq1 = _tile_2d(k_smem.index(1 + z), KEYS, BLOCK_D).slice(C * HALF, HALF, dim=1)
    return k2, v2, kq0, kq1, ds_smem.index(z), ds_smem.index(1 + z), ds_smem.index(C + z)


@gluon.jit
def _tile_stat(base, m0, N_Q, BLOCK_M: gl.constexpr, layout: gl.constexpr):
    """A query tile's row statistic (rows m0 .., 0 past N_Q) from one scalar pointer and constant offsets: a thread's
    addresses are one register and immediates, not a 64-bit pointer per value (_row_stats's, 64 registers at 128
    rows)."""
    idx = gl.arange(0, BLOCK_M, layout=layout)
    return gl.load(base + m0 + idx, mask=idx < N_Q - m0, other=0.0)


@gluon.jit
def _dpt_minus_d(v2, do2, st_zero, D_base, m0, N_Q):
    """dPᵀ − D (keys x queries) issued as one async product whose accumulator starts at −D: with 128-row query tiles
    a thread's 32 D values are not held across the product, only its accumulator."""
    delta = _tile_stat(D_base, m0, N_Q, st_zero.shape[1], gl.SliceLayout(0, st_zero.type.layout))
    return warpgroup_mma(v2, do2.permute((1, 0)), st_zero - gl.expand_dims(delta, 0), is_async=True)


@gluon.jit
def _p_exponent(st, qk_scale, lse2, PRESCALED_LSE: gl.constexpr):
    """exp2's argument for Pᵀ (keys x queries) at 64-row tiles: Sᵀ·qk_scale − lse·log2 e, lse2 as _row_stats loaded
    it. PRESCALED_LSE (GluonBwdWsConfig.prescaled_lse): lse2 is −lse·log2 e, added, so that no multiply or negation
    of the loaded value is left for ptxas to hoist before the tile's products (module docstring)."""
    if PRESCALED_LSE:
        x = st * qk_scale + gl.expand_dims(lse2, 0)
    else:
        x = st * qk_scale - gl.expand_dims(lse2, 0)
    return x


@gluon.jit
def _ring_stat(ring, slot, layout: gl.constexpr):
    """GluonBwdWsConfig.stats_smem: a query tile's row statistic (BLOCK_M fp32; rows past N_Q zero-filled by TMA) from
    its ring slot's row, in `layout`. Read where it is used, after the product it follows: neither statistic is then
    loaded from global memory nor held in registers across the tile's products (16 registers each at 64 rows)."""
    return ring.index(slot).reshape([ring.shape[2]]).load(layout)


@gluon.jit
def _own_dq_tile(dv, dk, pt16, ds16, dst16, my_ds, k2, q2, do2, dq_smem, slot_free, dq_desc, b, h, m0, sm_scale, turn,
                 C: gl.constexpr, EARLY_RELEASE: gl.constexpr, PINGPONG: gl.constexpr):
    """GluonBwdWsConfig.dq_own_keys: consumer C's share of the tile's dQ, dS_c·K_c over its own 64 keys (both halves
    of d, N = d / 2 as K's 64-byte swizzle allows), added by reduce-add through its own two staging tiles; nothing
    waits for the other consumer. Frees the Q/dO slot (slot_free) and returns dV and dK with their products
    retired. Its dSᵀ tile is free for the next tile's store once the products retire: the warpgroup barrier after
    the staging wait orders every warp's product wait before any warp's next store. PINGPONG: dV's and dK's products
    are issued here too, with dQ's, in the tile's second turn (_consumer_loop)."""
    BLOCK_M: gl.constexpr = dst16.shape[1]
    HALF: gl.constexpr = k2.shape[1] // 2
    my_ds.store(dst16)
    fence_async_shared()
    gl.thread_barrier()  # every warp's dSᵀ rows are written before the warpgroup's products read them
    zero = gl.zeros([BLOCK_M, HALF], gl.float32, _mma_layout(4, HALF))
    ds_q = my_ds.permute((1, 0))
    if PINGPONG:
        _take_turn(turn, 1, C, PINGPONG)
        dv = warpgroup_mma(pt16, do2, dv, is_async=True)
        dk = warpgroup_mma(ds16, q2, dk, is_async=True)
    lo = warpgroup_mma(ds_q, k2.slice(0, HALF, dim=1), zero, use_acc=False, is_async=True)
    hi = warpgroup_mma(ds_q, k2.slice(HALF, HALF, dim=1), zero, use_acc=False, is_async=True)
    _pass_turn(turn, C, PINGPONG)
    if EARLY_RELEASE:  # dV's and dK's groups retire (dQ's two stay in flight): Q and dO are read no more
        dv, dk, pt16, ds16 = warpgroup_mma_wait(num_outstanding=2, deps=(dv, dk, pt16, ds16))
        mbarrier.arrive(slot_free)
        lo, hi = warpgroup_mma_wait(num_outstanding=0, deps=(lo, hi))
    else:
        dv, dk, lo, hi, pt16, ds16 = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, lo, hi, pt16, ds16))
        mbarrier.arrive(slot_free)
    tma.store_wait(pendings=0)  # this consumer's staging tiles: its previous reduce-adds have read them
    gl.thread_barrier()
    dq_smem.index(2 * C).reshape([BLOCK_M, HALF]).store(lo * sm_scale)
    dq_smem.index(2 * C + 1).reshape([BLOCK_M, HALF]).store(hi * sm_scale)
    fence_async_shared()
    gl.thread_barrier()
    _tma_reduce_add(dq_desc, [b, h, m0, 0], dq_smem.index(2 * C))
    _tma_reduce_add(dq_desc, [b, h, m0, HALF], dq_smem.index(2 * C + 1))
    return dv, dk


@gluon.jit
def _one_dq_tile(dv, dk, pt16, ds16, ds_lo, ds_hi, kq0, kq1, dq_smem, slot_free, ds_free, ds_ready, t, dq_desc, b, h,
                 m0, sm_scale, C: gl.constexpr, EARLY_RELEASE: gl.constexpr):
    """GluonBwdWsConfig.dq_one_consumer, after consumer C's dSᵀ rows are stored and ds_ready arrived at: consumer 1
    computes the tile's whole dQ (64 × d, N = d: kq0 / kq1 are all of K's columns) and adds it through both staging
    halves; consumer 0 only retires its dV and dK products and frees the slot, waiting for nothing of the other's.
    ds_free counts consumer 1's arrival alone (the launch's init): consumer 0's next dSᵀ store still waits for this
    tile's dQ product to have read its rows, but its next Sᵀ, dPᵀ, exponentials and dV run under that product (cuDNN's
    d 64 backward: one consumer warpgroup does every tile's dQ, NOTES.md)."""
    if C == 0:
        dv, dk, pt16, ds16 = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, pt16, ds16))
        mbarrier.arrive(slot_free)
    else:
        BLOCK_M: gl.constexpr = ds_lo.shape[1]
        BLOCK_D: gl.constexpr = kq0.shape[1]
        HALF: gl.constexpr = BLOCK_D // 2
        mbarrier.wait(ds_ready, t & 1)
        dq = warpgroup_mma(ds_lo.permute((1, 0)), kq0,
                           gl.zeros([BLOCK_M, BLOCK_D], gl.float32, _mma_layout(4, BLOCK_D)), use_acc=False,
                           is_async=True)
        dq = warpgroup_mma(ds_hi.permute((1, 0)), kq1, dq, is_async=True)
        if EARLY_RELEASE:  # dV's and dK's groups retire (dQ's two stay in flight): Q and dO are read no more
            dv, dk, pt16, ds16 = warpgroup_mma_wait(num_outstanding=2, deps=(dv, dk, pt16, ds16))
            mbarrier.arrive(slot_free)
            dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
            mbarrier.arrive(ds_free)
        else:
            dv, dk, dq, pt16, ds16 = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, pt16, ds16))
            mbarrier.arrive(ds_free)
            mbarrier.arrive(slot_free)
        # The staging halves: free once this consumer's previous reduce-adds have read them.
        lo, hi = gl.split(gl.permute(gl.reshape(dq * sm_scale, [BLOCK_M, 2, HALF]), (0, 2, 1)))
        tma.store_wait(pendings=0)
        gl.thread_barrier()
        dq_smem.index(0).reshape([BLOCK_M, HALF]).store(lo)
        dq_smem.index(1).reshape([BLOCK_M, HALF]).store(hi)
        fence_async_shared()
        gl.thread_barrier()
        _tma_reduce_add(dq_desc, [b, h, m0, 0], dq_smem.index(0))
        _tma_reduce_add(dq_desc, [b, h, m0, HALF], dq_smem.index(1))
    return dv, dk


@gluon.jit
def _consumer_loop(dk, dv, t_lo, t_hi, j0, b, h, n0, C: gl.constexpr, descs, smem, bars, sched,
                   MASKED: gl.constexpr, KEY_MASK: gl.constexpr, REBUILD: gl.constexpr, STAGES: gl.constexpr,
                   EARLY_RELEASE: gl.constexpr, BLOCK_M: gl.constexpr, OWN_DQ: gl.constexpr = False,
                   PINGPONG: gl.constexpr = False, PRESCALED_LSE: gl.constexpr = False,
                   STATS_SMEM: gl.constexpr = False, DQ_ONE: gl.constexpr = False, LEAN_SYNC: gl.constexpr = False):
    """Consumer C's query tiles t in [t_lo, t_hi). REBUILD (stage 4d, GluonBwdWsConfig.rebuild): the resident K
    and V halves and the dSᵀ halves are viewed each tile through slot C + z (and z, 1 + z), z = m0 >> 30, which is
    0 (the launcher refuses 2^30 query rows or more) but neither provably 0 nor loop-invariant to the compiler,
    so their wgmma descriptors are rebuilt each tile instead of being hoisted and held (stage 4b's technique,
    flash_gluon_bwd._q_loop). STAGES: the Q/dO ring's slots; EARLY_RELEASE: GluonBwdWsConfig.release_before_dq;
    BLOCK_M: the query tile's rows (GluonBwdWsConfig.block_m); OWN_DQ: GluonBwdWsConfig.dq_own_keys (_own_dq_tile);
    PRESCALED_LSE: GluonBwdWsConfig.prescaled_lse (L holds −lse·log2 e; _p_exponent). STATS_SMEM:
    GluonBwdWsConfig.stats_smem (L and Delta are TMA descriptors; the load warp copies a tile's rows into its Q/dO
    slot, read here by _ring_stat right before the exponent and dSᵀ, after the waits on Q's and dO's barriers).
    DQ_ONE: GluonBwdWsConfig.dq_one_consumer (_one_dq_tile). LEAN_SYNC: GluonBwdWsConfig.lean_sync (no ds_free: the
    dSᵀ store waits on the previous tile's slot_empty, _ds_rows_free).

    PINGPONG (GluonBwdWsConfig.pingpong, with OWN_DQ): two turns a tile, taken strictly in alternation (consumer 0
    first; flash_gluon_ws._take_turn): the first issues Sᵀ and dPᵀ, the second (_own_dq_tile) dV, dK and dQ once
    dSᵀ is formed and stored; each turn is passed on right after its issues and taken only once its operands have
    landed, so a turn is held only while issuing. Both consumers run the same tiles t (n_t and n_diag are the
    program's, and so is KEY_MASK), two turns each, so the alternation holds to the last tile, whose final pass
    nobody waits for; a turn's parity is fixed by its place in the tile, so nothing is carried across tiles.
    No deadlock with the ring: a consumer arrives at slot_empty(t) after its second turn of t without waiting on
    anything, and the load of tile t + STAGES needs only both slot_empty(t) arrivals, which precede the turns of
    t + 1 that the other waits for. The diagonal tiles (SERIAL) issue dPᵀ after Pᵀ, out of turn (registers)."""
    q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc = descs
    k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, nl2_smem, d_smem = smem
    kv_bar, q_ready, do_ready, slot_empty, ds_ready, ds_free, turn = bars
    L, Delta, H, N_Q, N_K, qk_scale, sm_scale, causal = sched
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]
    HALF: gl.constexpr = BLOCK_D // 2
    dtype: gl.constexpr = q_desc.dtype
    st_layout: gl.constexpr = _mma_layout(4, BLOCK_M)
    kv_layout: gl.constexpr = _mma_layout(4, BLOCK_D)
    dq_layout: gl.constexpr = _mma_layout(4, HALF)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    row_layout: gl.constexpr = gl.SliceLayout(1, st_layout)
    pid_bh = gl.program_id(1)
    if STATS_SMEM:  # L and Delta are descriptors: the statistics come through the ring
        L_base = 0
        D_base = 0
    else:
        L_base = L + pid_bh.to(gl.int64) * N_Q
        D_base = Delta + pid_bh.to(gl.int64) * N_Q
    k2, v2, kq0, kq1, ds_lo, ds_hi, my_ds = _resident_views(k_smem, v_smem, ds_smem, 0, C, KEYS, BLOCK_D, DQ_ONE)
    my_dq = dq_smem.index(C)
    offs_n = n0 + C * KEYS + gl.arange(0, KEYS, layout=row_layout)
    st_zero = gl.zeros([KEYS, BLOCK_M], gl.float32, st_layout)
    inv_sm = 1.0 / sm_scale
    for t in range(t_lo, t_hi):
        slot, phase = _ring_use(t, STAGES)
        m0 = (j0 + t) * BLOCK_M
        if STATS_SMEM:
            offs_m = m0 + gl.arange(0, BLOCK_M, layout=col_layout)
        else:
            offs_m, lse2, delta = _row_stats(L_base, D_base, m0, N_Q, BLOCK_M, col_layout, PRESCALED_LSE)
        if REBUILD:
            k2, v2, kq0, kq1, ds_lo, ds_hi, my_ds = _resident_views(k_smem, v_smem, ds_smem, m0 >> 30, C, KEYS,
                                                                    BLOCK_D, DQ_ONE)
        q2 = _tile_2d(q_smem.index(slot), BLOCK_M, BLOCK_D)
        do2 = _tile_2d(do_smem.index(slot), BLOCK_M, BLOCK_D)
        # SERIAL (rebuild's diagonal tiles, at most 2 a program): dPᵀ issued after Pᵀ is formed and dV's product
        # issued, so that its accumulator is not live across the causal mask (with it, that loop instance spilled).
        SERIAL: gl.constexpr = REBUILD and MASKED and BLOCK_M == KEYS
        mbarrier.wait(q_ready.index(slot), phase)
        if PINGPONG:  # the tile's first turn, taken with its operands in
            if not SERIAL:
                mbarrier.wait(do_ready.index(slot), phase)
            _take_turn(turn, 0, C, PINGPONG)
        # WIDE (128-row query tiles, GluonBwdWsConfig.block_m): lse and D folded into the Sᵀ and dPᵀ accumulators,
        # dSᵀ from the rounded Pᵀ: a thread holds no row statistics (nor their addresses) or fp32 Pᵀ across the
        # products (each cost 32 registers or more and spilled; NOTES.md).
        WIDE: gl.constexpr = BLOCK_M > KEYS
        if WIDE:  # Sᵀ − lse / sm_scale, whose exp2(· qk_scale) is P
            lse_s = _tile_stat(L_base, m0, N_Q, BLOCK_M, col_layout) * inv_sm
            st = warpgroup_mma(k2, q2.permute((1, 0)), st_zero - gl.expand_dims(lse_s, 0), is_async=True)
        else:
            st = warpgroup_mma(k2, q2.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        if not SERIAL:
            if not PINGPONG:
                mbarrier.wait(do_ready.index(slot), phase)
            if WIDE:
                dpt = _dpt_minus_d(v2, do2, st_zero, D_base, m0, N_Q)
            else:
                dpt = warpgroup_mma(v2, do2.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        _pass_turn(turn, C, PINGPONG)
        st = warpgroup_mma_wait(num_outstanding=0 if SERIAL else 1, deps=(st,))
        if WIDE:
            pt = _masked_pt(gl.exp2(st * qk_scale), offs_m, offs_n, N_K, MASKED, KEY_MASK)
        else:
            if STATS_SMEM:
                lse2 = _ring_stat(nl2_smem, slot, col_layout)
            pt = _masked_pt(gl.exp2(_p_exponent(st, qk_scale, lse2, PRESCALED_LSE)), offs_m, offs_n, N_K, MASKED,
                            KEY_MASK)
        pt16b = pt.to(dtype)
        pt16 = gl.convert_layout(pt16b, a_layout)
        if SERIAL:
            mbarrier.wait(do_ready.index(slot), phase)
        if PINGPONG:  # dV's product waits for the second turn (_own_dq_tile)
            if SERIAL:
                dpt = warpgroup_mma(v2, do2.permute((1, 0)), st_zero, use_acc=False, is_async=True)
            dpt = warpgroup_mma_wait(num_outstanding=0, deps=(dpt,))
        else:
            dv = warpgroup_mma(pt16, do2, dv, is_async=True)
        if WIDE:
            dpt, pt16 = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt16))
            dst16 = (pt16b.to(gl.float32) * dpt).to(dtype)
        else:
            if PINGPONG:
                pass
            elif SERIAL:
                dpt = warpgroup_mma(v2, do2.permute((1, 0)), st_zero, use_acc=False, is_async=True)
                dpt, pt16, dv = warpgroup_mma_wait(num_outstanding=0, deps=(dpt, pt16, dv))
            else:
                dpt, pt16 = warpgroup_mma_wait(num_outstanding=1, deps=(dpt, pt16))
            if STATS_SMEM:
                delta = _ring_stat(d_smem, slot, col_layout)
            dst16 = (pt * (dpt - gl.expand_dims(delta, 0))).to(dtype)
        ds16 = gl.convert_layout(dst16, a_layout)
        if not PINGPONG:
            dk = warpgroup_mma(ds16, q2, dk, is_async=True)
        if OWN_DQ:
            dv, dk = _own_dq_tile(dv, dk, pt16, ds16, dst16, my_ds, k2, q2, do2, dq_smem, slot_empty.index(slot),
                                  dq_desc, b, h, m0, sm_scale, turn, C, EARLY_RELEASE, PINGPONG)
        else:
            # dSᵀ rows of this consumer into the shared tile, once both consumers' dQ products of the
            # previous tile are done with it (a fresh barrier counts phase -1 as complete).
            if LEAN_SYNC:
                _ds_rows_free(slot_empty, t, STAGES)
            else:
                mbarrier.wait(ds_free, (t & 1) ^ 1)
            my_ds.store(dst16)
            fence_async_shared()
            mbarrier.arrive(ds_ready)
        if DQ_ONE:
            dv, dk = _one_dq_tile(dv, dk, pt16, ds16, ds_lo, ds_hi, kq0, kq1, dq_smem, slot_empty.index(slot), ds_free,
                                  ds_ready, t, dq_desc, b, h, m0, sm_scale, C, EARLY_RELEASE)
        elif not OWN_DQ:
            mbarrier.wait(ds_ready, t & 1)
            dq = warpgroup_mma(ds_lo.permute((1, 0)), kq0, gl.zeros([BLOCK_M, HALF], gl.float32, dq_layout),
                               use_acc=False, is_async=True)
            dq = warpgroup_mma(ds_hi.permute((1, 0)), kq1, dq, is_async=True)
            if EARLY_RELEASE:  # dV's and dK's groups retire (dQ's two stay in flight): Q and dO are read no more
                dv, dk, pt16, ds16 = warpgroup_mma_wait(num_outstanding=2, deps=(dv, dk, pt16, ds16))
                mbarrier.arrive(slot_empty.index(slot))
                dq = warpgroup_mma_wait(num_outstanding=0, deps=(dq,))
                mbarrier.arrive(ds_free)
            else:
                dv, dk, dq, pt16, ds16 = warpgroup_mma_wait(num_outstanding=0, deps=(dv, dk, dq, pt16, ds16))
                if not LEAN_SYNC:  # LEAN_SYNC: slot_empty's arrival stands for it (_ds_rows_free)
                    mbarrier.arrive(ds_free)
                mbarrier.arrive(slot_empty.index(slot))
            # This consumer's half of dQ: its staging tile is free once its previous reduce has read it.
            tma.store_wait(pendings=0)
            gl.thread_barrier()
            my_dq.reshape([BLOCK_M, HALF]).store(dq * sm_scale)
            fence_async_shared()
            gl.thread_barrier()
            _tma_reduce_add(dq_desc, [b, h, m0, C * HALF], my_dq)
    return dk, dv


@gluon.jit
def _consumer_partition(descs, smem, bars, sched, C: gl.constexpr, REBUILD: gl.constexpr, STAGES: gl.constexpr,
                        EARLY_RELEASE: gl.constexpr, BLOCK_M: gl.constexpr, OWN_DQ: gl.constexpr,
                        PINGPONG: gl.constexpr, PRESCALED_LSE: gl.constexpr, STATS_SMEM: gl.constexpr,
                        DQ_ONE: gl.constexpr = False, LEAN_SYNC: gl.constexpr = False):
    """Consumer warpgroup C: keys n0 + 64C … + 63 of the program's key tile."""
    q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc = descs
    k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, nl2_smem, d_smem = smem
    kv_bar, q_ready, do_ready, slot_empty, ds_ready, ds_free, turn = bars
    L, Delta, H, N_Q, N_K, qk_scale, sm_scale, causal = sched
    gl.static_assert(gl.num_warps() == 4, "a consumer is one warpgroup")
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]
    kv_layout: gl.constexpr = _mma_layout(4, BLOCK_D)
    b, h, n0, j0, n_t, n_diag = _program(H, N_Q, sched, BLOCK_M)
    dk = gl.zeros([KEYS, BLOCK_D], gl.float32, kv_layout)
    dv = gl.zeros([KEYS, BLOCK_D], gl.float32, kv_layout)
    mbarrier.wait(kv_bar, 0)
    dk, dv = _consumer_loop(dk, dv, 0, n_diag, j0, b, h, n0, C, descs, smem, bars, sched, True, True, REBUILD, STAGES,
                            EARLY_RELEASE, BLOCK_M, OWN_DQ, PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE,
                            LEAN_SYNC)
    if n0 + BLOCK_N > N_K:
        dk, dv = _consumer_loop(dk, dv, n_diag, n_t, j0, b, h, n0, C, descs, smem, bars, sched, False, True, REBUILD,
                                STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ, PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE,
                                LEAN_SYNC)
    else:
        dk, dv = _consumer_loop(dk, dv, n_diag, n_t, j0, b, h, n0, C, descs, smem, bars, sched, False, False, REBUILD,
                                STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ, PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE,
                                LEAN_SYNC)
    # K is read by both consumers' dQ products until the last tile's ds_free completes (n_t tiles:
    # phase (n_t - 1) & 1); with no tile, the fresh barrier's phase 1 is complete. OWN_DQ: only this consumer's
    # products read its K half, and they have retired. LEAN_SYNC: the same wait through slot_empty (_ds_rows_free).
    if LEAN_SYNC:
        _ds_rows_free(slot_empty, n_t, STAGES)
    elif not OWN_DQ:
        mbarrier.wait(ds_free, (n_t - 1) & 1)
    dtype: gl.constexpr = q_desc.dtype
    rows_k = k_smem.index(C)
    rows_v = v_smem.index(C)
    _tile_2d(rows_k, KEYS, BLOCK_D).store((dk * sm_scale).to(dtype))
    _tile_2d(rows_v, KEYS, BLOCK_D).store(dv.to(dtype))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(dk_desc, [b, h, n0 + C * KEYS, 0], rows_k)
    tma.async_copy_shared_to_global(dv_desc, [b, h, n0 + C * KEYS, 0], rows_v)
    tma.store_wait(pendings=0)


@gluon.jit
def _attn_bwd_ws_sm90(q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc, L, Delta,
                      H, N_Q, N_K, qk_scale, sm_scale, IS_CAUSAL: gl.constexpr, REBUILD: gl.constexpr = False,
                      STAGES: gl.constexpr = 2, EARLY_RELEASE: gl.constexpr = False, BLOCK_M: gl.constexpr = 64,
                      OWN_DQ: gl.constexpr = False, PINGPONG: gl.constexpr = False,
                      PRESCALED_LSE: gl.constexpr = False, STATS_SMEM: gl.constexpr = False,
                      DQ_ONE: gl.constexpr = False, LEAN_SYNC: gl.constexpr = False):
    """Grid (key tiles of 128, B·H); 4 warps (consumer 0) + a 4-warp consumer + a load warp.
    Descriptors rank 4 over (B, H, N, d): K, V, dK, dV blocks of 64 rows (KEYS: two halves, one per consumer),
    Q and dO blocks of BLOCK_M rows, dQ (fp32) (1, 1, BLOCK_M, d / 2). REBUILD, STAGES, EARLY_RELEASE, BLOCK_M,
    OWN_DQ, PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE, LEAN_SYNC: GluonBwdWsConfig's rebuild, num_stages,
    release_before_dq, block_m, dq_own_keys, pingpong, prescaled_lse, stats_smem, dq_one_consumer, lean_sync
    (_consumer_loop; with PRESCALED_LSE, L is −lse·log2 e; with STATS_SMEM, L and Delta are rank-2 descriptors over
    (B·H, N_Q) of (1, BLOCK_M) blocks)."""
    dtype: gl.constexpr = q_desc.dtype
    BLOCK_D: gl.constexpr = q_desc.block_type.shape[3]
    gl.static_assert(BLOCK_D == 128 or BLOCK_D == 64, "head dim 128 or 64 (K_SWIZZLE)")
    gl.static_assert(q_desc.block_type.shape[2] == BLOCK_M, "Q's blocks are the query tile")
    k_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, KEYS, BLOCK_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, KEYS, BLOCK_D], v_desc.layout)
    q_smem, do_smem = _ring_pair(q_desc, do_desc, STAGES, BLOCK_M, BLOCK_D)
    ds_smem = gl.allocate_shared_memory(dtype, [2, KEYS, BLOCK_M],
                                        gl.NVMMASharedLayout.get_default_for([KEYS, BLOCK_M], dtype))
    DQ_TILES: gl.constexpr = 4 if OWN_DQ else 2  # a consumer's dQ half, or (OWN_DQ) both halves of its share
    dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_TILES, 1, 1, BLOCK_M, BLOCK_D // 2], dq_desc.layout)
    nl2_smem = ds_smem  # unused without STATS_SMEM
    d_smem = ds_smem
    if STATS_SMEM:  # a row of −lse·log2 e and one of D per Q/dO slot, each in its descriptor's (unswizzled) layout
        nl2_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], L.layout)
        d_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, BLOCK_M], Delta.layout)
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ds_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if LEAN_SYNC:  # no ds_free: slot_empty stands for it (_ds_rows_free)
        ds_free = kv_bar  # unused
    else:
        ds_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    do_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    slot_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(ds_ready, count=2)
    if not LEAN_SYNC:
        mbarrier.init(ds_free, count=1 if DQ_ONE else 2)  # the readers of the dSᵀ tile: dQ's products
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(do_ready.index(i), count=1)
        mbarrier.init(slot_empty.index(i), count=2)
    fence_async_shared()

    descs = (q_desc, k_desc, v_desc, do_desc, dq_desc, dk_desc, dv_desc)
    smem = (k_smem, v_smem, q_smem, do_smem, ds_smem, dq_smem, nl2_smem, d_smem)
    turn = ds_free  # unused without PINGPONG
    if PINGPONG:  # consumer C waits on turn[C], the other arrives (flash_gluon_ws._take_turn)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for c in gl.static_range(2):
            mbarrier.init(turn.index(c), count=1)
        fence_async_shared()
    bars = (kv_bar, q_ready, do_ready, slot_empty, ds_ready, ds_free, turn)
    sched = (L, Delta, H, N_Q, N_K, qk_scale, sm_scale, 1 if IS_CAUSAL else 0)
    gl.warp_specialize([
        (_consumer_partition, (descs, smem, bars, sched, 0, REBUILD, STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ,
                               PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE, LEAN_SYNC)),
        (_consumer_partition, (descs, smem, bars, sched, 1, REBUILD, STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ,
                               PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE, LEAN_SYNC)),
        (_load_partition, (descs, smem, bars, sched, STAGES, BLOCK_M, STATS_SMEM)),
    ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


def stats_stride(n_q: int) -> int:
    """The row stride (fp32 elements) of GluonBwdWsConfig.stats_smem's row-statistic buffers: n_q rounded up to
    STATS_ALIGN, so that each (batch, head) row starts 16-byte aligned (TMA)."""
    return -(-n_q // STATS_ALIGN) * STATS_ALIGN


def _stats_descriptor(t: Tensor, name: str, block_m: int) -> TensorDescriptor:
    """stats_smem's TMA descriptor over the row statistic t, (B, H, n_q) fp32 with unit stride along the rows, a row
    stride of a multiple of STATS_ALIGN and heads packed (a view of the launcher's (B, H, stats_stride(n_q))
    buffer): shape (B·H, n_q), so that TMA zero-fills the rows past n_q; blocks (1, block_m)."""
    B, H, n_q = t.shape
    r = t.stride(1)
    if (t.dtype != torch.float32 or t.stride(2) != 1 or r % STATS_ALIGN or r < n_q or t.stride(0) != H * r
            or t.data_ptr() % 16):
        raise ValueError(f"{FN}: stats_smem reads {name} by TMA: it must be fp32 (B, H, n_q) with unit stride along "
                         f"n_q, rows a multiple of {STATS_ALIGN} elements apart (16 bytes), heads packed and its data "
                         f"16-byte aligned, got {t.dtype} of strides {tuple(t.stride())} at {t.data_ptr():#x}")
    return TensorDescriptor(t, [B * H, n_q], [r, 1], [1, block_m], STATS_LAYOUT)


def launch_args(q: Tensor, k: Tensor, v: Tensor, do: Tensor, lse: Tensor, delta: Tensor, dq32: Tensor, dk: Tensor,
                dv: Tensor, is_causal: bool, config: Optional[GluonBwdWsConfig] = None) -> Tuple[tuple, tuple, dict]:
    """(grid, arguments, options) of one launch, for tensors on any device (the compile test). config None:
    GluonBwdWsConfig(); the optional trailing REBUILD, STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ, PINGPONG, PRESCALED_LSE,
    STATS_SMEM, DQ_ONE, LEAN_SYNC are passed up to the last one the config sets (stage 3b's arguments without rebuild;
    the default's with rebuild alone). K and dK get K_SWIZZLE's swizzle, or the default one with dq_one_consumer. lse: the logsumexp, or with config.prescaled_lse the −lse·log2 e the preprocessing launch wrote.
    With config.stats_smem lse and delta ((B, H, n_q) views whose rows lie 16 bytes apart: _stats_descriptor) are
    passed as TMA descriptors."""
    config = config or GluonBwdWsConfig()
    q4, k4, v4, do4, dq4, dk4, dv4 = (as_4d(t) for t in (q, k, v, do, dq32, dk, dv))
    B, H, n_q, d = q4.shape
    check_head_dim(d, config)
    check_shared(shared_bytes(d, q.element_size(), config.num_stages, config.block_m, config.dq_own_keys,
                              config.pingpong, config.stats_smem), d, "ws backward", FN)
    if config.rebuild and n_q >= 1 << 30:
        raise ValueError(f"{FN}: rebuild views the resident tiles through slot (query row >> 30), so it needs "
                         f"fewer than 2^30 query rows, got {n_q}: {config}")
    n_k = k4.shape[2]
    bm, keys, bn = config.block_m, KEYS.value, BLOCK_N.value
    sm_scale = 1.0 / math.sqrt(d)
    swizzle = None if config.dq_one_consumer else K_SWIZZLE[d]  # K's and dK's: dK is stored through K's tile
    stats = (lse, delta)
    if config.stats_smem:
        stats = (_stats_descriptor(lse, "−lse·log2 e", bm), _stats_descriptor(delta, "delta", bm))
    args = (_descriptor(q4, bm, 0, d), _descriptor(k4, keys, 0, d, swizzle), _descriptor(v4, keys, 0, d),
            _descriptor(do4, bm, 0, d), _descriptor(dq4, bm, 0, d // 2), _descriptor(dk4, keys, 0, d, swizzle),
            _descriptor(dv4, keys, 0, d), *stats, H, n_q, n_k, sm_scale * LOG2E, sm_scale, bool(is_causal))
    # REBUILD, STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ, PINGPONG, PRESCALED_LSE, STATS_SMEM, DQ_ONE, LEAN_SYNC against
    # the kernel's defaults
    later = (config.rebuild, config.num_stages, config.release_before_dq, config.block_m, config.dq_own_keys,
             config.pingpong, config.prescaled_lse, config.stats_smem, config.dq_one_consumer, config.lean_sync)
    defaults = (False, NUM_STAGES.value, False, 64, False, False, False, False, False, False)
    args += later[:max((i + 1 for i, (v, off) in enumerate(zip(later, defaults))
                        if v != off), default=0)]
    return (-(-n_k // bn), B * H), args, {"num_warps": 4}


def flash_gluon_backward_ws(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                            is_causal: bool = False,
                            config: Optional[GluonBwdWsConfig] = None,
                            log: Optional[LaunchLog] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """flash_gluon_bwd.flash_gluon_backward's contract at head dims 128 and 64 (ValueError otherwise), through
    the warp-specialized kernel: D and the zeroed fp32 dQ buffer from the Triton preprocessing kernel (and with
    prescaled_lse −lse·log2 e), this kernel, the buffer's cast. config None: GluonBwdWsConfig() (rebuild). `log`
    receives the buffers (fp32 dQ, dK, dV, D; −lse·log2 e last with prescaled_lse) and both launches (the call plans
    of flash_dispatch). With stats_smem D and −lse·log2 e are (B, H, stats_stride(n_q)) buffers (logged whole), the
    kernel reading their first n_q columns."""
    from .flash_gluon_bwd import _preprocess, validate_backward
    from .flash_gluon_common import check_device

    validate_backward(q, k, v, o, do, lse, FN)
    config = config or GluonBwdWsConfig()
    check_head_dim(q.shape[-1], config)
    check_device(q.device, FN)
    q4, o4, do4 = as_4d(q), as_4d(o), as_4d(do)
    B, H, n_q, d = q4.shape
    dq32 = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=q.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=q.device)
    rows = stats_stride(n_q) if config.stats_smem else n_q  # TMA's 16-byte row strides
    delta = torch.empty((B, H, rows), dtype=torch.float32, device=q.device)
    lse = lse.contiguous()
    nl2 = torch.empty((B, H, rows), dtype=torch.float32, device=q.device) if config.prescaled_lse else None
    if log is not None:
        log.buffers.extend((dq32, dk, dv, delta) + ((nl2,) if config.prescaled_lse else ()))
        log.cast = q.dtype
    _preprocess(o4, do4, delta, as_4d(dq32), log, lse if config.prescaled_lse else None, nl2,  # d 128, 64: one tile
                rows if config.stats_smem else None)
    stats = (nl2 if config.prescaled_lse else lse, delta)
    if config.stats_smem:
        stats = tuple(t[..., :n_q] for t in stats)
    grid, args, opts = launch_args(q, k, v, do, *stats, dq32, dk, dv, is_causal, config)
    launch(_attn_bwd_ws_sm90, grid, args, opts, log)
    return dq32.to(q.dtype), dk, dv


__all__ = ["BLOCK_M_HEAD_DIMS", "CANDIDATE_CONFIGS", "DQ_OWN_KEYS_HEAD_DIMS", "GluonBwdWsConfig", "HEAD_DIMS",
           "K_SWIZZLE", "KEYS", "STATS_ALIGN",
           "TRIAL_CONFIGS", "check_head_dim",
           "flash_gluon_backward_ws", "launch_args", "shared_bytes", "stats_stride"]
