"""The Gluon backward for Hopper: impl.attention.flash_gluon_bwd (issue 47, stage 3).

On the CPU: the kernel compiles for sm_90a at every head dim, causal and full (bf16; fp16 at d 80
and 128) and at each candidate config, within the H100's shared memory, its products on wgmma, its
loads and stores through TMA and its dQ through the bulk tensor reduce (UTMAREDG in the SASS); the
launcher refuses what it cannot run with a message naming the constraint; nothing on the default
attention paths imports the module.

On an H100 (marked gpu): dQ, dK, dV against a float64 CPU reference (D from the o the forward
stored, as correctness/test_attention.py does) for d 64/80/96/128, causal and full, ragged lengths,
batch and heads > 1, bf16 and fp16, with o and lse from the Triton forward and from both Gluon
forwards; the dK/dV-only kernel with the Triton dQ kernel; every candidate config; rows whose every score
is very negative (padded keys); 3-D and strided inputs; 4096-long sequences against the Triton backward.

Stage 3c, the Gluon dQ kernel (impl.attention.flash_gluon_dq, GluonBwdConfig(dq="gluon")): its sm_90a
compile figures, refusals and a float64 emulation of its tile schedule on the CPU; on an H100 the same
reference checks (every d, ragged, fp16, both Gluon forwards, very negative scores, NaN-poisoned
outputs, strided and 3-D inputs bit-identical, 4096-long sequences).
"""
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton.experimental.gluon")  # triton is a dependency on Linux only

from impl.attention import flash_gluon_bwd as bwd  # noqa: E402
from kits.compile_table import print_compile_table  # noqa: E402
from kits.gluon import WS_BWD_CANDIDATE_IDS  # noqa: E402
from kits.sm90_compile import run_without_interpreter  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
gpu = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(not IS_SM90, reason="the Gluon backward is written for sm_90 (H100/H200)")

HEAD_DIMS = (64, 80, 96, 128)
#: Stack bytes ptxas may use at each head dim (spilled loop-invariant values: wgmma descriptors and
#: addresses; the fp32 dK and dV accumulators alone are 128 of the 255 registers at d 128). Read in
#: NOTES.md ("Issue 47, stage 3"); a bound so that a change which spills more shows.
STACK_BOUND = {64: 0, 80: 0, 96: 64, 128: 512}


# ----------------------------------------------------------------------------- CPU: compile for sm_90a

# The launcher's own launch_args (CPU tensors), triton.compile for sm_90a, cuobjdump of the cubin:
# registers, stack and local bytes; instruction counts from the SASS; shared memory from the metadata.
_COMPILE = r"""
import json, re, sys, torch
from impl.attention import flash_gluon_bwd as mod

fn = mod._attn_bwd_sm90
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text

def compile_sm90(d, causal, config, dtype=torch.bfloat16):
    q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    dq32 = torch.empty(q.shape) if config.dq in ("reduce", "atomic") else None
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, dq32, dk, dv, causal, config)
    divisible = ("L", "Delta") + (("dq_ptr",) if config.dq == "atomic" else ())
    return compile_for_sm90(fn, args, opts, divisible=divisible)

rows = []
def add(d, causal, config, label, dtype=torch.bfloat16):
    row = dict(d=d, causal=causal, config=label, predicted=mod.shared_bytes(d, config), reduce=config.dq == "reduce",
               atomic=config.dq == "atomic")
    try:
        ck = compile_sm90(d, causal, config, dtype)
    except ValueError as e:
        rows.append(dict(row, refused=str(e)))
        return
    # the bulk-group waits' counts (cp.async.bulk.wait_group.read N): before a dQ staging write, the epilogue
    ptx = ck.asm["ptx"]
    waits = sorted({int(n) for n in re.findall(r"cp\.async\.bulk\.wait_group\.read\s+(\d+)", ptx)})
    # stage 3e: the PTX's global atomics / reductions by form, the bulk reduces, and the SASS's REDG / ATOMG by opcode
    ptx_atomics = sorted(set(re.findall(r"\b((?:atom|red)\.global[\w.:]*)", ptx)))
    sass_atomics = {}
    for op in re.findall(r"\b((?:REDG|ATOMG)(?:\.\w+)*)", sass_text(ck)):
        sass_atomics[op] = sass_atomics.get(op, 0) + 1
    rows.append(dict(row, dq_stages=config.dq_stages, prefetch=config.prefetch, bulk_waits=waits,
                     ptx_atomics=ptx_atomics, bulk_reduce_ptx=len(re.findall(r"cp\.reduce\.async\.bulk", ptx)),
                     sass_atomics=sass_atomics,
                     redg=sum(sass_atomics.values()), **cubin_figures(ck)))

for d in (64, 80, 96, 128):
    for causal in (False, True):
        add(d, causal, mod.default_config(d), str(mod.default_config(d)))
for d in (64, 80, 96, 128):  # stage 3d: two dQ staging tiles (d 128 causal: the candidate below)
    for causal in (False, True):
        if (d, causal) != (128, True):
            add(d, causal, mod.GluonBwdConfig(dq_stages=2), str(mod.GluonBwdConfig(dq_stages=2)))
add(128, True, mod.GluonBwdConfig(num_stages=3, dq_stages=2), str(mod.GluonBwdConfig(num_stages=3, dq_stages=2)))
for d in (64, 80, 96, 128):  # stage 3e: dQ by atomics from registers (d 128 causal: the candidate below)
    for causal in (False, True):
        if (d, causal) != (128, True):
            add(d, causal, mod.GluonBwdConfig(dq="atomic"), str(mod.GluonBwdConfig(dq="atomic")))
for d in (80, 128):
    add(d, True, mod.default_config(d), str(mod.default_config(d)) + " fp16", torch.float16)
for config in mod.CANDIDATE_CONFIGS:  # dq "gluon": this kernel is dq "triton"'s (the dQ kernel: test_gluon_dq_...)
    if config != mod.default_config(128) and config.dq != "gluon":
        add(128, True, config, str(config))
for d in (64, 80, 96):  # dK/dV only (dQ from the Triton kernel) at the other head dims
    add(d, True, mod.GluonBwdConfig(dq="triton"), str(mod.GluonBwdConfig(dq="triton")))
print(json.dumps(rows))
"""


# the compile-figure tables' columns (kits.compile_table): the kernel's place, then its figures
_LEAD = [("d", ">4", "{d:>4}"), ("causal", ">6", "{causal!s:>6}")]
_FIGURES = [("regs", ">4", "{regs:>4}"), ("stack", ">5", "{stack:>5}"), ("shared B", ">8", "{shared:>8}"),
            ("HGMMA", ">5", "{hgmma:>5}"), ("EX2", ">4", "{ex2:>4}"), ("BAR", ">4", "{bar_sync:>4}"),
            ("STL/LDL", ">7", "{stl:>3}/{ldl:<3}")]
#: Loop instances of the one-pass kernel: the diagonal, key-mask and mask-free ones (causal); key-mask and
#: mask-free (full). Stage 3e's dQ adds: in each instance a masked and an unmasked copy (a uniform branch on
#: the ragged query tile), each of d / 8 REDG.F32x2 a thread (64 x d fp32 over 256 threads, 8 bytes each).
LOOP_INSTANCES = {False: 2, True: 3}


def test_gluon_backward_compiles_for_hopper():
    """Every head dim, causal and full, at the default config (bf16; fp16 at d 80 and 128), the other
    candidates at d 128 causal (the one-pass reduce among them) and the dK/dV-only kernel (dq "triton") at d 64/80/96
    causal, the two-staging-tile one-pass kernel (dq_stages 2, stage 3d) at every head dim, causal and full (its
    3-slot config at d 128 refused, naming dq_stages): compiles for sm_90a, no local memory and stack within
    STACK_BOUND, shared memory what shared_bytes predicts (within the H100's 227 KB), products on
    wgmma (no HMMA), Q/dO/K/V through TMA loads, dK/dV through TMA stores and dQ through the bulk
    tensor reduce (none in the dK/dV-only kernel); the wait before a staging write is for every bulk group
    (wait_group.read 0) with one staging tile and leaves the last query tile's groups in flight with two (1 at
    d 64 / 128, 2 at split d: one group per reduce call)."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE))
    print_compile_table(rows, [*_LEAD, ("config", "<76", "{config:<76}"), *_FIGURES[:4],
                               ("TMA ld/st/red", ">13", "{tma_loads:>5}/{tma_stores}/{tma_reduce:<4}"),
                               *_FIGURES[4:], ("REDG", ">4", "{redg:>4}")], refused="refused: {predicted} B")
    assert {(r["d"], r["causal"]) for r in rows} == {(d, c) for d in HEAD_DIMS for c in (False, True)}
    assert sum("dq_stages=2" in r["config"] and "refused" not in r for r in rows) == 8
    assert {(r["d"], r["causal"]) for r in rows if r["atomic"]} == {(d, c) for d in HEAD_DIMS for c in (False, True)}
    for r in rows:
        if "refused" in r:
            assert r["predicted"] > SM90_MAX_SHARED, r
            if "dq_stages=2" in r["config"]:
                assert "dq_stages=2 needs" in r["refused"], r
            continue
        assert r["target"] == "sm_90a", r
        assert r["local"] == 0 and r["stack"] <= STACK_BOUND[r["d"]], f"spills: {r}"
        assert r["regs"] <= 255, r
        assert r["predicted"] - 16 < r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        assert r["hgmma"] > 0 and r["hmma"] == 0, r
        assert r["tma_loads"] > 0 and r["tma_stores"] > 0 and (r["tma_reduce"] > 0) == r["reduce"], r
        in_flight = (r["dq_stages"] - 1) * (2 if r["d"] in (80, 96) else 1)  # groups a staging wait leaves
        assert r["bulk_waits"] == sorted({0, in_flight} if r["reduce"] else {0}), r
        if not r["atomic"]:
            assert r["ptx_atomics"] == [] and r["redg"] == 0, r
            continue
        # stage 3e: vector relaxed atomics in the PTX, all of them REDG.F32x2 in the SASS (results unused), no bulk
        # reduce, no staging tile (shared_bytes drops it: checked above), only the epilogue's bulk wait
        assert r["ptx_atomics"] == ["atom.global.gpu.relaxed.add.v2.f32"], r
        assert r["bulk_reduce_ptx"] == 0 and r["tma_reduce"] == 0, r
        redg = LOOP_INSTANCES[r["causal"]] * 2 * r["d"] // 8
        assert r["sass_atomics"] == {"REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU": redg}, r
        plain = bwd.GluonBwdConfig(prefetch=r["prefetch"])  # stage 4c: the prefetch's rings in both
        assert r["predicted"] == bwd.shared_bytes(r["d"], plain) - 64 * r["d"] * 4, r


# Stages 4b and 4c: per kernel its figures and, per loop instance (tools/probes/sass_loops.py), its counts; in the
# hot loop (the last instance) also its cp.async (LDGSTS) and global loads (LDG), and where its first TMA load
# (the refill) and first TMA reduce-add sit (instruction index, -1: none).
_COMPILE_LOOPS = r"""
import json, re, sys, torch
sys.path.insert(0, "tools/probes")
import sass_loops
from impl.attention import flash_gluon_bwd as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text

rows = []
def add(d, causal, config, dtype=torch.bfloat16):
    q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    dq32 = torch.empty(q.shape) if config.dq in ("reduce", "atomic") else None
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, dq32, torch.empty_like(k), torch.empty_like(v),
                                       causal, config)
    divisible = ("L", "Delta") + (("dq_ptr",) if config.dq == "atomic" else ())
    ck = compile_for_sm90(mod._attn_bwd_sm90, args, opts, divisible=divisible)
    ins = sass_loops.parse(sass_text(ck))
    spans = sass_loops.loops(ins)
    loops = [dict(sass_loops.counts(ins[lo:hi + 1]), n=hi - lo + 1) for lo, hi in spans]
    hot = [t for _, t in ins[spans[-1][0]:spans[-1][1] + 1]]
    first = lambda rx: next((i for i, t in enumerate(hot) if re.search(rx, t)), -1)
    rows.append(dict(d=d, causal=causal, dq=config.dq, rebuild=config.rebuild, fp16=dtype == torch.float16,
                     prefetch=config.prefetch, refill_first=config.refill_first, config=str(config),
                     predicted=mod.shared_bytes(d, config), loops=loops, ldgsts=sum("LDGSTS" in t for t in hot),
                     ldg=sum(bool(re.match(r"(@!?U?P\w+ )?LDG\b", t)) for t in hot), first_tma_load=first(r"\bUTMALDG"),
                     first_reduce=first(r"\bUTMAREDG"), **cubin_figures(ck)))
"""

# Stage 4b: the one-pass kernels with rebuilt descriptors (GluonBwdConfig.rebuild), and the plain ones at d 128 for
# comparison.
_COMPILE_REBUILD = _COMPILE_LOOPS + r"""
for dq in ("reduce", "atomic"):
    for d in (64, 80, 96, 128):
        for causal in (False, True):
            add(d, causal, mod.GluonBwdConfig(dq=dq, rebuild=True))
    for causal in (False, True):
        add(128, causal, mod.GluonBwdConfig(dq=dq))
add(128, True, mod.GluonBwdConfig(rebuild=True), torch.float16)
print(json.dumps(rows))
"""


def test_gluon_backward_rebuild_compiles_without_spills():
    """Stage 4b (NOTES.md, "Issue 47, stage 4b"): the one-pass kernel with its resident tiles' descriptors rebuilt
    each query tile (rebuild), dq "reduce" and "atomic", every head dim, causal and full (bf16; fp16 at d 128
    causal): no stack, no local memory and no LDL / STL anywhere in the kernel, at most 255 registers, the shared
    memory of the plain config. At d 128, where the plain kernel spills (stack > 0, LDL / STL in its hot loop), each
    loop instance keeps the plain one's HGMMA, wgmma waits, CTA barriers, bulk reduces / REDG and exp2 counts (the
    same schedule), and the hot loop (the last instance) is no longer than the plain one's."""
    rows = json.loads(run_without_interpreter(_COMPILE_REBUILD))
    for r in rows:
        r["hot"] = dict(dict(LDL=0, STL=0), **r["loops"][-1])
    print_compile_table(rows, [*_LEAD, ("dq", "<6", "{dq:<6}"), ("rebuild", ">7", "{rebuild!s:>7}"),
                               ("fp16", ">5", "{fp16!s:>5}"), *_FIGURES,
                               ("hot loop n/LDL/STL", ">18", "{hot[n]:>10}/{hot[LDL]:>3}/{hot[STL]:<3}")],
                        refused="")
    assert sum(r["rebuild"] for r in rows) == 17
    plain = {(r["dq"], r["causal"]): r for r in rows if not r["rebuild"]}
    for r in rows:
        assert r["target"] == "sm_90a" and r["regs"] <= 255, r
        assert r["predicted"] - 16 < r["shared"] <= r["predicted"], r
        assert len(r["loops"]) == LOOP_INSTANCES[r["causal"]], r
        if not r["rebuild"]:  # the plain d 128 kernels: today's spills, the reason for stage 4b
            assert r["stack"] > 0 and r["loops"][-1]["LDL"] > 0 and r["loops"][-1]["STL"] > 0, r
            continue
        assert r["stack"] == 0 and r["local"] == 0 and r["stl"] == 0 and r["ldl"] == 0, f"spills: {r}"
        assert all(lp.get("LDL", 0) == 0 and lp.get("STL", 0) == 0 for lp in r["loops"]), r
        if r["d"] == 128 and not r["fp16"]:
            base = plain[(r["dq"], r["causal"])]
            assert r["shared"] == base["shared"], r
            for lp, bp in zip(r["loops"], base["loops"]):
                for key in ("HGMMA", "WG.DEPBAR", "BAR.SYNC", "UTMAREDG", "REDG", "MUFU.EX2", "UTMALDG"):
                    assert lp.get(key, 0) == bp.get(key, 0), (key, r, base)
            assert r["loops"][-1]["n"] <= base["loops"][-1]["n"], (r, base)


# Stage 4c: the prefetching candidates (and, beside them, the configs they extend) at d 128, causal and full, and
# the prefetching ones at d 80 (lo and hi halves) causal.
_COMPILE_PREFETCH = _COMPILE_LOOPS + r"""
from dataclasses import replace
for config in mod.CANDIDATE_CONFIGS:
    if config.prefetch:
        for causal in (False, True):
            add(128, causal, config)
            add(128, causal, replace(config, prefetch=False, refill_first=False))
        add(80, True, config)
print(json.dumps(rows))
"""


def test_gluon_backward_prefetch_compiles_without_spills():
    """Stage 4c (NOTES.md, "Issue 47, stage 4c (redone)"): the candidates with prefetch (split, reduce with and
    without refill_first, atomic; rebuilt descriptors where one pass) compile for sm_90a with no stack, no local
    memory and no LDL / STL, at most 255 registers; shared memory is shared_bytes' (the config without them plus the
    two 2-slot rings, 1 KB at block_m 64); the hot loop copies the next tile's statistics by cp.async (LDGSTS) and
    loads nothing from global memory by LDG, where the config without prefetch does; refill_first issues the hot
    loop's refill (its first TMA load) before its dQ reduce-add, the plain order after it."""
    rows = json.loads(run_without_interpreter(_COMPILE_PREFETCH))
    for r in rows:
        r["hot"] = dict(dict(LDL=0, STL=0), **r["loops"][-1])
        r["label"] = r["dq"] + " rebuild" * r["rebuild"]
    print_compile_table(rows, [*_LEAD, ("config", "<14", "{label:<14}"), ("pf", ">3", "{prefetch:>3}"),
                               ("rf", ">3", "{refill_first:>3}"), *_FIGURES,
                               ("hot n/LDGSTS/LDG", ">16", "{hot[n]:>8}/{ldgsts:>3}/{ldg:<3}"),
                               ("ld/red", ">7", "{first_tma_load:>3}/{first_reduce:<3}")], refused="")
    assert sum(r["prefetch"] for r in rows) == 12 and sum(r["refill_first"] for r in rows) == 3
    plain = {(r["dq"], r["rebuild"], r["causal"]): r for r in rows if not r["prefetch"]}
    for r in rows:
        assert r["target"] == "sm_90a" and r["regs"] <= 255, r
        assert r["predicted"] - 16 < r["shared"] <= r["predicted"], r
        assert len(r["loops"]) == LOOP_INSTANCES[r["causal"]], r
        if r["prefetch"]:
            assert r["stack"] == 0 and r["local"] == 0 and r["stl"] == 0 and r["ldl"] == 0, f"spills: {r}"
            assert r["ldgsts"] == 2 and r["ldg"] == 0, r  # lse and D of the next tile, one each a thread
        else:
            assert r["ldgsts"] == 0 and r["ldg"] > 0, r
        if r["d"] == 128 and r["prefetch"]:
            base = plain[(r["dq"], r["rebuild"], r["causal"])]
            assert r["shared"] == base["shared"] + 1024, (r, base)
        if r["dq"] == "reduce":
            assert (r["first_tma_load"] < r["first_reduce"]) == r["refill_first"], r


