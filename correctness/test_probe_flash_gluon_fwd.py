"""tools/probes/flash_gluon_fwd.py (issue 47's probe of the Gluon forwards) on the CPU: its --short plan (the
kernel table's min_seq), the --only selection of the lead's call, that the short rows run the kernels=auto
path; --shapes / --rows select the rows a trial's GPU call times, and the default plan has no trial rows."""
from __future__ import annotations

import argparse

import pytest

from kits.probes import probe_module

pytest.importorskip("triton.experimental.gluon")  # the plan reads flash_gluon_ws's configs

#: The lead's short call (NOTES.md, "Issue 47, stage 4: the kernel table's min_seq"): d 128 and 64 causal, cuDNN,
#: the table's ws config and Triton.
SHORT_ONLY = [r"^4x32x\d+x(128|64) (cudnn|triton autotuned|gluon-ws 2x64x128 s3 pp)$"]


@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_gluon_fwd") as module:
        yield module


def test_the_short_plan_times_the_table_candidates_as_called_with_triton_last(probe):
    rows = probe.plan(short=True)
    shapes = [(4, 32, n, d, causal) for n in probe.SHORT_SEQS for d, causal in probe.SHORT_KEYS]
    assert list(dict.fromkeys(r["shape"] for r in rows)) == shapes and probe.SHORT_SEQS[-1] == 3000
    for s in shapes:
        assert [(r["impl"], probe.cfg_text(r["config"])) for r in rows if r["shape"] == s] == [
            ("cudnn", ""), ("gluon-ws", "2x64x128 s3 pp"), ("gluon-ws", "2x64x128 s3 pp persist"),
            ("triton", "autotuned")]
    assert all(r["timer"] == "called" for r in rows)
    assert not any("timer" in r for r in probe.plan())  # the default plan: do_bench, as before


def test_the_leads_short_call_fits_its_estimate(probe, capsys):
    rows = probe.plan(short=True, only=tuple(SHORT_ONLY))
    assert [probe.row_label(r) for r in rows[:3]] == ["4x32x512x128 cudnn", "4x32x512x128 gluon-ws 2x64x128 s3 pp",
                                                      "4x32x512x128 triton autotuned"]
    assert len(rows) == 24 and sum(r["est"] for r in rows) <= 180  # compiles at 5 s each: ~2x the H100's
    probe.main(["--dry-run", "--short", "--only", SHORT_ONLY[0]])
    assert capsys.readouterr().out.splitlines()[-1].startswith("24 rows, estimate")
    with pytest.raises(SystemExit):
        probe.main(["--dry-run", "--only", "no such row"])


def test_a_short_row_runs_the_forward_through_the_dispatch(probe, monkeypatch):
    """The kernels="auto" path once the table named the config (plans included), with the config as the table's
    pairs."""
    from impl.attention import flash_dispatch, flash_gluon_ws
    from impl.attention.kernel_table import config_pairs
    calls = []
    monkeypatch.setattr(flash_dispatch, "gluon_forward", lambda *a: calls.append(a) or ("o", "lse", "record"))
    config = flash_gluon_ws.default_config(128)
    assert probe.auto_forward(config)("q", "k", "v", True, config) == ("o", "lse")
    ((q, k, v, causal, options, kernel, pairs),) = calls
    assert (options.kernels, kernel, pairs) == ("auto", "gluon_ws", config_pairs(config))
    assert flash_gluon_ws.GluonWsConfig(**dict(pairs)) == config


def _labels(probe, rows):
    return [f"{probe.shape_name(r['shape'])} {r['impl']} {probe.cfg_text(r['config'])}".strip() for r in rows]


def test_the_lpt_call_times_cudnn_the_default_grid_and_the_lpt_grid_per_shape(probe):
    """The lpt grid's GPU call (NOTES.md, "Issue 47, the ws forward's causal gap at N 2048-4096"): per shape cuDNN,
    the default ws config, the same config with lpt; the default plan keeps no lpt row."""
    shapes = [probe.parse_shape(s) for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")]
    labels = _labels(probe, probe.plan(shapes=shapes, kinds=("cudnn", "ws", "ws-lpt")))
    assert labels == [f"{s} {row}" for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")
                      for row in ("cudnn", "gluon-ws 2x64x128 s3 pp", "gluon-ws 2x64x128 s3 pp lpt")]
    assert not any("lpt" in label for label in _labels(probe, probe.plan()))
    assert _labels(probe, probe.plan(shapes=shapes[:1])) == _labels(probe, probe.plan())[:6]  # the default shape rows


def test_the_lpt_call_counts_the_triton_reference_compile_once(probe):
    """A Gluon row's error is measured against the Triton forward's output: without a triton row, the first Gluon
    row of a (d, causal) pays the autotune compile in its estimate."""
    shapes = [probe.parse_shape("4x32x4096x128"), probe.parse_shape("4x32x2048x128")]
    rows = probe.plan(shapes=shapes, kinds=("ws", "ws-lpt"))
    assert rows[0]["est"] >= probe.TRITON_FWD_CONFIGS * probe.COMPILE_S and all(r["est"] < 10 for r in rows[1:])


@pytest.mark.parametrize("text", ["4x32x4096", "4x32x4096x128:causal", "4xAx4096x128"])
def test_a_malformed_shape_is_refused_by_name(probe, text):
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        probe.parse_shape(text)
    assert probe.parse_shape("4x32x4096x128:full") == (4, 32, 4096, 128, False)


def test_the_early_q_call_times_the_persistent_grid_with_and_without_it(probe):
    """The early_q trial's GPU call (NOTES.md, "Issue 47, the ws forward's per-CTA fixed cost"): per shape cuDNN, the
    default ws grid, persistent, persistent with early_q; the default plan (and --rows' default) keeps no trial row."""
    names = ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128", "4x32x4096x128:full")
    shapes = [probe.parse_shape(s) for s in names]
    labels = _labels(probe, probe.plan(shapes=shapes, kinds=("cudnn", "ws", "ws-persistent", "ws-early-q")))
    assert labels == [f"{s.replace(':full', ' full')} {row}" for s in names
                      for row in ("cudnn", "gluon-ws 2x64x128 s3 pp", "gluon-ws 2x64x128 s3 pp persist",
                                  "gluon-ws 2x64x128 s3 pp persist early-q")]
    assert not any("early-q" in label for label in _labels(probe, probe.plan()) + _labels(probe, probe.plan(shapes)))
    from impl.attention import flash_gluon_ws

    (row,) = [r for r in probe.plan(shapes=shapes[:1], kinds=("ws-early-q",))]
    assert row["config"] in flash_gluon_ws.TRIAL_CONFIGS and row["config"].early_q and row["config"].persistent
