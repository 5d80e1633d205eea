"""The 2026 edition's parallelism calculations (alternate_ring_all_reduce, data_parallel_calcs,
fsdp_calcs, tp_calcs, fsdp_tp_calcs), answered in closed form: each answer's symbolic form is the
`symbolic` of the impl.parallelism_calcs function that computes it, and the bounds are evaluated for
the devices measured here and TPU v5p. templates/parallelism_calcs.md.j2 holds every word.

C and W of each device come from the stored rows: the H100's C is the bf16 matmul peak measured in its
newest run (the rows' `peaks`); W is the NCCL all-reduce bus bandwidth at the largest size and process
count measured on a GPU (bus bandwidth = bytes each device sends per second in a ring, the
calculations' W). No H100 all-reduce was measured (one GPU), so the H100 row borrows that W and says
so. The leaderboard_2026 page prices its prediction with the same W (nccl_bus_bandwidth)."""
from __future__ import annotations

from dataclasses import dataclass

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.bench.peaks import datasheet_bf16_flops
from impl.bench.row import Metric, Status
from impl.report.pages import Context, Kind, Scored
from impl.report.rows import Rows, view
from impl.workloads.problems import Problem as P

PROBLEMS = (P.ALTERNATE_RING_ALL_REDUCE, P.DATA_PARALLEL_CALCS, P.FSDP_CALCS, P.TP_CALCS, P.FSDP_TP_CALCS)
CALC_PROBLEMS = (P.ALTERNATE_RING_ALL_REDUCE, P.DATA_PARALLEL_CALCS, P.FSDP_CALCS, P.TP_CALCS, P.FSDP_TP_CALCS)
H100 = "h100-80gb-x1"  # the one-GPU device whose measured C has a row


@dataclass(frozen=True)
class Bandwidth:
    """W: the largest NCCL all-reduce measured on a GPU (by size, then processes), its bus bandwidth."""

    bps: float
    device: str
    bytes: int
    processes: int
    date: str
    file: str  # the run file it is read from


@dataclass(frozen=True)
class _AllReduce:
    backend: str = ""
    world_size: int = 0
    bytes: int = 0


def nccl_bus_bandwidth(rows: Rows, world_size: int | None = None) -> Bandwidth | None:
    """W of the largest measured NCCL all-reduce on a GPU device, of `world_size` processes when given
    (the first device's on a tie)."""
    best = None
    for device, benches in rows.per_gpu(P.DISTRIBUTED_COMMUNICATION_SINGLE_NODE):
        for b in benches:
            c, bw = view(_AllReduce, b), b.figure("busbw_GBps", Metric.BUS_BW)
            if b.status is not Status.MEASURED or c.backend != "nccl" or bw is None:
                continue
            if world_size is not None and c.world_size != world_size:
                continue
            if best is None or (c.bytes, c.world_size) > (best.bytes, best.processes):
                best = Bandwidth(bw * 1e9, device, c.bytes, c.world_size, b.run.date, b.run.file)
    return best


@dataclass(frozen=True)
class Peak:
    """C measured: the bf16 matmul peak of a device's newest row that carries one."""

    flops: float
    date: str
    section: str
    file: str


def measured_peak(rows: Rows, device: str) -> Peak | None:
    found = [b for b in rows.of(device=device) if b.row.peaks is not None]
    if not found:
        return None
    b = max(found, key=lambda b: str(b.run.datetime))
    return Peak(b.row.peaks.measured_flops, b.run.date, b.run.section, b.run.file)


@dataclass(frozen=True)
class Workload:
    """The FFN and batch the bounds are evaluated at: communication_accounting's XXL FFN at the global
    batch that makes it compute-bound on the TPU v5p mesh of that problem (so the two pages agree)."""

    B: float
    D: float
    D_FF: float


@dataclass(frozen=True)
class DeviceRow:
    """One device's C and W, where they come from, and its bounds."""

    kind: str  # "h100", "h200" (W's device) or "tpu": how the template names it and its sources
    device: str | None  # the device folder (None for TPU v5p)
    figures: pc.DeviceFigures
    bounds: pc.ParallelismBounds
    peak: Peak | None  # C measured; None: a datasheet's (or communication_accounting's, for TPU v5p)


@dataclass(frozen=True)
class CalcsFacts:
    """The closed forms at the workload (symbolic forms: TPU v5p's figures, any device would do) and the
    devices whose bounds the page evaluates."""

    wl: Workload
    devices: tuple[DeviceRow, ...]
    w: Bandwidth | None
    dp: pc.DataParallelCalcs
    fs: pc.ShardedCalcs
    tp: pc.ShardedCalcs
    ft: pc.FSDPTPCalcs
    ar: pc.Formula = pc.alternate_ring_all_reduce_time
    ring: pc.Formula = pc.ring_all_reduce_time
    fp16: int = pc.FP16
    tp_backward: str = pc.TP_BACKWARD_EQUATIONS
    index_figures: tuple = ()

    def answers(self, record: str) -> list[pc.Answer]:
        """The Answers of record `record` ("dp", "fs", "tp", "ft"), in field order."""
        return pc.answers(getattr(self, record))

    @property
    def first(self) -> DeviceRow:
        """The device the index quotes the bounds for."""
        return self.devices[0]

    @property
    def h100_borrows_w(self) -> bool:
        return any(d.kind == "h100" for d in self.devices)

    @property
    def scores(self) -> dict[str, Scored]:
        return {p: Scored(Kind.CLOSED_FORM, "closed form") for p in CALC_PROBLEMS}

    @property
    def sources(self) -> list[str]:
        """The run files of the measured C and W (the closed forms read no rows)."""
        return sorted({x.file for x in (self.w, *(d.peak for d in self.devices)) if x is not None and x.file})


def _row(kind: str, device: str | None, C: float, W: float, wl: Workload, peak: Peak | None) -> DeviceRow:
    fig = pc.DeviceFigures(kind, C=C, W=W)
    return DeviceRow(kind, device, fig, pc.parallelism_bounds(fig, wl.B, wl.D_FF), peak)


def facts(ctx: Context) -> CalcsFacts:
    wl = Workload(acc.compute_bound_batch()["global_tokens_int"], acc.XXL["d_model"], acc.XXL["d_ff"])
    devices = []
    w = nccl_bus_bandwidth(ctx.rows)
    if w is not None:
        if h100 := measured_peak(ctx.rows, H100):
            devices.append(_row("h100", H100, h100.flops, w.bps, wl, h100))
        h200 = measured_peak(ctx.rows, w.device)
        if h200 or datasheet_bf16_flops("H200"):
            devices.append(_row("h200", w.device, h200.flops if h200 else datasheet_bf16_flops("H200"), w.bps, wl, h200))
    tpu = pc.TPU_V5P_FIGURES
    devices.append(DeviceRow("tpu", None, tpu, pc.parallelism_bounds(tpu, wl.B, wl.D_FF), None))
    return CalcsFacts(wl, tuple(devices), w, pc.data_parallel_calcs(wl.B, wl.D, wl.D_FF, 4, tpu.C, tpu.W),
                      pc.fsdp_calcs(wl.B, wl.D, wl.D_FF, 4, tpu.C, tpu.W), pc.tp_calcs(wl.B, wl.D, wl.D_FF, 4, tpu.C, tpu.W),
                      pc.fsdp_tp_calcs(wl.B, wl.D, wl.D_FF, 2, 2, tpu.C, tpu.W))
