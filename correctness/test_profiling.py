"""Profiling helpers (issue 4): kernel classification, phase tables, the toy model's autocast
dtypes, the accumulation loops, and the memory-snapshot analysis on synthetic snapshots."""
from types import SimpleNamespace

import pytest
import torch

from impl.workloads import kernels as K
from impl.workloads import memory as M
from impl.workloads.steps import build_model, random_batch
from impl.model.toy import EXACT_SUM, accumulation_errors, accumulation_loops, format_facts, toy_autocast_dtypes

CPU = torch.device("cpu")


@pytest.mark.parametrize("name,cat", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_tn_align4>", "matmul"),
    ("void gemv2T_kernel_val<int, int, float, float, float, 128, 16, 4, 4, false>", "matmul"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "matmul"),
    ("triton_tem_fused_mm_0", "matmul"),
    ("aten::mm", "matmul"), ("aten::addmm", "matmul"), ("aten::bmm", "matmul"), ("aten::matmul", "matmul"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>", "softmax"),
    ("aten::_softmax", "softmax"), ("triton_red_fused__softmax_0", "softmax"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >", "reduction"),
    ("triton_per_fused_mean_pow_1", "reduction"), ("aten::sum", "reduction"),
    # autocast's casts are copies
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda> >", "copy"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >", "elementwise"),
    ("triton_poi_fused_add_mul_2", "elementwise"), ("aten::mul", "elementwise"), ("aten::masked_fill", "elementwise"),
    ("Memcpy DtoD (Device -> Device)", "copy"), ("Memset (Device)", "copy"), ("aten::copy_", "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    # attention: our Triton FlashAttention, SDPA's flash / cuDNN / memory-efficient kernels and CPU op,
    # but not an Inductor pointwise kernel named after the attention op it feeds
    ("_attn_fwd", "attention"), ("_attn_bwd_dkdv", "attention"), ("_attn_bwd_dq", "attention"),
    ("_attn_bwd_preprocess", "attention"),
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0", "attention"),
    ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
    ("triton_poi_fused__scaled_dot_product_cudnn_attention_transpose_view_5", "elementwise"),
    ("aten::_fused_adamw_", "elementwise"), ("_adamw_master_kernel", "elementwise"),
    ("some_unknown_kernel", "other"),
])
def test_classify_kernel(name, cat):
    assert K.classify_kernel(name) == cat


# --- phase tables -------------------------------------------------------------------------------
def _evt(name, start, end, kernels=(), self_us=0.0):
    return SimpleNamespace(name=name, device_type=SimpleNamespace(name="CPU"), is_async=False,
                           time_range=SimpleNamespace(start=start, end=end), self_cpu_time_total=self_us,
                           kernels=[SimpleNamespace(name=n, duration=d) for n, d in kernels])


def test_phase_attribution_by_launch_time_synthetic():
    """GPU path: kernels count where their launching op started; warm-up and everything nested in
    it is dropped; ops on another thread (autograd) inside the backward range count as backward."""
    events = [
        _evt("warm-up", 0, 100), _evt("forward", 1, 50), _evt("aten::mm", 2, 3, [("gemm_a", 40.0)]),
        _evt("forward", 200, 260),
        _evt("computing softmax", 210, 220), _evt("aten::_softmax", 211, 212, [("softmax_k", 5.0)]),
        _evt("aten::mm", 230, 231, [("gemm_a", 30.0)]), _evt("aten::add", 240, 241, [("elementwise_kernel", 3.0)]),
        _evt("backward", 300, 400), _evt("autograd::engine::evaluate_function: MmBackward0", 305, 350),
        _evt("aten::mm", 306, 307, [("gemm_a", 50.0), ("gemm_b", 20.0)]),
        _evt("optimizer step", 500, 520), _evt("aten::_foreach_add_", 501, 502, [("multi_tensor_apply_kernel", 7.0)]),
    ]
    p = K.build_phase_profile(events, steps=1, device_type="cuda")
    assert p.kernels["forward"] == {"softmax_k": [5.0, 1], "gemm_a": [30.0, 1], "elementwise_kernel": [3.0, 1]}
    assert p.kernels["computing softmax"] == {"softmax_k": [5.0, 1]}
    assert p.kernels["backward"] == {"gemm_a": [50.0, 1], "gemm_b": [20.0, 1]}
    assert p.range_wall_us["forward"] == [60]  # the warm-up forward's range is not a profiled one
    fb = p.table(("forward", "backward"))
    assert fb[0]["name"] == "gemm_a" and fb[0]["time_us"] == 80.0 and fb[0]["calls"] == 2
    assert abs(sum(r["share"] for r in fb) - 1.0) < 1e-12
    shares = p.category_shares(K.PHASES)
    assert shares["matmul"] == pytest.approx(100.0 / 115.0)
    ans = K.nsys_answers(p, batch=1, heads=1, seq=4, head_dim=2, layers=1)
    assert ans["top_forward"]["name"] == "gemm_a" and ans["top_stays_on_top"]
    assert [r["name"] for r in ans["non_matmul_nontrivial"]] == ["softmax_k", "elementwise_kernel"]
    assert ans["softmax_to_matmuls_flop_ratio"] == pytest.approx(K.SOFTMAX_FLOPS_PER_ELEMENT / (2 * 2 + 2 * 2))


def test_exposed_communication_on_synthetic_intervals():
    """A communication kernel's exposed time: its span less every other kind of device work (merged over
    streams) and less what an earlier-starting communication kernel already covered; returned in the
    order given."""
    busy = [(8.0, 12.0), (2.0, 4.0), (3.0, 6.0)]  # unsorted, two overlapping: [2, 6] and [8, 12]
    assert K.exposed_us([(0.0, 10.0)], busy) == [4.0]
    assert K.exposed_us([(20.0, 30.0), (0.0, 10.0)], busy) == [10.0, 4.0]  # order kept
    assert K.exposed_us([(0.0, 10.0), (5.0, 15.0), (2.0, 5.0)], []) == [10.0, 5.0, 0.0]  # counted once
    assert K.exposed_us([(2.0, 6.0), (9.0, 11.0)], busy) == [0.0, 0.0]  # hidden behind compute
    assert K.exposed_us([(6.0, 8.0)], busy) == [2.0] and K.exposed_us([], busy) == []  # touching edges


def test_step_parts_partition_the_phases_and_exposed_communication_per_phase():
    """step_breakdown's parts_ms: the PARTS ranges nested in forward and backward are taken out of their
    phase, attention apart, communication on its own; they sum to the kernel time. Its
    communication_exposed_ms sums each phase's exposed communication kernels."""
    events = [
        _evt("forward", 0, 100), _evt("aten::mm", 1, 2, [("gemm", 10.0)]),
        _evt("flash_fwd", 3, 4, [("_attn_fwd", 6.0)]),
        _evt("lm head forward", 50, 90), _evt("aten::mm", 51, 52, [("gemm", 20.0)]),
        _evt("backward", 100, 300), _evt("lm head backward", 101, 110),
        _evt("aten::mul", 102, 103, [("elementwise_kernel", 1.0)]),
        _evt("recompute", 120, 150), _evt("aten::mm", 121, 122, [("gemm", 8.0)]),
        _evt("flash", 123, 124, [("_attn_fwd", 6.0)]),
        _evt("aten::mm", 160, 161, [("gemm", 16.0)]), _evt("flash_bwd", 170, 171, [("_attn_bwd", 12.0)]),
        _evt("c10d::allreduce_", 180, 181, [("ncclDevKernel_AllReduce_Sum_bf16", 30.0)]),
        _evt("optimizer step", 400, 420), _evt("aten::_foreach_add_", 401, 402, [("multi_tensor_apply_kernel", 5.0)]),
    ]
    p = K.build_phase_profile(events, steps=1, device_type="cuda")
    p.exposed_comm = {"backward": {"ncclDevKernel_AllReduce_Sum_bf16": [7.0, 1]}}
    b = K.step_breakdown(p, step_s=200e-6)
    assert tuple(b["parts_ms"]) == K.STEP_PARTS
    assert {k: round(v * 1e3, 6) for k, v in b["parts_ms"].items()} == {
        "blocks forward": 10.0, "attention forward": 6.0, "lm head forward": 20.0, "recompute": 8.0,
        "attention recompute": 6.0, "blocks backward": 16.0, "attention backward": 12.0, "lm head backward": 1.0,
        "optimizer": 5.0, "communication": 30.0}
    assert sum(b["parts_ms"].values()) == pytest.approx(b["kernel_ms"])
    assert b["communication_exposed_ms"] == pytest.approx({"forward": 0.0, "backward": 7e-3, "optimizer step": 0.0})
    # a step that opened no part: no parts_ms (rows of other workloads stay as they were)
    plain = K.build_phase_profile([e for e in events if e.name not in K.PARTS], steps=1, device_type="cuda")
    assert "parts_ms" not in K.step_breakdown(plain, step_s=200e-6)


def test_profile_steps_tiny_model_cpu():
    """CPU path: ATen ops' self time per phase. The tiny model does 7 matmuls per layer plus the LM
    head per forward, so aten::mm must show exactly that many calls per pass."""
    model = build_model("tiny", 16, CPU)
    x, y = random_batch(model, 2, 16, CPU)
    p, _ = K.profile_steps(model, x, y, warmup=1, steps=2)
    layers = model.config["num_layers"]
    fwd = {r["name"]: r for r in p.table(("forward",))}
    assert fwd["aten::mm"]["calls"] == 2 * (7 * layers + 1)
    assert fwd["aten::bmm"]["calls"] == 2 * 2 * layers  # QK^T and PV per layer
    assert p.table(("computing softmax",))[0]["category"] == "softmax"
    assert {"forward", "backward", "optimizer step"} <= set(p.kernels)
    assert len(p.range_wall_us["forward"]) == 2
    ans = K.nsys_answers(p, batch=2, heads=4, seq=16, head_dim=16, layers=layers)
    # Which op tops a tiny CPU forward by self time is timing noise on a loaded 2-core machine (an
    # elementwise op with 9 calls per pass won once in CI); the answer must describe that op.
    top = ans["top_forward"]
    assert top["calls_per_pass"] == fwd[top["name"]]["calls"] / 2
    assert 0 < ans["matmul_share_forward"] <= 1 and 0 < ans["matmul_share_train_step"] <= 1
    p2, _ = K.profile_steps(model, x, y, warmup=0, steps=1, forward_only=True)
    assert "backward" not in p2.kernels and "forward" in p2.kernels


# --- mixed precision ----------------------------------------------------------------------------
def test_accumulation_ordering():
    v = accumulation_loops()
    e = accumulation_errors(v)
    assert e["fp32 += fp32"] < e["fp32 += fp16"] < e["fp16 += fp16"]
    # the in-place add promotes the fp16 addend to fp32 exactly as the explicit cast does
    assert v["fp32 += fp16"] == v["fp32 += fp16 cast to fp32"]
    assert v["fp16 += fp16"] < EXACT_SUM  # fp16's spacing near 10 swallows part of each 0.01


def test_format_facts():
    f = format_facts()
    assert f["fp16"]["max"] < f["bf16"]["max"] and f["bf16"]["eps"] > f["fp16"]["eps"]
    assert f["bf16"]["mantissa_bits"] == 7 and f["fp16"]["mantissa_bits"] == 10


def test_toy_autocast_dtypes_cpu():
    """Observed with torch's CPU autocast (fp16): unlike CUDA, CPU autocast keeps LayerNorm in
    the lower-precision type; parameters and gradients stay fp32, the loss is fp32."""
    d = toy_autocast_dtypes(CPU, torch.float16)
    assert d["parameters"] == ["float32"] and d["gradients"] == ["float32"]
    assert d["fc1 output"] == "float16" and d["logits"] == "float16" and d["loss"] == "float32"
    assert d["layernorm output"] in ("float16", "float32")  # recorded; torch 2.13 CPU gives float16


@pytest.mark.gpu
def test_toy_autocast_dtypes_cuda():
    d = toy_autocast_dtypes(torch.device("cuda"), torch.float16)
    assert d == {"parameters": ["float32"], "fc1 output": "float16", "layernorm output": "float32",
                 "logits": "float16", "loss": "float32", "gradients": ["float32"], "device_type": "cuda",
                 "autocast_dtype": "float16"}


# --- memory snapshot analysis -------------------------------------------------------------------
def _frame(name, filename="/x/src/impl/model/transformer.py", line=1):
    return dict(name=name, filename=filename, line=line)


def _snapshot():
    """Weights of 1000 bytes live before recording; then forward/backward markers, allocations,
    frees, and one block still live at the end."""
    mk = [_frame(M.MARKER_FUNC, "/x/src/impl/profiling/memory.py")]
    trace = [
        dict(action="alloc", addr=1, size=512, frames=mk),                       # 0 marker forward
        dict(action="free_requested", addr=1, size=512, frames=[]),
        dict(action="free_completed", addr=1, size=512, frames=[]),
        dict(action="alloc", addr=2, size=4096, frames=[_frame("forward", line=30),
                                                        _frame("__call__", "/x/torch/nn/modules/module.py")]),
        dict(action="alloc", addr=3, size=8192, frames=[_frame("<module>", "/other/thing.py"), _frame("big")]),
        dict(action="alloc", addr=4, size=512, frames=mk),                       # 5 marker backward
        dict(action="free_completed", addr=4, size=512, frames=[]),
        dict(action="free_completed", addr=3, size=8192, frames=[]),
        dict(action="alloc", addr=5, size=4096, frames=[_frame("forward", line=30),
                                                        _frame("__call__", "/x/torch/nn/modules/module.py")]),
        dict(action="free_completed", addr=5, size=4096, frames=[]),
        dict(action="segment_alloc", addr=9, size=2 << 20, frames=[]),
    ]
    segments = [dict(device=0, blocks=[dict(size=1000, state="active_allocated"), dict(size=4096, state="active_allocated"),
                                       dict(size=7000, state="inactive")])]
    return dict(device_traces=[trace], segments=segments)


def test_active_timeline_and_markers():
    snap = _snapshot()
    xs, ys = M.active_timeline(snap)
    assert xs == list(range(11))
    assert ys[0] == 1000 + 512 and ys[2] == 1000 and ys[4] == 1000 + 4096 + 8192 and ys[-1] == 1000 + 4096
    assert M.marker_indices(snap) == [0, 5]
    t = M.timeline_data(snap, ["forward", "backward"], max_points=2000)
    assert t["markers"] == [dict(name="forward", x=0), dict(name="backward", x=5)]
    assert t["peak_bytes"] == 1000 + 4096 + 8192 + 512 and t["markers_found"] == 2


def test_downsample_keeps_peak_and_bounds():
    xs = list(range(10_001))
    ys = [(i * 37) % 1000 for i in xs]
    ys[4321] = 10**9
    dx, dy = M.downsample(xs, ys, 500)
    assert len(dx) <= 500 and dx[0] == 0 and dx[-1] == 10_000 and max(dy) == 10**9
    assert dx == sorted(dx) and all(ys[x] == y for x, y in zip(dx, dy))
    assert M.downsample([1, 2], [3, 4], 500) == ([1, 2], [3, 4])


def test_match_and_largest_allocations():
    snap = _snapshot()
    m = M.match_allocation(snap, 4096)
    assert m["found"] and m["count"] == 2 and m["frames"][0].startswith("impl/model/transformer.py:30 forward")
    assert not M.match_allocation(snap, 3000)["found"]
    assert M.match_allocation(snap, 4000)["allocator_bytes"] == 4096  # rounded like the allocator
    big = M.largest_allocations(snap, top=2)
    assert big[0]["size"] == 8192 and big[0]["frames"] == ["impl/model/transformer.py:1 big"]
    assert big[1]["size"] == 4096 and big[1]["count"] == 2 and len(big[1]["frames"]) == 2
    assert M.residual_stream_bytes(4, 128, 2560, 4) == 4 * 128 * 2560 * 4


def test_render_timeline(tmp_path):
    t = M.timeline_data(_snapshot(), ["forward", "backward"])
    path = tmp_path / "t.png"
    from impl.report.figures import memory_timelines

    memory_timelines([("synthetic", t)], path, "synthetic")
    assert path.stat().st_size > 1000 and path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.gpu
def test_memory_recorder_cuda():
    dev = torch.device("cuda")
    with M.MemoryRecorder(dev) as rec:
        rec.mark("forward")
        a = torch.empty(4 * 128 * 64, device=dev)
        rec.mark("end")
    t = M.timeline_data(rec.snapshot, rec.marks)
    assert t["markers_found"] == 2
    assert M.match_allocation(rec.snapshot, a.numel() * 4)["found"]


def test_downsample_keeps_each_rise_and_fall():
    # 40 "layers" of 500 events each: a rise then a fall; min/max buckets keep every top and bottom
    ys = [(i % 500) if (i % 500) < 250 else 500 - (i % 500) for i in range(20_000)]
    xs = list(range(len(ys)))
    dx, dy = M.downsample(xs, ys, 1000)
    assert len(dx) <= 1000 and dx == sorted(dx) and all(ys[x] == y for x, y in zip(dx, dy))
    tops = sum(1 for a, b, c in zip(dy, dy[1:], dy[2:]) if b > a and b >= c and b >= 240)
    bottoms = sum(1 for a, b, c in zip(dy, dy[1:], dy[2:]) if b < a and b <= c and b <= 10)
    assert tops == 40 and bottoms >= 39
    with pytest.raises(ValueError, match="at least 4"):
        M.downsample(xs, ys, 3)


def test_timeline_block_markers():
    snap = _snapshot()
    blk = [_frame(M.BLOCK_MARKER_FUNC, "/x/src/impl/workloads/memory.py")]
    snap["device_traces"][0][3:3] = [dict(action="alloc", addr=7, size=512, frames=blk),
                                     dict(action="free_completed", addr=7, size=512, frames=[])]
    t = M.timeline_data(snap, ["forward", "backward"], block_marks=["block 0 forward"])
    assert t["blocks"] == [dict(name="block 0 forward", x=3)] and t["blocks_found"] == t["blocks_expected"] == 1
    assert t["markers"] == [dict(name="forward", x=0), dict(name="backward", x=7)]
    assert all(M.BLOCK_MARKER_FUNC not in f for e in M.largest_allocations(snap) for f in e["frames"])


def test_first_level_that_fits_records_each_oom_and_raises_anything_else():
    from impl.workloads.kernels import PROFILED, first_level_that_fits

    cleaned = []

    def run(level):
        if level in PROFILED[:2]:
            raise RuntimeError(f"CUDA out of memory at {level}\nmore")
        return level.upper()

    out, level, failures = first_level_that_fits(run, cleanup=lambda: cleaned.append(1))
    assert (out, level) == (PROFILED[2].upper(), PROFILED[2]) and len(cleaned) == 2
    assert failures == [f"{lv}: CUDA out of memory at {lv}" for lv in PROFILED[:2]]
    none_fit = first_level_that_fits(lambda lv: run(PROFILED[0]), start=PROFILED[1])  # OOM at every level
    assert none_fit[:2] == (None, None) and len(none_fit[2]) == len(PROFILED) - 1
    with pytest.raises(ValueError):
        first_level_that_fits(lambda lv: int("x"))
