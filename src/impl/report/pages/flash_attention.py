"""flash_forward and flash_backward: what the code does (its tile defaults and backward choice, read
from impl.attention), the tests that pin it, the backward-variants probe (two-pass against atomic,
reports/data/<device>/probes/) and, for the scoreboard, ours against cuDNN at the leaderboard shape.
templates/flash_attention.md.j2 holds every word."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass
from pathlib import Path

from impl.attention import backward_choice, flash_torch
from impl.report.flash_rows import median_ms, newest_date, over, pick
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import Ratio
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_FORWARD, P.FLASH_BACKWARD)
PROBE = "flash_bwd_variants-v4.json"


@dataclass(frozen=True)
class ProbeShape:
    """One probe shape's times (ms): each backward alone and with its forward."""

    shape: str  # b×h×s×d [causal]
    label: str
    bwd_two_pass: float
    bwd_atomic: float
    e2e_two_pass: float
    e2e_atomic: float

    @property
    def atomic_over_two_pass(self) -> float:
        return self.e2e_atomic / self.e2e_two_pass


@dataclass(frozen=True)
class BackwardProbe:
    device: str  # the GPU's name, as the probe file gives it
    folder: str  # the device folder under reports/data/
    path: str  # the probe file, from the repository root
    shapes: tuple[ProbeShape, ...]

    @property
    def slower_e2e(self) -> int:
        """Shapes where the atomic backward's forward+backward was slower than the two-pass one's."""
        return sum(s.e2e_atomic > s.e2e_two_pass for s in self.shapes)

    @property
    def slower_bwd(self) -> int:
        return sum(s.bwd_atomic > s.bwd_two_pass for s in self.shapes)


def backward_probe(doc: dict, folder: str = "", path: str = "") -> BackwardProbe:
    """The backward-variants probe file's shapes that timed both variants both ways."""
    shapes = []
    for r in doc["rows"]:
        ms, s = r["ms"], r["shape"]
        times = [ms.get(k) for k in ("ours bwd two_pass", "ours bwd atomic", "ours fwd+bwd two_pass",
                                     "ours fwd+bwd atomic")]
        if None in times:
            continue
        shape = f"{s['batch']}×{s['heads']}×{s['seq']}×{s['d']}" + (" causal" if s["causal"] else "")
        shapes.append(ProbeShape(shape, s.get("label") or "", *times))
    return BackwardProbe(doc["device"], folder, path, tuple(shapes))


@dataclass(frozen=True)
class Anchor:
    """Ours against SDPA cuDNN at the leaderboard shape (one device's newest leaderboard rows)."""

    device: str  # the GPU's name
    date: str
    forward_ms: float
    forward_vs: Ratio
    backward_ms: float | None = None  # forward+backward less the forward, of one run
    cudnn_backward_ms: float | None = None


def _anchor(ctx: Context) -> Anchor | None:
    """The first GPU device whose leaderboard rows have ours' and cuDNN's forward."""
    for device in ctx.rows.gpu_devices():
        lb = ctx.rows.of(P.LEADERBOARD, device=device)
        ours, cudnn = pick(lb, impl="flash_triton", mode="fwd"), pick(lb, impl="sdpa_cudnn", mode="fwd")
        if ours is None or cudnn is None:
            continue
        ours2, cudnn2 = pick(lb, impl="flash_triton", mode="fwd_bwd"), pick(lb, impl="sdpa_cudnn", mode="fwd_bwd")
        backward = () if ours2 is None or cudnn2 is None else (median_ms(ours2) - median_ms(ours),
                                                                median_ms(cudnn2) - median_ms(cudnn))
        return Anchor(ours.row.env.device, newest_date(lb), median_ms(ours), over(ours, cudnn, "cuDNN"), *backward)
    return None


def _probe(ctx: Context) -> BackwardProbe | None:
    """The first GPU device's backward-variants probe."""
    for device in ctx.rows.gpu_devices():
        path = ctx.reports_dir / "data" / device / "probes" / PROBE
        if path.exists():
            return backward_probe(json.loads(path.read_text()), device, f"reports/data/{device}/probes/{PROBE}")
    return None


def _tests(root: Path, *patterns: str) -> tuple[str, ...]:
    """Names of the tests in root's correctness/test_attention.py containing each pattern, in turn."""
    path = root / "correctness" / "test_attention.py"
    if not path.exists():
        return ()
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("def test_")]
    return tuple(ln.split("(")[0][4:] for p in patterns for ln in lines if p in ln)


@dataclass(frozen=True)
class FlashAttentionPage:
    block_q: int  # flash_forward_torch's default tiles
    block_k: int
    atomic_min_work: float | None  # score elements from which the atomic backward is picked; None: never
    tests: tuple[str, ...]  # correctness/test_attention.py's tests of both implementations
    probe: BackwardProbe | None
    anchor: Anchor | None
    index_figures: tuple = ()

    @property
    def scores(self) -> dict[str, Scored]:
        # answered from the code where no GPU row measures it
        a, code = self.anchor, Scored(Kind.CLOSED_FORM)
        measured = None if a is None else Scored(Kind.MEASURED, a.device, a.date)
        return {P.FLASH_FORWARD: measured or code,
                P.FLASH_BACKWARD: measured if a is not None and a.backward_ms is not None else code}

    @property
    def sources(self) -> list[str]:
        return [self.probe.path] if self.probe else []


def facts(ctx: Context) -> FlashAttentionPage:
    sig = inspect.signature(flash_torch.flash_forward_torch).parameters
    threshold = backward_choice.ATOMIC_MIN_WORK
    root = ctx.reports_dir.parent  # the repository whose report is built: its tests are listed
    return FlashAttentionPage(sig["block_q"].default, sig["block_k"].default,
                              None if threshold == float("inf") else threshold,
                              _tests(root, "flash", "backward_variants"), _probe(ctx), _anchor(ctx))
