"""GPU probe (issue 47, stage 3): the Gluon backward for sm_90 against SDPA cuDNN and our Triton backward.

Shapes: issue 47's d 128 table first (bf16; causal unless marked): 1x32x32768x128 (the 8B step's),
4x32x4096x128, 8x32x2048x128, 4x16x8192x128 full; then the leaderboard's 1x16x16384x64 and the split
head dims 4x16x4096x80 and x96. Per shape, each row times three things with do_bench (median, warmup
25, rep 100), all from the same inputs and upstream gradient dO:
- "fwd": the forward alone; "bwd": the backward alone from the saved o and lse; "fwd+bwd": both in
  one call (SDPA: autograd, its backward not separable, so its "bwd" is fwd+bwd minus fwd).
Rows: "cudnn" (SDPA cuDNN), "sdpa flash", "triton" (our Triton forward and backward, default options:
the two-pass backward), "triton atomic" (our single-pass Triton backward), "gluon-bwd" (our Triton
forward, one config, unautotuned + flash_gluon_bwd at its default config: its "bwd" is the figure), "ws+gluon-bwd" (the stage-2 warp-specialized Gluon
forward + flash_gluon_bwd: the issue's target pair), "ws+gluon-bwd-ws" (the same with the warp-specialized
backward, flash_gluon_bwd_ws, d 128 and 64: one row per its CANDIDATE_CONFIGS, labels "ws 64x128 s2 rebuild"
(stage 4d, its default), "ws 64x128 s2" (stage 3b's kernel), and issue 47's ws refill variants ("ws 64x128 s2
rebuild release-before-dq", "ws 64x128 s3 rebuild", "ws 64x128 s3 rebuild release-before-dq"), at every d 128 table
shape and at 1x16x16384x64; issue 47's ws d 64 adds the d 64 table shapes 4x32x4096x64 and 4x16x8192x64 full with
cuDNN, the ws rows and Triton only; --ws-trials adds, after them at each shape whose head dim they run at, one row
per flash_gluon_bwd_ws.TRIAL_CONFIGS: configs never in the table, "ws 128x128 s2 rebuild" (issue 47's 128-row
query tiles at d 64, which spill), "ws 64x128 s2 rebuild dq-own-keys" (each consumer's dQ over its own keys, d 64)
and "ws 64x128 s2 rebuild dq-own-keys pingpong" (the same with the consumers taking turns to issue products), "ws
64x128 s2 rebuild prescaled-lse" (−lse·log2 e from the preprocessing launch; d 128 and 64), "ws 64x128 s2 rebuild
dq-own-keys prescaled-lse" (d 64), "ws 64x128 s2 rebuild prescaled-lse stats-smem dq-one" (consumer 1 computing
each tile's whole dQ; d 64) and "ws 64x128 s2 rebuild prescaled-lse stats-smem lean-sync" (the dSᵀ handshake
without ds_free: the store waits on the previous tile's slot_empty; d 128 and 64), then
flash_gluon_bwd's candidate configs (among them
dq-triton: the Gluon kernel for dK/dV only, dQ from the Triton dQ kernel; dq-gluon: the same with stage 3c's
Gluon dQ kernel, whose default tiles also get a row at every d 128 table shape; dq-stages2: the one-pass
kernel with two dQ staging tiles, stage 3d; dq-atomic: the one-pass kernel adding dQ by atomics from registers,
stage 3e; "rebuild" (after the dq part): the one-pass kernel, reduce or dq-atomic, with its resident tiles' wgmma
descriptors rebuilt each query tile, stage 4b; "prefetch": the next query tile's lse and D copied by cp.async
under the current one, "refill-first": the Q/dO refill before the dQ reduce-add, stage 4c) at 1x32x32768x128 and
4x32x4096x128; at d 64/80/96, where one pass
is the default, a dq-stages2, a dq-atomic and a rebuild row beside the default's. Rows of split configs (dq-triton, dq-gluon, and the
d 128 default) also time the dQ kernel alone ("dq_ms"). Each Gluon row records its relative errors of dQ, dK,
dV against the Triton backward's ("err": the largest; > 2e-2 marks the row wrong, its time is kept but flagged).
"/cudnn" and "/triton": fwd+bwd ms over that shape's cudnn / triton fwd+bwd ms. The "ws+gluon-bwd",
"ws+gluon-bwd-ws" and "gluon-bwd" rows record "config_used", the config's label also where "config" is None
(the default, which moves between commits): tools/probes/kernel_table.py takes the backward's configs from it.
--carveout PCT (repeatable) adds, after each "ws+gluon-bwd" row, its twin timed with the Gluon backward kernels'
shared-memory carve-out set to PCT percent (tools/probes/carveout.py; label suffix "carveoutPCT"; the driver's
default is put back after the row), so the same kernel is timed both ways in one run.

--short (issue 47, stage 4: the kernel table's min_seq) times, instead of that plan, the short shapes
4x32x{512,1024,2048,3000} at each (d, causal) of SHORT_KEYS: cuDNN, the ws backward's CANDIDATE_CONFIGS (the
table's backward kernel at d 128 and 64) and our Triton backward, 3000 last. These rows run the ws forward and
backward through flash_dispatch.gluon_forward / gluon_backward, the path (call plans included) of a kernels="auto"
call the table sent to them, and our Triton kernels through flash_launch's, that of a call it did not; all timed
by called_timer.called_ms (back-to-back calls: host cost included where the host is slower, as users see it;
do_bench would hide it) and marked "timer": "called". The ws and Triton rows also time the public call as called
(tools/probes/public_call.py): FlashAttentionTriton.apply forward+backward ("public_fwd_bwd"), the kernel table
holding just the row's backward entry (Triton: none), so the forward is Triton's in both; "public_kernels": the
kernel each half ran. kernel_table.py judges a length by public_fwd_bwd where a row has it.

--rounds R (default 1: each row timed once, as before): per shape (a run of consecutive rows of one shape, as the
plan orders them), its rows are measured once as above (compiles, the error check, the first timings), then timed
R-1 more times with the same timers (and carve-out), the row order reversed every other round (tools/probes/
rounds.py), so that no row always runs last. A row's "fwd", "bwd", "fwd+bwd" (and "dq_ms") are then the medians of
their "<quantity>_rounds" lists (in the order measured; cuDNN's "bwd" each round's difference; "rounds": how many),
/cudnn and /triton ratios of medians, and the JSON's top-level "rounds" says R.

A row starts only while elapsed + its estimate is within --budget-s; the rest are listed as left out. A later round
starts only whole, if its estimate (retime_s: the rows' timings, no compiles) fits; if it does not, the run stops
there ("rounds_cut": the shape and the rounds done), the shape's rows keeping the medians of the rounds they have.
The dry run's estimate counts the later rounds.
A failing row (compile, launch, a hang cut by the caller's timeout) leaves its error text / no row (one failing in a
later round: "round N: ...", its earlier rounds kept).

    PYTHONPATH=src python tools/probes/flash_gluon_bwd.py [OUT.json] [--budget-s S] [--skip-triton] [--skip-ws]
        [--ws-trials] [--only REGEX ...] [--carveout PCT ...] [--short] [--rounds R] [--dry-run]
writes OUT.json (default $OUT/flash_gluon_bwd.json, else ./flash_gluon_bwd.json) after every row.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from dataclasses import replace

import torch
import torch.nn.functional as F

from carveout import GLUON_BWD_KERNELS, Loaded, check_percent  # the probe beside this one (its folder is on sys.path)
from public_call import PUBLIC  # the module beside this one
from rounds import ShapeRounds, check_rounds, close_shape, note, plan_line  # the module beside this one

# (batch, heads, seq, d, causal)
TABLE = [(1, 32, 32768, 128, True), (4, 32, 4096, 128, True), (8, 32, 2048, 128, True), (4, 16, 8192, 128, False)]
OTHERS = [(1, 16, 16384, 64, True), (4, 16, 4096, 80, True), (4, 16, 4096, 96, True)]
#: Issue 47, ws d 64: the d 64 kernel-table shapes beside the leaderboard's (OTHERS[0]): cuDNN, the ws backward's
#: candidates and our Triton backward only, so that one run can give the table a d 64 causal and a full entry.
WS_D64 = [(4, 32, 4096, 64, True), (4, 16, 8192, 64, False)]
SWEEP = [TABLE[0], TABLE[1]]
#: --short: the (d, causal) the kernel table has ws backward entries at (and d 64 full, where none measured yet),
#: and their short lengths.
SHORT_KEYS = [(128, True), (64, True), (128, False), (64, False)]
SHORT_SEQS = [512, 1024, 2048, 3000]  # 3000: not a tile multiple, the last rows (the budget cuts them first)
WRONG = 2e-2  # bf16 tolerance of the correctness tests
COMPILE_S = 5.0  # a new compile (or autotune entry) on the H100's host, roughly
#: Per shape, in this order: the Gluon rows before our Triton ones, whose first call at a (d, causal)
#: autotunes (~20 configs compiled and timed).
IMPLS = ("cudnn", "sdpa flash", "ws+gluon-bwd", "gluon-bwd", "triton", "triton atomic")
#: Compiles a row's first call at a (d, causal) pays: the Triton rows autotune (forward 9 configs,
#: dQ + dK/dV 12, atomic 6), the Gluon rows compile their kernel and the unautotuned Triton
#: reference (forward, dQ, dK/dV: one config each).
#: Rows that run a Gluon backward at `config`, None meaning its default (default_config below): their label is
#: recorded as "config_used" (tools/probes/kernel_table.py reads it; "ws+gluon-bwd-ws" is the table's "gluon_ws").
GLUON_DEFAULT_IMPLS = ("ws+gluon-bwd", "gluon-bwd", "ws+gluon-bwd-ws")
#: What a row times (--rounds: each one's per-round list "<quantity>_rounds" and its median; cuDNN's "bwd" is each
#: round's difference); "dq_ms" only at split configs.
TIMED = ("fwd", "bwd", "fwd+bwd", "dq_ms", PUBLIC)
PUBLIC_IMPLS = ("ws+gluon-bwd-ws", "triton")  # the --short rows that also time the public call (public_call.py)
PUBLIC_S = 1.0  # a row's public call: one called_ms and a recorded call
COMPILES = {"cudnn": 0, "sdpa flash": 0, "ws+gluon-bwd": 5, "gluon-bwd": 1, "ws+gluon-bwd-ws": 1, "triton": 21,
            "triton atomic": 6}


def shape_name(s) -> str:
    return "x".join(map(str, s[:4])) + ("" if s[4] else " full")


def default_config(impl: str, d: int):
    """The config a GLUON_DEFAULT_IMPLS row with config None runs."""
    if impl == "ws+gluon-bwd-ws":
        from impl.attention.flash_gluon_bwd_ws import GluonBwdWsConfig
        return GluonBwdWsConfig()
    from impl.attention.flash_gluon_bwd import default_config as gluon_default
    return gluon_default(d)


def cfg_text(c) -> str:
    if c is None or isinstance(c, str):
        return c or ""
    if not hasattr(c, "dq"):  # flash_gluon_bwd_ws.GluonBwdWsConfig: 128-key tiles (stage 4d: rebuild)
        from impl.attention.flash_gluon_bwd_ws import BLOCK_N
        return (f"ws {c.block_m}x{BLOCK_N.value} s{c.num_stages}" + (" rebuild" if c.rebuild else "")
                + (" release-before-dq" if c.release_before_dq else "")  # issue 47, ws refill
                + (" dq-own-keys" if c.dq_own_keys else "")  # issue 47, ws dQ over a consumer's own keys
                + (" pingpong" if c.pingpong else "")  # and the consumers' ping-pong
                + (" prescaled-lse" if c.prescaled_lse else "")  # issue 47, ws prescaled lse
                + (" stats-smem" if c.stats_smem else "")  # and the row statistics through the load warp's ring
                + (" dq-one" if c.dq_one_consumer else "")  # issue 47, ws dQ by one consumer
                + (" lean-sync" if c.lean_sync else ""))  # issue 47, the d 64 backward's handshakes (no ds_free)
    dq = {"triton": " dq-triton", "gluon": " dq-gluon " + "x".join(map(str, c.dq_tiles)),
          "atomic": " dq-atomic"}.get(c.dq, "")
    if c.dq_stages > 1:  # stage 3d: dQ staging tiles used in turn
        dq += f" dq-stages{c.dq_stages}"
    if c.rebuild:  # stage 4b: the resident tiles' descriptors rebuilt each query tile (no spills at d 128)
        dq += " rebuild"
    if c.prefetch:  # stage 4c: the next query tile's lse and D copied by cp.async under the current tile
        dq += " prefetch"
    if c.refill_first:  # stage 4c: the Q/dO refill before the dQ reduce-add
        dq += " refill-first"
    return f"{c.block_m}x{c.block_n} w{c.num_warps} s{c.num_stages}" + dq


def row_label(spec) -> str:
    """A row's name as --only matches it and the budget stop lists it: "shape impl config"."""
    return f"{shape_name(spec['shape'])} {spec['impl']} {config_text(spec)}".rstrip()


