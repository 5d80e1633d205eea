"""2 naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_individual_parameters
_benchmarking (with (b) a profiler timeline of naive vs per-parameter overlapped) and
ddp_bucketed_benchmarking (the 2025 handout's name for ddp_overlap_bucketed's benchmark, a 2025
question; stored runs before issue 33 call it ddp_overlap_bucketed_benchmarking) (bucket sizes 1 … 1000
MB), next to torch.nn.parallel.DistributedDataParallel (default bucket_cap_mb) and the single-GPU floor
(rank 0 alone, no wrapper, same per-rank batch).

Each edition's xl (the grid's [edition, size] pairs: 2025's xl, 2026's xl = 2.7B (2025); test ids
start with the edition, so `-k 2026` runs one edition), fp32, AdamW (impl.model), 2 GPUs over
NCCL; smoke: tiny over gloo on 2 CPU processes.
Timing: one round is one training step on every rank (impl.workloads.dist_steps.train_step); the
benchmark's timer is the slowest rank's own device-synchronised clock, so stats are the slowest
rank's step time. Each rank also measures the time its DDP's finish_gradient_synchronization
waited on communication after backward's compute was done (comm_s: all of it for naive / flat, the
part not hidden behind backward for the overlapped variants); details["steps"] holds the mean over
steps of the slowest rank's figures, Metric.COMM_SHARE that comm_s over the median step. torch DDP
hides its communication inside backward(), so its comm_s is not measured: the overhead over the
single-GPU floor stands for it. One model per worker (built with the largest context), re-wrapped
per variant. Memory: the largest CUDA peak over the ranks in one more step after the timed ones
(None on the CPU). The (b) timeline is a payload of the naive and individual rows at the trace context:
after their timed steps, a few more steps profiled on rank 0 (impl.bench.traces)."""
from dataclasses import asdict

import pytest

from impl.workloads import dist_steps
from impl.workloads.dist_steps import StepSummary
from impl.workloads.editions import GridSize
from impl.bench.row import Memory, Metric, Status
from impl.workloads.problems import Problem, StoredGroup
from impl.workloads.sweeps import grid
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.runtime import profile_name

PROFILE = profile_name()
G = grid("ddp_benchmarking", PROFILE)
WS = G.world_size
# smoke: gloo on the CPU (tiny); full: NCCL, one GPU per rank.
BACKEND = "nccl" if PROFILE == "full" else "gloo"
MAX_CONTEXT = max(c for c, _ in G.configs)
ANCHORS = StoredGroup.DDP_BENCHMARKING_ANCHORS
PROBLEMS = dict(single=ANCHORS, torch_ddp=ANCHORS, naive=Problem.NAIVE_DDP_BENCHMARKING,
                flat=Problem.MINIMAL_DDP_FLAT_BENCHMARKING,
                individual=Problem.DDP_OVERLAP_INDIVIDUAL_PARAMETERS_BENCHMARKING,
                bucketed=Problem.DDP_BUCKETED_BENCHMARKING)
TRACE = G.trace


@pytest.fixture(scope="module")
def workers():
    w = Workers(G.budget_s, G.timeout_s, dist_steps.WorkerState)
    yield w
    w.close()


def _run(bench, workers, size: GridSize, context, batch, variant, bucket_mb=None):
    problem = PROBLEMS[variant]
    if variant == "torch_ddp":
        bucket_mb = None  # torch's default bucket_cap_mb (25)
    config = dict(size.row_config(), context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                  variant=variant, bucket_mb=bucket_mb, dtype="fp32")
    if workers.skip(bench, problem=problem, config=config, world_size=WS, backend=BACKEND):
        return
    group = workers.get(WS, BACKEND)
    setup = group.call(dist_steps.ddp_setup, size=size.build_name, max_context=MAX_CONTEXT, context=context,
                       batch=batch, variant=variant, bucket_mb=bucket_mb)[0]
    ranks = 1 if variant == "single" else WS
    row, timed = measure_on_ranks(
        bench, group, dist_steps.step, problem=problem, config=config,
        round=f"one training step on {'rank 0 alone' if ranks == 1 else f'each of {WS} ranks'} (slowest rank's time)",
        warmup=G.warmup, rounds=G.rounds, tokens=ranks * batch * context, details=asdict(setup))
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    stats = bench.benchmark.stats.stats
    summary = StepSummary.of(timed)
    row.details["steps"] = asdict(summary)
    if summary.comm_s is not None:
        row.metrics[Metric.COMM_SHARE] = summary.comm_s / stats.median
    # The step's peak from one more step after the timed ones (the readings synchronise): rank 0's
    # for the single-GPU floor, the largest over the ranks otherwise.
    peaks = [r.memory.peak() for r in group.call(dist_steps.memory_step) if r is not None and r.memory.peak() is not None]
    row.memory = Memory(peak_allocated=max(peaks, default=None))
    trace = (variant, bucket_mb) in TRACE.variants and context == TRACE.context
    if trace:
        row.details["timeline"] = group.call(dist_steps.profiled_steps, warmup=TRACE.warmup, steps=TRACE.steps,
                                             max_intervals=TRACE.max_intervals)[0]
    bench.save(row)
    group.call(dist_steps.teardown)
    if variant not in ("single", "torch_ddp"):
        # Every variant hands each gradient to exactly one all-reduce per step.
        assert summary.bytes_per_step == setup.grad_bytes
        assert 0 <= summary.comm_s <= stats.max
    if trace:
        tl = row.details["timeline"]
        assert tl["lanes"]["compute"] and tl["lanes"]["communication"], "both lanes must hold intervals"
        assert {p["name"] for p in tl["phases"]} >= {"forward", "backward", "optimizer step"}


SIZES = G.sizes
CONFIGS = [(z, c, b) for z in SIZES for c, b in G.configs]
IDS = [f"{z.id}-ctx{c}-b{b}" for z, c, b in CONFIGS]
BUCKETED = [(z, c, b, mb) for z, c, b in CONFIGS if z.edition in G.bucketed_editions for mb in G.bucket_mb]


@pytest.mark.parametrize("size,context,batch", CONFIGS, ids=IDS)
def test_ddp_benchmarking_single_gpu_floor(bench, workers, size, context, batch):
    """The floor: the same per-rank step on one GPU without any wrapper or communication."""
    _run(bench, workers, size, context, batch, "single")


@pytest.mark.parametrize("size,context,batch", CONFIGS, ids=IDS)
def test_naive_ddp_benchmarking(bench, workers, size, context, batch):
    _run(bench, workers, size, context, batch, "naive")


@pytest.mark.parametrize("size,context,batch", CONFIGS, ids=IDS)
def test_minimal_ddp_flat_benchmarking(bench, workers, size, context, batch):
    _run(bench, workers, size, context, batch, "flat")


@pytest.mark.parametrize("size,context,batch", CONFIGS, ids=IDS)
def test_ddp_overlap_individual_parameters_benchmarking(bench, workers, size, context, batch):
    _run(bench, workers, size, context, batch, "individual")


@pytest.mark.parametrize("size,context,batch,bucket_mb", BUCKETED,
                         ids=[f"{z.id}-ctx{c}-b{b}-{mb}MB" for z, c, b, mb in BUCKETED])
def test_ddp_bucketed_benchmarking(bench, workers, size, context, batch, bucket_mb):
    _run(bench, workers, size, context, batch, "bucketed", bucket_mb)


@pytest.mark.parametrize("size,context,batch", CONFIGS, ids=IDS)
def test_ddp_benchmarking_torch_ddp(bench, workers, size, context, batch):
    _run(bench, workers, size, context, batch, "torch_ddp")
