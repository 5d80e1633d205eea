"""Worker commands of benchmarking_script (c), 2026 edition: training steps in a fresh process.

Warm-up removes one-off costs of a process (CUDA context and allocator growth, cuBLAS handles and
heuristics, kernel loading); a process that already ran steps has paid them, so each warm-up
config runs in a new Python (a one-rank impl.bench.worker_group.WorkerGroup over gloo, spawned per
row, whose first use of the GPU is the model's build).
The parent drives it one step per command: the harness's warm-up calls and its pytest-benchmark
rounds are real steps of that process, each timed by the process's own synchronised clock
(`seconds`, read by SlowestRankClock), so the row's stats are the fresh process's step times.

A step times its phases apart (the handout's forward, backward and optimizer step), with a device
synchronisation after each; the forward is the training forward with the loss.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.bench.worker_group import Timed
from impl.workloads.dist_steps import WorkerState
from impl.workloads.steps import autocast_ctx, build_model, random_batch
from impl.model import AdamW, SizeRef, cross_entropy


@dataclass
class PhaseStep(Timed):
    """One training step; `seconds` is the whole step, the phases add up to it."""

    forward_s: float
    backward_s: float
    optimizer_s: float


PHASE_FIELDS = ("forward_s", "backward_s", "optimizer_s")


def set_up(state: WorkerState, size: SizeRef, context: int, batch: int, device: str) -> None:
    """The model, a random batch and a fresh AdamW on `device`. The worker's group is gloo (CPU), so
    nothing has touched the GPU before this build, as in a script that starts, builds and times."""
    state.device = torch.device(device)
    state.clocks.clear()  # the clocks synchronise state.device
    state.model = build_model(size, context, state.device, seed=0)
    state.model_key = (size, context)
    state.x, state.y = random_batch(state.model, batch, context, state.device)
    state.optimizer = AdamW(state.model.parameters(), lr=1e-4, weight_decay=0.01)


def phased_train_step(state: WorkerState, dtype: str) -> PhaseStep:
    clock = state.clock(kernel=False)  # synchronises the device before reading the host clock
    start = clock()
    state.optimizer.zero_grad(set_to_none=True)
    with autocast_ctx(dtype, state.device):
        loss = cross_entropy(state.model(state.x), state.y)
    forward_end = clock()
    loss.backward()
    backward_end = clock()
    state.optimizer.step()
    end = clock()
    return PhaseStep(seconds=end - start, forward_s=forward_end - start, backward_s=backward_end - forward_end,
                     optimizer_s=end - backward_end)


__all__ = ["PHASE_FIELDS", "PhaseStep", "phased_train_step", "set_up"]
