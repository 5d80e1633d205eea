"""The GPU-side Nsight Systems tooling, checked on the CPU: tools/gpu_nsys.sh refuses to start without
the carried Debian packages, the nsys command lines of the cases, the packing of outputs into the
device's few returned files and their unpacking, and a case's workload on the CPU."""
import json
import os
import subprocess
from pathlib import Path

import pytest

from impl.nsys import cases as C
from impl.nsys import outputs as O
from impl.nsys.run import export_command, profile_command, stats_command
from impl.nsys.tables import NsysOutputError

ROOT = Path(__file__).resolve().parents[1]
NSYS = "/opt/nsys"


def _gpu_nsys(tmp_path, debs: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NSYS_DEBS=str(debs), OUT=str(tmp_path / "out"))
    return subprocess.run(["bash", str(ROOT / "tools/gpu_nsys.sh"), "ddp"], env=env, capture_output=True, text=True,
                          timeout=60)


def test_gpu_script_refuses_without_the_carried_debs_and_names_them(tmp_path):
    (tmp_path / "debs").mkdir()
    r = _gpu_nsys(tmp_path, tmp_path / "debs")
    assert r.returncode == 2
    assert "libdw1 libelf1" in r.stderr and "tools/nsys_fetch.sh" in r.stderr
    assert not (tmp_path / "out").exists()  # refused before setting anything up
    (tmp_path / "debs" / "libdw1_0.188-2.1_amd64.deb").write_bytes(b"")
    r = _gpu_nsys(tmp_path, tmp_path / "debs")
    assert r.returncode == 2 and "package(s) libelf1 " in r.stderr


