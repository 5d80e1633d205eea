"""The model sizes of the assignment (SPEC "Fixed facts") as a typed config that owns its
parameter and FLOP counts. `TransformerLM(**MODEL_SIZES[name])` builds that size with the fixed
defaults (vocabulary 10,000, RoPE theta 10,000): a config is a read-only mapping of the
constructor's arguments, so it unpacks with `**`."""
from __future__ import annotations

from collections.abc import Iterator, Mapping
import dataclasses
from dataclasses import dataclass, fields

from .flops import mode_flops

VOCAB_SIZE = 10_000
BATCH_SIZE = 4


def param_count(d_model: int, d_ff: int, num_layers: int, num_heads: int, vocab_size: int = VOCAB_SIZE) -> int:
    """Parameters with embeddings, counted in closed form (checked against the module in tests)."""
    per_block = 4 * d_model * d_model + 3 * d_model * d_ff + 2 * d_model
    return 2 * vocab_size * d_model + num_layers * per_block + d_model


@dataclass(frozen=True)
class ModelConfig(Mapping):
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = VOCAB_SIZE

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{f.name} must be a positive int, got {value!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"ModelConfig: d_model {self.d_model} is not divisible by num_heads {self.num_heads}")

    # Mapping protocol over the constructor's arguments, for TransformerLM(**config).
    def __getitem__(self, key: str) -> int:
        if key not in self._keys():
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    @classmethod
    def _keys(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @property
    def params(self) -> int:
        return param_count(**self)

    def flops(self, mode: str, batch: int, seq: int) -> float:
        """Model FLOPs of one `mode` step (impl.model.flops: matmuls only, training = 3 × forward)."""
        return mode_flops(mode, **self, batch=batch, seq=seq)


# The assignment's sizes, smallest first: this order is every table's order.
MODEL_SIZES: dict[str, ModelConfig] = {
    "small": ModelConfig(d_model=768, d_ff=3072, num_layers=12, num_heads=12),
    "medium": ModelConfig(d_model=1024, d_ff=4096, num_layers=24, num_heads=16),
    "large": ModelConfig(d_model=1280, d_ff=5120, num_layers=36, num_heads=20),
    "xl": ModelConfig(d_model=1600, d_ff=6400, num_layers=48, num_heads=25),
    "2.7B": ModelConfig(d_model=2560, d_ff=10240, num_layers=32, num_heads=32),
}

# Every named config: the assignment's sizes, `tiny` (small enough for CPU smoke runs) and the 2026
# leaderboard's 8B model (SPEC "leaderboard (2026)": head dim 128, Qwen-sized vocabulary; its
# context 32,768 is the step's, not the model's: TransformerLM takes context_length apart). Nothing
# iterates this table (grids and report tables iterate MODEL_SIZES); 8B last, so it sorts last.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(d_model=64, d_ff=256, num_layers=2, num_heads=4),
    **MODEL_SIZES,
    "8B": ModelConfig(d_model=4096, d_ff=11008, num_layers=34, num_heads=32, vocab_size=151_936),
}


def model_config(name: str) -> ModelConfig:
    try:
        return MODEL_CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; known: {', '.join(MODEL_CONFIGS)}") from None

# Table order (smallest first) for any report that sorts by size; unknown names sort last.
SIZE_ORDER: tuple[str, ...] = tuple(MODEL_CONFIGS)


def size_rank(name: str) -> int:
    return SIZE_ORDER.index(name) if name in SIZE_ORDER else len(SIZE_ORDER)
