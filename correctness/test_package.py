"""The package as a user installs it (issue 46, items 6-8): the wheel holds every file the package
reads, requires-python names the Python the code needs, and each CLI works on the repository it is
run in (or on --root), refuses where there is none, answers --help without doing anything, and
never writes outside the repository, also installed from the wheel (not editable) into a venv."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from importlib.util import find_spec
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from impl.bench import store, test_record
from impl.report import build, compare, gate

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "impl"
# every CLI: (module, its main, arguments that would make it work, without --root)
CLIS = {
    "impl.report": (build.main, []),
    "impl.report.gate": (gate.main, []),
    "impl.report.compare": (compare.main, ["leaderboard"]),
    "impl.bench.store": (store.main, ["run.json", "--section", "leaderboard"]),
    "impl.bench.test_record": (test_record.main, ["--file", "record.json"]),
}
WANTED = "reports/data/ and pyproject.toml"  # what a CLI looks for (impl.bench.repo.MARKERS)


def _tree(folder: Path, skip: tuple[str, ...] = ("__pycache__",)) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not any(s in p.parts for s in skip)}


def _newest(device: str, section: str, n: int = 1) -> list[Path]:
    runs = [rf.path for rf in store.run_files(ROOT / "reports" / "data")
            if (rf.device, rf.section) == (device, section)]
    if len(runs) < n:
        pytest.skip(f"fewer than {n} committed {device}/{section} runs")
    return runs[-n:]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True,
                   capture_output=True, timeout=60)


def _small_repo(root: Path) -> Path:
    """A repository of the suite with the least in it: pyproject.toml, one perf file (the section
    list), the newest two committed H100 leaderboard runs and the newest CPU one, committed to git
    (compare reads git's HEAD), and a fresh CPU run under out/smoke/ as `make smoke` leaves it."""
    (root / "perf").mkdir(parents=True)
    (root / "perf" / "test_leaderboard.py").write_text("")
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    for device, n in (("h100-80gb-x1", 2), ("cpu", 1)):
        folder = root / "reports" / "data" / device / "leaderboard"
        folder.mkdir(parents=True)
        for run in _newest(device, "leaderboard", n):
            shutil.copy(run, folder / run.name)
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "a small repository")
    fresh = json.loads(store.read_run_text(_newest("cpu", "leaderboard")[0]))
    fresh["datetime"] = "2099-01-01T00:00:00+00:00"
    (root / "out" / "smoke").mkdir(parents=True)
    (root / "out" / "smoke" / "leaderboard.json").write_text(json.dumps(fresh))
    return root


# ------------------------------------------------------------- in this checkout
@pytest.mark.parametrize("module", CLIS)
def test_each_cli_outside_a_repository_refuses_naming_what_it_looked_for(module, tmp_path, monkeypatch, capsys):
    main, args = CLIS[module]
    (tmp_path / "reports").mkdir()  # a reports/ folder alone (another project's) is no repository
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert f"no folder at or above {tmp_path.resolve()} holds {WANTED}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--root", str(tmp_path)])
    assert f"--root {tmp_path}: not the suite's repository (it needs {WANTED})" in capsys.readouterr().err
    assert _tree(tmp_path) == {}


@pytest.mark.parametrize("module", CLIS)
def test_each_cli_answers_help_and_does_nothing_else(module, tmp_path, monkeypatch, capsys):
    main, _ = CLIS[module]
    repo = tmp_path / "repo"
    (repo / "reports" / "data").mkdir(parents=True)
    (repo / "pyproject.toml").write_text("")
    (repo / "reports" / "stale.md").write_text("a page the report would delete")
    monkeypatch.chdir(repo)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:") and "--root" in out
    assert _tree(tmp_path) == {"repo/pyproject.toml": b"", "repo/reports/stale.md": b"a page the report would delete"}


def test_the_torchrun_worker_entry_answers_help(capsys):
    from impl.distributed import run_worker

    run_worker.main(["--help"])  # once "usage: ..." as an error: no function named
    assert "torchrun --nproc-per-node 2 -m impl.distributed.run_worker" in capsys.readouterr().out


