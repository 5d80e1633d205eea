"""fsdp and fsdp_accounting (2026; the 2025 xl rows are history): each edition's xl (the grid's
[edition, size] pairs; test ids start with the edition, so `-k 2026` runs the 2026 xl = 2.7B
(2025)) on 2 GPUs over NCCL (smoke: tiny on 2 gloo CPU processes), AdamW (impl.model) on the
wrapper's parameters, one row per variant in the same run:

  fsdp             impl.distributed.FSDP, fp32 (ZeRO-3: weights, gradients and AdamW state sharded)
  fsdp_bf16        the same with compute_dtype=bf16 (bf16 all-gathers and matmuls, fp32 master
                   weights, fp32 reduce-scatter)
  fsdp_block_bf16  fsdp_bf16 with unit=TransformerBlock (one all-gather / reduce-scatter per block,
                   embedding and head per weight; prefetch 1 unit): torch_fsdp_bf16's layout
  fsdp_block_bf16_rs1  fsdp_block_bf16 with one reduce-scatter in flight (fully_shard's count; ours
                   defaults to 2): the lower peak, at what cost in step time
  ddp              our DDPBucketed (100 MB buckets): replicated weights, the ZeRO-0 reference
  torch_fsdp       torch.distributed.fsdp.fully_shard per block + root, fp32 (the anchor)
  torch_fsdp_bf16  the same with MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)

Time per step: one round is one training step on every rank (impl.workloads.dist_steps.train_step,
the same step as DDP's); the benchmark's timer is the slowest rank's own device-synchronised clock.
Each rank also reports its forward+backward time and, for our wrappers, the time
finish_gradient_synchronization waited (comm_s) and the bytes handed to collectives
(details["steps"]). Memory per rank (CUDA allocator; None on the CPU), on one more step after the
timed ones: allocated after setup, peak of that step (reset at its start) and allocated after it.
The prediction next to it is impl.accounting.memory_breakdown (zero_stage 3 for the FSDP rows, 0
for DDP) with activation_bytes for the activations; torch's fully_shard rows get the ZeRO-3
prediction too, and every row fsdp_accounting (a)'s expected saving at the peak
(impl.accounting.fsdp_peak_saving, details["expected_saving"]), to read against the measured
peaks of the ddp and fsdp rows of the same run.

Tensor parallelism (test_fsdp_tensor_parallel, the 2026 xl only): impl.distributed.TensorParallel in
fp32 over 2 and 4 ranks (4: the 4-GPU machine; elsewhere a needs-hardware row) on the same model and
global batch (every rank runs all WS x batch sequences), AdamW on each rank's shards; beside the
step, the all-reduce traffic of one step (counted) and tp_calcs' prediction from this run's matmul
rate and all-reduce bus bandwidth (impl.workloads.fsdp_steps.tp_probe). Its COMM_SHARE is that
predicted communication time over the measured step: TP's all-reduces are not overlapped.

Timeline (our FSDP rows): after that, one more step records when each all-gather / reduce-scatter
was issued, was ready and was needed by its layer (impl.distributed.fsdp_timeline).
details["timeline"] holds rank 0's rows (at most timeline_rows) and summary,
details["timeline_ranks"] every rank's summary and that step's time.

A variant that runs out of memory in setup or a timed step leaves an OOM row (not run, with the
message); any other failure fails the test. The worker group is then restarted for the next
variant. The worker commands are impl.workloads.fsdp_steps (set-up, timeline step) and
impl.workloads.dist_steps (the step).
"""
from dataclasses import asdict

import pytest

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.workloads import dist_steps, fsdp_steps
from impl.workloads.dist_steps import StepSummary
from impl.workloads.editions import GridSize
from impl.bench.harness import set_up_or_oom
from impl.bench.row import Memory, Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.workloads.variants import FSDPVariant
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.runtime import profile_name

PROBLEM = Problem.FSDP
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
WS = G.world_size
BACKEND = "nccl" if PROFILE == "full" else "gloo"
ZERO_STAGE = {v: 0 if v is FSDPVariant.DDP else 3 for v in FSDPVariant}  # impl.accounting's stage of each variant


@pytest.fixture(scope="module")
def workers():
    w = Workers(G.budget_s, G.timeout_s, dist_steps.WorkerState)
    yield w
    w.close()


def _predicted(size: GridSize, batch: int, context: int, variant: str) -> dict:
    shape = size.config
    activations = acc.activation_bytes(batch, context, shape.d_model, shape.d_ff, shape.num_heads, shape.num_layers)
    saving = acc.fsdp_peak_saving(shape.params, WS, acc.largest_sharded_layer_numel(shape.d_model, shape.d_ff,
                                                                                     shape.vocab_size), activations)
    return dict(n_params=shape.params, activations=activations, saving=asdict(saving),
                breakdown=acc.memory_breakdown(shape.params, WS, ZERO_STAGE[variant], activations))


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


