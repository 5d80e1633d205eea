"""Attention implementations against float64 references (naive math on upcast inputs, gradients
via autograd in float64 on the CPU): FlashAttentionTorch, FlashAttentionTriton (through the Triton
interpreter on a CPU), naive attention vs SDPA, input validation, the backward selection, FLOPs and
the profiler annotations.

Causal masking is top-left aligned (query i sees keys j <= i), like SDPA's is_causal.
"""
import dataclasses
import types
import math
import os

import torch

if not torch.cuda.is_available():
    # The Triton kernels run on the CPU through the interpreter; must be set before triton is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from impl.attention import (FlashAttentionTorch, FlashAttentionTriton, FlashOptions, LaunchRecorder,  # noqa: E402
                            attention_by_name, attention_flops, default_options, naive_attention)
from impl.attention import backward_choice, flash_configs, flash_kernels, flash_launch, flash_triton  # noqa: E402
from impl.attention.backward_choice import BACKWARD_VARIANTS, ShapeKey  # noqa: E402
from impl.model import TransformerLM, cross_entropy  # noqa: E402
from impl.annotate import annotate  # noqa: E402

pytestmark = [
    # The Triton interpreter's own numpy deprecation noise, and overflow in rows that are never stored.
    pytest.mark.filterwarnings("ignore::DeprecationWarning:triton.*"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# Triton on CPU only works if the kernels were defined under the interpreter.
TRITON_OK = HAS_CUDA or INTERPRET
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET != 1")
gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
TRITON_DEVICE = "cuda" if HAS_CUDA else "cpu"

HEAD_DIMS = [16, 24, 32, 48, 64, 80, 96, 128]



# The options the Triton tests pass (every call takes its options; nothing is set process-wide): on
# the GPU one fixed config per kernel, since autotuning every config for every (shape, head dim, dtype)
# drawn here would dominate the runtime. The autotuned path has its own tests below. (Under the
# interpreter there is a single config anyway.)
OPTS = FlashOptions(autotune=False)


def opts(**changes) -> FlashOptions:
    """OPTS with `changes` (FlashOptions fields: variant, tma, recorder, ...)."""
    return dataclasses.replace(OPTS, **changes)


# ----------------------------------------------------------------------------- helpers

def rel_err(out, ref):
    """||out - ref|| / max(||ref||, 0.1 * sqrt(numel)).

    Inputs are unit normal, so an RMS of 0.1 is well below the natural scale of every output; the
    floor only matters for (near-)zero references, e.g. dQ/dK when a row attends to one or two
    keys."""
    ref = ref.double().cpu()
    floor = 0.1 * math.sqrt(max(ref.numel(), 1))
    return ((out.double().cpu() - ref).norm() / max(ref.norm().item(), floor)).item()


def tolerance(dtype, device):
    if dtype == torch.float32:
        # fp32 tiles use three TF32 passes (tf32x3) on the GPU: close to fp32.
        return 1e-3
    if dtype == torch.float16:
        return 5e-3
    return 2e-2  # bfloat16


def reference(q, k, v, is_causal, do, o_saved=None):
    """float64 CPU reference: (o, lse, dq, dk, dv). With `o_saved` (the output the implementation
    stored), dQ and dK take D = rowsum(dO * O) from it, as FlashAttention-2's backward defines
    them: O's rounding to fp16/bf16 is an error no backward can undo, and where a row attends to
    a few keys (dS small) it dominates dQ/dK (fp16, 76 queries x 2 keys, d = 1: 0.8% of dK from
    that rounding alone, the rest of the error ~1e-15)."""
    q64, k64, v64 = (x.detach().cpu().double().requires_grad_(True) for x in (q, k, v))
    scale = 1 / math.sqrt(q.shape[-1])
    s = q64 @ k64.transpose(-2, -1) * scale
    if is_causal:
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1)
    o = p @ v64
    do64 = do.detach().cpu().double()
    o.backward(do64)
    dq, dk, dv = q64.grad, k64.grad, v64.grad
    if o_saved is not None:
        p, q64, k64, v64 = p.detach(), q64.detach(), k64.detach(), v64.detach()
        delta = (do64 * o_saved.detach().cpu().double()).sum(-1, keepdim=True)
        ds = p * (do64 @ v64.transpose(-2, -1) - delta)
        dq, dk = ds @ k64 * scale, ds.transpose(-2, -1) @ q64 * scale
    return o.detach(), lse.detach(), dq, dk, dv


def test_reference_with_exact_saved_output_is_autograd():
    """reference(o_saved=exact O) gives autograd's gradients: the stored-O form changes only D."""
    q, k, v, do = make_inputs((2, 3, 40, 16), (2, 3, 33, 16), torch.float64, "cpu", seed=1)
    for is_causal in (False, True):
        exact = reference(q, k, v, is_causal, do)
        for a, b in zip(exact, reference(q, k, v, is_causal, do, o_saved=exact[0])):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def run_flash(cls, q, k, v, is_causal, do, options=OPTS):
    """Forward + backward through `cls` (FlashAttentionTriton with `options`; None: apply without
    them, i.e. default_options()); returns (o, lse, dq, dk, dv)."""
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    if cls is FlashAttentionTriton and options is not None:
        o = cls.apply(q, k, v, is_causal, options)
    else:
        o = cls.apply(q, k, v, is_causal)
    saved = o.grad_fn.saved_tensors
    lse_candidates = [t for t in saved if t.shape == q.shape[:-1]]
    assert len(lse_candidates) == 1, [tuple(t.shape) for t in saved]
    lse = lse_candidates[0]
    assert lse.dtype == torch.float32
    o.backward(do)
    return o.detach(), lse.detach(), q.grad, k.grad, v.grad


def make_inputs(shape_q, shape_k, dtype, device, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(shape_q, generator=g) * scale).to(dtype=dtype, device=device)
    k = (torch.randn(shape_k, generator=g) * scale).to(dtype=dtype, device=device)
    v = torch.randn(shape_k, generator=g).to(dtype=dtype, device=device)
    do = torch.randn(shape_q, generator=g).to(dtype=dtype, device=device)
    return q, k, v, do


def check_against_reference(cls, q, k, v, do, is_causal, tol=None, options=OPTS):
    tol = tol if tol is not None else tolerance(q.dtype, q.device)
    o, lse, dq, dk, dv = run_flash(cls, q, k, v, is_causal, do, options)
    assert o.dtype == q.dtype and o.shape == q.shape and o.device == q.device
    assert dq.dtype == q.dtype and dk.dtype == k.dtype and dv.dtype == v.dtype
    for t in (o, lse, dq, dk, dv):
        assert torch.isfinite(t).all()
    r_o, r_lse, r_dq, r_dk, r_dv = reference(q, k, v, is_causal, do, o_saved=o)
    errs = {"o": rel_err(o, r_o), "L": rel_err(lse, r_lse), "dq": rel_err(dq, r_dq),
            "dk": rel_err(dk, r_dk), "dv": rel_err(dv, r_dv)}
    bad = {n: e for n, e in errs.items() if not e < tol}
    assert not bad, f"rel errors above {tol}: {bad} (all: {errs})"
    return errs


def _impl_params():
    return [
        pytest.param(FlashAttentionTorch, "cpu", id="torch"),
        pytest.param(FlashAttentionTriton, TRITON_DEVICE, id="triton", marks=needs_triton),
    ]


# ----------------------------------------------------------------------------- fixed shapes

@pytest.mark.parametrize("cls,device", _impl_params())
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["3d", "4d"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_flash_matches_reference(cls, device, is_causal, layout, dtype):
    if layout == "3d":
        sq, sk = (2, 45, 32), (2, 45, 32)
    else:
        sq, sk = (1, 2, 70, 64), (1, 2, 70, 64)
    q, k, v, do = make_inputs(sq, sk, dtype, device)
    if cls is FlashAttentionTriton and dtype == torch.bfloat16 and device == "cpu":
        # the interpreter's bf16 tl.dot is wrong (errors ~1e9; bf16 is checked on the GPU): refuse, not answer
        with pytest.raises(ValueError, match="bfloat16 is not supported .* interpreter"):
            cls.apply(q, k, v, is_causal)
        return
    check_against_reference(cls, q, k, v, do, is_causal)


@pytest.mark.parametrize("cls,device", _impl_params())
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k", [(40, 19), (17, 50)])
def test_flash_unequal_lengths(cls, device, is_causal, n_q, n_k):
    # Causal with n_q != n_k is top-left aligned, as in SDPA.
    q, k, v, do = make_inputs((1, 2, n_q, 48), (1, 2, n_k, 48), torch.float32, device)
    check_against_reference(cls, q, k, v, do, is_causal)


@pytest.mark.parametrize("cls,device", _impl_params())
def test_flash_large_scores_are_finite(cls, device):
    # Large logits stress the online softmax (no overflow / NaN; masked rows handled).
    q, k, v, do = make_inputs((1, 2, 50, 32), (1, 2, 50, 32), torch.float32, device, scale=6.0)
    check_against_reference(cls, q, k, v, do, True)


@pytest.mark.parametrize("cls,device", _impl_params())
def test_flash_single_token(cls, device):
    q, k, v, do = make_inputs((2, 1, 16), (2, 1, 16), torch.float32, device)
    check_against_reference(cls, q, k, v, do, True)


# ----------------------------------------------------------------------------- hypothesis

@st.composite
def attention_case(draw, head_dims=tuple(HEAD_DIMS), max_seq=80):
    is_causal = draw(st.booleans())
    n_q = draw(st.integers(1, max_seq))
    n_k = draw(st.integers(1, max_seq))
    d = draw(st.sampled_from(head_dims))
    four_d = draw(st.booleans())
    lead = (1, draw(st.integers(1, 2))) if four_d else (draw(st.integers(1, 2)),)
    seed = draw(st.integers(0, 2**16))
    return is_causal, n_q, n_k, d, lead, seed


def log_gpu_case(test: str, **case) -> None:
    """Append a hypothesis example about to run on the GPU to $SUITE_CASE_LOG (one JSON line, with the
    xdist worker): a kernel fault kills the process's CUDA context, and hypothesis then cannot replay
    (nor print) the example that faulted; the worker's last line names it."""
    path = os.environ.get("SUITE_CASE_LOG")
    if path and TRITON_DEVICE == "cuda":
        import json

        with open(path, "a") as f:
            f.write(json.dumps(dict(test=test, worker=os.environ.get("PYTEST_XDIST_WORKER"),
                                    **{k: str(v) for k, v in case.items()})) + "\n")


# 60 examples, sharded by dtype x backward variant (15 each): every pair is drawn, and on a GPU, where
# each example compiles its own kernels (~6 s), the shards run on separate xdist workers instead of
# one test setting the suite's wall time (387 s in run 19, NOTES.md).
@needs_triton
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=attention_case())
def test_triton_hypothesis(case, dtype, variant):
    is_causal, n_q, n_k, d, lead, seed = case
    rec = LaunchRecorder()
    log_gpu_case("test_triton_hypothesis", case=case, dtype=dtype, variant=variant)
    q, k, v, do = make_inputs(lead + (n_q, d), lead + (n_k, d), dtype, TRITON_DEVICE, seed=seed)
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=opts(variant=variant, recorder=rec))
    assert rec.summary()["bwd"] == variant


