"""FlashAttention-2 (Triton): from one call's tensors and options to its kernel launches.

The host path of a call is what every small attention row measures (seq <= 1024: the kernels take
microseconds), so it is built in two layers:

* **Call plans** (`_CallPlan`, the fast path). A call's *signature* holds everything its launches
  depend on except the tensors' addresses: shapes, strides, dtype, device, causal, the options
  value, the backward variant, each pointer's 16-byte alignment (Triton specializes on it). A
  signature seen before has a plan: the outputs to allocate and, per kernel, the compiled kernel
  with its grid and the non-tensor arguments (strides, lengths, scales, constexprs) already bound.
  A hit allocates the outputs and calls each compiled kernel's launcher the way
  ``JITFunction.run`` does after its cache hit; no autotuner, no argument specialization, no views.
* **The slow path** (`_forward_slow`, `_backward_slow`) runs a signature's first calls: a shape
  key's first call goes through the autotuner (benchmarking its list), later ones through
  ``JITFunction.run`` with the resolved config, which compiles the kernel and returns it; when every
  kernel of the call has one, the call's plan is stored. Under the interpreter (or
  ``direct_launch=False``) a plan's kernels are ordinary JIT calls with the same bound arguments,
  so the CPU tests run the plan logic too.

The Gluon kernels' calls under kernels="auto" (impl.attention.flash_dispatch) get plans of the same kind
(`_logged_plan`): built from what the Gluon launcher logged on a signature's first call (its buffers, each
compiled kernel with its arguments); a hit launches each as a `_BoundCall`, whose descriptors are the first
call's rebased onto the call's tensors.

The torch.library custom ops that carry these launchers through torch.compile (one opaque node each,
output metadata from its fake, so Dynamo never traces the launch path) are registered by
impl.attention.flash_dispatch, which picks between them and the Gluon kernels (options.kernels).
"""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Callable, Dict, Optional, Tuple

import torch
import triton
from triton import knobs as _knobs
from triton.runtime import driver as _driver

from impl.runtime import launch_ctx

from .backward_choice import ShapeKey, resolve_backward
from .flash_configs import (_BWD_ATOMIC_SAFE, _BWD_KV_SAFE, _BWD_Q_SAFE, _FWD_SAFE, _INTERPRETED, _PRE_BLOCK_M,
                            _PRUNE, _AUTOTUNE_KEY, _block_d, _cdiv, _config, _head_dim_tiles, _pinned_atomic_config,
                            _seq_bucket)
from .flash_kernels import _attn_bwd_atomic, _attn_bwd_dkdv, _attn_bwd_dq, _attn_bwd_preprocess, _attn_fwd
from .flash_options import FlashOptions, LaunchRecord, default_options, options_by_key

Tensor = torch.Tensor

LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------
# Layout: head-dim tiles, 4-D views, tensor descriptors
# ---------------------------------------------------------------------------

def _as_4d(x: Tensor) -> Tensor:
    """(B, S, d) -> (B, 1, S, d) view; (B, H, S, d) as is; more dims flattened."""
    if x.dim() == 3:
        return x.unsqueeze(1)
    if x.dim() == 4:
        return x
    return x.reshape(-1, x.shape[-2], x.shape[-1]).unsqueeze(1)


def _tiles(d: int, options: FlashOptions) -> Tuple[int, int]:
    """(BLOCK_D, D1) of head dim d under `options` (split_head_dim False: padded to a power of two)."""
    return _head_dim_tiles(d) if options.split_head_dim else (_block_d(d), 0)


def _tiles_label(d: int, block_d: int, d1: int) -> str:
    return f"{block_d}+{d1}" if d1 else f"{block_d}" if block_d == d else f"{block_d} padded"


def _head_dim_label(d: int) -> str:
    """How head dim d is tiled, for launch records: "64+16" (split), "128 padded", or "64"."""
    return _tiles_label(d, *_head_dim_tiles(d))


def _tma_ok(*tensors: Tensor, options: FlashOptions) -> bool:
    """Tensor descriptors need a unit stride along d and 16-byte aligned bases and row strides
    (true for contiguous inputs and their head/sequence transposes whenever d * itemsize is a
    multiple of 16); other layouts take the pointer path. False when `options` (required: there are
    no module defaults to fall back on) switch descriptors off."""
    if not options.tma:
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((st * size) % 16 for st in t.stride()[:-1]):
            return False
    return True


