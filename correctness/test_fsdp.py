"""FSDP (impl.distributed.fsdp) on 2 gloo ranks against single-process full-batch training.

Process start-up dominates, so one launch runs every training case (module fixture) and the tests
read its numbers; two more launches cover error paths and a failing rank. Workers live in
impl.distributed._fsdp_testing (spawn must import them).
"""
import time

import pytest

from impl.distributed import _fsdp_testing as T
from impl.distributed import launch

WORLD_SIZE = 2
STEPS = 4
# (model, compute dtype, optimizer, prefetch depth)
CASES = [
    ("toy", "fp32", "sgd", 1),
    ("toy", "fp32", "adamw_impl", 0),
    ("toy", "fp32", "adamw_torch", 2),
    ("tiny_lm", "fp32", "sgd", 1),
    ("tiny_lm", "fp32", "adamw_impl", 1),
    ("toy", "bf16", "sgd", 1),
    ("tiny_lm", "bf16", "sgd", 1),
    ("tiny_lm", "fp16", "sgd", 2),
]
# fp32: SGD is linear in the gradient, so only summation order differs. Adam divides by sqrt(v),
# which turns a rounding difference in a near-zero gradient into an lr-sized update difference at
# worst; its bound is looser but still two orders below how far the weights move (checked too).
# Half compute dtypes: each rank rounds its partial gradient to the compute dtype before the fp32
# reduce-scatter, the reference rounds the full-batch one.
TOL = {("fp32", "sgd"): 1e-6, ("fp32", "adamw_impl"): 2e-4, ("fp32", "adamw_torch"): 2e-4,
       ("bf16", "sgd"): 1e-3, ("fp16", "sgd"): 5e-4}
IDS = ["-".join(map(str, c)) for c in CASES]


@pytest.fixture(scope="module")
def results():
    return launch(T.equivalence, WORLD_SIZE, backend="gloo", args=(CASES, STEPS), timeout_s=120)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_fsdp_matches_single_process_training(results, case):
    tol = TOL[case[1], case[2]]
    for rank_out in results:
        r = rank_out[case]
        assert r["init_diff"] == 0.0  # rank 0's weights were broadcast and sharded exactly
        assert r["moved"] > 20 * tol, "training must move the weights well beyond the tolerance"
        assert r["max_diff"] <= tol
        assert r["loss_diff"] <= 50 * tol


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gather_full_params_is_the_full_fp32_state(results, case):
    r0, r1 = (rank_out[case] for rank_out in results)
    assert r0["keys_equal"] and r0["all_fp32"]
    assert r0["max_diff"] == r1["max_diff"]  # both ranks gathered the same state


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_shards_are_fp32_and_split_evenly(results, case):
    for rank_out in results:
        r = rank_out[case]
        assert r["shard_dtypes"] == ["torch.float32"] and r["shard_grad_dtypes"] == ["torch.float32"]
        # Each rank holds ceil(numel / world) of every weight: half of it, plus padding.
        assert r["full_sharded_numel"] / WORLD_SIZE <= r["sharded_numel"] < r["full_sharded_numel"] / WORLD_SIZE + r["num_units"]
        assert r["weights_none"], "gathered full weights must be dropped after each layer's forward"
        assert r["opt_numel"] > r["sharded_numel"]  # replicated norm gains are trained too


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_communicated_bytes_show_backward_regather(results, case):
    """Exact payload of a step: a Linear's weight is all-gathered again in backward (it was freed
    after forward), an Embedding's is not (its backward needs only the indices)."""
    for rank_out in results:
        r = rank_out[case]
        assert r["bytes"] == r["expected_bytes"]


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_prefetch_serves_the_next_layers(results, case):
    """From the second step on, every forward gather but the first comes from the previous
    layer's prefetch, and every backward re-gather but the first (the head) from the one before."""
    prefetch = case[3]
    for rank_out in results:
        r = rank_out[case]
        fwd, bwd = r["prefetched"]
        if prefetch == 0:
            assert (fwd, bwd) == (0, 0)
        else:
            assert fwd == r["num_calls"] - 1
            assert bwd == r["num_regathered"] - 1


def test_compute_dtype_halves_gather_bytes(results):
    fp32 = results[0][("tiny_lm", "fp32", "sgd", 1)]["bytes"]
    bf16 = results[0][("tiny_lm", "bf16", "sgd", 1)]["bytes"]
    assert bf16 < fp32


def test_toy_model_shards_every_linear_and_embedding(results):
    assert results[0][("toy", "fp32", "sgd", 1)]["num_units"] == 3
    # tiny TransformerLM: embedding + head + 2 layers x (4 attention + 3 SwiGLU) linears
    assert results[0][("tiny_lm", "fp32", "sgd", 1)]["num_units"] == 2 + 2 * 7


@pytest.fixture(scope="module")
def misuse():
    return launch(T.misuse, WORLD_SIZE, backend="gloo", timeout_s=60)[0]


def test_bad_arguments_raise_value_error(misuse):
    assert "compute_dtype" in misuse["bad_dtype"]
    assert "prefetch" in misuse["bad_prefetch"]
    assert "biased" in misuse["biased_half"]


def test_module_without_layers_warns_and_replicates(misuse):
    assert misuse["no_layers_warning"] and misuse["no_layers_units"] == 0


def test_torch_nn_layers_are_sharded(misuse):
    assert misuse["torch_layers_units"] == 2 and misuse["torch_layers_bias_grad"]


def test_fsdp_without_process_group_raises():
    from impl.distributed.fsdp import FSDP

    with pytest.raises(ValueError, match="process group"):
        FSDP(T.ToyLM())


def test_failing_rank_in_fsdp_step_surfaces():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1") as err:
        launch(T.fail_in_fsdp, WORLD_SIZE, backend="gloo", timeout_s=60)
    assert "deliberate failure inside an FSDP step" in str(err.value)
    assert time.monotonic() - t0 < 30  # reported at once, not after the timeout
