"""Issue 47: the ws forward's persistent grid with and without early_q, timed interleaved and under Nsight Compute.

early_q measured 15.5% slower than the persistent default at 4x16x16384x128 causal and 6% at 4x32x4096x128 full
(NOTES.md, "the early_q slowdown"), though its key loops compile to the same SASS; ws-o-regs splits its two
changes (the store from registers alone, Q freed late). `cudnn` (SDPA cuDNN's forward on the same q, k, v) is the
anchor to profile beside them: where do its warps stall that ours do not? Two uses:
- `--time ROUNDS`: do_bench medians of the variants alternated ROUNDS times (no ncu): is the slowdown there
  again, in every round, whichever variant runs first?
- under ncu (`--ncu-command` prints the two commands, PROFILES): each variant once between cudaProfilerStart/Stop
  (flash_ncu.profiled: compiles in the warm-up), the same q, k, v: the counters, then the PC sampling.

    PYTHONPATH=src python tools/probes/flash_ncu_fwd_ws.py --ncu-command        # the ncu lines (no GPU needed)
    PYTHONPATH=src python tools/probes/flash_ncu_fwd_ws.py --time 5 [--shape B,H,N,D] [--full] [--variants a,b]
    ncu ... python tools/probes/flash_ncu_fwd_ws.py [--shape B,H,N,D] [--full] [--variants a,b] [--warmup N]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

# the probe beside this one
from flash_ncu import CACHE_CONTROLS, ncu_line, profiled, require_gpu, shape_arg, variants_arg
from rounds import time_rounds  # the variants alternated, the order reversed every other round

PROG = "flash_ncu_fwd_ws"
SHAPE_16K = (4, 16, 16384, 128)  # where early_q lost most (8.908 ms against 7.710)
CUDNN = "cudnn"
KERNEL_REGEX = r"_attn_fwd_ws_sm90|sdpa_sm90_flash_fprop"  # ours; cuDNN's (cudnn_generated_fort_native_sdpa_sm90_...)
#: name -> GluonWsConfig fields: the per-tile grid, the persistent default, early_q's store from registers alone
#: (o_regs: Q freed late, as the default), the early_q trial (the store and Q freed early), the rotated loop (no PRMT),
#: the per-thread row sums (lazy_sum: no quad shuffle of l per key tile), a later tile's Q prefetched into L2
#: (prefetch_q: its Q wait, the short shapes' largest fixed cost a CTA tile), the persistent grid on an atomic tile
#: counter (dynamic: the next tile's loads under the last one's epilogue).
VARIANTS: Dict[str, dict] = {"ws": {}, "ws-persistent": {"persistent": True},
                             "ws-o-regs": {"persistent": True, "o_regs": True},
                             "ws-early-q": {"persistent": True, "early_q": True}, "ws-rotate": {"rotate": True},
                             "ws-lazy-sum": {"lazy_sum": True}, "ws-prefetch-q": {"prefetch_q": True},
                             "ws-dynamic": {"persistent": True, "dynamic": True}}
#: report name -> (sections, extra metrics). "fwd": L2 sectors and hit rate, DRAM bytes (is the K/V stream
#: missing L2 more?), the global stores by request and sector (early_q's O from registers), the tensor pipe.
#: "src": per-instruction stalls (which mbarrier wait of the key loop grows: k_ready, v_ready or the turn).
PROFILES = {
    "fwd": (("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "SchedulerStats", "WarpStateStats",
             "Occupancy", "LaunchStats"),
            ("lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum", "lts__t_sector_hit_rate.pct",
             "dram__bytes_read.sum", "dram__bytes_write.sum", "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
             "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
             "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active")),
    "src": (("SourceCounters", "WarpStateStats"), ()),
}


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=",".join(map(str, SHAPE_16K)), help="B,H,N,D (bf16; default 4,16,16384,128)")
    ap.add_argument("--full", action="store_true", help="full attention (default causal)")
    ap.add_argument("--variants", default="ws-persistent,ws-o-regs,ws-early-q",
                    help=f"comma-separated, launch order kept: {', '.join(VARIANTS)}, {CUDNN}")
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled calls of each variant first")
    ap.add_argument("--time", type=int, default=0, metavar="ROUNDS",
                    help="no profiling: do_bench medians, the variants alternated ROUNDS times (the order reversed "
                         "every other round)")
    ap.add_argument("--cache-control", choices=CACHE_CONTROLS, default="all",
                    help="ncu's --cache-control in the printed commands: all (flushed, ncu's default) or none (warm)")
    ap.add_argument("--ncu-command", action="store_true", help="print the ncu commands for these arguments, exit")
    args = ap.parse_args(argv)
    args.shape = shape_arg(ap, args.shape)
    args.variants = tuple(variants_arg(ap, args.variants, (*VARIANTS, CUDNN)))
    if args.warmup < 1:
        ap.error("--warmup must be >= 1 (the first call compiles)")
    if args.time < 0:
        ap.error("--time must be >= 0")
    return args


def ncu_command(args: argparse.Namespace, report: str = "fwd", out: str = "$OUT", python: str = "python3") -> str:
    """The ncu command of PROFILES[report] for `args`, its report to `out`/`report`.ncu-rep (clocks left alone,
    as flash_ncu_bwd's; one launch a variant)."""
    sections, metrics = PROFILES[report]
    probe = ["tools/probes/flash_ncu_fwd_ws.py", "--shape", ",".join(map(str, args.shape)),
             "--variants", ",".join(args.variants), "--warmup", str(args.warmup)] + (["--full"] if args.full else [])
    return ncu_line(probe, KERNEL_REGEX, len(args.variants), sections, metrics, report, out, python,
                    args.cache_control)


def _forwards(args: argparse.Namespace) -> List[Callable[[], object]]:
    """One callable a variant, all on the same q, k, v (GPU tensors built here)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention.flash_gluon_ws import GluonWsConfig, flash_gluon_ws_forward

    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*args.shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    causal = not args.full

    def fwd(config):
        return lambda: flash_gluon_ws_forward(q, k, v, causal, config)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return [cudnn if name == CUDNN else fwd(GluonWsConfig(**VARIANTS[name])) for name in args.variants]


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.ncu_command:
        print("\n".join(ncu_command(args, report) for report in PROFILES))
        return
    require_gpu(PROG, (9, 0))
    fns = _forwards(args)
    shape = f"{'x'.join(map(str, args.shape))} {'full' if args.full else 'causal'}"
    if args.time:
        from triton.testing import do_bench

        times = time_rounds(args.variants, fns, args.time,
                            lambda fn: float(do_bench(fn, warmup=25, rep=100, return_mode="median")))
        base = statistics.median(times[args.variants[0]])
        for name, ms in times.items():
            med = statistics.median(ms)
            print(f"{PROG}: {shape} {name}: median {med:.3f} ms ({med / base:.3f}x {args.variants[0]}); rounds "
                  + " ".join(f"{t:.3f}" for t in ms), flush=True)
        return
    print(f"{PROG}: {shape}; profiled launches in order: {', '.join(args.variants)}", flush=True)
    profiled(fns, args.warmup)
    print(f"{PROG}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
