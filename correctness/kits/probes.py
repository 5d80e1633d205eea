"""The probes under tools/probes imported as their scripts run: with their folder on sys.path (a probe imports
the probes beside it, e.g. flash_ncu_bwd imports flash_ncu), for as long as a test module uses them."""
from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

PROBES = Path(__file__).resolve().parents[2] / "tools" / "probes"


@contextmanager
def probe_module(name: str) -> Iterator[ModuleType]:
    sys.path.insert(0, str(PROBES))
    try:
        yield importlib.import_module(name)
    finally:
        sys.path.remove(str(PROBES))
