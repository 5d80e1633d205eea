"""Start a process group on one host and run a worker function on every rank.

Two ways in:

* ``launch(fn, world_size)`` spawns ``world_size`` fresh processes from Python
  (tests, benchmarks). Results come back through a queue; a failing or hanging
  rank turns into an exception in the parent instead of a stuck run.
* ``init_from_env()`` joins a group that ``torchrun`` set up (env:// rendezvous),
  so the same ``fn(rank, world_size, *args)`` workers also run under torchrun::

      torchrun --nproc-per-node 2 -m impl.distributed.run_worker pkg.module:fn [args...]

Worker functions must be module-level (spawn pickles them by qualified name)
and their return values must be picklable.
"""

from __future__ import annotations

import datetime
import os
import pickle
import queue as queue_mod
import socket
import time
import traceback
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The GPU host forbids NVLink multicast (NVLS); NCCL and symmetric memory would
# otherwise try to use it and fail at communicator creation.
_REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

DEFAULT_TIMEOUT_S = 300.0


def _apply_required_env() -> None:
    for key, value in _REQUIRED_ENV.items():
        os.environ.setdefault(key, value)


def default_backend(world_size: int) -> str:
    """NCCL when every rank can have its own GPU, else gloo (CPU)."""
    if torch.cuda.is_available() and world_size <= torch.cuda.device_count():
        return "nccl"
    return "gloo"


def device_for(backend: str, rank: int) -> torch.device:
    """The device a rank's tensors live on for ``backend``."""
    return torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")


def _validate(backend: str, world_size: int) -> None:
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if world_size > gpus:
            raise ValueError(
                f"nccl needs one GPU per rank: world_size={world_size} but "
                f"{gpus} GPU(s) available"
            )


def _free_port() -> int:
    # Bind to port 0 so the OS picks an unused port. There is a small window
    # in which another process could grab it before rank 0 binds; acceptable
    # for a single-host launcher.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world_size, backend, port, timeout_s, fn, args, results):
    """Body of each spawned process: join the group, run fn, report back."""
    _apply_required_env()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        out = fn(rank, world_size, *args)
        # The queue pickles in a background thread, where a failure would be
        # lost; pickle here so an unpicklable result is reported as an error.
        pickle.dumps(out)
        results.put((rank, True, out))
    except BaseException:  # report everything, including KeyboardInterrupt
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _kill_all(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    backend: str | None = None,
    args: Sequence[Any] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes.

    Returns the ranks' return values ordered by rank. Raises ``RuntimeError``
    (naming the rank, with its traceback) as soon as any rank fails, and
    ``TimeoutError`` (naming the unfinished ranks) if the whole run takes
    longer than ``timeout_s``. In both cases every child is killed first.
    """
    backend = backend or default_backend(world_size if isinstance(world_size, int) else 1)
    _validate(backend, world_size)

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(rank, world_size, backend, port, timeout_s, fn, tuple(args), results),
            # Not daemonic, so workers may start their own processes
            # (DataLoader workers); we kill them ourselves below.
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()

    outputs: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(outputs) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - outputs.keys())
                raise TimeoutError(
                    f"launch timed out after {timeout_s:.1f}s; ranks {missing} "
                    f"of {world_size} did not finish"
                )
            try:
                rank, ok, payload = results.get(timeout=min(remaining, 0.5))
            except queue_mod.Empty:
                _check_silent_deaths(procs, outputs, results)
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{payload}")
            outputs[rank] = payload
    finally:
        # On success the ranks are exiting on their own; on failure we do not
        # wait for peers stuck in collectives.
        if len(outputs) == world_size:
            for p in procs:
                p.join(timeout=max(1.0, min(30.0, deadline - time.monotonic())))
        _kill_all(procs)
        results.close()
    return [outputs[r] for r in range(world_size)]


def _check_silent_deaths(procs, outputs, results) -> None:
    """A rank that died without reporting (segfault, os._exit) is a failure."""
    for rank, p in enumerate(procs):
        if rank in outputs or p.exitcode is None:
            continue
        # Its report may still be in flight through the queue's pipe.
        try:
            r, ok, payload = results.get(timeout=1.0)
        except queue_mod.Empty:
            raise RuntimeError(
                f"rank {rank} exited with code {p.exitcode} without reporting a result"
            ) from None
        if not ok:
            raise RuntimeError(f"rank {r} failed:\n{payload}")
        outputs[r] = payload


def init_from_env(backend: str | None = None) -> tuple[int, int, int]:
    """Join the process group described by torchrun's environment variables.

    Reads RANK, WORLD_SIZE, LOCAL_RANK (and MASTER_ADDR/MASTER_PORT through the
    env:// rendezvous). On NCCL each process binds to GPU LOCAL_RANK.
    Returns ``(rank, world_size, local_rank)``.
    """
    _apply_required_env()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if backend is None:
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
        backend = default_backend(local_world)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method="env://")
    return rank, world_size, local_rank
