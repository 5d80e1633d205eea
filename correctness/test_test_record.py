"""The correctness suite's record (impl.bench.test_record) and the index's view of it."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from impl.bench import kernel_digest as kd
from impl.bench import test_record as tr
from impl.report import test_records
from kits.kernel_tree import choice, tree

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" failures="2"
skipped="3" tests="10" time="12.5"><testcase classname="correctness.test_a" name="test_ok" time="0.1"/>
<testcase classname="correctness.test_a" name="test_bad[fp32]"><failure message="x">boom</failure></testcase>
<testcase classname="correctness.test_b" name="test_worse"><failure message="y">boom</failure></testcase>
<testcase classname="correctness.test_c" name="test_setup"><error message="z">fixture</error></testcase>
</testsuite></testsuites>"""


#: A commit of this repository, for the records filed with --file (check_commit_known refuses any other).
HEAD = tr.git_output(Path(__file__).resolve().parents[1], "rev-parse", "HEAD") or "c0ffee00"


def _tree(root: Path) -> Path:
    return tree(root, choice())


def test_junit_counts_and_failure_names(tmp_path, monkeypatch):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    monkeypatch.setenv("SUITE_COMMIT", "0123456789abcdef")
    rec = tr.record_from_junit(path, "pytest correctness -n 8", _tree(tmp_path / "repo"), device="h100-80gb-x1")
    assert (rec.passed, rec.failed, rec.errors, rec.skipped) == (4, 2, 1, 3)
    assert rec.failures == ["correctness.test_a::test_bad[fp32]", "correctness.test_b::test_worse",
                            "correctness.test_c::test_setup"]
    assert rec.commit == "0123456789abcdef" and not rec.dirty and not rec.green
    assert rec.duration_s == 12.5 and rec.stamp().endswith("_01234567")
    assert rec.kernels == kd.kernel_digest(tmp_path / "repo")  # the kernel files and the table's choices


@pytest.mark.parametrize("text", ["", "<testsuites><testsuite", "[]", "<html/>"])
def test_a_broken_junit_is_refused_naming_the_file(tmp_path, text):
    path = tmp_path / "junit.xml"
    path.write_text(text)
    with pytest.raises(ValueError, match="junit.xml"):
        tr.parse_junit(path)


def test_records_are_filed_never_overwritten(tmp_path, monkeypatch):
    path = tmp_path / "junit.xml"
    path.write_text('<testsuite tests="2" failures="0" errors="0" skipped="0" time="1"><testcase classname="a" '
                    'name="t1"/><testcase classname="a" name="t2"/></testsuite>')
    monkeypatch.setenv("SUITE_COMMIT", "abcdef0123")
    rec = tr.record_from_junit(path, "pytest correctness", _tree(tmp_path / "repo"), device="cpu")
    first, second = tr.store_record(rec, tmp_path / "data"), tr.store_record(rec, tmp_path / "data")
    assert first != second and first.parent == second.parent == tmp_path / "data/cpu/tests"
    assert [r.to_json() for r in tr.load_records(tmp_path / "data")] == [rec.to_json()] * 2


def test_index_marks_a_record_whose_kernels_changed(tmp_path):
    root = _tree(tmp_path / "repo")
    data = tmp_path / "data"
    tested = kd.digest(kd.KERNEL_PATHS, root)
    base = dict(datetime="2026-11-24T10:00:00+00:00", commit="c0ffee00", dirty=False, source_digest="s",
                command="pytest correctness", passed=5, failed=0, errors=0, skipped=1, duration_s=1.0)
    tr.store_record(tr.TestRecord(device="h100-80gb-x1", kernel_digest=tested, **base), data)
    tr.store_record(tr.TestRecord(device="cpu", kernel_digest="old", **base), data)
    facts = {t.device: t for t in test_records.device_tests(data, root)}
    assert not facts["h100-80gb-x1"].kernels_changed and facts["cpu"].kernels_changed
    assert [t.device for t in test_records.device_tests(data, root)] == ["h100-80gb-x1", "cpu"]  # GPUs first
    (root / "src/impl/attention/k.py").write_text("x = 2\n")  # a kernel edit after the record
    assert test_records.device_tests(data, root)[0].kernels_changed


BASE = dict(datetime="2026-11-24T10:00:00+00:00", commit=HEAD, dirty=False, source_digest="s",
            command="pytest correctness", passed=5, failed=0, errors=0, skipped=1, duration_s=1.0)


def _stale(root: Path, data: Path) -> dict[str, bool]:
    return {t.device: t.kernels_changed for t in test_records.device_tests(data, root)}


