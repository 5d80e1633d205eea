"""Filing a device call's nsys outputs under reports/data/<device>/nsys/<stamp>/ (impl.nsys.store): what is kept,
the captures (exports, reports) kept in the branch's history and not in the folder, CAPTURES.json naming the commit
holding each, the refusal to overwrite, and a missing part named (refused without --partial). Each test files into a
temporary git repository."""
import json
import subprocess
import tarfile

import pytest

from impl.nsys import captures as C
from impl.nsys import outputs as O
from impl.nsys import store as S
from impl.nsys.tables import NsysOutputError
from impl.nsys.extract import write_extracts
from kits.nsys_outputs import write_export


@pytest.fixture(autouse=True)
def repo(tmp_path):
    """tmp_path as a git repository with one commit on main (the data folder tmp_path/data is inside it)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)
    git("init", "-q", "-b", "main"), git("config", "user.name", "t"), git("config", "user.email", "t@example.com")
    (tmp_path / "README").write_text("x")
    git("add", "README"), git("commit", "-q", "-m", "first")
    return tmp_path


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _recorded(dest, sub):
    """The names dest/CAPTURES.json records under sub, each checked to be held by the commit it names."""
    out = []
    for name, commit in S.recorded_captures(dest).items():
        if name.startswith(f"{sub}/"):
            assert C.stored(C.repo_root(dest), (dest / name).resolve(), commit).startswith(f"{commit}:"), name
            out.append(name.split("/", 1)[1])
    return out


def _export_of(repo, dest, name):
    """The export `name` as the history keeps it for `dest` (CAPTURES.json's commit), written to a scratch file."""
    p = repo / "scratch" / f"{name}.sqlite.gz"
    p.parent.mkdir(exist_ok=True)
    commit = S.recorded_captures(dest)[f"sqlite/{p.name}"]
    p.write_bytes(C.read_bytes(repo, C.spec(commit, C.relative(repo, (dest / "sqlite" / p.name).resolve()))))
    return p


def _parts(tmp_path, drop_second=False):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    names = ("ddp_2026_xl_naive_ctx128", "nsys_profile_2025_small_ctx128")
    recs = []
    first, second = [], []
    for n in names:
        f = O.CaseFiles(work, n)
        for r in O.REPORTS:
            f.csv(r).write_text("x")
        f.result.write_text("{}")
        f.rep.write_bytes(b"rep")
        write_export(f.sqlite)
        O.gzip_file(f.sqlite)
        first += [f.csv(r) for r in O.REPORTS] + [f.result, f.sqlite_gz]
        second.append(f.rep)
        recs.append(O.CaseRecord(n, n.split("_20")[0], "profiled", reports=O.REPORTS, sqlite=True, rep=True,
                                 workload={"status": "ok"}))
    for name, members in (("nsys-1.tar", first), ("nsys-2.tar", second)):
        with tarfile.open(out / name, "w") as tar:
            for f in members:
                tar.add(f, arcname=f.name)
    m = O.Manifest("v", "2x NVIDIA H200", "abcdef123", "20261126T090839Z", tuple(recs), ("nsys-1.tar", "nsys-2.tar"))
    (out / O.MANIFEST).write_text(m.to_json())
    (out / "log.txt").write_text("log")
    if drop_second:
        (out / "nsys-2.tar").unlink()
    return out


def test_device_slug_from_the_manifest():
    assert S.device_of("2x NVIDIA H200") == "h200-141gb-x2"
    assert S.device_of("1x NVIDIA H100 80GB HBM3") == "h100-80gb-x1"
    with pytest.raises(NsysOutputError, match="--device"):
        S.device_of("H200")


def test_files_tables_all_reports_and_only_the_drawn_exports_and_never_overwrites(tmp_path, repo):
    out, data = _parts(tmp_path), tmp_path / "data"
    status = _git(repo, "status", "--porcelain")
    head = _git(repo, "rev-parse", "HEAD")
    dest = S.file_outputs(out, data, sqlite=["ddp_*"])
    assert dest == data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12"
    # the captures are in the branch's history, one commit naming the folder, and not in the folder
    assert _recorded(dest, "sqlite") == ["ddp_2026_xl_naive_ctx128.sqlite.gz"]
    assert len(_recorded(dest, "rep")) == 2 and len(list((dest / "tables").iterdir())) == 8
    assert not (dest / "sqlite").exists() and not (dest / "rep").exists()
    rel = "data/h200-141gb-x2/nsys/20261126T090839Z_abcdef12"
    kept = _git(repo, "rev-parse", "HEAD^")
    assert set(S.recorded_captures(dest).values()) == {kept} and _git(repo, "rev-parse", f"{kept}^") == head
    assert C.read_bytes(repo, f"{kept}:{rel}/rep/ddp_2026_xl_naive_ctx128.nsys-rep") == b"rep"
    assert _git(repo, "log", "-1", "--format=%s", kept) == f"captures of {rel}: 3 files (impl.nsys.store)"
    # the working tree beyond the new folder, the index and HEAD's tree as they were (the new folder is untracked)
    assert _git(repo, "rev-parse", "HEAD^{tree}") == _git(repo, "rev-parse", f"{head}^{{tree}}")
    assert _git(repo, "status", "--porcelain").replace("?? data/", "").strip() == status
    filed = json.loads((dest / S.FILED).read_text())
    assert "captures" not in filed
    assert filed["not_kept"]["sqlite"] == ["nsys_profile_2025_small_ctx128.sqlite.gz"] and not filed["lost_files"]
    # what the pages read of the kept export, written as it is filed (a timeline; no memory table in it)
    assert filed["kept"]["extract"] == ["ddp_2026_xl_naive_ctx128.timeline.json.gz"]
    assert sorted(p.name for p in (dest / "extract").iterdir()) == filed["kept"]["extract"]
    assert (dest / "manifest.json").exists() and (dest / "log.txt").exists()
    with pytest.raises(NsysOutputError, match="already filed"):
        S.file_outputs(out, data)
    assert S.main([str(out), "--data", str(data)]) == 1


def test_filing_outside_a_git_repository_is_refused(tmp_path_factory):
    """The captures need a branch's history: a data folder outside any git repository is named."""
    bare = tmp_path_factory.mktemp("nogit")
    if subprocess.run(["git", "-C", str(bare), "rev-parse"], capture_output=True).returncode == 0:
        pytest.skip("the temporary folder is inside a git repository")
    out = _parts(bare)
    with pytest.raises(NsysOutputError, match="not inside a git repository"):
        S.file_outputs(out, bare / "data")
    assert not (bare / "data").exists()


def test_a_missing_part_is_refused_unless_partial_and_then_recorded(tmp_path):
    out, data = _parts(tmp_path, drop_second=True), tmp_path / "data"
    with pytest.raises(NsysOutputError, match="ddp_2026_xl_naive_ctx128.nsys-rep"):
        S.file_outputs(out, data)
    assert not (data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12").exists()
    assert S.main([str(out), "--data", str(data), "--partial", "--device", "h200-141gb-x2", "--note", "n"]) == 0
    filed = json.loads((data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12" / S.FILED).read_text())
    assert filed["missing_parts"] == ["nsys-2.tar"] and filed["note"] == "n"
    assert filed["lost_files"]["nsys_profile_2025_small_ctx128"] == ["nsys_profile_2025_small_ctx128.nsys-rep"]


def test_an_export_left_out_is_added_later_from_the_same_parts_only_once(tmp_path, repo):
    """2026-11-26's filing kept no export of the two-GPU cases the pages draw: they are added from the same
    call's parts (ADDED.json says so), never from another call's, never over a stored file."""
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=[])
    filed = S.recorded_captures(dest)
    assert _recorded(dest, "sqlite") == [] and len(filed) == 2
    head = _git(repo, "rev-parse", "HEAD")
    assert S.add_exports(out, dest, ["ddp_*"], note="the pages draw it") == ["ddp_2026_xl_naive_ctx128"]
    assert _recorded(dest, "sqlite") == ["ddp_2026_xl_naive_ctx128.sqlite.gz"]
    assert not (dest / "sqlite").exists()
    (added,) = json.loads((dest / S.ADDED).read_text())
    assert added["sqlite"] == ["ddp_2026_xl_naive_ctx128.sqlite.gz"] and added["note"] == "the pages draw it"
    assert added["extract"] == ["ddp_2026_xl_naive_ctx128.timeline.json.gz"]
    # the record gains the new commit, a child of the branch as it was; what it recorded stays as it was
    recorded = S.recorded_captures(dest)
    assert recorded == {**filed, "sqlite/ddp_2026_xl_naive_ctx128.sqlite.gz": _git(repo, "rev-parse", "HEAD^")}
    assert _git(repo, "rev-parse", "HEAD^^") == head
    with pytest.raises(NsysOutputError, match="never rewritten"):
        S.add_exports(out, dest, ["ddp_*"])
    (dest / S.CAPTURES).unlink()  # the history alone still refuses it
    with pytest.raises(NsysOutputError, match="never rewritten"):
        S.add_exports(out, dest, ["ddp_*"])
    (dest / S.CAPTURES).write_text(json.dumps(recorded))
    with pytest.raises(NsysOutputError, match="no case"):
        S.add_exports(out, dest, ["fsdp_*"])
    (out / O.MANIFEST).write_text((out / O.MANIFEST).read_text().replace("abcdef123", "0000000"))
    with pytest.raises(NsysOutputError, match="another call"):
        S.add_exports(out, dest, ["nsys_*"])


def test_a_folder_filed_before_extracts_gets_them_once(tmp_path):
    """Folders filed before impl.nsys.extract existed: `--extract FOLDER` writes the extracts their exports (read
    from the history at the commit CAPTURES.json names) lack (ADDED.json says so), and nothing the second time; an extract is never
    rewritten."""
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=["*"])
    for p in (dest / "extract").iterdir():  # as a folder filed before extracts existed
        p.unlink()
    assert S.main(["--extract", str(dest), "--note", "backfill"]) == 0
    (added,) = json.loads((dest / S.ADDED).read_text())
    assert added["note"] == "backfill" and added["extract"] == [
        "ddp_2026_xl_naive_ctx128.timeline.json.gz", "nsys_profile_2025_small_ctx128.timeline.json.gz"]
    assert S.add_extracts(dest) == [] and len(json.loads((dest / S.ADDED).read_text())) == 1
    with pytest.raises(NsysOutputError, match="never rewritten"):
        write_extracts(_export_of(tmp_path, dest, "ddp_2026_xl_naive_ctx128"), dest / "extract")
    with pytest.raises(SystemExit):
        S.main([str(out), "--extract", str(dest)])  # folders alone


def test_a_folder_with_its_exports_in_the_tree_still_gets_extracts(tmp_path, tmp_path_factory):
    """A folder laid out as before 2026-11-26 (sqlite/ in the folder), outside any git repository:
    `--extract` reads the folder's own exports."""
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=["ddp_*"])
    old = tmp_path_factory.mktemp("old") / dest.name
    if subprocess.run(["git", "-C", str(old.parent), "rev-parse"], capture_output=True).returncode == 0:
        pytest.skip("the temporary folder is inside a git repository")
    (old / "sqlite").mkdir(parents=True)
    (old / "manifest.json").write_bytes((dest / "manifest.json").read_bytes())
    case, name = "ddp_2026_xl_naive_ctx128", "ddp_2026_xl_naive_ctx128.timeline.json.gz"
    _export_of(tmp_path, dest, case).rename(old / "sqlite" / f"{case}.sqlite.gz")
    assert S.add_extracts(old) == [name]
    assert (old / "extract" / name).read_bytes() == (dest / "extract" / name).read_bytes()


def test_a_folder_filed_with_its_captures_in_the_tree_gets_its_record_from_the_history(tmp_path, repo):
    """Folders whose captures were committed in the tree (before 2026-11-26's move) and then left it: `--record`
    names, for each capture FILED.json and ADDED.json list, the commit that added it; a capture the history lacks
    is refused by name, and a recorded name is never rewritten."""
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=["ddp_*"])
    recorded = S.recorded_captures(dest)
    (dest / S.CAPTURES).unlink()
    assert S.main(["--record", str(dest)]) == 0
    assert S.recorded_captures(dest) == recorded and S.record_history(dest) == {}
    (dest / S.CAPTURES).unlink()
    # a capture committed in the tree by hand, then removed
    rel = C.relative(repo, (dest / "rep" / "ddp_2026_xl_naive_ctx128.nsys-rep").resolve())
    filed = json.loads((dest / S.FILED).read_text())
    filed["kept"]["rep"].append("old.nsys-rep")
    (dest / S.FILED).write_text(json.dumps(filed))
    (dest / "rep").mkdir()
    (dest / "rep" / "old.nsys-rep").write_bytes(b"old")
    _git(repo, "add", str(dest / "rep" / "old.nsys-rep")), _git(repo, "commit", "-q", "-m", "in the tree")
    added = _git(repo, "rev-parse", "HEAD")
    _git(repo, "rm", "-q", str(dest / "rep" / "old.nsys-rep")), _git(repo, "commit", "-q", "-m", "out of it")
    assert S.record_history(dest) == {**recorded, "rep/old.nsys-rep": added}
    assert C.read_bytes(repo, C.spec(added, rel.replace("ddp_2026_xl_naive_ctx128", "old"))) == b"old"
    filed["kept"]["rep"].append("never.nsys-rep")
    (dest / S.FILED).write_text(json.dumps(filed))
    with pytest.raises(NsysOutputError, match="never.nsys-rep"):
        S.record_history(dest)
    with pytest.raises(NsysOutputError, match="never rewritten"):
        S._record_captures(dest, {"rep/old.nsys-rep": "0" * 40})
