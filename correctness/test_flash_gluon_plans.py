"""Call plans of the Gluon kernels under FlashOptions(kernels="auto") (flash_dispatch, "Gluon call plans").

CPU (the Gluon kernels cannot run here): the dispatch is driven with the sm_90 capability stubbed and the kernels
replaced by stand-ins whose "launch" computes a fingerprint of its arguments (so a plan that routed a tensor to
the wrong argument gives other outputs): a signature's first call goes through the launcher (checks, JIT launch,
plan stored), the next ones launch the compiled stand-ins directly with the same outputs and the same
LaunchRecord; a change of strides, causal, the table's config or the options misses, a pointer off 16-byte
alignment never gets a plan, direct_launch=False never uses one; the shared layouts are built once.

GPU (marked, H100/H200): plan hits give the bits of the launchers' path (direct_launch=False) at d 128 and 64
causal, for new tensors, a misaligned view, ragged lengths; bad input after a plan raises as before.
"""
from __future__ import annotations

import dataclasses
import inspect
import types

import pytest
import torch

from impl.attention import FlashAttentionTriton, FlashOptions, LaunchRecorder, kernel_table as kt
from kits.gluon import needs_gluon

HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)


# ----------------------------------------------------------------------------- CPU: stand-in kernels

def _fwd_kernel(a):
    q, k, v, o = (a[n].base for n in ("q_desc", "k_desc", "v_desc", "o_desc"))
    o.copy_(q + 2 * k + 3 * v + a["N_K"] + a["IS_CAUSAL"])
    a["L"].copy_(q.float().sum(-1) - k.float().sum(-1))


def _rows(t, shape, stride):
    """The (B, H, n_q) statistic in t whose rows lie `stride` apart (the preprocessing kernel's STATS_STRIDE)."""
    return t.as_strided(shape, (shape[1] * stride, stride, 1))


def _preprocess_kernel(a):
    delta = (a["O"].float() * a["DO"].float()).sum(-1)
    stride = a["STATS_STRIDE"] or a["N_Q"]  # the ws backward's stats_smem: padded rows
    _rows(a["Delta"], delta.shape, stride).copy_(delta)
    if a["NL2"] is not None:  # its prescaled_lse: −lse·log2 e beside D
        _rows(a["NL2"], delta.shape, stride).copy_(a["L"] * -1.4426950408889634)
    a["DQ"].zero_()


def _stat(x, shape):
    """A row statistic the ws backward reads: a tensor, or (stats_smem) a TMA descriptor over (B·H, n_q) rows of its
    base, read through the descriptor's shape and strides as TMA would (a plan's base is the buffer it allocated)."""
    if hasattr(x, "block_shape"):
        x = x.base.as_strided(tuple(x.shape), tuple(x.strides))
    return x.reshape(shape)


def _bwd_kernel(a):
    q, k, v, do, dq, dk, dv = (a[n].base for n in ("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc", "dk_desc",
                                                   "dv_desc"))
    dq.add_(q.float() * _stat(a["L"], q.shape[:-1])[..., None] + _stat(a["Delta"], q.shape[:-1])[..., None])
    dk.copy_(k + 2 * do)
    dv.copy_(3 * v - do + a["N_Q"])


class _Compiled:
    """Stands in for a CompiledKernel: its launcher call (grid x3, stream, function, metadata, hooks x2, then
    every parameter) runs the stand-in kernel."""

    def __init__(self, jit):
        self.jit, self.function, self.packed_metadata = jit, "fn", "packed"

    @property
    def run(self):
        def launch(*a):
            values = a[9:]
            assert len(values) == len(self.jit.arg_names)
            self.jit.log.append(("direct", self.jit.name))
            self.jit.body(dict(zip(self.jit.arg_names, values)))
        return launch

    def launch_metadata(self, grid, stream, *args):
        return None


