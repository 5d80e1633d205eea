"""1.1 memory_profiling: the 2025 edition's (a)-(e) on its 2.7B at each context, and the 2026
edition's (a)-(f) on the 2026 table's xl at contexts 128 and 2048; fp32 and bf16 autocast,
inference forward and a full training step. The benchmark row carries the peaks (b)/(c) (its
memory, CUDA only: no peak counter on the CPU); configs in `snapshot_dtypes` also record one
step's allocator history (a second, untimed step: recording slows allocation), phases and block
boundaries marked, stored min/max-downsampled for the report's timeline figure (a), with the
residual-stream check (d) and the largest allocations (e). Raw snapshots of `artifacts` are saved
as pickles. (f) has its own rows (`block_probe`): a stack of `probe_layers` of the size's blocks,
whose per-block facts are those of the whole model (a test pins that they do not depend on the
depth), so (f) is answered at 2048 too, where the whole training step does not fit."""
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from impl import accounting as acc
from impl.model import AdamW
from impl.model.sizes import ModelConfig
from impl.workloads.editions import GridSize
from impl.workloads.block_memory import BlockProbe, probe_block_memory
from impl.workloads.memory import (MemoryRecorder, largest_allocations, match_allocation, phased_step,
                               residual_stream_bytes, timeline_data)
from impl.bench.harness import set_up_or_oom
from impl.workloads.problems import Problem
from impl.workloads.steps import ModelCache, make_step, model_and_batch, random_batch
from impl.bench.row import Status
from impl.model import TransformerLM
from impl.runtime import free_memory, is_oom, profile_name, first_line
from impl.workloads.sweeps import grid

G = grid("memory_profiling", profile_name())
MODELS = ModelCache()
ARTIFACTS = Path(os.environ.get("SUITE_ARTIFACTS_DIR", "out/artifacts"))
ROUND = {"forward": "one forward pass (no grad)", "train_step": "one training step with AdamW",
         "block_probe": "forward+backward of the probed block stack (no probe: the probe runs after the rounds)"}


@dataclass(frozen=True)
class Case:
    size: GridSize
    context: int
    dtype: str
    mode: str

    @property
    def id(self) -> str:
        return f"{self.size.id}-{self.context}-{self.dtype}-{self.mode}"

    @property
    def model(self) -> ModelConfig:
        return self.size.config

    def row_config(self, batch: int) -> dict:
        """The size by edition with its dimensions, then the step."""
        return dict(self.size.row_config(), context=self.context, dtype=self.dtype, mode=self.mode, batch=batch)


def _cases() -> list[Case]:
    shapes = [(GridSize("2025", s), c) for s in G.sizes for c in G.contexts]
    shapes += [(GridSize("2026", s), c) for s, c in G.cases_2026]
    return [Case(z, c, d, m) for z, c in shapes for d in G.dtypes for m in G.modes]


CASES = _cases()
PROBE_CASES = [Case(GridSize("2026", s), c, d, "block_probe") for s, c in G.cases_2026 for d in G.dtypes]
ARTIFACT_CASES = {Case(GridSize(e, s), c, d, m) for e, s, c, d, m in G.artifacts}


def _closed_form(case: Case, batch: int) -> dict:
    """What a step needs in fp32 by impl.accounting: the training state (parameters, gradients,
    AdamW's moments) and the activations kept for backward; an OOM row reads it."""
    m = case.model
    terms = acc.checkpoint_terms(batch, case.context, m.d_model, m.d_ff, m.num_heads, m.vocab_size)
    saved = m.num_layers * terms["a_block"] + terms["a_outside"]
    state = acc.training_state_bytes(m.params)
    return dict(params=m.params, param_bytes=acc.param_bytes(m.params), training_state_bytes=state,
                saved_activation_bytes=saved, block_saved_bytes=terms["a_block"],
                train_step_need_bytes=state + saved)


def _record(model, x, y, case: Case, optimizer, device, batch):
    """Allocator history of one step (after the timed ones, so optimizer state already exists),
    with phase markers and, from the block probe's hooks, one marker per block boundary."""
    with MemoryRecorder(device) as rec, BlockProbe(model.layers, meter=lambda: torch.cuda.memory_allocated(device),
                                                   mark=rec.mark_block):
        phased_step(model, x, y, case.dtype, case.mode, optimizer, rec.mark)
    snap = rec.snapshot
    out = dict(timeline=timeline_data(snap, rec.marks, G.max_points, block_marks=rec.block_marks),
               largest=largest_allocations(snap, top=10))
    # (d) the residual stream stays in the parameters' dtype (fp32) even under autocast: the
    # embedding output is fp32 and `x + block(x)` promotes; half-size (batch, seq, d_model) tensors
    # are the autocast matmul outputs feeding it. Both sizes are looked up.
    out["residual"] = {str(b): match_allocation(snap, residual_stream_bytes(batch, case.context, case.model.d_model, b))
                       for b in (4, 2)}
    if case in ARTIFACT_CASES:
        path = ARTIFACTS / f"memory_profiling_{case.id}.pickle"
        rec.dump(path)
        out["artifact"] = path.name
    return out


