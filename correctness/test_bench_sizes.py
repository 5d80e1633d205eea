"""impl.workloads.steps' size helpers: what a sweep's size names, the closed-form memory need a row
records beside its peak or its OOM, and the contexts nsys_profile (2026) chooses from it."""
import pytest

from impl import accounting as acc
from impl.workloads.steps import fitting_contexts, memory_need, size_config, step_memory_need
from impl.model import MODEL_SIZES_2026, SizeRef


def test_size_config_accepts_names_refs_and_configs():
    xl26 = SizeRef("2026", "xl")
    assert size_config(xl26) == size_config(xl26.config) == size_config("2.7B") != size_config("xl")
    with pytest.raises(ValueError, match="unknown model size"):
        size_config("huge")
    with pytest.raises(TypeError, match="a model size is"):
        size_config(3)


def test_memory_need_10b_does_not_train_on_80gb():
    """The 10B's fp32 weights are ~51 GB (its forward fits an 80 GB GPU), its backward needs their
    gradients too (beyond it); bf16 adds the Linear weights' 2-byte copies to the forward."""
    ten = SizeRef("2026", "10B")
    fwd = memory_need(ten, "forward", "fp32", 4, 512)
    assert fwd["total"] == acc.param_bytes(MODEL_SIZES_2026["10B"].params) < acc.H100_BYTES
    assert memory_need(ten, "backward", "fp32", 4, 512)["total"] > acc.H100_BYTES
    bf16 = memory_need(ten, "forward", "bf16", 4, 512)
    assert fwd["total"] < bf16["total"] < 1.5 * fwd["total"]
    step = memory_need(ten, "optimizer_step", "fp32", 4, 512)
    assert step["optimizer_state"] == 2 * step["parameters"]


def test_fitting_contexts_are_the_powers_of_two_that_fit():
    small = SizeRef("2026", "small")
    every = fitting_contexts(small, 4, "fp32", None, lo=200, hi=4096, headroom=0.9)
    assert every == [256, 512, 1024, 2048, 4096]
    budget = memory_need(small, "train_step", "fp32", 4, 1024)["total"]
    assert fitting_contexts(small, 4, "fp32", budget, lo=256, hi=4096, headroom=1.0) == [256, 512, 1024]
    with pytest.raises(ValueError, match="headroom"):
        fitting_contexts(small, 4, "fp32", None, lo=256, hi=128, headroom=0.9)


def test_step_memory_need_terms_by_mode():
    """Forward holds the parameters (and autocast's copies); backward adds gradients and saved
    activations; the optimizer step AdamW's two moments: 4, 8 and 16 bytes a parameter."""
    n, act = 1000, 5000
    assert step_memory_need("forward", n, act)["total"] == 4 * n
    assert step_memory_need("forward", n, act, cast_bytes=2 * n)["total"] == 6 * n
    assert step_memory_need("backward", n, act)["total"] == 8 * n + act
    assert step_memory_need("optimizer_step", n, act)["total"] == 16 * n + act
    with pytest.raises(ValueError, match="unknown mode"):
        step_memory_need("inference", n, act)