def _set_allocator(device: torch.device) -> None:
    """Triton allocates device-side descriptors' scratch memory through this per-thread allocator
    (the backward runs on autograd's thread, so every call sets it)."""
    triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def _tma_flag(scores: int, options: FlashOptions, *tensors: Tensor) -> bool:
    """The TMA constexpr of one launch of `scores` (batch·heads·n_q·n_k) tile elements. Device-side
    descriptors cost host time per launch (Triton allocates their scratch memory at every launch):
    +~50 us per forward call on the H100's host (probes/flash_host_overhead.json), so below
    options.tma_min_scores (one head of 8192 x 8192 by default) a GPU launch takes the pointer path.
    The interpreter has no launch cost to weigh: it takes descriptors whenever the layout allows, so
    the CPU tests run that path."""
    if not options.tma:
        return False
    cuda = tensors[0].is_cuda
    if cuda and scores < options.tma_min_scores:  # the threshold first: it skips the layout checks
        return False
    tma = _tma_ok(*tensors, options=options)
    if tma and cuda:
        _set_allocator(tensors[0].device)
    return tma


# ---------------------------------------------------------------------------
# Options -> kernels
# ---------------------------------------------------------------------------

_SAFE = {"fwd": _FWD_SAFE, "kv": _BWD_KV_SAFE, "q": _BWD_Q_SAFE, "atomic": _BWD_ATOMIC_SAFE}
# Autotuners built for config lists other than the committed ones, keyed (kernel, list); each wraps
# the same JITFunction as the module's autotuner, so compiled kernels are shared.
_TUNERS: Dict[tuple, object] = {}


def _kernels() -> Dict[str, object]:
    return {"fwd": _attn_fwd, "kv": _attn_bwd_dkdv, "q": _attn_bwd_dq, "atomic": _attn_bwd_atomic}


def _kernel(name: str, options: FlashOptions):
    """The autotuner launching kernel `name` ("fwd", "kv", "q", "atomic") under `options`: the
    module's (the committed list) unless options name a list or switch autotuning off. Under the
    interpreter always the module's (one small config)."""
    base = _kernels()[name]
    if _INTERPRETED:
        return base
    shapes = options.config_list(name)
    if shapes is None and not options.autotune:
        shapes = (_SAFE[name],)
    if shapes is None:
        return base
    tuner = _TUNERS.get((name, shapes))
    if tuner is None:
        extra = {"reset_to_zero": ["DQ"]} if name == "atomic" else {}
        tuner = _TUNERS[(name, shapes)] = triton.autotune(configs=[_config(s) for s in shapes], key=_AUTOTUNE_KEY,
                                                          prune_configs_by=_PRUNE, **extra)(base.fn)
    return tuner


def _options_key(options: Optional[FlashOptions]) -> int:
    """The int the custom ops carry for `options` (FlashOptions.key; 0: default_options())."""
    return 0 if options is None else options.key


def _options_of(key: int) -> FlashOptions:
    return options_by_key(key)


def _record(options: FlashOptions, record: LaunchRecord) -> LaunchRecord:
    """Hand `record` to options.recorder, when the caller set one (nothing is kept otherwise)."""
    if options.recorder is not None:
        options.recorder(record)
    return record


# ---------------------------------------------------------------------------
# One kernel of a plan
# ---------------------------------------------------------------------------

class _DirectCall:
    """A compiled kernel with its grid and the arguments after the call's tensors bound: launched by
    calling its launcher as JITFunction.run does after its cache hit (triton 3.6, runtime/jit.py),
    minus the argument specialization and cache-key building that found it."""

    __slots__ = ("kernel", "grid", "rest", "function", "packed")

    def __init__(self, kernel, grid: tuple, rest: tuple) -> None:
        if hasattr(kernel, "result"):  # an async-compile future
            kernel = kernel.result()
        self.kernel = kernel
        self.grid = (grid + (1, 1))[:3]
        self.rest = rest
        kernel.run  # noqa: B018 -- loads the module (_init_handles) so .function is set
        self.function = kernel.function
        self.packed = kernel.packed_metadata

    def __call__(self, tensors: tuple, stream) -> None:
        kernel = self.kernel
        enter = _knobs.runtime.launch_enter_hook
        full = tensors + self.rest
        g0, g1, g2 = self.grid
        meta = None if enter is None else kernel.launch_metadata(self.grid, stream, *full)
        kernel.run(g0, g1, g2, stream, self.function, self.packed, meta, enter, _knobs.runtime.launch_exit_hook,
                   *full)


