"""The report's one loader (impl.report.data): a current (schema-2) run file and an older-format one
load to the one row type (impl.report.rows.Bench), rows stored under an older group name read under
the handout's, and a file it cannot read is refused naming the file and the row."""
import json
import re
from pathlib import Path

import pytest

from impl.bench.row import Env, Row, Status, Timing
from impl.bench.store import BadRunFile
from impl.report.data import load_file, load_rows
from impl.report.rows import Bench, Rows, RunRef, Stats

DEVICE, NAME = "h100-80gb-x1", "test_leaderboard[flash_triton-fwd]"
STATS = dict(median=2e-3, mean=2.1e-3, min=1.9e-3, max=2.5e-3, stddev=1e-4, iqr=5e-5, rounds=5, data=[2e-3] * 5)


def _doc(benchmarks: list[dict], when: str = "2099-01-01T00:00:00+00:00", **extra) -> dict:
    return dict(datetime=when, commit_info=dict(id="abcdef1234", dirty=True), machine_info={}, benchmarks=benchmarks,
                **extra)


def _current(problem: str = "leaderboard", name: str = NAME) -> dict:
    env = Env("NVIDIA H100", "cuda", "2.11", None, None, "full")
    row = Row(problem, {"impl": "flash_triton"}, env, Status.MEASURED, Timing("one call", "cuda_event", 1, 5))
    return dict(name=name, fullname=f"perf/test_leaderboard.py::{name}", group=problem, stats=STATS,
                extra_info=row.to_json())


def _legacy(info: dict, name: str = NAME, group: str = "leaderboard") -> dict:
    base = dict(problem=group, config={"impl": "flash_triton"}, env=dict(device="NVIDIA H100", device_type="cuda"))
    return dict(name=name, fullname=f"perf/test_leaderboard.py::{name}", group=group, stats=STATS,
                extra_info=base | info)


def _write(tmp_path: Path, doc: dict, stem: str = "20990101T000000Z_abcdef12", section: str = "leaderboard") -> Path:
    path = tmp_path / "data" / DEVICE / section / f"{stem}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_a_current_and_an_older_format_file_load_to_the_one_row_type(tmp_path):
    current = _write(tmp_path, _doc([_current()], not_run=[]))
    older = _write(tmp_path, _doc([_legacy({"do_bench_ms": 1.5})], when="2098-01-01T00:00:00+00:00"),
                   "20980101T000000Z_abcdef12")
    [new], [old] = load_file(current, DEVICE, "leaderboard"), load_file(older, DEVICE, "leaderboard")
    for b in (new, old):
        assert type(b) is Bench and type(b.run) is RunRef and type(b.stats) is Stats and type(b.row) is Row
        assert (b.name, b.problem, b.row.config, b.status) == (NAME, "leaderboard", {"impl": "flash_triton"}, Status.MEASURED)
    assert new.run == RunRef(DEVICE, "leaderboard", "2099-01-01T00:00:00+00:00", "abcdef12+", False,
                             f"reports/data/{DEVICE}/leaderboard/20990101T000000Z_abcdef12.json")
    assert new.run.kernels is None and old.run.kernels is None  # no kernel digest in their commit_info
    assert new.stats == Stats(2.1e-3, 1e-4, 2e-3, 5e-5, 5, [2e-3] * 5)
    # the older format's real figure was do_bench's (its stats timed one placeholder round)
    assert old.run.legacy and old.stats == Stats(1.5e-3, None, 1.5e-3, None, None, None)


def test_not_run_rows_load_without_statistics(tmp_path):
    env = Env("NVIDIA H100", "cuda", "2.11", None, None, "full")
    oom = Row("leaderboard", {"impl": "flash_triton"}, env, Status.OOM, reason="out of memory")
    path = _write(tmp_path, _doc([_current()], not_run=[dict(name="test_leaderboard[big]", row=oom.to_json())]))
    measured, not_run = load_file(path, DEVICE, "leaderboard")
    assert measured.measured and (not_run.status, not_run.stats, not_run.row.reason) == (Status.OOM, None, "out of memory")
    older = _write(tmp_path, _doc([_legacy({"oom": True, "oom_message": "CUDA OOM"})]), "20980101T000000Z_abcdef12")
    [b] = load_file(older, DEVICE, "leaderboard")
    assert (b.status, b.stats, b.row.reason) == (Status.OOM, None, "CUDA OOM")  # its one round timed a no-op


def test_rows_stored_under_an_older_group_name_read_under_the_handouts(tmp_path):
    name = "test_ddp[bucketed-1]"
    current = _current("ddp_overlap_bucketed_benchmarking", name) | dict(fullname=f"perf/test_ddp.py::{name}")
    older = _legacy({}, name, "ddp_overlap_bucketed_benchmarking") | dict(fullname=f"perf/test_ddp.py::{name}")
    _write(tmp_path, _doc([current], not_run=[]), section="ddp")
    _write(tmp_path, _doc([older], when="2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12", section="ddp")
    rows = Rows.loaded(load_rows(tmp_path / "data"))
    assert [b.problem for b in (*rows.newest, *rows.history)] == ["ddp_bucketed_benchmarking"] * 2
    assert [b.run.legacy for b in (*rows.newest, *rows.history)] == [False, True]  # the newest run is the 2099 one


def test_an_unreadable_older_format_row_is_refused_naming_the_file_and_the_row(tmp_path, capsys):
    good = _write(tmp_path, _doc([_current()], not_run=[]))
    bad = _write(tmp_path, _doc([_legacy({"metrics": ["not", "a", "table"]})]), "20980101T000000Z_abcdef12")
    with pytest.raises(BadRunFile, match=rf"row {re.escape(NAME)}: unreadable \(AttributeError") as exc:
        load_file(bad, DEVICE, "leaderboard")
    assert exc.value.where == str(bad)
    # the report leaves it out, naming it; the good file still loads
    assert [b.run.file for b in load_rows(tmp_path / "data")] == [f"reports/data/{DEVICE}/leaderboard/{good.name}"]
    assert f"warning: skipped {bad}: row {NAME}: unreadable" in capsys.readouterr().err
