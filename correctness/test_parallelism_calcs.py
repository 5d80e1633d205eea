"""The 2026 edition's parallelism calculations (impl.parallelism_calcs): each bound is the exact
crossover of the time formulas it was derived from, the fsdp_tp optimum beats every other split,
and the ring costs they rest on are what real send/recv rings over gloo ranks send (the simulation:
impl.distributed.ring, one 4-rank launch for rings of 2, 3 and 4 ranks)."""
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from impl import accounting as acc
from impl import parallelism_calcs as pc
from impl.distributed import launch
from kits import parallelism_workers as W

# --- closed forms --------------------------------------------------------------------------------

setting = dict(B=st.floats(1, 1e7), D=st.floats(1, 1e5), D_FF=st.floats(1, 1e5), C=st.floats(1e9, 1e16),
               W=st.floats(1e6, 1e13))


def test_ring_costs_and_alternate_ring():
    S, W = 1200.0, 100.0
    assert pc.ring_all_gather_time(S, 4, W) == pc.ring_reduce_scatter_time(S, 4, W) == 0.75 * S / W
    assert pc.ring_all_reduce_time(S, 4, W) == 1.5 * S / W
    assert pc.alternate_ring_all_reduce_time(S, 4, W) == 3 * S / W
    for n in (2, 3, 4, 8, 64):
        # N/2 times the chunked ring: equal at N = 2
        assert pc.alternate_ring_all_reduce_time(S, n, W) == pytest.approx(n / 2 * pc.ring_all_reduce_time(S, n, W))
    assert pc.alternate_ring_all_reduce_time.symbolic == "(N−1) · S / W"
    assert "N/2 times slower" in pc.alternate_ring_all_reduce_time.doc


def test_hand_case_values():
    B, D, F, N, C, W = 1000, 10, 20, 4, 1e6, 1e3
    dp = pc.data_parallel_calcs(B, D, F, N, C, W)
    assert dp.backward_flops.value == 12 * B * D * F / N
    assert dp.backward_comm_time.value == pytest.approx(2 * 3 / 4 * 3 * 2 * D * F / W)
    assert dp.max_devices.value == pytest.approx(1 + B * W / C)  # p = 2: 1 + B·W/C
    tp = pc.tp_calcs(B, D, F, N, C, W)
    assert tp.forward_flops.value == 6 * B * D * F / N
    assert tp.forward_comm_time.value == tp.backward_comm_time.value == pytest.approx(1.5 * 2 * B * D / W)
    assert tp.max_devices_forward.value == pytest.approx(1 + 1.5 * F * W / C)
    assert tp.max_devices_backward.value == pytest.approx(1 + 3 * F * W / C)
    fs = pc.fsdp_calcs(B, D, F, N, C, W)
    assert fs.backward_comm_time.value == pytest.approx(2 * fs.forward_comm_time.value)
    assert fs.backward_comm_time.value == pytest.approx(dp.backward_comm_time.value)


def _meaningful(B, D_FF, C, W):
    """Skip settings where a bound is 1 + (something below 1e-6): (N−1)/N then cancels to noise."""
    assume(B * W / C > 1e-6 and D_FF * W / C > 1e-6)


def _records(B, D, F, C, W):
    return [pc.data_parallel_calcs(B, D, F, 3, C, W), pc.fsdp_calcs(B, D, F, 3, C, W),
            pc.tp_calcs(B, D, F, 3, C, W), pc.fsdp_tp_calcs(B, D, F, 2, 3, C, W)]


def test_every_answer_has_its_formula_and_part_label():
    for rec in _records(100, 8, 32, 1e12, 1e9):
        items = pc.answers(rec)
        assert len(items) >= 3
        for a in items:
            assert isinstance(a, pc.Answer) and a.symbolic and a.part.startswith("(") and a.value > 0
            assert a.unit in ("FLOP", "s", "devices")
    assert "dW3_i = z_iᵀ dy" in pc.TP_BACKWARD_EQUATIONS and "all-reduce" in pc.TP_BACKWARD_EQUATIONS
    assert acc.tp_calcs is pc.tp_calcs  # re-exported by impl.accounting


