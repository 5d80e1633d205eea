"""Worker functions and toy models for the distributed correctness tests.

``spawn`` pickles a worker by its qualified name (``kits.distributed.fn``); the
child imports it from correctness/, which the root conftest.py puts on ``sys.path``
and spawn passes on to the child.

Every equivalence worker follows the same recipe: rank r builds its model
from a rank-dependent seed (so the DDP broadcast matters), the reference model
is built from rank 0's seed and trained single-process on the full batch, and
the distributed copy trains on this rank's contiguous slice of the same batch.
Workers return plain dicts of max parameter differences; the tests assert.
"""

from __future__ import annotations

import atexit
import io
import os
import re
import sys
import time
import weakref

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from impl.distributed.collectives import allreduce_benchmark
from impl.distributed.ddp import DDPBucketed, DDPFlat, DDPIndividualParameters, DDPNaive, DDPReduceToOwner
from impl.distributed.fsdp import FSDP
from impl.distributed.launcher import device_for, launch
from impl.distributed.release import released
from impl.distributed.sharded_optimizer import ShardedOptimizer, ZeRO1Optimizer

PER_RANK_BATCH = 4
VOCAB, SEQ = 11, 3


# ---------------------------------------------------------------- launcher --

def report_rank(rank, world_size, payload):
    t = torch.tensor([float(rank)], device=_device(rank))
    before = t._use_count()
    released(dist.all_reduce, t)
    return {
        "held_after": t._use_count() - before,  # references gloo's worker still holds
        "rank": rank,
        "world_size": world_size,
        "payload": payload,
        "rank_sum": t.item(),
        "backend": dist.get_backend(),
        "bench": allreduce_benchmark(rank, world_size, [64, 4096], 1, 3, _device(rank).type),
    }


def fail_on_rank(rank, world_size, bad_rank):
    if rank == bad_rank:
        raise ValueError(f"deliberate failure on rank {rank}")
    dist.barrier()  # the healthy ranks block here until the parent kills them
    return rank


def hang_on_rank(rank, world_size, bad_rank):
    if rank == bad_rank:
        time.sleep(3600)
    return rank


def exit_on_rank(rank, world_size, bad_rank, code):
    """`bad_rank` dies without a word; its peer then fails in the barrier (connection reset)."""
    if rank == bad_rank:
        os._exit(code)
    dist.barrier()
    return rank


def die_at_exit_on_rank(rank, world_size, bad_rank, how):
    """`bad_rank` reports its result, then dies at interpreter exit (like an abort in a C++
    destructor): by exit code 3 or by SIGABRT."""
    if rank == bad_rank and how == "code":
        atexit.register(os._exit, 3)
    elif rank == bad_rank:
        atexit.register(os.abort)
    return rank


def die_at_exit_saying(rank, world_size, bad_rank, words):
    """`bad_rank` reports its result, then writes `words` to its stderr and exits with code 3 at
    interpreter exit (what a failing teardown in a C++ library leaves behind)."""
    if rank == bad_rank:
        atexit.register(os._exit, 3)
        atexit.register(lambda: (sys.stderr.write(f"{words}\n"), sys.stderr.flush()))
    return rank


