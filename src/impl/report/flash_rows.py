"""The kernel rows of the FlashAttention pages, typed: their config view, labels and table cells (the attention pages'
too). Times are pytest-benchmark medians (do_bench's in older files, impl.report.legacy)."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.row import Metric, Status
from impl.bench.timers import host_bound as timers_host_bound
from impl.report.ratio import Headline
from impl.report.rows import Bench, View, group
from impl.report.timer_probe import ProbeCheck, check, probe_of

IMPL_LABELS = {"flash_triton": "ours (Triton fwd + Triton bwd)",
               "flash_triton_compiled_bwd": "ours (Triton fwd + compiled bwd)",
               "flash_triton_compiled": "torch.compile(ours)", "naive": "naive PyTorch",
               "sdpa_flash": "SDPA flash backend", "sdpa_cudnn": "SDPA cuDNN backend",
               "flash_auto": "ours (kernel table)"}  # kernels="auto": a Gluon kernel where the table names one
IMPL_COLORS = {impl: f"C{i}" for i, impl in enumerate(IMPL_LABELS)}  # one colour per implementation in every figure
MODE_LABELS = {"fwd": "forward", "bwd": "backward", "fwd_bwd": "forward+backward"}
STATUS_LABELS = {Status.OOM: "OOM", Status.UNSUPPORTED: "unsupported", Status.LEFT_OUT: "left out",
                 Status.LEFT_OUT_BY_BUDGET: "left out (budget)", Status.NEEDS_HARDWARE: "needs hardware",
                 Status.FAILED: "failed"}


@dataclass(frozen=True)
class Kernel(View):
    impl: str = ""
    mode: str = ""  # fwd, bwd, fwd_bwd
    dtype: str = ""
    d: int = 0
    seq: int = 0
    batch: int = 0
    heads: int = 0
    causal: bool | None = None
    host: bool | None = None  # flash_shapes' host-cost rows (timed on the host clock)


kernel = Kernel.of


def ran(b: Bench) -> bool:
    return b.status is Status.MEASURED


def host_bound(b: Bench) -> bool:
    """A measured row whose host time to issue a call (metric host_ms) is most of the call: it times the launch
    path, not the kernels (impl.bench.timers.host_bound; rows from before the metric: False)."""
    return ran(b) and b.stats is not None and timers_host_bound(b.stats.median, b.metric(Metric.HOST_MS))


def status_label(b: Bench) -> str | None:  # None: it ran
    return None if ran(b) else STATUS_LABELS.get(b.status, b.status.value)


@dataclass(frozen=True)
class Cell:  # a table cell of one row: its value where it ran, else why not (STATUS_LABELS')
    value: float | None
    status: str | None = None  # None: it ran


def cell(b: Bench | None, value) -> Cell | None:  # None without a row
    return None if b is None else Cell(value(b)) if ran(b) else Cell(None, status_label(b))


def median_ms(b: Bench) -> float:
    return b.stats.median * 1e3


def pick(rows: list[Bench], **cfg) -> Bench | None:  # the first row that ran with these config values
    return next((b for b in rows if ran(b) and all(getattr(kernel(b), k) == v for k, v in cfg.items())), None)


def groups(rows: list[Bench], *keys: str) -> list[tuple[tuple, list[Bench]]]:  # sorted by key; rows in order
    by = group(rows, lambda b: tuple(getattr(kernel(b), k) for k in keys))
    return sorted(by.items(), key=lambda kv: kv[0])


def best_anchor(rows: list[Bench]) -> Bench | None:  # the faster SDPA backend that ran, the first on a tie
    return min((b for b in rows if kernel(b).impl.startswith("sdpa") and ran(b)), key=lambda b: b.stats.median,
               default=None)


def not_run(rows: list[Bench]) -> tuple[tuple[str, str], ...]:  # (status, reason) of each once, in row order
    return tuple(dict.fromkeys((status_label(b), b.row.reason) for b in rows if b.row.reason and not ran(b)))


def probe_check(reports_dir, device: str, ours: Bench, h: Headline, mode: str) -> ProbeCheck | None:
    """`h` beside the device's do_bench-against-events probe (impl.report.timer_probe), where one timed ours' impl in
    `mode` at ours' shape."""
    c = kernel(ours)
    shape = dict(batch=c.batch, heads=c.heads, seq=c.seq, d=c.d, dtype=c.dtype, causal=c.causal)
    return check(probe_of(reports_dir, device, c.impl, mode, **shape), h, mode)


def timers(rows: list[Bench]) -> tuple[str, ...]:  # the clocks: timing records', or older files' `timer` detail
    names = {b.row.timing.timer if b.row.timing is not None else b.details.get("timer") for b in rows}
    return tuple(sorted(n for n in names if n))
