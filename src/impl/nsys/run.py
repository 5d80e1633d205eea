"""The GPU-machine entry (tools/gpu_nsys.sh calls it): check that nsys can write a report, then
profile each case of the named groups (impl.nsys.cases) in its own `nsys profile` process, export
its SQLite database (trimmed, gzipped), write its `nsys stats` CSVs, and after every case rewrite
the manifest and the parts in --out, so a command stopped at its time limit still returns every
finished case.

  python -m impl.nsys.run GROUP... [--only TEXT]... [--budget-s 420] [--out DIR] [--nsys PATH]

A case starts only while the budget lasts (counted from the start, the check included); the rest
are recorded as left_out_by_budget.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from impl.nsys.cases import GROUPS, NsysCase, cases
from impl.nsys.outputs import MANIFEST, MAX_PARTS, REPORTS, CaseFiles, CaseRecord, Manifest, gzip_file, write_parts
from impl.nsys.timeline import trim_export

DEFAULT_NSYS = "/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys"
TRACE = ("-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none")
CASE_TIMEOUT_S = 240  # one case: build, warm-up, steps and nsys's import (estimated ~1 min for a two-GPU xl case; not yet measured)
# torch.cuda.nvtx names ranges with plain strings; nsys's NVTX capture looks at registered ones only unless told
CAPTURE_ENV = {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}


class NsysSetupError(RuntimeError):
    """nsys cannot write a report here; the message says what to fix."""


def profile_command(nsys: str, case: NsysCase, files: CaseFiles, python: str = sys.executable) -> list[str]:
    """The `nsys profile` command line of `case`."""
    cmd = [nsys, "profile", *TRACE, "--force-overwrite=true", "-o", str(files.rep.with_suffix(""))]
    if case.capture:
        cmd += ["--capture-range=nvtx", f"--nvtx-capture={case.capture}", "--capture-range-end=stop"]
    if case.memory:
        cmd += ["--cuda-memory-usage=true"]
    return cmd + [python, "-m", "impl.nsys.workloads", *case.args, "--result", str(files.result)]


def export_command(nsys: str, files: CaseFiles) -> list[str]:
    return [nsys, "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(files.sqlite), str(files.rep)]


def stats_command(nsys: str, files: CaseFiles) -> list[str]:
    """nsys stats on the export (no second export), one CSV per report: ROOT/NAME_<report>.csv."""
    reports = [arg for r in REPORTS for arg in ("--report", r)]
    return [nsys, "stats", *reports, "--format", "csv", "--output", str(files.root / files.name), str(files.sqlite)]


def _run(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> int:
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        try:
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            f.write(f"timed out after {timeout_s:.0f} s\n")
            return 124


def _tail(log: Path, n: int = 6) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.exists() else []
    return " | ".join(lines[-n:])


def check_nsys(nsys: str, work: Path) -> str:
    """nsys's version, after a one-kernel profile produced a .nsys-rep; NsysSetupError otherwise."""
    if not os.access(nsys, os.X_OK):
        raise NsysSetupError(f"no nsys executable at {nsys} (pass --nsys PATH)")
    version = subprocess.run([nsys, "--version"], capture_output=True, text=True).stdout.strip()
    probe = work / "nsys_check"
    log = work / "nsys_check.log"
    cmd = [nsys, "profile", *TRACE, "--force-overwrite=true", "-o", str(probe), sys.executable, "-c",
           "import torch; torch.ones(8, device='cuda').sum().item()"]
    _run(cmd, log, 180)
    if not probe.with_suffix(".nsys-rep").exists():
        why = ("it wrote only a .qdstrm: its importer could not load (libdw.so.1 / libelf.so.1 on LD_LIBRARY_PATH? "
               "tools/gpu_nsys.sh unpacks the carried libdw1 and libelf1)" if probe.with_suffix(".qdstrm").exists()
               else "it wrote no report")
        raise NsysSetupError(f"nsys {version} cannot profile here: {why}; its output: {_tail(log)}")
    return version


