"""Issue 42's repeat tool (impl.bench.repeat): its outcome rules, its runner (on stand-in commands
that pass, fail, crash or hang, not the suite), the budget stop, and the filed summaries' count."""
import json
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from impl.bench import repeat as R
from impl.bench.store import run_files

EXIT_TEST = "correctness.test_distributed::test_overlapped_ddp_ranks_exit_cleanly[bucketed]"

# A stand-in for one repetition's pytest: what it does is picked by the repetition's number (its
# junit file is <index>.xml) from PLAN, a JSON list in argv[2].
FAKE = r'''
import json, signal, sys, time
from pathlib import Path
junit = Path(sys.argv[1]); plan = json.loads(sys.argv[2]); what = plan[int(junit.stem) - 1]
def write(cases):
    body = "".join(f'<testcase classname="{c}" name="{n}">{x}</testcase>' for c, n, x in cases)
    bad = sum("failure" in x for _, _, x in cases)
    junit.write_text(f'<testsuites><testsuite tests="{len(cases)}" failures="{bad}" errors="0" skipped="0" time="1">'
                     f'{body}</testsuite></testsuites>')
ok = [("correctness.test_fsdp", f"test_ok{i}", "") for i in range(3)]
if what == "pass":
    print("...\n=== slowest 25 durations ===\n1.00s call correctness/test_fsdp.py::test_ok0\n3 passed in 1.0s")
    write(ok)
elif what == "fail":
    print("RuntimeError: rank 1 of 2 was killed by signal SIGABRT after reporting its result\nboom marker 5e1f")
    write(ok[:1] + [("correctness.test_distributed", "test_overlapped_ddp_ranks_exit_cleanly[bucketed]",
                     "<failure message='x'>boom</failure>")])
    sys.exit(1)
elif what == "crash":
    print("Fatal Python error: Segmentation fault", flush=True)
    sys.exit(139)
elif what == "hang":
    def stop(*_):
        print("KeyboardInterrupt in correctness/test_fsdp.py::test_hangs", flush=True)
        write(ok[:2]); sys.exit(2)
    signal.signal(signal.SIGINT, stop)
    print("hanging", flush=True)
    time.sleep(120)
elif what == "stubborn":  # ignores the interrupt, and has a child of its own (as pytest has ranks)
    import subprocess
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(120)"])
    Path("child.pid").write_text(str(child.pid))  # in the runner's cwd
    time.sleep(120)
'''


def _header(commit="abc1234def", device="cpu") -> dict:
    return dict(device=device, machine=device, backend="gloo", torch="x", slots=[], commit=commit, dirty=False,
                source_digest="0", command=R.COMMAND, started=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                budget_s=0)


def _run(tmp_path, plan, slots=1, budget_s=60.0, n=None, **kw) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "fake.py"
    script.write_text(FAKE)
    runner = R.Runner(_header(), R.slots_for(None, True, slots, 0), n or len(plan), budget_s, tmp_path / "out",
                      lambda junit: [sys.executable, str(script), str(junit), json.dumps(plan)], tmp_path, **kw)
    return runner.run()


def _junit(tmp_path, failures=0, errors=0, tests=3) -> Path:
    cases = "".join(f'<testcase classname="c" name="t{i}"><failure message="m">x</failure></testcase>'
                    for i in range(failures))
    path = tmp_path / "j.xml"
    path.write_text(f'<testsuite tests="{tests}" failures="{failures}" errors="{errors}" skipped="0" time="1">{cases}</testsuite>')
    return path


@pytest.mark.parametrize("rc, failures, stopped, junit, outcome", [
    (0, 0, False, True, "passed"),
    (1, 1, False, True, "failed"),
    (0, 1, False, True, "failed"),  # a report with a failure is a failure whatever the status
    (1, 0, False, True, "failed"),  # non-zero with nothing named: failed, its status the reason
    (1, 0, False, False, "failed"),  # no report at all (a crash)
    (0, 0, False, False, "failed"),  # "passed" needs pytest's report
    (2, 0, True, True, "stopped"),  # cut at the budget, nothing failed so far
    (2, 1, True, True, "failed"),  # cut at the budget after a failure: still a failure
    (None, 0, True, False, "stopped"),  # killed at the budget without a report
])
def test_outcome_rules(tmp_path, rc, failures, stopped, junit, outcome):
    rep = R.judge(1, "0,1", "2026-11-26T00:00:00+00:00", 1.0, rc, _junit(tmp_path, failures) if junit else None, stopped)
    assert rep.outcome == outcome
    assert (rep.outcome == "failed") == bool(rep.failures)  # a failure always names its reason


def test_a_failure_is_recorded_named_and_counted(tmp_path):
    doc = _run(tmp_path, ["pass", "fail", "crash", "pass"], slots=2)
    assert doc["finished"] and doc["ended"] == "all 4 started"
    assert doc["totals"] == dict(passed=2, failed=2, stopped=0)
    reps = {r["index"]: r for r in doc["repetitions"]}
    assert [reps[i]["outcome"] for i in (1, 2, 3, 4)] == ["passed", "failed", "failed", "passed"]
    assert reps[2]["failures"] == [EXIT_TEST] and reps[2]["failed"] == 1 and reps[2]["rc"] == 1
    assert reps[3]["failures"] == ["pytest exited with code 139 and named no failing test; no test passed"]
    assert {r["slot"] for r in doc["repetitions"]} <= {"cpu#1", "cpu#2"}
    # what is on disk is what was returned, and a whole summary
    on_disk = R.read_summary(tmp_path / "out" / R.SUMMARY)
    assert on_disk["totals"] == doc["totals"]
    log = (tmp_path / "out" / R.LOG).read_text()
    assert "boom marker 5e1f" in log and "Segmentation fault" in log  # failed repetitions' output kept whole
    assert f"FAILED {EXIT_TEST}" in log and "3 passed in 1.0s" in log
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted([R.LOG, R.SUMMARY])


