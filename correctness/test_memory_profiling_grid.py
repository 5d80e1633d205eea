"""memory_profiling (2025) (d), (e) at the handout's reference hyperparameters (issue 45): batch 4 and
context 512 for the 2.7B, with the 128 and 256 rows kept as extra rows."""
from impl import accounting as acc
from impl.model import SizeRef
from impl.workloads.memory import residual_stream_bytes
from impl.workloads.sweeps import grid

MiB = 2 ** 20


def test_full_grid_runs_the_2025_reference_context_with_snapshots():
    g = grid("memory_profiling", "full")
    assert g.sizes == ("2.7B",) and g.batch == 4 and g.reference_context == 512
    assert set(g.contexts) >= {128, 256, 512}  # 512 answers (d), (e); 128 and 256 stay as extra rows
    assert {"fp32", "bf16"} <= set(g.snapshot_dtypes) and {"forward", "train_step"} <= {str(m) for m in g.modes}
    assert ("2025", "2.7B", 512, "fp32", "forward") in {(e, s, c, d, str(m)) for e, s, c, d, m in g.artifacts}


def test_smoke_grid_marks_its_reference_context():
    g = grid("memory_profiling", "smoke")
    assert g.reference_context in g.contexts


def test_reference_figures_at_512():
    """(d): the residual stream of the 2.7B at batch 4 x 512 in fp32 is 20 MiB; (e): the forward's largest
    allocations are the (4, 32, 512, 512) fp32 score and probability matrices, 128 MiB each."""
    m = SizeRef("2025", "2.7B").config
    assert residual_stream_bytes(4, 512, m.d_model, 4) == 20 * MiB
    assert acc.attention_scores_bytes(4, 512, m.num_heads) == 128 * MiB
    assert acc.attention_scores_bytes(4, 128, m.num_heads) == 8 * MiB  # the extra row's: 16x smaller