# ----------------------------------------------------------------------------- CPU: refusals, isolation

def _inputs(shape_q, shape_k=None, dtype=torch.bfloat16, device="cpu", seed=0, scale=1.0):
    """q, k, v, do (unit normal; q and k times scale)."""
    g = torch.Generator().manual_seed(seed)
    shape_k = shape_k or shape_q
    q = (torch.randn(shape_q, generator=g) * scale).to(dtype=dtype, device=device)
    k = (torch.randn(shape_k, generator=g) * scale).to(dtype=dtype, device=device)
    v = torch.randn(shape_k, generator=g).to(dtype=dtype, device=device)
    do = torch.randn(shape_q, generator=g).to(dtype=dtype, device=device)
    return q, k, v, do


def _args(shape=(2, 3, 40, 64), dtype=torch.bfloat16):
    q, k, v, do = _inputs(shape, dtype=dtype)
    return dict(q=q, k=k, v=v, o=torch.empty_like(q), do=do, lse=torch.zeros(q.shape[:-1]))


@pytest.mark.parametrize("case,match", [
    ("fp32", "bf16/fp16"),
    ("mixed dtypes", "bf16/fp16"),
    ("head dim 48", "head dim must be one of"),
    ("k, v shapes differ", "k and v must be"),
    ("2-D", r"\(B, H, N, d\)"),
    ("do shape", "do must match q's shape"),
    ("o dtype", "o must match q's shape .* and dtype"),
    ("lse dtype", "lse must be float32"),
    ("lse shape", "lse must be float32 of shape"),
    ("do not innermost", "do needs unit stride along the head dim"),
    ("q row stride not 16 B", "multiples of 16 bytes"),
])
def test_gluon_backward_names_the_broken_constraint(case, match):
    a = _args()
    if case == "fp32":
        a = _args(dtype=torch.float32)
    elif case == "mixed dtypes":
        a["v"] = a["v"].half()
    elif case == "head dim 48":
        a = _args((2, 3, 40, 48))
    elif case == "k, v shapes differ":
        a["v"] = a["v"][:, :, :30]
    elif case == "2-D":
        a = {n: t[0, 0] for n, t in a.items()}
    elif case == "do shape":
        a["do"] = a["do"][:, :, :30]
    elif case == "o dtype":
        a["o"] = a["o"].half()
    elif case == "lse dtype":
        a["lse"] = a["lse"].double()
    elif case == "lse shape":
        a["lse"] = a["lse"][..., :30]
    elif case == "do not innermost":
        a["do"] = a["do"].transpose(-1, -2).contiguous().transpose(-1, -2)
    elif case == "q row stride not 16 B":  # rows 68 elements apart: 136 bytes
        a["q"] = torch.randn(2, 3, 40, 68).to(torch.bfloat16)[..., :64]
    with pytest.raises(ValueError, match=f"^flash_gluon_backward: .*{match}"):
        bwd.flash_gluon_backward(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True)


def test_gluon_backward_refuses_other_devices():
    """Valid inputs off an sm_90 GPU: a RuntimeError that says what the kernel needs."""
    a = _args()
    with pytest.raises(RuntimeError, match="^flash_gluon_backward .*sm_90"):
        bwd.flash_gluon_backward(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], False)


def test_gluon_backward_refuses_configs_over_shared_memory():
    a = _args((1, 2, 40, 128))
    q = a["q"]
    config = bwd.GluonBwdConfig(64, 128, 8, 4)  # 64 KB K/V + 4 x 32 KB ring + 16 + 32 KB > 227 KB
    with pytest.raises(ValueError, match="shared memory"):
        bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], torch.empty(q.shape), torch.empty_like(q),
                        torch.empty_like(q), True, config)


@pytest.mark.parametrize("d,num_stages,fits", [(128, 2, True), (128, 3, False), (96, 3, True), (64, 4, True)])
def test_gluon_backward_dq_stages_refused_by_name_where_a_second_staging_tile_does_not_fit(d, num_stages, fits):
    """dq_stages 2 adds one fp32 staging tile (block_m x d x 4 B): at d 128 the default 2-slot ring fits
    (180,264 + 32,768 = 213,032 B), the 3-slot one does not (245,840 B predicted, > 232,448) while it fits with one
    staging tile: the refusal names dq_stages and what dq_stages=1 needs."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    a = _args((1, 2, 40, d))
    q = a["q"]
    config = bwd.GluonBwdConfig(64, 128, 8, num_stages, dq_stages=2)
    assert bwd.shared_bytes(d, config) == bwd.shared_bytes(d, bwd.GluonBwdConfig(64, 128, 8, num_stages)) + 64 * d * 4
    assert (bwd.shared_bytes(d, config) <= SM90_MAX_SHARED) == fits
    call = lambda: bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], torch.empty(q.shape),  # noqa: E731
                                   torch.empty_like(q), torch.empty_like(q), True, config)
    if fits:
        grid, args, opts = call()
        assert args[-1] == 2 and args[-2] is True  # DQ_STAGES after DQ
        return
    with pytest.raises(ValueError, match=r"^flash_gluon_backward: dq_stages=2 needs 245840 bytes .* dq_stages=1 "
                                         r"needs 213072"):
        call()


@pytest.mark.parametrize("fields,match", [(dict(block_n=32), "block_n"), (dict(num_warps=4), "block_n"),
                                          (dict(block_m=32), "block_m"), (dict(num_stages=5), "num_stages"),
                                          (dict(dq="bulk"), "dq must be"), (dict(dq_stages=3), "dq_stages"),
                                          (dict(dq_stages=0), "dq_stages"),
                                          (dict(dq="triton", dq_stages=2), "dq_stages .* only with dq='reduce'"),
                                          (dict(dq="gluon", dq_stages=2), "dq_stages"),
                                          (dict(dq="atomic", dq_stages=2), "dq_stages .* only with dq='reduce' "
                                                                           r"\(dq='atomic' stages nothing\)"),
                                          (dict(dq="triton", rebuild=True), "rebuild is for the one-pass kernel"),
                                          (dict(dq="gluon", rebuild=True), "rebuild is for the one-pass kernel"),
                                          (dict(dq="triton", refill_first=True), "refill_first .* dq='reduce' only"),
                                          (dict(dq="gluon", refill_first=True), "refill_first .* dq='reduce' only"),
                                          (dict(dq="atomic", refill_first=True), "refill_first .* dq='reduce' only"),
                                          (dict(prefetch=1), "prefetch and refill_first must be bools"),
                                          (dict(refill_first="yes"), "prefetch and refill_first must be bools")])
def test_gluon_backward_config_refuses_what_it_cannotrun_without_interpreter(fields, match):
    with pytest.raises(ValueError, match=match):
        bwd.GluonBwdConfig(**fields)


def test_gluon_backward_launch_args():
    """One program per key tile and (batch, head); the scale and its base-2 form as the forwards pass
    them; 14 descriptors, the hi halves None at d 128 and set at d 80 (64 + 16)."""
    for d, hi in ((128, False), (80, True)):
        a = _args((2, 3, 1000, d))
        q = a["q"]
        grid, args, opts = bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], torch.empty(q.shape),
                                           torch.empty_like(q), torch.empty_like(q), True, bwd.GluonBwdConfig())
        assert grid == (8, 6) and opts == {"num_warps": 8}
        assert all(x is not None for x in args[:7]) and all((x is not None) == hi for x in args[7:14])
        assert args[19] == pytest.approx(1.4426950408889634 / math.sqrt(d)) and args[20] == pytest.approx(d ** -0.5)
        assert args[-2:] == (True, 1)  # DQ (dq "reduce"), DQ_STAGES (one staging tile by default)


def test_gluon_backward_launch_args_dq_atomic():
    """dq "atomic" (stage 3e): no dQ descriptor (the lo and hi slots None), the fp32 buffer itself appended as dq_ptr
    (4-D, the caller's storage) after DQ and DQ_STAGES, then DQ_ATOMIC; shared memory without the staging tile."""
    for d in (128, 80):
        a = _args((2, 3, 1000, d))
        q = a["q"]
        dq32 = torch.empty(q.shape)
        grid, args, opts = bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], dq32, torch.empty_like(q),
                                           torch.empty_like(q), True, bwd.GluonBwdConfig(dq="atomic"))
        assert grid == (8, 6) and opts == {"num_warps": 8}
        assert args[4] is None and args[11] is None  # dq_desc, dqh_desc
        assert args[-4:-2] == (True, 1) and args[-1] is True  # DQ, DQ_STAGES, ..., DQ_ATOMIC
        assert args[-2].shape == (2, 3, 1000, d) and args[-2].data_ptr() == dq32.data_ptr()
        assert bwd.shared_bytes(d, bwd.GluonBwdConfig(dq="atomic")) == \
            bwd.shared_bytes(d, bwd.GluonBwdConfig()) - 64 * d * 4


def test_gluon_backward_launch_args_rebuild():
    """rebuild (stage 4b) appends REBUILD after the kernel's defaults for dq_ptr / DQ_ATOMIC (dq "reduce") or after
    the buffer and DQ_ATOMIC (dq "atomic"); everything before it is the plain config's; shared memory unchanged (the
    one-slot rings are the same tiles); 2^30 query rows and more refused by name (the slot index is row >> 30)."""
    a = _args((2, 3, 1000, 128))
    q = a["q"]
    for dq in ("reduce", "atomic"):
        dq32 = torch.empty(q.shape)
        plain = bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], dq32, torch.empty_like(q),
                                torch.empty_like(q), True, bwd.GluonBwdConfig(dq=dq))
        grid, args, opts = bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], dq32, torch.empty_like(q),
                                           torch.empty_like(q), True, bwd.GluonBwdConfig(dq=dq, rebuild=True))
        assert (grid, opts) == plain[::2] and args[-1] is True
        n = len(plain[1])
        assert len(args) == n + (3 if dq == "reduce" else 1)
        for x, y in zip(args[:n], plain[1]):  # the same arguments: scalars equal, tensors / descriptors of one kind
            assert type(x) is type(y) and (x == y if isinstance(x, (bool, int, float, type(None))) else True), (x, y)
        if dq == "reduce":
            assert args[-3:-1] == (None, False)
        for d in HEAD_DIMS:
            assert bwd.shared_bytes(d, bwd.GluonBwdConfig(dq=dq, rebuild=True)) == \
                bwd.shared_bytes(d, bwd.GluonBwdConfig(dq=dq))
    big = torch.empty(1, 1, 1 << 30, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="rebuild views the resident tiles through slot"):
        bwd.launch_args(big, big, big, big, torch.empty(1, 1, 1 << 30, device="meta"),
                        torch.empty(1, 1, 1 << 30, device="meta"), torch.empty(big.shape, device="meta"),
                        big, big, True, bwd.GluonBwdConfig(rebuild=True))


@pytest.mark.parametrize("dq", ["reduce", "atomic", "triton", "gluon"])
def test_gluon_backward_launch_args_prefetch_and_refill_first(dq):
    """Stage 4c: prefetch appends PREFETCH (refill_first REFILL_FIRST after it) behind the kernel's defaults for the
    optional arguments before it (dq_ptr, DQ_ATOMIC, REBUILD; dq "atomic": its buffer and True); the arguments before
    those are the plain config's. shared_bytes adds the two 2-slot fp32 rings (16 x block_m bytes), every head dim."""
    a = _args((2, 3, 1000, 128))
    q = a["q"]
    dq32 = torch.empty(q.shape) if dq in ("reduce", "atomic") else None

    def call(**fields):
        return bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], dq32, torch.empty_like(q),
                               torch.empty_like(q), True, bwd.GluonBwdConfig(dq=dq, **fields))

    plain = call()
    assert len(plain[1]) == (31 if dq == "atomic" else 29)  # dq "atomic": + dq_ptr, DQ_ATOMIC
    grid, args, opts = call(prefetch=True)
    assert (grid, opts) == plain[::2] and len(args) == 33
    for x, y in zip(args[:29], plain[1]):  # the same arguments: scalars equal, tensors / descriptors of one kind
        assert type(x) is type(y) and (x == y if isinstance(x, (bool, int, float, type(None))) else True), (x, y)
    if dq == "atomic":
        assert args[29].data_ptr() == dq32.data_ptr() and args[30] is True
    else:
        assert args[29] is None and args[30] is False
    assert args[31:] == (False, True)  # REBUILD at its default, PREFETCH
    if dq in ("reduce", "atomic"):
        assert call(rebuild=True, prefetch=True)[1][31:] == (True, True)
    if dq == "reduce":
        assert call(rebuild=True, prefetch=True, refill_first=True)[1][31:] == (True, True, True)
        assert call(refill_first=True)[1][31:] == (False, False, True)  # REBUILD, PREFETCH at their defaults
    for d in HEAD_DIMS:
        cfg = bwd.GluonBwdConfig(dq=dq)
        assert bwd.shared_bytes(d, replace(cfg, prefetch=True)) == bwd.shared_bytes(d, cfg) + 16 * 64


@pytest.mark.parametrize("case,match", [("no buffer", "dq32 is the fp32 dQ buffer of dq='reduce' or 'atomic'"),
                                        ("strided buffer", "dq='atomic' adds into dq32 by row offsets"),
                                        ("bf16 buffer", "dq='atomic' adds into dq32 by row offsets")])
def test_gluon_backward_dq_atomic_refuses_by_name(case, match):
    """dq "atomic" addresses the buffer as contiguous fp32 rows of q's shape: the launcher refuses anything
    else, naming dq='atomic'; without a buffer it refuses as dq "reduce" does."""
    a = _args((1, 2, 40, 64))
    q = a["q"]
    dq32 = {"no buffer": None, "strided buffer": torch.empty(1, 40, 2, 64).transpose(1, 2),
            "bf16 buffer": torch.empty(q.shape, dtype=torch.bfloat16)}[case]
    with pytest.raises(ValueError, match=f"^flash_gluon_backward: {match}"):
        bwd.launch_args(q, a["k"], a["v"], a["do"], a["lse"], a["lse"], dq32, torch.empty_like(q), torch.empty_like(q),
                        True, bwd.GluonBwdConfig(dq="atomic"))


def test_gluon_backward_passes_options_to_the_triton_dq(monkeypatch):
    """dq "triton": the caller's FlashOptions reach the Triton dQ launch (tools/probes/flash_ncu_bwd.py
    pins its config through them); None stays None (the launch's defaults). Launches stubbed, CPU."""
    from impl.attention.flash_options import FlashOptions, with_configs

    seen = []
    monkeypatch.setattr(bwd, "check_device", lambda *a: None)
    monkeypatch.setattr(bwd, "_triton_dq", lambda *a: seen.append(a[-1]))
    monkeypatch.setattr(bwd, "_attn_bwd_sm90", type("Stub", (), {"__getitem__": lambda s, g: lambda *a, **k: None})())
    a = _args((1, 2, 40, 128))
    pinned = with_configs(FlashOptions(), q=[(128, 64, 8, 3)])
    for options in (pinned, None):
        bwd.flash_gluon_backward(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True,
                                 bwd.GluonBwdConfig(dq="triton"), options)
    assert seen == [pinned, None]


def test_gluon_backward_is_off_the_default_paths():
    """Issue 47 wires the kernels in at stage 4: until then importing the attention package, the
    Triton path and the model does not import it."""
    out = run_without_interpreter("import sys, impl.attention, impl.attention.flash_triton, impl.model\n"
               "print(*(f'impl.attention.{m}' in sys.modules for m in ('flash_gluon_bwd', 'flash_gluon_bwd_ws', "
               "'flash_gluon_dq')))")
    assert out.split() == ["False", "False", "False"]


# ----------------------------------------------------------------------------- GPU (unrun until a GPU session)

def rel_err(out, ref):
    """||out - ref|| / max(||ref||, 0.1 sqrt(numel)), as correctness/test_attention.py measures."""
    ref = ref.double().cpu()
    floor = 0.1 * math.sqrt(max(ref.numel(), 1))
    return ((out.double().cpu() - ref).norm() / max(ref.norm().item(), floor)).item()


TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # test_attention.py's tolerances by dtype


def reference_grads(q, k, v, do, o, is_causal):
    """float64 on the CPU: (dq, dk, dv), causal top-left aligned, D = rowsum(dO·O) from the o the
    forward stored (test_attention.py's convention: O's rounding is no backward's error)."""
    q, k, v, do, o = (x.detach().cpu().double() for x in (q, k, v, do, o))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q @ k.transpose(-2, -1) * scale
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    p = torch.softmax(s, dim=-1)
    ds = p * (do @ v.transpose(-2, -1) - (do * o).sum(-1, keepdim=True))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, p.transpose(-2, -1) @ do


def forward(kind, q, k, v, is_causal):
    """(o, lse) of one of the forwards the backward pairs with."""
    if kind == "triton":
        from impl.attention.flash_launch import flash_attention_triton_forward
        from impl.attention.flash_options import FlashOptions

        return flash_attention_triton_forward(q, k, v, is_causal, options=FlashOptions(autotune=False))
    if kind == "stage1":
        from impl.attention.flash_gluon import flash_gluon_forward

        return flash_gluon_forward(q, k, v, is_causal)
    from impl.attention.flash_gluon_ws import flash_gluon_ws_forward

    return flash_gluon_ws_forward(q, k, v, is_causal)