def config_text(spec) -> str:
    """The row's config as its label says it: the kernel config, then its carve-out, if any."""
    carveout = "" if spec.get("carveout") is None else f" carveout{spec['carveout']}"
    return (cfg_text(spec["config"]) + carveout).strip()


def est_s(s, impl, new_compile: bool, split: bool = False) -> float:
    """Three do_bench runs (~0.4 s each plus ~10 calls of the row's own time) and the compiles; split
    (a Gluon row whose dQ is a separate kernel): a fourth, of the dQ kernel alone (~40% of the backward)."""
    b, h, n, d, causal = s
    ms = 3.5 * 4 * b * h * n * n * d / (2 if causal else 1) / 400e12 * 1e3  # at ~400 TFLOP/s
    compile_s = COMPILES[impl] * COMPILE_S if new_compile else 0.0
    return 1.5 + 30 * ms / 1e3 + compile_s + ((0.5 + 10 * 0.4 * ms / 3.5 * 2.5 / 1e3) if split else 0.0)


def times_public(spec) -> bool:
    """A --short row of the table's kernel or Triton: it also times the public call (public_call.py)."""
    return spec.get("timer") == "called" and spec["impl"] in PUBLIC_IMPLS


def public_s(spec) -> float:
    """A --short row's public call's estimate, else 0."""
    return PUBLIC_S * times_public(spec)


