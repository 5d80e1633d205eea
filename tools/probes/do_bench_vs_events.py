"""GPU probe (issue 45): why does triton.testing.do_bench read SDPA cuDNN's forward+backward 16% above its own
CUDA-event median at the leaderboard shape while ours barely moves, and ours' forward 16% above while cuDNN's
barely moves? (reports/data/h100-80gb-x1/leaderboard/20261124T210448Z_95227b00+.json; NOTES.md, "Issue 45:
do_bench against CUDA events", has the hypotheses this tells apart.)

The two callables are the leaderboard's own (perf/test_leaderboard.py): torch.compile(FlashAttentionTriton.apply)
with FlashOptions(backward="triton", autotune=True) and SDPA restricted to the cuDNN backend, at bf16, causal,
1×16×16384×64, forward and forward+backward (input gradients reset first: impl.workloads.attention.attention_step).
Options (issue 47; the defaults are the run above): --ours flash_auto times the leaderboard's other row of ours,
torch.compile(FlashAttentionTriton.apply) under FlashOptions(kernels="auto") (impl.workloads.attention.flash_options:
the Gluon kernels the kernel table names) in place of the Triton kernels (eager before 2026-11-28, as the leaderboard
ran it then; the JSON's "compiled" says which, absent: flash_auto eager); --shape BxHxNxD another causal shape;
--modes a comma-separated subset of fwd_bwd, fwd and bwd, in run order. "bwd" times the backward alone through
autograd: one forward runs at setup and every call walks its saved graph again (retain_graph), so the public
path's backward (autograd, the backward's preprocessing, the dQ cast) is timed without the forward. (Under
torch.compile AOTAutograd may refuse retain_graph for a backward with donated buffers: the mode is then left out
with its error, the others kept.) The JSON records ours, shape and modes; impl.report.timer_probe sets a probe
beside a headline only where both match.
Each (impl, mode) is timed by these methods on one warm process (run order: METHODS, do_bench_fresh first):

  events          the suite's timer: rounds of k back-to-back calls between two CUDA events (k: a round >= 25 ms),
                  30 rounds, per-call median (impl.bench.timers.CudaEventTimer's way)
  events_barrier  the same rounds with a tiny kernel (a 4-byte zero_) before every call, less the rounds of those
                  alone: breaks any overlap of one call's tail with the next call's head (PDL, a side stream)
                  without evicting L2
  events_flush    the same rounds with do_bench's L2 flush (its 256 MB zero_) before every call, less the same
                  rounds of flushes alone: cold L2, the host still runs ahead of the device
  alone           every call alone: synchronise, event, call, event (no flush): the host's launch is exposed,
                  L2 warm from the previous call
  do_bench_fresh  triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all") right after the first calls,
                  before any timed rounds of that implementation
  do_bench        the same right after the events rounds: the suite's cross-check, in the suite's order
  do_bench_after_alone  the same right after the calls alone (the suite's rounds before 2026-11-23 22:37)
  do_bench_noflush  the same with the driver's clear_cache made a no-op for the call (do_bench has no argument
                  for it in triton 3.6: it always zeroes the buffer)
  do_bench_spin   do_bench's own loop (copied from triton 3.6's testing.py) with a ~1 ms GPU spin
                  (torch.cuda._sleep) enqueued after each flush and before the start event: cold L2 kept, the
                  host gets ahead before the timed call
  do_bench_long   triton.testing.do_bench(fn, warmup=250, rep=1000): ten times the warm-up and the calls
  interleaved     (per mode) R repeats of one events round of ours then one of cuDNN (order alternating): the
                  per-repeat ratio's median and IQR, the headline rule's other source
and, per (impl, mode), the host's time to enqueue one call while the device is busy, the flush's own device
time, and the caching allocator's counters (cudaMalloc segments, allocations, retries) over a do_bench call and
over an events round.

Reading it (NOTES.md, hypotheses H1-H6):
  H1 cold L2: events_flush and do_bench close; events_barrier and do_bench_noflush near events.
  H2 the host's launch exposed: do_bench_spin near events while do_bench is not; alone >= do_bench; the host's
     enqueue time above the flush's device time.
  H3 do_bench's warm-up estimate and sample: do_bench_long near events, or do_bench's "all" times falling from
     the first half to the second.
  H4 the allocator / cuDNN's workspace: segments allocated during do_bench but not during events rounds.
  H5 overlap across calls in back-to-back rounds: events_barrier already near do_bench.
  H6 state left by the timed rounds: do_bench_fresh and do_bench_after_alone near events (or near the pre-22:37
     do_bench, 4.36-4.52 ms for cuDNN) while do_bench right after the events rounds is not; the GPU's clock,
     temperature and power are recorded before and after every step.

    PYTHONPATH=src python tools/probes/do_bench_vs_events.py OUT.json [--budget-s 420] [--dry-run]
        [--ours flash_triton|flash_auto] [--shape 1x16x16384x64] [--modes fwd_bwd,fwd]
writes OUT.json after every measurement ({"device", "ours", "shape", "modes", "plan", "rows": [...],
"left_out": [...]}); a method is started only while the elapsed time plus its estimate is within --budget-s (the
estimates are an H100's at the leaderboard shape, about twice what the 2fbd353 run took; the process's start,
~15 s, is outside them). --dry-run prints the plan and its estimate and writes them without touching the GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from impl.workloads.attention import FLASH_IMPLS, STEP_MODES

SHAPE = (1, 16, 16384, 64)  # batch, heads, seq, d: the leaderboard's (2025), the default
DTYPE = "bf16"
OURS, ANCHOR = "flash_triton", "sdpa_cudnn"  # --ours' default (one of FLASH_IMPLS) and the anchor
MODES = ("fwd_bwd", "fwd")  # --modes' default; any of STEP_MODES ("bwd": the backward alone through autograd)
# the suite's order first (its rounds, then do_bench right after them), then the variants
METHODS = ("events", "do_bench", "events_barrier", "events_flush", "alone", "do_bench_after_alone", "do_bench_noflush",
           "do_bench_spin", "do_bench_long")
ROUNDS, ROUND_MS, INTERLEAVED = 30, 25.0, 20
# seconds each step is expected to take on an H100 (ours' first call compiles and autotunes: 29 s in the run;
# 39.5 s at 2fbd353). flash_auto's first calls compile the Gluon kernels the table names, no autotuning (5.6 s for
# the leaderboard's fwd+bwd row at 026db39, after flash_triton's in the same process); a half the table names no
# kernel for autotunes Triton's; compiled since 2026-11-28 (torch.compile's trace, ~10-20 s), hence 40 s.
ESTIMATE_S = {"setup:flash_triton": 60.0, "setup:flash_auto": 40.0, "setup:sdpa_cudnn": 5.0, "do_bench_fresh": 1.0,
              "do_bench_after_alone": 1.0, "events": 2.0, "events_barrier": 4.0, "events_flush": 4.0, "alone": 1.0,
              "do_bench": 1.0, "do_bench_noflush": 1.0, "do_bench_spin": 1.0, "do_bench_long": 3.0, "interleaved": 3.0}


@dataclass(frozen=True)
class Config:
    """What one run times: ours (`flash_triton`: the Triton kernels; `flash_auto`: the kernel table's; both
    compiled, as the leaderboard runs them) beside SDPA cuDNN, at `shape` (causal, DTYPE), in `modes`."""

    ours: str = OURS
    shape: tuple[int, int, int, int] = SHAPE
    modes: tuple[str, ...] = MODES

    @property
    def impls(self) -> tuple[str, str]:
        return self.ours, ANCHOR

    def record(self) -> dict:  # the JSON's fields (the report matches a probe to a headline by ours and shape)
        return dict(ours=self.ours, shape=list(self.shape), modes=list(self.modes), dtype=DTYPE, causal=True,
                    compiled=True)


def parse_shape(text: str) -> tuple[int, int, int, int]:
    """"BxHxNxD" -> (batch, heads, seq, d), each a positive integer."""
    parts = text.lower().split("x")
    if len(parts) != 4 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"--shape {text!r}: expected BxHxNxD, four positive integers "
                                         "(batch, heads, seq, d), e.g. 1x16x16384x64")
    return tuple(int(p) for p in parts)  # type: ignore[return-value]


def parse_modes(text: str) -> tuple[str, ...]:
    """"fwd_bwd,fwd" -> ("fwd_bwd", "fwd"): a comma-separated subset of STEP_MODES, in the order given."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in STEP_MODES]
    if not modes or bad or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"--modes {text!r}: expected distinct modes among {', '.join(STEP_MODES)}, "
                                         f"comma-separated{f' (unknown: {bad})' if bad else ''}")
    return modes


