"""Kernel tables per annotated phase, from torch.profiler: nsys_profile's questions answered by the
suite itself (nsys is not needed; the same NVTX ranges make an `nsys profile` run readable too).

How kernels are assigned to phases (forward, backward, optimizer step, the attention parts):
every GPU kernel is linked by the profiler (CUPTI correlation id) to the CPU op that launched it
(`FunctionEvent.kernels`), and that op is assigned to every annotation range whose CPU-side time
interval contains the op's start. We attribute by *launch* time, not execution time, because GPU
execution is asynchronous (a forward's kernels may still run after its Python range closed), and
launch times and ranges are on the same CPU clock, so no GPU/CPU clock alignment is needed. Ranges
are matched by time rather than by parent links because backward ops run on the autograd engine's
thread, outside the tree of the main thread's "backward" range. Warm-up steps run inside the
profiler under their own "warm-up" range and are simply not reported.

On the CPU there are no kernels: CPU ops' *self* time stands in for kernel time (self time, so a
nested aten::matmul → aten::mm is counted once), which keeps the code path exercised in smoke.

Cost: `prof.events()` makes torch build a FunctionEvent per raw event and their parent/child tree in
Python, 5-15 s per config on the H100 (most of nsys_profile's time). profile_steps therefore reads
the profiler's raw kineto events (`phase_profile_from_kineto`: one pass, kernels linked to their
launching op by correlation id exactly as torch links them, CPU self time from a per-thread
interval stack), and records warm-up steps not at all (torch.profiler.schedule's warm-up phase
runs the profiler without keeping events). `build_phase_profile` keeps the FunctionEvent path;
correctness/test_profiling_kineto_compile.py checks that both give the same tables.
"""
from __future__ import annotations

import bisect
import contextlib
import re
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from impl.model import AdamW, cross_entropy
from impl.annotate import PARTS, PHASES, annotate
from impl.workloads.steps import autocast_ctx
from impl.runtime import synchronize

CATEGORIES = ("matmul", "attention", "elementwise", "reduction", "softmax", "copy", "communication", "other")
ATTENTION_PARTS = ("computing attention scores", "computing softmax", "final matmul")
WARMUP = "warm-up"
ANNOTATIONS = (WARMUP, *PHASES, *PARTS, *ATTENTION_PARTS)

# Order matters: the first rule that matches wins (a "triton_red_fused_softmax" is a softmax, a
# cutlass "..._gemm_..._reduce" epilogue is still a matmul, a cuDNN "sdpa_..._flash_..._wgmma" or
# cutlass "fmha" kernel is attention). Attention: our Triton FlashAttention kernels (_attn_fwd,
# _attn_bwd_*) and SDPA's (flash, fmha, cudnn, *attention* ops on the CPU), but not Inductor's
# fused pointwise/reduction kernels that merely carry an attention op in their name (the layout
# changes around it). Copy includes casts: ATen's direct_copy_kernel is what autocast's fp32 → bf16
# weight casts run. Optimizers are elementwise (impl.model.adamw_master's Triton kernel included).
_RULES = [
    ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|broadcast|c10d::|gloo"),
    ("attention", r"^(?!triton_|cpp_fused)(?:.*(?:_attn_(?:fwd|bwd)|flash|fmha|cudnn|attention))"),
    ("copy", r"memcpy|memset|\bcopy_|aten::copy_|aten::to\b|aten::_to_copy|aten::contiguous|aten::clone|"
             r"direct_copy_kernel|dtoh|htod|dtod|cat_?array|catarraybatched|aten::cat\b|aten::stack\b"),
    ("matmul", r"gemm|gemv|sgemm|hgemm|cutlass|xmma|wgmma|cublas|\bmatmul\b|aten::mm\b|aten::addmm\b|aten::bmm\b|"
               r"aten::baddbmm\b|aten::linear\b|aten::matmul\b|aten::_?scaled_mm\b|aten::einsum\b|"
               r"triton_(?:tem|mm|bmm)_|\bmm_|_mm\b|\bbmm\b|splitk|s\d{3,4}gemm|nvjet"),
    ("softmax", r"softmax"),
    ("reduction", r"reduce|reduction|aten::sum\b|aten::mean\b|aten::amax\b|aten::max\b|aten::norm\b|"
                  r"aten::aminmax\b|aten::var\b|triton_(?:red|per)_|layer_?norm|rms_?norm|logsumexp|"
                  r"aten::_foreach_norm|multi_tensor_apply.*norm"),
    ("elementwise", r"elementwise|vectorized|unrolled_elementwise|aten::(?:add|sub|mul|div|pow|rsqrt|sqrt|exp|"
                    r"sigmoid|silu|neg|where|masked_fill|tril|fill_|zero_|lerp|addcmul|addcdiv|abs|cos|sin|"
                    r"relu|gelu)_?\b|triton_poi_|pointwise|_foreach_|_fused_adamw?_|_adamw_master_kernel|"
                    r"multi_tensor_apply|fill_kernel|"
                    r"index_select|indexing|gather|scatter|embedding"),
]
_COMPILED = [(cat, re.compile(rx, re.IGNORECASE)) for cat, rx in _RULES]