def run_case(nsys: str, case: NsysCase, work: Path, timeout_s: float = CASE_TIMEOUT_S) -> CaseRecord:
    files = CaseFiles(work, case.name)
    log = work / f"{case.name}.log"
    t0 = time.monotonic()
    env = dict(os.environ, **CAPTURE_ENV, **dict(case.env))
    rc = _run(profile_command(nsys, case, files), log, timeout_s, env)
    workload = json.loads(files.result.read_text()) if files.result.exists() else {}
    rec = CaseRecord(name=case.name, group=case.group, status="failed", workload=workload)
    if not files.rep.exists():
        why = (f"the workload ran out of memory: {workload.get('oom')}" if workload.get("status") == "oom"
               else "only a .qdstrm (the importer failed)" if files.rep.with_suffix(".qdstrm").exists()
               else f"no report (exit {rc}; capture range {case.capture!r} never opened?)")
        return replace(rec, status="oom" if workload.get("status") == "oom" else "failed",
                       seconds=time.monotonic() - t0, message=f"{why}; {_tail(log)}")
    if _run(export_command(nsys, files), log, 300) == 0 and files.sqlite.exists():
        trim_export(files.sqlite)
        _run(stats_command(nsys, files), log, 300)
        gzip_file(files.sqlite)
    status = "oom" if workload.get("status") == "oom" else "profiled" if rc == 0 else "failed"
    return replace(rec, status=status, seconds=time.monotonic() - t0, rep=True, sqlite=files.sqlite_gz.exists(),
                   reports=tuple(r for r in REPORTS if files.csv(r).exists()),
                   message=None if status == "profiled" else f"exit {rc}: {_tail(log)}")


def _case_files(work: Path, records: list[CaseRecord]) -> list[Path]:
    """What a part holds, in packing order: tables and results, exports, then .nsys-rep files."""
    fs = [CaseFiles(work, r.name) for r in records]
    small = [p for f in fs for p in (f.result, *(f.csv(r) for r in REPORTS), work / f"{f.name}.log") if p.exists()]
    return small + [f.sqlite_gz for f in fs if f.sqlite_gz.exists()] + [f.rep for f in fs if f.rep.exists()]


def _environment() -> tuple[str, str, int | None]:
    """(device, commit, GPU 0's memory in bytes)."""
    import torch

    # SUITE_COMMIT names the tree the device tool sent (the machine's own git HEAD is stale there)
    commit = os.environ.get("SUITE_COMMIT") or subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    if not torch.cuda.is_available():
        return "no CUDA device", commit or "unknown", None
    n = torch.cuda.device_count()
    props = torch.cuda.get_device_properties(0)
    return f"{n}x {props.name}", commit or "unknown", props.total_memory


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m impl.nsys.run")
    ap.add_argument("groups", nargs="+", choices=GROUPS)
    ap.add_argument("--only", action="append", default=[], help="keep cases whose name contains TEXT (repeatable)")
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--out", type=Path, default=Path("out/gpu/nsys"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/nsys-work"))
    ap.add_argument("--nsys", default=os.environ.get("NSYS", DEFAULT_NSYS))
    ap.add_argument("--max-parts", type=int, default=int(os.environ.get("NSYS_MAX_PARTS", MAX_PARTS)),
                    help="tar parts at most: 8 returned files less manifest, log and any other file the call "
                         "writes under $OUT (NSYS_MAX_PARTS)")
    a = ap.parse_args(argv)
    start = time.monotonic()
    a.out.mkdir(parents=True, exist_ok=True)
    a.work.mkdir(parents=True, exist_ok=True)
    device, commit, device_bytes = _environment()
    try:
        version = check_nsys(a.nsys, a.work)
    except NsysSetupError as exc:
        print(f"gpu_nsys: {exc}", file=sys.stderr)
        return 3
    todo = [c for c in cases(a.groups, device_bytes) if not a.only or any(t in c.name for t in a.only)]
    print(f"{version}; {device}; {len(todo)} cases; budget {a.budget_s:.0f} s", flush=True)
    records: list[CaseRecord] = []
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    for case in todo:
        if time.monotonic() - start > a.budget_s:
            records.append(CaseRecord(case.name, case.group, "left_out_by_budget",
                                      message=f"budget of {a.budget_s:.0f} s spent"))
        else:
            records.append(run_case(a.nsys, case, a.work))
            r = records[-1]
            print(f"{r.name}: {r.status} in {r.seconds:.0f} s; stats {list(r.reports)}; sqlite {r.sqlite}"
                  + (f"; {r.message}" if r.message else ""), flush=True)
        parts, left = write_parts(_case_files(a.work, records), a.out, max_parts=a.max_parts)
        manifest = Manifest(nsys_version=version, device=device, commit=commit, started_utc=stamp,
                            cases=tuple(records), parts=tuple(parts), left_out_files=tuple(left))
        (a.out / MANIFEST).write_text(manifest.to_json())
    return 0 if all(r.status != "failed" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
