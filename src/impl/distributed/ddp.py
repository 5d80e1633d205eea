"""Data-parallel wrappers, from simplest to most overlapped.

All variants share one contract (as torch DDP): every rank holds a full model
replica, rank 0's (the group's first) parameters and buffers are broadcast at construction, each
rank runs forward/backward on its own slice of the batch, and after
``finish_gradient_synchronization()`` every ``.grad`` holds the average over
ranks — so with a mean loss over equal shards it equals the full-batch gradient.
With ``average=False`` it holds the sum instead: the full-batch gradient of a loss
summed over tokens (the 2026 leaderboard's), each rank summing over its own.
The broadcast pairs tensors across ranks by position, so construction first checks
that every rank wraps the same parameters and buffers (impl.distributed.agreement)
and raises on every rank otherwise. ``group``: the process group every collective runs on
(None: the default one; the 8B step's NCCL options need a group of their own).

Usage per step::

    loss = loss_fn(ddp(x_local), y_local)
    loss.backward()
    ddp.finish_gradient_synchronization()
    opt.step()

Parameters that receive no gradient in a step (requires_grad=False, or unused
in the forward) keep ``grad is None``, like single-process training. The set of
such parameters must be the same on all ranks in a step (true when every rank
runs the same code path), otherwise ranks would issue different collectives.

Shared (tied) parameters are deduplicated by identity, which
``nn.Module.parameters()`` already does; autograd accumulates both uses into
the one ``.grad`` before its post-accumulate hook fires.

Exit safety (issue 23): every collective's tensors go through ``impl.distributed.release``,
which waits until gloo's worker thread let go of them; otherwise a rank can abort at exit.

Instrumentation: ``comm_time_s`` is the host time the last
``finish_gradient_synchronization`` spent on communication that was not
hidden behind backward (device synchronised); ``bytes_communicated_last_step``
is the payload handed to collectives in the last step (buffer sizes, not
multiplied by any algorithm factor).
"""

from __future__ import annotations

import math
import time
import weakref
from typing import Hashable, Mapping

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from impl.distributed.agreement import verify_module
from impl.distributed.release import Released


def _sync_device(tensors) -> None:
    for t in tensors:
        if t.is_cuda:
            torch.cuda.synchronize(t.device)
            return


def _group_by_dtype_device(tensors):
    """Flattening needs one dtype and device per buffer."""
    groups: dict = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.values())


