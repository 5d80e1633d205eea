"""The basics Transformer LM, its optimizer and loss."""
from .flops import forward_flops, mode_flops
from .layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU, silu
from .loss import cross_entropy
from .optim import AdamW
from .sizes import BATCH_SIZE, MODEL_SIZES, VOCAB_SIZE, param_count
from .transformer import CausalSelfAttention, TransformerBlock, TransformerLM

__all__ = ["AdamW", "BATCH_SIZE", "CausalSelfAttention", "Embedding", "Linear", "MODEL_SIZES", "RMSNorm",
           "RotaryEmbedding", "SwiGLU", "TransformerBlock", "TransformerLM", "VOCAB_SIZE", "cross_entropy",
           "forward_flops", "mode_flops", "param_count", "silu"]
