"""Histories and the regression gate (impl.bench.store, impl.report.gate, impl.report.compare) on
copies of committed runs in a temporary data folder."""
import json
import shutil
from pathlib import Path

import pytest

from impl.bench import store
from impl.report import compare, gate

DATA = Path(__file__).resolve().parents[1] / "reports" / "data"
OURS = "test_leaderboard[flash_triton-fwd_bwd]"


def _newest_schema2(device: str, section: str) -> Path:
    runs = [rf.path for rf in store.run_files(DATA) if rf.device == device and rf.section == section
            and any(b.get("extra_info", {}).get("schema") == 2 for b in json.loads(rf.path.read_text())["benchmarks"])]
    if not runs:
        pytest.skip(f"no schema-2 {device}/{section} run committed")
    return runs[-1]


def _later_copy(src: Path, slower: dict[str, float], datetime: str) -> dict:
    doc = json.loads(src.read_text())
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
        f'run = "{dest.stem}"\nreason = "a test of the gate"\n')
    assert gate.main(["--data-dir", str(data_dir)]) == 0
    assert "accepted: a test of the gate" in capsys.readouterr().out


def test_gate_acceptance_for_another_run_does_not_carry_over(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    _store(_later_copy(src, {OURS: 1.3}, "2099-01-01T00:00:00+00:00"), tmp_path, data_dir)
    (data_dir.parent / "accepted-changes.toml").write_text(
        f'[[accepted]]\ndevice = "h100-80gb-x1"\nsection = "leaderboard"\nrow = "{OURS}"\n'
        'run = "20000101T000000Z_00000000"\nreason = "an older change"\n')
    assert gate.main(["--data-dir", str(data_dir)]) == 1


def test_gate_within_band_and_measured_bands(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    _store(_later_copy(src, {OURS: 1.01}, "2099-01-01T00:00:00+00:00"), tmp_path, data_dir)
    changes = gate.compare(data_dir).changes
    assert {c.row for c in changes} >= {OURS} and not any(c.regressed for c in changes)
    runs = sorted((data_dir / "h100-80gb-x1" / "leaderboard").glob("*.json"))
    bands = gate.measure_bands(runs, "h100-80gb-x1", "leaderboard")
    assert bands[OURS] == pytest.approx(max(gate.MIN_BAND, gate.BAND_SAFETY * 0.01))
    gate.write_bands(data_dir.parent / "noise-bands.toml", "h100-80gb-x1", "leaderboard", {OURS: 0.005})
    _store(_later_copy(src, {OURS: 1.02}, "2099-01-02T00:00:00+00:00"), tmp_path, data_dir)
    assert [c.row for c in gate.compare(data_dir).changes if c.regressed] == [OURS]  # 2% is beyond its own 0.5% band


def test_store_never_overwrites_and_refuses_interrupted_runs(h100_leaderboard, tmp_path):
    data_dir, src = h100_leaderboard
    doc = json.loads(src.read_text())
    doc["datetime"] = "2099-01-01T00:00:00.000001+00:00"
    first = _store(doc, tmp_path, data_dir)
    before = sorted(p.name for p in (data_dir / "h100-80gb-x1" / "leaderboard").iterdir())
    with pytest.raises(ValueError, match=f"the same run is already stored as .*{first.name}"):
        _store(doc, tmp_path, data_dir)  # filed twice (two make perf sharing one output): refused
    doc["suite"] = dict(interrupted=True, why="KeyboardInterrupt")
    with pytest.raises(ValueError, match="interrupted"):
        _store(doc, tmp_path, data_dir)
    assert sorted(p.name for p in (data_dir / "h100-80gb-x1" / "leaderboard").iterdir()) == before
    # another run stamped in the same second is kept, under a name that sorts after the first
    doc["suite"], doc["datetime"] = {}, "2099-01-01T00:00:00.000002+00:00"
    second = _store(doc, tmp_path, data_dir)
    assert second.name.startswith(first.stem + "_") and sorted([second, first]) == [first, second]
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
    doc = json.loads(src.read_text())
    fresh.write_text(json.dumps(doc))
    rows, problems = compare.compare_run(fresh, "cpu", data_dir)
    assert rows and not problems
    gone = doc["benchmarks"].pop(0)["name"]
    fresh.write_text(json.dumps(doc))
    rows, problems = compare.compare_run(fresh, "cpu", data_dir)
    assert problems == [f"leaderboard: {gone} was measured in {src.stem}, now absent"]
