"""tools/probes/ncu_summary.py on made-up ncu exports: the raw page's table a launch (metrics, stall shares) and
the source page's samples by family, by reason and the long-scoreboard samples by their sources' producer, and its
instruction mix a unit of work."""
from __future__ import annotations

import gzip

import pytest

from kits.probes import probe_module

_RAW = (
    '"ID","Kernel Name","gpu__time_duration.sum","lts__t_sectors_op_red.sum",'
    '"l1tex__t_sector_pipe_lsu_mem_local_op_ld_hit_rate.pct","launch__registers_per_thread",'
    '"smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",'
    '"smsp__average_warps_issue_stalled_selected_per_issue_active.ratio"\n'
    '"","","ms","sector","%","register/thread","inst","inst","inst"\n'
    '"0","_attn_bwd_sm90","66.098400","3,233,808,384","1.859476","255","6","1","1"\n'
    '"1","bprop","36.139680","3233808384","99.760614","168","1","2","1"\n')

_HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","stall_barrier","stall_long_sb","stall_lg",'
           '"stall_long_sb (Not Issued)"\n')
_SOURCE = ('"Kernel Name","k0",\n' + _HEADER +
           '"0x0","      LDL.64 R224, [R1+0xe0]","10","0","0","10","0"\n'
           '"0x10","      VIADD R10, R15, 0x10","0","0","0","0","0"\n'
           '"0x20","      R2UR UR8, R225","60","0","60","0","60"\n'
           '"0x30","@P2   R2UR UR9, R10","20","0","20","0","20"\n'
           '"0x40","      BAR.SYNC.DEFER_BLOCKING 0x0","10","10","0","0","0"\n'
           '"Kernel Name","k1",\n' + _HEADER +
           '"0x0","      WARPGROUP.DEPBAR.LE gsb0, 0x1","5","5","0","0","0"\n')


@pytest.fixture(scope="module")
def probe():
    with probe_module("ncu_summary") as module:
        yield module


def test_raw_table(probe):
    lines = probe.raw_table(_RAW, names=["one-pass", "cudnn"])
    assert len(lines) == 4 and lines[0].startswith("| launch | ms | SM % |")
    one, cudnn = lines[2], lines[3]
    assert one.startswith("| one-pass | 66.10 | — |") and "| 3.234 |" in one and "| 1.9 |" in one
    assert one.endswith("| long_scoreboard 75.0, barrier 12.5, selected 12.5 |")
    assert "| 99.8 |" in cudnn and "| 168 |" in cudnn and cudnn.endswith("| barrier 50.0, long_scoreboard 25.0, "
                                                                          "selected 25.0 |")


def test_raw_table_converts_the_units_ncu_chose(probe):
    """ncu scales each metric per run (a 0.93-ms launch is "929.25 us", 0.4 GB "402.81 Mbyte"): the table shows
    the header's units whatever the export's, and names a unit it does not know instead of printing a figure 1000×
    off."""
    raw = ('"ID","Kernel Name","gpu__time_duration.sum","dram__bytes_read.sum","launch__shared_mem_per_block"\n'
           '"","","{t}","{b}","byte/block"\n"0","k","929.25","402.81","236339"\n')
    row = probe.raw_table(raw.format(t="us", b="Mbyte"))[2]
    assert row.startswith("| k | 0.93 |") and "| 0.403 |" in row and "| 236.3 |" in row
    assert probe.raw_table(raw.format(t="ms", b="Gbyte"))[2].startswith("| k | 929.25 |")
    with pytest.raises(ValueError, match=r"gpu__time_duration.sum in unit 'hours'"):
        probe.raw_table(raw.format(t="hours", b="Mbyte"))


def test_operands_and_producer(probe):
    assert probe.opcode("@!P1  LDL.64 R2, [R1]") == "LDL.64" and probe.family("WARPGROUP.DEPBAR.LE") == \
        "WARPGROUP.DEPBAR"
    assert probe.family("BAR.SYNC.DEFER_BLOCKING") == "BAR" and probe.family("DEPBAR.LE") == "DEPBAR"
    assert probe.dest_and_sources("LDL.64 R224, [R1+0xe0]") == (["R224", "R225"], ["R1"])
    assert probe.dest_and_sources("STL [R1+0x110], R2") == ([], ["R1", "R2"])
    assert probe.dest_and_sources("FADD R164, R164, -R218") == (["R164"], ["R164", "R218"])
    (_, body), _ = probe.read_source(_SOURCE)
    assert [probe.producer(body, i) for i in (2, 3, 4)] == ["LDL", "VIADD", ""]


def test_source_summary(probe, tmp_path):
    path = tmp_path / "s.csv.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(_SOURCE)
    blocks = probe.read_source(probe._open_text(str(path)))
    assert [b[0] for b in blocks] == ["k0", "k1"] and len(blocks[0][1]) == 5
    lines = probe.source_summary("one-pass", blocks[0][1], top=3)
    assert lines[0] == "one-pass: 100 samples"
    assert lines[1] == "  by family (% of samples): R2UR 80.0, LDL 10.0, BAR 10.0"
    assert lines[2] == "  by reason: long_sb 80.0, lg 10.0, barrier 10.0"
    assert lines[4] == "  long_sb by producer of the stalled instruction's sources: LDL 60.0, VIADD 20.0"
    assert probe.source_summary("k1", blocks[1][1])[1].endswith("WARPGROUP.DEPBAR 100.0")


