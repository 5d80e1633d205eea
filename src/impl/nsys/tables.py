"""`nsys stats --format csv` reports as typed rows: cuda_gpu_kern_sum (kernels), nvtx_sum (NVTX
ranges) and nvtx_kern_sum (kernels per NVTX range). Times stay in nanoseconds, nsys's unit.

Column names are those of Nsight Systems 2025.3's report scripts. A file may carry lines before its
header (nsys prints "Processing ..." when it writes to stdout); the header is the first line holding
every column a report needs. Range names lose the ":" nsys puts before a name of the default domain.

nvtx_kern_sum assigns a kernel to the ranges open *on the thread that launched it* (the same PID and
TID). PyTorch launches backward kernels from its autograd thread, outside the main thread's
"backward" range, so that table shows backward almost empty; impl.nsys.timeline attributes by
process and launch time instead (as impl.workloads.kernels does for torch.profiler).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from impl.workloads.kernels import classify_kernel


class NsysOutputError(ValueError):
    """An nsys output that cannot be read: the message names the file and what is wrong."""


# The columns each report must have, in nsys's order.
KERNEL_COLUMNS = ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                  "StdDev (ns)", "Name")
NVTX_COLUMNS = ("Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                "StdDev (ns)", "Style", "Range")
NVTX_KERNEL_COLUMNS = ("NVTX Range", "Style", "PID", "TID", "NVTX Inst", "Kern Inst", "Total Time (ns)", "Avg (ns)",
                       "Med (ns)", "Min (ns)", "Max (ns)", "StdDev (ns)", "Kernel Name")


def range_name(raw: str) -> str:
    """An NVTX range's name without the ':' nsys prefixes to ranges of the default domain."""
    return raw[1:] if raw.startswith(":") else raw


@dataclass(frozen=True)
class TimeStats:
    """nsys's statistics of one row's durations (ns)."""

    total_ns: float
    avg_ns: float
    median_ns: float
    min_ns: float
    max_ns: float
    stddev_ns: float


@dataclass(frozen=True)
class KernelSummary:
    """One kernel name of cuda_gpu_kern_sum."""

    name: str
    instances: int
    time: TimeStats
    share: float  # of all kernels' total time in the report (nsys's "Time (%)" / 100)

    @property
    def category(self) -> str:
        """impl.workloads.kernels' category (matmul, softmax, ...): the same rule as the torch.profiler
        tables, so both sources group kernels alike."""
        return classify_kernel(self.name)


@dataclass(frozen=True)
class NvtxRangeSummary:
    """One NVTX range name of nvtx_sum (CPU-side durations of the range)."""

    name: str
    style: str  # "PushPop" or "StartEnd"
    instances: int
    time: TimeStats
    share: float


@dataclass(frozen=True)
class NvtxKernel:
    """One (range, kernel, process, thread) row of nvtx_kern_sum."""

    range: str
    style: str
    pid: int
    tid: int
    range_instances: int  # instances of the range that launched this kernel
    kernel_instances: int
    time: TimeStats  # of the kernel's executions
    kernel: str

    @property
    def category(self) -> str:
        return classify_kernel(self.kernel)


def _rows(path: Path, columns: tuple[str, ...], report: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) of the CSV at `path` after its header, which must hold `columns`."""
    path = Path(path)
    if not path.is_file():
        raise NsysOutputError(f"{path}: no such file (nsys stats --report {report} --format csv writes it)")
    lines = path.read_text(errors="replace").splitlines()
    for i, cells in enumerate(csv.reader(lines)):
        if set(columns) <= {c.strip() for c in cells}:
            header = [c.strip() for c in cells]
            out = []
            for j, row in enumerate(csv.reader(lines[i + 1:]), start=i + 2):
                if not row or not "".join(row).strip():
                    continue
                if len(row) != len(header):
                    raise NsysOutputError(f"{path}:{j}: {len(row)} fields, the header has {len(header)}")
                out.append((j, dict(zip(header, row))))
            return out
    seen = next((c for c in csv.reader(lines) if len(c) > 1), None)
    raise NsysOutputError(f"{path}: no {report} header with the columns {list(columns)}"
                          + (f"; the first table line has {seen}" if seen else " (the file holds no table)"))


def _number(path: Path, line: int, row: dict[str, str], column: str) -> float:
    text = row[column].strip().replace(",", "")  # nsys may group thousands in some formats
    try:
        return float(text)
    except ValueError:
        raise NsysOutputError(f"{path}:{line}: column {column!r} is not a number: {row[column]!r}") from None


def _stats(path: Path, line: int, row: dict[str, str]) -> TimeStats:
    n = lambda c: _number(path, line, row, c)  # noqa: E731
    return TimeStats(total_ns=n("Total Time (ns)"), avg_ns=n("Avg (ns)"), median_ns=n("Med (ns)"),
                     min_ns=n("Min (ns)"), max_ns=n("Max (ns)"), stddev_ns=n("StdDev (ns)"))


def read_kernel_summary(path: Path) -> list[KernelSummary]:
    """cuda_gpu_kern_sum, largest total time first (nsys's order)."""
    return [KernelSummary(name=r["Name"], instances=int(_number(path, i, r, "Instances")), time=_stats(path, i, r),
                          share=_number(path, i, r, "Time (%)") / 100)
            for i, r in _rows(path, KERNEL_COLUMNS, "cuda_gpu_kern_sum")]


def read_nvtx_summary(path: Path) -> list[NvtxRangeSummary]:
    """nvtx_sum, largest total time first."""
    return [NvtxRangeSummary(name=range_name(r["Range"]), style=r["Style"],
                             instances=int(_number(path, i, r, "Instances")), time=_stats(path, i, r),
                             share=_number(path, i, r, "Time (%)") / 100)
            for i, r in _rows(path, NVTX_COLUMNS, "nvtx_sum")]


def read_nvtx_kernels(path: Path) -> list[NvtxKernel]:
    """nvtx_kern_sum, in nsys's order (by range, then kernel)."""
    return [NvtxKernel(range=range_name(r["NVTX Range"]), style=r["Style"], pid=int(_number(path, i, r, "PID")),
                       tid=int(_number(path, i, r, "TID")), range_instances=int(_number(path, i, r, "NVTX Inst")),
                       kernel_instances=int(_number(path, i, r, "Kern Inst")), time=_stats(path, i, r),
                       kernel=r["Kernel Name"])
            for i, r in _rows(path, NVTX_KERNEL_COLUMNS, "nvtx_kern_sum")]


def kernels_of_range(rows: list[NvtxKernel], name: str) -> list[NvtxKernel]:
    """The rows of one range (every thread), largest total time first."""
    return sorted((r for r in rows if r.range == name), key=lambda r: (-r.time.total_ns, r.kernel))


__all__ = ["KERNEL_COLUMNS", "KernelSummary", "NVTX_COLUMNS", "NVTX_KERNEL_COLUMNS", "NsysOutputError", "NvtxKernel",
           "NvtxRangeSummary", "TimeStats", "kernels_of_range", "range_name", "read_kernel_summary",
           "read_nvtx_kernels", "read_nvtx_summary"]
