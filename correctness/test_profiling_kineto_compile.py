"""The fast paths behind nsys_profile and torch_compile (b) (issue 4): kernel tables read from the
profiler's raw kineto events must equal the ones torch's FunctionEvent parsing gives; the profile's
fallback levels; the regional compiled model and the compiled AdamW must match eager and compile
once per size and grad mode (aot_eager on the CPU: dynamo + AOTAutograd, no code generation)."""
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType

from impl.model import AdamW, cross_entropy
from impl.workloads import kernels as K
from impl.workloads.compiled import CompiledAdamW, RegionalLM, WholeLM, compile_model, graph_breaks, unique_graphs
from impl.workloads.steps import build_model, random_batch

CPU = torch.device("cpu")


# --- kernel tables from raw kineto events ---------------------------------------------------------
def test_kineto_tables_equal_function_event_tables_cpu():
    """One real CPU profile (schedule: 1 unrecorded warm-up step, 2 recorded) read both ways."""
    model = build_model("tiny", 16, CPU)
    x, y = random_batch(model, 2, 16, CPU)
    opt = AdamW(model.parameters(), lr=1e-4)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=sched) as prof:
        for _ in range(3):
            K.annotated_train_step(model, x, y, "fp32", opt)
            prof.step()
    raw = K.phase_profile_from_kineto(prof.profiler.kineto_results, 2, "cpu")
    ref = K.build_phase_profile(prof.events(), 2, "cpu")
    assert len(raw.range_wall_us["forward"]) == 2  # the warm-up step was not recorded
    assert raw.range_wall_us.keys() == ref.range_wall_us.keys()
    for rng, walls in ref.range_wall_us.items():
        assert raw.range_wall_us[rng] == pytest.approx(walls), rng
    assert set(raw.kernels) == set(ref.kernels)
    for rng, table in ref.kernels.items():
        assert raw.kernels[rng].keys() == table.keys(), rng
        for name, (t, n) in table.items():
            assert raw.kernels[rng][name][1] == n, (rng, name)
            assert raw.kernels[rng][name][0] == pytest.approx(t, rel=1e-9, abs=1e-6), (rng, name)


class _KE:
    """A stand-in for torch._C._autograd._KinetoEvent (times in ns)."""

    def __init__(self, name, start, end, device="cpu", corr=0, linked=0, thread=1, activity="cpu_op"):
        self._n, self._s, self._e, self._corr, self._linked, self._t = name, start, end, corr, linked, thread
        self._dev = DeviceType.CPU if device == "cpu" else DeviceType.CUDA
        self._act = activity

    def name(self): return self._n
    def start_ns(self): return self._s
    def end_ns(self): return self._e
    def device_type(self): return self._dev
    def correlation_id(self): return self._corr
    def linked_correlation_id(self): return self._linked
    def is_async(self): return False
    def start_thread_id(self): return self._t
    def end_thread_id(self): return self._t
    def is_hidden_event(self): return False
    def activity_type(self): return self._act


