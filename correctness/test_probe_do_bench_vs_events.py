"""tools/probes/do_bench_vs_events.py (issues 45 and 47) on the CPU: its options (--ours, --shape, --modes), the plan
they give (the defaults keep the 2fbd353 run's), and the dry run (no GPU touched), which records them."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from kits.probes import probe_module

COMMITTED = Path(__file__).resolve().parents[1] / "reports/data/h100-80gb-x1/probes/do_bench_vs_events_2fbd353.json"


@pytest.fixture(scope="module")
def probe():
    with probe_module("do_bench_vs_events") as module:
        yield module


def test_the_defaults_are_the_first_runs_plan(probe):
    """No option: compiled Triton beside cuDNN at 1x16x16384x64, fwd_bwd then fwd: the 44 steps the probe of
    2fbd353 ran (reports/data/h100-80gb-x1/probes/do_bench_vs_events_2fbd353.json), in its order."""
    cfg = probe.parse_args(["x.json"]).config
    assert cfg == probe.Config("flash_triton", (1, 16, 16384, 64), ("fwd_bwd", "fwd"))
    assert [list(s) for s in probe.plan(cfg)] == json.loads(COMMITTED.read_text())["plan"]


def test_options_choose_ours_shape_and_modes(probe):
    cfg = probe.parse_args(["x.json", "--ours", "flash_auto", "--shape", "4x32x4096x128", "--modes", "fwd,bwd"]).config
    assert (cfg.ours, cfg.shape, cfg.modes, cfg.impls) == ("flash_auto", (4, 32, 4096, 128), ("fwd", "bwd"),
                                                           ("flash_auto", "sdpa_cudnn"))
    steps = probe.plan(cfg)
    assert steps[0] == ("setup:flash_auto", "flash_auto", None) and ("setup:sdpa_cudnn", "sdpa_cudnn", None) in steps
    assert {m for _, _, m in steps if m} == {"fwd", "bwd"} and not any(i == "flash_triton" for _, i, _ in steps)
    assert steps[-2:] == [("interleaved", None, "fwd"), ("interleaved", None, "bwd")]
    assert probe.ESTIMATE_S["setup:flash_auto"] < probe.ESTIMATE_S["setup:flash_triton"]  # no autotuning


@pytest.mark.parametrize("argv, words", [
    (["--ours", "sdpa_flash"], "invalid choice: 'sdpa_flash'"),
    (["--shape", "1x16x16384"], "--shape '1x16x16384': expected BxHxNxD"),
    (["--shape", "1x16x0x64"], "four positive integers"),
    (["--modes", "fwd,fwd+bwd"], "(unknown: ['fwd+bwd'])"),
    (["--modes", "fwd,fwd"], "expected distinct modes among fwd, fwd_bwd, bwd"),
    (["--modes", ","], "--modes ','"),
])
def test_bad_options_exit_2_naming_what_is_wrong(probe, capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        probe.parse_args(["x.json", *argv])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_the_dry_run_writes_the_plan_with_ours_shape_modes_and_its_estimate(probe, tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert probe.main([str(out), "--dry-run", "--ours", "flash_auto", "--modes", "fwd_bwd,fwd,bwd"]) == 0
    doc = json.loads(out.read_text())
    assert (doc["ours"], doc["shape"], doc["modes"], doc["dry_run"]) == ("flash_auto", [1, 16, 16384, 64],
                                                                         ["fwd_bwd", "fwd", "bwd"], True)
    assert len(doc["plan"]) == 2 * (1 + 3 * (1 + len(probe.METHODS))) + 3
    assert doc["estimate_s"] == sum(probe.ESTIMATE_S[s[0]] for s in doc["plan"])
    text = capsys.readouterr().out
    assert "ours flash_auto, shape 1x16x16384x64, modes fwd_bwd,fwd,bwd" in text
    assert f"{len(doc['plan'])} steps, estimate {doc['estimate_s']:.0f} s (budget 420 s)" in text
