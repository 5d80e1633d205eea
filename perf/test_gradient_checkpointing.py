"""gradient_checkpointing (beyond the assignment): forward+backward steps of one model under each
checkpointing policy of impl.checkpointing — none, nested (memory-optimal recursion) and every_k
at the best single-level k from impl.accounting for this shape with its neighbours — timed with
the CUDA peak the harness records (no peak counter on the CPU: None there). Then nested vs
none over depths of one width.

Every row carries its predictions: the fp32 closed form (impl.accounting.checkpoint_terms) and the
same model fed with B, R and the head's bytes measured by saved-tensor hooks at the row's dtype
(impl.checkpointing.measured_terms: one block, so it fits where the whole model does not), plus
the block forwards per step, counted with forward pre-hooks against the closed form."""
import math

import pytest
import torch

from impl import accounting as acc
from impl.checkpointing import BlockCallCounter, apply_checkpointing, measured_terms
from impl.model import Linear, SizeRef, TransformerLM, forward_flops
from impl.bench.harness import Budget
from impl.bench.row import Status
from impl.workloads.problems import Problem
from impl.workloads.steps import DTYPES, ModelCache, autocast_ctx, make_step, model_and_batch, random_batch
from impl.runtime import free_memory, is_oom, profile_name
from impl.workloads.sweeps import grid

PROBLEM = Problem.GRADIENT_CHECKPOINTING
G = grid(PROBLEM, profile_name())
D = G.depth
E26 = G.edition_2026
MODELS = ModelCache()
BUDGET = Budget(G.budget_s)
SIZE = SizeRef("2025", G.size)


def _best_k(shape, batch: int, context: int) -> int:
    """B and R of the fp32 closed form at this shape choose k (bf16 rows use the same ks)."""
    terms = acc.checkpoint_terms(batch, context, shape.d_model, shape.d_ff, shape.num_heads, shape.vocab_size)
    return acc.best_every_k(shape.num_layers, terms["a_block"], terms["a_resid"])


L = SIZE.config.num_layers
BEST_K = _best_k(SIZE.config, G.batch, G.context)
KS = acc.every_k_neighbours(BEST_K, L)
POLICIES = [("none", None), ("nested", None)] + [("every_k", k) for k in KS]
CASES = [(d, p, k) for d in G.dtypes for p, k in POLICIES]
# 2026 (b): the best block size and the next smaller and larger, then no checkpointing (last: it may
# not fit, and an OOM row should not come before the rows that do)
SIZE_2026 = SizeRef(E26.edition, E26.size)
BEST_K_2026 = _best_k(SIZE_2026.config, E26.batch, E26.context)
# ... and the textbook round(sqrt(L)) as a reference (it assumes a block saves about one boundary's bytes)
_L26 = SIZE_2026.config.num_layers
KS_2026 = sorted({k for k in (BEST_K_2026 - 1, BEST_K_2026, BEST_K_2026 + 1, round(math.sqrt(_L26))) if 1 <= k <= _L26})
POLICIES_2026 = [("every_k", k) for k in KS_2026] + [("none", None)]


def _predictions(model, policy, k, dtype, batch, seq, device) -> dict:
    """The row's predicted peaks (fp32 closed form and hook-measured terms) and recomputation."""
    s = model.model_config
    n_layers = s.num_layers
    state = sum(p.numel() * p.element_size() for p in model.parameters())
    # autocast casts each Linear weight once per forward and caches the copy until forward ends
    cast = 0 if dtype == "fp32" else sum(
        m.weight.numel() * DTYPES[dtype].itemsize
        for m in model.modules() if isinstance(m, Linear))
    closed = acc.checkpoint_terms(batch, seq, s.d_model, s.d_ff, s.num_heads, s.vocab_size)
    hooked = measured_terms(model, batch, seq, autocast_ctx(dtype, device))
    free_memory()
    pred = {}
    for name, t, cache in (("closed_form_fp32", closed, 0), ("hook_terms", hooked, cast)):
        pred[name] = acc.checkpoint_step_peak_bytes(policy, n_layers, t["a_block"], t["a_resid"], t["a_outside"],
                                                    state, state, cache, k)
        pred[name]["activations"] = acc.checkpoint_peak_activation_bytes(policy, n_layers, t["a_block"],
                                                                         t["a_resid"], k)
    # forward FLOPs are linear in the depth: one block is the step from 1 to 2 blocks
    block_flops = forward_flops(**s.replace(num_layers=2), batch=batch, seq=seq) - forward_flops(
        **s.replace(num_layers=1), batch=batch, seq=seq)
    return dict(predicted=pred, terms=dict(closed_form_fp32=closed, hook_terms=hooked), state_bytes=state,
                cast_cache_bytes=cast, predicted_block_forwards=acc.checkpoint_block_forwards(policy, n_layers, k),
                recompute_flops=acc.checkpoint_recompute_flops(policy, n_layers, block_flops, k))