class _Jit:
    """Stands in for a JITFunction: fn[grid](*args, **kwargs) binds like JITFunction.run, runs the stand-in
    kernel and returns the compiled stand-in."""

    def __init__(self, real, name, body, log):
        self.signature = inspect.signature(real.fn)  # (the interpreter's functions have no .signature)
        self.arg_names = list(self.signature.parameters)
        self.name, self.body, self.log = name, body, log
        self.compiled = _Compiled(self)

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.log.append(("jit", self.name))
            bound = self.signature.bind(*args, **{k: x for k, x in kwargs.items() if k in self.arg_names})
            bound.apply_defaults()
            self.body(dict(bound.arguments))
            return self.compiled
        return run


def _drop_floors(monkeypatch):
    """The dispatch reads the shipped table with every entry's min_seq 0 (its measured floors send short calls
    to Triton, and these tests are about the Gluon path at short lengths)."""
    from impl.attention import flash_dispatch
    table = kt.shipped_table()
    floorless = kt.KernelTable(tuple(dataclasses.replace(e, min_seq=0, losses=()) for e in table.entries), table.rule)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: floorless)


@pytest.fixture
def fake_sm90(monkeypatch):
    """The dispatch on CPU tensors as on an sm_90 device, the Gluon kernels and the Triton preprocessing kernel
    replaced by stand-ins; an empty plan cache; the table without its length floors. Returns the launch log."""
    from impl.attention import (flash_dispatch, flash_gluon_bwd_ws, flash_gluon_common, flash_gluon_ws,
                                flash_kernels, flash_launch)
    log = []
    monkeypatch.setattr(flash_dispatch, "_capability", lambda t: (9, 0))
    monkeypatch.setattr(flash_gluon_common, "check_device", lambda device, fn="": None)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: types.SimpleNamespace(multi_processor_count=132))
    for mod, name, body in ((flash_gluon_ws, "_attn_fwd_ws_sm90", _fwd_kernel),
                            (flash_gluon_bwd_ws, "_attn_bwd_ws_sm90", _bwd_kernel),
                            (flash_kernels, "_attn_bwd_preprocess", _preprocess_kernel)):
        monkeypatch.setattr(mod, name, _Jit(getattr(mod, name), name, body, log))
    monkeypatch.setattr(flash_launch, "_calls", {})
    _drop_floors(monkeypatch)
    return log


def _inputs(shape=(1, 2, 40, 128), seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(shape, generator=g).to(dtype) for _ in range(4))
    lse = torch.randn(shape[:-1], generator=g)
    return q, k, v, q + k, do, lse  # o: any tensor in q's shape


def _fwd(q, k, v, causal, options):
    from impl.attention import flash_dispatch
    return flash_dispatch.forward(q, k, v, causal, options)


def _bwd(q, k, v, o, do, lse, causal, options):
    from impl.attention import flash_dispatch
    return flash_dispatch.backward(q, k, v, o, do, lse, causal, options)


def _kinds(log):
    kinds = [kind for kind, _ in log]
    log.clear()
    return kinds


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@needs_gluon
@pytest.mark.parametrize("d", [128, 64])
def test_a_plan_hit_launches_the_compiled_kernels_with_the_slow_paths_outputs_and_record(fake_sm90, d):
    """First call: the launchers (JIT launches); later calls, new tensors included: only direct launches, the
    outputs the slow path gives for the same tensors, the same LaunchRecord (the plan's one object)."""
    log = fake_sm90
    rec = LaunchRecorder()
    opts = FlashOptions(kernels="auto", recorder=rec)
    slow = dataclasses.replace(opts, direct_launch=False)
    q, k, v, o, do, lse = _inputs((1, 2, 40, d))
    first = _fwd(q, k, v, True, opts)
    assert _kinds(log) == ["jit"] and first[2].kernel == "gluon_ws"
    first_b = _bwd(q, k, v, o, do, lse, True, opts)
    assert _kinds(log) == ["jit", "jit"]  # the preprocessing kernel, the ws backward
    for seed in (0, 1, 2):  # seed 0: the same tensors; 1, 2: new ones (other addresses)
        x = _inputs((1, 2, 40, d), seed)
        ref, ref_b = _fwd(*x[:3], True, slow), _bwd(*x, True, slow)
        assert _kinds(log) == ["jit"] * 3  # direct_launch=False: the launchers, every call
        hit, hit_b = _fwd(*x[:3], True, opts), _bwd(*x, True, opts)
        assert _kinds(log) == ["direct"] * 3
        assert _same(hit[:2], ref[:2]) and _same(hit_b[:3], ref_b[:3]), seed
        assert hit[2] == ref[2] == first[2] and hit[2] is first[2] and rec.last["fwd"] is first[2]
        assert hit_b[3] == ref_b[3] == first_b[3] and hit_b[3] is first_b[3] and rec.last["bwd"] is first_b[3]
        assert hit_b[0].dtype == q.dtype and hit_b[1].dtype == k.dtype
    assert _same(_fwd(q, k, v, True, opts)[:2], first[:2])  # and the first call's own outputs


