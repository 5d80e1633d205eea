"""1.1 memory_profiling (a)-(e): the 2.7B model at each context, fp32 and bf16 autocast, inference
forward and a full training step. The benchmark row carries the peaks (b)/(c) (its memory, CUDA
only: no peak counter on the CPU); configs in
`snapshot_dtypes` also record one step's allocator history (a second, untimed step: recording
slows allocation), stored downsampled for the report's timeline figure (a), with the residual-
stream check (d) and the largest allocations (e). One raw snapshot is saved as an artifact."""
import os
from pathlib import Path

import pytest

from impl.model import AdamW
from impl.bench.memory import (MemoryRecorder, largest_allocations, match_allocation, phased_step,
                                   residual_stream_bytes, timeline_data)
from impl.bench.steps import ModelCache, make_step, model_and_batch
from impl.bench.row import Status
from impl.runtime import free_memory, is_oom, profile_name
from impl.bench.sweeps import grid
from impl.model import MODEL_CONFIGS

G = grid("memory_profiling", profile_name())
MODELS = ModelCache()
ARTIFACTS = Path(os.environ.get("SUITE_ARTIFACTS_DIR", "out/artifacts"))


def _record(model, x, y, dtype, mode, optimizer, device, config, artifact):
    """Allocator history of one step (after the timed ones, so optimizer state already exists)."""
    d_model = MODEL_CONFIGS[config["size"]]["d_model"]
    with MemoryRecorder(device) as rec:
        phased_step(model, x, y, dtype, mode, optimizer, rec.mark)
    snap = rec.snapshot
    out = dict(timeline=timeline_data(snap, rec.marks, G["max_points"]), largest=largest_allocations(snap, top=10))
    # (d) the residual stream stays in the parameters' dtype (fp32) even under autocast: the
    # embedding output is fp32 and `x + block(x)` promotes; half-size (batch, seq, d_model) tensors
    # are the autocast matmul outputs feeding it. Both sizes are looked up.
    out["residual"] = {str(b): match_allocation(snap, residual_stream_bytes(config["batch"], config["context"], d_model, b))
                       for b in (4, 2)}
    if artifact:
        path = ARTIFACTS / "memory_profiling_{size}_ctx{context}_{dtype}_{mode}.pickle".format(**config)
        rec.dump(path)
        out["artifact"] = path.name
    return out


# The 2025 edition's 2.7B grid, then the 2026 edition's (size, context) pairs.
SHAPES = [(s, c) for s in G["sizes"] for c in G["contexts"]] + [tuple(x) for x in G["cases_2026"]]
CASES = [(s, c, d, m) for s, c in SHAPES for d in G["dtypes"] for m in G["modes"]]
ROUND = {"forward": "one forward pass (no grad)", "train_step": "one training step with AdamW"}


@pytest.mark.parametrize("size,context,dtype,mode", CASES)
def test_memory_profiling(bench, size, context, dtype, mode):
    device, batch = bench.device, G["batch"]
    config = dict(size=size, context=context, dtype=dtype, mode=mode, batch=batch)
    details = dict(residual_bytes={str(b): residual_stream_bytes(batch, context, MODEL_CONFIGS[size]["d_model"], b)
                                   for b in (4, 2)}, snapshot=None)
    got = model_and_batch(bench, MODELS, problem="memory_profiling", config=config, size=size,
                          context_length=max(context, *G["contexts"]), batch=batch, context=context,
                          details=details)
    if got is None:
        return
    model, x, y = got
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01) if mode == "train_step" else None
    fn, setup = make_step(mode, model, x, y, dtype, optimizer)
    row = bench.measure(problem="memory_profiling", config=config, fn=fn, setup=setup, round=ROUND[mode],
                        warmup=G["warmup"], rounds=G["rounds"], details=details)
    info, measured = row.details, row.status is Status.MEASURED
    if measured and device.type != "cuda":
        info["snapshot_skipped"] = "CUDA allocator history needs a GPU (the analysis code is tested on synthetic snapshots)"
    elif measured and dtype in G["snapshot_dtypes"]:
        try:
            info["snapshot"] = _record(model, x, y, dtype, mode, optimizer, device, config,
                                       artifact=(size, context, dtype, mode) == tuple(G["artifact"]))
        except Exception as exc:  # noqa: BLE001 - history recording itself can tip a config over
            if not is_oom(exc):
                raise
            info["snapshot_skipped"] = "out of memory while recording: " + str(exc).splitlines()[0][:200]
    if measured:
        bench.save(row)
    del fn, setup, optimizer
    model.zero_grad(set_to_none=True)
    free_memory()
    if device.type == "cuda" and measured:
        assert row.memory.peak_allocated > 0
        snap = info.get("snapshot")
        if snap:
            assert snap["timeline"]["markers_found"] == snap["timeline"]["markers_expected"]