@settings(max_examples=60, deadline=None)
@given(case=attention_case(head_dims=(1, 3, 8) + tuple(HEAD_DIMS), max_seq=96),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
@example(case=(False, 76, 2, 1, (2,), 73), dtype=torch.float16)  # O's rounding dominated dK (reference())
@example(case=(False, 76, 2, 1, (2,), 73), dtype=torch.bfloat16)
def test_torch_hypothesis(case, dtype):
    is_causal, n_q, n_k, d, lead, seed = case
    q, k, v, do = make_inputs(lead + (n_q, d), lead + (n_k, d), dtype, "cpu", seed=seed)
    check_against_reference(FlashAttentionTorch, q, k, v, do, is_causal)


# ----------------------------------------------------------------------------- layouts, saved state, poison

@pytest.mark.parametrize("cls,device", _impl_params())
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_flash_non_contiguous_inputs(cls, device, is_causal):
    B, S, H, d = 1, 37, 2, 32
    g = torch.Generator().manual_seed(3)
    q, k, v, do = (torch.randn(B, S, H, d, generator=g).to(device).transpose(1, 2) for _ in range(4))
    assert not q.is_contiguous()
    check_against_reference(cls, q, k, v, do, is_causal)


@needs_triton
@pytest.mark.parametrize("n_q,n_k,d,is_causal,dtype", [(70, 70, 64, True, torch.float32), (45, 30, 80, False, torch.float16),
                                                       (17, 50, 48, True, torch.float32)])
def test_triton_descriptor_and_pointer_paths(n_q, n_k, d, is_causal, dtype):
    """Both load paths of the kernels (tensor descriptors where the layout allows, pointers
    otherwise) are correct on ragged lengths and padded head dims, and the layout rule picks them.
    (On the GPU small problems take pointers by size: the threshold is lifted here.)"""
    descriptors, pointers = opts(tma_min_scores=0), opts(tma_min_scores=0, tma=False)
    q, k, v, do = make_inputs((1, 2, n_q, d), (1, 2, n_k, d), dtype, TRITON_DEVICE)
    assert flash_launch._tma_ok(q, k, v, do, options=descriptors)
    assert not flash_launch._tma_ok(q, k, v, do, options=pointers)
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=pointers)
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=descriptors)


# ----------------------------------------------------------------------------- head dims split in two tiles

def test_head_dim_tiles_split_where_the_rest_is_a_power_of_two_of_at_least_16():
    """48, 80, 96 split (largest power of two + a power-of-two rest >= 16, a dot's least K); powers
    of two are one tile; the rest (e.g. 24 = 16 + 8, 112 = 64 + 48) is padded to the next power of
    two. Launch records name the choice through _head_dim_label."""
    tiles = {d: flash_configs._head_dim_tiles(d) for d in range(16, 129)}
    assert {d: t for d, t in tiles.items() if t[1]} == {48: (32, 16), 80: (64, 16), 96: (64, 32)}
    assert tiles[16] == (16, 0) and tiles[64] == (64, 0) and tiles[128] == (128, 0)
    assert tiles[24] == (32, 0) and tiles[40] == (64, 0) and tiles[72] == (128, 0) and tiles[112] == (128, 0)
    assert all(t == (flash_configs._block_d(d), 0) for d, t in tiles.items() if not t[1])
    assert [flash_launch._head_dim_label(d) for d in (80, 96, 48, 24, 64)] == ["64+16", "64+32", "32+16",
                                                                               "32 padded", "64"]


@needs_triton
@pytest.mark.parametrize("tma", [True, False], ids=["descriptors", "pointers"])
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("d", [48, 80, 96])
def test_triton_split_head_dims_match_reference(d, dtype, is_causal, variant, tma):
    """The split head dims through every kernel (forward, dQ, dK/dV, atomic, D) on ragged lengths
    (45 queries, 30 keys: not tile multiples), loading through descriptors and through pointers; the
    hi tile sits at column BLOCK_D of the same rows, so a wrong offset or a dropped half shows in
    every output. (The interpreter's bf16 dot is wrong: bf16 runs in the GPU test below.)"""
    rec = LaunchRecorder()
    options = opts(tma_min_scores=0, tma=tma, variant=variant, recorder=rec)
    q, k, v, do = make_inputs((1, 2, 45, d), (1, 2, 30, d), dtype, TRITON_DEVICE, seed=d)
    assert flash_launch._tma_ok(q, k, v, do, options=options) == tma
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=options)
    picks = rec.summary()
    assert picks["bwd"] == variant and picks["d_tiles"] == flash_launch._head_dim_label(d)
    assert "+" in picks["d_tiles"]


@needs_triton
def test_triton_unaligned_layouts_take_the_pointer_path():
    """Rows of 20 fp16 values (40 bytes) or a non-unit stride along d cannot be described to the
    copy engine: those inputs take the pointer path, still correct."""
    q, k, v, do = make_inputs((1, 2, 33, 20), (1, 2, 33, 20), torch.float16, TRITON_DEVICE)
    assert not flash_launch._tma_ok(q, k, v, do, options=OPTS)
    check_against_reference(FlashAttentionTriton, q, k, v, do, True)
    q, k, v, do = (t.transpose(-1, -2).contiguous().transpose(-1, -2)
                   for t in make_inputs((1, 2, 33, 32), (1, 2, 33, 32), torch.float32, TRITON_DEVICE))
    assert q.stride(-1) != 1 and not flash_launch._tma_ok(q, k, v, do, options=OPTS)
    check_against_reference(FlashAttentionTriton, q, k, v, do, False)


@pytest.mark.parametrize("cls,device", _impl_params())
def test_flash_saves_exactly_one_lse(cls, device):
    q, k, v, _ = make_inputs((1, 2, 20, 16), (1, 2, 20, 16), torch.float32, device)
    q.requires_grad_(True)
    o = cls.apply(q, k, v, True, OPTS) if cls is FlashAttentionTriton else cls.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5  # L, q, k, v, o
    assert sum(t.shape == q.shape[:-1] for t in saved) == 1


