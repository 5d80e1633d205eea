"""The pytest side of the bench layer, loaded by the root conftest (`pytest_plugins`): the
fixtures perf tests use (`device`, `profile`, `peaks`, `bench`), the session's list of rows that
did not run (written beside the benchmarks into the same JSON by `pytest_benchmark_update_json`),
and one progress line per finished row, so a person watching a long GPU command sees where it is.
It also keeps a run honest: its failed tests go into the JSON (impl.bench.store refuses such a
run), a second timed run on the same device is refused (impl.bench.runlock), `--benchmark-compare`
reads the committed runs from git's HEAD, and what pytest-benchmark writes lands in the repo's
.benchmarks and out/ from any folder.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os

import pytest
import torch

from impl.bench.row import Metric, NotRunEntry, Row
from impl.bench.store import FailedTest, write_atomically
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
        self.failed: list[FailedTest] = []
        self._config = None

    def attach(self, config) -> None:
        self.not_run.clear()
        self.failed.clear()
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


_DEFAULT_STORAGE = ("file://./.benchmarks", "./.benchmarks", ".benchmarks")
_COMPARE_NOTES: list[str] = []  # what --benchmark-compare compares with, shown in the header


def pytest_report_header(config):
    return [f"[bench] {note}" for note in _COMPARE_NOTES]


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark reads its options and loads what it compares with
def pytest_configure(config):
    RECORDER.attach(config)
    _STOP.clear()
    _COMPARE_NOTES.clear()
    _check_profile()
    root = config.rootpath
    # pytest-benchmark's paths are relative to the current folder: pin them to the repo, so a run
    # from perf/ reads and writes what one from the root does, and nothing lands outside out/ or .benchmarks
    if config.getoption("benchmark_storage", default=None) in _DEFAULT_STORAGE:
        config.option.benchmark_storage = f"file://{root / '.benchmarks'}"
    histograms = config.getoption("benchmark_histogram", default=None) or []
    config.option.benchmark_histogram = [h if os.path.isabs(h) else str(root / "out" / "histograms" / h)
                                         for h in histograms]
    if config.getoption("benchmark_compare", default=[]) not in ([], None, False):
        _write_compare_baseline(config)


def _check_profile() -> None:
    """SUITE_PROFILE=full on a CPU would run the course's GPU grids for hours: refused unless meant."""
    if (os.environ.get("SUITE_PROFILE") == "full" and not torch.cuda.is_available()
            and os.environ.get("SUITE_FULL_ON_CPU") != "1"):
        raise pytest.UsageError("SUITE_PROFILE=full on a machine without a GPU runs the course's GPU grids for "
                                "hours; use the smoke profile, or set SUITE_FULL_ON_CPU=1 if you mean it")


