"""impl.bench.harness.set_up_or_oom: an OOM while building a row becomes the row's OOM record, made
only after the half-built objects are gone (their memory is what the next rows need); an error the
caller names unsupported (an SDPA backend refusing a config) becomes an unsupported row. A perf
file's Budget starts with the file's first test, not at its import."""
import gc
import subprocess
import sys
import weakref

import pytest
import torch

from impl.workloads.attention import sdpa_rejects
from impl.bench.harness import set_up_or_oom
from impl.bench.row import Status


class _Recorder:
    """Stands in for the Harness: records each oom() call and whether the half-built object was
    still alive at that moment."""

    def __init__(self):
        self.calls, self.alive_at_record, self.not_runs = [], [], []
        self.watch = None

    def not_run(self, *, problem, config, status, reason, details=None):
        self.not_runs.append((problem, status, reason))

    def oom(self, *, problem, config, exc, details=None):
        gc.collect()
        self.calls.append((problem, config, exc, details))
        self.alive_at_record.append(self.watch is not None and self.watch() is not None)


def test_returns_what_build_returns_and_records_nothing():
    rec = _Recorder()
    assert set_up_or_oom(rec, lambda: ("model", 1.5), problem="p", config={}) == ("model", 1.5)
    assert rec.calls == []


def test_oom_is_recorded_after_the_half_built_objects_are_freed():
    rec = _Recorder()

    class Model:
        pass

    def build():
        model = Model()
        rec.watch = weakref.ref(model)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore lines")

    assert set_up_or_oom(rec, build, problem="p", config={"size": "xl"}, details={"a": 1}) is None
    assert rec.calls == [("p", {"size": "xl"}, "CUDA out of memory. Tried to allocate 2.00 GiB", {"a": 1})]
    assert rec.alive_at_record == [False]


def test_other_errors_propagate_and_record_nothing():
    rec = _Recorder()

    def build():
        raise ValueError("bad shape")

    with pytest.raises(ValueError, match="bad shape"):
        set_up_or_oom(rec, build, problem="p", config={})
    assert rec.calls == []


def test_an_error_named_unsupported_becomes_an_unsupported_row_and_others_still_raise():
    rec = _Recorder()

    def build():
        raise RuntimeError("No available kernel. Aborting execution.\nmore")

    assert set_up_or_oom(rec, build, problem="p", config={}, unsupported=sdpa_rejects("sdpa_cudnn")) is None
    assert rec.not_runs == [("p", Status.UNSUPPORTED, "No available kernel. Aborting execution.")]
    assert rec.calls == []
    with pytest.raises(RuntimeError, match="No available kernel"):  # our kernels' errors are failures
        set_up_or_oom(rec, build, problem="p", config={}, unsupported=sdpa_rejects("flash_triton"))


# Two perf files as a session collects them (`pytest perf -k flash`): both are imported before the
# first test runs. The first spends its budget; the second's budgets start with its own first test.
FIRST_FILE = """
import time
from impl.bench.harness import Budget

BUDGET = Budget({budget})

def test_spends_the_budget():
    time.sleep({budget} + 0.2)
    assert BUDGET.exhausted()

def test_later_rows_share_it():  # one clock per file, not one per test
    assert BUDGET.exhausted()
"""
SECOND_FILE = """
import time
from impl.bench.harness import Budget

BUDGET = Budget({budget})
LATER_GRID = Budget(0.3)  # a second grid's budget, first checked by a later test (nsys_profile's 2026 rows)

def test_keeps_its_whole_budget():
    assert BUDGET.deadline - time.monotonic() > {budget} - {slack}
    time.sleep(0.5)

def test_every_budget_of_the_file_started_with_its_first_test():
    assert LATER_GRID.exhausted()
"""


def test_each_perf_file_budget_starts_with_its_first_test(tmp_path):
    budget, slack = 2.0, 1.0  # slack: pytest's own time between starting a file and its first test, on a busy machine
    (tmp_path / "test_first_file.py").write_text(FIRST_FILE.format(budget=budget))
    (tmp_path / "test_second_file.py").write_text(SECOND_FILE.format(budget=budget, slack=slack))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "impl.bench.plugin", "-p", "no:cacheprovider", "-q",
                           "test_first_file.py", "test_second_file.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout


NOTHING_TIMED_FILE = """
from impl.bench.row import Status

def test_a_row_that_cannot_run_here(bench):
    bench.not_run(problem="leaderboard", config=dict(case=1), status=Status.NEEDS_HARDWARE,
                  reason="needs 2 GPUs, 0 here")
"""


def test_a_run_whose_rows_all_did_not_run_is_still_written(tmp_path):
    """pytest-benchmark writes no --benchmark-json when nothing was timed; the suite writes it, so a
    section whose every row was an OOM or lacked the hardware still files its rows (a 2-GPU run of
    the 8B step on 80 GB cards left an empty file and lost its OOM row)."""
    import json

    (tmp_path / "test_nothing_timed.py").write_text(NOTHING_TIMED_FILE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "impl.bench.plugin", "-p", "no:cacheprovider", "-q",
                           "test_nothing_timed.py", "--benchmark-json=run.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["benchmarks"] == []
    assert [(r["row"]["status"], r["row"]["reason"]) for r in run["not_run"]] == [("needs_hardware", "needs 2 GPUs, 0 here")]
    assert run["suite"]["interrupted"] is False


def test_a_budget_made_outside_a_test_file_starts_at_its_first_check():
    from impl.bench.harness import Budget

    budget = Budget(60)
    assert budget.deadline is None
    assert not budget.exhausted() and budget.deadline is not None
