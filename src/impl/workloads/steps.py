"""The steps that benchmarking_script times: forward, backward alone, forward+backward, and a
full training step with AdamW, each as (fn, setup) for impl.bench.harness.Harness.measure; and
the training step with switchable speed-ups that training_step ablates (TrainConfig)."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from impl import accounting as acc
from impl.model import AdamW, Embedding, Linear, TransformerLM, cross_entropy
from impl.model.fused_ce import LMHead, fused_linear_cross_entropy
from impl.model.loss import check_reduction
from impl.annotate import PHASES, annotate, annotating_parts
from impl.workloads.compiled import compile_blocks_in_place
from impl.workloads.pointwise_compile import compile_pointwise_in_place
from impl.model import ModelConfig, SizeRef, model_config

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_ctx(dtype: str, device: torch.device):
    """fp32 runs plainly; bf16/fp16 run under autocast with fp32 master weights."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


Size = str | SizeRef | ModelConfig  # a named config (impl.model.MODEL_CONFIGS), an edition's size, or a shape


def size_config(size: Size) -> ModelConfig:
    """The ModelConfig a sweep's size names; a clear error for anything else."""
    if isinstance(size, ModelConfig):
        return size
    if isinstance(size, SizeRef):
        return size.config
    if isinstance(size, str):
        return model_config(size)
    raise TypeError(f"a model size is a name, a SizeRef or a ModelConfig, got {type(size).__name__}")


def build_model(size: Size, context: int, device: torch.device, attn_impl: str = "naive", seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM.from_config(size_config(size), context_length=context, attn_impl=attn_impl, device=device)


# What each timed step of benchmarking_script keeps alive at its peak (this module's modes). The
# forward runs without autograd, so its activations are transient (not counted: the need is a floor);
# the backward's forward (timed or in its setup) saves them; the optimizer step runs after a
# forward+backward with AdamW's moments alive.
STEP_MODE_STATE = {
    "forward": ("parameters",),
    "backward": ("parameters", "gradients", "activations"),
    "forward_backward": ("parameters", "gradients", "activations"),
    "optimizer_step": ("parameters", "gradients", "optimizer_state", "activations"),
    "train_step": ("parameters", "gradients", "optimizer_state", "activations"),
}


def step_memory_need(mode: str, n_params: int, activations: float, cast_bytes: float = 0.0) -> dict[str, float]:
    """Closed-form bytes one single-device step of `mode` needs (fp32 parameters, gradients and AdamW
    moments; `activations`: what autograd saves, activation_bytes; `cast_bytes`: autocast's cached
    low-precision weight copies, alive through the forward): each term and their "total"."""
    if mode not in STEP_MODE_STATE:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(STEP_MODE_STATE)}")
    full = acc.memory_breakdown(n_params, activations=activations)
    out = {term: full[term] for term in STEP_MODE_STATE[mode]}
    if cast_bytes:
        out["autocast_weight_copies"] = float(cast_bytes)
    out["total"] = sum(out.values())
    return out


def memory_need(size: Size, mode: str, dtype: str, batch: int, context: int) -> dict[str, float]:
    """The closed-form bytes a `mode` step of this size needs on one device (step_memory_need), for a
    row's details beside its measured peak or its OOM: activations as fp32 autograd saves them (under autocast a uniform 2-byte estimate), and under autocast the
    low-precision copies of every Linear weight."""
    c = size_config(size)
    low = dtype != "fp32"
    activations = acc.activation_bytes(batch, context, c.d_model, c.d_ff, c.num_heads, c.num_layers, c.vocab_size,
                                       bytes_per=DTYPES[dtype].itemsize)
    linear_numel = c.num_layers * (4 * c.d_model ** 2 + 3 * c.d_model * c.d_ff) + c.vocab_size * c.d_model
    need = step_memory_need(mode, c.params, activations,
                                cast_bytes=linear_numel * DTYPES[dtype].itemsize if low else 0)
    return need