def _write_compare_baseline(config) -> None:
    """`--benchmark-compare` out of the box. The newest committed run of every row for this device
    (impl.bench.store.committed_baseline: git's HEAD, not the working tree) is written into
    pytest-benchmark's storage as run 0000, which `--benchmark-compare=0000` names. Plain
    `--benchmark-compare` reads a merge, out/compare/<device>.json: the committed rows, each
    replaced by the same row of the user's newest saved run (--benchmark-autosave, 0001 on) that
    holds it, so a saved run of one section shadows only its own rows."""
    from pytest_benchmark.utils import get_machine_id

    from impl.bench.store import committed_baseline, device_slug

    if config.getoption("benchmark_storage") != f"file://{config.rootpath / '.benchmarks'}":
        return  # the user named a storage: theirs to fill and compare with
    device = device_slug()
    baseline = committed_baseline(device)
    for why in baseline.skipped:
        _COMPARE_NOTES.append(f"compare: skipped {why}")
    folder = config.rootpath / ".benchmarks" / get_machine_id()
    committed = folder / "0000_committed.json"
    if baseline.doc is not None:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomically(committed, baseline.doc)
    else:
        committed.unlink(missing_ok=True)  # never compare with an earlier HEAD's rows
        _COMPARE_NOTES.append(f"compare: no committed {device} run in {baseline.source}")
    if config.getoption("benchmark_compare") is not True:
        return  # a named run (0000, 0003, a file): pytest-benchmark's own choice
    merged = dict(baseline.doc or {}, benchmarks=list((baseline.doc or {}).get("benchmarks", [])), not_run=[])
    rows = {b["fullname"]: b for b in merged["benchmarks"]}
    saved = sorted(p for p in folder.glob("[0-9][0-9][0-9][0-9]_*.json") if not p.name.startswith("0000_"))
    for path in saved:  # oldest first: a newer saved run's row replaces an older one's
        try:
            doc = json.loads(path.read_text())
            benches = {b["fullname"]: b for b in doc["benchmarks"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _COMPARE_NOTES.append(f"compare: skipped saved run {path} ({type(exc).__name__}: {exc})")
            continue
        rows.update(benches)
        merged = dict(doc, benchmarks=[], not_run=[])
    if not rows:
        return  # nothing to compare with: pytest-benchmark says "Can't compare"
    merged["benchmarks"] = sorted(rows.values(), key=lambda b: b["fullname"])
    target = config.rootpath / "out" / "compare" / f"{device}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, merged)
    shadow = f", shadowed row by row by the saved runs {', '.join(p.stem for p in saved)}" if saved else ""
    _COMPARE_NOTES.append(f"compare: baseline {target}: the committed rows ({baseline.source}){shadow}")
    config.option.benchmark_compare = str(target)


@pytest.hookimpl(wrapper=True)
def pytest_benchmark_compare_machine_info(config, benchmarksession, machine_info, compared_benchmark):
    """pytest-benchmark's warning names its storage relative to the current folder, and raises
    where that is the repo's storage and pytest runs from a subfolder (perf/): the same warning then."""
    try:
        return (yield)
    except ValueError:
        benchmarksession.logger.warning(f"Benchmark machine_info is different from the compared run's "
                                        f"(storage {benchmarksession.storage}).")
        return []


def pytest_terminal_summary(terminalreporter, config):
    """After pytest-benchmark's table: each timed row the comparison had no baseline for, by name
    (pytest-benchmark shows such a row without a comparison and passes --benchmark-compare-fail)."""
    bs = getattr(config, "_benchmarksession", None)
    if bs is None or not bs.compare or not bs.benchmarks:
        return
    known = set().union(*(m.keys() for m in bs.compared_mapping.values())) if bs.compared_mapping else set()
    missing = [b.fullname for b in bs.benchmarks if b and b.fullname not in known]
    for name in missing:
        terminalreporter.write_line(f"[bench] compare: no baseline for {name}")
    if missing:
        terminalreporter.write_line(f"[bench] compare: {len(bs.benchmarks) - len(missing)} of {len(bs.benchmarks)} "
                                    "timed rows compared")


_LOCK: list = []  # the session's device lock, while it holds one


def pytest_collection_finish(session):
    """A session that will time benchmarks takes the device's lock (impl.bench.runlock): a second
    one would load the machine under the first one's timings."""
    from impl.bench.runlock import DeviceBusy, RunLock
    from impl.bench.store import device_slug

    bs = getattr(session.config, "_benchmarksession", None)
    if bs is None or bs.disabled or bs.skip or _LOCK or session.config.getoption("collectonly", default=False):
        return
    if not any("benchmark" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    lock = RunLock(session.config.rootpath / "out" / "locks", device_slug())
    try:
        lock.acquire()
    except DeviceBusy as exc:
        pytest.exit(f"refused: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    _LOCK.append(lock)


def pytest_unconfigure(config):
    while _LOCK:
        _LOCK.pop().release()


def pytest_runtest_logreport(report):
    if report.failed:  # a failure in setup or teardown is an error; the store refuses either
        RECORDER.failed.append(FailedTest(report.nodeid, report.when))


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
                                args=list(config.invocation_params.args),
                                failed=[dict(test=f.test, when=f.when) for f in RECORDER.failed])


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
