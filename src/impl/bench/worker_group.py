"""A persistent group of worker processes that the test process (the parent) commands, for the
distributed benchmarks, and the clock that times them.

Why a persistent group: pytest-benchmark, the suite's one timer, runs in the parent, and process
start-up costs seconds; the ranks start once per perf file (or per world size) and keep their
models between commands.

A command is a module-level function `fn(state, **kwargs)` (the worker commands of
impl.workloads: dist_steps, fsdp_steps, ...): the parent sends the function itself (pickled by its
qualified name, so a worker imports its module on first use) and every rank runs it on its own
state, a `RankState` or the subclass the group was made with (`state_type`, a workload's: its
model, wrapper, optimizer). Nothing is registered anywhere.

Timing: a timed command returns, on every rank that worked, a `Timed` reply (or a subclass) with
`seconds`, the rank's own device-synchronised time of the work (`timed`). `SlowestRankClock` is the
benchmark's timer: it advances by the slowest rank's seconds of each command, so the benchmark's
stats are the slowest rank's time, without the parent's IPC round trip.

Processes start through impl.distributed.launcher.spawn_ranks, so error semantics follow `launch`: a rank that raises, dies silently or does not answer
within the command's timeout fails the call in the parent (RankError / TimeoutError naming the rank
and, on its first line, the rank's error) and every rank is killed first, so a broken run never
hangs; `Workers.get` starts a new group for the next row.
"""
from __future__ import annotations

import queue as queue_mod
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from impl.bench.harness import Budget
from impl.bench.row import Status
from impl.bench.timers import make_timer
from impl.distributed.launcher import SPAWN, device_for, host_store, spawn_ranks, stop_ranks

Command = Callable[..., Any]  # fn(state: RankState, **kwargs), module-level


@dataclass
class RankState:
    """What a rank keeps between commands; workloads subclass it with what their commands build."""

    rank: int
    world_size: int
    backend: str
    device: torch.device
    clocks: dict = field(default_factory=dict)

    def clock(self, kernel: bool):
        """The rank's clock (impl.bench.timers.make_timer on its device), one per kind."""
        if kernel not in self.clocks:
            self.clocks[kernel] = make_timer(self.device, kernel)
        return self.clocks[kernel]


@dataclass
class Timed:
    seconds: float  # this rank's device-synchronised time of the command's timed work


def timed(state: RankState, fn: Callable[[], Any], kernel: bool) -> float:
    """Seconds of `fn()` on the rank's own clock: what a command puts in its `Timed` reply."""
    clock = state.clock(kernel)
    start = clock()
    fn()
    return clock() - start


class RankError(RuntimeError):
    """A rank raised: the first line names the rank and its error's last line (an OOM reads as one,
    impl.runtime.is_oom), the rest is the rank's traceback."""


def noop(state: RankState) -> None:
    return None


def serve(rank: int, world_size: int, state_type: type[RankState], commands, replies) -> str:
    """Body of every rank: run commands until None. An exception ends the process and reaches the
    parent, with its traceback, as the rank's report (impl.distributed.launcher.spawn_ranks)."""
    backend = dist.get_backend()
    if backend == "gloo":
        torch.set_num_threads(1)  # ranks share a small CPU host; intra-op threads would fight
    state = state_type(rank=rank, world_size=world_size, backend=backend, device=device_for(backend, rank))
    while True:
        msg = commands.get()
        if msg is None:
            return "closed"
        fn, kwargs = msg
        replies.put((rank, True, fn(state, **kwargs)))


class WorkerGroup:
    """`world_size` processes in one process group, each serving commands on its `state_type`
    until closed."""

    def __init__(self, world_size: int, backend: str, state_type: type[RankState] = RankState,
                 start_timeout_s: float = 180.0, command_timeout_s: float = 300.0):
        self.world_size, self.backend = world_size, backend
        self.command_timeout_s = command_timeout_s
        # One queue carries both command replies and each rank's final report (an exception's
        # traceback included), so a failing rank is seen wherever the parent is waiting.
        self.replies = SPAWN.Queue()
        self.commands = [SPAWN.Queue() for _ in range(world_size)]
        # The process group's own timeout bounds a collective whose peer is gone; the parent's
        # command timeout bounds everything else.
        self.store = host_store(command_timeout_s)  # held until close(): the ranks' rendezvous
        self.procs = spawn_ranks(serve, world_size, backend, command_timeout_s,
                                 rank_args=[(state_type, q, self.replies) for q in self.commands],
                                 reporters=[self.replies] * world_size, store_port=self.store.port)
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
        stop_ranks(self.procs)

    def close(self) -> None:
        if self.dead:
            return
        for q in self.commands:
            q.put(None)
        try:
            self._gather("close", 60.0)  # each rank's final report: (rank, True, "closed")
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
                     flops: float | None = None, metrics: dict | None = None, details: dict | None = None, **kwargs):
    """A benchmark row whose round is command `fn` on every rank, timed by the slowest rank's own
    clock (`kwargs` go to the command). `flops`: one rank's share of a round (MFU is per GPU).
    Returns (row, the timed rounds' replies: one list of per-rank replies per command; empty when
    the row did not measure)."""
    clock = SlowestRankClock()
    row = bench.measure(problem=problem, config=config, fn=clock.command(group, fn, **kwargs), round=round,
                        warmup=warmup, rounds=rounds, kernel=kernel, tokens=tokens, flops=flops, metrics=metrics,
                        details=details, clock=clock)
    timed = clock.last(row.timing.rounds * row.timing.iterations) if row.timing else []
    return row, timed


class Workers:
    """A perf file's worker group (a module fixture): started by the first row that needs it (a
    file whose rows all cannot run starts no processes), one group at a time (a new one when a row
    needs another world size or backend, or a rank died), and the file's time budget, counted from
    its first row."""

    def __init__(self, budget_s: float, command_timeout_s: float, state_type: type[RankState] = RankState):
        self.command_timeout_s = command_timeout_s
        self.state_type = state_type
        self.budget = Budget(budget_s)
        self.group: WorkerGroup | None = None

    def get(self, world_size: int, backend: str) -> WorkerGroup:
        g = self.group
        if g is None or g.dead or (g.world_size, g.backend) != (world_size, backend):
            self.close()
            self.group = WorkerGroup(world_size, backend, self.state_type, command_timeout_s=self.command_timeout_s)
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


__all__ = ["RankError", "RankState", "SlowestRankClock", "Timed", "WorkerGroup", "Workers", "measure_on_ranks", "noop",
           "serve", "timed"]
