"""1.1 benchmarking_script: forward, backward alone, forward+backward and a full AdamW training
step for every model size × context, fp32 and bf16 autocast (the timings that
benchmarking_mixed_precision (c) reads), and the warm-up study of (c)."""
import pytest

from impl.bench.steps import ModelCache, build_model, make_step, model_and_batch, random_batch
from impl.bench.sweeps import grid
from impl.model import MODEL_CONFIGS
from impl.runtime import free_memory, is_oom, profile_name

PROBLEM = "benchmarking_script"
PROFILE = profile_name()
MAIN = grid("benchmarking_script", PROFILE)
WARMUP = grid("benchmarking_script_warmup", PROFILE)
MODELS = ModelCache()
ROUND = {"forward": "one forward pass (no grad)", "backward": "one backward pass (forward in setup)",
         "forward_backward": "one forward and backward pass",
         "optimizer_step": "one AdamW step (forward and backward in setup)", "train_step": "one training step with AdamW"}


# The warm-up study comes first in the file so its first row also sees a cold process.
@pytest.mark.parametrize("size,context,dtype,mode,warmup", [
    (s, c, d, m, w) for s in WARMUP["sizes"] for c in WARMUP["contexts"] for d in WARMUP["dtypes"]
    for m in WARMUP["modes"] for w in WARMUP["warmups"]])
def test_benchmarking_script_warmup(bench, size, context, dtype, mode, warmup):
    """(c) A fresh model and an emptied allocator cache per row, so warm-up 0 pays the first-call
    costs (allocation, kernel loading, library heuristics) inside its timed steps."""
    MODELS.clear()
    batch = WARMUP["batch"]
    config = dict(size=size, context=context, dtype=dtype, mode=mode, batch=batch, warmup=warmup, study="warmup")
    details = dict(left_out=WARMUP["left_out"])
    try:
        model = build_model(size, context, bench.device)
    except Exception as exc:
        if not is_oom(exc):
            raise
        bench.oom(problem=PROBLEM, config=config, exc=exc, details=details)
        return
    free_memory()
    x, y = random_batch(model, batch, context, bench.device)
    fn, setup = make_step(mode, model, x, y, dtype)
    bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=warmup,
                  rounds=WARMUP["rounds"], flops=MODEL_CONFIGS[size].flops(mode, batch, context),
                  tokens=batch * context, details=details)


@pytest.mark.parametrize("size,context,dtype,mode", [
    (s, c, d, m) for s in MAIN["sizes"] for c in MAIN["contexts"] for d in MAIN["dtypes"] for m in MAIN["modes"]])
def test_benchmarking_script(bench, size, context, dtype, mode):
    """(b) w warm-up then n timed steps, each synchronised; bf16 rows are (c) of
    benchmarking_mixed_precision."""
    batch = MAIN["batch"]
    config = dict(size=size, context=context, dtype=dtype, mode=mode, batch=batch, study="main")
    got = model_and_batch(bench, MODELS, problem=PROBLEM, config=config, size=size,
                          context_length=max(MAIN["contexts"]), batch=batch, context=context)
    if got is None:
        return
    model, x, y = got
    fn, setup = make_step(mode, model, x, y, dtype)
    bench.measure(problem=PROBLEM, config=config, fn=fn, setup=setup, round=ROUND[mode], warmup=MAIN["warmup"],
                  rounds=MAIN["rounds"], flops=MODEL_CONFIGS[size].flops(mode, batch, context),
                  tokens=batch * context)
    model.zero_grad(set_to_none=True)
