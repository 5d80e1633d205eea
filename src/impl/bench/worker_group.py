"""A persistent group of worker processes that the test process (the parent) commands, for the
distributed benchmarks, and the clock that times them.

Why a persistent group: pytest-benchmark, the suite's one timer, runs in the parent, and process
start-up costs seconds; the ranks start once per perf file (or per world size) and keep their
models between commands.

A command is a module-level function `fn(state, **kwargs)` (impl.bench.dist_steps,
impl.bench.fsdp_steps): the parent sends the function itself (pickled by its qualified name, so a
worker imports its module on first use) and every rank runs it on its own `WorkerState`. Nothing is
registered anywhere.

Timing: a timed command returns, on every rank that worked, a reply with `seconds`, the rank's
own device-synchronised time of the work (impl.bench.dist_steps.timed). `SlowestRankClock` is the
benchmark's timer: it advances by the slowest rank's seconds of each command, so the benchmark's
stats are the slowest rank's time, without the parent's IPC round trip.

Error semantics follow `launcher.launch`: a rank that raises, dies silently or does not answer
within the command's timeout fails the call in the parent (RankError / TimeoutError naming the rank
and, on its first line, the rank's error) and every rank is killed first, so a broken run never
hangs; `Workers.get` starts a new group for the next row.
"""
from __future__ import annotations

import queue as queue_mod
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from impl.bench.dist_steps import WorkerState
from impl.bench.harness import Budget
from impl.bench.row import Status
from impl.distributed.launcher import _free_port, _kill_all, _rank_entry, _validate, device_for

Command = Callable[..., Any]  # fn(state: WorkerState, **kwargs), module-level


class RankError(RuntimeError):
    """A rank raised: the first line names the rank and its error's last line (an OOM reads as one,
    impl.runtime.is_oom), the rest is the rank's traceback."""


def noop(state: WorkerState) -> None:
    return None


def serve(rank: int, world_size: int, commands, replies) -> str:
    """Body of every rank: run commands until None. An exception ends the process and reaches the
    parent through launcher._rank_entry with its traceback."""
    backend = dist.get_backend()
    if backend == "gloo":
        torch.set_num_threads(1)  # ranks share a small CPU host; intra-op threads would fight
    state = WorkerState(rank=rank, world_size=world_size, backend=backend, device=device_for(backend, rank))
    while True:
        msg = commands.get()
        if msg is None:
            return "closed"
        fn, kwargs = msg
        replies.put((rank, True, fn(state, **kwargs)))


class WorkerGroup:
    """`world_size` processes in one process group, each serving commands until closed."""

    def __init__(self, world_size: int, backend: str, start_timeout_s: float = 180.0,
                 command_timeout_s: float = 300.0):
        _validate(backend, world_size)
        self.world_size, self.backend = world_size, backend
        self.command_timeout_s = command_timeout_s
        ctx = mp.get_context("spawn")
        # One queue carries both command replies and _rank_entry's final report (an exception's
        # traceback included), so a failing rank is seen wherever the parent is waiting.
        self.replies = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(world_size)]
        port = _free_port()
        # The process group's own timeout bounds a collective whose peer is gone; the parent's
        # command timeout bounds everything else.
        self.procs = [ctx.Process(target=_rank_entry, daemon=False,
                                  args=(r, world_size, backend, port, command_timeout_s, serve,
                                        (self.commands[r], self.replies), self.replies))
                      for r in range(world_size)]
        for p in self.procs:
            p.start()
        self.dead = False
        self.call(noop, timeout_s=start_timeout_s)  # returns once every rank joined the group

    def call(self, fn: Command, timeout_s: float | None = None, **kwargs) -> list[Any]:
        """Run command `fn` on every rank; the ranks' return values, ordered by rank."""
        if self.dead:
            raise RuntimeError("worker group is closed or failed earlier")
        for q in self.commands:
            q.put((fn, kwargs))
        return self._gather(fn.__name__, timeout_s or self.command_timeout_s)

    def _gather(self, name: str, timeout_s: float) -> list[Any]:
        out: dict[int, Any] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(out) < self.world_size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(self.world_size)) - out.keys())
                    raise TimeoutError(f"command {name!r} timed out after {timeout_s:.0f}s on ranks {missing}")
                try:
                    rank, ok, payload = self.replies.get(timeout=min(remaining, 0.5))
                except queue_mod.Empty:
                    for r, p in enumerate(self.procs):
                        if r not in out and p.exitcode is not None and self.replies.empty():
                            raise RuntimeError(f"rank {r} exited with code {p.exitcode} during {name!r}")
                    continue
                if not ok:
                    last = [ln.strip() for ln in payload.strip().splitlines() if ln.strip()][-1:] or ["?"]
                    raise RankError(f"rank {rank} of {self.world_size} failed in {name!r}: {last[0]}\n{payload}")
                out[rank] = payload
        except BaseException:
            self.kill()
            raise
        return [out[r] for r in range(self.world_size)]

    def kill(self) -> None:
        self.dead = True
        _kill_all(self.procs)

    def close(self) -> None:
        if self.dead:
            return
        for q in self.commands:
            q.put(None)
        try:
            self._gather("close", 60.0)  # _rank_entry's final (rank, True, "closed")
        finally:
            self.kill()


