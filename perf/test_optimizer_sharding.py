"""3 optimizer_state_sharding_accounting: each edition's xl (the grid's [edition, size] pairs; test
ids start with the edition, so `-k 2026` runs the 2026 xl = 2.7B (2025)) on 2 GPUs (smoke: tiny on
2 gloo CPU processes), AdamW, four configurations:

  none        our DDP (per-parameter overlapped all-reduce) + AdamW: no sharding
  sharded     the same DDP + ShardedOptimizer(AdamW): each parameter's state on one owner rank,
              updated parameters broadcast by their owners
  zero1       ZeRO1Optimizer(AdamW) behind DDPNaive(reduce_gradients=False): reduce-scatter of the
              raw gradients, all-gather of the updated flat shards
  torch_zero  the same DDP + torch.distributed.optim.ZeroRedundancyOptimizer(torch.optim.AdamW)

Memory per rank (CUDA allocator; None on the CPU): peak after model init (model, wrapper and
optimizer built; AdamW state is created lazily at the first step), and around the optimizer step
of the last timed step: the peak of forward+backward+gradient sync (reset at the step's start)
and the allocated bytes directly before the step; the peak during the step and the allocated
bytes directly after it (impl.workloads.dist_steps.train_step with memory=True). Breakdown, computed from the tensors on this rank at those two points:
parameters (distinct storages of the model's parameters), gradients, optimizer state (tensors in
this rank's optimizer state), buffers (storages not counted as parameters or gradients: DDP buckets, ZeRO-1's gradient shard after its step),
other = allocated − those, and activations = peak before the step − allocated before the step
(the transient of forward/backward on top of what stays). The prediction next to it is
impl.accounting.memory_breakdown (ZeRO stage 0 or 1) with activation_bytes for the activations.
Communicated bytes per step: the payload counted by our wrappers / optimizers; torch_zero's
broadcast is not instrumented, so its payload is derived (every parameter broadcast once by its
owner) and marked so. Time per step: one round is one training step on every rank; the benchmark's
timer is the slowest rank's own device-synchronised clock (impl.bench.worker_group). The memory is
read on one more step after the timed ones (the readings synchronise; the timed steps run
without them)."""
from dataclasses import asdict

import pytest

from impl import accounting as acc
from impl.workloads import dist_steps
from impl.workloads.dist_steps import ShardSetup, StepReply, StepSummary
from impl.workloads.editions import GridSize
from impl.bench.row import Memory, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.runtime import profile_name

PROBLEM = Problem.OPTIMIZER_STATE_SHARDING_ACCOUNTING
PROFILE = profile_name()
G = grid(PROBLEM, PROFILE)
WS = G.world_size
BACKEND = "nccl" if PROFILE == "full" else "gloo"
ZERO_STAGE = dict(none=0, sharded=1, zero1=1, torch_zero=1)


@pytest.fixture(scope="module")
def workers():
    w = Workers(G.budget_s, G.timeout_s, dist_steps.WorkerState)
    yield w
    w.close()


def _comm_bytes(variant: str, step: StepReply, opt_bytes: int | None, param_bytes: int) -> tuple[int, str]:
    if variant == "none":
        return step.bytes, "counted"
    if variant == "zero1":
        return opt_bytes, "counted"
    if variant == "sharded":
        return step.bytes + opt_bytes, "counted"
    return step.bytes + param_bytes, "all-reduce counted; broadcast derived (each parameter once)"


def _rank_memory(setup: ShardSetup, step: StepReply) -> dict:
    m = step.memory
    nb, na = m.named_before, m.named_after
    out = dict(init_peak=setup.init.peak, init_allocated=setup.init.allocated, named_init=asdict(setup.named_init),
               before_peak=m.before.peak, before_allocated=m.before.allocated, after_peak=m.after.peak,
               after_allocated=m.after.allocated, named_before=asdict(nb), named_after=asdict(na))
    if m.before.allocated is not None:
        out["activations"] = m.before.peak - m.before.allocated
        out["other_before"] = m.before.allocated - nb.total()
        out["other_after"] = m.after.allocated - na.total()
    return out


CASES = [(z, v) for z in G.sizes for v in G.variants]


