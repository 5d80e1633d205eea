"""Filing a device call's nsys outputs under reports/data/<device>/nsys/<stamp>/ (impl.nsys.store): what is kept,
the refusal to overwrite, and a missing part named (refused without --partial)."""
import json
import tarfile

import pytest

from impl.nsys import outputs as O
from impl.nsys import store as S
from impl.nsys.tables import NsysOutputError
from impl.nsys.extract import write_extracts
from kits.nsys_outputs import write_export


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


def test_files_tables_all_reports_and_only_the_drawn_exports_and_never_overwrites(tmp_path):
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=["ddp_*"])
    assert dest == data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12"
    assert sorted(p.name for p in (dest / "sqlite").iterdir()) == ["ddp_2026_xl_naive_ctx128.sqlite.gz"]
    assert len(list((dest / "rep").iterdir())) == 2 and len(list((dest / "tables").iterdir())) == 8
    filed = json.loads((dest / S.FILED).read_text())
    assert filed["not_kept"]["sqlite"] == ["nsys_profile_2025_small_ctx128.sqlite.gz"] and not filed["lost_files"]
    # what the pages read of the kept export, written as it is filed (a timeline; no memory table in it)
    assert filed["kept"]["extract"] == ["ddp_2026_xl_naive_ctx128.timeline.json.gz"]
    assert sorted(p.name for p in (dest / "extract").iterdir()) == filed["kept"]["extract"]
    assert (dest / "manifest.json").exists() and (dest / "log.txt").exists()
    with pytest.raises(NsysOutputError, match="already filed"):
        S.file_outputs(out, data)
    assert S.main([str(out), "--data", str(data)]) == 1


def test_a_missing_part_is_refused_unless_partial_and_then_recorded(tmp_path):
    out, data = _parts(tmp_path, drop_second=True), tmp_path / "data"
    with pytest.raises(NsysOutputError, match="ddp_2026_xl_naive_ctx128.nsys-rep"):
        S.file_outputs(out, data)
    assert not (data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12").exists()
    assert S.main([str(out), "--data", str(data), "--partial", "--device", "h200-141gb-x2", "--note", "n"]) == 0
    filed = json.loads((data / "h200-141gb-x2" / "nsys" / "20261126T090839Z_abcdef12" / S.FILED).read_text())
    assert filed["missing_parts"] == ["nsys-2.tar"] and filed["note"] == "n"
    assert filed["lost_files"]["nsys_profile_2025_small_ctx128"] == ["nsys_profile_2025_small_ctx128.nsys-rep"]


def test_an_export_left_out_is_added_later_from_the_same_parts_only_once(tmp_path):
    """2026-11-26's filing kept no export of the two-GPU cases the pages draw: they are added from the same
    call's parts (ADDED.json says so), never from another call's, never over a stored file."""
    out, data = _parts(tmp_path), tmp_path / "data"
    dest = S.file_outputs(out, data, sqlite=[])
    assert S.add_exports(out, dest, ["ddp_*"], note="the pages draw it") == ["ddp_2026_xl_naive_ctx128"]
    assert sorted(p.name for p in (dest / "sqlite").iterdir()) == ["ddp_2026_xl_naive_ctx128.sqlite.gz"]
    (added,) = json.loads((dest / S.ADDED).read_text())
    assert added["sqlite"] == ["ddp_2026_xl_naive_ctx128.sqlite.gz"] and added["note"] == "the pages draw it"
    assert added["extract"] == ["ddp_2026_xl_naive_ctx128.timeline.json.gz"]
    with pytest.raises(NsysOutputError, match="never rewritten"):
        S.add_exports(out, dest, ["ddp_*"])
    with pytest.raises(NsysOutputError, match="no case"):
        S.add_exports(out, dest, ["fsdp_*"])
    (out / O.MANIFEST).write_text((out / O.MANIFEST).read_text().replace("abcdef123", "0000000"))
    with pytest.raises(NsysOutputError, match="another call"):
        S.add_exports(out, dest, ["nsys_*"])


def test_a_folder_filed_before_extracts_gets_them_once(tmp_path):
    """Folders filed before impl.nsys.extract existed: `--extract FOLDER` writes the extracts their exports lack
    (ADDED.json says so), and nothing the second time; an extract is never rewritten."""
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
        write_extracts(dest / "sqlite" / "ddp_2026_xl_naive_ctx128.sqlite.gz", dest / "extract")
    with pytest.raises(SystemExit):
        S.main([str(out), "--extract", str(dest)])  # folders alone