def check(q, k, v, do, is_causal, fwd="triton", config=None, tol=None):
    o, lse = forward(fwd, q, k, v, is_causal)
    dq, dk, dv = bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal, config)
    for g, x in ((dq, q), (dk, k), (dv, v)):
        assert g.shape == x.shape and g.dtype == x.dtype and g.device == x.device
        assert torch.isfinite(g).all()
    ref = reference_grads(q, k, v, do, o, is_causal)
    errs = {n: rel_err(g, r) for n, g, r in zip(("dq", "dk", "dv"), (dq, dk, dv), ref)}
    tol = tol or TOL[q.dtype]
    assert all(e < tol for e in errs.values()), f"rel errors above {tol}: {errs}"
    return dq, dk, dv


# (B, H, N_Q, N_K): ragged lengths; 1000 queries are 16 tiles of 64, so the 2-slot ring wraps 8 times.
SHAPES = [(2, 3, 300, 300), (1, 2, 1000, 1000), (2, 2, 200, 333), (1, 3, 257, 129)]


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fields", [None, dict(dq_stages=2), dict(dq="atomic"), dict(rebuild=True),
                                    dict(dq="atomic", rebuild=True), dict(prefetch=True),
                                    dict(rebuild=True, prefetch=True, refill_first=True),
                                    dict(dq="atomic", rebuild=True, prefetch=True), dict(dq="triton", prefetch=True),
                                    dict(dq="gluon", prefetch=True)],
                         ids=["default", "dq_stages2", "dq_atomic", "rebuild", "dq_atomic_rebuild", "prefetch",
                              "rebuild_prefetch_refill_first", "dq_atomic_rebuild_prefetch", "dq_triton_prefetch",
                              "dq_gluon_prefetch"])
def test_gluon_backward_gpu_matches_reference(fields, shape, d, is_causal, dtype):
    """The default config at each head dim, stage 3d's one-pass kernel with two dQ staging tiles used in
    turn (dq_stages 2; at d 128 too, where one pass is not the default) and stage 3e's with dQ added by atomics
    from registers (dq "atomic", every d), and stage 4b's one-pass kernels (reduce, atomic) with their resident
    tiles' descriptors rebuilt each query tile (rebuild), and stage 4c's row statistics prefetched by cp.async
    (prefetch, every dq mode; with the refill before the dQ reduce-add, refill_first), against the same float64
    reference. 1000 queries: 16 query tiles a key tile, so the staging tiles (and the statistics' ring slots)
    alternate 8 times each; 300, 200 and 257 queries: a ragged query tile (the masked atomics, the zero-filled
    statistics)."""
    B, H, n_q, n_k = shape
    config = None if fields is None else bwd.GluonBwdConfig(**fields)
    check(*_inputs((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda"), is_causal, config=config)


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_backward_gpu_dkdv_only_with_triton_dq(shape, d, is_causal):
    """dq "triton": this kernel for dK and dV, the Triton dQ kernel (which writes D) for dQ."""
    B, H, n_q, n_k = shape
    check(*_inputs((B, H, n_q, d), (B, H, n_k, d), torch.bfloat16, "cuda"), is_causal,
          config=bwd.GluonBwdConfig(dq="triton"))


@gpu
@needs_sm90
@pytest.mark.parametrize("fwd", ["stage1", "ws"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gluon_backward_gpu_pairs_with_the_gluon_forwards(d, is_causal, fwd):
    """o and lse from the stage-1 and stage-2 Gluon forwards (same natural-log lse contract)."""
    check(*_inputs((2, 3, 1000, d), dtype=torch.bfloat16, device="cuda"), is_causal, fwd=fwd)


def _config_id(c) -> str:
    dq_tiles = "-" + "x".join(map(str, c.dq_tiles)) if c.dq == "gluon" else ""
    dq_stages = f"-dq-stages{c.dq_stages}" if c.dq_stages > 1 else ""
    rebuild = "-rebuild" if c.rebuild else ""
    rebuild += ("-prefetch" if c.prefetch else "") + ("-refill-first" if c.refill_first else "")  # stage 4c
    return f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}-dq-{c.dq}{dq_tiles}{dq_stages}{rebuild}"


#: The variants the ragged, long and NaN-poisoned tests run besides the default: stage 3c's dQ kernel and
#: stage 3d's two dQ staging tiles (dq "reduce", at d 128 too), stage 3e's dQ by atomics (dq "atomic"), stage 4b's
#: one-pass kernels with descriptors rebuilt each query tile (rebuild, dq "reduce" and "atomic"), stage 4c's row
#: statistics prefetched (the split, the rebuilt reduce kernel with refill_first, the rebuilt atomic one).
EXTRA_VARIANTS = {"dq-gluon": dict(dq="gluon"), "dq-stages2": dict(dq_stages=2), "dq-atomic": dict(dq="atomic"),
                  "rebuild": dict(rebuild=True), "dq-atomic-rebuild": dict(dq="atomic", rebuild=True),
                  "dq-triton-prefetch": dict(dq="triton", prefetch=True),
                  "rebuild-prefetch-refill-first": dict(rebuild=True, prefetch=True, refill_first=True),
                  "dq-atomic-rebuild-prefetch": dict(dq="atomic", rebuild=True, prefetch=True)}


def _variant_config(name):
    return None if name == "default" else bwd.GluonBwdConfig(**EXTRA_VARIANTS[name])


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [80, 128])
@pytest.mark.parametrize("config", bwd.CANDIDATE_CONFIGS, ids=_config_id)
def test_gluon_backward_gpu_candidate_configs(config, d, is_causal):
    """Each config the probe times is correct (those over shared memory are refused, not run)."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    q, k, v, do = _inputs((2, 2, 1000, d), dtype=torch.bfloat16, device="cuda")
    if bwd.shared_bytes(d, config) > SM90_MAX_SHARED:
        o, lse = forward("triton", q, k, v, is_causal)
        with pytest.raises(ValueError, match="shared memory"):
            bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal, config)
        return
    check(q, k, v, do, is_causal, config=config)


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", ["default", *EXTRA_VARIANTS])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_gluon_backward_gpu_ragged_keys_with_very_negative_scores(d, is_causal, variant):
    """Every score of every row below -100, so lse < -100: a padded key row (K = 0, score 0) would
    get P = exp(-lse) = inf, and dQ = dS·K would take inf·0 = NaN from it unless the ragged key tile
    masks it (n_k = 37 and 200 are not multiples of 128).

    The magnitude is in Q, not K: keys sharing a large common component make dQ = Σ_j dS_j·K_j cancel
    (Σ_j dS_j = 0), and dS rounded to bf16 for the MMA alone then costs ~2e-2 relative error in dQ,
    any kernel's floor (float64 emulation; an H100 run failed the bf16 tolerance by that, 2.09e-2 at
    d 128). Large queries keep every score below -100 with a floor of ~3e-3. dq "gluon": the Gluon dQ
    kernel's masked loop instance (keys past N_K) is what must keep its dQ finite."""
    g = torch.Generator().manual_seed(4)
    direction = F.normalize(torch.randn(d, generator=g), dim=0)
    for n_q, n_k in ((40, 37), (300, 200)):
        q = 13 * math.sqrt(d) * direction + 0.1 * torch.randn(1, 2, n_q, d, generator=g)
        k = -13 * direction + torch.randn(1, 2, n_k, d, generator=g)
        v, do = torch.randn(1, 2, n_k, d, generator=g), torch.randn(1, 2, n_q, d, generator=g)
        q, k, v, do = (t.to(device="cuda", dtype=torch.bfloat16) for t in (q, k, v, do))
        check(q, k, v, do, is_causal, config=_variant_config(variant))


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gluon_backward_gpu_strided_and_3d_inputs(d, is_causal):
    """(B, N, H, d) storage (a model's projections) and 3-D inputs run the same code on the same
    values: dK and dV bit-identical to contiguous 4-D inputs (one program owns each key tile); dQ is
    summed by reduce-adds in whatever order the programs reach them, so only close."""
    B, H, n = 2, 3, 300
    q, k, v, do = (x.transpose(1, 2) for x in _inputs((B, n, H, d), dtype=torch.bfloat16, device="cuda"))
    assert not q.is_contiguous()
    o, lse = forward("triton", q, k, v, is_causal)
    dq, dk, dv = bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal)
    c = [x.contiguous() for x in (q, k, v, o, do)]
    dq_c, dk_c, dv_c = bwd.flash_gluon_backward(*c, lse, is_causal)
    assert torch.equal(dk, dk_c) and torch.equal(dv, dv_c)
    torch.testing.assert_close(dq, dq_c, rtol=1e-2, atol=1e-2)
    dq3, dk3, dv3 = bwd.flash_gluon_backward(q[:, 0], k[:, 0], v[:, 0], o[:, 0], do[:, 0], lse[:, 0], is_causal)
    assert dq3.shape == q[:, 0].shape and torch.equal(dk3, dk_c[:, 0]) and torch.equal(dv3, dv_c[:, 0])


@gpu
@needs_sm90
@pytest.mark.parametrize("variant", ["default", *EXTRA_VARIANTS])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gluon_backward_gpu_long_sequences_match_triton(is_causal, variant):
    """4096 queries and keys at d 128 (64 query tiles per key tile: the ring wraps 32 times, 32
    programs add into each dQ tile; dq "gluon": 64 key tiles per query tile through the dQ kernel's
    3-slot ring; dq-stages2: the two staging tiles alternate 32 times a program) against the Triton two-pass
    backward."""
    from impl.attention.flash_launch import flash_attention_triton_backward
    from impl.attention.flash_options import FlashOptions

    q, k, v, do = _inputs((2, 4, 4096, 128), dtype=torch.bfloat16, device="cuda")
    o, lse = forward("triton", q, k, v, is_causal)
    got = bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal, _variant_config(variant))
    want = flash_attention_triton_backward(q, k, v, o, do, lse, is_causal, options=FlashOptions(autotune=False))
    for n, g, w in zip(("dq", "dk", "dv"), got, want[:3]):
        assert rel_err(g, w) < TOL[torch.bfloat16], (n, rel_err(g, w))


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [80, 128])
@pytest.mark.parametrize("dq", ["reduce", "triton", "gluon", "reduce-stages2", "atomic", "reduce-rebuild",
                                "atomic-rebuild", "dq-triton-prefetch", "rebuild-prefetch-refill-first",
                                "dq-atomic-rebuild-prefetch"])
def test_gluon_backward_gpu_writes_every_element(d, is_causal, dq, monkeypatch):
    """Every torch.empty is NaN-poisoned (as test_attention.py does): the launcher's outputs (dK, dV,
    dQ or the fp32 dQ buffer, D) must have every element written or zeroed by a kernel (the ragged key
    tile's rows, the dQ rows every program adds into; dq "gluon": D, which the dQ kernel writes and
    the dK/dV kernel reads, and the ragged query tile's dQ rows)."""
    q, k, v, do = _inputs((2, 3, 333, d), (2, 3, 200, d), dtype=torch.bfloat16, device="cuda", seed=3)
    o, lse = forward("triton", q, k, v, is_causal)
    orig_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = orig_empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    if dq in EXTRA_VARIANTS:  # stage 4c's
        config = _variant_config(dq)
    elif dq == "reduce-stages2":
        config = bwd.GluonBwdConfig(dq_stages=2)
    elif dq.endswith("-rebuild"):
        config = bwd.GluonBwdConfig(dq=dq[:-len("-rebuild")], rebuild=True)
    else:
        config = bwd.GluonBwdConfig(dq=dq)
    dq_, dk, dv = bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal, config)
    monkeypatch.undo()
    assert torch.isfinite(dq_).all() and torch.isfinite(dk).all() and torch.isfinite(dv).all()
    ref = reference_grads(q, k, v, do, o, is_causal)
    assert all(rel_err(g, r) < TOL[torch.bfloat16] for g, r in zip((dq_, dk, dv), ref))


# ----------------------------------------------------------------------------- CPU: the schedule, emulated