def classify_kernel(name: str) -> str:
    """One of CATEGORIES for a CUDA kernel name (cuBLAS, CUTLASS, Triton, ATen kernels) or, on
    the CPU, an ATen op name."""
    for cat, rx in _COMPILED:
        if rx.search(name):
            return cat
    return "other"


# ---------------------------------------------------------------------------------------------
# FLOPs of the attention parts, for (e): the two matmuls do 2·d FLOPs per score, softmax a
# handful per score (max, subtract, exp, sum, divide).
SOFTMAX_FLOPS_PER_ELEMENT = 5


def attention_part_flops(batch: int, heads: int, seq: int, head_dim: int) -> dict:
    scores = batch * heads * seq * seq
    return {"computing attention scores": 2.0 * scores * head_dim,
            "computing softmax": float(SOFTMAX_FLOPS_PER_ELEMENT * scores),
            "final matmul": 2.0 * scores * head_dim}


# ---------------------------------------------------------------------------------------------
@dataclass
class PhaseProfile:
    """Result of profile_steps: per-range kernel totals plus the range wall times."""
    steps: int
    device_type: str
    kernels: dict = field(default_factory=dict)      # range name -> {kernel name: [time_us, calls]}
    range_wall_us: dict = field(default_factory=dict)  # range name -> list of wall durations (us)
    # CUDA: device time of device events linked to no op (so in no range): a launch outside any torch
    # op that impl.runtime.launch_ctx does not wrap. On the H100 it matched the optimizer phase's
    # kernel time in every profile while the phase tables held those kernels too (NOTES.md, fourth
    # pass): some other device record is counted as well; unexplained, so read it with care
    unlinked_us: float = 0.0
    # CUDA: host time in runtime calls that can block the host on the device (BLOCKING_RUNTIME), per
    # range: range name -> {call name: [time_us, calls]}. A phase whose host range outlasts its kernels
    # is host-bound only if these are small; else it waits (a sync, an allocator cudaMalloc/cudaFree)
    blocking: dict = field(default_factory=dict)
    # CUDA: per range, each communication kernel's exposed time (exposed_us): range name -> {kernel: [us, calls]}
    exposed_comm: dict = field(default_factory=dict)

    def table(self, phases, top: int | None = None) -> list[dict]:
        """Kernel table over the union of `phases`: name, category, total time (us), calls, share."""
        merged: dict[str, list] = defaultdict(lambda: [0.0, 0])
        for ph in phases:
            for name, (t, n) in self.kernels.get(ph, {}).items():
                merged[name][0] += t
                merged[name][1] += n
        total = sum(t for t, _ in merged.values()) or 1.0
        rows = [dict(name=name, category=classify_kernel(name), time_us=t, calls=n, share=t / total)
                for name, (t, n) in merged.items()]
        rows.sort(key=lambda r: -r["time_us"])
        return rows[:top] if top else rows

    def total_us(self, phases) -> float:
        return sum(t for ph in phases for t, _ in self.kernels.get(ph, {}).values())

    def category_us(self, phases) -> dict:
        """Total time (us) per category, every category present."""
        by = dict.fromkeys(CATEGORIES, 0.0)
        for r in self.table(phases):
            by[r["category"]] += r["time_us"]
        return by

    def category_shares(self, phases) -> dict:
        by = self.category_us(phases)
        total = sum(by.values()) or 1.0
        return {c: t / total for c, t in by.items()}

    @property
    def timing_source(self) -> str:
        return "kernels" if self.device_type == "cuda" else "cpu_op_self_time"


