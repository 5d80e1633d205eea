"""2 naive_ddp_benchmarking, minimal_ddp_flat_benchmarking, ddp_overlap_individual_parameters
_benchmarking (with (b) a profiler timeline of naive vs bucketed) and ddp_overlap_bucketed
_benchmarking (bucket sizes 1 … 1000 MB), next to torch.nn.parallel.DistributedDataParallel
(default bucket_cap_mb) and the single-GPU floor (rank 0 alone, no wrapper, same per-rank batch).

xl, fp32, AdamW (impl.model), 2 GPUs over NCCL; smoke: tiny over gloo on 2 CPU processes.
Timing: pytest-benchmark in the parent times one "step" command to every rank until every rank
replied (slowest rank + IPC round trip, recorded as ipc_s). Each rank measures the time its DDP's
finish_gradient_synchronization waited on communication after backward's compute was done
(comm_s: all of it for naive / flat, the part not hidden behind backward for the overlapped
variants); metrics hold the slowest rank's value and its share of the slowest rank's step.
torch DDP hides its communication inside backward(), so its comm_s is not measured: the
overhead over the single-GPU floor stands for it. One model per worker (built with the largest
context), re-wrapped per variant."""
import pytest
import torch

from impl.bench.workers import LazyWorkerGroup, mean, slowest, timed_command
from impl.bench.legacy_harness import run_benchmark
from impl.runtime import profile_name
from impl.bench.sweeps import grid

PROFILE = profile_name()
G = grid("ddp_benchmarking", PROFILE)
WS = G["world_size"]
# smoke: gloo on the CPU (tiny); full: NCCL, one GPU per rank.
BACKEND = "nccl" if PROFILE == "full" else "gloo"
MAX_CONTEXT = max(c for c, _ in G["configs"])
CPU = torch.device("cpu")  # the parent only sends commands
ANCHORS = "ddp_benchmarking_anchors"
PROBLEMS = dict(single=ANCHORS, torch_ddp=ANCHORS, naive="naive_ddp_benchmarking",
                flat="minimal_ddp_flat_benchmarking", individual="ddp_overlap_individual_parameters_benchmarking",
                bucketed="ddp_overlap_bucketed_benchmarking")


@pytest.fixture(scope="module")
def workers():
    g = LazyWorkerGroup(WS, BACKEND, G["budget_s"], G["timeout_s"])
    yield g
    g.close()


def _config(context, batch, variant, bucket_mb):
    return dict(size=G["size"], context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                variant=variant, bucket_mb=bucket_mb, dtype="fp32")


def _run(benchmark, device, workers, context, batch, variant, bucket_mb=None):
    problem = PROBLEMS[variant]
    if variant == "torch_ddp":
        bucket_mb = None  # torch's default bucket_cap_mb (25)
    config = _config(context, batch, variant, bucket_mb)
    if workers.skip(benchmark, problem=problem, config=config, device=device):
        return
    group = workers.get()
    setup = group.call("ddp_setup", size=G["size"], max_context=MAX_CONTEXT, context=context, batch=batch,
                       variant=variant, bucket_mb=bucket_mb)[0]
    log: list = []
    ranks = 1 if variant == "single" else WS
    run_benchmark(benchmark, problem=problem, config=config, device=CPU, fn=timed_command(group, "ddp_step", log),
                  warmup=G["warmup"], rounds=G["rounds"], tokens=ranks * batch * context,
                  extra=dict(ipc_s=workers.ipc, **setup))
    group.call("teardown")
    info = benchmark.extra_info
    info["env"] = workers.env
    timed = log[-G["rounds"]:]
    steps = [slowest(r, "step_s") for r in timed]
    comm = [slowest(r, "comm_s") for r in timed]
    info["per_step"] = [[None if x is None else dict(step_s=x["step_s"], fwd_bwd_s=x["fwd_bwd_s"], comm_s=x["comm_s"])
                         for x in r] for r in timed]
    metrics = info.setdefault("metrics", {})
    metrics.update(worker_step_s=mean(steps), fwd_bwd_s=mean(slowest(r, "fwd_bwd_s") for r in timed),
                   comm_s=mean(comm), bytes_per_step=slowest(timed[-1], "bytes"))
    if metrics["comm_s"] is not None:
        metrics["comm_share"] = metrics["comm_s"] / metrics["worker_step_s"]
    if variant not in ("single", "torch_ddp"):
        # Every variant hands each gradient to exactly one all-reduce per step.
        assert metrics["bytes_per_step"] == setup["grad_bytes"]
        assert 0 <= metrics["comm_share"] < 1


