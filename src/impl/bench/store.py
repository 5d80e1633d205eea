"""Benchmark histories: each run of a section is its own file, never overwritten.

    reports/data/<device slug>/<section>/<UTC timestamp>_<commit>.json

The slug names the GPU model, its memory and the GPU count (`h100-80gb-x1`, `h200-141gb-x2`;
`cpu` for any CPU), so a one-GPU run never lands beside two-GPU data. pytest writes a run's JSON
outside reports/ first (`--benchmark-json`); `python -m impl.bench.store RUN.json --section S`
then files it: atomically (a temporary file renamed into place), under a name no earlier run has,
and only if the run was not interrupted (Ctrl-C, a session timeout), which the plugin records in
the JSON's `suite` block. An interrupted run is refused and reports/ is left as it was.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[3] / "reports" / "data"
NOT_RUNS = ("probes", "logs", "tests")  # folders beside the sections that hold no runs (tests: test records)

# GPU memory as marketed, where the device name does not say it (the H200 reports "NVIDIA H200").
_MARKETED_GB = {"h200": 141, "h100": 80, "a100": 80}


def gpu_slug(name: str, count: int, total_memory_bytes: int) -> str:
    """`NVIDIA H100 80GB HBM3`, 1 GPU → `h100-80gb-x1`; `NVIDIA H200`, 2 GPUs → `h200-141gb-x2`."""
    lowered = name.lower()
    model = next((m for m in re.findall(r"[a-z]+\d+[a-z]*", lowered) if m not in ("nvidia", "tesla")), None)
    model = model or re.sub(r"[^a-z0-9]+", "-", lowered).strip("-")
    stated = re.search(r"(\d+)\s*gb", lowered)
    gb = int(stated.group(1)) if stated else _MARKETED_GB.get(model, round(total_memory_bytes / 2**30))
    return f"{model}-{gb}gb-x{count}"


def device_slug() -> str:
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    props = torch.cuda.get_device_properties(0)
    return gpu_slug(props.name, torch.cuda.device_count(), props.total_memory)


def run_stamp(doc: dict) -> str:
    """`<UTC timestamp>_<commit>` of a pytest-benchmark JSON: its `datetime` and commit_info
    (`+` marks a tree with uncommitted changes, as on the GPU machine, whose HEAD stays the
    session's first commit)."""
    when = datetime.fromisoformat(doc["datetime"]).astimezone(timezone.utc)
    info = doc.get("commit_info") or {}
    commit = (info.get("id") or "nocommit")[:8] + ("+" if info.get("dirty") else "")
    return f"{when:%Y%m%dT%H%M%SZ}_{commit}"


@dataclass(frozen=True)
class RunFile:
    device: str
    section: str
    path: Path

    @property
    def stamp(self) -> str:
        return self.path.stem


def run_files(data_dir: Path = DATA_DIR) -> list[RunFile]:
    """Every stored run, oldest first within each (device, section)."""
    out = []
    for path in sorted(data_dir.glob("*/*/*.json")):
        section = path.parent.name
        if section in NOT_RUNS or section == "history":
            continue
        out.append(RunFile(path.parent.parent.name, section, path))
    return out


def is_interrupted(doc: dict) -> bool:
    return bool((doc.get("suite") or {}).get("interrupted"))


def _free_name(folder: Path, stamp: str) -> Path:
    path, n = folder / f"{stamp}.json", 1
    while path.exists():  # two runs in one second from one commit: keep both
        n += 1
        path = folder / f"{stamp}-{n}.json"
    return path


def store_run(run_json: Path, section: str, data_dir: Path = DATA_DIR, device: str | None = None) -> Path:
    """File one finished run; returns its new path. Raises ValueError for an interrupted or empty
    run, leaving data_dir untouched."""
    doc = json.loads(run_json.read_text())
    if is_interrupted(doc):
        raise ValueError(f"{run_json}: the run was interrupted ({doc['suite'].get('why')}); not stored")
    if not doc.get("benchmarks") and not doc.get("not_run"):
        raise ValueError(f"{run_json}: no rows; not stored")
    device = device or (doc.get("suite") or {}).get("device_slug") or device_slug()
    folder = data_dir / device / section
    folder.mkdir(parents=True, exist_ok=True)
    dest = _free_name(folder, run_stamp(doc))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".partial-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
    os.replace(tmp, dest)  # atomic: a reader sees the whole file or none
    return dest


def committed_baseline(device: str, data_dir: Path = DATA_DIR) -> dict | None:
    """One pytest-benchmark JSON holding, for every row stored for `device`, its newest schema-2
    measurement: what `pytest perf --benchmark-compare` compares against out of the box (the
    plugin writes it into pytest-benchmark's storage as run 0000). Older-format rows are left
    out: their stats timed a placeholder round."""
    from impl.bench.row import SCHEMA

    newest: dict[str, dict] = {}
    head = None
    for rf in run_files(data_dir):
        if rf.device != device:
            continue
        doc = json.loads(rf.path.read_text())
        for bench in doc.get("benchmarks", []):
            if (bench.get("extra_info") or {}).get("schema") == SCHEMA:
                newest[bench["fullname"]] = bench
                head = doc
    if head is None:
        return None
    return dict(head, benchmarks=sorted(newest.values(), key=lambda b: b["fullname"]), not_run=[])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON of finished runs")
    ap.add_argument("--section", help="section name (default: the JSON file's stem up to its first '-')")
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--device", help="device slug (default: the run's own)")
    args = ap.parse_args(argv)
    status = 0
    for run in args.runs:
        try:
            dest = store_run(run, args.section or run.stem.split("-")[0], args.data_dir, args.device)
            print(f"stored {run} -> {dest}")
        except ValueError as exc:
            print(f"store: {exc}", file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
