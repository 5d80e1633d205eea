"""The model sizes of the assignment (SPEC "Fixed facts"). `TransformerLM(**MODEL_SIZES[name])`
builds that size with the fixed defaults (vocabulary 10,000, RoPE theta 10,000)."""

MODEL_SIZES: dict[str, dict[str, int]] = {
    "small": dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": dict(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": dict(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": dict(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": dict(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}

VOCAB_SIZE = 10_000
BATCH_SIZE = 4


def param_count(d_model: int, d_ff: int, num_layers: int, num_heads: int, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameters with embeddings, counted in closed form (checked against the module in tests)."""
    per_block = 4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model
    return 2 * vocab_size * d_model + num_layers * per_block + d_model