_MIX_HEADER = '"Address","Source","Warp Stall Sampling (All Samples)","Instructions Executed"\n'
_MIX = ('"Kernel Name","ours",\n' + _MIX_HEADER +
        '"0x0","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR36], RZ, !UPT","10","32"\n'
        '"0x10","      MUFU.EX2 R7, R33","30","132"\n'
        '"0x20","      PRMT R152, R152, 0x5432, R152","20","70"\n'
        '"0x30","@P0   BRA 0x10","40","6"\n'
        '"Kernel Name","theirs",\n' + _MIX_HEADER +
        '"0x0","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR24], RZ, !UPT","50","64"\n'
        '"0x10","      MUFU.EX2 R13, R17","25","264"\n'
        '"0x20","      FMUL.FTZ R17, R24, UR21","25","256"\n')


def test_mix_table_counts_a_unit_of_work(probe, tmp_path, capsys):
    """Executed instructions by family over a unit of work (HGMMA:16: ours ran 2 units, theirs 4), samples in %;
    a unit a launch (comma-separated); a malformed unit, a count of units not the launches', or one a launch never
    ran is refused by name."""
    blocks = probe.read_source(_MIX)
    lines = probe.mix_table(blocks, "HGMMA:16")
    assert lines[0] == "| family | ours a unit | ours % samples | theirs a unit | theirs % samples |"
    assert lines[2] == "| units | 2 |  | 4 |  |"
    rows = {line.split(" | ")[0][2:]: line for line in lines[3:]}
    assert rows["HGMMA"] == "| HGMMA | 16.0 | 10.0 | 16.0 | 50.0 |"
    assert rows["MUFU"] == "| MUFU | 66.0 | 30.0 | 66.0 | 25.0 |"
    assert rows["PRMT"] == "| PRMT | 35.0 | 20.0 | 0.0 | 0.0 |" and rows["FMUL"].endswith("| 64.0 | 25.0 |")
    assert rows["BRA"] == "| BRA | 3.0 | 40.0 | 0.0 | 0.0 |"
    assert rows["all"] == "| all | 120.0 | 100.0 | 146.0 | 100.0 |"
    with pytest.raises(ValueError, match="FAMILY:N"):
        probe.mix_table(blocks, "HGMMA")
    with pytest.raises(ValueError, match="launch theirs executed no PRMT"):
        probe.mix_table(blocks, "PRMT:32")
    per_launch = probe.mix_table(blocks, "HGMMA:16,HGMMA:32")  # theirs: a unit of 32 HGMMA, 2 units
    assert per_launch[2] == "| units | 2 |  | 2 |  |" and "| MUFU | 66.0 | 30.0 | 132.0 | 25.0 |" in per_launch
    with pytest.raises(ValueError, match="gives 3 units for 2 launches"):
        probe.mix_table(blocks, "HGMMA:16,HGMMA:16,HGMMA:16")
    with pytest.raises(ValueError, match="launch theirs executed no PRMT"):
        probe.mix_table(blocks, "HGMMA:16,PRMT:32")
    path = tmp_path / "mix.csv"
    path.write_text(_MIX)
    assert probe.main(["mix", str(path), "--names", "a,b", "--unit", "MUFU:66"]) == 0
    assert "| units | 2 |  | 4 |  |" in capsys.readouterr().out


def test_mix_table_reads_an_export_without_pc_sampling(probe):
    """A report taken without source-level sampling exports counts only: the mix still counts, samples read 0."""
    counts_only = ('"Kernel Name","ours",\n"Address","Source","Instructions Executed"\n'
                   '"0x0","      HGMMA.64x128x16.F32.BF16 R24, gdesc[UR36], RZ, !UPT","32"\n'
                   '"0x10","      MUFU.EX2 R7, R33","132"\n')
    rows = {line.split(" | ")[0][2:]: line for line in probe.mix_table(probe.read_source(counts_only))[3:]}
    assert rows["MUFU"] == "| MUFU | 66.0 | 0.0 |" and rows["all"] == "| all | 82.0 | 0.0 |"


def test_cli(probe, tmp_path, capsys):
    raw = tmp_path / "raw.csv"
    raw.write_text(_RAW)
    assert probe.main(["raw", str(raw), "--names", "a,b"]) == 0
    assert "| a | 66.10 |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        probe.main(["neither", str(raw)])
    raw.write_text(_RAW.replace('"","","ms"', '"","","hours"'))  # a unit the table does not know: named, exit 2
    assert probe.main(["raw", str(raw)]) == 2
    assert "gpu__time_duration.sum in unit 'hours'" in capsys.readouterr().err
