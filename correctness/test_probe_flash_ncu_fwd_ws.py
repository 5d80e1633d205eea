"""tools/probes/flash_ncu_fwd_ws.py (the early_q slowdown under Nsight Compute) on the CPU: its arguments, its ncu
filter, the commands it prints, the interleaved timing order, and its refusal without an sm_90 GPU."""
from __future__ import annotations

import re
import shlex

import pytest
import torch

from kits.probes import probe_module


@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_ncu_fwd_ws") as module:
        yield module


def test_defaults_are_the_16k_shape_and_the_three_persistent_variants(probe):
    args = probe.parse_args([])
    assert args.shape == (4, 16, 16384, 128) and not args.full and args.time == 0
    assert args.variants == ("ws-persistent", "ws-o-regs", "ws-early-q")
    from impl.attention.flash_gluon_ws import CANDIDATE_CONFIGS, TRIAL_CONFIGS, GluonWsConfig
    for name in ("ws-early-q", "ws-o-regs", "ws-rotate", "ws-lazy-sum", "ws-prefetch-q"):
        assert GluonWsConfig(**probe.VARIANTS[name]) in TRIAL_CONFIGS, name
    assert GluonWsConfig(**probe.VARIANTS["ws-dynamic"]) in CANDIDATE_CONFIGS  # promoted (d3505e9)
    assert GluonWsConfig(**probe.VARIANTS["ws-persistent"]) == GluonWsConfig(persistent=True)


@pytest.mark.parametrize("argv,match", [(["--shape", "1,2,3"], "B,H,N,D"), (["--shape", "a,b,c,d"], "integers"),
                                        (["--variants", "ws,early-q"], "unknown"), (["--warmup", "0"], "warmup"),
                                        (["--time", "-1"], "--time")])
def test_refuses_bad_arguments(probe, argv, match, capsys):
    with pytest.raises(SystemExit):
        probe.parse_args(argv)
    assert re.search(match, capsys.readouterr().err)


def test_the_filter_selects_the_ws_forward_and_cudnns_forward_only(probe):
    rx = re.compile(probe.KERNEL_REGEX)
    assert rx.search("_attn_fwd_ws_sm90")
    assert rx.search("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_4x1x1_kernel0_0")
    for name in ("_attn_fwd_sm90", "_attn_fwd", "_attn_bwd_ws_sm90", "vectorized_elementwise_kernel",
                 "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0"):
        assert not rx.search(name), name


def test_cudnn_is_a_variant_beside_ours(probe):
    args = probe.parse_args(["--variants", "ws,cudnn", "--shape", "4,32,4096,128"])
    assert args.variants == ("ws", "cudnn") and "cudnn" not in probe.VARIANTS


@pytest.mark.parametrize("report", ["fwd", "src"])
def test_ncu_command_bounds_the_replay_and_round_trips(probe, report):
    args = probe.parse_args(["--variants", "ws,ws-persistent,ws-early-q", "--shape", "4,32,4096,128", "--full"])
    words = shlex.split(probe.ncu_command(args, report))
    assert words[0] == "ncu" and f"$OUT/{report}" in words
    for flag, value in (("--profile-from-start", "off"), ("--clock-control", "none"), ("--launch-count", "3"),
                        ("--kernel-name", "regex:" + probe.KERNEL_REGEX)):
        assert words[words.index(flag) + 1] == value
    sections, metrics = probe.PROFILES[report]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--section"] == list(sections)
    assert ("--metrics" in words) == bool(metrics)
    again = probe.parse_args(words[words.index("tools/probes/flash_ncu_fwd_ws.py") + 1:])
    assert (again.shape, again.full, again.variants, again.warmup, again.time) == (
        args.shape, True, args.variants, args.warmup, 0)


def test_timing_alternates_the_order(probe):
    calls = []
    times = probe.time_rounds(["a", "b"], ["fa", "fb"], 3, lambda fn: calls.append(fn) or float(len(calls)))
    assert calls == ["fa", "fb", "fb", "fa", "fa", "fb"]
    assert times == {"a": [1.0, 4.0, 5.0], "b": [2.0, 3.0, 6.0]}


def test_refuses_without_an_sm90_gpu(probe, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="flash_ncu_fwd_ws: needs a CUDA GPU"):
        probe.main([])
    with pytest.raises(SystemExit, match="flash_ncu_fwd_ws: needs a CUDA GPU"):
        probe.main(["--time", "3"])
    probe.main(["--ncu-command"])  # needs no GPU
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("ncu ") for line in lines)