class _BoundCall(_DirectCall):
    """A _DirectCall whose whole argument list is rebuilt per call from the call's tensors (the Gluon kernels:
    their descriptors carry the call's addresses and sit among the other arguments). `args`: the first call's
    arguments, every tensor and descriptor blanked (a plan keeps no tensor alive); `tensors_at`: (argument index,
    tensor index); `descs_at`: (argument index, tensor index, the first call's descriptor over no tensor)."""

    __slots__ = ("args", "tensors_at", "descs_at")

    def __init__(self, kernel, grid: tuple, args: tuple, tensors_at: tuple, descs_at: tuple) -> None:
        super().__init__(kernel, grid, ())
        self.args, self.tensors_at, self.descs_at = args, tensors_at, descs_at

    def __call__(self, tensors: tuple, stream) -> None:
        args = list(self.args)
        for i, j in self.tensors_at:
            args[i] = tensors[j]
        for i, j, desc in self.descs_at:
            args[i] = _rebased(desc, tensors[j])
        _DirectCall.__call__(self, tuple(args), stream)


def _is_descriptor(x) -> bool:
    """A host-side tensor descriptor (Triton's or Gluon's TensorDescriptor): the compiled kernel's launcher
    reads its base's address, shape, strides and padding (triton 3.6, backends/nvidia/driver.py,
    make_tensordesc_arg); its block shape and layout are the kernel's specialization, fixed at compile time."""
    return isinstance(getattr(x, "base", None), torch.Tensor) and hasattr(x, "block_shape")


def _rebased(desc, base: Tensor):
    """A copy of descriptor `desc` over `base`, without its __post_init__ checks: a plan's signature fixes the
    shape, strides, dtype and alignment the first call's descriptor was checked with."""
    new = object.__new__(desc.__class__)
    new.__dict__.update(desc.__dict__)
    new.base = base
    return new


def _logged_plan(device: torch.device, inputs: tuple, log, record: LaunchRecord) -> Optional["_CallPlan"]:
    """The plan of a launcher call that logged its buffers and launches (flash_gluon_common.LaunchLog), or None
    where one cannot be made: a launch without a compiled kernel, no launch, an argument tensor that starts at no
    input or buffer (a copy, an offset view), or two of those starting at one address (which one is meant is then
    unknown). Every argument is matched to its tensor by address, so the plan launches each kernel with the
    first call's arguments but the new call's tensors, and descriptors rebased onto them."""
    tensors = tuple(inputs) + tuple(log.buffers)
    where = {t.data_ptr(): j for j, t in enumerate(tensors)}
    if not log.launches or len(where) != len(tensors):
        return None
    calls = []
    for fn, grid, args, opts, kernel in log.launches:
        if kernel is None:
            return None
        bound = fn.signature.bind(*args, **{k: x for k, x in opts.items() if k in fn.arg_names})
        bound.apply_defaults()  # JITFunction.run launches with every parameter, defaults included
        values = list(bound.arguments.values())
        tensors_at, descs_at = [], []
        for i, x in enumerate(values):
            desc = _is_descriptor(x)
            if not (desc or isinstance(x, torch.Tensor)):
                continue
            j = where.get((x.base if desc else x).data_ptr())
            if j is None:
                return None
            if desc:
                descs_at.append((i, j, _rebased(x, None)))
            else:
                tensors_at.append((i, j))
            values[i] = None
        calls.append(_BoundCall(kernel, grid, tuple(values), tuple(tensors_at), tuple(descs_at)))
    every = tuple(range(len(tensors)))
    return _CallPlan(device, tuple((b.shape, b.dtype) for b in log.buffers), tuple(calls), (every,) * len(calls),
                     record, False, log.cast, tuple(log.zeroed))


