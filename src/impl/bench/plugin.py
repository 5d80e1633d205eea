"""The pytest side of the bench layer, loaded by the root conftest (`pytest_plugins`): the
fixtures perf tests use (`device`, `profile`, `peaks`, `bench`), the session's list of rows that
did not run (written beside the benchmarks into the same JSON by `pytest_benchmark_update_json`),
and one progress line per finished row, so a person watching a long GPU command sees where it is.
"""
from __future__ import annotations

import contextlib
import functools

import pytest
import torch

from impl.bench.row import Metric, NotRunEntry, Row
from impl.runtime import default_device, profile_name


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
    """Per pytest session: rows that did not run, and the terminal for progress lines."""

    def __init__(self):
        self.not_run: list[NotRunEntry] = []
        self._config = None

    def attach(self, config) -> None:
        self.not_run.clear()
        self._config = config

    def add(self, entry: NotRunEntry) -> None:
        self.not_run.append(entry)
        self._line(f"{entry.name}: {entry.row.status.value} ({entry.row.reason})")

    def progress(self, name: str, row: Row, median_s: float) -> None:
        self._line(f"{name}: median {_fmt_s(median_s)}  {headline(row)}  {row.status.value}")

    def _line(self, text: str) -> None:
        # looked up at write time: the terminal reporter registers after this plugin configures
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


RECORDER = Recorder()


_STOP: dict[str, str] = {}  # why the session stopped early, if it did


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark loads what --benchmark-compare compares with
def pytest_configure(config):
    RECORDER.attach(config)
    _STOP.clear()
    if config.getoption("benchmark_compare", default=[]) not in ([], None, False):
        _write_compare_baseline(config)


def _write_compare_baseline(config) -> None:
    """`--benchmark-compare` out of the box: the newest committed run of every row for this device
    (impl.bench.store), written into pytest-benchmark's default storage as run 0000. A user's own
    saved runs (--benchmark-autosave) number from 0001, so plain --benchmark-compare takes the
    newest of those when there are any; --benchmark-compare=0000 always takes the committed one."""
    import json

    from pytest_benchmark.utils import get_machine_id

    from impl.bench.store import committed_baseline, device_slug

    storage = config.getoption("benchmark_storage")
    if storage not in ("file://./.benchmarks", "./.benchmarks", ".benchmarks"):
        return  # the user named a storage: theirs to fill
    baseline = committed_baseline(device_slug())
    if baseline is None:
        return
    folder = config.rootpath / ".benchmarks" / get_machine_id()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "0000_committed.json").write_text(json.dumps(baseline))


def pytest_keyboard_interrupt(excinfo):
    _STOP["why"] = "KeyboardInterrupt"


def pytest_sessionfinish(session, exitstatus):
    if session.shouldstop and "why" not in _STOP:  # e.g. pytest-timeout's --session-timeout
        _STOP["why"] = str(session.shouldstop)


def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Beside pytest-benchmark's entries: the rows that did not run, and what impl.bench.store needs
    to file the run (its device slug, and whether it was interrupted: such a run is not stored)."""
    from impl.bench.store import device_slug

    session = getattr(config, "_bench_session", None)
    stopped = _STOP.get("why") or (str(session.shouldstop) if session is not None and session.shouldstop else None)
    output_json["not_run"] = [e.to_json() for e in RECORDER.not_run]
    output_json["suite"] = dict(device_slug=device_slug(), interrupted=stopped is not None, why=stopped,
                                args=list(config.invocation_params.args))


def pytest_sessionstart(session):
    session.config._bench_session = session


@pytest.fixture(scope="session")
def device() -> torch.device:
    return default_device()


@pytest.fixture(scope="session")
def profile() -> str:
    return profile_name()


@pytest.fixture(scope="session")
def peaks(device):
    """MFU's denominators, measured once per session on first use (impl.bench.peaks)."""
    from impl.bench.peaks import measure_peaks

    return functools.cache(lambda: measure_peaks(device))


@pytest.fixture
def bench(benchmark, device, peaks):
    from impl.bench.harness import Harness

    return Harness(benchmark, device, peaks, RECORDER)