def fitting_contexts(size: Size, batch: int, dtype: str, device_bytes: float | None, *, lo: int, hi: int,
                     headroom: float) -> list[int]:
    """The powers of two in [lo, hi] whose training step (forward, backward, AdamW) fits
    `headroom` × device_bytes by the closed form (memory_need); all of them when device_bytes is
    None (a CPU has no device-memory limit)."""
    if lo < 1 or hi < lo or not 0 < headroom <= 1:
        raise ValueError(f"fitting_contexts needs 1 <= lo <= hi and 0 < headroom <= 1, got {lo}, {hi}, {headroom}")
    out, c = [], 1 << (lo - 1).bit_length()
    while c <= hi:
        if device_bytes is None or memory_need(size, "train_step", dtype, batch, c)["total"] <= headroom * device_bytes:
            out.append(c)
        c *= 2
    return out


def chosen_2026_cases(g, device_bytes: int | None) -> list[tuple[str, int]]:
    """nsys_profile (2026)'s (size, context) pairs for grid `g` (impl.workloads.grids.Nsys2026Grid):
    the `n_sizes` largest candidates that have `n_contexts` fitting contexts (fitting_contexts on
    g.device_bytes, else `device_bytes`), each with its longest `n_contexts`, smallest size first.
    Shared by perf/test_nsys_profile.py and the Nsight Systems cases (impl.nsys.cases)."""
    device_bytes = g.device_bytes or device_bytes
    chosen = []
    for name in reversed(g.candidates):
        fit = fitting_contexts(SizeRef(g.edition, name), g.batch, g.dtype, device_bytes,
                               lo=g.min_context, hi=g.max_context, headroom=g.headroom)
        if len(fit) >= g.n_contexts and len(chosen) < g.n_sizes:
            chosen.append((name, fit[-g.n_contexts:]))
    return [(name, c) for name, fit in reversed(chosen) for c in fit]


