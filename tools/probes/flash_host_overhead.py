"""GPU probe: host time per call of the flash forward/backward paths on a small shape (where the
host, not the kernel, sets the time): the launcher alone with and without tensor descriptors, the
custom op, FlashAttentionTriton.apply, and the kernel time for scale.
    PYTHONPATH=src python tools/probes/flash_host_overhead.py OUT.json"""
import json
import sys
import time

import torch
from triton.testing import do_bench

from impl.attention import FlashOptions, flash_triton as ft
from impl.workloads.attention import attention_inputs


def host_us(fn, n=300):
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def cprofile_tables(fn, n: int, top: int) -> dict:
    """cProfile of n calls of fn (the device drained after): {"cprofile_tottime": ..., "cprofile_cumulative": ...},
    each the top `top` functions by own and by cumulative time."""
    import cProfile
    import io
    import pstats
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    out = {}
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(top)
        out[f"cprofile_{key}"] = s.getvalue()
    return out


def main(path):
    res = {"device": torch.cuda.get_device_name(), "rows": []}
    for shape in ((1, 1, 8192, 64), (1, 1, 512, 16)):
        q, k, v, do = attention_inputs(shape, "bf16", torch.device("cuda"))
        o, lse = ft.flash_attention_triton_forward(q, k, v, True)
        for tma in (True, False):
            opts = FlashOptions(tma=tma)  # the ops take the options as their registered int
            cases = {
                "launcher fwd": lambda: ft.flash_attention_triton_forward(q, k, v, True, options=opts),
                "op fwd": lambda: ft.flash_forward_op(q, k, v, True, opts.key),
                "launcher bwd": lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, options=opts),
                "op bwd": lambda: ft.flash_backward_op(q, k, v, o, do, lse, True, None, opts.key),
                "apply fwd+bwd": lambda: ft.FlashAttentionTriton.apply(q, k, v, True, opts).backward(do),
            }
            for name, fn in cases.items():
                row = {"shape": shape, "tma": tma, "case": name, "host_us": host_us(fn),
                       "do_bench_us": do_bench(fn, return_mode="median") * 1e3}
                res["rows"].append(row)
                print(json.dumps(row), flush=True)
    # where the launcher's host time goes: cProfile of 200 forward launches
    import cProfile
    import io
    import pstats
    q, k, v, do = attention_inputs((1, 1, 8192, 64), "bf16", torch.device("cuda"))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(200):
        ft.flash_attention_triton_forward(q, k, v, True)
    pr.disable()
    torch.cuda.synchronize()
    s = io.StringIO()
    pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(25)
    res["cprofile_fwd"] = s.getvalue()
    print(s.getvalue()[:4000])
    json.dump(res, open(path, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