def _oom_guarded(info: dict, key: str, fn) -> None:
    """info[key] = fn(), or info[key + '_skipped'] with the reason when fn runs out of memory."""
    try:
        info[key] = fn()
    except Exception as exc:  # noqa: BLE001 - recording can tip a config over; only OOM is a result
        if not is_oom(exc):
            raise
        info[key] = None
        info[f"{key}_skipped"] = "out of memory: " + first_line(exc, 200)
    free_memory()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_memory_profiling(bench, case: Case):
    device, batch = bench.device, G.batch
    config = case.row_config(batch)
    m = case.model
    details = dict(residual_bytes={str(b): residual_stream_bytes(batch, case.context, m.d_model, b) for b in (4, 2)},
                   residual_derivation=dict(batch=batch, context=case.context, d_model=m.d_model, bytes_per_elem=4),
                   closed_form=_closed_form(case, batch), snapshot=None)
    if case.size.edition == "2025":  # (d) and (e) are asked at the reference context; the others are extra rows
        details["reference_context"] = case.context == G.reference_context
    got = model_and_batch(bench, MODELS, problem=Problem.MEMORY_PROFILING, config=config, size=case.size.build_name,
                          context_length=max(c.context for c in CASES), batch=batch, context=case.context,
                          details=details)
    if got is None:
        return
    model, x, y = got
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01) if case.mode == "train_step" else None
    fn, setup = make_step(case.mode, model, x, y, case.dtype, optimizer)
    row = bench.measure(problem=Problem.MEMORY_PROFILING, config=config, fn=fn, setup=setup, round=ROUND[case.mode],
                        warmup=G.warmup, rounds=G.rounds, details=details)
    info, measured = row.details, row.status is Status.MEASURED
    if measured and device.type != "cuda":
        info["snapshot_skipped"] = "CUDA allocator history needs a GPU (the analysis code is tested on synthetic snapshots)"
    elif measured and case.dtype in G.snapshot_dtypes:
        _oom_guarded(info, "snapshot", lambda: _record(model, x, y, case, optimizer, device, batch))
    if measured:
        bench.save(row)
    del fn, setup, optimizer
    model.zero_grad(set_to_none=True)
    free_memory()
    if device.type == "cuda" and measured:
        assert row.memory.peak_allocated > 0
        snap = info.get("snapshot")
        if snap:
            t = snap["timeline"]
            assert t["markers_found"] == t["markers_expected"]
            assert t["blocks_found"] == t["blocks_expected"], "block boundary markers missing from the allocator trace"


@pytest.mark.parametrize("case", PROBE_CASES, ids=[c.id for c in PROBE_CASES])
def test_memory_profiling_block_probe(bench, case: Case):
    """(f): what one block saves for backward, by operation, and the gradient memory of one block's
    backward, on a stack of `probe_layers` of the size's blocks (impl.workloads.block_memory)."""
    device, batch, layers = bench.device, G.batch, G.probe_layers
    config = dict(case.row_config(batch), probe_layers=layers)
    m = case.model
    terms = acc.checkpoint_terms(batch, case.context, m.d_model, m.d_ff, m.num_heads, m.vocab_size)
    details = dict(block_saved_bytes_closed_form_fp32=terms["a_block"], block_memory=None)
    MODELS.clear()  # the whole-model rows' model out of the way

    def build():
        torch.manual_seed(0)
        model = TransformerLM(**m.replace(num_layers=layers), context_length=case.context, device=device)
        return (model, *random_batch(model, batch, case.context, device))
    got = set_up_or_oom(bench, build, problem=Problem.MEMORY_PROFILING, config=config, details=details)
    if got is None:
        return
    model, x, y = got
    fn, setup = make_step("forward_backward", model, x, y, case.dtype)
    row = bench.measure(problem=Problem.MEMORY_PROFILING, config=config, fn=fn, setup=setup, round=ROUND[case.mode],
                        warmup=G.warmup, rounds=G.rounds, details=details)
    info = row.details
    if row.status is Status.MEASURED:
        _oom_guarded(info, "block_memory",
                     lambda: probe_block_memory(model, x, y, case.dtype, top=G.probe_top).to_json())
        bench.save(row)
    del model, x, y, fn, setup, got
    free_memory()
    f = info.get("block_memory")
    if f:
        assert abs(sum(o["share"] for o in f["ops"]) - 1) < 1e-9 and len(f["top"]) == min(G.probe_top, len(f["ops"]))
        assert f["grad_bytes_expected"] == 4 * f["block_params"]  # fp32 master weights: fp32 gradients
