"""Runs one forward+backward of ours (the committed kernels, configs pinned to skip autotuning) and
of SDPA's cuDNN backend on the leaderboard shape between cudaProfilerStart/Stop, for Nsight
Compute's pipe utilisation (issue 10: is each kernel tensor-core, MUFU or issue bound?):
    ncu --profile-from-start off --section ComputeWorkloadAnalysis ... python tools/probes/flash_ncu.py FWD KV Q
FWD/KV/Q: tile configs as "BLOCK_M,BLOCK_N,warps,stages"."""
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from impl.attention import FlashAttentionTriton, FlashOptions
from impl.attention.flash_options import with_configs
from impl.workloads.attention import attention_inputs


def main(fwd, kv, q):
    parse = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    options = with_configs(FlashOptions(), fwd=[parse(fwd)], kv=[parse(kv)], q=[parse(q)])
    qq, kk, vv, do = attention_inputs((1, 16, 16384, 64), "bf16", torch.device("cuda"))

    def ours():
        FlashAttentionTriton.apply(qq, kk, vv, True, options).backward(do)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(qq, kk, vv, is_causal=True).backward(do)

    for _ in range(3):
        ours()
        cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    ours()
    cudnn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


if __name__ == "__main__":
    main(*sys.argv[1:4])
