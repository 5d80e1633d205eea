"""Which property of our gradients makes AccumulateGrad's detach slow on CUDA (26 us vs 2.3)?"""
import json, sys, time
import torch, triton, triton.language as tl
from torch.profiler import profile, ProfilerActivity
from impl.attention.flash_triton import FlashAttentionTriton

@triton.jit
def _touch(x_ptr):
    tl.store(x_ptr, 0.0)

dev = torch.device("cuda")
shape = (1, 1, 128, 64)
q, k, v = (torch.randn(shape, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(shape, device=dev, dtype=torch.bfloat16)

def make(alloc, launch):
    class F(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            ctx.save_for_backward(a, b, c)
            return torch.empty_like(a)
        @staticmethod
        def backward(ctx, g):
            a, b, c = ctx.saved_tensors
            outs = tuple(alloc(t) for t in (a, b, c))
            if launch:
                for t in outs:
                    _touch[(1,)](t)
            return outs
    return lambda: F.apply(q, k, v).backward(do)

cases = {
    "empty_like": make(torch.empty_like, False),
    "torch.empty(shape, dtype, device)": make(lambda t: torch.empty(t.shape, dtype=t.dtype, device=t.device), False),
    "empty_like + triton launch on each": make(torch.empty_like, True),
    "ours": lambda: FlashAttentionTriton.apply(q, k, v, True).backward(do),
}
res = []
for name, fn in cases.items():
    def call():
        q.grad = k.grad = v.grad = None
        fn()
    for _ in range(30):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        call()
    host = (time.perf_counter() - t0) / 500 * 1e6
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(50):
            call()
    ev = {e.key: round(e.cpu_time_total / e.count, 2) for e in prof.key_averages()
          if e.key in ("aten::detach", "torch::autograd::AccumulateGrad")}
    row = {"case": name, "host_us": round(host, 1), **ev}
    res.append(row)
    print(json.dumps(row), flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
