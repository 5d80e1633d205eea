"""The Gluon tests' skip mark: triton.experimental.gluon importable (the kernel table's and the call plans' CPU
tests need it; Triton builds without it run the Triton kernels only)."""
from __future__ import annotations

import importlib.util

import pytest


def gluon_found() -> bool:
    try:
        return importlib.util.find_spec("triton.experimental.gluon") is not None
    except ImportError:
        return False


needs_gluon = pytest.mark.skipif(not gluon_found(), reason="triton.experimental.gluon is not installed")