@needs_gluon
@pytest.mark.parametrize("stats_smem", [False, True], ids=["prescaled_lse", "stats_smem"])
def test_a_prescaled_or_stats_smem_plan_gives_the_launchers_outputs(fake_sm90, monkeypatch, stats_smem):
    """Issue 47, ws prescaled lse and ws stats in shared memory: a table entry naming GluonBwdWsConfig(prescaled_lse=
    True[, stats_smem=True]) at d 128 causal; the plan has a fifth buffer (−lse·log2 e), and a hit returns the
    gradients (its first three outputs). With stats_smem the launcher logs the (B, H, 44) statistics' buffers whole
    (41 query rows, rows padded to 4), so the plan allocates them in that shape and rebases the kernel's (B·H, 41)
    descriptors of row stride 44 onto them; the stand-ins write and read the statistics at that stride (the
    preprocessing kernel's STATS_STRIDE, TMA's strides), and a hit gives the launcher's outputs, new tensors too."""
    from impl.attention import flash_dispatch
    from impl.attention.flash_gluon_bwd_ws import GluonBwdWsConfig
    log = fake_sm90
    config = GluonBwdWsConfig(prescaled_lse=True, stats_smem=stats_smem)
    table = flash_dispatch.shipped_table()  # fake_sm90's, without floors
    key = ("bwd", "sm_90", 128, True, "bfloat16")
    entries = tuple(dataclasses.replace(e, config=tuple(sorted(dataclasses.asdict(config).items())))
                    if e.key == key else e for e in table.entries)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: kt.KernelTable(entries, table.rule))
    opts = FlashOptions(kernels="auto")
    slow = dataclasses.replace(opts, direct_launch=False)
    first = _bwd(*_inputs((1, 2, 41, 128)), True, opts)
    assert _kinds(log) == ["jit", "jit"] and first[3].configs == (("bwd", repr(config)),)
    for seed in (0, 1):
        x = _inputs((1, 2, 41, 128), seed)
        ref = _bwd(*x, True, slow)
        assert _kinds(log) == ["jit", "jit"]
        hit = _bwd(*x, True, opts)
        assert _kinds(log) == ["direct", "direct"]
        assert _same(hit[:3], ref[:3]), seed
        q, lse = x[0], x[5]
        want = q.float() * (lse * -1.4426950408889634)[..., None] + (x[3].float() * x[4].float()).sum(-1)[..., None]
        assert torch.equal(ref[0], want.to(q.dtype)), seed  # what the stand-ins compute, through the padded rows


