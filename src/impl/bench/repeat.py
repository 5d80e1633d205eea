"""Issue 42's repeat: the command that once failed on NCCL, run N times, every outcome kept.

The command: the four distributed correctness files, serially, with `-x` (`FILES`, `PYTEST_ARGS`;
`test_overlapped_ddp_ranks_exit_cleanly[bucketed]` failed once on 2×H200). Each repetition is one
pytest process on one pair of GPUs (CUDA_VISIBLE_DEVICES=0,1, 2,3, ...: on a 4-GPU machine two
repetitions run at once), or on the CPU (gloo) with `--cpu`.

    python -m impl.bench.repeat run --n 20 --budget-s 540 --out OUT [--pairs auto | --pairs 0,1 2,3] [--cpu]
    python -m impl.bench.repeat file OUT/repeat.json   # files it as reports/data/<device>/repeats/<stamp>.json
    python -m impl.bench.repeat count [--device SLUG] [--since COMMIT]

`run` writes two files under OUT (the device tool returns at most 8):
* `repeat.json`: the summary, rewritten whole (atomically) after every repetition: per repetition
  its outcome, duration, pair, pytest's counts and the failing tests by name; the totals. A run
  killed from outside still leaves the summary as of its last finished repetition (`finished`
  false).
* `repeat.log`: each repetition's header, then for a passed one its slowest tests and pytest's
  last line, for a failed or stopped one its whole output.

No repetition starts unless the budget has room for it (the slowest so far, or `--estimate-s`).
One still running at the budget is interrupted (SIGINT: pytest writes its report and the
launcher stops its ranks; SIGKILL after `--stop-grace-s`) and recorded as `stopped`: neither
passed nor failed, unless a test had already failed, which makes it `failed`. A repetition whose
pytest exits non-zero without naming a failing test (a crash, a collection error) is `failed` with
its exit code as the reason: nothing is counted as passed that pytest did not report passed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from impl.bench.repo import add_repo_arguments, repo_from_args
from impl.bench.store import git_output, write_atomically, write_new
from impl.bench.test_record import SOURCE_PATHS, digest, parse_junit, tested_commit

FILES = ("correctness/test_distributed.py", "correctness/test_sharded_optimizer.py", "correctness/test_fsdp.py",
         "correctness/test_tensor_parallel.py")
# -x as in the failing run; the timeout as tools/gpu_run.sh's. -v names each test as it starts, so
# the log of a repetition stopped at the budget says which test was running; the durations are
# what a passed repetition's log keeps.
PYTEST_ARGS = ("-x", "-v", "-p", "no:cacheprovider", "--timeout=300", "--durations=25")
COMMAND = "pytest " + " ".join(FILES + PYTEST_ARGS)
REPEATS_FOLDER = "repeats"  # beside the sections under reports/data/<device>/ (store.NOT_RUNS)
SUMMARY, LOG = "repeat.json", "repeat.log"
OUTCOMES = ("passed", "failed", "stopped")
KIND = "repeat-1"
# A failed or stopped repetition's output is kept whole up to this many bytes (then its head and tail).
WHOLE_LOG_BYTES = 4_000_000


@dataclass
class Repetition:
    index: int  # 1-based, in the order started
    slot: str  # CUDA_VISIBLE_DEVICES of its pair ("0,1"), "cpu" on the CPU; "#k" marks the k-th run at once on it
    started: str  # UTC, ISO 8601
    duration_s: float
    outcome: str  # passed | failed | stopped
    rc: int | None  # pytest's exit status (None: killed without one)
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failures: list[str] = field(default_factory=list)  # node ids, or why it failed where pytest named none


def judge(index: int, slot: str, started: str, duration_s: float, rc: int | None, junit: Path | None,
          stopped: bool) -> Repetition:
    """A repetition's outcome from pytest's exit status and its junit XML (which may be missing or
    broken: a crash, a kill). Passed only when pytest exited 0 and its report shows tests passed and
    none failed; failed whenever a test failed or errored, or pytest exited non-zero (an interrupt at
    the budget aside), each failure named; stopped when interrupted at the budget with no failure."""
    counts, failures, unreadable = dict(tests=0, failures=0, errors=0, skipped=0), [], None
    if junit is not None:
        try:
            counts, _, failures = parse_junit(junit)
        except ValueError as exc:
            unreadable = str(exc)
    rep = Repetition(index, slot, started, round(duration_s, 1), "failed", rc,
                     passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                     failed=counts["failures"], errors=counts["errors"], skipped=counts["skipped"],
                     failures=list(failures))
    if rep.failed or rep.errors:
        if not rep.failures:
            rep.failures = [f"junit counts {rep.failed} failed, {rep.errors} errors but names no test"]
        return rep
    if stopped:
        rep.outcome = "stopped"
        return rep
    if rc == 0 and unreadable is None and rep.passed > 0:
        rep.outcome = "passed"
        return rep
    why = f"pytest exited with {'no status' if rc is None else f'code {rc}'} and named no failing test"
    rep.failures = [why + (f" ({unreadable})" if unreadable else "") + ("" if rep.passed else "; no test passed")]
    return rep


def totals(reps: list[Repetition]) -> dict[str, int]:
    return {o: sum(r.outcome == o for r in reps) for o in OUTCOMES}


def check_summary(doc: dict, where: str = "summary") -> dict:
    """doc, if it is a whole summary: known kind, every repetition well-formed, a failed one naming
    its failures, the totals those of its repetitions. ValueError naming `where` otherwise."""
    def bad(why: str):
        raise ValueError(f"{where}: not a repeat summary ({why})")
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        bad(f"kind is not {KIND!r}")
    for key in ("device", "commit", "command", "started", "finished", "repetitions", "totals"):
        if key not in doc:
            bad(f"no {key!r}")
    try:
        datetime.fromisoformat(doc["started"])
        reps = [Repetition(**r) for r in doc["repetitions"]]
    except (TypeError, ValueError) as exc:
        bad(str(exc))
    for r in reps:
        if r.outcome not in OUTCOMES:
            bad(f"repetition {r.index}: outcome {r.outcome!r}")
        if r.outcome == "failed" and not r.failures:
            bad(f"repetition {r.index} failed without a failure named")
    if sorted(r.index for r in reps) != list(range(1, len(reps) + 1)):
        bad("repetitions are not numbered 1..n")
    if doc["totals"] != totals(reps):
        bad(f"totals {doc['totals']} are not those of its repetitions {totals(reps)}")
    return doc


# ------------------------------------------------------------------------------------------ running --

@dataclass
class Slot:
    name: str  # what the summary calls it: "0,1", "cpu", "0,1#2"
    env: dict[str, str]  # set for its repetitions (CUDA_VISIBLE_DEVICES)


def slots_for(pairs: list[str] | None, cpu: bool, per_pair: int, visible: int) -> list[Slot]:
    """The places repetitions run: each pair (default: consecutive pairs of the `visible` GPUs) or
    the CPU, each `per_pair` times at once."""
    if cpu:
        bases = [("cpu", "")]
    else:
        if not pairs:
            pairs = [f"{i},{i + 1}" for i in range(0, visible - 1, 2)]
        if not pairs:
            raise ValueError(f"no pair of GPUs: {visible} visible (use --cpu for gloo on the CPU)")
        used = [g for p in pairs for g in p.split(",")]
        if any(len(p.split(",")) != 2 for p in pairs) or len(set(used)) != len(used):
            raise ValueError(f"pairs must be disjoint pairs of GPU indices, got {pairs}")
        bases = [(p, p) for p in pairs]
    return [Slot(name if per_pair == 1 else f"{name}#{k + 1}", {"CUDA_VISIBLE_DEVICES": devices})
            for name, devices in bases for k in range(per_pair)]


def pytest_argv(python: str, junit: Path) -> list[str]:
    return [python, "-m", "pytest", *FILES, *PYTEST_ARGS, f"--junitxml={junit}"]


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Runner:
    """Runs repetitions on `slots` (one thread each) until `n` ran or the budget leaves no room,
    keeping the summary and the combined log under `out` current after each one."""

    def __init__(self, header: dict, slots: list[Slot], n: int, budget_s: float, out: Path,
                 argv_for: Callable[[Path], list[str]], cwd: Path, estimate_s: float = 0.0,
                 stop_grace_s: float = 30.0, reserve_s: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.header, self.slots, self.n, self.out, self.argv_for, self.cwd = header, slots, n, out, argv_for, cwd
        self.estimate_s, self.stop_grace_s, self.clock = estimate_s, stop_grace_s, clock
        self.t0 = clock()
        # repetitions must end (interrupt and grace included) before the budget does
        self.deadline = self.t0 + budget_s - stop_grace_s - reserve_s
        self.lock = threading.Lock()
        self.stop = threading.Event()  # set on SIGTERM/SIGINT of the runner itself
        self.next_index = 1
        self.reps: list[Repetition] = []
        self.ended: str | None = None
        self.work = Path(tempfile.mkdtemp(prefix="repeat-"))
        out.mkdir(parents=True, exist_ok=True)
        (out / LOG).write_text(f"{COMMAND}\n{json.dumps(header)}\n")
        self.write_summary(finished=False)

    def write_summary(self, finished: bool) -> dict:
        reps = sorted(self.reps, key=lambda r: r.index)
        doc = dict(self.header, kind=KIND, finished=finished, ended=self.ended, requested=self.n,
                   elapsed_s=round(self.clock() - self.t0, 1), totals=totals(reps),
                   repetitions=[asdict(r) for r in reps])
        write_atomically(self.out / SUMMARY, doc)
        return doc

    def _take(self) -> int | None:
        with self.lock:
            if self.stop.is_set() or self.next_index > self.n:
                return None
            slowest = max([self.estimate_s] + [r.duration_s for r in self.reps if r.outcome != "stopped"])
            left = self.deadline - self.clock()
            if left < slowest or left <= 0:
                self.ended = self.ended or (f"budget: {self.n - self.next_index + 1} of {self.n} not started "
                                            f"({max(left, 0):.0f} s left before the stop"
                                            + (f", a repetition takes ~{slowest:.0f} s)" if slowest else ")"))
                return None
            self.next_index += 1
            return self.next_index - 1

    def _run_one(self, index: int, slot: Slot) -> None:
        junit, log = self.work / f"{index}.xml", self.work / f"{index}.log"
        started = datetime.now(timezone.utc).isoformat(timespec="seconds")
        t = self.clock()
        env = dict(os.environ, **slot.env)
        stopped, rc = False, None
        with open(log, "wb") as f:
            proc = subprocess.Popen(self.argv_for(junit), stdout=f, stderr=subprocess.STDOUT, cwd=self.cwd, env=env,
                                    start_new_session=True)  # its own group: the ranks it spawns go with it
            try:
                while rc is None:
                    try:
                        rc = proc.wait(timeout=0.5)
                    except subprocess.TimeoutExpired:
                        if self.clock() >= self.deadline or self.stop.is_set():
                            stopped = True
                            _kill_group(proc.pid, signal.SIGINT)
                            try:
                                rc = proc.wait(timeout=self.stop_grace_s)
                            except subprocess.TimeoutExpired:
                                _kill_group(proc.pid, signal.SIGKILL)
                                rc = proc.wait()  # -9: killed without its report
            finally:
                if proc.poll() is None:
                    _kill_group(proc.pid, signal.SIGKILL)
                    proc.wait()
                _kill_group(proc.pid, signal.SIGKILL)  # ranks that outlived pytest
        rep = judge(index, slot.name, started, self.clock() - t, rc, junit if junit.exists() else None, stopped)
        with self.lock:
            self.reps.append(rep)
            self._append_log(rep, log)
            self.write_summary(finished=False)

    def _append_log(self, rep: Repetition, log: Path) -> None:
        text = log.read_bytes()
        head = (f"\n===== repetition {rep.index}/{self.n} on {rep.slot}: {rep.outcome.upper()} in {rep.duration_s} s "
                f"(exit {rep.rc}; {rep.passed} passed, {rep.failed} failed, {rep.errors} errors, {rep.skipped} skipped)"
                + "".join(f"\n  FAILED {f}" for f in rep.failures) + " =====\n")
        if rep.outcome == "passed":
            lines = text.decode(errors="replace").splitlines()
            start = next((i for i, line in enumerate(lines) if "slowest" in line and "durations" in line),
                         len(lines) - 3)
            body = "\n".join(lines[max(0, start):]) + "\n"
        elif len(text) <= WHOLE_LOG_BYTES:
            body = text.decode(errors="replace")
        else:
            cut = WHOLE_LOG_BYTES // 4
            body = (text[:cut].decode(errors="replace") + f"\n[... {len(text) - 4 * cut} bytes left out ...]\n"
                    + text[-3 * cut:].decode(errors="replace"))
        with open(self.out / LOG, "a") as f:
            f.write(head + body)

    def _worker(self, slot: Slot) -> None:
        while (index := self._take()) is not None:
            self._run_one(index, slot)

    def run(self) -> dict:
        threads = [threading.Thread(target=self._worker, args=(s,), daemon=True) for s in self.slots]
        for t in threads:
            t.start()
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.5)
        except KeyboardInterrupt:
            self.stop.set()
            for t in threads:
                t.join()
        with self.lock:
            if self.stop.is_set():
                self.ended = "interrupted: the runner was stopped"
            elif self.ended is None:
                self.ended = f"all {self.n} started"
            doc = self.write_summary(finished=True)
        for p in self.work.iterdir():
            p.unlink()
        self.work.rmdir()
        return doc


def _probe(python: str, env: dict[str, str], cwd: Path) -> dict:
    """Device slug, GPU count and torch version as a rank sees them (in a child: this process
    never touches the GPUs)."""
    code = ("import json, torch; from impl.bench.store import device_slug; print(json.dumps(dict(slug=device_slug(), "
            "gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0, torch=torch.__version__)))")
    out = subprocess.run([python, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"probing the device failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def header_for(root: Path, python: str, slots: list[Slot], machine: dict, budget_s: float) -> dict:
    first = _probe(python, dict(os.environ, **slots[0].env), root)
    commit, dirty = tested_commit(root)
    return dict(device=first["slug"], machine=machine["slug"], backend="gloo" if first["gpus"] < 2 else "nccl",
                torch=first["torch"], slots=[s.name for s in slots], commit=commit, dirty=dirty,
                source_digest=digest(SOURCE_PATHS, root), command=COMMAND,
                started=datetime.now(timezone.utc).isoformat(timespec="seconds"), budget_s=budget_s)


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def run_main(args, root: Path) -> int:
    python = sys.executable
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root / "src"), os.environ.get("PYTHONPATH")])))
    os.environ["PYTHONPATH"] = env["PYTHONPATH"]
    if args.cpu:
        machine = dict(slug="cpu", gpus=0)
        slots = slots_for(None, True, args.per_pair, 0)
    else:
        machine = _probe(python, env, root)
        slots = slots_for(args.pairs, False, args.per_pair, machine["gpus"])
    header = header_for(root, python, slots, machine, args.budget_s)
    if not args.cpu and header["backend"] != "nccl":
        print(f"repeat: a pair sees {header['device']}, not two GPUs; use --cpu for gloo", file=sys.stderr)
        return 2
    runner = Runner(header, slots, args.n, args.budget_s, args.out, lambda junit: pytest_argv(python, junit), root,
                    estimate_s=args.estimate_s, stop_grace_s=args.stop_grace_s)
    signal.signal(signal.SIGTERM, _interrupt)  # a kill from outside stops the repetitions and writes the summary
    print(f"repeat: {args.n} x `{COMMAND}` on {header['device']} ({header['backend']}), slots {header['slots']}, "
          f"budget {args.budget_s:.0f} s -> {args.out}", flush=True)
    doc = runner.run()
    t = doc["totals"]
    print(f"repeat: {t['passed']} passed, {t['failed']} failed, {t['stopped']} stopped of {args.n} requested "
          f"({doc['ended']}); {args.out / SUMMARY}")
    for r in doc["repetitions"]:
        for f in r["failures"]:
            print(f"  repetition {r['index']} ({r['slot']}): {f}")
    return 0 if t["failed"] == 0 and t["passed"] > 0 else 1


# ------------------------------------------------------------------------------------ filing, count --

def read_summary(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path}: not a repeat summary ({type(exc).__name__}: {exc})") from None
    return check_summary(doc, str(path))


def stamp(doc: dict) -> str:
    when = datetime.fromisoformat(doc["started"])
    return f"{when:%Y%m%dT%H%M%SZ}_{(doc['commit'] or 'nocommit')[:8]}{'+' if doc.get('dirty') else ''}"


def file_summary(doc: dict, data_dir: Path) -> Path:
    """Files a checked summary as <data_dir>/<device>/repeats/<started>_<commit>.json, never over another."""
    folder = data_dir / doc["device"] / REPEATS_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    return write_new(folder, stamp(doc), doc)


def load_summaries(data_dir: Path, device: str | None = None) -> list[tuple[Path, dict]]:
    paths = sorted(data_dir.glob(f"{device or '*'}/{REPEATS_FOLDER}/*.json"))
    return [(p, read_summary(p)) for p in paths if not p.name.startswith(".")]


@dataclass
class Tally:
    passed: int = 0
    failed: int = 0
    stopped: int = 0
    files: int = 0
    failures: list[str] = field(default_factory=list)  # "<file> repetition i (slot): failure"
    skipped: list[str] = field(default_factory=list)  # files left out, with why

    def line(self, what: str) -> str:
        ran = self.passed + self.failed
        return (f"{what}: {self.passed} of {ran} repetitions passed, {self.failed} failed"
                f"{f', {self.stopped} stopped at a budget' if self.stopped else ''} ({self.files} summaries)")


def tally(summaries: list[tuple[Path, dict]], since: str | None = None,
          is_after: Callable[[str, str], bool | None] | None = None) -> Tally:
    """Counts over the summaries whose commit is `since` or a descendant of it (`is_after(since,
    commit)`: True, False, or None when unknown: that file is left out and named)."""
    out = Tally()
    for path, doc in summaries:
        if since is not None:
            after = is_after(since, doc["commit"]) if doc["commit"] else None
            if after is None:
                out.skipped.append(f"{path.name}: commit {doc['commit']} unknown here")
            if not after:
                continue
        out.files += 1
        for r in doc["repetitions"]:
            setattr(out, r["outcome"], getattr(out, r["outcome"]) + 1)
            out.failures += [f"{path.name} repetition {r['index']} ({r['slot']}): {f}" for f in r["failures"]
                             if r["outcome"] == "failed"]
    return out


def git_is_after(root: Path) -> Callable[[str, str], bool | None]:
    def is_after(since: str, commit: str) -> bool | None:
        if any(git_output(root, "cat-file", "-e", f"{c}^{{commit}}") is None for c in (since, commit)):
            return None
        out = subprocess.run(["git", "merge-base", "--is-ancestor", since, commit], cwd=root, capture_output=True)
        return out.returncode == 0
    return is_after


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the command N times")
    r.add_argument("--n", type=int, required=True)
    r.add_argument("--budget-s", type=float, required=True, help="wall seconds for the whole run, stop included")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--pairs", nargs="+", help="CUDA_VISIBLE_DEVICES of each pair (default: 0,1 2,3 ... of the GPUs)")
    r.add_argument("--per-pair", type=int, default=1, help="repetitions at once on each pair (default 1)")
    r.add_argument("--cpu", action="store_true", help="gloo on the CPU (CUDA_VISIBLE_DEVICES empty)")
    r.add_argument("--estimate-s", type=float, default=0.0,
                   help="start no repetition with less time left (default: the slowest so far)")
    r.add_argument("--stop-grace-s", type=float, default=30.0)
    add_repo_arguments(r, data_dir=False)
    f = sub.add_parser("file", help="file a summary under reports/data/<device>/repeats/")
    f.add_argument("summary", type=Path)
    add_repo_arguments(f)
    c = sub.add_parser("count", help="count the filed repetitions")
    c.add_argument("--device")
    c.add_argument("--since", help="only summaries of this commit or its descendants")
    add_repo_arguments(c)
    args = ap.parse_args(argv)
    repo = repo_from_args(ap, args)
    if args.cmd == "run":
        if args.n < 1 or args.per_pair < 1 or args.budget_s <= 0:
            ap.error("--n and --per-pair must be >= 1, --budget-s > 0")
        return run_main(args, repo.root)
    try:
        if args.cmd == "file":
            doc = read_summary(args.summary)
            where = file_summary(doc, repo.data_dir)
            print(f"repeat summary ({doc['device']}, {stamp(doc)}): {doc['totals']} -> {where}")
            return 0
        summaries = load_summaries(repo.data_dir, args.device)
    except ValueError as exc:
        print(f"repeat: {exc}", file=sys.stderr)
        return 2
    t = tally(summaries, args.since, git_is_after(repo.root))
    print(t.line(f"{args.device or 'all devices'}{f' since {args.since}' if args.since else ''}"))
    for line in t.failures:
        print(f"  {line}")
    for line in t.skipped:
        print(f"  left out: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
