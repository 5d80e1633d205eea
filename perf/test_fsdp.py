"""fsdp (beyond the assignment): xl on 2 GPUs over NCCL (smoke: tiny on 2 gloo CPU processes),
AdamW (impl.model) on the wrapper's parameters, one row per variant in the same run:

  fsdp             impl.distributed.FSDP, fp32 (ZeRO-3: weights, gradients and AdamW state sharded)
  fsdp_bf16        the same with compute_dtype=bf16 (bf16 all-gathers and matmuls, fp32 master
                   weights, fp32 reduce-scatter)
  ddp              our DDPBucketed (100 MB buckets): replicated weights, the ZeRO-0 reference
  torch_fsdp       torch.distributed.fsdp.fully_shard per block + root, fp32 (the anchor)
  torch_fsdp_bf16  the same with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)

Time per step: pytest-benchmark in the parent around one "step" command to all ranks (slowest
rank + IPC round trip, ipc_s recorded). Each rank also reports its own step time, forward+backward
time and, for our wrappers, the time finish_gradient_synchronization waited (comm_s) and the bytes
handed to collectives. Memory per rank (CUDA allocator; None on the CPU): allocated after setup,
peak of the last timed step (reset at its start) and allocated after it. The prediction next to it
is impl.accounting.memory_breakdown (zero_stage 3 for the FSDP rows, 0 for DDP) with
activation_bytes for the activations; torch's fully_shard rows get the ZeRO-3 prediction too.

The worker commands live in impl.distributed._fsdp_testing; the command "names" passed to the
worker group are those functions, so the workers import that module (and its registration in
bench.COMMANDS) when they unpickle the command."""
import pytest
import torch

from impl import accounting as acc
from impl.distributed import _fsdp_testing as W
from impl.distributed.bench import LazyWorkerGroup, mean, slowest, timed_command
from impl.model import param_count
from impl.profiling.attention_bench import record_not_run
from impl.profiling.harness import run_benchmark
from impl.runtime import profile_name
from impl.sweeps import ALL_SIZES, grid

PROBLEM = "fsdp"
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
WS = G["world_size"]
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
BACKEND = "nccl" if PROFILE == "full" else "gloo"
CPU = torch.device("cpu")
ZERO_STAGE = dict(fsdp=3, fsdp_bf16=3, ddp=0, torch_fsdp=3, torch_fsdp_bf16=3)
OURS = ("fsdp", "fsdp_bf16", "ddp")


@pytest.fixture(scope="module")
def workers():
    g = LazyWorkerGroup(WS, BACKEND, G["budget_s"], G["timeout_s"])
    yield g
    g.close()


def _predicted(size: str, batch: int, context: int, variant: str) -> dict:
    shape = ALL_SIZES[size]
    n = param_count(**shape)
    activations = acc.activation_bytes(batch, context, shape["d_model"], shape["d_ff"], shape["num_heads"],
                                       shape["num_layers"])
    return dict(n_params=n, activations=activations,
                breakdown=acc.memory_breakdown(n, WS, ZERO_STAGE[variant], activations))


@pytest.mark.parametrize("variant", G["variants"])
def test_fsdp(benchmark, device, workers, variant):
    size, context, batch = G["size"], G["context"], G["batch"]
    config = dict(size=size, context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                  variant=variant, dtype="bf16" if variant.endswith("bf16") else "fp32")
    reason = f"needs {WS} GPUs for NCCL, this machine has {GPUS}" if BACKEND == "nccl" and GPUS < WS else None
    if reason or workers.budget.exhausted():
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device,
                       kind="unsupported" if reason else "left_out", reason=reason or workers.budget.reason())
        return
    group = workers.get()
    setups = group.call(W.cmd_fsdp_setup, size=size, context=context, batch=batch, variant=variant)
    log: list = []
    run_benchmark(benchmark, problem=PROBLEM, config=config, device=CPU, fn=timed_command(group, W.cmd_fsdp_step, log),
                  warmup=G["warmup"], rounds=G["rounds"], tokens=WS * batch * context, extra=dict(ipc_s=workers.ipc))
    group.call("teardown")
    timed = log[-G["rounds"]:]
    last = timed[-1]
    pred = _predicted(size, batch, context, variant)
    info = benchmark.extra_info
    info.update(env=workers.env, predicted=pred["breakdown"], predicted_activations_bytes=pred["activations"],
                n_params=pred["n_params"],
                ranks=[dict(init_allocated=s["init_allocated"], init_peak=s["init_peak"],
                            local_param_bytes=s["local_param_bytes"], step_peak=st["peak"],
                            step_allocated=st["allocated"]) for s, st in zip(setups, last)],
                per_step=[[dict(step_s=x["step_s"], fwd_bwd_s=x["fwd_bwd_s"], comm_s=x["comm_s"]) for x in r]
                          for r in timed])
    metrics = info.setdefault("metrics", {})
    metrics.update(worker_step_s=mean(slowest(r, "step_s") for r in timed),
                   fwd_bwd_s=mean(slowest(r, "fwd_bwd_s") for r in timed),
                   comm_s=mean(slowest(r, "comm_s") for r in timed),
                   bytes_per_step=slowest(last, "bytes"),
                   prefetched_fwd_bwd=last[0].get("prefetched"),
                   peak_bytes=slowest(last, "peak"),
                   predicted_total_bytes=pred["breakdown"]["total"])
    if metrics["peak_bytes"] is not None:
        metrics["peak_over_predicted"] = metrics["peak_bytes"] / pred["breakdown"]["total"]

    # Checks that hold on any device.
    n, param_bytes = pred["n_params"], acc.param_bytes(pred["n_params"])
    assert setups[0]["n_params"] == n
    assert all(r["loss"] == r["loss"] for r in last), "loss must be finite"  # NaN != NaN
    local = [s["local_param_bytes"] for s in setups]
    if variant == "ddp":
        assert local == [param_bytes] * WS
        assert metrics["bytes_per_step"] == param_bytes  # one all-reduce of every gradient
    elif variant in ("fsdp", "fsdp_bf16"):
        # Sharded: about 1/WS of the parameters per rank (padding and replicated norm gains on top).
        assert all(param_bytes / WS <= b < param_bytes / WS + param_bytes / 100 for b in local)
        assert metrics["bytes_per_step"] > 0 and 0 <= metrics["comm_s"] < metrics["worker_step_s"]
        # The full fp32 model was built on the device, sharded, and freed: what stays is the shards.
        for s in setups:
            if s["init_allocated"] is not None:
                assert s["init_allocated"] < 0.6 * param_bytes
