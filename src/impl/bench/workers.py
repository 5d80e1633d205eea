"""Benchmark driver for the distributed perf files: a persistent worker group that the test
process (the parent) commands, and the worker-side commands (all-reduce loop, DDP training step,
sharded-optimizer step with memory accounting, profiler trace).

Why a persistent group driven by the parent: pytest-benchmark is the suite's one timer, and it
runs in the parent. The parent's timed function sends one command to every rank and returns when
every rank has replied, so the clock sees the slowest rank's step plus a small IPC round trip
(measured with the no-op command, `WorkerGroup.ping`, and recorded beside each row). Processes
start once per perf module (seconds each), and a model is built once per worker.

Error semantics follow `launcher.launch`: a rank that raises, dies silently or does not answer
within the command's timeout fails the call in the parent (RuntimeError / TimeoutError naming the
rank) and every rank is killed first, so a broken run never hangs.

Worker commands are plain functions `cmd(state, **kwargs)` in COMMANDS; `state` is a per-process
dict (rank, world size, device, model, wrapper, optimizer, ...).
"""
from __future__ import annotations

import gc
import queue as queue_mod
import re
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from impl.distributed.launcher import _free_port, _kill_all, _rank_entry, _validate, device_for

# ---------------------------------------------------------------------------------------------
# Parent side


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
        self.call("noop", timeout_s=start_timeout_s)  # returns once every rank joined the group

    def call(self, name: str, timeout_s: float | None = None, **kwargs) -> list[Any]:
        """Run command `name` on every rank; the ranks' return values, ordered by rank."""
        if self.dead:
            raise RuntimeError("worker group is closed or failed earlier")
        for q in self.commands:
            q.put((name, kwargs))
        return self._gather(name, timeout_s or self.command_timeout_s)

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
                    raise RuntimeError(f"rank {rank} of {self.world_size} failed in {name!r}:\n{payload}")
                out[rank] = payload
        except BaseException:
            self.kill()
            raise
        return [out[r] for r in range(self.world_size)]

    def ping(self, n: int = 20) -> float:
        """Median seconds of a no-op command round trip to all ranks: the IPC part of every
        parent-timed step."""
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            self.call("noop")
            times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

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


# ---------------------------------------------------------------------------------------------
# Worker side


