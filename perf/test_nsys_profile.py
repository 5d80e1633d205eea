"""1.1 nsys_profile (a)-(e): per size × context, the Python timer's forward (the benchmark row) and a
torch.profiler run of annotated training steps whose kernel tables per phase answer the questions
(details["nsys"]). One config also writes its Chrome trace, gzipped, as an artifact.

Cost per config, kept small so the full grid (5 sizes × 4 contexts) fits one GPU command: the timer
(one probe call, `timer_warmup` - 1 more warm-up calls, at least `timer_rounds` timed), then `prof_warmup`
unrecorded and `prof_steps` recorded steps, whose raw kineto events are read in one pass
(impl.bench.kernels.phase_profile_from_kineto; torch's own FunctionEvent parsing took 5-15 s a
config).

Out of memory is a result, not a lost row: the model build is caught (an OOM row); the timer falls
back to the forward without autograd where the training forward does not fit; the profile falls
back from the training step to forward+backward (no optimizer step), then the training forward,
then the forward without autograd, and records which one it got (nsys.profiled) and why."""
import os
from pathlib import Path

import pytest
import torch

from impl.bench.harness import Budget, time_once
from impl.bench.kernels import PROFILED, forward_loss, nsys_answers, profile_steps
from impl.bench.row import Status
from impl.bench.steps import ModelCache, model_and_batch
from impl.runtime import first_line, free_memory, is_oom, profile_name
from impl.bench.sweeps import grid
from impl.model import MODEL_CONFIGS

PROFILE = profile_name()
G = grid("nsys_profile", PROFILE)
MODELS = ModelCache()
BUDGET = Budget(G["budget_s"])  # rows past it are recorded as left out, so the file ends in time
ARTIFACTS = Path(os.environ.get("SUITE_ARTIFACTS_DIR", "out/artifacts"))


def _timer_forward(model, x, y):
    """(forward fn, grad): the training forward if one call of it fits, else the forward without
    autograd. The probe call is the timer's first warm-up call."""
    dtype = G["dtype"]

    def train_forward():
        return forward_loss(model, x, y, dtype)

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


def _profile(model, x, y, trace_path, start: str):
    """(profile, parse_s), the level profiled (kernels.PROFILED) and the OOM messages of the levels
    that did not fit; (None, None, messages) when none did."""
    kw = dict(dtype=G["dtype"], warmup=G["prof_warmup"], steps=G["prof_steps"], trace_path=trace_path)
    failures = []
    for upto in PROFILED[PROFILED.index(start):]:
        try:
            return profile_steps(model, x, y, upto=upto, **kw), upto, failures
        except Exception as exc:  # noqa: BLE001
            if not is_oom(exc):
                raise
            failures.append(f"{upto}: {first_line(exc)}")
        model.zero_grad(set_to_none=True)
        free_memory()
    return None, None, failures


@pytest.mark.parametrize("size,context", [(s, c) for s in G["sizes"] for c in G["contexts"]])
def test_nsys_profile(bench, size, context):
    batch, dtype = G["batch"], G["dtype"]
    shape = MODEL_CONFIGS[size]
    config = dict(size=size, context=context, dtype=dtype, batch=batch, mode="forward")
    if BUDGET.exhausted():
        bench.not_run(problem="nsys_profile", config=config, status=Status.LEFT_OUT_BY_BUDGET, reason=BUDGET.reason())
        return
    got = model_and_batch(bench, MODELS, problem="nsys_profile", config=config, size=size,
                          context_length=max(G["contexts"]), batch=batch, context=context)
    if got is None:
        return
    model, x, y = got
    # (a) the Python timer on the same forward the profile's "forward" range holds
    fn, grad, timer_oom = _timer_forward(model, x, y)
    row = bench.measure(problem="nsys_profile", config=config, fn=fn, warmup=max(1, G["timer_warmup"] - 1),
                        rounds=G["timer_rounds"],
                        round="one training forward with the loss" if grad else "one forward with the loss, no grad",
                        details=dict(timer_forward="training" if grad else "no_grad", timer_oom_message=timer_oom))
    if row.status is not Status.MEASURED:
        return
    trace = None
    if (size, context) == tuple(G["trace"]):
        trace = ARTIFACTS / f"nsys_profile_{size}_ctx{context}.trace.json.gz"
        trace.parent.mkdir(parents=True, exist_ok=True)
    try:
        got, profiled, failures = _profile(model, x, y, trace, "train_step" if grad else "forward_no_grad")
    finally:
        model.zero_grad(set_to_none=True)
        free_memory()
    if got is None:
        row.details.update(nsys=None, profile_oom="; ".join(failures))
        bench.save(row)
        return
    prof, parse_s = got
    answers = nsys_answers(prof, batch=batch, heads=shape["num_heads"], seq=context,
                           head_dim=shape["d_model"] // shape["num_heads"], layers=shape["num_layers"], top=G["top"])
    answers.update(profiled=profiled, train_oom=profiled != "train_step", train_oom_message="; ".join(failures) or None,
                   parse_s=parse_s, parse="kineto", warmup_steps=G["prof_warmup"])
    row.details["nsys"] = answers
    if trace is not None and trace.exists():
        mb = trace.stat().st_size / 2**20
        if mb <= G["trace_max_mb"]:
            row.details["artifact"] = trace.name
        else:  # the device returns files of at most 16 MB; never leave one that cannot come back
            trace.unlink()
            row.details["artifact_skipped"] = f"{trace.name}: {mb:.1f} MB > {G['trace_max_mb']} MB"
    bench.save(row)

    # The tables must account for what ran: forward kernels exist and the top row is the largest.
    fwd = answers["tables"]["forward"]
    assert fwd and fwd[0]["time_us"] >= fwd[-1]["time_us"]
    assert 0.0 <= answers["matmul_share_forward"] <= 1.0