@needs_gluon
def test_a_dynamic_forward_gets_a_plan_that_zeroes_a_fresh_counter_each_call(fake_sm90, monkeypatch):
    """Issue 47, dynamic: the ws forward's tile counter is a buffer of the launch (LaunchLog.zeroed), so a table
    entry naming GluonWsConfig(persistent=True, dynamic=True) gets a plan (the counter's address once matched no
    input or buffer: no plan, every call took the launcher's host path, 0.2-0.5 ms on the H200), and each hit
    launches with a counter reading 0 although the stand-in counts into it, as the CTAs do."""
    from impl.attention import flash_dispatch, flash_gluon_ws, flash_launch
    log = fake_sm90
    config = flash_gluon_ws.GluonWsConfig(persistent=True, dynamic=True)
    table = flash_dispatch.shipped_table()  # fake_sm90's, without floors
    key = ("fwd", "sm_90", 128, True, "bfloat16")
    entries = tuple(dataclasses.replace(e, config=kt.config_pairs(config)) if e.key == key else e
                    for e in table.entries)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: kt.KernelTable(entries, table.rule))
    read = []

    def counting(a):
        read.append(int(a["COUNTER"].item()))
        a["COUNTER"].add_(7)
        _fwd_kernel(a)

    monkeypatch.setattr(flash_gluon_ws._attn_fwd_ws_sm90, "body", counting)
    opts = FlashOptions(kernels="auto")
    slow = dataclasses.replace(opts, direct_launch=False)
    first = _fwd(*_inputs()[:3], True, opts)
    assert _kinds(log) == ["jit"] and first[2].configs == (("fwd", repr(config)),)
    (plan,) = [p for sig, p in flash_launch._calls.items() if sig[0] == "gluon fwd"]
    assert plan.zeroed == (2,) and plan.outputs[2] == (torch.Size([1]), torch.int32)
    for seed in (0, 1, 2):
        x = _inputs(seed=seed)[:3]
        ref, hit, again = _fwd(*x, True, slow), _fwd(*x, True, opts), _fwd(*x, True, opts)
        assert _kinds(log) == ["jit", "direct", "direct"]
        assert _same(hit[:2], ref[:2]) and _same(again[:2], ref[:2]) and len(hit) == 3, seed
    assert read == [0] * 10


@needs_gluon
def test_a_plan_keeps_no_tensor_of_the_call_that_made_it(fake_sm90):
    from impl.attention import flash_launch
    q, k, v, o, do, lse = _inputs()
    opts = FlashOptions(kernels="auto")
    _fwd(q, k, v, True, opts)
    _bwd(q, k, v, o, do, lse, True, opts)
    plans = [p for key, p in flash_launch._calls.items() if key[0].startswith("gluon")]
    assert len(plans) == 2
    for plan in plans:
        for call in plan.calls:
            assert not any(isinstance(a, torch.Tensor) for a in call.args)
            assert all(desc.base is None for _, _, desc in call.descs_at)
            assert len(call.args) == len(call.kernel.jit.arg_names)


