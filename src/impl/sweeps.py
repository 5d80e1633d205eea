"""Every sweep grid of the suite, per profile, in one table.

`smoke` uses tiny shapes that run on a CPU in minutes (what CI runs); `full` is the assignment's
grid, trimmed only where a section must fit one 10-minute command on the GPU machine; what a
trim leaves out is recorded in the benchmark JSON through `left_out`, never dropped silently.
"""
from impl.model.sizes import MODEL_SIZES

# A model small enough for CPU smoke runs; not one of the assignment's sizes.
SMOKE_SIZES = {"tiny": dict(d_model=64, d_ff=256, num_layers=2, num_heads=4)}

ALL_SIZES = {**MODEL_SIZES, **SMOKE_SIZES}

MODES = ("forward", "backward", "forward_backward", "train_step")

GRIDS = {
    "benchmarking_script": {
        "full": dict(sizes=list(MODEL_SIZES), contexts=[128, 256, 512, 1024], modes=list(MODES),
                     dtypes=["fp32", "bf16"], batch=4, warmup=5, rounds=10),
        "smoke": dict(sizes=["tiny"], contexts=[32, 64], modes=list(MODES), dtypes=["fp32", "bf16"],
                      batch=2, warmup=1, rounds=3),
    },
    # (c): warm-up 0/1/2/5; a subset of sizes, recorded as such in the JSON.
    "benchmarking_script_warmup": {
        "full": dict(sizes=["small", "large"], contexts=[256], modes=["forward", "train_step"], dtypes=["fp32"],
                     warmups=[0, 1, 2, 5], batch=4, rounds=10,
                     left_out="sizes medium, xl, 2.7B and contexts other than 256 (time budget)"),
        "smoke": dict(sizes=["tiny"], contexts=[32], modes=["forward", "train_step"], dtypes=["fp32"],
                      warmups=[0, 1, 2, 5], batch=2, rounds=3, left_out="smoke profile"),
    },
}


def grid(problem: str, profile: str) -> dict:
    try:
        return GRIDS[problem][profile]
    except KeyError:
        raise ValueError(f"no sweep grid for problem {problem!r} in profile {profile!r}") from None
