"""tools/probes/sass_loops.py on a made-up SASS listing: loop bodies from backward branches, the mbarrier retry
blocks after the kernel's end not counted as loops, the counts and positions it reports."""
from __future__ import annotations

import pytest

from kits.probes import probe_module


_LISTING = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;                      /* 0x00000a0000017a02 */
        /*0010*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;  /* 0x0000000000007a02 */
        /*0020*/               @!P0 BRA 0x0100 ;                               /* 0x0000000000007a02 */
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;   /* 0x0000000000007a02 */
        /*0040*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR12], R24 ; /* 0x0000000000007a02 */
        /*0050*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;             /* 0x0000000000007a02 */
        /*0060*/                   DEPBAR.LE SB0, 0x1 ;                        /* 0x0000000000007a02 */
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;               /* 0x0000000000007a02 */
        /*0080*/                   LDL.64 R4, [R1+0x10] ;                      /* 0x0000000000007a02 */
        /*0090*/              @P1 BRA 0x0010 ;                                 /* 0x0000000000007a02 */
        /*00a0*/                   EXIT ;                                      /* 0x0000000000007a02 */
        /*0100*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;  /* 0x0000000000007a02 */
        /*0110*/               @!P0 BRA 0x0100 ;                               /* 0x0000000000007a02 */
        /*0120*/                   BRA 0x0030 ;                                /* 0x0000000000007a02 */
"""


@pytest.fixture(scope="module")
def probe():
    with probe_module("sass_loops") as module:
        yield module


def test_one_loop_and_no_retry_block(probe):
    ins = probe.parse(_LISTING)
    assert len(ins) == 14 and ins[3] == (0x30, "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ")
    assert probe.loops(ins) == [(1, 9)]  # 0x0010 .. the @P1 BRA; not the retry spin nor its BRA 0x0030 back


def test_counts_and_positions(probe):
    ins = probe.parse(_LISTING)
    c = probe.counts(ins[1:10])
    assert (c["HGMMA"], c["WG.DEPBAR"], c["DEPBAR SB0"], c["BAR.SYNC"], c["LDL"], c["SYNCS"]) == (2, 1, 1, 1, 1, 1)
    assert probe.positions(ins[1:10]) == ["0:SYNCS", "2:HGMMAx2", "4:WARPGROUP.DEPBAR.LE gsb0, 0x1",
                                          "5:DEPBAR.LE SB0, 0x1", "6:BAR.SYNC"]
    lines = probe.report(_LISTING, verbose=True)
    assert lines[0].startswith("loop [1..9] 9 instructions: HGMMA 2,") and lines[1].strip().startswith("0:SYNCS |")


_RED_LISTING = """
        /*0000*/                   HGMMA.64x128x16.F32.BF16 R88, R212, gdesc[UR28].tnspB, R88, gsb0 ;  /* 0x0 */
        /*0010*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;             /* 0x0000000000007a02 */
        /*0020*/                   FMUL R152, R152, R6 ;                       /* 0x0000000000007a02 */
        /*0030*/                   REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR4][R18.64], R152 ;  /* 0x0 */
        /*0040*/                   FMUL R154, R154, R6 ;                       /* 0x0000000000007a02 */
        /*0050*/                   REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU desc[UR4][R20.64], R154 ;  /* 0x0 */
        /*0060*/                   ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R3, desc[UR4][R2.64], R5 ;  /* 0x0 */
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;               /* 0x0000000000007a02 */
        /*0080*/              @P1 BRA 0x0000 ;                                 /* 0x0000000000007a02 */
"""


def test_global_reductions_counted_with_their_width(probe):
    """Stage 3e: REDG / ATOMG counted, their full opcodes (the width: F32x2 = 8 bytes a thread) on the loop's line,
    and a run of REDG with no other sync instruction between folded by -v."""
    ins = probe.parse(_RED_LISTING)
    assert probe.loops(ins) == [(0, 8)]
    c = probe.counts(ins)
    assert (c["REDG"], c["ATOMG"], c["BAR.SYNC"]) == (2, 1, 1)
    assert probe.atomic_forms(ins) == {"REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU": 2, "ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU": 1}
    assert probe.positions(ins) == ["0:HGMMA", "1:WARPGROUP.DEPBAR.LE gsb0, 0x1", "3:REDGx2", "6:ATOMG", "7:BAR.SYNC"]
    line = probe.report(_RED_LISTING)[0]
    assert "REDG 2, ATOMG 1" in line and line.endswith("; REDG.E.ADD.F32x2.FTZ.RN.STRONG.GPU 2; "
                                                      "ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU 1")


_LDG_LISTING = """
        /*0000*/               @!P4 LDG.E R61, desc[UR54][R18.64] ;          /* 0x0000000000007a02 */
        /*0010*/                   LDG.E R17, desc[UR54][R20.64] ;            /* 0x0000000000007a02 */
        /*0020*/                   LDG.E R30, desc[UR54][R20.64+0x4] ;        /* 0x0000000000007a02 */
        /*0030*/                   WARPGROUP.ARRIVE ;                         /* 0x0000000000007a02 */
        /*0040*/                   FMUL R61, R61, 1.4426950216293334961 ;     /* 0x0000000000007a02 */
        /*0050*/                   MOV R30, RZ ;                              /* 0x0000000000007a02 */
        /*0060*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR24], RZ, gsb0 ; /* 0x0000000000007a02 */
        /*0070*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;            /* 0x0000000000007a02 */
        /*0080*/                   FADD R57, R24, -R17 ;                      /* 0x0000000000007a02 */
        /*0090*/                   FFMA R58, R25, UR45, -R61 ;                /* 0x0000000000007a02 */
"""


def test_ldg_readers_first_reader_and_the_mma_wait_between(probe):
    # R61's first reader is the FMUL before the wait (its later FFMA reads the product, not the load); R17's the FADD
    # after it; R30 is overwritten before any read, so it has no reader.
    assert probe.ldg_readers(probe.parse(_LDG_LISTING)) == {("FMUL", False): 1, ("FADD", True): 1}
