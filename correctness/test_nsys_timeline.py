"""impl.nsys.timeline and impl.nsys.figure on a synthetic SQLite export with the real schema's
columns (kits.nsys_outputs): kernels per stream and device, NCCL classification, attribution to the
NVTX ranges open at launch (any thread of the process), overlap, errors, trimming, the figure."""
import sqlite3

import pytest

from impl.nsys.figure import draw_timeline
from impl.nsys.tables import NsysOutputError
from impl.nsys.timeline import Lane, is_nccl, read_timeline, trim_export
from kits.nsys_outputs import US, write_export


@pytest.fixture
def export(tmp_path):
    return write_export(tmp_path / "run.sqlite")


def test_kernels_lanes_devices_and_gpu_names(export):
    tl = read_timeline(export)
    assert len(tl.kernels) == 9
    assert [k.start_ns for k in tl.kernels] == sorted(k.start_ns for k in tl.kernels)
    assert {k.pid for k in tl.kernels} == {100, 200}  # the bits above the pid are masked off
    assert tl.lanes() == [Lane(0, 7), Lane(0, 20), Lane(1, 7), Lane(1, 20)]  # compute before NCCL per device
    assert tl.nccl_lanes() == {Lane(0, 20), Lane(1, 20)}
    assert tl.gpus == {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize("name,nccl", [
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
    ("ncclKernel_AllGather_RING_LL_Sum_int8_t", True),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_cublas", False),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::BroadcastOp>", False)])
def test_nccl_classification(name, nccl):
    assert is_nccl(name) is nccl


