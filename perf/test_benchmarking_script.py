"""1.1 benchmarking_script: forward, backward alone, forward+backward and a full AdamW training
step for every model size × context, fp32 and bf16 autocast (the timings that
benchmarking_mixed_precision (c) reads), and the warm-up study of (c).

The 2026 edition's rows (its own size table: xl = the 2025 table's 2.7B, and a 10B) answer (b) with
forward, backward and optimizer step timed apart (mean ± std: pytest-benchmark's mean and stddev over
10 rounds of one step), mixed precision (c) with the bf16 forward and backward beside them, and (c)
with each warm-up config in a fresh process (impl.workloads.fresh_steps). Every row records its size's
edition and dimensions (SizeRef.row_config)."""
import pytest

from impl.workloads.dist_steps import WorkerState
from impl.workloads.fresh_steps import PHASE_FIELDS, phased_train_step, set_up
from impl.workloads.problems import Problem
from impl.workloads.steps import ModelCache, build_model, make_step, memory_need, model_and_batch, random_batch
from impl.workloads.sweeps import grid
from impl.bench.worker_group import WorkerGroup, measure_on_ranks
from impl.model import SizeRef
from impl.runtime import first_line, free_memory, is_oom, profile_name

PROBLEM = Problem.BENCHMARKING_SCRIPT
PROFILE = profile_name()
MAIN = grid("benchmarking_script", PROFILE)
WARMUP = grid("benchmarking_script_warmup", PROFILE)
MAIN_2026 = grid("benchmarking_script_2026", PROFILE)
WARMUP_2026 = grid("benchmarking_script_2026_warmup", PROFILE)
MODELS = ModelCache()
ROUND = {"forward": "one forward pass (no grad)", "backward": "one backward pass (forward in setup)",
         "forward_backward": "one forward and backward pass",
         "optimizer_step": "one AdamW step (forward and backward in setup)", "train_step": "one training step with AdamW"}


# The fresh-process study comes first in the file, before this process holds any model.
@pytest.mark.parametrize("size,warmup", [(s, w) for s in WARMUP_2026.sizes for w in WARMUP_2026.warmups])
def test_benchmarking_script_2026_warmup(bench, size, warmup):
    """(c), 2026: `warmup` training steps, then `rounds` timed ones, in a process started for this
    row; the row's stats are those timed steps (the fresh process's own clock), its details each
    step's phases. A config that does not fit is an OOM row with its closed-form need."""
    G = WARMUP_2026
    ref = SizeRef(G.edition, size)
    batch, context, dtype = G.batch, G.context, G.dtype
    config = dict(**ref.row_config(), context=context, dtype=dtype, mode="train_step", batch=batch, warmup=warmup,
                  study="warmup_fresh_process")
    details = dict(left_out=G.left_out, memory_need=memory_need(ref, "train_step", dtype, batch, context))
    MODELS.clear()
    group = WorkerGroup(1, "gloo", WorkerState, start_timeout_s=G.start_timeout_s, command_timeout_s=G.step_timeout_s)
    try:
        try:
            group.call(set_up, size=ref, context=context, batch=batch, device=str(bench.device))
        except Exception as exc:  # noqa: BLE001 - only OOM becomes a row
            if not is_oom(exc):
                raise
            bench.oom(problem=PROBLEM, config=config, exc=first_line(exc), details=details)
            return
        row, timed = measure_on_ranks(bench, group, phased_train_step, problem=PROBLEM, config=config,
                                      round="one training step of a fresh process (forward, backward and AdamW "
                                      "step, each synchronised)", warmup=warmup, rounds=G.rounds,
                                      tokens=batch * context, details=details, dtype=dtype)
    finally:
        group.close()
    if not timed:
        return
    steps = [replies[0] for replies in timed]
    row.details["steps"] = {f: [getattr(s, f) for s in steps] for f in PHASE_FIELDS}
    bench.save(row)
    # one fresh-process step a round: the details' steps are the benchmark's rounds, the handout's 10
    # (where pytest-benchmark is off, --benchmark-disable or under xdist, every call is one untimed
    # round, warm-up included: nothing to check)
    if not bench.benchmark.disabled:
        assert len(steps) == row.timing.rounds == G.rounds and row.timing.iterations == 1


