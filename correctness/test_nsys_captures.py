"""The captures branch (impl.nsys.captures): Nsight Systems captures stored on a branch of their own with git
plumbing, never through the working tree or the index; and main's tracked tree holding none of them."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from impl.nsys import captures as C

ROOT = Path(__file__).resolve().parents[1]
RUN = "reports/data/h200-141gb-x2/nsys/20261126T090839Z_abcdef1"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit on main and a file staged but not committed."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.name", "t"), _git(r, "config", "user.email", "t@example.com")
    (r / "README").write_text("main\n")
    _git(r, "add", "README"), _git(r, "commit", "-q", "-m", "first")
    (r / "staged.txt").write_text("staged\n")
    _git(r, "add", "staged.txt")
    return r


def _state(r: Path) -> tuple[str, str, str, list[str]]:
    """HEAD, the index's tree, `git status`, the files on disk: what add_files must leave as they were."""
    return (_git(r, "rev-parse", "HEAD"), _git(r, "write-tree"), _git(r, "status", "--porcelain"),
            sorted(p.relative_to(r).as_posix() for p in r.rglob("*") if ".git" not in p.parts))


def test_the_first_add_creates_the_branch_with_the_files_at_their_paths_and_touches_nothing_else(repo, tmp_path):
    rep, gz = tmp_path / "a.nsys-rep", tmp_path / "a.sqlite.gz"
    rep.write_bytes(b"rep\x00bytes"), gz.write_bytes(b"\x1f\x8bgz")
    before = _state(repo)
    assert C.head(repo) is None and C.stored(repo, f"{RUN}/rep/a.nsys-rep") is None and C.listed(repo, RUN) == []
    commit = C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": rep, f"{RUN}/sqlite/a.sqlite.gz": gz}, f"captures of {RUN}")
    assert _state(repo) == before
    assert C.head(repo) == commit and _git(repo, "rev-list", "--count", C.BRANCH) == "1"
    assert _git(repo, "log", "-1", "--format=%s", C.BRANCH) == f"captures of {RUN}"
    assert C.listed(repo, RUN) == [f"{RUN}/rep/a.nsys-rep", f"{RUN}/sqlite/a.sqlite.gz"]
    assert C.stored(repo, f"{RUN}/rep/a.nsys-rep") == f"captures:{RUN}/rep/a.nsys-rep"
    assert C.read_bytes(repo, f"{RUN}/rep/a.nsys-rep") == b"rep\x00bytes"
    assert C.stored(repo, repo / RUN / "sqlite" / "a.sqlite.gz") == f"captures:{RUN}/sqlite/a.sqlite.gz"
    # the branch holds the captures alone, not main's files
    assert _git(repo, "ls-tree", "-r", "--name-only", C.BRANCH).split() == C.listed(repo, RUN)


def test_a_second_add_is_a_child_commit_keeping_the_first_files(repo, tmp_path):
    (tmp_path / "a").write_bytes(b"a"), (tmp_path / "b").write_bytes(b"b")
    first = C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "one")
    before = _state(repo)
    second = C.add_files(repo, {f"{RUN}/rep/b.nsys-rep": tmp_path / "b"}, "two")
    assert _state(repo) == before
    assert _git(repo, "rev-parse", f"{second}^") == first and C.head(repo) == second
    assert C.listed(repo, f"{RUN}/rep") == [f"{RUN}/rep/a.nsys-rep", f"{RUN}/rep/b.nsys-rep"]
    assert C.read_bytes(repo, f"{RUN}/rep/a.nsys-rep") == b"a"


def test_errors_name_what_is_wrong(repo, tmp_path):
    (tmp_path / "a").write_bytes(b"a")
    with pytest.raises(C.CapturesError, match="not inside a git repository"):
        C.repo_root(tmp_path / "elsewhere" / "x")
    with pytest.raises(C.CapturesError, match="no such file"):
        C.add_files(repo, {f"{RUN}/rep/x.nsys-rep": tmp_path / "missing"}, "m")
    with pytest.raises(C.CapturesError, match="not a path inside"):
        C.add_files(repo, {"../x": tmp_path / "a"}, "m")
    with pytest.raises(C.CapturesError, match="outside the repository"):
        C.stored(repo, tmp_path / "a")
    with pytest.raises(C.CapturesError, match="not stored"):
        C.read_bytes(repo, f"{RUN}/rep/a.nsys-rep")
    C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "m")
    with pytest.raises(C.CapturesError, match="never rewritten"):
        C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "again")
    assert _git(repo, "rev-list", "--count", C.BRANCH) == "1"


def test_a_branch_moved_during_an_add_is_refused(repo, tmp_path, monkeypatch):
    """Two adds at once: the one that finds the ref moved since it read it fails and leaves the ref as it is."""
    (tmp_path / "a").write_bytes(b"a"), (tmp_path / "b").write_bytes(b"b")
    first = C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "one")
    real_head = C.head
    monkeypatch.setattr(C, "head", lambda r, branch=C.BRANCH: _git(r, "rev-parse", "HEAD"))  # a stale view
    with pytest.raises(C.CapturesError, match="moved while adding"):
        C.add_files(repo, {f"{RUN}/rep/b.nsys-rep": tmp_path / "b"}, "two")
    assert real_head(repo) == first



def test_mains_tracked_tree_holds_no_captures():
    """The device tool copies the tracked tree (64 MiB at most): the captures live on the captures branch."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.nsys-rep", "*.sqlite.gz"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    assert r.stdout.split() == []