def is_split(spec) -> bool:
    """A ws+gluon-bwd row whose dQ is a separate kernel (it also times the dQ kernel alone)."""
    from impl.attention import flash_gluon_bwd as bwd

    impl, d = spec["impl"], spec["shape"][3]
    return impl.startswith("ws+gluon-bwd") and impl != "ws+gluon-bwd-ws" and \
        (spec["config"] or bwd.default_config(d)).dq not in ("reduce", "atomic")


def retime_s(spec) -> float:
    """A later round's estimate of a row: its timings again, no compile."""
    return est_s(spec["shape"], spec["impl"], False, is_split(spec)) + public_s(spec)


def plan(skip_triton: bool = False, skip_ws: bool = False, only=(), carveouts=(), ws_trials: bool = False,
         short: bool = False):
    """The rows in order; `only` (regexes): keep the rows whose row_label matches one of them (none: all);
    `carveouts` (percents): a twin of each "ws+gluon-bwd" row per percent, right after it; `ws_trials`: the ws
    backward's TRIAL_CONFIGS after its candidates; `short`: the --short plan instead. Estimates count a compile
    only at a key's first kept row."""
    import re

    from impl.attention import flash_gluon_bwd as bwd, flash_gluon_bwd_ws as ws

    rows, compiled = [], set()

    def add(s, impl, config=None):
        add_row(s, impl, config)
        if impl == "ws+gluon-bwd":  # the same kernel again, at each carve-out
            for percent in carveouts:
                add_row(s, impl, config, percent)

    def add_row(s, impl, config, carveout=None):
        if skip_triton and impl.startswith("triton"):
            return
        spec = dict(shape=s, impl=impl, config=config, carveout=carveout, **(dict(timer="called") if short else {}))
        if only and not any(re.search(rx, row_label(spec)) for rx in only):
            return
        key = (impl, cfg_text(config), s[3], s[4])
        rows.append(dict(spec, est=est_s(s, impl, key not in compiled, is_split(spec)) + public_s(spec)))
        compiled.add(key)

    def add_ws(s):  # the ws backward's candidates (and trials) where each runs (GluonBwdWsConfig.head_dims)
        if not skip_ws:
            for c in ws.CANDIDATE_CONFIGS + (ws.TRIAL_CONFIGS if ws_trials else ()):
                if s[3] in c.head_dims:
                    add(s, "ws+gluon-bwd-ws", c)

    if short:
        for n in SHORT_SEQS:
            for d, causal in SHORT_KEYS:
                s = (4, 32, n, d, causal)
                add(s, "cudnn")
                add_ws(s)
                add(s, "triton")
        return rows
    dq_gluon = bwd.GluonBwdConfig(dq="gluon")  # stage 3c: the Gluon dQ kernel, at every d 128 shape
    for s in TABLE:
        for impl in IMPLS:
            add(s, impl)
            if impl == "ws+gluon-bwd":
                add(s, impl, dq_gluon)
            if impl == "gluon-bwd":
                add_ws(s)
    for s in SWEEP:
        for c in bwd.CANDIDATE_CONFIGS:
            if c != bwd.default_config(s[3]) and c != dq_gluon:
                add(s, "ws+gluon-bwd", c)
    for s in OTHERS:
        for impl in IMPLS:
            add(s, impl)
            default = bwd.default_config(s[3])
            if impl == "ws+gluon-bwd" and default.dq == "reduce":  # stages 3d and 3e where one pass is the default
                add(s, impl, replace(default, dq_stages=2))
                add(s, impl, replace(default, dq="atomic"))
                add(s, impl, replace(default, rebuild=True))  # stage 4b
            if impl == "gluon-bwd":
                add_ws(s)  # issue 47, ws d 64
    for s in WS_D64:
        add(s, "cudnn")
        add_ws(s)
        add(s, "triton")
    return rows


