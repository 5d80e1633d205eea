"""impl.bench.harness.set_up_or_oom: an OOM while building a row becomes the row's OOM record, made
only after the half-built objects are gone (their memory is what the next rows need); an error the
caller names unsupported (an SDPA backend refusing a config) becomes an unsupported row."""
import gc
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