@pytest.mark.parametrize("cls,device,variant", [(*p.values, "two_pass") for p in _impl_params()]
                         + [pytest.param(FlashAttentionTriton, TRITON_DEVICE, "atomic", id="triton-atomic",
                                         marks=needs_triton)])
def test_flash_outputs_do_not_depend_on_uninitialised_memory(cls, device, variant, monkeypatch):
    """Every torch.empty is NaN-poisoned: any element the kernels fail to write shows up (the
    single-pass backward's fp32 dQ buffer must be zeroed by its preprocessing kernel)."""
    q, k, v, do = make_inputs((1, 2, 33, 80), (1, 2, 21, 80), torch.float32, device)
    r_o, r_lse, r_dq, r_dk, r_dv = reference(q, k, v, False, do)
    orig_empty = torch.empty

    def poisoned_empty(*args, **kwargs):
        t = orig_empty(*args, **kwargs)
        if t.is_floating_point():
            t.fill_(float("nan"))
        return t

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    o, lse, dq, dk, dv = run_flash(cls, q, k, v, False, do, opts(variant=variant))
    monkeypatch.undo()
    for t in (o, lse, dq, dk, dv):
        assert not torch.isnan(t).any()
    tol = tolerance(torch.float32, device)
    for out, ref in ((o, r_o), (lse, r_lse), (dq, r_dq), (dk, r_dk), (dv, r_dv)):
        assert rel_err(out, ref) < tol


# ----------------------------------------------------------------------------- custom ops, torch.compile

def _opcheck_inputs(layout, device):
    """q, k, v, do for opcheck: "3d" contiguous (B, S, d), or "strided" (B, H, S, d) transposed views
    of (B, S, H, d) tensors, as the model passes them; n_q != n_k so the dk/dv fakes use k's shape."""
    g = torch.Generator().manual_seed(5)
    if layout == "3d":
        q, do = (torch.randn(2, 20, 16, generator=g) for _ in range(2))
        k, v = (torch.randn(2, 13, 16, generator=g) for _ in range(2))
    else:
        q, do = (torch.randn(1, 20, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
        k, v = (torch.randn(1, 13, 2, 16, generator=g).transpose(1, 2) for _ in range(2))
    return tuple(t.to(device) for t in (q, k, v, do))


@needs_triton
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["3d", "strided"])
def test_triton_custom_ops_opcheck(is_causal, layout):
    """torch.library.opcheck of both ops: schema (no mutation, no aliasing), fake implementations
    against the real outputs (shapes, dtypes, strides) and the ops under aot_dispatch with dynamic
    shapes."""
    q, k, v, do = _opcheck_inputs(layout, TRITON_DEVICE)
    torch.library.opcheck(flash_triton.flash_forward_op, (q, k, v, is_causal, OPTS.key))
    o, lse = flash_triton.flash_forward_op(q, k, v, is_causal, OPTS.key)
    assert o.is_contiguous() and lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    for variant in BACKWARD_VARIANTS:
        torch.library.opcheck(flash_triton.flash_backward_op, (q, k, v, o, do, lse, is_causal, variant, OPTS.key))


@needs_triton
@pytest.mark.parametrize("kind", ["triton", "compiled"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_under_torch_compile(is_causal, kind, monkeypatch):
    """torch.compile(fullgraph=True) through FlashAttentionTriton.apply: the custom ops keep it one
    graph; outputs and gradients equal eager's (the same kernels run) and the reference. With the
    "compiled" backward the PyTorch backward is traced into the graph: compiled_flash_backward
    (whose lazy torch.compile on CUDA Dynamo cannot trace inside the Function) runs only eagerly."""
    q, k, v, do = make_inputs((1, 2, 40, 32), (1, 2, 40, 32), torch.float32, TRITON_DEVICE)
    eager_only = flash_triton.compiled_flash_backward

    def compiled_backward_eagerly(*args):
        assert not torch.compiler.is_compiling(), "compiled_flash_backward traced by torch.compile"
        return eager_only(*args)

    monkeypatch.setattr(flash_triton, "compiled_flash_backward", compiled_backward_eagerly)
    options = opts(backward=kind)

    def f(q, k, v):
        return FlashAttentionTriton.apply(q, k, v, is_causal, options)

    results = []
    for fn in (f, torch.compile(f, fullgraph=True, backend="aot_eager")):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves)
        out.backward(do)
        results.append((out.detach(), [x.grad for x in leaves]))
    (e_out, e_grads), (c_out, c_grads) = results
    torch.testing.assert_close(c_out, e_out, rtol=0, atol=0)
    # Eager's "compiled" backward is inductor's on CUDA, the graph's the traced PyTorch one.
    grad_tol = dict(rtol=0, atol=0) if kind == "triton" or not HAS_CUDA else dict(rtol=1e-4, atol=1e-4)
    for c, e in zip(c_grads, e_grads):
        torch.testing.assert_close(c, e, **grad_tol)
    _, _, r_dq, r_dk, r_dv = reference(q, k, v, is_causal, do)
    for a, b in zip(c_grads, (r_dq, r_dk, r_dv)):
        assert rel_err(a, b) < tolerance(torch.float32, TRITON_DEVICE)


@needs_triton
def test_triton_model_compiles_whole_without_graph_breaks():
    """The training step's property: a TransformerLM with attn_impl="flash_triton" compiled whole
    with fullgraph=True gives eager's loss and gradients, at two sequence lengths (the second
    compiles a dynamic-length graph, so the fakes see symbolic shapes)."""
    torch.manual_seed(0)
    model = TransformerLM(d_model=32, num_heads=2, d_ff=64, num_layers=2, vocab_size=50, context_length=16,
                          attn_impl="flash_triton").to(TRITON_DEVICE)
    model.set_attention("flash_triton", OPTS)  # every block's attention passes the options
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    params = list(model.parameters())
    for seq in (12, 7):
        x = torch.randint(0, 50, (2, seq), device=TRITON_DEVICE)
        y = torch.randint(0, 50, (2, seq), device=TRITON_DEVICE)
        results = []
        for m in (model, compiled):
            model.zero_grad(set_to_none=True)
            loss = cross_entropy(m(x), y)
            loss.backward()
            results.append((loss.detach(), [p.grad.clone() for p in params]))
        (e_loss, e_grads), (c_loss, c_grads) = results
        torch.testing.assert_close(c_loss, e_loss)
        for c, e in zip(c_grads, e_grads):
            torch.testing.assert_close(c, e)


# ----------------------------------------------------------------------------- backward selection

@needs_triton
@pytest.mark.parametrize("kind", ["triton", "compiled"])
def test_triton_backward_selection(kind, monkeypatch):
    """FlashOptions.backward picks the backward of the call: the Triton kernels or the (compiled)
    PyTorch backward, which must then run and the Triton backward must not."""
    ran = []
    real = flash_triton.compiled_flash_backward
    monkeypatch.setattr(flash_triton, "compiled_flash_backward", lambda *a: (ran.append("compiled"), real(*a))[1])
    rec = LaunchRecorder()
    q, k, v, do = make_inputs((1, 2, 30, 32), (1, 2, 30, 32), torch.float32, TRITON_DEVICE)
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=opts(backward=kind, recorder=rec))
    assert ran == ([] if kind == "triton" else ["compiled"])
    assert ("bwd" in rec.last) == (kind == "triton")


# ----------------------------------------------------------------------------- two-pass / single-pass (atomic) backward

# Interpreter tiles are 16-32 rows: 45, 70, 33, 17 and 50 are not multiples, 64 is.
VARIANT_SHAPES = [((2, 45, 32), (2, 45, 32)), ((1, 2, 70, 80), (1, 2, 37, 80)), ((1, 2, 33, 96), (1, 2, 64, 96)),
                  ((2, 17, 16), (2, 50, 16)), ((1, 3, 64, 128), (1, 3, 64, 128))]


@needs_triton
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("shape_q,shape_k", VARIANT_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_triton_backward_variants_match_reference(shape_q, shape_k, dtype, is_causal, variant):
    """Both backward implementations, 3-D and 4-D inputs, lengths that are and are not tile
    multiples, n_q != n_k, head dims 16..128 with the split 80 and 96 (64 + 16, 64 + 32)."""
    rec = LaunchRecorder()
    q, k, v, do = make_inputs(shape_q, shape_k, dtype, TRITON_DEVICE)
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=opts(variant=variant, recorder=rec))
    assert rec.summary()["bwd"] == variant


@needs_triton
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # two-pass dK/dV rows never stored
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_backward_ragged_keys_with_very_negative_scores(variant, is_causal):
    """Rows whose every score is below -100 have L < -100, so a padded key row (K = 0, score 0)
    would get P = exp(-L) = inf in fp32; the single-pass kernel multiplies those rows of dS into dQ,
    where inf * 0 is NaN: its masks must zero them (n_k = 37 is not a tile multiple; without the
    key mask this test's dQ is NaN)."""
    g = torch.Generator().manual_seed(4)
    direction = F.normalize(torch.randn(16, generator=g), dim=0)
    q = 12 * direction + 0.1 * torch.randn(1, 2, 40, 16, generator=g)
    k = -50 * direction + torch.randn(1, 2, 37, 16, generator=g)
    v, do = torch.randn(1, 2, 37, 16, generator=g), torch.randn(1, 2, 40, 16, generator=g)
    q, k, v, do = (t.to(TRITON_DEVICE) for t in (q, k, v, do))
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=opts(variant=variant))


