"""tools/probes/flash_ncu_bwd.py (issue 47's Nsight Compute probe) on the CPU: its arguments, the kernels
its ncu filter selects, the command it prints, and its refusal without an sm_90 GPU."""
from __future__ import annotations

import re
import shlex

import pytest
import torch

from kits.probes import probe_module



@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_ncu_bwd") as module:
        yield module


def test_defaults_are_the_8b_shape_and_every_variant(probe):
    args = probe.parse_args([])
    assert args.shape == (1, 32, 32768, 128) and not args.full
    assert [v.name for v in args.variants] == ["one-pass", "one-pass-dq2", "one-pass-atomic", "one-pass-rebuild", "ws",
                                               "split-triton", "split-gluon", "cudnn"]
    assert probe.kernels(args.variants) == ["_attn_bwd_sm90", "_attn_bwd_sm90", "_attn_bwd_sm90", "_attn_bwd_sm90",
                                            "_attn_bwd_ws_sm90",
                                            "_attn_bwd_dq", "_attn_bwd_sm90", "_attn_bwd_dq_sm90", "_attn_bwd_sm90",
                                            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]


@pytest.mark.parametrize("argv,match", [(["--shape", "1,2,3"], "B,H,N,D"), (["--shape", "a,b,c,d"], "integers"),
                                        (["--variants", "one-pass,atomic"], "unknown"),
                                        (["--shape", "4,32,4096,80", "--variants", "ws"],
                                         "ws runs at head dims 64, 128 only, not 80"),
                                        (["--variants", "ws-own-keys"], "ws-own-keys runs at head dims 64 only, not 128"),
                                        (["--shape", "4,32,4096,80", "--variants", "ws-prescaled-lse"],
                                         "ws-prescaled-lse runs at head dims 64, 128 only, not 80"),
                                        (["--shape", "4,32,4096,80", "--variants", "ws-stats-smem"],
                                         "ws-stats-smem runs at head dims 64, 128 only, not 80"),
                                        (["--warmup", "0"], "warmup"),
                                        (["--carveout", "101"], "--carveout: carve-out 101: a percent")])
def test_refuses_bad_arguments(probe, argv, match, capsys):
    with pytest.raises(SystemExit):
        probe.parse_args(argv)
    assert re.search(match, capsys.readouterr().err)


