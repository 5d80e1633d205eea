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
import sys
import tempfile
import time
import signal
import traceback
from dataclasses import dataclass
from multiprocessing import connection as mp_connection
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

# The GPU host forbids NVLink multicast (NVLS); NCCL and symmetric memory would
# otherwise try to use it and fail at communicator creation.
_REQUIRED_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}

DEFAULT_TIMEOUT_S = 300.0
SPAWN = mp.get_context("spawn")  # ranks are fresh interpreters: no forked CUDA or gloo state


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


def check_world(backend: str, world_size: int) -> None:
    """Raise ValueError unless ``world_size`` ranks can run on ``backend`` here (NCCL: one GPU each)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}")
    if backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if world_size > gpus:
            raise ValueError(
                f"nccl needs one GPU per rank: world_size={world_size} but "
                f"{gpus} GPU(s) available"
            )


def host_store(timeout_s: float) -> dist.TCPStore:
    """The group's rendezvous store, served by the launching process (as torchrun's agent serves its
    workers'), on a port the OS picks as it binds. The caller keeps it until every rank has exited:
    a rank's exit then never takes the store away from a peer still shutting down, and no other
    process can take the port between its choice and its use (both possible when rank 0 hosted it
    on a port picked beforehand)."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def _rank_entry(rank, world_size, backend, port, timeout_s, fn, args, results, stderr_path=None):
    """Body of each spawned process: join the group, run fn, report ``(rank, ok, payload)`` with
    ``results.put`` (payload: fn's return value, or the traceback). `stderr_path`: this process's
    standard error (Python's and the C++ libraries') goes to that file, for the parent to read."""
    if stderr_path is not None:
        fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 2)
        os.close(fd)
    _apply_required_env()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(rank)
    try:
        if backend == "nccl":
            torch.cuda.set_device(rank)
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
        # Every rank finishes connecting before any runs fn: a rank whose fn does no collective could
        # otherwise exit while a peer is still in gloo's connectFullMesh, which then fails with
        # "Connection closed by peer" (seen in CI on a loaded machine).
        dist.barrier()
        out = fn(rank, world_size, *args)
        # A queue pickles in a background thread, where a failure would be
        # lost; pickle here so an unpicklable result is reported as an error.
        pickle.dumps(out)
        results.put((rank, True, out))
    except BaseException:  # report everything, including KeyboardInterrupt
        results.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _PipeReporter:
    """``results`` for _rank_entry: one pipe per rank, so the parent can wait on reports and
    process exits together (multiprocessing.connection.wait) and see each as it happens."""

    def __init__(self, conn):
        self.conn = conn

    def put(self, item) -> None:
        self.conn.send(item)