def bench(fn) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def inputs(s):
    b, h, n, d, _ = s
    g = torch.Generator(device="cuda").manual_seed(0)
    return tuple(torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))


def rel_err(out, ref) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


def _triton(q, k, v, do, causal, variant, options=None):
    """(forward, backward from the saved o and lse, both) of our Triton kernels; options None: the
    defaults (autotuned)."""
    from impl.attention.flash_launch import flash_attention_triton_backward, flash_attention_triton_forward

    fwd = lambda: flash_attention_triton_forward(q, k, v, causal, options=options)  # noqa: E731
    o, lse = fwd()
    bwd = lambda: flash_attention_triton_backward(q, k, v, o, do, lse, causal, variant, options)  # noqa: E731

    def both():
        o2, lse2 = fwd()
        return flash_attention_triton_backward(q, k, v, o2, do, lse2, causal, variant, options)

    return fwd, bwd, both


def _auto_ws(q, k, v, do, causal, config):
    """(forward, backward from the saved o and lse, both) of the ws kernels as a kernels="auto" call the table sent
    to them runs them (--short rows): the forward at its default config."""
    from impl.attention import FlashOptions
    from impl.attention.flash_dispatch import gluon_backward, gluon_forward
    from impl.attention.flash_gluon_ws import default_config
    from impl.attention.kernel_table import config_pairs

    options, fwd_pairs, pairs = FlashOptions(kernels="auto"), config_pairs(default_config(q.shape[-1])), \
        config_pairs(config)
    fwd = lambda: gluon_forward(q, k, v, causal, options, "gluon_ws", fwd_pairs)[:2]  # noqa: E731
    o, lse = fwd()
    bwd = lambda: gluon_backward(q, k, v, o, do, lse, causal, options, "gluon_ws", pairs)[:3]  # noqa: E731

    def both():
        o2, lse2 = fwd()
        return gluon_backward(q, k, v, o2, do, lse2, causal, options, "gluon_ws", pairs)[:3]

    return fwd, bwd, both