def test_the_filter_selects_the_backward_kernels_only(probe):
    """Every kernel a variant profiles (and cuDNN's d 64 bprop name seen in flash_ncu-v3.txt) matches;
    the forwards, the preprocess, the casts and cuDNN's small kernels do not."""
    rx = re.compile(probe.KERNEL_REGEX)
    for name in probe.kernels(probe.VARIANTS) + [
            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0"]:
        assert rx.search(name), name
    fprop = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
    for name in ("_attn_bwd_preprocess", "_attn_fwd", "_attn_fwd_sm90", "_attn_fwd_ws_sm90",
                 "vectorized_elementwise_kernel", fprop, "compute_dot_do_o_specialized", "convert_dq_to_16bits"):
        assert not rx.search(name), name


@pytest.mark.parametrize("report", ["bwd", "src"])
def test_ncu_command_bounds_the_replay_and_round_trips(probe, report):
    args = probe.parse_args(["--variants", "one-pass,cudnn", "--shape", "4,32,4096,128", "--full", "--carveout", "72"])
    cmd = probe.ncu_command(args, report)
    words = shlex.split(cmd)
    assert words[0] == "ncu" and f"$OUT/{report}" in cmd
    for flag, value in (("--profile-from-start", "off"), ("--clock-control", "none"), ("--launch-count", "2"),
                        ("--kernel-name", "regex:" + probe.KERNEL_REGEX)):
        assert words[words.index(flag) + 1] == value
    sections, metrics = probe.PROFILES[report]
    assert [words[i + 1] for i, w in enumerate(words) if w == "--section"] == list(sections)
    assert ("--metrics" in words) == bool(metrics)
    again = probe.parse_args(words[words.index("tools/probes/flash_ncu_bwd.py") + 1:])
    assert (again.shape, again.full, again.variants, again.warmup, again.carveout) == (
        args.shape, args.full, args.variants, args.warmup, 72)


def test_ncu_command_flushes_the_caches_unless_told_to_keep_them_warm(probe):
    """ncu's own default (--cache-control all, unsaid: the earlier commands unchanged) or --cache-control none: L2 as
    the previous kernel left it, the suite's back-to-back rounds."""
    assert "--cache-control" not in shlex.split(probe.ncu_command(probe.parse_args([]), "bwd"))
    words = shlex.split(probe.ncu_command(probe.parse_args(["--cache-control", "none"]), "bwd"))
    assert words[words.index("--cache-control") + 1] == "none"
    assert words.index("--cache-control") < words.index("tools/probes/flash_ncu_bwd.py")  # ncu's, not the probe's
    with pytest.raises(ValueError, match="cache_control 'some'"):
        probe.ncu_line([], "x", 1, [], [], "r", "$OUT", "python3", cache_control="some")


def test_refuses_without_an_sm90_gpu(probe, monkeypatch, capsys):
    """No GPU, or another one: a message, before any tensor or kernel."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="flash_ncu_bwd: needs a CUDA GPU"):
        probe.main([])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100")
    with pytest.raises(SystemExit, match="needs compute capability 9.0, found 8.0"):
        probe.main([])
    probe.main(["--ncu-command"])  # needs no GPU
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith("ncu ") for line in lines)


def test_d64_takes_the_ws_backward_and_its_own_keys_trial(probe):
    """At d 64 the ws backward (the kernel table's config there) and the dq_own_keys trial profile side by side."""
    args = probe.parse_args(["--shape", "1,16,16384,64", "--variants", "ws,ws-own-keys,cudnn"])
    assert probe.kernels(args.variants) == ["_attn_bwd_ws_sm90", "_attn_bwd_ws_sm90",
                                            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]
    assert "ws,ws-own-keys,cudnn" in probe.ncu_command(args)


@pytest.mark.parametrize("shape", ["1,16,16384,64", "4,32,4096,128"])
def test_the_prescaled_lse_trial_profiles_when_named_at_d64_and_d128(probe, shape):
    """Issue 47, ws prescaled lse: ws-prescaled-lse (a TRIAL_CONFIGS entry) profiles the ws kernel beside the default
    at d 64 and 128 when --variants names it; never among the defaults (test_defaults_...)."""
    args = probe.parse_args(["--shape", shape, "--variants", "ws,ws-prescaled-lse,cudnn"])
    assert probe.kernels(args.variants) == ["_attn_bwd_ws_sm90", "_attn_bwd_ws_sm90",
                                            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]
    assert "ws,ws-prescaled-lse,cudnn" in probe.ncu_command(args)
    assert "ws-prescaled-lse" not in probe.DEFAULT_VARIANTS and probe.BY_NAME["ws-prescaled-lse"].trial


@pytest.mark.parametrize("shape", ["1,16,16384,64", "4,32,4096,128"])
def test_the_stats_smem_trial_profiles_when_named_at_d64_and_d128(probe, shape):
    """Issue 47, ws stats in shared memory: ws-stats-smem (with prescaled_lse) profiles the ws
    kernel beside the default and the prescaled trial when --variants names it; never among the defaults."""
    args = probe.parse_args(["--shape", shape, "--variants", "ws,ws-prescaled-lse,ws-stats-smem,cudnn"])
    assert probe.kernels(args.variants) == ["_attn_bwd_ws_sm90"] * 3 + [
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]
    assert "ws,ws-prescaled-lse,ws-stats-smem,cudnn" in probe.ncu_command(args)
    assert "ws-stats-smem" not in probe.DEFAULT_VARIANTS and probe.BY_NAME["ws-stats-smem"].trial


def test_the_lean_sync_trial_profiles_when_named_beside_the_table_config(probe):
    """Issue 47, the d 64 backward's handshakes: ws-lean-sync (the statistics through the ring with lean_sync, a
    TRIAL_CONFIGS entry) profiles the ws kernel beside the table's d 64 config and cuDNN when --variants names it, at d
    64 and 128 (not 80); never among the defaults."""
    args = probe.parse_args(["--shape", "1,16,16384,64", "--variants", "ws-stats-smem,ws-lean-sync,cudnn"])
    assert probe.kernels(args.variants) == ["_attn_bwd_ws_sm90"] * 2 + [
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop"]
    assert "ws-stats-smem,ws-lean-sync,cudnn" in probe.ncu_command(args)
    assert "ws-lean-sync" not in probe.DEFAULT_VARIANTS and probe.BY_NAME["ws-lean-sync"].trial
    assert probe.BY_NAME["ws-lean-sync"].head_dims == (64, 128)
