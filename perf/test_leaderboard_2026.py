"""leaderboard (2026) on one GPU (issue 27): the 8B training step of impl.workloads.leaderboard_2026 with
fewer layers, at one rank's share of the two-GPU batch, timed per layer count and checkpointing
policy. Each row builds a fresh model and optimizer, runs one first step timed apart (FlashAttention
autotuning, optimizer-state allocation: the first_call_s metric), then warm-up and timed steps through
the harness (step time, tokens/s, MFU, CUDA peak memory). OOM anywhere is a row with status OOM and
the sweep goes on; rows past the file's time budget are left out by budget. The two-GPU step itself
is predicted from these rows (impl.leaderboard_prediction), not run. Grid: impl.workloads.sweeps."""
import pytest

from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import time_once
from impl.workloads.leaderboard_2026 import StepSpec, build_step
from impl.bench.row import Metric, Status
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
