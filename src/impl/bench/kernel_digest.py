"""Which kernels a checkout runs, as a digest: what a correctness record (impl.bench.test_record) and a
perf run (impl.bench.session) name their kernels by, so the report can tell whether two results came
from the same kernels (also across commits, or at one commit with different uncommitted changes) and
whether a record still vouches for the kernels as they are now.

Two parts, each a sha256 read from the working tree (the same code gives the same digest on any
machine, committed or not):

- `sources`: the .py/.toml files under KERNEL_PATHS (the Triton and Gluon kernels and the code that
  launches them);
- `table`: the kernel table's choices (impl.attention.kernel_table: which kernel and config
  FlashAttentionTriton runs per direction, arch, head dim, causal, dtype, from which min_seq), without
  each choice's "measured" and "losses" evidence, which grows as probes are filed while what runs stays
  the same.

Records made before the table part existed hold `sources` alone (the same value as then): they are
judged by it (`KernelDigest.changed_since`).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from impl.attention.kernel_table import TABLE_FILE, table_from_json, table_to_json

# What a GPU result vouches for: the Triton kernels and the code that launches them.
KERNEL_PATHS = ("src/impl/attention", "src/impl/model/adamw_master.py")
KERNEL_TABLE = f"src/impl/attention/{TABLE_FILE}"  # not a .py/.toml file: `sources` never reads it
EVIDENCE = ("measured", "losses")  # an entry's probe measurements: not what runs


def digest(paths: tuple[str, ...], root: Path) -> str:
    """sha256 over the .py/.toml files under `paths` (relative to the repository `root`; names and
    contents, sorted), read from the working tree: the same code gives the same digest on any
    machine, committed or not."""
    h = hashlib.sha256()
    files = []
    for p in paths:
        base = root / p
        files += [base] if base.is_file() else [f for f in base.rglob("*") if f.suffix in (".py", ".toml")]
    for f in sorted(files, key=lambda f: f.relative_to(root).as_posix()):
        if "__pycache__" in f.parts:
            continue
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def table_digest(root: Path) -> str:
    """sha256 over the kernel table's choices at `root` (each entry's key, kernel, config and min_seq, in
    the table's own JSON form, without its "measured" and "losses" lists: EVIDENCE). A checkout without the table (one older than
    it) runs the Triton kernels everywhere, as an empty table does, and digests as one. ValueError
    naming the file when it is not a kernel table."""
    path = root / KERNEL_TABLE
    try:
        raw = json.loads(path.read_text()) if path.is_file() else {}
        entries = table_to_json(table_from_json(raw))["entries"]  # parsed: a malformed entry is refused
    except (ValueError, AttributeError, TypeError) as exc:  # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a kernel table ({type(exc).__name__}: {exc})") from None
    choices = [{k: v for k, v in e.items() if k not in EVIDENCE} for e in entries]
    return hashlib.sha256(json.dumps(choices, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class KernelDigest:
    sources: str  # digest(KERNEL_PATHS, root)
    table: str | None  # table_digest(root); None in a record made before it was recorded

    @property
    def label(self) -> str:
        """As pages name it: 8 hex digits of each part ("sources/table")."""
        return f"{self.sources[:8]}/{(self.table or '–')[:8]}"

    def changed_since(self, recorded: KernelDigest) -> bool:
        """Whether the kernels described by self (a checkout's) differ from those of a `recorded`
        result: the sources differ, or the result recorded the table's choices and they differ."""
        return self.sources != recorded.sources or (recorded.table is not None and self.table != recorded.table)

    def to_json(self) -> dict:
        return dict(kernel_digest=self.sources, kernel_table_digest=self.table)

    @classmethod
    def from_json(cls, doc: dict) -> KernelDigest | None:
        """From the keys to_json writes (in a run's commit_info); None where they are absent (a run
        stored before runs recorded them)."""
        sources = doc.get("kernel_digest")
        return cls(str(sources), doc.get("kernel_table_digest")) if sources else None


def kernel_digest(root: Path) -> KernelDigest:
    """The kernels of the checkout at `root`."""
    return KernelDigest(digest(KERNEL_PATHS, root), table_digest(root))


def running_kernels() -> KernelDigest | None:
    """The kernels this process imports: those of the checkout whose src/ holds the imported `impl`
    package (the suite runs from its checkout, pyproject's pythonpath = ["src"]); None where the
    package lives elsewhere (installed), whose files are not a checkout's."""
    import impl

    src = Path(impl.__file__).resolve().parents[1]
    root = src.parent
    if src.name != "src" or not all((root / p).exists() for p in KERNEL_PATHS):
        return None
    return kernel_digest(root)


__all__ = ["KERNEL_PATHS", "KERNEL_TABLE", "KernelDigest", "digest", "kernel_digest", "running_kernels",
           "table_digest"]
