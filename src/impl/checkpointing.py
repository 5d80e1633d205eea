"""gradient_checkpointing: activation-checkpointing policies for impl.model.TransformerLM, applied
to a built model without touching its code.

`apply_checkpointing(model, policy, k=None)` replaces the model's forward (on the instance only) by
one that runs `model.layers` under a policy; `apply_checkpointing(model, "none")` restores the
class's own forward. Checkpoints are torch.utils.checkpoint with use_reentrant=False (works with
autocast, nests, and needs no input with requires_grad).

Policies (L blocks; B = bytes one block saves for backward; R = one residual-stream tensor):
  none     every block saves its activations: L·B live at the end of forward, L block forwards.
  every_k  single level: segments of k consecutive blocks; every segment but the last is
           checkpointed (its input is kept, its insides recomputed in backward). The last segment
           runs plainly, as torch.utils.checkpoint.checkpoint_sequential does: its activations are
           needed first in backward, so recomputing them would cost time and save no peak.
           Peak ≈ (ceil(L/k) − 1)·R + k·B; block forwards L + (L − k_last). Best k ≈ sqrt(L·R/B).
  nested   memory-optimal recursion on a segment of n blocks: checkpoint the first half (whose
           recomputation in backward applies the same scheme to itself), recurse into the second
           half; one block runs plainly. Every recursion level keeps one boundary, so
           peak = ceil(log2 L)·R + B = O(log L) boundaries, and each level recomputes half
           its blocks once: block forwards L + (L/2)·log2 L for L a power of two = O(L log L).
The closed forms (exact recursions, not only the asymptotics) are
impl.accounting.checkpoint_peak_activation_bytes / checkpoint_block_forwards.
"""
from __future__ import annotations

import types
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from impl.saved_tensors import saved_tensor_bytes

POLICIES = ("none", "every_k", "nested")


def _run_plain(blocks, lo: int, hi: int, x, rope, positions):
    for i in range(lo, hi):
        x = blocks[i](x, rope, positions)
    return x


def _checkpointed(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(fn, x, use_reentrant=False)


def run_every_k(blocks, x, rope, positions, k: int):
    n = len(blocks)
    for lo in range(0, n, k):
        hi = min(lo + k, n)
        if hi == n:  # last segment: plain (see the module docstring)
            x = _run_plain(blocks, lo, hi, x, rope, positions)
        else:
            x = _checkpointed(lambda t, lo=lo, hi=hi: _run_plain(blocks, lo, hi, t, rope, positions), x)
    return x


def nested_split(n: int) -> int:
    """Blocks in the checkpointed first half of an n-block segment; the rest is recursed into.
    The smaller half goes first so the recursion on the second half bounds the depth by ceil(log2 n)."""
    return n // 2


def run_nested(blocks, x, rope, positions, lo: int = 0, hi: int | None = None):
    hi = len(blocks) if hi is None else hi
    if hi - lo <= 1:
        return _run_plain(blocks, lo, hi, x, rope, positions)
    mid = lo + nested_split(hi - lo)
    # The recomputation of the first half calls run_nested again, so it is itself checkpointed.
    x = _checkpointed(lambda t: run_nested(blocks, t, rope, positions, lo, mid), x)
    return run_nested(blocks, x, rope, positions, mid, hi)


def run_layers(model, x: torch.Tensor, positions: torch.Tensor, policy: str, k: int | None = None):
    blocks = model.layers
    if policy == "none":
        return _run_plain(blocks, 0, len(blocks), x, model.rope, positions)
    if policy == "every_k":
        return run_every_k(blocks, x, model.rope, positions, k)
    if policy == "nested":
        return run_nested(blocks, x, model.rope, positions)
    raise ValueError(f"unknown checkpointing policy {policy!r}; expected one of {POLICIES}")


def _checkpointed_forward(self, token_ids: torch.Tensor, return_hidden: bool = False) -> torch.Tensor:
    """TransformerLM.forward with the block loop replaced by run_layers (same ops otherwise);
    return_hidden as there (the fused LM head + loss applies lm_head itself)."""
    self._check_input(token_ids)
    positions = torch.arange(token_ids.shape[1], device=token_ids.device)
    x = self.token_embeddings(token_ids)
    x = run_layers(self, x, positions, *self.checkpoint_policy)
    h = self.ln_final(x)
    return h if return_hidden else self.lm_head(h)


def apply_checkpointing(model, policy: str, k: int | None = None):
    """Sets the policy on `model` in place and returns it. every_k needs 1 <= k; k >= L is the
    same as none (one plain segment)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown checkpointing policy {policy!r}; expected one of {POLICIES}")
    if policy == "every_k" and (k is None or int(k) < 1):
        raise ValueError(f"every_k needs a segment length k >= 1, got {k!r}")
    if policy != "every_k" and k is not None:
        raise ValueError(f"policy {policy!r} takes no k")
    if policy == "none":
        model.__dict__.pop("forward", None)  # back to the class's forward
        model.__dict__.pop("checkpoint_policy", None)
        return model
    model.checkpoint_policy = (policy, None if k is None else int(k))
    model.forward = types.MethodType(_checkpointed_forward, model)
    return model


class BlockCallCounter:
    """Counts block forward calls (original and recomputed) through forward pre-hooks."""

    def __init__(self, model):
        self.calls = 0
        self._handles = [b.register_forward_pre_hook(self._hook) for b in model.layers]

    def _hook(self, module, args):
        self.calls += 1

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.remove()


def measured_terms(model, batch: int, seq: int, autocast_ctx) -> dict[str, int]:
    """B, R and the outside bytes measured with saved-tensor hooks on the model's own device and
    dtype (e.g. under bf16 autocast, where the closed form's uniform bytes-per-element is only an
    estimate): one block's forward on a random residual stream, then the final norm, LM head and
    loss. Costs one block's activations, never the whole model's."""
    from impl.model import cross_entropy

    device = next(model.parameters()).device
    params = list(model.parameters()) + list(model.buffers())
    g = torch.Generator(device="cpu").manual_seed(0)
    # requires_grad as the residual stream has: autograd saves nothing for ops on constants
    x = torch.randn(batch, seq, model.config["d_model"], generator=g).to(device).requires_grad_()
    y = torch.randint(0, model.vocab_size, (batch, seq), generator=g).to(device)
    positions = torch.arange(seq, device=device)
    with autocast_ctx:
        _, a_block = saved_tensor_bytes(lambda: model.layers[0](x, model.rope, positions), params + [x])
        _, a_out = saved_tensor_bytes(lambda: cross_entropy(model.lm_head(model.ln_final(x)), y), params + [x, y])
    # x (excluded above, being the caller's tensor) is kept by the first RMSNorm of each part:
    # a plain block's B and the head's bytes include their input, as in the closed form.
    r = x.numel() * x.element_size()
    return dict(a_block=a_block + r, a_resid=r, a_outside=a_out + r)
