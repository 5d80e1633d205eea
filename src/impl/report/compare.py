"""`make compare`: fresh smoke runs (out/smoke/<section>.json) against the newest committed CPU
run of each section. It prints each row's median beside the committed one, and fails when the
rows themselves changed: a row the baseline measured that the fresh run did not measure (gone,
OOM, unsupported, left out) or whose status changed. A change to or from "left out by budget" is
shown, not judged: how many rows fit a section's wall-clock budget depends on the machine. Timings are shown, not judged: a smoke run
on a shared 2-core machine is no timing baseline; `make gate` judges timings of stored runs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from impl.bench.row import Status
from impl.bench.store import DATA_DIR, run_files
from impl.report.data import Record, load_file
from impl.report.markdown import table


def _by_name(records: list[Record]) -> dict[str, Record]:
    return {r.name: r for r in records}


def compare_run(fresh: Path, device: str, data_dir: Path = DATA_DIR) -> tuple[list[list], list[str]]:
    section = fresh.stem
    stored = [rf for rf in run_files(data_dir) if rf.device == device and rf.section == section]
    if not stored:
        return [], [f"{section}: no committed {device} run to compare with"]
    base = _by_name(load_file(stored[-1].path, device, section))
    new = _by_name(load_file(fresh, device, section))
    rows, problems = [], []
    for name in sorted(base.keys() | new.keys()):
        b, n = base.get(name), new.get(name)
        b_status = b.row.status.value if b else "absent"
        n_status = n.row.status.value if n else "absent"
        b_ms = f"{b.stats.median * 1e3:.4g}" if b and b.stats and b.stats.median else "–"
        n_ms = f"{n.stats.median * 1e3:.4g}" if n and n.stats and n.stats.median else "–"
        rows.append([section, name, b_status, n_status, b_ms, n_ms])
        budget = Status.LEFT_OUT_BY_BUDGET.value
        if b is not None and b_status != n_status and budget not in (b_status, n_status):
            problems.append(f"{section}: {name} was {b_status} in {stored[-1].stamp}, now {n_status}")
    return rows, problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR)
    args = ap.parse_args(argv)
    all_rows, problems = [], []
    for run in args.runs:
        if not run.exists():
            problems.append(f"{run}: no such run (did the smoke step run this section?)")
            continue
        rows, bad = compare_run(run, args.device, args.data_dir)
        all_rows += rows
        problems += bad
    print(table(["section", "row", "committed status", "fresh status", "committed median (ms)",
                 "fresh median (ms)"], all_rows))
    for p in problems:
        print(f"compare: {p}", file=sys.stderr)
    print(f"compare: {len(all_rows)} rows, {len(problems)} changed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