class _DataParallelBase(nn.Module):
    def __init__(self, module: nn.Module, reduce_gradients: bool = True, average: bool = True,
                 options: dict[str, object] | None = None, group=None):
        super().__init__()
        self.module = module
        self.group = group  # None: the default process group
        self.world_size = dist.get_world_size(group)
        self.reduce_gradients = reduce_gradients
        self.average = average
        self.comm_time_s = 0.0
        self.bytes_communicated_last_step = 0
        # parameters() dedupes tied weights by identity; frozen params never sync.
        self.trainable = [p for p in module.parameters() if p.requires_grad]
        self._hook_handles: list = []
        # before the broadcast pairs tensors by position; `options`: a subclass's that shape its collectives
        verify_module(type(self).__name__, module, group=group,
                      options=dict(reduce_gradients=reduce_gradients, average=average, **(options or {})),
                      roles=self._roles())
        self._broadcast_from_rank0()

    def _roles(self) -> dict[int, str] | None:
        """id(parameter) -> a subclass's role for it, which the ranks must agree on (None: no roles)."""
        return None

    def _register_grad_hooks(self) -> None:
        """Calls self._on_grad_ready(p) when each trainable p's grad is final. The hook holds the
        wrapper only weakly: a bound method stored in a parameter's (C++) hook table would be a
        reference cycle the garbage collector cannot see, keeping a dropped wrapper and its model
        alive for good."""
        me = weakref.ref(self)

        def hook(p: torch.Tensor) -> None:
            ddp = me()
            if ddp is not None:
                ddp._on_grad_ready(p)

        self._hook_handles = [p.register_post_accumulate_grad_hook(hook) for p in self.trainable]

    def remove_hooks(self) -> None:
        """Detach from the parameters, e.g. before wrapping the same module again."""
        for handle in self.__dict__.get("_hook_handles", ()):  # __init__ may have failed early
            handle.remove()
        self.__dict__["_hook_handles"] = []

    def __del__(self):
        self.remove_hooks()

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        # One coalesced broadcast per dtype/device instead of one per tensor.
        tensors = list(self.module.parameters()) + list(self.module.buffers())
        for group in _group_by_dtype_device(tensors):
            flat = _flatten_dense_tensors(group)
            with Released() as keep:
                dist.broadcast(keep(flat), group=self.group, group_src=0)
            for t, synced in zip(group, _unflatten_dense_tensors(flat, group)):
                t.copy_(synced)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def _prescale(self, t: torch.Tensor) -> torch.Tensor:
        """Divided by the world size before a summing all-reduce, so the result is the mean
        (nothing for average=False: the sum)."""
        return t.div_(self.world_size) if self.average else t

    def finish_gradient_synchronization(self) -> None:
        if not self.reduce_gradients:
            self.comm_time_s = 0.0
            self.bytes_communicated_last_step = 0
            return
        t0 = time.perf_counter()
        self.bytes_communicated_last_step = self._finish()
        _sync_device(self.trainable)
        self.comm_time_s = time.perf_counter() - t0

    def _finish(self) -> int:
        raise NotImplementedError


class DDPNaive(_DataParallelBase):
    """One blocking all-reduce per parameter, after backward."""

    def _finish(self) -> int:
        nbytes = 0
        for p in self.trainable:
            if p.grad is None:
                continue
            self._prescale(p.grad)
            with Released() as keep:
                dist.all_reduce(keep(p.grad), group=self.group)
            nbytes += p.grad.numel() * p.grad.element_size()
        return nbytes


class DDPFlat(_DataParallelBase):
    """One all-reduce of all gradients flattened together, after backward.

    Fewer, larger messages than DDPNaive (latency paid once), at the cost of a
    copy in and out of the flat buffer and no overlap with backward.
    """

    def _finish(self) -> int:
        grads = [p.grad for p in self.trainable if p.grad is not None]
        nbytes = 0
        for group in _group_by_dtype_device(grads):
            flat = self._prescale(_flatten_dense_tensors(group))
            with Released() as keep:
                dist.all_reduce(keep(flat), group=self.group)
            for g, reduced in zip(group, _unflatten_dense_tensors(flat, group)):
                g.copy_(reduced)
            nbytes += flat.numel() * flat.element_size()
        return nbytes


class DDPIndividualParameters(_DataParallelBase):
    """Async all-reduce per parameter, launched as soon as its grad is final.

    Communication overlaps the rest of backward; finish only waits.
    """

    def __init__(self, module: nn.Module, reduce_gradients: bool = True, average: bool = True, group=None):
        super().__init__(module, reduce_gradients, average, group=group)
        self._pending: list = []  # the works of this step's all-reduces
        self._sent = Released()  # their grads, until gloo's worker let go of them
        self._sent_bytes = 0
        if reduce_gradients:
            self._register_grad_hooks()

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        # Pre-divide (average=True) so the summed result is already the mean.
        grad = self._prescale(p.grad)
        self._sent_bytes += grad.numel() * grad.element_size()
        self._pending.append(dist.all_reduce(self._sent(grad), async_op=True, group=self.group))

    def _finish(self) -> int:
        for handle in self._pending:
            handle.wait()
        handle = None  # the loop variable would keep the last work alive through the release wait
        self._pending.clear()
        self._sent.wait()
        nbytes, self._sent_bytes = self._sent_bytes, 0
        return nbytes


