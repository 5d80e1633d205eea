"""impl.nsys.extract: what the pages read of an nsys export, written once at filing and read back exactly."""
from __future__ import annotations

import gzip
import json

import pytest

from impl.nsys.extract import (read_memory_extract, read_timeline_extract, write_extracts)
from impl.nsys.memory import read_memory
from impl.nsys.tables import NsysOutputError
from impl.nsys.timeline import read_timeline
from kits.nsys_outputs import write_export, write_memory_export


def _gz(path):
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(gzip.compress(path.read_bytes()))
    return gz


def test_a_timeline_reads_back_as_the_export_gave_it(tmp_path):
    export = write_export(tmp_path / "case.sqlite")
    (path,) = write_extracts(_gz(export), tmp_path / "extract")
    assert path.name == "case.timeline.json.gz"
    want, got = read_timeline(export, kernels_required=False), read_timeline_extract(path)
    assert got.kernels == want.kernels and got.ranges == want.ranges and got.gpus == want.gpus
    assert any(k.ranges for k in got.kernels) and any(k.nccl for k in got.kernels)  # the fields that vary are kept
    first = path.read_bytes()
    path.unlink()
    write_extracts(_gz(export), tmp_path / "extract")
    assert path.read_bytes() == first  # no timestamp in the gzip: the same export, the same bytes


def test_a_memory_export_gets_its_trace_too(tmp_path):
    export = write_memory_export(tmp_path / "mem.sqlite", [(0, 100, 0, 2), (5, 100, 1, 2)], [("forward", 0, 10)])
    timeline, memory = write_extracts(_gz(export), tmp_path / "extract")
    assert memory.name == "mem.memory.json.gz" and not read_timeline_extract(timeline).kernels
    want, got = read_memory(export), read_memory_extract(memory)
    assert got.events == want.events and len(got.events) == 2 and got.ranges == want.ranges
    assert got.in_range("forward") == want.in_range("forward")


def test_a_missing_or_unknown_extract_is_refused_by_name(tmp_path):
    with pytest.raises(NsysOutputError, match="no such extract"):
        read_timeline_extract(tmp_path / "x.timeline.json.gz")
    bad = tmp_path / "y.timeline.json.gz"
    bad.write_bytes(gzip.compress(json.dumps({"format": 99}).encode()))
    with pytest.raises(NsysOutputError, match="extract format 99"):
        read_timeline_extract(bad)
