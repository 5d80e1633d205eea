"""2 distributed_communication_single_node: all-reduce of float32 buffers (1 MB ... 1 GB) with
gloo on the CPU and NCCL on the GPUs at 2, 4, 6 processes; time, algorithm and bus bandwidth
(nccl-tests convention), and the latency/bandwidth fit t = o + S/w the bucket model uses.

Timing: one persistent worker group per (backend, processes); pytest-benchmark times, in the
parent, one command that makes every rank run `inner` back-to-back all-reduces (ranks lined up by
a barrier, device synchronised) and waits for every rank's reply. Per all-reduce time =
(parent time − IPC round trip of a no-op command) / inner; the ranks' own clocks (slowest rank) are
recorded beside it as a cross-check. NCCL runs need one GPU per process: the rest are recorded as
not run."""
import pytest
import torch

from impl import accounting as acc
from impl.bench.workers import WorkerGroup, mean, timed_command
from impl.distributed.collectives import algorithm_bandwidth, bus_bandwidth
from impl.bench.attention import Budget, record_not_run
from impl.bench.legacy_harness import run_benchmark
from impl.runtime import env_info, profile_name
from impl.bench.sweeps import grid

PROBLEM = "distributed_communication_single_node"
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
CPU = torch.device("cpu")  # the parent only sends commands; the workers own the devices
RESULTS: dict = {}  # (backend, procs) -> [(bytes, seconds per all-reduce)], for the fit rows


class _Slot:
    """One worker group alive at a time (6 CPU processes plus 2 GPU ones would crowd the host)."""

    def __init__(self):
        self.key, self.group, self.ipc = None, None, None
        self.budget = None

    def get(self, backend: str, procs: int):
        if self.key != (backend, procs) or self.group is None or self.group.dead:
            self.close()
            self.group = WorkerGroup(procs, backend, command_timeout_s=G["timeout_s"])
            self.key, self.ipc = (backend, procs), self.group.ping()
        return self.group, self.ipc

    def close(self):
        if self.group is not None:
            self.group.close()
        self.key, self.group = None, None


@pytest.fixture(scope="module")
def slot():
    s = _Slot()
    s.budget = Budget(G["budget_s"])  # started by the file's first test, not at collection
    yield s
    s.close()


def _not_runnable(backend: str, procs: int) -> str | None:
    if backend == "nccl" and procs > GPUS:
        return f"NCCL needs one GPU per process: {procs} processes, this machine has {GPUS} GPU(s)"
    return None


CASES = [(b, n, mb) for b, n in G["runs"] for mb in G["sizes_mb"]]


@pytest.mark.parametrize("backend,procs,size_mb", CASES)
def test_distributed_communication_single_node(benchmark, device, slot, backend, procs, size_mb):
    nbytes = size_mb * 2 ** 20
    config = dict(backend=backend, world_size=procs, size_mb=size_mb, bytes=nbytes, dtype="float32")
    extra = dict(left_out=G.get("left_out"))
    reason = _not_runnable(backend, procs)
    if reason or slot.budget.exhausted():
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device,
                       kind="unsupported" if reason else "left_out", reason=reason or slot.budget.reason(), extra=extra)
        return
    group, ipc = slot.get(backend, procs)
    inner = max(1, min(G["max_inner"], G["inner_bytes"][backend] // nbytes))
    log: list = []
    run_benchmark(benchmark, problem=PROBLEM, config=config, device=CPU,
                  fn=timed_command(group, "allreduce", log, nbytes=nbytes, inner=inner),
                  warmup=G["warmup"], rounds=G["rounds"], extra=dict(extra, inner=inner, ipc_s=ipc))
    info = benchmark.extra_info
    info["env"] = env_info(device)
    timed = log[-G["rounds"]:]
    worker_s = mean(max(r) / inner for r in timed)  # slowest rank's clock, per all-reduce
    info["worker_time_s"] = worker_s
    if benchmark.stats is None:  # --benchmark-disable
        return
    per_op = max(benchmark.stats.stats.median - ipc, 1e-9) / inner
    info["metrics"] = dict(time_s=per_op, algbw_GBps=algorithm_bandwidth(nbytes, per_op) / 1e9,
                           busbw_GBps=bus_bandwidth(nbytes, per_op, procs) / 1e9,
                           worker_busbw_GBps=bus_bandwidth(nbytes, worker_s, procs) / 1e9)
    RESULTS.setdefault((backend, procs), []).append((nbytes, per_op))
    # Each round's ranks ran inside the parent's timed window: its clock can only read longer.
    assert all(p >= max(step) for p, step in zip(benchmark.stats.stats.data, timed))


@pytest.mark.parametrize("backend,procs", [tuple(r) for r in G["runs"]])
def test_distributed_communication_single_node_fit(benchmark, device, backend, procs):
    """t = o + S/w by least squares over this run's sizes (S = bytes per rank, so w is the
    algorithm bandwidth): the o and w of the ddp_overlap_bucketed (b) model."""
    config = dict(backend=backend, world_size=procs, kind="fit")
    points = RESULTS.get((backend, procs), [])
    if len({b for b, _ in points}) < 2:
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device, kind="left_out",
                       reason=_not_runnable(backend, procs) or "fewer than two sizes were timed")
        return
    sizes, times = zip(*points)
    fit: dict = {}

    def do_fit():
        fit["o_s"], fit["w_Bps"] = acc.fit_latency_bandwidth(sizes, times)

    run_benchmark(benchmark, problem=PROBLEM, config=config, device=CPU, fn=do_fit, warmup=0, rounds=1,
                  extra=dict(results=dict(sizes_bytes=list(sizes), times_s=list(times))))
    benchmark.extra_info["results"].update(fit)
    assert fit["w_Bps"] > 0
