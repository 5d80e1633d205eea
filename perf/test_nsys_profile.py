"""1.1 nsys_profile (a)-(e): per size × context, the Python timer's forward (the benchmark row) and a
torch.profiler run of annotated training steps whose kernel tables per phase answer the questions
(details["nsys"]). One config also writes its Chrome trace, gzipped, as an artifact.

Cost per config, kept small so the full grid (5 sizes × 4 contexts) fits one GPU command: the timer
(one probe call, `timer_warmup` - 1 more warm-up calls, at least `timer_rounds` timed), then `prof_warmup`
unrecorded and `prof_steps` recorded steps, whose raw kineto events are read in one pass
(impl.workloads.kernels.phase_profile_from_kineto; torch's own FunctionEvent parsing took 5-15 s a
config).

Out of memory is a result, not a lost row: the model build is caught (an OOM row); the timer falls
back to the forward without autograd where the training forward does not fit; the profile falls
back from the training step to forward+backward (no optimizer step), then the training forward,
then the forward without autograd, and records which one it got (nsys.profiled) and why.

The 2026 edition's rows (test_nsys_profile_2026) profile two sizes of its own table at three
power-of-two contexts above 128, the largest the longest that fits, chosen from the closed-form
memory need at collection (sweeps "nsys_profile_2026", impl.workloads.steps.chosen_2026_cases); (b)'s calls per forward is
nsys.top_forward.calls_per_pass."""
import os
from pathlib import Path

import pytest
import torch

from impl.bench.harness import Budget
from impl.bench.timers import time_once
from impl.workloads.kernels import (first_level_that_fits, forward_loss, nsys_answers, oom_vs_closed_form, profile_steps,
                                    timer_forward_loss)
from impl.bench.row import Status
from impl.workloads.problems import Problem
from impl.workloads.steps import (ModelCache, chosen_2026_cases, device_memory_bytes, fallback_2026_cases, memory_need,
                                  model_and_batch)
from impl.runtime import default_device, first_line, free_memory, is_oom, profile_name
from impl.workloads.sweeps import grid
from impl.model import SizeRef

PROFILE = profile_name()
G = grid("nsys_profile", PROFILE)
MODELS = ModelCache()
BUDGET = Budget(G.budget_s)  # rows past it are recorded as left out, so the file ends in time
ARTIFACTS = Path(os.environ.get("SUITE_ARTIFACTS_DIR", "out/artifacts"))


def _timer_forward(model, x, y, dtype):
    """(forward fn, grad): the training forward if one call of it fits, else the forward without
    autograd. The probe call is the timer's first warm-up call."""

    def train_forward():  # the loss detached: a round must not keep its graph alive into the next (issue 45)
        return timer_forward_loss(model, x, y, dtype)

    failure = None
    try:
        time_once(train_forward, x.device)
        return train_forward, True, None
    except Exception as exc:  # noqa: BLE001
        if not is_oom(exc):
            raise
        failure = first_line(exc)
    free_memory()  # outside the except block: the traceback's frames (and tensors) are gone

    def forward_no_grad():
        with torch.no_grad():
            return forward_loss(model, x, y, dtype)
    return forward_no_grad, False, failure


def _profile(model, x, y, trace_path, start: str, g: dict):
    """(profile, parse_s), the level profiled (kernels.PROFILED) and the OOM messages of the levels
    that did not fit; (None, None, messages) when none did."""
    kw = dict(dtype=g.dtype, warmup=g.prof_warmup, steps=g.prof_steps, trace_path=trace_path)
    return first_level_that_fits(lambda upto: profile_steps(model, x, y, upto=upto, **kw), start,
                                 lambda: model.zero_grad(set_to_none=True))


G26 = grid("nsys_profile_2026", PROFILE)
DEVICE_BYTES = device_memory_bytes(default_device())
CASES_2026 = chosen_2026_cases(G26, DEVICE_BYTES)
BUDGET_2026 = Budget(G26.budget_s)
# per size, the chosen contexts whose row ran out of memory in this run; a size with one gets its
# fallback context (fallback_2026_cases: the power of two below its shortest, if still >= min_context)
OOM_2026: dict[str, list[int]] = {}
FALLBACK_2026 = fallback_2026_cases(G26, CASES_2026)


