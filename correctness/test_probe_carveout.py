"""tools/probes/carveout.py (issue 47): the shared-memory carve-out of loaded kernels, on the CPU with a stand-in
for cuFuncSetAttribute: which kernels it sets, the default put back, and the refusals by name."""
from __future__ import annotations

import pytest

from kits.probes import probe_module


@pytest.fixture(scope="module")
def carveout():
    with probe_module("carveout") as module:
        yield module


def _loaded(carveout, rc=0):
    calls = []

    def set_attribute(function, attribute, value):
        calls.append((function, attribute, value))
        return rc
    loaded = carveout.Loaded(set_attribute)
    for function, name in ((11, "_attn_bwd_sm90"), (12, "_attn_bwd_sm90"), (21, "_attn_bwd_dq_sm90"),
                           (31, "_attn_bwd_dq"), (41, "_attn_fwd_ws_sm90")):
        loaded(None, function, name, None, "hash")  # as Triton's load hook calls it
    return loaded, calls


def test_sets_the_matching_gluon_backward_kernels_only(carveout):
    loaded, calls = _loaded(carveout)
    assert loaded.set(carveout.GLUON_BWD_KERNELS, 72) == ["_attn_bwd_dq_sm90", "_attn_bwd_sm90"]
    assert sorted(calls) == [(11, 9, 72), (12, 9, 72), (21, 9, 72)]  # every load of each, not Triton's dQ


def test_the_block_form_puts_the_default_back_even_when_the_block_fails(carveout):
    loaded, calls = _loaded(carveout)
    with pytest.raises(KeyError):
        with loaded.carveout(r"^_attn_bwd_sm90$", 86) as names:
            assert names == ["_attn_bwd_sm90"] and [c[2] for c in calls] == [86, 86]
            raise KeyError("the timed block failed")
    assert [c[2] for c in calls] == [86, 86, carveout.DEFAULT, carveout.DEFAULT]


@pytest.mark.parametrize("percent", [101, -2, 1000])
def test_a_percent_out_of_range_is_refused_by_name(carveout, percent):
    loaded, calls = _loaded(carveout)
    with pytest.raises(ValueError, match=f"carve-out {percent}: a percent from 0 to 100"):
        loaded.set(carveout.GLUON_BWD_KERNELS, percent)
    assert calls == []


def test_a_pattern_that_matches_nothing_loaded_is_an_error(carveout):
    loaded, _ = _loaded(carveout)
    with pytest.raises(LookupError, match=r"no loaded kernel matches '\^_attn_bwd_ws_sm90\$'.*_attn_fwd_ws_sm90"):
        loaded.set(r"^_attn_bwd_ws_sm90$", 72)


def test_a_driver_error_names_the_kernel_and_the_result(carveout):
    loaded, _ = _loaded(carveout, rc=1)
    with pytest.raises(RuntimeError, match=r"CARVEOUT, 72\) on _attn_bwd_dq_sm90: CUresult 1"):
        loaded.set(carveout.GLUON_BWD_KERNELS, 72)


def test_install_hooks_triton_s_kernel_loads(carveout):
    knobs = pytest.importorskip("triton").knobs
    loaded = carveout.Loaded(lambda *a: 0)
    try:
        assert loaded.install() is loaded and loaded in knobs.runtime.kernel_load_end_hook.calls
        knobs.runtime.kernel_load_end_hook(None, 7, "_attn_bwd_sm90", None, "h")
        assert loaded.functions == {"_attn_bwd_sm90": [7]}
    finally:
        knobs.runtime.kernel_load_end_hook.remove(loaded)
