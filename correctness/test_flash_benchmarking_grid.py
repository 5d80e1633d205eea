"""flash_benchmarking's full grid (issue 45): every cell runs (or is an OOM row), the Triton-forward +
compiled-backward variant at every d, and the `-k` pieces the GPU runs select every case exactly once."""
from impl.workloads.sweeps import FLASH_BENCHMARKING_PIECES, grid


def _ids(g):
    """perf/test_flash_benchmarking.py's case ids (its CASES and ids), rebuilt from the grid."""
    return [f"{dt}-{i}-d{d}-seq{s}-{m}" for dt in g.dtypes for i in g.impls for d in g.dims for s in g.seqs
            for m in g.modes if not (i == "flash_triton_compiled_bwd" and m == "fwd")]


def _k(expr: str, name: str) -> bool:
    """pytest's -k for the expressions used here: words joined by `and`, each optionally `not`."""
    ok = True
    for term in expr.split(" and "):
        neg = term.startswith("not ")
        word = term.removeprefix("not ")
        ok &= (word not in name) if neg else (word in name)
    return ok


def test_full_grid_has_no_cutoff_every_cell_runs():
    g = grid("flash_benchmarking", "full")
    assert g.naive_max_seq >= max(g.seqs)  # naive to the longest sequence: it runs or is an OOM row
    assert set(g.compiled_bwd_dims) == set(g.dims)  # the compiled backward at every d
    assert g.seqs == tuple(2 ** i for i in range(7, 17)) and g.dtypes == ("bf16", "fp32")
    assert g.budget_s <= 480  # one piece inside gpu_run.sh's 540 s section timeout


def test_pieces_select_every_case_exactly_once():
    ids = _ids(grid("flash_benchmarking", "full"))
    assert len(ids) == 2 * 10 * 4 * (4 * 3 + 2)
    for name in ids:
        assert sum(_k(p, f"test_flash_benchmarking[{name}]") for p in FLASH_BENCHMARKING_PIECES) == 1, name
    compiled = [n for n in ids if _k(FLASH_BENCHMARKING_PIECES[2], n) or _k(FLASH_BENCHMARKING_PIECES[3], n)]
    assert len(compiled) == 2 * 10 * 4 * 2  # the compiled-backward variant in every (dtype, d, seq) row