def test_the_budget_stops_a_repetition_cleanly_and_starts_no_more(tmp_path):
    # 5.5 s before the stop: room for the stand-in to start under load and set its handler
    doc = _run(tmp_path, ["hang", "pass", "pass"], budget_s=8.0, stop_grace_s=2.0, reserve_s=0.5)
    assert doc["finished"] and doc["ended"].startswith("budget: 2 of 3 not started")
    assert doc["totals"] == dict(passed=0, failed=0, stopped=1)
    (rep,) = doc["repetitions"]
    assert rep["outcome"] == "stopped" and rep["passed"] == 2 and rep["rc"] == 2
    assert "KeyboardInterrupt in correctness/test_fsdp.py::test_hangs" in (tmp_path / "out" / R.LOG).read_text()


def test_a_repetition_deaf_to_the_interrupt_is_killed_with_what_it_started(tmp_path):
    doc = _run(tmp_path, ["stubborn"], budget_s=7.5, stop_grace_s=1.0, reserve_s=0.5)
    (rep,) = doc["repetitions"]
    assert rep["outcome"] == "stopped" and rep["rc"] == -9 and rep["passed"] == 0
    assert doc["finished"] and R.check_summary(doc)
    # the child it started (as pytest starts ranks) was killed with its process group
    pid = int((tmp_path / "child.pid").read_text())
    deadline = time.monotonic() + 10
    while not _ended(pid):
        assert time.monotonic() < deadline, f"pid {pid} outlived its repetition"
        time.sleep(0.05)


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_summary_that_does_not_add_up_is_refused(tmp_path):
    doc = _run(tmp_path, ["pass", "fail"])
    R.check_summary(doc)
    with pytest.raises(ValueError, match="totals"):
        R.check_summary(dict(doc, totals=dict(passed=2, failed=0, stopped=0)))
    hidden = json.loads(json.dumps(doc))
    next(r for r in hidden["repetitions"] if r["outcome"] == "failed")["failures"] = []
    with pytest.raises(ValueError, match="without a failure named"):
        R.check_summary(hidden)


def test_pairs_are_disjoint_and_default_to_consecutive_gpus():
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in R.slots_for(None, False, 1, 4)] == ["0,1", "2,3"]
    assert [s.name for s in R.slots_for(["0,1"], False, 2, 2)] == ["0,1#1", "0,1#2"]
    assert R.slots_for(None, True, 1, 8)[0].env == {"CUDA_VISIBLE_DEVICES": ""}
    for bad in (["0,1", "1,2"], ["0"]):
        with pytest.raises(ValueError, match="disjoint pairs"):
            R.slots_for(bad, False, 1, 4)
    with pytest.raises(ValueError, match="no pair"):
        R.slots_for(None, False, 1, 1)


def _git(repo: Path, *args) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def test_filed_summaries_count_since_a_commit(tmp_path):
    repo = tmp_path / "repo"
    (repo / "reports" / "data").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    _git(repo, "init", "-q")
    commits = []
    for i in range(2):
        (repo / "f").write_text(str(i))
        _git(repo, "add", "-A")
        _git(repo, "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", str(i))
        commits.append(_git(repo, "rev-parse", "HEAD"))
    old = _run(tmp_path / "a", ["pass", "fail"]) | dict(commit=commits[0], device="h200-141gb-x2")
    new = _run(tmp_path / "b", ["pass", "pass"]) | dict(commit=commits[1], device="h200-141gb-x2")
    stopped = R.judge(3, "cpu", new["started"], 1.0, 2, None, True)  # one cut at a budget
    new["repetitions"].append(R.asdict(stopped))
    new["totals"] = R.totals([R.Repetition(**r) for r in new["repetitions"]])
    R.check_summary(new)
    data = repo / "reports" / "data"
    paths = [R.file_summary(d, data) for d in (old, new, new)]
    assert len(set(paths)) == 3 and all(p.parent == data / "h200-141gb-x2" / "repeats" for p in paths)
    assert run_files(data) == []  # never read as a perf section's runs
    loaded = R.load_summaries(data)
    since_old = R.tally(loaded, commits[0], R.git_is_after(repo))
    since_new = R.tally(loaded, commits[1], R.git_is_after(repo))
    assert (since_old.passed, since_old.failed, since_old.files) == (1 + 2 * new["totals"]["passed"], 1, 3)
    assert (since_new.passed, since_new.failed, since_new.stopped, since_new.files) == (4, 0, 2, 2)
    assert since_old.failures == [f"{paths[0].name} repetition 2 (cpu): {EXIT_TEST}"]
    unknown = R.tally(loaded, "f" * 40, R.git_is_after(repo))
    assert unknown.files == 0 and len(unknown.skipped) == 3
    assert "1 of 2 repetitions passed, 1 failed" in R.tally([x for x in loaded if x[0] == paths[0]]).line("x")
    # the CLI files and counts the same way
    (tmp_path / "s.json").write_text(json.dumps(old))
    assert R.main(["file", str(tmp_path / "s.json"), "--root", str(repo)]) == 0
    assert len(R.load_summaries(data, "h200-141gb-x2")) == 4
