"""The repository a command works on. Each CLI (impl.report, impl.report.gate, impl.report.compare,
impl.bench.store, impl.bench.test_record) reads and writes only under one (and a `--data-dir` the
user names): the folder given by `--root`, or else the nearest folder at or above the current one
that holds both `reports/data/` and `pyproject.toml`; where there is none it refuses before doing
anything. Never the package's own location: installed, that is a site-packages folder, and a report
built there once deleted the pages it found (issue 46)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path

# What makes a folder the suite's repository: the stored runs every CLI reads (reports/data, not
# just reports/, which another project may have too) and a project file.
MARKERS = ("reports/data/", "pyproject.toml")


class NoRepository(ValueError):
    """No repository to work on: names the folder tried and what it lacked."""


@dataclass(frozen=True)
class Repo:
    root: Path
    data_dir: Path  # the stored runs: ROOT/reports/data unless --data-dir names another folder

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def perf_dir(self) -> Path:
        return self.root / "perf"


def _repo(root: Path) -> Repo:
    return Repo(root, root / "reports" / "data")


def _is_repo(folder: Path) -> bool:
    return (folder / "reports" / "data").is_dir() and (folder / "pyproject.toml").is_file()


def find_repo(root: Path | None = None) -> Repo:
    """The repository at `root` when given, else the nearest one at or above the current folder.
    NoRepository otherwise, naming where it looked and for what."""
    wanted = " and ".join(MARKERS)
    if root is not None:
        if not _is_repo(root):
            raise NoRepository(f"--root {root}: not the suite's repository (it needs {wanted})")
        return _repo(root.resolve())
    here = Path.cwd().resolve()
    for folder in (here, *here.parents):
        if _is_repo(folder):
            return _repo(folder)
    raise NoRepository(f"no repository here: no folder at or above {here} holds {wanted}; "
                       "run this inside the repository or give --root")


def add_repo_arguments(ap: argparse.ArgumentParser, data_dir: bool = True) -> None:
    """`--root` (and `--data-dir` for the commands that read or file runs)."""
    ap.add_argument("--root", type=Path, help=f"the repository to work on (default: the nearest folder at or "
                                              f"above the current one holding {' and '.join(MARKERS)})")
    if data_dir:
        ap.add_argument("--data-dir", type=Path, help="the stored runs (default: ROOT/reports/data)")


def repo_from_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Repo:
    """The repository named by `--root` or found from the current folder, with `--data-dir` where
    given. Without one the command stops here (argparse's usage error, exit status 2), before it
    reads or writes anything."""
    try:
        repo = find_repo(args.root)
    except NoRepository as exc:
        ap.error(str(exc))
    given = getattr(args, "data_dir", None)
    return replace(repo, data_dir=given) if given is not None else repo