def _is_annotation(evt) -> bool:
    return evt.name in ANNOTATIONS or evt.name.startswith("ProfilerStep")


def _intervals(events) -> dict:
    out = defaultdict(list)
    for e in events:
        if e.name in ANNOTATIONS and getattr(e.device_type, "name", str(e.device_type)).endswith("CPU"):
            out[e.name].append((e.time_range.start, e.time_range.end))
    return {k: sorted(v) for k, v in out.items()}


def _containing(intervals: list, t: float) -> bool:
    i = bisect.bisect_right(intervals, (t, float("inf"))) - 1
    return i >= 0 and intervals[i][0] <= t <= intervals[i][1]


def kernel_samples(events, device_type: str):
    """(start_us, kernel name, duration_us) for every kernel (GPU) or CPU op self time (CPU)."""
    for e in events:
        if _is_annotation(e) or getattr(e, "is_async", False):
            continue
        if not getattr(e.device_type, "name", str(e.device_type)).endswith("CPU"):
            continue  # device-side events are reached through the CPU op that launched them
        if device_type == "cuda":
            for k in e.kernels:
                yield e.time_range.start, k.name, float(k.duration)
        elif e.self_cpu_time_total > 0:
            yield e.time_range.start, e.name, float(e.self_cpu_time_total)


def build_phase_profile(events, steps: int, device_type: str) -> PhaseProfile:
    """Assigns kernels to annotation ranges by the launch time of their CPU op (see module doc);
    anything inside a warm-up range (whose phases are nested in it) is left out. `events`:
    FunctionEvents (prof.events()) or objects with the same attributes."""
    return _attribute(_intervals(events), kernel_samples(events, device_type), steps, device_type)


# Raw kineto events torch's own parser drops (torch.autograd.profiler_util._filter_name).
# CUDA runtime calls that can hold the host until the device (or the allocator) catches up
BLOCKING_RUNTIME = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMalloc",
                              "cudaFree", "cudaMemcpy", "cudaMemcpyAsync", "cudaHostAlloc", "cudaFreeHost"})
_FILTERED_NAMES = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                             "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                             "aten::is_leaf", "aten::output_nr", "aten::_version"})


def _is_range_name(name: str) -> bool:
    return name in ANNOTATIONS or name.startswith("ProfilerStep")


