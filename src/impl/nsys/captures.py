"""The Nsight Systems captures (NAME.nsys-rep, NAME.sqlite.gz) kept in the checked-out branch's history, out of its
tree.

Only main survives between sessions here (a branch of their own, `captures`, was lost with its data on
2026-11-27), so the captures live in main's own history. `add_files` writes two commits with git plumbing alone:
A = HEAD's tree plus the files at the paths they would have in the tree
(reports/data/<device>/nsys/<run>/rep/NAME.nsys-rep, .../sqlite/NAME.sqlite.gz), a child of HEAD; then B = HEAD's
tree again, a child of A, saying the captures leave the tree and are kept at A. The checked-out branch moves from
HEAD to B only if nobody moved it meanwhile (git update-ref with the old value). B's tree is the old HEAD's, so the
working tree and the index are not touched (staged changes stay staged), the tracked tree stays small (the device
tool copies at most 64 MiB of it), and the captures are one command away for as long as the branch's history is:

  git show <A>:reports/data/<device>/nsys/<run>/rep/NAME.nsys-rep > NAME.nsys-rep

The pages never read these bytes nor ask git: they read the extracts (impl.nsys.extract) and name each capture by
the record of its run folder (CAPTURES.json: {"<subfolder>/<name>": "<commit A>"}, impl.nsys.store), so a shallow
clone or a tarball of the tree rebuilds them identically.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath


class CapturesError(Exception):
    """A capture could not be stored or found: not a git repository, a detached HEAD, a file missing, a path
    already stored in the branch's history, or the branch moved by someone else during an add."""


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
        raise CapturesError(f"{path}: not inside a git repository (the captures go to its branch's history)")
    return Path(r.stdout.strip())


def branch(repo: Path) -> str:
    """The checked-out branch's ref (refs/heads/NAME); CapturesError on a detached HEAD."""
    ref = _git(repo, "symbolic-ref", "-q", "HEAD", check=False)
    if not ref.startswith("refs/heads/"):
        raise CapturesError(f"{repo}: HEAD is detached; check out the branch whose history keeps the captures")
    return ref


def relative(repo: Path, path: str | Path) -> str:
    """`path` (absolute inside the repository, or relative to its top) as a commit's tree names it: relative to
    the top, POSIX, no '..'; CapturesError otherwise."""
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


def spec(commit: str, path: str) -> str:
    """The git object name `<commit>:<path>` (what `git show` takes)."""
    return f"{commit}:{path}"


def _is_blob(repo: Path, name: str) -> bool:
    return _git(repo, "cat-file", "-t", name, check=False) == "blob"


def stored(repo: Path, path: str | Path, rev: str = "HEAD") -> str | None:
    """Where `path` (relative to the repository's top, or absolute inside it) is kept in `rev`'s history: the
    `<commit>:<path>` name of the newest commit that added it (and holds it as a file), None if none did."""
    rel = relative(repo, path)
    commit = _git(repo, "log", "-1", "--diff-filter=A", "--format=%H", rev, "--", rel, check=False)
    return spec(commit, rel) if commit and _is_blob(repo, spec(commit, rel)) else None


def read_bytes(repo: Path, name: str) -> bytes:
    """The bytes of the file `name` (`<commit>:<path>`); CapturesError if the repository does not hold it."""
    if not _is_blob(repo, name):
        raise CapturesError(f"{name}: not stored in {repo} (a shallow clone lacks older commits)")
    r = subprocess.run(["git", "-C", str(repo), "cat-file", "blob", name], capture_output=True)
    if r.returncode != 0:
        raise CapturesError(f"{name}: git cat-file failed: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def add_files(repo: Path, files: Mapping[str | Path, Path], message: str) -> str:
    """Store `files` ({path in the tree: local file}) in the checked-out branch's history (see the module's doc):
    commit A (HEAD's tree plus the files, `message`), then B (HEAD's tree, a child of A); the branch moves to B.
    Returns A. Refuses a detached HEAD, a local file that is missing, a path the branch's history already holds
    (stored data is never rewritten) and a branch that moved during the call. The working tree and the index are
    not touched."""
    repo = Path(repo)
    if not files:
        raise CapturesError("no files to add")
    ref = branch(repo)
    entries = {}
    for dest, src in files.items():
        if not Path(src).is_file():
            raise CapturesError(f"{src}: no such file to add to the history of {ref}")
        entries[relative(repo, dest)] = Path(src)
    head = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
    taken = [p for p in entries if _git(repo, "rev-list", "-1", head, "--", p)]
    if taken:
        raise CapturesError(f"already in the history of {ref} (stored data is never rewritten): {taken}")
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        _git(repo, "read-tree", head, env=env)
        for rel, src in entries.items():
            blob = _git(repo, "hash-object", "-w", "--no-filters", "--", str(src.resolve()))
            _git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{rel}", env=env)
        tree = _git(repo, "write-tree", env=env)
    kept = _git(repo, "commit-tree", tree, "-p", head, "-m", message)
    title = message.splitlines()[0]
    left = _git(repo, "commit-tree", f"{head}^{{tree}}", "-p", kept, "-m",
                f"{title}: they leave the tree, kept in history at {kept}\n\n"
                f"git show {kept}:<path> writes one out (impl.nsys.captures).")
    r = subprocess.run(["git", "-C", str(repo), "update-ref", "-m", f"captures: {title}", ref, left, head],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise CapturesError(f"{ref} moved while adding (expected {head}): {r.stderr.strip()}; the branch was left "
                            f"as it was; add again")
    return kept


__all__ = ["CapturesError", "add_files", "branch", "read_bytes", "relative", "repo_root", "spec", "stored"]