def _profile_row(bench, g: dict, budget: Budget, ref: SizeRef, context: int, context_length: int, config: dict,
                 trace: Path | None, details: dict | None = None) -> Status:
    """One row: the Python timer's forward (the benchmark) and the profiled steps' answers; its status
    (OOM where the model, its batch or the timer's forward did not fit)."""
    batch, dtype = g.batch, g.dtype
    shape = ref.config
    if budget.exhausted():
        bench.not_run(problem=Problem.NSYS_PROFILE, config=config, status=Status.LEFT_OUT_BY_BUDGET,
                      reason=budget.reason(), details=details)
        return Status.LEFT_OUT_BY_BUDGET
    got = model_and_batch(bench, MODELS, problem=Problem.NSYS_PROFILE, config=config, size=ref,
                          context_length=context_length, batch=batch, context=context, details=details)
    if got is None:
        return Status.OOM
    model, x, y = got
    # (a) the Python timer on the same forward the profile's "forward" range holds
    fn, grad, timer_oom = _timer_forward(model, x, y, dtype)
    row = bench.measure(problem=Problem.NSYS_PROFILE, config=config, fn=fn, warmup=max(1, g.timer_warmup - 1),
                        rounds=g.timer_rounds,
                        round="one training forward with the loss" if grad else "one forward with the loss, no grad",
                        details=dict(details or {}, timer_forward="training" if grad else "no_grad",
                                     timer_oom_message=timer_oom))
    if row.status is not Status.MEASURED:
        return row.status
    if trace is not None:
        trace.parent.mkdir(parents=True, exist_ok=True)
    try:
        got, profiled, failures = _profile(model, x, y, trace, "train_step" if grad else "forward_no_grad", g)
    finally:
        model.zero_grad(set_to_none=True)
        free_memory()
    if got is None:
        row.details.update(nsys=None, profile_oom="; ".join(failures))
        bench.save(row)
        return row.status
    prof, parse_s = got
    answers = nsys_answers(prof, batch=batch, heads=shape.num_heads, seq=context, head_dim=shape.head_dim,
                           layers=shape.num_layers, top=g.top)
    answers.update(profiled=profiled, train_oom=profiled != "train_step", train_oom_message="; ".join(failures) or None,
                   parse_s=parse_s, parse="kineto", warmup_steps=g.prof_warmup)
    row.details["nsys"] = answers
    if trace is not None and trace.exists():
        mb = trace.stat().st_size / 2**20
        if mb <= g.trace_max_mb:
            row.details["artifact"] = trace.name
        else:  # the device returns files of at most 16 MB; never leave one that cannot come back
            trace.unlink()
            row.details["artifact_skipped"] = f"{trace.name}: {mb:.1f} MB > {g.trace_max_mb} MB"
    bench.save(row)

    # The tables must account for what ran: forward kernels exist and the top row is the largest.
    fwd = answers["tables"]["forward"]
    assert fwd and fwd[0]["time_us"] >= fwd[-1]["time_us"]
    assert 0.0 <= answers["matmul_share_forward"] <= 1.0
    return row.status


@pytest.mark.parametrize("size,context", [(s, c) for s in G.sizes for c in G.contexts])
def test_nsys_profile(bench, size, context):
    ref = SizeRef("2025", size)
    config = dict(**ref.row_config(), context=context, dtype=G.dtype, batch=G.batch, mode="forward")
    trace = ARTIFACTS / f"nsys_profile_{size}_ctx{context}.trace.json.gz" if (size, context) == tuple(G.trace) \
        else None
    _profile_row(bench, G, BUDGET, ref, context, max(G.contexts), config, trace)


def _details_2026(ref: SizeRef, context: int, **extra) -> dict:
    need = memory_need(ref, "train_step", G26.dtype, G26.batch, context)
    return dict(cases=[list(c) for c in CASES_2026], chosen_by="the largest 2026 sizes with three powers of two "
                "whose closed-form fp32 training step fits headroom x device memory (impl.workloads.steps.fitting_contexts)",
                memory_need=need, oom_vs_closed_form=oom_vs_closed_form(need, DEVICE_BYTES), **extra)


@pytest.mark.parametrize("size,context", CASES_2026)
def test_nsys_profile_2026(bench, size, context):
    """2026: two sizes of the 2026 table at three power-of-two contexts above 128, the largest the
    longest whose training step fits (chosen by chosen_2026_cases; the choice is in the row's details).
    An OOM row carries the closed form beside it (details.oom_vs_closed_form; the measured peak at the
    OOM is the row's memory) and gives its size the fallback context below."""
    ref = SizeRef(G26.edition, size)
    config = dict(**ref.row_config(), context=context, dtype=G26.dtype, batch=G26.batch, mode="forward",
                  study="nsys_2026")
    trace = ARTIFACTS / f"nsys_profile_2026_{size}_ctx{context}.trace.json.gz" if (size, context) == CASES_2026[0] \
        else None
    status = _profile_row(bench, G26, BUDGET_2026, ref, context, max(c for s, c in CASES_2026 if s == size), config,
                          trace, _details_2026(ref, context))
    if status is Status.OOM:
        OOM_2026.setdefault(size, []).append(context)


@pytest.mark.parametrize("size,context", FALLBACK_2026)
def test_nsys_profile_2026_fallback(bench, size, context):
    """The shorter context of a size whose chosen context ran out of memory, so the size still has
    three that ran (the handout's "the largest ... the longest you can fit"); skipped, with no row,
    when every chosen context of the size ran."""
    if not OOM_2026.get(size):
        pytest.skip(f"not needed: every chosen context of {size} ran")
    ref = SizeRef(G26.edition, size)
    config = dict(**ref.row_config(), context=context, dtype=G26.dtype, batch=G26.batch, mode="forward",
                  study="nsys_2026")
    _profile_row(bench, G26, BUDGET_2026, ref, context, max(c for s, c in CASES_2026 if s == size), config, None,
                 _details_2026(ref, context, fallback_for=OOM_2026[size]))