def public_timer(row, tensors):
    """What times a --short ws or Triton row's public call (public_call.time_public: forward+backward, the table
    holding just the row's backward entry, min_seq 0; Triton: none), filling row["public_kernels"] once; None for
    other rows."""
    if not times_public(row):
        return None
    from called_timer import called_ms
    from public_call import only_entry_table, time_public

    from impl.attention.kernel_table import arch_name

    _, _, _, d, causal = row["shape"]
    kernel = "gluon_ws" if row["impl"] == "ws+gluon-bwd-ws" else None
    table = only_entry_table("bwd", kernel, row["config"], arch_name(torch.cuda.get_device_capability()), d, causal,
                             "bfloat16")  # inputs()'
    kernels = row.setdefault("public_kernels", {})
    return lambda: time_public(called_ms, table, *tensors, causal, kernels=None if kernels else kernels)


def with_public(again, public):
    """again() and, where the row times the public call, its quantities too."""
    return again if public is None else (lambda: {**again(), **public()})


def measure(row, tensors, cache, loaded: Loaded | None = None):
    """(the row's fields, its first timings included; what times it again: its TIMED quantities, the same timer
    and carve-out)."""
    from called_timer import called_ms  # the probe beside this one (its folder is on sys.path)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention import flash_gluon_bwd as gbwd

    q, k, v, do = tensors
    causal = row["shape"][4]
    impl = row["impl"]
    called = row.get("timer") == "called"
    bench_ = called_ms if called else bench
    if impl in ("cudnn", "sdpa flash"):
        backend = SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION
        qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))

        def both():
            out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
            return torch.autograd.grad(out, (qg, kg, vg), do)

        def again():
            with sdpa_kernel(backend):
                fwd_ms = bench_(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                both_ms = bench_(both)
            return {"fwd": fwd_ms, "fwd+bwd": both_ms, "bwd": both_ms - fwd_ms}

        return {**again(), "bwd_by": "difference"}, again
    from impl.attention.flash_options import FlashOptions

    plain = FlashOptions(autotune=False)  # one config per kernel: a reference, not a baseline
    if "ref" not in cache:  # the Triton two-pass backward's gradients: every other row is checked against them
        cache["ref"] = _triton(q, k, v, do, causal, "two_pass", plain)[1]()
    public = public_timer(row, tensors)
    if impl in ("triton", "triton atomic"):
        fwd, bwd, both = _triton(q, k, v, do, causal, "two_pass" if impl == "triton" else "atomic")
        again = with_public(lambda: {"fwd": bench_(fwd), "bwd": bench_(bwd), "fwd+bwd": bench_(both)}, public)
        out = again()
        out["err"] = max(rel_err(g, r) for g, r in zip(bwd(), cache["ref"]))
        out["wrong"] = out["err"] > WRONG
        return out, again
    if impl == "ws+gluon-bwd-ws" and called:
        fwd, bwd, both = _auto_ws(q, k, v, do, causal, row["config"])
        err = max(rel_err(g, r) for g, r in zip(bwd(), cache["ref"]))
        again = with_public(lambda: {"fwd": bench_(fwd), "bwd": bench_(bwd), "fwd+bwd": bench_(both)}, public)
        return {**again(), "err": err, "wrong": err > WRONG}, again
    if impl == "ws+gluon-bwd-ws":
        from impl.attention.flash_gluon_bwd_ws import flash_gluon_backward_ws
        from impl.attention.flash_gluon_ws import flash_gluon_ws_forward

        fwd = lambda: flash_gluon_ws_forward(q, k, v, causal)  # noqa: E731
        o, lse = fwd()
        config = row["config"]
        bwd = lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal, config)  # noqa: E731

        def both():
            o2, lse2 = fwd()
            return flash_gluon_backward_ws(q, k, v, o2, do, lse2, causal, config)

        err = max(rel_err(g, r) for g, r in zip(bwd(), cache["ref"]))
        again = lambda: {"fwd": bench(fwd), "bwd": bench(bwd), "fwd+bwd": bench(both)}  # noqa: E731
        return {**again(), "err": err, "wrong": err > WRONG}, again
    if impl == "gluon-bwd":
        from impl.attention.flash_launch import flash_attention_triton_forward as forward
        fwd = lambda: forward(q, k, v, causal, options=plain)  # noqa: E731 - its fwd ms is not the baseline
    else:
        from impl.attention.flash_gluon_ws import flash_gluon_ws_forward
        fwd = lambda: flash_gluon_ws_forward(q, k, v, causal)  # noqa: E731
    config = row["config"]
    o, lse = fwd()
    bwd = lambda: gbwd.flash_gluon_backward(q, k, v, o, do, lse, causal, config)  # noqa: E731

    def both():
        o2, lse2 = fwd()
        return gbwd.flash_gluon_backward(q, k, v, o2, do, lse2, causal, config)

    err = max(rel_err(g, r) for g, r in zip(bwd(), cache["ref"]))  # this first call loads the kernels
    dq_fn = _dq_only(q, k, v, o, do, lse, causal, config or gbwd.default_config(q.shape[-1]))
    carved = []

    def again():
        carve = contextlib.nullcontext() if row.get("carveout") is None else \
            loaded.carveout(GLUON_BWD_KERNELS, row["carveout"])
        with carve as names:  # None, or the kernels carved for this row
            times = {"fwd": bench(fwd), "bwd": bench(bwd), "fwd+bwd": bench(both)}
            if dq_fn is not None:  # the dQ kernel alone (Triton's or stage 3c's), from the same o and lse
                times["dq_ms"] = bench(dq_fn)
        carved[:] = names or []
        return times

    out = {**again(), "err": err, "wrong": err > WRONG}
    if carved:
        out["carveout_kernels"] = list(carved)
    return out, again


