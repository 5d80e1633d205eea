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


def run_faked(monkeypatch, probe: ModuleType, argv: list, out: Path, timings: dict, step_s: float = 0.0):
    """probe.main(argv + [out]) without a GPU (flash_gluon_fwd / flash_gluon_bwd): its measure replaced by a fake
    whose timings of a row (first, then each later round's) are timings[row label] in turn (dicts of quantities), the
    clock advanced step_s a timing. Returns (the JSON written, the row labels in the order timed)."""
    import json
    import types

    import torch

    clock, order, left = [0.0], [], {label: list(times) for label, times in timings.items()}

    def fake_measure(row, *_):
        label = probe.row_label(row)

        def again():
            order.append(label)
            clock[0] += step_s
            return dict(left[label].pop(0))

        return again(), again

    monkeypatch.setattr(probe, "measure", fake_measure)
    monkeypatch.setattr(probe, "inputs", lambda shape: None)
    monkeypatch.setattr(probe, "time", types.SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "fake")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    probe.main([str(out), *argv])
    return json.loads(out.read_text()), order
