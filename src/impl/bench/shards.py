"""The correctness suite in shards: `pytest --shard K/N` (the root conftest) runs the K-th of N
disjoint parts of the collected tests, so a suite longer than one device call (600 s) can be run as N
calls whose records (impl.bench.test_record) merge into one.

Which shard a test lands in depends on its node id alone and on those of its sibling
parametrizations (never on the machine, the process, xdist's worker or the collection order): the
parametrizations of one test function, sorted by node id, are dealt round-robin over the shards,
starting at a shard given by a stable hash of the function's id. So a test's many parametrizations
(the GPU kernels' hundreds) spread evenly instead of piling into one shard, and every test is in
exactly one shard. The longest tests (the conftest's LONG_FIRST, longest first) start at shard
j mod N instead of a hash, so that the slowest few do not share one call.
"""
from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    index: int  # K, from 1
    count: int  # N

    @classmethod
    def parse(cls, text: str) -> Shard:
        """`K/N` with 1 <= K <= N; ValueError naming the value otherwise."""
        k, sep, n = str(text).strip().partition("/")
        if not (sep and k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            raise ValueError(f"--shard must be K/N with whole numbers 1 <= K <= N, got {text!r}")
        return cls(int(k), int(n))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def _function_id(nodeid: str) -> str:
    """The node id without its parametrization (`a.py::test_x[fp32-64]` -> `a.py::test_x`)."""
    return nodeid.split("[", 1)[0]


def _stable_hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def assign(nodeids: Sequence[str], count: int, long_first: Sequence[str] = ()) -> dict[str, int]:
    """Each node id's shard (1..count). `long_first`: test function names, longest first, whose
    parametrizations start at shard j mod count (the j-th name) rather than at their hash's."""
    groups: dict[str, list[str]] = defaultdict(list)
    for nodeid in nodeids:
        groups[_function_id(nodeid)].append(nodeid)
    out = {}
    for fid, members in groups.items():
        name = fid.rsplit("::", 1)[-1]
        start = long_first.index(name) if name in long_first else _stable_hash(fid)
        for i, nodeid in enumerate(sorted(members)):
            out[nodeid] = (start + i) % count + 1
    return out


def select(items: list, shard: Shard, long_first: Sequence[str] = ()) -> tuple[list, list]:
    """(kept, deselected) of pytest items (anything with a `nodeid`) for `shard`, order kept."""
    where = assign([it.nodeid for it in items], shard.count, long_first)
    kept = [it for it in items if where[it.nodeid] == shard.index]
    return kept, [it for it in items if where[it.nodeid] != shard.index]