@given(**setting)
@settings(max_examples=60, deadline=None)
def test_one_axis_bounds_are_the_crossover_of_comm_and_compute(B, D, D_FF, C, W):
    """At the largest N each pass's communication time equals its compute time; above it exceeds."""
    _meaningful(B, D_FF, C, W)
    def crossover(n, comm, compute):
        assert comm(n) == pytest.approx(compute(n), rel=1e-6)
        assert comm(n * 1.01) > compute(n * 1.01)

    fwd = lambda n: pc.ffn_forward_flops(B, D, D_FF, n) / C  # noqa: E731
    bwd = lambda n: pc.ffn_backward_flops(B, D, D_FF, n) / C  # noqa: E731
    n_dp = pc.data_parallel_calcs(B, D, D_FF, 1, C, W).max_devices.value
    crossover(n_dp, lambda n: pc.dp_backward_comm_time(D, D_FF, n, W), bwd)
    fs = pc.fsdp_calcs(B, D, D_FF, 1, C, W)
    crossover(fs.max_devices_forward.value, lambda n: pc.fsdp_forward_comm_time(D, D_FF, n, W), fwd)
    crossover(fs.max_devices_backward.value, lambda n: pc.fsdp_backward_comm_time(D, D_FF, n, W), bwd)
    tp = pc.tp_calcs(B, D, D_FF, 1, C, W)
    crossover(tp.max_devices_forward.value, lambda n: pc.tp_forward_comm_time(B, D, n, W), fwd)
    crossover(tp.max_devices_backward.value, lambda n: pc.tp_backward_comm_time(B, D, n, W), bwd)


def _fsdp_tp_times(B, D, F, t, f, C, W):
    compute = pc.fsdp_tp_forward_flops(B, D, F, t, f) / C
    return compute, pc.fsdp_tp_fsdp_comm_time(D, F, t, f, W), pc.fsdp_tp_tp_comm_time(B, D, t, f, W)


@given(**setting)
@settings(max_examples=60, deadline=None)
def test_fsdp_tp_overlapping_optimum(B, D, D_FF, C, W):
    """Both axes sit exactly at their limit; any larger count on either axis is communication-bound."""
    _meaningful(B, D_FF, C, W)
    split = pc.fsdp_tp_best_split(B, D_FF, C, W)
    assert split.n == pytest.approx(pc.fsdp_tp_calcs(B, D, D_FF, 1, 1, C, W).max_devices.value)
    compute, t_fsdp, t_tp = _fsdp_tp_times(B, D, D_FF, split.n_tp, split.n_fsdp, C, W)
    assert t_fsdp == pytest.approx(compute, rel=1e-6) and t_tp == pytest.approx(compute, rel=1e-6)
    for t, f in ((split.n_tp * 1.01, split.n_fsdp), (split.n_tp, split.n_fsdp * 1.01)):
        compute, t_fsdp, t_tp = _fsdp_tp_times(B, D, D_FF, t, f, C, W)
        assert max(t_fsdp, t_tp) > compute


@given(**setting)
@settings(max_examples=60, deadline=None)
def test_fsdp_tp_serial_optimum_beats_every_split(B, D, D_FF, C, W):
    """The closed-form split is feasible (T_FSDP + T_TP = compute) and no split on a fine grid of
    N_TP with its largest feasible N_FSDP has a larger product."""
    _meaningful(B, D_FF, C, W)
    split = pc.fsdp_tp_best_split_serial(B, D_FF, C, W)
    assert split.n_tp >= 1 and split.n_fsdp >= 1
    assert split.n == pytest.approx(pc.fsdp_tp_calcs(B, D, D_FF, 1, 1, C, W).max_devices_serial.value)
    compute, t_fsdp, t_tp = _fsdp_tp_times(B, D, D_FF, split.n_tp, split.n_fsdp, C, W)
    assert t_fsdp + t_tp == pytest.approx(compute, rel=1e-6)
    # 3F(f−1) + 2B(t−1) ≤ K: the largest f for each t
    K = 6 * B * D_FF * W / (2 * C)
    t_max = 1 + K / (2 * B)
    for i in range(201):
        t = 1 + (t_max - 1) * i / 200
        f = 1 + (K - 2 * B * (t - 1)) / (3 * D_FF)
        assert t * f <= split.n * (1 + 1e-9)