def test_the_report_builds_the_repository_it_is_run_in_from_a_subfolder(tmp_path, monkeypatch):
    repo = _small_repo(tmp_path / "repo")
    (repo / "reports" / "figures").mkdir()
    (repo / "reports" / "figures" / "orphan.png").write_bytes(b"\x89PNG")
    monkeypatch.chdir(repo / "perf")
    assert build.main([]) == 0
    assert (repo / "reports" / "README.md").exists() and not (repo / "reports" / "figures" / "orphan.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]


def test_requires_python_is_the_python_the_code_needs():
    """tomllib and enum.StrEnum are 3.11's: pip must not install the package on 3.10."""
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.10.14" not in spec and "3.11.0" in spec and sys.version_info >= (3, 11)


# ------------------------------------------------------------- the wheel, installed into a venv
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built offline (no index, the installed setuptools) from a copy, so
    the build leaves nothing (build/, *.egg-info) in the checkout."""
    if not (find_spec("setuptools") and (find_spec("setuptools.command.bdist_wheel") or find_spec("wheel"))):
        pytest.skip("building the wheel offline needs setuptools >= 70.1 (or setuptools and wheel) installed")
    work = tmp_path_factory.mktemp("wheel")
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(work / "dist"), str(work)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (found,) = (work / "dist").glob("*.whl")
    return found


def test_the_wheel_holds_every_file_the_package_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert "impl/report/templates/figures.toml" in data  # the words drawn into the figures
    assert sorted(data - names) == []
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A venv with the wheel installed (not editable) by pip. Its other packages (torch, matplotlib...)
    are this interpreter's, named in a .pth file: nothing is downloaded or copied."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    (purelib / "outer-site-packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
    out = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return venv


def _run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # conftest exports src/: not here
    return subprocess.run([str(venv / "bin" / "python"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_installed_clis_work_on_the_repository_they_run_in_and_write_nowhere_else(venv, tmp_path):
    repo = _small_repo(tmp_path / "repo")
    lib = next((venv / "lib").glob("python3*"))
    # where the CLIs once took the repository to be (Path(__file__).parents[3] of an installed
    # module): a report built there deleted the pages and figures it found
    decoy = lib / "reports"
    (decoy / "figures").mkdir(parents=True)
    (decoy / "mine.md").write_text("not the report's")
    (decoy / "figures" / "mine.png").write_bytes(b"\x89PNG")
    venv_before = _tree(venv)
    where = _run(venv, tmp_path, "-c", "import impl; print(impl.__file__)")
    assert Path(where.stdout.strip()).is_relative_to(lib), where.stderr  # the installed copy, not src/

    for module in CLIS:
        before = _tree(repo)
        done = _run(venv, repo, "-m", module, "--help")
        assert done.returncode == 0 and done.stdout.startswith("usage:"), (module, done.stderr[-2000:])
        assert _tree(repo) == before, module

    done = _run(venv, repo / "perf", "-m", "impl.report.gate", "--all")  # from a subfolder: every row shown
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "h100-80gb-x1" in done.stdout
    done = _run(venv, repo, "-m", "impl.report.compare", "--out", "out", "leaderboard")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    done = _run(venv, tmp_path, "-m", "impl.bench.store", str(repo / "out/smoke/leaderboard.json"),
                "--section", "leaderboard", "--root", str(repo))
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((repo / "reports/data/cpu/leaderboard").glob("2099*.json.gz"))) == 1  # stored packed
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()  # test_record --file refuses a commit the repository lacks
    record = dict(device="cpu", datetime="2099-01-01T00:00:00+00:00", commit=head, dirty=False,
                  source_digest="s", kernel_digest="k", command="pytest correctness", passed=3, failed=0, errors=0,
                  skipped=0, duration_s=1.0, failures=[])
    (repo / "out" / "record.json").write_text(json.dumps(record))
    done = _run(venv, repo, "-m", "impl.bench.test_record", "--file", "out/record.json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert len(list((repo / "reports/data/cpu/tests").glob("*.json"))) == 1
    done = _run(venv, repo, "-m", "impl.report")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "leaderboard" in (repo / "reports" / "README.md").read_text()

    outside = _run(venv, tmp_path, "-m", "impl.report")  # tmp_path holds the repository, is none
    assert outside.returncode == 2 and WANTED in outside.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["repo"]
    assert _tree(venv) == venv_before  # the decoy's page and figure included
