"""The do_bench-against-CUDA-events probe (tools/probes/do_bench_vs_events.py, issue 45) beside the headlines it checks
(leaderboard, flash_forward): its interleaved same-run ratio of ours and cuDNN per pass, and each side's do_bench
median against its own CUDA-event median. The headline itself stays `impl.report.ratio.headline`'s."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from impl.report.ratio import Headline, Timers, band

PATTERN = "do_bench_vs_events*.json"  # under reports/data/<device>/probes/
# the probe's names of the leaderboard's callables: ours (its --ours; files from before the option timed the compiled
# Triton path and name none) and the anchor
OURS, ANCHOR = "flash_triton", "sdpa_cudnn"


@dataclass(frozen=True)
class Spread:
    median: float
    q1: float
    q3: float
    n: int

    @classmethod
    def of(cls, d: dict) -> Spread:  # a probe row's median and, where it has them, quartiles and count
        return cls(d["median"], d.get("q1", d["median"]), d.get("q3", d["median"]), d.get("n", 0))

    def holds(self, x: float | None) -> bool:  # `x` lies within the interquartile range
        return x is not None and self.q1 <= x <= self.q3


@dataclass(frozen=True)
class TimerProbe:
    path: str  # the probe file, from the repository root
    device: str  # the GPU's name, as the probe gives it
    ours: str  # which of ours it timed beside the anchor ("flash_triton", "flash_auto")
    shape: tuple[int, int, int, int]  # batch, heads, seq, d
    dtype: str
    causal: bool
    interleaved: dict[str, Spread]  # per mode ("fwd", "fwd_bwd"): ours ÷ cuDNN over the interleaved pairs
    steps: dict[tuple[str, str, str], Spread]  # (step, impl, mode) -> the step's times (ms)

    def timers(self, impl: str, mode: str) -> Timers | None:
        """One side's event rounds and do_bench in the probe, read as the headline rule reads a row (`ratio.Timers`)."""
        ev, db = self.steps.get(("events", impl, mode)), self.steps.get(("do_bench", impl, mode))
        if ev is None:
            return None
        return Timers(ev.median / 1e3, None if db is None else db.median / 1e3,
                      band(ev.median / 1e3, iqr=(ev.q3 - ev.q1) / 1e3))

    def at(self, batch: int, heads: int, seq: int, d: int, dtype: str, causal: bool) -> bool:
        return self.shape == (batch, heads, seq, d) and self.dtype == dtype and self.causal == bool(causal)

    def matches(self, impl: str, mode: str, batch: int, heads: int, seq: int, d: int, dtype: str,
                causal: bool) -> bool:
        """It timed `impl` as ours in `mode` (interleaved) at this shape: the only probe a headline of `impl` there
        may stand beside."""
        return self.ours == impl and mode in self.interleaved and self.at(batch, heads, seq, d, dtype, causal)


def read(path: Path, rel: str) -> TimerProbe | None:
    """The probe file at `path` (named `rel` on the page); None where it holds no interleaved step."""
    doc = json.loads(path.read_text())
    rows = doc.get("rows") or []
    inter = {r["mode"]: Spread.of(r["ratio"]) for r in rows if r.get("step") == "interleaved" and r.get("ratio")}
    if not inter:
        return None
    steps = {(r["step"], r["impl"], r["mode"]): Spread.of(r)
             for r in rows if r.get("impl") and r.get("mode") and r.get("median") is not None}
    return TimerProbe(rel, doc.get("device", "–"), doc.get("ours", OURS), tuple(doc["shape"]), doc.get("dtype", ""),
                      bool(doc.get("causal")), inter, steps)


def probe_of(reports_dir: Path, device: str, impl: str, mode: str, *, batch: int, heads: int, seq: int, d: int,
             dtype: str, causal: bool) -> TimerProbe | None:
    """The device folder's probe of `impl` as ours in `mode` at this shape (`TimerProbe.matches`; the last such file
    by name where there are several), None without one: a probe of another of ours, mode or shape is never read as
    this one's (files from before the probe's --ours timed flash_triton)."""
    folder = reports_dir / "data" / device / "probes"
    for f in sorted(folder.glob(PATTERN), reverse=True) if folder.is_dir() else ():
        p = read(f, f"reports/data/{device}/probes/{f.name}")
        if p is not None and p.matches(impl, mode, batch, heads, seq, d, dtype, causal):
            return p
    return None


@dataclass(frozen=True)
class ProbeCheck:
    """One headline's ratios beside the probe's same pass (its interleaved ratio, each side's `Timers` in the probe)."""

    probe: TimerProbe
    mode: str
    interleaved: Spread
    event_ratio: float
    do_bench_ratio: float | None
    ours: Timers | None  # in the probe
    anchor: Timers | None


def check(probe: TimerProbe | None, h: Headline | None, mode: str) -> ProbeCheck | None:
    """`h` (a headline of `mode` at the probe's shape: the caller checks the shape) beside the probe."""
    if probe is None or h is None or mode not in probe.interleaved:
        return None
    return ProbeCheck(probe, mode, probe.interleaved[mode], h.ratio.value, h.do_bench.value if h.do_bench else None,
                      probe.timers(probe.ours, mode), probe.timers(ANCHOR, mode))
