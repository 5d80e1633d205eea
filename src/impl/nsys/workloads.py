"""The process nsys profiles: one case of impl.nsys.cases, with its NVTX ranges (impl.annotate).

  python -m impl.nsys.workloads KIND --edition E --size S --context C --batch B [...] --result FILE

KIND is nsys_profile, memory_block, ddp, fsdp or leaderboard_2026 (the 8B step of one StepSpec). Single-GPU kinds run their warm-up inside "warm-up"
and their measured steps inside "measured" (the capture range), each step "step i"; the two-GPU
kinds run every rank's steps as "step i" (nsys records the whole process tree). The steps
themselves are the suite's: impl.workloads.kernels.annotated_train_step (forward, backward,
optimizer step; the naive attention's three ranges) and impl.workloads.dist_steps.train_step.
What ran (or the OOM that stopped it) goes to --result as JSON, for the run's manifest.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

from impl.annotate import annotate
from impl.nsys.cases import MEASURED
from impl.runtime import first_line, is_oom, synchronize

WARMUP = "warm-up"


def _steps(fn, device, warmup: int, steps: int, measured: str | None) -> None:
    """`warmup` calls in "warm-up", then `steps` calls "step i" inside `measured` (if given)."""
    for _ in range(warmup):
        with annotate(WARMUP):
            fn()
            synchronize(device)
    with annotate(measured) if measured else contextlib.nullcontext():
        for i in range(steps):
            with annotate(f"step {i}"):
                fn()
                synchronize(device)


def nsys_profile(a) -> dict:
    """The benchmarking script's step, falling back like perf/test_nsys_profile.py where it runs out
    of memory (train step, forward+backward, forward, forward without autograd)."""
    from impl.model import AdamW, SizeRef
    from impl.workloads.kernels import annotated_train_step, first_level_that_fits
    from impl.workloads.steps import build_model, random_batch

    device = torch.device(a.device)
    model = build_model(SizeRef(a.edition, a.size), a.context, device)
    x, y = random_batch(model, a.batch, a.context, device)
    opt = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    def warmup(upto):  # the warm-up finds the level that fits; the measured steps run that level only
        for _ in range(a.warmup):
            with annotate(WARMUP):
                annotated_train_step(model, x, y, a.dtype, opt, upto=upto)

    _, upto, failures = first_level_that_fits(warmup, cleanup=lambda: opt.zero_grad(set_to_none=True))
    if upto is None:
        return dict(status="oom", profiled=None, oom=failures)
    _steps(lambda: annotated_train_step(model, x, y, a.dtype, opt, upto=upto), device, 0, a.steps, MEASURED)
    return dict(status="ok", profiled=upto, oom=failures)


def memory_block(a) -> dict:
    """memory_profiling (f): forward + backward of a `layers`-block stack of the size's blocks with
    PyTorch's per-op NVTX labels (emit_nvtx) and "block k" ranges (impl.workloads.block_memory)."""
    from impl.model import SizeRef, TransformerLM, cross_entropy
    from impl.workloads.block_memory import BlockProbe
    from impl.workloads.steps import autocast_ctx, random_batch

    device = torch.device(a.device)
    torch.manual_seed(0)
    cfg = SizeRef(a.edition, a.size).config.replace(num_layers=a.layers)
    model = TransformerLM(**cfg, context_length=a.context, device=device)
    x, y = random_batch(model, a.batch, a.context, device)

    def step():
        model.zero_grad(set_to_none=True)  # as a training step leaves them: backward allocates them
        with BlockProbe(model.layers, meter=lambda: torch.cuda.memory_allocated(device)):
            with annotate("forward"), autocast_ctx(a.dtype, device):
                loss = cross_entropy(model(x), y)
            with annotate("backward"):
                loss.backward()

    try:
        # emit_nvtx needs CUDA (it synchronises on entry); the CPU check runs without the op labels
        with torch.autograd.profiler.emit_nvtx(record_shapes=False) if device.type == "cuda" else contextlib.nullcontext():
            _steps(step, device, 1, 1, MEASURED)
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        return dict(status="oom", oom=[first_line(exc)])
    return dict(status="ok", layers=a.layers, caching_allocator_off=True)


