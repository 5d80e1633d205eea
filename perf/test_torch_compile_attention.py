"""1.3 torch_compile (a): `torch.compile(naive_attention)` on the pytorch_attention grid, forward and
backward timed the same way (impl.workloads.attention.run_attention_passes), beside eager rows of the
same cell in the same run (impl "eager"), so a cell's ratio never mixes two runs. The budget is
checked at a cell's first row only: a cut never splits a cell. The test ids start with d<head dim>,
so `-k d16` runs one head dim's cells when the grid must be split over commands.

Each (d, seq) compiles afresh (dynamo reset, static shapes): the first forward and the first
backward, which is when AOTAutograd/Inductor compile, are timed once (time_once) and recorded as
compile_forward_s / compile_backward_s in details, outside the benchmarked rounds."""
import pytest
import torch

from impl.attention import attention_flops, naive_attention
from impl.attention.memory import naive_attention_memory
from impl.workloads.attention import allocated_bytes, attention_inputs, run_attention_passes
from impl.bench.harness import Budget, set_up_or_oom
from impl.bench.timers import time_once
from impl.bench.row import Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.runtime import free_memory, profile_name

PROBLEM = Problem.TORCH_COMPILE
G = grid("torch_compile_attention", profile_name())
BUDGET = Budget(G.budget_s)
IMPLS = ("eager", "compiled")
CASES = [(d, s, m, i) for d in G.dims for s in G.seqs for i in IMPLS for m in ("forward", "backward")]
_COMPILED: dict = {}  # (d, seq) -> (compiled fn, compile times): one fresh compile per shape
_CELLS: set = set()  # (d, seq) cells begun in this run: finished even past the budget


def eager_attention(a, b, c):
    return naive_attention(a, b, c, is_causal=False)


def compiled_attention(key, q, k, v, do, device):
    """Compile for this shape; the first forward and backward calls are the compile costs."""
    if key not in _COMPILED:
        _COMPILED.clear()
        torch._dynamo.reset()
        fn = torch.compile(eager_attention, backend=G.backend, dynamic=False)
        holder = []
        fwd_s = time_once(lambda: holder.append(fn(q, k, v)), device)
        bwd_s = time_once(lambda: holder.pop().backward(do), device)
        for t in (q, k, v):
            t.grad = None
        _COMPILED[key] = (fn, dict(compile_forward_s=fwd_s, compile_backward_s=bwd_s))
    return _COMPILED[key]


@pytest.mark.parametrize("d_model,seq,mode,impl", CASES, ids=[f"d{d}-seq{s}-{m}-{i}" for d, s, m, i in CASES])
def test_torch_compile_attention(bench, d_model, seq, mode, impl):
    device = bench.device
    batch, dtype = G.batch, G.dtype
    config = dict(batch=batch, d_model=d_model, seq=seq, mode=mode, dtype=dtype, causal=False,
                  impl=impl, backend=G.backend if impl == "compiled" else None)
    details = dict(study="attention", derived_memory=naive_attention_memory(batch, seq, d_model, dtype).as_dict(),
                   eager_rows="torch_compile (impl eager, same run)")
    if (d_model, seq) not in _CELLS and BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    _CELLS.add((d_model, seq))
    free_memory()
    baseline = allocated_bytes(device)
    def set_up():
        q, k, v, do = attention_inputs((batch, seq, d_model), dtype, device)
        if impl == "eager":
            return (q, k, v, do), (eager_attention, {})
        return (q, k, v, do), compiled_attention((d_model, seq), q, k, v, do, device)
    got = set_up_or_oom(bench, set_up, problem=PROBLEM, config=config, details=details)
    if got is None:
        _COMPILED.clear()
        return
    (q, k, v, do), (fn, compile_times) = got
    del got
    details.update(compile_times)
    flops = attention_flops(batch, seq, seq, d_model, is_causal=False, mode="fwd" if mode == "forward" else "bwd")
    run_attention_passes(bench, problem=PROBLEM, config=config, attn=fn, q=q, k=k, v=v, grad_out=do, mode=mode,
                         warmup=G.warmup, rounds=G.rounds, flops=flops, baseline=baseline, details=details)
