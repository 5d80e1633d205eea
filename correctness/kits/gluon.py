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

#: flash_gluon_bwd_ws.CANDIDATE_CONFIGS' test ids, in order: the GPU tests parametrise by index into it (the configs
#: themselves need Gluon at collection); test_flash_gluon_bwd pins each id against its config's fields.
WS_BWD_CANDIDATE_IDS = ("rebuild", "stage3b", "release", "s3", "s3-release", "stats", "stats-s3", "stats-s3-release")
