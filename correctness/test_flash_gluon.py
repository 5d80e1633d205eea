"""The Gluon forward for Hopper (impl.attention.flash_gluon, issue 47 stage 1).

On the CPU: the kernel compiles for sm_90a (Gluon kernels do not run in the Triton interpreter; their
PTX and cubin need no GPU) at every head dim, causal and full, within the H100's registers and shared
memory, on the wgmma and TMA paths; the launcher refuses what it cannot run with a message naming the
constraint; nothing on the default attention paths imports the module.

On an H100 (marked gpu): outputs against a float64 CPU reference and against the Triton forward, for
d 64/80/96/128, causal and full, ragged lengths, batch and heads > 1, bf16 and fp16; strided and 3-D
inputs give bit-identical results to contiguous 4-D ones; every candidate config is correct.
"""
import json
import math
import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton.experimental.gluon")  # triton is a dependency on Linux only

from impl.attention.flash_gluon import CANDIDATE_CONFIGS  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
gpu = pytest.mark.gpu
needs_sm90 = pytest.mark.skipif(not IS_SM90, reason="the Gluon forward is written for sm_90 (H100/H200)")

HEAD_DIMS = (64, 80, 96, 128)


def _run(code: str) -> str:
    """Run `code` in a fresh Python without the interpreter (these tests compile, never interpret)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


# ----------------------------------------------------------------------------- CPU: compile for sm_90a

# Builds each launch's arguments with the launcher's own launch_args (CPU tensors: the descriptors,
# constexprs and warps are what a GPU launch passes), compiles with triton.compile for sm_90a, and
# reads the cubin Triton produced: registers, stack and local (spill) bytes from cuobjdump's resource
# usage, instruction counts from its SASS; dynamic shared memory from the kernel's metadata.
_COMPILE = r"""
import json, os, re, subprocess, tempfile, torch, triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource
from triton.runtime.jit import mangle_type
from impl.attention import flash_gluon as fg

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")

def compile_sm90(d, causal, config, dtype=torch.bfloat16):
    q, k, v = (torch.randn(2, 3, 1000, d, dtype=dtype) for _ in range(3))
    o, lse = torch.empty_like(q), torch.empty(q.shape[:-1])
    grid, args, opts = fg.launch_args(q, k, v, o, lse, causal, config)
    fn = fg._attn_fwd_sm90
    sig, const = {}, {}
    for i, (name, a) in enumerate(zip(fn.arg_names, args)):
        if fn.params[i].is_constexpr or a is None:
            sig[name], const[(i,)] = "constexpr", a
        else:
            sig[name] = mangle_type(a)  # what the runtime specializes a tensor / descriptor / scalar to
    src = GluonASTSource(fn, sig, const, {(fn.arg_names.index("L"),): [["tt.divisibility", 16]]})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)