def phase_profile_from_kineto(result, steps: int, device_type: str) -> PhaseProfile:
    """build_phase_profile from the profiler's raw results (`prof.profiler.kineto_results`),
    without torch's FunctionEvent parsing (see module doc). Times are µs from the trace start.

    CUDA: a device event (kernel, memcpy, memset) belongs to the CPU op whose correlation id is the
    device event's linked correlation id, among ops that are not themselves linked (runtime calls
    such as cudaLaunchKernel are); this is how torch fills FunctionEvent.kernels. CPU: an op's self
    time is its duration less its direct children's (nesting per thread, as torch's
    _populate_cpu_children), and a single child of the same name is folded into its parent (as
    torch's _remove_dup_nodes)."""
    from torch.autograd import DeviceType

    cpu, cuda = DeviceType.CPU, device_type == "cuda"
    t0 = result.trace_start_ns()
    intervals: dict = defaultdict(list)
    op_start: dict = {}                    # CUDA: correlation id -> launch time of the op
    device: dict = defaultdict(list)       # CUDA: linked correlation id -> [(kernel name, us)]
    ops: list = []                         # CPU: (thread, start, end, name)
    blocking: list = []                    # CUDA: (start, runtime call, us) of BLOCKING_RUNTIME calls
    demangle = torch._C._demangle
    events = result.events()
    hidden = getattr(type(events[0]), "is_hidden_event", None) if events else None
    activity = getattr(type(events[0]), "activity_type", None) if events else None
    for e in events:
        name = e.name()
        if name in _FILTERED_NAMES or (hidden is not None and hidden(e)):
            continue
        if e.device_type() == cpu:
            if e.is_async() or e.start_thread_id() != e.end_thread_id():
                continue
            start = (e.start_ns() - t0) / 1e3
            if name in ANNOTATIONS:
                intervals[name].append((start, (e.end_ns() - t0) / 1e3))
            if cuda:
                if e.linked_correlation_id() == 0 and not _is_range_name(name):
                    op_start[e.correlation_id()] = start
                if name in BLOCKING_RUNTIME:
                    blocking.append((start, name, (e.end_ns() - e.start_ns()) / 1e3))
            else:
                ops.append((e.start_thread_id(), start, (e.end_ns() - t0) / 1e3, name))
        elif cuda:
            if _is_range_name(name) or (activity is not None and "annotation" in str(activity(e)).lower()):
                continue  # the GPU-side copy of a record_function range, not a kernel
            device[e.linked_correlation_id()].append((demangle(name) if name.startswith("_Z") else name,
                                                      (e.start_ns() - t0) / 1e3, (e.end_ns() - t0) / 1e3))
    if cuda:
        linked = [(op_start[c], k, a, b) for c, ks in device.items() if c in op_start for k, a, b in ks]
        samples = ((t, k, b - a) for t, k, a, b in linked)
    else:
        samples = _cpu_self_samples(ops)
    intervals = {k: sorted(v) for k, v in intervals.items()}
    prof = _attribute(intervals, samples, steps, device_type)
    prof.unlinked_us = sum(b - a for c, ks in device.items() if c not in op_start for _, a, b in ks)
    prof.blocking = _attribute(intervals, blocking, steps, device_type).kernels
    if cuda:
        is_comm = {k: classify_kernel(k) == "communication" for k in {k for _, k, _, _ in linked}}  # once a name
        comm = [(t, k, a, b) for t, k, a, b in linked if is_comm[k]]
        busy = [(a, b) for _, k, a, b in linked if not is_comm[k]]
        exposed = exposed_us([(a, b) for _, _, a, b in comm], busy)
        prof.exposed_comm = _attribute(intervals, ((t, k, x) for (t, k, _, _), x in zip(comm, exposed)), steps,
                                       device_type).kernels
    return prof


def exposed_us(comm: list[tuple[float, float]], busy: list[tuple[float, float]]) -> list[float]:
    """Per communication kernel (start, end), the time in it during which no other device work ran: no
    `busy` interval (every kernel, copy or memset that is not communication, on any stream) and no
    earlier-starting communication kernel (so the sum over kernels is the union's exposed time, counted
    once). A collective overlapped by compute costs the step only what compute loses beside it; an exposed
    one costs its whole time: the part of communication the step waits for."""
    merged: list[list[float]] = []
    for a, b in sorted(busy):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [a for a, _ in merged]
    before = [0.0]  # busy time before each merged interval
    for a, b in merged:
        before.append(before[-1] + b - a)

    def busy_until(x: float) -> float:
        i = bisect.bisect_right(starts, x) - 1
        return 0.0 if i < 0 else before[i] + min(x, merged[i][1]) - merged[i][0]

    out = [0.0] * len(comm)
    covered = float("-inf")  # the end of the communication kernels already counted
    for i in sorted(range(len(comm)), key=lambda j: comm[j]):
        a, b = comm[i]
        a = max(a, covered)
        covered = max(covered, b)
        if b > a:
            out[i] = (b - a) - (busy_until(b) - busy_until(a))
    return out


