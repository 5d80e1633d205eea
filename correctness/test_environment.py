"""How the suite runs where users run it: `pytest correctness` from the repo root without make."""
import subprocess
import sys
from pathlib import Path

import impl


def test_child_processes_import_impl_from_this_checkout(tmp_path):
    """Tests start fresh Pythons (sm_90 compiles, fresh-process benchmarks); they inherit the
    environment, not sys.path, and may run in another folder: conftest.py exports src/ absolutely."""
    out = subprocess.run([sys.executable, "-c", "import impl; print(impl.__file__)"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-1000:]
    assert Path(out.stdout.strip()).resolve() == Path(impl.__file__).resolve()


def test_long_tests_head_separate_worksteal_slices():
    """Under `--dist worksteal` the j-th longest test heads slice j mod workers (conftest.py), so the
    long tests start at once on separate workers; slice sizes are worksteal's own split."""
    import conftest
    from types import SimpleNamespace

    long = [SimpleNamespace(name=n, originalname=n) for n in conftest.LONG_FIRST]
    short = [SimpleNamespace(name=f"short{i}", originalname=f"short{i}") for i in range(100)]
    items = short[:50] + long[::-1] + short[50:]
    order = conftest.spread_long_tests(items, 4)
    assert sorted(map(id, order)) == sorted(map(id, items))
    sizes = conftest.worksteal_slices(len(items), 4)
    assert sum(sizes) == len(items) and max(sizes) - min(sizes) <= 1
    heads = [sum(sizes[:i]) for i in range(4)]
    assert [order[h].name for h in heads] == list(conftest.LONG_FIRST[:4])
    assert [o.name for o in order if o.name.startswith("short")] == [s.name for s in short]
