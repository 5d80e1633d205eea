"""training_step (issue 8): the fused LM head + cross-entropy against the unfused path, the fused
AdamW against the foreach one, the named configs, the loss curve of the fast options against fp32
eager training; and the machinery of perf/test_training_step.py: the profiled step's breakdown,
compiled graphs reused across contexts, no model kept alive by them, the report's tables."""
import dataclasses
import gc
import json
import weakref

import pytest
import torch

from impl.model import AdamW, TransformerLM, cross_entropy
from impl.model.fused_ce import fused_linear_cross_entropy
from impl.profiling import kernels as K
from impl.profiling.annotate import PHASES
from impl.profiling.compiled import graph_breaks, raise_recompile_limit, unique_graphs
from impl.profiling.steps import (TRAIN_CONFIGS, build_model, make_train_step, named_train_config, random_batch,
                                  train_config)
from impl.report.data import load_file
from impl.report.training_step import render
from impl.sweeps import GRIDS, SMOKE_SIZES

V = 97


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _model(**kw):
    torch.manual_seed(0)
    return TransformerLM(**SMOKE_SIZES["tiny"], vocab_size=V, context_length=16, **kw)


def _batch(b=3, s=13, seed=1):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, V, (b, s + 1), generator=g)
    return t[:, :-1], t[:, 1:]


def _unfused_and_fused(model, x, y, rows, autocast_dtype=None):
    """Loss and grads wrt the final hidden states and the LM head weight, both ways."""
    ctx = torch.autocast("cpu", dtype=autocast_dtype) if autocast_dtype else torch.autocast("cpu", enabled=False)
    out = []
    for fused in (False, True):
        with ctx:
            h = model(x, return_hidden=True).detach().requires_grad_()
            w = model.lm_head.weight
            loss = (fused_linear_cross_entropy(h, w, y, rows=rows) if fused else cross_entropy(model.lm_head(h), y))
        gh, gw = torch.autograd.grad(loss, (h, w))
        out.append((loss.detach(), gh, gw))
    return out


def test_return_hidden_is_what_the_lm_head_reads():
    model = _model()
    x, _ = _batch()
    with torch.no_grad():
        assert torch.equal(model(x), model.lm_head(model(x, return_hidden=True)))


# fp32: the same arithmetic in another order. bf16 autocast: both paths round the logits and their
# gradient to bf16 the same way; the fused one sums dW per chunk in fp32, the unfused one in one
# bf16 matmul. Tolerances (loss, gradients) per compute dtype.
FUSED_CE_TOL = {None: (1e-6, 1e-5), torch.bfloat16: (1e-3, 1e-2)}


@pytest.mark.parametrize("autocast_dtype,rows", [(None, 1), (None, 7), (None, 39), (None, None),  # one token per
                                                 (torch.bfloat16, 7), (torch.bfloat16, None)])  # chunk, ragged, one, default
def test_fused_ce_matches_cross_entropy(autocast_dtype, rows):
    model = _model()
    x, y = _batch()
    (l0, gh0, gw0), (l1, gh1, gw1) = _unfused_and_fused(model, x, y, rows, autocast_dtype)
    loss_tol, grad_tol = FUSED_CE_TOL[autocast_dtype]
    assert l1.dtype == torch.float32 and gh1.dtype == torch.float32 and gw1.dtype == torch.float32
    assert abs(l1.item() - l0.item()) / l0.item() < loss_tol
    assert rel_err(gh1, gh0) < grad_tol
    assert rel_err(gw1, gw0) < grad_tol


def test_fused_ce_matches_float64_reference():
    torch.manual_seed(0)
    h = (3 * torch.randn(5, 11, 24)).requires_grad_()
    w = torch.randn(V, 24, requires_grad=True)
    t = torch.randint(0, V, (5, 11))
    loss = fused_linear_cross_entropy(h, w, t, rows=8)
    gh, gw = torch.autograd.grad(3.0 * loss, (h, w))  # grad_output != 1 reaches the saved grads
    h64, w64 = h.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = torch.nn.functional.cross_entropy((h64 @ w64.T).reshape(-1, V), t.reshape(-1))
    gh64, gw64 = torch.autograd.grad(3.0 * ref, (h64, w64))
    assert abs(loss.item() - ref.item()) / ref.item() < 1e-6
    assert rel_err(gh, gh64) < 1e-5 and rel_err(gw, gw64) < 1e-5


