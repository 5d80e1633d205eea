"""`make compare`: each section's newest fresh run (`make smoke`'s out/smoke/<section>.json or `make perf`'s
out/runs/<run>/<section>.json, whichever is newer) against the committed runs (git's HEAD) of the same section on
the run's own device, row by row: each row of the fresh run against that row's newest committed record, in whichever
committed run has it last (a later partial run does not hide the others), and each row of the newest committed run
that the fresh run lacks. It prints each row's median beside the committed one, and fails when the rows themselves
changed: a row the baseline measured that the fresh run did not measure (gone, OOM, unsupported, left out) or whose
status changed. A change to or from "left out by budget" is shown, not judged: how many rows fit a section's
wall-clock budget depends on the machine. Timings are shown, not judged: a smoke run on a shared 2-core machine is
no timing baseline; `make gate` judges timings of stored runs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.bench.row import Status
from impl.bench.store import BadRunFile, Suite, check_section, committed_runs, device_problems, read_run, run_stem
from impl.report.data import load_doc
from impl.report.rows import Bench
from impl.report.markdown import table


def newest_fresh(out: Path, section: str) -> Path | None:
    """The newest fresh run of `section` under `out` (make smoke's or make perf's), or None."""
    found = [p for p in (out / "smoke" / f"{section}.json", *out.glob(f"runs/*/{section}.json")) if p.exists()]
    return max(found, key=lambda p: p.stat().st_mtime, default=None)


def _cells(rec: Bench | None) -> tuple[str, str]:
    """A record's status and median (ms) as the table shows them: "absent" and "–" without one."""
    if rec is None:
        return "absent", "–"
    return rec.row.status.value, f"{rec.stats.median * 1e3:.4g}" if rec.stats and rec.stats.median else "–"


def compare_run(fresh: Path, device: str | None, data_dir: Path) -> tuple[list[list], list[str]]:
    """(table rows, problems) of one fresh run against the committed runs of its section on `device` (default: the
    run's own), row by row; a bad fresh run is a problem, a bad committed one is skipped with a warning."""
    section = run_stem(fresh) or fresh.stem
    try:
        fresh_doc = read_run(fresh, section)
        device = device or Suite.from_json(fresh_doc).device_slug or "cpu"
        if problems := device_problems(fresh_doc, device):
            raise BadRunFile(str(fresh), problems)
    except BadRunFile as exc:
        return [], [f"{section}: {exc}"]
    stored, skipped, _ = committed_runs(device, data_dir)
    for why in skipped:
        print(f"compare: warning: skipped {why}", file=sys.stderr)
    stored = [(rf, doc) for rf, doc in stored if rf.section == section]
    if not stored:
        return [], [f"{section}: no committed {device} run to compare with"]
    base: dict[str, tuple[str, Bench]] = {}  # row: (run stem, its newest committed record)
    for rf, doc in stored:  # oldest first: a later run's record replaces an earlier one's
        records = load_doc(doc, rf.path, device, section)
        base.update((rec.name, (rf.stamp, rec)) for rec in records)
    newest_rows = {rec.name for rec in records}  # the last run read is the newest
    new = {r.name: r for r in load_doc(fresh_doc, fresh, device, section)}
    rows, problems = [], []
    for name in sorted(newest_rows | new.keys()):
        stamp, b = base.get(name, (None, None))
        (b_status, b_ms), (n_status, n_ms) = _cells(b), _cells(new.get(name))
        rows.append([section, name, b_status, n_status, b_ms, n_ms])
        if b is not None and b_status != n_status and Status.LEFT_OUT_BY_BUDGET.value not in (b_status, n_status):
            problems.append(f"{section}: {name} was {b_status} in {stamp}, now {n_status}")
    return rows, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", help="run files, or with --out section names")
    ap.add_argument("--out", type=Path, help="take each named section's newest fresh run under this folder")
    ap.add_argument("--device", help="device slug (default: each run's own)")
    add_repo_arguments(ap)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    all_rows, problems = [], []
    for name in args.runs:
        if args.out is not None:
            try:
                check_section(name, repo.perf_dir)
            except ValueError as exc:
                problems.append(str(exc))
                continue
            if (run := newest_fresh(args.out, name)) is None:
                problems.append(f"{name}: no fresh run under {args.out} (make smoke or make perf writes one)")
                continue
        else:
            run = Path(name)
        if not run.exists():
            problems.append(f"{run}: no such run")
            continue
        rows, bad = compare_run(run, args.device, repo.data_dir)
        all_rows += rows
        problems += bad
    print(table(["section", "row", "committed status", "fresh status", "committed median (ms)",
                 "fresh median (ms)"], all_rows))
    for p in problems:
        print(f"compare: {p}", file=sys.stderr)
    print(f"compare: {len(all_rows)} rows compared, {len(problems)} problems (a changed status, a missing or bad run)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