@needs_triton
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
def test_triton_backward_launcher_takes_a_per_call_variant(variant):
    """flash_attention_triton_backward(..., variant=) overrides options.variant and its launch record
    names the choice; both variants give the same gradients."""
    rec = LaunchRecorder()
    other_variant = "two_pass" if variant == "atomic" else "atomic"
    options = opts(variant=other_variant, recorder=rec)
    q, k, v, do = make_inputs((1, 2, 50, 32), (1, 2, 50, 32), torch.float32, TRITON_DEVICE)
    o, lse = flash_triton.flash_attention_triton_forward(q, k, v, True, options=options)
    grads = flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant=variant, options=options)
    assert rec.last["bwd"].variant == variant
    other = flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, options=options)
    assert rec.last["bwd"].variant == other_variant
    for a, b in zip(grads, other):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="flash backward variant"):
        flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant="sideways", options=options)


def test_choose_backward_rule():
    """Default (FlashOptions.atomic_min_work infinite): two-pass for every shape; with a threshold,
    atomic from that much work (batch·heads·n_q·n_k, halved when causal) on."""
    big = ShapeKey(16, 16384, 16384, 64, torch.bfloat16, True)
    small = ShapeKey(128, 512, 512, 80, torch.bfloat16, False)
    default = default_options()
    assert default.variant == "auto" and default.atomic_min_work == math.inf
    assert {backward_choice.resolve_backward(key, default) for key in (big, small)} == {"two_pass"}
    assert big.work == 16 * 16384 ** 2 / 2 and small.work == 128 * 512 ** 2
    threshold = FlashOptions(atomic_min_work=2 ** 30)
    assert backward_choice.resolve_backward(big, threshold) == backward_choice.choose_backward(big, 2 ** 30) == "atomic"
    assert backward_choice.resolve_backward(small, threshold) == "two_pass"
    assert backward_choice.choose_backward(small, min_work=small.work) == "atomic"


def test_options_variant_forces_and_rejects_unknown():
    """FlashOptions.variant forces a variant for every shape ("auto": the rule); a per-call variant
    overrides it; unknown names are refused by both."""
    key = ShapeKey(1, 8, 8, 16, torch.float32, False)
    for kind in BACKWARD_VARIANTS:
        assert backward_choice.resolve_backward(key, FlashOptions(variant=kind)) == kind
        assert backward_choice.resolve_backward(key, FlashOptions(variant="auto"), variant=kind) == kind
    assert backward_choice.resolve_backward(key, FlashOptions(variant="auto")) == backward_choice.choose_backward(
        key, math.inf)
    with pytest.raises(ValueError, match="unknown flash backward variant 'fused'"):
        FlashOptions(variant="fused")
    with pytest.raises(ValueError, match="unknown flash backward variant 'fused'"):
        backward_choice.resolve_backward(key, OPTS, variant="fused")


@needs_triton
def test_triton_two_pass_backward_has_no_preprocessing_launch(monkeypatch):
    """The two-pass backward computes D inside its dQ kernel: two launches, no preprocessing kernel
    (which only the single-pass backward uses, to zero its fp32 dQ buffer)."""
    class NoLaunch:
        def __getitem__(self, grid):
            raise AssertionError("the preprocessing kernel was launched")

    monkeypatch.setattr(flash_launch, "_attn_bwd_preprocess", NoLaunch())
    q, k, v, do = make_inputs((1, 2, 40, 32), (1, 2, 40, 32), torch.float32, TRITON_DEVICE)
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=opts(variant="two_pass"))
    with pytest.raises(AssertionError, match="preprocessing kernel was launched"):
        run_flash(FlashAttentionTriton, q, k, v, True, do, opts(variant="atomic"))


@needs_triton
def test_triton_call_plan_follows_the_backward_variant():
    """A backward call served by its call plan (from a signature's third call on) still records its
    variant, and other options, or a per-call variant, are never served the plan of another variant."""
    rec = LaunchRecorder()
    by_kind = {kind: opts(variant=kind, recorder=rec) for kind in ("two_pass", "atomic")}
    q, k, v, do = make_inputs((1, 2, 24, 16), (1, 2, 24, 16), torch.float32, TRITON_DEVICE)
    o, lse = flash_triton.flash_attention_triton_forward(q, k, v, True, options=by_kind["two_pass"])
    for kind in ("two_pass", "atomic", "two_pass"):
        for _ in range(3):
            rec.clear()  # each call, plan hit or not, records its own
            flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, options=by_kind[kind])
            assert rec.count == 1 and rec.last["bwd"].variant == kind
    other = "atomic" if kind == "two_pass" else "two_pass"
    for _ in range(3):  # the per-call override is part of the signature too
        flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant=other, options=by_kind[kind])
        assert rec.last["bwd"].variant == other


@needs_triton
@pytest.mark.parametrize("d,limit,tma", [(128, None, False), (128, 128, True), (64, None, True)])
def test_triton_forward_descriptors_up_to_a_head_dim_tile(d, limit, tma):
    """The forward takes descriptors only where its head-dim tile is at most
    FlashOptions.fwd_tma_max_block_d wide (64 by default: the d 128 sweep, NOTES.md); the backward
    keeps them at d 128."""
    rec = LaunchRecorder()
    extra = {} if limit is None else {"fwd_tma_max_block_d": limit}
    options = FlashOptions(autotune=False, tma_min_scores=0, recorder=rec, **extra)
    q, k, v, do = make_inputs((1, 1, 20, d), (1, 1, 20, d), torch.float32, TRITON_DEVICE)
    o, lse = flash_triton.flash_attention_triton_forward(q, k, v, True, options=options)
    flash_triton.flash_attention_triton_backward(q, k, v, o, do, lse, True, options=options)
    assert rec.last["fwd"].tma is tma
    assert rec.last["bwd"].tma is True


@needs_triton
def test_triton_autotune_pick_is_resolved_once_per_shape_key(monkeypatch):
    """The first call of a shape key goes through the autotuner; later calls of the same key launch
    its pick directly (no autotuner on the launch path), a new key goes through it again."""
    q, k, v, _ = make_inputs((1, 2, 24, 16), (1, 2, 24, 16), torch.float32, TRITON_DEVICE)
    flash_triton.clear_plans()  # forgets the resolved picks
    calls = []
    rec = LaunchRecorder()
    options = opts(recorder=rec)
    tuner = flash_launch._kernel("fwd", options)  # the GPU's autotune-off tuner too
    real_run = tuner.run

    def counting_run(*args, **kwargs):
        calls.append(kwargs.get("IS_CAUSAL"))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(tuner, "run", counting_run)
    first = flash_triton.flash_attention_triton_forward(q, k, v, True, options=options)
    second = flash_triton.flash_attention_triton_forward(q, k, v, True, options=options)
    assert calls == [True]
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    flash_triton.flash_attention_triton_forward(q, k, v, False, options=options)
    assert calls == [True, False]
    assert "BLOCK_M" in rec.summary()["fwd"]


# ----------------------------------------------------------------------------- options, launch records, direct launch