def _cpu_self_samples(ops: list):
    """(start, name, self time) per CPU op; `ops` are (thread, start, end, name)."""
    ops.sort(key=lambda o: (o[0], o[1], -o[2]))
    n = len(ops)
    parent, nchild, child_us = [-1] * n, [0] * n, [0.0] * n
    stack: list = []
    thread = None
    for i, (th, start, end, _) in enumerate(ops):
        if th != thread:
            stack, thread = [], th
        while stack and (start >= ops[stack[-1]][2] or end > ops[stack[-1]][2]):
            stack.pop()
        if stack:
            p = stack[-1]
            parent[i] = p
            nchild[p] += 1
            child_us[p] += end - start
        stack.append(i)
    rep = list(range(n))  # parents precede their children in this order
    self_us: dict = defaultdict(float)
    for i, (_, start, end, name) in enumerate(ops):
        p = parent[i]
        if p >= 0 and nchild[p] == 1 and ops[p][3] == name:
            rep[i] = rep[p]
        self_us[rep[i]] += end - start - child_us[i]
    for i, t in self_us.items():
        name = ops[i][3]
        if t > 0 and not _is_range_name(name):
            yield ops[i][1], name, t


def _attribute(intervals: dict, samples, steps: int, device_type: str) -> PhaseProfile:
    """Sums samples (launch time, kernel name, µs) into every annotation range containing their
    launch time; warm-up ranges, and ranges nested in one, are left out."""
    intervals = dict(intervals)
    warm = intervals.pop(WARMUP, [])
    # phase ranges nested in a warm-up range are warm-up too
    intervals = {k: [iv for iv in v if not _containing(warm, iv[0])] for k, v in intervals.items()}
    intervals = {k: v for k, v in intervals.items() if v}
    prof = PhaseProfile(steps=steps, device_type=device_type)
    prof.range_wall_us = {k: [b - a for a, b in v] for k, v in intervals.items()}
    names = [n for n in ANNOTATIONS if n in intervals]
    for start, kname, dur in samples:
        if _containing(warm, start):
            continue
        for rng in names:
            if _containing(intervals[rng], start):
                slot = prof.kernels.setdefault(rng, {}).setdefault(kname, [0.0, 0])
                slot[0] += dur
                slot[1] += 1
    return prof


# ---------------------------------------------------------------------------------------------
def forward_loss(model, x, y, dtype: str = "fp32"):
    """The training forward (autograd recording, loss included): what the "forward" range holds
    and what nsys_profile (a) times with the Python timer."""
    with autocast_ctx(dtype, x.device):
        return cross_entropy(model(x), y)


def timer_forward_loss(model, x, y, dtype: str = "fp32"):
    """forward_loss for a timer's rounds: the loss detached, so each call's autograd graph (every
    activation the forward saved) is freed when the call returns. pytest-benchmark's pedantic keeps
    each round's return value until the next round has returned, so a loss returned with its graph kept
    two training forwards' activations alive: nsys_profile (2026) medium@2048 ran out of memory so
    (issue 45; NOTES.md), at 2 x 50.8 GB of activations + parameters, though one training step's
    closed form (57.6 GB) fits the H100's 85 GB."""
    return forward_loss(model, x, y, dtype).detach()


TWO_GRAPHS_CAUSE = ("the Python timer's rounds kept the previous round's loss, and with it that forward's whole "
                    "autograd graph, alive while the next forward ran (pytest-benchmark holds each round's return "
                    "value): two training forwards' activations at once, 2 x activations + parameters, against the "
                    "one step the closed form counts; fixed since issue 45 (the timer's forward returns the loss "
                    "detached: kernels.timer_forward_loss)")


def oom_vs_closed_form(need: dict, device_bytes: int | None) -> dict:
    """What an nsys_profile (2026) row records beside an OOM: the closed-form training step
    (impl.workloads.steps.memory_need) and the timer's training forward (parameters + activations),
    the two-graphs figure the timer needed before issue 45's fix, the device's bytes, and that known
    cause; the measured peak at the OOM is the row's memory."""
    forward = need["parameters"] + need["activations"]
    return dict(closed_form_train_step_bytes=need["total"], closed_form_training_forward_bytes=forward,
                two_forward_graphs_bytes=forward + need["activations"], device_bytes=device_bytes,
                fits_by_closed_form=device_bytes is None or need["total"] <= device_bytes,
                known_cause_before_fix=TWO_GRAPHS_CAUSE)


PROFILED = ("train_step", "forward_backward", "forward", "forward_no_grad")  # fallbacks, in order