def ranked_steps(state, warmup: int, steps: int) -> float:
    """Worker command: `warmup` then `steps` training steps (dist_steps.train_step: forward,
    backward, the wrapper's wait, optimizer step) as "step i", the ranks lined up first."""
    from impl.workloads.dist_steps import train_step

    return _ranked(state, lambda: train_step(state), warmup, steps)


def leaderboard_steps(state, warmup: int, steps: int) -> float:
    """Worker command: the leaderboard step built by leaderboard_2026.rank_setup, with its forward,
    backward and optimizer step ranges, as ranked_steps runs a DDP or FSDP step."""
    return _ranked(state, lambda: state.built.step(annotated=True), warmup, steps)


def _ranked(state, step, warmup: int, steps: int) -> float:
    import torch.distributed as dist

    dist.barrier()
    _steps(step, state.device, warmup, steps, None)
    if state.device.type == "cuda":
        # The worker group kills its ranks once they report closed, before CUPTI flushes its activity buffers at
        # exit: on 2026-11-26 nsys kept the ranks' NVTX ranges but none of their kernels. cudaProfilerStop makes
        # nsys flush the CUDA trace buffers (its --flush-on-cudaprofilerstop, true by default). *Untested*.
        torch.cuda.synchronize(state.device)
        torch.cuda.profiler.stop()
    return torch.cuda.max_memory_allocated(state.device) if state.device.type == "cuda" else None


def distributed(a, setup, state=None, steps=ranked_steps, **kwargs) -> dict:
    """A worker group of `world_size` NCCL ranks: command `setup(**kwargs)` on each, then `steps`
    (ranked_steps; leaderboard_steps with the leaderboard's rank state)."""
    from impl.bench.worker_group import WorkerGroup
    from impl.workloads.dist_steps import WorkerState

    backend = "nccl" if a.device == "cuda" else "gloo"  # gloo: the CPU check of this path
    group = WorkerGroup(a.world_size, backend, state or WorkerState, command_timeout_s=300)
    try:
        try:
            group.call(setup, **kwargs)
            peaks = group.call(steps, warmup=a.warmup, steps=a.steps)
        except Exception as exc:  # noqa: BLE001 - an OOM on a rank is a result
            if not is_oom(exc):
                raise
            return dict(status="oom", oom=[first_line(exc)])
    finally:
        group.close()
    return dict(status="ok", peak_allocated=peaks)


def _args(argv: list[str]):
    p = argparse.ArgumentParser(prog="python -m impl.nsys.workloads")
    p.add_argument("kind", choices=("nsys_profile", "memory_block", "ddp", "fsdp", "leaderboard_2026"))
    for name in ("--edition", "--size", "--dtype", "--variant"):
        p.add_argument(name, default="fp32" if name == "--dtype" else None)
    # leaderboard_2026: the StepSpec's fields (impl.workloads.leaderboard_2026)
    for name in ("--config", "--checkpointing", "--compile", "--attn"):
        p.add_argument(name)
    p.add_argument("--k", type=int)
    for name in ("--context", "--batch", "--warmup", "--steps", "--layers", "--world-size"):
        p.add_argument(name, type=int, default=dict(warmup=1, steps=2, layers=3, world_size=2).get(name[2:].replace("-", "_")))
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))  # cpu: the tests' run of the same code
    p.add_argument("--result", type=Path, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = _args(sys.argv[1:] if argv is None else argv)
    if a.kind in ("ddp", "fsdp"):
        from impl.model import SizeRef
        from impl.workloads import dist_steps, fsdp_steps

        kw = dict(size=SizeRef(a.edition, a.size).build_name, context=a.context, batch=a.batch, variant=a.variant)
        result = (distributed(a, dist_steps.ddp_setup, max_context=a.context, **kw) if a.kind == "ddp"
                  else distributed(a, fsdp_steps.fsdp_setup, **kw))
    elif a.kind == "leaderboard_2026":
        from impl.workloads import leaderboard_2026 as lb

        spec = lb.StepSpec(config=a.config, batch=a.batch, context=a.context, checkpointing=a.checkpointing,
                           checkpoint_k=a.k, attn_impl=a.attn, compile=a.compile)
        result = distributed(a, lb.rank_setup, state=lb.StepRankState, steps=leaderboard_steps, spec=spec)
    else:
        result = {"nsys_profile": nsys_profile, "memory_block": memory_block}[a.kind](a)
    a.result.write_text(json.dumps(dict(result, kind=a.kind, args=vars(a) | {"result": str(a.result)})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
