"""The memory accounting of naive attention (impl.attention.memory) against what autograd really
keeps: on the CPU, the tensors the forward saves for backward (saved_tensors_hooks, counted once
per storage); on a GPU, torch.cuda.memory_allocated before backward and the peaks."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.attention import naive_attention
from impl.attention.memory import dtype_bytes, naive_attention_memory


def saved_bytes(batch, seq, d, dtype, is_causal):
    q, k, v = (torch.randn(batch, seq, d, dtype=dtype, requires_grad=True) for _ in range(3))
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        naive_attention(q, k, v, is_causal=is_causal)
    return sum(storages.values())


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), seq=st.integers(1, 70), d=st.integers(1, 40), causal=st.booleans(),
       dtype=st.sampled_from(["fp32", "bf16", "fp64"]))
def test_saved_for_backward_matches_autograd(batch, seq, d, causal, dtype):
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}[dtype]
    derived = naive_attention_memory(batch, seq, d, dtype, is_causal=causal)
    assert saved_bytes(batch, seq, d, torch_dtype, causal) == derived.saved_for_backward


def test_one_score_matrix_is_saved_not_two():
    """Softmax saves its output and the 1/sqrt(d) scaling saves nothing: the scaled scores are not
    kept for backward, so doubling the sequence adds exactly batch·Δ(seq²)·bytes beyond Q,K,V."""
    b, d = 2, 8
    small, big = saved_bytes(b, 32, d, torch.float32, False), saved_bytes(b, 64, d, torch.float32, False)
    assert big - small == b * (64 ** 2 - 32 ** 2) * 4 + 3 * b * (64 - 32) * d * 4


def test_totals_are_ordered_and_scale():
    m = naive_attention_memory(8, 16384, 128, "fp32")
    assert m.scores_matrix == 8 * 16384 ** 2 * 4
    assert m.saved_for_backward < m.before_backward < m.backward_peak
    # dP, CUDA softmax backward's dP * P temporary and dS on top of P, plus dV
    assert m.backward_peak - m.before_backward == 3 * m.scores_matrix + 8 * 16384 * 128 * 4
    assert m.softmax_backward_temp == m.scores_matrix
    causal = naive_attention_memory(8, 16384, 128, "fp32", is_causal=True)
    assert causal.saved_for_backward - m.saved_for_backward == 16384 ** 2  # the bool mask
    assert naive_attention_memory(8, 1024, 64, "bf16").scores_matrix * 2 == naive_attention_memory(8, 1024, 64).scores_matrix


def test_dtype_bytes():
    assert [dtype_bytes(x) for x in ("fp32", "bf16", torch.float16, torch.float64)] == [4, 2, 2, 8]


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_measured_cuda_memory_matches_derived(causal):
    dev = torch.device("cuda")
    b, s, d = 4, 2048, 64
    # The first backward in a process gives the autograd thread its cuBLAS handle and a workspace
    # (32 MiB on the H100) that then stays allocated: make that happen before the measurement.
    w = torch.randn(2, 8, 8, device=dev, requires_grad=True)
    naive_attention(w, w, w).sum().backward()
    del w
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(dev)
    q, k, v, do = (torch.randn(b, s, d, device=dev) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    derived = naive_attention_memory(b, s, d, "fp32", is_causal=causal)
    torch.cuda.reset_peak_memory_stats(dev)
    out = naive_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(dev) - base
    fwd_peak = torch.cuda.max_memory_allocated(dev) - base
    torch.cuda.reset_peak_memory_stats(dev)
    out.backward(do)
    torch.cuda.synchronize()
    bwd_peak = torch.cuda.max_memory_allocated(dev) - base
    slack = 16 << 20  # allocator rounding (a quarter of one score matrix here)
    assert before == pytest.approx(derived.before_backward, abs=slack)
    assert fwd_peak - derived.grad_output == pytest.approx(derived.forward_peak, abs=slack)
    assert bwd_peak == pytest.approx(derived.backward_peak, rel=0.05, abs=slack)