class SlowestRankClock:
    """pytest-benchmark's timer for distributed rows: seconds of the slowest rank's own timed work,
    summed over the commands run through `command`. Every call of the returned function is one
    command on all ranks; its replies are kept in `replies` (warm-up calls included)."""

    __name__ = "SlowestRankClock"

    def __init__(self):
        self.elapsed = 0.0
        self.replies: list[list[Any]] = []

    def __call__(self) -> float:
        return self.elapsed

    def command(self, group: WorkerGroup, fn: Command, **kwargs) -> Callable[[], None]:
        def run():
            replies = group.call(fn, **kwargs)
            times = [r.seconds for r in replies if r is not None]
            if not times:
                raise RuntimeError(f"command {fn.__name__!r}: no rank returned a timed reply")
            self.elapsed += max(times)
            self.replies.append(replies)
        return run

    def last(self, n: int) -> list[list[Any]]:
        """The replies of the last `n` commands (the timed rounds' when n = rounds x iterations)."""
        return self.replies[-n:]


def measure_on_ranks(bench, group: WorkerGroup, fn: Command, *, problem: str, config: dict, round: str,
                     warmup: int, rounds: int, kernel: bool = False, tokens: int | None = None,
                     details: dict | None = None, **kwargs):
    """A benchmark row whose round is command `fn` on every rank, timed by the slowest rank's own
    clock (`kwargs` go to the command). Returns (row, the timed rounds' replies: one list of
    per-rank replies per command; empty when the row did not measure)."""
    clock = SlowestRankClock()
    row = bench.measure(problem=problem, config=config, fn=clock.command(group, fn, **kwargs), round=round,
                        warmup=warmup, rounds=rounds, kernel=kernel, tokens=tokens, details=details, clock=clock)
    timed = clock.last(row.timing.rounds * row.timing.iterations) if row.timing else []
    return row, timed


class Workers:
    """A perf file's worker group (a module fixture): started by the first row that needs it (a
    file whose rows all cannot run starts no processes), one group at a time (a new one when a row
    needs another world size or backend, or a rank died), and the file's time budget, counted from
    its first row."""

    def __init__(self, budget_s: float, command_timeout_s: float):
        self.command_timeout_s = command_timeout_s
        self.budget = Budget(budget_s)
        self.group: WorkerGroup | None = None

    def get(self, world_size: int, backend: str) -> WorkerGroup:
        g = self.group
        if g is None or g.dead or (g.world_size, g.backend) != (world_size, backend):
            self.close()
            self.group = WorkerGroup(world_size, backend, command_timeout_s=self.command_timeout_s)
        return self.group

    def skip(self, bench, *, problem: str, config: dict, world_size: int, backend: str) -> bool:
        """Records a not-run row and returns True when this row cannot run here: NEEDS_HARDWARE
        with fewer GPUs than NCCL ranks, LEFT_OUT_BY_BUDGET once the file's budget is spent."""
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if backend == "nccl" and gpus < world_size:
            status = Status.NEEDS_HARDWARE
            reason = f"NCCL needs one GPU per rank: {world_size} ranks, {gpus} GPU(s) here"
        elif self.budget.exhausted():
            status, reason = Status.LEFT_OUT_BY_BUDGET, self.budget.reason()
        else:
            return False
        bench.not_run(problem=problem, config=config, status=status, reason=reason)
        return True

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        self.group = None


__all__ = ["RankError", "SlowestRankClock", "WorkerGroup", "Workers", "measure_on_ranks", "noop", "serve"]
