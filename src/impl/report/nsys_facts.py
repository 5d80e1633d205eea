"""nsys_profile (c) as facts: the non-matmul kernels with non-trivial time in the forward pass, read
from the forward's own kernel table (the question asks about the forward; backward and the optimizer
step have their own tables)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_OP = re.compile(r"(\w+Functor|\w+_kernel\w*|softmax_warp_forward|Memcpy \w+|\w+_reduce\w*)")


@dataclass(frozen=True)
class Kernel:
    name: str  # as the profiler names it
    category: str  # matmul, elementwise, softmax, copy, reduction, ...
    share: float  # of the forward's kernel time
    calls: int

    @property
    def op(self) -> str:
        """A readable handle: the functor or kernel the long name is built around."""
        found = [m for m in _OP.findall(self.name) if m not in ("elementwise_kernel", "vectorized_elementwise_kernel")]
        return found[-1] if found else self.name[:40]


@dataclass(frozen=True)
class ForwardNonMatmul:
    threshold: float  # share of forward kernel time counted as non-trivial
    kernels: list[Kernel]  # above the threshold, largest first

    @property
    def categories(self) -> list[str]:
        return sorted({k.category for k in self.kernels})

    @property
    def total_share(self) -> float:
        return sum(k.share for k in self.kernels)


def forward_non_matmul(nsys: dict) -> ForwardNonMatmul:
    threshold = nsys.get("nontrivial_threshold", 0.01)
    rows = (nsys.get("tables") or {}).get("forward") or []
    ks = [Kernel(r["name"], r["category"], r["share"], int(r["calls"])) for r in rows
          if r["category"] != "matmul" and r["share"] >= threshold]
    return ForwardNonMatmul(threshold, sorted(ks, key=lambda k: -k.share))
