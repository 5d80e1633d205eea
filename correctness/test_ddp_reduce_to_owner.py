"""The ZeRO-2 gradient sync (impl.distributed.DDPReduceToOwner) on gloo ranks: each gradient reduced
only to its owner in a ShardedOptimizer equals DDPBucketed's all-reduced one there, every other grad
is None (freed into a bucket during backward, the bucket dropped once sent), two training steps give
the all-reduce path's weights, and bad or disagreeing owner maps are refused on every rank.
Workers: correctness/kits/reduce_to_owner.py.

Bit for bit on 2 ranks (one addition either way). On 3, gloo's reduce adds the ranks' values in
another order than its all-reduce (measured: mix.weight of the tied model differs in the last bit),
so there they agree to fp32 rounding: REL_3_RANKS."""
import pytest

from impl.distributed import launch
from kits import distributed as T
from kits import reduce_to_owner as W

REL_3_RANKS = 1e-6  # two fp32 roundings of a sum of 3 (2^-23 each), relative to the gradient's norm


@pytest.fixture(scope="module", params=[(2, False), (3, True)], ids=["2_ranks_sum", "3_ranks_mean"])
def runs(request):
    world_size, average = request.param
    return world_size, launch(W.equivalence, world_size, args=(average,), timeout_s=300)


@pytest.mark.parametrize("kind", W.KINDS)
@pytest.mark.parametrize("buckets", list(W.BUCKETS_MB))
def test_owned_grads_equal_the_all_reduced_ones_and_the_rest_are_freed(runs, kind, buckets):
    world_size, results = runs
    owned = [set(r[(kind, buckets)]["owned"]) for r in results]
    assert set().union(*owned) and sum(map(len, owned)) == len(set().union(*owned))  # one owner each
    assert any(s["owned_with_grad"] for r in results for s in r[(kind, buckets)]["steps"])
    for rank, r in enumerate(results):
        case = r[(kind, buckets)]
        # buckets never mix owners; split from DDPBucketed's, so at least as many
        assert not case["mixed_buckets"] and len(case["buckets"]) >= case["ref_buckets"], case
        for step in case["steps"]:
            assert step["owned_grad_none_differ"] == [], (rank, step)
            if world_size == 2:
                assert step["owned_differ"] == [], (rank, step)
            assert step["owned_max_diff"] < REL_3_RANKS, (rank, step)
            assert step["grad_is_bucket_view"], (rank, step)
            assert step["not_owned_with_grad"] == [], (rank, step)
            assert step["held_before_finish"] == [] and step["buffers_after_finish"] == 0, (rank, step)
            # every rank sends every bucket (the ones with a grad) once, as the all-reduce path does
            assert step["bytes"] == step["ref_bytes"] > 0, (rank, step)
        if kind == "frozen":  # the never-used parameter has no grad on its owner either
            assert all("unused" not in s["owned_with_grad"] for s in case["steps"])


@pytest.mark.parametrize("kind", W.KINDS)
def test_two_steps_give_the_all_reduce_paths_weights(runs, kind):
    world_size, results = runs
    for rank, r in enumerate(results):
        for buckets in W.BUCKETS_MB:
            case = r[(kind, buckets)]
            assert case["moved"] > 1e-4, (rank, buckets)
            if world_size == 2:
                assert case["weights_differ"] == [], (rank, buckets, case["weights_differ"])
            # AdamW's first steps move a weight by ~lr whatever the gradient's last bits
            assert case["weights_max_diff"] < 1e-6, (rank, buckets, case["weights_max_diff"])


OWNER_REFUSALS = {
    # the ranks' owner maps differ: the first parameter where they do is named, with both owners
    "owner_swapped": T.refusal("DDPReduceToOwner", "parameter 0 (weight)", f"shape (2, 4), {T.F32}=True, owned by "
                               "rank 0", f"shape (2, 4), {T.F32}=True, owned by rank 1"),
    "owner_missing": "DDPReduceToOwner: owner names no rank for trainable parameters ['bias']",
    "owner_outside": "DDPReduceToOwner: owner names ranks outside the world of 2 (0 to 1): {'bias': 2}",
}


@pytest.fixture(scope="module")
def owner_refusals():
    return launch(T.refusals, 2, args=(list(OWNER_REFUSALS),), timeout_s=120)


@pytest.mark.parametrize("case", OWNER_REFUSALS)
def test_bad_or_disagreeing_owner_maps_are_refused_on_every_rank(owner_refusals, case):
    T.assert_refusals([r[case] for r in owner_refusals], OWNER_REFUSALS[case])


def test_an_owner_map_that_is_not_a_mapping_is_refused():
    import torch
    import torch.distributed as dist

    from impl.distributed import DDPReduceToOwner

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(TypeError, match=r"owner must map id\(parameter\) -> rank .* got list"):
            DDPReduceToOwner(torch.nn.Linear(2, 2), 1, owner=[0, 0])
    finally:
        dist.destroy_process_group()
