"""tools/gpu_lanes.sh on the CPU, with a stand-in nvidia-smi listing two GPUs: each command runs at once with its own
CUDA_VISIBLE_DEVICES, LANE and LANE_OUT; a lane past LANE_TIMEOUT is stopped and its rc (124) kept; every lane's
output and files come back packed in one lanes.tgz; more commands than GPUs, or none, or an OUT holding an earlier
run's lanes, are refused by name."""
from __future__ import annotations

import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "gpu_lanes.sh"


@pytest.fixture
def two_gpus(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n'\n")
    smi.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", OUT=str(tmp_path / "out"), LANE_TIMEOUT="4")


def _run(env, *commands):
    return subprocess.run(["bash", str(SCRIPT), *commands], env=env, capture_output=True, text=True, timeout=60)


def test_lanes_run_at_once_on_their_own_gpu_and_come_back_packed(two_gpus):
    start = time.monotonic()
    done = _run(two_gpus, 'echo "$LANE $CUDA_VISIBLE_DEVICES" > $LANE_OUT/who.txt; sleep 1',
                "sleep 30; echo gone-on")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20  # the second lane stopped at LANE_TIMEOUT, the first not waited for alone
    out = Path(two_gpus["OUT"])
    assert sorted(p.name for p in out.iterdir()) == ["lanes.tgz"]  # the loose files are packed, then removed
    with tarfile.open(out / "lanes.tgz") as tar:
        read = {m.name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    assert read["lanes/0/who.txt"] == "0 0\n"
    assert "lane 0 rc=0" in read["lanes/lane0.txt"]
    again = _run(two_gpus, "true")
    assert again.returncode == 2 and "holds an earlier run's lanes" in again.stderr
    with tarfile.open(out / "lanes.tgz") as tar:
        assert "lanes/0/who.txt" in tar.getnames()  # the first run's archive as it was
    assert "lane 1 rc=124" in read["lanes/lane1.txt"] and read["lanes/lane1.txt"].count("gone-on") == 1  # its command line only


def test_more_commands_than_gpus_or_none_are_refused(two_gpus):
    too_many = _run(two_gpus, "true", "true", "true")
    assert too_many.returncode == 2 and "3 commands for 2 GPU(s)" in too_many.stderr
    none = _run(two_gpus)
    assert none.returncode == 2 and "no command given" in none.stderr
    assert not (Path(two_gpus["OUT"]) / "lanes.tgz").exists()