def test_a_change_of_the_tables_choices_leaves_a_record_stale_new_evidence_does_not(tmp_path):
    root, data = _tree(tmp_path / "repo"), tmp_path / "data"
    now = kd.kernel_digest(root)
    tr.store_record(tr.TestRecord(device="h100-80gb-x1", kernel_digest=now.sources, kernel_table_digest=now.table,
                                  **BASE), data)
    tr.store_record(tr.TestRecord(device="h200-141gb-x2", kernel_digest=now.sources, **BASE), data)  # an old record
    assert _stale(root, data) == {"h100-80gb-x1": False, "h200-141gb-x2": False}
    tree(root, choice(probes=4))  # probes filed, the same choice
    assert _stale(root, data) == {"h100-80gb-x1": False, "h200-141gb-x2": False}
    tree(root, choice(num_warps=8))  # the table now runs another config
    # the old record never recorded the table: judged by its kernel files alone, as when it was filed
    assert _stale(root, data) == {"h100-80gb-x1": True, "h200-141gb-x2": False}
    tree(root, choice(num_warps=8), kernel="x = 3\n")
    assert _stale(root, data) == {"h100-80gb-x1": True, "h200-141gb-x2": True}


def test_a_record_filed_before_the_table_digest_loads_without_it(tmp_path):
    old = dict(BASE, device="cpu", kernel_digest="k", failures=[])  # the fields records had before
    path = tmp_path / "data/cpu/tests/20261124T100000Z_c0ffee00.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    [rec] = tr.load_records(tmp_path / "data")
    assert rec.kernel_table_digest is None and rec.kernels == kd.KernelDigest("k", None)


