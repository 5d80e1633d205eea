"""Model FLOPs of the Transformer LM, for tokens/s → MFU.

Counts matrix-multiply FLOPs only (2 per multiply-add): the projections, the FFN, the LM head, and
the two attention products QK^T and PV at full (not causally halved) size, since the naive and
SDPA paths compute the whole square. Training = 3 × forward (backward does two products per
forward product). The embedding lookup is a gather, not a matmul, and is not counted.
"""


def forward_flops(d_model: int, d_ff: int, num_layers: int, num_heads: int, batch: int, seq: int,
                  vocab_size: int) -> float:
    tokens = batch * seq
    per_layer = 2 * tokens * (4 * d_model * d_model + 3 * d_model * d_ff) + 2 * 2 * batch * seq * seq * d_model
    return num_layers * per_layer + 2 * tokens * d_model * vocab_size


# The optimizer step does no matmul: 0 model FLOPs (its rows carry time and memory, no MFU).
MODE_MULTIPLIER = {"forward": 1.0, "backward": 2.0, "forward_backward": 3.0, "optimizer_step": 0.0, "train_step": 3.0}


def mode_flops(mode: str, **shape) -> float:
    return MODE_MULTIPLIER[mode] * forward_flops(**shape)
