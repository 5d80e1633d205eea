"""leaderboard (2026) on one GPU (issue 27): the 8B training step of impl.workloads.leaderboard_2026 with
fewer layers, at one rank's share of the two-GPU batch, timed per layer count and checkpointing
policy. Each row builds a fresh model and optimizer, runs one first step timed apart (FlashAttention
autotuning, optimizer-state allocation: the first_call_s metric), then warm-up and timed steps through
the harness (step time, tokens/s, MFU, CUDA peak memory). OOM anywhere is a row with status OOM and
the sweep goes on; rows past the file's time budget are left out by budget. The page predicts the
two-GPU step from these rows (impl.leaderboard_prediction).

test_leaderboard_2026_two_gpus runs the step itself on two GPUs, one row per checkpointing candidate
(`-k two_gpus`; smoke: the tiny config on 2 gloo CPU processes). Grid: impl.workloads.sweeps."""
import time
from dataclasses import asdict

import pytest

from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import time_once
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.workloads.leaderboard_2026 import (StepRankState, StepSpec, build_step, rank_breakdown, rank_do_bench,
                                             rank_first_step,
                                             rank_peak, rank_setup, rank_step, rank_teardown)
from impl.bench.row import Memory, Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.runtime import free_memory, profile_name

PROBLEM = Problem.LEADERBOARD_2026
G = grid(PROBLEM, profile_name())
BUDGET = Budget(G.budget_s)
CASES = [(policy, k, layers) for policy, k in G.policies for layers in G.layers]


@pytest.mark.parametrize("policy,k,layers", CASES)
def test_leaderboard_2026(bench, policy, k, layers):
    spec = StepSpec(config=G.config, num_layers=layers, batch=G.batch, context=G.context,
                    checkpointing=policy, checkpoint_k=k, attn_impl=G.attn_impl)
    row_config = dict(config=spec.config, layers=layers, batch=spec.batch, context=spec.context, checkpointing=policy,
                      k=k, attn_impl=spec.attn_impl, world_size=1, dtype="bf16", weights="bf16", loss="sum")
    details = dict(params=spec.model.params)
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=row_config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return

    def set_up():
        step = build_step(spec, bench.device)
        return step, time_once(step.step, bench.device)  # autotunes here, not in warm-up or rounds
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=row_config, details=details)
    if got is None:
        return
    step, first_s = got
    bench.measure(problem=PROBLEM, config=row_config, fn=step.step, round="one training step (zero_grad, "
                  "forward, summed cross-entropy, backward, AdamW step)", warmup=G.warmup, rounds=G.rounds,
                  flops=spec.flops(), tokens=step.tokens, metrics={Metric.FIRST_CALL_S: first_s},
                  details=details)
    del step, got
    free_memory()


# ---- the two-GPU step itself --------------------------------------------------------------------

TWO = G.two_gpus
RUN_STARTED = time.monotonic()  # the module's import: the run's start, pytest's own start-up aside
BACKEND = "nccl" if profile_name() == "full" else "gloo"


@pytest.fixture(scope="module")
def workers():
    w = Workers(TWO.budget_s, TWO.timeout_s, StepRankState)
    yield w
    w.close()


