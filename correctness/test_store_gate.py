"""Histories and the regression gate (impl.bench.store, impl.report.gate, impl.report.compare) on
copies of committed runs in a temporary data folder, and (issue 35) every way a history could lie:
wrong baselines, lost runs, bad data trusted, unchecked commands and files."""
import gzip
import json
import math
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from impl.bench import runlock, store
from impl.bench.kernel_digest import KernelDigest, kernel_digest
from impl.bench.session import BenchSession
from impl.bench.row import Env, Metric, Row, Status, Timing
from impl.report import compare, gate
from impl.report import data as report_data

DATA = Path(__file__).resolve().parents[1] / "reports" / "data"


@pytest.fixture
def plugin(pytestconfig):
    """The bench plugin as pytest registered it (the root conftest's pytest_plugins): nothing imports it."""
    return pytestconfig.pluginmanager.get_plugin("impl.bench.plugin")
OURS = "test_leaderboard[flash_triton-fwd_bwd]"


def _newest_schema2(device: str, section: str) -> Path:
    runs = [rf.path for rf in store.run_files(DATA) if rf.device == device and rf.section == section
            and any(b.get("extra_info", {}).get("schema") == 2 for b in _doc(rf.path)["benchmarks"])]
    if not runs:
        pytest.skip(f"no schema-2 {device}/{section} run committed")
    return runs[-1]


def _doc(path: Path) -> dict:
    """A stored run's document, either form (impl.bench.store.read_run_text)."""
    return json.loads(store.read_run_text(path))


def _later_copy(src: Path, slower: dict[str, float], datetime: str) -> dict:
    doc = _doc(src)
    doc["datetime"] = datetime
    for b in doc["benchmarks"]:
        for k in ("min", "max", "mean", "median"):
            b["stats"][k] *= slower.get(b["name"], 1.0)
    return doc


@pytest.fixture
def h100_leaderboard(tmp_path):
    """A data folder holding the newest committed H100 leaderboard run."""
    src = _newest_schema2("h100-80gb-x1", "leaderboard")
    folder = tmp_path / "data" / "h100-80gb-x1" / "leaderboard"
    folder.mkdir(parents=True)
    shutil.copy(src, folder / src.name)
    return tmp_path / "data", src


def _store(doc: dict, tmp_path: Path, data_dir: Path) -> Path:
    run = tmp_path / "run.json"
    run.write_text(json.dumps(doc))
    return store.store_run(run, "leaderboard", data_dir, device="h100-80gb-x1")


def test_gate_fails_on_a_30_percent_slower_row_and_accepts_it_with_a_reason(h100_leaderboard, tmp_path, capsys):
    data_dir, src = h100_leaderboard
    dest = _store(_later_copy(src, {OURS: 1.3}, "2099-01-01T00:00:00+00:00"), tmp_path, data_dir)
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    err = capsys.readouterr().err
    assert f"REGRESSION h100-80gb-x1/leaderboard {OURS}" in err
    assert err.count("REGRESSION") == 1  # the other rows are unchanged
    (data_dir.parent / "accepted-changes.toml").write_text(
        f'[[accepted]]\ndevice = "h100-80gb-x1"\nsection = "leaderboard"\nrow = "{OURS}"\n'
        f'run = "{store.run_stem(dest)}"\nreason = "a test of the gate"\n')
    assert gate.main(["--data-dir", str(data_dir)]) == 0
    assert "accepted: a test of the gate" in capsys.readouterr().out


