"""Runs one forward+backward of ours (the committed kernels, configs pinned to skip autotuning) and
of SDPA's cuDNN backend on the leaderboard shape between cudaProfilerStart/Stop, for Nsight
Compute's pipe utilisation (issue 10: is each kernel tensor-core, MUFU or issue bound?):
    ncu --profile-from-start off --section ComputeWorkloadAnalysis ... python tools/probes/flash_ncu.py FWD KV Q
FWD/KV/Q: tile configs as "BLOCK_M,BLOCK_N,warps,stages".

`require_gpu`, `profiled`, `ncu_line` and the argument parsers `shape_arg` / `variants_arg` are shared with
flash_ncu_bwd.py and flash_ncu_fwd_ws.py (issue 47's Gluon kernels)."""
import argparse
import shlex
import sys
from typing import Callable, Collection, List, Optional, Sequence, Tuple

import torch


def require_gpu(prog: str, capability: Optional[Tuple[int, int]] = None) -> None:
    """Exit with a message naming `prog` unless a CUDA GPU (of `capability`, when given) is visible:
    an ncu run without one would profile nothing and say little about why."""
    if not torch.cuda.is_available():
        sys.exit(f"{prog}: needs a CUDA GPU (none visible); run it on the device machine under ncu")
    got = torch.cuda.get_device_capability()
    if capability is not None and tuple(got) != tuple(capability):
        sys.exit(f"{prog}: needs compute capability {capability[0]}.{capability[1]}, found {got[0]}.{got[1]} "
                 f"({torch.cuda.get_device_name()})")


def shape_arg(ap: argparse.ArgumentParser, text: str) -> Tuple[int, int, int, int]:
    """--shape "B,H,N,D" as four ints, else ap.error naming what was given."""
    try:
        shape = tuple(int(x) for x in text.split(","))
    except ValueError:
        ap.error(f"--shape must be B,H,N,D integers, got {text!r}")
    if len(shape) != 4:
        ap.error(f"--shape must be B,H,N,D, got {shape}")
    return shape


def variants_arg(ap: argparse.ArgumentParser, text: str, known: Collection[str]) -> List[str]:
    """--variants "a,b,...": the names in order, else ap.error naming the unknown ones and the known."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        ap.error(f"--variants: unknown {unknown} (known: {', '.join(known)})")
    return names


CACHE_CONTROLS = ("all", "none")  # ncu's --cache-control


def ncu_line(probe: List[str], kernel_regex: str, launches: int, sections: Sequence[str], metrics: Sequence[str],
             report: str, out: str, python: str, cache_control: str = "all") -> str:
    """The ncu command that profiles `probe` (its argv) into `out`/`report`.ncu-rep: clocks left alone
    (METHOD.md), one profiler range, the kernels kernel_regex matches, at most `launches` of them. cache_control
    "all" (ncu's default, left unsaid): caches flushed before every profiled kernel and replay pass, do_bench's cold
    L2; "none": L2 as the previous kernel left it, the suite's back-to-back rounds (path_kernels.py: the leaderboard's
    backward is 1.10x cuDNN's warm, ~1.01-1.04x cold)."""
    if cache_control not in CACHE_CONTROLS:
        raise ValueError(f"cache_control {cache_control!r}: expected one of {CACHE_CONTROLS}")
    cmd = ["ncu", "--profile-from-start", "off", "--clock-control", "none", "--kernel-name", f"regex:{kernel_regex}",
           "--launch-count", str(launches)] + (["--cache-control", cache_control] if cache_control != "all" else [])
    for s in sections:
        cmd += ["--section", s]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    cmd += ["-f", "--export", f"{out}/{report}", python] + probe
    return " ".join(a if a.startswith(out) else shlex.quote(a) for a in cmd)  # $OUT expands in the shell


def profiled(fns: Sequence[Callable[[], object]], warmup: int = 3) -> None:
    """Run each of `fns` `warmup` times (compiles, autotuning, cuDNN plans: all outside the range),
    then each once between cudaProfilerStart and cudaProfilerStop, so that
    `ncu --profile-from-start off` sees exactly those launches."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def main(fwd, kv, q):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention import FlashAttentionTriton, FlashOptions
    from impl.attention.flash_options import with_configs
    from impl.workloads.attention import attention_inputs

    require_gpu("flash_ncu")
    parse = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    options = with_configs(FlashOptions(), fwd=[parse(fwd)], kv=[parse(kv)], q=[parse(q)])
    qq, kk, vv, do = attention_inputs((1, 16, 16384, 64), "bf16", torch.device("cuda"))

    def ours():
        FlashAttentionTriton.apply(qq, kk, vv, True, options).backward(do)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(do)

    profiled([ours, cudnn])


if __name__ == "__main__":
    main(*sys.argv[1:4])
