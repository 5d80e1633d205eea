"""`pytest --shard K/N` (impl.bench.shards, the root conftest): every test in exactly one shard."""
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from impl.bench.shards import Shard, assign

ROOT = Path(__file__).resolve().parent.parent
IDS = [f"correctness/test_a.py::test_p[{i}]" for i in range(9)] + [
    "correctness/test_a.py::test_one", "correctness/test_b.py::test_two",
    "correctness/test_b.py::TestC::test_m[x-1]", "correctness/test_b.py::TestC::test_m[y-2]",
    "correctness/test_c.py::test_long[a]", "correctness/test_c.py::test_long[b]"]


@pytest.mark.parametrize("text, shard", [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), (" 3/3 ", Shard(3, 3))])
def test_a_shard_reads_as_k_of_n(text, shard):
    assert Shard.parse(text) == shard and str(shard) == text.strip()


@pytest.mark.parametrize("text", ["3/2", "0/2", "1/0", "0/0", "1", "1/", "/2", "a/b", "-1/2", "1/2/3", "1.0/2", ""])
def test_a_bad_shard_is_refused_naming_the_value(text):
    with pytest.raises(ValueError, match=re.escape(repr(text))):
        Shard.parse(text)


@pytest.mark.parametrize("count", [1, 2, 3, 5])
def test_every_test_lands_in_exactly_one_shard_whatever_the_order(count):
    where = assign(IDS, count)
    assert set(where) == set(IDS) and set(where.values()) <= set(range(1, count + 1))
    assert assign(list(reversed(IDS)), count) == where  # the collection order does not matter
    assert assign(IDS[:9], count) == {i: where[i] for i in IDS[:9]}  # nor which other files were collected


def test_parametrizations_of_one_test_spread_over_the_shards():
    where = assign(IDS, 3)
    assert Counter(where[i] for i in IDS[:9]) == Counter({1: 3, 2: 3, 3: 3})


def test_the_longest_tests_start_in_different_shards():
    where = assign(IDS, 2, long_first=("test_long", "test_two"))
    # test_long (the longest) starts at shard 1, its second parametrization goes to 2; test_two starts at 2
    assert (where["correctness/test_c.py::test_long[a]"], where["correctness/test_c.py::test_long[b]"]) == (1, 2)
    assert where["correctness/test_b.py::test_two"] == 2


TINY = """
import pytest

@pytest.mark.parametrize("i", range(7))
def test_p(i):
    pass

def test_a():
    pass

@pytest.mark.parametrize("d", ["x", "y"])
def test_b(d):
    pass
"""


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest on the tiny file with the root conftest loaded as a plugin (the file is outside the repository)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
    env = {k: v for k, v in env.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADDOPTS"))}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-v",
                           "--rootdir", str(tmp_path), str(tmp_path / "test_tiny.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _passed(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return re.findall(r"PASSED (?:\S+::)?(test_\S+)", out.stdout) or re.findall(r"::(test_\S+) PASSED", out.stdout)


def test_pytest_shards_partition_the_tests_also_under_xdist(tmp_path):
    (tmp_path / "test_tiny.py").write_text(TINY)
    everything = _passed(_pytest(tmp_path))
    one, two = _passed(_pytest(tmp_path, "--shard", "1/2", "-n", "2")), _passed(_pytest(tmp_path, "--shard", "2/2"))
    assert len(everything) == 10 and one and two
    assert sorted(one + two) == sorted(everything) and not set(one) & set(two)
    # -k deselects after the shards are dealt: a test keeps its shard
    only_p = _passed(_pytest(tmp_path, "--shard", "1/2", "-k", "test_p"))
    assert set(only_p) == {t for t in one if t.startswith("test_p")}


@pytest.mark.parametrize("value", ["3/2", "junk"])
def test_pytest_refuses_a_bad_shard_naming_it(tmp_path, value):
    (tmp_path / "test_tiny.py").write_text(TINY)
    out = _pytest(tmp_path, "--shard", value)
    assert out.returncode == 4 and f"--shard must be K/N with whole numbers 1 <= K <= N, got '{value}'" in out.stderr
