"""The package as a user installs it (issue 46, items 6 and 8): the wheel holds every file the
package reads and requires-python names the Python the code needs."""
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "impl"


def test_requires_python_is_the_python_the_code_needs():
    """tomllib and enum.StrEnum are 3.11's: pip must not install the package on 3.10."""
    spec = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    assert "3.10.14" not in spec and "3.11.0" in spec and sys.version_info >= (3, 11)


# ------------------------------------------------------------- the wheel, installed into a venv
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built offline (no index, the installed setuptools) from a copy, so
    the build leaves nothing (build/, *.egg-info) in the checkout."""
    pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools installed")
    work = tmp_path_factory.mktemp("wheel")
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    shutil.copytree(ROOT / "src", work / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                          "-q", "-w", str(work / "dist"), str(work)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (found,) = (work / "dist").glob("*.whl")
    return found


def test_the_wheel_holds_every_file_the_package_reads(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    data = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert "impl/report/templates/cli.txt.j2" in data  # the gate's and compare's words
    assert sorted(data - names) == []
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "Requires-Python: >=3.11" in metadata