def _emulate(q, k, v, do, o, lse, is_causal, config):
    """The kernel's schedule in float64 torch, line for line with _attn_bwd_sm90 / _q_loop: per key
    tile the query tiles from j0 (causal: the tile holding query n0) with the first n_diag masked,
    zero-filled rows past N_Q / N_K, the key mask only in the ragged key tile's program, P in base 2
    from the natural-log lse, dQ accumulated tile by tile as the reduce-adds do. A check of the
    kernel's index arithmetic and conventions that runs on the CPU (the kernel itself cannot)."""
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    bm, bn = config.block_m, config.block_n
    log2e = 1.4426950408889634
    sm_scale = 1 / math.sqrt(d)
    qk_scale = sm_scale * log2e
    n_m = -(-n_q // bm)
    pad_q, pad_k = n_m * bm - n_q, -(-n_k // bn) * bn - n_k
    zq = lambda x: F.pad(x, (0, 0, 0, pad_q))  # noqa: E731 - TMA's zero fill
    zk = lambda x: F.pad(x, (0, 0, 0, pad_k))  # noqa: E731
    q_, do_, k_, v_ = zq(q), zq(do), zk(k), zk(v)
    delta = (o * do).sum(-1)
    lse_, delta_ = F.pad(lse, (0, pad_q)), F.pad(delta, (0, pad_q))  # masked loads, other=0
    dq, dk, dv = torch.zeros_like(q_), torch.zeros_like(k_), torch.zeros_like(v_)
    for pid_n in range(-(-n_k // bn)):
        n0 = pid_n * bn
        if is_causal:
            j0 = min(n0 // bm, n_m)
            n_t = n_m - j0
            n_diag = min(bn // bm, n_t)
        else:
            j0, n_t, n_diag = 0, n_m, 0
        offs_n = torch.arange(n0, n0 + bn)
        kt, vt = k_[:, :, n0:n0 + bn], v_[:, :, n0:n0 + bn]
        for t in range(n_t):
            m0 = (j0 + t) * bm
            offs_m = torch.arange(m0, m0 + bm)
            qt, dot = q_[:, :, m0:m0 + bm], do_[:, :, m0:m0 + bm]
            st = kt @ qt.transpose(-1, -2)
            pt = torch.exp2(st * qk_scale - lse_[:, :, None, m0:m0 + bm] * log2e)
            if t < n_diag:
                pt = torch.where(offs_m[None, :] >= offs_n[:, None], pt, 0.0)
            if t < n_diag or n0 + bn > n_k:
                pt = torch.where((offs_n < n_k)[:, None], pt, 0.0)
            dv[:, :, n0:n0 + bn] += pt @ dot
            dst = pt * (vt @ dot.transpose(-1, -2) - delta_[:, :, None, m0:m0 + bm])
            dk[:, :, n0:n0 + bn] += dst @ qt
            dq[:, :, m0:m0 + bm] += dst.transpose(-1, -2) @ kt * sm_scale
    return dq[:, :, :n_q], dk[:, :, :n_k] * sm_scale, dv[:, :, :n_k]


def _emulation_problem(shape, is_causal, very_negative, seed):
    """float64 inputs at d 32 for the tile-schedule emulations, with o, lse and the reference (dq, dk, dv).
    very_negative: every score near -1000, lse < -710, so exp(-lse) of a padded key overflows float64."""
    B, H, n_q, n_k = shape
    q, k, v, do = (x.double() for x in _inputs((B, H, n_q, 32), (B, H, n_k, 32), torch.float32, seed=seed))
    if very_negative:
        direction = F.normalize(torch.randn(32, generator=torch.Generator().manual_seed(6), dtype=torch.float64), dim=0)
        q, k = 40 * direction + 0.1 * q, -25 * math.sqrt(32) * direction + 0.1 * k
    s = q @ k.transpose(-2, -1) / math.sqrt(32)
    if is_causal:
        s = s.masked_fill(~torch.ones(n_q, n_k, dtype=torch.bool).tril(), float("-inf"))
    lse, o = torch.logsumexp(s, -1), torch.softmax(s, -1) @ v
    return q, k, v, do, o, lse, reference_grads(q, k, v, do, o, is_causal)


@pytest.mark.parametrize("very_negative", [False, True], ids=["normal", "very-negative"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES + [(1, 1, 129, 300), (1, 2, 64, 64)], ids=lambda s: "x".join(map(str, s)))
def test_gluon_backward_schedule_emulated_on_cpu(shape, is_causal, very_negative):
    """The kernel's tile schedule and conventions (emulated: _emulate) give the reference gradients,
    for ragged lengths, N_Q != N_K both ways, one tile, both tile shapes of the candidates, and scores
    so negative that a padded key's P overflows (the key mask of the ragged key tile)."""
    q, k, v, do, o, lse, ref = _emulation_problem(shape, is_causal, very_negative, seed=5)
    for config in (bwd.GluonBwdConfig(), bwd.GluonBwdConfig(64, 64, 4, 2)):
        got = _emulate(q, k, v, do, o, lse, is_causal, config)
        for n, g, r in zip(("dq", "dk", "dv"), got, ref):
            assert torch.isfinite(g).all(), n
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-9, msg=n)


# ----------------------------------------------------------------------------- stage 3c: the Gluon dQ kernel

_COMPILE_DQ = r"""
import json, sys, torch
from impl.attention import flash_gluon_bwd as bwd
from impl.attention import flash_gluon_dq as mod

fn = mod._attn_bwd_dq_sm90
from kits.sm90_compile import compile_for_sm90, cubin_figures

def compile_sm90(d, causal, tiles, dtype):
    q, k, v, o, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(5))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.dq_launch_args(q, k, v, o, do, lse, delta, torch.empty_like(q), causal, tiles)
    return compile_for_sm90(fn, args, opts, divisible=("O", "L", "Delta"))

rows = []
def add(d, causal, tiles, dtype=torch.bfloat16):
    row = dict(d=d, causal=causal, tiles=list(tiles), dtype=str(dtype)[6:], predicted=mod.dq_shared_bytes(d, tiles))
    try:
        ck = compile_sm90(d, causal, tiles, dtype)
    except ValueError as e:
        rows.append(dict(row, refused=str(e)))
        return
    rows.append(dict(row, **cubin_figures(ck)))

default = bwd.GluonBwdConfig(dq="gluon").dq_tiles
for d in (64, 80, 96, 128):
    for causal in (False, True):
        add(d, causal, default)
add(128, True, default, torch.float16)
for config in bwd.CANDIDATE_CONFIGS:
    if config.dq == "gluon" and config.dq_tiles != default:
        add(128, True, config.dq_tiles)
add(128, True, (64, 64, 4))  # one warpgroup
add(128, True, (128, 128, 3))  # over the limit: refused
print(json.dumps(rows))
"""

#: HGMMA instructions per key-tile loop body (one warpgroup's view: m64 per instruction, k16 steps):
#: S and dP are d/16 k-steps each, dQ block_n/16 (two accumulators at split d, each block_n/16).
def _dq_hgmma_per_tile(d, block_n):
    lo, hi = (64, d - 64) if d in (80, 96) else (d, 0)
    return 2 * (lo // 16 + hi // 16) + block_n // 16 * (2 if hi else 1)


def test_gluon_dq_compiles_for_hopper():
    """Stage 3c's dQ kernel (flash_gluon_dq) at every head dim, causal and full, at GluonBwdConfig(dq=
    "gluon")'s tiles (bf16; fp16 at d 128) and the other candidate tiles at d 128 causal: compiles for
    sm_90a, no local memory and no stack at all (the fp32 dQ accumulator is 64 of the registers at
    d 128, S and dP 32 each at 64 keys), shared memory what dq_shared_bytes predicts, its products
    on wgmma (no HMMA) with the HGMMA count of two loop instances of S + dP + dQ, Q/dO/K/V through
    TMA loads, dQ through TMA stores, no reduce; tiles over 227 KB refused by the launcher."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_DQ))
    print_compile_table(rows, [*_LEAD, ("tiles", "<14", "{tiles!s:<14}"), ("dtype", "<9", "{dtype:<9}"),
                               *_FIGURES[:4], ("TMA ld/st", ">9", "{tma_loads:>5}/{tma_stores:<3}"), *_FIGURES[4:]],
                        refused="refused: {predicted} B")
    assert {(r["d"], r["causal"]) for r in rows} == {(d, c) for d in HEAD_DIMS for c in (False, True)}
    refused = [r for r in rows if "refused" in r]
    assert [r["tiles"] for r in refused] == [[128, 128, 3]], refused
    assert refused[0]["refused"].startswith("flash_gluon_backward: the dQ kernel's tiles (128, 128, 3) needs")
    for r in rows:
        if "refused" in r:
            assert r["predicted"] > SM90_MAX_SHARED, r
            continue
        assert r["target"] == "sm_90a" and r["warps"] == r["tiles"][0] // 16, r
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, f"spills: {r}"
        assert r["regs"] <= 255, r
        assert r["predicted"] - 16 < r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        assert r["hmma"] == 0 and r["hgmma"] == 2 * _dq_hgmma_per_tile(r["d"], r["tiles"][1]), r
        split = r["d"] in (80, 96)
        # Q, dO once; K, V in the prologue's NUM_STAGES - 1 slots and in each loop instance's refill.
        assert r["tma_loads"] == (2 + 2 * (r["tiles"][2] - 1) + 2 * 2) * (2 if split else 1), r
        assert r["tma_stores"] == (2 if split else 1) and r["tma_reduce"] == 0, r


def test_gluon_dq_launch_args():
    """One program per query tile and (batch, head), block_m / 16 warps; descriptors Q, K, V, dQ, their
    hi halves, dO and its hi half (None at d 128, set at d 80); O by pointer with its own strides."""
    from impl.attention import flash_gluon_dq as gdq

    for d, hi in ((128, False), (80, True)):
        q, k, v, do = _inputs((2, 3, 1000, d))
        o = torch.empty(2, 1000, 3, d, dtype=q.dtype).transpose(1, 2)  # (B, N, H, d) storage
        lse = torch.zeros(q.shape[:-1])
        for tiles, grid in (((128, 64, 3), (8, 6)), ((64, 128, 3), (16, 6))):
            g, args, opts = gdq.dq_launch_args(q, k, v, o, do, lse, lse, torch.empty_like(q), True, tiles)
            assert g == grid and opts == {"num_warps": tiles[0] // 16}
            assert all(x is not None for x in args[:4]) and all((x is not None) == hi for x in args[4:8])
            assert args[8] is not None and (args[9] is not None) == hi
            assert args[10] is o and args[13:17] == o.stride()
            assert args[20] == pytest.approx(1.4426950408889634 / math.sqrt(d))
            assert args[21] == pytest.approx(d ** -0.5)
            assert args[22:] == (tiles[0], tiles[1], 64 if hi else 128, d - 64 if hi else 0, True, tiles[2])


@pytest.mark.parametrize("fields", [dict(dq_tiles=(32, 64, 3)), dict(dq_tiles=(128, 256, 3)),
                                    dict(dq_tiles=(128, 64, 1)), dict(dq_tiles=(128, 64, 5))])
def test_gluon_dq_config_refuses_what_it_cannotrun_without_interpreter(fields):
    with pytest.raises(ValueError, match="dq_tiles must be"):
        bwd.GluonBwdConfig(dq="gluon", **fields)


def test_gluon_dq_refuses_on_the_cpu():
    """dq "gluon" goes through the launcher's checks (a broken constraint named) and then needs an sm_90 GPU."""
    config = bwd.GluonBwdConfig(dq="gluon")
    a = _args((1, 2, 40, 128))
    with pytest.raises(RuntimeError, match="^flash_gluon_backward .*sm_90"):
        bwd.flash_gluon_backward(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True, config)
    a["lse"] = a["lse"][..., :30]
    with pytest.raises(ValueError, match="^flash_gluon_backward: lse must be float32 of shape"):
        bwd.flash_gluon_backward(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True, config)


def test_gluon_dq_refuses_tiles_over_shared_memory():
    from impl.attention import flash_gluon_dq as gdq

    a = _args((1, 2, 40, 128))
    q, lse = a["q"], a["lse"]
    match = r"^flash_gluon_backward: the dQ kernel's tiles \(128, 128, 3\) .*shared memory"
    with pytest.raises(ValueError, match=match):
        gdq.dq_launch_args(q, a["k"], a["v"], a["o"], a["do"], lse, lse, torch.empty_like(q), True, (128, 128, 3))


def _emulate_dq(q, k, v, do, o, lse, is_causal, block_m, block_n):
    """The dQ kernel's schedule in float64 torch, line for line with _attn_bwd_dq_sm90 / _k_loop: per
    query tile, the unmasked key tiles [0, mid) and the masked ones [mid, n_tiles) (the forward's
    split), zero-filled rows past N_Q / N_K, lse and D as 0 there, D from O and dO in the program, P in
    base 2 from the natural-log lse, the mask as a select, dQ·(1/sqrt d) at the end."""
    B, H, n_q, d = q.shape
    n_k = k.shape[2]
    log2e = 1.4426950408889634
    sm_scale = 1 / math.sqrt(d)
    qk_scale = sm_scale * log2e
    n_m = -(-n_q // block_m)
    pad_q, pad_k = n_m * block_m - n_q, -(-n_k // block_n) * block_n - n_k
    q_, do_, o_ = (F.pad(x, (0, 0, 0, pad_q)) for x in (q, do, o))
    k_, v_ = (F.pad(x, (0, 0, 0, pad_k)) for x in (k, v))
    lse_ = F.pad(lse, (0, pad_q))
    dq = torch.zeros_like(q_)
    n_full = n_k // block_n
    for pid_m in range(n_m):
        start_m = pid_m * block_m
        if is_causal:
            mid = min(start_m // block_n, n_full)
            n_tiles = -(-min(start_m + block_m, n_k) // block_n)
        else:
            mid, n_tiles = n_full, -(-n_k // block_n)
        rows = slice(start_m, start_m + block_m)
        offs_m = torch.arange(start_m, start_m + block_m)
        qt, dot = q_[:, :, rows], do_[:, :, rows]
        delta = (o_[:, :, rows] * dot).sum(-1)
        lse2 = lse_[:, :, rows] * log2e
        acc = torch.zeros_like(qt)
        for j in range(n_tiles):
            cols = slice(j * block_n, (j + 1) * block_n)
            offs_n = torch.arange(j * block_n, (j + 1) * block_n)
            p = torch.exp2(qt @ k_[:, :, cols].transpose(-1, -2) * qk_scale - lse2[..., None])
            if j >= mid:
                valid = (offs_n < n_k)[None, :]
                if is_causal:
                    valid = valid & (offs_m[:, None] >= offs_n[None, :])
                p = torch.where(valid, p, 0.0)
            ds = p * (dot @ v_[:, :, cols].transpose(-1, -2) - delta[..., None])
            acc += ds @ k_[:, :, cols]
        dq[:, :, rows] = acc * sm_scale
    return dq[:, :, :n_q]


@pytest.mark.parametrize("very_negative", [False, True], ids=["normal", "very-negative"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES + [(1, 1, 129, 300), (1, 2, 64, 64), (1, 1, 300, 70)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_dq_schedule_emulated_on_cpu(shape, is_causal, very_negative):
    """The dQ kernel's tile schedule and conventions (emulated: _emulate_dq) give the reference dQ for
    ragged lengths, N_Q != N_K both ways, one tile, every tiling the candidates use, and scores so
    negative that a padded key's P overflows (the masked instance's key mask)."""
    q, k, v, do, o, lse, (ref, _, _) = _emulation_problem(shape, is_causal, very_negative, seed=7)
    for block_m, block_n in ((128, 64), (128, 128), (64, 64), (64, 128)):
        got = _emulate_dq(q, k, v, do, o, lse, is_causal, block_m, block_n)
        assert torch.isfinite(got).all(), (block_m, block_n)
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9, msg=f"tiles {block_m} x {block_n}")


DQ_GLUON = bwd.GluonBwdConfig(dq="gluon")


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES + [(1, 1, 300, 70)], ids=lambda s: "x".join(map(str, s)))
def test_gluon_dq_gpu_matches_reference(shape, d, is_causal, dtype):
    """dq "gluon": the Gluon dQ kernel (D in it) and the dK/dV kernel, against the float64 reference."""
    B, H, n_q, n_k = shape
    check(*_inputs((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda"), is_causal, config=DQ_GLUON)


@gpu
@needs_sm90
@pytest.mark.parametrize("fwd", ["stage1", "ws"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [80, 128])
def test_gluon_dq_gpu_pairs_with_the_gluon_forwards(d, is_causal, fwd):
    check(*_inputs((2, 3, 1000, d), dtype=torch.bfloat16, device="cuda"), is_causal, fwd=fwd, config=DQ_GLUON)


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gluon_dq_gpu_strided_and_3d_inputs(d, is_causal):
    """(B, N, H, d) storage for q, k, v, o, dO (o's strides reach the kernel's pointer loads of D) and
    3-D inputs: every gradient bit-identical to contiguous 4-D inputs (one program owns each dQ tile,
    one each dK/dV tile: no order-dependent sums)."""
    B, H, n = 2, 3, 300
    q, k, v, do = (x.transpose(1, 2) for x in _inputs((B, n, H, d), dtype=torch.bfloat16, device="cuda"))
    o, lse = forward("triton", q, k, v, is_causal)
    o = o.transpose(1, 2).contiguous().transpose(1, 2)
    assert not q.is_contiguous() and not o.is_contiguous()
    got = bwd.flash_gluon_backward(q, k, v, o, do, lse, is_causal, DQ_GLUON)
    c = [x.contiguous() for x in (q, k, v, o, do)]
    want = bwd.flash_gluon_backward(*c, lse, is_causal, DQ_GLUON)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    got3 = bwd.flash_gluon_backward(q[:, 0], k[:, 0], v[:, 0], o[:, 0], do[:, 0], lse[:, 0], is_causal, DQ_GLUON)
    assert all(g.shape == w[:, 0].shape and torch.equal(g, w[:, 0]) for g, w in zip(got3, want))


# ----------------------------------------------------------------------------- stage 3b: the warp-specialized experiment

_COMPILE_WS = r"""
import json, sys, torch
from impl.attention import flash_gluon_bwd_ws as mod

fn = mod._attn_bwd_ws_sm90
from kits.sm90_compile import compile_for_sm90, cubin_figures
rows = []
cases = [(d, c, causal, torch.bfloat16) for d in (128, 64) for c in mod.CANDIDATE_CONFIGS
         for causal in (False, True) if not c.stats_smem]  # those: _COMPILE_WS_STATS
for d, config, causal, dtype in cases + [(d, mod.GluonBwdWsConfig(), True, torch.float16) for d in (128, 64)]:
    q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(fn, args, opts, divisible=("L", "Delta"))
    rows.append(dict(d=d, causal=causal, rebuild=config.rebuild, stages=config.num_stages,
                     release=config.release_before_dq, fp16=dtype == torch.float16,
                     predicted=mod.shared_bytes(d, 2, config.num_stages),
                     **cubin_figures(ck)))
print(json.dumps(rows))
"""


def _assert_ws_partitions_fit(r: dict) -> None:
    """A ws backward compile row (the compile probes' JSON): 12 warps, the consumers' 240 and the load warp's 24
    setmaxnreg budgets among its partitions, and no partition touching more registers than its budget."""
    assert r["warps"] == 12 and {240, 24} <= {int(b) for b in r["partitions"]}, r
    assert all(used <= int(b) for b, used in r["partitions"].items()), r


def test_ws_backward_compiles_for_hopper():
    """Stages 3b and 4d at d 128 and 64, full and causal (and fp16 causal with rebuild): 12 warps, setmaxnreg budgets
    240 (consumers) / 24 (load warp) with no partition past its budget, wgmma only, dQ by reduce, shared memory within
    its bound. Stage 3b's kernel (rebuild=False) spills what the 240-register budget cannot hold (read in NOTES.md),
    bounded; with rebuild (stage 4d) nothing spills: no stack, no local loads or stores, at the same wgmma, ex2,
    reduce and barrier counts and shared memory. Issue 47's ws refill variants (num_stages 3, release_before_dq):
    no spills either, the same products, ex2 and reduce-adds; a third slot adds 32 KB of shared memory (and its
    barriers), release_before_dq one wgmma wait a loop instance (read in NOTES.md). Issue 47, ws d 64 (K in a
    64-byte swizzle, dQ's products at N = 32): the same checks, a third slot 16 KB; stage 3b's kernel does not spill."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_WS))
    for r in rows:
        print(f"\nws d {r['d']} causal={r['causal']} rebuild={r['rebuild']} stages={r['stages']} "
              f"release={r['release']} "
              f"fp16={r['fp16']}: stack {r['stack']} B, "
              f"STL/LDL {r['stl']}/{r['ldl']}, shared {r['shared']} B, HGMMA {r['hgmma']}, "
              f"UTMAREDG {r['tma_reduce']}, BAR.SYNC {r['bar_sync']}, budget: regs touched {r['partitions']}")
        assert r["local"] == 0 and r["stack"] <= 512, r
        _assert_ws_partitions_fit(r)
        assert r["hgmma"] > 0 and r["hmma"] == 0 and r["tma_reduce"] > 0, r
        assert r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        if r["rebuild"]:
            assert r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
    assert sum(r["rebuild"] for r in rows) == 18
    assert [r["d"] for r in rows if not r["rebuild"] and r["stack"] > 0] == [128, 128]
    plain = {(r["d"], r["causal"]): r for r in rows if not r["rebuild"]}
    for r in rows:
        base = plain[r["d"], r["causal"]]
        same = ("hgmma", "ex2", "tma_reduce", "tma_loads", "tma_stores", "warps")
        assert {f: r[f] for f in same} == {f: base[f] for f in same}, r
        if r["stages"] == 2 and not r["release"]:
            assert (r["bar_sync"], r["shared"]) == (base["bar_sync"], base["shared"]), r
        else:  # a slot: a Q and a dO tile of 64 rows, and three barriers
            assert r["shared"] == base["shared"] + (r["stages"] - 2) * (2 * 64 * r["d"] * 2 + 48), r


_COMPILE_WS_M128 = r"""
import json, torch
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures
rows = []
for config in (mod.GluonBwdWsConfig(), mod.GluonBwdWsConfig(block_m=128)):
    for causal in (False, True):
        q, k, v, do = (torch.randn(2, 3, 1000, 64, dtype=torch.bfloat16) for _ in range(4))
        lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
        grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                           torch.empty_like(v), causal, config)
        ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
        rows.append(dict(block_m=config.block_m, causal=causal, trial=config in mod.TRIAL_CONFIGS,
                         predicted=mod.shared_bytes(64, 2, config.num_stages, config.block_m), **cubin_figures(ck)))
print(json.dumps(rows))
"""

#: Stack bytes of the 128-row query tiles at d 64 (issue 47, TRIAL_CONFIGS; read in NOTES.md): full attention none,
#: causal 64 (loop-invariant scalars and the row statistics' base addresses, reloaded a few times a tile).
WS_M128_STACK = {False: 0, True: 64}


def test_ws_backward_128_row_tiles_compile_for_hopper():
    """Issue 47, ws 128-row query tiles (GluonBwdWsConfig(block_m=128), d 64): 12 warps within the 240 / 24 budgets,
    wgmma only (Sᵀ and dPᵀ products 64 × 128), dQ by reduce, shared memory 164,496 B predicted (+64 KB + 32 KB: Q
    and dO slots, dSᵀ and dQ staging twice the rows), its stack within WS_M128_STACK: it is a trial config, not a
    candidate, while the causal kernel spills."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_WS_M128))
    base = {r["causal"]: r for r in rows if r["block_m"] == 64}
    for r in rows:
        print(f"\nws d 64 block_m={r['block_m']} causal={r['causal']}: regs {r['regs']}, stack {r['stack']} B, "
              f"STL/LDL {r['stl']}/{r['ldl']}, shared {r['shared']} B, HGMMA {r['hgmma']}, ex2 {r['ex2']}, "
              f"UTMAREDG {r['tma_reduce']}, budget: regs touched {r['partitions']}")
        assert r["local"] == 0 and r["warps"] == 12 and {240, 24} <= {int(b) for b in r["partitions"]}, r
        assert all(used <= int(b) for b, used in r["partitions"].items()), r
        assert r["hgmma"] > 0 and r["hmma"] == 0 and r["tma_reduce"] > 0, r
        assert r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        if r["block_m"] == 128:
            assert r["stack"] <= WS_M128_STACK[r["causal"]], r
            assert r["predicted"] == 164_496 and r["shared"] == base[r["causal"]]["shared"] + 64 * 1024, r
        else:
            assert r["stack"] == 0, r
    assert [r["stack"] > 0 for r in rows if r["block_m"] == 128] == [False, True]
    assert ws.GluonBwdWsConfig(block_m=128) in ws.TRIAL_CONFIGS
    assert all(c.block_m == 64 for c in ws.CANDIDATE_CONFIGS)


@pytest.mark.parametrize("block_m", [32, 256, 0, "128", 128.0, True, None])
def test_ws_backward_config_refuses_other_query_tiles(block_m):
    from impl.attention import flash_gluon_bwd_ws as ws

    with pytest.raises(ValueError, match=r"^GluonBwdWsConfig: block_m must be one of \(64, 128\)"):
        ws.GluonBwdWsConfig(block_m=block_m)


def test_ws_backward_refuses_128_row_tiles_at_d128():
    """128-row query tiles at d 128: Sᵀ, dPᵀ, dK and dV alone would be 256 of a consumer's 240 registers and the CTA
    295,568 B of shared memory; refused by the launcher and the entry point, naming the config and the head dim."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    config = ws.GluonBwdWsConfig(block_m=128)
    assert config.head_dims == (64,) and ws.GluonBwdWsConfig().head_dims == ws.HEAD_DIMS
    assert ws.shared_bytes(128, 2, 2, 128) == 295_568 > SM90_MAX_SHARED
    assert ws.shared_bytes(64, 2, 2, 128) == 164_496 and ws.shared_bytes(64) == 98_960
    _assert_refused_at_d128(config, r"^flash_gluon_backward_ws: GluonBwdWsConfig\(.*block_m=128, dq_own_keys=False, "
                                    r".*\) runs at head dims \(64,\) only \(128-row query tiles: .*got head dim 128$")


def test_ws_backward_launch_args_128_row_tiles():
    """block_m 128 passes all four trailing constexprs (REBUILD, STAGES, EARLY_RELEASE, BLOCK_M = 128); Q, dO and dQ
    blocks of 128 rows, K, V, dK, dV of 64 (a consumer's keys); the candidates launch as before (block_m 64 is the
    kernel's default, never passed), at the same grid."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 300, 64))
    bufs = _ws_bufs(a)
    grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(block_m=128))
    grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(False))
    assert (grid, opts) == (grid2, opts2) == (((300 + 127) // 128, 2), {"num_warps": 4})
    assert args[len(base):] == (True, 2, False, 128)
    q_d, k_d, v_d, do_d, dq_d, dk_d, dv_d = args[:7]
    assert [x.block_shape[2] for x in (q_d, do_d, dq_d)] == [128] * 3
    assert [x.block_shape[2] for x in (k_d, v_d, dk_d, dv_d)] == [64] * 4
    assert dq_d.block_shape == [1, 1, 128, 32]
    for c in (c for c in ws.CANDIDATE_CONFIGS if not c.prescaled_lse):  # the statistics' candidates: 4 more
        cargs = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, c)[1]
        assert len(cargs) <= len(base) + 3 and all(x.block_shape[2] == 64 for x in cargs[:7])


_COMPILE_WS_OWN = r"""
import json, torch
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures
rows = []
own = mod.GluonBwdWsConfig(dq_own_keys=True)
cases = [(c, causal, torch.bfloat16) for c in (mod.GluonBwdWsConfig(), own) for causal in (False, True)]
cases += [(own, True, torch.float16), (mod.GluonBwdWsConfig(dq_own_keys=True, num_stages=3), True, torch.bfloat16),
          (mod.GluonBwdWsConfig(dq_own_keys=True, release_before_dq=True), True, torch.bfloat16)]
for config, causal, dtype in cases:
    q, k, v, do = (torch.randn(2, 3, 1000, 64, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
    rows.append(dict(own=config.dq_own_keys, causal=causal, stages=config.num_stages, release=config.release_before_dq,
                     fp16=dtype == torch.float16, predicted=mod.shared_bytes(64, 2, config.num_stages, 64,
                                                                             config.dq_own_keys),
                     **cubin_figures(ck)))
print(json.dumps(rows))
"""


def test_ws_backward_own_key_dq_compiles_for_hopper():
    """Issue 47, ws dQ over a consumer's own keys (GluonBwdWsConfig(dq_own_keys=True), d 64): 12 warps within the
    240 / 24 budgets and no spills (full, causal, fp16 causal, with a third slot, with release_before_dq), the same
    wgmma and ex2 counts as the default (the same 8 m64n32k16 dQ products a consumer, over K = 64), twice its dQ
    reduce-adds (each consumer adds both 32-column halves of its share), and 16 KB more shared memory (two more fp32
    staging tiles of 64 x 32)."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_WS_OWN))
    base = {r["causal"]: r for r in rows if not r["own"]}
    for r in rows:
        print(f"\nws d 64 own={r['own']} causal={r['causal']} stages={r['stages']} release={r['release']} "
              f"fp16={r['fp16']}: regs {r['regs']}, stack {r['stack']} B, STL/LDL {r['stl']}/{r['ldl']}, shared "
              f"{r['shared']} B, HGMMA {r['hgmma']}, ex2 {r['ex2']}, UTMAREDG {r['tma_reduce']}, BAR.SYNC "
              f"{r['bar_sync']}, budget: regs touched {r['partitions']}")
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
        _assert_ws_partitions_fit(r)
        assert r["hgmma"] > 0 and r["hmma"] == 0 and r["tma_reduce"] > 0, r
        assert r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        b = base[r["causal"]]
        assert (r["hgmma"], r["ex2"]) == (b["hgmma"], b["ex2"]), r
        if r["own"]:
            assert r["tma_reduce"] == 2 * b["tma_reduce"], r
            slots = (r["stages"] - 2) * (2 * 64 * 64 * 2 + 48)
            assert r["shared"] - slots == b["shared"] + 2 * 64 * 32 * 4 - 64, r  # the unused dQ handshake's 64 B
    assert ws.GluonBwdWsConfig(dq_own_keys=True) in ws.TRIAL_CONFIGS
    assert not any(c.dq_own_keys for c in ws.CANDIDATE_CONFIGS)


_COMPILE_WS_PINGPONG = r"""
import json, re, torch
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures
rows = []
Cfg = mod.GluonBwdWsConfig
cases = [(Cfg(dq_own_keys=True, pingpong=p), causal, torch.bfloat16) for p in (False, True)
         for causal in (False, True)]
cases += [(Cfg(dq_own_keys=True, pingpong=True), True, torch.float16),
          (Cfg(dq_own_keys=True, pingpong=True, num_stages=3), True, torch.bfloat16),
          (Cfg(dq_own_keys=True, pingpong=True, release_before_dq=True), True, torch.bfloat16)]
for config, causal, dtype in cases:
    q, k, v, do = (torch.randn(2, 3, 1000, 64, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
    rows.append(dict(pp=config.pingpong, causal=causal, stages=config.num_stages, release=config.release_before_dq,
                     fp16=dtype == torch.float16, arrives=len(re.findall(r"\bmbarrier\.arrive", ck.asm["ptx"])),
                     predicted=mod.shared_bytes(64, 2, config.num_stages, 64, True, config.pingpong),
                     **cubin_figures(ck)))
print(json.dumps(rows))
"""


def test_ws_backward_own_key_dq_pingpong_compiles_for_hopper():
    """Issue 47, ws ping-pong of the own-keys consumers (GluonBwdWsConfig(dq_own_keys=True, pingpong=True), d 64):
    12 warps within the 240 / 24 budgets and no spills (full, causal, fp16 causal, a third slot, release_before_dq),
    the own-keys kernel's wgmma, ex2 and reduce-add counts (the same products, only their issue order differs), the
    turn passes in the PTX (more mbarrier arrives), and 32 B more shared memory (the two turn mbarriers)."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_WS_PINGPONG))
    own = {r["causal"]: r for r in rows if not r["pp"]}
    for r in rows:
        print(f"\nws d 64 own keys pingpong={r['pp']} causal={r['causal']} stages={r['stages']} release="
              f"{r['release']} fp16={r['fp16']}: regs {r['regs']}, stack {r['stack']} B, STL/LDL "
              f"{r['stl']}/{r['ldl']}, shared {r['shared']} B, HGMMA {r['hgmma']}, ex2 {r['ex2']}, UTMAREDG "
              f"{r['tma_reduce']}, BAR.SYNC {r['bar_sync']}, PTX mbarrier arrives {r['arrives']}, budget: regs touched {r['partitions']}")
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
        _assert_ws_partitions_fit(r)
        assert r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        o = own[r["causal"]]
        assert (r["hgmma"], r["ex2"], r["tma_reduce"]) == (o["hgmma"], o["ex2"], o["tma_reduce"]), r
        if r["pp"]:
            assert r["arrives"] > o["arrives"], r
            slots = (r["stages"] - 2) * (2 * 64 * 64 * 2 + 48)
            assert r["shared"] - slots == o["shared"] + 32, r
    assert ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True) in ws.TRIAL_CONFIGS
    assert not any(c.pingpong for c in ws.CANDIDATE_CONFIGS)


@pytest.mark.parametrize("fields", [dict(), dict(block_m=128, rebuild=False)], ids=["default", "m128-stage3b"])
def test_ws_backward_config_refuses_pingpong_without_own_key_dq(fields):
    """The turns hand the tensor core between consumers free of the dQ handshake: pingpong needs dq_own_keys."""
    from impl.attention import flash_gluon_bwd_ws as ws

    msg = r"^GluonBwdWsConfig: pingpong needs dq_own_keys=True .*got dq_own_keys=False$"
    with pytest.raises(ValueError, match=msg):
        ws.GluonBwdWsConfig(pingpong=True, **fields)


def test_ws_backward_launch_args_own_key_dq_pingpong():
    """pingpong passes all six trailing constexprs (..., OWN_DQ, PINGPONG = True) with own-keys' descriptors and grid;
    shared_bytes adds the two turn mbarriers; own-keys' arguments are unchanged (five trailing)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 300, 64))
    bufs = _ws_bufs(a)
    grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                      ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True))
    grid2, own, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                       ws.GluonBwdWsConfig(dq_own_keys=True))
    assert (grid, opts) == (grid2, opts2)
    assert args[:len(own)] == own and args[len(own):] == (True,) and own[-5:] == (True, 2, False, 64, True)
    assert ws.shared_bytes(64, 2, 2, 64, True, True) == ws.shared_bytes(64, 2, 2, 64, True) + 32 == 115_376


@pytest.mark.parametrize("fields", [dict(block_m=128), dict(rebuild=False), dict(block_m=128, rebuild=False)],
                         ids=["m128", "stage3b", "both"])
def test_ws_backward_config_refuses_own_key_dq_with_wide_tiles_or_without_rebuild(fields):
    """dq_own_keys adds a 16-register dQ accumulator half: refused where the consumers are already nearer the budget
    (128-row query tiles: spilling; stage 3b's kernel: 216-226 of 240 registers at d 64)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    got = f"block_m={fields.get('block_m', 64)}, rebuild={fields.get('rebuild', True)}"
    with pytest.raises(ValueError, match=rf"^GluonBwdWsConfig: dq_own_keys needs block_m=64 and rebuild=True .*{got}$"):
        ws.GluonBwdWsConfig(dq_own_keys=True, **fields)


@pytest.mark.parametrize("pingpong", [False, True], ids=["own", "pingpong"])
def test_ws_backward_refuses_own_key_dq_at_d128(pingpong):
    """dq_own_keys at d 128: each consumer's share of dQ is 64 × 128 fp32 (two 32-register halves, +32 registers over
    the default's one half): refused by the launcher and the entry point, naming the config and the head dim; with
    the ping-pong too."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=pingpong)
    assert config.head_dims == ws.DQ_OWN_KEYS_HEAD_DIMS == (64,)
    _assert_refused_at_d128(config, rf"^flash_gluon_backward_ws: GluonBwdWsConfig\(.*dq_own_keys=True, "
                                    rf"pingpong={pingpong}(, .*)?\) runs at head dims \(64,\) only "
                                    r"\(dq_own_keys: registers and shared memory\), got head dim 128$")


def test_ws_backward_launch_args_own_key_dq():
    """dq_own_keys passes all five trailing constexprs (REBUILD, STAGES, EARLY_RELEASE, BLOCK_M, OWN_DQ = True) with
    the default's descriptors (dQ blocks of 64 x 32: each consumer adds its share in two 32-column halves) and grid;
    shared_bytes adds two fp32 staging tiles of 64 x 32; the candidates' arguments are unchanged."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 300, 64))
    bufs = _ws_bufs(a)
    config = ws.GluonBwdWsConfig(dq_own_keys=True)
    grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, config)
    grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(False))
    assert (grid, opts) == (grid2, opts2) == (((300 + 127) // 128, 2), {"num_warps": 4})
    assert args[len(base):] == (True, 2, False, 64, True)
    assert [x.block_shape for x in args[:7]] == [x.block_shape for x in base[:7]]
    assert args[4].block_shape == [1, 1, 64, 32]
    assert ws.shared_bytes(64, 2, 2, 64, True) == ws.shared_bytes(64) + 2 * 64 * 32 * 4 == 115_344
    for c in (c for c in ws.CANDIDATE_CONFIGS if not c.prescaled_lse):  # the statistics' candidates: 4 more
        assert len(ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, c)[1]) <= len(base) + 3


_COMPILE_WS_PRESCALED = r"""
import json, sys, torch
sys.path.insert(0, "tools/probes")
import sass_loops
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text
Cfg = mod.GluonBwdWsConfig
cases = [(d, Cfg(prescaled_lse=p), causal, torch.bfloat16) for d in (128, 64) for causal in (False, True)
         for p in (False, True)]
cases += [(64, Cfg(dq_own_keys=True, prescaled_lse=p), True, torch.bfloat16) for p in (False, True)]
cases += [(64, Cfg(prescaled_lse=True), True, torch.float16),
          (64, Cfg(dq_own_keys=True, pingpong=True, prescaled_lse=True), True, torch.bfloat16)]
rows = []
for d, config, causal, dtype in cases:
    q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
    readers = sass_loops.ldg_readers(sass_loops.parse(sass_text(ck)))  # {(opcode, after an MMA wait): count}
    rows.append(dict(d=d, causal=causal, own=config.dq_own_keys, pp=config.pingpong, plse=config.prescaled_lse,
                     fp16=dtype == torch.float16, ldg_uses=sum(readers.values()),
                     ldg_early=sum(n for (_, after), n in readers.items() if not after), **cubin_figures(ck)))
print(json.dumps(rows))
"""


#: Stack bytes of the prescaled-lse trial by head dim (read in NOTES.md): none at d 64; at d 128 one 4-byte slot,
#: stored and reloaded once in each of two loop instances' exponent block (the consumers touch 238 of 240 registers).
WS_PRESCALED_STACK = {64: 0, 128: 8}


def test_ws_backward_prescaled_lse_compiles_for_hopper():
    """Issue 47, ws prescaled lse (GluonBwdWsConfig(prescaled_lse=True); NOTES.md): at d 128 and 64, full and causal,
    with own-keys dQ, its ping-pong and in fp16, 12 warps within the 240 / 24 budgets, no spills at d 64 (at d 128 a
    bounded one, WS_PRESCALED_STACK), and the default's (or own-keys') registers, shared memory, wgmma, ex2 and
    reduce-add counts: only where the loaded statistic is used changes. The point of it: every global load's result
    (lse's and D's) is first used after a wgmma wait (WARPGROUP.DEPBAR), none before the tile's products are issued
    (the default's FMUL by log2 e is)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    rows = json.loads(run_without_interpreter(_COMPILE_WS_PRESCALED))
    base = {(r["d"], r["causal"], r["own"], r["pp"]): r for r in rows if not r["plse"]}
    for r in rows:
        print(f"\nws d {r['d']} prescaled_lse={r['plse']} causal={r['causal']} own={r['own']} pp={r['pp']} "
              f"fp16={r['fp16']}: regs {r['regs']}, stack {r['stack']} B, STL/LDL {r['stl']}/{r['ldl']}, shared "
              f"{r['shared']} B, HGMMA {r['hgmma']}, ex2 {r['ex2']}, UTMAREDG {r['tma_reduce']}, LDG results first "
              f"used before a wgmma wait {r['ldg_early']} of {r['ldg_uses']}, budget: regs touched {r['partitions']}")
        bound = WS_PRESCALED_STACK[r["d"]] if r["plse"] else 0
        assert r["local"] == 0 and r["stack"] <= bound and r["stl"] <= bound // 4 and r["ldl"] <= bound // 4, r
        _assert_ws_partitions_fit(r)
        if r["plse"]:
            assert r["ldg_uses"] > 0 and r["ldg_early"] == 0, r
            b = base.get((r["d"], r["causal"], r["own"], r["pp"]))
            if b is not None and not r["fp16"]:
                same = ("regs", "shared", "hgmma", "ex2", "tma_reduce", "tma_loads", "tma_stores", "bar_sync")
                assert {f: r[f] for f in same} == {f: b[f] for f in same}, (r, b)
        else:
            assert r["ldg_early"] > 0, r  # the stall the trial removes
    assert ws.GluonBwdWsConfig(prescaled_lse=True) in ws.TRIAL_CONFIGS
    assert ws.GluonBwdWsConfig(dq_own_keys=True, prescaled_lse=True) in ws.TRIAL_CONFIGS
    assert all(c.stats_smem for c in ws.CANDIDATE_CONFIGS if c.prescaled_lse)  # prescaled alone measured slower


@pytest.mark.parametrize("fields", [dict(block_m=128), dict(block_m=128, rebuild=False)], ids=["m128", "m128-stage3b"])
def test_ws_backward_config_refuses_prescaled_lse_with_128_row_tiles(fields):
    """128-row query tiles fold lse / sm_scale into Sᵀ's accumulator (_tile_stat): no row statistic to prescale."""
    from impl.attention import flash_gluon_bwd_ws as ws

    msg = r"^GluonBwdWsConfig: prescaled_lse needs block_m=64 \(128-row query tiles fold lse .*got block_m=128$"
    with pytest.raises(ValueError, match=msg):
        ws.GluonBwdWsConfig(prescaled_lse=True, **fields)


def test_ws_backward_prescaled_lse_runs_where_its_base_config_runs():
    """prescaled_lse changes no head dim: d 128 and 64 alone, d 64 with dq_own_keys (and its ping-pong)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    assert ws.GluonBwdWsConfig(prescaled_lse=True).head_dims == ws.HEAD_DIMS == (64, 128)
    for fields in (dict(dq_own_keys=True), dict(dq_own_keys=True, pingpong=True)):
        assert ws.GluonBwdWsConfig(prescaled_lse=True, **fields).head_dims == (64,)
    assert ws.GluonBwdWsConfig(rebuild=False, prescaled_lse=True).head_dims == (64, 128)


def test_ws_backward_launch_args_prescaled_lse():
    """prescaled_lse passes all seven trailing constexprs (..., PINGPONG, PRESCALED_LSE = True) with the base config's
    descriptors, grid and shared memory; every other config's arguments are unchanged (at most six trailing)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    for d, fields in ((128, {}), (64, {}), (64, dict(dq_own_keys=True)), (64, dict(dq_own_keys=True, pingpong=True))):
        a = _args((1, 2, 300, d))
        bufs = _ws_bufs(a)
        grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                          ws.GluonBwdWsConfig(prescaled_lse=True, **fields))
        grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                            ws.GluonBwdWsConfig(**fields))
        plain = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(False))[1]
        assert (grid, opts) == (grid2, opts2)
        assert args[:len(base)] == base and args[len(plain):] == (True, 2, False, 64) + (
            fields.get("dq_own_keys", False), fields.get("pingpong", False), True), fields
    for c in tuple(c for c in ws.CANDIDATE_CONFIGS + ws.TRIAL_CONFIGS if not c.prescaled_lse):
        d = c.head_dims[0]
        a = _args((1, 2, 300, d))
        plain = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *_ws_bufs(a), True, ws.GluonBwdWsConfig(False))[1]
        assert len(ws.launch_args(a["q"], a["k"], a["v"], a["do"], *_ws_bufs(a), True, c)[1]) <= len(plain) + 6


_PRESCALED_PREPROCESS = r"""
import torch
from impl.attention import flash_gluon_bwd as bwd
from impl.attention.flash_gluon_common import LOG2E
for B, H, n_q, d in ((2, 3, 100, 64), (1, 2, 257, 128)):
    g = torch.Generator().manual_seed(n_q)
    o, do = (torch.randn(B, H, n_q, d, generator=g).to(torch.bfloat16) for _ in range(2))
    lse = torch.randn(B, H, n_q, generator=g) * 30
    lse[0, 0, :3] = torch.tensor([0.0, -0.0, 1e-30])
    runs = []
    for scaled in (False, True):
        delta, nl2 = torch.full((B, H, n_q), float("nan")), torch.full((B, H, n_q), float("nan"))
        dq = torch.full((B, H, n_q, d), float("nan"))
        bwd._preprocess(o, do, delta, dq, None, lse if scaled else None, nl2 if scaled else None)
        runs.append((delta, dq, nl2))
    (delta0, dq0, untouched), (delta1, dq1, nl2) = runs
    assert torch.equal(delta0, delta1) and torch.equal(dq0, dq1) and not dq1.any(), "D or dQ changed"
    assert untouched.isnan().all(), "NL2 written without lse"
    assert torch.equal(nl2, lse * -LOG2E), (nl2 - lse * -LOG2E).abs().max()
try:
    bwd._preprocess(o, do, delta, dq, None, lse, None)
except ValueError as e:
    assert str(e).startswith("_preprocess: lse and nl2 go together"), e
else:
    raise AssertionError("lse without nl2 accepted")
print("ok")
"""


def test_ws_backward_prescaled_lse_preprocess_writes_the_scaled_lse_interpreted():
    """The preprocessing launch (flash_kernels._attn_bwd_preprocess, under TRITON_INTERPRET=1 on the CPU) with lse and
    a buffer writes −lse·log2 e bitwise as torch's lse * -LOG2E (fp32: the default kernel's lse2 negated), every row
    of ragged lengths, and D and the zeroed dQ buffer as without them; without them it writes nothing more."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src")] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", _PRESCALED_PREPROCESS], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]

_COMPILE_WS_STATS = r"""
import json, re, sys, torch
sys.path.insert(0, "tools/probes")
import sass_loops
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text
Cfg = mod.GluonBwdWsConfig
cases = [(d, Cfg(prescaled_lse=True, stats_smem=s), causal, torch.bfloat16) for d in (128, 64)
         for causal in (False, True) for s in (False, True)]
cases += [(64, Cfg(prescaled_lse=True, stats_smem=True), True, torch.float16)]
cases += [(d, c, causal, torch.bfloat16) for c in mod.CANDIDATE_CONFIGS if c.stats_smem and c.num_stages == 3
          for d, causal in ((128, True), (128, False), (64, True))]  # the three-slot candidates
rows = []
for d, config, causal, dtype in cases:
    q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])  # rows of 1000 fp32: 16-byte multiples
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
    sass = sass_text(ck)
    readers = sass_loops.ldg_readers(sass_loops.parse(sass))  # {(opcode, after an MMA wait): count}
    rows.append(dict(d=d, causal=causal, stats=config.stats_smem, stages=config.num_stages,
                     release=config.release_before_dq, fp16=dtype == torch.float16,
                     ldg=len(re.findall(r"\bLDG\b", sass)), ldg_uses=sum(readers.values()),
                     predicted=mod.shared_bytes(d, 2, config.num_stages, 64, False, False, config.stats_smem),
                     **cubin_figures(ck)))
print(json.dumps(rows))
"""


def test_ws_backward_stats_smem_compiles_for_hopper():
    """Issue 47, ws stats in shared memory (GluonBwdWsConfig(prescaled_lse=True, stats_smem=True); NOTES.md): at d 128
    and 64, full and causal (and fp16, and the three-slot candidates, with and without release_before_dq, at d 128
    and at d 64 causal), 12 warps within the 240 / 24 budgets, no
    stack and no spills anywhere (the prescaled trial spills 8 B at d 128), no global load at all (the statistics
    come by TMA: two more UTMALDG in the load warp's loop), the prescaled trial's wgmma, ex2, reduce-add and barrier
    counts, and 2 · 64 fp32 of shared memory more per ring slot (within shared_bytes and the H100's limit)."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(run_without_interpreter(_COMPILE_WS_STATS))
    base = {(r["d"], r["causal"]): r for r in rows if not r["stats"]}
    for r in rows:
        print(f"\nws d {r['d']} stats_smem={r['stats']} causal={r['causal']} s{r['stages']} release={r['release']} "
              f"fp16={r['fp16']}: "
              f"regs {r['regs']}, stack {r['stack']} B, STL/LDL {r['stl']}/{r['ldl']}, shared {r['shared']} B "
              f"(bound {r['predicted']}), HGMMA {r['hgmma']}, ex2 {r['ex2']}, UTMALDG {r['tma_loads']}, UTMAREDG "
              f"{r['tma_reduce']}, LDG {r['ldg']}, budget: regs touched {r['partitions']}")
        _assert_ws_partitions_fit(r)
        assert r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        if not r["stats"]:
            assert r["ldg"] > 0 and r["stack"] <= WS_PRESCALED_STACK[r["d"]], r  # the trial it is measured against
            continue
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
        assert r["ldg"] == 0 and r["ldg_uses"] == 0, r
        b = base[(r["d"], r["causal"])]
        if r["stages"] == 2 and not r["fp16"]:
            same = ("regs", "hgmma", "ex2", "tma_reduce", "bar_sync")
            assert {f: r[f] for f in same} == {f: b[f] for f in same}, (r, b)
            assert r["tma_loads"] > b["tma_loads"], (r, b)
            assert 2 * 2 * 64 * 4 <= r["shared"] - b["shared"] <= 2 * 2 * 64 * 4 + 128, (r, b)
    assert sum(r["stats"] for r in rows) == 4 + 1 + 2 * 3
    assert ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True) in ws.CANDIDATE_CONFIGS
    # its trials: dq_one_consumer and lean_sync
    assert not any(c.stats_smem for c in ws.TRIAL_CONFIGS if not (c.dq_one_consumer or c.lean_sync))


@pytest.mark.parametrize("fields", [dict(), dict(block_m=128), dict(dq_own_keys=True)], ids=["default", "m128", "own"])
def test_ws_backward_config_refuses_stats_smem_without_prescaled_lse(fields):
    """The TMA copies need 16-byte row strides, which only the launcher's own buffers are guaranteed: D and
    −lse·log2 e (prescaled_lse), not the caller's lse. Named by both fields."""
    from impl.attention import flash_gluon_bwd_ws as ws

    msg = r"^GluonBwdWsConfig: stats_smem needs prescaled_lse=True \(.*\), got prescaled_lse=False$"
    with pytest.raises(ValueError, match=msg):
        ws.GluonBwdWsConfig(stats_smem=True, **fields)
    with pytest.raises(ValueError, match=r"^GluonBwdWsConfig: prescaled_lse needs block_m=64"):
        ws.GluonBwdWsConfig(stats_smem=True, prescaled_lse=True, block_m=128)


def test_ws_backward_stats_smem_runs_where_prescaled_lse_runs():
    """stats_smem changes no head dim: d 128 and 64 alone, d 64 with dq_own_keys (and its ping-pong); three ring slots
    fit at d 128 too (213,488 + 1,536 B)."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    assert ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True).head_dims == (64, 128)
    for fields in (dict(dq_own_keys=True), dict(dq_own_keys=True, pingpong=True)):
        assert ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, **fields).head_dims == (64,)
    for ns in (2, 3):
        assert ws.shared_bytes(128, 2, ns, stats_smem=True) == ws.shared_bytes(128, 2, ns) + ns * 2 * 64 * 4
    assert ws.shared_bytes(128, 2, 3, stats_smem=True) <= SM90_MAX_SHARED


def _stats_bufs(a, rows=None):
    """launch_args' −lse·log2 e, D, fp32 dQ, dK, dV with the statistics as flash_gluon_backward_ws allocates them under
    stats_smem: (B, H, n_q) views of (B, H, rows) buffers (rows: stats_stride(n_q))."""
    from impl.attention import flash_gluon_bwd_ws as ws

    B, H, n_q = a["q"].shape[:-1]
    rows = rows or ws.stats_stride(n_q)
    nl2, delta = (torch.zeros(B, H, rows)[..., :n_q] for _ in range(2))
    return (nl2, delta, torch.empty(a["q"].shape), torch.empty_like(a["k"]), torch.empty_like(a["v"]))


def test_ws_backward_launch_args_stats_smem():
    """stats_smem passes all eight trailing constexprs (..., PRESCALED_LSE, STATS_SMEM = True) with the prescaled
    config's other arguments but the statistics, which are rank-2 TMA descriptors over (B·H, n_q) (TMA zero-fills the
    rows past n_q) with the buffers' padded row stride, (1, 64) blocks and the unswizzled layout; every other config's
    arguments are unchanged (at most seven trailing). stats_stride rounds n_q up to 4."""
    from impl.attention import flash_gluon_bwd_ws as ws

    assert [ws.stats_stride(n) for n in (1, 4, 130, 257, 1000, 4113)] == [4, 4, 132, 260, 1000, 4116]
    for d, n_q, fields in ((128, 301, {}), (64, 257, {}), (64, 300, dict(dq_own_keys=True, pingpong=True))):
        a = _args((2, 3, n_q, d))
        bufs = _stats_bufs(a)
        config = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, **fields)
        grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, config)
        grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                            ws.GluonBwdWsConfig(prescaled_lse=True, **fields))
        assert (grid, opts) == (grid2, opts2) and args[len(base):] == (True,)
        assert args[:7] == base[:7] and args[9:len(base)] == base[9:]
        rows = ws.stats_stride(n_q)
        for desc, t in zip(args[7:9], bufs[:2]):
            assert desc.base is t and list(desc.shape) == [6, n_q] and list(desc.strides) == [rows, 1]
            assert list(desc.block_shape) == [1, 64] and desc.layout == ws.STATS_LAYOUT
            assert desc.layout.swizzle_byte_width == 0 and desc.layout.rank == 2
    for c in tuple(c for c in ws.CANDIDATE_CONFIGS + ws.TRIAL_CONFIGS if not c.stats_smem):
        a = _args((1, 2, 300, c.head_dims[0]))
        plain = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *_ws_bufs(a), True, ws.GluonBwdWsConfig(False))[1]
        assert len(ws.launch_args(a["q"], a["k"], a["v"], a["do"], *_ws_bufs(a), True, c)[1]) <= len(plain) + 7


_COMPILE_WS_DQ_ONE = r"""
import json, re, sys, torch
sys.path.insert(0, "tools/probes")
import sass_loops
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text
Cfg = mod.GluonBwdWsConfig
stats = dict(prescaled_lse=True, stats_smem=True)
cases = [(Cfg(**stats), True), (Cfg(dq_one_consumer=True, **stats), True), (Cfg(dq_one_consumer=True, **stats), False),
         (Cfg(dq_one_consumer=True, release_before_dq=True, **stats), True)]
rows = []
for config, causal in cases:
    q, k, v, do = (torch.randn(2, 3, 1000, 64, dtype=torch.bfloat16) for _ in range(4))
    lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
    grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                       torch.empty_like(v), causal, config)
    ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
    sass = sass_text(ck)
    ins = sass_loops.parse(sass)
    loops = [sass_loops.counts(ins[lo:hi + 1]) for lo, hi in sass_loops.loops(ins)]
    tiles = [c for c in loops if c["HGMMA"] in (16, 24) and c["MUFU.EX2"] == 32]  # the consumers' query-tile loops
    rows.append(dict(one=config.dq_one_consumer, causal=causal, release=config.release_before_dq,
                     hgmma_shapes=sorted(set(re.findall(r"HGMMA\.(\d+x\d+x\d+)", sass))),
                     tiles=[(c["HGMMA"], c["UTMAREDG"], c["STS"]) for c in tiles],
                     predicted=mod.shared_bytes(64, 2, config.num_stages, 64, False, False, True), **cubin_figures(ck)))
print(json.dumps(rows))
"""


def test_ws_backward_dq_one_consumer_compiles_for_hopper():
    """Issue 47, ws dQ by one consumer (GluonBwdWsConfig(dq_one_consumer=True) with the statistics through the ring;
    NOTES.md): at d 64, full and causal (and with release_before_dq), within the 240 / 24 budgets, no stack and no
    spills; every HGMMA is m64n64k16 (the split's dQ halves are m64n32k16); each query-tile loop instance of the dQ
    consumer has 24 HGMMA, 2 reduce-adds and 16 STS (its whole 64 × 64 fp32 tile), the other's 16 HGMMA and none;
    in all 5/6 of the split's HGMMA and as many reduce-adds, the same shared memory."""
    rows = json.loads(run_without_interpreter(_COMPILE_WS_DQ_ONE))
    base = next(r for r in rows if not r["one"])
    for r in rows:
        r["tiles"] = [tuple(t) for t in r["tiles"]]  # (HGMMA, UTMAREDG, STS) a loop instance, lists in JSON
        print(f"\nws d 64 dq_one_consumer={r['one']} causal={r['causal']} release={r['release']}: regs {r['regs']}, "
              f"stack {r['stack']} B, STL/LDL {r['stl']}/{r['ldl']}, shared {r['shared']} B (bound {r['predicted']}), "
              f"HGMMA {r['hgmma']} {r['hgmma_shapes']}, UTMAREDG {r['tma_reduce']}, loops (HGMMA, UTMAREDG, STS) "
              f"{r['tiles']}, regs touched {r['partitions']}")
        _assert_ws_partitions_fit(r)
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
        assert r["shared"] <= r["predicted"], r
        if not r["one"]:
            assert "64x32x16" in r["hgmma_shapes"] and all(t == (24, 1, 8) for t in r["tiles"]), r
            continue
        assert r["hgmma_shapes"] == ["64x64x16"] and r["shared"] == base["shared"], r
        assert sorted(set(r["tiles"])) == [(16, 0, 0), (24, 2, 16)], r
        assert sum(t[0] == 24 for t in r["tiles"]) == sum(t[0] == 16 for t in r["tiles"]), r
        if r["causal"]:
            assert 6 * r["hgmma"] == 5 * base["hgmma"] and r["tma_reduce"] == base["tma_reduce"], (r, base)


@pytest.mark.parametrize("fields", [dict(block_m=128), dict(rebuild=False), dict(dq_own_keys=True)],
                         ids=["m128", "stage3b", "own"])
def test_ws_backward_config_refuses_dq_one_consumer_beside_another_dq_split(fields):
    """dq_one_consumer replaces the default's dQ split: refused with 128-row tiles, stage 3b's kernel and own-keys dQ,
    naming the three fields; not a bool refused; d 64 only (d 128 refused by the launcher and the entry point)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    msg = (r"^GluonBwdWsConfig: dq_one_consumer needs block_m=64, rebuild=True and dq_own_keys=False \(.*\), got "
           r"block_m=\d+, rebuild=(True|False), dq_own_keys=(True|False)$")
    with pytest.raises(ValueError, match=msg):
        ws.GluonBwdWsConfig(dq_one_consumer=True, **fields)
    with pytest.raises(ValueError, match="dq_one_consumer must be a bool"):
        ws.GluonBwdWsConfig(dq_one_consumer=1)
    config = ws.GluonBwdWsConfig(dq_one_consumer=True, prescaled_lse=True, stats_smem=True)
    assert config.head_dims == (64,) and config in ws.TRIAL_CONFIGS and config not in ws.CANDIDATE_CONFIGS
    _assert_refused_at_d128(config, "runs at head dims \\(64,\\) only")


def test_ws_backward_launch_args_dq_one_consumer():
    """dq_one_consumer passes all nine trailing constexprs (..., STATS_SMEM, DQ_ONE = True) and K's and dK's
    descriptors in the default (128-byte) swizzle, its dQ product being N = 64 over all of K's columns; every other
    argument is the statistics-through-the-ring config's (K and dK at the split's 64-byte swizzle there)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((2, 3, 257, 64))
    bufs = _stats_bufs(a)
    stats = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)
    for fields in (dict(), dict(release_before_dq=True, num_stages=3)):
        grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True,
                                          replace(stats, dq_one_consumer=True, **fields))
        grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, replace(stats, **fields))
        assert (grid, opts) == (grid2, opts2) and args[len(base):] == (True,) and base[-2:] == (True, True)
        assert [i for i, (x, y) in enumerate(zip(args, base)) if x is not y and x != y] == [1, 5]
        for i in (1, 5):  # K, dK
            assert args[i].layout.swizzle_byte_width == 128 and base[i].layout.swizzle_byte_width == 64
            assert args[i].base is base[i].base and args[i].block_shape == base[i].block_shape


_COMPILE_WS_LEAN = r"""
import json, sys, torch
sys.path.insert(0, "tools/probes")
import sass_loops
from impl.attention import flash_gluon_bwd_ws as mod
from kits.sm90_compile import compile_for_sm90, cubin_figures, sass_text
Cfg = mod.GluonBwdWsConfig
stats = dict(prescaled_lse=True, stats_smem=True)
cases = [(64, True, {}), (64, False, {}), (64, True, dict(num_stages=3)), (128, True, {})]
rows = []
for d, causal, fields in cases:
    for lean in (False, True):
        config = Cfg(lean_sync=lean, **stats, **fields)
        q, k, v, do = (torch.randn(2, 3, 1000, d, dtype=torch.bfloat16) for _ in range(4))
        lse, delta = torch.empty(q.shape[:-1]), torch.empty(q.shape[:-1])
        grid, args, opts = mod.launch_args(q, k, v, do, lse, delta, torch.empty(q.shape), torch.empty_like(k),
                                           torch.empty_like(v), causal, config)
        ck = compile_for_sm90(mod._attn_bwd_ws_sm90, args, opts, divisible=("L", "Delta"))
        ins = sass_loops.parse(sass_text(ck))
        loops = [sass_loops.counts(ins[lo:hi + 1]) for lo, hi in sass_loops.loops(ins)]
        tiles = [c for c in loops if c["HGMMA"] > 0 and c["MUFU.EX2"] == 32]  # the consumers' query-tile loops
        rows.append(dict(d=d, causal=causal, stages=config.num_stages, lean=lean, tiles=tiles, **cubin_figures(ck)))
print(json.dumps(rows))
"""


def test_ws_backward_lean_sync_compiles_for_hopper():
    """Issue 47, the d 64 backward's handshakes (GluonBwdWsConfig(lean_sync=True) with the statistics through the
    ring; NOTES.md): at d 64 full and causal, with a third slot and at d 128, within the 240 / 24 budgets with the
    registers its base config touches, no stack and no spills; every consumer query-tile loop instance has one
    BAR.SYNC and one SYNCS (ds_free's arrive) fewer than its base's and the same HGMMA, waits, fences, stores and
    reduce-adds; one mbarrier less of shared memory."""
    rows = json.loads(run_without_interpreter(_COMPILE_WS_LEAN))
    base = {(r["d"], r["causal"], r["stages"]): r for r in rows if not r["lean"]}
    for r in rows:
        print(f"\nws d {r['d']} causal={r['causal']} s{r['stages']} lean_sync={r['lean']}: regs {r['regs']}, stack "
              f"{r['stack']} B, STL/LDL {r['stl']}/{r['ldl']}, shared {r['shared']} B, BAR.SYNC {r['bar_sync']}, "
              f"loops (BAR.SYNC, SYNCS) {[(t['BAR.SYNC'], t['SYNCS']) for t in r['tiles']]}, regs touched "
              f"{r['partitions']}")
        _assert_ws_partitions_fit(r)
        assert r["local"] == 0 and r["stack"] == 0 and r["stl"] == 0 and r["ldl"] == 0, r
        if not r["lean"]:
            continue
        b = base[r["d"], r["causal"], r["stages"]]
        same = ("partitions", "hgmma", "ex2", "tma_loads", "tma_reduce", "tma_stores")
        assert {f: r[f] for f in same} == {f: b[f] for f in same}, (r, b)
        assert r["shared"] < b["shared"] and r["bar_sync"] < b["bar_sync"], (r, b)
        assert len(r["tiles"]) == len(b["tiles"]) >= 4, (r, b)
        for t, u in zip(r["tiles"], b["tiles"]):
            assert (t["BAR.SYNC"], t["SYNCS"]) == (u["BAR.SYNC"] - 1, u["SYNCS"] - 1), (t, u)
            assert {k: n for k, n in t.items() if k not in ("BAR.SYNC", "SYNCS")} == {
                k: n for k, n in u.items() if k not in ("BAR.SYNC", "SYNCS")}, (t, u)
    assert sum(r["lean"] for r in rows) == 4


@pytest.mark.parametrize("fields", [dict(block_m=128), dict(dq_own_keys=True), dict(dq_own_keys=True, pingpong=True),
                                    dict(dq_one_consumer=True), dict(release_before_dq=True)],
                         ids=["m128", "own", "pingpong", "dq-one", "release"])
def test_ws_backward_config_refuses_lean_sync_beside_another_dq_split_or_release(fields):
    """lean_sync stands slot_empty in for ds_free, which holds only where both consumers free the slot after dQ's
    products in the default split: refused with 128-row tiles, own-keys dQ (and its ping-pong), dQ by one consumer and
    the slot freed before dQ, naming each conflicting field with its value; not a bool refused. Stage 3b's kernel, a
    third slot and the statistics' options are not in the way, nor is d 128."""
    import re

    from impl.attention import flash_gluon_bwd_ws as ws

    named = ", ".join(f"{k}={v!r}" for k, v in fields.items())
    msg = r"^GluonBwdWsConfig: lean_sync needs the default dQ split \(.*\), got " + re.escape(named) + "$"
    with pytest.raises(ValueError, match=msg):
        ws.GluonBwdWsConfig(lean_sync=True, **fields)
    with pytest.raises(ValueError, match="^GluonBwdWsConfig: lean_sync must be a bool"):
        ws.GluonBwdWsConfig(lean_sync=1)
    for ok in (dict(), dict(rebuild=False), dict(num_stages=3), dict(prescaled_lse=True, stats_smem=True)):
        assert ws.GluonBwdWsConfig(lean_sync=True, **ok).head_dims == (64, 128)
    config = ws.GluonBwdWsConfig(lean_sync=True, prescaled_lse=True, stats_smem=True)
    assert config in ws.TRIAL_CONFIGS and config not in ws.CANDIDATE_CONFIGS
    assert not any(c.lean_sync for c in ws.CANDIDATE_CONFIGS) and not ws.GluonBwdWsConfig().lean_sync


def test_ws_backward_launch_args_lean_sync():
    """lean_sync passes all ten trailing constexprs (REBUILD .. DQ_ONE as its base config sets them or the kernel's
    defaults, then LEAN_SYNC = True); every argument its base config passes is the same."""
    from impl.attention import flash_gluon_bwd_ws as ws

    for d, fields in ((64, dict(prescaled_lse=True, stats_smem=True)), (64, dict(num_stages=3)), (128, {})):
        a = _args((2, 3, 257, d))
        bufs = _stats_bufs(a) if fields.get("stats_smem") else _ws_bufs(a)
        c = ws.GluonBwdWsConfig(**fields)
        grid, args, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, replace(c, lean_sync=True))
        grid2, base, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, c)
        assert (grid, opts) == (grid2, opts2) and len(args) == 15 + 10, len(args)
        assert [i for i, (x, y) in enumerate(zip(args, base)) if x is not y and x != y] == []
        assert args[15:] == (c.rebuild, c.num_stages, c.release_before_dq, c.block_m, c.dq_own_keys, c.pingpong,
                             c.prescaled_lse, c.stats_smem, c.dq_one_consumer, True), args[15:]


@pytest.mark.parametrize("case", ["row stride 301", "heads not packed", "fp16"])
def test_ws_backward_stats_smem_refuses_statistics_tma_cannot_read(case):
    """The launcher names what TMA cannot take in a statistic: rows not 16 bytes apart (the caller's own (B, H, 301)
    lse), heads not packed, another dtype."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((2, 3, 301, 64))
    nl2, delta, *rest = _stats_bufs(a)
    if case == "row stride 301":
        nl2 = torch.zeros(2, 3, 301)
    elif case == "heads not packed":
        nl2 = torch.zeros(2, 4, 304)[:, :3, :301]
    else:
        nl2 = nl2.half()
    msg = (r"^flash_gluon_backward_ws: stats_smem reads −lse·log2 e by TMA: it must be fp32 \(B, H, n_q\) with unit "
           r"stride along n_q, rows a multiple of 4 elements apart \(16 bytes\), heads packed and its data 16-byte "
           r"aligned, got ")
    with pytest.raises(ValueError, match=msg):
        ws.launch_args(a["q"], a["k"], a["v"], a["do"], nl2, delta, *rest, True,
                       ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True))


_STATS_PREPROCESS = r"""
import torch
from impl.attention import flash_gluon_bwd as bwd
from impl.attention.flash_gluon_bwd_ws import stats_stride
from impl.attention.flash_gluon_common import LOG2E
for B, H, n_q, d in ((2, 3, 101, 64), (1, 2, 257, 128)):
    g = torch.Generator().manual_seed(n_q)
    o, do = (torch.randn(B, H, n_q, d, generator=g).to(torch.bfloat16) for _ in range(2))
    lse = torch.randn(B, H, n_q, generator=g) * 30
    delta0, nl20 = torch.full((B, H, n_q), float("nan")), torch.full((B, H, n_q), float("nan"))
    dq0 = torch.full((B, H, n_q, d), float("nan"))
    bwd._preprocess(o, do, delta0, dq0, None, lse, nl20)
    rows = stats_stride(n_q)
    assert rows > n_q and rows % 4 == 0
    delta, nl2 = torch.full((B, H, rows), float("nan")), torch.full((B, H, rows), float("nan"))
    dq = torch.full((B, H, n_q, d), float("nan"))
    bwd._preprocess(o, do, delta, dq, None, lse, nl2, rows)
    assert torch.equal(delta[..., :n_q], delta0) and torch.equal(dq, dq0) and not dq.any(), "D or dQ changed"
    assert torch.equal(nl2[..., :n_q], lse * -LOG2E) and torch.equal(nl2[..., :n_q], nl20)
    assert delta[..., n_q:].isnan().all() and nl2[..., n_q:].isnan().all(), "a padding column written"
for bad in (dict(lse=None, nl2=None, stats_stride=104), dict(lse=lse, nl2=nl2, stats_stride=n_q - 1),
            dict(lse=lse, nl2=nl2, stats_stride=float(rows))):
    try:
        bwd._preprocess(o, do, delta, dq, None, **bad)
    except ValueError as e:
        assert str(e).startswith("_preprocess: stats_stride needs nl2 and an int of at least n_q"), e
    else:
        raise AssertionError(f"accepted {bad['stats_stride']!r}")
print("ok")
"""


def test_ws_backward_stats_smem_preprocess_writes_padded_rows_interpreted():
    """The preprocessing launch with a row stride (flash_kernels._attn_bwd_preprocess's STATS_STRIDE, under
    TRITON_INTERPRET=1 on the CPU) writes D and −lse·log2 e into the first n_q columns of each padded row, bitwise as
    without it (lse's rows stay n_q apart), the padding untouched, dQ zeroed as before; a stride without nl2, below
    n_q or not an int is refused."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([os.path.join(ROOT, "src")] + [p for p in [env.get("PYTHONPATH")] if p])
    out = subprocess.run([sys.executable, "-c", _STATS_PREPROCESS], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.split() == ["ok"], out.stderr[-3000:]


@pytest.mark.parametrize("field", ["rebuild", "release_before_dq", "dq_own_keys", "pingpong", "prescaled_lse",
                                   "stats_smem", "lean_sync"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_ws_backward_config_refuses_a_flag_that_is_not_a_bool(field, value):
    from impl.attention import flash_gluon_bwd_ws as ws

    with pytest.raises(ValueError, match=f"^GluonBwdWsConfig: {field} must be a bool"):
        ws.GluonBwdWsConfig(**{field: value})


@pytest.mark.parametrize("num_stages", [1, 4, "3", 3.0, True])
def test_ws_backward_config_refuses_other_ring_depths(num_stages):
    from impl.attention import flash_gluon_bwd_ws as ws

    with pytest.raises(ValueError, match="^GluonBwdWsConfig: num_stages must be 2 or 3"):
        ws.GluonBwdWsConfig(num_stages=num_stages)


def test_ws_backward_launch_args_ws_refill():
    """Issue 47's ws refill: the trailing (REBUILD, STAGES, EARLY_RELEASE) up to the last one the config sets, so
    the default launches with its one trailing argument; a third slot's shared memory within the bound."""
    from impl.attention import flash_gluon_bwd_ws as ws
    from impl.attention.flash_configs import SM90_MAX_SHARED

    a = _args((1, 2, 40, 128))
    bufs = (a["lse"], torch.empty(1, 2, 40), torch.empty(1, 2, 40, 128), torch.empty_like(a["k"]),
            torch.empty_like(a["v"]))
    base = len(ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(False))[1])
    tails = {c: ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, c)[1][base:] for c in (
        ws.GluonBwdWsConfig(), ws.GluonBwdWsConfig(num_stages=3), ws.GluonBwdWsConfig(release_before_dq=True),
        ws.GluonBwdWsConfig(False, 3, True), ws.GluonBwdWsConfig(False, release_before_dq=True))}
    assert list(tails.values()) == [(True,), (True, 3), (True, 2, True), (False, 3, True), (False, 2, True)]
    assert ws.shared_bytes(128) + 2 * 64 * 128 * 2 + 3 * 16 == ws.shared_bytes(128, 2, 3) <= SM90_MAX_SHARED


def test_ws_backward_launch_args_rebuild():
    """rebuild (the default) appends REBUILD and nothing else; rebuild=False gives stage 3b's arguments; 2^30 query
    rows and more refused by name with rebuild (the slot index is row >> 30)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 40, 128))
    bufs = (a["lse"], torch.empty(1, 2, 40), torch.empty(1, 2, 40, 128), torch.empty_like(a["k"]),
            torch.empty_like(a["v"]))
    grid, plain, opts = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True, ws.GluonBwdWsConfig(False))
    grid2, rebuilt, opts2 = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True)
    assert (grid, opts) == (grid2, opts2) and len(rebuilt) == len(plain) + 1 and rebuilt[-1] is True
    assert rebuilt[-2] is True and plain[-1] is True  # IS_CAUSAL, as before
    huge = torch.empty(1, 1, 1 << 30, 128, dtype=torch.bfloat16, device="meta")
    with pytest.raises(ValueError, match="rebuild views the resident tiles through slot"):
        ws.launch_args(huge, huge, huge, huge, torch.empty(1, 1, 1 << 30, device="meta"),
                       torch.empty(1, 1, 1 << 30, device="meta"), torch.empty(huge.shape, device="meta"), huge, huge,
                       True)


def _ws_bufs(a):
    """launch_args' lse, D, fp32 dQ, dK, dV for _args' tensors."""
    return (a["lse"], torch.empty(a["q"].shape[:-1]), torch.empty(a["q"].shape), torch.empty_like(a["k"]),
            torch.empty_like(a["v"]))


def _assert_refused_at_d128(config, msg: str) -> None:
    """The ws launcher and its entry point both refuse `config` at head dim 128 with a ValueError matching `msg`."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 40, 128))
    with pytest.raises(ValueError, match=msg):
        ws.launch_args(a["q"], a["k"], a["v"], a["do"], *_ws_bufs(a), True, config)
    with pytest.raises(ValueError, match=msg):
        ws.flash_gluon_backward_ws(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True, config)


@pytest.mark.parametrize("d", [80, 96])
def test_ws_backward_refuses_other_head_dims(d):
    """Head dims 128 and 64 only (flash_gluon_bwd_ws.K_SWIZZLE), from the entry point and the launcher alike."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 40, d))
    with pytest.raises(ValueError, match=r"^flash_gluon_backward_ws: head dim must be one of \(64, 128\), got "):
        ws.flash_gluon_backward_ws(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True)
    bufs = _ws_bufs(a)
    with pytest.raises(ValueError, match=f"^flash_gluon_backward_ws: head dim must be one of .*, got {d}$"):
        ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True)


@pytest.mark.parametrize("d", [64, 128])
def test_ws_backward_refuses_other_devices(d):
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 40, d))
    with pytest.raises(RuntimeError, match="^flash_gluon_backward_ws .*sm_90"):
        ws.flash_gluon_backward_ws(a["q"], a["k"], a["v"], a["o"], a["do"], a["lse"], True)


@pytest.mark.parametrize("d", [64, 128])
def test_ws_backward_swizzles_k_so_that_a_dq_half_starts_an_atom(d):
    """Issue 47, ws d 64: a consumer's dQ product reads d / 2 columns of K from column (d / 2)·c, and a wgmma
    descriptor starts on a swizzle atom, so K's (and dK's, stored through K's tile) swizzle is d / 2 columns wide:
    64 bytes at d 64, the default 128 at d 128 (its descriptors as before); the other operands keep the default."""
    from impl.attention import flash_gluon_bwd_ws as ws

    a = _args((1, 2, 40, d))
    bufs = _ws_bufs(a)
    args = ws.launch_args(a["q"], a["k"], a["v"], a["do"], *bufs, True)[1]
    q_d, k_d, v_d, do_d, dq_d, dk_d, dv_d = args[:7]
    assert k_d.layout.swizzle_byte_width == dk_d.layout.swizzle_byte_width == d // 2 * 2
    assert {x.layout.swizzle_byte_width for x in (q_d, v_d, do_d, dv_d)} == {min(d * 2, 128)}
    assert dq_d.block_shape == [1, 1, 64, d // 2] and dq_d.layout.swizzle_byte_width == min(d // 2 * 4, 128)


def _ws_backward_gpu_check(shape, d, is_causal, config, monkeypatch, dtype=torch.bfloat16):
    """CANDIDATE_CONFIGS[config] (or config itself) of the ws backward at head dim d against the float64 reference (the
    Triton backward past 2000 query rows), every torch.empty NaN-poisoned."""
    from impl.attention import flash_gluon_bwd_ws as ws

    if isinstance(config, int):  # an index into CANDIDATE_CONFIGS (the parametrised tests' ids)
        assert len(ws.CANDIDATE_CONFIGS) == len(WS_BWD_CANDIDATE_IDS)
        config = ws.CANDIDATE_CONFIGS[config]

    B, H, n_q, n_k = shape
    q, k, v, do = _inputs((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda")
    o, lse = forward("triton", q, k, v, is_causal)
    orig_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = orig_empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    got = ws.flash_gluon_backward_ws(q, k, v, o, do, lse, is_causal, config)
    monkeypatch.undo()
    assert all(torch.isfinite(g).all() for g in got)
    if n_q > 2000:  # against the Triton backward (the float64 reference is slow there)
        from impl.attention.flash_launch import flash_attention_triton_backward
        from impl.attention.flash_options import FlashOptions

        want = flash_attention_triton_backward(q, k, v, o, do, lse, is_causal, options=FlashOptions(autotune=False))
    else:
        want = reference_grads(q, k, v, do, o, is_causal)
    errs = [rel_err(g, w) for g, w in zip(got, want)]
    assert all(e < TOL[dtype] for e in errs), errs


def test_ws_backward_candidate_ids_name_their_configs():
    """The GPU tests' ids (kits.gluon.WS_BWD_CANDIDATE_IDS, by index) say what each CANDIDATE_CONFIGS entry runs."""
    from impl.attention import flash_gluon_bwd_ws as ws

    assert len(WS_BWD_CANDIDATE_IDS) == len(ws.CANDIDATE_CONFIGS)
    for name, c in zip(WS_BWD_CANDIDATE_IDS, ws.CANDIDATE_CONFIGS):
        assert (name == "stage3b") == (not c.rebuild) and ("release" in name) == c.release_before_dq, name
        assert ("s3" in name) == (c.num_stages == 3) and name.startswith("stats") == c.stats_smem == c.prescaled_lse
        assert c.block_m == 64 and not c.dq_own_keys, name


@gpu
@needs_sm90
@pytest.mark.parametrize("config", range(len(WS_BWD_CANDIDATE_IDS)), ids=WS_BWD_CANDIDATE_IDS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES + [(2, 4, 4096, 4096)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("d", [128, 64], ids=["d128", "d64"])
def test_ws_backward_gpu_matches_reference(d, shape, is_causal, config, monkeypatch):
    """Stage 3b (rebuild=False), 4d, issue 47's ws refill variants and the row statistics through the ring
    (CANDIDATE_CONFIGS, in order), at d 128 and at d 64 (K in a 64-byte swizzle, 32-column dQ halves), the ragged
    and unequal lengths of SHAPES, full and causal."""
    _ws_backward_gpu_check(shape, d, is_causal, config, monkeypatch)


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_ws_backward_d64_gpu_fp16_matches_reference(is_causal, monkeypatch):
    """Issue 47, ws d 64 in fp16 (its tolerance), the default config, a ragged length."""
    _ws_backward_gpu_check((1, 3, 257, 129), 64, is_causal, 0, monkeypatch, torch.float16)


#: Issue 47, ws 128-row query tiles: SHAPES (ragged, N_Q != N_K both ways), query and key lengths off a multiple of
#: 128 by one row (a last tile of 1 query, a last key tile of 1 key), keys beyond the queries by more than a tile,
#: and 2x4x4096.
WS_M128_SHAPES = SHAPES + [(1, 2, 129, 129), (1, 2, 385, 257), (2, 2, 130, 700), (2, 4, 4096, 4096)]


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_M128_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_m128_gpu_matches_reference(shape, is_causal, dtype, monkeypatch):
    """Issue 47, ws 128-row query tiles (TRIAL_CONFIGS, d 64): one diagonal tile a key tile, lse and D folded into
    the Sᵀ / dPᵀ accumulators, dSᵀ from the rounded Pᵀ; against the reference at ragged and unequal lengths."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(block_m=128)
    assert config in ws.TRIAL_CONFIGS
    _ws_backward_gpu_check(shape, 64, is_causal, config, monkeypatch, dtype)


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_M128_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_own_keys_gpu_matches_reference(shape, is_causal, dtype, monkeypatch):
    """Issue 47, ws dQ over a consumer's own keys (TRIAL_CONFIGS, d 64): each consumer adds dS_c·K_c by reduce-add
    with no dQ handshake; against the reference at ragged and unequal lengths (a last key tile of one key: the
    second consumer's keys all masked; more keys than queries; 2x4x4096)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(dq_own_keys=True)
    assert config in ws.TRIAL_CONFIGS
    _ws_backward_gpu_check(shape, 64, is_causal, config, monkeypatch, dtype)


#: Issue 47, ws ping-pong: both consumers of a program run the same query tiles (their trip counts are the program's,
#: never a consumer's), so besides WS_M128_SHAPES these lengths pin the turns where the two consumers' work differs:
#: a last key tile whose second consumer's keys are all masked (192 = 128 + 64) or 8 of 64 live (200), and programs
#: with no query tile at all (causal, keys past the queries: no turn taken), beside long alternations (4096).
WS_PINGPONG_SHAPES = WS_M128_SHAPES + [(1, 2, 300, 192), (2, 2, 333, 200)]


@gpu
@needs_sm90
@pytest.mark.timeout(120)  # a turn protocol that hangs fails here, not at the session's limit
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_PINGPONG_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_own_keys_pingpong_gpu_matches_reference(shape, is_causal, dtype, monkeypatch):
    """Issue 47, ws ping-pong (TRIAL_CONFIGS, d 64): the own-keys consumers take turns issuing their products (two
    turns a tile); against the reference at ragged and unequal lengths (WS_PINGPONG_SHAPES)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True)
    assert config in ws.TRIAL_CONFIGS
    _ws_backward_gpu_check(shape, 64, is_causal, config, monkeypatch, dtype)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fields", [dict(num_stages=3), dict(release_before_dq=True)], ids=["s3", "release"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 257, 129), (2, 2, 130, 700), (2, 4, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_own_keys_pingpong_ring_variants_gpu_match_reference(shape, is_causal, fields, monkeypatch):
    """pingpong with a third ring slot and with release_before_dq: the turns beside a deeper or earlier-freed ring."""
    from impl.attention import flash_gluon_bwd_ws as ws

    _ws_backward_gpu_check(shape, 64, is_causal, ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True, **fields),
                           monkeypatch)


@gpu
@needs_sm90
@pytest.mark.parametrize("fields", [dict(num_stages=3), dict(release_before_dq=True)], ids=["s3", "release"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 257, 129), (2, 2, 130, 700), (2, 4, 4096, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_own_keys_ring_variants_gpu_match_reference(shape, is_causal, fields, monkeypatch):
    """dq_own_keys with a third ring slot, and with the slot freed before dQ's products retire (release_before_dq):
    the consumers drift apart by up to the ring's depth, so the ring's phases are exercised past one tile of lead."""
    from impl.attention import flash_gluon_bwd_ws as ws

    _ws_backward_gpu_check(shape, 64, is_causal, ws.GluonBwdWsConfig(dq_own_keys=True, **fields), monkeypatch)


def _assert_same_gradients(got, want, dq_exact: bool, dtype) -> None:
    """(dQ, dK, dV) of two ws backward configs that must agree bit for bit: dK and dV always (each one program's, in a
    fixed order); dQ where `dq_exact` (its fp32 reduce-adds cannot reorder), else within one rounding of the cast to
    `dtype` (the reduce-adds' order varies between runs, a config's against itself too)."""
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2]), "dK or dV differ"
    if dq_exact:
        assert torch.equal(got[0], want[0]), "dQ differs"
    else:
        ulp = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}[dtype]
        torch.testing.assert_close(got[0], want[0], rtol=ulp, atol=1e-5 * want[0].abs().max().item())


def _assert_config_gives_bases_bits(config, base, shape, d: int, is_causal: bool, dtype, dq_exact: bool) -> None:
    """The ws backward under `config` against `base` on one set of GPU inputs (B, H, n_q, n_k = shape; Triton's
    forward): _assert_same_gradients."""
    from impl.attention import flash_gluon_bwd_ws as ws

    B, H, n_q, n_k = shape
    q, k, v, do = _inputs((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda")
    o, lse = forward("triton", q, k, v, is_causal)
    want = ws.flash_gluon_backward_ws(q, k, v, o, do, lse, is_causal, base)
    got = ws.flash_gluon_backward_ws(q, k, v, o, do, lse, is_causal, config)
    _assert_same_gradients(got, want, dq_exact, dtype)


#: Issue 47, ws prescaled lse: ragged query lengths (a last tile of 1000 - 960 = 40 rows; 4096 + 17), unequal lengths
#: both ways, and keys within two key tiles (200) under long and ragged queries, where dQ is deterministic (below).
WS_PRESCALED_SHAPES = [(1, 2, 1000, 1000), (1, 2, 4113, 4113), (1, 3, 257, 129), (2, 2, 130, 700), (1, 2, 4113, 200)]


#: Issue 47's row-statistics configs, each with the config whose bits it must give: the prescaled lse (a trial)
#: against the default; the statistics through the ring (a candidate) against the prescaled lse.
WS_STATISTICS_PAIRS = {"prescaled_lse": (dict(prescaled_lse=True), dict()),
                       "stats_smem": (dict(prescaled_lse=True, stats_smem=True), dict(prescaled_lse=True))}


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_PRESCALED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("d", [128, 64], ids=["d128", "d64"])
@pytest.mark.parametrize("pair", list(WS_STATISTICS_PAIRS))
def test_ws_backward_statistics_configs_gpu_give_their_bases_bits(pair, d, shape, is_causal, dtype):
    """Issue 47, ws prescaled lse: −lse·log2 e from the preprocessing launch, added in P's exponent, gives the
    default's bits. Issue 47, ws stats in shared memory: the row statistics copied by the load warp's TMA into the
    Q/dO ring and read from shared memory are the values the prescaled trial loads from global memory (rows past n_q
    zero-filled as its masked loads read them; n_q of 1000, 4113, 257 and 130: padded rows of 1000, 4116, 260, 132
    fp32), so it gives the prescaled trial's bits. Bits: dK and dV (each one program's, in a fixed order) always; dQ
    where its fp32 reduce-adds cannot reorder (at most two an element, n_k <= 256: a + b == b + a), elsewhere within
    one rounding of the cast (the reduce-adds' order varies between runs, the default's against itself too)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    fields, base = WS_STATISTICS_PAIRS[pair]
    config = ws.GluonBwdWsConfig(**fields)
    assert config in (ws.CANDIDATE_CONFIGS if config.stats_smem else ws.TRIAL_CONFIGS)
    _assert_config_gives_bases_bits(config, ws.GluonBwdWsConfig(**base), shape, d, is_causal, dtype,
                                    shape[3] <= 2 * ws.BLOCK_N.value)


#: Issue 47, ws dQ by one consumer: beside WS_PRESCALED_SHAPES' ragged lengths, a last key tile whose second
#: consumer's keys are all masked (192) or 8 of 64 live (200) (the dQ consumer still adds the tile's whole dQ), and
#: programs with no query tile (causal, keys past the queries).
WS_DQ_ONE_SHAPES = WS_PRESCALED_SHAPES + [(1, 2, 300, 192), (2, 2, 333, 200)]
#: Its rings: two slots (bf16 and fp16), release_before_dq and three slots (bf16).
WS_DQ_ONE_RINGS = {"s2-bf16": (dict(), torch.bfloat16), "s2-fp16": (dict(), torch.float16),
                   "release": (dict(release_before_dq=True), torch.bfloat16),
                   "s3": (dict(num_stages=3), torch.bfloat16)}


@gpu
@needs_sm90
@pytest.mark.timeout(120)  # a handshake that hangs fails here, not at the session's limit
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_DQ_ONE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ring", list(WS_DQ_ONE_RINGS))
def test_ws_backward_dq_one_consumer_gpu_gives_the_splits_bits(ring, shape, is_causal):
    """Issue 47, ws dQ by one consumer (TRIAL_CONFIGS, d 64): consumer 1 computes each tile's whole dQ (N = 64, K in
    the 128-byte swizzle), consumer 0 none. dK and dV are each consumer's own products, unchanged: bitwise the
    statistics-through-the-ring config's with the same ring (two slots, release_before_dq, three slots); dQ within
    one rounding of the cast (the reduce-adds' order varies between runs)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    fields, dtype = WS_DQ_ONE_RINGS[ring]
    base = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, **fields)
    config = replace(base, dq_one_consumer=True)
    assert ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, dq_one_consumer=True) in ws.TRIAL_CONFIGS
    _assert_config_gives_bases_bits(config, base, shape, 64, is_causal, dtype, False)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 257, 129), (2, 2, 130, 700), (1, 2, 300, 192), (2, 2, 333, 200)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_dq_one_consumer_gpu_matches_reference(shape, is_causal, monkeypatch):
    """The dQ-by-one-consumer trial against the float64 reference, every torch.empty NaN-poisoned (a staging half or
    a dQ row left unwritten shows)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, dq_one_consumer=True)
    _ws_backward_gpu_check(shape, 64, is_causal, config, monkeypatch)


#: Issue 47, the d 64 backward's handshakes: lean_sync's rings on the table's d 64 config (the statistics through the
#: ring): dq_one's but release_before_dq (which lean_sync refuses): two slots (bf16 and fp16) and three (bf16).
WS_LEAN_RINGS = {name: ring for name, ring in WS_DQ_ONE_RINGS.items() if name != "release"}


@gpu
@needs_sm90
@pytest.mark.timeout(120)  # a handshake that hangs fails here, not at the session's limit
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", WS_DQ_ONE_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("ring", list(WS_LEAN_RINGS))
def test_ws_backward_lean_sync_gpu_gives_its_bases_bits(ring, shape, is_causal):
    """Issue 47, the d 64 backward's handshakes (TRIAL_CONFIGS, lean_sync): no ds_free, the dSᵀ store waiting on the
    previous tile's slot_empty instead (its parity over many tiles: 4113 query rows; programs with no query tile: keys
    past the queries, causal). The same products in the same order: dK and dV bitwise the config's without it, dQ
    bitwise where its reduce-adds cannot reorder (n_k <= 256), else within one rounding of the cast."""
    from impl.attention import flash_gluon_bwd_ws as ws

    fields, dtype = WS_LEAN_RINGS[ring]
    base = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, **fields)
    config = replace(base, lean_sync=True)
    assert ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, lean_sync=True) in ws.TRIAL_CONFIGS
    _assert_config_gives_bases_bits(config, base, shape, 64, is_causal, dtype, shape[3] <= 2 * ws.BLOCK_N.value)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,shape", [(64, (1, 3, 257, 129)), (64, (2, 2, 130, 700)), (64, (1, 2, 300, 192)),
                                     (64, (2, 2, 333, 200)), (128, (1, 3, 257, 129)), (128, (2, 2, 130, 700))],
                         ids=lambda x: f"d{x}" if isinstance(x, int) else "x".join(map(str, x)))
def test_ws_backward_lean_sync_gpu_matches_reference(d, shape, is_causal, monkeypatch):
    """The lean_sync trial against the float64 reference, every torch.empty NaN-poisoned, at d 64 (ragged lengths, a
    last key tile with 8 or no live keys in its second half) and at d 128 (where it runs too, off the table)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, lean_sync=True)
    _ws_backward_gpu_check(shape, d, is_causal, config, monkeypatch)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("pingpong", [False, True], ids=["own", "pingpong"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", [(1, 3, 257, 129), (2, 2, 130, 700), (1, 2, 4113, 4113)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ws_backward_d64_own_keys_prescaled_lse_gpu_bitwise_equals_own_keys(shape, is_causal, pingpong):
    """prescaled_lse with own-keys dQ (and its ping-pong) at d 64 against the same config without it: dK and dV
    bitwise, dQ bitwise where each element gets at most two reduce-adds (n_k <= 128), else within a rounding."""
    from impl.attention import flash_gluon_bwd_ws as ws

    base = ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=pingpong)
    B, H, n_q, n_k = shape
    q, k, v, do = _inputs((B, H, n_q, 64), (B, H, n_k, 64), torch.bfloat16, "cuda")
    o, lse = forward("triton", q, k, v, is_causal)
    want = ws.flash_gluon_backward_ws(q, k, v, o, do, lse, is_causal, base)
    got = ws.flash_gluon_backward_ws(q, k, v, o, do, lse, is_causal, replace(base, prescaled_lse=True))
    _assert_same_gradients(got, want, n_k <= ws.BLOCK_N.value, torch.bfloat16)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [128, 64], ids=["d128", "d64"])
def test_ws_backward_prescaled_lse_gpu_matches_reference(d, is_causal, monkeypatch):
    """prescaled_lse against the float64 reference with every torch.empty NaN-poisoned (the −lse·log2 e buffer: each
    row the kernel reads written by the preprocessing launch), a ragged length."""
    from impl.attention import flash_gluon_bwd_ws as ws

    _ws_backward_gpu_check((1, 3, 257, 129), d, is_causal, ws.GluonBwdWsConfig(prescaled_lse=True), monkeypatch)


@gpu
@needs_sm90
@pytest.mark.timeout(120)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d,fields", [(128, {}), (64, {}), (128, dict(num_stages=3)),
                                      (64, dict(dq_own_keys=True, pingpong=True)), (64, dict(release_before_dq=True))],
                         ids=["d128", "d64", "d128-s3", "d64-own-pingpong", "d64-release"])
def test_ws_backward_stats_smem_gpu_matches_reference(d, fields, is_causal, monkeypatch):
    """stats_smem against the float64 reference with every torch.empty NaN-poisoned (the padded statistics' buffers:
    their padding columns, 257 -> 260, are never read, TMA zero-fills past n_q), a ragged length; with a third ring
    slot (d 128), own-keys dQ and its ping-pong, and the slot freed before dQ's products retire (the statistics are
    read before every path's release)."""
    from impl.attention import flash_gluon_bwd_ws as ws

    config = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, **fields)
    _ws_backward_gpu_check((1, 3, 257, 129), d, is_causal, config, monkeypatch)
    _ws_backward_gpu_check((2, 2, 130, 700), d, is_causal, config, monkeypatch)