def fallback_2026_cases(g, cases: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Per size of `cases` (chosen_2026_cases), the power of two below its shortest chosen context,
    where that is still >= g.min_context: the context nsys_profile (2026) runs instead when one of
    the size's chosen contexts runs out of memory, so the size keeps three that ran."""
    out = []
    for name in dict.fromkeys(s for s, _ in cases):
        low = min(c for s, c in cases if s == name) // 2
        if low >= g.min_context:
            out.append((name, low))
    return out


def device_memory_bytes(device: torch.device) -> int | None:
    """The device's total memory, or None off CUDA."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def random_batch(model: TransformerLM, batch: int, context: int, device: torch.device, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    tokens = torch.randint(0, model.vocab_size, (batch, context + 1), generator=g).to(device)
    return tokens[:, :-1], tokens[:, 1:]


def make_step(mode: str, model: TransformerLM, x: torch.Tensor, y: torch.Tensor, dtype: str,
              optimizer: torch.optim.Optimizer | None = None, fused_ce: bool = False, loss: str = "mean",
              after_backward: Callable[[], None] | None = None,
              lm_head: LMHead | None = None) -> tuple[Callable, Callable | None]:
    """Returns (fn, setup): fn is timed, setup runs untimed before each call. `model` may be a
    torch.compile'd wrapper; fused_ce applies the LM head inside the loss (impl.model.fused_ce), as `lm_head`
    says (None: LMHead's defaults);
    loss: the cross-entropy's reduction over tokens ("mean" or "sum"); after_backward runs between
    the train step's backward and its optimizer step (a data-parallel gradient synchronisation).
    The train step returns its (detached) loss; train_step(annotated=True) runs each phase in its
    profiler range (impl.annotate.PHASES) and its parts in theirs (PARTS: the fused LM head, the
    recompute), for a profiled call: the timed calls go without (no range's host cost in their time)."""
    device = x.device
    check_reduction(loss)
    lm_head = lm_head or LMHead()

    def loss_fn():
        with autocast_ctx(dtype, device):
            if fused_ce:
                return fused_linear_cross_entropy(model(x, return_hidden=True), model.lm_head.weight, y,
                                                  rows=lm_head.rows(model.vocab_size), reduction=loss,
                                                  softmax=lm_head.softmax)
            return cross_entropy(model(x), y, reduction=loss)

    if mode == "forward":
        def forward():
            with torch.no_grad(), autocast_ctx(dtype, device):
                return model(x)
        return forward, None

    if mode == "backward":
        def setup():
            model.zero_grad(set_to_none=True)
            return (loss_fn(),), {}
        return (lambda loss: loss.backward()), setup

    if mode == "forward_backward":
        def forward_backward():
            model.zero_grad(set_to_none=True)
            loss_fn().backward()
        return forward_backward, None

    if mode == "optimizer_step":  # the 2026 edition times the optimizer step apart
        if optimizer is None:
            optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def fill_grads():
            optimizer.zero_grad(set_to_none=True)
            loss_fn().backward()
            return (), {}
        return (lambda: optimizer.step()), fill_grads

    if mode == "train_step":
        if optimizer is None:
            optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def train_step(annotated: bool = False):
            phase = annotate if annotated else _no_range
            optimizer.zero_grad(set_to_none=True)
            with annotating_parts() if annotated else contextlib.nullcontext():  # impl.annotate.PARTS
                with phase(PHASES[0]):
                    loss = loss_fn()
                with phase(PHASES[1]):
                    loss.backward()
                    if after_backward is not None:
                        after_backward()
                with phase(PHASES[2]):
                    optimizer.step()
            return loss.detach()
        return train_step, None

    raise ValueError(f"unknown mode {mode!r}; expected forward, backward, forward_backward, optimizer_step or "
                     "train_step")


def _no_range(name: str):
    return contextlib.nullcontext()


class ModelCache:
    """Keeps the last-built model so a sweep over contexts, dtypes and modes of one size builds it
    once; building another size frees the previous one first (the GPU holds one at a time)."""

    def __init__(self):
        self.key, self.model = None, None

    def get(self, size: Size, context_length: int, device: torch.device, attn_impl: str = "naive") -> TransformerLM:
        key = (size, context_length, str(device), attn_impl)
        if key != self.key:
            self.clear()
            self.model = build_model(size, context_length, device, attn_impl)
            self.key = key
        self.model.zero_grad(set_to_none=True)
        return self.model

    def clear(self) -> None:
        from impl.runtime import free_memory

        self.key, self.model = None, None
        free_memory()


def model_and_batch(harness, models: ModelCache, *, problem: str, config: dict, size: Size, context_length: int,
                    batch: int, context: int, details: dict | None = None):
    """(model, x, y) from the cache, or None after recording the config as OOM: building a large
    model can itself run out of memory, and that is a result, not a crash."""
    from impl.runtime import is_oom

    try:
        model = models.get(size, context_length, harness.device)
        return (model, *random_batch(model, batch, context, harness.device))
    except Exception as exc:  # noqa: BLE001 - only OOM is turned into a row
        if not is_oom(exc):
            raise
        message = str(exc)
    models.clear()  # outside the except block, whose traceback holds the tensors
    harness.oom(problem=problem, config=config, exc=message, details=details)
    return None


# training_step (issue 8): the full training step with switchable speed-ups, for an ablation.

@dataclass(frozen=True)
class TrainConfig:
    """How one training step runs.

    dtype      "fp32", or "bf16": autocast, fp32 optimizer state, fp32 master weights (the
               parameters themselves, or the optimizer's copies for weights="bf16")
    weights    "fp32": every parameter stored in fp32 (under bf16 autocast, each matmul weight is
               cast to bf16 in the forward and its bf16 gradient back to an fp32 .grad in the
               backward); "bf16": the weight of every Linear (the matmul weights, lm_head
               included: ~99% of the parameters) stored in bf16, so neither cast runs and the
               weight gradients are bf16; each weight is the upper half of its fp32 master,
               whose lower half lives in the optimizer (impl.model.adamw_master). The
               embedding and the RMSNorm gains stay fp32, so the residual stream stays fp32 as
               under plain autocast; "bf16_residual": the token embedding too (through its master
               alike), so the residual stream and every activation between blocks is bf16 (the
               RMSNorms still compute in fp32 and return bf16; the gains stay fp32). Both need
               dtype "bf16" and an "adamw_master" optimizer
    attn_impl  any impl.attention name: "naive", "flash_triton" (FlashAttention-2), "sdpa", ...
    compile    "none"; "blocks": torch.compile of each TransformerBlock in place (regional: the
               blocks share one code object, so one block's graph is compiled and reused by every
               layer, far quicker than compiling the whole model); "model": torch.compile(model);
               "model+cudagraphs": the same under mode="reduce-overhead" (Inductor records the
               forward and backward graphs as CUDA graphs and replays them: one launch per graph
               instead of the host issuing each kernel; with another backend, e.g. the CPU smoke's
               aot_eager, or on the CPU, the call path runs without graphs).
               Both take the sequence dimension as dynamic (make_train_step), so the graphs of
               one size serve every context: compile once per size, not per (size, context).
               "pointwise": only the RMSNorms, RoPE and SwiGLUs compiled (impl.workloads.
               pointwise_compile), attention and checkpointing eager (the 8B leaderboard step)
    optimizer  "adamw" (ours, foreach), "adamw_fused" (ours through torch._fused_adamw_),
               "torch_adamw" (torch.optim.AdamW, fused on CUDA, its default foreach on the CPU),
               "adamw_master" / "adamw_master_fused" (impl.model.adamw_master.AdamWMaster: bf16
               parameters through fp32 masters, one Triton launch for all of them, the fp32 ones as
               "adamw" / "adamw_fused")
               "adamw_master_sharded": AdamWMaster inside impl.distributed.ShardedOptimizer over the
               default process group (each rank keeps the masters and moments of the parameters
               it owns, steps them and broadcasts them)
    fused_ce   LM head + cross-entropy fused and chunked (impl.model.fused_ce)
    loss       the cross-entropy's reduction over tokens: "mean", or "sum" (the 2026 leaderboard)
    grad_sync  "none", or "ddp_bucketed": data parallel over the default process group, gradients
               all-reduced in GRAD_BUCKET_MB buckets during backward (impl.distributed.DDPBucketed)
               and waited for before the optimizer step; averaged for loss "mean", summed for "sum",
               so that either way the step is the single-process step on the ranks' joined batch;
               or "reduce_to_owner": each gradient reduced only to the rank that owns its parameter in
               the sharded optimizer (impl.distributed.DDPReduceToOwner: ZeRO-2), the others freed
    """

    dtype: str = "fp32"
    weights: str = "fp32"
    attn_impl: str = "naive"
    compile: str = "none"
    optimizer: str = "adamw"
    fused_ce: bool = False
    loss: str = "mean"
    grad_sync: str = "none"


GRAD_SYNCS = ("none", "ddp_bucketed", "reduce_to_owner")
GRAD_BUCKET_MB = 100  # the fsdp section's DDP bucket size


def train_config(bf16=False, flash=False, compile="none", fused_adamw=False, fused_ce=False, bf16_weights=False,
                 flash_impl="flash_triton") -> TrainConfig:
    """The switchable options of the ablation as a TrainConfig (compile: a TrainConfig.compile
    mode). bf16_weights stores the Linear weights in bf16 and takes the master-weight AdamW (whose
    fp32 parameters go through the fused kernel when fused_adamw is on too)."""
    optimizer = ("adamw_master" if bf16_weights else "adamw") + ("_fused" if fused_adamw else "")
    return TrainConfig(dtype="bf16" if bf16 else "fp32", weights="bf16" if bf16_weights else "fp32",
                       attn_impl=flash_impl if flash else "naive", compile=compile,
                       optimizer=optimizer, fused_ce=fused_ce)


# Each speed-up alone on top of bf16, then all of them; the anchor is PyTorch's own pieces. fast
# compiles the whole model as the anchor does, so the two differ only in the pieces that are ours
# (attention, optimizer, LM head + loss); +compile alone compiles per block: regional compilation
# costs a fraction of the whole model's (a minute or two per size on the H100), and a third
# whole-model compile per size would not fit the GPU command. (fast compiled per block before:
# NOTES.md estimates that cost it most of its host time at 2.7B.)
TRAIN_CONFIGS = {
    "fp32": dict(),
    "bf16": dict(bf16=True),
    "+flash": dict(bf16=True, flash=True),
    "+compile": dict(bf16=True, compile="blocks"),
    "+fused_adamw": dict(bf16=True, fused_adamw=True),
    "+fused_ce": dict(bf16=True, fused_ce=True),
    "+bf16_weights": dict(bf16=True, bf16_weights=True),
    "fast": dict(bf16=True, flash=True, compile="model", fused_adamw=True, fused_ce=True, bf16_weights=True),
}
# the next try after fast (NOTES.md): its backward was host-bound at 2.7B and its whole step at xl
TRAIN_CONFIGS["fast+cudagraphs"] = dict(TRAIN_CONFIGS["fast"], compile="model+cudagraphs")
ANCHOR = TrainConfig(dtype="bf16", attn_impl="sdpa", compile="model", optimizer="torch_adamw")


def named_train_config(name: str, flash_impl: str = "flash_triton") -> TrainConfig:
    """A named config of the ablation ("fp32", "bf16", "+flash", ..., "fast", "anchor")."""
    if name == "anchor":
        return ANCHOR
    try:
        return train_config(**TRAIN_CONFIGS[name], flash_impl=flash_impl)
    except KeyError:
        raise ValueError(f"unknown training config {name!r}; expected one of {[*TRAIN_CONFIGS, 'anchor']}") from None


def compile_model(model: TransformerLM, how: str, backend: str = "inductor"):
    """The module to call: `model` itself (its blocks compiled in place for "blocks",
    impl.workloads.compiled.compile_blocks_in_place) or a compiled wrapper ("model",
    "model+cudagraphs").
    Compilation happens at the first calls."""
    if how == "none":
        return model
    if how == "blocks":
        compile_blocks_in_place(model, backend=backend)
        return model
    if how == "pointwise":
        compile_pointwise_in_place(model, backend=backend)
        return model
    if how == "model+cudagraphs" and backend == "inductor":
        return torch.compile(model, mode="reduce-overhead")
    if how in ("model", "model+cudagraphs"):
        return torch.compile(model, backend=backend)
    raise ValueError(f"unknown compile mode {how!r}; expected none, blocks, pointwise, model or model+cudagraphs")


def make_optimizer(kind: str, params, lr: float = 1e-4, weight_decay: float = 0.01,
                   group=None) -> torch.optim.Optimizer:
    """`group`: the process group of "adamw_master_sharded" (None: the default group)."""
    params = list(params)
    if kind in ("adamw", "adamw_fused"):
        return AdamW(params, lr=lr, weight_decay=weight_decay, fused=kind == "adamw_fused")
    if kind in ("adamw_master", "adamw_master_fused", "adamw_master_sharded"):
        from impl.model.adamw_master import AdamWMaster  # late: it imports triton (as impl.attention does)

        if kind == "adamw_master_sharded":
            from impl.distributed.sharded_optimizer import ShardedOptimizer

            return ShardedOptimizer(params, AdamWMaster, process_group=group, lr=lr, weight_decay=weight_decay)
        return AdamWMaster(params, lr=lr, weight_decay=weight_decay, fused=kind == "adamw_master_fused")
    if kind == "torch_adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=params[0].is_cuda)
    raise ValueError(f"unknown optimizer {kind!r}; expected adamw, adamw_fused, adamw_master, adamw_master_fused, "
                     "adamw_master_sharded or torch_adamw")


def linear_weights(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weight of every impl.model.Linear in `model` (lm_head included)."""
    return [m.weight for m in model.modules() if isinstance(m, Linear)]


WEIGHTS = ("fp32", "bf16", "bf16_residual")  # TrainConfig.weights


def bf16_params(model: torch.nn.Module, weights: str) -> list[torch.nn.Parameter]:
    """The parameters that TrainConfig.weights stores in bf16 (through fp32 masters)."""
    if weights == "fp32":
        return []
    extra = [m.weight for m in model.modules() if isinstance(m, Embedding)] if weights == "bf16_residual" else []
    return linear_weights(model) + extra


def _check_weights(cfg: TrainConfig) -> None:
    if cfg.weights not in WEIGHTS:
        raise ValueError(f"unknown weights {cfg.weights!r}; expected one of {WEIGHTS}")
    if cfg.weights != "fp32" and cfg.dtype != "bf16":
        raise ValueError(f"weights={cfg.weights!r} needs dtype='bf16' (autocast), got dtype={cfg.dtype!r}")
    if cfg.weights != "fp32" and not cfg.optimizer.startswith("adamw_master"):
        raise ValueError(f"weights={cfg.weights!r} needs an adamw_master optimizer (fp32 masters), "
                         f"got {cfg.optimizer!r}")
    check_reduction(cfg.loss)
    if cfg.grad_sync not in GRAD_SYNCS:
        raise ValueError(f"unknown grad_sync {cfg.grad_sync!r}; expected one of {GRAD_SYNCS}")
    if cfg.optimizer == "adamw_master_sharded" and cfg.grad_sync == "none":
        raise ValueError("optimizer 'adamw_master_sharded' needs a grad_sync (each owner steps its parameters "
                         f"with the gradients of every rank); expected one of {GRAD_SYNCS[1:]}")
    if cfg.grad_sync == "reduce_to_owner" and cfg.optimizer != "adamw_master_sharded":
        raise ValueError(f"grad_sync 'reduce_to_owner' needs optimizer 'adamw_master_sharded' (it names each "
                         f"parameter's owner, the one rank that receives its gradient), got {cfg.optimizer!r}")
    # DDP's hooks fire as each parameter's gradient is accumulated, in eager autograd: "pointwise"
    # compiles functions of the parameters, whose accumulation stays eager; the others are untested
    if cfg.grad_sync != "none" and cfg.compile not in ("none", "pointwise"):
        raise ValueError(f"grad_sync={cfg.grad_sync!r} runs eagerly (its hooks fire in backward) or with "
                         f"compile='pointwise'; got compile={cfg.compile!r}")


def make_train_step(cfg: TrainConfig, model: TransformerLM, x: torch.Tensor, y: torch.Tensor,
                    backend: str = "inductor", lr: float = 1e-4, weight_decay: float = 0.01, group=None,
                    lm_head: LMHead | None = None):
    """(step, optimizer): a full training step of `model` under `cfg`; step() returns the loss.
    Switches the model's attention to cfg.attn_impl and, for compile="blocks", compiles its blocks
    in place: give it a model of its own. The first calls of step() compile. The sequence
    dimension is dynamic in the compiled graphs (the blocks mark theirs; for the whole model, the
    token ids'), so a model of another context reuses them, provided its context_length (the
    RoPE tables' shape, a static graph input) is the same: build every context's model with the
    largest one. For weights="bf16" the model's Linear weights (and for "bf16_residual" its embedding) become bf16 (the same Parameter
    objects): the optimizer is built on the fp32 model and keeps each weight's fp32 value as
    its master before the cast rounds it (AdamWMaster.cast_params_). `group`: the process group of
    the data-parallel gradient sync and sharded optimizer (None: the default group). `lm_head`: how the fused
    LM head runs (cfg.fused_ce only; None: impl.model.fused_ce.LMHead's defaults)."""
    _check_weights(cfg)
    if lm_head is not None and not cfg.fused_ce:
        raise ValueError(f"lm_head={lm_head} sets how the fused LM head runs; cfg.fused_ce is off")
    if model.config["attn_impl"] != cfg.attn_impl:
        model.set_attention(cfg.attn_impl)
    optimizer = make_optimizer(cfg.optimizer, model.parameters(), lr=lr, weight_decay=weight_decay, group=group)
    if cfg.weights != "fp32":
        optimizer.cast_params_(bf16_params(model, cfg.weights), torch.bfloat16)
    sync = None
    if cfg.grad_sync != "none":
        from impl.distributed.ddp import DDPBucketed, DDPReduceToOwner

        # after the cast, so the bf16 weights' buckets are bf16; its hooks fire on the parameters
        # themselves, so the step calls the model, not the wrapper (kept alive by `sync`)
        average = cfg.loss == "mean"
        ddp = DDPBucketed(model, GRAD_BUCKET_MB, average=average, group=group) if cfg.grad_sync == "ddp_bucketed" \
            else DDPReduceToOwner(model, GRAD_BUCKET_MB, owner=optimizer.owner, average=average, group=group)
        sync = ddp.finish_gradient_synchronization
    target = compile_model(model, cfg.compile, backend)
    if cfg.compile.startswith("model"):
        torch._dynamo.maybe_mark_dynamic(x, 1)
    step, _ = make_step("train_step", target, x, y, cfg.dtype, optimizer, fused_ce=cfg.fused_ce, loss=cfg.loss,
                        after_backward=sync, lm_head=lm_head)
    if cfg.compile == "model+cudagraphs":
        return _new_graph_step(step), optimizer
    return step, optimizer


def _new_graph_step(step: Callable) -> Callable:
    """`step` opening a new CUDA-graph generation: the previous step's graph outputs (its loss,
    say) may still be referenced; marking the step tells Inductor they are done with."""
    def graph_step(*args, **kwargs):
        torch.compiler.cudagraph_mark_step_begin()
        return step(*args, **kwargs)
    return graph_step