def _time_policy(bench, model, x, y, *, config, policy, k, dtype, warmup, rounds, details):
    batch, seq = x.shape
    details = {**details, **_predictions(model, policy, k, dtype, batch, seq, bench.device)}
    apply_checkpointing(model, policy, k)
    counter = BlockCallCounter(model)
    step, _ = make_step("forward_backward", model, x, y, dtype)
    steps = [0]

    def fn():
        steps[0] += 1
        step()

    try:
        row = bench.measure(problem=PROBLEM, config=config, fn=fn, round="one forward and backward pass (gradients "
                            "set to None first)", warmup=warmup, rounds=rounds,
                            flops=model.model_config.flops("forward_backward", batch, seq),
                            tokens=batch * seq, details=details)
    finally:
        counter.remove()
        apply_checkpointing(model, "none")
        model.zero_grad(set_to_none=True)
        free_memory()
    if row.status is Status.MEASURED and steps[0]:
        per_step = counter.calls / steps[0]
        row.details["measured_block_forwards"] = per_step
        bench.save(row)
        assert per_step == details["predicted_block_forwards"]
    return row


@pytest.mark.parametrize("dtype,policy,k", CASES)
def test_gradient_checkpointing(bench, dtype, policy, k):
    batch, context = G.batch, G.context
    config = dict(**SIZE.row_config(), batch=batch, context=context, dtype=dtype, policy=policy, k=k,
                  mode="forward_backward", study="policies")
    details = dict(best_k=BEST_K, ks=KS, best_k_rule=BEST_K_RULE)
    _policy_row(bench, SIZE, config, policy, k, dtype, batch, context, details)


BEST_K_RULE = "argmin of accounting.checkpoint_peak_activation_bytes over k (fp32 closed form at this shape)"


def _policy_row(bench, size: SizeRef, config, policy, k, dtype, batch, context, details) -> None:
    """One policy row on the cached model of `size` (or its budget / OOM record)."""
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason(),
                      details=details)
        return
    got = model_and_batch(bench, MODELS, problem=PROBLEM, config=config, size=size, context_length=context,
                          batch=batch, context=context, details=details)
    if got is None:
        return
    model, x, y = got
    _time_policy(bench, model, x, y, config=config, policy=policy, k=k, dtype=dtype, warmup=G.warmup,
                 rounds=G.rounds, details=details)


@pytest.mark.parametrize("policy,k", POLICIES_2026)
def test_gradient_checkpointing_2026(bench, policy, k):
    """2026 (b): xl (2026), batch 4 × 2048, single-level checkpointing of k blocks a segment at the
    best k of the closed form and its neighbours, and no checkpointing: the measured peaks (row
    memory) beside the predicted ones (details), and the step time."""
    batch, context, dtype = E26.batch, E26.context, E26.dtype
    config = dict(**SIZE_2026.row_config(), batch=batch, context=context, dtype=dtype, policy=policy, k=k,
                  mode="forward_backward", study="single_level_2026")
    details = dict(best_k=BEST_K_2026, ks=KS_2026, best_k_rule=BEST_K_RULE,
                   predicted_activation_bytes_by_k=_activation_by_k(SIZE_2026.config, batch, context))
    _policy_row(bench, SIZE_2026, config, policy, k, dtype, batch, context, details)
    if (policy, k) == POLICIES_2026[-1]:
        MODELS.clear()


def _activation_by_k(shape, batch: int, context: int) -> dict[str, float]:
    """The closed form's block-stack peak for every k (the curve the best k minimises)."""
    t = acc.checkpoint_terms(batch, context, shape.d_model, shape.d_ff, shape.num_heads, shape.vocab_size)
    return {str(k): acc.checkpoint_peak_activation_bytes("every_k", shape.num_layers, t["a_block"], t["a_resid"], k)
            for k in range(1, shape.num_layers + 1)}


DEPTH = dict(layers=None, model=None)


def _depth_model(layers, device):
    """xl width (or the smoke width) at `layers` blocks; one at a time on the device."""
    if DEPTH["layers"] != layers:
        DEPTH.update(layers=None, model=None)
        MODELS.clear()
        torch.manual_seed(0)
        shape = SizeRef("2025", D.width).config.replace(num_layers=layers)
        DEPTH.update(model=TransformerLM.from_config(shape, context_length=D.context, device=device), layers=layers)
    return DEPTH["model"]


@pytest.mark.parametrize("layers,policy", [(n, p) for n in D.layers for p in D.policies])
def test_gradient_checkpointing_depth(bench, layers, policy):
    """(a) Nested vs none as depth grows: the measured peak grows like log2(L)·R + B vs L·B."""
    config = dict(width=D.width, edition="2025", layers=layers, batch=D.batch, context=D.context, dtype=D.dtype,
                  policy=policy, k=None, mode="forward_backward", study="depth")
    if BUDGET.exhausted():
        bench.not_run(problem=PROBLEM, config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason())
        return
    message = None
    try:
        model = _depth_model(layers, bench.device)
        x, y = random_batch(model, D.batch, D.context, bench.device)
    except Exception as exc:  # noqa: BLE001 - only OOM becomes a row
        if not is_oom(exc):
            raise
        message = str(exc)
    if message is not None:  # outside the except block, whose traceback holds the tensors
        DEPTH.update(layers=None, model=None)
        bench.oom(problem=PROBLEM, config=config, exc=message)
        return
    _time_policy(bench, model, x, y, config=config, policy=policy, k=None, dtype=D.dtype, warmup=G.warmup,
                 rounds=G.rounds, details={})
    if (layers, policy) == (D.layers[-1], D.policies[-1]):
        DEPTH.update(layers=None, model=None)
        free_memory()