def test_bounds_table_for_a_device():
    b = pc.parallelism_bounds(pc.TPU_V5P_FIGURES, B=1e6, D_FF=53248)
    assert b.device == "TPU v5p"
    assert b.dp.value == b.fsdp.value == pytest.approx(1 + 1e6 * 1.8e11 / 4.6e14)
    assert b.tp_backward.value - 1 == pytest.approx(2 * (b.tp_forward.value - 1))
    assert b.fsdp_tp.value == pytest.approx(b.fsdp.value * b.tp_forward.value)
    assert b.fsdp_tp_serial.value < b.fsdp_tp.value
    assert (acc.TPU_V5P["c"], acc.TPU_V5P["w_ici"]) == (pc.TPU_V5P_FIGURES.C, pc.TPU_V5P_FIGURES.W)


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="B must be a positive"):
        pc.data_parallel_calcs(0, 1, 1, 2, 1, 1)
    with pytest.raises(ValueError, match="N_TP .*>= 1"):
        pc.fsdp_tp_calcs(1, 1, 1, 0.5, 2, 1, 1)
    with pytest.raises(ValueError, match="W must be a positive"):
        pc.parallelism_bounds(pc.DeviceFigures("x", C=1.0, W=math.inf), B=1, D_FF=1)


# --- the simulation: real rings over gloo ranks --------------------------------------------------

SIZES = [2, 3, 4]
NUMELS = [12, 7, 60]  # 12 and 60 split evenly over 2, 3 and 4 ranks; 7 over none
OPS = ["all_gather", "reduce_scatter", "all_reduce", "alternate_all_reduce"]
VOLUME = {"all_gather": pc.ring_all_gather_bytes, "reduce_scatter": pc.ring_reduce_scatter_bytes,
          "all_reduce": pc.ring_all_reduce_bytes, "alternate_all_reduce": pc.alternate_ring_all_reduce_bytes}


@pytest.fixture(scope="module")
def rings():
    return launch(W.ring_simulation, max(SIZES), backend="gloo", args=(SIZES, NUMELS), timeout_s=180)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", SIZES)
def test_ring_collective_matches_torch_and_the_formula(rings, n, op):
    for numel in NUMELS:
        per_rank = [rings[r][n, op, numel] for r in range(n)]
        S = numel * W.ELEM * (n if op == "all_gather" else 1)  # the gathered size for all-gather
        for r, c in enumerate(per_rank):
            assert c["max_diff"] == 0.0, f"rank {r}: wrong result"
            assert c["steps"] == pc.RING_STEPS[op](n) and c["calls"] == 1
            assert c["payload_bytes"] == S
            if op in ("all_gather", "alternate_all_reduce") or numel % n == 0:
                assert c["bytes_sent"] == pytest.approx(VOLUME[op](S, n), abs=1e-9)
        # Uneven chunks: ranks send different amounts, but every chunk still travels the same hops.
        assert sum(c["bytes_sent"] for c in per_rank) == pytest.approx(n * VOLUME[op](S, n), abs=1e-9)


# --- fsdp_accounting (a): the predicted saving at the peak ---------------------------------------

def test_fsdp_peak_saving_xl_on_two_gpus():
    from impl.model import MODEL_SIZES, param_count

    shape = MODEL_SIZES["xl"]
    n = param_count(**shape)
    largest = acc.largest_sharded_layer_numel(shape["d_model"], shape["d_ff"])
    assert largest == 10_000 * 1600  # the embedding / LM head, not an FFN matrix (1600·6400)
    activations = acc.activation_bytes(4, 512, shape["d_model"], shape["d_ff"], shape["num_heads"],
                                       shape["num_layers"])
    r = acc.fsdp_peak_saving(n, 2, largest, activations)
    # half of the 16-byte fp32 state, less the in-flight buffers: 2 gathered + 3 gradient copies of L
    assert r.in_flight == 5 * 4 * largest
    assert r.saving == pytest.approx(16 * n / 2 - r.in_flight)
    assert r.ddp_peak - r.fsdp_peak == r.saving and r.fraction == pytest.approx(r.saving / r.ddp_peak)
    assert 15.5e9 < r.saving < 16e9
    # activations cancel; no sharding, no saving
    assert acc.fsdp_peak_saving(n, 2, largest).saving == pytest.approx(r.saving)
    assert acc.fsdp_peak_saving(n, 1, largest, activations).saving == 0
    with pytest.raises(ValueError, match="world_size"):
        acc.fsdp_peak_saving(n, 0, largest)