def _dq_only(q, k, v, o, do, lse, causal, config):
    """The dQ launch of a split config (dq "triton" or "gluon") as a callable, else None."""
    from impl.attention import flash_gluon_bwd as gbwd

    B, H, n_q, _ = q.shape
    delta = torch.empty((B, H, n_q), dtype=torch.float32, device=q.device)
    dq = torch.empty_like(q)
    if config.dq == "triton":
        lse3 = lse.contiguous().reshape(B, H, n_q)
        return lambda: gbwd._triton_dq(q, k, v, o, do, dq, lse3, delta, causal)
    if config.dq == "gluon":
        from impl.attention.flash_gluon_dq import _attn_bwd_dq_sm90, dq_launch_args

        grid, args, opts = dq_launch_args(q, k, v, o, do, lse.contiguous(), delta, dq, causal, config.dq_tiles)
        return lambda: _attn_bwd_dq_sm90[grid](*args, **opts)
    return None


def fill_ratios(rows) -> None:
    from impl.attention import attention_flops

    anchor = {(r["shape_name"], r["impl"]): r["fwd+bwd"] for r in rows
              if r.get("fwd+bwd") is not None and r["impl"] in ("cudnn", "triton") and not r["config"]}
    for r in rows:
        b, h, n, d, causal = r["shape"]
        ms = r.get("fwd+bwd")
        r["tflops"] = attention_flops(b * h, n, n, d, causal, "fwd_bwd") / ms * 1e-9 if ms else None
        r["bwd_tflops"] = attention_flops(b * h, n, n, d, causal, "bwd") / r["bwd"] * 1e-9 if r.get("bwd") else None
        for impl in ("cudnn", "triton"):
            a = anchor.get((r["shape_name"], impl))
            r[f"/{impl}"] = ms / a if ms and a else None


