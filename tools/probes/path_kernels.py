"""GPU probe (issue 47): what the public path launches, kernel by kernel, beside SDPA cuDNN's.

The timer probe (do_bench_vs_events.py, ffd9816) read flash_auto 1.03-1.05x cuDNN at 4x32x4096x128 forward, where
the Gluon forward kernel alone reads 1.00x in tools/probes/flash_gluon_fwd.py's do_bench. Either the path launches
more than the kernel (allocations zeroed, casts, the backward's preprocessing) or the kernel itself runs slower
when called through it. The profiler answers both: per call, each kernel's device time, the number of launches,
and the device's busy span from the first kernel's start to the last's end (span - kernel sum = idle gaps, the
host's share).

Each (shape, mode, L2 state) times flash_auto (FlashAttentionTriton.apply eager under
impl.workloads.attention.flash_options) and sdpa_cudnn on the same inputs, in R profiler windows of n calls each, the
order alternating per window. L2 "warm": calls back to back, as the suite's CUDA-event rounds time them (the
leaderboard's headline). "cold": an L2 flush (do_bench's 256 MB int32 buffer, added to rather than zeroed) before
every call, as do_bench and ncu (its default --cache-control all) time them; the flush's kernels are left out of the
sums (their names are learnt from a window of flushes alone, and a call launching a kernel of the same name is
refused), and the span is each call's own, from its first kernel to its last.
At 1x16x16384x64 the backward kernel read 1.10x cuDNN's warm (eca0b29, H100 and H200) against ~1.01-1.04x by
do_bench: the cold windows tell whether the L2 state is the difference.

    PYTHONPATH=src python tools/probes/path_kernels.py OUT.json [--shapes 4x32x4096x128 ...] [--modes fwd,bwd]
        [--l2 warm,cold] [--windows 6] [--calls 10]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from do_bench_vs_events import parse_modes, parse_shape  # noqa: E402

IMPLS = ("flash_auto", "sdpa_cudnn")
DTYPE = "bf16"
L2_STATES = ("warm", "cold")
FLUSH_BYTES = 256 * 1024 * 1024  # triton.testing.do_bench's L2 flush buffer


@dataclass(frozen=True)
class KernelTime:
    """One kernel's device time in one window (start, end in us on the device's clock)."""
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class Window:
    """n calls of one impl: per call, each kernel name's device ms and launch count, the kernels' summed device
    ms, and the device's busy span (first start to last end) in ms."""
    impl: str
    calls: int
    kernel_ms: dict[str, float]
    launches: dict[str, float]
    sum_ms: float
    span_ms: float
    clock_mhz: float | None = None  # the SM clock and the board's power sampled while the window's calls ran (NVML)
    power_w: float | None = None


def summarise(impl: str, calls: int, kernels: list[KernelTime], flush: frozenset[str] = frozenset(),
              gpu: tuple[float | None, float | None] = (None, None)) -> Window:
    """A window's kernels -> per-call figures. With `flush` (the flush's kernel names) each call was preceded by one
    flush: those are left out and the span is summed per call (flush to flush); refuses an empty window and a flush
    count other than `calls` (a call launching a kernel named like the flush would be misread)."""
    kernels = sorted(kernels, key=lambda k: k.start_us)
    calls_kernels = [k for k in kernels if k.name not in flush]
    if not calls_kernels:
        raise ValueError(f"{impl}: the profiler recorded no kernels in a window of {calls} calls")
    if flush and (n_flush := len(kernels) - len(calls_kernels)) != calls:
        raise ValueError(f"{impl}: {n_flush} kernels named like the L2 flush ({sorted(flush)}) in a window of {calls} "
                         "calls each after one flush: the call launches one of the same name")
    ms, n = defaultdict(float), defaultdict(int)
    for k in calls_kernels:
        ms[k.name] += (k.end_us - k.start_us) / 1e3
        n[k.name] += 1
    segments, current = [], []
    for k in kernels:
        if k.name in flush:
            segments, current = segments + ([current] if current else []), []
        else:
            current.append(k)
    segments += [current] if current else []
    span = sum(max(k.end_us for k in seg) - min(k.start_us for k in seg) for seg in segments) / 1e3
    return Window(impl, calls, {k: v / calls for k, v in ms.items()}, {k: v / calls for k, v in n.items()},
                  sum(ms.values()) / calls, span / calls, *gpu)


def medians(windows: list[Window]) -> dict:
    """Per impl: the windows' median sum and span, and each kernel's median ms and launches a call."""
    out = {}
    for impl in sorted({w.impl for w in windows}):
        ws = [w for w in windows if w.impl == impl]
        names = sorted({k for w in ws for k in w.kernel_ms}, key=lambda k: -statistics.median(
            w.kernel_ms.get(k, 0.0) for w in ws))
        clocks = [w.clock_mhz for w in ws if w.clock_mhz is not None]
        out[impl] = dict(sum_ms=statistics.median(w.sum_ms for w in ws),
                         span_ms=statistics.median(w.span_ms for w in ws),
                         clock_mhz=statistics.median(clocks) if clocks else None,
                         kernels={k: dict(ms=statistics.median(w.kernel_ms.get(k, 0.0) for w in ws),
                                          launches=statistics.median(w.launches.get(k, 0) for w in ws))
                                  for k in names})
    return out


