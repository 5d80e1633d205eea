"""tools/probes/flash_gluon_fwd.py (issue 47's do_bench probe of the Gluon forwards) on the CPU: --shapes / --rows
select the rows a trial's GPU call times, and the default plan has no trial rows."""
from __future__ import annotations

import argparse

import pytest

from kits.probes import probe_module

pytest.importorskip("triton.experimental.gluon")  # the plan reads flash_gluon_ws's configs


@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_gluon_fwd") as module:
        yield module


def _labels(probe, rows):
    return [f"{probe.shape_name(r['shape'])} {r['impl']} {probe.cfg_text(r['config'])}".strip() for r in rows]


def test_the_lpt_call_times_cudnn_the_default_grid_and_the_lpt_grid_per_shape(probe):
    """The lpt grid's GPU call (NOTES.md, "Issue 47, the ws forward's causal gap at N 2048-4096"): per shape cuDNN,
    the default ws config, the same config with lpt; the default plan keeps no lpt row."""
    shapes = [probe.parse_shape(s) for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")]
    labels = _labels(probe, probe.plan(shapes, ("cudnn", "ws", "ws-lpt")))
    assert labels == [f"{s} {row}" for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")
                      for row in ("cudnn", "gluon-ws 2x64x128 s3 pp", "gluon-ws 2x64x128 s3 pp lpt")]
    assert not any("lpt" in label for label in _labels(probe, probe.plan()))
    assert _labels(probe, probe.plan(shapes[:1])) == _labels(probe, probe.plan())[:6]  # the default shape rows


def test_the_lpt_call_counts_the_triton_reference_compile_once(probe):
    """A Gluon row's error is measured against the Triton forward's output: without a triton row, the first Gluon
    row of a (d, causal) pays the autotune compile in its estimate."""
    rows = probe.plan([probe.parse_shape("4x32x4096x128"), probe.parse_shape("4x32x2048x128")], ("ws", "ws-lpt"))
    assert rows[0]["est"] >= probe.TRITON_FWD_CONFIGS * probe.COMPILE_S and all(r["est"] < 10 for r in rows[1:])


@pytest.mark.parametrize("text", ["4x32x4096", "4x32x4096x128:causal", "4xAx4096x128"])
def test_a_malformed_shape_is_refused_by_name(probe, text):
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        probe.parse_shape(text)
    assert probe.parse_shape("4x32x4096x128:full") == (4, 32, 4096, 128, False)
