"""What a FlashAttentionTriton call is told (FlashOptions) and what it reports back (LaunchRecord).

Options are a frozen value passed through the call (``FlashAttentionTriton.apply(q, k, v, causal,
options)``, the launchers' ``options=``); ``None`` means :func:`default_options`, the dataclass
defaults (the one home of every default: there are no module-level setters). Two callers in one
process can use different options: nothing is stored in module state except caches keyed on the
options value.

A launch record names what one forward or backward call ran: the config of each kernel, the
backward variant, how the head dim was tiled, whether the streamed tiles used tensor descriptors.
The launchers hand it to ``options.recorder`` (a :class:`LaunchRecorder`, which keeps the last
record of each kind) when one is set.

Pure Python: importing this module never touches Triton or CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

ConfigShape = Tuple[int, int, int, int]  # (BLOCK_M, BLOCK_N, num_warps, num_stages)

BACKWARD_KINDS = ("triton", "compiled")
VARIANT_SETTINGS = ("auto", "two_pass", "atomic")
CONFIG_KERNELS = ("fwd", "kv", "q", "atomic")
KERNEL_SETTINGS = ("triton", "auto")


@dataclass(frozen=True)
class LaunchRecord:
    """One launcher call: ``kind`` "fwd" or "bwd"; ``configs``: kernel name ("fwd", "dq", "dkdv",
    "atomic") -> str(triton.Config); ``variant``: the backward variant (None for the forward);
    ``d_tiles``: the head-dim tiling label ("64", "64+16", "128 padded"); ``tma``: descriptors used;
    ``kernel``: which family ran, "triton" or a Gluon kernel of the kernel table ("gluon_ws", "gluon"; the
    backward's "gluon_ws" is flash_gluon_bwd_ws)."""

    kind: str
    configs: Tuple[Tuple[str, str], ...]
    d_tiles: str
    tma: bool
    variant: Optional[str] = None
    kernel: str = "triton"


class LaunchRecorder:
    """Collects launch records: the last one of each kind, and a count."""

    def __init__(self) -> None:
        self.last: Dict[str, LaunchRecord] = {}
        self.count = 0

    def __call__(self, record: LaunchRecord) -> None:
        self.last[record.kind] = record
        self.count += 1

    def clear(self) -> None:
        self.last.clear()
        self.count = 0

    def summary(self) -> dict:
        """The JSON shape of the old ``tuned_configs()``: each kernel's config of the last forward
        and backward, "d_tiles" of the last call, "bwd" the last backward's variant, plus "tma"."""
        out: Dict[str, object] = {}
        for kind in ("fwd", "bwd"):
            rec = self.last.get(kind)
            if rec is None:
                continue
            out.update(dict(rec.configs))
            out["d_tiles"] = rec.d_tiles
            out["tma"] = rec.tma
            if rec.variant is not None:
                out["bwd"] = rec.variant
        return out


_REGISTRY: Dict[int, "FlashOptions"] = {}


@dataclass(frozen=True)
class FlashOptions:
    """How FlashAttentionTriton runs.

    backward: "triton" (our kernels) or "compiled" (torch.compile'd PyTorch backward).
    variant: the Triton backward, "auto" (backward_choice's rule, with atomic_min_work), "two_pass"
        or "atomic" (forced for every shape).
    atomic_min_work: the rule of "auto": the atomic backward from this much work per call on
        (batch·heads·n_q·n_k scores, halved when causal), the two-pass one below it. Small problems
        are launch-bound (the atomic path launches 3 kernels against 2, and pays the dQ cast), large
        ones compute-bound, where 5 products against 7 can win if the fp32 reductions keep up.
        Infinite (always two-pass): the H100 probe of NOTES.md's "Version 4, outcome" found the
        atomic kernel slower at the leaderboard shape. tools/probes/flash_bwd_variants.py prints
        the threshold to set here once it measures a crossover.
    tma: tensor-descriptor loads where the layout allows; tma_min_scores: below this many scores
        (batch·heads·n_q·n_k) a GPU launch takes the pointer path (descriptors cost host time).
    fwd_tma_max_block_d: the forward's descriptors only where its head-dim tile (BLOCK_D) is at most
        this wide: at a 128-wide tile the pointer path's best config ran 4-7% faster than the
        descriptors' best on the H100 (4x32x4096x128 and 1x32x32768x128, bf16, causal;
        probes/flash_d128_a3c533a.json), at 64 the descriptors ~2% faster (NOTES.md, v3).
    atomic_dq_tma: the atomic backward adds dQ through a descriptor when its loads use them.
    autotune: False = one shared-memory-safe config per kernel (fast test suites).
    configs: per kernel ("fwd", "kv", "q", "atomic") a tuple of (BLOCK_M, BLOCK_N, warps, stages)
        replacing its autotune list (one entry: launched without benchmarking); None = the list.
    split_head_dim: tile d 48/80/96 as two power-of-two tiles (default) or pad to the next power.
    direct_launch: after a shape key's first calls, launch the compiled kernels directly (no
        JITFunction.run); False keeps every launch on Triton's ordinary path (tests compare them).
    kernels: "triton" (our Triton kernels, everywhere) or "auto": FlashAttentionTriton runs the Gluon
        kernel that impl.attention.kernel_table names for the call's (architecture, head dim, causal,
        dtype) where the tensors are CUDA on that architecture, the layout suits it and Gluon imports,
        and the Triton kernels otherwise (the CPU interpreter always). Default "triton" until the GPU
        suite passes with "auto" (NOTES.md, "Issue 47, stage 4: the kernel table").
    recorder: receives a LaunchRecord per launcher call (not part of equality or hashing).
    """

    backward: str = "triton"
    variant: str = "auto"
    atomic_min_work: float = math.inf
    tma: bool = True
    tma_min_scores: int = 1 << 26
    fwd_tma_max_block_d: int = 64
    atomic_dq_tma: bool = True
    autotune: bool = True
    configs: Optional[Tuple[Tuple[str, Tuple[ConfigShape, ...]], ...]] = None
    split_head_dim: bool = True
    direct_launch: bool = True
    kernels: str = "triton"
    recorder: Optional[LaunchRecorder] = field(default=None, compare=False, hash=False, repr=False)
    key: int = field(default=0, init=False, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        # The int the custom ops carry under torch.compile (a custom op takes no Python objects);
        # every value is registered, so the ops' implementations find it (0: default_options()).
        object.__setattr__(self, "key", len(_REGISTRY) + 1)
        _REGISTRY[self.key] = self
        if self.backward not in BACKWARD_KINDS:
            raise ValueError(f"unknown flash backward {self.backward!r}; expected one of {BACKWARD_KINDS}")
        if self.variant not in VARIANT_SETTINGS:
            raise ValueError(f"unknown flash backward variant {self.variant!r}; expected one of {VARIANT_SETTINGS}")
        if self.kernels not in KERNEL_SETTINGS:
            raise ValueError(f"unknown flash kernels setting {self.kernels!r}; expected one of {KERNEL_SETTINGS}")
        if self.configs is not None:
            if isinstance(self.configs, dict):  # accept a dict, store a hashable tuple
                object.__setattr__(self, "configs", tuple(sorted(
                    (name, tuple(tuple(c) for c in shapes)) for name, shapes in self.configs.items())))
            for name, shapes in self.configs:
                if name not in CONFIG_KERNELS or not shapes:
                    raise ValueError(f"configs: unknown kernel {name!r} or empty list; kernels {CONFIG_KERNELS}")

    def config_list(self, name: str) -> Optional[Tuple[ConfigShape, ...]]:
        for n, shapes in self.configs or ():
            if n == name:
                return shapes
        return None


_DEFAULT = FlashOptions()


def default_options() -> FlashOptions:
    """The options a call with options=None runs with: the dataclass defaults (one shared value, so
    its key, and the caches keyed on it, stay the same across calls). Not settable: a caller that
    wants other options passes them."""
    return _DEFAULT


def options_by_key(key: int) -> FlashOptions:
    """The options registered under `key` (FlashOptions.key; 0: default_options())."""
    return _DEFAULT if key == 0 else _REGISTRY[key]


def with_configs(options: Optional[FlashOptions] = None, **lists) -> FlashOptions:
    """`options` with the autotune lists of the named kernels (fwd, kv, q, atomic) replaced by
    `lists` (each a sequence of (BLOCK_M, BLOCK_N, warps, stages)); the others keep theirs."""
    from dataclasses import replace
    options = options or _DEFAULT
    merged = dict(options.configs or ())
    merged.update({name: tuple(tuple(c) for c in shapes) for name, shapes in lists.items() if shapes is not None})
    return replace(options, configs=merged or None)


__all__ = ["BACKWARD_KINDS", "CONFIG_KERNELS", "FlashOptions", "KERNEL_SETTINGS", "LaunchRecord", "LaunchRecorder", "VARIANT_SETTINGS",
           "default_options", "options_by_key", "with_configs"]