def test_kineto_cuda_linking_synthetic():
    """Kernels belong to the op whose correlation id they link to (not to the cudaLaunchKernel
    runtime event, itself linked); GPU copies of annotation ranges are not kernels; a backward op
    on another thread inside the backward range counts as backward; kernels linked to no op
    are counted apart."""
    us = 1000
    ev = [
        _KE("forward", 100 * us, 200 * us), _KE("computing softmax", 120 * us, 140 * us),
        _KE("aten::mm", 110 * us, 111 * us, corr=7), _KE("cudaLaunchKernel", 110 * us, 111 * us, corr=8, linked=7),
        _KE("sm90_xmma_gemm_f32", 150 * us, 190 * us, device="cuda", linked=7, activity="kernel"),
        _KE("aten::_softmax", 121 * us, 122 * us, corr=9),
        _KE("cunn_SoftMaxForward", 191 * us, 196 * us, device="cuda", linked=9, activity="kernel"),
        _KE("forward", 100 * us, 200 * us, device="cuda", linked=1, activity="gpu_user_annotation"),
        _KE("backward", 300 * us, 400 * us),
        _KE("aten::mm", 310 * us, 311 * us, corr=11, thread=2),
        _KE("gemm_b", 320 * us, 350 * us, device="cuda", linked=11, activity="kernel"),
        _KE("gemm_orphan", 320 * us, 330 * us, device="cuda", linked=99, activity="kernel"),
        _KE("_adamw_master_kernel", 410 * us, 412 * us, device="cuda", linked=0, activity="kernel"),
    ]
    result = SimpleNamespace(events=lambda: ev, trace_start_ns=lambda: 0)
    p = K.phase_profile_from_kineto(result, steps=1, device_type="cuda")
    assert p.kernels["forward"] == {"sm90_xmma_gemm_f32": [40.0, 1], "cunn_SoftMaxForward": [5.0, 1]}
    assert p.kernels["computing softmax"] == {"cunn_SoftMaxForward": [5.0, 1]}
    assert p.kernels["backward"] == {"gemm_b": [30.0, 1]}
    assert p.range_wall_us["forward"] == [100.0]
    # kernels with no launching op are in no table, but their time is counted (a launch outside
    # any torch op, as our launchers made before impl.runtime.launch_ctx)
    assert p.unlinked_us == pytest.approx(12.0)


def test_blocking_runtime_calls_per_phase_synthetic():
    """Host time in runtime calls that may wait for the device (a sync, the allocator's cudaMalloc /
    cudaFree) is summed per range, apart from the kernels; launches are not among them, and a call in
    the warm-up is left out. step_breakdown reports it per phase in ms per step."""
    us = 1000
    ev = [
        _KE("warm-up", 0, 50 * us), _KE("cudaFree", 10 * us, 30 * us, corr=2),
        _KE("forward", 100 * us, 200 * us), _KE("cudaMalloc", 110 * us, 115 * us, corr=3),
        _KE("cudaStreamSynchronize", 150 * us, 190 * us, corr=4), _KE("cudaMalloc", 191 * us, 192 * us, corr=5),
        _KE("aten::mm", 120 * us, 121 * us, corr=7), _KE("cudaLaunchKernel", 120 * us, 121 * us, corr=8, linked=7),
        _KE("backward", 300 * us, 400 * us), _KE("cudaFree", 310 * us, 312 * us, corr=6),
    ]
    p = K.phase_profile_from_kineto(SimpleNamespace(events=lambda: ev, trace_start_ns=lambda: 0), 1, "cuda")
    assert p.blocking == {"forward": {"cudaMalloc": [6.0, 2], "cudaStreamSynchronize": [40.0, 1]},
                          "backward": {"cudaFree": [2.0, 1]}}
    out = K.step_breakdown(p, step_s=0.4)["blocking_runtime_ms"]
    assert out["forward"]["cudaStreamSynchronize"] == dict(ms=pytest.approx(0.04), calls=1)
    assert out["backward"] == {"cudaFree": dict(ms=pytest.approx(0.002), calls=1)}


def test_exposed_communication_from_kernel_intervals_synthetic():
    """communication_exposed_ms from the trace's device intervals: an all-reduce in backward half under a
    compute kernel of another stream is exposed for its other half; the optimizer's broadcast with nothing
    beside it is exposed whole; per phase by its launching op, in ms per step."""
    us = 1000
    ev = [
        _KE("backward", 100 * us, 200 * us),
        _KE("aten::mm", 110 * us, 111 * us, corr=7),
        _KE("gemm", 120 * us, 160 * us, device="cuda", linked=7, activity="kernel"),
        _KE("c10d::allreduce_", 112 * us, 113 * us, corr=8),
        _KE("ncclDevKernel_AllReduce_Sum_bf16", 150 * us, 170 * us, device="cuda", linked=8, activity="kernel"),
        _KE("optimizer step", 300 * us, 400 * us),
        _KE("c10d::broadcast_", 310 * us, 311 * us, corr=9),
        _KE("ncclDevKernel_Broadcast", 320 * us, 326 * us, device="cuda", linked=9, activity="kernel"),
    ]
    p = K.phase_profile_from_kineto(SimpleNamespace(events=lambda: ev, trace_start_ns=lambda: 0), 1, "cuda")
    assert p.exposed_comm == {"backward": {"ncclDevKernel_AllReduce_Sum_bf16": [10.0, 1]},
                              "optimizer step": {"ncclDevKernel_Broadcast": [6.0, 1]}}
    out = K.step_breakdown(p, step_s=0.4)
    assert out["communication_exposed_ms"] == pytest.approx({"forward": 0.0, "backward": 0.01, "optimizer step": 0.006})
    assert out["category_ms"]["communication"] == pytest.approx(0.026)