class _JitCall:
    """The same bound arguments launched through JITFunction.run (the interpreter, direct_launch=False)."""

    __slots__ = ("fn", "grid", "ints", "constexprs")

    def __init__(self, fn, grid: tuple, ints: tuple, constexprs: dict) -> None:
        self.fn, self.grid, self.ints, self.constexprs = fn, grid, ints, constexprs

    def __call__(self, tensors: tuple, stream) -> None:
        self.fn[self.grid](*tensors, *self.ints, **self.constexprs)


# The autotuner's pick per (kernel, autotuner, shape key), resolved once. Value: (config, its kwargs,
# str(config) for records).
_resolved: Dict[tuple, Tuple[triton.Config, dict, str]] = {}


def _run_kernel(kernel, name: str, key: tuple, grid: Callable[[int, int], tuple], tensors: tuple, ints: tuple,
                constexprs: dict, options: FlashOptions, pinned: Optional[triton.Config] = None):
    """Launch the autotuned `kernel` on grid(BLOCK_M, BLOCK_N) with `tensors` then `ints` positional.
    Returns (str(config) of what ran, the call to keep in a plan or None). A shape key's first call
    goes through the autotuner and gives no call; later ones launch the resolved config through
    JITFunction.run, which returns the compiled kernel (a _DirectCall; a _JitCall under the
    interpreter or direct_launch=False). A `pinned` config is launched as if the autotuner had picked it."""
    rkey = (name, id(kernel)) + key
    hit = _resolved.get(rkey)
    if hit is None and pinned is not None and not _INTERPRETED:
        hit = _resolved[rkey] = (pinned, pinned.all_kwargs(), str(pinned))
    if hit is None:
        kernel[lambda meta: grid(meta["BLOCK_M"], meta["BLOCK_N"])](*tensors, *ints, **constexprs)
        config = kernel.best_config
        hit = _resolved[rkey] = (config, config.all_kwargs(), str(config))
        return hit[2], None
    config, kwargs, text = hit
    g = grid(config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"])
    if _INTERPRETED or not options.direct_launch:
        call = _JitCall(kernel.fn, g, ints, {**constexprs, **kwargs})
        call(tensors, None)
        return text, call
    compiled = kernel.fn[g](*tensors, *ints, **constexprs, **kwargs)
    if compiled is None:
        return text, None
    merged = {**constexprs, **config.kwargs}
    names = kernel.fn.arg_names
    tail = tuple(merged[n] for n in names[len(tensors) + len(ints):])
    return text, _DirectCall(compiled, g, ints + tail)


def _plain_call(fn, grid: tuple, tensors: tuple, ints: tuple, constexprs: dict, options: FlashOptions):
    """A kernel without an autotuner (the atomic backward's preprocessing): launched now, returned as
    a call for the plan."""
    if _INTERPRETED or not options.direct_launch:
        call = _JitCall(fn, grid, ints, constexprs)
        call(tensors, None)
        return call
    compiled = fn[grid](*tensors, *ints, **constexprs)
    # the launcher takes every parameter: those after the ints from constexprs, or their defaults (the
    # preprocessing's L and NL2, None: flash_gluon_bwd_ws's prescaled_lse alone passes them)
    tail = tuple(constexprs.get(p.name, p.default) for p in fn.params[len(tensors) + len(ints):])
    return None if compiled is None else _DirectCall(compiled, grid, ints + tail)


def _tune_key(q: Tensor, n_q: int, n_k: int, d: int, causal: bool) -> tuple:
    """The autotuner's own key (sequence bucket, head dim, causal, dtypes: all inputs share q's)."""
    return (_seq_bucket(n_q, n_k), d, causal, q.dtype)


# ---------------------------------------------------------------------------
# Call plans
# ---------------------------------------------------------------------------

class _CallPlan:
    """What one signature's call does after its first calls: allocate `outputs` (shape, dtype) and run
    `calls` in order, each on its slice of the call's tensors (`slots`: indices into inputs +
    outputs); `record` is the call's LaunchRecord (a backward plan's names its variant); a backward
    plan also keeps the dtype dQ is cast to (the atomic variant); `zeroed`: the outputs zeroed before the launches
    (a Gluon launcher's LaunchLog.zeroed: the ws forward's dynamic tile counter)."""

    __slots__ = ("device", "outputs", "calls", "pick", "record", "tma", "cast", "zeroed")

    def __init__(self, device: torch.device, outputs: tuple, calls: tuple, slots: tuple, record: LaunchRecord,
                 tma: bool, cast: Optional[torch.dtype] = None, zeroed: tuple = ()) -> None:
        self.device, self.outputs, self.calls = device, outputs, calls
        self.pick = tuple(itemgetter(*s) for s in slots)  # every slot tuple has >= 2 indices: a tuple back
        self.record, self.tma, self.cast, self.zeroed = record, tma, cast, zeroed

    def run(self, inputs: tuple) -> tuple:
        device = self.device
        outs = tuple([torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.outputs])
        for i in self.zeroed:
            outs[i].zero_()
        tensors = inputs + outs
        if device.type == "cuda":
            index = device.index
            if self.tma:
                _set_allocator(device)
            if torch._C._cuda_getDevice() != index or torch.autograd.profiler._is_profiler_enabled:
                with launch_ctx(inputs[0], "impl_flash::kernels"):
                    self._launch(tensors, _current_stream(index))
            else:
                self._launch(tensors, _current_stream(index))
        else:
            self._launch(tensors, None)
        return outs

    def _launch(self, tensors: tuple, stream) -> None:
        for call, pick in zip(self.calls, self.pick):
            call(pick(tensors), stream)

    def grads(self, inputs: tuple) -> tuple:
        """A backward plan's (dq, dk, dv): its first three outputs (the rest: D, and the ws backward's −lse·log2 e
        with prescaled_lse), dQ cast from its fp32 buffer where `cast` says."""
        dq, dk, dv = self.run(inputs)[:3]
        return (dq if self.cast is None else dq.to(self.cast)), dk, dv


def _current_stream(index: int):
    """The raw CUDA stream Triton launches on (its driver's choice)."""
    return _driver.active.get_current_stream(index)


# signature -> _CallPlan, for forward and backward calls (the signature's first element says which).
_calls: Dict[tuple, _CallPlan] = {}
# Plans kept at most: a signature holds shapes, so a job whose lengths keep changing (growing contexts, packed
# batches) would otherwise keep one plan per length forever. Past it the oldest plan goes (a miss rebuilds it).
MAX_PLANS = 4096


def _plan(sig: Optional[tuple]) -> Optional[_CallPlan]:
    """The plan kept under `sig` (None: none, or no signature)."""
    return None if sig is None else _calls.get(sig)


def _keep_plan(sig: tuple, plan: _CallPlan) -> None:
    """Store `plan` under `sig`, the oldest plan dropped first when MAX_PLANS others are held."""
    while sig not in _calls and len(_calls) >= MAX_PLANS:
        del _calls[next(iter(_calls))]
    _calls[sig] = plan


def clear_plans() -> None:
    """Forget resolved autotune picks and call plans (after the config lists change)."""
    _resolved.clear()
    _calls.clear()


# ---------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------

def _forward_signature(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions) -> tuple:
    return ("fwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), q.dtype, q.device, causal, options.key)


def _aligned(*tensors: Tensor) -> bool:
    """Every pointer 16-byte aligned. Triton specializes each pointer on it; plans are made for aligned
    inputs only (the usual case: the caching allocator aligns to 512 bytes), so misaligned ones always
    take the slow path."""
    ptrs = 0
    for t in tensors:
        ptrs |= t.data_ptr()
    return not ptrs & 15


def _plannable(views: tuple, tensors: tuple) -> bool:
    """A plan launches on the call's own tensors: each 4-D view the kernels got must start where its
    tensor does (a >4-D input reshaped by copying does not), and every pointer must be aligned."""
    return all(a.data_ptr() == b.data_ptr() for a, b in zip(views, tensors)) and _aligned(*tensors)


def _forward(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions):
    sig = _forward_signature(q, k, v, causal, options)
    plan = _calls.get(sig)
    if plan is None or not _aligned(q, k, v):
        return _forward_slow(q, k, v, causal, options, sig)
    o, lse = plan.run((q, k, v))
    _record(options, plan.record)
    return o, lse, plan.record


def _forward_slow(q: Tensor, k: Tensor, v: Tensor, causal: bool, options: FlashOptions, sig: tuple):
    q4, k4, v4 = _as_4d(q), _as_4d(k), _as_4d(v)
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    # o and lse are allocated in the shapes returned; contiguous, so the 4-D views' strides are theirs.
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    o4 = _as_4d(o)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _tiles(d, options)
    tma = block_d <= options.fwd_tma_max_block_d and _tma_flag(B * H * n_q * n_k, options, k4, v4)
    tensors = (q4, k4, v4, o4, lse)
    ints = (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), H, n_q, n_k, _seq_bucket(n_q, n_k),
            sm_scale * LOG2E)
    with launch_ctx(q, "impl_flash::forward_kernel"):
        text, call = _run_kernel(_kernel("fwd", options), "fwd", _tune_key(q, n_q, n_k, d, causal),
                                 lambda m, n: (_cdiv(n_q, m), B * H), tensors, ints,
                                 dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma), options)
    record = _record(options, LaunchRecord("fwd", (("fwd", text),), _tiles_label(d, block_d, d1), tma))
    if call is not None and _plannable((q4, k4, v4), (q, k, v)):
        _keep_plan(sig, _CallPlan(q.device, ((q.shape, q.dtype), (q.shape[:-1], torch.float32)), (call,),
                                ((0, 1, 2, 3, 4),), record, tma))
    return o, lse, record


