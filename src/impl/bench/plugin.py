"""The pytest side of the bench layer, registered by the root conftest (`pytest_plugins`) and
imported by nothing else. Shaped like pytest-benchmark's own plugin: pytest_configure makes the
run's `BenchSession` (impl.bench.session: rows that did not run, failed tests, the device lock,
the compare baseline), keeps it on `config.stash[SESSION]` and registers it, so its hooks and the
fixtures below read the run's state from pytest's config, not from module globals.

Fixtures for perf tests: `device`, `profile`, `peaks`, `bench` (impl.bench.harness.Harness); every
test module's budgets start with its first test.
"""
from __future__ import annotations

import functools
import os

import pytest
import torch

from impl.bench.harness import Budget, Harness
from impl.bench.peaks import measure_peaks
from impl.bench.session import BenchSession
from impl.runtime import default_device, profile_name

SESSION = pytest.StashKey[BenchSession]()


def check_profile() -> None:
    """SUITE_PROFILE=full on a CPU would run the course's GPU grids for hours: refused unless meant."""
    if (os.environ.get("SUITE_PROFILE") == "full" and not torch.cuda.is_available()
            and os.environ.get("SUITE_FULL_ON_CPU") != "1"):
        raise pytest.UsageError("SUITE_PROFILE=full on a machine without a GPU runs the course's GPU grids for "
                                "hours; use the smoke profile, or set SUITE_FULL_ON_CPU=1 if you mean it")


@pytest.hookimpl(tryfirst=True)  # before pytest-benchmark reads its options and loads what it compares with
def pytest_configure(config):
    check_profile()
    session = BenchSession(config)
    session.pin_paths()
    config.stash[SESSION] = session
    config.pluginmanager.register(session, "impl-bench-session")


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


@pytest.fixture(scope="session")
def device() -> torch.device:
    return default_device()


@pytest.fixture(scope="session")
def profile() -> str:
    return profile_name()


@pytest.fixture(scope="session")
def peaks(device):
    """MFU's denominators, measured once per session on first use (impl.bench.peaks)."""
    return functools.cache(lambda: measure_peaks(device))


@pytest.fixture(scope="module", autouse=True)
def _budgets_start_with_the_file(request):
    """A perf file's budgets (module-level Budget objects, made when pytest imports the file at
    collection) start when the file's first test does, before its module fixtures: a later file of
    the session keeps its whole budget (issue 46)."""
    for value in vars(request.module).values():
        if isinstance(value, Budget):
            value.start()


@pytest.fixture
def bench(benchmark, device, peaks, request):
    return Harness(benchmark, device, peaks, request.config.stash[SESSION].recorder)
