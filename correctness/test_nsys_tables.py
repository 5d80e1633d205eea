"""impl.nsys.tables on synthetic `nsys stats --format csv` files with nsys 2025.3's headers."""
import pytest

from impl.nsys import tables as T
from kits.nsys_outputs import KERNEL_SUM, NVTX_KERN_SUM, NVTX_SUM


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_kernel_summary_rows_are_typed_with_categories(tmp_path):
    rows = T.read_kernel_summary(_write(tmp_path, "k.csv", KERNEL_SUM))
    assert [r.instances for r in rows] == [2, 1, 4]
    gemm, nccl, softmax = rows
    assert gemm.time.total_ns == 500000 and gemm.time.avg_ns == 250000 and gemm.time.median_ns == 250000
    assert softmax.time.median_ns == 24000.5 and softmax.time.min_ns == 20000 and softmax.time.max_ns == 32000
    assert gemm.share == pytest.approx(0.625)
    assert (gemm.category, nccl.category, softmax.category) == ("matmul", "communication", "softmax")


def test_lines_before_the_header_are_skipped(tmp_path):
    text = "Generating SQLite file x.sqlite from x.nsys-rep\nProcessing [x.sqlite] with [cuda_gpu_kern_sum.py]...\n\n"
    rows = T.read_kernel_summary(_write(tmp_path, "k.csv", text + KERNEL_SUM))
    assert len(rows) == 3


def test_nvtx_summary_strips_the_default_domain_colon(tmp_path):
    rows = T.read_nvtx_summary(_write(tmp_path, "n.csv", NVTX_SUM))
    assert [r.name for r in rows] == ["step 0", "backward", "forward", "optimizer step"]
    assert rows[2].instances == 2 and rows[2].time.avg_ns == 300000 and rows[2].style == "PushPop"


def test_nvtx_kernel_attribution_rows(tmp_path):
    rows = T.read_nvtx_kernels(_write(tmp_path, "nk.csv", NVTX_KERN_SUM))
    fwd = T.kernels_of_range(rows, "forward")
    assert [r.category for r in fwd] == ["matmul", "softmax"]  # largest total first
    assert (fwd[0].pid, fwd[0].tid, fwd[0].range_instances, fwd[0].kernel_instances) == (100, 1, 1, 1)
    assert T.kernels_of_range(rows, "step 0")[0].kernel_instances == 3


def test_missing_file_names_it_and_the_report(tmp_path):
    with pytest.raises(T.NsysOutputError, match=r"nope\.csv: no such file.*nvtx_kern_sum"):
        T.read_nvtx_kernels(tmp_path / "nope.csv")


def test_missing_columns_are_named(tmp_path):
    text = KERNEL_SUM.replace('"Med (ns)",', "").replace('"250000.0","250000.0"', '"250000.0"')
    with pytest.raises(T.NsysOutputError, match=r"k\.csv: no cuda_gpu_kern_sum header .*Med \(ns\)"):
        T.read_kernel_summary(_write(tmp_path, "k.csv", text))


def test_a_file_without_a_table_says_so(tmp_path):
    with pytest.raises(T.NsysOutputError, match="holds no table"):
        T.read_nvtx_summary(_write(tmp_path, "n.csv", "SKIPPED: x.sqlite does not contain NV Tools Extension (NVTX) data.\n"))


def test_bad_numbers_and_short_rows_name_the_line(tmp_path):
    bad = KERNEL_SUM.replace('"2","250000.0"', '"two","250000.0"')
    with pytest.raises(T.NsysOutputError, match=r"k\.csv:2: column 'Instances' is not a number: 'two'"):
        T.read_kernel_summary(_write(tmp_path, "k.csv", bad))
    short = KERNEL_SUM + '"1.0","5"\n'
    with pytest.raises(T.NsysOutputError, match=r"k2\.csv:5: 2 fields, the header has 9"):
        T.read_kernel_summary(_write(tmp_path, "k2.csv", short))
