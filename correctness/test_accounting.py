"""The closed-form models of impl.accounting: hand-derivable cases, invariants, and the activation
count checked against what autograd really keeps alive after a forward pass."""
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from impl import accounting as acc
from impl.model import MODEL_SIZES, TransformerLM, cross_entropy, param_count
from impl.saved_tensors import saved_tensor_bytes


# --- 1. model memory ---------------------------------------------------------------------------

def test_training_state_is_16_bytes_per_param():
    assert acc.param_bytes(10) == 40 and acc.param_bytes(10, 2) == 20
    assert acc.adam_state_bytes(10) == 80
    assert acc.training_state_bytes(10) == 160
    n = param_count(**MODEL_SIZES["xl"])
    assert acc.training_state_bytes(n) == 16 * n


def test_residual_stream():
    assert acc.residual_stream_bytes(4, 128, 2560, 4) == 4 * 128 * 2560 * 4
    assert acc.residual_stream_bytes(4, 128, 2560, 2) * 2 == acc.residual_stream_bytes(4, 128, 2560, 4)


def test_activation_hand_case():
    # b=1, s=2, d=4, f=8, h=2 (hd=2), 1 layer, V=3, fp32: per block 10·bsd + 2·bs + 5·bsf + h·s² + 2·s·hd
    # elements plus s² mask bytes; outside: 3·bsd + 2·bs + 2·bs·V.
    b, s, d, f, h, V = 1, 2, 4, 8, 2, 3
    elems = 10 * 8 + 2 * 2 + 5 * 16 + h * 4 + 2 * 2 * 2 + 3 * 8 + 2 * 2 + 2 * 2 * 3
    assert acc.activation_bytes(b, s, d, f, h, 1, V, 4) == 4 * elems + s * s


@given(b=st.integers(1, 8), s=st.integers(1, 64), layers=st.integers(1, 6))
@settings(max_examples=30, deadline=None)
def test_activation_scaling(b, s, layers):
    """Linear in batch; per-block terms linear in layers; quadratic in seq only through the scores."""
    kw = dict(d_model=32, d_ff=64, num_heads=4, vocab=50)
    one = acc.activation_breakdown(1, s, num_layers=layers, **kw)
    many = acc.activation_breakdown(b, s, num_layers=layers, **kw)
    for k in one:
        if k in ("blocks: causal mask (bool)", "blocks: rope cos/sin tables"):  # shared across the batch
            assert many[k] == one[k]
        else:
            assert many[k] == b * one[k]
    top = {k: v for k, v in one.items() if not k.startswith("blocks")}
    blocks = acc.activation_bytes(1, s, num_layers=layers, **kw) - sum(top.values())
    assert blocks == layers * (acc.activation_bytes(1, s, num_layers=1, **kw) - sum(top.values()))
    assert one["blocks: softmax probs (b,h,s,s)"] == layers * acc.attention_scores_bytes(1, s, 4)


def _saved_bytes_alive(model, x, y):
    """Bytes autograd keeps after forward + loss (parameters, buffers and inputs excluded)."""
    exclude = [*model.parameters(), *model.buffers(), x, y]
    loss, nbytes = saved_tensor_bytes(lambda: cross_entropy(model(x), y), exclude)
    del loss
    return nbytes


@pytest.mark.parametrize("b,s,d,f,h,layers,V", [(2, 16, 32, 48, 4, 2, 50), (1, 24, 48, 96, 3, 3, 37)])
def test_activation_bytes_match_autograd(b, s, d, f, h, layers, V):
    """The formula equals the bytes of the distinct storages that autograd holds after forward (fp32,
    naive attention), found with saved-tensor hooks: counts no tensor that is freed, misses none."""
    torch.manual_seed(0)
    model = TransformerLM(d_model=d, num_heads=h, d_ff=f, num_layers=layers, vocab_size=V, context_length=s)
    x = torch.randint(0, V, (b, s))
    y = torch.randint(0, V, (b, s))
    measured = _saved_bytes_alive(model, x, y)
    assert measured == acc.activation_bytes(b, s, d, f, h, layers, V, 4)


