"""2 distributed_communication_single_node: all-reduce of float32 buffers (1 MB ... 1 GB) with
gloo on the CPU and NCCL on the GPUs at 2, 4, 6 processes; time, algorithm and bus bandwidth
(nccl-tests convention). The latency/bandwidth fit t = o + S/w that the bucket model uses is
computed by the report from these rows' medians.

Kernel-level rows: one call is one all-reduce on every rank (lined up by a barrier), timed on each
rank with its device clock (CUDA events on a GPU); the benchmark's timer is the slowest rank's
clock (impl.bench.worker_group.SlowestRankClock), with enough all-reduces per round that a round
is at least 1 ms, so stats.median is the time of one all-reduce. One worker group per (backend,
processes); NCCL runs need one GPU per process, the rest are not-run rows (needs_hardware)."""
import pytest

from impl.workloads import dist_steps
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.distributed.collectives import algorithm_bandwidth, bus_bandwidth
from impl.runtime import profile_name

PROBLEM = Problem.DISTRIBUTED_COMMUNICATION_SINGLE_NODE
G = grid(PROBLEM, profile_name())
CASES = [(b, n, mb) for b, n in G.runs for mb in G.sizes_mb]


@pytest.fixture(scope="module")
def workers():
    w = Workers(G.budget_s, G.timeout_s, dist_steps.WorkerState)
    yield w
    w.close()


@pytest.mark.parametrize("backend,procs,size_mb", CASES)
def test_distributed_communication_single_node(bench, workers, backend, procs, size_mb):
    nbytes = size_mb * 2 ** 20
    config = dict(backend=backend, world_size=procs, size_mb=size_mb, bytes=nbytes, dtype="float32")
    details = dict(left_out=G.left_out)
    if workers.skip(bench, problem=PROBLEM, config=config, world_size=procs, backend=backend):
        return
    row, timed = measure_on_ranks(
        bench, workers.get(procs, backend), dist_steps.allreduce, problem=PROBLEM, config=config,
        round=f"one all-reduce of {size_mb} MB float32 on {procs} ranks (barrier-aligned; slowest rank's device time)",
        warmup=G.warmup, rounds=G.rounds, kernel=True, details=details, nbytes=nbytes)
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    per_op = bench.benchmark.stats.stats.median
    row.metrics[Metric.BYTES] = nbytes
    row.metrics[Metric.ALG_BW] = algorithm_bandwidth(nbytes, per_op) / 1e9
    row.metrics[Metric.BUS_BW] = bus_bandwidth(nbytes, per_op, procs) / 1e9
    bench.save(row)
    # Every timed call ran on every rank, and the timer read the slowest of them.
    assert all(len(r) == procs and all(x.seconds > 0 for x in r) for r in timed)