@needs_triton
def test_triton_options_are_per_call_and_records_name_what_ran():
    """Two callers with different FlashOptions in one process: each call runs its own options
    (variant, descriptors) and hands its LaunchRecord to its own recorder; the module defaults and
    SPEC's apply(q, k, v, is_causal) are untouched."""
    q, k, v, do = make_inputs((1, 2, 40, 48), (1, 2, 40, 48), torch.float32, TRITON_DEVICE)
    do = do.contiguous()
    before = flash_triton.default_options()
    rec_a, rec_b = LaunchRecorder(), LaunchRecorder()
    a = FlashOptions(variant="atomic", tma=True, tma_min_scores=0, recorder=rec_a)
    b = FlashOptions(variant="two_pass", tma=False, recorder=rec_b)
    for opts in (a, b, a):
        qq, kk, vv = (x.detach().requires_grad_(True) for x in (q, k, v))
        FlashAttentionTriton.apply(qq, kk, vv, True, opts).backward(do)
    assert rec_a.count == 4 and rec_b.count == 2
    sa, sb = rec_a.summary(), rec_b.summary()
    assert sa["bwd"] == "atomic" and "atomic" in sa and "dq" not in sa and sa["tma"] is True
    assert sb["bwd"] == "two_pass" and {"dq", "dkdv"} <= set(sb) and sb["tma"] is False
    assert sa["d_tiles"] == sb["d_tiles"] == "32+16"
    assert flash_triton.default_options() is before
    o, lse, rec = flash_triton.flash_attention_triton_forward_recorded(q, k, v, True, options=b)
    assert rec.kind == "fwd" and rec.tma is False and dict(rec.configs).keys() == {"fwd"}
    torch.testing.assert_close(o, FlashAttentionTriton.apply(q, k, v, True), rtol=0, atol=0)
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=None)  # options=None still works


def test_flash_options_validate_and_hash_without_recorder():
    from impl.attention.flash_options import with_configs
    with pytest.raises(ValueError, match="unknown flash backward"):
        FlashOptions(backward="cuda-magic")
    with pytest.raises(ValueError, match="variant"):
        FlashOptions(variant="fused")
    assert FlashOptions(recorder=LaunchRecorder()) == FlashOptions()
    assert hash(FlashOptions(configs={"fwd": [(64, 64, 4, 3)]})) == hash(with_configs(fwd=[(64, 64, 4, 3)]))
    assert with_configs(fwd=[(64, 64, 4, 3)]).config_list("fwd") == ((64, 64, 4, 3),)
    with pytest.raises(ValueError, match="configs"):
        FlashOptions(configs={"fwd": []})


def test_attention_package_keeps_no_module_settings():
    """Options have one home (issue 47, stage 4): FlashOptions passed through the call. No module of
    impl.attention rebinds a module global (no `global` statement), none answers attributes through a
    module-level __getattr__, and the old setters are gone from the package."""
    import ast
    import pathlib

    import impl.attention as A
    root = pathlib.Path(A.__file__).parent
    found = []
    for path in sorted(root.glob("*.py")):
        tree = ast.parse(path.read_text())
        found += [f"{path.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        found += [f"{path.name}:{n.lineno} __getattr__" for n in tree.body
                  if isinstance(n, ast.FunctionDef) and n.name == "__getattr__"]
    assert found == []
    gone = {"set_flash_backward", "get_flash_backward", "set_flash_autotune", "set_backward_variant",
            "backward_variant", "backward_choices", "last_backward_choice"}
    assert not gone & set(A.__all__) and not any(hasattr(A, name) for name in gone)
    for module, names in ((flash_triton, ("set_backward", "set_tma", "set_autotune", "use_configs", "tuned_configs",
                                          "set_default_options", "BACKWARD", "_USE_TMA", "TMA_MIN_SCORES")),
                          (flash_launch, ("set_default_options", "_default_options", "_LAST")),
                          (backward_choice, ("ATOMIC_MIN_WORK", "set_backward_variant", "record_choice",
                                             "settings_key"))):
        assert not [n for n in names if hasattr(module, n)], module.__name__


@needs_triton
def test_triton_options_reach_the_launch_through_torch_compile():
    """Options given to apply reach the launchers unchanged through the custom ops (as their
    registered int) under torch.compile(fullgraph=True): the call's recorder gets both launches,
    with the options' variant and descriptor choice; default_options() is unchanged and a call
    without options records nothing there."""
    rec = LaunchRecorder()
    options = opts(variant="atomic", tma=False, recorder=rec)
    before = default_options()
    q, k, v, do = make_inputs((1, 2, 24, 16), (1, 2, 24, 16), torch.float32, TRITON_DEVICE)
    compiled = torch.compile(lambda a, b, c: FlashAttentionTriton.apply(a, b, c, True, options), fullgraph=True,
                             backend="aot_eager")
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    compiled(*leaves).backward(do)
    assert rec.count == 2 and rec.last["bwd"].variant == "atomic" and rec.last["fwd"].tma is False
    assert rec.last["bwd"].tma is False
    FlashAttentionTriton.apply(*leaves, True).backward(do)  # options=None: default_options(), no recorder
    assert rec.count == 2 and default_options() is before and default_options().recorder is None


class _FakeCompiled:
    """Stands in for a CompiledKernel: records the launcher calls a _DirectCall makes."""

    def __init__(self, log):
        self.log, self.function, self.packed_metadata = log, "fn", "packed"

    @property
    def run(self):
        return lambda *a: self.log.append(("direct", a))

    def launch_metadata(self, grid, stream, *args):
        return None


class _FakeJit:
    def __init__(self, real, log):
        self.real, self.log, self.arg_names = real, log, real.arg_names

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", args, kwargs))
            return _FakeCompiled(self.log)
        return run


class _FakeTuner:
    def __init__(self, real, log):
        self.fn, self.log = _FakeJit(real.fn, log), log
        self.best_config = real.configs[0]

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.log.append(("tune", args, kwargs))


@needs_triton
def test_plans_kept_are_capped_the_oldest_dropped_first(monkeypatch):
    """A job whose lengths keep changing makes a plan per length: past MAX_PLANS the oldest goes (and a later call of
    its signature is a miss that rebuilds it), so the plans never grow without bound."""
    monkeypatch.setattr(flash_launch, "MAX_PLANS", 2)
    monkeypatch.setattr(flash_launch, "_calls", {})
    for i in range(3):
        flash_launch._keep_plan(("fwd", i), f"plan {i}")
    assert flash_launch._calls == {("fwd", 1): "plan 1", ("fwd", 2): "plan 2"}
    flash_launch._keep_plan(("fwd", 2), "plan 2 again")  # a signature held: replaced, nothing dropped
    assert flash_launch._calls == {("fwd", 1): "plan 1", ("fwd", 2): "plan 2 again"}


def test_direct_launch_plan_cache_is_keyed_on_everything_that_changes_the_kernel(monkeypatch):
    """The direct-launch path (GPU only) driven on the CPU with stand-in kernels: a shape key's first
    call goes through the autotuner, the second through JITFunction.run (making a plan), the third
    launches the plan with every argument in the kernel's parameter order; a change of dtype, head
    dim, causal, an int's value (strides: divisibility, ==1), the TMA flag or the options' configs gets
    a new plan, never a stale one; a pointer off 16-byte alignment never gets one."""
    log = []
    tuners = {}

    def fake_kernel(name, options):
        real = flash_launch._kernels()[name]
        key = (name, options.config_list(name))
        return tuners.setdefault(key, _FakeTuner(real, log))

    monkeypatch.setattr(flash_launch, "_INTERPRETED", False)
    monkeypatch.setattr(flash_launch, "_kernel", fake_kernel)
    monkeypatch.setattr(flash_launch, "_driver", types.SimpleNamespace(
        active=types.SimpleNamespace(get_current_stream=lambda idx: 0)))
    monkeypatch.setattr(flash_launch, "_resolved", {})
    monkeypatch.setattr(flash_launch, "_calls", {})
    opts = FlashOptions(tma_min_scores=0)

    def call(q, k, v, causal=True, options=opts):
        log.clear()
        flash_triton.flash_attention_triton_forward(q, k, v, causal, options=options)
        return [entry[0] for entry in log]

    q, k, v, _ = make_inputs((1, 2, 40, 64), (1, 2, 40, 64), torch.float32, "cpu")
    assert call(q, k, v) == ["tune"]
    assert call(q, k, v) == ["jit"]
    assert call(q, k, v) == ["direct"]
    n_args = len(flash_kernels._attn_fwd.fn.arg_names)
    assert len(log[0][1]) == 9 + n_args  # grid x3, stream, function, packed, metadata, hooks x2, then every param
    names = flash_kernels._attn_fwd.fn.arg_names
    full = dict(zip(names, log[0][1][9:]))
    assert full["IS_CAUSAL"] is True and full["HEAD_DIM"] == 64 and full["BLOCK_M"] == tuners[("fwd", None)].best_config.kwargs["BLOCK_M"]
    assert full["Q"].data_ptr() == q.data_ptr() and full["N_K"] == 40
    plans = len(flash_launch._calls)

    variants = {
        "dtype": make_inputs((1, 2, 40, 64), (1, 2, 40, 64), torch.float16, "cpu")[:3],
        "head dim": make_inputs((1, 2, 40, 32), (1, 2, 40, 32), torch.float32, "cpu")[:3],
        "seq (ints)": make_inputs((1, 2, 41, 64), (1, 2, 41, 64), torch.float32, "cpu")[:3],
        "strides": tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)),
    }
    for what, (a, b, c) in variants.items():
        first = call(a, b, c)
        assert first in (["tune"], ["jit"]), (what, first)  # a new key or a new plan, never "direct"
        call(a, b, c)
        assert call(a, b, c) == ["direct"], what
        assert len(flash_launch._calls) == plans + 1, what
        plans += 1
    # a pointer off 16-byte alignment (Triton specializes on it): never a plan, every call through the JIT
    misaligned = tuple(torch.empty(t.numel() + 1, dtype=t.dtype)[1:].view(t.shape).copy_(t) for t in (q, k, v))
    assert [call(*misaligned) for _ in range(3)][1:] == [["jit"], ["jit"]] and len(flash_launch._calls) == plans
    assert call(q, k, v, causal=False)[0] != "direct"
    assert call(q, k, v, options=FlashOptions(tma=False))[0] != "direct"  # the TMA constexpr
    other = FlashOptions(tma_min_scores=0, configs={"fwd": [(32, 32, 4, 2)]})
    assert call(q, k, v, options=other) == ["tune"]  # another config list: another autotuner
    assert call(q, k, v, options=FlashOptions(tma_min_scores=0, direct_launch=False)) == ["jit"]
    assert call(q, k, v) == ["direct"]  # the first plan is still there


