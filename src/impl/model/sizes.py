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

# The 2026 edition's Table 1 (handout v26.1.1): small/medium/large as in 2025, but its xl is the 2025
# table's 2.7B and it adds a 10B (head dim 128). The same name means different models in the two
# editions: look sizes up through SizeRef, which carries the edition.
MODEL_SIZES_2026: dict[str, ModelConfig] = {
    "small": MODEL_SIZES["small"],
    "medium": MODEL_SIZES["medium"],
    "large": MODEL_SIZES["large"],
    "xl": MODEL_SIZES["2.7B"],
    "10B": ModelConfig(d_model=4608, d_ff=12288, num_layers=50, num_heads=36),
}

EDITION_SIZES: dict[str, dict[str, ModelConfig]] = {"2025": MODEL_SIZES, "2026": MODEL_SIZES_2026}
DEFAULT_EDITION = "2025"  # rows stored before the 2026 table existed name 2025 sizes
# The CPU smoke profile's stand-in for an edition's sizes: valid in every edition (so a smoke row of a
# 2026 question names its edition like the GPU rows), never listed by sizes() or EDITION_SIZES.
SMOKE_SIZES: dict[str, ModelConfig] = {"tiny": ModelConfig(d_model=64, d_ff=256, num_layers=2, num_heads=4)}


@dataclass(frozen=True)
class SizeRef:
    """A model size named as its edition names it: ("2026", "xl") is the 2025 table's 2.7B."""

    edition: str
    name: str

    def __post_init__(self):
        if self.edition not in EDITION_SIZES:
            raise ValueError(f"unknown edition {self.edition!r}; known: {', '.join(EDITION_SIZES)}")
        if self.name not in EDITION_SIZES[self.edition] and self.name not in SMOKE_SIZES:
            raise ValueError(f"the {self.edition} table has no size {self.name!r}; "
                             f"it has: {', '.join(EDITION_SIZES[self.edition])} (and the smoke profile's "
                             f"{', '.join(SMOKE_SIZES)})")

    @classmethod
    def from_row(cls, config: Mapping) -> "SizeRef":
        """The size of a stored row's config (`size`, optional `edition`; older rows are 2025's)."""
        return cls(str(config.get("edition") or DEFAULT_EDITION), str(config["size"]))

    @classmethod
    def of(cls, pair) -> "SizeRef":
        """From a sweep grid's [edition, name] pair."""
        edition, name = pair
        return cls(str(edition), str(name))

    @property
    def config(self) -> ModelConfig:
        return EDITION_SIZES[self.edition].get(self.name) or SMOKE_SIZES[self.name]

    @property
    def id(self) -> str:
        """For test ids: `-k 2026` selects a 2026 edition's rows."""
        return f"{self.edition}-{self.name}"

    @property
    def build_name(self) -> str:
        """The MODEL_CONFIGS name of the same dimensions (xl (2026) builds as 2.7B), for code that
        builds a model by name."""
        for name, cfg in MODEL_CONFIGS.items():
            if cfg == self.config:
                return name
        raise ValueError(f"no MODEL_CONFIGS entry has the dimensions of {self.edition} {self.name}")

    def aliases(self) -> list["SizeRef"]:
        """The same model under its names in the other editions (xl (2026) is 2.7B (2025))."""
        return [SizeRef(ed, name) for ed, table in EDITION_SIZES.items() if ed != self.edition
                for name, cfg in table.items() if cfg == self.config]

    @property
    def label(self) -> str:
        """"xl (2026)"; where the name means another model in the other edition, its name there too:
        "xl (2026) = 2.7B (2025)", "xl (2025)". Same-named same models (small) read "small"."""
        if self.name in SMOKE_SIZES:
            return self.name
        same = [a for a in self.aliases() if a.name == self.name]
        if same and len(self.aliases()) == len(same):
            return self.name
        others = [a for a in self.aliases() if a.name != self.name]
        return " = ".join([f"{self.name} ({self.edition})"] + [f"{a.name} ({a.edition})" for a in others])

    def row_config(self) -> dict[str, object]:
        """What a benchmark row's config records of its size: name, edition and the dimensions, so a
        stored row is never ambiguous."""
        c = self.config
        return dict(size=self.name, edition=self.edition, d_model=c.d_model, d_ff=c.d_ff,
                    num_layers=c.num_layers, num_heads=c.num_heads)


def sizes(edition: str) -> list[SizeRef]:
    """Every size of an edition's table, smallest first."""
    return [SizeRef(edition, name) for name in EDITION_SIZES[edition]]


# Every named config: the assignment's sizes, `tiny` (small enough for CPU smoke runs) and the 2026
# leaderboard's 8B model (SPEC "leaderboard (2026)": head dim 128, Qwen-sized vocabulary; its
# context 32,768 is the step's, not the model's: TransformerLM takes context_length apart). Nothing
# iterates this table (grids and report tables iterate MODEL_SIZES); 8B last, so it sorts last.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    **SMOKE_SIZES,
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
