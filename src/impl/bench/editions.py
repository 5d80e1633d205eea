"""A sweep grid's model size as a course edition names it: ("2026", "xl") is the 2025 table's
2.7B (impl.model.SizeRef). Grids list (edition, name) pairs; the smoke profile's stand-in `tiny`,
in no edition's table, is allowed beside them. What a row records of its size, and the
MODEL_CONFIGS name that impl.bench.steps.build_model (which builds by name) makes it from."""
from __future__ import annotations

from dataclasses import dataclass

from impl.model.sizes import EDITION_SIZES, MODEL_CONFIGS, ModelConfig, SizeRef

SMOKE_STAND_INS = ("tiny",)  # sizes the smoke profile runs in place of a table's


@dataclass(frozen=True)
class GridSize:
    edition: str
    name: str

    def __post_init__(self):
        if self.name not in SMOKE_STAND_INS:
            SizeRef(self.edition, self.name)  # raises, naming the edition's table, for a size it lacks
        elif self.edition not in EDITION_SIZES:
            raise ValueError(f"unknown edition {self.edition!r} for the stand-in {self.name!r}")

    @classmethod
    def of(cls, pair) -> "GridSize":
        """From a grid's [edition, name] pair."""
        edition, name = pair
        return cls(str(edition), str(name))

    @property
    def in_table(self) -> bool:
        return self.name in EDITION_SIZES[self.edition]

    @property
    def config(self) -> ModelConfig:
        return SizeRef(self.edition, self.name).config if self.in_table else MODEL_CONFIGS[self.name]

    @property
    def id(self) -> str:
        """For test ids: `-k 2026` selects a 2026 edition's rows."""
        return f"{self.edition}-{self.name}"

    def row_config(self) -> dict[str, object]:
        """SizeRef's fields (name, edition, dimensions); a stand-in records the same fields."""
        if self.in_table:
            return SizeRef(self.edition, self.name).row_config()
        c = self.config
        return dict(size=self.name, edition=self.edition, d_model=c.d_model, d_ff=c.d_ff,
                    num_layers=c.num_layers, num_heads=c.num_heads)

    @property
    def build_name(self) -> str:
        """The MODEL_CONFIGS name of the same dimensions (xl (2026) builds as 2.7B)."""
        for name, cfg in MODEL_CONFIGS.items():
            if cfg == self.config:
                return name
        raise ValueError(f"no MODEL_CONFIGS entry has the dimensions of {self.edition} {self.name}")


def grid_sizes(pairs) -> list[GridSize]:
    return [GridSize.of(p) for p in pairs]


__all__ = ["GridSize", "SMOKE_STAND_INS", "grid_sizes"]