def test_cli_files_a_record_made_elsewhere(tmp_path):
    rec = tr.TestRecord(device="h100-80gb-x1", datetime="2026-11-24T10:00:00+00:00", commit=HEAD, dirty=True,
                        source_digest="s", kernel_digest="k", command="make test", passed=3, failed=1, errors=0,
                        skipped=0, duration_s=2.0, failures=["t::x"])
    path = tmp_path / "record.json"
    path.write_text(json.dumps(rec.to_json()))
    out = subprocess.run([sys.executable, "-m", "impl.bench.test_record", "--file", str(path), "--data-dir",
                          str(tmp_path / "data")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr  # filed, and the exit status says it was red
    assert "3 passed, 1 failed" in out.stdout
    assert len(list((tmp_path / "data/h100-80gb-x1/tests").glob("*.json"))) == 1


@pytest.mark.parametrize("commit", ["0ef2165a4b7fabdc5a3dc02ee7a8b8e81af2a6c8", None])
def test_filing_a_record_of_a_commit_this_repository_lacks_is_refused_naming_both(tmp_path, capsys, commit):
    """A record made on a GPU machine names its commit by SUITE_COMMIT, typed by hand: one this repository does not
    have (a typo, as in the thirtieth session) is refused, naming the file and the commit, and nothing is filed."""
    [path] = _write_records(tmp_path, tr.TestRecord(**{**BASE, "device": "h100-80gb-x1", "kernel_digest": "k",
                                                       "commit": commit}))
    assert tr.main(["--file", str(path), "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"test_record: {path}: commit {commit!r} is not a commit of ") and "SUITE_COMMIT" in err
    assert not (tmp_path / "data").exists()
    assert tr.main(["--file", str(path), "--out", str(tmp_path / "copy.json")]) == 0  # only filing checks


@pytest.mark.parametrize("text", ["", "{", "[]", '{"benchmarks": []}', '{"device": "cpu"}'])
def test_filing_a_file_that_is_not_a_record_names_the_file(tmp_path, capsys, text):
    path = tmp_path / "record.json"
    path.write_text(text)
    assert tr.main(["--file", str(path), "--data-dir", str(tmp_path / "data")]) == 2
    assert capsys.readouterr().err.startswith(f"test_record: {path}: not a test record (")
    assert not (tmp_path / "data").exists()


def _shard(k: int, n: int, **changes) -> tr.TestRecord:
    fields = dict(BASE, device="h100-80gb-x1", kernel_digest="k", kernel_table_digest="t", shard=f"{k}/{n}",
                  command=f"pytest correctness -n 12 --dist worksteal --shard {k}/{n}",
                  datetime=f"2026-11-27T0{k}:00:00+00:00", failures=[f"correctness/test_{k}.py::test_x"])
    return tr.TestRecord(**{**fields, **changes})


def _write_records(tmp_path: Path, *records: tr.TestRecord) -> list[Path]:
    paths = []
    for i, rec in enumerate(records):
        paths.append(tmp_path / f"record-{i + 1}.json")
        paths[-1].write_text(json.dumps(rec.to_json()))
    return paths


@pytest.mark.parametrize("bad", ["3/2", "0/2", "junk", "1/"])
def test_a_record_with_a_shard_that_is_not_k_of_n_is_refused_built_or_read(tmp_path, bad):
    with pytest.raises(ValueError, match=f"--shard must be K/N .*got '{bad}'"):
        _shard(1, 2, shard=bad)
    path = tmp_path / "record.json"
    path.write_text(json.dumps(dict(_shard(1, 2).to_json(), shard=bad)))
    with pytest.raises(ValueError, match=f"{path}: not a test record .*got '{bad}'"):
        tr.read_record(path)


def test_a_shard_record_from_junit_says_which_shard(tmp_path, monkeypatch):
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    monkeypatch.setenv("SUITE_COMMIT", "0123456789abcdef")
    rec = tr.record_from_junit(path, "pytest correctness --shard 2/3", _tree(tmp_path / "repo"), device="cpu",
                               shard=tr.Shard(2, 3))
    assert rec.shard == "2/3" and rec.shards is None
    [back] = _write_records(tmp_path, rec)
    assert tr.read_record(back) == rec


def test_merged_shards_sum_into_one_record(tmp_path):
    # given out of order: the merge orders them by shard
    paths = _write_records(tmp_path, _shard(2, 2, passed=7, skipped=0, duration_s=2.25, dirty=True), _shard(1, 2))
    rec = tr.merge_records(paths)
    assert (rec.passed, rec.failed, rec.errors, rec.skipped, rec.duration_s) == (12, 0, 0, 1, 3.2)
    assert rec.failures == ["correctness/test_1.py::test_x", "correctness/test_2.py::test_x"]
    assert rec.shard is None and rec.shards == 2 and rec.dirty and rec.datetime == "2026-11-27T02:00:00+00:00"
    assert rec.command == "pytest correctness -n 12 --dist worksteal"
    assert rec.shard_commands == [_shard(1, 2).command, _shard(2, 2).command]
    assert (rec.device, rec.commit, rec.kernels) == ("h100-80gb-x1", HEAD, kd.KernelDigest("k", "t"))
    tr.store_record(rec, tmp_path / "data")  # a merged record files as a whole one
    assert [r.shards for r in tr.load_records(tmp_path / "data")] == [2]


@pytest.mark.parametrize("field, value", [("device", "h200-141gb-x1"), ("commit", "deadbeef"),
                                          ("source_digest", "s2"), ("kernel_digest", "k2"),
                                          ("kernel_table_digest", None),
                                          ("command", "pytest correctness/test_a.py --shard 2/2")])
def test_a_merge_of_shards_of_different_runs_is_refused_naming_field_and_file(tmp_path, field, value):
    paths = _write_records(tmp_path, _shard(1, 2), _shard(2, 2, **{field: value}))
    with pytest.raises(ValueError, match=f"^{re.escape(str(paths[1]))}: field {field} is"):
        tr.merge_records(paths)


@pytest.mark.parametrize("shards, message", [
    ([(1, 2), (1, 2)], r"record-2.json: field shard 1/2 repeats .*record-1.json"),
    ([(1, 3), (3, 3)], r"field shard: 2/3 missing"),
    ([(1, 2), (2, 3)], r"record-2.json: field shard is 2/3, but .*record-1.json is one of 2"),
    ([(1, 2)], r"field shard: 2/2 missing")])
def test_a_repeated_missing_or_mixed_shard_is_refused(tmp_path, shards, message):
    paths = _write_records(tmp_path, *(_shard(k, n) for k, n in shards))
    with pytest.raises(ValueError, match=message):
        tr.merge_records(paths)


def test_a_whole_record_is_not_a_shard_to_merge(tmp_path):
    paths = _write_records(tmp_path, _shard(1, 2), _shard(2, 2, shard=None))
    with pytest.raises(ValueError, match="record-2.json: field shard is None"):
        tr.merge_records(paths)


def test_a_lone_shard_is_never_filed(tmp_path, capsys):
    with pytest.raises(ValueError, match="shard 1/2 .* merge all 2 shards"):
        tr.store_record(_shard(1, 2), tmp_path / "data")
    [path] = _write_records(tmp_path, _shard(2, 2))
    assert tr.main(["--file", str(path), "--data-dir", str(tmp_path / "data")]) == 2
    assert "record of shard 2/2" in capsys.readouterr().err and not (tmp_path / "data").exists()


def test_cli_merges_shards_then_files_the_merge(tmp_path, capsys):
    paths = _write_records(tmp_path, _shard(1, 2), _shard(2, 2, failures=[], failed=0))
    merged = tmp_path / "merged.json"
    assert tr.main(["merge", *map(str, paths), "--out", str(merged)]) == 0
    assert "2 shards): 10 passed, 0 failed" in capsys.readouterr().out
    assert tr.main(["--file", str(merged), "--data-dir", str(tmp_path / "data")]) == 0
    [rec] = tr.load_records(tmp_path / "data")
    assert rec == tr.merge_records(paths)
    assert tr.main(["merge", str(paths[0]), str(paths[0]), "--out", str(tmp_path / "x.json")]) == 2
    assert "repeats" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_the_index_names_a_merged_records_shards_and_nothing_else_changes(tmp_path):
    root, data = _tree(tmp_path / "repo"), tmp_path / "data"
    now = kd.kernel_digest(root)
    whole = tr.TestRecord(device="h100-80gb-x1", kernel_digest=now.sources, kernel_table_digest=now.table, **BASE)
    tr.store_record(whole, data)
    before = test_records.render(test_records.device_tests(data, root))
    assert "shards" not in before
    merged = tr.merge_records(_write_records(tmp_path, *(_shard(k, 2, kernel_digest=now.sources,
                                                                 kernel_table_digest=now.table) for k in (1, 2))))
    tr.store_record(merged, data)
    after = test_records.render(test_records.device_tests(data, root))
    assert "| h100-80gb-x1 (2 shards) | 10 |" in after and '"(N shards)" marks a record merged' in after
