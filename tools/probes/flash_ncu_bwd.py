"""Issue 47: the d 128 (and d 64) backward kernels under Nsight Compute, one invocation, fixed configs.

Between cudaProfilerStart/Stop (flash_ncu.profiled: every compile, cuDNN plan and the pinned Triton
config's first launch happen in the warm-up before it) each chosen variant runs its backward once,
from the same q, k, v, dO and the ws forward's o and lse (cuDNN: its own forward, kept for autograd):
- one-pass: flash_gluon_backward, dq "reduce" (stage 3: dQ by TMA reduce-add), 64x128 w8 s2;
- one-pass-dq2: the same with dq_stages=2 (stage 3d: two fp32 dQ staging tiles used alternately, the
  wait before a staging write for the reduce two tiles back instead of the last one);
- one-pass-atomic: the same with dq "atomic" (stage 3e: dQ added from registers by atomics, no staging);
- one-pass-rebuild: one-pass with rebuild=True (stage 4b: the resident tiles' wgmma descriptors rebuilt each
  query tile; no stack, no spills at d 128);
- ws: flash_gluon_backward_ws (stage 3b, warp-specialized one pass; its default config, the kernel table's at d 64);
- ws-own-keys: the same with dq_own_keys (d 64 only: each consumer adds dQ over its own 64 keys, no handshake);
- ws-prescaled-lse: ws with prescaled_lse (−lse·log2 e from the preprocessing launch; a trial: only when named);
- ws-stats-smem: ws-prescaled-lse with stats_smem (the row statistics through the load warp's TMA ring; a
  candidate);
- ws-lean-sync: ws-stats-smem with lean_sync (no ds_free: the dSᵀ store waits on the previous tile's slot_empty; a
  trial: only when named);
- split-triton: the dK/dV-only kernel + the Triton dQ kernel pinned at TRITON_DQ (no autotuning);
- split-gluon: the same dK/dV kernel + the Gluon dQ kernel (stage 3c) at its default tiles;
- cudnn: SDPA cuDNN's backward (autograd.grad with the graph retained).
Only the kernels KERNEL_REGEX matches are meant to be profiled (not the preprocess, the casts or
cuDNN's small kernels); `kernels()` lists them in launch order, `--ncu-command` prints the two ncu
commands (PROFILES: the counters, then the per-instruction sampling).

    PYTHONPATH=src python tools/probes/flash_ncu_bwd.py --ncu-command    # the ncu lines (no GPU needed)
    ncu ... python tools/probes/flash_ncu_bwd.py [--shape B,H,N,D] [--full] [--variants a,b] [--warmup N]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from carveout import GLUON_BWD_KERNELS, Loaded, check_percent  # the probes beside this one (on sys.path)
from flash_ncu import CACHE_CONTROLS, ncu_line, profiled, require_gpu, shape_arg, variants_arg

PROG = "flash_ncu_bwd"
SHAPE_8B = (1, 32, 32768, 128)  # the 8B step's attention, where the one-pass kernel missed by 1.56x
#: The Triton dQ kernel's config (BLOCK_M, BLOCK_N, warps, stages): the autotuner's pick at d 128
#: (probes/flash_d128_a3c533a.json), pinned so that nothing is benchmarked under ncu.
TRITON_DQ = (128, 64, 8, 3)
#: Our backward kernels (Triton/Gluon function names) and cuDNN's backward ("..._flash_bprop_...").
KERNEL_REGEX = r"_attn_bwd_(sm90|ws_sm90|dq)|bprop"
#: Two profiles of the same launches, so that the per-instruction one (SourceCounters: PC sampling and
#: SASS-patched counts, which the 255-register kernels may refuse) cannot cost the counters of the first.
#: report name -> (sections, extra metrics). "bwd": the L2 sectors by operation (reduce-adds are "red")
#: and DRAM bytes beside the sections' figures.
PROFILES = {
    "bwd": (("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables",
             "SchedulerStats", "WarpStateStats", "Occupancy", "LaunchStats"),
            ("lts__t_sectors_op_red.sum", "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
             "lts__t_sectors_op_atom.sum", "dram__bytes_read.sum", "dram__bytes_write.sum")),
    "src": (("SourceCounters", "WarpStateStats"), ()),
}


@dataclass(frozen=True)
class Variant:
    name: str
    kernels: Tuple[str, ...]  # the launches KERNEL_REGEX selects, in order
    head_dims: Optional[Tuple[int, ...]] = None  # the head dims it runs at (None: any the probe takes)
    trial: bool = False  # profiled only when --variants names it (a TRIAL_CONFIGS entry)


VARIANTS = (Variant("one-pass", ("_attn_bwd_sm90",)),
            Variant("one-pass-dq2", ("_attn_bwd_sm90",)),
            Variant("one-pass-atomic", ("_attn_bwd_sm90",)),
            Variant("one-pass-rebuild", ("_attn_bwd_sm90",)),
            Variant("ws", ("_attn_bwd_ws_sm90",), head_dims=(64, 128)),
            Variant("ws-own-keys", ("_attn_bwd_ws_sm90",), head_dims=(64,)),
            Variant("ws-prescaled-lse", ("_attn_bwd_ws_sm90",), head_dims=(64, 128), trial=True),
            Variant("ws-stats-smem", ("_attn_bwd_ws_sm90",), head_dims=(64, 128), trial=True),
            Variant("ws-lean-sync", ("_attn_bwd_ws_sm90",), head_dims=(64, 128), trial=True),
            Variant("split-triton", ("_attn_bwd_dq", "_attn_bwd_sm90")),
            Variant("split-gluon", ("_attn_bwd_dq_sm90", "_attn_bwd_sm90")),
            Variant("cudnn", ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop",)))
BY_NAME = {v.name: v for v in VARIANTS}
#: --variants' default: every variant that runs at the default shape's head dim (128), trials left out.
DEFAULT_VARIANTS = tuple(v.name for v in VARIANTS
                         if not v.trial and (v.head_dims is None or SHAPE_8B[3] in v.head_dims))


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=",".join(map(str, SHAPE_8B)), help="B,H,N,D (bf16; default the 8B step's)")
    ap.add_argument("--full", action="store_true", help="full attention (default causal)")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help=f"comma-separated, launch order kept: {', '.join(BY_NAME)}")
    ap.add_argument("--warmup", type=int, default=2, help="unprofiled calls of each variant first")
    ap.add_argument("--carveout", type=int, default=None, metavar="PCT",
                    help="the Gluon backward kernels' shared-memory carve-out, in percent (tools/probes/carveout.py)")
    ap.add_argument("--cache-control", choices=CACHE_CONTROLS, default="all",
                    help="ncu's --cache-control in the printed commands: all (flushed, ncu's default) or none (warm)")
    ap.add_argument("--ncu-command", action="store_true", help="print the ncu commands for these arguments, exit")
    args = ap.parse_args(argv)
    if args.carveout is not None:
        try:
            check_percent(args.carveout)
        except ValueError as e:
            ap.error(f"--carveout: {e}")
    args.shape = shape_arg(ap, args.shape)
    args.variants = tuple(BY_NAME[n] for n in variants_arg(ap, args.variants, BY_NAME))
    for v in args.variants:
        if v.head_dims is not None and args.shape[3] not in v.head_dims:
            ap.error(f"--variants: {v.name} runs at head dims {', '.join(map(str, v.head_dims))} only, "
                     f"not {args.shape[3]}")
    if args.warmup < 1:
        ap.error("--warmup must be >= 1 (the first call compiles)")
    return args


def kernels(variants: Sequence[Variant]) -> List[str]:
    """The profiled launches in order: what --launch-count bounds and the report lists."""
    return [k for v in variants for k in v.kernels]


def ncu_command(args: argparse.Namespace, report: str = "bwd", out: str = "$OUT", python: str = "python3") -> str:
    """The ncu command of PROFILES[report] for `args`, its report to `out`/`report`.ncu-rep. Clocks left
    alone (METHOD.md); one range, the kernels KERNEL_REGEX matches, at most as many as the probe launches."""
    sections, metrics = PROFILES[report]
    probe = ["tools/probes/flash_ncu_bwd.py", "--shape", ",".join(map(str, args.shape)),
             "--variants", ",".join(v.name for v in args.variants), "--warmup", str(args.warmup)]
    if args.full:
        probe.append("--full")
    if args.carveout is not None:
        probe += ["--carveout", str(args.carveout)]
    return ncu_line(probe, KERNEL_REGEX, len(kernels(args.variants)), sections, metrics, report, out, python,
                    args.cache_control)


def _backwards(args: argparse.Namespace) -> List[Callable[[], object]]:
    """One callable per variant (GPU tensors built here)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from impl.attention import flash_gluon_bwd as gbwd
    from impl.attention.flash_gluon_bwd_ws import GluonBwdWsConfig, flash_gluon_backward_ws
    from impl.attention.flash_gluon_ws import flash_gluon_ws_forward
    from impl.attention.flash_options import FlashOptions, with_configs

    causal = not args.full
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do = (torch.randn(*args.shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
    o, lse = flash_gluon_ws_forward(q, k, v, causal)
    pinned = with_configs(FlashOptions(), q=[TRITON_DQ])
    configs = {"one-pass": gbwd.GluonBwdConfig(64, 128, 8, 2),
               "one-pass-dq2": gbwd.GluonBwdConfig(64, 128, 8, 2, dq_stages=2),
               "one-pass-atomic": gbwd.GluonBwdConfig(64, 128, 8, 2, dq="atomic"),
               "one-pass-rebuild": gbwd.GluonBwdConfig(64, 128, 8, 2, rebuild=True),
               "split-triton": gbwd.GluonBwdConfig(64, 128, 8, 2, dq="triton"),
               "split-gluon": gbwd.GluonBwdConfig(64, 128, 8, 2, dq="gluon")}
    qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def cudnn():
        return torch.autograd.grad(out, (qg, kg, vg), do, retain_graph=True)

    def ours(config):
        return lambda: gbwd.flash_gluon_backward(q, k, v, o, do, lse, causal, config, pinned)

    fns = {"ws": lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal),
           "ws-own-keys": lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal,
                                                          GluonBwdWsConfig(dq_own_keys=True)),
           "ws-prescaled-lse": lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal,
                                                               GluonBwdWsConfig(prescaled_lse=True)),
           "ws-stats-smem": lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal,
                                                            GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)),
           "ws-lean-sync": lambda: flash_gluon_backward_ws(q, k, v, o, do, lse, causal,
                                                           GluonBwdWsConfig(prescaled_lse=True, stats_smem=True,
                                                                            lean_sync=True)),
           "cudnn": cudnn}
    fns.update({name: ours(c) for name, c in configs.items()})
    return [fns[var.name] for var in args.variants]


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    if args.ncu_command:
        print("\n".join(ncu_command(args, report) for report in PROFILES))
        return
    require_gpu(PROG, (9, 0))
    loaded = Loaded().install() if args.carveout is not None else None  # before the first launch
    fns = _backwards(args)
    if loaded is not None:  # load every kernel (one call each), then set the carve-out before the range
        for fn in fns:
            fn()
        carved = loaded.set(GLUON_BWD_KERNELS, args.carveout)
        print(f"{PROG}: carve-out {args.carveout}% on {', '.join(carved)}", flush=True)
    print(f"{PROG}: shape {args.shape} {'full' if args.full else 'causal'}; profiled launches in order: "
          f"{', '.join(kernels(args.variants))}", flush=True)
    profiled(fns, args.warmup)
    print(f"{PROG}: done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
