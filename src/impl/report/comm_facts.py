"""distributed_communication_single_node as facts: all-reduce time and bus bandwidth per backend and
process count at the largest size both backends ran, from one run of one device (the run with the
most NCCL process counts answers: impl.report.pages.distributed.comm_page);
templates/distributed_communication.md.j2 holds the words."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Point:
    busbw_gbps: float
    seconds: float  # per all-reduce


@dataclass(frozen=True)
class CommFacts:
    device: str  # named as headings name it
    size_bytes: int  # the largest size NCCL ran
    nccl_procs: int  # the most NCCL processes measured
    nccl: Point  # at that size and process count
    gloo_same: Point | None  # Gloo at the same size and process count
    gloo_by_procs: list[tuple[int, float]]  # (processes, bus bandwidth GB/s) at that size
    not_run: int
    nccl_by_procs: list[tuple[int, Point]] = ()  # every NCCL process count at that size
    smallest: tuple[int, Point] | None = None  # (bytes, NCCL at nccl_procs) at the smallest size it ran
    reasons: tuple[str, ...] = ()  # why configurations did not run ("nccl, 6 processes: ...")
    files: tuple[str, ...] = ()  # the run files read
    when: str = "–"  # the run, UTC

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 2**20

    @property
    def gloo_over_nccl(self) -> float | None:
        return None if self.gloo_same is None else self.gloo_same.seconds / self.nccl.seconds

    def algbw_gbps(self, p: Point) -> float:
        """Algorithm bandwidth at the headline size: bytes / time (GB = 1e9 bytes)."""
        return self.size_bytes / p.seconds / 1e9


def comm_facts(device: str, points: dict[tuple[str, int], dict[int, tuple[float, float]]], not_run: int,
               reasons: tuple[str, ...] = (), files: tuple[str, ...] = (), when: str = "–") -> CommFacts | None:
    """points: (backend, processes) -> {bytes: (bus bandwidth GB/s, seconds)} of one run; None unless both
    backends ran."""
    nccl = max((k for k in points if k[0] == "nccl"), default=None)
    gloo = [k for k in sorted(points) if k[0] == "gloo"]
    if not (nccl and gloo):
        return None
    big = max(points[nccl])
    same = points.get(("gloo", nccl[1]), {}).get(big)
    by_procs = [(k[1], Point(*points[k][big])) for k in sorted(points) if k[0] == "nccl" and big in points[k]]
    small = min(points[nccl])
    return CommFacts(device, big, nccl[1], Point(*points[nccl][big]), Point(*same) if same else None,
                     [(k[1], points[k][big][0]) for k in gloo if big in points[k]], not_run, by_procs,
                     (small, Point(*points[nccl][small])) if small != big else None, tuple(reasons), tuple(files),
                     when)
