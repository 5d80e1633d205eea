"""The basics Transformer LM: pre-norm blocks of causal multi-head attention with RoPE and SwiGLU.

The attention kernel is chosen by name (`attn_impl`: "naive", "sdpa", "flash_torch",
"flash_triton"), so FlashAttention plugs in without touching the model.
"""
import torch
from torch import nn

from .layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU
from .sizes import VOCAB_SIZE, ModelConfig


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, attn_impl: str, device=None, dtype=None):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model {d_model} is not divisible by num_heads {num_heads}")
        from impl.attention import attention_by_name  # late: attention imports triton

        self.num_heads = num_heads
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.attn_impl = attn_impl
        self.attend = attention_by_name(attn_impl)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.num_heads

        def heads(t):  # (b, s, d) -> (b, h, s, d/h)
            return t.view(b, s, h, d // h).transpose(1, 2)

        q = rope(heads(self.q_proj(x)), positions)
        k = rope(heads(self.k_proj(x)), positions)
        v = heads(self.v_proj(x))
        o = self.attend(q, k, v, True)
        return self.output_proj(o.transpose(1, 2).reshape(b, s, d))


class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, attn_impl, device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalSelfAttention(d_model, num_heads, attn_impl, device=device, dtype=dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), rope, positions)
        return x + self.ffn(self.ln2(x))


def _check_config(rope_theta: float, **sizes: int) -> None:
    """Sizes are ints >= 1 and the heads split d_model: otherwise torch's internals fail later
    with errors that name none of them."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if sizes["d_model"] % sizes["num_heads"]:
        raise ValueError(f"d_model {sizes['d_model']} is not divisible by num_heads {sizes['num_heads']}")
    if isinstance(rope_theta, bool) or not isinstance(rope_theta, (int, float)) or not rope_theta > 0 \
            or rope_theta == float("inf"):
        raise ValueError(f"rope_theta must be a finite number > 0, got {rope_theta!r}")


class TransformerLM(nn.Module):
    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        num_layers: int,
        vocab_size: int = VOCAB_SIZE,
        context_length: int = 1024,
        rope_theta: float = 10000.0,
        attn_impl: str = "naive",
        device=None,
        dtype=None,
    ):
        super().__init__()
        _check_config(d_model=d_model, num_heads=num_heads, d_ff=d_ff, num_layers=num_layers,
                      vocab_size=vocab_size, context_length=context_length, rope_theta=rope_theta)
        self.vocab_size, self.context_length = vocab_size, context_length
        self.config = dict(d_model=d_model, num_heads=num_heads, d_ff=d_ff, num_layers=num_layers,
                           vocab_size=vocab_size, context_length=context_length, attn_impl=attn_impl)
        # One RoPE table for all blocks, passed to each in forward.
        self.rope = RotaryEmbedding(d_model // num_heads, context_length, rope_theta, device=device)
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, attn_impl, device=device, dtype=dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    @classmethod
    def from_config(cls, config: ModelConfig, **kwargs) -> "TransformerLM":
        """The model of a typed size config (impl.model.sizes: a ModelConfig, or a SizeRef's
        .config); `kwargs` are the other constructor arguments (context_length, attn_impl, device,
        ...). `TransformerLM(**config)` builds the same model."""
        if not isinstance(config, ModelConfig):
            raise TypeError(f"TransformerLM.from_config takes a ModelConfig, got {type(config).__name__}")
        clash = set(kwargs) & set(config)
        if clash:
            raise ValueError(f"TransformerLM.from_config: {sorted(clash)} come from the config, not as arguments")
        return cls(**config, **kwargs)

    @property
    def model_config(self) -> ModelConfig:
        """The size of this model as a typed config."""
        return ModelConfig(**{k: self.config[k] for k in ModelConfig._keys()})

    def set_attention(self, attn_impl: str, options=None) -> None:
        """Switch every block to another attention implementation (same weights); `options`, a
        FlashOptions for "flash_triton", is passed by every attention call (None: its defaults)."""
        from impl.attention import attention_by_name

        fn = attention_by_name(attn_impl, options)
        for block in self.layers:
            block.attn.attn_impl, block.attn.attend = attn_impl, fn
        self.config["attn_impl"] = attn_impl

    def _check_input(self, token_ids: torch.Tensor) -> None:
        if token_ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
            raise ValueError(f"token ids must be an integer tensor, got dtype {token_ids.dtype}")
        if token_ids.dim() != 2 or token_ids.numel() == 0:
            raise ValueError(f"token ids must have shape (batch, seq) with batch >= 1 and seq >= 1, "
                             f"got {tuple(token_ids.shape)}")
        if token_ids.shape[1] > self.context_length:
            raise ValueError(f"sequence length {token_ids.shape[1]} exceeds the model's context_length "
                             f"{self.context_length}")
        if torch.compiler.is_compiling():
            return
        # One small reduction and a host sync: cheap next to a forward pass, and it turns a
        # device-side assert (which poisons the CUDA context) into a clear error.
        lo, hi = torch.aminmax(token_ids)
        if lo.item() < 0 or hi.item() >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}), got range [{lo.item()}, {hi.item()}]")

    def forward(self, token_ids: torch.Tensor, return_hidden: bool = False) -> torch.Tensor:
        """Logits (batch, seq, vocab); with return_hidden, the final-norm hidden states (batch, seq,
        d_model) instead, for a loss that applies `lm_head.weight` itself (impl.model.fused_ce)."""
        self._check_input(token_ids)
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.token_embeddings(token_ids)
        for block in self.layers:
            x = block(x, self.rope, positions)
        h = self.ln_final(x)
        return h if return_hidden else self.lm_head(h)