HEAD = (f"{'shape':<22}{'impl':<17}{'config':<34}{'fwd ms':>9}{'bwd ms':>9}{'f+b ms':>9}{'TF/s':>6}"
        f"{'/cudnn':>8}{'/triton':>8}{'err':>9}  note")


def line(r) -> str:
    num = (lambda x, f: f"{x:{f}}" if x is not None else "-")
    note = ("WRONG " if r.get("wrong") else "") + ("bwd by difference " if r.get("bwd_by") else "")
    note += f"dQ kernel alone {r['dq_ms']:.3f} ms " if r.get("dq_ms") is not None else ""
    note += f"public f+b {r[PUBLIC]:.3f} ms " if r.get(PUBLIC) is not None else ""
    return (f"{r['shape_name']:<22}{r['impl']:<17}{config_text(r):<34}{num(r.get('fwd'), '9.3f'):>9}"
            f"{num(r.get('bwd'), '9.3f'):>9}{num(r.get('fwd+bwd'), '9.3f'):>9}{num(r.get('tflops'), '6.0f'):>6}"
            f"{num(r.get('/cudnn'), '8.3f'):>8}{num(r.get('/triton'), '8.3f'):>8}{num(r.get('err'), '9.1e'):>9}  "
            f"{note}{(r.get('error') or '')[:80]}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "flash_gluon_bwd.json"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no row that would end past this")
    ap.add_argument("--dry-run", action="store_true", help="print the plan, touch no GPU")
    ap.add_argument("--skip-triton", action="store_true",
                    help="leave out our Triton rows (their autotuning costs ~2 min per head dim)")
    ap.add_argument("--skip-ws", action="store_true", help="leave out the stage-3b rows (ws+gluon-bwd-ws)")
    ap.add_argument("--ws-trials", action="store_true",
                    help="also time the ws backward's TRIAL_CONFIGS (they spill; never in the kernel table)")
    ap.add_argument("--only", action="append", default=[], metavar="REGEX",
                    help="keep only rows whose 'shape impl config' label matches (repeatable: any of them)")
    ap.add_argument("--short", action="store_true",
                    help="the short shapes (4x32x512..3000) as called, for the kernel table's min_seq")
    ap.add_argument("--carveout", action="append", default=[], type=int, metavar="PCT",
                    help="also time each ws+gluon-bwd row with the Gluon backward's shared-memory carve-out at "
                         "PCT percent (repeatable)")
    ap.add_argument("--rounds", type=check_rounds, default=1, metavar="R",
                    help="per shape, time every row R times in all, the order reversed every other round; report "
                         "the medians (default 1: one timing each)")
    args = ap.parse_args(argv)
    try:
        carveouts = tuple(check_percent(p) for p in args.carveout)
    except ValueError as e:
        ap.error(f"--carveout: {e}")
    specs = plan(args.skip_triton, args.skip_ws, tuple(args.only), carveouts, args.ws_trials, args.short)
    if not specs:
        ap.error(f"no row matches --only {args.only}")
    if args.dry_run:
        for s in specs:
            print(f"{shape_name(s['shape']):<22}{s['impl']:<17}{config_text(s):<34} est {s['est']:5.1f} s"
                  + ("  + public call" if times_public(s) else ""))
        print(plan_line(len(specs), sum(s["est"] for s in specs), sum(map(retime_s, specs)), args.rounds,
                        args.budget_s))
        return
    import triton

    start, rows = time.time(), []
    res = {"device": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
           "torch": torch.__version__, "triton": triton.__version__, "budget_s": args.budget_s,
           "stopped_by_budget": False, "left_out": [], "rows": rows}
    if args.rounds > 1:
        res["rounds"] = args.rounds  # each row's TIMED quantities: the medians of their "<quantity>_rounds"
    shape, tensors, cache = None, None, {}
    later = ShapeRounds(args.rounds, TIMED)
    loaded = Loaded().install() if carveouts else None  # before the first launch: it records every kernel loaded

    def dump():
        res["seconds"] = time.time() - start
        json.dump(res, open(args.out, "w"), indent=1, default=cfg_text)

    def end_shape(rest) -> bool:
        return close_shape(later, res, rest, lambda: time.time() - start, args.budget_s, lambda: fill_ratios(rows),
                           line, row_label, dump)

    print(HEAD, flush=True)
    if note(args.rounds):
        print(note(args.rounds), flush=True)
    for i, spec in enumerate(specs):
        if spec["shape"] != shape and not end_shape(specs[i:]):
            break
        if time.time() - start + spec["est"] > args.budget_s:
            res["stopped_by_budget"] = True
            res["left_out"] = [row_label(s) for s in specs[i:]]
            print(f"budget: stopped after {time.time() - start:.0f} s, {len(specs) - i} rows left out", flush=True)
            break
        if spec["shape"] != shape:
            tensors, cache = None, {}  # free the last shape's tensors first
            torch.cuda.empty_cache()
            shape, tensors = spec["shape"], inputs(spec["shape"])
        row = dict(shape=spec["shape"], shape_name=shape_name(spec["shape"]), impl=spec["impl"],
                   config=spec["config"], carveout=spec["carveout"], fwd=None, bwd=None, err=None, wrong=None,
                   error=None)
        row["fwd+bwd"] = None
        if "timer" in spec:  # --short: timed as called (called_timer), the Gluon kernels through the dispatch
            row["timer"] = spec["timer"]
        if spec["impl"] in GLUON_DEFAULT_IMPLS:  # the config the row ran, also where it is the default (the
            # default moves between commits; tools/probes/kernel_table.py reads this)
            row["config_used"] = cfg_text(spec["config"] or default_config(spec["impl"], spec["shape"][3]))
        t0 = time.time()
        try:
            out, again = measure(row, tensors, cache, loaded)
            row.update(out)
            later.add(row, again, retime_s(spec))
        except Exception as e:  # noqa: BLE001 - a failed row is a result; the probe goes on
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        row["s"] = round(time.time() - t0, 1)
        rows.append(row)
        fill_ratios(rows)
        print(line(row), flush=True)
        dump()
    end_shape([])  # the last shape's (or, after a budget stop, the cut shape's) rounds
    dump()
    print(HEAD)
    if note(args.rounds):
        print(note(args.rounds))
    print("\n".join(line(r) for r in rows))
    print(f"{res['seconds']:.0f} s; {res['device']}, torch {res['torch']}, triton {res['triton']}"
          + (f"; budget stop, {len(res['left_out'])} rows left out" if res["stopped_by_budget"] else ""))


if __name__ == "__main__":
    main()
