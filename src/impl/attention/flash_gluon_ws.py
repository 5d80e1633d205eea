"""FlashAttention forward for Hopper (sm_90a) in Gluon, warp-specialized: issue 47, stage 2.

Stage 1 (:mod:`impl.attention.flash_gluon`) runs every step in the same 8 warps, so a tile's softmax
overlaps no MMA but the P·V left in flight, and its ring needs CTA barriers. Here the work is split
with ``gl.warp_specialize`` into partitions that synchronise only through mbarriers:

* **Load partition** (1 warp, few registers): issues every TMA copy. Per CTA tile it loads the two
  consumers' query tiles (each behind a ready/empty mbarrier pair, so a persistent CTA refills Q only
  once its consumer has stored O out of it), then streams K and V through a ring of NUM_STAGES
  shared-memory slots: per slot a ready barrier for K, one for V (Q·Kᵀ may start before V lands)
  and an empty barrier that both consumers arrive at once their P·V on the slot is done (count 2).
* **Two consumer warpgroups** (the default partition and one 4-warp worker), each owning its own
  BLOCK_M-row query tile of the CTA's 2·BLOCK_M rows; both read every K/V slot (one load serves
  both). Per key tile j a consumer issues S_j = Q·K_jᵀ and then O += P_{j-1}·V_{j-1}, waits for S_j
  only, runs the softmax of S_j while its P·V runs, then waits for the P·V, frees the slot and
  rescales O (FA3's intra-warpgroup overlap; P from registers).
* **Ping-pong.** With PINGPONG the two consumers take turns to issue their MMAs (an mbarrier per
  consumer, each passing the turn to the other after its issue group), so the tensor cores run one
  warpgroup's Q·Kᵀ and P·V while the other does its softmax. Both consumers run the same number of
  issue groups per tile (same key tiles: the causal range is the CTA tile's), so the turns stay in
  step across tiles.
* **Register budgets.** setmaxnreg per partition: the load warp's warpgroup (padded by the compiler)
  drops to LOAD_REGS, the worker consumer asks for CONSUMER_REGS, the default consumer gets what is
  left of the 64 K registers (Triton's AllocateWarpGroups: 504 - CONSUMER_REGS - LOAD_REGS per
  thread at 12 warps; 240 / 240 / 24 by default, FA3's split).
* **Persistence.** Every partition walks the same tile list ``t = program_id, + num_programs, ...``,
  so a one-tile-per-program grid and a persistent grid (SM count) run the same kernel. Tiles are
  ordered in groups of GROUP heads, heaviest causal query tile first inside a group and the group's
  heads fastest: CTAs running at once share the K/V of a few heads in L2, and the long causal tiles
  start first (the short ones fill the tail).
* **LPT grid** (``lpt``, a trial, off by default). The one-tile-per-program grid walks each head's query tiles
  heaviest first, then the next head's: a saw of B·H teeth, so the last wave holds the last heads' long tiles
  and the SMs idle behind them (a list-scheduling model of 4x32x4096x128 causal: 3% of the time, 6% at N 2048).
  With lpt the causal grid takes the persistent order instead, heads in groups (the largest divisor of B·H
  whose K/V fit L2_KV_BYTES: equal groups, no short last group), so a group's long tiles start together and
  the short ones end the grid. Host-side only: the kernel is the default's, GROUP a runtime argument.
* **Early Q** (``early_q``, a persistent-only trial, off by default). By default a consumer stages O through its
  Q slot, waits for the TMA store to read it (store_wait) and only then frees the slot (q_empty), and the load
  warp takes both Q slots before the next tile's first K/V: the next tile's Q and K_0 land a load latency after
  the later consumer's epilogue. With early_q a consumer frees its Q slot once its last S = Q·Kᵀ has completed
  (before the last P·V) and stores O straight from its accumulator registers (masked rows, no shared staging, no
  store_wait), so the next tile's loads run under the last softmax, P·V and epilogue. Same shared memory as the
  default (3 K/V slots fill it at d 128; a separate O buffer would not fit); the kernel takes O's tensor.
  **O from registers** (``o_regs``, persistent only, off): early_q's store with the default's late q_empty, the
  A/B that splits early_q's two changes (it measured slower than the default persistent grid; NOTES.md).
* **Rotated loop** (``rotate``, a trial, off by default, head dims 64 and 128): the same MMAs, turns and waits, the
  consumer loop cut between a key tile's row max and its exponentials (_rotated_tile), so P is packed in the step
  that issues its P·V; the default's back-edge carries P as 16-bit halves, re-paired by 32 PRMT a warp and tile
  inside the turn (issue 47's ncu of the d 128 forward).
* **Lazy row sum** (``lazy_sum``, a trial, off by default, head dims 64 and 128): l kept per thread across the key
  tiles (l = alpha·l + the thread's partial sums: no quad shuffle per tile) and summed across the quad once before
  the epilogue (FA3's and cuDNN's way). Another summation order: l, O and lse differ from the default's by a
  rounding.
* **Q prefetched into L2** (``prefetch_q``, a trial, off by default): after issuing its tile's first K/V copies,
  the load warp prefetches into L2 (``prefetch.global.L2``, every 128-byte line) the Q rows of tile t + AHEAD
  (the SM count on the one-tile-per-program grid: about the tile that starts when one now running ends; the grid
  size when persistent: the CTA's own next tile), so that tile's Q TMA reads L2, not DRAM. Each CTA tile waits
  ~1.1 us for its Q (ncu of 4x32x4096x128 causal, NOTES.md "short sequences"), a fixed cost the persistent
  cuDNN kernel does not pay. Values unchanged (a prefetch moves no data into registers or shared memory).
* **Dynamic tiles** (``dynamic``, persistent only; a table candidate since its H200 probe: 0.96-0.99x the default
  at every causal d 128 / d 64 shape, 1.00-1.01 full; off in the default): cuDNN's scheduler. The static stride
  above hands CTA i the tiles i, i + grid, ... whatever they cost (the one-tile grid's block scheduler is greedy;
  this is not), and its load warp waits for both consumers' epilogues before the next tile's first copy. With
  dynamic the load warp takes each next tile from a global int32 counter (an atomic add; the launcher zeroes a
  fresh one a launch), in the same order (heaviest first in a head group: greedy over it leaves the lightest tiles
  for the tail), writes it to each consumer's index word in shared memory before the arrive of that consumer's Q
  (q_ready publishes it), and issues the tile's first NUM_STAGES K/V copies before its Q: their slots are freed
  by the previous tile's key tiles, so they load under its epilogue. An index past the end and a plain q_ready
  arrive end the consumers. With prefetch_q it prefetches the next tile's Q into L2 as soon as it has its index.

Masks, head-dim split (80 = 64 + 16, 96 = 64 + 32), scale folding and the epilogue through Q's shared
memory are stage 1's; the launcher's checks are flash_gluon_common's (both forwards'). The first key
tile of a tile always runs the masked softmax (it has no P·V before it, so it is peeled anyway).

Nothing on the default paths imports this module (a test checks it). Importing it needs triton
(Gluon) but no GPU; :func:`launch_args` builds a launch for CPU tensors too (the sm_90a compile test).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                              warpgroup_mma_wait)

from .flash_gluon import (_lazy_parts, _lazy_total, _online_softmax, _pv_async, _qk_async, _rows, _softmax_exp,
                          _softmax_max, _store_lse, _store_tile)
from .flash_gluon_common import (LOG2E, LaunchLog, _copy, _key_tiles, _mma_layout, _retire, _ring_pair, _slot, _tile_2d,
                                 as_4d, check_shared, descriptors, dims, forward_outputs, launch)

Tensor = torch.Tensor
FN = "flash_gluon_ws_forward"
#: Triton gives each warp-specialized program 12 warps (4 per consumer, the load warp padded to 4);
#: 65,536 / 384 threads = 168 registers each, and setmaxnreg moves them between warpgroups.
_REG_POOL = 3 * 168
#: H100 SMs, used when the launch arguments are built for CPU tensors (the compile test).
H100_SMS = 132
#: L2 bytes of K/V a persistent group of heads may keep in flight (half the H100's 50 MB L2).
L2_KV_BYTES = 24 << 20


@dataclass(frozen=True)
class GluonWsConfig:
    """block_m query rows per consumer warpgroup (the CTA tile is 2 x block_m), block_n keys per
    tile, num_stages K/V slots; pingpong: consumers take turns issuing MMAs; persistent: grid of SM
    count; consumer_regs / load_regs: setmaxnreg budgets of the worker consumer and the load warp; lpt:
    the one-tile-per-program causal grid in equal L2-sized head groups, heaviest tiles first (lpt_group);
    early_q: each consumer frees its Q slot once its last Q·Kᵀ is done and stores O from registers, so a
    persistent CTA's next Q and K/V load during the last P·V and the epilogue; o_regs: early_q's store from
    registers without its early release of Q (a diagnostic A/B of early_q's two changes); rotate: the consumer loop
    cut after the MMA issue, so P is packed for its wgmma in the step that computes it (head dims 64 and 128);
    lazy_sum: per-thread row sums, summed across the quad once per CTA tile (head dims 64 and 128); prefetch_q:
    the load warp prefetches a later CTA tile's Q into L2 (one SM count of tiles ahead; persistent: its next);
    dynamic: a persistent CTA takes each next tile from a global atomic counter, and its load warp issues the next
    tile's first K/V before its Q (both under the last tile's epilogue where the slots allow)."""

    block_m: int = 64
    block_n: int = 128
    num_stages: int = 3
    pingpong: bool = True
    persistent: bool = False
    consumer_regs: int = 240
    load_regs: int = 24
    lpt: bool = False
    early_q: bool = False
    o_regs: bool = False
    rotate: bool = False
    lazy_sum: bool = False
    prefetch_q: bool = False
    dynamic: bool = False

    def __post_init__(self) -> None:
        # 128 rows per consumer spill under 240 registers (sm_90a compile: 1,064 stack bytes at d 128,
        # 8 at d 64 with 64-key tiles): O and S alone would be 128 + 128 registers a thread at d 128.
        if self.block_m != 64:
            raise ValueError(f"block_m must be 64 (128 rows per consumer spill), got {self}")
        if self.block_n not in (64, 128) or not 2 <= self.num_stages <= 4:
            raise ValueError(f"block_n must be 64 or 128 and num_stages 2..4, got {self}")
        regs = (self.consumer_regs, self.load_regs)
        if any(r % 8 or not 24 <= r <= 256 for r in regs) or 2 * self.consumer_regs + self.load_regs > _REG_POOL:
            raise ValueError(f"register budgets must be multiples of 8 in 24..256 with 2 x consumer + load <= "
                             f"{_REG_POOL} (the default consumer gets the rest), got {self}")
        if self.dynamic and not self.persistent:
            raise ValueError(f"dynamic schedules a persistent grid's tiles (persistent=True), got {self}")
        if self.early_q and not self.persistent:
            raise ValueError(f"early_q overlaps a tile's epilogue with the next tile's loads, which only a "
                             f"persistent CTA has (persistent=True), got {self}")
        if self.o_regs and (self.early_q or not self.persistent):
            raise ValueError(f"o_regs is early_q's store from registers with Q freed late, a persistent-only A/B "
                             f"(persistent=True, early_q=False), got {self}")
        if self.lpt and self.persistent:
            raise ValueError(f"lpt orders the one-tile-per-program grid (persistent has its own head groups), "
                             f"got {self}")
        if self.rotate and self.lazy_sum:
            raise ValueError(f"lazy_sum changes the default consumer loop, not rotate's (rotate=False), got {self}")


#: Configs the probe times and the GPU tests check (those over shared memory are refused at d 128).
CANDIDATE_CONFIGS = (GluonWsConfig(), GluonWsConfig(num_stages=2), GluonWsConfig(pingpong=False),
                     GluonWsConfig(persistent=True), GluonWsConfig(persistent=True, num_stages=2),
                     GluonWsConfig(block_n=64, num_stages=4), GluonWsConfig(persistent=True, dynamic=True))
#: Trials, never in the kernel table: the probe times them with --rows ws-lpt / ws-early-q, the GPU tests check them.
TRIAL_CONFIGS = (GluonWsConfig(lpt=True), GluonWsConfig(persistent=True, early_q=True),
                 GluonWsConfig(persistent=True, o_regs=True), GluonWsConfig(rotate=True),
                 GluonWsConfig(lazy_sum=True), GluonWsConfig(prefetch_q=True),
                 GluonWsConfig(persistent=True, dynamic=True, prefetch_q=True))


def default_config(d: int) -> GluonWsConfig:
    """64 query rows per consumer (FA3's d 128 split: O and S are 64 registers each per thread),
    128-key tiles, 3 slots (224 KB of the H100's 227 at d 128), ping-pong, one tile per program.
    Not yet measured: the probe sweeps CANDIDATE_CONFIGS."""
    return GluonWsConfig()


#: Shared memory the warp-specialize lowering adds: the worker partitions' captured arguments and
#: their dispatch state (measured 264 B at d 64/128, 376 B at d 80/96; the bound leaves room).
WS_CAPTURE_BYTES = 512


def shared_bytes(d: int, config: GluonWsConfig, itemsize: int = 2) -> int:
    """An upper bound on the shared memory a launch uses: two query tiles (reused for O), the K/V
    ring, six mbarrier arrays (8 bytes a barrier, each array counted up to 16 bytes) and
    WS_CAPTURE_BYTES."""
    q = 2 * config.block_m * d * itemsize
    ring = config.num_stages * 2 * config.block_n * d * itemsize
    barriers = 3 * 16 + 3 * (-(-8 * config.num_stages // 16) * 16)
    tile_words = 16 if config.dynamic else 0  # dynamic's two tile indices
    return q + ring + barriers + tile_words + WS_CAPTURE_BYTES


# ---------------------------------------------------------------------------
# Kernel helpers
# ---------------------------------------------------------------------------

@gluon.jit
def _tile_coords(t, n_m, n_bh, GROUP):
    """(query tile, batch·head) of linear tile t: heads in groups of GROUP; in a group the query
    tiles in order (the caller reverses them for causal) and the group's heads fastest."""
    per_group = n_m * GROUP
    g = t // per_group
    r = t % per_group
    heads = gl.minimum(GROUP, n_bh - g * GROUP)
    return r // heads, g * GROUP + r % heads


@gluon.jit
def _tile_work(t, sched, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Where tile t's rows start (the CTA's 2·BLOCK_M), its batch, head, batch·head, and its key
    tiles: [0, mid) full and below the diagonal (no masks), [mid, n_tiles) with masks. The same for
    every partition, so all walk the same ring positions."""
    L, H, N_Q, N_K, qk_scale, n_m, n_bh, GROUP = sched
    i, bh = _tile_coords(t, n_m, n_bh, GROUP)
    if IS_CAUSAL:
        i = n_m - 1 - i  # heaviest first
    start = i * (2 * BLOCK_M)
    mid, n_tiles = _key_tiles(start, 2 * BLOCK_M, N_K, BLOCK_N, IS_CAUSAL)
    return start, bh // H, bh % H, bh, mid, n_tiles


@gluon.jit
def _prefetch_q_l2(QP, q_strides, b, h, start, N_Q, ROWS: gl.constexpr, D: gl.constexpr):
    """prefetch.global.L2 of every 128-byte line of rows [start, start + ROWS) of Q[b, h] (D elements a row;
    rows past N_Q clamped to the last), 32 rows at a time: one warp, a line or two a lane each step (the load
    warp's 24 registers)."""
    sb, sh, sn = q_strides
    PER_LINE: gl.constexpr = 1024 // QP.dtype.element_ty.primitive_bitwidth  # elements in 128 bytes
    LINES: gl.constexpr = (D + PER_LINE - 1) // PER_LINE  # 1 at d 64, 2 at 80 / 96 / 128
    layout: gl.constexpr = gl.BlockedLayout([1, LINES], [32, 1], [1, 1], [1, 0])
    base = QP + (b.to(gl.int64) * sb + h.to(gl.int64) * sh)
    cols = gl.expand_dims(gl.arange(0, LINES, layout=gl.SliceLayout(0, layout)) * PER_LINE, 0)
    for r0 in gl.static_range(0, ROWS, 32):
        rows = gl.minimum(start + r0 + gl.arange(0, 32, layout=gl.SliceLayout(1, layout)), N_Q - 1)
        ptrs = base + gl.expand_dims(rows.to(gl.int64) * sn, 1) + cols
        gl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=gl.int32,
                                  is_pure=False, pack=1)


@gluon.jit
def _load_partition(descs, smem, bars, sched, dyn, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                    BLOCK_D: gl.constexpr, D1: gl.constexpr, NUM_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    prefetch, PREFETCH_Q: gl.constexpr, DYNAMIC: gl.constexpr):
    """The load warp: the counter's tiles (DYNAMIC: _dynamic_load_partition) or the grid-stride ones."""
    if DYNAMIC:
        _dynamic_load_partition(descs, smem, bars, sched, dyn, prefetch, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES,
                                IS_CAUSAL, PREFETCH_Q)
    else:
        _static_load_partition(descs, smem, bars, sched, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, IS_CAUSAL,
                               prefetch, PREFETCH_Q)


@gluon.jit
def _static_load_partition(descs, smem, bars, sched, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           BLOCK_D: gl.constexpr, D1: gl.constexpr, NUM_STAGES: gl.constexpr,
                           IS_CAUSAL: gl.constexpr, prefetch, PREFETCH_Q: gl.constexpr):
    """One warp: per tile the two query tiles (once their consumers have stored the last tile's O
    out of them; early_q: once their last Q·Kᵀ is done), then every key tile's K and V into the ring
    (once both consumers freed the slot). PREFETCH_Q: after the first K/V copies, tile t + AHEAD's Q
    into L2 (prefetch = (Q, its strides, AHEAD))."""
    q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc = descs
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    n_tiles_all = sched[5] * sched[6]
    pos = 0
    n_done = 0
    for t in range(gl.program_id(0), n_tiles_all, gl.num_programs(0)):
        start, b, h, bh, mid, n_tiles = _tile_work(t, sched, BLOCK_M, BLOCK_N, IS_CAUSAL)
        for c in gl.static_range(2):
            # Barriers start as if phase -1 had completed: the first tile does not wait.
            mbarrier.wait(q_empty.index(c), (n_done & 1) ^ 1)
            _copy(q_desc, qh_desc, start + c * BLOCK_M, b, h, q_ready.index(c), q_smem.index(c),
                  _slot(qh_smem, c, D1), BLOCK_D, D1)
        for j in range(n_tiles):
            pos = _load_kv(j, pos, b, h, descs, smem, bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)
            if PREFETCH_Q:  # after K_0 / V_0: the consumers' first wait is not delayed
                QP, q_strides, AHEAD = prefetch
                if (j == 0) & (t + AHEAD < n_tiles_all):
                    start2, b2, h2, bh2, mid2, n2 = _tile_work(t + AHEAD, sched, BLOCK_M, BLOCK_N, IS_CAUSAL)
                    _prefetch_q_l2(QP, q_strides, b2, h2, start2, sched[2], 2 * BLOCK_M, BLOCK_D + D1)
        n_done += 1


@gluon.jit
def _load_kv(j, pos, b, h, descs, smem, bars, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
             NUM_STAGES: gl.constexpr):
    """Key tile j's K and V into ring position pos, once both consumers freed its slot. Returns pos + 1."""
    q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc = descs
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    slot = pos % NUM_STAGES
    mbarrier.wait(kv_empty.index(slot), ((pos // NUM_STAGES) & 1) ^ 1)
    _copy(k_desc, kh_desc, j * BLOCK_N, b, h, k_ready.index(slot), k_smem.index(slot),
          _slot(kh_smem, slot, D1), BLOCK_D, D1)
    _copy(v_desc, vh_desc, j * BLOCK_N, b, h, v_ready.index(slot), v_smem.index(slot),
          _slot(vh_smem, slot, D1), BLOCK_D, D1)
    return pos + 1


@gluon.jit
def _hand_tile(tile_smem, c: gl.constexpr, t, q_ready, SIGNAL: gl.constexpr):
    """dynamic: tile index t into consumer c's index word (its q_empty was waited for: it has read the last one).
    The warp barrier orders every lane's store before the arrive that publishes it: the expect of Q's copy (a
    release; q_ready then completes with the copy) or, with SIGNAL (no tile left), a plain arrive."""
    tile_smem.index(c).store(gl.full([1], t, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
    gl.thread_barrier()
    if SIGNAL:
        mbarrier.arrive(q_ready.index(c))


@gluon.jit
def _dynamic_load_partition(descs, smem, bars, sched, dyn, prefetch, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                            BLOCK_D: gl.constexpr, D1: gl.constexpr, NUM_STAGES: gl.constexpr,
                            IS_CAUSAL: gl.constexpr, PREFETCH_Q: gl.constexpr):
    """dynamic: the load warp of a persistent CTA whose tiles come from a global counter (dyn = (the
    int32 counter, zeroed by the launcher; the two consumers' index words)): its first tile is program_id, each
    next one num_programs + an atomic add, taken once the tile's last K/V copy is issued (its latency under the
    consumers' last key tiles). Per tile after the first: its first min(n_tiles, NUM_STAGES) K/V copies (their slots
    are freed by the previous tile's key tiles, so they load under its epilogue), then each consumer's tile index and
    Q (once it has stored its last O), then the rest of the K/V. After the last tile, an index past the end and a
    plain arrive on q_ready end both consumers. PREFETCH_Q: the next tile's Q into L2 as soon as its index is known.
    Deadlock-free: the copies ahead of Q wait only for slots of earlier tiles, whose Q was issued."""
    q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc = descs
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    counter, tile_smem = dyn
    n_tiles_all = sched[5] * sched[6]
    pos = 0
    n_done = 0
    t = gl.program_id(0)
    while t < n_tiles_all:
        start, b, h, bh, mid, n_tiles = _tile_work(t, sched, BLOCK_M, BLOCK_N, IS_CAUSAL)
        # Copies whose slots the previous tile frees (no wait on this tile's Q). None on the first tile: the ring is
        # empty, and K/V issued ahead would queue Q behind 2 x NUM_STAGES blocks at the SM's ingress.
        n_first = gl.minimum(n_tiles, gl.minimum(n_done, 1) * NUM_STAGES)
        for j in range(n_first):
            pos = _load_kv(j, pos, b, h, descs, smem, bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)
        for c in gl.static_range(2):
            mbarrier.wait(q_empty.index(c), (n_done & 1) ^ 1)
            _hand_tile(tile_smem, c, t, q_ready, False)
            _copy(q_desc, qh_desc, start + c * BLOCK_M, b, h, q_ready.index(c), q_smem.index(c),
                  _slot(qh_smem, c, D1), BLOCK_D, D1)
        for j in range(n_first, n_tiles):
            pos = _load_kv(j, pos, b, h, descs, smem, bars, BLOCK_N, BLOCK_D, D1, NUM_STAGES)
        t = gl.num_programs(0) + gl.atomic_add(counter, 1, sem="relaxed")  # the index carries no data
        if PREFETCH_Q:
            QP, q_strides, AHEAD = prefetch
            if t < n_tiles_all:
                start2, b2, h2, bh2, mid2, n2 = _tile_work(t, sched, BLOCK_M, BLOCK_N, IS_CAUSAL)
                _prefetch_q_l2(QP, q_strides, b2, h2, start2, sched[2], 2 * BLOCK_M, BLOCK_D + D1)
        n_done += 1
    for c in gl.static_range(2):
        mbarrier.wait(q_empty.index(c), (n_done & 1) ^ 1)
        _hand_tile(tile_smem, c, t, q_ready, True)


@gluon.jit
def _take_turn(turn, k, C: gl.constexpr, PINGPONG: gl.constexpr):
    """Wait until it is consumer C's k-th turn to issue MMAs (consumer 0 goes first: its first
    wait is on the phase a fresh barrier counts as complete). Returns k + 1."""
    if PINGPONG:
        mbarrier.wait(turn.index(C), (k & 1) ^ (1 - C))
    return k + 1


@gluon.jit
def _pass_turn(turn, C: gl.constexpr, PINGPONG: gl.constexpr):
    if PINGPONG:
        mbarrier.arrive(turn.index(1 - C))


@gluon.jit
def _wait_ring(bar_array, pos, NUM_STAGES: gl.constexpr):
    mbarrier.wait(bar_array.index(pos % NUM_STAGES), (pos // NUM_STAGES) & 1)


@gluon.jit
def _consumer_loop(acc, acc_h, p, l_i, m_i, pos, k, j_lo, j_hi, q2, qh2, offs_m, N_K, qk_scale, smem, bars,
                   C: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr,
                   D1: gl.constexpr, NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, MASKED: gl.constexpr,
                   IS_CAUSAL: gl.constexpr, LAZY_SUM: gl.constexpr):
    """Key tiles [j_lo, j_hi). On entry the previous tile's P (p) is computed but its P·V not issued;
    pos is that tile's ring position. Each iteration: (turn) issue S_j, then P_{j-1}·V_{j-1};
    (pass turn) wait for S_j only, softmax of S_j while the P·V runs; wait for the P·V, free its
    slot, rescale O. LAZY_SUM: l per thread (_row_sum)."""
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    # wgmma groups complete in order; the P·V is one group per head-dim half.
    PV_GROUPS: gl.constexpr = 2 if D1 > 0 else 1
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    for j in range(j_lo, j_hi):
        cur = (pos + 1) % NUM_STAGES
        prev = pos % NUM_STAGES
        k = _take_turn(turn, k, C, PINGPONG)
        _wait_ring(k_ready, pos + 1, NUM_STAGES)
        s = _qk_async(q2, qh2, k_smem.index(cur), _slot(kh_smem, cur, D1), s_zero, BLOCK_N, BLOCK_D, D1)
        _wait_ring(v_ready, pos, NUM_STAGES)
        acc, acc_h, p_h = _pv_async(p, acc, acc_h, None, v_smem.index(prev), _slot(vh_smem, prev, D1), BLOCK_N,
                                    BLOCK_D, D1)
        _pass_turn(turn, C, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=PV_GROUPS, deps=(s, ))
        p32, alpha, l_i, m_i = _online_softmax(s, m_i, l_i, offs_m, j * BLOCK_N, N_K, qk_scale, MASKED, IS_CAUSAL,
                                               LAZY_SUM)
        p_next = gl.convert_layout(p32.to(k_smem.dtype), p_layout)
        acc, acc_h, p, p_h = _retire(acc, acc_h, p, p_h, D1)
        if D1 > 0:
            acc_h = acc_h * _rows(alpha, acc_h)
        mbarrier.arrive(kv_empty.index(prev))
        acc = acc * _rows(alpha, acc)
        p = p_next
        pos += 1
    return acc, acc_h, p, l_i, m_i, pos, k


@gluon.jit
def _rotated_step(acc, l_i, m_i, s, m_new, pos, k, j, q2, s_zero, offs_m, N_K, qk_scale, smem, bars, C: gl.constexpr,
                  BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                  MASKED: gl.constexpr, MASKED_NEXT: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """rotate's step for key tile j (ring position pos), entered with S_j's row max taken (s, m_new: _softmax_max's)
    and O retired: S_j's exponentials, P_j packed and O rescaled; (turn) S_{j+1} and P_j·V_j issued; S_{j+1}'s row
    max while that P·V runs; the P·V retired and its slot freed. MASKED, MASKED_NEXT: tile j's and j + 1's masks."""
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc.type.layout, k_width=2)
    p32, alpha, l_i = _softmax_exp(s, m_i, m_new, l_i, qk_scale, MASKED, False)
    p = gl.convert_layout(p32.to(k_smem.dtype), p_layout)
    acc = acc * _rows(alpha, acc)
    k = _take_turn(turn, k, C, PINGPONG)
    _wait_ring(k_ready, pos + 1, NUM_STAGES)
    s = _qk_async(q2, 0, k_smem.index((pos + 1) % NUM_STAGES), 0, s_zero, BLOCK_N, BLOCK_D, 0)
    _wait_ring(v_ready, pos, NUM_STAGES)
    acc, acc_h, p_h = _pv_async(p, acc, 0, None, v_smem.index(pos % NUM_STAGES), 0, BLOCK_N, BLOCK_D, 0)
    _pass_turn(turn, C, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=1, deps=(s, ))
    s, m_next = _softmax_max(s, m_new, offs_m, (j + 1) * BLOCK_N, N_K, qk_scale, MASKED_NEXT, IS_CAUSAL)
    acc, acc_h, p, p_h = _retire(acc, 0, p, 0, 0)
    mbarrier.arrive(kv_empty.index(pos % NUM_STAGES))
    return acc, l_i, m_new, s, m_next, pos + 1, k


@gluon.jit
def _rotated_loop(acc, l_i, m_i, s, m_new, pos, k, j_lo, j_hi, q2, s_zero, offs_m, N_K, qk_scale, smem, bars,
                  C: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
                  PINGPONG: gl.constexpr, MASKED: gl.constexpr, MASKED_NEXT: gl.constexpr, IS_CAUSAL: gl.constexpr):
    for j in range(j_lo, j_hi):
        acc, l_i, m_i, s, m_new, pos, k = _rotated_step(acc, l_i, m_i, s, m_new, pos, k, j, q2, s_zero, offs_m, N_K,
                                                        qk_scale, smem, bars, C, BLOCK_N, BLOCK_D, NUM_STAGES,
                                                        PINGPONG, MASKED, MASKED_NEXT, IS_CAUSAL)
    return acc, l_i, m_i, s, m_new, pos, k


@gluon.jit
def _rotated_tile(q2, offs_m, mid, n_tiles, pos, k, N_K, qk_scale, smem, bars, C: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, NUM_STAGES: gl.constexpr,
                  PINGPONG: gl.constexpr, IS_CAUSAL: gl.constexpr, EARLY_Q: gl.constexpr):
    """rotate (a trial, D1 == 0 only): one CTA tile's key tiles with the default's MMAs, turns and waits in the
    same order, the loop cut between a tile's row max and its exponentials instead of before the MMA issue. The
    default carries P across its back-edge as 16-bit halves and ptxas re-pairs them for the wgmma with 32 PRMT a
    warp and key tile, issued while the consumer holds the turn (ncu at d 128: 3.2% of the PC samples); here P is
    packed in the step that issues its P·V, as in stage 1 (no PRMT), and only S (after its max) and the retired O
    cross the back-edge (O in flight across it makes ptxas serialise every wgmma for want of registers). Masks
    as the default's, plus the last tile always: the default's arithmetic, except where the default leaves the last
    tile unmasked (full attention, keys a multiple of BLOCK_N: P the same up to a rounding). Returns O (not
    normalised), l, m and the ring position and turn count after the tile."""
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, BLOCK_D)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    k = _take_turn(turn, k, C, PINGPONG)
    _wait_ring(k_ready, pos, NUM_STAGES)
    s = _qk_async(q2, 0, k_smem.index(pos % NUM_STAGES), 0, s_zero, BLOCK_N, BLOCK_D, 0)
    _pass_turn(turn, C, PINGPONG)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
    acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_layout)
    # Masks as the default's (tile 0, the tiles from mid) and on the last tile (exact for an unmasked one too), so
    # that the exponentials after the loops have one form: tiles [1, mid2) unmasked.
    last = n_tiles - 1
    mid2 = gl.minimum(mid, last)
    s, m_new = _softmax_max(s, m_i, offs_m, 0, N_K, qk_scale, True, IS_CAUSAL)
    # Steps by (tile j's mask, tile j + 1's): tile 0 when tile 1 is unmasked, unmasked pairs, the step crossing
    # mid2, masked pairs.
    c = (mid2 >= 2).to(gl.int32)
    a = gl.maximum(mid2 - 1, c)
    b = a + c
    acc, l_i, m_i, s, m_new, pos, k = _rotated_loop(acc, l_i, m_i, s, m_new, pos, k, 0, c, q2, s_zero, offs_m, N_K,
                                                    qk_scale, smem, bars, C, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,
                                                    True, False, IS_CAUSAL)
    acc, l_i, m_i, s, m_new, pos, k = _rotated_loop(acc, l_i, m_i, s, m_new, pos, k, c, a, q2, s_zero, offs_m, N_K,
                                                    qk_scale, smem, bars, C, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,
                                                    False, False, IS_CAUSAL)
    acc, l_i, m_i, s, m_new, pos, k = _rotated_loop(acc, l_i, m_i, s, m_new, pos, k, a, b, q2, s_zero, offs_m, N_K,
                                                    qk_scale, smem, bars, C, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG,
                                                    False, True, IS_CAUSAL)
    acc, l_i, m_i, s, m_new, pos, k = _rotated_loop(acc, l_i, m_i, s, m_new, pos, k, b, last, q2, s_zero, offs_m,
                                                    N_K, qk_scale, smem, bars, C, BLOCK_N, BLOCK_D, NUM_STAGES,
                                                    PINGPONG, True, True, IS_CAUSAL)
    # The last key tile: its exponentials, then its P·V alone.
    p32, alpha, l_i = _softmax_exp(s, m_i, m_new, l_i, qk_scale, True, False)
    p = gl.convert_layout(p32.to(k_smem.dtype), p_layout)
    acc = acc * _rows(alpha, acc)
    if EARLY_Q:  # every Q·Kᵀ of the tile has completed
        mbarrier.arrive(q_empty.index(C))
    k = _take_turn(turn, k, C, PINGPONG)
    _wait_ring(v_ready, pos, NUM_STAGES)
    acc, acc_h, p_h = _pv_async(p, acc, 0, None, v_smem.index(pos % NUM_STAGES), 0, BLOCK_N, BLOCK_D, 0)
    _pass_turn(turn, C, PINGPONG)
    acc, acc_h, p, p_h = _retire(acc, 0, p, 0, 0)
    mbarrier.arrive(kv_empty.index(pos % NUM_STAGES))
    return acc, l_i, m_new, pos + 1, k


@gluon.jit
def _consumer_partition(descs, smem, bars, sched, O, dyn, C: gl.constexpr, BLOCK_M: gl.constexpr,
                        BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
                        NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr, IS_CAUSAL: gl.constexpr,
                        EARLY_Q: gl.constexpr, O_REGS: gl.constexpr, ROTATE: gl.constexpr,
                        LAZY_SUM: gl.constexpr, DYNAMIC: gl.constexpr):
    """Consumer warpgroup C (4 warps): rows [C·BLOCK_M, (C+1)·BLOCK_M) of each CTA tile (_consumer_tile).
    DYNAMIC: the tiles the load warp took from the counter, each index read from C's word of dyn's once its Q
    has landed (q_ready), until an index past the end."""
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    L, H, N_Q, N_K, qk_scale, n_m, n_bh, GROUP = sched
    gl.static_assert(gl.num_warps() == 4, "a consumer is one warpgroup")
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, _mma_layout(4, BLOCK_N))

    pos = 0  # ring position of the key tile in hand
    k = 0  # this consumer's MMA issue groups so far (the ping-pong turns)
    n_done = 0
    if DYNAMIC:
        t = _taken_tile(dyn, q_ready, C, n_done)
        while t < n_m * n_bh:
            pos, k = _consumer_tile(t, n_done, pos, k, s_zero, descs, smem, bars, sched, O, C, BLOCK_M, BLOCK_N,
                                    BLOCK_D, D1, NUM_STAGES, PINGPONG, IS_CAUSAL, EARLY_Q, O_REGS, ROTATE, LAZY_SUM,
                                    False)
            n_done += 1
            t = _taken_tile(dyn, q_ready, C, n_done)
    else:
        for t in range(gl.program_id(0), n_m * n_bh, gl.num_programs(0)):
            pos, k = _consumer_tile(t, n_done, pos, k, s_zero, descs, smem, bars, sched, O, C, BLOCK_M, BLOCK_N,
                                    BLOCK_D, D1, NUM_STAGES, PINGPONG, IS_CAUSAL, EARLY_Q, O_REGS, ROTATE, LAZY_SUM,
                                    True)
            n_done += 1


@gluon.jit
def _taken_tile(dyn, q_ready, C: gl.constexpr, n_done):
    """dynamic: consumer C's next tile index, once q_ready's phase n_done has completed (the load warp wrote the
    word before the arrive that completes it)."""
    counter, tile_smem = dyn
    mbarrier.wait(q_ready.index(C), n_done & 1)
    word = tile_smem.index(C).load(gl.BlockedLayout([1], [32], [gl.num_warps()], [0]))
    return gl.max(word, axis=0)


@gluon.jit
def _consumer_tile(t, n_done, pos, k, s_zero, descs, smem, bars, sched, O, C: gl.constexpr, BLOCK_M: gl.constexpr,
                   BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr, NUM_STAGES: gl.constexpr,
                   PINGPONG: gl.constexpr, IS_CAUSAL: gl.constexpr, EARLY_Q: gl.constexpr, O_REGS: gl.constexpr,
                   ROTATE: gl.constexpr, LAZY_SUM: gl.constexpr, WAIT_Q: gl.constexpr):
    """Consumer C's rows of CTA tile t (its n_done-th; pos, k: ring position and turn count on entry; returned
    after the tile). WAIT_Q: wait here for its Q (dynamic waited before, to read t). EARLY_Q: O
    (the output tensor) stored from registers, Q's slot freed after the tile's last Q·Kᵀ; O_REGS: O stored
    from registers, Q's slot freed after the store (the default's point); ROTATE: _rotated_tile's loop;
    LAZY_SUM: l per thread (_row_sum) until after the tile's last P·V, then summed across the quad."""
    q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc = descs
    q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem = smem
    q_ready, q_empty, k_ready, v_ready, kv_empty, turn = bars
    L, H, N_Q, N_K, qk_scale, n_m, n_bh, GROUP = sched
    dtype: gl.constexpr = q_desc.dtype
    s_layout: gl.constexpr = _mma_layout(4, BLOCK_N)
    o_layout: gl.constexpr = _mma_layout(4, BLOCK_D)
    oh_layout: gl.constexpr = _mma_layout(4, D1)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    start, b, h, bh, mid, n_tiles = _tile_work(t, sched, BLOCK_M, BLOCK_N, IS_CAUSAL)
    start_m = start + C * BLOCK_M
    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    if WAIT_Q:
        mbarrier.wait(q_ready.index(C), n_done & 1)
    q2 = _tile_2d(q_smem.index(C), BLOCK_M, BLOCK_D)
    qh2 = 0
    if D1 > 0:
        qh2 = _tile_2d(qh_smem.index(C), BLOCK_M, D1)

    if ROTATE:
        acc, l_i, m_i, pos, k = _rotated_tile(q2, offs_m, mid, n_tiles, pos, k, N_K, qk_scale, smem, bars, C,
                                              BLOCK_M, BLOCK_N, BLOCK_D, NUM_STAGES, PINGPONG, IS_CAUSAL,
                                              EARLY_Q)
        acc_h = 0
    else:
        # Key tile 0: S only (no P·V before it), always through the masked softmax.
        k = _take_turn(turn, k, C, PINGPONG)
        _wait_ring(k_ready, pos, NUM_STAGES)
        s = _qk_async(q2, qh2, k_smem.index(pos % NUM_STAGES), _slot(kh_smem, pos % NUM_STAGES, D1), s_zero,
                      BLOCK_N, BLOCK_D, D1)
        _pass_turn(turn, C, PINGPONG)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_layout)
        if LAZY_SUM:
            l_i = gl.zeros_like(_lazy_parts(s_zero))
        else:
            l_i = gl.zeros([BLOCK_M], gl.float32, row_layout)
        p32, alpha, l_i, m_i = _online_softmax(s, m_i, l_i, offs_m, 0, N_K, qk_scale, True, IS_CAUSAL, LAZY_SUM)
        p = gl.convert_layout(p32.to(dtype), p_layout)
        acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, o_layout)
        acc_h = 0
        if D1 > 0:
            acc_h = gl.zeros([BLOCK_M, D1], gl.float32, oh_layout)

        acc, acc_h, p, l_i, m_i, pos, k = _consumer_loop(
            acc, acc_h, p, l_i, m_i, pos, k, 1, mid, q2, qh2, offs_m, N_K, qk_scale, smem, bars, C, BLOCK_M,
            BLOCK_N, BLOCK_D, D1, NUM_STAGES, PINGPONG, False, IS_CAUSAL, LAZY_SUM)
        acc, acc_h, p, l_i, m_i, pos, k = _consumer_loop(
            acc, acc_h, p, l_i, m_i, pos, k, gl.maximum(mid, 1), n_tiles, q2, qh2, offs_m, N_K, qk_scale, smem,
            bars, C, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, PINGPONG, True, IS_CAUSAL, LAZY_SUM)
        if EARLY_Q:
            # Every Q·Kᵀ of the tile has completed (each key tile's S was waited for) and O does not go
            # through Q's slot: the load warp may bring the next tile's Q during the last P·V and the epilogue.
            mbarrier.arrive(q_empty.index(C))

        # The last tile's P·V.
        k = _take_turn(turn, k, C, PINGPONG)
        _wait_ring(v_ready, pos, NUM_STAGES)
        acc, acc_h, p_h = _pv_async(p, acc, acc_h, None, v_smem.index(pos % NUM_STAGES),
                                    _slot(vh_smem, pos % NUM_STAGES, D1), BLOCK_N, BLOCK_D, D1)
        _pass_turn(turn, C, PINGPONG)
        acc, acc_h, p, p_h = _retire(acc, acc_h, p, p_h, D1)
        mbarrier.arrive(kv_empty.index(pos % NUM_STAGES))
        pos += 1
        if LAZY_SUM:
            l_i = _lazy_total(l_i, row_layout)

    if EARLY_Q or O_REGS:
        _store_rows(acc, acc_h, l_i, m_i, O, L, bh, start_m, offs_m, N_Q, BLOCK_M, BLOCK_D, D1)
        if not EARLY_Q:  # o_regs: Q freed where the default frees it (nothing to wait for: no TMA store)
            mbarrier.arrive(q_empty.index(C))
    else:
        # O through this consumer's query tile (its last Q·Kᵀ is done); once the store has read it,
        # the load warp may bring the next tile's Q.
        _store_tile(acc, acc_h, l_i, m_i, q_smem.index(C), _slot(qh_smem, C, D1), o_desc, oh_desc, L, b, h,
                    bh, start_m, offs_m, N_Q, BLOCK_D, D1)
        tma.store_wait(pendings=0)
        mbarrier.arrive(q_empty.index(C))
    return pos, k


@gluon.jit
def _store_rows(acc, acc_h, l_i, m_i, O, L, bh, start_m, offs_m, N_Q, BLOCK_M: gl.constexpr, BLOCK_D: gl.constexpr,
                D1: gl.constexpr):
    """early_q's epilogue: O = acc / l straight from the accumulator registers into the contiguous
    (B·H, N_Q, BLOCK_D + D1) output (no shared staging, so nothing to wait for before the next tile; rows
    past N_Q masked), lse by _store_lse as _store_tile."""
    inv_l = 1.0 / l_i
    _store_cols(acc * _rows(inv_l, acc), O, bh, start_m, N_Q, 0, BLOCK_M, BLOCK_D, BLOCK_D + D1)
    if D1 > 0:
        _store_cols(acc_h * _rows(inv_l, acc_h), O, bh, start_m, N_Q, BLOCK_D, BLOCK_M, D1, BLOCK_D + D1)
    _store_lse(L, bh, N_Q, offs_m, m_i, l_i)


@gluon.jit
def _store_cols(x, O, bh, start_m, N_Q, COL0: gl.constexpr, BLOCK_M: gl.constexpr, WIDTH: gl.constexpr,
                D: gl.constexpr):
    """Columns [COL0, COL0 + WIDTH) of a BLOCK_M-row O tile (x in its accumulator layout)."""
    rows = start_m + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, x.type.layout))
    cols = COL0 + gl.arange(0, WIDTH, layout=gl.SliceLayout(0, x.type.layout))
    offs = gl.expand_dims((bh.to(gl.int64) * N_Q + rows) * D, 1) + gl.expand_dims(cols, 0)
    gl.store(O + offs, x.to(O.dtype.element_ty), mask=gl.expand_dims(rows < N_Q, 1))


# ---------------------------------------------------------------------------
# Kernel
# ---------------------------------------------------------------------------

@gluon.jit
def _attn_fwd_ws_sm90(q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc, L,
                      H, N_Q, N_K, qk_scale, n_m, n_bh, GROUP,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, D1: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, PINGPONG: gl.constexpr,
                      CONSUMER_REGS: gl.constexpr, LOAD_REGS: gl.constexpr, COUNTER, DYNAMIC: gl.constexpr,
                      O, EARLY_Q: gl.constexpr,
                      O_REGS: gl.constexpr, ROTATE: gl.constexpr, LAZY_SUM: gl.constexpr,
                      QP, Q_SB, Q_SH, Q_SN, AHEAD, PREFETCH_Q: gl.constexpr):
    """Grid: tiles (one per program) or SMs (persistent); 4 warps (consumer 0) + a 4-warp consumer
    + a load warp. Descriptors as stage 1's, Q and O blocks of BLOCK_M rows; O the output tensor
    when EARLY_Q or O_REGS stores it from registers (else None: through o_desc). PREFETCH_Q: QP the 4-D
    query tensor, Q_SB / Q_SH / Q_SN its batch, head and row strides, AHEAD how many tiles ahead the load
    warp prefetches Q into L2 (all None otherwise). DYNAMIC: COUNTER a zeroed int32 the persistent CTAs take
    their tiles from (_dynamic_load_partition; else None)."""
    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, BLOCK_D], q_desc.layout)
    k_smem, v_smem = _ring_pair(k_desc, v_desc, NUM_STAGES, BLOCK_N, BLOCK_D)
    qh_smem = 0
    kh_smem = 0
    vh_smem = 0
    if D1 > 0:
        qh_smem = gl.allocate_shared_memory(dtype, [2, 1, 1, BLOCK_M, D1], qh_desc.layout)
        kh_smem, vh_smem = _ring_pair(kh_desc, vh_desc, NUM_STAGES, BLOCK_N, D1)
    q_ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    k_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    tile_smem = 0
    if DYNAMIC:  # each consumer's next tile index, written by the load warp (under q_empty / q_ready)
        tile_smem = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    for c in gl.static_range(2):
        mbarrier.init(q_ready.index(c), count=1)
        mbarrier.init(q_empty.index(c), count=1)
        mbarrier.init(turn.index(c), count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_ready.index(i), count=1)
        mbarrier.init(v_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)  # both consumers
    # The copy engine must see the initialised barriers before the first copy signals one.
    fence_async_shared()

    descs = (q_desc, k_desc, v_desc, o_desc, qh_desc, kh_desc, vh_desc, oh_desc)
    smem = (q_smem, k_smem, v_smem, qh_smem, kh_smem, vh_smem)
    bars = (q_ready, q_empty, k_ready, v_ready, kv_empty, turn)
    sched = (L, H, N_Q, N_K, qk_scale, n_m, n_bh, GROUP)
    dyn = (COUNTER, tile_smem)
    gl.warp_specialize([
        (_consumer_partition, (descs, smem, bars, sched, O, dyn, 0, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES,
                               PINGPONG, IS_CAUSAL, EARLY_Q, O_REGS, ROTATE, LAZY_SUM, DYNAMIC)),
        (_consumer_partition, (descs, smem, bars, sched, O, dyn, 1, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES,
                               PINGPONG, IS_CAUSAL, EARLY_Q, O_REGS, ROTATE, LAZY_SUM, DYNAMIC)),
        (_load_partition, (descs, smem, bars, sched, dyn, BLOCK_M, BLOCK_N, BLOCK_D, D1, NUM_STAGES, IS_CAUSAL,
                           (QP, (Q_SB, Q_SH, Q_SN), AHEAD), PREFETCH_Q, DYNAMIC)),
    ], [4, 1], [CONSUMER_REGS, LOAD_REGS])


