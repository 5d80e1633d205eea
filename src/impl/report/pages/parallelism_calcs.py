"""The 2026 parallelism calculations in closed form (each answer is the `symbolic` of its
impl.parallelism_calcs function), evaluated for TPU v5p and the devices measured here: C is a device's
newest measured bf16 matmul peak, W the largest NCCL all-reduce's bus bandwidth on a GPU (the H100, one
GPU, borrows it). templates/parallelism_calcs.md.j2 holds every word."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Status
from impl.report.pages import Context, Kind, Scored
from impl.report.pages.distributed_communication import AllReduceConfig
from impl.report.rows import Bench, Rows
from impl.workloads.problems import Problem as P

PROBLEMS = (P.ALTERNATE_RING_ALL_REDUCE, P.DATA_PARALLEL_CALCS, P.FSDP_CALCS, P.TP_CALCS, P.FSDP_TP_CALCS)
H100 = "h100-80gb-x1"  # the one-GPU device whose measured C has a row


@dataclass(frozen=True)
class Bandwidth:
    bps: float  # bus bandwidth
    device: str
    bytes: int
    processes: int
    date: str
    file: str


def nccl_bus_bandwidth(rows: Rows, world_size: int | None = None) -> Bandwidth | None:
    """W of the largest (bytes, processes) measured NCCL all-reduce on a GPU, of `world_size` processes when
    given; the first device's on a tie."""
    found = [Bandwidth(bw * 1e9, device, c.bytes, c.world_size, b.run.date, b.run.file)
             for device, benches in rows.per_gpu(P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE) for b in benches
             for c, bw in [(AllReduceConfig.of(b), b.figure("busbw_GBps", Metric.BUS_BW))]
             if b.status is Status.MEASURED and c.backend == "nccl" and bw is not None
             and world_size in (None, c.world_size)]
    return max(found, key=lambda w: (w.bytes, w.processes), default=None)


def measured_peak(rows: Rows, device: str) -> Bench | None:
    """The device's newest row that carries a measured bf16 matmul peak (its row.peaks)."""
    return max((b for b in rows.of(device=device) if b.row.peaks is not None), key=lambda b: b.run.datetime,
               default=None)


@dataclass(frozen=True)
class Workload:  # communication_accounting's XXL FFN at its TPU v5p compute-bound global batch
    B: float
    D: float
    D_FF: float


@dataclass(frozen=True)
class DeviceRow:
    kind: str  # "h100", "h200" (W's device) or "tpu"
    device: str | None  # the device folder (None for TPU v5p)
    figures: pc.DeviceFigures
    bounds: pc.ParallelismBounds
    peak: Bench | None  # the row whose peak is C; None: a datasheet's C (or communication_accounting's, for TPU v5p)


@dataclass(frozen=True)
class CalcsFacts:
    wl: Workload
    devices: tuple[DeviceRow, ...]  # the first is the one the index quotes
    w: Bandwidth | None
    dp: pc.DataParallelCalcs  # the closed forms, at TPU v5p's figures
    fs: pc.ShardedCalcs
    tp: pc.ShardedCalcs
    ft: pc.FSDPTPCalcs
    sources: list[str]  # the run files of the measured C and W
    ar: pc.Formula = pc.alternate_ring_all_reduce_time
    ring: pc.Formula = pc.ring_all_reduce_time
    fp16: int = pc.FP16
    tp_backward: str = pc.TP_BACKWARD_EQUATIONS
    scores = {p: Scored(Kind.CLOSED_FORM, "closed form") for p in PROBLEMS}
    h100_borrows_w = property(lambda self: any(d.kind == "h100" for d in self.devices))  # its W is the H200s'

    def answers(self, record: str) -> list[pc.Answer]:
        return pc.answers(getattr(self, record))


def facts(ctx: Context) -> CalcsFacts:
    wl = Workload(acc.compute_bound_batch()["global_tokens_int"], acc.XXL["d_model"], acc.XXL["d_ff"])
    def row(kind, device, fig, peak=None):
        return DeviceRow(kind, device, fig, pc.parallelism_bounds(fig, wl.B, wl.D_FF), peak)
    devices, tpu = [], pc.TPU_V5P_FIGURES
    if w := nccl_bus_bandwidth(ctx.rows):
        if h100 := measured_peak(ctx.rows, H100):
            devices.append(row("h100", H100, pc.DeviceFigures("h100", C=h100.row.peaks.measured_flops, W=w.bps), h100))
        h200 = measured_peak(ctx.rows, w.device)
        if C := h200.row.peaks.measured_flops if h200 else datasheet_bf16_flops("H200"):
            devices.append(row("h200", w.device, pc.DeviceFigures("h200", C=C, W=w.bps), h200))
    a = (wl.B, wl.D, wl.D_FF)
    return CalcsFacts(wl, (*devices, row("tpu", None, tpu)), w, pc.data_parallel_calcs(*a, 4, tpu.C, tpu.W),
                      pc.fsdp_calcs(*a, 4, tpu.C, tpu.W), pc.tp_calcs(*a, 4, tpu.C, tpu.W),
                      pc.fsdp_tp_calcs(*a, 2, 2, tpu.C, tpu.W),
                      sorted({f for f in (w and w.file, *(d.peak.run.file for d in devices if d.peak)) if f}))
