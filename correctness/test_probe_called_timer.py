"""tools/probes/called_timer.py (the Gluon probes' --short timer) on the CPU, CUDA events stood in by a clock that
each call advances: the median per-call time of rounds of back-to-back calls, each round at least ROUND_S long."""
from __future__ import annotations

import torch

from kits.probes import probe_module


def test_called_ms_is_the_per_call_time_of_back_to_back_rounds(monkeypatch):
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self):
            self.at = clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = []
    costs = iter([0.5] * 4 + [0.5] * 50 * 4 + [2.0] * 50 + [0.5] * 50 * 5)  # one slow round of ten: the median holds

    def fn():
        calls.append(1)
        clock[0] += next(costs)

    with probe_module("called_timer") as timer:
        assert timer.called_ms(fn) == 0.5
        assert len(calls) == 1 + 3 + timer.ROUNDS * 50  # 25 ms rounds of 0.5 ms calls
