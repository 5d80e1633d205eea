"""1.1 benchmarking_script: forward, backward alone, forward+backward and a full AdamW training
step for every model size × context, fp32 and bf16 autocast (the timings that
benchmarking_mixed_precision (c) reads), and the warm-up study of (c)."""
import pytest

from impl.model import mode_flops
from impl.bench.legacy_harness import record_oom, run_benchmark
from impl.bench.steps import ModelCache, build_model, make_step, model_and_batch, random_batch
from impl.runtime import free_memory, is_oom, profile_name
from impl.bench.sweeps import grid
from impl.model import MODEL_CONFIGS

PROFILE = profile_name()
MAIN = grid("benchmarking_script", PROFILE)
WARMUP = grid("benchmarking_script_warmup", PROFILE)
MODELS = ModelCache()


def _flops(size, mode, batch, context):
    return mode_flops(mode, **MODEL_CONFIGS[size], batch=batch, seq=context)


# The warm-up study comes first in the file so its first row also sees a cold process.
@pytest.mark.parametrize("size,context,dtype,mode,warmup", [
    (s, c, d, m, w) for s in WARMUP["sizes"] for c in WARMUP["contexts"] for d in WARMUP["dtypes"]
    for m in WARMUP["modes"] for w in WARMUP["warmups"]])
def test_benchmarking_script_warmup(benchmark, device, matmul_peak, size, context, dtype, mode, warmup):
    """(c) A fresh model and an emptied allocator cache per row, so warm-up 0 pays the first-call
    costs (allocation, kernel loading, library heuristics) inside its timed steps."""
    MODELS.clear()
    batch = WARMUP["batch"]
    config = dict(size=size, context=context, dtype=dtype, mode=mode, batch=batch, warmup=warmup)
    extra = dict(study="warmup", left_out=WARMUP["left_out"])
    try:
        model = build_model(size, context, device)
    except Exception as exc:
        if not is_oom(exc):
            raise
        record_oom(benchmark, problem="benchmarking_script", config=config, device=device, message=str(exc), extra=extra)
        return
    free_memory()
    x, y = random_batch(model, batch, context, device)
    fn, setup = make_step(mode, model, x, y, dtype)
    run_benchmark(benchmark, problem="benchmarking_script", config=config, fn=fn, setup=setup, device=device,
                  warmup=warmup, rounds=WARMUP["rounds"], flops=_flops(size, mode, batch, context),
                  tokens=batch * context, peak_flops=matmul_peak["peak_flops"], extra={**extra, **matmul_peak})


@pytest.mark.parametrize("size,context,dtype,mode", [
    (s, c, d, m) for s in MAIN["sizes"] for c in MAIN["contexts"] for d in MAIN["dtypes"] for m in MAIN["modes"]])
def test_benchmarking_script(benchmark, device, matmul_peak, size, context, dtype, mode):
    """(b) w warm-up then n timed steps, each synchronised; bf16 rows are (c) of
    benchmarking_mixed_precision."""
    batch = MAIN["batch"]
    config = dict(size=size, context=context, dtype=dtype, mode=mode, batch=batch)
    extra = dict(study="main")
    got = model_and_batch(benchmark, MODELS, problem="benchmarking_script", config=config, device=device, size=size,
                          context_length=max(MAIN["contexts"]), batch=batch, context=context, extra=extra)
    if got is None:
        return
    model, x, y = got
    fn, setup = make_step(mode, model, x, y, dtype)
    run_benchmark(benchmark, problem="benchmarking_script", config=config, fn=fn, setup=setup, device=device,
                  warmup=MAIN["warmup"], rounds=MAIN["rounds"], flops=_flops(size, mode, batch, context),
                  tokens=batch * context, peak_flops=matmul_peak["peak_flops"], extra={**extra, **matmul_peak})
    model.zero_grad(set_to_none=True)
