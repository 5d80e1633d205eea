"""`--benchmark-compare` out of the box: what pytest-benchmark compares a run with, written into its
storage from the committed runs (impl.bench.store.committed_baseline: git's HEAD, not the working
tree) and the user's own saved runs."""
from __future__ import annotations

import json

from impl.bench import store


def write_compare_baseline(config) -> list[str]:
    """The newest committed run of every row for this device is written into pytest-benchmark's
    storage as run 0000, which `--benchmark-compare=0000` names. Plain `--benchmark-compare` reads a
    merge, out/compare/<device>.json: the committed rows, each replaced by the same row of the
    user's newest saved run (--benchmark-autosave, 0001 on) that holds it, so a saved run of one
    section shadows only its own rows. Returns notes for the run's header (what is compared with,
    what was skipped)."""
    from pytest_benchmark.utils import get_machine_id

    notes: list[str] = []
    if config.getoption("benchmark_storage") != f"file://{config.rootpath / '.benchmarks'}":
        return notes  # the user named a storage: theirs to fill and compare with
    device = store.device_slug()
    baseline = store.committed_baseline(device, config.rootpath / "reports" / "data")  # rootdir: the repository
    for why in baseline.skipped:
        notes.append(f"compare: skipped {why}")
    folder = config.rootpath / ".benchmarks" / get_machine_id()
    committed = folder / "0000_committed.json"
    if baseline.doc is not None:
        folder.mkdir(parents=True, exist_ok=True)
        store.write_atomically(committed, baseline.doc)
    else:
        committed.unlink(missing_ok=True)  # never compare with an earlier HEAD's rows
        notes.append(f"compare: no committed {device} run in {baseline.source}")
    if config.getoption("benchmark_compare") is not True:
        return notes  # a named run (0000, 0003, a file): pytest-benchmark's own choice
    merged = dict(baseline.doc or {}, benchmarks=list((baseline.doc or {}).get("benchmarks", [])), not_run=[])
    rows = {b["fullname"]: b for b in merged["benchmarks"]}
    saved = sorted(p for p in folder.glob("[0-9][0-9][0-9][0-9]_*.json") if not p.name.startswith("0000_"))
    for path in saved:  # oldest first: a newer saved run's row replaces an older one's
        try:
            doc = json.loads(path.read_text())
            benches = {b["fullname"]: b for b in doc["benchmarks"]}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            notes.append(f"compare: skipped saved run {path} ({type(exc).__name__}: {exc})")
            continue
        rows.update(benches)
        merged = dict(doc, benchmarks=[], not_run=[])
    if not rows:
        return notes  # nothing to compare with: pytest-benchmark says "Can't compare"
    merged["benchmarks"] = sorted(rows.values(), key=lambda b: b["fullname"])
    target = config.rootpath / "out" / "compare" / f"{device}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    store.write_atomically(target, merged)
    shadow = f", shadowed row by row by the saved runs {', '.join(p.stem for p in saved)}" if saved else ""
    notes.append(f"compare: baseline {target}: the committed rows ({baseline.source}){shadow}")
    config.option.benchmark_compare = str(target)
    return notes


__all__ = ["write_compare_baseline"]
