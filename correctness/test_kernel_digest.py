"""The kernels' digest (impl.bench.kernel_digest): the kernel files plus the kernel table's choices,
not the table's measured evidence, and the one staleness rule records and runs are judged by."""
from pathlib import Path

import pytest

from impl.attention.kernel_table import KernelTable, dumps
from impl.bench import kernel_digest as kd
from kits.kernel_tree import choice, tree


def test_the_table_digest_follows_its_choices_not_their_evidence(tmp_path):
    root = tree(tmp_path, choice())
    first = kd.kernel_digest(root)
    tree(root, choice(probes=3))  # more probes filed for the same choice
    assert kd.kernel_digest(root) == first
    tree(root, choice(num_warps=8))  # another config chosen
    assert kd.kernel_digest(root).table != first.table and kd.kernel_digest(root).sources == first.sources
    tree(root, choice(), choice(d=128))  # one more entry
    assert kd.kernel_digest(root).table not in (first.table, None)
    (root / kd.KERNEL_TABLE).write_text(dumps(KernelTable((choice(),), "another rule")))  # prose only
    assert kd.kernel_digest(root) == first
    tree(root, choice(min_seq=1024, losses=1))  # a measured floor: another choice (short calls run Triton)
    floored = kd.kernel_digest(root)
    assert floored.table != first.table
    tree(root, choice(min_seq=1024, losses=2))  # more losses filed for the same floor: evidence
    assert kd.kernel_digest(root) == floored


def test_the_sources_digest_is_the_kernel_files_and_ignores_the_table(tmp_path):
    root = tree(tmp_path, choice())
    before = kd.kernel_digest(root)
    assert before.sources == kd.digest(kd.KERNEL_PATHS, root)  # the value records have always held
    tree(root, choice(num_warps=8))
    assert kd.kernel_digest(root).sources == before.sources
    tree(root, choice(), kernel="x = 2\n")
    assert kd.kernel_digest(root) == kd.KernelDigest(kd.digest(kd.KERNEL_PATHS, root), before.table) != before


def test_no_table_digests_as_an_empty_one_and_a_bad_table_names_its_file(tmp_path):
    without = kd.table_digest(tree(tmp_path / "a"))
    empty = tree(tmp_path / "b")
    (empty / kd.KERNEL_TABLE).write_text(dumps(KernelTable((), "")))
    assert kd.table_digest(empty) == without  # both run the Triton kernels everywhere
    for text in ("{", "[]", '{"entries": [{"direction": "fwd"}]}'):
        (empty / kd.KERNEL_TABLE).write_text(text)
        with pytest.raises(ValueError, match=f"{kd.KERNEL_TABLE}: not a kernel table"):
            kd.table_digest(empty)


def test_changed_since_judges_a_record_without_the_table_by_its_sources():
    now = kd.KernelDigest("s1", "t1")
    assert not now.changed_since(kd.KernelDigest("s1", "t1"))
    assert now.changed_since(kd.KernelDigest("s1", "t0"))  # the table's choices changed
    assert now.changed_since(kd.KernelDigest("s0", "t1"))
    assert not now.changed_since(kd.KernelDigest("s1", None))  # an old record: its sources alone
    assert now.changed_since(kd.KernelDigest("s0", None))


def test_the_json_form_round_trips_and_its_absence_reads_as_none():
    k = kd.KernelDigest("0123456789abcdef", "fedcba9876543210")
    assert kd.KernelDigest.from_json(dict(id="c0ffee", **k.to_json())) == k
    assert kd.KernelDigest.from_json(dict(id="c0ffee", dirty=False)) is None
    assert k.label == "01234567/fedcba98"


def test_a_process_run_from_this_checkout_digests_its_kernels():
    root = Path(__file__).resolve().parents[1]
    assert kd.running_kernels() == kd.kernel_digest(root)
