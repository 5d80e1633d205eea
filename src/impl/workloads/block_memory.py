"""memory_profiling (f) (2026 edition): what one TransformerBlock saves for backward, by the
operation that allocated each saved tensor, and the gradient memory one block's backward
produces, read from how allocated memory changes across each block.

Three instruments, one forward + backward:
  - `StorageLedger` (a TorchDispatchMode) notes, for every new storage, the aten op that
    allocated it (`aten::mm`, the names PyTorch's NVTX ranges carry in Nsight) and the module it
    ran in; on the CPU it also counts the bytes of live storages, the meter where no CUDA
    allocator is;
  - saved-tensor hooks (`torch.autograd.graph.saved_tensors_hooks`) see each tensor autograd
    keeps while a block's forward runs: its storage, looked up in the ledger, names the op;
  - block boundaries: a forward pre/post hook per block (each block's forward is also an NVTX /
    record_function range "block k", so Nsight or torch.profiler show the same spans), and in
    the backward a gradient hook on each block's output (fires when the block above has finished
    its backward) and on block 0's input (fires when block 0 has). At each boundary the meter
    (torch.cuda.memory_allocated on a GPU) is read, and `mark(name)` may put the boundary into an
    allocator trace.

Block k's backward frees what its forward kept (F_k, the forward growth) and allocates its
weight gradients, so the memory change across it is G_k - F_k: G_k = F_k + (change in backward),
to be compared with 4 bytes x the block's parameters (gradients take the fp32 parameters' dtype).
Everything after the recording (`block_memory_facts`) is plain Python on plain records.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from impl.annotate import annotate

INPUT = "block input"  # the op label of a block's input (allocated by the block below)


@dataclass(frozen=True)
class Origin:
    """Where a storage was allocated: the aten op, the module path it ran in (relative to its
    block, "" for the block's own code), and the block (None outside the blocks)."""

    op: str
    module: str
    block: int | None


class StorageLedger(TorchDispatchMode):
    """Origin of every storage allocated while active, the bytes of those still alive, and the
    most those bytes have been (since construction or `reset_peak`)."""

    def __init__(self, where: Callable[[], tuple[int | None, str]] = lambda: (None, "")):
        super().__init__()
        self.where = where
        self.origins: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self.live_bytes = 0
        self.peak_bytes = 0

    def reset_peak(self) -> None:
        self.peak_bytes = self.live_bytes

    def _free(self, nbytes: int) -> None:
        self.live_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            s = t.untyped_storage()
            # views and in-place results share an input's storage: not an allocation
            if s.nbytes() == 0 or s.data_ptr() in inputs or s in self.origins:
                continue
            block, module = self.where()
            self.origins[s] = Origin(func._schema.name, module, block)
            self.live_bytes += s.nbytes()
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(s, self._free, s.nbytes())
        return out


@dataclass(frozen=True)
class Saved:
    """One distinct storage a block saved for backward."""

    block: int
    op: str
    module: str
    nbytes: int


@dataclass
class ProbeRecord:
    """What one probed forward + backward leaves: saved storages per block, the meter at each
    block's forward start/end, and in the backward at each block's start and block 0's end."""

    num_blocks: int
    saved: list[Saved] = field(default_factory=list)
    fwd_start: dict[int, int] = field(default_factory=dict)
    fwd_end: dict[int, int] = field(default_factory=dict)
    bwd_start: dict[int, int] = field(default_factory=dict)
    bwd_end_block0: int | None = None


class BlockProbe:
    """Hooks on `blocks` (a TransformerLM's `layers`) for the duration of a `with`: NVTX /
    record_function ranges per block, boundary readings of `meter`, `mark(name)` at each boundary
    and, with `ledger=True`, the saved-tensor attribution (slow: every op goes through Python)."""

    def __init__(self, blocks: torch.nn.ModuleList, meter: Callable[[], int] | None = None,
                 mark: Callable[[str], None] = lambda name: None, ledger: bool = False):
        self.blocks, self.mark = blocks, mark
        self.record = ProbeRecord(len(blocks))
        self._block: int | None = None
        self._modules: list[str] = []
        self._ranges: list[contextlib.ExitStack] = []
        self._handles: list = []
        self._stack = contextlib.ExitStack()
        self.ledger = StorageLedger(self._where) if ledger else None
        if meter is None and self.ledger is None:
            raise ValueError("BlockProbe needs a meter (e.g. torch.cuda.memory_allocated) or ledger=True")
        self.meter = meter if meter is not None else (lambda: self.ledger.live_bytes)
        self._params = {p.untyped_storage().data_ptr() for p in blocks.parameters()}

    def _where(self) -> tuple[int | None, str]:
        return self._block, (self._modules[-1] if self._modules else "")

    def _enter_module(self, name: str):
        def hook(module, args):
            self._modules.append(name)
        return hook

    def _exit_module(self, module, args, out) -> None:  # returns None: a value would replace `out`
        self._modules.pop()

    # forward boundaries -------------------------------------------------------------------
    def _pre(self, k: int):
        def hook(module, args):
            self.mark(f"block {k} forward")
            self.record.fwd_start[k] = self.meter()
            self._block = k
            if args and isinstance(args[0], torch.Tensor):
                self._inputs[args[0].untyped_storage()] = k
            r = contextlib.ExitStack()
            r.enter_context(annotate(f"block {k}"))
            self._ranges.append(r)
            if k == 0 and torch.is_grad_enabled() and args and args[0].requires_grad:
                args[0].register_hook(self._bwd_end_block0)
        return hook

    def _post(self, k: int):
        def hook(module, args, out):
            self._ranges.pop().close()
            self._block = None
            self.record.fwd_end[k] = self.meter()
            if torch.is_grad_enabled() and out.requires_grad:
                out.register_hook(lambda grad: self._bwd_start(k))
        return hook

    # backward boundaries (gradient hooks fire once the gradient is complete) --------------
    def _bwd_start(self, k: int) -> None:
        self.mark(f"block {k} backward")
        self.record.bwd_start[k] = self.meter()

    def _bwd_end_block0(self, grad) -> None:
        self.mark("blocks backward end")
        self.record.bwd_end_block0 = self.meter()

    # saved tensors -----------------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        k = self._block
        if k is not None and t.untyped_storage().data_ptr() not in self._params:
            self._saved_by_block[k][t.untyped_storage()] = None  # keyed by storage: distinct storages
        return t.detach()  # a saved output holding its grad_fn would keep its node (and memory) alive

    def __enter__(self) -> "BlockProbe":
        self._saved_by_block: dict[int, WeakIdKeyDictionary] = defaultdict(WeakIdKeyDictionary)
        self._inputs = WeakIdKeyDictionary()  # storage of block k's input -> k
        for k, block in enumerate(self.blocks):
            self._handles.append(block.register_forward_pre_hook(self._pre(k)))
            self._handles.append(block.register_forward_hook(self._post(k)))
            for name, sub in block.named_modules():
                if name:
                    self._handles.append(sub.register_forward_pre_hook(self._enter_module(name)))
                    self._handles.append(sub.register_forward_hook(self._exit_module))
        if self.ledger is not None:
            self._stack.enter_context(torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t))
            self._stack.enter_context(self.ledger)
        return self

    def collect(self) -> ProbeRecord:
        """Resolve saved storages to their origins; call after the forward, before the backward
        frees them."""
        if self.ledger is None:
            raise ValueError("saved-tensor attribution needs BlockProbe(ledger=True)")
        self.record.saved = []
        for k, storages in sorted(self._saved_by_block.items()):
            for s in list(storages.keys()):
                o = self.ledger.origins.get(s)
                if self._inputs.get(s) == k:
                    op, module = INPUT, ""
                elif o is None:
                    op, module = "allocated before the probe", ""
                elif o.block != k:
                    op, module = f"{o.op} (outside the block)", o.module
                else:
                    op, module = o.op, o.module
                self.record.saved.append(Saved(k, op, module, s.nbytes()))
        return self.record

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._stack.close()
        return False


