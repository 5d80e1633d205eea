"""The basics Transformer LM, its optimizer and loss."""
from .flops import forward_flops, mode_flops
from .layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU, silu
from .loss import cross_entropy
from .optim import AdamW
from .sizes import (BATCH_SIZE, EDITION_SIZES, MODEL_CONFIGS, MODEL_SIZES, MODEL_SIZES_2026, VOCAB_SIZE, ModelConfig,
                    SizeRef, model_config, param_count, size_rank, sizes)
from .transformer import CausalSelfAttention, TransformerBlock, TransformerLM

__all__ = ["AdamW", "BATCH_SIZE", "CausalSelfAttention", "Embedding", "Linear", "EDITION_SIZES", "MODEL_CONFIGS", "MODEL_SIZES", "MODEL_SIZES_2026", "ModelConfig", "RMSNorm",
           "RotaryEmbedding", "SizeRef", "SwiGLU", "TransformerBlock", "TransformerLM", "VOCAB_SIZE", "cross_entropy",
           "forward_flops", "mode_flops", "model_config", "param_count", "silu", "size_rank", "sizes"]
