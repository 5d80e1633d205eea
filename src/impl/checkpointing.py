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
  keep_attention  every block checkpointed but the last k (k >= 0, run plainly), each keeping its
           attention's output o and log-sum-exp beside its input, so the recompute in backward
           runs the norms, projections, RoPE and SwiGLU again but never the attention forward (on
           long contexts the most expensive part of a block's forward). Needs a FlashAttention with
           separate halves (impl.attention.attention_halves: flash_torch, flash_triton, the Gluon pairs). Per
           checkpointed block: R + o + lse saved; block forwards L + (L − k), attention forwards L.
The closed forms (exact recursions, not only the asymptotics) are
impl.accounting.checkpoint_peak_activation_bytes / checkpoint_block_forwards.
"""
from __future__ import annotations

import contextlib
import types
from contextlib import contextmanager
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from impl.annotate import part
from impl.saved_tensors import saved_tensor_bytes

POLICIES = ("none", "every_k", "nested", "keep_attention")


class AttentionKeeper:
    """A block's `attend` for keep_attention. Outside a keeping checkpoint it is plain
    FlashAttention. Inside one, the checkpoint's forward records each call's (o, lse) in the
    checkpoint's own slot, and its recompute replays them in the same order instead of running the
    forward again. A slot belongs to one checkpoint call (made by its context_fn), so a forward that
    never reaches backward leaves nothing for a later step to replay."""

    def __init__(self, attn_impl: str):
        from impl.attention import PrecomputedAttention, attention_halves  # late: attention imports triton

        self.attn_impl = attn_impl
        self.forward, self.backward = attention_halves(attn_impl)
        self.precomputed = PrecomputedAttention
        self.slot: list | None = None
        self.replay = False

    def __call__(self, q, k, v, is_causal=False):
        if self.replay:
            o, lse = self.slot.pop(0)
        else:
            with torch.no_grad():
                o, lse = self.forward(q, k, v, bool(is_causal))
            if self.slot is not None:
                self.slot.append((o, lse))
        return self.precomputed.apply(q, k, v, o, lse, self.backward, bool(is_causal))

    @contextmanager
    def recording(self, slot: list, replay: bool):
        saved = self.slot, self.replay
        self.slot, self.replay = slot, replay
        try:
            yield
        finally:
            self.slot, self.replay = saved


@contextmanager
def _recompute_range():
    """The re-forward in backward, as a profiled step's "recompute" range (impl.annotate.part: opened on
    entry, so a checkpoint made outside a profiled step but recomputed inside one is still named)."""
    with part("recompute"):
        yield


def _recompute_named():
    """checkpoint's context_fn for the plain policies: nothing around the forward, the range around the recompute."""
    return contextlib.nullcontext(), _recompute_range()


def _keeping_contexts(keepers: list[AttentionKeeper]) -> Callable:
    """checkpoint's context_fn: one fresh slot per checkpoint call, recorded into by its forward
    and replayed from by its recompute (inside the "recompute" range)."""
    def context_fn():
        slot: list = []
        return _all(k.recording(slot, replay=False) for k in keepers), _all(
            [_recompute_range(), *(k.recording(slot, replay=True) for k in keepers)])
    return context_fn


@contextmanager
def _all(contexts):
    contexts = list(contexts)
    for c in contexts:
        c.__enter__()
    try:
        yield
    finally:
        for c in reversed(contexts):
            c.__exit__(None, None, None)


def _run_plain(blocks, lo: int, hi: int, x, rope, positions):
    for i in range(lo, hi):
        x = blocks[i](x, rope, positions)
    return x


def _checkpointed(fn: Callable, x: torch.Tensor) -> torch.Tensor:
    return checkpoint(fn, x, use_reentrant=False, context_fn=_recompute_named)


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


def run_keep_attention(blocks, x, rope, positions, plain: int):
    """Every block but the last `plain` checkpointed alone, keeping its attention's o and lse."""
    n = len(blocks)
    for i in range(n - plain):
        keepers = [blocks[i].attn.attend]
        x = checkpoint(lambda t, i=i: blocks[i](t, rope, positions), x, use_reentrant=False,
                       context_fn=_keeping_contexts(keepers))
    return _run_plain(blocks, n - plain, n, x, rope, positions)


def run_layers(model, x: torch.Tensor, positions: torch.Tensor, policy: str, k: int | None = None):
    blocks = model.layers
    if policy == "none":
        return _run_plain(blocks, 0, len(blocks), x, model.rope, positions)
    if policy == "every_k":
        return run_every_k(blocks, x, model.rope, positions, k)
    if policy == "nested":
        return run_nested(blocks, x, model.rope, positions)
    if policy == "keep_attention":
        return run_keep_attention(blocks, x, model.rope, positions, k)
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


TAKES_K = {"every_k": 1, "keep_attention": 0}  # policy -> the smallest k it takes


def apply_checkpointing(model, policy: str, k: int | None = None):
    """Sets the policy on `model` in place and returns it. every_k needs 1 <= k; k >= L is the
    same as none (one plain segment). keep_attention needs 0 <= k <= L (k = L is none)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown checkpointing policy {policy!r}; expected one of {POLICIES}")
    if policy in TAKES_K and (k is None or int(k) < TAKES_K[policy]):
        raise ValueError(f"{policy} needs k >= {TAKES_K[policy]}, got {k!r}")
    if policy == "keep_attention" and int(k) > len(model.layers):
        raise ValueError(f"keep_attention: k={k} plain blocks, but the model has {len(model.layers)}")
    if policy not in TAKES_K and k is not None:
        raise ValueError(f"policy {policy!r} takes no k")
    # Each block's attend back to its plain kernel; keep_attention then swaps in its keepers.
    for block in model.layers:
        if isinstance(block.attn.attend, AttentionKeeper):
            model.set_attention(block.attn.attend.attn_impl)
            break
    if policy == "none":
        model.__dict__.pop("forward", None)  # back to the class's forward
        model.__dict__.pop("checkpoint_policy", None)
        return model
    if policy == "keep_attention":
        for block in model.layers:
            block.attn.attend = AttentionKeeper(block.attn.attn_impl)
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
