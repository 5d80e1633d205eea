"""One pytest run's bench state and the hooks that read it, as pytest-benchmark keeps its own
(`config._benchmarksession`): impl.bench.plugin makes a `BenchSession` in pytest_configure, keeps
it on `config.stash[SESSION]` and registers it as a plugin, so nothing lives in module globals and
a second pytest run in one process (pytester, a unit test) starts clean."""
from __future__ import annotations

import os

import pytest

from impl.bench.compare_baseline import write_compare_baseline
from impl.bench.kernel_digest import running_kernels
from impl.bench.recorder import Recorder
from impl.bench.runlock import DeviceBusy, RunLock
from impl.bench import store

_DEFAULT_STORAGE = ("file://./.benchmarks", "./.benchmarks", ".benchmarks")


class BenchSession:
    """What one pytest run records beside pytest-benchmark (the recorder), why it stopped early if
    it did, what `--benchmark-compare` compares with, the device lock while it holds one, and the
    kernels it imports (impl.bench.kernel_digest; None outside a checkout), digested when pytest
    configures, before a perf file imports them."""

    def __init__(self, config):
        self.config = config
        self.kernels = running_kernels()
        self.recorder = Recorder(config)
        self.compare_notes: list[str] = []
        self.stop_reason: str | None = None
        self.lock: RunLock | None = None
        self.session: pytest.Session | None = None

    def pin_paths(self) -> None:
        """pytest-benchmark's paths are relative to the current folder: pinned to the repo, so a
        run from perf/ reads and writes what one from the root does, and nothing lands outside out/
        or .benchmarks. Run before pytest-benchmark reads its options (the plugin's tryfirst)."""
        config, root = self.config, self.config.rootpath
        if config.getoption("benchmark_storage", default=None) in _DEFAULT_STORAGE:
            config.option.benchmark_storage = f"file://{root / '.benchmarks'}"
        histograms = config.getoption("benchmark_histogram", default=None) or []
        config.option.benchmark_histogram = [h if os.path.isabs(h) else str(root / "out" / "histograms" / h)
                                             for h in histograms]
        if config.getoption("benchmark_compare", default=[]) not in ([], None, False):
            self.compare_notes.extend(write_compare_baseline(config))

    # ---- hooks (this object is a registered plugin) -------------------------------------------
    def pytest_report_header(self, config):
        return [f"[bench] {note}" for note in self.compare_notes]

    def pytest_sessionstart(self, session):
        self.session = session

    def pytest_collection_finish(self, session):
        """A session that will time benchmarks takes the device's lock (impl.bench.runlock): a
        second one would load the machine under the first one's timings."""
        bs = getattr(session.config, "_benchmarksession", None)
        if (bs is None or bs.disabled or bs.skip or self.lock is not None
                or session.config.getoption("collectonly", default=False)):
            return
        if not any("benchmark" in getattr(item, "fixturenames", ()) for item in session.items):
            return
        lock = RunLock(session.config.rootpath / "out" / "locks", store.device_slug())
        try:
            lock.acquire()
        except DeviceBusy as exc:
            pytest.exit(f"refused: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
        self.lock = lock

    def pytest_unconfigure(self, config):
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def pytest_runtest_logreport(self, report):
        if report.failed:  # a failure in setup or teardown is an error; the store refuses either
            self.recorder.failed.append(store.FailedTest(report.nodeid, report.when))

    def pytest_keyboard_interrupt(self, excinfo):
        self.stop_reason = "KeyboardInterrupt"

    def pytest_sessionfinish(self, session, exitstatus):
        if session.shouldstop and self.stop_reason is None:  # e.g. pytest-timeout's --session-timeout
            self.stop_reason = str(session.shouldstop)
        self._save_when_nothing_was_timed(session.config)

    def _save_when_nothing_was_timed(self, config) -> None:
        """pytest-benchmark writes no --benchmark-json when no benchmark was timed. A run whose every
        row did not run (an OOM, too few GPUs, the budget) must still be written, or those rows are
        lost: write it as pytest-benchmark would (its own hooks, then ours), with no benchmarks.
        (pytest-benchmark's sessionfinish hook wrapper has saved, or not, before this runs.)"""
        bs = getattr(config, "_benchmarksession", None)
        if bs is None or not bs.json or bs.benchmarks or not self.recorder.not_run:
            return
        commit_info = config.hook.pytest_benchmark_generate_commit_info(config=config)
        config.hook.pytest_benchmark_update_commit_info(config=config, commit_info=commit_info)
        output_json = config.hook.pytest_benchmark_generate_json(
            config=config, benchmarks=[], include_data=True, machine_info=bs.get_machine_info(),
            commit_info=commit_info)
        config.hook.pytest_benchmark_update_json(config=config, benchmarks=[], output_json=output_json)
        bs.save_json(output_json)

    def pytest_benchmark_update_json(self, config, benchmarks, output_json):
        """Beside pytest-benchmark's entries: the rows that did not run, and what impl.bench.store
        needs to file the run (its device slug, and whether it was interrupted: such a run is not
        stored); the commit is SUITE_COMMIT's where set (store.sent_commit), and beside it the kernels'
        digests (`kernel_digest`, `kernel_table_digest`: KernelDigest.to_json), which tell runs of one
        kernel version apart from runs of another at any commit."""
        session = self.session
        stopped = self.stop_reason or (str(session.shouldstop) if session is not None and session.shouldstop else None)
        info = store.sent_commit(output_json.get("commit_info") or {}, os.environ.get("SUITE_COMMIT"))
        output_json["commit_info"] = dict(info, **self.kernels.to_json()) if self.kernels is not None else info
        output_json["not_run"] = [e.to_json() for e in self.recorder.not_run]
        output_json["suite"] = dict(device_slug=store.device_slug(), interrupted=stopped is not None, why=stopped,
                                    args=list(config.invocation_params.args),
                                    failed=[dict(test=f.test, when=f.when) for f in self.recorder.failed])


__all__ = ["BenchSession"]
