"""Which kernel FlashAttentionTriton runs under FlashOptions(kernels="auto") (issue 47, stage 4).

The table (``kernel_table.json`` beside this module, shipped in the wheel) is written by
``tools/probes/kernel_table.py build`` from the committed probe results and checked against them by
``correctness/test_kernel_table.py``: it is never edited by hand. An entry names, for one direction
("fwd" or "bwd") and one (architecture, head dim, causal, dtype), the Gluon kernel and config that beat
our Triton kernels in the same probe run at every shape that run measured with a sequence length of at least
the entry's ``min_seq``, each measurement with its probe file; the measured losses (shorter shapes: the host
launch path and small grids) that set ``min_seq`` are kept beside them. A call without an entry, or shorter than
its ``min_seq``, runs the Triton kernels (the portable path).

Pure Python: importing this module never touches Triton, Gluon or CUDA.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from typing import Any, Dict, Optional, Tuple

#: The Gluon kernels each direction may name, and the one architecture each is written for. The backward's
#: "gluon": flash_gluon_bwd (GluonBwdConfig); "gluon_ws": the warp-specialized flash_gluon_bwd_ws (GluonBwdWsConfig).
KERNELS = {"fwd": {"gluon_ws": "sm_90"}, "bwd": {"gluon": "sm_90", "gluon_ws": "sm_90"}}
HEAD_DIMS = (64, 80, 96, 128)  # the Gluon kernels' (flash_gluon_common.HEAD_DIM_TILES)
#: Kernels written for fewer head dims than HEAD_DIMS: (direction, kernel) -> theirs.
KERNEL_HEAD_DIMS = {("bwd", "gluon_ws"): (64, 128)}  # flash_gluon_bwd_ws.HEAD_DIMS (issue 47, ws d 64)
DTYPES = ("bfloat16", "float16")
TABLE_FILE = "kernel_table.json"

Config = Tuple[Tuple[str, Any], ...]  # the kernel's config dataclass as (field, value) pairs


def config_pairs(config) -> Config:
    """A launcher's config dataclass as an entry's (field, value) pairs (lists as tuples): what
    flash_dispatch.gluon_forward / gluon_backward take."""
    from dataclasses import asdict

    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in asdict(config).items()))


def arch_name(capability: Tuple[int, int]) -> str:
    """(9, 0) -> "sm_90"."""
    return f"sm_{capability[0]}{capability[1]}"


@dataclass(frozen=True)
class Measured:
    """One shape of one probe run where both the Gluon kernel and our Triton kernel were timed."""

    probe: str  # repository path of the probe's JSON
    device: str
    shape: Tuple[int, int, int, int]  # batch, heads, sequence, head dim
    ms: float
    triton_ms: float
    err: float  # the probe's relative error of the Gluon kernel's output
    #: What ms and triton_ms time: "" the probe's own quantity for the direction (the half alone), or the probe
    #: row's field they are ("public_fwd_bwd": FlashAttentionTriton.apply forward+backward as called).
    quantity: str = ""


@dataclass(frozen=True)
class KernelChoice:
    direction: str
    arch: str
    d: int
    causal: bool
    dtype: str
    kernel: str
    config: Config
    measured: Tuple[Measured, ...]  # the wins: faster than triton, correct
    #: The entry applies to calls of sequence length (dispatch: min(N_Q, N_K)) >= min_seq; 0: every length.
    min_seq: int = 0
    losses: Tuple[Measured, ...] = ()  # the measured losses (not faster) that set min_seq, each shorter than it

    def __post_init__(self) -> None:
        where = f"kernel table entry {self.direction} {self.arch} d {self.d} causal {self.causal} {self.dtype}"
        if self.direction not in KERNELS:
            raise ValueError(f"{where}: unknown direction {self.direction!r}; expected one of {sorted(KERNELS)}")
        arch = KERNELS[self.direction].get(self.kernel)
        if arch is None:
            raise ValueError(f"{where}: unknown kernel {self.kernel!r}; expected one of "
                             f"{sorted(KERNELS[self.direction])} (no entry means triton)")
        if self.arch != arch:
            raise ValueError(f"{where}: kernel {self.kernel!r} runs on {arch} only, not {self.arch}")
        if self.d not in HEAD_DIMS or self.dtype not in DTYPES or not isinstance(self.causal, bool):
            raise ValueError(f"{where}: head dim must be one of {HEAD_DIMS}, dtype one of {DTYPES}, causal a bool")
        dims = KERNEL_HEAD_DIMS.get((self.direction, self.kernel), HEAD_DIMS)
        if self.d not in dims:
            raise ValueError(f"{where}: kernel {self.kernel!r} runs at head dims {dims} only")
        if not self.measured or any(m.ms >= m.triton_ms for m in self.measured):
            raise ValueError(f"{where}: needs measurements, each faster than triton in the same run")
        if not isinstance(self.min_seq, int) or self.min_seq < 0:
            raise ValueError(f"{where}: min_seq must be an int >= 0, got {self.min_seq!r}")
        if any(m.ms < m.triton_ms or m.shape[2] >= self.min_seq for m in self.losses):
            raise ValueError(f"{where}: losses must be not faster than triton and shorter than min_seq "
                             f"{self.min_seq}")
        if not any(m.shape[2] >= self.min_seq for m in self.measured):
            raise ValueError(f"{where}: needs a measured win at a sequence length >= min_seq {self.min_seq}")

    @property
    def key(self) -> Tuple[str, str, int, bool, str]:
        return (self.direction, self.arch, self.d, self.causal, self.dtype)


@dataclass(frozen=True)
class KernelTable:
    entries: Tuple[KernelChoice, ...]
    rule: str = ""

    def __post_init__(self) -> None:
        keys = [e.key for e in self.entries]
        dup = sorted({k for k in keys if keys.count(k) > 1})
        if dup:
            raise ValueError(f"kernel table: more than one entry for {dup}")

    def lookup(self, direction: str, arch: str, d: int, causal: bool, dtype: str, n: int) -> Optional[KernelChoice]:
        """The entry for a call of sequence length n, None below its min_seq (a dict get and one comparison:
        each call under kernels="auto" runs this)."""
        e = self._index.get((direction, arch, d, causal, dtype))
        return e if e is not None and n >= e.min_seq else None

    @functools.cached_property
    def _index(self) -> Dict[Tuple[str, str, int, bool, str], KernelChoice]:
        """key -> entry (each call under kernels="auto" looks one up: a dict, not a scan)."""
        return {e.key: e for e in self.entries}


def choose(table: KernelTable, direction: str, kernels: str, capability: Optional[Tuple[int, int]], d: int,
           causal: bool, dtype: str, n: int) -> Optional[KernelChoice]:
    """The entry a call runs, None for the Triton kernels. capability: the CUDA device's (major, minor),
    None for tensors off CUDA; n: the call's sequence length (flash_dispatch: min(N_Q, N_K)). Only
    kernels="auto" consults the table."""
    if kernels != "auto" or capability is None:
        return None
    return table.lookup(direction, arch_name(capability), d, bool(causal), dtype, n)


# ----------------------------------------------------------------------------- JSON (one format, both ways)

def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


def table_from_json(data: Dict[str, Any]) -> KernelTable:
    """Raises ValueError naming the bad entry or field."""
    entries = []
    for raw in data.get("entries", ()):
        raw = dict(raw)
        try:
            measured, losses = (tuple(Measured(m["probe"], m["device"], tuple(m["shape"]), float(m["ms"]),
                                               float(m["triton_ms"]), float(m["err"]), str(m.get("quantity", "")))
                                      for m in raw.pop(f, ()))
                                for f in ("measured", "losses"))
            config = tuple((str(k), _tuples(v)) for k, v in sorted(raw.pop("config").items()))
            entries.append(KernelChoice(measured=measured, losses=losses, config=config, **raw))
        except (KeyError, TypeError) as e:
            raise ValueError(f"kernel table entry {raw}: missing or unknown field ({e})") from None
    return KernelTable(tuple(entries), str(data.get("rule", "")))


def table_to_json(table: KernelTable) -> Dict[str, Any]:
    def runs(ms: Tuple[Measured, ...]) -> list:
        return [dict(probe=m.probe, device=m.device, shape=list(m.shape), ms=m.ms, triton_ms=m.triton_ms,
                     err=m.err, **({"quantity": m.quantity} if m.quantity else {})) for m in ms]

    def entry(e: KernelChoice) -> Dict[str, Any]:
        out = dict(direction=e.direction, arch=e.arch, d=e.d, causal=e.causal, dtype=e.dtype, kernel=e.kernel,
                   config={k: list(v) if isinstance(v, tuple) else v for k, v in e.config})
        if e.min_seq:  # left out at 0 (every length), as the losses when none: entries without them unchanged
            out["min_seq"] = e.min_seq
        out["measured"] = runs(e.measured)
        if e.losses:
            out["losses"] = runs(e.losses)
        return out
    return {"rule": table.rule, "entries": [entry(e) for e in sorted(table.entries, key=lambda e: e.key)]}


def dumps(table: KernelTable) -> str:
    return json.dumps(table_to_json(table), indent=1) + "\n"


@functools.cache
def shipped_table() -> KernelTable:
    """The committed table (read once per process)."""
    return table_from_json(json.loads(resources.files(__package__).joinpath(TABLE_FILE).read_text()))


__all__ = ["DTYPES", "HEAD_DIMS", "KERNELS", "KERNEL_HEAD_DIMS", "KernelChoice", "KernelTable", "Measured",
           "TABLE_FILE", "arch_name", "choose", "config_pairs", "dumps", "shipped_table", "table_from_json",
           "table_to_json"]