def first_level_that_fits(run, start: str = PROFILED[0], cleanup=None):
    """(run(level), level, the OOM messages of the levels before it) for the first level of PROFILED
    from `start` whose `run` does not run out of memory; (None, None, messages) when none fits.
    `cleanup()` (grads, optimizer state) and free_memory run after each level that did not."""
    from impl.runtime import first_line, free_memory, is_oom

    failures = []
    for level in PROFILED[PROFILED.index(start):]:
        try:
            return run(level), level, failures
        except Exception as exc:  # noqa: BLE001  (an OOM is recorded, anything else raised)
            if not is_oom(exc):
                raise
            failures.append(f"{level}: {first_line(exc)}")
        if cleanup is not None:
            cleanup()
        free_memory()
    return None, None, failures


def annotated_train_step(model, x, y, dtype: str, optimizer, forward_only: bool = False,
                         upto: str | None = None) -> None:
    """One training step with each phase in its own range; each phase ends in a device sync
    inside its range, so a range's wall time is the time its GPU work took (as the Python timer
    measures it). `upto` (one of PROFILED) stops early, for configs whose full step runs out of
    memory: "forward_backward" skips the optimizer step, "forward" stops after the (training)
    forward, "forward_no_grad" runs the forward without autograd (no activations kept).
    forward_only=True is upto="forward"."""
    upto = upto or ("forward" if forward_only else "train_step")
    if upto not in PROFILED:
        raise ValueError(f"upto must be one of {PROFILED}, got {upto!r}")
    device = x.device
    optimizer.zero_grad(set_to_none=True)
    with annotate("forward"):
        with torch.no_grad() if upto == "forward_no_grad" else contextlib.nullcontext():
            loss = forward_loss(model, x, y, dtype)
        synchronize(device)
    if upto in ("forward", "forward_no_grad"):
        return
    with annotate("backward"):
        loss.backward()
        synchronize(device)
    if upto == "forward_backward":
        return
    with annotate("optimizer step"):
        optimizer.step()
        synchronize(device)