def _backward_signature(q, k, v, o, do, lse, causal: bool, options: FlashOptions, variant: Optional[str]) -> tuple:
    # The variant a call runs is a function of its shape, its options (variant, atomic_min_work) and
    # the per-call override: all in the signature, so a plan always runs the variant it was made for.
    return ("bwd", q.shape, q.stride(), k.shape, k.stride(), v.stride(), o.stride(), do.shape, do.stride(),
            lse.shape, lse.is_contiguous(), q.dtype, q.device, causal, options.key, variant)


def _backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
              options: FlashOptions, variant: Optional[str] = None):
    sig = _backward_signature(q, k, v, o, do, lse, causal, options, variant)
    plan = _calls.get(sig)
    if plan is None or not _aligned(q, k, v, o, do):
        d = q.shape[-1]
        shape_key = ShapeKey(q.numel() // (q.shape[-2] * d), q.shape[-2], k.shape[-2], d, q.dtype, causal)
        kind = resolve_backward(shape_key, options, variant)
        return _backward_slow(q, k, v, o, do, lse, causal, options, kind, sig)
    dq, dk, dv = plan.grads((q, k, v, o, do, lse))
    _record(options, plan.record)
    return dq, dk, dv, plan.record


def _backward_slow(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor, causal: bool,
                   options: FlashOptions, kind: str, sig: tuple):
    q4, k4, v4, o4, do4 = (_as_4d(t) for t in (q, k, v, o, do))
    B, H, n_q, d = q4.shape
    n_k = k4.shape[2]
    lse3 = lse.reshape(B, H, n_q).contiguous()
    # Outputs in the shapes returned, contiguous (their 4-D views share their strides); the
    # slots below index inputs (q, k, v, o, do, lse) then outputs.
    dq_shape, dq_dtype = (q.shape, q.dtype) if kind == "two_pass" else (q.shape, torch.float32)
    outputs = ((dq_shape, dq_dtype), (k.shape, k.dtype), (v.shape, v.dtype), ((B, H, n_q), torch.float32))
    dq, dk, dv, delta = (torch.empty(s, dtype=t, device=q.device) for s, t in outputs)
    dq4, dk4, dv4 = _as_4d(dq), _as_4d(dk), _as_4d(dv)
    sm_scale = 1.0 / math.sqrt(d)
    block_d, d1 = _tiles(d, options)
    key = _tune_key(q, n_q, n_k, d, causal)
    tma = _tma_flag(B * H * n_q * n_k, options, q4, k4, v4, do4)
    bucket = _seq_bucket(n_q, n_k)
    tail = (H, n_q, n_k, bucket, sm_scale, sm_scale * LOG2E)

    def grid_kv(m, n):
        return (_cdiv(n_k, n), B * H)

    with launch_ctx(q, "impl_flash::backward_kernels"):
        if kind == "two_pass":
            const = dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma)
            # dQ first: it writes D, which the dK/dV kernel reads.
            dq_text, dq_call = _run_kernel(
                _kernel("q", options), "dq", key, lambda m, n: (_cdiv(n_q, m), B * H),
                (q4, k4, v4, o4, do4, dq4, lse3, delta),
                (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), *do4.stride(), *dq4.stride()) + tail,
                const, options)
            kv_text, kv_call = _run_kernel(
                _kernel("kv", options), "dkdv", key, grid_kv, (q4, k4, v4, do4, dk4, dv4, lse3, delta),
                (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dk4.stride(), *dv4.stride()) + tail,
                const, options)
            configs = (("dq", dq_text), ("dkdv", kv_text))
            calls = (dq_call, kv_call)
            slots = ((0, 1, 2, 3, 4, 6, 5, 9), (0, 1, 2, 4, 7, 8, 5, 9))
            cast = None
        else:
            # fp32 inputs accumulate into dQ itself; 16-bit ones into an fp32 buffer, cast at the end.
            pre_call = _plain_call(_attn_bwd_preprocess, (_cdiv(n_q, _PRE_BLOCK_M), B * H), (o4, do4, delta, dq4),
                                   (*o4.stride(), *do4.stride(), *dq4.stride(), H, n_q),
                                   dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, BLOCK_M=_PRE_BLOCK_M), options)
            dq_tma = tma and options.atomic_dq_tma and not _INTERPRETED and _tma_ok(dq4, options=options)
            text, atomic_call = _run_kernel(
                _kernel("atomic", options), "atomic", key, grid_kv, (q4, k4, v4, do4, dq4, dk4, dv4, lse3, delta),
                (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride(), *dq4.stride(), *dk4.stride(),
                 *dv4.stride()) + tail,
                dict(HEAD_DIM=d, BLOCK_D=block_d, D1=d1, IS_CAUSAL=causal, TMA=tma, DQ_TMA=dq_tma),
                options, pinned=_pinned_atomic_config(q.dtype, d, (block_d, d1)))
            configs = (("atomic", text),)
            calls = (pre_call, atomic_call)
            slots = ((3, 4, 9, 6), (0, 1, 2, 4, 6, 7, 8, 5, 9))
            cast = None if q.dtype == torch.float32 else q.dtype
            if cast is not None:
                dq = dq.to(cast)
    record = _record(options, LaunchRecord("bwd", configs, _tiles_label(d, block_d, d1), tma, kind))
    if all(c is not None for c in calls) and _plannable((q4, k4, v4, o4, do4), (q, k, v, o, do)) \
            and lse.is_contiguous():
        _keep_plan(sig, _CallPlan(q.device, outputs, calls, slots, record, tma, cast))
    return dq, dk, dv, record