def test_attribution_by_process_and_launch_time(export):
    tl = read_timeline(export)
    by = {(k.pid, k.start_ns // US): k for k in tl.kernels}
    assert by[(100, -40)].ranges == ()  # launched before any range
    assert by[(100, 20)].ranges == ("step 0", "forward") and by[(100, 20)].range == "forward"
    # launched from the autograd thread (tid 2): still rank 0's backward, which runs on tid 1
    assert by[(100, 320)].range == "backward" and by[(100, 450)].range == "backward"
    assert by[(100, 820)].range == "optimizer step"
    assert by[(100, 20)].launch_ns == 10 * US
    assert [k.start_ns // US for k in tl.in_range("backward") if k.pid == 100] == [320, 450]


def test_registered_range_names_come_from_string_ids(tmp_path):
    tl = read_timeline(write_export(tmp_path / "r.sqlite", registered_names=True))
    assert {r.name for r in tl.ranges} == {"step 0", "forward", "backward", "optimizer step"}


def test_without_the_runtime_table_the_gpu_start_stands_in(tmp_path):
    tl = read_timeline(write_export(tmp_path / "r.sqlite", drop_table="CUPTI_ACTIVITY_KIND_RUNTIME"))
    k = next(k for k in tl.kernels if k.pid == 100 and k.start_ns == 450 * US)
    assert k.launch_ns is None and k.range == "backward"


def test_window_spans_every_process_and_overlap(export):
    tl = read_timeline(export)
    assert tl.window("backward") == (300 * US, 800 * US)
    part = tl.between(*tl.window("backward"))
    assert all(k.end_ns > 300 * US and k.start_ns < 800 * US for k in part.kernels)
    o0, o1 = tl.overlap()
    assert (o0.device, o0.nccl_ns, o0.both_ns) == (0, 250 * US, 150 * US)  # NCCL 450-700, compute to 600
    assert o0.nccl_hidden_share == pytest.approx(0.6)
    assert o1.both_ns == 150 * US  # 460-610
    with pytest.raises(NsysOutputError, match=r"no NVTX range 'step 9'.*'backward'"):
        tl.window("step 9")
    with pytest.raises(NsysOutputError, match=r"range 'forward' has no instance 3"):
        tl.window("forward", occurrence=3)


@pytest.mark.parametrize("drop,message", [
    (dict(drop_table="CUPTI_ACTIVITY_KIND_KERNEL"), r"table CUPTI_ACTIVITY_KIND_KERNEL is missing"),
    (dict(drop_table="StringIds"), r"table StringIds is missing"),
    (dict(drop_column=("CUPTI_ACTIVITY_KIND_KERNEL", "streamId")), r"table CUPTI_ACTIVITY_KIND_KERNEL lacks the columns \['streamId'\]")])
def test_malformed_exports_name_the_file_and_what_is_missing(tmp_path, drop, message):
    path = write_export(tmp_path / "bad.sqlite", **drop)
    with pytest.raises(NsysOutputError, match=r"bad\.sqlite: " + message):
        read_timeline(path)


def test_not_a_database_or_no_file(tmp_path):
    (tmp_path / "x.sqlite").write_text("not sqlite " * 100)
    with pytest.raises(NsysOutputError, match=r"x\.sqlite: not an SQLite database"):
        read_timeline(tmp_path / "x.sqlite")
    with pytest.raises(NsysOutputError, match=r"y\.sqlite: no such file"):
        read_timeline(tmp_path / "y.sqlite")


def test_trim_keeps_what_is_read(export):
    before = read_timeline(export)
    trim_export(export)
    tables = {t for (t,) in sqlite3.connect(export).execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "OSRT_API" not in tables and {"ENUM_NSYS_EVENT_TYPE", "NVTX_EVENTS", "StringIds"} <= tables
    after = read_timeline(export)
    assert after.kernels == before.kernels and after.ranges == before.ranges


def test_figure_is_written(export, tmp_path):
    tl = read_timeline(export)
    out = draw_timeline(tl, tmp_path / "fig" / "t.png", "synthetic step",
                        range_names=("forward", "backward", "optimizer step"))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    with pytest.raises(ValueError, match="no kernel ran and no range was open in the window"):
        draw_timeline(tl, tmp_path / "empty.png", "none", window=(5000 * US, 6000 * US))


def test_an_export_without_kernels_reads_and_draws_its_ranges_when_asked(tmp_path):
    """2026-11-26's two-GPU cases: nsys kept the spawned ranks' NVTX ranges but none of their kernels."""
    path = write_export(tmp_path / "nvtx.sqlite", drop_table="CUPTI_ACTIVITY_KIND_KERNEL")
    with pytest.raises(NsysOutputError, match="CUPTI_ACTIVITY_KIND_KERNEL is missing"):
        read_timeline(path)
    tl = read_timeline(path, kernels_required=False)
    assert tl.kernels == () and {r.name for r in tl.ranges} == {"step 0", "forward", "backward", "optimizer step"}
    assert tl.window("step 0") == (0, 1000 * US) and tl.overlap() == []
    out = draw_timeline(tl, tmp_path / "nvtx.png", "ranges only", window=tl.window("step 0"))
    assert out.stat().st_size > 5000


def test_waits_count_the_compute_idle_up_to_an_nccl_kernel_it_resumes_after(tmp_path):
    """fsdp_accounting (b) from kernels: compute idle when an all-gather ends and resuming within RESUME_NS
    waited for it (from its last kernel's end); compute running at the end, or resuming much later, did not."""
    ag = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    kernels = [(100, 0, 7, 1, 0, 0, 100, "gemm_a"), (100, 0, 20, 1, 1, 50, 150, ag),
               (100, 0, 7, 1, 2, 160, 200, "gemm_b"),  # resumes 10 us after: waited 150 - 100 = 50 us
               (100, 0, 20, 1, 3, 180, 190, ag),  # ends while gemm_b runs: no wait
               (100, 0, 20, 1, 4, 400, 450, ag), (100, 0, 7, 1, 5, 600, 700, "gemm_c")]  # resumes 150 us after
    tl = read_timeline(write_export(tmp_path / "w.sqlite", kernels=kernels))
    assert [(k.start_ns // US, w // US) for k, w in tl.waits(0, "AllGather")] == [(50, 50), (180, 0), (400, 0)]
    assert tl.waits(0, "ReduceScatter") == [] and tl.waits(1, "AllGather") == []
    assert tl.measured_steps() == ["step 0"]


def test_no_measured_step_is_named(tmp_path):
    tl = read_timeline(write_export(tmp_path / "n.sqlite", ranges=[("forward", 0, 300)]))
    with pytest.raises(NsysOutputError, match=r"no measured step range \('step N'\); the ranges are \['forward'\]"):
        tl.measured_steps()
