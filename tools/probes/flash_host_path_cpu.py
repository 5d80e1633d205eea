"""CPU probe: host microseconds per call of the flash launchers with every kernel launch stubbed
out (meta tensors, no allocation cost, descriptors off): what our Python launch path costs beside
Triton's own launch (which tools/probes/flash_bwd_variants.py times on the GPU against an empty
kernel). Also the same launchers through the autotuner on every call (the v3 path; its cache holds
the key, so only its per-call key building is timed).
    PYTHONPATH=src python tools/probes/flash_host_path_cpu.py"""
import os, time
os.environ["TRITON_INTERPRET"] = "1"
import torch
from impl.attention import flash_triton as ft, backward_choice as bc

class Stub:
    """Stands in for a JIT function: `stub[grid](*args, **kw)` does nothing."""
    def __getitem__(self, grid):
        return lambda *a, **k: None
    def run(self, *a, **k):
        return None

def per_call_us(fn, n=3000):
    for _ in range(100): fn()
    t = time.perf_counter()
    for _ in range(n): fn()
    return (time.perf_counter() - t) / n * 1e6

q, k, v, do = (torch.empty(4, 32, 512, 80, device="meta") for _ in range(4))
o, lse = torch.empty(4, 32, 512, 80, device="meta"), torch.empty(4, 32, 512, device="meta")
ft.set_tma(False)
configs = [ft._config(c) for c in [(64, 128, 4, 3), (64, 64, 4, 3), (128, 64, 8, 4), (128, 64, 8, 3), (128, 64, 4, 3),
                                   (128, 128, 8, 3), (128, 32, 4, 4), (64, 32, 4, 4), (64, 64, 4, 2)]]
for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd_atomic"):
    kern = getattr(ft, name)
    kern.fn = Stub()
    kern.configs = configs
    kern.best_config = configs[0]
ft._attn_bwd_preprocess = Stub()
import triton.runtime.autotuner as at
# no GPU to benchmark on: the first config "wins" without running anything
at.Autotuner._bench = lambda self, *a, config, **k: [1.0, 1.0, 1.0] if config is configs[0] else [2.0, 2.0, 2.0]
res = {}
# 1) new path: picks resolved (cache warm)
ft._resolved.clear()
for name in ("_attn_fwd", "_attn_bwd_dq", "_attn_bwd_dkdv", "_attn_bwd_atomic"):
    getattr(ft, name).cache.clear()
ft.flash_attention_triton_forward(q, k, v, True)
res["forward launcher, pick resolved"] = per_call_us(lambda: ft.flash_attention_triton_forward(q, k, v, True))
for variant in ("two_pass", "atomic"):
    ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant=variant)
    res[f"backward launcher {variant}, picks resolved"] = per_call_us(
        lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant=variant), n=1000)
# 2) the autotuner on every call (the v3 path): the autotuner's cache holds the key, so it only builds it
def via_autotuner(kernel, name, key, grid, *args, **constexprs):
    kernel[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*args, **constexprs)
ft._launch = via_autotuner
ft.flash_attention_triton_forward(q, k, v, True)
ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant="two_pass")
res["forward launcher, autotuner each call"] = per_call_us(lambda: ft.flash_attention_triton_forward(q, k, v, True))
res["backward launcher two_pass, autotuner each call"] = per_call_us(
    lambda: ft.flash_attention_triton_backward(q, k, v, o, do, lse, True, variant="two_pass"), n=1000)
for k_, v_ in res.items():
    print(f"{k_:55s} {v_:7.1f} us")