@needs_gluon
def test_the_signature_changes_with_everything_the_launches_depend_on(fake_sm90, monkeypatch):
    """Strides, causal, the table's config, the options: each a new signature (its first call through the
    launcher, then its own plan), never a stale plan; the first plan stays. The signature function itself
    also separates dtypes, devices, shapes of any input and the kernel."""
    from impl.attention import flash_dispatch, flash_launch
    log = fake_sm90
    opts = FlashOptions(kernels="auto")
    q, k, v, o, do, lse = _inputs()

    def twice(*x, causal=True, options=opts):
        kinds = []
        for _ in range(2):
            _fwd(*x[:3], causal, options)
            _bwd(*x, causal, options)
            kinds.append(_kinds(log))
        return kinds

    assert twice(q, k, v, o, do, lse) == [["jit"] * 3, ["direct"] * 3]
    # (B, S, H, d) storage seen as (B, H, S, d): other strides
    strided = tuple(t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, o, do)) + (lse,)
    assert twice(*strided) == [["jit"] * 3, ["direct"] * 3]
    assert twice(q, k, v, o, do, lse, causal=False) == [["jit"] * 3, ["direct"] * 3]  # the table has d 128 full
    assert twice(q, k, v, o, do, lse, options=FlashOptions(kernels="auto", tma=False)) == [["jit"] * 3,
                                                                                          ["direct"] * 3]
    n = len(flash_launch._calls)
    table = flash_dispatch.shipped_table()  # fake_sm90's, without floors
    other = []
    for e in table.entries:
        if e.key == ("fwd", "sm_90", 128, True, "bfloat16"):
            e = dataclasses.replace(e, config=tuple((f, 2 if f == "num_stages" else x) for f, x in e.config))
        other.append(e)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: kt.KernelTable(tuple(other)))
    records = [_fwd(q, k, v, True, opts)[2] for _ in range(2)]
    assert _kinds(log) == ["jit", "direct"] and len(flash_launch._calls) == n + 1  # the new config: its own plan
    assert "num_stages=2" in records[1].configs[0][1]
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: table)
    assert twice(q, k, v, o, do, lse) == [["direct"] * 3, ["direct"] * 3]  # the first plans are still there

    choice = table.lookup("bwd", "sm_90", 128, True, "bfloat16", 40)
    sig = lambda *t, c=choice, o=opts: flash_dispatch._signature("gluon bwd", c.kernel, c.config, True, o,  # noqa
                                                                 *t)
    base = sig(q, k, v, o, do, lse)
    assert base == sig(*_inputs(seed=3))  # the same layout, other tensors: the same signature
    changed = [sig(q, k.half(), v, o, do, lse), sig(q, k, v, o, do, lse.double()), sig(q, k, v, o[..., :64], do, lse),
               sig(q, k, v, o, do, lse.to("meta")), sig(q, k, v, o, do, lse[..., :20]),
               sig(q, k, v, o, do, lse, c=table.lookup("bwd", "sm_90", 64, True, "bfloat16", 40)),
               sig(q, k, v, o, do, lse, o=FlashOptions(kernels="auto"))]
    assert all(s != base for s in changed) and len(set(changed)) == len(changed)
    assert sig(q, k, v, o, do, lse, o=FlashOptions(kernels="auto", direct_launch=False)) is None


@needs_gluon
def test_a_pointer_off_16_byte_alignment_never_gets_a_plan(fake_sm90):
    """o is no TMA operand (the launcher's checks pass a misaligned o), but Triton specializes on its
    alignment: such a call runs the launcher every time, stores no plan, and a plan made for aligned tensors
    is not taken for it."""
    from impl.attention import flash_launch
    log = fake_sm90
    opts = FlashOptions(kernels="auto")
    q, k, v, o, do, lse = _inputs()
    off = torch.empty(o.numel() + 1, dtype=o.dtype)[1:].view(o.shape).copy_(o)
    assert off.data_ptr() % 16 and off.stride() == o.stride()
    for _ in range(3):
        _bwd(q, k, v, off, do, lse, True, opts)
        assert _kinds(log) == ["jit", "jit"]
    assert not flash_launch._calls
    ref = _bwd(q, k, v, o, do, lse, True, opts)
    _kinds(log)
    assert _same(_bwd(q, k, v, o, do, lse, True, opts)[:3], ref[:3]) and _kinds(log) == ["direct"] * 2
    got = _bwd(q, k, v, off, do, lse, True, opts)
    assert _kinds(log) == ["jit", "jit"] and _same(got[:3], ref[:3])


@needs_gluon
def test_input_the_launcher_refuses_misses_the_plan_and_takes_triton(fake_sm90, monkeypatch):
    """After a plan exists, a k the TMA cannot take (a head-dim stride) misses it, is refused by the launcher's
    checks and runs the Triton launcher, as without plans."""
    from impl.attention import flash_dispatch
    log = fake_sm90
    opts = FlashOptions(kernels="auto")
    q, k, v, *_ = _inputs()
    _fwd(q, k, v, True, opts)
    _fwd(q, k, v, True, opts)
    assert _kinds(log) == ["jit", "direct"]
    triton_calls = []
    monkeypatch.setattr(flash_dispatch, "_forward", lambda *a: triton_calls.append(a) or "triton")
    wide = torch.randn(1, 2, 40, 256).to(torch.bfloat16)[..., ::2]
    assert _fwd(q, wide, v, True, opts) == "triton" and len(triton_calls) == 1 and _kinds(log) == []