@pytest.mark.parametrize("size,variant", CASES, ids=[f"{z.id}-{v}" for z, v in CASES])
def test_optimizer_state_sharding_accounting(bench, workers, size: GridSize, variant):
    context, batch = G.context, G.batch
    config = dict(size.row_config(), context=context, batch_per_rank=batch, world_size=WS, backend=BACKEND,
                  variant=variant, dtype="fp32")
    if workers.skip(bench, problem=PROBLEM, config=config, world_size=WS, backend=BACKEND):
        return
    group = workers.get(WS, BACKEND)
    setups = group.call(dist_steps.shard_setup, size=size.build_name, context=context, batch=batch, variant=variant)
    row, timed = measure_on_ranks(bench, group, dist_steps.step, problem=PROBLEM, config=config,
                                  round=f"one training step on each of {WS} ranks (slowest rank's time)",
                                  warmup=G.warmup, rounds=G.rounds, tokens=WS * batch * context)
    if row.status is not Status.MEASURED:
        return
    last = group.call(dist_steps.memory_step, named=True)
    opt_bytes = group.call(dist_steps.optimizer_bytes)[0]
    group.call(dist_steps.teardown)
    shape = size.config
    n = shape.params
    activations = acc.activation_bytes(batch, context, shape.d_model, shape.d_ff, shape.num_heads, shape.num_layers)
    predicted = acc.memory_breakdown(n, WS, ZERO_STAGE[variant], activations)
    comm, comm_source = _comm_bytes(variant, last[0], opt_bytes, acc.param_bytes(n))
    ranks = [_rank_memory(s, st) for s, st in zip(setups, last)]
    row.details.update(n_params=n, predicted=predicted, predicted_activations_bytes=activations, ranks=ranks,
                       owned=[dict(owned_numel=s.owned_numel, largest_numel=s.largest_numel) for s in setups],
                       comm_bytes_per_step=comm, comm_bytes_source=comm_source,
                       predicted_ring_bytes_per_rank=acc.comm_volume_per_rank(acc.param_bytes(n), WS),
                       steps=asdict(StepSummary.of(timed)))
    peaks = [st.memory.peak() for st in last if st.memory.peak() is not None]
    row.memory = Memory(peak_allocated=max(peaks, default=None))
    bench.save(row)

    # Checks of the breakdown against the closed forms: exact where the layout is exact.
    assert setups[0].n_params == n
    named = [st.memory.named_before for st in last]
    state_full = acc.adam_state_bytes(n)
    for nb in named:
        assert nb.gradients == acc.grad_bytes(n)  # no stage here shards gradients
        if variant == "zero1":  # parameters are views of one flat buffer padded to a multiple of WS
            assert acc.param_bytes(n) <= nb.parameters < acc.param_bytes(n) + 4 * WS
        else:
            assert nb.parameters == acc.param_bytes(n)
    if variant == "zero1":  # after the step: the model's grads are gone, this rank's (padded) shard is left
        for st in last:
            na = st.memory.named_after
            assert na.gradients == 0
            assert acc.grad_bytes(n) / WS <= na.buffers < acc.grad_bytes(n) / WS + 4
    states = [nb.optimizer_state for nb in named]
    if variant == "none":
        assert states == [state_full] * WS
    elif variant == "sharded":
        assert sum(states) == state_full
        for s in setups:  # greedy balance: no rank exceeds the ideal share by more than the largest tensor
            assert 8 * s.owned_numel <= state_full / WS + 8 * s.largest_numel
    elif variant == "zero1":  # equal flat shards, padded
        assert all(state_full / WS <= s < state_full / WS + 8 * WS for s in states)
    else:  # torch keeps a scalar step tensor per parameter beside m and v
        assert state_full <= sum(states) <= state_full * 1.01
    expected_comm = dict(none=acc.grad_bytes(n), sharded=acc.grad_bytes(n) + acc.param_bytes(n))
    if variant in expected_comm:
        assert comm == expected_comm[variant]
    elif variant == "zero1":  # reduce-scatter + all-gather of the padded flat buffer
        assert 2 * acc.param_bytes(n) <= comm < 2 * acc.param_bytes(n) + 8 * WS
