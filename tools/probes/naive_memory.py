"""Diagnostic (GPU): which allocations are live at the peak of one naive-attention backward.
Prints, per run, the peak above the baseline and the live blocks at that peak with their frames."""
import re
import sys

import torch

sys.path.insert(0, "src")
from impl.attention.naive import naive_attention  # noqa: E402


def live_at_peak(snapshot, base_addrs):
    live, peak, at_peak = {}, 0, {}
    for ev in snapshot["device_traces"][0]:
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev
        elif ev["action"] in ("free_requested", "free_completed"):
            live.pop(ev["addr"], None)
        total = sum(e["size"] for a, e in live.items() if a not in base_addrs)
        if total > peak:
            peak, at_peak = total, dict(live)
    return peak, at_peak


def frames(ev):
    """The ATen / autograd C++ frames that made the block (the backward runs on the autograd
    engine's thread, which has no Python frames), innermost first."""
    names = [f["name"] for f in ev.get("frames", [])]
    keep = [n for n in names if re.search(r"at::native|at::_ops|autograd::generated|cublas|Softmax|softmax|bmm", n)]
    return " <- ".join(n[:90] for n in (keep or names)[:5])


for label, causal in (("non-causal #1", False), ("causal", True), ("non-causal #2", False)):
    dev = torch.device("cuda")
    b, s, d = 4, 2048, 64
    q, k, v, do = (torch.randn(b, s, d, device=dev) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()
    out = naive_attention(q, k, v, is_causal=causal)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=100000, stacks="all")
    out.backward(do)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    _, at_peak = live_at_peak(snap, set())
    print(f"== {label}: backward peak above before-backward {peak / 2**20:.1f} MiB")
    for ev in sorted(at_peak.values(), key=lambda e: -e["size"]):
        print(f"   {ev['size'] / 2**20:8.1f} MiB  {frames(ev)}")
    del q, k, v, do, out
    torch.cuda.empty_cache()
