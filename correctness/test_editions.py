"""impl.workloads.editions: grid sizes named by edition build and record the right model."""
import pytest

from impl.workloads.editions import GridSize
from impl.model.sizes import MODEL_CONFIGS, MODEL_SIZES_2026, SizeRef


def test_2026_xl_is_built_as_the_2025_2_7b_and_records_its_edition():
    z = GridSize("2026", "xl")
    assert z.build_name == "2.7B" and MODEL_CONFIGS[z.build_name] == MODEL_SIZES_2026["xl"]
    assert z.row_config() == SizeRef("2026", "xl").row_config()
    assert z.row_config()["d_model"] == 2560 == z.config.d_model and z.id == "2026-xl"
    assert GridSize("2025", "xl").build_name == "xl" and GridSize("2025", "xl").config.d_model == 1600


def test_smoke_stand_in_and_bad_names():
    t = GridSize.of(["2026", "tiny"])
    assert t.build_name == "tiny" and t.row_config()["edition"] == "2026" and t.row_config()["d_model"] == 64
    assert set(t.row_config()) == set(SizeRef("2026", "xl").row_config())
    with pytest.raises(ValueError, match="no size '2.7B'"):
        GridSize("2026", "2.7B")
    for edition, name in (("2027", "xl"), ("2027", "tiny")):
        with pytest.raises(ValueError, match="unknown edition"):
            GridSize(edition, name)
    with pytest.raises(ValueError, match="no MODEL_CONFIGS entry"):
        GridSize("2026", "10B").build_name
