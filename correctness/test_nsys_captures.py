"""Captures kept in the branch's history (impl.nsys.captures): each add is a commit holding them and a child taking
them out of the tree again, with git plumbing alone, never through the working tree or the index; the committed
run folders' records (CAPTURES.json) naming files this repository's history holds; and main's tracked tree holding
none of them."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from impl.nsys import captures as C
from impl.report.pages._nsys import SHORT

ROOT = Path(__file__).resolve().parents[1]
RUN = "reports/data/h200-141gb-x2/nsys/20261126T090839Z_abcdef1"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A git repository with one commit on main, a file staged but not committed and one changed but not staged."""
    r = tmp_path / "repo"
    r.mkdir()
    _git(r, "init", "-q", "-b", "main")
    _git(r, "config", "user.name", "t"), _git(r, "config", "user.email", "t@example.com")
    (r / "README").write_text("main\n")
    _git(r, "add", "README"), _git(r, "commit", "-q", "-m", "first")
    (r / "staged.txt").write_text("staged\n")
    _git(r, "add", "staged.txt")
    (r / "README").write_text("changed\n")
    return r


def _state(r: Path) -> tuple[str, str, str, list[str]]:
    """HEAD's tree, the index's tree, `git status`, the files on disk: what add_files must leave as they were."""
    return (_git(r, "rev-parse", "HEAD^{tree}"), _git(r, "write-tree"), _git(r, "status", "--porcelain"),
            sorted(p.relative_to(r).as_posix() for p in r.rglob("*") if ".git" not in p.parts))


def test_an_add_keeps_the_files_in_one_commit_and_takes_them_out_of_the_tree_in_the_next(repo, tmp_path):
    rep, gz = tmp_path / "a.nsys-rep", tmp_path / "a.sqlite.gz"
    rep.write_bytes(b"rep\x00bytes"), gz.write_bytes(b"\x1f\x8bgz")
    head, before = _git(repo, "rev-parse", "HEAD"), _state(repo)
    assert C.stored(repo, f"{RUN}/rep/a.nsys-rep") is None
    kept = C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": rep, f"{RUN}/sqlite/a.sqlite.gz": gz}, f"captures of {RUN}")
    # the tree, the index (the staged file still staged), the working tree (the unstaged change) as they were
    assert _state(repo) == before and "A  staged.txt" in before[2] and "M README" in before[2]
    # main moved two commits: A (HEAD's tree + the files), then B (HEAD's tree again), each a child of the last
    now = _git(repo, "rev-parse", "HEAD")
    assert _git(repo, "rev-parse", "--abbrev-ref", "HEAD") == "main" and _git(repo, "rev-parse", "main") == now
    assert _git(repo, "rev-parse", f"{now}^") == kept and _git(repo, "rev-parse", f"{kept}^") == head
    assert _git(repo, "rev-parse", f"{now}^{{tree}}") == _git(repo, "rev-parse", f"{head}^{{tree}}")
    assert _git(repo, "ls-tree", "-r", "--name-only", kept).split() == [
        "README", f"{RUN}/rep/a.nsys-rep", f"{RUN}/sqlite/a.sqlite.gz"]
    assert _git(repo, "log", "-1", "--format=%s", kept) == f"captures of {RUN}"
    assert kept in _git(repo, "log", "-1", "--format=%B", now)
    assert "leave the tree" in _git(repo, "log", "-1", "--format=%s", now)
    # found and read back, by path (the commit that added it) or by `<commit>:<path>`
    assert C.stored(repo, f"{RUN}/rep/a.nsys-rep") == C.spec(kept, f"{RUN}/rep/a.nsys-rep")
    assert C.stored(repo, repo / RUN / "sqlite" / "a.sqlite.gz") == f"{kept}:{RUN}/sqlite/a.sqlite.gz"
    assert C.read_bytes(repo, f"{kept}:{RUN}/rep/a.nsys-rep") == b"rep\x00bytes"
    assert C.read_bytes(repo, f"{kept[:12]}:{RUN}/sqlite/a.sqlite.gz") == b"\x1f\x8bgz"