def process_has_exited(pid: int) -> bool:
    """Whether process `pid` has ended: gone, or a zombie its parent has not reaped yet (Linux's
    /proc; the launcher reaps a rank only once it sees the exit)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]  # the field after "(comm)"
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def store_outlives_rank0(rank, world_size, exit_wait_s=50.0):
    """Rank 0 returns (and exits); the others wait until its process has ended, then use the
    group's store, as a teardown or a watchdog may. Returns what the store then reads back.
    (It waited a fixed 2 s before: slower than needed on gloo, and on NCCL, whose teardown can
    take longer, not proof that rank 0 had gone.)
    Every rank destroys the group before rank 0 leaves: NCCL's communicator destruction is
    collective, so a rank 0 left to the launcher's destroy_process_group waits for its peer, which
    waits for rank 0's exit (2xH200, a4ea09d: rank 1 timed out at 50 s). The store object stays ours."""
    store = dist.distributed_c10d._get_default_store()
    if rank == 0:
        store.set("rank0_pid", str(os.getpid()))
    pid = int(store.get("rank0_pid"))
    dist.destroy_process_group()
    if rank == 0:
        return "left"
    deadline = time.monotonic() + exit_wait_s
    while not process_has_exited(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 (pid {pid}) still running {exit_wait_s:.0f} s after it returned")
        time.sleep(0.02)
    store.set(f"after_rank0_{rank}", "ok")
    return store.get(f"after_rank0_{rank}").decode()


class Outcome:
    """One launch's end: its results (`value`) or what it raised (`error`), and its seconds."""

    def __init__(self, value=None, error: BaseException | None = None, seconds: float = 0.0):
        self.value, self.error, self.seconds = value, error, seconds

    def raised(self, kind: type) -> str:
        """The message of the `kind` it raised; AssertionError naming what happened instead."""
        assert isinstance(self.error, kind), f"expected {kind.__name__}, got {self!r}"
        return str(self.error)

    def __repr__(self) -> str:
        what = f"raised {self.error!r}" if self.error is not None else f"returned {self.value!r}"
        return f"<launch {what} after {self.seconds:.1f} s>"


def launch_at_once(launches: dict, world_size: int = 2, backend: str | None = None) -> dict[str, Outcome]:
    """Each `name: (fn, args, timeout_s)` launched at the same time, each a process group of its
    own (its store, ranks and exit), as launch() would one after another; their outcomes by name.
    A launch is mostly process start-up (on NCCL ~10 s: interpreters, CUDA, the communicator), which
    a host with cores to spare does for several at once in about one's time."""
    from concurrent.futures import ThreadPoolExecutor

    def one(item):
        fn, args, timeout_s = item
        t = time.monotonic()
        try:
            return Outcome(launch(fn, world_size, backend=backend, args=args, timeout_s=timeout_s),
                           seconds=time.monotonic() - t)
        except Exception as exc:  # noqa: BLE001 - each test judges its own launch's error
            return Outcome(error=exc, seconds=time.monotonic() - t)

    with ThreadPoolExecutor(len(launches)) as pool:
        return dict(zip(launches, pool.map(one, launches.values())))


def ddp_train_and_exit(rank, world_size, variant):
    """The harness of issue 23: a few steps of an overlapped DDP wrapper on the tied and the MLP
    model, then return (the launcher destroys the group and the process exits)."""
    device = _device(rank)
    for kind in ("tied", "mlp"):
        model = make_model(kind, rank, device)
        ddp = DDPIndividualParameters(model) if variant == "individual" else DDPBucketed(model, bucket_size_mb=1e-9)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        for step in range(4):
            batch = make_batch(kind, step, PER_RANK_BATCH * world_size, device)
            opt.zero_grad()
            ddp.module.loss(local_slice(batch, rank, world_size)).backward()
            ddp.finish_gradient_synchronization()
            opt.step()
    return rank


class _GainedMLP(nn.Module):
    """The 8B step's parameter pattern in small: bf16 Linear weights with an fp32 norm-like gain
    before each, so the dtypes alternate in parameter order."""

    def __init__(self, layers: int = 3, width: int = 8):
        super().__init__()
        self.gains = nn.ParameterList([nn.Parameter(1 + 0.1 * torch.randn(width)) for _ in range(layers)])
        self.linears = nn.ModuleList([nn.Linear(width, width, bias=False) for _ in range(layers)])
        for lin in self.linears:
            lin.weight.data = lin.weight.data.to(torch.bfloat16)

    def named_parameters(self, *args, **kwargs):  # interleaved: gain 0, weight 0, gain 1, weight 1, ...
        params = dict(super().named_parameters(*args, **kwargs))
        for i in range(len(self.linears)):
            yield f"gains.{i}", params[f"gains.{i}"]
            yield f"linears.{i}.weight", params[f"linears.{i}.weight"]

    def parameters(self, recurse=True):
        return (p for _, p in self.named_parameters())

    def forward(self, x):
        for gain, lin in zip(self.gains, self.linears):
            x = torch.tanh(F.linear((x * gain).to(torch.bfloat16), lin.weight).float())
        return x


class _CopyCount(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts aten copies (copy_, and the clone a reshape may make) dispatched while active."""

    def __init__(self):
        super().__init__()
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.copy_.default, torch.ops.aten.clone.default):
            self.copies += 1
        return func(*args, **(kwargs or {}))


def ddp_bucketed_mixed_dtypes(rank, world_size, steps):
    """DDPBucketed (a cap of two weights) on _GainedMLP against DDPNaive on the same model and batches:
    per step, whether every grad is bitwise the naive one; the buckets' dtypes and sizes; whether each
    grad is its bucket's view after the sync; the copies finish made and its seconds; and, with zero_grad
    keeping the grads (set_to_none=False), the copies the hooks made."""
    torch.manual_seed(0)
    device = _device(rank)
    models = [_GainedMLP().to(device) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    weight_bytes = models[0].linears[0].weight.numel() * 2
    bucketed = DDPBucketed(models[0], bucket_size_mb=2 * weight_bytes / 2**20, average=False)
    naive = DDPNaive(models[1], average=False)
    out = dict(buckets=[(str(b.buffer.dtype), len(b.params)) for b in bucketed.buckets], equal=[], views=[],
               finish_copies=[], hook_copies=[], finish_s=[])
    for step in range(steps):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank)).to(device)
        keep = step > 0  # from the second step on, the grads are kept and zeroed, not dropped
        for model, ddp in ((models[0], bucketed), (models[1], naive)):
            model.zero_grad(set_to_none=not keep)
            count = _CopyCount()
            with count:
                model(x).square().sum().backward()
            if ddp is bucketed:
                out["hook_copies"].append(count.copies)
            count, start = _CopyCount(), time.perf_counter()
            with count:
                ddp.finish_gradient_synchronization()
            if ddp is bucketed:
                out["finish_copies"].append(count.copies)
                out["finish_s"].append(time.perf_counter() - start)
        out["equal"].append(all(torch.equal(a.grad, b.grad) for a, b in zip(models[0].parameters(),
                                                                            models[1].parameters())))
        out["views"].append(all(p.grad.untyped_storage().data_ptr() == bucketed._bucket_of[id(p)].buffer.data_ptr()
                                for p in models[0].parameters()))
    return out


# ------------------------------------------------------------------ models --

class MLP(nn.Module):
    def __init__(self, frozen=False, unused=False):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 16)
        self.fc3 = nn.Linear(16, 4)
        # A buffer, to check it is broadcast from rank 0 like the parameters.
        self.register_buffer("scale", torch.rand(4) + 0.5)
        if frozen:
            self.fc1.weight.requires_grad_(False)
        # Registered but never used in forward: its grad stays None.
        self.unused = nn.Parameter(torch.randn(5)) if unused else None

    def forward(self, x):
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))) * self.scale

    def loss(self, batch):
        x, y = batch
        return F.mse_loss(self(x), y)


class TiedLM(nn.Module):
    """Embedding and output head share one Parameter."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.mix = nn.Linear(8, 8)
        self.head = nn.Linear(8, VOCAB, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(torch.tanh(self.mix(self.embed(tokens))))

    def loss(self, batch):
        tokens, targets = batch
        return F.cross_entropy(self(tokens).flatten(0, 1), targets.flatten())


def make_model(kind: str, seed: int, device, unused=True) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "mlp":
        model = MLP()
    elif kind == "tied":
        model = TiedLM()
    elif kind == "frozen":
        model = MLP(frozen=True, unused=unused)
    else:
        raise ValueError(kind)
    return model.to(device)


def make_batch(kind: str, step: int, batch: int, device):
    g = torch.Generator().manual_seed(10_000 + step)
    if kind == "tied":
        data = (torch.randint(0, VOCAB, (batch, SEQ), generator=g), torch.randint(0, VOCAB, (batch, SEQ), generator=g))
    else:
        data = (torch.randn(batch, 8, generator=g), torch.randn(batch, 4, generator=g))
    return tuple(t.to(device) for t in data)


def local_slice(batch, rank, world_size):
    n = batch[0].shape[0] // world_size
    return tuple(t[rank * n : (rank + 1) * n] for t in batch)


def max_param_diff(a: nn.Module, b: nn.Module) -> float:
    return max((pa - pb).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


def _moved(init, model) -> float:
    """How far training moved the parameters: guards against a test that
    passes because nothing changed."""
    return max((p - p0).abs().max().item() for p0, p in zip(init, model.parameters()))


def _device(rank):
    # Called first by every worker: with 2 ranks on a small CPU host, intra-op
    # threads of both processes would fight over the same cores.
    backend = dist.get_backend()
    if backend == "gloo":
        torch.set_num_threads(1)
    return device_for(backend, rank)


def _seeds(rank, rep):
    # rank-dependent seed for the replica, rank 0's seed for the reference
    return 100 * rep + rank, 100 * rep


# --------------------------------------------------------------------- DDP --

OPTIMIZERS = {
    "sgd": lambda params: torch.optim.SGD(params, lr=0.1),
    "sgd_momentum": lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    "adam": lambda params: torch.optim.Adam(params, lr=1e-2),
    "adamw": lambda params: torch.optim.AdamW(params, lr=1e-2, weight_decay=0.1),
}


def _ddp_factories(model_bytes):
    # Bucket caps: smaller than any parameter (one bucket each), a third of
    # the model (a few buckets), and far larger than the model (one bucket).
    mb = model_bytes / 2**20
    return {
        "naive": DDPNaive,
        "flat": DDPFlat,
        "individual": DDPIndividualParameters,
        "bucketed_per_param": lambda m: DDPBucketed(m, bucket_size_mb=1e-9),
        "bucketed_few": lambda m: DDPBucketed(m, bucket_size_mb=mb / 3),
        "bucketed_one": lambda m: DDPBucketed(m, bucket_size_mb=1000.0),
    }


def ddp_equivalence(rank, world_size, model_kinds, opt_names, steps, reps):
    """For every (model, ddp variant, optimizer): max over reps and steps of
    the parameter difference to single-process full-batch training."""
    device = _device(rank)
    out = {}
    for kind in model_kinds:
        probe = make_model(kind, 0, device)
        model_bytes = sum(p.numel() * p.element_size() for p in probe.parameters() if p.requires_grad)
        for variant, factory in _ddp_factories(model_bytes).items():
            for opt_name in opt_names:
                worst, info = 0.0, {}
                for rep in range(reps):
                    seed, ref_seed = _seeds(rank, rep)
                    ref = make_model(kind, ref_seed, device)
                    ddp = factory(make_model(kind, seed, device))
                    worst = max(worst, max_param_diff(ref, ddp.module))
                    buffers_equal = all(torch.equal(a, b) for a, b in zip(ref.buffers(), ddp.module.buffers()))
                    init = [p.detach().clone() for p in ref.parameters()]
                    ref_opt = OPTIMIZERS[opt_name](ref.parameters())
                    opt = OPTIMIZERS[opt_name](ddp.parameters())
                    for step in range(steps):
                        batch = make_batch(kind, 1000 * rep + step, PER_RANK_BATCH * world_size, device)
                        ref_opt.zero_grad()
                        ref.loss(batch).backward()
                        ref_opt.step()

                        opt.zero_grad()
                        ddp.module.loss(local_slice(batch, rank, world_size)).backward()
                        ddp.finish_gradient_synchronization()
                        opt.step()
                        worst = max(worst, max_param_diff(ref, ddp.module))
                    info = {
                        "moved": _moved(init, ref),
                        "buffers_equal": buffers_equal,
                        "bytes": ddp.bytes_communicated_last_step,
                        "comm_time_s": ddp.comm_time_s,
                        "unused_grad_none": [n for n, p in ddp.module.named_parameters() if p.grad is None],
                        "num_buckets": len(getattr(ddp, "buckets", [])),
                        "num_trainable": len(ddp.trainable),
                    }
                out[(kind, variant, opt_name)] = {"max_diff": worst, **info}
    return out


# ------------------------------------------------------ sharded optimizers --

OPT_CLASSES = {
    "sgd_momentum": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
    "adam": (torch.optim.Adam, dict(lr=1e-2)),
    "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.1)),
}


def _split_groups(model, lr):
    """Two groups with different lrs: first half of the parameters, the rest."""
    params = list(model.parameters())
    half = len(params) // 2
    return [{"params": params[:half], "lr": lr}, {"params": params[half:], "lr": lr * 0.5}]


# Buckets of about 100 elements: the mlp's first group (400 elements) is cut into 4, splitting
# fc1.weight and fc2.weight, with two collectives in flight at a time. (Smaller buckets split
# more but cost ~1 ms of gloo per collective here.)
SMALL_BUCKET_NUMEL = 100


def _make_sharded(sharded_name, model, cls, kwargs, groups):
    if sharded_name == "zero1":
        return DDPNaive(model, reduce_gradients=False), ZeRO1Optimizer(groups, cls, **kwargs)
    if sharded_name in ("zero1_small_buckets", "zero1_all_reduce"):
        opt = ZeRO1Optimizer(groups, cls, bucket_numel=SMALL_BUCKET_NUMEL, **kwargs)
        # The path of gloo builds without reduce_scatter: all-reduce, keep this rank's part.
        opt._use_reduce_scatter = sharded_name == "zero1_small_buckets"
        return DDPNaive(model, reduce_gradients=False), opt
    return DDPFlat(model), ShardedOptimizer(groups, cls, **kwargs)


def _train_step(kind, step, world_size, rank, device, model, opt, ddp=None):
    batch = make_batch(kind, step, PER_RANK_BATCH * world_size, device)
    if ddp is not None:
        batch = local_slice(batch, rank, world_size)
    opt.zero_grad()
    model.loss(batch).backward()
    if ddp is not None:
        ddp.finish_gradient_synchronization()
    opt.step()


def sharded_equivalence(rank, world_size, sharded_names, model_kinds, opt_names, steps, add_group_at):
    """Sharded vs. plain optimizer, two layouts: two groups from the start,
    and one group with the second added after ``add_group_at`` steps."""
    device = _device(rank)
    out = {}
    for name in sharded_names:
        for kind in model_kinds:
            for opt_name in opt_names:
                cls, kwargs = OPT_CLASSES[opt_name]
                for layout in ("two_groups", "added_later"):
                    seed, ref_seed = _seeds(rank, 0)
                    # ZeRO-1 steps a trainable-but-unused param with a zero
                    # grad (documented), so leave that one out for it.
                    unused = not name.startswith("zero1")
                    ref = make_model(kind, ref_seed, device, unused=unused)
                    model = make_model(kind, seed, device, unused=unused)
                    ref_groups, groups = _split_groups(ref, kwargs["lr"]), _split_groups(model, kwargs["lr"])
                    if kind == "tied":
                        # The tied Parameter listed twice must be deduplicated.
                        groups[0]["params"] = groups[0]["params"] + [model.head.weight]
                    if layout == "added_later":
                        ref_later, later = ref_groups.pop(), groups.pop()
                    init = [p.detach().clone() for p in ref.parameters()]
                    ref_opt = cls(ref_groups, **kwargs)
                    ddp, opt = _make_sharded(name, model, cls, kwargs, groups)
                    worst = 0.0
                    for step in range(steps):
                        if layout == "added_later" and step == add_group_at:
                            ref_opt.add_param_group(ref_later)
                            opt.add_param_group(later)
                        _train_step(kind, step, world_size, rank, device, ref, ref_opt)
                        _train_step(kind, step, world_size, rank, device, model, opt, ddp)
                        worst = max(worst, max_param_diff(ref, model))
                    out[(name, kind, opt_name, layout)] = {
                        "max_diff": worst,
                        "moved": _moved(init, ref),
                        "bytes": opt.bytes_communicated_last_step,
                        "is_optimizer": isinstance(opt, torch.optim.Optimizer),
                    }
    return out


def sharded_resume(rank, world_size, sharded_names, opt_names, steps_before, steps_after):
    """Save per-rank optimizer shard + model mid-run, load into fresh objects,
    and check the continuation matches the uninterrupted run exactly."""
    device = _device(rank)
    kind = "mlp"
    out = {}
    for name in sharded_names:
        for opt_name in opt_names:
            cls, kwargs = OPT_CLASSES[opt_name]
            model = make_model(kind, rank, device)
            ddp, opt = _make_sharded(name, model, cls, kwargs, _split_groups(model, kwargs["lr"]))
            for step in range(steps_before):
                _train_step(kind, step, world_size, rank, device, model, opt, ddp)
            buf = io.BytesIO()
            torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
            for step in range(steps_before, steps_before + steps_after):
                _train_step(kind, step, world_size, rank, device, model, opt, ddp)

            buf.seek(0)
            saved = torch.load(buf, weights_only=False)
            fresh = make_model(kind, 999 + rank, device)
            ddp2, opt2 = _make_sharded(name, fresh, cls, kwargs, _split_groups(fresh, kwargs["lr"]))
            fresh.load_state_dict(saved["model"])
            opt2.load_state_dict(saved["opt"])
            for step in range(steps_before, steps_before + steps_after):
                _train_step(kind, step, world_size, rank, device, fresh, opt2, ddp2)
            out[(name, opt_name)] = max_param_diff(model, fresh)
    return out


def sharded_balance(rank, world_size, sizes):
    """Ownership of parameters with the given numels, as seen by this rank."""
    params = [nn.Parameter(torch.zeros(n, device=_device(rank))) for n in sizes]
    opt = ShardedOptimizer(params, torch.optim.SGD, lr=0.1)
    return {
        "owners": [opt.owner[id(p)] for p in params],
        "rank_numel": list(opt.rank_numel),
        "local_numel": sum(p.numel() for g in opt.local_optimizer.param_groups for p in g["params"]),
    }


def _spied_collectives(unheld: list, calls: list):
    """Patch the collectives the sharded optimizers and their DDP wrappers call (through `dist` and
    sharded_optimizer's own names) so that each call counts in `calls` and names in `unheld` every CPU
    tensor argument nothing but its Python object holds (use count 1): gloo's worker dropping such a
    tensor makes the 2 -> 1 transition, which takes the GIL (issue 23; impl.distributed.release)."""
    from contextlib import ExitStack
    from unittest import mock

    import impl.distributed.sharded_optimizer as so

    def spy(name, collective):
        def call(*args, **kwargs):
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            tensors += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
            calls.append(name)
            unheld.extend(f"{name} {tuple(t.shape)}" for t in tensors if not t.is_cuda and t._use_count() < 2)
            return collective(*args, **kwargs)
        return call

    stack = ExitStack()
    for module, names in ((dist, ("all_reduce", "broadcast", "all_gather")),
                          (so, ("all_gather_single", "reduce_scatter_single"))):
        for name in names:
            stack.enter_context(mock.patch.object(module, name, spy(name, getattr(module, name))))
    return stack


def sharded_collective_holds(rank, world_size, sharded_names, steps=2):
    """Per sharded optimizer: {"calls": collectives issued by construction and `steps` steps (its
    DDP wrapper's too), "unheld": those tensors handed over with nothing but Python holding them}."""
    device = _device(rank)
    out = {}
    for name in sharded_names:
        cls, kwargs = OPT_CLASSES["adam"]
        unheld, calls = [], []
        with _spied_collectives(unheld, calls):
            model = make_model("mlp", rank, device)
            ddp, opt = _make_sharded(name, model, cls, kwargs, _split_groups(model, kwargs["lr"]))
            for step in range(steps):
                _train_step("mlp", step, world_size, rank, device, model, opt, ddp)
        out[name] = {"calls": len(calls), "unheld": unheld}
    return out


def sharded_resume_and_balance(rank, world_size, sharded_names, opt_names, sizes, refusal_cases):
    """The cheap checks in one launch (process start-up dominates): resume, balance, the
    refusals of ranks that disagree, and the collectives' C++ holds."""
    return {
        "resume": sharded_resume(rank, world_size, sharded_names, opt_names, 5, 5),
        "balance": sharded_balance(rank, world_size, sizes),
        "refusals": refusals(rank, world_size, refusal_cases),
        "holds": sharded_collective_holds(rank, world_size, sharded_names + ["zero1_all_reduce"]),
    }


# ------------------------------------------------------- ZeRO-1 memory --

def _reachable_tensors(*roots) -> list:
    """Tensors reachable from ``roots`` through containers and object
    attributes (plus each tensor's ``.grad``). Modules, classes, functions and
    weak references are not followed: they lead to globals, and a weak
    reference does not keep memory alive."""
    import gc
    import types

    skip = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, weakref.ReferenceType)
    seen, tensors, todo = set(), [], list(roots)
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, skip) or isinstance(obj, (str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            tensors.append(obj)
            if obj.grad is not None:
                todo.append(obj.grad)
        todo.extend(gc.get_referents(obj))
    return tensors


def _distinct_storage_bytes(tensors) -> int:
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def _inside(t: torch.Tensor, buf: torch.Tensor) -> bool:
    lo = buf.data_ptr()
    hi = lo + buf.numel() * buf.element_size()
    return t.numel() == 0 or lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi


class _WideMLP(nn.Module):
    """Big enough that the optimizer's bookkeeping is small next to the
    buffers; one frozen parameter (no grad, no state) and one tied pair."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 256)
        self.fc2 = nn.Linear(256, 256)
        self.fc3 = nn.Linear(256, 256)
        self.fc3.weight = self.fc2.weight
        self.out = nn.Linear(256, 4)
        self.out.bias.requires_grad_(False)

    def forward(self, x):
        return self.out(torch.tanh(self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))))


def zero1_memory_structure(rank, world_size, steps, bucket_numel):
    """What a ZeRO-1 rank keeps alive, measured from the objects (no device allocator needed):
    distinct storages reachable from the model and the optimizer after construction, after the
    last backward (before its step), after that step and after zero_grad; whether the
    pre-flattening parameter storages were released; whether params and the local optimizer's
    chunks alias the flat buffer; whether a bucket boundary splits a parameter; and the max
    difference to plain single-process Adam (a small ``bucket_numel`` gives many buckets)."""
    import gc

    device = _device(rank)
    torch.manual_seed(rank)  # different replicas: the DDP broadcast matters
    model = _WideMLP().to(device)
    torch.manual_seed(0)
    ref = _WideMLP().to(device)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    param_bytes = _distinct_storage_bytes(_reachable_tensors(model))
    grad_bytes = sum(p.numel() * p.element_size() for p in trainable)
    old_storages = [weakref.ref(p.untyped_storage()) for p in trainable]

    ddp = DDPNaive(model, reduce_gradients=False)
    opt = ZeRO1Optimizer(model.parameters(), torch.optim.Adam, bucket_numel=bucket_numel, lr=1e-2)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    gc.collect()
    (fg,) = opt.flat_groups
    out = {
        "P": param_bytes,
        "G": grad_bytes,
        "S": 2 * grad_bytes,  # Adam: exp_avg + exp_avg_sq
        "old_storages_alive": sum(r() is not None for r in old_storages),
        "init_bytes": _distinct_storage_bytes(_reachable_tensors(model, opt)),
        "buckets": len(fg.buckets),
        "splits_a_param": any(o < b.start < e for b in fg.buckets for o, e in zip(fg.offsets, fg.ends)),
    }
    worst = 0.0
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(4 * world_size, 32, generator=g).to(device)
        y = torch.randn(4 * world_size, 4, generator=g).to(device)
        for m, o, xs, ys in ((ref, ref_opt, x, y), (model, opt, *local_slice((x, y), rank, world_size))):
            o.zero_grad()
            F.mse_loss(m(xs), ys).backward()
            if m is model:
                ddp.finish_gradient_synchronization()
                gc.collect()
                out.update(_zero1_before_step(model, opt))
            o.step()
        worst = max(worst, max_param_diff(ref, model))
    gc.collect()
    local = [p for grp in opt.local_optimizer.param_groups for p in grp["params"]]
    state = [v for s in opt.local_optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    out.update(
        step_bytes=_distinct_storage_bytes(_reachable_tensors(model, opt)),
        state_bytes=sum(t.numel() * t.element_size() for t in state),
        params_in_flat=all(_inside(p, fg.flat_param) for p in trainable),
        chunks_own_their_bucket_part=local == fg.chunks and all(
            c.data_ptr() == b.owned(fg.flat_param, rank, world_size).data_ptr() for c, b in zip(local, fg.buckets)),
        model_grads_after_step=sum(p.grad is not None for p in params),
        shard_grad_bytes=_distinct_storage_bytes([c.grad for c in fg.chunks]),
        shard_numel=fg.flat_param.numel() // world_size,
        old_storages_alive_after=sum(r() is not None for r in old_storages),
        max_diff=worst,
    )
    opt.zero_grad()
    gc.collect()
    out["zeroed_bytes"] = _distinct_storage_bytes(_reachable_tensors(model, opt))
    return out


def _zero1_before_step(model, opt) -> dict:
    """After backward, before the step: are the params' grads autograd's own tensors (storages
    of exactly their size, no views of a shared buffer), and what does the optimizer hold beside
    them (storages reachable from it that are no param's grad)?"""
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    grad_storages = {g.untyped_storage().data_ptr() for g in grads}
    held = [t for t in _reachable_tensors(opt) if t.untyped_storage().data_ptr() not in grad_storages]
    return {
        "grads_own_storage": all(g.untyped_storage().nbytes() == g.numel() * g.element_size() for g in grads),
        "optimizer_bytes_before_step": _distinct_storage_bytes(held),
        "before_step_bytes": _distinct_storage_bytes(_reachable_tensors(model, opt)),
    }


# ------------------------------------------------------ ZeRO-1 peak memory --

class _DeepMLP(nn.Module):
    """Equal 64-wide layers: no parameter dominates (ZeRO-1 frees a grad only once all of it is
    packed); with a large batch, activations outweigh the gradients, as in the xl model."""

    def __init__(self, width: int = 64, depth: int = 8):
        super().__init__()
        self.layers = nn.Sequential(*[m for _ in range(depth) for m in (nn.Linear(width, width), nn.Tanh())])

    def forward(self, x):
        return self.layers(x)


def _peak_of_step(model, ddp, opt, batch) -> dict:
    """Peak live bytes of one training step, per phase (forward + backward + gradient sync; the
    optimizer step): the storages that stay alive across it (reachable from the model, wrapper,
    optimizer and batch after zero_grad) plus the peak of what was allocated since, counted by a
    StorageLedger (every storage an op creates, until freed)."""
    import gc

    from impl.workloads.block_memory import StorageLedger

    x, y = batch
    opt.zero_grad(set_to_none=True)
    gc.collect()
    resident = _distinct_storage_bytes(_reachable_tensors(model, ddp, opt, x, y))
    with StorageLedger() as ledger:
        F.mse_loss(model(x), y).backward()
        ddp.finish_gradient_synchronization()
        fwd_bwd = ledger.peak_bytes
        ledger.reset_peak()
        opt.step()
        step = ledger.peak_bytes
    return {"resident": resident, "fwd_bwd": resident + fwd_bwd, "step": resident + step}


def zero1_peak_bytes(rank, world_size, bucket_numel, batch_per_rank):
    """Peak live bytes per phase of a training step of ``_DeepMLP`` with Adam, unsharded
    (DDPNaive + Adam) and ZeRO-1 (``bucket_numel`` elements per bucket), after a first step
    that created the optimizer state; with the model's gradient and Adam-state bytes and its
    largest parameter's bytes."""
    import gc

    device = _device(rank)
    out = {}
    for name in ("unsharded", "zero1"):
        torch.manual_seed(0)
        model = _DeepMLP().to(device)
        if name == "zero1":
            ddp = DDPNaive(model, reduce_gradients=False)
            opt = ZeRO1Optimizer(model.parameters(), torch.optim.Adam, bucket_numel=bucket_numel, lr=1e-3)
        else:
            ddp, opt = DDPNaive(model), torch.optim.Adam(model.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(rank)
        batches = [(torch.randn(batch_per_rank, 64, generator=g).to(device),
                    torch.randn(batch_per_rank, 64, generator=g).to(device)) for _ in range(2)]
        opt.zero_grad()
        F.mse_loss(model(batches[0][0]), batches[0][1]).backward()
        ddp.finish_gradient_synchronization()
        opt.step()
        out[name] = _peak_of_step(model, ddp, opt, batches[1])
        del model, ddp, opt, batches
        gc.collect()
    params = list(_DeepMLP().parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    out.update(G=grad_bytes, S=2 * grad_bytes, largest=max(p.numel() * p.element_size() for p in params))
    return out


# ------------------------------------------- ranks that disagree (issue 46) --

def _params(shapes, device, frozen=()) -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(s, device=device), requires_grad=i not in frozen) for i, s in enumerate(shapes)]


class _Scaled(nn.Module):
    """A Linear and a buffer whose length is given: the buffer is broadcast with the parameters."""

    def __init__(self, buffer_len: int):
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.register_buffer("scale", torch.ones(buffer_len))


class _Affine(nn.Module):
    """nn.Linear's parameters (weight (2, 4), bias) in a layer FSDP does not shard."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(2, 4))
        self.bias = nn.Parameter(torch.zeros(2))


def _zero1_added_group(rank, dev):
    opt = ZeRO1Optimizer(_params([(3,)], dev), torch.optim.SGD, lr=0.1)
    opt.add_param_group({"params": _params([(2,)] * (1 + rank), dev)})


SGD = torch.optim.SGD
# The inputs, each built on every rank from its rank (on its device): every rank must refuse it.
DISAGREEING = {
    "ddp_naive": lambda rank, dev: DDPNaive(nn.Linear(4 + rank, 2).to(dev)),
    "ddp_flat": lambda rank, dev: DDPFlat(nn.Linear(4 + rank, 2).to(dev)),
    "ddp_individual": lambda rank, dev: DDPIndividualParameters(nn.Linear(4 + rank, 2).to(dev)),
    "ddp_bucketed": lambda rank, dev: DDPBucketed(nn.Linear(4 + rank, 2).to(dev), bucket_size_mb=1),
    "ddp_requires_grad": lambda rank, dev: DDPFlat(nn.Linear(4, 2).to(dev).requires_grad_(rank == 0)),
    "ddp_buffer": lambda rank, dev: DDPNaive(_Scaled(3 + rank).to(dev)),
    "sharded_count": lambda rank, dev: ShardedOptimizer(_params([(3,)] * (2 + rank), dev), SGD, lr=0.1),
    "sharded_requires_grad": lambda rank, dev: ShardedOptimizer(
        _params([(3,), (4,)], dev, frozen={1} if rank else ()), SGD, lr=0.1),
    "sharded_group_bounds": lambda rank, dev: ShardedOptimizer(
        [{"params": _params(shapes, dev)} for shapes in ([[(3,), (4,)]] if rank == 0 else [[(3,)], [(4,)]])],
        SGD, lr=0.1),
    "zero1_list": lambda rank, dev: ZeRO1Optimizer(_params([(3,), (5,)] + [(7,)] * rank, dev), SGD, lr=0.1),
    "zero1_added_group": _zero1_added_group,
    "fsdp_linear": lambda rank, dev: FSDP(nn.Linear(4 + rank, 2).to(dev)),
    "fsdp_sharding": lambda rank, dev: FSDP(nn.Sequential(_Affine() if rank else nn.Linear(4, 2)).to(dev)),
    # options that decide the collectives: buckets of other sizes, gathers of another dtype or order
    "ddp_bucket_size": lambda rank, dev: DDPBucketed(nn.Linear(4, 2).to(dev), bucket_size_mb=1 + rank),
    "fsdp_prefetch": lambda rank, dev: FSDP(nn.Linear(4, 2).to(dev), prefetch=rank % 2),
    "fsdp_reduce_dtype": lambda rank, dev: FSDP(nn.Linear(4, 2).to(dev),
                                                reduce_dtype=torch.bfloat16 if rank else torch.float32),
}


def refusal(wrapper: str, what: str, rank0: str, others: str, differ: tuple[int, ...] = (1,)) -> str:
    """The start of impl.distributed.agreement's message when rank 0 holds `rank0` at the first
    difference and every rank in `differ` holds `others`."""
    label = f"rank {differ[0]}" if len(differ) == 1 else "ranks " + ", ".join(map(str, differ))
    return (f"{wrapper}: the ranks disagree on {what}: rank 0: {rank0}; {label}: {others}. "
            f"Ranks {list(differ)} differ from rank 0")


F32 = "torch.float32, requires_grad"  # in a tensor's description: shape (..), {F32}=True


def assert_refused_by_every_rank(messages: list[str | None], expected: str) -> None:
    """Every rank raised (its message is not None), the same message, which starts as `expected`."""
    refused = [rank for rank, m in enumerate(messages) if m is not None]
    assert refused == list(range(len(messages))), f"only ranks {refused} refused: {messages}"
    assert len(set(messages)) == 1, messages
    assert messages[0].startswith(expected), f"{messages[0]!r}\ndoes not start with\n{expected!r}"


def assert_refusals(results: list[dict], expected: str) -> None:
    """`refusals`' results for one case, one per rank: every rank refused alike, then all met again."""
    assert_refused_by_every_rank([r["message"] for r in results], expected)
    assert all(r["in_step"] for r in results), "a rank was left behind in a collective"


def refusals(rank, world_size, cases):
    """Each case of DISAGREEING built on this rank: its ValueError message (None if accepted), and
    whether every rank then met in one all-reduce (none was left in a collective of the case)."""
    device = _device(rank)
    out = {}
    for case in cases:
        try:
            DISAGREEING[case](rank, device)
            message = None
        except ValueError as e:
            message = str(e)
        ranks = torch.tensor([float(rank)], device=device)
        released(dist.all_reduce, ranks)
        out[case] = {"message": message, "in_step": ranks.item() == sum(range(world_size))}
    return out


def refuse(rank, world_size, case):
    """One case of DISAGREEING, not caught: the launcher reports the refusal."""
    DISAGREEING[case](rank, _device(rank))
    return rank


def assert_launch_refused(case: str, expected: str, world_size: int = 2, backend: str | None = None) -> None:
    """Launching `refuse` on `case` fails naming the first failing rank and its ValueError, which
    starts as `expected`, and every other rank failed too (none hung in a collective)."""
    try:
        launch(refuse, world_size, backend=backend, args=(case,), timeout_s=60)
    except RuntimeError as err:
        msg = str(err)
    else:
        raise AssertionError(f"{case}: every rank accepted it")
    first = re.match(rf"rank (\d+) of {world_size} failed:\n", msg)
    assert first, msg
    assert f"ValueError: {expected}" in msg, msg
    others = sorted(set(range(world_size)) - {int(first.group(1))})
    # the ranks' stderr may follow (impl.distributed.launcher appends its last lines)
    assert f"\n(then ranks {others} failed too)" in msg, msg


def _owners(model: nn.Module, rank: int, world_size: int, how: str) -> dict[int, int]:
    """An owner map of `model`'s parameters for DDPReduceToOwner's refusals: round robin, then spoiled."""
    params = list(model.parameters())
    owner = {id(p): i % world_size for i, p in enumerate(params)}
    if how == "swapped" and rank:  # rank 1 and up name other owners
        owner = {k: (v + 1) % world_size for k, v in owner.items()}
    if how == "missing":  # every rank alike: the bias has no owner
        del owner[id(params[1])]
    if how == "outside":  # every rank alike: a rank the world lacks
        owner[id(params[1])] = world_size
    return owner


def _reduce_to_owner(rank, dev, how):
    model = nn.Linear(4, 2).to(dev)
    return DDPReduceToOwner(model, 1, owner=_owners(model, rank, dist.get_world_size(), how))


DISAGREEING.update({
    "owner_swapped": lambda rank, dev: _reduce_to_owner(rank, dev, "swapped"),
    # the same bad map on every rank: each raises the same after the agreement check (none hangs)
    "owner_missing": lambda rank, dev: _reduce_to_owner(rank, dev, "missing"),
    "owner_outside": lambda rank, dev: _reduce_to_owner(rank, dev, "outside"),
})
