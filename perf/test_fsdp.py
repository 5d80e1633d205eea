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

Timeline (our FSDP rows): after the timed steps, which run uninstrumented, one more step records
when each all-gather / reduce-scatter was issued, was ready and was needed by its layer
(impl.distributed.fsdp_timeline). extra_info["timeline"] holds rank 0's rows (at most
timeline_rows) and summary, extra_info["timeline_ranks"] every rank's summary and that step's time.

A variant that runs out of memory or fails in setup or a timed step still leaves its row: oom
with the message, or not_run "failed" with the error's last line (and the test fails); a failing
timeline step leaves the timed row with timeline_error. The worker group is then restarted for the
next variant.

The worker commands live in impl.testing.fsdp; the command "names" passed to the
worker group are those functions, so the workers import that module (and its registration in
bench.COMMANDS) when they unpickle the command."""
import pytest
import torch

from impl import accounting as acc
from impl.testing import fsdp as W
from impl.bench.workers import LazyWorkerGroup, mean, slowest, timed_command
from impl.model import param_count
from impl.bench.attention import record_not_run
from impl.bench.legacy_harness import record_oom, run_benchmark
from impl.runtime import is_oom, profile_name
from impl.bench.sweeps import grid
from impl.model import MODEL_CONFIGS

PROBLEM = "fsdp"
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
WS = G["world_size"]
BACKEND = "nccl" if PROFILE == "full" else "gloo"
CPU = torch.device("cpu")
ZERO_STAGE = dict(fsdp=3, fsdp_bf16=3, ddp=0, torch_fsdp=3, torch_fsdp_bf16=3)
OURS = ("fsdp", "fsdp_bf16", "ddp")
TIMELINE = ("fsdp", "fsdp_bf16")  # the rows with an instrumented step


@pytest.fixture(scope="module")
def workers():
    g = LazyWorkerGroup(WS, BACKEND, G["budget_s"], G["timeout_s"])
    yield g
    g.close()


def _predicted(size: str, batch: int, context: int, variant: str) -> dict:
    shape = MODEL_CONFIGS[size]
    n = param_count(**shape)
    activations = acc.activation_bytes(batch, context, shape["d_model"], shape["d_ff"], shape["num_heads"],
                                       shape["num_layers"])
    return dict(n_params=n, activations=activations,
                breakdown=acc.memory_breakdown(n, WS, ZERO_STAGE[variant], activations))


def _error_line(exc: BaseException) -> str:
    """What went wrong in one line: a worker's error arrives with its whole traceback."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    oom = [ln for ln in lines if "out of memory" in ln.lower()]
    return (oom or lines or [type(exc).__name__])[-1][:300]


def _guarded(fn, failure: dict):
    """`fn` that stores its first exception in `failure` and turns later calls into no-ops, so a
    failing step still leaves the benchmark row (the harness would drop a row whose timing raised)."""
    def run():
        if failure:
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded in the row, then reported by _raise_unless_oom
            failure["exc"] = exc
    return run


def _mark_failed(info: dict, exc: BaseException) -> None:
    """An already-recorded row whose timed steps (or the step after them) failed: its timings
    time nothing."""
    info.pop("metrics", None)
    if is_oom(exc):
        info.update(oom=True, oom_message=_error_line(exc))
    else:
        info.update(not_run="failed", not_run_reason=_error_line(exc))


def _record_setup_failure(benchmark, device, config: dict, exc: BaseException, env) -> None:
    if is_oom(exc):
        record_oom(benchmark, problem=PROBLEM, config=config, device=device, message=_error_line(exc))
    else:
        record_not_run(benchmark, problem=PROBLEM, config=config, device=device, kind="failed",
                       reason=_error_line(exc))
    benchmark.extra_info["env"] = env  # the workers' device, not the parent's


def _raise_unless_oom(exc: BaseException) -> None:
    """OOM is a result; any other failure fails the test (its row is already recorded)."""
    if not is_oom(exc):
        pytest.fail(f"{type(exc).__name__}: {exc}", pytrace=False)