CASES = [(z, v) for z in G.sizes for v in G.variants]


@pytest.mark.parametrize("size,variant", CASES, ids=[f"{z.id}-{v}" for z, v in CASES])
def test_fsdp(bench, workers, size: GridSize, variant):
    context, batch = G.context, G.batch
    config = dict(size.row_config(), context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                  variant=variant, dtype="bf16" if variant.endswith("bf16") else "fp32")
    if workers.skip(bench, problem=PROBLEM, config=config, world_size=WS, backend=BACKEND):
        return
    group = workers.get(WS, BACKEND)
    setups = set_up_or_oom(bench, lambda: group.call(fsdp_steps.fsdp_setup, size=size.build_name, context=context,
                                                     batch=batch, variant=variant), problem=PROBLEM, config=config)
    if setups is None:  # an OOM on a rank: the group dies; the next row starts one
        return
    row, timed = measure_on_ranks(bench, group, dist_steps.step, problem=PROBLEM, config=config,
                                  round=f"one training step on each of {WS} ranks (slowest rank's time)",
                                  warmup=G.warmup, rounds=G.rounds, tokens=WS * batch * context)
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    last = group.call(dist_steps.memory_step)
    pred = _predicted(size, batch, context, variant)
    summary = StepSummary.of(timed)
    peaks = [st.memory.peak() for st in last if st.memory.peak() is not None]
    row.memory = Memory(peak_allocated=max(peaks, default=None))
    row.details.update(
        predicted=pred["breakdown"], predicted_activations_bytes=pred["activations"], n_params=pred["n_params"],
        predicted_total_bytes=pred["breakdown"]["total"], peak_bytes=row.memory.peak_allocated,
        expected_saving=pred["saving"],
        prefetched_fwd_bwd=last[0].prefetched, steps=asdict(summary),
        ranks=[dict(init_allocated=s.init.allocated, init_peak=s.init.peak, local_param_bytes=s.local_param_bytes,
                    step_peak=st.memory.peak(), step_allocated=st.memory.after.allocated)
               for s, st in zip(setups, last)])
    if summary.comm_s is not None:
        row.metrics[Metric.COMM_SHARE] = summary.comm_s / bench.benchmark.stats.stats.median
    if variant.ours:
        replies = group.call(fsdp_steps.fsdp_timeline, max_rows=G.timeline_rows)
        row.details.update(timeline=replies[0].timeline, timeline_step_s=max(r.step_s for r in replies),
                           timeline_ranks=[dict(step_s=r.step_s, summary=r.summary) for r in replies])
    bench.save(row)
    group.call(dist_steps.teardown)

    # Checks that hold on any device.
    n, param_bytes = pred["n_params"], acc.param_bytes(pred["n_params"])
    assert setups[0].n_params == n
    assert all(st.loss == st.loss for st in last), "loss must be finite"  # NaN != NaN
    local = [s.local_param_bytes for s in setups]
    if variant == "ddp":
        assert local == [param_bytes] * WS
        assert summary.bytes_per_step == param_bytes  # one all-reduce of every gradient
    elif variant.ours:
        # Sharded: about 1/WS of the parameters per rank (padding and replicated norm gains on top).
        assert all(param_bytes / WS <= b < param_bytes / WS + param_bytes / 100 for b in local)
        assert summary.bytes_per_step > 0 and 0 <= summary.comm_s <= bench.benchmark.stats.stats.max
        # The full fp32 model was built on the device, sharded, and freed: what stays is the shards.
        for s in setups:
            if s.init.allocated is not None:
                assert s.init.allocated < 0.6 * param_bytes
    if variant.ours:
        _check_timeline(row.details["timeline"])


# ---- tensor parallelism beside them ------------------------------------------------------------

TP_CASES = [(z, n) for z in G.sizes if z.edition == "2026" for n in G.tp_world_sizes]


