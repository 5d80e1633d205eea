"""Synthetic stored rows for the report's tests: `bench(...)` makes one impl.report.rows.Bench as the
loader would (a run file under reports/data/<device>/<section>/), and `context(rows, tmp_path)` the
Context a page's facts(ctx) reads. `assert_snapshot` compares a rendered page with its golden file
under correctness/report_snapshots/ (`pytest --update-snapshots` rewrites the golden files)."""
from __future__ import annotations

import re
from pathlib import Path

from impl.bench.kernel_digest import KernelDigest
from impl.bench.row import Env, Memory, Metric, Row, Status, Timing
from impl.report.pages import Context
from impl.report.rows import Bench, Rows, RunRef, Stats
from impl.report.templating import _paragraph, environment

SNAPSHOTS = Path(__file__).resolve().parents[1] / "report_snapshots"
GPU = Env("NVIDIA H200", "cuda", "2.11.0", "3.6.0", "13.0", "full")


def bench(problem: str, config: dict, median: float | None = None, *, device: str = "h200-141gb-x2",
          section: str | None = None, when: str = "2026-11-26T04:00:00", commit: str = "abcdef12",
          status: Status = Status.MEASURED, reason: str | None = None, details: dict | None = None,
          metrics: dict[Metric, float] | None = None, peak: int | None = None, env: Env = GPU,
          iterations: int = 1, iqr: float | None = None, name: str | None = None,
          kernels: KernelDigest | None = None) -> Bench:
    """One stored row; a measured row gets statistics around `median` (seconds), any other none."""
    section = section or problem
    stamp = when.replace("-", "").replace(":", "")[:13]
    measured = status is Status.MEASURED and median is not None
    row = Row(problem, dict(config), env, status, Timing("one call", "CudaEventTimer", 2, 5, iterations) if measured
              else None, Memory(peak, None), dict(metrics or {}), reason=reason, details=dict(details or {}))
    stats = Stats(median, median / 100, median, iqr if iqr is not None else median / 50, 5, [median] * 5) \
        if measured else None
    run = RunRef(device, section, when, commit, False, f"reports/data/{device}/{section}/{stamp}Z_{commit}.json",
                 kernels)
    return Bench(name or f"test_{problem}[{'-'.join(map(str, config.values()))}]", row, run, stats)


def context(rows: list[Bench], tmp_path: Path, history: list[Bench] = ()) -> Context:
    """The Context of a build over `rows` (figures go under tmp_path/figures)."""
    return Context(reports_dir=tmp_path, fig_dir=tmp_path / "figures", rows=Rows(tuple(rows), tuple(history)))


def assert_snapshot(request, name: str, text: str) -> None:
    """`text` equals correctness/report_snapshots/<name>.md; with --update-snapshots it becomes it."""
    path = SNAPSHOTS / f"{name}.md"
    if request.config.getoption("--update-snapshots"):
        SNAPSHOTS.mkdir(exist_ok=True)
        path.write_text(text)
        return
    assert path.is_file(), f"no snapshot {path}: run pytest with --update-snapshots once and review it"
    expected = path.read_text()
    assert text == expected, f"page {name} differs from {path} (rerun with --update-snapshots if intended)"


def template_macros(name: str):
    """The macros of template `name` as functions, each rendered as a page renders a paragraph (lines joined, a
    blank line between paragraphs): for tests of one macro's words (a page's score line). The report itself
    renders whole pages only."""
    module = environment().get_template(name).module

    class Macros:
        def __getattr__(self, macro):
            return lambda *args, **kwargs: "\n\n".join(
                _paragraph(par) for par in re.split(r"\n\s*\n", str(getattr(module, macro)(*args, **kwargs)).strip()))
    return Macros()