def test_fused_ce_without_grad_only_computes_the_loss():
    torch.manual_seed(0)
    h, w, t = torch.randn(4, 8), torch.randn(V, 8), torch.randint(0, V, (4,))
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, w, t, rows=3)
    assert abs(loss.item() - cross_entropy(h @ w.T, t).item()) < 1e-5


def test_fused_ce_bad_input():
    h, w = torch.randn(2, 3, 8), torch.randn(V, 8)
    with pytest.raises(ValueError, match="targets"):
        fused_linear_cross_entropy(h, w, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        fused_linear_cross_entropy(h, w, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="integer"):
        fused_linear_cross_entropy(h, w, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="d_model"):
        fused_linear_cross_entropy(h, torch.randn(V, 9), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="floating"):
        fused_linear_cross_entropy(h.long(), w, torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="no tokens"):
        fused_linear_cross_entropy(torch.randn(0, 8), w, torch.zeros(0, dtype=torch.long))


def _fused_adamw_supported(device: str) -> bool:
    try:
        p = torch.zeros(2, device=device)
        torch._fused_adamw_([p], [p.clone()], [p.clone()], [p.clone()], [], [torch.ones((), device=device)],
                            lr=0.1, beta1=0.9, beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
        return True
    except (AttributeError, NotImplementedError, RuntimeError):
        return False


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_adamw_matches_foreach(device, weight_decay):
    """Same update over 10 steps, with a parameter joining at step 4 (its own step count)."""
    if not _fused_adamw_supported(device):
        pytest.skip(f"torch {torch.__version__} has no torch._fused_adamw_ kernel for {device}")
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    plain = [torch.randn(s, device=device, requires_grad=True) for s in shapes]
    fused = [p.detach().clone().requires_grad_() for p in plain]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    opt_p, opt_f = AdamW(plain[:2], **kw), AdamW(fused[:2], fused=True, **kw)
    for step in range(10):
        if step == 4:
            opt_p.add_param_group(dict(params=[plain[2]]))
            opt_f.add_param_group(dict(params=[fused[2]]))
        for p, q in zip(plain, fused):
            p.grad = torch.randn(p.shape, device=device)
            q.grad = p.grad.clone()
        opt_p.step()
        opt_f.step()
    for p, q in zip(plain, fused):
        assert rel_err(q.detach(), p.detach()) < 1e-6
    assert opt_f.state[fused[2]]["step"] == 6


def test_named_configs():
    assert set(GRIDS["training_step"]["full"]["configs"]) == {*TRAIN_CONFIGS, "anchor"}
    fast = named_train_config("fast")
    assert (fast.dtype, fast.attn_impl, fast.compile, fast.optimizer, fast.fused_ce) == (
        "bf16", "flash_triton", "blocks", "adamw_fused", True)
    assert named_train_config("+flash", flash_impl="flash_torch").attn_impl == "flash_torch"
    anchor = named_train_config("anchor")
    assert (anchor.attn_impl, anchor.compile, anchor.optimizer) == ("sdpa", "model", "torch_adamw")
    with pytest.raises(ValueError, match="unknown training config"):
        named_train_config("faster")


STEPS, LR = 50, 1e-3


def _loss_curve(cfg, backend="aot_eager", device="cpu"):
    """Overfits one fixed batch: the curve falls from ~ln(256) to well below, so it tests training."""
    torch.manual_seed(0)
    model = TransformerLM(**SMOKE_SIZES["tiny"], vocab_size=256, context_length=32, attn_impl=cfg.attn_impl,
                          device=device)
    g = torch.Generator().manual_seed(1)
    t = torch.randint(0, 256, (4, 33), generator=g).to(device)
    step, _ = make_train_step(cfg, model, t[:, :-1], t[:, 1:], backend=backend, lr=LR)
    curve = torch.stack([step() for _ in range(STEPS)]).cpu()
    torch._dynamo.reset()
    return curve


def _device_case(device):
    # CPU: FlashAttention's PyTorch twin (the Triton interpreter takes minutes) and aot_eager (dynamo +
    # AOTAutograd without inductor's C++ code generation, which takes ~40 s per graph on 2 cores).
    # GPU: the real thing.
    return ("flash_torch", "aot_eager") if device == "cpu" else ("flash_triton", "inductor")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_fast_options_follow_fp32_loss_curve(device):
    """50 AdamW steps (lr 1e-3) of a tiny model on one batch, against fp32 eager training with
    the plain options. Tolerances, per step, on |loss - loss_fp32| / loss_fp32:
      - the exact-math options in fp32 (fused_ce, fused_adamw, regional compile): ≤ 1e-4 (they
        reorder fp32 sums only; measured ~1e-6 on the CPU);
      - fast (bf16 autocast + FlashAttention + compile + fused AdamW + fused CE): ≤ 2e-2 (bf16
        rounding of activations; measured ~2e-3 on the CPU).
    And the fp32 curve itself must fall below half its start, so the steps do train."""
    flash_impl, backend = _device_case(device)
    ref = _loss_curve(train_config(), backend, device)
    assert ref[-1] < 0.5 * ref[0]
    exact = _loss_curve(train_config(compile=True, fused_adamw=True, fused_ce=True), backend, device)
    assert ((exact - ref).abs() / ref).max() < 1e-4
    fast = _loss_curve(train_config(bf16=True, flash=True, compile=True, fused_adamw=True, fused_ce=True,
                                    flash_impl=flash_impl), backend, device)
    assert ((fast - ref).abs() / ref).max() < 2e-2


def test_model_with_flash_triton_matches_naive(device):
    """The fast config's attention inside the whole model (fp32: the interpreter's bf16 tl.dot is
    wrong on the CPU; the GPU loss-curve test covers bf16): loss and every gradient, on the suite's
    device (the Triton kernels need CUDA tensors there, the interpreter on the CPU)."""
    x, y = (t.to(device) for t in _batch(b=2, s=16))
    out = {}
    for impl in ("naive", "flash_triton"):
        model = _model(attn_impl=impl).to(device)
        loss = cross_entropy(model(x), y)
        loss.backward()
        out[impl] = [loss.detach()] + [p.grad for p in model.parameters()]
    for a, b in zip(out["flash_triton"], out["naive"]):
        assert rel_err(a, b) < 1e-4


# --- perf/test_training_step.py: where the time goes, compiled graphs across contexts, leaks, report
CPU = torch.device("cpu")


def _row_step(name: str, context: int, model_context: int = 64):
    """(model, step) as a perf row builds them on the CPU: flash_torch, aot_eager, the model built
    for the largest context."""
    cfg = named_train_config(name, flash_impl="flash_torch")
    model = build_model("tiny", model_context, CPU, cfg.attn_impl)
    x, y = random_batch(model, 2, context, CPU)
    step, _ = make_train_step(cfg, model, x, y, backend="aot_eager")
    return model, step


@pytest.mark.parametrize("name", ["bf16", "anchor"])
def test_profiled_step_breakdown_cpu(name):
    """The CPU path of the row's profile: CPU op self time per phase and category. The tiny model
    does 7 matmuls per layer plus the LM head per forward and two per matmul backward, so aten::mm
    (the LM head's vocabulary dominates) must top the step with 3 × (7 layers + 1) calls; SDPA (the
    anchor) is attention, the naive attention (bf16) is not."""
    model, step = _row_step(name, 32)
    step()
    prof, _ = K.profile_calls(lambda: step(annotated=True), CPU, warmup=1, steps=1)
    out = K.step_breakdown(prof, step_s=0.5, top=5)
    assert all(out["phase_ms"][ph] > 0 for ph in PHASES)
    assert sum(out["phase_ms"].values()) == pytest.approx(out["kernel_ms"])
    assert sum(out["category_ms"].values()) == pytest.approx(out["kernel_ms"])
    assert out["gap_ms"] == pytest.approx(500.0 - out["kernel_ms"])
    top = out["top"]
    assert len(top) == 5 and [t["ms"] for t in top] == sorted((t["ms"] for t in top), reverse=True)
    assert top[0]["name"] == "aten::mm" and top[0]["calls"] == 3 * (7 * model.config["num_layers"] + 1)
    assert (out["category_ms"]["attention"] > 0) == (name == "anchor")
    assert out["timing_source"] == "cpu_op_self_time" and len(json.dumps(out)) < 4096
    # the timed calls carry no phase ranges
    plain, _ = K.profile_calls(step, CPU, warmup=0, steps=1)
    assert not set(plain.kernels) & set(PHASES)


@pytest.mark.parametrize("name", ["+compile", "anchor"])
def test_compiled_graphs_serve_every_context(name):
    """Regional (+compile) and whole-model (anchor) compilation: the graphs compiled at the first
    context serve the next ones (fresh models, as the perf rows build them), and the compiled
    step's loss equals the eager one at every context."""
    torch._dynamo.reset()  # dynamo's counters survive a reset (and other tests): count differences
    raise_recompile_limit()
    new, breaks = [], graph_breaks()
    for ctx in (32, 64, 48):
        _, step = _row_step(name, ctx)
        before = unique_graphs()
        loss = step()
        new.append(unique_graphs() - before)
        cfg = dataclasses.replace(named_train_config(name), compile="none")
        eager = build_model("tiny", 64, CPU, cfg.attn_impl)
        x, y = random_batch(eager, 2, ctx, CPU)
        torch.testing.assert_close(loss, make_train_step(cfg, eager, x, y)[0](), rtol=1e-3, atol=1e-3)
    assert new[0] > 0 and new[1:] == [0, 0]
    assert graph_breaks() == breaks


@pytest.mark.parametrize("name", ["+compile", "fast", "anchor"])
def test_compiled_graphs_keep_no_model(name):
    """Dynamo's kept graphs (not reset between rows) must not hold a dropped row's model: its
    parameters are graph inputs, and the compiled blocks' forwards live on the model itself."""
    model, step = _row_step(name, 32)
    step()
    step()
    param = weakref.ref(next(model.parameters()))
    del model, step
    gc.collect()
    assert param() is None


def _synthetic_row(config: str, profile: dict | None = None, error: str | None = None) -> dict:
    info = dict(problem="training_step", oom=False, warmup=3, rounds=5, peak_flops=1e15, peak_dtype="bfloat16",
                env=dict(device_type="cuda"), metrics=dict(tokens_per_s=1e5, mfu=0.4),
                config=dict(size="xl", context=512, config=config, batch=4, dtype="bf16", attn_impl="sdpa",
                            compile="none", optimizer="adamw", fused_ce=False, compile_backend=None))
    if profile is not None:
        info["profile"] = profile
    if error is not None:
        info["profile_error"] = error
    return dict(name=f"test_training_step[xl-512-{config}]", group="training_step", extra_info=info,
                stats=dict(mean=0.01, stddev=0.0, median=0.01, min=0.01, max=0.01, rounds=5))


def test_report_where_the_time_goes(tmp_path):
    """The report's tables from a synthetic JSON whose profiles come from step_breakdown: a
    10 ms step with 6 ms of matmul, 1 ms of attention, 0.5 ms of elementwise (8.5 ms of kernels)."""
    prof = K.PhaseProfile(steps=1, device_type="cuda", kernels={
        "forward": {"sm90_xmma_gemm_bf16": [2000.0, 8], "_attn_fwd": [400.0, 2]},
        "backward": {"sm90_xmma_gemm_bf16": [4000.0, 16], "_attn_bwd_dkdv": [600.0, 2]},
        "optimizer step": {"multi_tensor_apply_kernel": [500.0, 3]}})
    breakdown = K.step_breakdown(prof, step_s=0.01)
    rows = [_synthetic_row("bf16"), _synthetic_row("fast", breakdown), _synthetic_row("anchor", error="OOM: boom")]
    path = tmp_path / "gpu" / "training_step.json"
    path.parent.mkdir()
    path.write_text(json.dumps(dict(benchmarks=rows)))
    import pandas as pd

    text = render(pd.DataFrame(load_file(path)), "gpu", tmp_path / "figures", "figures")
    part = text[text.index("### Where the time goes"):]
    line = next(ln for ln in part.splitlines() if ln.startswith("| xl | 512 | fast |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    head = [c.strip() for c in part.splitlines()[part.splitlines().index(line) - 2].strip("|").split("|")]
    got = dict(zip(head, cells))
    assert got["step (ms)"] == "10.00" and got["forward (ms)"] == "2.40" and got["backward (ms)"] == "4.60"
    assert got["optimizer step (ms)"] == "0.50"
    assert got["matmul"] == "6.00 (60%)" and got["attention"] == "1.00 (10%)" and got["elementwise"] == "0.50 (5%)"
    assert got["kernels"] == "7.50 (75%)" and got["gap"] == "2.50 (25%)"
    assert "communication" not in head  # no time in any row
    assert "anchor: OOM: boom" in part and "| xl | 512 | bf16 |" not in part  # bf16 was not profiled
    assert "| xl | 512 | `sm90_xmma_gemm_bf16` | matmul | 6.000 | 24 | 60.0% |" in part
    # rows from before the profiles (no profile keys): no such part
    path.write_text(json.dumps(dict(benchmarks=[_synthetic_row("bf16")])))
    assert "Where the time goes" not in render(pd.DataFrame(load_file(path)), "gpu", tmp_path / "figures", "figures")
