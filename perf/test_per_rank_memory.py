"""per_rank_memory (issue 37): do the per-rank states of the 2026 distributed questions' xl
(3.4B, 2,560 wide) fit one GPU at world size 2, before any two-GPU machine is lent?

One GPU cannot hold a sharded rank's real layout (FSDP or a sharded optimizer over a world of one
shards nothing), so each variant's per-rank bytes are the closed form
(impl.accounting.memory_breakdown at its ZeRO stage, the per-rank micro-batch's activations by
impl.accounting.activation_bytes), and what one GPU can show is measured: the replicated rank of
DDP, the largest, as a full training step (impl.model.AdamW) at the per-rank batch and context.
The row records the allocator after building the model (parameters), after the timed steps
(parameters, gradients and AdamW's moments) and the step's peak, next to the closed form, and for
each variant whether its closed form fits this GPU. An OOM is the answer for this GPU (recorded
with the closed form), not a crash."""
import pytest
import torch

from impl import accounting as acc
from impl.workloads.editions import GridSize
from impl.bench.harness import set_up_or_oom
from impl.bench.row import Status
from impl.workloads.problems import StoredGroup
from impl.workloads.steps import build_model, make_step, random_batch
from impl.workloads.sweeps import grid
from impl.model import AdamW
from impl.runtime import free_memory, profile_name

PROBLEM = StoredGroup.PER_RANK_MEMORY
G = grid(PROBLEM, profile_name())


def per_rank_closed_form(size: GridSize, world_size: int, batch: int, context: int, stages: dict) -> dict:
    """Per variant: the per-rank bytes (parameters, gradients, optimizer state, activations, total)."""
    m = size.config
    activations = acc.activation_bytes(batch, context, m.d_model, m.d_ff, m.num_heads, m.num_layers, m.vocab_size)
    return {v: acc.memory_breakdown(m.params, world_size, stage, activations) for v, stage in stages.items()}


def test_per_rank_memory(bench):
    size, ws, batch, context = G.size, G.world_size, G.batch, G.context
    device = bench.device
    config = dict(size.row_config(), world_size=ws, batch_per_rank=batch, context=context, dtype="fp32",
                  variant="ddp")
    closed = per_rank_closed_form(size, ws, batch, context, G.stages)
    gpu_bytes = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    details = dict(n_params=size.config.params, stages=dict(G.stages), closed_form=closed, gpu_memory_bytes=gpu_bytes,
                   fits_this_gpu={v: c["total"] <= gpu_bytes for v, c in closed.items()} if gpu_bytes else None)

    def build():
        model = build_model(size.build_name, context, device)
        init = torch.cuda.memory_allocated(device) if device.type == "cuda" else None
        return (model, *random_batch(model, batch, context, device), init)
    got = set_up_or_oom(bench, build, problem=PROBLEM, config=config, details=details)
    if got is None:
        return
    model, x, y, init = got
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    fn, setup = make_step("train_step", model, x, y, "fp32", optimizer)
    row = bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup,
                        round="one training step of the replicated (DDP) rank on one GPU",
                        warmup=G.warmup, rounds=G.rounds, details=details)
    info = row.details
    if device.type == "cuda":
        # after the step: parameters, gradients and AdamW's two moments stay (zero_grad comes at the next step)
        info.update(init_allocated=init, after_step_allocated=torch.cuda.memory_allocated(device))
    states = sum(p.numel() * p.element_size() for p in model.parameters())
    moments = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                  if torch.is_tensor(t)) if row.status is Status.MEASURED else None
    info.update(param_bytes=states, optimizer_state_bytes=moments)
    if row.status is Status.MEASURED:
        bench.save(row)
    del fn, setup, optimizer, model, x, y, got
    free_memory()

    ddp = closed["ddp"]
    assert states == ddp["parameters"] and ddp["gradients"] == ddp["parameters"]
    assert closed["fsdp"]["total"] < closed["sharded_optimizer"]["total"] < ddp["total"]
    if row.status is Status.MEASURED:
        assert moments == ddp["optimizer_state"]  # AdamW's m and v in fp32, whole on the replicated rank
        if device.type == "cuda":
            assert info["init_allocated"] >= ddp["parameters"]
            assert info["after_step_allocated"] >= ddp["parameters"] + ddp["gradients"] + ddp["optimizer_state"]