@needs_gluon
def test_direct_launch_false_never_stores_or_uses_a_plan(fake_sm90):
    from impl.attention import flash_launch
    log = fake_sm90
    opts = FlashOptions(kernels="auto", direct_launch=False)
    x = _inputs()
    for _ in range(3):
        _fwd(*x[:3], True, opts)
        _bwd(*x, True, opts)
        assert _kinds(log) == ["jit"] * 3
    assert not flash_launch._calls


@needs_gluon
def test_aliased_inputs_make_no_plan_but_a_later_distinct_call_does(fake_sm90):
    """q, k, v one tensor: which argument is which cannot be told by address, so no plan; the same signature
    with distinct tensors then makes one, which an aliased call may use (each argument by position)."""
    from impl.attention import flash_launch
    log = fake_sm90
    opts = FlashOptions(kernels="auto")
    q, k, v, *_ = _inputs()
    _fwd(q, q, q, True, opts)
    assert not flash_launch._calls
    _fwd(q, k, v, True, opts)
    assert len(flash_launch._calls) == 1
    _kinds(log)
    slow = _fwd(q, q, q, True, dataclasses.replace(opts, direct_launch=False))
    hit = _fwd(q, q, q, True, opts)
    assert _kinds(log) == ["jit", "direct"] and _same(hit[:2], slow[:2])


@needs_gluon
def test_the_shared_layouts_are_built_once_per_block_dtype_and_swizzle():
    from triton.experimental.gluon import language as gl

    from impl.attention import flash_gluon_common as c
    a = c.shared_layout(64, 128, torch.bfloat16)
    assert a is c.shared_layout(64, 128, torch.bfloat16)
    assert a == gl.NVMMASharedLayout.get_default_for([1, 1, 64, 128], gl.bfloat16)
    assert c.shared_layout(64, 128, torch.bfloat16, 64) == gl.NVMMASharedLayout(64, 16, rank=4)
    others = [c.shared_layout(64, 128, torch.bfloat16, 64), c.shared_layout(64, 64, torch.float32),
              c.shared_layout(128, 128, torch.bfloat16), c.shared_layout(64, 64, torch.bfloat16)]
    assert all(x is not a for x in others)
    t = torch.zeros(1, 2, 40, 128, dtype=torch.float16)
    assert c._descriptor(t, 64, 0, 128).layout is c.shared_layout(64, 128, torch.float16)
    assert c._descriptor(t, 64, 0, 0) is None


# ----------------------------------------------------------------------------- GPU (unrun until a GPU session)

def _fwd_bwd(q, k, v, do, causal, options):
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = FlashAttentionTriton.apply(q, k, v, causal, options)
    o.backward(do)
    return [o.detach(), q.grad, k.grad, v.grad]


def _gpu_inputs(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=g).to("cuda", torch.bfloat16) for _ in range(4)]


