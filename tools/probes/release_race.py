"""Probe (issue 23): how often `Released` returns while gloo's worker still owes the tensor's Python
object a decref. torch 2.13 (c10/util/intrusive_ptr.h, "PyObject preservation") lowers a TensorImpl's use
count first and only then, on the 2 -> 1 transition, decrefs its PyObject, which takes the GIL. A wait on
the use count alone can thus return while the worker is still queued for the GIL; a rank that then exits
ends that thread inside a C++ destructor (SIGABRT, "terminate called without an active exception").
Seen here as the tensor's Python refcount still one above its baseline right after `Released` returns.
    PYTHONPATH=src python tools/probes/release_race.py [ITERATIONS] [WORLD_SIZE]
Run it beside a busy core (python -c 'while True: pass') to widen the window, as CI's load does."""
import sys

import torch
import torch.distributed as dist

from impl.distributed import launch
from impl.distributed.collectives import all_gather_single
from impl.distributed.release import Released


def worker(rank, world_size, iterations):
    """Per collective kind: how many times the refcount was above its baseline after the wait."""
    late = {"all_reduce": 0, "all_gather_single": 0}
    for _ in range(iterations):
        t = torch.ones(64 * world_size)
        mine = torch.ones(64)
        base_t, base_mine = sys.getrefcount(t), sys.getrefcount(mine)
        with Released() as keep:
            dist.all_reduce(keep(t))
        late["all_reduce"] += sys.getrefcount(t) > base_t
        release = Released()
        work = all_gather_single(release(t), release(mine), async_op=True)  # as ZeRO-1's _InFlight
        work.wait()
        work = None
        release.wait()
        late["all_gather_single"] += (sys.getrefcount(t) > base_t) + (sys.getrefcount(mine) > base_mine)
    return late


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    world_size = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    results = launch(worker, world_size, backend="gloo", args=(n,), timeout_s=600)
    print(f"{n} iterations x {world_size} ranks; waits that returned before the worker's decref, per rank: {results}")