def figures(ck):
    path = tempfile.mktemp(suffix=".cubin")
    open(path, "wb").write(ck.asm["cubin"])
    res = subprocess.run([CUOBJDUMP, "-res-usage", path], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([CUOBJDUMP, "-sass", path], capture_output=True, text=True, check=True).stdout
    usage = dict(re.findall(r"\b(REG|STACK|LOCAL):(\d+)", res))
    return dict(regs=int(usage["REG"]), stack=int(usage["STACK"]), local=int(usage["LOCAL"]), shared=ck.metadata.shared,
                hgmma=len(re.findall(r"\bHGMMA\.", sass)), hmma=len(re.findall(r"\bHMMA\.", sass)),
                tma_loads=len(re.findall(r"\bUTMALDG\b", sass)), tma_stores=len(re.findall(r"\bUTMASTG\b", sass)),
                target=re.search(r"\.target\s+(\S+)", ck.asm["ptx"]).group(1))

rows = []
for d in (64, 80, 96, 128):
    for causal in (False, True):
        config = fg.default_config(d)
        rows.append(dict(d=d, causal=causal, config=str(config), predicted=fg.shared_bytes(d, config),
                         **figures(compile_sm90(d, causal, config))))
for d in (80, 128):  # fp16: the same code on another element type
    config = fg.default_config(d)
    rows.append(dict(d=d, causal=True, config=str(config) + " fp16", predicted=fg.shared_bytes(d, config),
                     **figures(compile_sm90(d, True, config, torch.float16))))
for config in fg.CANDIDATE_CONFIGS:  # the probe's sweep, at d 128 causal: each fits, or the launcher refuses it
    try:
        ck = compile_sm90(128, True, config)
    except ValueError as e:
        rows.append(dict(d=128, causal=True, config=str(config), predicted=fg.shared_bytes(128, config), refused=str(e)))
        continue
    rows.append(dict(d=128, causal=True, config=str(config), predicted=fg.shared_bytes(128, config), **figures(ck)))
print(json.dumps(rows))
"""


def test_gluon_forward_compiles_for_hopper():
    """Every head dim, causal and full, at the default config (bf16; fp16 at d 80 and 128), and every
    probe candidate at d 128:
    compiles for sm_90a with no spills (no local memory, no stack), within the H100's 227 KB of
    shared memory (what shared_bytes predicts: no conversion scratch), its products on
    wgmma (HGMMA in SASS, no HMMA) and its loads and stores through TMA."""
    from impl.attention.flash_configs import SM90_MAX_SHARED

    rows = json.loads(_run(_COMPILE))
    print(f"\n{'d':>4} {'causal':>6} {'config':<63} {'regs':>4} {'spill B':>7} {'shared B':>8} {'HGMMA':>5} {'TMA ld/st':>9}")
    for r in rows:
        if "refused" in r:
            print(f"{r['d']:>4} {str(r['causal']):>6} {r['config']:<63} refused: {r['predicted']} B > {SM90_MAX_SHARED}")
            continue
        print(f"{r['d']:>4} {str(r['causal']):>6} {r['config']:<63} {r['regs']:>4} {r['local']:>7} {r['shared']:>8} "
              f"{r['hgmma']:>5} {r['tma_loads']:>5}/{r['tma_stores']}")
    assert {(r["d"], r["causal"]) for r in rows} == {(d, c) for d in HEAD_DIMS for c in (False, True)}
    for r in rows:
        if "refused" in r:
            assert r["predicted"] > SM90_MAX_SHARED, r
            continue
        assert r["target"] == "sm_90a", r
        assert r["local"] == 0 and r["stack"] == 0, f"spills: {r}"
        assert r["regs"] <= 255, r
        assert r["predicted"] - 16 < r["shared"] <= r["predicted"] <= SM90_MAX_SHARED, r
        assert r["hgmma"] > 0 and r["hmma"] == 0, r
        assert r["tma_loads"] > 0 and r["tma_stores"] > 0, r


# ----------------------------------------------------------------------------- CPU: refusals, isolation

def _qkv(shape_q, shape_k=None, dtype=torch.bfloat16, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    shape_k = shape_k or shape_q
    q = torch.randn(shape_q, generator=g).to(dtype=dtype, device=device)
    k = torch.randn(shape_k, generator=g).to(dtype=dtype, device=device)
    v = torch.randn(shape_k, generator=g).to(dtype=dtype, device=device)
    return q, k, v


@pytest.mark.parametrize("case,match", [
    ("fp32", "bf16/fp16"),
    ("mixed dtypes", "bf16/fp16"),
    ("head dim 48", "head dim must be one of"),
    ("k, v shapes differ", "k and v must be"),
    ("d not innermost", "unit stride along the head dim"),
    ("row stride not 16 B", "multiples of 16 bytes"),
    ("misaligned start", "16-byte aligned"),
    ("2-D", r"\(B, H, N, d\)"),
])
def test_gluon_forward_names_the_broken_constraint(case, match):
    from impl.attention.flash_gluon import flash_gluon_forward

    q, k, v = _qkv((2, 3, 40, 64))
    if case == "fp32":
        q, k, v = q.float(), k.float(), v.float()
    elif case == "mixed dtypes":
        v = v.half()
    elif case == "head dim 48":
        q, k, v = _qkv((2, 3, 40, 48))
    elif case == "k, v shapes differ":
        v = v[:, :, :30]
    elif case == "d not innermost":
        q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif case == "row stride not 16 B":  # rows 68 elements apart: 136 bytes
        q = torch.randn(2, 3, 40, 68).to(torch.bfloat16)[..., :64]
    elif case == "misaligned start":  # 2 bytes past an aligned start
        q = torch.randn(2 * 3 * 40 * 64 + 1).to(torch.bfloat16)[1:].view(2, 3, 40, 64)
    elif case == "2-D":
        q, k, v = q[0, 0], k[0, 0], v[0, 0]
    with pytest.raises(ValueError, match=match):
        flash_gluon_forward(q, k, v, True)


def test_gluon_forward_refuses_other_devices():
    """Valid inputs off an sm_90 GPU: a RuntimeError that says what the kernel needs."""
    from impl.attention.flash_gluon import flash_gluon_forward

    with pytest.raises(RuntimeError, match="sm_90"):
        flash_gluon_forward(*_qkv((1, 2, 40, 64)), False)


def test_gluon_forward_refuses_configs_over_shared_memory():
    from impl.attention.flash_gluon import GluonFwdConfig, launch_args

    q, k, v = _qkv((1, 2, 40, 128))
    with pytest.raises(ValueError, match="shared memory"):
        launch_args(q, k, v, torch.empty_like(q), torch.empty(q.shape[:-1]), True, GluonFwdConfig(128, 128, 8, 4))


def test_gluon_forward_is_off_the_default_paths():
    """Issue 47 wires the kernel in at stage 4: until then importing the attention package, the Triton
    path and the model does not import it."""
    out = _run("import sys, impl.attention, impl.attention.flash_triton, impl.model\n"
               "print('impl.attention.flash_gluon' in sys.modules)")
    assert out.split() == ["False"]


# ----------------------------------------------------------------------------- GPU (unrun until a GPU session)

def rel_err(out, ref):
    """||out - ref|| / max(||ref||, 0.1 sqrt(numel)), as correctness/test_attention.py measures."""
    ref = ref.double().cpu()
    floor = 0.1 * math.sqrt(max(ref.numel(), 1))
    return ((out.double().cpu() - ref).norm() / max(ref.norm().item(), floor)).item()


TOL = {torch.bfloat16: 2e-2, torch.float16: 5e-3}  # test_attention.py's tolerances by dtype


def reference(q, k, v, is_causal):
    """float64 on the CPU: (o, natural-log lse); causal top-left aligned (query i sees keys j <= i)."""
    q, k, v = (x.detach().cpu().double() for x in (q, k, v))
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def triton_forward(q, k, v, is_causal):
    from impl.attention.flash_launch import flash_attention_triton_forward
    from impl.attention.flash_options import FlashOptions

    return flash_attention_triton_forward(q, k, v, is_causal, options=FlashOptions(autotune=False))


# (B, H, N_Q, N_K): ragged lengths; 1000 keys are 8 tiles of 128, so the 3-slot ring wraps twice.
SHAPES = [(2, 3, 300, 300), (1, 2, 1000, 1000), (2, 2, 200, 333), (1, 3, 257, 129)]


@gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_gluon_gpu_matches_reference_and_triton(shape, d, is_causal, dtype):
    from impl.attention.flash_gluon import flash_gluon_forward

    B, H, n_q, n_k = shape
    q, k, v = _qkv((B, H, n_q, d), (B, H, n_k, d), dtype, "cuda")
    o, lse = flash_gluon_forward(q, k, v, is_causal)
    assert o.shape == q.shape and o.dtype == dtype and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    assert torch.isfinite(o).all() and torch.isfinite(lse).all()
    r_o, r_lse = reference(q, k, v, is_causal)
    assert rel_err(o, r_o) < TOL[dtype] and rel_err(lse, r_lse) < TOL[dtype], (rel_err(o, r_o), rel_err(lse, r_lse))
    t_o, t_lse = triton_forward(q, k, v, is_causal)
    assert rel_err(o, t_o) < TOL[dtype], rel_err(o, t_o)
    torch.testing.assert_close(lse, t_lse, rtol=1e-4, atol=1e-4)  # fp32 statistics of the same scores


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", HEAD_DIMS)
def test_gluon_gpu_strided_and_3d_inputs_match_contiguous(d, is_causal):
    """Heads and sequence transposed ((B, N, H, d) storage, as a model's projections give) and 3-D
    inputs run the same kernel code on the same values: bit-identical to contiguous 4-D inputs."""
    from impl.attention.flash_gluon import flash_gluon_forward

    B, H, n = 2, 3, 300
    q, k, v = (x.transpose(1, 2) for x in _qkv((B, n, H, d), dtype=torch.bfloat16, device="cuda"))
    assert not q.is_contiguous()
    o, lse = flash_gluon_forward(q, k, v, is_causal)
    o_c, lse_c = flash_gluon_forward(q.contiguous(), k.contiguous(), v.contiguous(), is_causal)
    assert torch.equal(o, o_c) and torch.equal(lse, lse_c)
    o3, lse3 = flash_gluon_forward(q[:, 0], k[:, 0], v[:, 0], is_causal)
    assert o3.shape == q[:, 0].shape and lse3.shape == (B, n)
    assert torch.equal(o3, o_c[:, 0]) and torch.equal(lse3, lse_c[:, 0])


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [80, 128])
@pytest.mark.parametrize("config", CANDIDATE_CONFIGS,
                         ids=lambda c: f"{c.block_m}x{c.block_n}w{c.num_warps}s{c.num_stages}")
def test_gluon_gpu_candidate_configs(config, d, is_causal):
    """Each config the probe times is correct (those over shared memory are refused, not run)."""
    from impl.attention.flash_configs import SM90_MAX_SHARED
    from impl.attention.flash_gluon import flash_gluon_forward, shared_bytes

    q, k, v = _qkv((2, 2, 1000, d), dtype=torch.bfloat16, device="cuda")
    if shared_bytes(d, config) > SM90_MAX_SHARED:
        with pytest.raises(ValueError, match="shared memory"):
            flash_gluon_forward(q, k, v, is_causal, config)
        return
    o, lse = flash_gluon_forward(q, k, v, is_causal, config)
    r_o, r_lse = reference(q, k, v, is_causal)
    assert rel_err(o, r_o) < TOL[torch.bfloat16] and rel_err(lse, r_lse) < TOL[torch.bfloat16]


@gpu
@needs_sm90
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_gluon_gpu_long_sequences_match_triton(is_causal):
    """4096 keys (32 tiles: the ring wraps ten times, 32 query tiles per head) against the Triton forward."""
    from impl.attention.flash_gluon import flash_gluon_forward

    q, k, v = _qkv((2, 4, 4096, 128), dtype=torch.bfloat16, device="cuda")
    o, lse = flash_gluon_forward(q, k, v, is_causal)
    t_o, t_lse = triton_forward(q, k, v, is_causal)
    assert rel_err(o, t_o) < TOL[torch.bfloat16], rel_err(o, t_o)
    torch.testing.assert_close(lse, t_lse, rtol=1e-4, atol=1e-4)
