"""The correctness suite's records (impl.bench.test_record) as the index shows them: per device the
newest record's counts, commit and date, and whether the kernels changed since it was made."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from impl.bench.test_record import KERNEL_PATHS, TestRecord, digest, load_records
from impl.report import templating


@dataclass(frozen=True)
class DeviceTests:
    record: TestRecord  # the device's newest
    kernels_changed: bool  # the kernel files differ from those the record tested

    @property
    def device(self) -> str:
        return self.record.device


def device_tests(data_dir: Path, root: Path) -> list[DeviceTests]:
    """The newest record of each device, GPUs first; kernels_changed compares the record's kernel
    digest with that of the checkout at `root` (a later kernel change, committed or not, leaves the
    record stale)."""
    newest: dict[str, TestRecord] = {}
    for rec in load_records(data_dir):
        if rec.device not in newest or rec.datetime > newest[rec.device].datetime:
            newest[rec.device] = rec
    now = digest(KERNEL_PATHS, root)
    out = [DeviceTests(rec, rec.kernel_digest != now) for rec in newest.values()]
    return sorted(out, key=lambda t: (t.device == "cpu", t.device))


def render(tests: list[DeviceTests]) -> str:
    return templating.render("test_records.md.j2", tests=tests, kernel_paths=KERNEL_PATHS)