@pytest.mark.parametrize("size,dtype,mode", [(s, d, m) for s in MAIN_2026.sizes
                                             for d, modes in MAIN_2026.modes.items() for m in modes])
def test_benchmarking_script_2026(bench, size, dtype, mode):
    """(b), 2026, and benchmarking_mixed_precision (c), 2026: one step a round, mean ± std from
    pytest-benchmark's stats; the closed-form memory need beside the measured peak, or the OOM."""
    G = MAIN_2026
    ref = SizeRef(G.edition, size)
    batch, context = G.batch, G.context
    config = dict(**ref.row_config(), context=context, dtype=dtype, mode=mode, batch=batch, study="main_2026")
    details = dict(memory_need=memory_need(ref, mode, dtype, batch, context))
    got = model_and_batch(bench, MODELS, problem=PROBLEM, config=config, size=ref, context_length=context,
                          batch=batch, context=context, details=details)
    if got is None:
        return
    model, x, y = got
    fn, setup = make_step(mode, model, x, y, dtype)
    row = bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=G.warmup,
                        rounds=G.rounds, flops=ref.config.flops(mode, batch, context), tokens=batch * context,
                        details=details)
    model.zero_grad(set_to_none=True)
    free_memory()
    if row.timing is not None:  # one step a round: the stats' mean and stddev are the handout's
        assert (row.timing.rounds, row.timing.iterations) == (G.rounds, 1)


# The warm-up study comes first among the 2025 rows so its first row also sees a cold process.
@pytest.mark.parametrize("size,context,dtype,mode,warmup", [
    (s, c, d, m, w) for s in WARMUP.sizes for c in WARMUP.contexts for d in WARMUP.dtypes
    for m in WARMUP.modes for w in WARMUP.warmups])
def test_benchmarking_script_warmup(bench, size, context, dtype, mode, warmup):
    """(c) A fresh model and an emptied allocator cache per row, so warm-up 0 pays the first-call
    costs (allocation, kernel loading, library heuristics) inside its timed steps."""
    MODELS.clear()
    batch = WARMUP.batch
    ref = SizeRef("2025", size)
    config = dict(**ref.row_config(), context=context, dtype=dtype, mode=mode, batch=batch, warmup=warmup,
                  study="warmup")
    details = dict(left_out=WARMUP.left_out)
    try:
        model = build_model(ref, context, bench.device)
    except Exception as exc:
        if not is_oom(exc):
            raise
        bench.oom(problem=PROBLEM, config=config, exc=exc, details=details)
        return
    free_memory()
    x, y = random_batch(model, batch, context, bench.device)
    fn, setup = make_step(mode, model, x, y, dtype)
    bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=warmup,
                  rounds=WARMUP.rounds, flops=ref.config.flops(mode, batch, context),
                  tokens=batch * context, details=details)


@pytest.mark.parametrize("size,context,dtype,mode", [
    (s, c, d, m) for s in MAIN.sizes for c in MAIN.contexts for d in MAIN.dtypes for m in MAIN.modes])
def test_benchmarking_script(bench, size, context, dtype, mode):
    """(b) w warm-up then n timed steps, each synchronised; bf16 rows are (c) of
    benchmarking_mixed_precision."""
    batch = MAIN.batch
    ref = SizeRef("2025", size)
    config = dict(**ref.row_config(), context=context, dtype=dtype, mode=mode, batch=batch, study="main")
    got = model_and_batch(bench, MODELS, problem=PROBLEM, config=config, size=ref,
                          context_length=max(MAIN.contexts), batch=batch, context=context)
    if got is None:
        return
    model, x, y = got
    fn, setup = make_step(mode, model, x, y, dtype)
    bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=MAIN.warmup,
                  rounds=MAIN.rounds, flops=ref.config.flops(mode, batch, context),
                  tokens=batch * context)
    model.zero_grad(set_to_none=True)