def _fwd_bwd(q, k, v, do, causal, options):
    q, k, v = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = FlashAttentionTriton.apply(q, k, v, causal, options)
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad]


@gpu
@needs_cuda
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "descriptors"])
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("shape_q,shape_k,causal,layout", [
    ((1, 1, 128, 64), (1, 1, 128, 64), True, "contiguous"),
    ((2, 3, 333, 80), (2, 3, 517, 80), False, "contiguous"),
    ((1, 4, 300, 64), (1, 4, 300, 64), True, "strided"),
    ((2, 2, 200, 96), (2, 2, 200, 96), True, "contiguous"),
])
def test_triton_gpu_direct_launch_matches_jit_launch(shape_q, shape_k, causal, layout, dtype, variant, tma,
                                                     monkeypatch):
    """The direct launch of a cached plan (third call of a key on) gives the same bits as Triton's
    ordinary JIT launch of the same kernel and config (direct_launch=False), and is actually taken.
    Atomic dQ sums in a nondeterministic order: dQ is compared with a tolerance there."""
    q, k, v, do = make_inputs(shape_q, shape_k, dtype, "cuda")
    if layout == "strided":  # (B, S, H, d) storage seen as (B, H, S, d)
        q, k, v, do = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, do))
    direct = FlashOptions(variant=variant, tma=tma, tma_min_scores=0, autotune=False)
    jit = dataclasses.replace(direct, direct_launch=False)
    launches = []
    real = flash_launch._DirectCall.__call__
    monkeypatch.setattr(flash_launch._DirectCall, "__call__", lambda self, *a: (launches.append(1), real(self, *a))[1])
    ref = _fwd_bwd(q, k, v, do, causal, jit)
    for _ in range(3):
        got = _fwd_bwd(q, k, v, do, causal, direct)
    assert launches, "the direct path was not taken"
    for name, x, r in zip(("o", "dq", "dk", "dv"), got, ref):
        if name == "dq" and variant == "atomic":
            torch.testing.assert_close(x, r, rtol=1e-2, atol=1e-2)
        else:
            assert torch.equal(x, r), name
    check_against_reference(FlashAttentionTriton, q, k, v, do, causal)


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
def test_triton_gpu_direct_launch_survives_shape_changes(variant):
    """Alternating shapes, layouts and dtypes between calls: each call's plan is its own (a stale
    plan would read the wrong strides or lengths), every output equals the JIT launch's."""
    direct = FlashOptions(variant=variant, autotune=False)
    jit = dataclasses.replace(direct, direct_launch=False)
    cases = [((1, 1, 128, 64), torch.bfloat16, True), ((2, 4, 257, 64), torch.bfloat16, True),
             ((1, 2, 64, 128), torch.float16, False), ((1, 1, 128, 64), torch.float32, True)]
    inputs = [make_inputs(s, s, dt, "cuda", seed=i) + (c,) for i, (s, dt, c) in enumerate(cases)]
    refs = [_fwd_bwd(q, k, v, do, c, jit) for q, k, v, do, c in inputs]
    for _ in range(3):
        for (q, k, v, do, c), ref in zip(inputs, refs):
            got = _fwd_bwd(q, k, v, do, c, direct)
            for name, x, r in zip(("o", "dq", "dk", "dv"), got, ref):
                if name == "dq" and variant == "atomic":
                    torch.testing.assert_close(x, r, rtol=1e-2, atol=1e-2)
                else:
                    assert torch.equal(x, r), (name, q.shape, q.dtype)


@gpu
@needs_cuda
def test_triton_gpu_compiled_with_options_matches_eager():
    """torch.compile through apply with explicit options (passed to the custom ops as an int)."""
    rec = LaunchRecorder()
    opts = FlashOptions(variant="two_pass", autotune=False, recorder=rec)
    q, k, v, do = make_inputs((1, 2, 256, 64), (1, 2, 256, 64), torch.bfloat16, "cuda")
    compiled = torch.compile(lambda a, b, c: FlashAttentionTriton.apply(a, b, c, True, opts), fullgraph=True)
    got = _fwd_bwd(q, k, v, do, True, opts)
    q2, k2, v2 = (x.detach().requires_grad_(True) for x in (q, k, v))
    o = compiled(q2, k2, v2)
    o.backward(do)
    for x, r in zip([o.detach(), q2.grad, k2.grad, v2.grad], got):
        assert torch.equal(x, r)
    assert rec.summary()["bwd"] == "two_pass"


# Compiles the kernels for the H100 (sm_90) on the CPU in a subprocess (this one interprets them):
# sm90(fn, ptrs, const, num_warps, num_stages) -> (PTX, ptxas's spill-store bytes); pointer arguments
# typed by `ptrs` and 16-byte aligned, every stride along d 1, the constexprs `fn` takes from `const`.
_SM90 = r"""
import os, re, subprocess, tempfile, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from impl.attention import flash_configs as fc, flash_kernels as ft

def sm90(fn, ptrs, const, num_warps, num_stages):
    const = {n: v for n, v in const.items() if n in fn.arg_names}
    const.update({n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")})
    sig = {n: ptrs.get(n) or ("constexpr" if n in const else "fp32" if n.endswith("scale") else "i32")
           for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=const,
                    attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in ptrs if n in fn.arg_names})
    options = {"num_warps": num_warps, "num_stages": num_stages}
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
    path = os.path.join(tempfile.mkdtemp(), "k.ptx")
    open(path, "w").write(ptx)
    ptxas = triton.knobs.nvidia.ptxas.path  # the one triton chose the PTX version for (TRITON_PTXAS_PATH wins)
    done = subprocess.run([ptxas, "-arch=sm_90a", "-v", path, "-o", path + ".cubin"], capture_output=True, text=True)
    spills = re.findall(r"(\d+) bytes spill stores", done.stderr)
    if done.returncode or not spills:  # name what ptxas said (once on the H100 it printed no spill line)
        raise RuntimeError(f"ptxas exit {done.returncode}: {done.stderr[-1500:]} {done.stdout[-500:]}")
    return ptx, int(spills[0])

BF16 = dict(Q="*bf16", K="*bf16", V="*bf16", O="*bf16", DO="*bf16", DQ="*bf16", DK="*bf16", DV="*bf16",
            L="*fp32", Delta="*fp32")
ATOMIC = dict(BF16, DQ="*fp32")
"""


def run_sm90(code: str) -> list:
    """Run `code` after _SM90 without the interpreter; its stdout lines, split."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    out = subprocess.run([sys.executable, "-c", _SM90 + code], env=env, capture_output=True, text=True, timeout=300,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.returncode == 0, out.stderr[-2000:]
    return [line.split() for line in out.stdout.splitlines()]


@needs_triton
def test_triton_atomic_kernel_compiles_for_hopper():
    """The single-pass kernel compiled for the H100 (sm_90, on the CPU: PTX needs no GPU) adds its dQ
    tiles with one bulk tensor reduction each (cp.reduce.async.bulk.tensor, the copy engine) when
    DQ_TMA, and with relaxed element atomics (no fences) otherwise; neither spills registers."""
    lines = run_sm90(r"""