CONFIGS = [tuple(c) for c in G["configs"]]
IDS = [f"ctx{c}-b{b}" for c, b in CONFIGS]


@pytest.mark.parametrize("context,batch", CONFIGS, ids=IDS)
def test_ddp_benchmarking_single_gpu_floor(benchmark, device, workers, context, batch):
    """The floor: the same per-rank step on one GPU without any wrapper or communication."""
    _run(benchmark, device, workers, context, batch, "single")


@pytest.mark.parametrize("context,batch", CONFIGS, ids=IDS)
def test_naive_ddp_benchmarking(benchmark, device, workers, context, batch):
    _run(benchmark, device, workers, context, batch, "naive")


@pytest.mark.parametrize("context,batch", CONFIGS, ids=IDS)
def test_minimal_ddp_flat_benchmarking(benchmark, device, workers, context, batch):
    _run(benchmark, device, workers, context, batch, "flat")


@pytest.mark.parametrize("context,batch", CONFIGS, ids=IDS)
def test_ddp_overlap_individual_parameters_benchmarking(benchmark, device, workers, context, batch):
    _run(benchmark, device, workers, context, batch, "individual")


@pytest.mark.parametrize("context,batch,bucket_mb", [(c, b, mb) for c, b in CONFIGS for mb in G["bucket_mb"]],
                         ids=[f"ctx{c}-b{b}-{mb}MB" for c, b in CONFIGS for mb in G["bucket_mb"]])
def test_ddp_overlap_bucketed_benchmarking(benchmark, device, workers, context, batch, bucket_mb):
    _run(benchmark, device, workers, context, batch, "bucketed", bucket_mb)


@pytest.mark.parametrize("context,batch", CONFIGS, ids=IDS)
def test_ddp_benchmarking_torch_ddp(benchmark, device, workers, context, batch):
    _run(benchmark, device, workers, context, batch, "torch_ddp")


TRACE = G["trace"]
TRACE_BATCH = dict(CONFIGS)[TRACE["context"]]


@pytest.mark.parametrize("variant,bucket_mb", [tuple(v) for v in TRACE["variants"]],
                         ids=[v if mb is None else f"{v}-{mb}MB" for v, mb in TRACE["variants"]])
def test_ddp_overlap_individual_parameters_benchmarking_trace(benchmark, device, workers, variant, bucket_mb):
    """(b) torch.profiler timeline of one step on rank 0: kernels on the compute stream vs NCCL
    kernels (merged intervals in extra_info["timeline"]; `make report` draws the PNG)."""
    problem = "ddp_overlap_individual_parameters_benchmarking"
    config = dict(_config(TRACE["context"], TRACE_BATCH, variant, bucket_mb), kind="trace")
    if workers.skip(benchmark, problem=problem, config=config, device=device):
        return
    group = workers.get()
    group.call("ddp_setup", size=G["size"], max_context=MAX_CONTEXT, context=TRACE["context"], batch=TRACE_BATCH,
               variant=variant, bucket_mb=bucket_mb)
    out: dict = {}

    def trace():
        out["timeline"] = group.call("ddp_trace", warmup=TRACE["warmup"], steps=TRACE["steps"],
                                     max_intervals=TRACE["max_intervals"])[0]

    run_benchmark(benchmark, problem=problem, config=config, device=CPU, fn=trace, warmup=0, rounds=1)
    group.call("teardown")
    benchmark.extra_info.update(env=workers.env, timeline=out["timeline"])
    tl = out["timeline"]
    assert tl["lanes"]["compute"] and tl["lanes"]["communication"], "both lanes must hold intervals"
    assert {p["name"] for p in tl["phases"]} >= {"forward", "backward", "optimizer step"}
