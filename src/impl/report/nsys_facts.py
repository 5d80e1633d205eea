"""nsys_profile as facts, one `Profiled` per profiled config; (c)'s non-matmul kernels are read from
the forward's own kernel table (the question asks about the forward; backward and the optimizer step
have their own tables). templates/nsys_profile.md.j2 holds the words."""
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


@dataclass(frozen=True)
class Profiled:
    """One profiled config: its Python timer against the profiler's view of the same forward."""

    config: str  # "<size label> at context <n>"
    timer_ms: float  # pytest-benchmark's time of the same forward
    range_ms: float  # the annotated forward range
    kernel_ms: float  # kernel time inside it
    top_name: str
    top_is_matmul: bool
    top_calls: int  # per forward
    top_stays: bool  # still on top for forward+backward
    matmul_fwd: float
    matmul_train: float | None  # None where the training step was not profiled
    softmax_time: float  # softmax ÷ (the two attention matmuls), time
    softmax_flops: float  # the same in FLOPs
    non_matmul: ForwardNonMatmul

    @property
    def busy(self) -> float:
        return self.kernel_ms / self.timer_ms

    @property
    def range_agrees(self) -> bool:
        """The profiled range within 10% of the Python timer."""
        return abs(self.range_ms / self.timer_ms - 1) <= 0.1

    @property
    def softmax_per_flop(self) -> float:
        return self.softmax_time / self.softmax_flops


def profiled(config: str, timer_s: float, nsys: dict) -> Profiled:
    top = nsys["top_forward"]
    train = nsys["matmul_share_train_step"] if (nsys.get("profiled") or "train_step") == "train_step" else None
    return Profiled(config, timer_s * 1e3, nsys["forward_range_ms"], nsys["forward_kernel_ms"], top["name"],
                    top["category"] == "matmul", int(top["calls_per_pass"]), bool(nsys.get("top_stays_on_top")),
                    nsys["matmul_share_forward"], train, nsys["softmax_to_matmuls_time_ratio"],
                    nsys["softmax_to_matmuls_flop_ratio"], forward_non_matmul(nsys))


@dataclass(frozen=True)
class NsysFacts:
    configs: list[Profiled]  # by context, as the table lists them

    @property
    def busiest(self) -> Profiled:
        return max(self.configs, key=lambda c: c.busy)

    @property
    def idlest(self) -> Profiled:
        return min(self.configs, key=lambda c: c.busy)

    @property
    def middle(self) -> Profiled:
        """The config whose kernel tables the page prints."""
        return self.configs[len(self.configs) // 2]

    @property
    def agree(self) -> int:
        return sum(c.range_agrees for c in self.configs)

    @property
    def top_calls(self) -> list[int]:
        return sorted({c.top_calls for c in self.configs})

    @property
    def matmul_train(self) -> list[float]:
        return [c.matmul_train for c in self.configs if c.matmul_train is not None]


@dataclass(frozen=True)
class NsysCase:
    """One (size, context) the 2026 study asked for: the forward's Python-timer mean ± std, the top forward
    kernel and its calls per forward, or the OOM with its closed-form need."""

    size: str  # its label (impl.report.rows.size_label)
    context: int
    measured: bool
    forward_ms: float | None = None
    forward_std_ms: float | None = None
    kernel_ms: float | None = None  # the forward's summed kernel time (profiler)
    top_name: str | None = None
    top_calls: int | None = None  # per forward pass
    top_stays: bool | None = None
    need_bytes: float | None = None  # closed-form fp32 training-step need (OOM rows)


def nsys_cases(rows) -> list[NsysCase]:
    """The cases of `rows` (impl.report.rows.Bench of nsys_profile), in the order the study lists them."""
    from impl.report.rows import size_label

    out = []
    for b in rows:
        n = b.details.get("nsys") or {}
        label = size_label(b.cfg.size_ref, b.cfg.size)
        need = (b.details.get("memory_need") or {}).get("total")
        if not (b.measured and n):
            out.append(NsysCase(label, int(b.cfg.context), False, need_bytes=need))
            continue
        top = n.get("top_forward") or {}
        out.append(NsysCase(label, int(b.cfg.context), True, b.stats.mean * 1e3,
                            None if b.stats.stddev is None else b.stats.stddev * 1e3, n.get("forward_kernel_ms"),
                            top.get("name"), None if top.get("calls_per_pass") is None else int(top["calls_per_pass"]),
                            bool(n.get("top_stays_on_top")), need))
    order = [tuple(c) for c in next((b.details.get("cases") for b in rows if b.details.get("cases")), [])]
    names = {(c.size.split(" ")[0], c.context): c for c in out}
    return [names[k] for k in order if k in names] + [c for c in out if (c.size.split(" ")[0], c.context) not in order]