def serve(rank: int, world_size: int, commands, replies) -> str:
    """Body of every rank: run commands until None. An exception ends the process and reaches
    the parent through _rank_entry with its traceback."""
    backend = dist.get_backend()
    if backend == "gloo":
        torch.set_num_threads(1)  # ranks share a small CPU host; intra-op threads would fight
    state = dict(rank=rank, world_size=world_size, backend=backend, device=device_for(backend, rank))
    while True:
        msg = commands.get()
        if msg is None:
            return "closed"
        name, kwargs = msg
        replies.put((rank, True, COMMANDS[name](state, **kwargs)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sync_compute(device: torch.device) -> None:
    """Wait for the compute stream only: NCCL work launched asynchronously runs on its own
    streams and keeps running, so an overlapped all-reduce is not counted as compute."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _drop_grad_hooks(model: torch.nn.Module) -> None:
    """Remove every post-accumulate-grad hook left on the parameters before a configuration is
    dropped, so the next wrapper of the same parameters starts clean. Our DDPs hold themselves
    only weakly in their hooks (a strong bound method made a cycle through the autograd engine's
    C++ side that gc cannot traverse, which leaked a model per configuration); this also covers
    hooks that other wrappers leave behind."""
    for p in model.parameters():
        hooks = getattr(p, "_post_accumulate_grad_hooks", None)
        if hooks:
            hooks.clear()


def _free(state: dict, *keys: str) -> None:
    if state.get("model") is not None and ({"model", "wrapper", "optimizer"} & set(keys)):
        _drop_grad_hooks(state["model"])
    for k in keys:
        state.pop(k, None)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def cmd_noop(state: dict) -> None:
    return None


def cmd_env(state: dict) -> dict:
    from impl.runtime import env_info

    return env_info(state["device"])


def cmd_allreduce(state: dict, nbytes: int, inner: int) -> float:
    """`inner` back-to-back all-reduces of float32 ones, ranks lined up by a barrier first;
    returns this rank's seconds (device synchronised)."""
    numel = max(1, nbytes // 4)
    x = state.get("ar_buf")
    if x is None or x.numel() != numel:
        state.pop("ar_buf", None)
        x = state["ar_buf"] = torch.ones(numel, dtype=torch.float32, device=state["device"])
    dist.barrier()
    _sync(state["device"])
    t0 = time.perf_counter()
    for _ in range(inner):
        dist.all_reduce(x)
    _sync(state["device"])
    return time.perf_counter() - t0


# ---- model, batch, DDP wrappers -------------------------------------------------------------


def _model(state: dict, size: str, max_context: int):
    """One model per worker, built with the largest context so every context reuses it."""
    from impl.bench.steps import build_model

    key = (size, max_context)
    if state.get("model_key") != key:
        _free(state, "model", "wrapper", "optimizer")
        state["model"] = build_model(size, max_context, state["device"], seed=0)
        state["model_key"] = key
    return state["model"]


def _fresh_parameters(model: torch.nn.Module) -> None:
    """Replace every Parameter object by a new one over the same storage: the previous wrapper's
    post-accumulate-grad hooks (our DDPs) live on the old objects and must not fire for the next
    wrapper. Tied parameters stay tied (memo by identity)."""
    memo: dict[int, torch.nn.Parameter] = {}
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                memo[id(p)] = torch.nn.Parameter(p.detach(), requires_grad=p.requires_grad)
            m._parameters[name] = memo[id(p)]


def _batch(state: dict, batch: int, context: int):
    from impl.bench.steps import random_batch

    # Each rank draws its own micro-batch, as in data-parallel training.
    return random_batch(state["model"], batch, context, state["device"], seed=1000 + state["rank"])


def _wrap(model, variant: str, bucket_mb: float | None):
    from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive

    if variant == "single":
        return None
    if variant == "naive":
        return DDPNaive(model)
    if variant == "flat":
        return DDPFlat(model)
    if variant == "individual":
        return DDPIndividualParameters(model)
    if variant == "bucketed":
        return DDPBucketed(model, bucket_size_mb=bucket_mb)
    if variant == "torch_ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [model_device(model).index] if model_device(model).type == "cuda" else None
        kw = {} if bucket_mb is None else dict(bucket_cap_mb=bucket_mb)
        return DistributedDataParallel(model, device_ids=device_ids, **kw)
    raise ValueError(f"unknown DDP variant {variant!r}")


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def cmd_ddp_setup(state: dict, size: str, max_context: int, context: int, batch: int, variant: str,
                  bucket_mb: float | None = None, lr: float = 1e-4) -> dict:
    """Wrap the worker's model in `variant` with a fresh AdamW (impl.model). "single" (the
    single-GPU floor) runs on rank 0 only, without a wrapper; the other ranks idle."""
    from impl.model import AdamW

    _free(state, "wrapper", "optimizer", "x", "y")
    model = _model(state, size, max_context)
    model.zero_grad(set_to_none=True)
    _fresh_parameters(model)
    state["variant"] = variant
    state["active"] = variant != "single" or state["rank"] == 0
    state["wrapper"] = _wrap(model, variant, bucket_mb)
    state["optimizer"] = AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    state["x"], state["y"] = _batch(state, batch, context)
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return dict(grad_bytes=grad_bytes, n_params=sum(p.numel() for p in model.parameters()),
                num_buckets=len(getattr(state["wrapper"], "buckets", []) or []))


def _ddp_step(state: dict) -> dict:
    from impl.model import cross_entropy
    from torch.profiler import record_function

    dev, model, wrapper, opt = state["device"], state["model"], state["wrapper"], state["optimizer"]
    fwd = wrapper if wrapper is not None else model
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    with record_function("forward"):
        loss = cross_entropy(fwd(state["x"]), state["y"])
    with record_function("backward"):
        loss.backward()
        _sync_compute(dev)
    t_bwd = time.perf_counter()
    comm_s, nbytes = None, None
    if hasattr(wrapper, "finish_gradient_synchronization"):
        with record_function("finish_gradient_synchronization"):
            wrapper.finish_gradient_synchronization()
        comm_s, nbytes = wrapper.comm_time_s, wrapper.bytes_communicated_last_step
    with record_function("optimizer step"):
        opt.step()
        _sync(dev)
    t_end = time.perf_counter()
    return dict(step_s=t_end - t0, fwd_bwd_s=t_bwd - t0, comm_s=comm_s, bytes=nbytes)


def cmd_ddp_step(state: dict) -> dict | None:
    if not state["active"]:
        return None
    return _ddp_step(state)


# ---- profiler timeline ----------------------------------------------------------------------

_COMM = re.compile(r"nccl|gloo|c10d|all_?reduce|broadcast|all_?gather|reduce_?scatter", re.IGNORECASE)


def _merge(intervals: list[tuple[float, float]], gap: float) -> list[list[float]]:
    """Union of (start, end) intervals, joining neighbours closer than `gap`."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def _busy(iv: list[list[float]]) -> float:
    return sum(e - s for s, e in iv)


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


PHASES = ("forward", "backward", "finish_gradient_synchronization", "optimizer step")


def build_timeline(ops, phases, start_us: float, max_intervals: int, source: str) -> dict:
    """Lanes of one profiled step from `ops` = [(lane, start_us, end_us)] and the annotated
    `phases` = [(name, start_us, end_us)], both on the profiler's clock, from `start_us` on.

    Each lane is merged (gaps below span / max_intervals joined) so the JSON stays small; busy
    and overlap totals are computed before that coarsening."""
    lanes: dict[str, list] = {"compute": [], "communication": []}
    for lane, s, e in ops:
        if s >= start_us:
            lanes[lane].append((s, e))
    exact = {k: _merge(v, 0.0) for k, v in lanes.items()}
    end = max([iv[-1][1] for iv in exact.values() if iv] + [start_us])
    span = end - start_us
    out = dict(span_us=span, busy_us={k: _busy(v) for k, v in exact.items()},
               overlap_us=_overlap(exact["compute"], exact["communication"]), source=source, lanes={},
               phases=[dict(name=n, start_us=s - start_us, dur_us=e - s) for n, s, e in phases if s >= start_us])
    for k, iv in exact.items():
        gap, coarse = 0.0, iv
        while len(coarse) > max_intervals:
            gap = max(gap * 2, span / max_intervals)
            coarse = _merge([tuple(x) for x in iv], gap)
        out["lanes"][k] = [[round(s - start_us, 1), round(e - s, 1)] for s, e in coarse]
    return out


def _cuda_timeline(prof, last_step: str, max_intervals: int) -> dict:
    """GPU: every kernel from the profiler's Chrome trace (kernel events carry start and
    duration there; NCCL kernels on the "communication" lane, all others on "compute"); every
    step ends in a device sync, so kernels starting after the last step's CPU start belong to it."""
    import json
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    finally:
        os.remove(path)
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    ann = [(e["name"], float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in spans
           if e.get("cat") == "user_annotation"]
    start = max(s for n, s, _ in ann if n == last_step)
    ops = [("communication" if "nccl" in e["name"].lower() else "compute", float(e["ts"]), float(e["ts"]) + float(e["dur"]))
           for e in spans if e.get("cat") == "kernel"]
    return build_timeline(ops, [a for a in ann if a[0] in PHASES], start, max_intervals, "cuda kernels")


def _cpu_timeline(prof, last_step: str, max_intervals: int) -> dict:
    """CPU (gloo smoke runs): no kernels exist, so top-level aten ops stand in for compute and
    c10d / gloo ops for communication."""
    events = prof.events()
    start = max(e.time_range.start for e in events if e.name == last_step)
    ops, phases = [], []
    for e in events:
        s, t = e.time_range.start, e.time_range.end
        if e.name in PHASES:
            phases.append((e.name, s, t))
        elif _COMM.search(e.name):
            ops.append(("communication", s, t))
        elif e.name.startswith("aten::") and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")):
            ops.append(("compute", s, t))
    return build_timeline(ops, phases, start, max_intervals, "cpu ops (no kernels on this device)")


def cmd_ddp_trace(state: dict, warmup: int, steps: int, max_intervals: int) -> dict | None:
    """Profile `steps` steps on rank 0 (the other ranks run the same steps unprofiled) and return
    the timeline of the last one."""
    from torch.profiler import ProfilerActivity, profile, record_function

    for _ in range(warmup):
        cmd_ddp_step(state)
    if state["rank"] != 0:
        for _ in range(steps):
            cmd_ddp_step(state)
        return None
    cuda = state["device"].type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(steps):
            with record_function(f"ddp step {i}"):
                last = _ddp_step(state)
    name = f"ddp step {steps - 1}"
    tl = _cuda_timeline(prof, name, max_intervals) if cuda else _cpu_timeline(prof, name, max_intervals)
    return dict(tl, step=last)


def cmd_teardown(state: dict) -> None:
    if "model" in state:
        state["model"].zero_grad(set_to_none=True)
    _free(state, "wrapper", "optimizer", "x", "y")


# ---- optimizer-state sharding: memory breakdown ---------------------------------------------


def _unique_bytes(tensors) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        st = t.untyped_storage()
        if st.data_ptr() not in seen:
            seen.add(st.data_ptr())
            total += st.nbytes()
    return total


def _inner_optimizer(opt):
    """The optimizer that holds this rank's state: ours keep it in `local_optimizer`, torch's
    ZeroRedundancyOptimizer in `optim`."""
    return getattr(opt, "local_optimizer", None) or getattr(opt, "optim", None) or opt


def _state_tensors(opt) -> list[torch.Tensor]:
    inner = _inner_optimizer(opt)
    return [v for s in inner.state.values() for v in s.values() if torch.is_tensor(v)]


def _buffer_tensors(wrapper, opt, counted: set) -> list[torch.Tensor]:
    """Communication / staging buffers the wrappers own (DDP buckets; ZeRO-1's flat buffers)
    whose storage is not already counted as parameters or gradients (`counted`: storage
    pointers). ZeRO-1's params and grads are views of its flat buffers, so its flat gradient
    shows here only while no param has a grad (before the first backward)."""
    out = [b.buffer for b in getattr(wrapper, "buckets", []) or []]
    if hasattr(opt, "flat_buffers"):
        out += opt.flat_buffers()
    return [t for t in out if t.untyped_storage().data_ptr() not in counted]


def _named_bytes(state: dict) -> dict:
    model, opt, wrapper = state["model"], state["optimizer"], state["wrapper"]
    params = list(model.parameters())
    grads = [p.grad for p in params]
    counted = {t.untyped_storage().data_ptr() for t in params + grads if t is not None}
    return dict(parameters=_unique_bytes(params), gradients=_unique_bytes(grads),
                optimizer_state=_unique_bytes(_state_tensors(opt)),
                buffers=_unique_bytes(_buffer_tensors(wrapper, opt, counted)))


def _mem(device) -> tuple[int | None, int | None]:
    if device.type != "cuda":
        return None, None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device)


def _reset_peak(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _make_sharding(model, variant: str, lr: float):
    from impl.distributed.ddp import DDPIndividualParameters, DDPNaive
    from impl.distributed.sharded_optimizer import ShardedOptimizer, ZeRO1Optimizer
    from impl.model import AdamW

    kw = dict(lr=lr, weight_decay=0.01)
    if variant == "none":
        return DDPIndividualParameters(model), AdamW(model.parameters(), **kw)
    if variant == "sharded":
        return DDPIndividualParameters(model), ShardedOptimizer(model.parameters(), AdamW, **kw)
    if variant == "zero1":
        # ZeRO-1 reduce-scatters the raw local grads itself: the wrapper only broadcasts at init.
        return DDPNaive(model, reduce_gradients=False), ZeRO1Optimizer(model.parameters(), AdamW, **kw)
    if variant == "torch_zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return DDPIndividualParameters(model), ZeroRedundancyOptimizer(
            model.parameters(), optimizer_class=torch.optim.AdamW, **kw)
    raise ValueError(f"unknown sharding variant {variant!r}")


def cmd_shard_setup(state: dict, size: str, context: int, batch: int, variant: str, lr: float = 1e-4) -> dict:
    """A fresh model per config (ZeRO-1 re-points parameters into its flat buffer, so a model is
    not reusable across configs); memory measured from an emptied allocator."""
    from impl.bench.steps import build_model

    _free(state, "model", "model_key", "wrapper", "optimizer", "x", "y")
    dev = state["device"]
    _reset_peak(dev)
    base, _ = _mem(dev)
    state["model"] = build_model(size, context, dev, seed=0)
    state["wrapper"], state["optimizer"] = _make_sharding(state["model"], variant, lr)
    state["x"], state["y"] = _batch(state, batch, context)
    state["variant"], state["active"] = variant, True
    alloc, peak = _mem(dev)
    return dict(base_allocated=base, init_allocated=alloc, init_peak=peak, named_init=_named_bytes(state),
                n_params=sum(p.numel() for p in state["model"].parameters()),
                num_param_tensors=len(list(state["model"].parameters())))


def cmd_shard_step(state: dict) -> dict:
    """One training step with the memory read directly before and directly after the optimizer
    step: peak of forward+backward+sync (reset at the step's start) and allocated right before
    the step; peak during the step and allocated right after it."""
    from impl.model import cross_entropy

    dev, wrapper, opt = state["device"], state["wrapper"], state["optimizer"]
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    _reset_peak(dev)
    loss = cross_entropy(wrapper(state["x"]), state["y"])
    loss.backward()
    _sync_compute(dev)
    t_bwd = time.perf_counter()
    wrapper.finish_gradient_synchronization()
    comm_s = wrapper.comm_time_s
    before_alloc, before_peak = _mem(dev)
    named_before = _named_bytes(state)
    _reset_peak(dev)
    t_opt = time.perf_counter()
    opt.step()
    _sync(dev)
    t_end = time.perf_counter()
    after_alloc, after_peak = _mem(dev)
    return dict(step_s=t_end - t0, fwd_bwd_s=t_bwd - t0, comm_s=comm_s, opt_s=t_end - t_opt,
                ddp_bytes=wrapper.bytes_communicated_last_step,
                opt_bytes=getattr(opt, "bytes_communicated_last_step", None),
                before_allocated=before_alloc, before_peak=before_peak, after_allocated=after_alloc,
                after_peak=after_peak, named_before=named_before, named_after=_named_bytes(state))


def cmd_shard_owned(state: dict) -> dict:
    """Elements of the parameters whose optimizer state this rank holds (for the balance check)."""
    opt = state["optimizer"]
    if hasattr(opt, "owned_params"):
        return dict(owned_numel=sum(p.numel() for p in opt.owned_params()),
                    largest_numel=max(p.numel() for p in state["model"].parameters()))
    return {}


COMMANDS = {
    "noop": cmd_noop,
    "env": cmd_env,
    "allreduce": cmd_allreduce,
    "ddp_setup": cmd_ddp_setup,
    "ddp_step": cmd_ddp_step,
    "ddp_trace": cmd_ddp_trace,
    "teardown": cmd_teardown,
    "shard_setup": cmd_shard_setup,
    "shard_step": cmd_shard_step,
    "shard_owned": cmd_shard_owned,
}


# ---------------------------------------------------------------------------------------------
# Parent-side helpers shared by the perf files


def timed_command(group: WorkerGroup, name: str, log: list, **kwargs):
    """A zero-argument function for run_benchmark: one command on all ranks, replies appended to
    `log` (warm-up calls included; the caller keeps the last `rounds`)."""
    def fn():
        log.append(group.call(name, **kwargs))
    return fn


def slowest(replies: list[dict | None], key: str) -> float | None:
    vals = [r[key] for r in replies if r is not None and r.get(key) is not None]
    return max(vals) if vals else None


def mean(xs) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


class LazyWorkerGroup:
    """A perf file's worker group, started by the first test that needs it (so a file whose rows
    are all not-run starts no processes) and restarted if a rank died; `budget` is the file's
    time budget, counted from its first test."""

    def __init__(self, world_size: int, backend: str, budget_s: float, command_timeout_s: float):
        from impl.bench.attention import Budget

        self.world_size, self.backend, self.command_timeout_s = world_size, backend, command_timeout_s
        self.group, self.ipc, self.env = None, None, None
        self.budget = Budget(budget_s)

    def get(self) -> "WorkerGroup":
        if self.group is None or self.group.dead:
            self.group = WorkerGroup(self.world_size, self.backend, command_timeout_s=self.command_timeout_s)
            self.ipc = self.group.ping()
            self.env = self.group.call("env")[0]
        return self.group

    def skip(self, benchmark, *, problem: str, config: dict, device: torch.device) -> bool:
        """Records a not-run row and returns True when this row cannot run here: "unsupported" with
        fewer GPUs than NCCL ranks, "left_out" once the file's time budget is spent."""
        from impl.bench.attention import record_not_run

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if self.backend == "nccl" and gpus < self.world_size:
            kind, reason = "unsupported", f"needs {self.world_size} GPUs for NCCL, this machine has {gpus}"
        elif self.budget.exhausted():
            kind, reason = "left_out", self.budget.reason()
        else:
            return False
        record_not_run(benchmark, problem=problem, config=config, device=device, kind=kind, reason=reason)
        return True

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