def test_case_names_are_what_the_device_returns_and_unique():
    every = C.cases(list(C.GROUPS), 80 * 10**9)
    assert len({c.name for c in every}) == len(every)
    assert all(set(c.name) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.") for c in every)
    assert {c.group for c in every} == set(C.GROUPS)
    ddp = C.ddp_cases()
    assert {a for c in ddp for a in c.args if a in ("naive", "individual")} == {"naive", "individual"}
    assert all(c.gpus == 2 and c.capture is None for c in ddp + C.fsdp_cases())
    mem = C.memory_cases()
    assert all(c.memory and ("PYTORCH_NO_CUDA_MEMORY_CACHING", "1") in c.env for c in mem)
    with pytest.raises(ValueError, match=r"unknown nsys case groups \['dpp'\]"):
        C.cases(["dpp"], None)


def test_command_lines(tmp_path):
    files = O.CaseFiles(tmp_path, "m")
    mem = C.memory_cases()[0]
    cmd = profile_command(NSYS, mem, files, python="py")
    assert cmd[:6] == [NSYS, "profile", "-t", "cuda,nvtx", "--sample=none", "--cpuctxsw=none"]
    assert "--capture-range=nvtx" in cmd and f"--nvtx-capture={C.MEASURED}" in cmd and "--cuda-memory-usage=true" in cmd
    assert cmd[cmd.index("-o") + 1] == str(tmp_path / "m")  # nsys adds .nsys-rep
    assert cmd[-2:] == ["--result", str(files.result)] and cmd[cmd.index("py") + 1:][:3] == ["-m", "impl.nsys.workloads", "memory_block"]
    ddp = profile_command(NSYS, C.ddp_cases()[0], files, python="py")
    assert not any(a.startswith("--capture-range") for a in ddp) and "--cuda-memory-usage=true" not in ddp
    assert export_command(NSYS, files)[-3:] == ["-o", str(files.sqlite), str(files.rep)]
    stats = stats_command(NSYS, files)
    assert [stats[i + 1] for i, a in enumerate(stats) if a == "--report"] == list(O.REPORTS)
    assert stats[-3:] == ["--output", str(tmp_path / "m"), str(files.sqlite)]


def _file(path: Path, n: int) -> Path:
    path.write_bytes(os.urandom(n))
    return path


def test_plan_parts_fills_in_order_and_leaves_out_what_cannot_fit(tmp_path):
    small = [_file(tmp_path / f"s{i}.csv", 1000) for i in range(3)]
    big = _file(tmp_path / "big.nsys-rep", 9000)
    huge = _file(tmp_path / "huge.sqlite.gz", 20000)
    parts, left = O.plan_parts(small + [big, huge], part_bytes=12000, max_parts=2, total_bytes=40000)
    assert parts == [small, [big]] and left == [huge]
    parts, left = O.plan_parts(small + [big], part_bytes=12000, max_parts=1, total_bytes=40000)
    assert parts == [small] and left == [big]  # no part left for it
    parts, left = O.plan_parts(small, part_bytes=12000, max_parts=3, total_bytes=2500)
    assert parts == [small[:1]] and left == small[1:]  # the total is spent


def test_parts_and_manifest_round_trip(tmp_path):
    work, out, dest = tmp_path / "work", tmp_path / "out", tmp_path / "dest"
    work.mkdir(), out.mkdir()
    files = O.CaseFiles(work, "ddp_2026_xl_naive_ctx128")
    files.csv("nvtx_sum").write_text("x")
    files.rep.write_bytes(b"rep")
    files.sqlite.write_bytes(b"SQLite format 3\x00" * 10)
    gz = O.gzip_file(files.sqlite)
    assert gz == files.sqlite_gz and not files.sqlite.exists()
    (out / "nsys-9.tar").write_text("stale")
    parts, left = O.write_parts([files.csv("nvtx_sum"), gz, files.rep], out)
    assert parts == ["nsys-1.tar"] and left == [] and not (out / "nsys-9.tar").exists()
    rec = O.CaseRecord("ddp_2026_xl_naive_ctx128", "ddp", "profiled", 12.5, reports=("nvtx_sum",), sqlite=True, rep=True,
                       workload={"status": "ok"})
    m = O.Manifest("NVIDIA Nsight Systems version 2025.3.1", "2x NVIDIA H100 80GB HBM3", "abc1234", "20261127T000000Z",
                   (rec,), tuple(parts))
    (out / O.MANIFEST).write_text(m.to_json())
    assert O.read_manifest(out / O.MANIFEST) == m
    assert O.unpack(out, dest) == m
    assert (dest / files.sqlite.name).read_bytes() == b"SQLite format 3\x00" * 10
    assert (dest / files.rep.name).read_bytes() == b"rep" and (dest / O.MANIFEST).exists()


def test_manifest_errors_name_the_file(tmp_path):
    with pytest.raises(NsysOutputError, match=r"manifest\.json: no such file"):
        O.read_manifest(tmp_path / "manifest.json")
    (tmp_path / "manifest.json").write_text(json.dumps({"cases": []}))
    with pytest.raises(NsysOutputError, match=r"manifest\.json: not an nsys run manifest"):
        O.read_manifest(tmp_path / "manifest.json")
    m = O.Manifest("v", "d", "c", "s", (), ("nsys-1.tar",))
    (tmp_path / "manifest.json").write_text(m.to_json())
    with pytest.raises(NsysOutputError, match=r"missing: nsys-1\.tar"):
        O.unpack(tmp_path, tmp_path / "dest")


def test_a_missing_part_names_each_cases_lost_files_and_partial_extracts_the_rest(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir(), out.mkdir()
    a, b = O.CaseFiles(work, "case_a"), O.CaseFiles(work, "case_b")
    for f in (a, b):
        f.csv("nvtx_sum").write_text("x")
        f.result.write_text("{}")
        f.rep.write_bytes(b"rep")
    for name, members in (("nsys-1.tar", [a.csv("nvtx_sum"), a.result, b.csv("nvtx_sum"), b.result, a.rep]),
                          ("nsys-2.tar", [b.rep])):
        import tarfile
        with tarfile.open(out / name, "w") as tar:
            for f in members:
                tar.add(f, arcname=f.name)
    recs = tuple(O.CaseRecord(n, "g", "profiled", reports=("nvtx_sum",), rep=True, workload={"status": "ok"})
                 for n in ("case_a", "case_b"))
    recs += (O.CaseRecord("case_c", "g", "left_out_by_budget"),)
    (out / O.MANIFEST).write_text(O.Manifest("v", "d", "c", "s", recs, ("nsys-1.tar", "nsys-2.tar")).to_json())
    (out / "nsys-2.tar").unlink()  # the device did not return it
    with pytest.raises(NsysOutputError, match=r"(?s)missing: nsys-2\.tar.*case_b: case_b\.nsys-rep"):
        O.unpack(out, tmp_path / "strict")
    assert not (tmp_path / "strict").exists()  # nothing extracted
    lost = O.lost_files(O.read_manifest(out / O.MANIFEST), out)
    assert lost.missing_parts == ("nsys-2.tar",) and lost.files == {"case_b": ("case_b.nsys-rep",)}
    dest = tmp_path / "dest"
    assert O.main(["unpack", str(out), str(dest)]) == 1
    assert O.main(["unpack", str(out), str(dest), "--partial"]) == 0
    assert "case_b: case_b.nsys-rep" in capsys.readouterr().err
    assert (dest / "case_a.nsys-rep").exists() and (dest / "case_b_nvtx_sum.csv").exists()
    assert not (dest / "case_b.nsys-rep").exists()


def test_a_single_gpu_workload_runs_on_the_cpu(tmp_path):
    """The same code the nsys_profile case runs on the GPU, at the smoke size on the CPU."""
    from impl.nsys.workloads import main

    out = tmp_path / "r.json"
    assert main(["nsys_profile", "--edition", "2025", "--size", "tiny", "--context", "16", "--batch", "2",
                 "--device", "cpu", "--result", str(out)]) == 0
    r = json.loads(out.read_text())
    assert (r["status"], r["profiled"], r["kind"]) == ("ok", "train_step", "nsys_profile")


def test_the_leaderboard_workload_runs_its_step_on_two_gloo_ranks(tmp_path):
    """The 8B case's code path (leaderboard_2026.rank_setup, then the annotated step on every rank) at
    the tiny config on two CPU processes; its case is the grid's fastest measured candidate."""
    from impl.nsys import cases as C
    from impl.nsys.workloads import main

    (case,) = C.leaderboard_cases()
    assert case.gpus == 2 and case.capture is None and C.LEADERBOARD_CANDIDATE.id in case.name
    assert case.args[case.args.index("--attn") + 1] == "flash_gluon" and "--k" in case.args
    out = tmp_path / "r.json"
    assert main(["leaderboard_2026", "--config", "tiny", "--context", "32", "--batch", "2", "--checkpointing",
                 "keep_attention", "--k", "1", "--compile", "none", "--attn", "flash_torch", "--warmup", "1",
                 "--steps", "1", "--world-size", "2", "--device", "cpu", "--result", str(out)]) == 0
    r = json.loads(out.read_text())
    assert (r["status"], r["kind"], len(r["peak_allocated"])) == ("ok", "leaderboard_2026", 2)