@pytest.fixture
def no_floors(monkeypatch):
    """The GPU plan tests run the Gluon kernels at short lengths, which a measured floor would send to Triton."""
    _drop_floors(monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
@pytest.mark.parametrize("d", [128, 64])
@pytest.mark.parametrize("shape", [(2, 3, 512), (1, 4, 1029), (2, 2, 77)], ids=["2x3x512", "1x4x1029", "2x2x77"])
def test_gpu_plan_hits_give_the_launchers_bits(d, shape, monkeypatch, no_floors):
    """Forward and forward+backward at d 128 and 64 causal bf16 (the table's Gluon entries), ragged lengths
    included: each call with new tensors; the direct launches are taken and every output equals the
    launchers' (direct_launch=False) bit for bit but dQ (TMA reduce-adds in no fixed order: close); the records
    name the table's kernel."""
    from impl.attention import flash_launch
    rec = LaunchRecorder()
    direct = FlashOptions(autotune=False, kernels="auto", recorder=rec)
    slow = dataclasses.replace(direct, direct_launch=False)
    hits = []
    real = flash_launch._BoundCall.__call__
    monkeypatch.setattr(flash_launch._BoundCall, "__call__", lambda self, *a: (hits.append(1), real(self, *a))[1])
    for seed in range(3):
        q, k, v, do = _gpu_inputs((*shape, d), seed)
        before = len(hits)
        ref = _fwd_bwd(q, k, v, do, True, slow)
        assert len(hits) == before, "direct_launch=False took a plan"
        for _ in range(2):
            got = _fwd_bwd(q, k, v, do, True, direct)
            for name, x, r in zip(("o", "dq", "dk", "dv"), got, ref):
                if name == "dq":  # added into by TMA reduce-adds from every key tile, in no fixed order
                    torch.testing.assert_close(x, r, rtol=1e-2, atol=1e-2)
                else:
                    assert torch.equal(x, r), (name, seed)
        with torch.no_grad():
            o_ref = FlashAttentionTriton.apply(q, k, v, True, slow)
            assert torch.equal(FlashAttentionTriton.apply(q, k, v, True, direct), o_ref)
        assert rec.last["fwd"].kernel == "gluon_ws" and rec.last["bwd"].kernel == "gluon_ws"
    assert hits, "no plan hit"


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
@pytest.mark.parametrize("d", [128, 64])
def test_gpu_a_dynamic_forward_plan_gives_the_launchers_bits_call_after_call(d, monkeypatch, no_floors):
    """The dynamic forward (a table entry naming it at d causal) through its plan: each hit zeroes a fresh tile
    counter, so call after call (a counter left at its end would end every CTA after its first tile) the output
    equals the launcher's (direct_launch=False) bit for bit, at more CTA tiles (2x8x2048: 256) than programs."""
    from impl.attention import flash_dispatch, flash_gluon_ws, flash_launch
    config = flash_gluon_ws.GluonWsConfig(persistent=True, dynamic=True)
    table = flash_dispatch.shipped_table()
    key = ("fwd", "sm_90", d, True, "bfloat16")
    entries = tuple(dataclasses.replace(e, config=kt.config_pairs(config)) if e.key == key else e
                    for e in table.entries)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: kt.KernelTable(entries, table.rule))
    hits = []
    real = flash_launch._BoundCall.__call__
    monkeypatch.setattr(flash_launch._BoundCall, "__call__", lambda self, *a: (hits.append(1), real(self, *a))[1])
    direct = FlashOptions(kernels="auto")
    slow = dataclasses.replace(direct, direct_launch=False)
    with torch.no_grad():
        for seed in range(2):
            q, k, v, _ = _gpu_inputs((2, 8, 2048, d), seed)
            ref = FlashAttentionTriton.apply(q, k, v, True, slow)
            for _ in range(3):
                assert torch.equal(FlashAttentionTriton.apply(q, k, v, True, direct), ref), seed
    assert len(hits) >= 5, "the dynamic forward took no plan"


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
def test_gpu_a_misaligned_view_is_its_own_signature(no_floors):
    """A 16-byte-misaligned o (and lse) after a plan for aligned ones: the launcher's path (other Triton
    specializations of both kernels), the same bits as direct_launch=False, and close to the aligned call's
    (only the loads' vector widths differ)."""
    direct = FlashOptions(autotune=False, kernels="auto")
    slow = dataclasses.replace(direct, direct_launch=False)
    from impl.attention import flash_dispatch
    q, k, v, do = _gpu_inputs((2, 3, 256, 128), 0)
    o, lse, _ = flash_dispatch.forward(q, k, v, True, slow)
    for _ in range(2):
        ref = flash_dispatch.backward(q, k, v, o, do, lse, True, direct)
    off_o = torch.empty(o.numel() + 8, dtype=o.dtype, device="cuda")[1:1 + o.numel()].view(o.shape).copy_(o)
    off_lse = torch.empty(lse.numel() + 1, device="cuda")[1:].view(lse.shape).copy_(lse)
    assert off_o.data_ptr() % 16 and off_lse.data_ptr() % 16
    for _ in range(2):
        got = flash_dispatch.backward(q, k, v, off_o, do, off_lse, True, direct)
        base = flash_dispatch.backward(q, k, v, off_o, do, off_lse, True, slow)
        for name, x, y, r in zip(("dq", "dk", "dv"), got[:3], base[:3], ref[:3]):
            assert name == "dq" or torch.equal(x, y), name  # dQ: reduce-adds in no fixed order
            torch.testing.assert_close(x, y, rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(x, r, rtol=1e-2, atol=1e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
def test_gpu_bad_input_after_a_plan_raises_as_before(no_floors):
    """With plans in place: mismatched k/v shapes and a wrong lse raise what they raise without plans (the
    Triton path's or the launcher's error, whichever answered before)."""
    from impl.attention import flash_dispatch
    direct = FlashOptions(autotune=False, kernels="auto")
    slow = dataclasses.replace(direct, direct_launch=False)
    q, k, v, do = _gpu_inputs((1, 2, 128, 128), 0)
    o, lse, _ = flash_dispatch.forward(q, k, v, True, direct)
    flash_dispatch.forward(q, k, v, True, direct)
    flash_dispatch.backward(q, k, v, o, do, lse, True, direct)
    flash_dispatch.backward(q, k, v, o, do, lse, True, direct)
    bad = {"fwd k short": lambda opts: flash_dispatch.forward(q, k[..., :64, :], v, True, opts),
           "fwd v wide": lambda opts: flash_dispatch.forward(q, k, torch.cat([v, v], -1), True, opts),
           "bwd lse shape": lambda opts: flash_dispatch.backward(q, k, v, o, do, lse[..., :64], True, opts),
           "bwd do dtype": lambda opts: flash_dispatch.backward(q, k, v, o, do.half(), lse, True, opts)}
    for name, call in bad.items():
        errors = []
        for opts in (slow, direct):
            try:
                call(opts)
                errors.append(None)
            except Exception as e:  # noqa: BLE001 -- the same type and message either way
                errors.append((type(e), str(e)))
        assert errors[0] == errors[1], name


@needs_gluon
def test_a_call_shorter_than_the_entrys_min_seq_runs_triton_and_gets_no_gluon_plan(fake_sm90, monkeypatch):
    """An entry with min_seq 64: calls with min(N_Q, N_K) < 64 (40 x 40, 64 queries x 40 keys) run the Triton
    launchers (stubbed) every time, with no Gluon launch, plan or signature; 64 x 64 runs the Gluon kernels and
    gets its plans."""
    from impl.attention import flash_dispatch, flash_launch
    log = fake_sm90
    table = flash_dispatch.shipped_table()  # fake_sm90's, without floors
    floored = kt.KernelTable(tuple(dataclasses.replace(e, min_seq=64) if e.d == 128 and e.causal else e
                                   for e in table.entries), table.rule)
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: floored)
    triton = []
    monkeypatch.setattr(flash_dispatch, "_forward", lambda *a: triton.append("fwd") or (a[0], a[0][..., 0], None))
    monkeypatch.setattr(flash_dispatch, "_backward", lambda *a: triton.append("bwd") or (*a[:3], None))
    signatures = []
    real_signature = flash_dispatch._signature
    monkeypatch.setattr(flash_dispatch, "_signature", lambda *a: signatures.append(a[0]) or real_signature(*a))
    opts = FlashOptions(kernels="auto")
    short = _inputs()
    long_q = _inputs((1, 2, 64, 128))
    mixed = long_q[:1] + short[1:3] + long_q[3:5] + long_q[5:]  # 64 queries, 40 keys
    for x in (short, mixed):
        for _ in range(2):
            _fwd(*x[:3], True, opts)
            _bwd(*x, True, opts)
    assert triton == ["fwd", "bwd"] * 4 and _kinds(log) == [] and signatures == []
    assert not any(key[0].startswith("gluon") for key in flash_launch._calls)
    for _ in range(2):
        record = _fwd(*long_q[:3], True, opts)[2]
        _bwd(*long_q, True, opts)
    assert record.kernel == "gluon_ws" and _kinds(log) == ["jit"] * 3 + ["direct"] * 3 and len(triton) == 8
    assert sum(key[0].startswith("gluon") for key in flash_launch._calls) == 2
