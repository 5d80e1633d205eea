import math

import torch


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_hyperparameters(lr, betas, eps, weight_decay) -> None:
    """Reject what would otherwise train on NaN or fail later with an IndexError."""
    for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
        if not _is_number(value) or not math.isfinite(value) or value < 0:
            raise ValueError(f"AdamW: {name} must be a finite number >= 0, got {value!r}")
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2
            and all(_is_number(b) and 0.0 <= b < 1.0 for b in betas)):
        raise ValueError(f"AdamW: betas must be a pair (beta1, beta2), each in [0, 1), got {betas!r}")


class AdamW(torch.optim.Optimizer):
    """AdamW with the update of torch.optim.AdamW (decoupled weight decay, bias-corrected moments).

    The update is written with torch._foreach_* ops over each group's parameters, so a step costs
    a handful of multi-tensor kernels instead of ~8 small launches per parameter. `fused=True`
    runs the same update through torch._fused_adamw_ instead (torch.optim.AdamW(fused=True)'s
    kernel: one launch per chunk of tensors that reads each parameter, gradient and moment once);
    CUDA and, in recent torch, CPU.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01,
                 fused: bool = False):
        _check_hyperparameters(lr, betas, eps, weight_decay)
        if fused and not hasattr(torch, "_fused_adamw_"):
            raise ValueError(f"AdamW: fused=True needs torch._fused_adamw_, missing in torch {torch.__version__}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused))

    def _advance(self, p: torch.Tensor) -> dict:
        """p's state for this step: moments created (zero) at its first step, step count advanced."""
        if p.grad.is_sparse:
            raise RuntimeError("AdamW does not support sparse gradients")
        state = self.state[p]
        if "step" not in state:  # state may hold other entries already (AdamWMaster's "master_lo")
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] += 1
        return state

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._step_group(group)
        return loss

    def _step_group(self, group: dict) -> None:
        """One group's update; subclasses change how the arithmetic runs, not the state."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        grads, exp_avgs, exp_avg_sqs = [], [], []
        for p in params:
            state = self._advance(p)
            grads.append(p.grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        # All parameters of a group advance together, so they share one step count, except
        # after add_param_group or for parameters whose grads appear late: group by step (and
        # by device and dtype, which multi-tensor kernels need to share).
        by_step: dict[tuple, list[int]] = {}
        for i, p in enumerate(params):
            by_step.setdefault((self.state[p]["step"], p.device, p.dtype), []).append(i)
        for (step, device, _), idx in by_step.items():
            ps = [params[i] for i in idx]
            gs = [grads[i] for i in idx]
            ms = [exp_avgs[i] for i in idx]
            vs = [exp_avg_sqs[i] for i in idx]
            if group.get("fused"):
                # the kernel reads the (already incremented) step from a device tensor; a fill,
                # not a host copy, so the step does not wait for the device
                steps = [torch.full((), float(step), device=device)] * len(ps)
                torch._fused_adamw_(ps, gs, ms, vs, [], steps, lr=lr, beta1=beta1, beta2=beta2,
                                    weight_decay=wd, eps=eps, amsgrad=False, maximize=False)
                continue
            self._foreach_update(ps, gs, ms, vs, step, lr, beta1, beta2, eps, wd)

    @staticmethod
    def _foreach_update(ps, gs, ms, vs, step: int, lr: float, beta1: float, beta2: float, eps: float,
                        wd: float) -> None:
        """The AdamW arithmetic of torch.optim.AdamW on lists of same-device, same-dtype tensors
        (parameters, gradients, first and second moments) that share the step count `step`."""
        if wd != 0:
            torch._foreach_mul_(ps, 1 - lr * wd)
        torch._foreach_lerp_(ms, gs, 1 - beta1)
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - beta2)
        bias1 = 1 - beta1 ** step
        bias2 = 1 - beta2 ** step
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, math.sqrt(bias2))
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(ps, ms, denom, value=-lr / bias1)
