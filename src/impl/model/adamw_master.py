"""AdamW for bf16 parameters with fp32 master weights, in one pass over memory.

A bf16 parameter's fp32 master copy and moments live in the optimizer state (`state[p]["master"]`,
`"exp_avg"`, `"exp_avg_sq"`, all fp32). A step reads the bf16 gradient, updates master, exp_avg
and exp_avg_sq in fp32 with the arithmetic of impl.model.AdamW (that of torch.optim.AdamW:
decoupled weight decay, bias-corrected moments) and writes the master rounded to bf16 (round to
nearest even) back into the parameter: one Triton kernel per parameter tensor, each element read
and written once,

    read   grad 2 B + master 4 B + exp_avg 4 B + exp_avg_sq 4 B = 14 B
    write  param 2 B + master 4 B + exp_avg 4 B + exp_avg_sq 4 B = 14 B    (28 B per parameter,

as much as the fused fp32 AdamW moves; what bf16 weights save are autocast's casts around it:
fp32 weight -> bf16 in the forward, bf16 weight gradient -> fp32 .grad in the backward.) The
step count stays on the host: the bias corrections reach the kernel as scalars, so nothing waits
for the device.

Where the kernel runs: on CUDA tensors. On CPU tensors the same update runs as torch ops
(impl.model.AdamW's foreach arithmetic on the masters, then a copy into the bf16 parameters),
unless `kernel="triton"` asks for the kernel: then it runs through the Triton interpreter, which
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

from impl.runtime import device_ctx

from .optim import AdamW

LOW_PRECISION = (torch.bfloat16,)  # the kernel's rounding is bf16's

# triton.jit decides at decoration time whether kernels run in the interpreter.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
# Elements per program: 2048 with 8 warps is 8 per thread (16-byte bf16 loads) on the GPU; the
# interpreter runs programs one after another, each a few numpy ops: there fewer, larger blocks.
BLOCK_SIZE = 2**16 if _INTERPRETED else 2048
NUM_WARPS = 8


@triton.jit
def _adamw_master_kernel(param_ptr, grad_ptr, master_ptr, exp_avg_ptr, exp_avg_sq_ptr, n_elements,
                         decay, one_minus_beta1, beta2, one_minus_beta2, eps, step_size, bias2_sqrt,
                         BLOCK_SIZE: tl.constexpr):
    """One AdamW step of n_elements contiguous elements: decay = 1 - lr * weight_decay,
    step_size = lr / (1 - beta1^step), bias2_sqrt = sqrt(1 - beta2^step)."""
    start = tl.program_id(0).to(tl.int64) * BLOCK_SIZE
    offs = start + tl.arange(0, BLOCK_SIZE)
    mask = offs < n_elements
    g = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(master_ptr + offs, mask=mask, other=0.0)
    m = tl.load(exp_avg_ptr + offs, mask=mask, other=0.0)
    v = tl.load(exp_avg_sq_ptr + offs, mask=mask, other=0.0)
    w = w * decay
    m = m + one_minus_beta1 * (g - m)  # lerp(m, g, 1 - beta1), as torch computes it for weights < 0.5
    v = v * beta2 + one_minus_beta2 * g * g
    # IEEE-rounded sqrt and divisions (tl.sqrt and / are approximate on the GPU), as torch computes
    denom = tl.div_rn(tl.sqrt_rn(v), bias2_sqrt) + eps
    w = w - step_size * tl.div_rn(m, denom)
    tl.store(master_ptr + offs, w, mask=mask)
    tl.store(exp_avg_ptr + offs, m, mask=mask)
    tl.store(exp_avg_sq_ptr + offs, v, mask=mask)
    tl.store(param_ptr + offs, _to_bf16_rtne(w), mask=mask)


@triton.jit
def _to_bf16_rtne(x):
    """fp32 -> bf16, round to nearest even (as torch's .to(torch.bfloat16)), in integer ops: the
    interpreter's fp32 -> bf16 cast truncates (Triton 3.6), and on the GPU the few integer ops are
    free in a memory-bound kernel, so the one code path runs, and is tested, on both. NaN stays a
    (quiet) NaN; finite values past the largest bf16 round to inf, as in torch."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


def master_update(param: torch.Tensor, grad: torch.Tensor, master: torch.Tensor, exp_avg: torch.Tensor,
                  exp_avg_sq: torch.Tensor, step: int, lr: float, beta1: float, beta2: float, eps: float,
                  weight_decay: float, block_size: int | None = None) -> None:
    """One launch of the kernel on one parameter (all five tensors contiguous, of one shape; param
    and grad bf16, the rest fp32); `step` is the already advanced host step count."""
    n = param.numel()
    if n == 0:
        return
    block = block_size or BLOCK_SIZE
    with device_ctx(param):
        _adamw_master_kernel[(triton.cdiv(n, block),)](
            param, grad, master, exp_avg, exp_avg_sq, n,
            1.0 - lr * weight_decay, 1.0 - beta1, beta2, 1.0 - beta2, eps,
            lr / (1.0 - beta1 ** step), (1.0 - beta2 ** step) ** 0.5,
            BLOCK_SIZE=block, num_warps=NUM_WARPS)


class AdamWMaster(AdamW):
    """impl.model.AdamW for a mix of fp32 and bf16 parameters: the bf16 ones are updated through
    fp32 masters (module doc), the others as AdamW does.

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

    @torch.no_grad()
    def cast_params_(self, params, dtype: torch.dtype = torch.bfloat16) -> None:
        """Keep each fp32 parameter's value as its master (state[p]["master"]), then store the
        parameter itself in `dtype` (the same Parameter object: modules and param_groups keep it)."""
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
            self.state[p]["master"] = p.detach().clone()
            p.data = p.data.to(dtype)

    def _advance(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if p.dtype in LOW_PRECISION and "step" not in state:
            # the moments of a bf16 parameter are fp32, like its master
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(state["master"])
            state["exp_avg_sq"] = torch.zeros_like(state["master"])
        return super()._advance(p)

    def _check(self, p: torch.Tensor) -> None:
        if p.grad.is_sparse:
            raise RuntimeError("AdamWMaster does not support sparse gradients")
        if p.grad.dtype != p.dtype:
            raise RuntimeError(f"AdamWMaster: a {p.dtype} parameter of shape {tuple(p.shape)} has a {p.grad.dtype} "
                               "gradient; its update reads a gradient of the parameter's dtype")
        master = self.state[p].get("master")
        if master is None:
            raise RuntimeError(f"AdamWMaster: the {p.dtype} parameter of shape {tuple(p.shape)} has no fp32 master; "
                               "give the optimizer fp32 parameters and cast them with cast_params_")
        if master.dtype != torch.float32 or master.shape != p.shape or master.device != p.device:
            raise RuntimeError(f"AdamWMaster: the master of a parameter of shape {tuple(p.shape)} must be fp32 of "
                               f"the same shape and device, got {master.dtype} {tuple(master.shape)} on {master.device}")

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
        by_step: dict[tuple, list[torch.Tensor]] = {}
        for p, kernel in zip(low, use_kernel):
            state = self._advance(p)
            if kernel:
                master_update(p.detach(), p.grad.contiguous(), state["master"], state["exp_avg"], state["exp_avg_sq"],
                              state["step"], lr, beta1, beta2, eps, wd, self.block_size)
            else:
                by_step.setdefault((state["step"], p.device), []).append(p)
        for (step, _), ps in by_step.items():  # the torch ops: AdamW's arithmetic on the masters, then a copy
            states = [self.state[p] for p in ps]
            masters = [s["master"] for s in states]
            self._foreach_update(masters, [p.grad.float() for p in ps], [s["exp_avg"] for s in states],
                                 [s["exp_avg_sq"] for s in states], step, lr, beta1, beta2, eps, wd)
            torch._foreach_copy_(ps, masters)

    def load_state_dict(self, state_dict: dict) -> None:
        """torch's load_state_dict casts every floating state tensor to its parameter's dtype; a
        bf16 parameter's master and moments are fp32 and must stay so: they are put back in fp32."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params):
            saved = state_dict["state"].get(i, {})
            for key in ("master", "exp_avg", "exp_avg_sq"):
                if p.dtype in LOW_PRECISION and key in saved:
                    self.state[p][key] = saved[key].to(device=p.device, dtype=torch.float32)
