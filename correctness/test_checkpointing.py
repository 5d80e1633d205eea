"""gradient_checkpointing: every policy gives the loss and gradients of the plain model, recomputes
exactly the block forwards the closed form counts, and keeps for backward what the memory model
says (saved-tensor hooks on the CPU, where no peak-memory counter exists)."""
import math

import pytest
import torch

from impl import accounting as acc
from impl import checkpointing as ckpt
from impl.checkpointing import BlockCallCounter, apply_checkpointing
from impl.model import TransformerLM, cross_entropy
from impl.model import MODEL_CONFIGS
from impl.saved_tensors import saved_tensor_bytes

TINY = MODEL_CONFIGS["tiny"]
V = 97


def _model(num_layers, seq=16):
    torch.manual_seed(0)
    return TransformerLM(**TINY.replace(num_layers=num_layers, vocab_size=V), context_length=seq)


def _batch(b=2, s=16):
    g = torch.Generator().manual_seed(1)
    t = torch.randint(0, V, (b, s + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def _loss_and_grads(model, x, y, dtype=None):
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", dtype=dtype) if dtype else torch.autocast("cpu", enabled=False)
    with ctx:
        loss = cross_entropy(model(x), y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


CASES = [("every_k", 1), ("every_k", 2), ("every_k", 3), ("every_k", 5), ("nested", None)]


@pytest.mark.parametrize("layers", [TINY["num_layers"], 5])
@pytest.mark.parametrize("policy,k", CASES)
def test_same_loss_and_grads_as_none(policy, k, layers):
    model = _model(layers)
    x, y = _batch()
    ref_loss, ref_grads = _loss_and_grads(model, x, y)
    apply_checkpointing(model, policy, k)
    loss, grads = _loss_and_grads(model, x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-6, atol=1e-6, msg=n)


@pytest.mark.parametrize("policy,k", [("every_k", 2), ("nested", None)])
def test_same_under_bf16_autocast(policy, k):
    """checkpoint replays the autocast state in recomputation, so bf16 results match too."""
    model = _model(4)
    x, y = _batch()
    ref_loss, ref_grads = _loss_and_grads(model, x, y, torch.bfloat16)
    apply_checkpointing(model, policy, k)
    loss, grads = _loss_and_grads(model, x, y, torch.bfloat16)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=1e-6)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-5, atol=1e-6, msg=n)


def test_none_restores_the_class_forward():
    model = _model(3)
    x, _ = _batch()
    ref = model(x)
    apply_checkpointing(model, "nested")
    assert "forward" in model.__dict__
    apply_checkpointing(model, "none")
    assert "forward" not in model.__dict__
    torch.testing.assert_close(model(x), ref, rtol=0, atol=0)


def test_bad_arguments():
    model = _model(2)
    for args in [("every_k", None), ("every_k", 0), ("nested", 2), ("sqrt", None)]:
        with pytest.raises(ValueError):
            apply_checkpointing(model, *args)


@pytest.mark.parametrize("layers", [1, 2, 3, 4, 5, 7, 8, 9])
@pytest.mark.parametrize("policy,k", [("none", None)] + CASES)
def test_block_forward_calls(policy, k, layers):
    """Forward + backward runs exactly checkpoint_block_forwards block forwards (pre-hook count)."""
    model = apply_checkpointing(_model(layers, seq=8), policy, k)
    x, y = _batch(1, 8)
    with BlockCallCounter(model) as count:
        cross_entropy(model(x), y).backward()
    assert count.calls == acc.checkpoint_block_forwards(policy, layers, k)


def test_block_forwards_closed_forms():
    for m in range(0, 8):
        L = 2 ** m
        assert acc.checkpoint_block_forwards("nested", L) == L + (L // 2) * m
    assert acc.checkpoint_block_forwards("every_k", 10, 3) == 10 + 9  # segments 3,3,3,1
    assert acc.checkpoint_block_forwards("every_k", 10, 10) == 10


def test_split_matches_accounting():
    assert all(ckpt.nested_split(n) == acc.nested_first_half(n) for n in range(1, 200))


def _visible_saved_bytes(model, x, y):
    """Bytes autograd keeps after forward + loss (parameters, buffers and inputs excluded)."""
    exclude = [*model.parameters(), *model.buffers(), x, y]
    loss, nbytes = saved_tensor_bytes(lambda: cross_entropy(model(x), y), exclude)
    del loss
    return nbytes


@pytest.mark.parametrize("layers", [4, 6, 8])
@pytest.mark.parametrize("policy,k", [("none", None), ("every_k", 1), ("every_k", 2), ("every_k", 3), ("nested", None)])
def test_saved_bytes_follow_the_model(policy, k, layers, monkeypatch):
    """End-of-forward memory (hook-visible saved bytes, boundaries included) equals the closed form:
    none L·B + outside; every_k (n_seg−1)·R + k_last·B + outside; nested ceil(log2 L)·R + B
    + outside, which is also its accounted peak (reached at the end of forward). Each boundary is one
    top-level checkpoint call on an R-byte input."""
    b, s = 2, 16
    model = apply_checkpointing(_model(layers, seq=s), policy, k)
    x, y = _batch(b, s)
    calls, depth = [], [0]  # input bytes of top-level checkpoints (nested ones run inside another)
    real = ckpt._checkpointed

    def counting(fn, t):
        if depth[0] == 0:
            calls.append(t.numel() * t.element_size())
        depth[0] += 1
        try:
            return real(fn, t)
        finally:
            depth[0] -= 1

    monkeypatch.setattr(ckpt, "_checkpointed", counting)
    visible = _visible_saved_bytes(model, x, y)
    terms = acc.checkpoint_terms(b, s, TINY["d_model"], TINY["d_ff"], TINY["num_heads"], V)
    B, R, out = terms["a_block"], terms["a_resid"], terms["a_outside"]
    assert all(c == R for c in calls)
    end_of_forward = visible
    if policy == "none":
        assert visible == layers * B + out and not calls
    elif policy == "every_k":
        seg = [min(k, layers - lo) for lo in range(0, layers, k)]
        assert len(calls) == len(seg) - 1
        assert end_of_forward == (len(seg) - 1) * R + seg[-1] * B + out
        # the accounted peak is the end of forward, or the backward of the last checkpointed
        # segment: the inputs of the segments before it plus its recomputed k·B
        n = len(seg)
        peak = acc.checkpoint_peak_activation_bytes(policy, layers, B, R, k)
        assert peak == (max(end_of_forward - out, (n - 2) * R + max(seg) * B) if n > 1 else layers * B)
    else:
        assert len(calls) == math.ceil(math.log2(layers))  # one boundary per recursion level
        assert end_of_forward == acc.checkpoint_peak_activation_bytes("nested", layers, B, R) + out
    # checkpointing never keeps more than the plain model
    assert end_of_forward <= layers * B + out


def test_nested_peak_is_logarithmic():
    B, R = 1000.0, 7.0
    for L in range(1, 130):
        depth = math.ceil(math.log2(L)) if L > 1 else 0
        want = depth * R + B
        assert acc.checkpoint_peak_activation_bytes("nested", L, B, R) == want


def test_best_k_minimises_and_tracks_sqrt_rule():
    for L, B, R in [(48, 100.0, 1.0), (48, 1.0, 1.0), (48, 1.0, 100.0), (16, 3.0, 1.0), (64, 50.0, 2.0)]:
        k = acc.best_every_k(L, B, R)
        peaks = [acc.checkpoint_peak_activation_bytes("every_k", L, B, R, j) for j in range(1, L + 1)]
        assert acc.checkpoint_peak_activation_bytes("every_k", L, B, R, k) == min(peaks)
        approx = math.sqrt(L * R / B)
        if 1 < approx < L:
            assert abs(k - approx) <= max(1.0, 0.5 * approx)
        assert k in acc.every_k_neighbours(k, L)
    # xl at batch 4, seq 2048 (fp32): a block saves ~60 residual streams, so the best k is 1
    t = acc.checkpoint_terms(4, 2048, 1600, 6400, 25)
    assert acc.best_every_k(48, t["a_block"], t["a_resid"]) == 1


def test_measured_terms_equal_closed_form_fp32():
    """The hook measurement the perf test uses for its predictions (one block, then the head)
    gives the accounting's B, R and outside bytes exactly in fp32."""
    import contextlib

    b, s = 2, 16
    model = _model(3, seq=s)
    got = ckpt.measured_terms(model, b, s, contextlib.nullcontext())
    assert got == acc.checkpoint_terms(b, s, TINY["d_model"], TINY["d_ff"], TINY["num_heads"], V)


def test_step_peak_phases():
    B, R, out, P = 100.0, 1.0, 50.0, 1000.0
    none = acc.checkpoint_step_peak_bytes("none", 8, B, R, out, P, P)
    assert none["forward_end"] == P + 8 * B + out and none["backward"] == 2 * P + 8 * B
    ek = acc.checkpoint_step_peak_bytes("every_k", 8, B, R, out, P, P, cast_cache_bytes=P / 2, k=3)
    assert ek["forward_end"] == P + P / 2 + out + 2 * R + 2 * B  # segments 3, 3, 2
    assert ek["backward"] == 2 * P + R + 3 * B
    assert ek["peak"] == max(ek["forward_end"], ek["backward"])
    nested = acc.checkpoint_step_peak_bytes("nested", 8, B, R, out, P, P)
    assert nested["forward_end"] == P + out + 3 * R + B


# ---- keep_attention: the recompute never runs the attention forward --------------------------

class _CountingHalves:
    """attention_halves("flash_torch") with the forward's calls counted."""

    def __init__(self):
        from impl.attention import attention_halves
        self.forward_fn, self.backward = attention_halves("flash_torch")
        self.calls = 0

    def forward(self, *args):
        self.calls += 1
        return self.forward_fn(*args)


def _flash_model(num_layers, seq=16):
    model = _model(num_layers, seq)
    model.set_attention("flash_torch")
    return model


@pytest.mark.parametrize("plain", [0, 1, 3])
def test_keep_attention_same_loss_and_grads_and_one_attention_forward_per_block(plain):
    model = _flash_model(4)
    x, y = _batch()
    ref_loss, ref_grads = _loss_and_grads(model, x, y)
    apply_checkpointing(model, "keep_attention", plain)
    counter = _CountingHalves()
    for block in model.layers:
        block.attn.attend.forward = counter.forward
    with BlockCallCounter(model) as blocks:
        loss, grads = _loss_and_grads(model, x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    for n in ref_grads:
        torch.testing.assert_close(grads[n], ref_grads[n], rtol=0, atol=0, msg=n)
    assert counter.calls == 4  # once per block: the recomputes replay the kept o and lse
    assert blocks.calls == 4 + (4 - plain)  # every checkpointed block's forward runs again
    # nothing kept for a later step: every slot was replayed (popped) by its recompute
    assert all(b.attn.attend.slot is None for b in model.layers)


def test_keep_attention_keeps_o_and_lse_until_its_recompute(monkeypatch):
    """Between forward and backward each checkpointed block holds exactly one (o, lse) beside its
    checkpointed input; its recompute takes them, so after backward nothing is held."""
    slots, real = [], ckpt.AttentionKeeper.recording

    def recording(self, slot, replay):
        if not replay and all(slot is not seen for seen in slots):
            slots.append(slot)
        return real(self, slot, replay)

    monkeypatch.setattr(ckpt.AttentionKeeper, "recording", recording)
    layers, plain, (b, s) = 3, 1, (2, 16)
    model = apply_checkpointing(_flash_model(layers, seq=s), "keep_attention", plain)
    x, y = _batch(b, s)
    loss = cross_entropy(model(x), y)
    h, hd = TINY["num_heads"], TINY["d_model"] // TINY["num_heads"]
    assert len(slots) == layers - plain
    for slot in slots:
        (o, lse), = slot
        assert o.shape == (b, h, s, hd) and lse.shape == (b, h, s) and lse.dtype == torch.float32
    loss.backward()
    assert all(slot == [] for slot in slots)


def test_keep_attention_refuses_an_attention_without_halves_and_bad_k():
    with pytest.raises(ValueError, match="no separate forward and backward halves"):
        apply_checkpointing(_model(2), "keep_attention", 0)  # the naive attention
    with pytest.raises(ValueError, match="k >= 0"):
        apply_checkpointing(_flash_model(2), "keep_attention", None)
    with pytest.raises(ValueError, match="plain blocks, but the model has 2"):
        apply_checkpointing(_flash_model(2), "keep_attention", 3)


def test_keep_attention_then_none_restores_the_plain_attention():
    model = _flash_model(2)
    plain = model.layers[0].attn.attend
    apply_checkpointing(model, "keep_attention", 1)
    assert isinstance(model.layers[0].attn.attend, ckpt.AttentionKeeper)
    apply_checkpointing(model, "none")
    assert model.layers[0].attn.attend is plain