# ---------------------------------------------------------------------------
# Host side
# ---------------------------------------------------------------------------

def group_heads(n_k: int, d: int, n_bh: int, itemsize: int = 2) -> int:
    """Heads per persistent group: as many as keep their K and V within L2_KV_BYTES (at least 1)."""
    return max(1, min(n_bh, L2_KV_BYTES // (2 * n_k * d * itemsize)))


def lpt_group(n_k: int, d: int, n_bh: int, itemsize: int = 2) -> int:
    """Heads per group of the lpt grid: the largest divisor of n_bh within group_heads, so every group is
    as long as the others (a short last group ends the grid on a saw of its long tiles again)."""
    most = group_heads(n_k, d, n_bh, itemsize)
    return max(g for g in range(1, most + 1) if n_bh % g == 0)


def _counter(config: GluonWsConfig, device: torch.device, log: Optional[LaunchLog] = None) -> tuple:
    """(COUNTER, DYNAMIC): dynamic's tile counter, a fresh zeroed int32 a launch (a fill kernel before it: ~2 us
    of stream time, no sync), or (None, False). Logged as a zeroed buffer: without it no call plan matched the
    counter's address, so every kernels="auto" call took the launcher's host path (0.2-0.5 ms a call)."""
    if not config.dynamic:
        return None, False
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    return (counter if log is None else log.add_zeroed(counter)), True


def launch_args(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, is_causal: bool,
                config: Optional[GluonWsConfig] = None, num_sms: int = H100_SMS,
                log: Optional[LaunchLog] = None) -> Tuple[tuple, tuple, dict]:
    """(grid, positional arguments, launch options) of one launch, for tensors on any device (the
    sm_90a compile test builds them from CPU tensors); num_sms sizes a persistent grid; `log` receives the
    buffers the launch allocates (dynamic's counter)."""
    q4, k4, v4, o4 = as_4d(q), as_4d(k), as_4d(v), as_4d(o)
    B, H, n_q, n_k, d, lo, hi = dims(q4, k4)
    config = config or default_config(d)
    for name in ("rotate", "lazy_sum"):
        if getattr(config, name) and hi:
            raise ValueError(f"{FN}: {name} covers head dims without a hi half (64, 128), got d {d} ({config})")
    check_shared(shared_bytes(d, config, q.element_size()), d, config, FN)
    bm, bn = config.block_m, config.block_n
    n_m, n_bh = -(-n_q // (2 * bm)), B * H
    n_tiles = n_m * n_bh
    if config.persistent:
        grid, group = (min(num_sms, n_tiles), ), group_heads(n_k, d, n_bh, q.element_size())
    elif config.lpt and is_causal:  # full attention's tiles are equal: nothing to balance
        grid, group = (n_tiles, ), lpt_group(n_k, d, n_bh, q.element_size())
    else:
        grid, group = (n_tiles, ), 1  # each head's query tiles in a row, heaviest first: stage 1's order
    args = (*descriptors(q4, k4, v4, o4, bm, bn), lse, H, n_q, n_k, LOG2E / math.sqrt(d), n_m, n_bh, group,
            bm, bn, lo, hi, bool(is_causal), config.num_stages, config.pingpong, config.consumer_regs,
            config.load_regs, *_counter(config, q.device, log), o4 if config.early_q or config.o_regs else None,
            config.early_q, config.o_regs, config.rotate, config.lazy_sum)
    if config.prefetch_q:  # the persistent CTA's next tile (dynamic: taken from the counter), or about the one
        # starting when a running one ends
        args += (q4, *q4.stride()[:3], grid[0] if config.persistent else num_sms, True)
    else:
        args += (None, None, None, None, None, False)
    return grid, args, {"num_warps": 4}


def flash_gluon_ws_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                           config: Optional[GluonWsConfig] = None,
                           log: Optional[LaunchLog] = None) -> Tuple[Tensor, Tensor]:
    """flash_gluon_forward's contract (shapes, dtypes, strides, (o, lse), the same ValueError and
    RuntimeError checks) on the warp-specialized kernel; `log` receives the outputs and the launch (the
    call plans of flash_dispatch)."""
    o, lse = forward_outputs(q, k, v, FN, log)
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    grid, args, opts = launch_args(q, k, v, o, lse, is_causal, config, sms, log)
    launch(_attn_fwd_ws_sm90, grid, args, opts, log)
    return o, lse


__all__ = ["CANDIDATE_CONFIGS", "GluonWsConfig", "TRIAL_CONFIGS", "default_config", "flash_gluon_ws_forward",
           "group_heads", "launch_args", "lpt_group", "shared_bytes"]