def test_gate_acceptance_for_another_run_does_not_carry_over(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    _store(_later_copy(src, {OURS: 1.3}, "2099-01-01T00:00:00+00:00"), tmp_path, data_dir)
    (data_dir.parent / "accepted-changes.toml").write_text(
        f'[[accepted]]\ndevice = "h100-80gb-x1"\nsection = "leaderboard"\nrow = "{OURS}"\n'
        f'run = "{store.run_stem(src)}"\nreason = "an older change"\n')
    verdict = gate.compare(data_dir)
    assert [c.row for c in verdict.changes if c.regressed and not c.accepted] == [OURS]


def test_gate_within_band_and_measured_bands(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    _store(_later_copy(src, {OURS: 1.01}, "2099-01-01T00:00:00+00:00"), tmp_path, data_dir)
    changes = gate.compare(data_dir).changes
    assert {c.row for c in changes} >= {OURS} and not any(c.regressed for c in changes)
    runs = [rf.path for rf in store.run_files(data_dir)]
    bands = gate.measure_bands(runs, "h100-80gb-x1", "leaderboard")
    assert bands[OURS] == pytest.approx(max(gate.MIN_BAND, gate.BAND_SAFETY * 0.01))
    gate.write_bands(data_dir.parent / "noise-bands.toml", "h100-80gb-x1", "leaderboard", {OURS: 0.005})
    _store(_later_copy(src, {OURS: 1.02}, "2099-01-02T00:00:00+00:00"), tmp_path, data_dir)
    assert [c.row for c in gate.compare(data_dir).changes if c.regressed] == [OURS]  # 2% is beyond its own 0.5% band


def test_store_never_overwrites_and_refuses_interrupted_runs(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    doc = _doc(src)
    doc["datetime"] = "2099-01-01T00:00:00.000001+00:00"
    first = _store(doc, tmp_path, data_dir)
    before = sorted(p.name for p in (data_dir / "h100-80gb-x1" / "leaderboard").iterdir())
    with pytest.raises(ValueError, match=f"the same run is already stored as .*{re.escape(first.name)}"):
        _store(doc, tmp_path, data_dir)  # filed twice (two make perf sharing one output): refused
    doc["suite"] = dict(interrupted=True, why="KeyboardInterrupt")
    with pytest.raises(ValueError, match="interrupted"):
        _store(doc, tmp_path, data_dir)
    assert sorted(p.name for p in (data_dir / "h100-80gb-x1" / "leaderboard").iterdir()) == before
    # another run stamped in the same second is kept, under a name that sorts after the first
    doc["suite"], doc["datetime"] = {}, "2099-01-01T00:00:00.000002+00:00"
    second = _store(doc, tmp_path, data_dir)
    assert second.name.startswith(store.run_stem(first) + "_") and sorted([second, first]) == [first, second]
    assert [rf.path for rf in store.run_files(data_dir)][-2:] == [first, second]


@pytest.mark.parametrize("name,count,mem,slug", [
    ("NVIDIA H100 80GB HBM3", 1, 85e9, "h100-80gb-x1"),
    ("NVIDIA H200", 2, 150e9, "h200-141gb-x2"),
    ("NVIDIA A100-SXM4-40GB", 8, 42e9, "a100-40gb-x8"),
])
def test_gpu_slug_names_model_memory_and_count(name, count, mem, slug):
    assert store.gpu_slug(name, count, int(mem)) == slug


def test_compare_fails_when_a_row_changes_status(tmp_path):
    src = _newest_schema2("cpu", "leaderboard")
    data_dir = tmp_path / "data"
    (data_dir / "cpu" / "leaderboard").mkdir(parents=True)
    shutil.copy(src, data_dir / "cpu" / "leaderboard" / src.name)
    fresh = tmp_path / "leaderboard.json"
    doc = _doc(src)
    fresh.write_text(json.dumps(doc))
    rows, problems = compare.compare_run(fresh, "cpu", data_dir)
    assert rows and not problems
    gone = doc["benchmarks"].pop(0)["name"]
    fresh.write_text(json.dumps(doc))
    rows, problems = compare.compare_run(fresh, "cpu", data_dir)
    assert problems == [f"leaderboard: {gone} was measured in {store.run_stem(src)}, now absent"]


# --- Issue 35: histories that cannot lie. A small synthetic run of the `leaderboard` section. ---

ROOT = Path(__file__).resolve().parents[1]
GPU = "h100-80gb-x1"


def _row(status: Status = Status.MEASURED) -> dict:
    env = Env(device="NVIDIA H100", device_type="cuda", torch="2", triton=None, cuda=None, profile="full")
    timing = Timing(round="one call", timer="cuda_event", warmup_rounds=1, rounds=5) if status is Status.MEASURED else None
    return Row(problem="leaderboard", config={}, env=env, status=status, timing=timing).to_json()


def _bench(name: str, median: float, host_ms: float | None = None) -> dict:
    row = _row()
    if host_ms is not None:
        row["metrics"] = dict(row.get("metrics") or {}, host_ms=host_ms)
    return dict(name=name, fullname=f"perf/test_leaderboard.py::{name}", group="leaderboard", extra_info=row,
                stats=dict(median=median, mean=median, min=median, max=median, stddev=0.0, rounds=5, iqr=0.0))


def _run(medians: dict[str, float], when: str = "2099-01-01T00:00:00+00:00", **suite) -> dict:
    return dict(datetime=when, commit_info=dict(id="abcdef1234", dirty=False), machine_info={},
                benchmarks=[_bench(n, m) for n, m in medians.items()], not_run=[],
                suite=dict(device_slug=GPU, interrupted=False, why=None, args=[], failed=[], **suite))


A, B = "test_leaderboard[flash_triton-fwd]", "test_leaderboard[flash_triton-fwd_bwd]"


def _file(data_dir: Path, doc, name: str = "20990101T000000Z_abcdef12.json", device: str = GPU,
          packed: bool = False) -> Path:
    """A run file planted as is: doc (a document, text or bytes) plain, or packed as the store packs
    (name + ".gz")."""
    path = data_dir / device / "leaderboard" / (name + ".gz" if packed else name)
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = doc if isinstance(doc, bytes) else (doc if isinstance(doc, str) else json.dumps(doc)).encode()
    path.write_bytes(store.encode_run(raw) if packed else raw)
    return path


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# bad run files: (what is planted, the words that name the problem)
BAD_FILES = {
    "truncated": (json.dumps(_run({A: 1e-3}))[:-40], "not JSON"),
    "empty": ("", "empty file"),
    "a list": ("[]", "found list"),
    "an empty object": ("{}", "no rows"),
    "NaN median": (json.dumps(_run({A: float("nan")})), f"row {A}: stats must be finite and > 0: median nan"),
    "negative median": (json.dumps(_run({A: -1e-3})), "median -0.001"),
    "zero median": (json.dumps(_run({A: 0.0})), "median 0.0"),
    "no median": (json.dumps(dict(_run({}), benchmarks=[dict(_bench(A, 1e-3), stats=dict(mean=1e-3, rounds=5))])),
                  f"row {A}: stats must be finite and > 0: median None"),
    "missing stats": (json.dumps(dict(_run({A: 1e-3}), benchmarks=[dict(_bench(A, 1e-3), stats=None)])), f"row {A}: no stats"),
    "unknown status": (json.dumps(dict(_run({}), benchmarks=[dict(_bench(A, 1e-3), extra_info=dict(_row(), status="timed_out"))])),
                       f"row {A}: unknown status 'timed_out'"),
    "failed tests": (json.dumps(_run({A: 1e-3}, ) | dict(suite=dict(failed=[dict(test=f"perf/test_leaderboard.py::{A}", when="call")] * 4))),
                     "4 tests failed or errored"),
}


def _edited(edit, doc: dict | None = None) -> str:
    """A run of one row (A) with `edit` applied to its benchmark entry, as file text (NaN and
    infinity as JSON's NaN and Infinity, as json.dumps writes them)."""
    doc = doc or _run({A: 1e-3})
    edit(doc["benchmarks"][0])
    return json.dumps(doc)


def _set(*path_value):
    """An edit setting bench[path...] = value."""
    *path, value = path_value

    def edit(bench):
        node = bench
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return edit


NAN, INF = float("nan"), float("inf")
# issue 46, item 4: every number of a row is checked, not only the timing stats
BAD_FILES |= {
    "negative mfu": (_edited(_set("extra_info", "metrics", "mfu", -3.0)), f"row {A}: metrics.mfu -3.0 is not a finite number >= 0"),
    "NaN tflops": (_edited(_set("extra_info", "metrics", "tflops", NAN)), f"row {A}: metrics.tflops nan is not a finite"),
    "infinite tokens/s": (_edited(_set("extra_info", "metrics", "tokens_per_s", INF)), "metrics.tokens_per_s inf"),
    "a metric that is text": (_edited(_set("extra_info", "metrics", "gbps", "fast")), "metrics.gbps 'fast'"),
    "negative peak memory": (_edited(_set("extra_info", "memory", "peak_allocated", -1024)),
                             f"row {A}: memory.peak_allocated -1024 is not a finite number >= 0"),
    "zero measured peak": (_edited(_set("extra_info", "peaks", dict(measured_flops=0.0, measured_dtype="bf16",
                                                                    measured_n=8, datasheet_flops=None))),
                           "peaks.measured_flops 0.0 is not a finite number >= 1"),
    "zero timed rounds": (_edited(_set("extra_info", "timing", "rounds", 0)), "timing.rounds 0 is not a whole number >= 1"),
    "NaN in details": (_edited(_set("extra_info", "details", "step", dict(gap_ms=NAN))), "details.step.gap_ms nan is not finite"),
    "negative stddev": (_edited(_set("stats", "stddev", -1.0)), f"row {A}: stats must be finite and >= 0: stddev -1.0"),
    "NaN iqr": (_edited(_set("stats", "iqr", NAN)), "stats must be finite and >= 0: iqr nan"),
    "an infinite round": (_edited(_set("stats", "data", [1e-3, INF])), "data[1] inf"),
    "NaN in a not-run row": (json.dumps(dict(_run({A: 1e-3}), not_run=[dict(name=B, fullname=f"perf/test_leaderboard.py::{B}",
                             group="leaderboard", row=dict(_row(Status.OOM), metrics=dict(flops=NAN)))])),
                             f"row {B}: metrics.flops nan"),
    # issue 46, item 2: the loader reads a file's rows only where they belong
    "rows of another section": (json.dumps(dict(_run({}), benchmarks=[dict(_bench(A, 1e-3), fullname=f"perf/test_fsdp.py::{A}")])),
                                "not perf/test_leaderboard.py"),
}
LOAD_ONLY = {  # files the store would file elsewhere or cannot tell (the loader knows their folder and format)
    "a CPU run in the H100 folder": (json.dumps(_run({A: 1e-3}) | dict(suite=dict(device_slug="cpu"))),
                                     f"the run's own device is 'cpu', not '{GPU}'"),
    "CPU rows without a device slug": (_edited(_set("extra_info", "env", "device_type", "cpu"), dict(_run({A: 1e-3}), suite={})),
                                       f"row {A}: env.device_type 'cpu', where a {GPU} run's is 'cuda'"),
    "an older-format row with a negative mfu": (json.dumps(dict(datetime="2099-01-01T00:00:00+00:00", benchmarks=[dict(
        name=A, fullname=f"perf/test_leaderboard.py::{A}", group="leaderboard", stats=_bench(A, 1e-3)["stats"],
        extra_info=dict(problem="leaderboard", env=dict(device="NVIDIA H100", device_type="cuda"),
                        metrics=dict(mfu=-3.0)))])), f"row {A}: metrics.mfu_measured_peak -3.0"),
}


# packed files that are not whole gzip (planted as these bytes under a .json.gz name)
_WHOLE_GZ = store.encode_run(json.dumps(_run({A: 1e-3})).encode())
BAD_PACKED = {
    "not gzip": (b'{"benchmarks": []}', "unreadable (BadGzipFile"),
    "truncated gzip": (_WHOLE_GZ[:len(_WHOLE_GZ) // 2], "unreadable (EOFError"),
    "a bad gzip checksum": (_WHOLE_GZ[:-8] + bytes(8), "unreadable (BadGzipFile: CRC check failed"),
    "gzip of bytes that are not UTF-8": (store.encode_run(b"\xff\xfe{}"), "unreadable (UnicodeDecodeError"),
}


@pytest.mark.parametrize("case,packed", [(c, False) for c in list(BAD_FILES) + list(LOAD_ONLY)]
                         + [(c, True) for c in list(BAD_FILES) + list(LOAD_ONLY)] + [(c, None) for c in BAD_PACKED])
def test_each_bad_run_file_is_named_by_the_loader_gate_report_and_compare(case, packed, tmp_path, capsys):
    """Each bad file, plain or packed (`.json.gz`: the same text gzipped, or bytes that are not whole gzip)."""
    text, words = (BAD_FILES | LOAD_ONLY | BAD_PACKED)[case]
    data_dir = tmp_path / "data"
    good = _file(data_dir, _run({A: 1e-3, B: 2e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    bad = _file(data_dir, text, "20990101T000000Z_abcdef12.json" + (".gz" if packed is None else ""),
                packed=bool(packed))
    with pytest.raises(store.BadRunFile, match=re.escape(words)) as exc:
        report_data.load_file(bad, GPU, "leaderboard")
    assert str(bad) in str(exc.value)
    # the gate fails on it by name (committed corruption), the report skips it with a warning
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    assert f"CORRUPT run file {bad}" in capsys.readouterr().err
    assert {r.run.file for r in report_data.load_rows(data_dir)} == {report_data.run_file_name(good)}
    assert f"warning: skipped {bad}" in capsys.readouterr().err


def test_the_store_refuses_a_suite_commit_its_repository_lacks(tmp_path):
    """A run whose commit came from SUITE_COMMIT (typed for a GPU machine) is filed only where the repository
    holding the data folder has that commit; outside a clone nothing can be checked, and it is filed."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty",
                                  "-m", "c"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    head = store.git_output(repo, "rev-parse", "HEAD")
    doc = _doc(_newest_schema2("h100-80gb-x1", "leaderboard"))
    doc["commit_info"] = dict(doc.get("commit_info") or {}, id="deadbee", dirty=False, source="SUITE_COMMIT")
    with pytest.raises(ValueError, match="SUITE_COMMIT 'deadbee' is not a commit"):
        _store(doc, tmp_path, repo / "data")
    assert not (repo / "data").exists()
    assert _store(doc, tmp_path, tmp_path / "elsewhere").exists()  # no clone: nothing to check against
    doc["commit_info"]["id"] = head[:7]
    assert _store(doc, tmp_path, repo / "data").name.endswith(f"_{head[:7]}.json.gz")


@pytest.mark.parametrize("case", BAD_FILES)
def test_the_store_refuses_each_bad_run_and_writes_nothing(case, tmp_path):
    text, words = BAD_FILES[case]
    run = tmp_path / "leaderboard.json"
    run.write_text(text)
    data_dir = tmp_path / "data"
    with pytest.raises(ValueError, match=re.escape(words)):
        store.store_run(run, "leaderboard", data_dir)
    assert not data_dir.exists()
    assert store.main([str(run), "--section", "leaderboard", "--data-dir", str(data_dir)]) == 1


def test_compare_skips_a_bad_committed_run_with_a_warning_and_names_a_bad_fresh_one(tmp_path, capsys):
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    bad = _file(data_dir, "{", "20990101T000000Z_abcdef12.json")
    fresh = tmp_path / "leaderboard.json"
    fresh.write_text(json.dumps(_run({A: 1e-3})))
    rows, problems = compare.compare_run(fresh, GPU, data_dir)
    assert len(rows) == 1 and not problems
    assert f"skipped {bad.relative_to(data_dir)}" in capsys.readouterr().err
    fresh.write_text("")
    assert compare.compare_run(fresh, GPU, data_dir) == ([], [f"leaderboard: {fresh}: empty file"])


def test_partial_leftovers_of_the_store_are_not_runs(tmp_path):
    data_dir = tmp_path / "data"
    good = _file(data_dir, _run({A: 1e-3}))
    _file(data_dir, '{"benchm', ".partial-x1y2.json")
    assert [rf.path for rf in store.run_files(data_dir)] == [good]
    assert gate.main(["--data-dir", str(data_dir)]) == 0


@pytest.mark.parametrize("section,device,words", [
    ("leaderbord", None, "unknown section 'leaderbord'"),  # a typo would be a new folder
    ("../../../x", None, "unknown section '../../../x'"),  # a file outside reports/
    ("fsdp", None, "not perf/test_fsdp.py"),  # leaderboard rows filed as fsdp
    ("leaderboard", "../../x", "is not a device folder name"),
])
def test_store_checks_section_and_device_names(section, device, words, tmp_path):
    run = tmp_path / "run.json"
    run.write_text(json.dumps(_run({A: 1e-3})))
    with pytest.raises(ValueError, match=re.escape(words)):
        store.store_run(run, section, tmp_path / "reports" / "data", device)
    assert _tree(tmp_path) == {"run.json": run.read_bytes()}


def test_gate_refuses_nonpositive_and_nan_medians_instead_of_judging_them(tmp_path):
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    for median in (float("nan"), -1e-3, 0.0):
        newest = _file(data_dir, _run({A: median, B: 1e-3}))
        verdict = gate.compare(data_dir)
        assert [e.where for e in verdict.bad_files] == [str(newest)]
        assert not any(c.verdict in ("within band", "faster") and c.row == A for c in verdict.changes)


ACCEPTED_BAD = {
    "not TOML": ("[[accepted]\nrow = 1", "not valid TOML"),
    "missing reason": ('[[accepted]]\ndevice = "d"\nsection = "s"\nrow = "r"\n', "entry 1 (row 'r'): 'reason' must be a non-empty string"),
    "a number as row": ('[[accepted]]\ndevice = "d"\nsection = "s"\nrow = 3\nreason = "x"\n', "'row' must be a non-empty string, got 3"),
    "unknown key": ('[[accepted]]\ndevice = "d"\nsection = "s"\nrow = "r"\nreason = "x"\nrun_id = "y"\n', "unknown key(s) ['run_id']"),
    "not a list": ('accepted = "all"\n', "'accepted' must be a list"),
    "stray table": ('[accept]\nrow = "r"\n', "unknown top-level key(s) ['accept']"),
}
BANDS_BAD = {
    "negative band": (f'["{GPU}"."leaderboard"]\n"{A}" = -0.05\n', f"[{GPU}.leaderboard] '{A}': a band is a relative spread > 0"),
    "a string band": (f'["{GPU}"."leaderboard"]\n"{A}" = "2%"\n', "got '2%'"),
    "a section that is not a table": (f'["{GPU}"]\nleaderboard = 0.02\n', f"[{GPU}.leaderboard] must be a table"),
    "not TOML": ('["h100"\n', "not valid TOML"),
}


@pytest.mark.parametrize("name,case", [("accepted-changes.toml", c) for c in ACCEPTED_BAD]
                         + [("noise-bands.toml", c) for c in BANDS_BAD])
def test_malformed_toml_is_named_with_its_entry(name, case, tmp_path, capsys):
    text, words = (ACCEPTED_BAD if name.startswith("accepted") else BANDS_BAD)[case]
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3}))
    (tmp_path / name).write_text(text)
    with pytest.raises(gate.ConfigError, match=re.escape(words)):
        gate.compare(data_dir)
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    assert str(tmp_path / name) in capsys.readouterr().err


def test_bands_need_two_runs_and_never_drop_existing_ones(tmp_path, capsys):
    data_dir = tmp_path / "data"
    bands = tmp_path / "noise-bands.toml"
    gate.write_bands(bands, GPU, "leaderboard", {B: 0.02, "test_leaderboard[old]": 0.03})
    before = bands.read_text()
    one = _file(data_dir, _run({A: 1.00e-3}), "r1.json")
    args = ["--data-dir", str(data_dir), "--device", GPU, "--section", "leaderboard", "--bands"]
    assert gate.main(args + [str(one)]) == 1 and "at least two different runs" in capsys.readouterr().err
    assert gate.main(args + [str(one), str(one)]) == 1
    assert bands.read_text() == before
    two = _file(data_dir, _run({A: 1.01e-3}, "2099-01-02T00:00:00+00:00"), "r2.json")
    assert gate.main(args + [str(one), str(two)]) == 0
    assert gate.read_bands(bands)[GPU]["leaderboard"] == {B: 0.02, "test_leaderboard[old]": 0.03,
                                                          A: pytest.approx(gate.MIN_BAND)}


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True)


def test_committed_baseline_is_read_from_git_head_not_the_working_tree(tmp_path):
    data_dir = tmp_path / "reports" / "data"
    _file(data_dir, _run({A: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "committed run")
    _file(data_dir, _run({A: 9e-3}))  # an uncommitted local make perf
    base = store.committed_baseline(GPU, data_dir)
    assert base.source == "git HEAD:reports/data"
    assert [b["stats"]["median"] for b in base.doc["benchmarks"]] == [1e-3]
    # outside a git checkout: the working tree, and the source says so
    shutil.rmtree(tmp_path / ".git")
    base = store.committed_baseline(GPU, data_dir)
    assert "not a git checkout" in base.source and [b["stats"]["median"] for b in base.doc["benchmarks"]] == [9e-3]


def _fake_config(root: Path, compare=True, histogram=()) -> SimpleNamespace:
    option = SimpleNamespace(benchmark_storage="file://./.benchmarks", benchmark_compare=compare,
                             benchmark_histogram=list(histogram))
    return SimpleNamespace(rootpath=root, option=option, getoption=lambda name, default=None: getattr(option, name, default))


def test_compare_baseline_from_any_folder_and_saved_runs_shadow_only_their_rows(tmp_path, monkeypatch):
    from pytest_benchmark.utils import get_machine_id

    committed = _run({A: 1e-3, B: 2e-3})
    monkeypatch.setattr(store, "committed_baseline",
                        lambda device, data_dir: store.Baseline(committed, "git HEAD:reports/data"))
    monkeypatch.setattr(store, "device_slug", lambda: GPU)
    saved = tmp_path / ".benchmarks" / get_machine_id()
    saved.mkdir(parents=True)
    (saved / "0001_x.json").write_text(json.dumps(_run({"test_flash_other[x]": 5e-3})))  # another section's autosave
    (saved / "0002_y.json").write_text(json.dumps(_run({B: 3e-3})))
    (tmp_path / "perf").mkdir()
    monkeypatch.chdir(tmp_path / "perf")
    config = _fake_config(tmp_path, histogram=["benchmark_20990101"])
    session = BenchSession(config)  # what the plugin's pytest_configure makes, not this run's
    session.pin_paths()
    assert config.option.benchmark_storage == f"file://{tmp_path / '.benchmarks'}"
    assert config.option.benchmark_histogram == [str(tmp_path / "out" / "histograms" / "benchmark_20990101")]
    assert json.loads((saved / "0000_committed.json").read_text()) == committed
    merged = json.loads(Path(config.option.benchmark_compare).read_text())
    assert Path(config.option.benchmark_compare).is_relative_to(tmp_path / "out")
    assert {b["name"]: b["stats"]["median"] for b in merged["benchmarks"]} == {
        A: 1e-3, B: 3e-3, "test_flash_other[x]": 5e-3}
    assert "shadowed row by row by the saved runs 0001_x, 0002_y" in session.pytest_report_header(config)[-1]
    config = _fake_config(tmp_path, compare="0000")  # a named run stays pytest-benchmark's choice
    BenchSession(config).pin_paths()
    assert config.option.benchmark_compare == "0000"


def test_compare_names_each_row_without_a_baseline(tmp_path, plugin):
    lines = []
    bs = SimpleNamespace(compare="x.json", benchmarks=[SimpleNamespace(fullname="p::a"), SimpleNamespace(fullname="p::b")],
                         compared_mapping={Path("x.json"): {"p::a": {}}})
    plugin.pytest_terminal_summary(SimpleNamespace(write_line=lines.append), SimpleNamespace(_benchmarksession=bs))
    assert lines == ["[bench] compare: no baseline for p::b", "[bench] compare: 1 of 2 timed rows compared"]


def test_failed_tests_are_recorded_in_the_run_json(monkeypatch):
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=()))
    session = BenchSession(config)
    session.pytest_runtest_logreport(SimpleNamespace(failed=True, nodeid="perf/test_x.py::t[a]", when="call"))
    session.pytest_runtest_logreport(SimpleNamespace(failed=False, nodeid="perf/test_x.py::t[b]", when="call"))
    out = {}
    session.pytest_benchmark_update_json(config, [], out)
    assert out["suite"]["failed"] == [dict(test="perf/test_x.py::t[a]", when="call")]
    assert store.Suite.from_json(out).failed == (store.FailedTest("perf/test_x.py::t[a]", "call"),)


def test_a_run_records_the_sent_commit_when_suite_commit_names_it(monkeypatch):
    """On a GPU machine git HEAD is the session's first commit (the tree sent since makes it dirty):
    SUITE_COMMIT, where set, is the run's commit, and the stamp names it."""
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=()))
    session = BenchSession(config)
    head = dict(id="93703375edf7cd01b7c543fd4f1f8b3f07dd7889", dirty=True, branch="main")
    kernels = kernel_digest(Path(__file__).resolve().parents[1]).to_json()  # this checkout's, beside the commit
    monkeypatch.delenv("SUITE_COMMIT", raising=False)
    out = dict(commit_info=dict(head), datetime="2026-11-26T09:04:53+00:00")
    session.pytest_benchmark_update_json(config, [], out)
    assert out["commit_info"] == dict(head, **kernels) and store.run_stamp(out) == "20261126T090453Z_93703375+"
    monkeypatch.setenv("SUITE_COMMIT", "36ed28e")
    out = dict(commit_info=dict(head), datetime="2026-11-26T09:04:53+00:00")
    session.pytest_benchmark_update_json(config, [], out)
    assert out["commit_info"] == dict(head, id="36ed28e", dirty=False, source="SUITE_COMMIT", git_head=head["id"],
                                      **kernels)
    assert store.run_stamp(out) == "20261126T090453Z_36ed28e"


def test_a_run_records_its_kernels_digest_and_the_report_reads_it(tmp_path, monkeypatch):
    """The kernels a run imported, beside its commit, read back as the rows' RunRef.kernels; a session
    outside a checkout (kernels None) records none, and its rows read None as older runs' do."""
    monkeypatch.delenv("SUITE_COMMIT", raising=False)
    config = SimpleNamespace(invocation_params=SimpleNamespace(args=()))
    for kernels in (KernelDigest("0123456789abcdef", "fedcba9876543210"), None):
        session = BenchSession(config)
        session.kernels = kernels
        out = dict(commit_info=dict(id="93703375edf7", dirty=False), datetime="2026-11-26T09:04:53+00:00",
                   machine_info={}, benchmarks=[])
        session.pytest_benchmark_update_json(config, [], out)
        out["not_run"] = [dict(name="test_x[a]", row=Row("x", {"a": 1}, Env("cpu", "cpu", "2", None, None, "smoke"),
                                                          Status.OOM, reason="out of memory").to_json())]
        [b] = report_data.load_doc(out, tmp_path / "cpu/x/20261126T090453Z_93703375.json", "cpu", "x")
        assert b.run.kernels == kernels and b.run.commit == "93703375"


def test_a_second_run_on_a_device_is_refused_naming_the_first_and_a_stale_lock_is_taken_over(tmp_path):
    first, second = runlock.RunLock(tmp_path, GPU), runlock.RunLock(tmp_path, GPU)
    first.acquire()
    with pytest.raises(runlock.DeviceBusy, match=re.escape(f"pid {first.me.pid} on {first.me.host}, started {first.me.started}")):
        second.acquire()
    first.release()
    second.acquire()
    second.release()
    assert not first.path.exists()
    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid is free now
    first.path.write_text(json.dumps(dict(vars(replace(first.me, pid=dead.pid)))))
    second.acquire()  # its holder is gone: stale
    assert second.holder() == second.me
    runlock.RunLock(tmp_path, "cpu").acquire()  # another device is another lock


@pytest.mark.parametrize("args,words", [
    (["stress", "N=abc"], "N must be a whole number from 1, got 'abc'"),
    (["stress", "N=0"], "got '0'"),
    (["perf", "SECTIONS="], "SECTIONS is empty"),
    (["perf", "SECTIONS=leaderbord"], "unknown section(s): leaderbord"),
    (["compare", "SECTIONS=ddp x"], "unknown section(s): x"),
])
def test_make_variables_are_checked_before_anything_runs(args, words):
    done = subprocess.run(["make", "-s", "-C", str(ROOT), *args, "PY=/bin/false"], capture_output=True, text=True)
    assert done.returncode == 2 and words in done.stderr


def test_each_make_perf_writes_its_own_run_folder():
    def run_dir() -> str:
        # OUT pinned: the environment's OUT (the GPU machine's device tool sets one) would be make's
        out = subprocess.run(["make", "-n", "-C", str(ROOT), "perf", "SECTIONS=leaderboard", "PY=python", "OUT=out"],
                             capture_output=True, text=True).stdout
        return re.search(r"--benchmark-json=(\S+)/\$s\.json", out).group(1)

    first, second = run_dir(), run_dir()
    assert first.startswith("out/runs/") and first != second


def test_make_compare_takes_the_newest_fresh_run_of_smoke_or_perf(tmp_path):
    import os

    smoke = _file(tmp_path / "out", _run({A: 1e-3}), "leaderboard.json", device="smoke").replace(
        tmp_path / "out" / "smoke" / "leaderboard.json")
    runs = tmp_path / "out" / "runs" / "20990101T000000Z-1" / "leaderboard.json"
    runs.parent.mkdir(parents=True)
    runs.write_text(smoke.read_text())
    os.utime(smoke, (1, 1))
    assert compare.newest_fresh(tmp_path / "out", "leaderboard") == runs
    os.utime(runs, (0, 0))
    assert compare.newest_fresh(tmp_path / "out", "leaderboard") == smoke
    assert compare.newest_fresh(tmp_path / "out", "fsdp") is None


def test_full_profile_on_a_cpu_is_refused(monkeypatch, plugin):
    monkeypatch.setenv("SUITE_PROFILE", "full")
    monkeypatch.setattr(plugin.torch.cuda, "is_available", lambda: False)
    with pytest.raises(pytest.UsageError, match="SUITE_PROFILE=full on a machine without a GPU"):
        plugin.check_profile()
    monkeypatch.setenv("SUITE_FULL_ON_CPU", "1")
    plugin.check_profile()


# --- hostile inputs, drawn by hypothesis: every answer is a document or a BadRunFile naming the file ---

_json = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                     lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                     max_leaves=12)
_stat = st.one_of(st.floats(), st.integers(-3, 3), st.none(), st.text(max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10_000), junk=_json, stats=st.dictionaries(st.sampled_from(store.STAT_KEYS + ("rounds",)), _stat),
       key=st.sampled_from(["benchmarks", "not_run", "suite", "datetime", "extra_info", "stats", "name"]))
def test_loader_and_store_answer_hostile_files_by_name(cut, junk, stats, key, tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile")
    doc = _run({A: 1e-3, B: 2e-3})
    bench = doc["benchmarks"][0]
    bench["stats"].update(stats)
    if key in ("extra_info", "stats", "name"):
        bench[key] = junk
    else:
        doc[key] = junk
    text = json.dumps(doc)
    for variant in (text, text[:cut % (len(text) + 1)]):
        path = folder / "leaderboard.json"
        path.write_text(variant)
        try:
            rows = report_data.load_file(path, GPU, "leaderboard")
        except store.BadRunFile as exc:
            assert exc.where == str(path) and exc.problems
            with pytest.raises(ValueError):
                store.store_run(path, "leaderboard", folder / "data")
            assert not (folder / "data").exists()
            continue
        for rec in rows:  # what loads is whole: finite positive medians, known statuses
            assert rec.stats is None or (math.isfinite(rec.stats.median) and rec.stats.median > 0)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(old=st.floats(allow_nan=True, allow_infinity=True), new=st.floats(allow_nan=True, allow_infinity=True))
def test_gate_never_passes_a_median_that_is_not_a_positive_number(old, new, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("gate") / "data"
    _file(data_dir, _run({A: old}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, _run({A: new}))
    verdict = gate.compare(data_dir)
    bad = [m for m in (old, new) if not (math.isfinite(m) and m > 0)]
    assert len(verdict.bad_files) == len(bad)
    if bad:
        assert not verdict.changes
    else:
        assert [c.regressed for c in verdict.changes] == [new / old > 1 + gate.DEFAULT_BAND["cuda"]]


def test_a_machine_info_warning_from_a_subfolder_is_a_warning_not_a_crash(plugin):
    # pytest-benchmark names its storage relative to the current folder and raises from perf/
    warned = []
    bs = SimpleNamespace(logger=SimpleNamespace(warning=warned.append), storage="/repo/.benchmarks")
    hook = plugin.pytest_benchmark_compare_machine_info(None, bs, {}, {})
    next(hook)
    with pytest.raises(StopIteration):
        hook.throw(ValueError("'/repo/.benchmarks' is not in the subpath of '/repo/perf'"))
    assert warned == ["Benchmark machine_info is different from the compared run's (storage /repo/.benchmarks)."]


def test_a_session_that_times_benchmarks_takes_the_device_lock_and_a_second_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(store, "device_slug", lambda: "cpu")
    config = SimpleNamespace(rootpath=tmp_path, _benchmarksession=SimpleNamespace(disabled=False, skip=False),
                             getoption=lambda name, default=None: default)
    session = BenchSession(config)
    untimed = SimpleNamespace(config=config, items=[SimpleNamespace(fixturenames=["device"])])
    session.pytest_collection_finish(untimed)  # correctness tests time nothing: no lock
    assert not (tmp_path / "out" / "locks" / "cpu.lock").exists()
    timed = SimpleNamespace(config=config, items=[SimpleNamespace(fixturenames=["bench", "benchmark"])])
    session.pytest_collection_finish(timed)
    held = json.loads((tmp_path / "out" / "locks" / "cpu.lock").read_text())
    assert held["pid"] == runlock.os.getpid()
    other = subprocess.Popen(["sleep", "30"])  # a live process holds the lock now
    try:
        (tmp_path / "out" / "locks" / "cpu.lock").write_text(json.dumps(dict(held, pid=other.pid, command="make perf")))
        session.lock = None  # a new run: the lock file is all it sees
        with pytest.raises(pytest.exit.Exception, match=f"refused: another suite run is timing on cpu: pid {other.pid}"):
            BenchSession(config).pytest_collection_finish(timed)
    finally:
        other.kill()
        other.wait()


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return json.dumps(v)


_toml_scalar = st.one_of(st.text(max_size=6), st.integers(-5, 5), st.floats(), st.booleans(),
                         st.lists(st.integers(0, 3), max_size=2))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(st.dictionaries(st.sampled_from(["device", "section", "row", "reason", "run", "why"]),
                                        _toml_scalar, max_size=6), max_size=3),
       bands=st.dictionaries(st.text("abc", min_size=1, max_size=3), _toml_scalar, max_size=3))
def test_gate_config_files_are_read_or_refused_by_name(entries, bands, tmp_path_factory):
    folder = tmp_path_factory.mktemp("toml")
    accepted, noise = folder / "accepted-changes.toml", folder / "noise-bands.toml"
    accepted.write_text("".join("[[accepted]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in e.items())
                                for e in entries))
    noise.write_text(f'["{GPU}"."leaderboard"]\n' + "".join(f'"{k}" = {_toml_value(v)}\n' for k, v in bands.items()))
    try:
        read = gate.read_accepted(accepted)
        assert all(a.reason.strip() and isinstance(a.row, str) for a in read)
    except gate.ConfigError as exc:
        assert str(accepted) in str(exc)
    try:
        for band in gate.read_bands(noise)[GPU]["leaderboard"].values():
            assert math.isfinite(band) and band > 0
    except gate.ConfigError as exc:
        assert str(noise) in str(exc)


# --- Issue 46: histories judged row by row, runs filed only where they belong ---

CPU_RUN = _run({A: 1e-3}) | dict(suite=dict(device_slug="cpu", interrupted=False, why=None, args=[], failed=[]))
for _bench_entry in CPU_RUN["benchmarks"]:
    _bench_entry["extra_info"]["env"].update(device="x86_64", device_type="cpu")


@pytest.mark.parametrize("doc,target,words", [
    (CPU_RUN, GPU, f"the run's own device is 'cpu', not '{GPU}'"),  # item 1: a CPU run given --device h100-80gb-x1
    (CPU_RUN | dict(suite={}), GPU, f"row {A}: env.device_type 'cpu', where a {GPU} run's is 'cuda'"),  # no slug of its own: its rows tell
    (_run({A: 1e-3}), "h200-141gb-x1", f"the run's own device is '{GPU}', not 'h200-141gb-x1'"),  # another GPU's
    (_run({A: 1e-3}), "cpu", f"the run's own device is '{GPU}', not 'cpu'; row {A}: env.device_type 'cuda', where a cpu run's is 'cpu'"),
])
def test_store_refuses_a_run_of_another_device_naming_both(doc, target, words, tmp_path, capsys):
    run = tmp_path / "leaderboard.json"
    run.write_text(json.dumps(doc))
    data_dir = tmp_path / "data"
    with pytest.raises(ValueError, match=re.escape(words)):
        store.store_run(run, "leaderboard", data_dir, device=target)
    assert store.main([str(run), "--section", "leaderboard", "--data-dir", str(data_dir), "--device", target]) == 1
    assert f"store: {run}: {words}" in capsys.readouterr().err
    assert not data_dir.exists()


def test_concurrent_stores_of_distinct_runs_stamped_in_one_second_all_land(tmp_path, monkeypatch):
    """Item 3: every store has written its run and reaches for the first free name at the same
    moment; each must land in a file of its own holding its own run."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    n, data_dir = 24, tmp_path / "data"
    barrier, write_partial = threading.Barrier(n), store._write_partial

    def then_wait(folder, doc):
        tmp = write_partial(folder, doc)
        barrier.wait(timeout=60)
        return tmp
    monkeypatch.setattr(store, "_write_partial", then_wait)
    runs = []
    for i in range(n):
        runs.append(tmp_path / f"leaderboard-{i}.json")
        runs[-1].write_text(json.dumps(_run({A: (i + 1) * 1e-3}, f"2099-01-01T00:00:00.{i:06d}+00:00")))
    with ThreadPoolExecutor(n) as pool:
        dests = list(pool.map(lambda run: store.store_run(run, "leaderboard", data_dir), runs))
    assert len(set(dests)) == n
    assert sorted(p.name for p in dests[0].parent.iterdir()) == sorted(p.name for p in dests)  # no leftovers
    for run, dest in zip(runs, dests):  # each success names the file that holds its run
        assert _doc(dest) == json.loads(run.read_text())


def test_concurrent_stores_of_one_run_keep_one_file(tmp_path, monkeypatch):
    import threading
    from concurrent.futures import ThreadPoolExecutor

    n, data_dir = 8, tmp_path / "data"
    barrier, write_partial = threading.Barrier(n), store._write_partial
    monkeypatch.setattr(store, "_write_partial", lambda folder, doc: (write_partial(folder, doc), barrier.wait(60))[0])
    run = tmp_path / "leaderboard.json"
    run.write_text(json.dumps(_run({A: 1e-3})))

    def attempt(_):
        try:
            return store.store_run(run, "leaderboard", data_dir)
        except ValueError as exc:
            return str(exc)
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(attempt, range(n)))
    kept = [r for r in results if isinstance(r, Path)]
    assert len(kept) == 1 and [p.name for p in kept[0].parent.iterdir()] == [kept[0].name]
    assert all(f"the same run is already stored as {kept[0]}" in r for r in results if r not in kept)


def test_stored_runs_and_test_records_are_world_readable(tmp_path):
    from impl.bench import test_record as tr

    run = tmp_path / "leaderboard.json"
    run.write_text(json.dumps(_run({A: 1e-3})))
    dest = store.store_run(run, "leaderboard", tmp_path / "data")
    rec = tr.TestRecord(device="cpu", datetime="2099-01-01T00:00:00+00:00", commit="c0ffee00", dirty=False,
                        source_digest="s", kernel_digest="k", command="pytest", passed=1, failed=0, errors=0,
                        skipped=0, duration_s=1.0)
    for path in (dest, tr.store_record(rec, tmp_path / "data")):
        assert path.stat().st_mode & 0o777 == 0o644, path


def _gate_errors(data_dir: Path, capsys) -> str:
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    return capsys.readouterr().err


@pytest.fixture
def regressed(tmp_path):
    """A folder whose second run made B 30% slower: what a later file must not hide."""
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    slow = _file(data_dir, _run({A: 1e-3, B: 1.3e-3}, "2098-06-01T00:00:00+00:00"), "20980601T000000Z_abcdef12.json")
    return data_dir, slow


def test_a_later_partial_run_does_not_hide_a_regression(regressed, capsys):
    """Item 2: a `-k` run of A alone, after the run that made B slower."""
    data_dir, slow = regressed
    _file(data_dir, _run({A: 1e-3}))
    err = _gate_errors(data_dir, capsys)
    assert f"REGRESSION {GPU}/leaderboard {B}: 1 -> 1.3 ms" in err
    change = next(c for c in gate.compare(data_dir).changes if c.row == B)
    assert (change.old_run, change.new_run) == ("20980101T000000Z_abcdef12", slow.stem)


def test_a_copy_of_the_regressed_run_is_ignored_by_name(regressed, capsys):
    data_dir, slow = regressed
    copy = _file(data_dir, slow.read_text())  # the same run, under a later name
    err = _gate_errors(data_dir, capsys)
    assert f"REGRESSION {GPU}/leaderboard {B}" in err
    assert f"gate: ignored {copy}: the same run as {slow}" in err
    assert [str(c) for c in report_data.load_stored(data_dir).copies] == [f"{copy}: the same run as {slow} (the same start time)"]


@pytest.mark.parametrize("misplaced,words", [
    (dict(_run({A: 1e-3, B: 1e-3}), benchmarks=[dict(_bench(n, 1e-3), fullname=f"perf/test_fsdp.py::{n}") for n in (A, B)]),
     f"row {A}: from 'perf/test_fsdp.py::{A}', not perf/test_leaderboard.py"),
    (CPU_RUN, f"the run's own device is 'cpu', not '{GPU}'"),
])
def test_a_file_of_another_section_or_device_fails_the_gate_and_hides_nothing(misplaced, words, regressed, capsys):
    data_dir, _ = regressed
    stray = _file(data_dir, misplaced)  # newest by name
    err = _gate_errors(data_dir, capsys)
    assert f"CORRUPT run file {stray}: " in err and words in err
    assert f"REGRESSION {GPU}/leaderboard {B}" in err  # judged without the stray file


def test_each_row_is_judged_against_its_own_previous_measurement(tmp_path):
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, _run({A: 2e-3}, "2098-06-01T00:00:00+00:00"), "20980601T000000Z_abcdef12.json")
    _file(data_dir, _run({B: 1.05e-3}))
    changes = {c.row: c for c in gate.compare(data_dir).changes}
    assert changes[A].ratio == pytest.approx(2) and changes[A].regressed
    assert changes[B].old_run == "20980101T000000Z_abcdef12" and not changes[B].regressed


def test_a_host_bound_row_is_judged_with_the_host_band_and_named(tmp_path, capsys):
    """The host's enqueue time (metric host_ms) at 80% of a row's newest median or more: the row times the host,
    judged within HOST_BOUND_BAND (2.5x); beyond it, or not host-bound now, the kernel band as before."""
    def doc(medians_hosts, when):
        d = _run({}, when)
        d["benchmarks"] = [_bench(n, m, h) for n, (m, h) in medians_hosts.items()]
        return d
    data_dir = tmp_path / "data"
    _file(data_dir, doc({A: (1e-3, 0.9), B: (1e-3, 0.1)}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, doc({A: (1.6e-3, 1.5), B: (1.6e-3, 0.1)}, "2098-06-01T00:00:00+00:00"), "20980601T000000Z_abcdef12.json")
    changes = {c.row: c for c in gate.compare(data_dir).changes}
    assert changes[A].host_bound and not changes[A].regressed
    assert changes[A].verdict == "host-bound: within its host band"
    assert not changes[B].host_bound and changes[B].regressed  # +60%, its device time: a regression
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    out, err = capsys.readouterr()
    assert f"REGRESSION {GPU}/leaderboard {B}" in err and A not in err
    assert "±10% (host-bound: ±150%)" in out and "host-bound: within its host band" in out
    # 2.6x: beyond what the host's speed explains, a regression even host-bound
    _file(data_dir, doc({A: (4.2e-3, 4.0)}, "2098-09-01T00:00:00+00:00"), "20980901T000000Z_abcdef12.json")
    change = next(c for c in gate.compare(data_dir).changes if c.row == A)
    assert change.host_bound and change.regressed and change.ratio == pytest.approx(4.2 / 1.6)
    assert "band ±150%, host-bound" in _gate_errors(data_dir, capsys)
    # host-bound in the previous measurement only: now the device's time, longer than the previous median, which was
    # at least the device's then: the kernel band
    _file(data_dir, doc({A: (8.0e-3, 0.5)}, "2098-12-01T00:00:00+00:00"), "20981201T000000Z_abcdef12.json")
    change = next(c for c in gate.compare(data_dir).changes if c.row == A)
    assert not change.host_bound and change.regressed


def test_rows_with_the_sm_clock_and_power_are_read_and_judged_as_any_row(tmp_path, capsys):
    """Kernel rows record the SM clock and board power their rounds ran at (Metric.SM_CLOCK_MHZ, POWER_W); a run
    with them after one without is read by the loader and judged by the gate on its medians alone, as any row."""
    def doc(medians, when, clock=None):
        d = _run(medians, when)
        for b in d["benchmarks"]:
            b["extra_info"]["metrics"] = dict(b["extra_info"].get("metrics") or {}, **(clock or {}))
        return d
    data_dir = tmp_path / "data"
    _file(data_dir, doc({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    new = _file(data_dir, doc({A: 1.02e-3, B: 1.3e-3}, "2099-01-01T00:00:00+00:00",
                              dict(sm_clock_mhz=1720.0, power_w=698.5)))
    rows = [r for r in report_data.load_rows(data_dir) if r.run.file == report_data.run_file_name(new)]
    assert len(rows) == 2
    assert {(r.metric(Metric.SM_CLOCK_MHZ), r.metric(Metric.POWER_W)) for r in rows} == {(1720.0, 698.5)}
    changes = {c.row: c for c in gate.compare(data_dir).changes}
    assert not changes[A].regressed and changes[B].regressed
    assert f"REGRESSION {GPU}/leaderboard {B}" in _gate_errors(data_dir, capsys)


def _config_case(tmp_path, name: str, text: str) -> Path:
    """Two stored runs, A and B in the first, A alone in the second; the config file `name` holds `text`."""
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, _run({A: 1e-3}))
    (tmp_path / name).write_text(text)
    return data_dir


def _accepted(**entry) -> str:
    entry = dict(device=GPU, section="leaderboard", row=A, reason="why") | entry
    return "[[accepted]]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in entry.items())


CONFIG_UNKNOWN = {  # item 5: typos in the gate's configuration
    "accepted: unknown section": ("accepted-changes.toml", _accepted(section="leaderbord"),
                                  f"entry 1 (row '{A}'): no stored {GPU} runs of section 'leaderbord' (sections: leaderboard)"),
    "accepted: unknown device": ("accepted-changes.toml", _accepted(device="h100-80gb"),
                                 f"no stored runs of device 'h100-80gb' (devices: {GPU})"),
    "accepted: unknown row": ("accepted-changes.toml", _accepted(row="test_leaderboard[flash_triton-fwd-bwd]"),
                              f"no row 'test_leaderboard[flash_triton-fwd-bwd]' in any stored {GPU}/leaderboard run"),
    "accepted: unknown run": ("accepted-changes.toml", _accepted(run="20990101T000000Z_abcdef13"),
                              f"no stored {GPU}/leaderboard run '20990101T000000Z_abcdef13'"),
    "accepted: a run without the row": ("accepted-changes.toml", _accepted(row=B, run="20990101T000000Z_abcdef12"),
                                        f"row '{B}' is not in the run '20990101T000000Z_abcdef12'"),
    "band: 1e9": ("noise-bands.toml", f'["{GPU}"."leaderboard"]\n"{A}" = 1e9\n',
                  f"[{GPU}.leaderboard] '{A}': a band is a relative spread > 0 and <= {gate.MAX_BAND}"),
    "band: unknown section": ("noise-bands.toml", f'["{GPU}"."flash_shape"]\n"{A}" = 0.05\n',
                              f"[{GPU}.flash_shape]: no stored {GPU} runs of section 'flash_shape'"),
    "band: unknown row": ("noise-bands.toml", f'["{GPU}"."leaderboard"]\n"{A}x" = 0.05\n',
                          f"[{GPU}.leaderboard] '{A}x': no row '{A}x'"),
}


@pytest.mark.parametrize("case", CONFIG_UNKNOWN)
def test_gate_configuration_must_name_what_is_stored(case, tmp_path, capsys):
    name, text, words = CONFIG_UNKNOWN[case]
    data_dir = _config_case(tmp_path, name, text)
    with pytest.raises(gate.ConfigError, match=re.escape(words)):
        gate.compare(data_dir)
    err = _gate_errors(data_dir, capsys)
    assert f"gate: {tmp_path / name}: " in err


def test_accepted_entry_naming_the_run_and_row_is_read(tmp_path):
    data_dir = _config_case(tmp_path, "accepted-changes.toml", _accepted(run="20990101T000000Z_abcdef12"))
    assert gate.compare(data_dir).changes[0].accepted == "why"


def test_bands_refuse_two_copies_of_one_run_and_rows_of_another_section(tmp_path, capsys):
    data_dir = tmp_path / "data"
    bands = tmp_path / "noise-bands.toml"
    one = _file(data_dir, _run({A: 1.00e-3}), "r1.json")
    copy = _file(data_dir, one.read_text(), "r1-copy.json")
    two = _file(data_dir, _run({A: 1.01e-3}, "2099-01-02T00:00:00+00:00"), "r2.json")
    args = ["--data-dir", str(data_dir), "--device", GPU, "--bands"]
    assert gate.main(args + [str(one), str(copy), "--section", "leaderboard"]) == 1
    assert f"{copy} and {one} are the same run" in capsys.readouterr().err
    assert gate.main(args + [str(one), str(two), "--section", "flash_shapes"]) == 1
    assert f"row {A}: from 'perf/test_leaderboard.py::{A}', not perf/test_flash_shapes.py" in capsys.readouterr().err
    assert gate.main(args + [str(one), str(two), "--device", "cpu", "--section", "leaderboard"]) == 1
    assert f"the run's own device is '{GPU}', not 'cpu'" in capsys.readouterr().err
    assert not bands.exists()


def test_bands_from_runs_that_differ_wildly_are_refused(tmp_path, capsys):
    data_dir = tmp_path / "data"
    one = _file(data_dir, _run({A: 1e-3}), "r1.json")
    two = _file(data_dir, _run({A: 9e-3}, "2099-01-02T00:00:00+00:00"), "r2.json")
    with pytest.raises(ValueError, match=re.escape(f"bands beyond {gate.MAX_BAND} (the runs were not identical): {A} 12.00")):
        gate.measure_bands([one, two], GPU, "leaderboard")


def test_compare_judges_each_row_against_its_own_newest_committed_record(tmp_path):
    """A later partial committed run (A alone) does not hide B's status change."""
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3, B: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, _run({A: 1e-3}))
    fresh = tmp_path / "leaderboard.json"
    fresh.write_text(json.dumps(dict(_run({A: 1e-3}), not_run=[dict(
        name=B, fullname=f"perf/test_leaderboard.py::{B}", group="leaderboard", row=_row(Status.OOM))])))
    rows, problems = compare.compare_run(fresh, GPU, data_dir)
    assert problems == [f"leaderboard: {B} was measured in 20980101T000000Z_abcdef12, now oom"]
    assert [r[1:4] for r in rows] == [[A, "measured", "measured"], [B, "measured", "oom"]]


def test_compare_refuses_a_fresh_run_of_another_device(tmp_path):
    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3}))
    fresh = tmp_path / "leaderboard.json"
    fresh.write_text(json.dumps(CPU_RUN))
    rows, problems = compare.compare_run(fresh, GPU, data_dir)
    assert not rows and problems == [f"leaderboard: {fresh}: the run's own device is 'cpu', not '{GPU}'; "
                                     f"row {A}: env.device_type 'cpu', where a {GPU} run's is 'cuda'"]


def test_the_report_warns_once_of_a_skipped_file(tmp_path, capsys):
    from impl.report import build

    data_dir = tmp_path / "data"
    _file(data_dir, _run({A: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    bad = _file(data_dir, "{")
    build.context(data_dir, tmp_path / "reports")
    assert capsys.readouterr().err.count(f"warning: skipped {bad}") == 1


# --- packed runs: new runs are stored as .json.gz; plain .json ones (filed before) read the same way ---

def test_a_plain_and_a_packed_run_read_alike_by_every_reader(tmp_path):
    data_dir = tmp_path / "reports" / "data"
    old = _file(data_dir, _run({A: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    new = _file(data_dir, _run({A: 2e-3}), packed=True)
    assert new.name == "20990101T000000Z_abcdef12.json.gz"
    assert [(rf.path, rf.stamp) for rf in store.run_files(data_dir)] == [(old, "20980101T000000Z_abcdef12"),
                                                                          (new, "20990101T000000Z_abcdef12")]
    assert store.read_run(new, "leaderboard", GPU) == _run({A: 2e-3})
    files = [r.run.file for r in report_data.load_rows(data_dir)]
    assert files == [report_data.run_file_name(old), report_data.run_file_name(new)] and files[1].endswith(".json.gz")
    assert [c.new_run for c in gate.compare(data_dir).changes] == ["20990101T000000Z_abcdef12"]
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "runs in both forms")
    runs, skipped, _ = store.committed_runs(GPU, data_dir)
    assert [(rf.path, doc) for rf, doc in runs] == [(old, store.read_run(old)), (new, store.read_run(new))]
    assert not skipped and store.committed_baseline(GPU, data_dir).doc["benchmarks"][0]["stats"]["median"] == 2e-3


def test_one_run_name_in_both_forms_is_refused_naming_both(tmp_path, capsys):
    data_dir = tmp_path / "reports" / "data"
    plain = _file(data_dir, _run({A: 1e-3}))
    packed = _file(data_dir, _run({A: 1e-3}), packed=True)
    for path in (plain, packed):
        words = f"{path}: one run name in both forms, {path.name} and {store.twin(path).name}"
        with pytest.raises(store.BadRunFile, match=re.escape(words)):
            store.read_run(path)
    assert gate.main(["--data-dir", str(data_dir)]) == 1
    err = capsys.readouterr().err
    assert f"CORRUPT run file {plain}: " in err and f"CORRUPT run file {packed}: " in err
    assert report_data.load_rows(data_dir) == []  # neither is picked
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "a run in both forms")
    runs, skipped, _ = store.committed_runs(GPU, data_dir)
    assert runs == [] and len(skipped) == 2 and all(plain.name in s and packed.name in s for s in skipped)
    with pytest.raises(ValueError, match=re.escape(packed.name)):  # the migration will not pack it over the other
        store.pack_file(plain)
    # the store never claims a name whose other form is there: this run lands under the next name
    other = tmp_path / "leaderboard.json"
    other.write_text(json.dumps(_run({A: 1e-3}, "2099-01-01T00:00:00.5+00:00")))
    assert store.store_run(other, "leaderboard", data_dir, GPU).name == "20990101T000000Z_abcdef12_2.json.gz"


def test_a_stored_run_is_packed_the_same_bytes_every_time(tmp_path):
    run = tmp_path / "leaderboard.json"
    run.write_text(json.dumps(_run({A: 1e-3})))
    one, two = (store.store_run(run, "leaderboard", tmp_path / d, GPU) for d in ("a", "b"))
    raw = one.read_bytes()
    assert one.name == two.name == "20990101T000000Z_abcdef12.json.gz" and raw == two.read_bytes()
    # gzip's header: no file name (FLG 0), mtime 0, the fixed level's XFL (2: best); the text is the plain form's
    assert raw[:10] == bytes([0x1F, 0x8B, 8, 0, 0, 0, 0, 0, 2, 0xFF])
    assert gzip.decompress(raw) == json.dumps(_run({A: 1e-3}), indent=2).encode()
    # a packed run given to the store (its section from its name) is filed as the same bytes
    again = tmp_path / "leaderboard-again.json.gz"
    again.write_bytes(raw)
    assert store.main([str(again), "--data-dir", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / GPU / "leaderboard" / one.name).read_bytes() == raw


def _plant_data(data_dir: Path) -> dict[str, bytes]:
    """Two plain runs, a probe, a log and a test record (only the runs are packed); their bytes."""
    _file(data_dir, _run({A: 1e-3}, "2098-01-01T00:00:00+00:00"), "20980101T000000Z_abcdef12.json")
    _file(data_dir, json.dumps(_run({A: 2e-3}), indent=1) + "\n")
    for other in ("probes/p.json", "logs/x.json", "tests/20990101T000000Z_abcdef12.json"):
        (data_dir / GPU / other).parent.mkdir(parents=True, exist_ok=True)
        (data_dir / GPU / other).write_text("{}")
    return _tree(data_dir)


def test_compress_packs_each_plain_run_in_place_to_its_exact_bytes(tmp_path, capsys):
    data_dir = tmp_path / "data"
    before = _plant_data(data_dir)
    rows = report_data.load_rows(data_dir)
    args = ["compress", "--data-dir", str(data_dir)]
    assert store.main([*args, "--dry-run"]) == 0 and _tree(data_dir) == before
    assert "would pack 2 runs" in capsys.readouterr().out
    assert store.main([*args, "--min-kib", "1000"]) == 0 and _tree(data_dir) == before  # none that large
    assert store.main(args) == 0
    out = capsys.readouterr().out
    assert f"packed {GPU}/leaderboard/20990101T000000Z_abcdef12.json: " in out and "packed 2 runs" in out
    after = _tree(data_dir)
    runs = [k for k in before if "/leaderboard/" in k]
    assert sorted(after) == sorted([k for k in before if k not in runs] + [k + ".gz" for k in runs])
    assert all(gzip.decompress(after[k + ".gz"]) == before[k] for k in runs)
    assert all(after[k] == before[k] for k in before if k not in runs)  # probes, logs, tests as they were
    assert [replace(r, run=replace(r.run, file=r.run.file.removesuffix(".gz"))) for r in
            report_data.load_rows(data_dir)] == rows  # the same rows, their files named with .gz
    assert store.main(args) == 0 and _tree(data_dir) == after  # nothing left to pack


def test_compress_refuses_a_packed_copy_that_does_not_unpack_to_the_file(tmp_path, monkeypatch, capsys):
    data_dir = tmp_path / "data"
    before = _plant_data(data_dir)
    real = store.encode_run
    monkeypatch.setattr(store, "encode_run", lambda raw: real(raw.replace(b"0.002", b"0.003")))
    newer = data_dir / GPU / "leaderboard" / "20990101T000000Z_abcdef12.json"
    with pytest.raises(ValueError, match=re.escape(f"{newer}: its packed copy unpacks to")):
        store.pack_file(newer)
    assert _tree(data_dir) == before  # no .gz, no partial file, the original as it was
    assert store.main(["compress", "--data-dir", str(data_dir)]) == 1
    assert f"store compress: {newer}: its packed copy" in capsys.readouterr().err
    packed_first = f"{GPU}/leaderboard/20980101T000000Z_abcdef12.json"  # unchanged by the edit: packed
    assert _tree(data_dir) == {(k + ".gz" if k == packed_first else k): (real(v) if k == packed_first else v)
                               for k, v in before.items()}