def plan_buckets(sizes: list[tuple[int, Hashable]], cap_bytes: float) -> list[list[int]]:
    """Buckets for tensors of (nbytes, kind) in the order their grads become ready: lists of indices
    into `sizes`, ordered by each bucket's first member. A tensor joins the open bucket of its own
    kind (a flat buffer has one dtype and device), which closes when the next tensor of that kind
    would take it past `cap_bytes`; a tensor larger than the cap gets a bucket of its own. One open
    bucket per kind, not one for the whole sequence: interleaved kinds (the 8B step's fp32 RMSNorm
    gains between its bf16 weights) would otherwise close a bucket at every change of kind, one tiny
    all-reduce per gain."""
    buckets: list[list[int]] = []
    open_: dict[Hashable, tuple[list[int], int]] = {}  # kind -> (its open bucket, the bucket's bytes)
    for i, (size, kind) in enumerate(sizes):
        members, used = open_.get(kind, (None, 0))
        if members is None or used + size > cap_bytes:
            members, used = [], 0
            buckets.append(members)
        members.append(i)
        open_[kind] = (members, used + size)
    return buckets


class _Bucket:
    """A fixed set of parameters whose grads are reduced as one flat buffer. `allocate`: the buffer
    exists from construction (kept for every step), else it is None until ``new_buffer()``."""

    def __init__(self, params: list[torch.Tensor], allocate: bool = True):
        self.params = params
        self.offsets = []
        offset = 0
        for p in params:
            self.offsets.append(offset)
            offset += p.numel()
        self.numel, self.dtype, self.device = offset, params[0].dtype, params[0].device
        self.buffer: torch.Tensor | None = None
        self.grads: list[torch.Tensor] | None = None
        if allocate:
            self.new_buffer(torch.zeros)
        self.index = {id(p): i for i, p in enumerate(params)}
        self.reset()

    def reset(self) -> None:
        self.ready = [False] * len(self.params)
        self.num_ready = 0
        self.handle = None

    def holds(self, i: int, grad: torch.Tensor) -> bool:
        """Whether `grad` is parameter i's view of the buffer (left as its grad by the last sync)."""
        return grad.data_ptr() == self.grads[i].data_ptr() and grad.stride() == self.grads[i].stride()

    def new_buffer(self, make=torch.empty) -> torch.Tensor:
        """A fresh buffer (unset by default: every part is written before it is sent, see DDPBucketed._finish)
        and each parameter's part of it in its shape, made together: a view holds the buffer, so views made
        later would raise its use count past the one recorded before a collective (impl.distributed.release)."""
        self.buffer = make(self.numel, dtype=self.dtype, device=self.device)
        self.grads = [self.buffer[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]
        return self.buffer

    def drop_buffer(self) -> None:
        """Let go of the buffer and its views (a view alone would keep the memory)."""
        self.buffer = self.grads = None

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class DDPBucketed(_DataParallelBase):
    """Gradients packed into buckets of at most ``bucket_size_mb``; each bucket
    is all-reduced asynchronously as soon as all of its grads are ready.

    Buckets are filled in reverse parameter order, roughly the order backward
    produces grads, so the first buckets complete (and start communicating)
    early; parameters of another dtype fill buckets of their own beside them
    (plan_buckets). A parameter larger than the cap gets a bucket of its own.
    Expects one backward per ``finish_gradient_synchronization`` (no
    gradient accumulation across backward calls without a sync).

    After ``finish_gradient_synchronization`` each ``p.grad`` is a view of its
    bucket (as torch DDP's ``gradient_as_bucket_view``): the next backward
    overwrites it, so a caller that keeps a step's grads must clone them.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float, reduce_gradients: bool = True,
                 average: bool = True, group=None):
        # Checked before the base class's broadcast, so every rank raises instead of some hanging.
        if isinstance(bucket_size_mb, bool) or not isinstance(bucket_size_mb, (int, float)) \
                or not math.isfinite(bucket_size_mb) or bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be a finite number > 0 (MiB per bucket), got {bucket_size_mb!r}")
        super().__init__(module, reduce_gradients, average, options=dict(bucket_size_mb=bucket_size_mb), group=group)
        self.bucket_size_bytes = bucket_size_mb * 1024 * 1024
        self.buckets = self._build_buckets()
        self._sent = Released()  # the buffers of this step's collectives, until gloo's worker let go of them
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        if reduce_gradients:
            self._register_grad_hooks()

    def _build_buckets(self) -> list[_Bucket]:
        order = list(reversed(self.trainable))
        plan = plan_buckets([(p.numel() * p.element_size(), (p.dtype, p.device)) for p in order],
                            self.bucket_size_bytes)
        return [_Bucket([order[i] for i in members]) for members in plan]

    def _launch(self, bucket: _Bucket) -> None:
        self._prescale(bucket.buffer)
        self._sent(bucket.buffer)
        bucket.handle = self._collective(bucket)

    def _collective(self, bucket: _Bucket) -> dist.Work:
        return dist.all_reduce(bucket.buffer, async_op=True, group=self.group)

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        bucket = self._bucket_of[id(p)]
        i = bucket.index[id(p)]
        if not bucket.holds(i, p.grad):  # a view kept by zero_grad(set_to_none=False): accumulated in place
            bucket.grads[i].copy_(p.grad)
        if not bucket.ready[i]:
            bucket.ready[i] = True
            bucket.num_ready += 1
        if bucket.num_ready == len(bucket.params):
            self._launch(bucket)

    def _finish(self) -> int:
        nbytes = 0
        # Buckets with an unused parameter never filled up during backward:
        # zero the missing slices (stale data from the last step) and send
        # them now. Same buckets on every rank, so collectives still match.
        # A bucket with no grads at all (all its params unused) is skipped.
        for bucket in self.buckets:
            if bucket.handle is None and bucket.num_ready > 0:
                for i, ready in enumerate(bucket.ready):
                    if not ready:
                        bucket.grads[i].zero_()
                self._launch(bucket)
        sent = [bucket for bucket in self.buckets if bucket.handle is not None]
        for bucket in sent:
            bucket.handle.wait()
            bucket.handle = None  # the worker lets go of the buffer only once no handle is left
        # every buffer let go by the backend before its parts become grads (impl.distributed.release)
        self._sent.wait()
        for bucket in sent:
            nbytes += bucket.nbytes
            self._unpack(bucket)
        for bucket in self.buckets:
            bucket.reset()
        return nbytes

    def _unpack(self, bucket: _Bucket) -> None:
        """Each grad becomes its part of the reduced buffer instead of a copy of it: no copy kernel a parameter
        at the end of backward (309 of them, ~10 ms, exposed, on the 8B step), and the autograd-made grads
        are freed here instead of at the next zero_grad."""
        for i, p in enumerate(bucket.params):
            if bucket.ready[i]:
                p.grad = bucket.grads[i]


class DDPReduceToOwner(DDPBucketed):
    """ZeRO-2's gradient sync: each gradient is reduced only to the rank that owns its parameter
    (``owner``: id(parameter) -> rank, as ``ShardedOptimizer.owner``), which steps it and broadcasts
    its new value; the other ranks never need the reduced gradient.

    DDPBucketed's buckets and hooks, with each bucket split by owner (a bucket goes to one rank),
    launched as an async ``dist.reduce(dst=owner)`` once full: each rank sends every gradient once
    and receives only its own (a ring all-reduce sends and receives 2(N-1)/N of them). Memory: no
    bucket buffer lives across steps. A bucket's buffer is allocated at its first gradient, and
    each parameter's ``.grad`` is freed once copied into it, so during backward a rank holds the
    buckets of the grads produced so far, not a full-size bucket set beside the grads. A bucket
    another rank owns is dropped once sent (on the GPU right after its launch: NCCL keeps the
    memory until its kernel is done; on gloo at the finish, see impl.distributed.release). After
    ``finish_gradient_synchronization()`` owned parameters' ``.grad`` hold the reduced gradient
    (the mean, or the sum for average=False) as views of their bucket, freed by the optimizer's
    ``zero_grad(set_to_none=True)``; every other trainable parameter's ``.grad`` is None. Call
    ``zero_grad(set_to_none=True)`` between steps: an owned grad left in place would accumulate the
    next backward into the reduced one on its owner only.

    Refused at construction, on every rank: ranks that disagree on any parameter's owner (compared
    with the parameters, impl.distributed.agreement), then a map that misses a trainable parameter
    or names a rank outside the world.
    """

    def __init__(self, module: nn.Module, bucket_size_mb: float, owner: Mapping[int, int],
                 reduce_gradients: bool = True, average: bool = True, group=None):
        if not isinstance(owner, Mapping):
            raise TypeError(f"DDPReduceToOwner: owner must map id(parameter) -> rank (ShardedOptimizer.owner), "
                            f"got {type(owner).__name__}")
        # read by _roles() during the base class's agreement check, before nn.Module's __init__ ran
        self.__dict__["owner"] = dict(owner)
        self.__dict__["rank"] = dist.get_rank(group)  # owners are ranks of `group`, as the optimizer's
        super().__init__(module, bucket_size_mb, reduce_gradients, average, group=group)

    def _roles(self) -> dict[int, str]:
        return {id(p): f"owned by rank {self.owner.get(id(p))}" for p in self.module.parameters()
                if p.requires_grad}

    def _check_owners(self) -> None:
        """After the agreement check: every rank holds the same map, so every rank raises alike."""
        names = {id(p): n for n, p in self.module.named_parameters()}
        missing = [names[id(p)] for p in self.trainable if id(p) not in self.owner]
        if missing:
            raise ValueError(f"DDPReduceToOwner: owner names no rank for trainable parameters {missing}: every "
                             "trainable parameter needs one owner")
        bad = {names[id(p)]: self.owner[id(p)] for p in self.trainable
               if isinstance(self.owner[id(p)], bool) or not isinstance(self.owner[id(p)], int)
               or not 0 <= self.owner[id(p)] < self.world_size}
        if bad:
            raise ValueError(f"DDPReduceToOwner: owner names ranks outside the world of {self.world_size} "
                             f"(0 to {self.world_size - 1}): {bad}")

    def _build_buckets(self) -> list[_Bucket]:
        self._check_owners()
        buckets = []
        for bucket in super()._build_buckets():
            by_owner: dict[int, list[torch.Tensor]] = {}
            for p in bucket.params:
                by_owner.setdefault(self.owner[id(p)], []).append(p)
            for owner, params in by_owner.items():
                buckets.append(_OwnedBucket(params, owner))
        return buckets

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        bucket = self._bucket_of[id(p)]
        if bucket.buffer is None:
            bucket.new_buffer()
        super()._on_grad_ready(p)
        p.grad = None  # its values are in the bucket; the owner's come back as views at the finish

    def _collective(self, bucket: _OwnedBucket) -> dist.Work:
        return dist.reduce(bucket.buffer, async_op=True, group=self.group, group_dst=bucket.owner)

    def _launch(self, bucket: _OwnedBucket) -> None:
        super()._launch(bucket)
        if bucket.owner != self.rank and bucket.buffer.is_cuda:
            bucket.drop_buffer()  # NCCL holds it (record_stream, or its work's stash) until the reduce is done

    def _unpack(self, bucket: _OwnedBucket) -> None:
        if bucket.owner == self.rank:
            super()._unpack(bucket)
        bucket.drop_buffer()  # the owner's grads keep theirs alive; a sent one is freed


class _OwnedBucket(_Bucket):
    """A bucket whose grads are reduced to one rank; its buffer exists only within a step."""

    def __init__(self, params: list[torch.Tensor], owner: int):
        super().__init__(params, allocate=False)
        self.owner = owner