for dq_tma in (True, False):
    ptx, spill = sm90(ft._attn_bwd_atomic.fn, ATOMIC, dict(HEAD_DIM=64, BLOCK_D=64, D1=0, IS_CAUSAL=True, TMA=True,
                      DQ_TMA=dq_tma, BLOCK_M=64, BLOCK_N=128), num_warps=8, num_stages=2)
    print(len(re.findall(r"cp\.reduce\.async\.bulk\.tensor", ptx)),
          len(re.findall(r"\batom\.global\.gpu\.relaxed\.add\.f32", ptx)), spill)
""")
    (bulk_tma, atom_tma, spill_tma), (bulk_ptr, atom_ptr, spill_ptr) = lines[:2]
    assert int(bulk_tma) > 0 and atom_tma == "0", lines
    assert bulk_ptr == "0" and int(atom_ptr) > 0, lines
    assert spill_tma == spill_ptr == "0", lines


@needs_triton
def test_triton_split_head_dim_kernels_compile_for_hopper():
    """At d 80 (64 + 16) every kernel compiles for sm_90 with descriptors (TMA loads) and with
    pointers, its tile products as 64- and 16-wide wgmma tiles, none 128 wide (the padded tiling's
    P·V, dS·K, dSᵀ·Q, Pᵀ·dO at 64 x 64 tiles); the single-pass kernel spills fewer bytes than the
    same kernel padded to 128 columns (which spills in every config, NOTES.md)."""
    lines = run_sm90(r"""
split = dict(HEAD_DIM=80, BLOCK_D=64, D1=16, IS_CAUSAL=True, BLOCK_M=64, BLOCK_N=64)
for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd_atomic"):
    for tma in (True, False):
        ptx, spill = sm90(getattr(ft, name).fn, ATOMIC if name == "_attn_bwd_atomic" else BF16,
                          dict(split, TMA=tma, DQ_TMA=tma), num_warps=4, num_stages=3)
        widths = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k16", ptx)), key=int)
        print(name, tma, ",".join(widths), int("cp.async.bulk.tensor" in ptx), spill)
for tma in (True, False):
    print("padded", tma, "-", "-", sm90(ft._attn_bwd_atomic.fn, ATOMIC, dict(split, BLOCK_D=128, D1=0, TMA=tma,
                                                                              DQ_TMA=tma), 4, 3)[1])
""")
    rows = {(name, tma): (widths, bulk, int(spill)) for name, tma, widths, bulk, spill in lines}
    for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd_atomic"):
        for tma in ("True", "False"):
            widths, bulk, _ = rows[name, tma]
            assert widths == "16,64", (name, tma, widths)
            assert bulk == ("1" if tma == "True" else "0"), (name, tma)
    for tma in ("True", "False"):
        assert rows["_attn_bwd_atomic", tma][2] < rows["padded", tma][2], rows


@needs_triton
def test_triton_fp32_atomic_configs_fit_hopper_shared_memory():
    """fp32 in the single-pass backward at head dims 80, 96 (split) and 128 (one 128-wide tile): the
    config the launcher runs with autotuning off (the pinned 32 x 32 one at a 128-wide tile, else the
    safe one) compiles for sm_90 within the H100's 227 KB of shared memory per block, while the safe
    config at d 128 would not (the 262 KB the H100 refused, correctness-gpu-run15)."""
    lines = run_sm90(r"""
import torch
F32 = {n: "*fp32" for n in "Q K V O DO DQ DK DV L Delta".split()}
def shared(fn, const, w, s):
    const = {n: v for n, v in const.items() if n in fn.arg_names}
    const.update({n: 1 for n in fn.arg_names if n.startswith("stride_") and n.endswith("d")})
    sig = {n: F32.get(n) or ("constexpr" if n in const else "fp32" if n.endswith("scale") else "i32") for n in fn.arg_names}
    src = ASTSource(fn=fn, signature=sig, constexprs=const,
                    attrs={(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in F32 if n in fn.arg_names})
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": w, "num_stages": s}).metadata.shared
safe = fc._config(fc._BWD_ATOMIC_SAFE)
for d in (80, 96, 128):
    block_d, d1 = fc._head_dim_tiles(d)
    for name, c in (("launch", fc._pinned_atomic_config(torch.float32, d) or safe), ("safe", safe)):
        if name == "safe" and d != 128:
            continue
        const = dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=True, TMA=True, DQ_TMA=True, **c.kwargs)
        print(d, name, shared(ft._attn_bwd_atomic.fn, const, c.num_warps, c.num_stages), fc.SM90_MAX_SHARED)
""")
    got = {(int(d), name): (int(used), int(limit)) for d, name, used, limit in lines}
    assert set(got) == {(80, "launch"), (96, "launch"), (128, "launch"), (128, "safe")}, got
    for (d, name), (used, limit) in got.items():
        assert (used <= limit) == (name == "launch"), (d, name, used, limit)


# ----------------------------------------------------------------------------- validation

def _t(*shape, dtype=torch.float32, device="cpu"):
    return torch.zeros(shape, dtype=dtype, device=device)


BAD_INPUTS = [
    pytest.param(lambda: (_t(8, 16), _t(8, 16), _t(8, 16), False), "at least 3 dims", id="2d"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 1, 8, 16), _t(1, 1, 8, 16), False), "rank", id="rank"),
    pytest.param(lambda: (_t(2, 8, 16), _t(3, 8, 16), _t(3, 8, 16), False), "batch dims", id="batch"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 32), _t(1, 8, 32), False), "head dim mismatch", id="headdim"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 16), _t(1, 9, 16), False), "seq length mismatch", id="kvseq"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 16, dtype=torch.float16), _t(1, 8, 16), False),
                 "dtype mismatch", id="dtype-mismatch"),
    pytest.param(lambda: (_t(1, 8, 16, dtype=torch.float64), _t(1, 8, 16, dtype=torch.float64),
                          _t(1, 8, 16, dtype=torch.float64), False), "unsupported dtype", id="float64"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 16, device="meta"), _t(1, 8, 16), False),
                 "device mismatch", id="device"),
    pytest.param(lambda: (_t(1, 0, 16), _t(1, 8, 16), _t(1, 8, 16), False), "seq lengths", id="empty"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 16), _t(1, 8, 16), "no"), r"is_causal must be a bool \(True or False\), got 'no'",
                 id="is_causal-str"),
    pytest.param(lambda: (_t(1, 8, 16), _t(1, 8, 16), _t(1, 8, 16), 1), "is_causal must be a bool", id="is_causal-int"),
]


@pytest.mark.parametrize("make,match", [p for p in BAD_INPUTS if p.id != "float64"])
def test_naive_rejects_bad_inputs(make, match):
    with pytest.raises(ValueError, match=match):
        naive_attention(*make())


def test_triton_rejects_bf16_under_the_interpreter():
    """Issue 23: the interpreter's bf16 tl.dot gave finite values around 1e9 and no error."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter is only used without a GPU")
    q = _t(1, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="bfloat16 is not supported .* interpreter .* supported there: float32, float16"):
        FlashAttentionTriton.apply(q, q, q, False)


@pytest.mark.parametrize("cls", [FlashAttentionTorch, FlashAttentionTriton], ids=["torch", "triton"])
@pytest.mark.parametrize("make,match", BAD_INPUTS)
def test_flash_rejects_bad_inputs(cls, make, match):
    with pytest.raises(ValueError, match=match):
        cls.apply(*make())


@pytest.mark.parametrize("d", [8, 129, 256])
def test_triton_rejects_unsupported_head_dim(d):
    q = _t(1, 8, d)
    with pytest.raises(ValueError, match="head dim"):
        FlashAttentionTriton.apply(q, q, q, False)


def test_torch_accepts_any_head_dim():
    q, k, v, do = make_inputs((1, 9, 3), (1, 9, 3), torch.float32, "cpu")
    check_against_reference(FlashAttentionTorch, q, k, v, do, True)


def test_triton_rejects_cpu_tensors_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = _t(1, 8, 16)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        FlashAttentionTriton.apply(q, q, q, False)


# ----------------------------------------------------------------------------- naive / sdpa / registry

