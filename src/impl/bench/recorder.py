"""What one pytest session records beside pytest-benchmark's own entries: the rows that did not run,
the tests that failed (impl.bench.store refuses a run with any), and one progress line per finished
row, so a person watching a long GPU command sees where it is. The harness writes into it; the
plugin's session owns one and puts it into the run's JSON."""
from __future__ import annotations

import contextlib

from impl.bench.row import Metric, NotRunEntry, Row
from impl.bench.store import FailedTest


def _fmt_s(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def headline(row: Row) -> str:
    """The one figure that says most about a row, for progress lines and tables."""
    m = row.metrics
    if Metric.TFLOPS in m:
        mfu = m.get(Metric.MFU, m.get(Metric.MFU_MEASURED_PEAK))
        which = "" if Metric.MFU in m else " of measured peak"
        return f"{m[Metric.TFLOPS]:.3g} TFLOP/s ({100 * mfu:.1f}% MFU{which})"
    if Metric.BUS_BW in m:
        return f"busbw {m[Metric.BUS_BW]:.1f} GB/s"
    if Metric.GBPS in m:
        return f"{m[Metric.GBPS]:.1f} GB/s"
    if Metric.TOKENS_PER_S in m:
        return f"{m[Metric.TOKENS_PER_S]:.4g} tokens/s"
    return ""


class Recorder:
    """Per pytest session: rows that did not run, failed tests, and the terminal for progress lines
    (`config` None: no terminal, e.g. in a unit test)."""

    def __init__(self, config=None):
        self.not_run: list[NotRunEntry] = []
        self.failed: list[FailedTest] = []
        self._config = config

    def add(self, entry: NotRunEntry) -> None:
        self.not_run.append(entry)
        self._line(f"{entry.name}: {entry.row.status.value} ({entry.row.reason})")

    def progress(self, name: str, row: Row, median_s: float) -> None:
        self._line(f"{name}: median {_fmt_s(median_s)}  {headline(row)}  {row.status.value}")

    def _line(self, text: str) -> None:
        # looked up at write time: the terminal reporter registers after the plugin configures
        if self._config is None:
            return
        terminal = self._config.pluginmanager.get_plugin("terminalreporter")
        capture = self._config.pluginmanager.get_plugin("capturemanager")
        if terminal is None:
            return
        # inside a test, output is captured; progress must reach the person watching now
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            terminal.ensure_newline()
            terminal.write_line(f"[bench] {text}")


__all__ = ["Recorder", "headline"]