def flash_attention_triton_forward(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                   options: Optional[FlashOptions] = None) -> Tuple[Tensor, Tensor]:
    """Run the forward kernel. Returns ``(o, lse)`` with ``lse`` of shape q.shape[:-1], fp32.
    `options` None: default_options(). The launch record goes to options.recorder (see
    flash_attention_triton_forward_recorded for it returned)."""
    o, lse, _ = _forward(q, k, v, bool(is_causal), options or default_options())
    return o, lse


def flash_attention_triton_backward(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                                    is_causal: bool = False, variant: Optional[str] = None,
                                    options: Optional[FlashOptions] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """Run the backward kernels. Returns ``(dq, dk, dv)`` in the input dtypes.

    `variant` ("two_pass", "atomic", "auto"; None: options.variant) picks the implementation
    (backward_choice.resolve_backward); the choice is in the launch record (options.recorder)."""
    dq, dk, dv, _ = _backward(q, k, v, o, do, lse, bool(is_causal), options or default_options(), variant)
    return dq, dk, dv


def flash_attention_triton_forward_recorded(q: Tensor, k: Tensor, v: Tensor, is_causal: bool = False,
                                            options: Optional[FlashOptions] = None):
    """flash_attention_triton_forward returning ``(o, lse, LaunchRecord)``."""
    return _forward(q, k, v, bool(is_causal), options or default_options())


def flash_attention_triton_backward_recorded(q: Tensor, k: Tensor, v: Tensor, o: Tensor, do: Tensor, lse: Tensor,
                                             is_causal: bool = False, variant: Optional[str] = None,
                                             options: Optional[FlashOptions] = None):
    """flash_attention_triton_backward returning ``(dq, dk, dv, LaunchRecord)``."""
    return _backward(q, k, v, o, do, lse, bool(is_causal), options or default_options(), variant)