@pytest.mark.parametrize("cand", TWO.candidates, ids=[c.id for c in TWO.candidates])
def test_leaderboard_2026_two_gpus(bench, peaks, workers, cand):
    """The whole step on TWO.world_size ranks (one process a GPU, NCCL; smoke: gloo on the CPU):
    DDP with summed gradients and sharded optimizer states (impl.workloads.leaderboard_2026). The
    first call from an empty cache is timed apart; then triton.testing.do_bench as the handout
    times it (its median; the slowest rank's) and the harness's rounds (the slowest rank's clock);
    then one profiled step on rank 0 (details["breakdown"]: kernel time per phase and category).
    Peak memory per rank over everything."""
    ws = TWO.world_size
    spec = StepSpec(config=TWO.config, num_layers=TWO.num_layers, batch=TWO.batch, context=TWO.context,
                    checkpointing=cand.checkpointing, checkpoint_k=cand.k, attn_impl=cand.attn_impl or TWO.attn_impl,
                    compile=cand.compile, allocator=cand.allocator, grad_sync=cand.grad_sync,
                    nccl_high_priority=cand.nccl_high_priority, nccl_max_ctas=cand.nccl_max_ctas,
                    residual=cand.residual,
                    lm_head_softmax=cand.lm_head_softmax,
                    **({} if cand.lm_head_chunk_mib is None else {"lm_head_chunk_mib": cand.lm_head_chunk_mib}))
    row_config = dict(config=spec.config, layers=spec.model.num_layers, batch=spec.batch, context=spec.context,
                      checkpointing=cand.checkpointing, k=cand.k, compile=cand.compile, attn_impl=spec.attn_impl,
                      allocator=cand.allocator, grad_sync=cand.grad_sync, nccl_high_priority=spec.nccl_high_priority,
                      nccl_max_ctas=spec.nccl_max_ctas,
                      world_size=ws,
                      backend=BACKEND,
                      parallelism="ddp+sharded_optimizer", dtype="bf16", weights=spec.train_config(ws).weights,
                      loss="sum",
                      # only where it is not the default, so earlier rows keep matching their configs
                      **({"residual": spec.residual} if spec.residual != "fp32" else {}),
                      **({"lm_head_chunk_mib": spec.lm_head_chunk_mib} if cand.lm_head_chunk_mib is not None else {}),
                      **({"lm_head_softmax": spec.lm_head_softmax} if spec.lm_head_softmax != "torch" else {}))
    details = dict(params=spec.model.params)
    if workers.skip(bench, problem=PROBLEM, config=row_config, world_size=ws, backend=BACKEND):
        return
    refusal = spec.nccl_refusal(BACKEND)
    if refusal is not None:  # rank_setup would raise the same; a row says so without starting the ranks
        bench.not_run(problem=PROBLEM, config=row_config, status=Status.UNSUPPORTED, reason=refusal, details=details)
        return
    if bench.device.type == "cuda":
        peaks()  # the session's matmul peak, measured before the ranks fill the GPUs
    group = workers.get(ws, BACKEND)

    def set_up():
        return group.call(rank_setup, spec=spec), group.call(rank_first_step)
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=row_config, details=details)
    if got is None:
        return
    init, first = got
    first_s = max(r.seconds for r in first)
    # the handout's "from an empty cache" holds only where the on-disk caches were empty at the first call
    details["first_call_caches"] = asdict(first[0].caches)
    row, _ = measure_on_ranks(bench, group, rank_step, problem=PROBLEM, config=row_config,
                              round=f"one training step (zero_grad, forward, summed cross-entropy, backward, AdamW "
                                    f"step) on each of {ws} ranks (slowest rank's time)",
                              warmup=TWO.warmup, rounds=TWO.rounds, flops=spec.flops(ws),
                              tokens=spec.batch * spec.context, metrics={Metric.FIRST_CALL_S: first_s},
                              details=details)
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    # do_bench calls the step as often as its estimate says; the ranks must agree, which they do
    # when one step outlasts its warm-up and rep (one call of each on every rank).
    step_ms = bench.benchmark.stats.stats.min * 1e3
    if bench.device.type == "cuda" and step_ms > 2 * max(TWO.do_bench_warmup_ms, TWO.do_bench_rep_ms):
        row.metrics[Metric.DO_BENCH_MS] = 1e3 * max(group.call(rank_do_bench, warmup_ms=TWO.do_bench_warmup_ms,
                                                               rep_ms=TWO.do_bench_rep_ms))
        row.details["do_bench"] = dict(warmup_ms=TWO.do_bench_warmup_ms, rep_ms=TWO.do_bench_rep_ms,
                                       return_mode="median", ranks="slowest")
    else:
        row.details["do_bench"] = dict(skipped="needs CUDA and a step longer than twice do_bench's warm-up and "
                                               "rep (else its call counts could differ between ranks)")
    row.details["breakdown"] = group.call(rank_breakdown, step_s=bench.benchmark.stats.stats.median)[0]
    mem = group.call(rank_peak)
    group.call(rank_teardown)
    row.memory = Memory(peak_allocated=max((m.peak for m in mem if m.peak is not None), default=None))
    # the handout's 10-minute limit is on the whole run: for the first candidate of a run this is it
    row.details["run_wall_s"] = time.monotonic() - RUN_STARTED
    row.details.update(ranks=[dict(init_allocated=i.allocated, peak=m.peak) for i, m in zip(init, mem)],
                       peaks_device=asdict(peaks()) if bench.device.type == "cuda" else None)
    bench.save(row)