# ----------------------------------------------------------------------------------------------
# The facts, from plain records
@dataclass(frozen=True)
class SavedOp:
    """One contributing operation: an aten op in one module of the block."""

    op: str
    module: str
    nbytes: int
    tensors: int
    share: float  # of the block's saved bytes


@dataclass(frozen=True)
class BlockMemoryFacts:
    """(f) for one probed block (the middle one: every block is the same, the ends border the
    embedding and the LM head), with each block's readings for the spread."""

    block: int
    saved_bytes: int  # distinct storages the block's forward kept for backward
    top: list[SavedOp]  # the `top` largest contributing operations, largest first
    top_share: float
    ops: list[SavedOp]  # all of them (shares sum to 1)
    forward_growth_bytes: list[int]  # per block: allocated at its forward's end - at its start
    backward_change_bytes: list[int]  # per block: allocated at its backward's end - at its start
    grad_bytes_measured: int  # forward growth + backward change of the probed block
    block_params: int
    grad_bytes_expected: int  # block params x bytes per gradient element

    def to_json(self) -> dict:
        return asdict(self)


def block_memory_facts(record: ProbeRecord, block_params: int, grad_elem_bytes: int, top: int = 5,
                       block: int | None = None) -> BlockMemoryFacts:
    n = record.num_blocks
    if n < 1:
        raise ValueError("no blocks were probed")
    k = n // 2 if block is None else block
    missing = [i for i in range(n) if i not in record.fwd_start or i not in record.fwd_end or i not in record.bwd_start]
    if missing or record.bwd_end_block0 is None:
        raise ValueError(f"block boundaries missing for blocks {missing or '[end of block 0 backward]'}: "
                         "was the probe's forward run with gradients and its backward run inside the probe?")
    groups: dict[tuple[str, str], list[int]] = defaultdict(list)
    for s in record.saved:
        if s.block == k:
            groups[(s.op, s.module)].append(s.nbytes)
    total = sum(sum(v) for v in groups.values())
    if total <= 0:
        raise ValueError(f"block {k} saved nothing for backward: was the probe built with ledger=True?")
    ops = sorted((SavedOp(op, mod, sum(v), len(v), sum(v) / total) for (op, mod), v in groups.items()),
                 key=lambda o: (-o.nbytes, o.module, o.op))
    fwd = [record.fwd_end[i] - record.fwd_start[i] for i in range(n)]
    # block i's backward runs from the gradient of its output to that of its input (block i-1's output)
    ends = [record.bwd_end_block0] + [record.bwd_start[i - 1] for i in range(1, n)]
    bwd = [ends[i] - record.bwd_start[i] for i in range(n)]
    return BlockMemoryFacts(block=k, saved_bytes=total, top=ops[:top], top_share=sum(o.share for o in ops[:top]),
                            ops=ops, forward_growth_bytes=fwd, backward_change_bytes=bwd,
                            grad_bytes_measured=fwd[k] + bwd[k], block_params=block_params,
                            grad_bytes_expected=block_params * grad_elem_bytes)


def probe_block_memory(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: str = "fp32",
                       top: int = 5) -> BlockMemoryFacts:
    """One probed forward + backward of a TransformerLM (gradients set to None first, as a
    training step's zero_grad leaves them, so the backward allocates them); the meter is the CUDA
    allocator's allocated bytes on a GPU, the ledger's live bytes elsewhere."""
    from impl.workloads.steps import autocast_ctx
    from impl.model import cross_entropy

    meter = (lambda: torch.cuda.memory_allocated(x.device)) if x.device.type == "cuda" else None
    model.zero_grad(set_to_none=True)
    with BlockProbe(model.layers, meter=meter, ledger=True) as probe:
        with autocast_ctx(dtype, x.device):
            loss = cross_entropy(model(x), y)
        record = probe.collect()
        loss.backward()
    del loss
    block = model.layers[record.num_blocks // 2]
    params = list(block.parameters())
    model.zero_grad(set_to_none=True)
    return block_memory_facts(record, sum(p.numel() for p in params), params[0].element_size(), top=top)
