"""Probe (issue 42): repeat correctness/test_distributed.py's exit test (kits.distributed.ddp_train_and_exit:
4 steps of an overlapped DDP wrapper on two small models, then the launcher destroys the group and the
ranks exit) until a time limit, and keep every failure whole: the launcher's message and what the ranks
wrote to stderr during that launch (the test keeps only the message, and pytest hides the stderr).
    PYTHONPATH=src:correctness python tools/probes/ddp_exit_stress.py OUT.json [SECONDS] [VARIANT ...]
On a machine with two GPUs the launcher picks NCCL, elsewhere gloo. VARIANT: individual, bucketed
(default both, alternating), or a sharded optimizer's launch of correctness/test_sharded_optimizer.py (issue 23 in
CI): sharded, zero1 (2 ranks, ShardedOptimizer / ZeRO-1 ending like that file's 2-rank launch), zero1_3 (3 ranks)."""
import json
import os
import sys
import tempfile
import time

import torch

from impl.distributed import launch
from impl.distributed.launcher import default_backend
from kits import distributed as T


# variant -> (worker, world size, its args): the last configurations of test_sharded_optimizer.py's launches,
# whose final collectives are the ones a rank exits after.
SHARDED = {
    "sharded": (T.sharded_equivalence, 2, (["sharded"], ["frozen"], ["adamw"], 3, 1)),
    "zero1": (T.sharded_equivalence, 2, (["zero1_small_buckets"], ["frozen"], ["adamw"], 3, 1)),
    "zero1_3": (T.sharded_equivalence, 3, (["zero1_all_reduce"], ["frozen"], ["adamw"], 3, 1)),
}


def launch_capturing_stderr(variant: str) -> tuple[str | None, str]:
    """(the launch's error message or None, everything written to fd 2 meanwhile, ranks included:
    spawned ranks inherit the parent's fd 2)."""
    with tempfile.TemporaryFile(mode="w+b") as log:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(log.fileno(), 2)
        try:
            fn, world_size, args = SHARDED.get(variant, (T.ddp_train_and_exit, 2, (variant,)))
            launch(fn, world_size, args=args, timeout_s=120)
            error = None
        except Exception as exc:  # noqa: BLE001 - the probe records every failure
            error = f"{type(exc).__name__}: {exc}"
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        return error, log.read().decode(errors="replace")


def main(out: str, seconds: float, variants: list[str]) -> None:
    runs, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        variant = variants[len(runs) % len(variants)]
        t0 = time.monotonic()
        error, stderr = launch_capturing_stderr(variant)
        runs.append(dict(variant=variant, seconds=round(time.monotonic() - t0, 2), error=error,
                         stderr=stderr[-20000:] if error else stderr[-2000:]))
        print(f"{len(runs):3d} {variant:10s} {runs[-1]['seconds']:6.2f}s {'FAILED' if error else 'ok'}", flush=True)
        if error:
            print(error, "\n--- stderr ---\n", stderr[-4000:], flush=True)
    failed = [r for r in runs if r["error"]]
    summary = dict(backend=default_backend(2), torch=torch.__version__, launches=len(runs), failed=len(failed),
                   by_variant={v: [sum(1 for r in runs if r["variant"] == v),
                                   sum(1 for r in failed if r["variant"] == v)] for v in variants})
    with open(out, "w") as f:
        json.dump(dict(summary=summary, runs=runs), f, indent=1)
    print(json.dumps(summary))


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 120.0, sys.argv[3:] or ["bucketed", "individual"])
