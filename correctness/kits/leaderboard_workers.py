"""Workers for correctness/test_leaderboard_2026.py's process-group test (spawn pickles a worker by
its qualified name; the child finds `kits` on the sys.path spawn copies from the parent; importing it
registers nothing)."""
from __future__ import annotations

import torch
import torch.distributed as dist

from impl.workloads.leaderboard_2026 import StepSpec, build_step, master_weights, step_group
from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive
from impl.distributed.launcher import device_for
from impl.distributed.release import released


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def sharded_step_equivalence(rank: int, world_size: int, spec: StepSpec, steps: int) -> dict:
    """`steps` steps of the data-parallel sharded step (this rank's share of spec.batch) beside the
    single-process step on the whole batch, both from the same seed. Returns the losses (the ranks'
    sum against the reference's), the relative error of each parameter's update against the
    reference's (masters where this rank keeps them, the broadcast bf16 values elsewhere), how
    the optimizer state was split, and which parameters hold a grad after the last step."""
    device = device_for(dist.get_backend(), rank)
    group = step_group(spec)  # the spec's NCCL options, as the perf rows run them
    ours = build_step(spec, device, group=group)
    ref = build_step(spec, device)
    init = master_weights(ref)
    losses = []
    for _ in range(steps):
        total = ours.step().clone()
        released(dist.all_reduce, total)
        losses.append((total.item(), ref.step().item()))
    mine, theirs = master_weights(ours), master_weights(ref)
    owned = {n for n, p in ours.model.named_parameters() if ours.optimizer.owner[id(p)] == rank}
    params = dict(ours.model.named_parameters())
    # a bf16 weight's update is below its bf16 spacing: compared through masters where this rank
    # has them; the others' bf16 values are compared with the reference's as they are
    update_err = {n: _rel(mine[n] - init[n], theirs[n] - init[n]) for n in mine
                  if n in owned or params[n].dtype != torch.bfloat16}
    bf16_equal = {n: (p == q).double().mean().item() for (n, p), q in zip(params.items(), ref.model.parameters())
                  if p.dtype == torch.bfloat16}
    local_state = [p for g in ours.optimizer.local_optimizer.param_groups for p in g["params"]
                   if ours.optimizer.local_optimizer.state.get(p)]
    with_grad = sorted(n for n, p in params.items() if p.grad is not None)  # after the last step
    if group is not dist.group.WORLD:
        dist.destroy_process_group(group)  # collective on NCCL: every rank, before the launcher's teardown
    return dict(losses=losses, update_err=update_err, owned=sorted(owned), bf16_equal=bf16_equal, with_grad=with_grad,
                local_state=len(local_state), params=len(list(ours.model.parameters())),
                tokens=ours.tokens, ref_tokens=ref.tokens, sum_gradients=_ddp_sums(rank, world_size, device),
                own_group=group is not dist.group.WORLD)


def _ddp_sums(rank: int, world_size: int, device: torch.device) -> dict[str, float]:
    """Every DDP variant with average=False: the synchronised gradient of a summed loss over this
    rank's rows equals the gradient of the sum over every rank's rows (max abs difference)."""
    out = {}
    for name, wrap in (("naive", DDPNaive), ("flat", DDPFlat), ("individual", DDPIndividualParameters),
                       ("bucketed", lambda m, **kw: DDPBucketed(m, 1, **kw))):
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3).to(device)
        x = torch.randn(4 * world_size, 5).to(device)
        ref = torch.autograd.grad(model(x).square().sum(), model.weight)[0]
        ddp = wrap(model, average=False)
        model(x[4 * rank:4 * (rank + 1)]).square().sum().backward()
        ddp.finish_gradient_synchronization()
        out[name] = (model.weight.grad - ref).abs().max().item()
    return out


def step_on_own_group(rank: int, world_size: int, spec: StepSpec, steps: int) -> dict:
    """The step on a process group of its own (a new gloo group of every rank, as step_group makes an NCCL
    one) beside the same step on the default group: each step's loss on both (bitwise equal if the group
    carries every collective: the gradient sync, the sharded optimizer's broadcasts, the agreement checks),
    and what step_group says to NCCL options on gloo."""
    device = device_for(dist.get_backend(), rank)
    own = dist.new_group(backend="gloo")
    try:
        on_own, on_world = build_step(spec, device, group=own), build_step(spec, device, group=dist.group.WORLD)
        losses = [(on_own.step().item(), on_world.step().item()) for _ in range(steps)]
        equal = all(torch.equal(p, q) for p, q in zip(on_own.model.parameters(), on_world.model.parameters()))
        del on_own, on_world
    finally:
        dist.destroy_process_group(own)
    try:
        step_group(StepSpec(**{**spec.__dict__, "nccl_high_priority": True}))
        refusal = None
    except ValueError as exc:
        refusal = str(exc)
    return dict(losses=losses, params_equal=equal, refusal=refusal,
                default_group=step_group(spec) is dist.group.WORLD)
