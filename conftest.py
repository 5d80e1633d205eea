"""Shared by correctness/ and perf/: the bench layer's fixtures and JSON hook (impl.bench.plugin:
`device`, `profile`, `peaks`, `bench`), and the skip rules for the gpu / multi_gpu markers."""
import itertools
import os
import sys
from pathlib import Path

import pytest

# Under xdist each worker gets its share of the cores for torch's intra-op threads and Inductor's
# compile workers (set before torch is imported; spawned ranks inherit it): 12 workers each starting
# 16 threads on the H100 box's 16 cores made a CPU test take 369 s instead of 165 (NOTES.md).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    _SHARE = str(max(1, (os.cpu_count() or 1) // _WORKERS))
    os.environ.setdefault("OMP_NUM_THREADS", _SHARE)
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", _SHARE)

import torch  # noqa: E402

# `impl` importable without PYTHONPATH: the pytest-benchmark CLI (list, compare) loads this file too,
# and so are the subprocesses tests start (sm_90 compiles, fresh-process benchmarks): they inherit the
# environment, not sys.path, so `pytest correctness` from the root works without make.
SRC = str(Path(__file__).resolve().parent / "src")
sys.path.insert(0, SRC)
if SRC not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, os.environ.get("PYTHONPATH")) if p)
# The test kits (correctness/kits: workers for spawned process groups) import as `kits.<module>`; spawn
# hands this sys.path to every child, so a worker pickled by name imports there too.
sys.path.insert(0, str(Path(__file__).resolve().parent / "correctness"))

if not torch.cuda.is_available():
    # Triton kernels run on the CPU through the interpreter; set before anything imports triton.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from impl.bench.shards import Shard, select  # noqa: E402

pytest_plugins = ["impl.bench.plugin"]


# Files whose tests spawn process groups (seconds to start each): `-m "not slow"` leaves them out
# for a quick check; `make test` and CI run them.
SLOW_FILES = {"test_distributed.py", "test_fsdp.py", "test_sharded_optimizer.py", "test_tensor_parallel.py",
              "test_parallelism_calcs.py", "test_bench_workers.py"}


# The longest tests, longest first (the two-shard H100 record at 5c685cb, `make test SHARD=K/N`, both logs'
# `--durations=25`, each function by its longest call; then the NCCL record's own long ones). `make correctness`
# schedules with xdist's worksteal: worker i starts on the i-th of equal contiguous slices of the collection, and
# idle workers steal from the tails. So the j-th longest test goes to the head of slice j mod workers: they start
# at once on separate workers, not queued behind each other (as under load scheduling, which dealt them all to one
# worker in one chunk: run 21, NOTES.md). With --shard K/N the j-th also starts its dealing at shard j mod N, so
# the longest alternate between the shards.
LONG_FIRST = ("test_triton_hypothesis", "test_gluon_backward_compiles_for_hopper",
              "test_triton_options_are_per_call_and_records_name_what_ran", "test_fast_cudagraphs_follows_fast",
              "test_gluon_backward_rebuild_compiles_without_spills", "test_gluon_forward_compiles_for_hopper",
              "test_triton_gpu_split_head_dims_autotuned", "test_gluon_backward_prefetch_compiles_without_spills",
              "test_fast_options_follow_fp32_loss_curve", "test_triton_gpu_autotuned_configs",
              "test_installed_clis_work_on_the_repository_they_run_in_and_write_nowhere_else",
              "test_triton_fp32_atomic_configs_fit_hopper_shared_memory",
              "test_triton_split_head_dim_kernels_compile_for_hopper",
              "test_gluon_attention_matches_flash_triton_on_the_gpu", "test_triton_gpu_hypothesis",
              "test_pytest_shards_partition_the_tests_also_under_xdist", "test_ws_backward_compiles_for_hopper",
              "test_index_has_a_row_per_problem_links_existing_pages_and_stays_small",
              "test_triton_options_reach_the_launch_through_torch_compile",
              "test_model_with_flash_triton_matches_naive", "test_overlapped_ddp_ranks_exit_cleanly",
              "test_two_ranks_equal_one_process_on_the_whole_batch", "test_compiled_graphs_serve_every_context")


def _start_rank(item) -> int:
    name = getattr(item, "originalname", item.name)
    return LONG_FIRST.index(name) if name in LONG_FIRST else len(LONG_FIRST)


def worksteal_slices(n: int, workers: int) -> list:
    """The sizes of xdist worksteal's first hand-out: each worker in turn takes len(pending) // (workers left)."""
    sizes, left = [], n
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    return sizes


def spread_long_tests(items: list, workers: int) -> list:
    """`items` reordered so the j-th longest (LONG_FIRST) heads worksteal slice j mod `workers`; the
    rest keep collection order."""
    long = sorted((it for it in items if _start_rank(it) < len(LONG_FIRST)), key=_start_rank)
    rest = iter([it for it in items if _start_rank(it) == len(LONG_FIRST)])
    out = []
    for j, size in enumerate(worksteal_slices(len(items), workers)):
        head = long[j::workers]
        out += head + list(itertools.islice(rest, max(0, size - len(head))))
    return out + list(rest)


def _shard(config) -> Shard | None:
    text = config.getoption("shard")
    try:
        return None if text is None else Shard.parse(text)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config):
    _shard(config)  # a bad --shard stops the run before collection (and before xdist starts workers)


def pytest_collection_modifyitems(config, items):
    # This hook runs before pytest's own -k/-m deselection: a test's shard comes from the whole collection.
    shard = _shard(config)
    if shard is not None:
        items[:], dropped = select(items, shard, LONG_FIRST)
        config.hook.pytest_deselected(items=dropped)
    items[:] = spread_long_tests(items, _WORKERS)
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for item in items:
        if item.path.name in SLOW_FILES and item.path.parent.name == "correctness":
            item.add_marker(pytest.mark.slow)
        if "gpu" in item.keywords and gpus < 1:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        if "multi_gpu" in item.keywords and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs >= 2 CUDA GPUs, found {gpus}"))


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite the report pages' golden files (correctness/report_snapshots/) from this run")
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only the K-th of N disjoint parts of the collected tests (impl.bench.shards), "
                          "for a record made in several calls and merged (python -m impl.bench.test_record merge)")