def profile_calls(fn, device: torch.device, warmup: int = 1, steps: int = 2,
                  trace_path=None) -> tuple[PhaseProfile, float]:
    """Profiles `steps` calls of `fn` (which annotates its phases) after `warmup` unrecorded ones
    (the schedule's warm-up phase: the profiler runs, so its start-up cost is paid, but keeps
    nothing); every call ends in a device sync, so its kernels are done before the profiler
    stops. Returns their phase profile and the seconds spent building it from the raw events
    (overhead, kept visible). `trace_path` (".json" or ".json.gz", compressed by torch) gets the
    Chrome trace of the recorded calls."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    kw = {}
    if warmup > 0:
        kw["schedule"] = torch.profiler.schedule(wait=0, warmup=warmup, active=steps, repeat=1)
    with torch.profiler.profile(activities=activities, **kw) as prof:
        for i in range(warmup + steps):
            with annotate(WARMUP) if i < warmup else contextlib.nullcontext():
                fn()
                synchronize(device)
            if warmup > 0:
                prof.step()
    t0 = time.perf_counter()
    result = phase_profile_from_kineto(prof.profiler.kineto_results, steps, device.type)
    parse_s = time.perf_counter() - t0
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    return result, parse_s


def profile_steps(model, x, y, dtype: str = "fp32", warmup: int = 1, steps: int = 2, trace_path=None,
                  forward_only: bool = False, upto: str | None = None) -> tuple[PhaseProfile, float]:
    """profile_calls of annotated_train_step (our AdamW, a fresh one)."""
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    result = profile_calls(lambda: annotated_train_step(model, x, y, dtype, optimizer, forward_only, upto),
                           x.device, warmup, steps, trace_path)
    optimizer.zero_grad(set_to_none=True)
    return result


# ---------------------------------------------------------------------------------------------
def _compact(rows: list[dict]) -> list[dict]:
    return [dict(name=r["name"][:160], category=r["category"], time_us=round(r["time_us"], 3),
                 calls=r["calls"], share=round(r["share"], 5)) for r in rows]


def nsys_answers(p: PhaseProfile, *, batch: int, heads: int, seq: int, head_dim: int, layers: int, top: int = 15,
                 nontrivial: float = 0.01) -> dict:
    """Everything nsys_profile (a)-(e) needs, as JSON-ready data."""
    fwd, fwd_bwd, train = ("forward",), ("forward", "backward"), PHASES
    steps = p.steps
    out: dict = {"steps_profiled": steps, "timing_source": p.timing_source}
    out["tables"] = {"forward": _compact(p.table(fwd, top)), "backward": _compact(p.table(("backward",), top)),
                     "optimizer step": _compact(p.table(("optimizer step",), top)),
                     "forward+backward": _compact(p.table(fwd_bwd, top)),
                     "train step": _compact(p.table(train, top))}
    # (a) profiled forward: the range's wall time (ends in a sync) and the summed kernel time
    walls = p.range_wall_us.get("forward", [])
    out["forward_range_ms"] = sum(walls) / len(walls) / 1e3 if walls else None
    out["forward_kernel_ms"] = p.total_us(fwd) / steps / 1e3
    out["phase_kernel_ms"] = {ph: p.total_us((ph,)) / steps / 1e3 for ph in PHASES}
    out["phase_range_ms"] = {ph: (sum(v) / len(v) / 1e3 if v else None)
                             for ph, v in ((ph, p.range_wall_us.get(ph, [])) for ph in PHASES)}
    # (b) top kernel in forward, its calls per forward pass, and whether it tops forward+backward
    tf, tfb = p.table(fwd, 1), p.table(fwd_bwd, 1)
    if tf:
        out["top_forward"] = dict(name=tf[0]["name"], category=tf[0]["category"],
                                  calls_per_pass=tf[0]["calls"] / steps, share=tf[0]["share"])
        out["top_forward_backward"] = dict(name=tfb[0]["name"], category=tfb[0]["category"], share=tfb[0]["share"])
        out["top_stays_on_top"] = tf[0]["name"] == tfb[0]["name"]
    # (c) non-matmul kernels with more than `nontrivial` of forward+backward time
    out["nontrivial_threshold"] = nontrivial
    out["non_matmul_nontrivial"] = _compact([r for r in p.table(fwd_bwd)
                                             if r["category"] != "matmul" and r["share"] > nontrivial][:top])
    # (d) matmul share: inference (forward) vs a full training step
    out["category_share"] = {"forward": p.category_shares(fwd), "train step": p.category_shares(train)}
    out["matmul_share_forward"] = out["category_share"]["forward"]["matmul"]
    out["matmul_share_train_step"] = out["category_share"]["train step"]["matmul"]
    # (e) softmax vs the two attention matmuls, time (per forward pass) and FLOPs
    flops = {k: layers * v for k, v in attention_part_flops(batch, heads, seq, head_dim).items()}  # per pass
    parts = {}
    for part in ATTENTION_PARTS:
        rows = p.table((part,))
        parts[part] = dict(time_ms=sum(r["time_us"] for r in rows) / steps / 1e3,
                           matmul_time_ms=sum(r["time_us"] for r in rows if r["category"] == "matmul") / steps / 1e3,
                           flops=flops[part])
    out["attention_parts"] = parts
    soft = parts["computing softmax"]
    mm_t = parts["computing attention scores"]["time_ms"] + parts["final matmul"]["time_ms"]
    mm_f = flops["computing attention scores"] + flops["final matmul"]
    out["softmax_to_matmuls_time_ratio"] = soft["time_ms"] / mm_t if mm_t else None
    out["softmax_to_matmuls_flop_ratio"] = soft["flops"] / mm_f
    return out


# step_breakdown's parts_ms: a partition of the phases' kernel time (they sum to kernel_ms). Attention is
# the attention-kind kernels; the LM head is the fused LM head + loss's Function (impl.annotate.PARTS: its
# forward computes the logits' gradients too); recompute is checkpointing's re-forward in backward, its
# attention apart (zero with keep_attention); "blocks" is the rest of the phase (norms, projections, MLP,
# embedding, the gradient sync's copies); communication every communication kernel, wherever launched.
STEP_PARTS = ("blocks forward", "attention forward", "lm head forward", "recompute", "attention recompute",
              "blocks backward", "attention backward", "lm head backward", "optimizer", "communication")


def step_parts(p: PhaseProfile) -> dict[str, float]:
    """STEP_PARTS' kernel time (us, over p.steps), from the ranges' category totals: the PARTS ranges are
    nested in a phase, so a phase less its parts is the rest."""
    cat = {r: p.category_us((r,)) for r in (*PHASES, *PARTS)}

    def attn(r: str) -> float:
        return cat[r]["attention"]

    def comm(r: str) -> float:
        return cat[r]["communication"]

    def rest(r: str) -> float:  # neither attention nor communication
        return sum(cat[r].values()) - attn(r) - comm(r)

    fwd, bwd, opt = PHASES
    lm_f, lm_b, rec = PARTS
    return {"blocks forward": rest(fwd) - rest(lm_f), "attention forward": attn(fwd) - attn(lm_f),
            "lm head forward": rest(lm_f) + attn(lm_f), "recompute": rest(rec), "attention recompute": attn(rec),
            "blocks backward": rest(bwd) - rest(rec) - rest(lm_b),
            "attention backward": attn(bwd) - attn(rec) - attn(lm_b), "lm head backward": rest(lm_b) + attn(lm_b),
            "optimizer": rest(opt) + attn(opt), "communication": sum(comm(ph) for ph in PHASES)}


def step_breakdown(p: PhaseProfile, step_s: float, top: int = 8) -> dict:
    """Where a training step's time goes, per step, as JSON-ready data (a few KB): kernel time in
    each phase and each category, the `top` kernels with their calls, and the gap between the
    measured step time `step_s` (timed without the profiler) and the kernel time: host work,
    launch overhead and device idle time (on the CPU, CPU op self time stands in for kernels).
    phase_host_ms: each phase's range on the host clock (under the profiler, so a little longer
    than unprofiled): the time the host took to issue the phase, which bounds a host-bound step.
    launch_ops: kernels launched by our Triton launchers outside a torch op are counted
    (impl.runtime.launch_ctx; earlier profiles missed them and counted their time in the gap);
    blocking_runtime_ms: per phase, host time in runtime calls that may wait for the device
    (PhaseProfile.blocking), so a phase_host_ms above the phase's kernels reads as waiting or issuing;
    unlinked_kernel_ms: the device time of events that still had no launching op (see
    PhaseProfile.unlinked_us: on the H100 this also counts a record beside the optimizer's
    kernels, so it is not simply what the tables miss).
    parts_ms (where a step opened a PARTS range): STEP_PARTS, which sum to kernel_ms.
    communication_exposed_ms (CUDA; None on the CPU, where collectives are not kernels): per phase, the
    communication kernels' time with no other device work beside them (exposed_us)."""
    per_step_ms = 1e3 * p.steps  # totals in us over p.steps steps -> ms per step
    kernel_ms = p.total_us(PHASES) / per_step_ms
    out = {"timing_source": p.timing_source, "steps_profiled": p.steps, "launch_ops": True,
           "step_ms": step_s * 1e3, "kernel_ms": kernel_ms, "gap_ms": step_s * 1e3 - kernel_ms,
           "phase_ms": {ph: p.total_us((ph,)) / per_step_ms for ph in PHASES},
           "phase_host_ms": {ph: sum(p.range_wall_us.get(ph, [])) / per_step_ms for ph in PHASES},
           "unlinked_kernel_ms": p.unlinked_us / per_step_ms,
           "blocking_runtime_ms": {ph: {n: dict(ms=t / per_step_ms, calls=c / p.steps) for n, (t, c) in calls.items()}
                                   for ph, calls in p.blocking.items() if ph in PHASES},
           "category_ms": {c: t / per_step_ms for c, t in p.category_us(PHASES).items()},
           "top": [dict(name=r["name"][:160], category=r["category"], ms=r["time_us"] / per_step_ms,
                        calls=r["calls"] / p.steps) for r in p.table(PHASES, top)],
           "communication_exposed_ms": {ph: sum(t for t, _ in p.exposed_comm.get(ph, {}).values()) / per_step_ms
                                        for ph in PHASES} if p.device_type == "cuda" else None}
    if any(r in p.range_wall_us for r in PARTS):
        out["parts_ms"] = {k: v / per_step_ms for k, v in step_parts(p).items()}
    return out
