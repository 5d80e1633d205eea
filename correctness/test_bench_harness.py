"""impl.bench.harness.set_up_or_oom: an OOM while building a row becomes the row's OOM record, made
only after the half-built objects are gone (their memory is what the next rows need); an error the
caller names unsupported (an SDPA backend refusing a config) becomes an unsupported row. A perf
file's Budget starts with the file's first test, not at its import."""
import gc
import os
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


# Kernel rows through the real harness and pytest-benchmark (not under xdist, which disables benchmarks), on a
# faked CUDA device: the clock and power sampled during the rounds are stored as their medians; a failing NVML
# leaves them out of an otherwise whole row; a CPU kernel row never samples.
GPU_STATE_FILE = """
import contextlib
import statistics
import time
from types import SimpleNamespace

import pytest
import torch

from impl.bench.row import Metric, Status

LOG = []
CLOCKS = [1900, 1560, 1875, 1740, 1965, 1600, 1800] * 4
POWERS_MW = [700_000, 640_000, 699_000, 650_000, 705_000, 680_000, 690_000] * 4


class FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = time.perf_counter()
        LOG.append("record")

    def synchronize(self):
        LOG.append("sync")

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def nvml(name, values):
    answers = iter(values)

    def read(device=None):
        LOG.append(name)
        if not values:
            raise ModuleNotFoundError("nvidia-ml-py does not seem to be installed")
        return next(answers)
    return read


@pytest.fixture
def cuda(monkeypatch):
    c = torch.cuda
    for name, fake in dict(Event=FakeEvent, device=lambda d: contextlib.nullcontext(), synchronize=lambda d=None: None,
                           reset_peak_memory_stats=lambda d=None: None, max_memory_allocated=lambda d=None: 1,
                           max_memory_reserved=lambda d=None: 1, get_device_name=lambda d=None: "Fake H100",
                           device_count=lambda: 1,
                           get_device_properties=lambda d=None: SimpleNamespace(multi_processor_count=132,
                                                                                total_memory=80 << 30)).items():
        monkeypatch.setattr(c, name, fake)
    return torch.device("cuda", 0)


def measure(bench, device):
    bench.device = device
    LOG.clear()

    def fn():
        LOG.append("call")
        time.sleep(2e-3)
    return bench.measure(problem="p", config={}, fn=fn, round="one call", kernel=True, warmup=2, rounds=5,
                         metrics={Metric.FIRST_CALL_S: 0.5})


def test_kernel_row_stores_the_median_clock_and_power_of_its_rounds(bench, cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "clock_rate", nvml("clock", CLOCKS))
    monkeypatch.setattr(torch.cuda, "power_draw", nvml("power", POWERS_MW))
    row = measure(bench, cuda)
    rounds = row.timing.rounds
    assert row.timing.timer == "CudaEventTimer" and row.timing.iterations > 1
    at = [i for i, e in enumerate(LOG) if e == "clock"]
    assert len(at) == rounds  # one sample a round, each after the round's calls and end event, before its wait
    assert all(LOG[i - 2:i + 3] == ["call", "record", "clock", "power", "sync"] for i in at)
    assert row.metrics[Metric.SM_CLOCK_MHZ] == statistics.median(CLOCKS[:rounds])
    assert row.metrics[Metric.POWER_W] == statistics.median(POWERS_MW[:rounds]) / 1e3


def test_failing_nvml_leaves_the_metrics_out_and_the_row_whole(bench, cuda, monkeypatch):
    monkeypatch.setattr(torch.cuda, "clock_rate", nvml("clock", []))
    monkeypatch.setattr(torch.cuda, "power_draw", nvml("power", []))
    row = measure(bench, cuda)
    assert LOG.count("clock") == row.timing.rounds  # asked, and refused
    assert row.status is Status.MEASURED and bench.benchmark.stats.stats.median > 0
    assert set(row.metrics) == {Metric.FIRST_CALL_S, Metric.HOST_MS}


def test_cpu_kernel_row_has_no_gpu_state(bench, monkeypatch):
    monkeypatch.setattr(torch.cuda, "clock_rate", nvml("clock", CLOCKS))
    row = measure(bench, torch.device("cpu"))
    assert row.timing.timer == "SyncTimer" and "clock" not in LOG
    assert Metric.SM_CLOCK_MHZ not in row.metrics and Metric.POWER_W not in row.metrics
"""


def test_kernel_rows_record_the_gpu_state_of_their_rounds(tmp_path):
    import json

    from impl.bench.row import Metric, Row
    from impl.bench.store import run_problems

    (tmp_path / "test_gpu_state.py").write_text(GPU_STATE_FILE)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # else no timing under xdist
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "impl.bench.plugin", "-p", "no:cacheprovider", "-q",
                           "test_gpu_state.py", "--benchmark-json=run.json"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "3 passed" in done.stdout
    run = json.loads((tmp_path / "run.json").read_text())
    assert run_problems(run) == []  # the store accepts the new metrics
    rows = {b["name"]: Row.from_json(b["extra_info"]) for b in run["benchmarks"]}
    clocked = rows.pop("test_kernel_row_stores_the_median_clock_and_power_of_its_rounds")
    assert 1560 <= clocked.metric(Metric.SM_CLOCK_MHZ) <= 1965 and 640 <= clocked.metric(Metric.POWER_W) <= 705
    assert len(rows) == 2 and all(r.metric(Metric.SM_CLOCK_MHZ) is r.metric(Metric.POWER_W) is None
                                  for r in rows.values())
