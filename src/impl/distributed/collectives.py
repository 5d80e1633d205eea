"""All-reduce micro-benchmark and the bandwidth conventions used to report it.

Bandwidths follow nccl-tests (PERFORMANCE.md there):

* algorithm bandwidth  algbw = bytes / time
* bus bandwidth        busbw = algbw * 2 (n - 1) / n

busbw corrects for the fact that a ring all-reduce moves 2(n-1)/n times the
buffer over each link, so it is comparable to the hardware link bandwidth
regardless of the number of ranks.
"""

from __future__ import annotations

import statistics
import time
from typing import Sequence

import torch
import torch.distributed as dist

from impl.distributed.release import Released, released

# Version-tolerant names: newer torch renames the *_tensor collectives to
# *_single and warns on the old names.
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def algorithm_bandwidth(nbytes: float, seconds: float) -> float:
    """Bytes per second seen by the caller: buffer size / elapsed time."""
    return nbytes / seconds


def bus_bandwidth(nbytes: float, seconds: float, world_size: int) -> float:
    """nccl-tests bus bandwidth of an all-reduce, in bytes per second."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    return algorithm_bandwidth(nbytes, seconds) * 2 * (world_size - 1) / world_size


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def allreduce_benchmark(
    rank: int,
    world_size: int,
    sizes_bytes: Sequence[int],
    warmup: int = 5,
    iters: int = 20,
    device_kind: str = "cuda",
) -> list[dict]:
    """Time ``dist.all_reduce`` of float32 tensors of each size.

    Launch on every rank (e.g. ``launch(allreduce_benchmark, n, args=(...))``).
    Each iteration is timed on the host between device synchronisations; the
    time of an iteration is the max over ranks (the collective is done only
    when the slowest rank is). Every rank returns the same list of dicts, one
    per size: bytes, mean_s, median_s, algbw_GBps, busbw_GBps (from the median).
    """
    device = torch.device("cuda", torch.cuda.current_device()) if device_kind == "cuda" else torch.device("cpu")
    results = []
    for nbytes in sizes_bytes:
        numel = max(1, int(nbytes) // 4)
        x = torch.ones(numel, dtype=torch.float32, device=device)
        local_times = []
        # gloo must let go of x before this rank may exit (issue 23); waited once, after the timing
        with Released() as keep:
            keep(x)
            for _ in range(warmup):
                dist.all_reduce(x)
            _sync(device)
            for _ in range(iters):
                # Line ranks up so one rank's late start does not count as comm time.
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                dist.all_reduce(x)
                _sync(device)
                local_times.append(time.perf_counter() - t0)

        # A tensor all-gather, not all_gather_object: its staging tensors would bypass Released.
        mine = torch.tensor(local_times, dtype=torch.float64, device=device)
        gathered = [torch.empty_like(mine) for _ in range(world_size)]
        released(dist.all_gather, gathered, mine)
        per_iter = torch.stack(gathered).amax(dim=0).tolist()
        actual_bytes = numel * 4
        median = statistics.median(per_iter)
        results.append(
            {
                "bytes": actual_bytes,
                "world_size": world_size,
                "iters": iters,
                "mean_s": statistics.fmean(per_iter),
                "median_s": median,
                "algbw_GBps": algorithm_bandwidth(actual_bytes, median) / 1e9,
                "busbw_GBps": bus_bandwidth(actual_bytes, median, world_size) / 1e9,
            }
        )
    return results


def allreduce_table(rank: int, world_size: int, sizes_mb: str = "1,10", device_kind: str = "cpu") -> str:
    """Command-line entry for torchrun (arguments arrive as strings), e.g. on a CPU with gloo:

        torchrun --nproc-per-node 2 -m impl.distributed.run_worker \\
            impl.distributed.collectives:allreduce_table 1,10,100 cpu
    """
    sizes = [int(float(s) * 2**20) for s in sizes_mb.split(",")]
    rows = allreduce_benchmark(rank, world_size, sizes, device_kind=device_kind)
    return "\n".join(f"{r['bytes'] / 2**20:g} MiB on {world_size} ranks: median {r['median_s'] * 1e3:.3f} ms, "
                     f"algbw {r['algbw_GBps']:.2f} GB/s, busbw {r['busbw_GBps']:.2f} GB/s" for r in rows)
