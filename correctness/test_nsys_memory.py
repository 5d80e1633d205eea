"""impl.nsys.memory on a synthetic --cuda-memory-usage export: device allocations and frees per NVTX range."""
import pytest

from impl.nsys.memory import read_memory
from impl.nsys.tables import NsysOutputError
from kits.nsys_outputs import write_memory_export

MiB = 2**20
EVENTS = [(0, 100 * MiB, 0, 2), (1, 8, 0, 5),  # weights; a static allocation (kind 5) is not device memory
          (10, 30 * MiB, 0, 2), (12, 10 * MiB, 0, 2), (14, 10 * MiB, 1, 2),  # block 0 keeps 30 MiB
          (20, 30 * MiB, 0, 2), (22, 10 * MiB, 0, 2), (24, 10 * MiB, 1, 2),  # block 1 keeps 30 MiB
          (40, 30 * MiB, 1, 2), (41, 5 * MiB, 0, 2), (42, 30 * MiB, 1, 2)]  # backward
RANGES = [("step 0", 0, 50), ("forward", 5, 30), ("block 0", 9, 15), ("block 1", 19, 25), ("backward", 35, 45)]


def test_each_range_counts_its_allocations_frees_and_the_most_live(tmp_path):
    tr = read_memory(write_memory_export(tmp_path / "m.sqlite", EVENTS, RANGES))
    b0, b1 = tr.in_range("block 0"), tr.in_range("block 1")
    assert (b0.allocations, b0.allocated, b0.freed, b0.net) == (2, 40 * MiB, 10 * MiB, 30 * MiB)
    assert b0.peak_live == 140 * MiB and b1.peak_live == 170 * MiB and b1.net == 30 * MiB
    bw = tr.in_range("backward")
    assert bw.net == -55 * MiB and tr.live()[-1] == (42_000, 105 * MiB)
    with pytest.raises(NsysOutputError, match="no NVTX range 'block 9'"):
        tr.in_range("block 9")


def test_an_export_without_memory_events_names_the_option(tmp_path):
    from kits.nsys_outputs import write_export

    with pytest.raises(NsysOutputError, match="--cuda-memory-usage=true"):
        read_memory(write_export(tmp_path / "k.sqlite"))
