"""distributed_communication_single_node as facts: all-reduce time and bus bandwidth per backend and
process count at the largest size both backends ran; templates/distributed_communication.md.j2 holds
the words."""
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
    nccl_procs: int
    nccl: Point
    gloo_same: Point | None  # Gloo at the same size and process count
    gloo_by_procs: list[tuple[int, float]]  # (processes, bus bandwidth GB/s) at that size
    not_run: int

    @property
    def size_mb(self) -> float:
        return self.size_bytes / 2**20

    @property
    def gloo_over_nccl(self) -> float | None:
        return None if self.gloo_same is None else self.gloo_same.seconds / self.nccl.seconds


def comm_facts(device: str, points: dict[tuple[str, int], dict[int, tuple[float, float]]], not_run: int
               ) -> CommFacts | None:
    """points: (backend, processes) -> {bytes: (bus bandwidth GB/s, seconds)}; None unless both backends ran."""
    nccl = max((k for k in points if k[0] == "nccl"), default=None)
    gloo = [k for k in sorted(points) if k[0] == "gloo"]
    if not (nccl and gloo):
        return None
    big = max(points[nccl])
    same = points.get(("gloo", nccl[1]), {}).get(big)
    return CommFacts(device, big, nccl[1], Point(*points[nccl][big]), Point(*same) if same else None,
                     [(k[1], points[k][big][0]) for k in gloo if big in points[k]], not_run)