def test_memory_breakdown_stages():
    n, w = 1000, 4
    ddp = acc.memory_breakdown(n, w, 0)
    assert (ddp["parameters"], ddp["gradients"], ddp["optimizer_state"]) == (4000, 4000, 8000)
    z1 = acc.memory_breakdown(n, w, 1, activations=123)
    assert z1["optimizer_state"] == 2000 and z1["gradients"] == 4000 and z1["total"] == 4000 + 4000 + 2000 + 123
    z3 = acc.memory_breakdown(n, w, 3)
    assert z3["total"] == ddp["total"] / w
    # one rank: sharding changes nothing
    assert acc.memory_breakdown(n, 1, 3) == acc.memory_breakdown(n, 1, 0)
    with pytest.raises(ValueError):
        acc.memory_breakdown(n, w, 4)


# --- 2. communication_accounting -----------------------------------------------------------

def test_xxl_memory():
    p = acc.xxl_params()
    assert p == 126 * 2 * 16384 * 53248
    state = acc.xxl_state_bytes()
    assert state["total"] == 16 * p and state["optimizer_state"] == 2 * state["master_weights"]
    n_gpu = acc.devices_needed(state["total"])
    assert (n_gpu - 1) * 80e9 < state["total"] <= n_gpu * 80e9
    assert acc.xxl_activation_bytes(10) == 10 * 126 * (16384 + 53248) * 2


def test_xxl_small_case_by_hand():
    kw = dict(d_model=2, d_ff=3, num_blocks=1)
    assert acc.xxl_params(**kw) == 12
    assert acc.xxl_state_bytes(**kw)["total"] == 192
    assert acc.xxl_activation_bytes(5, **kw) == 5 * 5 * 2
    # M(N) = 192/N + 25/N + 25 with 5 tokens (A = 50)
    assert acc.fsdp_bytes_per_device(4, 5, **kw) == pytest.approx(192 / 4 + 25 / 4 + 25)
    # < 100 bytes: (217)/N < 75 → N = 3
    assert acc.min_fsdp_devices(5, device_bytes=100, **kw) == 3
    assert acc.min_fsdp_devices(5, device_bytes=25, **kw) is None


@given(tokens=st.integers(0, 8192))
@settings(max_examples=40, deadline=None)
def test_min_fsdp_is_minimal(tokens):
    n = acc.min_fsdp_devices(tokens)
    if n is None:
        assert acc.xxl_activation_bytes(tokens) / 2 >= acc.V5P_BYTES
        return
    assert acc.fsdp_bytes_per_device(n, tokens) < acc.V5P_BYTES
    assert n == 1 or acc.fsdp_bytes_per_device(n - 1, tokens) >= acc.V5P_BYTES


def test_compute_bound_batch_balances_times():
    r = acc.compute_bound_batch()
    assert r["alpha"] == pytest.approx(4.6e14 / 1.8e11)
    assert r["per_device_tokens"] == pytest.approx(r["alpha"] / (2 * 4))
    assert r["global_tokens"] == pytest.approx(r["per_device_tokens"] * 64)
    # at the bound compute equals the FSDP all-gather and exceeds the TP collectives
    t = acc.fsdp_tp_forward_times(r["global_tokens"])
    assert t["t_math"] == pytest.approx(t["t_fsdp"])
    assert t["t_math"] > t["t_tp"] and r["tp_compute_bound"]
    # below it communication wins, above it compute does
    assert acc.fsdp_tp_forward_times(0.9 * r["global_tokens"])["t_math"] < t["t_fsdp"]
    assert acc.fsdp_tp_forward_times(1.1 * r["global_tokens"])["t_math"] > t["t_fsdp"]
    # serialised collectives: compute equals their sum at that batch
    ts = acc.fsdp_tp_forward_times(r["global_tokens_serialised"])
    assert ts["t_math"] == pytest.approx(ts["t_fsdp"] + ts["t_tp"])
    # the Scaling Book's optimal-X form: at X = X_opt (non-integer mesh allowed) both terms equal compute
    n, xo = 64, r["book_optimal_x"]
    tb = acc.fsdp_tp_forward_times(r["book_optimal_x_per_device_tokens"] * n, x=xo, y=n / xo)
    assert tb["t_math"] == pytest.approx(tb["t_fsdp"]) and tb["t_math"] == pytest.approx(tb["t_tp"])


def test_compute_bound_batch_scales_with_wire_bytes():
    assert acc.compute_bound_batch(comm_bytes=4)["per_device_tokens"] == pytest.approx(
        2 * acc.compute_bound_batch()["per_device_tokens"])
    # faster links halve the batch
    assert acc.compute_bound_batch(w_ici=3.6e11)["per_device_tokens"] == pytest.approx(
        acc.compute_bound_batch()["per_device_tokens"] / 2)


