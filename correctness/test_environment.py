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
