"""The Transformer LM's parts against references (float64 on the CPU), and its input checks."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from impl.model import (MODEL_SIZES, AdamW, Linear, RMSNorm, RotaryEmbedding, SwiGLU, TransformerLM,
                        cross_entropy, forward_flops, param_count)


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


SPEC_PARAMS = {"small": 128.6e6, "medium": 423e6, "large": 969e6, "xl": 2.0e9, "2.7B": 3.4e9}


@pytest.mark.parametrize("size", list(MODEL_SIZES))
def test_param_count_matches_spec(size):
    with torch.device("meta"):
        model = TransformerLM(**MODEL_SIZES[size])
    n = sum(p.numel() for p in model.parameters())
    assert n == param_count(**MODEL_SIZES[size])
    # SPEC gives 3-4 significant digits
    assert abs(n - SPEC_PARAMS[size]) / SPEC_PARAMS[size] < 0.02, n


def test_linear_init_is_truncated_normal():
    torch.manual_seed(0)
    lin = Linear(512, 256)
    std = math.sqrt(2 / (512 + 256))
    w = lin.weight.detach()
    assert w.abs().max() <= 3 * std + 1e-6
    # a normal cut at ±3σ has std σ·sqrt(1 - 6φ(3)/(Φ(3)-Φ(-3))) ≈ 0.9866σ
    assert abs(w.std().item() - 0.9866 * std) / std < 0.03
    x = torch.randn(3, 512)
    assert rel_err(lin(x), x @ w.T) < 1e-6


def test_rmsnorm_matches_formula():
    torch.manual_seed(0)
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64))
    x = torch.randn(2, 5, 64)
    x64 = x.double()
    ref = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    assert rel_err(norm(x), ref) < 1e-6
    assert norm(x.bfloat16()).dtype == torch.bfloat16


def test_rope_matches_complex_rotation():
    torch.manual_seed(0)
    d, s = 16, 11
    rope = RotaryEmbedding(d, 32, theta=10000.0)
    x = torch.randn(2, 3, s, d)
    pos = torch.arange(s)
    out = rope(x, pos)
    xc = torch.view_as_complex(x.double().reshape(2, 3, s, d // 2, 2))
    freqs = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ref = torch.view_as_real(xc * torch.polar(torch.ones(s, d // 2, dtype=torch.float64), pos[:, None] * freqs)).flatten(-2)
    assert rel_err(out, ref) < 1e-6
    # rotation keeps norms
    assert torch.allclose(out.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


def test_swiglu_matches_formula():
    torch.manual_seed(0)
    ffn = SwiGLU(32, 96)
    x = torch.randn(4, 32)
    w1, w2, w3 = (m.weight.double() for m in (ffn.w1, ffn.w2, ffn.w3))
    a = x.double() @ w1.T
    ref = (a * torch.sigmoid(a) * (x.double() @ w3.T)) @ w2.T
    assert rel_err(ffn(x), ref) < 1e-6


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 4), seq=st.integers(1, 9), vocab=st.integers(2, 50), scale=st.sampled_from([1.0, 30.0, 1e4]))
def test_cross_entropy_matches_torch(batch, seq, vocab, scale):
    g = torch.Generator().manual_seed(batch * 100 + seq * 10 + vocab)
    logits = torch.randn(batch, seq, vocab, generator=g) * scale
    targets = torch.randint(0, vocab, (batch, seq), generator=g)
    ours = cross_entropy(logits, targets)
    ref = F.cross_entropy(logits.double().reshape(-1, vocab), targets.reshape(-1))
    assert torch.isfinite(ours)
    assert abs(ours.item() - ref.item()) <= 1e-5 * max(1.0, abs(ref.item()))


def test_cross_entropy_gradient():
    torch.manual_seed(0)
    logits = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 10, (6,))
    cross_entropy(logits, targets).backward()
    ref = (torch.softmax(logits.detach(), -1) - F.one_hot(targets, 10)) / 6
    assert torch.allclose(logits.grad, ref)


def test_cross_entropy_bad_input():
    with pytest.raises(ValueError, match="targets"):
        cross_entropy(torch.randn(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer"):
        cross_entropy(torch.randn(2, 5), torch.zeros(2))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_adamw_matches_torch(weight_decay):
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    ours = [torch.randn(s, requires_grad=True) for s in shapes]
    ref = [p.detach().clone().requires_grad_() for p in ours]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=weight_decay)
    opt, ref_opt = AdamW(ours, **kw), torch.optim.AdamW(ref, **kw)
    for step in range(10):
        g = [torch.randn(s) for s in shapes]
        for p, q, gi in zip(ours, ref, g):
            p.grad, q.grad = gi.clone(), gi.clone()
        opt.step()
        ref_opt.step()
    for p, q in zip(ours, ref):
        assert rel_err(p.detach(), q.detach()) < 1e-6


def test_adamw_param_added_later_keeps_its_own_step_count():
    torch.manual_seed(0)
    a, b = torch.randn(4, requires_grad=True), torch.randn(4, requires_grad=True)
    a2, b2 = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    opt, ref = AdamW([a], lr=0.1), torch.optim.AdamW([a2], lr=0.1)
    for step in range(6):
        if step == 3:
            opt.param_groups[0]["params"].append(b)
            ref.param_groups[0]["params"].append(b2)
        for p, q in ((a, a2), (b, b2)):
            p.grad = torch.full_like(p, 0.5 + step)
            q.grad = p.grad.clone()
        opt.step()
        ref.step()
    assert rel_err(b.detach(), b2.detach()) < 1e-6 and rel_err(a.detach(), a2.detach()) < 1e-6


def tiny_model(**kw):
    torch.manual_seed(0)
    return TransformerLM(d_model=32, num_heads=4, d_ff=64, num_layers=2, vocab_size=50, context_length=16, **kw)


def test_model_is_causal():
    model = tiny_model()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 8:] = torch.randint(0, 50, (2, 4))
    with torch.no_grad():
        assert torch.allclose(model(x)[:, :8], model(y)[:, :8], atol=1e-5)
        assert not torch.allclose(model(x)[:, 8:], model(y)[:, 8:])


def test_model_attention_implementations_agree():
    model = tiny_model()
    x = torch.randint(0, 50, (2, 12))
    outs = {}
    for name in ("naive", "sdpa"):
        model.set_attention(name)
        model.zero_grad()
        logits = model(x)
        logits.square().mean().backward()
        outs[name] = (logits.detach(), model.lm_head.weight.grad.clone(), model.layers[0].attn.q_proj.weight.grad.clone())
    for a, b in zip(outs["naive"], outs["sdpa"]):
        assert rel_err(a, b) < 1e-5


def test_model_bad_input():
    model = tiny_model()
    with pytest.raises(ValueError, match="integer"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model(torch.tensor([[1, 50]]))
    with pytest.raises(ValueError, match=r"\[0, 50\)"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ValueError, match="context_length"):
        model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="batch, seq"):
        model(torch.zeros(17, dtype=torch.long))
    with pytest.raises(ValueError, match="attention"):
        tiny_model(attn_impl="nope")
    for empty in ((2, 0), (0, 4)):
        with pytest.raises(ValueError, match=r"batch >= 1 and seq >= 1, got \(" + f"{empty[0]}, {empty[1]}"):
            model(torch.zeros(empty, dtype=torch.long))


SIZES = dict(d_model=16, num_heads=2, d_ff=32, num_layers=1, vocab_size=50, context_length=16)


@pytest.mark.parametrize("name, value, match", [
    ("num_heads", 0, "num_heads must be an int >= 1, got 0"),
    ("context_length", -1, "context_length must be an int >= 1, got -1"),
    ("d_model", 16.0, "d_model must be an int >= 1, got 16.0"),
    ("num_layers", 0, "num_layers must be an int >= 1, got 0"),
    ("vocab_size", True, "vocab_size must be an int >= 1, got True"),
    ("num_heads", 3, "d_model 16 is not divisible by num_heads 3"),
    ("rope_theta", float("nan"), "rope_theta must be a finite number > 0, got nan"),
])
def test_model_bad_config(name, value, match):
    with pytest.raises(ValueError, match=match):
        TransformerLM(**{**SIZES, name: value})


@pytest.mark.parametrize("kw, match", [
    (dict(lr=float("nan")), "lr must be a finite number >= 0, got nan"),
    (dict(lr=-1e-3), "lr must be a finite number >= 0"),
    (dict(eps=float("inf")), "eps must be a finite number >= 0, got inf"),
    (dict(weight_decay=-0.1), "weight_decay must be a finite number >= 0"),
    (dict(betas=(0.9,)), r"betas must be a pair \(beta1, beta2\), each in \[0, 1\), got \(0.9,\)"),
    (dict(betas=(0.9, 0.999, 0.1)), "betas must be a pair"),
    (dict(betas=(0.9, 1.0)), "betas must be a pair"),
    (dict(betas=(float("nan"), 0.9)), "betas must be a pair"),
])
def test_adamw_bad_hyperparameters(kw, match):
    with pytest.raises(ValueError, match=match):
        AdamW([torch.nn.Parameter(torch.zeros(2))], **kw)


def test_forward_flops_counts_the_lm_head_and_attention():
    shape = dict(d_model=8, d_ff=16, num_layers=1, num_heads=2, batch=1, seq=4, vocab_size=10)
    # 4 tokens × (4·64 + 3·128) MACs + 2 attention products 4×4×8 + head 4×8×10, ×2 FLOPs
    assert forward_flops(**shape) == 2 * 4 * (256 + 384) + 2 * 2 * 16 * 8 + 2 * 4 * 80


def test_2026_table_is_its_own():
    """The 2026 handout's Table 1: small/medium/large as 2025, xl = the 2025 table's 2.7B, and a 10B
    at head dim 128. A size is named by edition: ("2026", "xl") is not ("2025", "xl")."""
    from impl.model import MODEL_SIZES_2026, SizeRef, sizes

    assert [r.name for r in sizes("2026")] == ["small", "medium", "large", "xl", "10B"]
    assert MODEL_SIZES_2026["xl"] == MODEL_SIZES["2.7B"] != MODEL_SIZES["xl"]
    ten = MODEL_SIZES_2026["10B"]
    assert (ten.d_model, ten.d_ff, ten.num_layers, ten.num_heads, ten.head_dim) == (4608, 12288, 50, 36, 128)
    xl26 = SizeRef("2026", "xl")
    assert xl26.config.head_dim == 80 and xl26.label == "xl (2026) = 2.7B (2025)"
    assert SizeRef("2025", "xl").label == "xl (2025)" and SizeRef("2026", "small").label == "small"
    assert SizeRef.from_row({"size": "xl"}) == SizeRef("2025", "xl")  # rows before the 2026 table
    assert SizeRef.from_row(xl26.row_config()) == xl26
    assert xl26.row_config()["d_model"] == 2560
    with pytest.raises(ValueError, match="2025 table has no size '10B'"):
        SizeRef("2025", "10B")
    with pytest.raises(ValueError, match="unknown edition '2024'"):
        SizeRef("2024", "xl")


def test_param_count_2026_10b_matches_module():
    """The closed-form count of the 10B (12.8B with SwiGLU and untied embeddings: the name is the
    handout's) against the module built on the meta device."""
    from impl.model import MODEL_SIZES_2026

    with torch.device("meta"):
        model = TransformerLM(**MODEL_SIZES_2026["10B"])
    assert sum(p.numel() for p in model.parameters()) == MODEL_SIZES_2026["10B"].params


def test_smoke_size_is_valid_in_every_edition_but_listed_by_none():
    """`tiny`, the CPU smoke profile's stand-in, names a size in any edition (a smoke row of a 2026
    question records edition 2026 like its GPU rows) without joining an edition's table."""
    from impl.model import SizeRef, sizes

    tiny = SizeRef("2026", "tiny")
    assert tiny.label == "tiny" and tiny.config.d_model == 64
    assert SizeRef.from_row(tiny.row_config()) == tiny
    assert all(r.name != "tiny" for ed in ("2025", "2026") for r in sizes(ed))


def test_transformer_from_config():
    """TransformerLM.from_config(ModelConfig, ...) builds what TransformerLM(**config, ...) builds and
    carries its size back as a ModelConfig; a config field passed again, or a non-config, is an error."""
    from impl.model import MODEL_CONFIGS, SizeRef

    cfg = MODEL_CONFIGS["tiny"]
    torch.manual_seed(0)
    a = TransformerLM.from_config(cfg, context_length=16)
    torch.manual_seed(0)
    b = TransformerLM(**cfg, context_length=16)
    assert a.model_config == cfg == SizeRef("2026", "tiny").config
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="come from the config"):
        TransformerLM.from_config(cfg, d_model=32)
    with pytest.raises(TypeError, match="takes a ModelConfig"):
        TransformerLM.from_config(dict(cfg))
