"""The Nsight Systems captures (NAME.nsys-rep, NAME.sqlite.gz) kept out of the tracked tree, on a branch of their own.

The branch `captures` holds only capture files, at the paths they would have in the tree
(reports/data/<device>/nsys/<run>/rep/NAME.nsys-rep, .../sqlite/NAME.sqlite.gz). It is written with git plumbing
alone, never checked out: each `add_files` call stores the files as blobs (git hash-object -w), builds the new tree
on a temporary index (the previous captures commit's tree plus the new files), and commits it as a child of the
previous captures commit (git commit-tree), moving the ref only if nobody moved it meanwhile (git update-ref with
the old value). The working tree, the index and HEAD are never touched, so main's tracked tree stays small (the
device tool copies at most 64 MiB of it) while the captures stay one command away:

  git show captures:reports/data/<device>/nsys/<run>/rep/NAME.nsys-rep > NAME.nsys-rep

The pages never read these bytes: they read the extracts (impl.nsys.extract) and name the captures by the
records of their run folder (FILED.json), so a clone of main alone rebuilds them identically.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

BRANCH = "captures"
REF = f"refs/heads/{BRANCH}"


class CapturesError(Exception):
    """A capture could not be stored or found: not a git repository, a file missing, a path already stored, or the
    branch moved by someone else during an add."""


def _git(repo: Path, *args: str, env: Mapping[str, str] | None = None, check: bool = True) -> str:
    """`git -C repo ARGS`'s stdout (stripped); CapturesError naming the command and git's message on failure."""
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                       env={**os.environ, **env} if env else None)
    if check and r.returncode != 0:
        raise CapturesError(f"git {' '.join(args)} in {repo}: {r.stderr.strip() or f'exit {r.returncode}'}")
    return r.stdout.strip()


def repo_root(path: Path) -> Path:
    """The top of the git working tree holding `path` (a file or folder, existing or not: its nearest existing
    parent is asked); CapturesError if none."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    if p.is_file():
        p = p.parent
    r = subprocess.run(["git", "-C", str(p), "rev-parse", "--show-toplevel"], capture_output=True, text=True)
    if r.returncode != 0:
        raise CapturesError(f"{path}: not inside a git repository (the captures go to its '{BRANCH}' branch)")
    return Path(r.stdout.strip())


def head(repo: Path, branch: str = BRANCH) -> str | None:
    """The branch's commit, None if it does not exist yet."""
    out = _git(repo, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", check=False)
    return out or None


def relative(repo: Path, path: str | Path) -> str:
    """`path` (absolute inside the repository, or relative to its top) as the branch stores it: relative to the
    top, POSIX, no '..'; CapturesError otherwise."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.resolve().relative_to(Path(repo).resolve())
        except ValueError:
            raise CapturesError(f"{path}: outside the repository {repo}") from None
    rel = PurePosixPath(p.as_posix())
    if not rel.parts or ".." in rel.parts or rel.is_absolute():
        raise CapturesError(f"{path}: not a path inside the repository")
    return rel.as_posix()


def stored(repo: Path, path: str | Path, branch: str = BRANCH) -> str | None:
    """Where `path` (relative to the repository's top, or absolute inside it) is stored on the branch: its git
    object name `<branch>:<path>` (what `git show` takes), or None if the branch or the path is not there."""
    rel = relative(repo, path)
    if head(repo, branch) is None:
        return None
    kind = _git(repo, "cat-file", "-t", f"refs/heads/{branch}:{rel}", check=False)
    return f"{branch}:{rel}" if kind == "blob" else None


def listed(repo: Path, folder: str | Path, branch: str = BRANCH) -> list[str]:
    """The paths the branch stores under `folder` (relative to the repository's top), sorted; [] if none."""
    if head(repo, branch) is None:
        return []
    rel = relative(repo, folder)
    out = _git(repo, "ls-tree", "-r", "--name-only", "-z", f"refs/heads/{branch}", "--", f"{rel}/")
    return sorted(p for p in out.split("\0") if p)


def read_bytes(repo: Path, path: str | Path, branch: str = BRANCH) -> bytes:
    """The stored bytes of `path` on the branch; CapturesError if it is not stored there."""
    if stored(repo, path, branch) is None:
        raise CapturesError(f"{path}: not stored on the '{branch}' branch of {repo}")
    r = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", f"refs/heads/{branch}:{relative(repo, path)}"],
                       capture_output=True)
    if r.returncode != 0:
        raise CapturesError(f"{path}: git cat-file failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def add_files(repo: Path, files: Mapping[str | Path, Path], message: str, branch: str = BRANCH) -> str:
    """Store `files` ({path on the branch: local file}) on the branch in one new commit, the branch's first if it
    does not exist yet, else a child of its current commit; the new commit. Refuses a local file that is missing,
    a path the branch already stores (stored data is never rewritten), and a branch that moved during the call.
    The working tree, the index and HEAD are not touched."""
    repo = Path(repo)
    if not files:
        raise CapturesError("no files to add")
    entries = {}
    for dest, src in files.items():
        if not Path(src).is_file():
            raise CapturesError(f"{src}: no such file to add to the '{branch}' branch")
        entries[relative(repo, dest)] = Path(src)
    parent = head(repo, branch)
    taken = [p for p in entries if parent is not None and stored(repo, p, branch)]
    if taken:
        raise CapturesError(f"already on the '{branch}' branch (stored data is never rewritten): {taken}")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if parent is not None:
            _git(repo, "read-tree", parent, env=env)
        for rel, src in entries.items():
            blob = _git(repo, "hash-object", "-w", "--no-filters", "--", str(src.resolve()))
            _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = _git(repo, "write-tree", env=env)
    commit = _git(repo, "commit-tree", tree, *(("-p", parent) if parent else ()), "-m", message)
    r = subprocess.run(["git", "-C", str(repo), "update-ref", "-m", f"{branch}: {message.splitlines()[0]}",
                        f"refs/heads/{branch}", commit, parent or ""], capture_output=True, text=True)
    if r.returncode != 0:
        raise CapturesError(f"refs/heads/{branch} moved while adding (expected {parent or 'no branch'}): "
                            f"{r.stderr.strip()}; the branch was left as it was; add again")
    return commit


__all__ = ["BRANCH", "REF", "CapturesError", "add_files", "head", "listed", "read_bytes", "relative", "repo_root",
           "stored"]
