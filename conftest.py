"""Fixtures shared by correctness/ and perf/: device, profile, the measured matmul peak, and the
skip rules for the gpu / multi_gpu markers."""
import os

import pytest
import torch

from impl.runtime import default_device, profile_name

if not torch.cuda.is_available():
    # Triton kernels run on the CPU through the interpreter; set before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs, found {gpus}"))


@pytest.fixture(scope="session")
def device() -> torch.device:
    return default_device()


@pytest.fixture(scope="session")
def profile() -> str:
    return profile_name()


@pytest.fixture(scope="session")
def matmul_peak(device) -> dict:
    """Measured once per session; every MFU in the JSON divides by this figure."""
    from impl.bench.peaks import measure_matmul_peak

    return measure_matmul_peak(device)
