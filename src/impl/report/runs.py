"""Where rows come from, said one way across the report: the device's name and the runs (UTC time,
commit, how many rows) a page's rows were read from."""
from __future__ import annotations

from dataclasses import dataclass

from impl.bench.kernel_digest import KernelDigest
from impl.bench.row import Env
from impl.report.rows import group


def gpu_count(device: str) -> int | None:
    """The GPU count a device folder names ("h200-141gb-x2" -> 2); None for cpu."""
    count = device.rsplit("-x", 1)[-1]
    return int(count) if device != "cpu" and count.isdigit() else None


def gpu_model(device: str) -> str:
    """The GPU of a device folder without its count: "h200-141gb" of "h200-141gb-x2"."""
    return device.rsplit("-x", 1)[0]


def device_short(device: str) -> str:
    """The index's device column: "H100", "2×H200", "CPU"."""
    n = gpu_count(device)
    name = device.split("-")[0].upper()
    return f"{n}×{name}" if n and n > 1 else name


def device_name(device: str, rows: list) -> str:
    """A section heading's device: "2× NVIDIA H200 (h200-141gb-x2)" (the GPU's name from the first Bench row's env)."""
    n, gpu = gpu_count(device), rows[0].row.env.device
    return f"{n}× {gpu} ({device})" if n else f"{gpu} ({device})"


def files_text(files) -> str:
    """Run files as the report names them: "`reports/data/<device>/<section>/<name>.json.gz`, ..."."""
    return ", ".join(f"`{f}`" for f in files)


def newest_date(rows) -> str:
    """The newest run's UTC date of Bench rows (impl.report.rows), "–" where none has a time."""
    times = [b.run.datetime for b in rows if b.run.datetime]
    return max(times)[:10] if times else "–"


def files_of(rows) -> tuple[str, ...]:
    """The run files Bench rows were read from, sorted, each once (a page's or a section's sources)."""
    return tuple(sorted({b.run.file for b in rows if b.run.file}))


@dataclass(frozen=True)
class RunId:
    """One stored run as a page names it (templates/_runs.md.j2)."""

    when: str  # "2026-11-23 22:37" (UTC)
    commit: str
    rows: int  # how many of the page's rows it holds
    legacy: bool  # the older format
    files: tuple[str, ...]
    kernels: KernelDigest | None = None  # the kernels it ran (RunRef.kernels); None: not recorded

    @property
    def version(self) -> str:
        """Which kernels it ran: their digest where recorded, else its commit (one commit, one version)."""
        return self.kernels.label if self.kernels is not None else self.commit


@dataclass(frozen=True)
class RunsFacts:
    """Which machine and runs a section's rows come from (runs oldest first)."""

    device: str
    env: Env
    runs: tuple[RunId, ...]
    date: str = "–"

    @classmethod
    def of(cls, device: str, rows: list) -> RunsFacts:
        """From Bench rows (impl.report.rows) in load order."""
        by = group(rows, lambda b: (b.run.datetime, b.run.commit))
        runs = tuple(RunId(g[0].run.when, commit, len(g), all(b.run.legacy for b in g),
                           files_of(g) if all(b.run.file for b in g) else (), g[0].run.kernels)
                     for (_, commit), g in sorted(by.items()))
        return cls(device, rows[-1].row.env, runs, newest_date(rows))

    @property
    def files(self) -> list[str]:
        return [f for r in self.runs for f in r.files]


@dataclass(frozen=True)
class DeviceSection:  # a device's part of a distributed page (ddp, fsdp, optimizer_sharding)
    heading: str  # "2× NVIDIA H200 (h200-141gb-x2)"
    runs: tuple  # the page's facts of each [edition, size] run, 2026 first, newest first
    source: RunsFacts  # the rows it read


class SourcedFromRuns:
    """Facts whose sources (the run files the page names) are their `runs`' (a RunsFacts; None: no rows)."""

    @property
    def sources(self) -> list[str]:
        return sorted(set(self.runs.files)) if self.runs else []


class SourcedFromSections:
    """Facts whose sources are the run files of their `sections` (each with `runs`, a RunsFacts)."""

    @property
    def sources(self) -> list[str]:
        return sorted({f for s in self.sections for f in s.runs.files})
