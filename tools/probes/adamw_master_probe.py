"""GPU probe: AdamWMaster's one-launch update over a model's Linear weights (issue 8), per
elements-per-program and warps: device time per step against its 26 B/parameter floor (read grad,
bf16 weight, master_lo, exp_avg, exp_avg_sq; write all but the grad) and host time per step (the
launch path: address table, pinned copy, launch), beside torch's fused fp32 AdamW over as many
parameters (what the anchor runs; 28 B/parameter: read weight, grad, m, v, write weight, m, v).
    PYTHONPATH=src python tools/probes/adamw_master_probe.py OUT.json [SIZE]
SIZE defaults to 2.7B (54 GB of state: H100 80 GB); on a CPU (TRITON_INTERPRET=1) use tiny."""
import json
import sys
import time

import torch

from impl.model import adamw_master
from impl.model.adamw_master import AdamWMaster
from impl.workloads.steps import build_model, linear_weights
from impl.runtime import default_device, synchronize

BYTES_PER_PARAM = dict(adamw_master=26, torch_adamw_fused_fp32=28)  # module doc
CONFIGS = [(1024, 4), (2048, 4), (2048, 8), (4096, 8), (8192, 8)]  # (BLOCK_SIZE, num_warps)


def weight_shapes(size: str) -> list[tuple]:
    with torch.device("meta"):
        model = build_model(size, 512, torch.device("meta"))
    return [tuple(w.shape) for w in linear_weights(model)]


def time_steps(step, device, steps: int) -> tuple[float, float]:
    """(device ms per step from the synchronised wall clock, host ms per step to issue it)."""
    step()
    synchronize(device)
    host = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        t = time.perf_counter()
        step()
        host += time.perf_counter() - t
    synchronize(device)
    return (time.perf_counter() - start) / steps * 1e3, host / steps * 1e3


def main(path: str, size: str = "2.7B") -> None:
    device = default_device()
    steps = 10 if device.type == "cuda" else 2
    shapes = weight_shapes(size)
    n = sum(torch.Size(s).numel() for s in shapes)
    res = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", size=size,
               tensors=len(shapes), params=n, floor_bytes={k: b * n for k, b in BYTES_PER_PARAM.items()}, rows=[])
    params = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    opt = AdamWMaster(params, lr=1e-4, weight_decay=0.01, kernel="triton")
    opt.cast_params_(params)
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    for block, warps in CONFIGS:
        adamw_master.NUM_WARPS = warps
        opt.block_size = block
        dev_ms, host_ms = time_steps(opt.step, device, steps)
        row = dict(kernel="adamw_master", block=block, warps=warps, step_ms=dev_ms, host_ms=host_ms,
                   gb_per_s=BYTES_PER_PARAM["adamw_master"] * n / dev_ms / 1e6)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    del opt, params
    if device.type == "cuda":  # the anchor's optimizer over as many fp32 parameters
        torch.cuda.empty_cache()
        params = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        ref = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True)
        dev_ms, host_ms = time_steps(ref.step, device, steps)
        row = dict(kernel="torch_adamw_fused_fp32", step_ms=dev_ms, host_ms=host_ms,
                   gb_per_s=BYTES_PER_PARAM["torch_adamw_fused_fp32"] * n / dev_ms / 1e6)
        res["rows"].append(row)
        print(json.dumps(row), flush=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main(*sys.argv[1:])