def test_cpu_self_time_folds_same_name_child():
    """As torch's _remove_dup_nodes: a single child of the same name is one call, its self time
    the sum; a child of another name is a call of its own."""
    us = 1000
    ev = [_KE("forward", 0, 100 * us), _KE("aten::copy_", 10 * us, 50 * us), _KE("aten::copy_", 12 * us, 40 * us),
          _KE("aten::empty", 15 * us, 20 * us)]
    p = K.phase_profile_from_kineto(SimpleNamespace(events=lambda: ev, trace_start_ns=lambda: 0), 1, "cpu")
    assert p.kernels["forward"] == {"aten::copy_": [35.0, 1], "aten::empty": [5.0, 1]}


@pytest.mark.parametrize("upto,phases", [("train_step", {"forward", "backward", "optimizer step"}),
                                         ("forward_backward", {"forward", "backward"}),
                                         ("forward", {"forward"}), ("forward_no_grad", {"forward"})])
def test_profile_fallback_levels(upto, phases):
    model = build_model("tiny", 16, CPU)
    x, y = random_batch(model, 2, 16, CPU)
    p, parse_s = K.profile_steps(model, x, y, warmup=1, steps=1, upto=upto)
    assert {k for k in p.kernels if k in K.PHASES} == phases and parse_s >= 0
    assert len(p.range_wall_us["forward"]) == 1


# --- compiled model and optimizer ---------------------------------------------------------------
@pytest.mark.parametrize("cls", [RegionalLM, WholeLM])
def test_compiled_model_matches_eager_and_reuses_graph(cls):
    torch._dynamo.reset()  # dynamo's counters survive a reset (and other tests): count differences
    breaks = graph_breaks()
    model = build_model("tiny", 64, CPU)
    target = cls(model, backend="aot_eager")
    counts = []
    for ctx in (16, 32, 64):
        x, y = random_batch(model, 2, ctx, CPU)
        with torch.no_grad():
            torch.testing.assert_close(target(x), model(x), rtol=1e-5, atol=1e-5)
        model.zero_grad(set_to_none=True)
        cross_entropy(target(x), y).backward()
        got = [prm.grad.clone() for prm in model.parameters()]
        model.zero_grad(set_to_none=True)
        cross_entropy(model(x), y).backward()
        for a, b in zip(got, (prm.grad for prm in model.parameters())):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        counts.append(unique_graphs())
    # one inference and one training graph at the first context, none after (sequence dynamic)
    assert counts[0] >= 2 and counts[1] == counts[0] and counts[2] == counts[0]
    assert graph_breaks() == breaks


def test_compile_model_rejects_unknown():
    with pytest.raises(ValueError):
        compile_model(build_model("tiny", 16, CPU), "blocks")


def test_compiled_adamw_matches_adamw():
    torch._dynamo.reset()
    a, b = build_model("tiny", 16, CPU), build_model("tiny", 16, CPU)
    oa = AdamW(a.parameters(), lr=1e-2, weight_decay=0.1)
    ob = CompiledAdamW(b.parameters(), lr=1e-2, weight_decay=0.1, backend="aot_eager")
    before = unique_graphs()
    for step in range(3):
        for m in (a, b):
            for i, prm in enumerate(m.parameters()):
                prm.grad = torch.randn(prm.shape, generator=torch.Generator().manual_seed(100 * step + i))
        oa.step()
        ob.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-6)
        assert ob.state[pb]["step"] == oa.state[pa]["step"] == 3
    assert unique_graphs() - before <= 2  # 1-D and 2-D parameters; no recompile per step or per size