def _tp_prediction(size: GridSize, tokens: int, n: int, probe: fsdp_steps.TPProbe, calls: int) -> dict:
    """tp_calcs' terms for the whole model from this run's measured matmul rate C and all-reduce bus
    bandwidth W: each block is an attention and an FFN sublayer, each one all-reduce of a (tokens,
    d_model) activation in forward and one in backward (tp_forward/backward_comm_time); the blocks'
    matmul FLOPs split N ways, the embedding and LM head's replicated (the model's own count)."""
    shape, p = size.config, probe.allreduce_bytes // (tokens * size.config.d_model)
    D, D_FF, L = shape.d_model, shape.d_ff, shape.num_layers
    W = probe.allreduce_bytes * 2 * (n - 1) / n / probe.allreduce_s  # the ring's bus bandwidth
    C = probe.matmul_flops_per_s
    comm_s = L * 2 * (pc.tp_forward_comm_time(tokens, D, n, W, p) + pc.tp_backward_comm_time(tokens, D, n, W, p))
    batch, context = tokens // G.context, G.context
    per_block = (shape.replace(num_layers=2).flops("train_step", batch, context)
                 - shape.replace(num_layers=1).flops("train_step", batch, context))
    flops = shape.flops("train_step", batch, context) - L * per_block * (1 - 1 / n)
    return dict(matmul_flops_per_s=C, allreduce_busbw_Bps=W, allreduce_s=probe.allreduce_s,
                activation_bytes=probe.allreduce_bytes, flops_per_rank=flops, compute_s=flops / C,
                comm_s=comm_s, step_s=flops / C + comm_s, allreduces_per_step=4 * L,
                payload_bytes_per_step=4 * L * probe.allreduce_bytes,
                ring_bytes_sent_per_rank=calls * pc.ring_all_reduce_bytes(probe.allreduce_bytes, n),
                max_devices_forward=pc.tp_max_devices_forward(D_FF, C, W, p),
                max_devices_backward=pc.tp_max_devices_backward(D_FF, C, W, p))


@pytest.mark.parametrize("size,n_tp", TP_CASES, ids=[f"{z.id}-tp{n}" for z, n in TP_CASES])
def test_fsdp_tensor_parallel(bench, workers, size: GridSize, n_tp: int):
    """TP over n_tp ranks on the same model and global batch as the rows above (WS x batch
    sequences, all of them on every rank), fp32: step time, the activation bytes its all-reduces
    moved, and tp_calcs' prediction from this run's matmul and all-reduce speeds."""
    context, global_batch = G.context, G.batch * WS
    config = dict(size.row_config(), context=context, batch_per_rank=global_batch, world_size=n_tp, backend=BACKEND,
                  variant="tp", dtype="fp32")
    if workers.skip(bench, problem=PROBLEM, config=config, world_size=n_tp, backend=BACKEND):
        return
    group = workers.get(n_tp, BACKEND)
    setups = set_up_or_oom(bench, lambda: group.call(fsdp_steps.tp_setup, size=size.build_name, context=context,
                                                     batch=global_batch), problem=PROBLEM, config=config)
    if setups is None:
        return
    tokens = global_batch * context
    row, timed = measure_on_ranks(bench, group, dist_steps.step, problem=PROBLEM, config=config,
                                  round=f"one training step on each of {n_tp} ranks (slowest rank's time)",
                                  warmup=G.warmup, rounds=G.rounds, tokens=tokens)
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    last = group.call(dist_steps.memory_step)
    traffic = group.call(fsdp_steps.tp_step_traffic)
    probes = group.call(fsdp_steps.tp_probe, tokens=tokens, d_model=size.config.d_model, d_ff=size.config.d_ff,
                        reps=G.tp_probe_reps)
    group.call(dist_steps.teardown)
    # The slowest rank's figures: its matmul rate, the all-reduce as its slowest rank saw it.
    probe = fsdp_steps.TPProbe(matmul_flops_per_s=min(q.matmul_flops_per_s for q in probes),
                               allreduce_s=max(q.allreduce_s for q in probes),
                               allreduce_bytes=probes[0].allreduce_bytes)
    predicted = _tp_prediction(size, tokens, n_tp, probe, traffic[0].calls)
    peaks = [st.memory.peak() for st in last if st.memory.peak() is not None]
    row.memory = Memory(peak_allocated=max(peaks, default=None))
    row.details.update(n_params=setups[0].n_params, peak_bytes=row.memory.peak_allocated, tp_predicted=predicted,
                       tp_traffic=asdict(traffic[0]), steps=asdict(StepSummary.of(timed)),
                       ranks=[dict(init_allocated=s.init.allocated, local_param_bytes=s.local_param_bytes,
                                   step_peak=st.memory.peak(), probe=asdict(q))
                              for s, st, q in zip(setups, last, probes)])
    row.metrics[Metric.COMM_SHARE] = predicted["comm_s"] / bench.benchmark.stats.stats.median
    bench.save(row)

    # Exact where the layout is exact: four all-reduces of one activation per block per step, the
    # same on every rank; the blocks' weights split n ways.
    assert all(t == traffic[0] for t in traffic)
    assert traffic[0].calls == predicted["allreduces_per_step"]
    assert traffic[0].payload_bytes == predicted["payload_bytes_per_step"]
    assert all(st.loss == st.loss for st in last), "loss must be finite"
    shape = size.config
    sharded = shape.num_layers * (4 * shape.d_model ** 2 + 3 * shape.d_model * shape.d_ff)  # BLOCK_SHARDING's weights
    assert all(s.local_param_bytes == acc.param_bytes(shape.params - sharded + sharded // n_tp) for s in setups)
