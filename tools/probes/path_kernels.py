"""GPU probe (issue 47): what the public path launches, kernel by kernel, beside SDPA cuDNN's.

The timer probe (do_bench_vs_events.py, ffd9816) read flash_auto 1.03-1.05x cuDNN at 4x32x4096x128 forward, where
the Gluon forward kernel alone reads 1.00x in tools/probes/flash_gluon_fwd.py's do_bench. Either the path launches
more than the kernel (allocations zeroed, casts, the backward's preprocessing) or the kernel itself runs slower
when called through it. The profiler answers both: per call, each kernel's device time, the number of launches,
and the device's busy span from the first kernel's start to the last's end (span - kernel sum = idle gaps, the
host's share).

Each (shape, mode) times flash_auto (FlashAttentionTriton.apply eager under impl.workloads.attention.flash_options)
and sdpa_cudnn on the same inputs, in R profiler windows of n calls each, the order alternating per window.

    PYTHONPATH=src python tools/probes/path_kernels.py OUT.json [--shapes 4x32x4096x128 ...] [--modes fwd,bwd]
        [--windows 6] [--calls 10]
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


def summarise(impl: str, calls: int, kernels: list[KernelTime]) -> Window:
    """A window's kernels -> per-call figures; refuses an empty window (the profiler saw no device work)."""
    if not kernels:
        raise ValueError(f"{impl}: the profiler recorded no kernels in a window of {calls} calls")
    ms, n = defaultdict(float), defaultdict(int)
    for k in kernels:
        ms[k.name] += (k.end_us - k.start_us) / 1e3
        n[k.name] += 1
    span = (max(k.end_us for k in kernels) - min(k.start_us for k in kernels)) / 1e3
    return Window(impl, calls, {k: v / calls for k, v in ms.items()}, {k: v / calls for k, v in n.items()},
                  sum(ms.values()) / calls, span / calls)


def medians(windows: list[Window]) -> dict:
    """Per impl: the windows' median sum and span, and each kernel's median ms and launches a call."""
    out = {}
    for impl in sorted({w.impl for w in windows}):
        ws = [w for w in windows if w.impl == impl]
        names = sorted({k for w in ws for k in w.kernel_ms}, key=lambda k: -statistics.median(
            w.kernel_ms.get(k, 0.0) for w in ws))
        out[impl] = dict(sum_ms=statistics.median(w.sum_ms for w in ws), span_ms=statistics.median(w.span_ms for w in ws),
                         kernels={k: dict(ms=statistics.median(w.kernel_ms.get(k, 0.0) for w in ws),
                                          launches=statistics.median(w.launches.get(k, 0) for w in ws))
                                  for k in names})
    return out


def profile_window(fn, calls: int) -> list[KernelTime]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    return [KernelTime(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA]


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
        lines.append(f"== {run['shape']} {run['mode']}")
        m = run["medians"]
        for impl, r in m.items():
            lines.append(f"  {impl:11s} sum {r['sum_ms']:.4f} ms  span {r['span_ms']:.4f} ms")
            for name, kr in r["kernels"].items():
                lines.append(f"      {kr['ms']:.4f} ms x{kr['launches']:.1f}  {name[:110]}")
        a, b = m["flash_auto"], m["sdpa_cudnn"]
        lines.append(f"  ours/cuDNN: kernel sum {a['sum_ms'] / b['sum_ms']:.3f}, span {a['span_ms'] / b['span_ms']:.3f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--shapes", nargs="+", type=parse_shape, default=[(4, 32, 4096, 128)])
    p.add_argument("--modes", type=parse_modes, default=("fwd", "bwd"))
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--calls", type=int, default=10)
    args = p.parse_args(argv)
    import torch

    doc = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, dtype=DTYPE, causal=True, runs=[])
    t0 = time.time()
    for shape in args.shapes:
        fns = callables(shape, args.modes)
        for fn in fns.values():  # compile, autotune, plan; then warm
            for _ in range(3):
                fn()
        for mode in args.modes:
            windows = []
            for w in range(args.windows):
                for impl in (IMPLS if w % 2 == 0 else IMPLS[::-1]):
                    windows.append(summarise(impl, args.calls, profile_window(fns[(impl, mode)], args.calls)))
            doc["runs"].append(dict(shape="x".join(map(str, shape)), mode=mode, medians=medians(windows),
                                    windows=[asdict(w) for w in windows]))
            args.out.write_text(json.dumps(doc, indent=1))
        del fns
        torch.cuda.empty_cache()
    print(table(doc))
    print(f"{time.time() - t0:.0f} s; {doc['device']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