def test_a_second_add_follows_the_first(repo, tmp_path):
    (tmp_path / "a").write_bytes(b"a"), (tmp_path / "b").write_bytes(b"b")
    first = C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "one")
    before = _state(repo)
    second = C.add_files(repo, {f"{RUN}/rep/b.nsys-rep": tmp_path / "b"}, "two")
    assert _state(repo) == before and _git(repo, "rev-parse", f"{second}^^") == first
    assert _git(repo, "rev-list", "--count", "HEAD") == "5"
    assert C.stored(repo, f"{RUN}/rep/a.nsys-rep") == f"{first}:{RUN}/rep/a.nsys-rep"
    assert C.read_bytes(repo, C.stored(repo, f"{RUN}/rep/b.nsys-rep")) == b"b"


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
        C.read_bytes(repo, f"HEAD:{RUN}/rep/a.nsys-rep")
    with pytest.raises(C.CapturesError, match="never rewritten"):  # a path in HEAD's tree is in its history
        C.add_files(repo, {"README": tmp_path / "a"}, "m")
    C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "m")
    head = _git(repo, "rev-parse", "HEAD")
    with pytest.raises(C.CapturesError, match="never rewritten"):  # out of the tree now, still in history
        C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "again")
    assert _git(repo, "rev-parse", "HEAD") == head
    _git(repo, "checkout", "-q", "--detach")
    with pytest.raises(C.CapturesError, match="detached"):
        C.add_files(repo, {f"{RUN}/rep/b.nsys-rep": tmp_path / "a"}, "m")
    assert _git(repo, "rev-parse", "HEAD") == _git(repo, "rev-parse", "main") == head


def test_a_branch_moved_during_an_add_is_refused(repo, tmp_path, monkeypatch):
    """Two adds at once: the one that finds the branch moved since it read it fails and leaves the branch as it is."""
    (tmp_path / "a").write_bytes(b"a")
    real = C._git

    def racing(r, *args, **kw):  # another add lands just before this one moves the branch
        if args[:1] == ("commit-tree",) and "-p" in args and "leave the tree" in args[-1]:
            other = _git(r, "commit-tree", "HEAD^{tree}", "-p", "HEAD", "-m", "meanwhile")
            _git(r, "update-ref", "refs/heads/main", other)
        return real(r, *args, **kw)
    monkeypatch.setattr(C, "_git", racing)
    with pytest.raises(C.CapturesError, match="moved while adding"):
        C.add_files(repo, {f"{RUN}/rep/a.nsys-rep": tmp_path / "a"}, "m")
    assert _git(repo, "log", "-1", "--format=%s", "main") == "meanwhile"


def _records() -> list[tuple[Path, str, str]]:
    """(run folder, capture, commit) for every capture the committed CAPTURES.json records name."""
    return [(f.parent, name, commit) for f in sorted(ROOT.glob("reports/data/*/nsys/*/CAPTURES.json"))
            for name, commit in json.loads(f.read_text()).items()]


def test_every_recorded_capture_is_held_by_this_repositorys_history():
    """What the pages tell readers to `git show` exists: each record names a commit holding the file, and its short
    form (what the pages print) names that commit alone."""
    if not (ROOT / ".git").exists():
        pytest.skip("no .git: a tarball of the tree cannot check the history")
    if _git(ROOT, "rev-parse", "--is-shallow-repository") == "true":
        pytest.skip("a shallow clone lacks the commits that hold the captures")
    records = _records()
    assert records
    for folder, name, commit in records:
        path = f"{folder.relative_to(ROOT).as_posix()}/{name}"
        assert C.stored(ROOT, path, commit) == f"{commit}:{path}", path
        assert _git(ROOT, "rev-parse", "--verify", "--quiet", f"{commit[:SHORT]}^{{commit}}") == commit


def test_mains_tracked_tree_holds_no_captures():
    """The device tool copies the tracked tree (64 MiB at most): the captures live in the history alone."""
    r = subprocess.run(["git", "-C", str(ROOT), "ls-files", "*.nsys-rep", "*.sqlite.gz"], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    assert r.stdout.split() == []
