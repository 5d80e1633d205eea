"""flash_forward and flash_backward: the code's tiles and backward choice (impl.attention), the tests that pin it,
the backward-variants probe and ours against cuDNN at the leaderboard shape, headlined by the report's one rule
(impl.report.ratio.headline: CUDA-event medians of one run, do_bench beside)."""
from __future__ import annotations

import inspect
import json
from dataclasses import dataclass

from impl.attention import default_options, flash_torch
from impl.report.flash_rows import Kernel, kernel, pick, probe_check
from impl.report.pages import Context, Kind, Scored
from impl.report.ratio import Headline, Ratio, headline, ratio, timers
from impl.report.rows import Bench
from impl.report.runs import files_of, newest_date
from impl.report.timer_probe import ProbeCheck
from impl.workloads.problems import Problem as P

PROBLEMS = (P.FLASH_FORWARD, P.FLASH_BACKWARD)
PROBE = "flash_bwd_variants-v4.json"  # under reports/data/<device>/probes/
PROBE_TIMES = ("ours bwd two_pass", "ours bwd atomic", "ours fwd+bwd two_pass", "ours fwd+bwd atomic")


@dataclass(frozen=True)
class ProbeShape:
    shape: dict  # as the probe stores it: batch, heads, seq, d, causal and a label
    bwd_two_pass: float  # ms, each backward alone and with its forward
    bwd_atomic: float
    e2e_two_pass: float
    e2e_atomic: float

    atomic_over_two_pass = property(lambda self: self.e2e_atomic / self.e2e_two_pass)


@dataclass(frozen=True)
class BackwardProbe:
    device: str  # the GPU's name, as the probe file gives it
    folder: str  # the device folder under reports/data/
    path: str  # the probe file, from the repository root
    shapes: tuple[ProbeShape, ...]  # those that timed both variants both ways

    # the shapes where the atomic forward+backward was the slower, and the same of the backward alone
    slower_e2e = property(lambda self: sum(s.e2e_atomic > s.e2e_two_pass for s in self.shapes))
    slower_bwd = property(lambda self: sum(s.bwd_atomic > s.bwd_two_pass for s in self.shapes))


def _probe(ctx: Context) -> BackwardProbe | None:  # the first GPU device's
    for device in ctx.rows.gpu_devices():
        path = ctx.reports_dir / "data" / device / "probes" / PROBE
        if path.exists():
            doc = json.loads(path.read_text())
            times = [(r["shape"], [r["ms"].get(k) for k in PROBE_TIMES]) for r in doc["rows"]]
            shapes = tuple(ProbeShape(shape, *ms) for shape, ms in times if None not in ms)
            return BackwardProbe(doc["device"], device, f"reports/data/{device}/probes/{PROBE}", shapes)
    return None


@dataclass(frozen=True)
class Anchor:  # ours against SDPA cuDNN at the leaderboard shape (one device's newest leaderboard rows)
    device: str  # the GPU's name
    date: str
    forward: Headline  # ours ÷ cuDNN forward: CUDA-event medians, do_bench beside (impl.report.ratio)
    # ours ÷ cuDNN of the backward, forward+backward less the forward of one run (CUDA-event medians; each side's
    # spread the sum of its two rows')
    backward: Ratio | None = None
    backward_do_bench: Ratio | None = None  # the same differences of do_bench's medians, beside (no verdict)
    forward_backward: Headline | None = None  # the forward+backward rows the backward is read from
    sources: tuple[str, ...] = ()  # the leaderboard run files it read
    kernel: Kernel | None = None  # ours' forward row: its dtype and shape (templates/_kernels.md.j2 words it)
    probe: ProbeCheck | None = None  # the forward beside the do_bench-against-events probe at this shape


def _backward(ours: Bench, cudnn: Bench, ours2: Bench, cudnn2: Bench) -> tuple[Ratio | None, Ratio | None]:
    """Ours ÷ cuDNN of the backward, forward+backward (`ours2`, `cudnn2`) less the forward of one run: the CUDA-event
    medians' ratio (the headline rule; each side's spread the sum of its two rows') and do_bench's beside."""
    def less(x: float | None, y: float | None) -> float | None:
        return None if None in (x, y) else x - y
    (o, c), (o2, c2) = map(timers, (ours, cudnn)), map(timers, (ours2, cudnn2))
    spreads = (None if None in (x.spread, y.spread) else x.spread + y.spread
               for x, y in ((ours2, ours), (cudnn2, cudnn)))
    return (ratio(o2.event_s - o.event_s, c2.event_s - c.event_s, "cuDNN", *spreads),
            ratio(less(o2.do_bench_s, o.do_bench_s), less(c2.do_bench_s, c.do_bench_s), "cuDNN"))


def _anchor(ctx: Context) -> Anchor | None:  # the first GPU device with ours' and cuDNN's forward
    for device, lb in ctx.rows.per_gpu(P.LEADERBOARD):
        ours, cudnn, ours2, cudnn2 = (pick(lb, impl=i, mode=m) for m in ("fwd", "fwd_bwd")
                                      for i in ("flash_triton", "sdpa_cudnn"))
        if ours and cudnn:
            both = ours2 is not None and cudnn2 is not None
            h = headline(ours, cudnn, "cuDNN")
            pc = probe_check(ctx.reports_dir, device, ours, h, "fwd")
            used = [b for b in (ours, cudnn, ours2, cudnn2) if b is not None]
            backward, backward_do_bench = _backward(ours, cudnn, ours2, cudnn2) if both else (None, None)
            return Anchor(ours.row.env.device, newest_date(lb), h, backward, backward_do_bench,
                          headline(ours2, cudnn2, "cuDNN") if both else None,
                          tuple(files_of(used)) + ((pc.probe.path,) if pc else ()), kernel(ours), pc)
    return None


@dataclass(frozen=True)
class FlashAttentionPage:
    block_q: int  # flash_forward_torch's default tiles
    block_k: int
    atomic_min_work: float | None  # score elements from which the atomic backward is picked; None: never
    tests: tuple[str, ...]  # correctness/test_attention.py's tests of both implementations
    probe: BackwardProbe | None
    anchor: Anchor | None
    sources: tuple[str, ...] = ()

    @property
    def scores(self) -> dict[str, Scored]:  # answered from the code where no GPU row measures it
        a, code = self.anchor, Scored(Kind.CLOSED_FORM)
        fwd = code if a is None else Scored(Kind.MEASURED, a.device, a.date)
        return {P.FLASH_FORWARD: fwd, P.FLASH_BACKWARD: fwd if a and a.backward is not None else code}


def facts(ctx: Context) -> FlashAttentionPage:
    sig, work = inspect.signature(flash_torch.flash_forward_torch).parameters, default_options().atomic_min_work
    tests = ctx.reports_dir.parent / "correctness" / "test_attention.py"  # the built repository's
    lines = [ln for ln in tests.read_text().splitlines() if ln.startswith("def test_")] if tests.exists() else []
    probe, anchor = _probe(ctx), _anchor(ctx)
    sources = ((probe.path,) if probe else ()) + (anchor.sources if anchor else ())
    return FlashAttentionPage(sig["block_q"].default, sig["block_k"].default, None if work == float("inf") else work,
                              tuple(ln.split("(")[0][4:] for p in ("flash", "backward_variants") for ln in lines
                                    if p in ln), probe, anchor, sources)