def _check_timeline(tl: dict) -> None:
    """Holds on any device: every collective was issued before it was ready, every gather of a
    layer was waited on after it was issued, both phases gathered."""
    s = tl["summary"]
    rows = [dict(zip(tl["columns"], r)) for r in tl["rows"]]
    assert all(r["issue_ms"] <= r["ready_ms"] for r in rows if r["ready_ms"] is not None)
    assert all(r["need_ms"] <= r["start_ms"] for r in rows if r["need_ms"] is not None)
    phases = {(g["kind"], g["phase"]) for g in s["groups"]}
    assert {("all_gather", "forward"), ("all_gather", "backward"), ("reduce_scatter", "backward")} <= phases
    assert 0 <= s["gathers_in_time"] <= s["gathers"] and 0 <= s["exposed_ms"] <= s["span_ms"]


def _record_timed(info: dict, setups: list, timed: list, pred: dict) -> dict:
    """Memory per rank, per-step times and the metrics of the timed steps; returns the metrics."""
    last = timed[-1]
    info.update(predicted=pred["breakdown"], predicted_activations_bytes=pred["activations"],
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
    return metrics


def _record_timeline(info: dict, replies: list) -> None:
    tl = replies[0]["timeline"]
    info.update(timeline=tl, timeline_ranks=[dict(step_s=r["step_s"], summary=r["summary"]) for r in replies])
    info["metrics"].update(timeline_step_s=max(r["step_s"] for r in replies), gathers=tl["summary"]["gathers"],
                           gathers_in_time=tl["summary"]["gathers_in_time"],
                           exposed_comm_ms=tl["summary"]["exposed_ms"])


@pytest.mark.parametrize("variant", G["variants"])
def test_fsdp(benchmark, device, workers, variant):
    size, context, batch = G["size"], G["context"], G["batch"]
    config = dict(size=size, context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                  variant=variant, dtype="bf16" if variant.endswith("bf16") else "fp32")
    if workers.skip(benchmark, problem=PROBLEM, config=config, device=device):
        return
    group = workers.get()
    try:
        setups = group.call(W.cmd_fsdp_setup, size=size, context=context, batch=batch, variant=variant)
    except Exception as exc:  # noqa: BLE001 - the group is dead; the next variant starts a new one
        _record_setup_failure(benchmark, device, config, exc, workers.env)
        _raise_unless_oom(exc)
        return
    log: list = []
    failure: dict = {}
    run_benchmark(benchmark, problem=PROBLEM, config=config, device=CPU,
                  fn=_guarded(timed_command(group, W.cmd_fsdp_step, log), failure),
                  warmup=G["warmup"], rounds=G["rounds"], tokens=WS * batch * context, extra=dict(ipc_s=workers.ipc))
    info = benchmark.extra_info
    info["env"] = workers.env
    if failure:
        _mark_failed(info, failure["exc"])
        _raise_unless_oom(failure["exc"])
        return
    timed = log[-G["rounds"]:]
    pred = _predicted(size, batch, context, variant)
    metrics = _record_timed(info, setups, timed, pred)
    try:
        if variant in TIMELINE:
            _record_timeline(info, group.call(W.cmd_fsdp_timeline, max_rows=G["timeline_rows"]))
        group.call("teardown")
    except Exception as exc:  # noqa: BLE001 - the timed row stands; the failure is recorded beside it
        info["timeline_error"] = _error_line(exc)
        _raise_unless_oom(exc)

    # Checks that hold on any device.
    n, param_bytes = pred["n_params"], acc.param_bytes(pred["n_params"])
    assert setups[0]["n_params"] == n
    assert all(r["loss"] == r["loss"] for r in timed[-1]), "loss must be finite"  # NaN != NaN
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
    if "timeline" in info:
        _check_timeline(info["timeline"])
