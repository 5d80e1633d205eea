"""impl.distributed.TensorParallel on 2 and 4 gloo ranks (one 4-rank launch; the 2-rank run is a
subgroup, so `group=` is exercised) and the 2-D FSDP × TP FFN on a 2 × 2 mesh, against
single-process references, with their activation / weight traffic counted against tp_calcs and
fsdp_tp_calcs (impl.parallelism_calcs). Workers: correctness/kits/parallelism_workers.py."""
import pytest

from impl import parallelism_calcs as pc
from impl.distributed import launch
from kits import distributed as D
from kits import parallelism_workers as W

SIZES = [2, 4]
KINDS = ["torch", "ring"]
TOL = 1e-5


@pytest.fixture(scope="module")
def tp_results():
    return launch(W.tp_equivalence, max(SIZES), backend="gloo", args=(SIZES,), timeout_s=180)


def _ranks(results, n):
    return [results[r][n] for r in range(n)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", SIZES)
def test_tp_forward_loss_grads_and_step_match_unsharded(tp_results, n, kind):
    for rank, res in enumerate(_ranks(tp_results, n)):
        r = res[kind]
        assert r["logits"] < TOL and r["loss"] < TOL, f"rank {rank}"
        bad = {k: v for k, v in r["grads"].items() if not v < TOL}
        assert not bad, f"rank {rank}: gradients differ from the unsharded model's slice: {bad}"
        assert r["keys_equal"] and r["params_after_step"] < TOL
        assert r["local_heads"] == [W.TINY_LM["num_heads"] // n] * W.TINY_LM["num_layers"]


def test_tp_shards_attention_and_ffn_of_every_block(tp_results):
    sharded = tp_results[0][2]["torch"]["sharded"]
    for layer in range(W.TINY_LM["num_layers"]):
        for name in ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.output_proj", "ffn.w1", "ffn.w2", "ffn.w3"):
            assert f"layers.{layer}.{name}.weight" in sharded
    assert not any(k.startswith(("token_embeddings", "lm_head", "ln_final")) or ".ln" in k for k in sharded)


@pytest.mark.parametrize("n", SIZES)
def test_tp_activation_traffic_matches_tp_calcs(tp_results, n):
    """Per step: one all-reduce of a (batch·seq, d_model) activation per sublayer (attention, FFN)
    and pass; the ring's bytes per rank are tp_calcs' volume (its time at W = 1 byte/s), fp32."""
    tokens, d, layers, p = W.BATCH * W.SEQ, W.TINY_LM["d_model"], W.TINY_LM["num_layers"], W.ELEM
    per_sublayer = {"forward": pc.tp_forward_comm_time(tokens, d, n, 1.0, p),
                    "backward": pc.tp_backward_comm_time(tokens, d, n, 1.0, p)}
    for res in _ranks(tp_results, n):
        for phase, volume in per_sublayer.items():
            ring, torch_ = res["ring"][phase], res["torch"][phase]
            assert ring["calls"] == torch_["calls"] == 2 * layers
            assert ring["payload_bytes"] == torch_["payload_bytes"] == 2 * layers * tokens * d * p
            assert ring["bytes_sent"] == pytest.approx(2 * layers * volume)
            assert ring["steps"] == 2 * layers * pc.RING_STEPS["all_reduce"](n)


@pytest.mark.parametrize("n", SIZES)
def test_tp_rejects_indivisible_heads_and_d_ff(tp_results, n):
    errors = tp_results[0][n]["errors"]
    assert "num_heads=3" in errors["heads"] and f"world size {n}" in errors["heads"]
    assert "d_ff=31" in errors["d_ff"] and f"world size {n}" in errors["d_ff"]


@pytest.mark.parametrize("n", SIZES)
def test_tp_refuses_ranks_that_disagree_on_every_rank_of_its_group(tp_results, n):
    """Rank 0's d_ff is half the others': refused by every rank of the group (a subgroup for n=2)."""
    d, f = W.TINY_LM["d_model"], W.TINY_LM["d_ff"]
    expected = D.refusal("TensorParallel", "parameter 7 (layers.0.ffn.w1.weight)", f"shape ({f}, {d}), {D.F32}=True",
                         f"shape ({2 * f}, {d}), {D.F32}=True", differ=tuple(range(1, n)))
    D.assert_refused_by_every_rank([res["errors"]["disagree"] for res in _ranks(tp_results, n)], expected)


# --- 2-D FSDP x TP FFN ---------------------------------------------------------------------------

N_TP, N_FSDP = 2, 2


@pytest.fixture(scope="module")
def mesh_results():
    return launch(W.fsdp_tp_equivalence, N_TP * N_FSDP, backend="gloo", args=(N_TP, N_FSDP), timeout_s=180)


def test_mesh_layout(mesh_results):
    assert [(r["fsdp_index"], r["tp_index"]) for r in mesh_results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    d, f = W.FFN_DIMS["d_model"], W.FFN_DIMS["d_ff"]
    shapes = mesh_results[0]["torch"]["shard_shapes"]
    assert shapes == {"w1": (f // N_TP, d // N_FSDP), "w3": (f // N_TP, d // N_FSDP), "w2": (d // N_FSDP, f // N_TP)}


@pytest.mark.parametrize("kind", KINDS)
def test_fsdp_tp_ffn_matches_single_process(mesh_results, kind):
    for rank, res in enumerate(mesh_results):
        r = res[kind]
        assert r["output"] < TOL and r["input_grad"] < TOL, f"rank {rank}"
        assert max(r["grads"].values()) < TOL, f"rank {rank}: {r['grads']}"
        assert r["gathered"] == 0.0


def test_fsdp_tp_traffic_per_axis_matches_formulas(mesh_results):
    """Forward: fsdp_tp_calcs' T_FSDP and T_TP volumes (times at W = 1). Backward (beyond the
    problem, which stops at the forward): FSDP re-gathers and reduce-scatters its TP slice
    (fsdp_calcs' backward volume on D_FF/N_TP), TP all-reduces dx of the row's B/N_FSDP tokens."""
    d, f, p = W.FFN_DIMS["d_model"], W.FFN_DIMS["d_ff"], W.ELEM
    tokens = W.FFN_DIMS["batch"] * W.FFN_DIMS["seq"]
    expected = {
        "fsdp/forward": pc.fsdp_tp_fsdp_comm_time(d, f, N_TP, N_FSDP, 1.0, p),
        "tp/forward": pc.fsdp_tp_tp_comm_time(tokens, d, N_TP, N_FSDP, 1.0, p),
        "fsdp/backward": pc.fsdp_backward_comm_time(d, f / N_TP, N_FSDP, 1.0, p),
        "tp/backward": pc.tp_backward_comm_time(tokens / N_FSDP, d, N_TP, 1.0, p),
    }
    for res in mesh_results:
        traffic = res["ring"]["traffic"]
        for key, volume in expected.items():
            assert traffic[key]["bytes_sent"] == pytest.approx(volume), key
            assert traffic[key]["payload_bytes"] == res["torch"]["traffic"][key]["payload_bytes"], key
        assert traffic["fsdp/forward"]["calls"] == 3 and traffic["fsdp/backward"]["calls"] == 6
        assert traffic["tp/forward"]["calls"] == traffic["tp/backward"]["calls"] == 1


def test_fsdp_tp_rejects_indivisible_dims(mesh_results):
    err = mesh_results[0]["error"]
    assert "d_model=9" in err and f"n_fsdp={N_FSDP}" in err


def test_fsdp_tp_refuses_ranks_that_disagree_on_every_rank(mesh_results):
    d, f = W.FFN_DIMS["d_model"], W.FFN_DIMS["d_ff"]
    expected = D.refusal("FSDPTPFeedForward", "parameter 0 (w1.weight)", f"shape ({f}, {d}), {D.F32}=True",
                         f"shape ({2 * f}, {d}), {D.F32}=True", differ=(1, 2, 3))
    D.assert_refused_by_every_rank([res["disagree"] for res in mesh_results], expected)