@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k", [(33, 33), (20, 41), (41, 20)])
def test_naive_matches_sdpa(is_causal, n_q, n_k):
    q, k, v, _ = make_inputs((2, 3, n_q, 24), (2, 3, n_k, 24), torch.float64, "cpu")
    out = naive_attention(q, k, v, is_causal)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    torch.testing.assert_close(out, ref)


def test_naive_gradients_match_reference():
    q, k, v, do = make_inputs((1, 2, 19, 16), (1, 2, 19, 16), torch.float32, "cpu")
    qg, kg, vg = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = naive_attention(qg, kg, vg, True)
    out.backward(do)
    r_o, _, r_dq, r_dk, r_dv = reference(q, k, v, True, do)
    for a, b in ((out, r_o), (qg.grad, r_dq), (kg.grad, r_dk), (vg.grad, r_dv)):
        assert rel_err(a, b) < 1e-5


def test_naive_annotations_recorded():
    q, k, v, _ = make_inputs((1, 16, 8), (1, 16, 8), torch.float32, "cpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        naive_attention(q, k, v, True)
    names = {e.name for e in prof.events()}
    for name in ("computing attention scores", "computing softmax", "final matmul"):
        assert name in names, names


def test_annotate_is_a_plain_context_manager():
    with annotate("some region"):
        x = torch.ones(2) + 1
    assert x.sum().item() == 4


@pytest.mark.parametrize("name", ["naive", "flash_torch", "flash_triton", "sdpa"])
def test_attention_by_name(name):
    if name == "flash_triton" and not TRITON_OK:
        pytest.skip("no CUDA and TRITON_INTERPRET != 1")
    device = TRITON_DEVICE if name == "flash_triton" else "cpu"
    q, k, v, _ = make_inputs((1, 2, 24, 16), (1, 2, 24, 16), torch.float32, device)
    f = attention_by_name(name, OPTS) if name == "flash_triton" else attention_by_name(name)
    out = f(q, k, v, True)
    r_o = reference(q, k, v, True, torch.zeros_like(q))[0]
    assert rel_err(out, r_o) < tolerance(torch.float32, device)


def test_attention_by_name_unknown():
    with pytest.raises(ValueError, match="unknown attention"):
        attention_by_name("flash_cuda")
    with pytest.raises(ValueError, match="takes no FlashOptions"):
        attention_by_name("sdpa", OPTS)


def test_attention_flops():
    fwd = 4 * 8 * 128 * 256 * 64
    assert attention_flops(8, 128, 256, 64, False, "fwd") == fwd
    assert attention_flops(8, 128, 256, 64, True, "fwd") == fwd / 2
    assert attention_flops(8, 128, 256, 64, False, "bwd") == 2.5 * fwd
    assert attention_flops(8, 128, 256, 64, True, "fwd_bwd") == 3.5 * fwd / 2
    with pytest.raises(ValueError):
        attention_flops(8, 128, 256, 64, False, "sideways")


# ----------------------------------------------------------------------------- GPU only

@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k,d", [(256, 256, 64), (333, 333, 80), (200, 517, 128), (1024, 1024, 64)])
def test_triton_gpu_matches_reference(dtype, is_causal, n_q, n_k, d):
    q, k, v, do = make_inputs((2, 4, n_q, d), (2, 4, n_k, d), dtype, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal)


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("n_q,n_k,d", [(256, 256, 64), (333, 333, 80), (300, 300, 96), (200, 517, 128),
                                       (1024, 1024, 64)])
def test_triton_gpu_backward_variants(dtype, is_causal, n_q, n_k, d, variant):
    q, k, v, do = make_inputs((2, 4, n_q, d), (2, 4, n_k, d), dtype, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=opts(variant=variant))


@gpu
@needs_cuda
@pytest.mark.parametrize("dq_tma", [True, False], ids=["bulk-reduce", "element-atomics"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("n_q,n_k,d,is_causal", [(333, 333, 80, True), (512, 200, 64, False), (700, 700, 128, True)])
def test_triton_gpu_atomic_dq_reduction_paths(n_q, n_k, d, is_causal, dtype, dq_tma):
    """The single-pass backward's dQ through descriptor bulk reductions and through element atomics
    (the interpreter has no descriptor reductions: only the GPU runs the first); descriptors forced
    on at these small sizes."""
    options = opts(variant="atomic", tma_min_scores=0, atomic_dq_tma=dq_tma)
    q, k, v, do = make_inputs((2, 4, n_q, d), (2, 4, n_k, d), dtype, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=options)


@gpu
@needs_cuda
@pytest.mark.parametrize("tma", [True, False], ids=["descriptors", "pointers"])
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [48, 80, 96])
def test_triton_gpu_split_head_dims_bf16(d, is_causal, variant, tma):
    """bf16 (which the interpreter cannot check) at the split head dims, ragged lengths, both
    backward variants, descriptors forced on at this size (dQ by bulk reduce-add) or off."""
    rec = LaunchRecorder()
    options = opts(variant=variant, tma_min_scores=0, tma=tma, recorder=rec)
    q, k, v, do = make_inputs((2, 4, 333, d), (2, 4, 517, d), torch.bfloat16, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=options)
    assert rec.summary()["d_tiles"] == flash_launch._head_dim_label(d)


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("d", [80, 96])
def test_triton_gpu_split_head_dims_autotuned(d, variant):
    """Every config of the autotune lists at the split head dims (bf16): the autotuner benchmarks
    each (one over the shared memory is skipped by the autotuner, any other failure raises); the pick
    is correct."""
    q, k, v, do = make_inputs((1, 4, 1000, d), (1, 4, 1000, d), torch.bfloat16, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=FlashOptions(variant=variant))


@gpu
@needs_cuda
@settings(max_examples=15, deadline=None)
@given(case=attention_case(max_seq=300), dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
       variant=st.sampled_from(BACKWARD_VARIANTS))
def test_triton_gpu_hypothesis(case, dtype, variant):
    is_causal, n_q, n_k, d, lead, seed = case
    log_gpu_case("test_triton_gpu_hypothesis", case=case, dtype=dtype, variant=variant)
    q, k, v, do = make_inputs(lead + (n_q, d), lead + (n_k, d), dtype, "cuda", seed=seed)
    check_against_reference(FlashAttentionTriton, q, k, v, do, is_causal, options=opts(variant=variant))


@gpu
@needs_cuda
@pytest.mark.parametrize("kind", ["triton", "compiled"])
def test_triton_gpu_backward_selection(kind):
    q, k, v, do = make_inputs((1, 4, 300, 64), (1, 4, 300, 64), torch.bfloat16, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=opts(backward=kind))


@gpu
@needs_cuda
@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_triton_gpu_matches_sdpa_bf16(is_causal):
    q, k, v, _ = make_inputs((1, 8, 2048, 64), (1, 8, 2048, 64), torch.bfloat16, "cuda")
    out = FlashAttentionTriton.apply(q, k, v, is_causal, OPTS)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=is_causal)
    assert rel_err(out, ref) < 2e-2


@gpu
@needs_cuda
@pytest.mark.parametrize("variant", BACKWARD_VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_triton_gpu_autotuned_configs(dtype, variant):
    """The autotuned path (all configs benchmarked, the best one used) is correct too; for the
    single-pass backward the autotuner zeroes the dQ buffer before each timed run (reset_to_zero),
    else its atomics would accumulate every benchmark run into the result. The second call launches
    the resolved pick without the autotuner."""
    options = FlashOptions(variant=variant)  # autotune=True, the default
    q, k, v, do = make_inputs((1, 4, 1000, 64), (1, 4, 1000, 64), dtype, "cuda")
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=options)
    check_against_reference(FlashAttentionTriton, q, k, v, do, True, options=options)
    assert flash_triton.autotune_enabled(options) and not flash_triton.autotune_enabled(OPTS)


def test_a_half_launched_outside_torch_ops_runs_inside_an_op_the_profiler_sees():
    """impl.attention._launched_as: under a profiler the half runs inside an op of its own, the op that
    kernels launched from Python (the Gluon halves) are linked to; its result is the half's."""
    from torch.profiler import ProfilerActivity, profile

    from impl.attention import _launched_as

    half = _launched_as("impl_flash::test_forward", lambda q, k: (q @ k.transpose(-1, -2), q.sum()))
    q, k = torch.randn(2, 8, 4), torch.randn(2, 8, 4)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out, _ = half(q, k)
    torch.testing.assert_close(out, q @ k.transpose(-1, -2), rtol=0, atol=0)
    ops = [e for e in prof.events() if e.name == "impl_flash::test_forward"]
    assert len(ops) == 1 and ops[0].cpu_children, [e.name for e in prof.events()]