# --- 3. bucket model and fit ---------------------------------------------------------------------

def test_bucketed_overhead_by_hand():
    assert acc.bucketed_overhead(100, 4, 0.5, 10) == pytest.approx(4 * 0.5 + 100 / 40)
    with pytest.raises(ValueError):
        acc.bucketed_overhead(100, 0, 0.5, 10)


@given(s=st.floats(1e6, 1e10), o=st.floats(1e-6, 1e-3), w=st.floats(1e9, 1e12))
@settings(max_examples=50, deadline=None)
def test_bucket_optimum_consistent(s, o, w):
    nb = acc.optimal_n_buckets(s, o, w)
    assert s / nb == pytest.approx(acc.optimal_bucket_bytes(s, o, w))
    tmin = acc.bucketed_overhead(s, nb, o, w)
    assert tmin == pytest.approx(acc.min_bucketed_overhead(s, o, w))
    for f in (0.5, 0.9, 1.1, 2.0):
        assert acc.bucketed_overhead(s, nb * f, o, w) >= tmin * (1 - 1e-12)
    if nb >= 1:  # a bucket larger than the model is one bucket
        assert acc.overhead_for_bucket_size(s, acc.optimal_bucket_bytes(s, o, w), o, w) == pytest.approx(tmin)


def test_fit_recovers_latency_and_bandwidth():
    o, w = 30e-6, 80e9
    sizes = [1e6, 1e7, 1e8, 1e9]
    rng = random.Random(0)
    times = [(o + x / w) * (1 + 1e-4 * rng.uniform(-1, 1)) for x in sizes]
    fo, fw = acc.fit_latency_bandwidth(sizes, times)
    assert fw == pytest.approx(w, rel=1e-3)
    exact = acc.fit_latency_bandwidth(sizes, [o + x / w for x in sizes])
    assert exact[0] == pytest.approx(o, rel=1e-6) and exact[1] == pytest.approx(w, rel=1e-9)
    with pytest.raises(ValueError):
        acc.fit_latency_bandwidth([1e6, 1e6], [1.0, 2.0])
    with pytest.raises(ValueError):
        acc.fit_latency_bandwidth([1e6, 2e6], [2.0, 1.0])


def test_bus_bandwidth_convention():
    assert acc.algbw(1e9, 0.01) == 1e11
    assert acc.bus_bandwidth(1e11, 2) == pytest.approx(1e11)
    assert acc.bus_bandwidth(1e11, 4) == pytest.approx(1.5e11)
    assert acc.bus_bandwidth(1e11, 4, "all_gather") == pytest.approx(0.75e11)


# --- 4. communication volumes -------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 4, 8, 64])
def test_comm_volumes(n):
    psi = 1e9
    v = acc.comm_volume_per_rank(psi, n)
    assert v["ddp"] == pytest.approx(2 * (n - 1) / n * psi)
    assert v["zero1"] == pytest.approx(v["ddp"])  # ZeRO-1 costs no more than DDP
    assert v["sharded_simple"] == pytest.approx(1.5 * v["ddp"])
    assert v["fsdp"] == pytest.approx(1.5 * v["ddp"])
    if n == 1:
        assert all(x == 0 for x in v.values())
    assert v["ddp"] < 2 * psi
    assert math.isclose(acc.ring_all_reduce_bytes(psi, n),
                        acc.ring_reduce_scatter_bytes(psi, n) + acc.ring_all_gather_bytes(psi, n))


def test_relative_fit_keeps_the_overhead_positive_where_the_per_byte_cost_grows():
    """gloo at 4 processes on the 2×H200 host (ms per all-reduce at 1, 10, 100, 1000 MB): the absolute
    least-squares line runs through the 1 GB point and crosses zero below; the relative fit does not."""
    sizes = [2**20 * m for m in (1, 10, 100, 1000)]
    times = [1.358e-3, 6.222e-3, 74.739e-3, 770.211e-3]
    assert acc.fit_latency_bandwidth(sizes, times)[0] < 0
    o, w = acc.fit_latency_bandwidth(sizes, times, relative=True)
    assert 0 < o < times[0] and w > 0
    exact = acc.fit_latency_bandwidth(sizes, [1e-4 + s / 1e9 for s in sizes], relative=True)
    assert exact[0] == pytest.approx(1e-4) and exact[1] == pytest.approx(1e9)
