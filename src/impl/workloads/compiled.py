"""torch.compile variants for torch_compile (b): the Transformer compiled whole or per block, and a
compiled AdamW update.

Regional compilation (`RegionalLM`, the suite's choice): every TransformerBlock runs through one
torch.compile'd function. The blocks share their code and, because dynamo lifts a module's
parameters to graph inputs (inline_inbuilt_nn_modules, always on in recent torch), one compiled
graph serves all blocks of a model: compile cost is that of one block, not of `num_layers` of them.
With `dynamic_seq`, the sequence dimension of the block inputs is marked dynamic before every call,
so the same graph also serves every context (one compilation per size and grad mode, instead of one
per context). The embedding, the final norm, the LM head and the loss stay eager.

`WholeLM` compiles the entire TransformerLM (one graph of all blocks unrolled), marking the
sequence dimension of the token ids dynamic likewise.

Why regional with a dynamic sequence (WHY, recorded in the benchmark JSON, gives the reason without
these one-off figures: the report prints only numbers read from data): measured on this suite's CPU
machine (2 cores, Inductor's C++ back end, caches disabled; first call of each graph
after a trivial compile has paid Inductor's one-off start-up of 10-19 s), inference / training graph:

    small (12 layers)   whole, dynamic seq  44.5 / 70.2 s  once        = 115 s for 4 contexts
                        whole, static       19.4 / 33.4 s  per context ≈ 211 s
                        regional, dynamic   12.7 / 19.4 s  once        =  32 s
                        regional, static     6.6-7.5 / 11.2-12.7 s per context ≈ 76 s
    tiny (2 layers)     whole, dynamic      13.3 / 20.0 s;  regional, dynamic 8.8 / 17.6 s

Regional compilation costs about one block however deep the model is (3.6× cheaper than the whole
model at 12 layers, more at 24-48), and marking the sequence dynamic turns four compilations per
size into one. On the H100 the whole small model took 31 s (inference) and 65 s (training) to
compile, so whole-model compilation of all five sizes could not fit one 10-minute command.

`CompiledAdamW`: impl.model.AdamW's update (same math, same state) with the per-parameter
arithmetic in one torch.compile'd function with dynamic sizes, called once per parameter: Inductor
fuses weight decay, both moments and the update into one kernel per parameter, and two
compilations (1-D and 2-D parameters) serve every parameter of every size. (Compiling the whole
step over the parameter list unrolls it into one graph of all parameters: 71.6 s for the small
model's 111 tensors on the CPU, against 7.6 s for the per-parameter function.)
"""
from __future__ import annotations

import math
import types

import torch
from torch import nn

from impl.bench.row import Status
from impl.model import AdamW
from impl.model.transformer import TransformerBlock, TransformerLM

STRATEGIES = ("regional", "whole")
WHY = ("Regional, not whole-model, compilation with a dynamic sequence dimension: regional compilation costs "
       "about one block however deep the model is, and a dynamic sequence compiles one graph per size and grad mode "
       "instead of one per context (the graphs this run compiled and their compile times are in the compilation "
       "table); whole-model compilation of every size would not fit one GPU command.")


def record_compile_s(bench, row, first_s: float) -> None:
    """details["compile_s"] of a measured row whose first call compiled: that call minus the row's
    timed median (the first call ran one step too), never negative. Needs the row's stats, so it
    is a no-op for rows that were not timed (OOM, --benchmark-disable)."""
    stats = bench.benchmark.stats
    if row.status is not Status.MEASURED or bench.benchmark.disabled or stats is None:
        return
    row.details["compile_s"] = max(0.0, first_s - stats.stats.median)
    bench.save(row)


def _block_forward(block: TransformerBlock, x: torch.Tensor, rope, positions: torch.Tensor) -> torch.Tensor:
    return TransformerBlock.forward(block, x, rope, positions)


def mark_seq_dynamic(x: torch.Tensor, positions: torch.Tensor, strict: bool = True) -> None:
    """Marks the sequence dimension of a block's inputs dynamic. strict: torch._dynamo.mark_dynamic
    (compiling code that specializes the length is an error); otherwise maybe_mark_dynamic (such
    code just compiles again for the next length)."""
    mark = torch._dynamo.mark_dynamic if strict else torch._dynamo.maybe_mark_dynamic
    mark(x, 1)
    mark(positions, 0)