def stop_ranks(procs) -> None:
    """Kill every rank process still alive and reap them all."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=10)


def spawn_ranks(
    fn: Callable[..., Any],
    world_size: int,
    backend: str,
    timeout_s: float,
    rank_args: Sequence[tuple],
    reporters: Sequence[Any],
    store_port: int,
    stderr_paths: Sequence[str] | None = None,
) -> list:
    """Start ``world_size`` spawned processes in one new process group, whose store the caller
    serves on ``store_port`` (``host_store``, kept until the ranks have exited): rank r joins the
    group, runs ``fn(r, world_size, *rank_args[r])`` and reports ``(r, ok, payload)`` once through
    ``reporters[r].put`` (payload: fn's picklable return value, or the traceback of what it
    raised). ``timeout_s`` is the group's own timeout for a collective whose peer is gone;
    ``stderr_paths[r]``, if given, receives rank r's standard error. The caller waits for the
    reports and ends the processes with ``stop_ranks``; ``launch`` is the one-shot use; a caller
    may also keep the ranks for many calls."""
    check_world(backend, world_size)
    procs = [
        SPAWN.Process(
            target=_rank_entry,
            args=(rank, world_size, backend, store_port, timeout_s, fn, tuple(rank_args[rank]), reporters[rank],
                  stderr_paths[rank] if stderr_paths else None),
            # Not daemonic, so workers may start their own processes
            # (DataLoader workers); stop_ranks kills them.
            daemon=False,
        )
        for rank in range(world_size)
    ]
    for p in procs:
        p.start()
    return procs


def _exit_status(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# After the first failure, how long to keep listening for its cause (a peer's lost-connection
# traceback can reach us before the exit of the rank that vanished).
_FAILURE_GRACE_S = 2.0
# How long ranks that all reported may take to exit before it counts as a hang at exit.
_EXIT_WAIT_S = 30.0


def launch(
    fn: Callable[..., Any],
    world_size: int,
    backend: str | None = None,
    args: Sequence[Any] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` new processes.

    Returns the ranks' return values ordered by rank. Raises ``RuntimeError`` naming the rank that
    failed first (an exception, with its traceback, or an exit by a non-zero code or a signal,
    also after the rank reported its result: an abort at exit is a failure), and ``TimeoutError``
    (naming the unfinished ranks) if the run takes longer than ``timeout_s`` or a rank does not
    exit after reporting. Every child is killed before raising.
    """
    backend = backend or default_backend(world_size if isinstance(world_size, int) else 1)
    check_world(backend, world_size)
    store = host_store(timeout_s)
    pipes = [SPAWN.Pipe(duplex=False) for _ in range(world_size)]
    with tempfile.TemporaryDirectory(prefix="launch-") as logs:
        stderr = [os.path.join(logs, f"rank{r}.stderr") for r in range(world_size)]
        procs = spawn_ranks(fn, world_size, backend, timeout_s, [tuple(args)] * world_size,
                            [_PipeReporter(writer) for _, writer in pipes], store.port, stderr)
        for _, writer in pipes:
            writer.close()  # the children hold their own copies
        try:
            return _collect(procs, [reader for reader, _ in pipes], timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            raise type(exc)(f"{exc}{_stderr_tails(stderr)}") from None
        finally:
            stop_ranks(procs)
            for reader, _ in pipes:
                reader.close()
            _forward(stderr)
            del store  # served until every rank has exited


# Lines of each rank's standard error a failure message ends with.
STDERR_TAIL_LINES = 15


def _stderr_tails(paths: Sequence[str]) -> str:
    """The last lines each rank wrote to its standard error (warnings and tracebacks of the C++
    libraries included: an abort at exit leaves its reason only there)."""
    out = []
    for rank, path in enumerate(paths):
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError:
            continue
        if lines:
            out.append(f"--- rank {rank}'s stderr, last {min(len(lines), STDERR_TAIL_LINES)} of {len(lines)} lines ---")
            out += lines[-STDERR_TAIL_LINES:]
    return "\n" + "\n".join(out) if out else ""


def _forward(paths: Sequence[str]) -> None:
    """Copy what the ranks wrote to standard error to ours (what they showed before it was captured)."""
    for path in paths:
        try:
            text = open(path, errors="replace").read()
        except OSError:
            continue
        if text:
            sys.stderr.write(text)
    sys.stderr.flush()


# A rank whose peer vanished fails with one of these; the peer is the cause.
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


@dataclass(order=True)
class _Failure:
    """Ordered by blame: failures seen in the order they reached the parent (a silent death is
    seen when the process ends, a traceback once it is formatted and sent), except that a rank
    that only lost its connection to a peer comes after every other failure."""

    peer_lost: bool
    seen: int
    rank: int
    message: str


def _collect(procs, readers, timeout_s: float) -> list[Any]:
    """Wait for every rank's report and exit; raise for the failure that happened first."""
    world_size = len(procs)
    outputs: dict[int, Any] = {}
    failures: list[_Failure] = []
    listening, running = set(range(world_size)), set(range(world_size))
    source = {id(r): ("report", rank) for rank, r in enumerate(readers)}
    source.update({id(p.sentinel): ("exit", rank) for rank, p in enumerate(procs)})
    deadline = time.monotonic() + timeout_s
    first_failure_t = all_reported_t = None

    def fail(rank: int, message: str, peer_lost: bool = False) -> None:
        failures.append(_Failure(peer_lost, len(failures), rank, message))

    def read_report(rank: int) -> None:
        listening.discard(rank)
        try:
            _, ok, payload = readers[rank].recv()
        except EOFError:  # exited without a report: its exit says how
            return
        if ok:
            outputs[rank] = payload
        else:
            fail(rank, f"rank {rank} of {world_size} failed:\n{payload}", any(m in payload for m in _PEER_LOST))

    def on_exit(rank: int) -> None:
        running.discard(rank)
        procs[rank].join(timeout=5)
        if rank in listening and readers[rank].poll():
            read_report(rank)  # sent just before it exited
        code = procs[rank].exitcode
        if code != 0:
            when = "after reporting its result" if rank in outputs else "without reporting a result"
            fail(rank, f"rank {rank} of {world_size} {_exit_status(code)} {when}")
        elif rank not in outputs and all(f.rank != rank for f in failures):
            fail(rank, f"rank {rank} of {world_size} exited without reporting a result")

    while running:
        now = time.monotonic()
        if failures and first_failure_t is None:
            first_failure_t = now
        if len(outputs) == world_size and all_reported_t is None:
            all_reported_t = now
        limit = deadline
        if first_failure_t is not None:
            limit = min(limit, first_failure_t + _FAILURE_GRACE_S)
        elif all_reported_t is not None:
            limit = min(limit, all_reported_t + _EXIT_WAIT_S)
        if now >= limit:
            break
        waiting = [readers[r] for r in listening] + [procs[r].sentinel for r in running]
        for ready in mp_connection.wait(waiting, timeout=limit - now):
            kind, rank = source[id(ready)]
            if kind == "report" and rank in listening:
                read_report(rank)
            elif kind == "exit" and rank in running:
                on_exit(rank)

    if failures:
        first = min(failures)
        message = first.message
        later = sorted({f.rank for f in failures} - {first.rank})
        if later:
            message += f"\n(then ranks {later} failed too)"
        raise RuntimeError(message)
    if len(outputs) < world_size:
        missing = sorted(set(range(world_size)) - outputs.keys())
        raise TimeoutError(
            f"launch timed out after {timeout_s:.1f}s; ranks {missing} of {world_size} did not finish"
        )
    if running:
        raise TimeoutError(f"ranks {sorted(running)} of {world_size} reported their results but did not exit")
    return [outputs[r] for r in range(world_size)]


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
