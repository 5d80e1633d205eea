"""The correctness suite's records (impl.bench.test_record) as the index shows them: per device the
newest record's counts, commit and date, and whether the kernels changed since it was made."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from impl.bench.test_record import KERNEL_PATHS, ROOT, TestRecord, digest, load_records
from impl.report.markdown import table


@dataclass(frozen=True)
class DeviceTests:
    record: TestRecord
    kernels_changed: bool  # the kernel files differ from those the record tested
    runs: int  # records stored for this device

    @property
    def device(self) -> str:
        return self.record.device


def device_tests(data_dir: Path, root: Path = ROOT) -> list[DeviceTests]:
    """The newest record of each device, GPUs first; kernels_changed compares the record's kernel
    digest with the checkout's (a later kernel change, committed or not, leaves the record stale)."""
    by_device: dict[str, list[TestRecord]] = {}
    for rec in load_records(data_dir):
        by_device.setdefault(rec.device, []).append(rec)
    now = digest(KERNEL_PATHS, root)
    out = [DeviceTests(max(recs, key=lambda r: r.datetime), max(recs, key=lambda r: r.datetime).kernel_digest != now,
                       len(recs)) for recs in by_device.values()]
    return sorted(out, key=lambda t: (t.device == "cpu", t.device))


def render(tests: list[DeviceTests]) -> str:
    if not tests:
        return "## Correctness where it ran\n\nNo test record yet: `make test-record` files one."
    rows = []
    for t in tests:
        r = t.record
        commit = f"`{(r.commit or '?')[:8]}{'+' if r.dirty else ''}`"
        rows.append([t.device, r.passed, r.failed + r.errors, r.skipped, commit, r.datetime[:10],
                     ", ".join(f"`{f}`" for f in r.failures[:5]) + (" …" if len(r.failures) > 5 else "") or "–",
                     "**kernels changed since**" if t.kernels_changed else "current"])
    return "\n\n".join([
        "## Correctness where it ran",
        "The newest record of `make test-record` per device (`reports/data/<device>/tests/`); `+` marks a tree "
        "with changes beyond the commit. A record whose kernel files (" + ", ".join(f"`{p}`" for p in KERNEL_PATHS)
        + ") differ from this checkout's is marked: its result says nothing about the kernels as they are now.",
        table(["device", "passed", "failed", "skipped", "commit", "date", "failures", "kernels"], rows)])