def compile_blocks_in_place(lm: TransformerLM, *, backend: str = "inductor") -> None:
    """RegionalLM's compilation inside `lm` itself (its forward, hence return_hidden, unchanged):
    every block's forward becomes one compiled function shared by all blocks (and all models:
    the cache is on the function's code), the sequence dimension marked dynamic at each call.
    Non-strict: an attention that specializes the length (flash_torch's Python tile loops)
    recompiles per length instead of failing; flash_triton's kernels are custom ops (no graph
    break, one graph for every length)."""
    block_fn = torch.compile(_block_forward, backend=backend)

    def forward(block, x, rope, positions):
        mark_seq_dynamic(x, positions, strict=False)
        return block_fn(block, x, rope, positions)

    for block in lm.layers:
        block.forward = types.MethodType(forward, block)


def raise_recompile_limit(n: int = 64) -> None:
    """Lets one compiled function hold `n` graphs (sizes, grad modes, configs): past dynamo's
    default limit (8) later calls would fall back to eager silently."""
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), n))


def unique_graphs() -> int:
    """Graphs dynamo has compiled in this process (since the last torch._dynamo.reset())."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def graph_breaks() -> int:
    return sum(torch._dynamo.utils.counters["graph_break"].values())


class RegionalLM(nn.Module):
    """`lm`'s forward with each block through one compiled function (see module doc). Shares
    `lm`'s parameters; `lm` itself is left eager."""

    def __init__(self, lm: TransformerLM, *, backend: str = "inductor", dynamic_seq: bool = True):
        super().__init__()
        self.lm, self.dynamic_seq = lm, dynamic_seq
        self.block_fn = torch.compile(_block_forward, backend=backend, dynamic=None if dynamic_seq else False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        # TransformerLM.forward, with the blocks compiled
        lm = self.lm
        lm._check_input(token_ids)
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = lm.token_embeddings(token_ids)
        for block in lm.layers:
            if self.dynamic_seq:
                mark_seq_dynamic(x, positions)
            x = self.block_fn(block, x, lm.rope, positions)
        return lm.lm_head(lm.ln_final(x))


class WholeLM(nn.Module):
    """torch.compile of the whole model; with `dynamic_seq` the token ids' sequence dimension is
    marked dynamic before every call."""

    def __init__(self, lm: TransformerLM, *, backend: str = "inductor", dynamic_seq: bool = True):
        super().__init__()
        self.lm, self.dynamic_seq = lm, dynamic_seq
        self.compiled = torch.compile(lm, backend=backend, dynamic=None if dynamic_seq else False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.dynamic_seq:
            torch._dynamo.mark_dynamic(token_ids, 1)
        return self.compiled(token_ids)


def compile_model(lm: TransformerLM, strategy: str, *, backend: str = "inductor", dynamic_seq: bool = True) -> nn.Module:
    if strategy == "regional":
        return RegionalLM(lm, backend=backend, dynamic_seq=dynamic_seq)
    if strategy == "whole":
        return WholeLM(lm, backend=backend, dynamic_seq=dynamic_seq)
    raise ValueError(f"compile strategy must be one of {STRATEGIES}, got {strategy!r}")


def describe(strategy: str, dynamic_seq: bool, backend: str) -> str:
    what = ("each Transformer block through one compiled function (regional; embedding, final norm, "
            "LM head and loss eager)" if strategy == "regional" else "the whole model")
    shapes = ("sequence dimension dynamic: one compilation per size and grad mode serves every context"
              if dynamic_seq else "static shapes: one compilation per context")
    return f"{what}; {shapes}; backend {backend}"


def _adamw_param_update(p, g, m, v, scalars, lr_wd: float, beta1: float, beta2: float, eps: float):
    """AdamW for one parameter; scalars = [lr / bias1, sqrt(bias2)] as a device tensor,
    so the step count never becomes a compile-time constant. Called under no_grad (step())."""
    p.mul_(1 - lr_wd)
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    p.sub_(scalars[0] * (m / (v.sqrt() / scalars[1] + eps)))


class CompiledAdamW(AdamW):
    """impl.model.AdamW with the update compiled (see module doc); state and results are those of
    AdamW (checked in correctness/test_profiling.py)."""

    def __init__(self, params, *, backend: str = "inductor", **kw):
        super().__init__(params, **kw)
        self._update = torch.compile(_adamw_param_update, backend=backend, dynamic=True)

    def _step_group(self, group: dict) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        scalars = {}  # (step, device) -> tensor
        for p in group["params"]:
            if p.grad is None:
                continue
            state = self._advance(p)
            key = (state["step"], p.device)
            if key not in scalars:
                step = state["step"]
                scalars[key] = torch.tensor([lr / (1 - beta1 ** step), math.sqrt(1 - beta2 ** step)],
                                            dtype=torch.float32, device=p.device)
            self._update(p.detach().view(-1), p.grad.view(-1), state["exp_avg"].view(-1), state["exp_avg_sq"].view(-1),
                         scalars[key], lr * wd, beta1, beta2, eps)


__all__ = ["STRATEGIES", "WHY", "CompiledAdamW", "RegionalLM", "WholeLM", "compile_blocks_in_place", "compile_model",
           "compile_model_case_id", "compile_model_cases", "describe", "graph_breaks", "implied_by_oom",
           "mark_seq_dynamic", "raise_recompile_limit", "unique_graphs"]


# ---- torch_compile (b)'s sweep: its cases, and the rows an earlier OOM already answers ----------------

OPTIMIZER_STEP = "optimizer_step"
# What a step of each mode keeps alive grows in this order at one context (impl.workloads.steps
# STEP_MODE_STATE): the forward holds the parameters, forward+backward adds gradients and saved
# activations, the timed training step adds AdamW's moments on top.
_MODE_RANK = {"forward": 0, "forward_backward": 1, "train_step": 2}


def compile_model_cases(sizes, contexts, modes) -> list[tuple]:
    """torch_compile (b)'s (size, context, mode, impl) rows in run order: sizes as given (SizeRef),
    per size the optimizer step first (context None), then contexts ascending, `modes` in the
    given order, eager before compiled. A budget cut falls on the largest size's longest context."""
    cases = []
    for size in sizes:
        cases += [(size, None, OPTIMIZER_STEP, impl) for impl in ("eager", "compiled")]
        cases += [(size, c, str(m), impl) for c in sorted(contexts) for m in modes for impl in ("eager", "compiled")]
    return cases


def compile_model_case_id(size, context, mode, impl) -> str:
    """Test ids: the 2025 sizes as before ("small-128-forward-eager"), others with their edition
    ("2026-10B-128-train_step-compiled"), so `-k 2026` selects the 2026-only sizes."""
    name = size.name if size.edition == "2025" else size.id
    return f"{name}-{context}-{mode}-{impl}"


def not_run_reason(ooms: dict, budget, size_key, context: int | None, mode: str,
                   impl: str) -> tuple[Status, str] | None:
    """(status, reason) of a row that is not to run, or None: an OOM that already answers it first (the truer
    reason, and it costs nothing), then the perf file's exhausted `budget` (impl.bench.harness.Budget)."""
    if reason := implied_by_oom(ooms, size_key, context, mode, impl):
        return Status.LEFT_OUT, reason
    if budget.exhausted():
        return Status.LEFT_OUT_BY_BUDGET, budget.reason()
    return None


def implied_by_oom(ooms: dict, size_key, context: int | None, mode: str, impl: str) -> str | None:
    """Why this row cannot fit, from an OOM this run already hit, or None. `ooms`: {(size_key,
    impl): [(mode, context), ...]} of the rows that ran out of memory. A row is answered when the same
    size and impl ran out of memory at a mode that keeps no more alive (forward < forward+backward <
    training step) and a context no longer than this one; an optimizer-step OOM (parameters,
    gradients and AdamW's moments alone) answers every training step of that size."""
    if mode == OPTIMIZER_STEP or mode not in _MODE_RANK:
        return None
    for m, c in ooms.get((size_key, impl), ()):
        if m == OPTIMIZER_STEP and mode == "train_step":
            return (f"not run: this size's {impl} optimizer step (parameters, gradients and AdamW state, no "
                    "activations) already ran out of memory; a training step holds all of that and more")
        if m in _MODE_RANK and _MODE_RANK[m] <= _MODE_RANK[mode] and c is not None and c <= context:
            return (f"not run: {m} {impl} ran out of memory at context {c}; this {mode} at context {context} "
                    "keeps at least as much alive")
    return None
