"""AdamW for bf16 parameters with fp32 master weights, in one pass over memory.

A bf16 parameter is the upper half of its fp32 master: the parameter holds the master rounded to
bf16 (round to nearest even, as torch's .to(torch.bfloat16)) and the optimizer state holds the
rest, `state[p]["master_lo"]`, the master minus that rounding in fp32 bit steps (int16); together
they are the master (`join_master`, `AdamWMaster.master(p)`). The moments are fp32. A step reads
the bf16 gradient, updates master, exp_avg and exp_avg_sq in fp32 with the arithmetic of
impl.model.AdamW (that of torch.optim.AdamW: decoupled weight decay, bias-corrected moments) and
splits the master again, each element read and written once,

    read   grad 2 B + param 2 B + master_lo 2 B + exp_avg 4 B + exp_avg_sq 4 B = 14 B
    write         param 2 B + master_lo 2 B + exp_avg 4 B + exp_avg_sq 4 B = 12 B   (26 B per parameter;

a separate fp32 master copy would move 28 B, as much as torch's fused fp32 AdamW: read and write
the master, and write its bf16 rounding too. It would also hold 2 B more per parameter.)

The split is exact but for one case: the remainder of a master to its nearest-even rounding lies
in [-2^15, 2^15] bit steps, 2^16 + 1 values, one too many for int16. A master exactly halfway
above its (even) rounding keeps a remainder of 2^15 - 1: it moves one fp32 bit step (2^-23 of its
value at most) towards the rounding, and the bf16 parameter stays its nearest-even rounding. (A
rounding half away from zero would keep every master exact, but then the bf16 weights would not
be torch's rounding of the masters.) Elsewhere the master is the fp32 value AdamW computes.

The step count stays on the host: the bias corrections reach the kernel as scalars, so nothing
waits for the device.

One launch per step for all bf16 parameters (of one device and step count): a launch costs
~100 µs of host time on the H100 machine, and one per tensor (225 for 2.7B) kept the fast training
step host-bound. The launch reads a per-step table of the tensors' addresses (one pinned
host-to-device copy: the gradients are new tensors every step) and block tables cached on the
device (program -> tensor, block). The addresses come from memory, so Triton cannot know their
alignment or the tensors' sizes: the kernel declares the addresses 16-byte aligned (the host
checks it: parameters and state must be, a misaligned gradient is copied) and runs full blocks
without a mask, so their loads and stores stay 16-byte vectors; only each tensor's last block is
masked. (correctness/test_training_step.py compiles the kernel for sm_90 on the CPU and checks
the PTX for the vector loads.)

Where the kernel runs: on CUDA tensors. On CPU tensors the same update runs as torch ops
(impl.model.AdamW's foreach arithmetic on the joined masters, then the split), unless
`kernel="triton"` asks for the kernel: then it runs through the Triton interpreter, which
needs TRITON_INTERPRET=1 set before this module is imported (impl.attention.flash_triton's
convention: triton.jit decides at decoration time). The interpreter is not the CPU default even
when set (conftest.py sets it for every CPU run, the perf smoke included): it takes ~1 µs per
element, half a second per step for the smoke model's LM head alone. `kernel="torch"` forces the
torch ops.

fp32 parameters in the same optimizer (embedding, norm gains) get impl.model.AdamW's own update
(foreach, or torch._fused_adamw_ with fused=True).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from impl.runtime import launch_ctx

from .optim import AdamW

LOW_PRECISION = (torch.bfloat16,)  # the kernel's rounding is bf16's

# triton.jit decides at decoration time whether kernels run in the interpreter.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Elements per program on the GPU: 1024 with 4 warps is 8 per thread (16-byte bf16 loads); the
# probe (tools/probes/adamw_master_probe.py) found it ~0.7 ms faster than 2048 with 8 warps at 2.7B
# on two H100s. The interpreter runs programs one after another, each a few numpy ops: there fewer,
# larger blocks.
GPU_BLOCK_SIZE, NUM_WARPS = 1024, 4
BLOCK_SIZE = 2**16 if _INTERPRETED else GPU_BLOCK_SIZE


@triton.jit
def _adamw_master_kernel(pointers, numels, block_tensor, block_index, n_tensors,
                         decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias2_sqrt,
                         BLOCK_SIZE: tl.constexpr):
    """One AdamW step of BLOCK_SIZE elements of one of n_tensors parameters (the multi-tensor
    launch, module doc): program p updates block block_index[p] of tensor block_tensor[p], whose
    five addresses are column t of `pointers` (rows: param, grad, master_lo, exp_avg, exp_avg_sq)
    and whose size is numels[t]. decay = 1 - lr * weight_decay, step_size = lr / (1 - beta1^step),
    bias2_sqrt = sqrt(1 - beta2^step)."""
    t = tl.load(block_tensor + tl.program_id(0))
    start = tl.load(block_index + tl.program_id(0)).to(tl.int64) * BLOCK_SIZE
    n = tl.load(numels + t)
    param = _column_ptr(pointers, 0, n_tensors, t, tl.bfloat16)
    grad = _column_ptr(pointers, 1, n_tensors, t, tl.bfloat16)
    master_lo = _column_ptr(pointers, 2, n_tensors, t, tl.int16)
    exp_avg = _column_ptr(pointers, 3, n_tensors, t, tl.float32)
    exp_avg_sq = _column_ptr(pointers, 4, n_tensors, t, tl.float32)
    offs = start + tl.arange(0, BLOCK_SIZE)
    # a full block without a mask: its loads are 16-byte vectors (n is read from memory, so a mask
    # `offs < n` has no known constancy and would split every load into scalars)
    args = (param, grad, master_lo, exp_avg, exp_avg_sq, offs, n,
            decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias2_sqrt)
    if start + BLOCK_SIZE <= n:
        _adamw_block(*args, MASKED=False)
    else:
        _adamw_block(*args, MASKED=True)


@triton.jit
def _column_ptr(pointers, row, n_tensors, t, dtype: tl.constexpr):
    """Address pointers[row, t] as a pointer to `dtype`, 16-byte aligned (the host checks it)."""
    ptr = tl.load(pointers + row * n_tensors + t).to(tl.pointer_type(dtype))
    return tl.multiple_of(ptr, 16)


@triton.jit
def _adamw_block(param, grad, master_lo, exp_avg, exp_avg_sq, offs, n,
                 decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias2_sqrt, MASKED: tl.constexpr):
    """The update of the elements `offs` of one tensor (base pointers), masked to `n` if MASKED."""
    if MASKED:
        mask, other = offs < n, 0
    else:
        mask, other = None, None
    param, grad, master_lo = param + offs, grad + offs, master_lo + offs
    exp_avg, exp_avg_sq = exp_avg + offs, exp_avg_sq + offs
    g = tl.load(grad, mask=mask, other=other).to(tl.float32)
    w = _join_master(tl.load(param, mask=mask, other=other), tl.load(master_lo, mask=mask, other=other))
    m = tl.load(exp_avg, mask=mask, other=other)
    v = tl.load(exp_avg_sq, mask=mask, other=other)
    w = w * decay
    m = m + one_minus_beta1 * (g - m)  # lerp(m, g, 1 - beta1), as torch computes it for weights < 0.5
    v = v * beta2 + one_minus_beta2 * g * g
    # IEEE-rounded sqrt and divisions (tl.sqrt and / are approximate on the GPU), as torch computes
    denom = tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + eps
    w = w - step_size * tl.div_rn(m, denom)
    hi, lo = _split_master(w)
    tl.store(param, hi, mask=mask)
    tl.store(master_lo, lo, mask=mask)
    tl.store(exp_avg, m, mask=mask)
    tl.store(exp_avg_sq, v, mask=mask)


@triton.jit
def _rtne_bits(x):
    """The bits of fp32 x rounded to bf16, round to nearest even (as torch's .to(torch.bfloat16)),
    as uint32, in integer ops: the interpreter's fp32 -> bf16 cast truncates (Triton 3.6), and on
    the GPU the few integer ops are free in a memory-bound kernel, so the one code path runs, and
    is tested, on both. NaN becomes the quiet 0x7FC0; finite values past the largest bf16 round
    to inf, as in torch."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(x != x, 0x7FC0, rounded)


@triton.jit
def _split_master(w):
    """(hi, lo): fp32 w rounded to bf16 (nearest even) and w's remainder to it in fp32 bit steps,
    int16, 2^15 clamped to 2^15 - 1 (module doc). The difference is taken modulo 2^32, so it is
    the true one for every finite w (same sign as its rounding); a NaN's stays a NaN once joined."""
    hi = _rtne_bits(w)
    diff = (w.to(tl.uint32, bitcast=True) - (hi << 16)).to(tl.int32, bitcast=True)
    lo = tl.minimum(tl.maximum(diff, -32768), 32767).to(tl.int16)
    return hi.to(tl.uint16).to(tl.bfloat16, bitcast=True), lo


@triton.jit
def _join_master(hi, lo):
    """The fp32 master from its bf16 rounding `hi` and remainder `lo` (int16): bits(hi) * 2^16 + lo,
    modulo 2^32."""
    hi_bits = hi.to(tl.uint16, bitcast=True).to(tl.uint32) << 16
    return (hi_bits + lo.to(tl.int32).to(tl.uint32, bitcast=True)).to(tl.float32, bitcast=True)


def split_master(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The torch ops of the kernel's split (module doc): fp32 `w` -> (bf16 rounding, int16 lo)."""
    hi = w.to(torch.bfloat16)
    # int64: the difference of two int32 bit patterns cannot overflow
    diff = w.view(torch.int32).to(torch.int64) - (hi.view(torch.int16).to(torch.int64) << 16)
    return hi, diff.clamp_(-(2**15), 2**15 - 1).to(torch.int16)


def join_master(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The fp32 master of a bf16 parameter `hi` from its int16 remainder `lo` (module doc)."""
    # bits(hi) sign-extended times 2^16 is the int32 bit pattern of hi as fp32; adding lo stays in
    # int32's range for every value the split leaves (module doc), so the cast back is exact
    bits = (hi.view(torch.int16).to(torch.int64) << 16) + lo.to(torch.int64)
    return bits.to(torch.int32).view(torch.float32)


ALIGN = 16  # bytes: _column_ptr promises Triton this alignment, for vector loads and stores


def _aligned(grad: torch.Tensor) -> torch.Tensor:
    """The gradient as the kernel reads it: contiguous and ALIGN-byte aligned (a copy otherwise)."""
    grad = grad.contiguous()
    return grad if grad.data_ptr() % ALIGN == 0 else grad.clone()


def block_tables(numels: list[int], block: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block_tensor, block_index), int32 on `device`: for each program of the multi-tensor launch,
    the tensor it updates and which of that tensor's blocks."""
    counts = torch.tensor([triton.cdiv(n, block) for n in numels], dtype=torch.int64)
    block_tensor = torch.repeat_interleave(torch.arange(len(numels)), counts)
    first = torch.cumsum(counts, 0) - counts  # each tensor's first program
    block_index = torch.arange(int(counts.sum())) - torch.repeat_interleave(first, counts)
    return block_tensor.to(device=device, dtype=torch.int32), block_index.to(device=device, dtype=torch.int32)


def master_update(tensors: list[tuple[torch.Tensor, ...]], step: int, lr: float, beta1: float, beta2: float,
                  eps: float, weight_decay: float, block_size: int | None = None,
                  tables: dict | None = None) -> None:
    """One launch of the kernel over every (param, grad, master_lo, exp_avg, exp_avg_sq) in
    `tensors` (each five contiguous, 16-byte aligned tensors of one shape and device; param and grad
    bf16, master_lo int16, the moments fp32); `step` is their already advanced host step count.
    `tables` caches the block tables per (sizes, block, device) between steps (they change only
    with the parameters)."""
    if not tensors:
        return
    block = block_size or BLOCK_SIZE
    device = tensors[0][0].device
    numels = [ts[0].numel() for ts in tensors]
    key = (tuple(numels), block, str(device))
    tables = {} if tables is None else tables
    if key not in tables:
        if len(tables) >= 8:  # a set of parameters that changes every step: keep the cache bounded
            tables.clear()
        tables[key] = block_tables(numels, block, device)
    block_tensor, block_index = tables[key]
    if block_tensor.numel() == 0:
        return
    # the per-step table: five addresses per tensor (the gradients are new tensors every step) and
    # its size, one host-to-device copy (pinned, so it does not wait for the queued backward)
    table = torch.tensor([[ts[row].data_ptr() for ts in tensors] for row in range(5)] + [numels], dtype=torch.int64)
    if device.type == "cuda":
        table = table.pin_memory().to(device, non_blocking=True)
    n = len(tensors)
    with launch_ctx(tensors[0][0], "impl::adamw_master"):
        _adamw_master_kernel[(block_tensor.numel(),)](
            table, table[5], block_tensor, block_index, n,
            1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2, eps,
            lr / (1.0 - beta1 ** step), (1.0 - beta2 ** step) ** 0.5,
            BLOCK_SIZE=block, num_warps=NUM_WARPS)


class AdamWMaster(AdamW):
    """impl.model.AdamW for a mix of fp32 and bf16 parameters: the bf16 ones are updated through
    fp32 masters (module doc: the bf16 parameter is the master's upper half, `state[p]["master_lo"]`
    the rest; `master(p)` joins them), the others as AdamW does.

    A bf16 parameter needs its master before its first step: give the optimizer fp32 parameters
    and let `cast_params_` store them in bf16, so each master starts from the exact fp32 value,
    not from its rounding. A bf16 parameter without a master, or whose gradient is not bf16, is
    an error (never a silent update in the wrong precision).
    kernel: None (Triton on CUDA, torch ops on the CPU), "triton" (on the CPU through the
    interpreter) or "torch"; block_size overrides the kernel's elements per program."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 fused: bool = False, kernel: str | None = None, block_size: int | None = None):
        if kernel not in (None, "triton", "torch"):
            raise ValueError(f"AdamWMaster: kernel must be None, 'triton' or 'torch', got {kernel!r}")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)
        self.kernel, self.block_size = kernel, block_size
        self._tables: dict = {}  # master_update's block tables

    @torch.no_grad()
    def cast_params_(self, params, dtype: torch.dtype = torch.bfloat16) -> None:
        """Keep each fp32 parameter's value as its master: store the parameter itself in `dtype`,
        its rounding (the same Parameter object: modules and param_groups keep it), and the rest in
        state[p]["master_lo"] (module doc)."""
        if dtype not in LOW_PRECISION:
            raise ValueError(f"AdamWMaster.cast_params_: dtype must be one of {LOW_PRECISION}, got {dtype}")
        mine = {id(p) for g in self.param_groups for p in g["params"]}
        for p in params:
            if id(p) not in mine:
                raise ValueError(f"AdamWMaster.cast_params_: a parameter of shape {tuple(p.shape)} is not in "
                                 "this optimizer")
            if p.dtype != torch.float32:
                raise ValueError(f"AdamWMaster.cast_params_: parameters must be fp32 before the cast (their value "
                                 f"becomes the master), got {p.dtype}")
            if not p.is_contiguous():
                raise ValueError("AdamWMaster.cast_params_: the kernel needs contiguous parameters")
            if "step" in self.state[p]:
                raise ValueError("AdamWMaster.cast_params_: the parameter has taken steps already")
            p.data, self.state[p]["master_lo"] = split_master(p.detach())

    @torch.no_grad()
    def master(self, p: torch.Tensor) -> torch.Tensor:
        """The fp32 master of the bf16 parameter p (a new tensor, joined from p and its remainder)."""
        if "master_lo" not in self.state[p]:
            raise ValueError(f"AdamWMaster.master: the parameter of shape {tuple(p.shape)} has no master")
        return join_master(p.detach(), self.state[p]["master_lo"])

    def _advance(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if p.dtype in LOW_PRECISION and "step" not in state:
            # the moments of a bf16 parameter are fp32, like its master
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        return super()._advance(p)

    def _check(self, p: torch.Tensor) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("AdamWMaster does not support sparse gradients")
        if p.grad.dtype != p.dtype:
            raise RuntimeError(f"AdamWMaster: a {p.dtype} parameter of shape {tuple(p.shape)} has a {p.grad.dtype} "
                               "gradient; its update reads a gradient of the parameter's dtype")
        lo = self.state[p].get("master_lo")
        if lo is None:
            raise RuntimeError(f"AdamWMaster: the {p.dtype} parameter of shape {tuple(p.shape)} has no fp32 master; "
                               "give the optimizer fp32 parameters and cast them with cast_params_")
        if lo.dtype != torch.int16 or lo.shape != p.shape or lo.device != p.device:
            raise RuntimeError(f"AdamWMaster: the master_lo of a parameter of shape {tuple(p.shape)} must be int16 of "
                               f"the same shape and device, got {lo.dtype} {tuple(lo.shape)} on {lo.device}")
        for name, t in (("parameter", p), ("master_lo", lo), *((k, self.state[p][k]) for k in ("exp_avg", "exp_avg_sq")
                                                                 if k in self.state[p])):
            if not t.is_contiguous() or t.data_ptr() % ALIGN:
                raise RuntimeError(f"AdamWMaster: the {name} of shape {tuple(p.shape)} must be contiguous and "
                                   f"{ALIGN}-byte aligned (the kernel's vector loads), got strides {t.stride()} "
                                   f"at address {t.data_ptr():#x}")

    def _use_kernel(self, p: torch.Tensor) -> bool:
        if self.kernel is None:
            return p.is_cuda
        if self.kernel == "triton" and not (p.is_cuda or _INTERPRETED):
            raise ValueError("AdamWMaster(kernel='triton'): CPU parameters need the Triton interpreter; set "
                             "TRITON_INTERPRET=1 before impl.model.adamw_master is first imported")
        return self.kernel == "triton"

    def _step_group(self, group: dict) -> None:
        low = [p for p in group["params"] if p.grad is not None and p.dtype in LOW_PRECISION]
        for p in low:  # every check before any state or parameter changes
            self._check(p)
        use_kernel = [self._use_kernel(p) for p in low]
        super()._step_group({**group, "params": [p for p in group["params"] if p.dtype not in LOW_PRECISION]})
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        launches: dict[tuple, list[tuple]] = {}  # (step, device) -> the kernel's tensors, one launch each
        by_step: dict[tuple, list[torch.Tensor]] = {}  # the same for the torch ops
        for p, kernel in zip(low, use_kernel):
            state = self._advance(p)
            if kernel:
                launches.setdefault((state["step"], p.device), []).append(
                    (p.detach(), _aligned(p.grad), state["master_lo"], state["exp_avg"], state["exp_avg_sq"]))
            else:
                by_step.setdefault((state["step"], p.device), []).append(p)
        for (step, _), tensors in launches.items():
            master_update(tensors, step, lr, beta1, beta2, eps, wd, self.block_size, self._tables)
        for (step, _), ps in by_step.items():  # the torch ops: AdamW's arithmetic on the masters, then the split
            states = [self.state[p] for p in ps]
            masters = [self.master(p) for p in ps]
            self._foreach_update(masters, [p.grad.float() for p in ps], [s["exp_avg"] for s in states],
                                 [s["exp_avg_sq"] for s in states], step, lr, beta1, beta2, eps, wd)
            for p, s, w in zip(ps, states, masters):  # in place, as the kernel writes them
                hi, lo = split_master(w)
                p.copy_(hi)
                s["master_lo"].copy_(lo)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict casts every state tensor of a floating parameter to its dtype;
        a bf16 parameter's moments are fp32 and its master_lo int16, and they are put back so."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            saved = state_dict["state"].get(i, {})
            for key, dtype in (("master_lo", torch.int16), ("exp_avg", torch.float32), ("exp_avg_sq", torch.float32)):
                if p.dtype in LOW_PRECISION and key in saved:
                    self.state[p][key] = saved[key].to(device=p.device, dtype=dtype)
