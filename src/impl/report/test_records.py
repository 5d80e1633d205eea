"""The correctness suite's records (impl.bench.test_record) as the index shows them: per device the
newest record's counts, commit and date, and whether the kernels changed since it was made (its kernel
files, or the kernel table's choices where the record holds them: impl.bench.kernel_digest)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from impl.bench.kernel_digest import KERNEL_PATHS, KERNEL_TABLE, kernel_digest
from impl.bench.test_record import TestRecord, load_records
from impl.report import templating


@dataclass(frozen=True)
class DeviceTests:
    record: TestRecord  # the device's newest
    kernels_changed: bool  # the kernels differ from those the record tested (KernelDigest.changed_since)

    @property
    def device(self) -> str:
        return self.record.device


def device_tests(data_dir: Path, root: Path) -> list[DeviceTests]:
    """The newest record of each device, GPUs first; kernels_changed compares the record's kernel
    digests with those of the checkout at `root` (a later kernel change, or a change of the table's
    choices, committed or not, leaves the record stale; new evidence for the same choices does not)."""
    newest: dict[str, TestRecord] = {}
    for rec in load_records(data_dir):
        if rec.device not in newest or rec.datetime > newest[rec.device].datetime:
            newest[rec.device] = rec
    now = kernel_digest(root)
    out = [DeviceTests(rec, now.changed_since(rec.kernels)) for rec in newest.values()]
    return sorted(out, key=lambda t: (t.device == "cpu", t.device))


def render(tests: list[DeviceTests]) -> str:
    return templating.render("test_records.md.j2", tests=tests, kernel_paths=KERNEL_PATHS, kernel_table=KERNEL_TABLE)