def plan(cfg: Config = Config()) -> list[tuple[str, str | None, str | None]]:
    """(step, impl, mode) in the order they run: each implementation's setup, its methods for every mode, then
    the interleaved repeats of each mode (both implementations are set up by then)."""
    steps: list[tuple[str, str | None, str | None]] = []
    for impl in cfg.impls:
        steps.append((f"setup:{impl}", impl, None))
        steps += [("do_bench_fresh", impl, mode) for mode in cfg.modes]  # before any timed rounds of the impl
        steps += [(m, impl, mode) for mode in cfg.modes for m in METHODS]
    steps += [("interleaved", None, mode) for mode in cfg.modes]
    return steps


def estimate_s(steps) -> float:
    return sum(ESTIMATE_S[s[0]] for s in steps)


def quartiles(xs: list[float]) -> dict:
    xs = sorted(xs)
    if len(xs) < 2:
        return dict(median=xs[0] if xs else None, q1=None, q3=None, n=len(xs))
    q1, _, q3 = statistics.quantiles(xs, n=4)
    return dict(median=statistics.median(xs), q1=q1, q3=q3, n=len(xs))


class Probe:
    def __init__(self, out: Path, budget_s: float, cfg: Config = Config()):
        import torch

        self.torch, self.out, self.budget_s, self.cfg, self.t0 = torch, out, budget_s, cfg, time.time()
        self.device = torch.device("cuda")
        self.doc = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, **cfg.record(),
                        budget_s=budget_s, plan=[list(s) for s in plan(cfg)], rows=[], left_out=[])
        self.fns: dict = {}  # (impl, mode) -> callable
        self.cache = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.int, device=self.device)  # do_bench's size
        self.tiny = torch.empty(1, dtype=torch.int, device=self.device)
        self.spin_cycles = self._calibrate_spin(1.0)

    # --- helpers -------------------------------------------------------------------------------------------
    def sync(self):
        self.torch.cuda.synchronize()

    def event(self):
        e = self.torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def _calibrate_spin(self, ms: float) -> int:
        """torch.cuda._sleep cycles for about `ms` of device time."""
        cycles = 1_000_000
        self.sync()
        a = self.event()
        self.torch.cuda._sleep(cycles)
        b = self.event()
        self.sync()
        return max(1, int(cycles * ms / max(a.elapsed_time(b), 1e-3)))

    def flush(self):
        self.cache.zero_()  # triton 3.6's clear_cache

    def save(self):
        tmp = self.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1))
        os.replace(tmp, self.out)

    def alloc_counters(self) -> dict:
        s = self.torch.cuda.memory_stats(self.device)
        keys = ("segment.all.allocated", "allocation.all.allocated", "num_alloc_retries", "num_device_alloc",
                "num_device_free", "num_sync_all_streams")
        return {k: s.get(k) for k in keys}

    def gpu_state(self) -> dict:
        """Clock (MHz), temperature (C) and power (mW) through torch's NVML wrappers; None where unavailable."""
        out = {}
        for name in ("clock_rate", "temperature", "power_draw"):
            try:
                out[name] = getattr(self.torch.cuda, name)(self.device)
            except Exception:  # noqa: BLE001 - pynvml missing or the query unsupported
                out[name] = None
        return out

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        return {k: (b[k] - a[k]) if a.get(k) is not None and b.get(k) is not None else None for k in a}

    # --- setup ---------------------------------------------------------------------------------------------
    def setup(self, impl: str) -> dict:
        """The leaderboard's callable of `impl` (perf/test_leaderboard.py: both of ours compiled, with
        impl.workloads.attention.flash_options) and each mode's first call; a mode whose first call
        fails is left out with its error, the others kept."""
        import torch

        from impl.attention import FlashAttentionTriton, LaunchRecorder
        from impl.workloads.attention import (attention_inputs, attention_step, flash_options, launch_kernels,
                                              sdpa_anchor)

        recorder = None
        if impl in FLASH_IMPLS:
            recorder = LaunchRecorder()
            options = flash_options(impl, recorder)
            apply = torch.compile(FlashAttentionTriton.apply)
            attn = lambda q, k, v: apply(q, k, v, True, options)  # noqa: E731
        else:
            attn = sdpa_anchor(impl, causal=True)
        q, k, v, do = attention_inputs(self.cfg.shape, DTYPE, self.device)
        t, errors = time.perf_counter(), {}
        for mode in self.cfg.modes:
            try:
                fn = attention_step(attn, mode, q, k, v, do)
                fn()  # compile and autotune (ours), cuDNN's plan
                self.fns[(impl, mode)] = fn
            except Exception as exc:  # noqa: BLE001 - the mode's steps are left out as not set up
                errors[mode] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                torch.cuda.empty_cache()
        self.sync()
        return dict(first_calls_s=time.perf_counter() - t, tuned=recorder.summary() if recorder else None,
                    kernels=launch_kernels(recorder) if recorder else None, mode_errors=errors)

    # --- methods (ms per call) -----------------------------------------------------------------------------
    def per_call_k(self, fn) -> int:
        self.sync()
        a = self.event()
        for _ in range(3):
            fn()
        b = self.event()
        self.sync()
        return max(1, int(ROUND_MS / max(a.elapsed_time(b) / 3, 1e-3)))

    def rounds(self, body, k: int, n: int = ROUNDS) -> list[float]:
        """n rounds of body() called k times between two events (each round starting on an idle device, as
        CudaEventTimer's do): per-call ms of each round."""
        out = []
        for _ in range(3):  # warm-up rounds
            body()
        for _ in range(n):
            self.sync()
            a = self.event()
            for _ in range(k):
                body()
            b = self.event()
            self.sync()
            out.append(a.elapsed_time(b) / k)
        return out

    def m_events(self, fn):
        k = self.per_call_k(fn)
        before = self.alloc_counters()
        xs = self.rounds(fn, k)
        return dict(quartiles(xs), k=k, allocator=self.delta(before, self.alloc_counters()))

    def _events_with(self, fn, before):
        """Rounds of k × (before(); fn()), less the median of rounds of before() alone."""
        k = self.per_call_k(fn)

        def both():
            before()
            fn()
        with_it, alone = self.rounds(both, k), self.rounds(before, k)
        f = statistics.median(alone)
        return dict(quartiles([x - f for x in with_it]), k=k, before_ms=f, with_before=quartiles(with_it))

    def m_events_flush(self, fn):
        return self._events_with(fn, self.flush)

    def m_events_barrier(self, fn):
        return self._events_with(fn, self.tiny.zero_)

    def m_alone(self, fn):
        xs = []
        for i in range(3 + ROUNDS):
            self.sync()
            a = self.event()
            fn()
            b = self.event()
            self.sync()
            if i >= 3:
                xs.append(a.elapsed_time(b))
        return quartiles(xs)

    def _do_bench(self, fn, warmup=25, rep=100):
        from triton.testing import do_bench

        before = self.alloc_counters()
        xs = do_bench(fn, warmup=warmup, rep=rep, return_mode="all")
        half = len(xs) // 2
        return dict(quartiles(xs), first_half=quartiles(xs[:half]) if half else None,
                    second_half=quartiles(xs[half:]), times=xs, allocator=self.delta(before, self.alloc_counters()))

    def m_do_bench(self, fn):
        return self._do_bench(fn)

    def m_do_bench_fresh(self, fn):
        return self._do_bench(fn)

    def m_do_bench_after_alone(self, fn):
        return self._do_bench(fn)

    def m_do_bench_long(self, fn):
        return self._do_bench(fn, warmup=250, rep=1000)

    def m_do_bench_noflush(self, fn):
        from triton import runtime

        drv = runtime.driver.active
        with _patched(drv, "clear_cache", lambda cache: None):
            return self._do_bench(fn)

    def m_do_bench_spin(self, fn, warmup=25, rep=100):
        """triton 3.6's do_bench loop (its estimate, warm-up and timed calls), the flush kept, plus a GPU spin
        after each flush so the host enqueues the call before the device reaches the start event."""
        fn()
        self.sync()
        a = self.event()
        for _ in range(5):
            self.flush()
            fn()
        b = self.event()
        self.sync()
        estimate = a.elapsed_time(b) / 5
        n_warmup, n_repeat = max(1, int(warmup / estimate)), max(1, int(rep / estimate))
        starts = [self.torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        ends = [self.torch.cuda.Event(enable_timing=True) for _ in range(n_repeat)]
        for _ in range(n_warmup):
            fn()
        for i in range(n_repeat):
            self.flush()
            self.torch.cuda._sleep(self.spin_cycles)
            starts[i].record()
            fn()
            ends[i].record()
        self.sync()
        xs = [s.elapsed_time(e) for s, e in zip(starts, ends)]
        return dict(quartiles(xs), times=xs, n_warmup=n_warmup, n_repeat=n_repeat, spin_cycles=self.spin_cycles)

    def host_enqueue(self, fn) -> dict:
        """Host ms to enqueue one call while the device is busy (a ~50 ms spin ahead of it), 5 calls."""
        xs = []
        for _ in range(5):
            self.sync()
            self.torch.cuda._sleep(self.spin_cycles * 50)
            t = time.perf_counter()
            fn()
            xs.append((time.perf_counter() - t) * 1e3)
        self.sync()
        return quartiles(xs)

    def interleaved(self, mode: str) -> dict:
        ours, cudnn = (self.fns[(impl, mode)] for impl in self.cfg.impls)
        k = min(self.per_call_k(ours), self.per_call_k(cudnn))
        ratios, pairs = [], []
        for i in range(INTERLEAVED):
            order = (("ours", ours), ("cudnn", cudnn)) if i % 2 == 0 else (("cudnn", cudnn), ("ours", ours))
            got = {name: statistics.median(self.rounds(fn, k, n=1)) for name, fn in order}
            pairs.append(got)
            ratios.append(got["ours"] / got["cudnn"])
        return dict(ratio=quartiles(ratios), k=k, pairs=pairs)

    # --- the run -------------------------------------------------------------------------------------------
    def run(self) -> None:
        for step, impl, mode in plan(self.cfg):
            elapsed = time.time() - self.t0
            if elapsed + ESTIMATE_S[step] > self.budget_s:
                self.doc["left_out"].append(dict(step=step, impl=impl, mode=mode, why="budget"))
                continue
            row = dict(step=step, impl=impl, mode=mode, gpu_before=self.gpu_state())
            try:
                if step.startswith("setup:"):
                    row.update(self.setup(impl))
                elif step == "interleaved":
                    if not all((i, mode) in self.fns for i in self.cfg.impls):
                        self.doc["left_out"].append(dict(step=step, mode=mode, why="an implementation is not set up"))
                        continue
                    row.update(self.interleaved(mode))
                else:
                    fn = self.fns.get((impl, mode))
                    if fn is None:
                        self.doc["left_out"].append(dict(step=step, impl=impl, mode=mode, why="not set up"))
                        continue
                    row.update(getattr(self, f"m_{step}")(fn))
                    if step == "events":
                        row["host_enqueue_ms"] = self.host_enqueue(fn)
            except Exception as exc:  # noqa: BLE001 - a failing step is a row with its error
                row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                self.torch.cuda.empty_cache()
            row["gpu_after"] = self.gpu_state()
            row["elapsed_s"] = round(time.time() - self.t0, 1)
            self.doc["rows"].append(row)
            self.save()
            med = row.get("median", (row.get("ratio") or {}).get("median"))
            print(f"{row['elapsed_s']:7.1f}s {step:18s} {impl or '':13s} {mode or '':8s} "
                  f"{'' if med is None else f'{med:.4f}'} {row.get('error', '')}", flush=True)
        self.save()
        print(summary(self.doc))


@contextlib.contextmanager
def _patched(obj, name, value):
    had = name in vars(obj)
    old = vars(obj).get(name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if had:
            setattr(obj, name, old)
        else:
            delattr(obj, name)


def summary(doc: dict) -> str:
    """Per (impl, mode): each method's median ms and its ratio to the events median."""
    lines, events = [], {}
    for r in doc["rows"]:
        if r["step"] == "events" and r.get("median"):
            events[(r["impl"], r["mode"])] = r["median"]
    for r in doc["rows"]:
        if r["step"] in METHODS and r.get("median") is not None:
            e = events.get((r["impl"], r["mode"]))
            lines.append(f"{r['impl']:13s} {r['mode']:8s} {r['step']:17s} {r['median']:.4f} ms"
                         + (f"  {r['median'] / e:.3f}× events" if e else ""))
        elif r["step"] == "interleaved" and r.get("ratio"):
            q = r["ratio"]
            lines.append(f"interleaved   {r['mode']:8s} ours/cuDNN median {q['median']:.3f} "
                         f"(IQR {q['q1']:.3f}–{q['q3']:.3f})")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "do_bench_vs_events.json"))
    ap.add_argument("--budget-s", type=float, default=420.0, help="start no step whose estimate would pass this")
    ap.add_argument("--dry-run", action="store_true", help="print and write the plan only")
    ap.add_argument("--ours", choices=FLASH_IMPLS, default=OURS,
                    help="flash_triton: torch.compile'd FlashAttentionTriton.apply (default); flash_auto: the same "
                         "under FlashOptions(kernels='auto') (both the leaderboard's rows' options)")
    ap.add_argument("--shape", type=parse_shape, default=SHAPE, help="BxHxNxD, causal (default 1x16x16384x64)")
    ap.add_argument("--modes", type=parse_modes, default=MODES,
                    help=f"comma-separated, in run order, among {','.join(STEP_MODES)} (default fwd_bwd,fwd)")
    args = ap.parse_args(argv)
    args.config = Config(args.ours, tuple(args.shape), tuple(args.modes))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    cfg, out = args.config, Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        steps = plan(cfg)
        print(f"ours {cfg.ours}, shape {'x'.join(map(str, cfg.shape))}, modes {','.join(cfg.modes)}")
        for s in steps:
            print(*[x or "" for x in s], ESTIMATE_S[s[0]], sep="\t")
        print(f"{len(steps)} steps, estimate {estimate_s(steps):.0f} s (budget {args.budget_s:.0f} s)")
        out.write_text(json.dumps(dict(cfg.record(), plan=[list(s) for s in steps], estimate_s=estimate_s(steps),
                                       dry_run=True), indent=1))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("needs a CUDA GPU (use --dry-run here)", file=sys.stderr)
        return 2
    Probe(out, args.budget_s, cfg).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
