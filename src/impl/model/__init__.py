"""The basics Transformer LM, its optimizer and loss."""
from .flops import forward_flops, mode_flops
from .layers import Embedding, Linear, RMSNorm, RotaryEmbedding, SwiGLU, silu
from .loss import cross_entropy
from .optim import AdamW
from .sizes import BATCH_SIZE, MODEL_CONFIGS, MODEL_SIZES, VOCAB_SIZE, ModelConfig, model_config, param_count, size_rank
from .transformer import CausalSelfAttention, TransformerBlock, TransformerLM

__all__ = ["AdamW", "BATCH_SIZE", "CausalSelfAttention", "Embedding", "Linear", "MODEL_CONFIGS", "MODEL_SIZES", "ModelConfig", "RMSNorm",
           "RotaryEmbedding", "SwiGLU", "TransformerBlock", "TransformerLM", "VOCAB_SIZE", "cross_entropy",
           "forward_flops", "mode_flops", "model_config", "param_count", "silu", "size_rank"]