def parse_l2(text: str) -> tuple[str, ...]:
    """"warm,cold" -> ("warm", "cold"): distinct L2 states among L2_STATES, in the order given."""
    states = tuple(t.strip() for t in text.split(",") if t.strip())
    if not states or len(set(states)) != len(states) or not set(states) <= set(L2_STATES):
        raise argparse.ArgumentTypeError(f"--l2 {text!r}: expected distinct states among {', '.join(L2_STATES)}, "
                                         "comma-separated")
    return states


def profile_window(fn, calls: int, flush=None) -> tuple[list[KernelTime], tuple[float | None, float | None]]:
    """The window's kernels, and the SM clock and board power (impl.bench.timers.gpu_sample) sampled once every call
    is enqueued (the device still busy with them)."""
    import torch

    from impl.bench.timers import gpu_sample
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            if flush is not None:
                flush()
            fn()
        gpu = gpu_sample(torch.device("cuda"))  # an H100 at its 700 W cap moves its clock (NOTES.md)
        torch.cuda.synchronize()
    return [KernelTime(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA], gpu


def callables(shape, modes):
    import torch

    from impl.attention import FlashAttentionTriton
    from impl.workloads.attention import attention_inputs, attention_step, flash_options, sdpa_anchor

    q, k, v, do = attention_inputs(shape, DTYPE, torch.device("cuda"))
    options = flash_options("flash_auto")
    attns = {"flash_auto": lambda q, k, v: FlashAttentionTriton.apply(q, k, v, True, options),
             "sdpa_cudnn": sdpa_anchor("sdpa_cudnn", causal=True)}
    return {(impl, mode): attention_step(attns[impl], mode, q, k, v, do) for mode in modes for impl in IMPLS}


def table(doc: dict) -> str:
    lines = []
    for run in doc["runs"]:
        lines.append(f"== {run['shape']} {run['mode']} L2 {run.get('l2', 'warm')}")  # eca0b29's runs: warm
        m = run["medians"]
        for impl, r in m.items():
            clock = f"  {r['clock_mhz']:.0f} MHz" if r.get("clock_mhz") else ""
            lines.append(f"  {impl:11s} sum {r['sum_ms']:.4f} ms  span {r['span_ms']:.4f} ms{clock}")
            for name, kr in r["kernels"].items():
                lines.append(f"      {kr['ms']:.4f} ms x{kr['launches']:.1f}  {name[:110]}")
        a, b = m["flash_auto"], m["sdpa_cudnn"]
        lines.append(f"  ours/cuDNN: kernel sum {a['sum_ms'] / b['sum_ms']:.3f}, "
                     f"span {a['span_ms'] / b['span_ms']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=[(4, 32, 4096, 128)])
    p.add_argument("--modes", type=parse_modes, default=("fwd", "bwd"))
    p.add_argument("--l2", type=parse_l2, default=L2_STATES)
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--calls", type=int, default=10)
    args = p.parse_args(argv)
    import torch

    doc = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype=DTYPE, causal=True, runs=[])
    t0 = time.time()
    cache = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int, device="cuda")
    flush = lambda: cache.add_(1)  # noqa: E731 - evicts L2 as do_bench's zero_ does; zero_ may run as a memset,
    # a kernel name cuDNN's own calls launch too
    flush_names = frozenset(k.name for k in profile_window(lambda: None, 3, flush)[0])
    doc["flush_kernels"] = sorted(flush_names)
    for shape in args.shapes:
        fns = callables(shape, args.modes)
        for fn in fns.values():  # compile, autotune, plan; then warm
            for _ in range(3):
                fn()
        for mode in args.modes:
            for l2 in args.l2:
                cold = l2 == "cold"
                windows = []
                for w in range(args.windows):
                    for impl in (IMPLS if w % 2 == 0 else IMPLS[::-1]):
                        kernels, gpu = profile_window(fns[(impl, mode)], args.calls, flush if cold else None)
                        windows.append(summarise(impl, args.calls, kernels, flush_names if cold else frozenset(), gpu))
                doc["runs"].append(dict(shape="x".join(map(str, shape)), mode=mode, l2=l2, medians=medians(windows),
                                        windows=[asdict(w) for w in windows]))
                args.out.write_text(json.dumps(doc, indent=1))
        del fns
        torch.cuda.empty_cache()
    print(table(doc))
    print(f"{time.time() - t0:.0f} s; {doc['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
