"""tools/probes/flash_gluon_bwd.py (issue 47's do_bench probe of the Gluon backward) on the CPU: its plan, the
row labels --only selects by, and the dry run (no GPU touched); --rounds with a faked measure."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from kits.probes import probe_module, run_faked

pytest.importorskip("triton.experimental.gluon")  # the plan reads flash_gluon_bwd's configs


#: The rows stage 3d's GPU call times (NOTES.md, "Stage 3d"): at the two sweep shapes cuDNN, the d 128 default
#: (the split), the one-pass kernel and its dq_stages 2 variant; at the leaderboard's d 64 shape cuDNN, the
#: default (one pass) and its dq_stages 2 variant.
STAGE_3D_ONLY = [r"^(1x32x32768x128|4x32x4096x128) (cudnn|ws[+]gluon-bwd( 64x128 w8 s2( dq-stages2)?)?)$",
                 r"^1x16x16384x64 (cudnn|ws[+]gluon-bwd( 64x128 w8 s2 dq-stages2)?)$"]

#: Stage 3e's GPU call (NOTES.md, "Stage 3e"): the same rows with dq "atomic" in place of dq_stages 2 (the one-pass
#: reduce kernel stays as the same-run baseline).
STAGE_3E_ONLY = [r"^(1x32x32768x128|4x32x4096x128) (cudnn|ws[+]gluon-bwd( 64x128 w8 s2( dq-atomic)?)?)$",
                 r"^1x16x16384x64 (cudnn|ws[+]gluon-bwd( 64x128 w8 s2 dq-atomic)?)$"]

#: Stage 4b's GPU call (NOTES.md, "Issue 47, stage 4b"): at the two sweep shapes cuDNN, the d 128 default (the split),
#: the one-pass reduce and dq-atomic kernels and each one's rebuild twin; at d 64 cuDNN, the default and its rebuild.
STAGE_4B_ONLY = [r"^(1x32x32768x128|4x32x4096x128) (cudnn|ws[+]gluon-bwd( 64x128 w8 s2( dq-atomic)?( rebuild)?)?)$",
                 r"^1x16x16384x64 (cudnn|ws[+]gluon-bwd( 64x128 w8 s2 rebuild)?)$"]


#: Stage 4c's GPU call (NOTES.md, "Issue 47, stage 4c (redone)"): at 1x32x32768x128 cuDNN, the default (the split),
#: the split with the statistics prefetched, the rebuilt one-pass reduce kernel, then with prefetch and with
#: refill_first too, the rebuilt dq-atomic kernel and its prefetching twin.
STAGE_4C_ONLY = [r"^1x32x32768x128 (cudnn|ws[+]gluon-bwd( 64x128 w8 s2( dq-triton prefetch| rebuild( prefetch"
                 r"( refill-first)?)?| dq-atomic rebuild( prefetch)?))?)$"]

@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_gluon_bwd") as module:
        yield module


def test_the_plan_has_the_dq_stages2_rows(probe):
    """The one-pass kernel with two dQ staging tiles beside the one-pass kernel at both sweep shapes, and
    beside the default (one pass) at d 64/80/96."""
    labels = [probe.row_label(r) for r in probe.plan(skip_triton=True)]
    assert len(labels) == len(set(labels))
    for shape in ("1x32x32768x128", "4x32x4096x128"):
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2 dq-stages2" in labels
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2" in labels
    for shape in ("1x16x16384x64", "4x16x4096x80", "4x16x4096x96"):
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2 dq-stages2" in labels and f"{shape} ws+gluon-bwd" in labels
    assert not any("dq-stages2" in x for x in labels if x.startswith(("8x32x2048x128", "4x16x8192x128")))


@pytest.mark.parametrize("only, tag", [(STAGE_3D_ONLY, "dq-stages2"), (STAGE_3E_ONLY, "dq-atomic")])
def test_only_keeps_the_matching_rows_in_order(probe, capsys, only, tag):
    """Each stage's --only selection (its GPU call's): cuDNN, the default and the one-pass kernel beside its
    variant at the two d 128 shapes, then at d 64; the dry run prints the same plan."""
    rows = probe.plan(skip_triton=True, only=tuple(only))
    assert [probe.row_label(r) for r in rows] == [
        "1x32x32768x128 cudnn", "1x32x32768x128 ws+gluon-bwd", "4x32x4096x128 cudnn", "4x32x4096x128 ws+gluon-bwd",
        "1x32x32768x128 ws+gluon-bwd 64x128 w8 s2", f"1x32x32768x128 ws+gluon-bwd 64x128 w8 s2 {tag}",
        "4x32x4096x128 ws+gluon-bwd 64x128 w8 s2", f"4x32x4096x128 ws+gluon-bwd 64x128 w8 s2 {tag}",
        "1x16x16384x64 cudnn", "1x16x16384x64 ws+gluon-bwd", f"1x16x16384x64 ws+gluon-bwd 64x128 w8 s2 {tag}"]
    # the estimate counts a compile at a key's first kept row only
    assert sum(r["est"] for r in rows) < 200
    probe.main(["--dry-run", "--skip-triton", *[a for rx in only for a in ("--only", rx)]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("11 rows, estimate") and sum(tag in line for line in out) == 3


def test_dry_run_refuses_an_empty_selection(probe, capsys):
    with pytest.raises(SystemExit):
        probe.main(["--dry-run", "--only", "no such row"])
    assert re.search("no row matches", capsys.readouterr().err)


def test_the_plan_has_the_dq_atomic_rows(probe):
    """Stage 3e: the one-pass kernel with dQ by atomics beside the one-pass kernel at both sweep shapes and beside
    the default (one pass) at d 64/80/96; not at the other d 128 shapes."""
    labels = [probe.row_label(r) for r in probe.plan(skip_triton=True)]
    assert len(labels) == len(set(labels))
    for shape in ("1x32x32768x128", "4x32x4096x128", "1x16x16384x64", "4x16x4096x80", "4x16x4096x96"):
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2 dq-atomic" in labels
    assert not any("dq-atomic" in x for x in labels if x.startswith(("8x32x2048x128", "4x16x8192x128")))
    split = {probe.row_label(r): r["est"] for r in probe.plan(skip_triton=True, only=(r"dq-atomic$",))}
    assert len(split) == 5




def test_carveout_twins_follow_each_ws_gluon_row_only(probe, capsys):
    """--carveout PCT: after each "ws+gluon-bwd" row, its twin at each percent (no new compile in its estimate);
    no other impl gets one; --only selects twins by their label; a bad percent is refused by name."""
    rows = probe.plan(skip_triton=True, carveouts=(72, 86))
    labels = [probe.row_label(r) for r in rows]
    plain = [r for r in rows if r["carveout"] is None]
    assert [probe.row_label(r) for r in plain] == [probe.row_label(r) for r in probe.plan(skip_triton=True)]
    for i, r in enumerate(rows):
        if r["carveout"] is None and r["impl"] == "ws+gluon-bwd":
            assert labels[i + 1:i + 3] == [labels[i] + " carveout72", labels[i] + " carveout86"]
            assert rows[i + 1]["est"] <= r["est"]
    assert all(r["impl"] == "ws+gluon-bwd" for r in rows if r["carveout"] is not None)
    only = probe.plan(skip_triton=True, carveouts=(72,), only=(r"^1x32x32768x128 ws[+]gluon-bwd 64x128 w8 s2 dq-atomic"
                                                               r"( carveout\d+)?$",))
    assert [probe.row_label(r) for r in only] == ["1x32x32768x128 ws+gluon-bwd 64x128 w8 s2 dq-atomic",
                                                  "1x32x32768x128 ws+gluon-bwd 64x128 w8 s2 dq-atomic carveout72"]
    with pytest.raises(SystemExit):
        probe.main(["--dry-run", "--carveout", "101"])
    assert "--carveout: carve-out 101: a percent from 0 to 100" in capsys.readouterr().err


def test_the_plan_has_the_rebuild_rows(probe):
    """Stage 4b: the one-pass kernels with rebuilt descriptors beside the one-pass reduce and dq-atomic rows at both
    sweep shapes, and beside the default (one pass) at d 64/80/96; not at the other d 128 shapes (the ws backward's
    rebuild rows, stage 4d, are at every d 128 table shape: test_the_plan_has_the_ws_backward_candidates)."""
    labels = [probe.row_label(r) for r in probe.plan(skip_triton=True, skip_ws=True)]
    assert len(labels) == len(set(labels))
    for shape in ("1x32x32768x128", "4x32x4096x128"):
        i = labels.index(f"{shape} ws+gluon-bwd 64x128 w8 s2 rebuild")
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2 dq-atomic rebuild" in labels and i > labels.index(
            f"{shape} ws+gluon-bwd 64x128 w8 s2")
    for shape in ("1x16x16384x64", "4x16x4096x80", "4x16x4096x96"):
        assert f"{shape} ws+gluon-bwd 64x128 w8 s2 rebuild" in labels
    assert not any("rebuild" in x for x in labels if x.startswith(("8x32x2048x128", "4x16x8192x128")))
    assert len([x for x in labels if x.endswith(" rebuild")]) == 7


def test_stage_4b_only_keeps_its_rows_in_order(probe, capsys):
    """Stage 4b's --only selection: cuDNN and the default at each shape, the one-pass pair and its rebuild twins at
    the two d 128 shapes, the default's rebuild twin at d 64; the dry run prints the same plan within the budget."""
    rows = probe.plan(skip_triton=True, only=tuple(STAGE_4B_ONLY))
    one = "ws+gluon-bwd 64x128 w8 s2"
    assert [probe.row_label(r) for r in rows] == [
        "1x32x32768x128 cudnn", "1x32x32768x128 ws+gluon-bwd", "4x32x4096x128 cudnn", "4x32x4096x128 ws+gluon-bwd",
        *[f"{s} {one}{v}" for s in ("1x32x32768x128", "4x32x4096x128")
          for v in ("", " dq-atomic", " rebuild", " dq-atomic rebuild")],
        "1x16x16384x64 cudnn", "1x16x16384x64 ws+gluon-bwd", f"1x16x16384x64 {one} rebuild"]
    assert sum(r["est"] for r in rows) < 300
    probe.main(["--dry-run", "--skip-triton", *[a for rx in STAGE_4B_ONLY for a in ("--only", rx)]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("15 rows, estimate") and sum("rebuild" in line for line in out) == 5


def test_stage_4c_only_keeps_its_rows_in_order_within_one_call(probe, capsys):
    """Stage 4c's --only selection at 1x32x32768x128 (the stage-4c candidates are the probe's sweep configs, also at
    4x32x4096x128): cuDNN, the default, the rebuilt one-pass pair and the prefetching configs; the dry run prints
    the same 8 rows, estimated under 230 s (one device call under 300 s with the start)."""
    labels = [probe.row_label(r) for r in probe.plan(skip_triton=True)]
    one = "ws+gluon-bwd 64x128 w8 s2"
    for shape in ("1x32x32768x128", "4x32x4096x128"):
        for v in ("dq-triton prefetch", "rebuild prefetch", "rebuild prefetch refill-first",
                  "dq-atomic rebuild prefetch"):
            assert f"{shape} {one} {v}" in labels
    rows = probe.plan(skip_triton=True, skip_ws=True, only=tuple(STAGE_4C_ONLY))
    s = "1x32x32768x128"
    assert [probe.row_label(r) for r in rows] == [
        f"{s} cudnn", f"{s} ws+gluon-bwd",
        *[f"{s} {one} {v}" for v in ("rebuild", "dq-atomic rebuild", "dq-triton prefetch", "rebuild prefetch",
                                      "rebuild prefetch refill-first", "dq-atomic rebuild prefetch")]]
    assert sum(r["est"] for r in rows) < 230
    probe.main(["--dry-run", "--skip-ws", "--budget-s", "270", *[a for rx in STAGE_4C_ONLY for a in ("--only", rx)]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("8 rows, estimate") and sum("prefetch" in line for line in out) == 4

#: Stage 4d's kernel-table call (NOTES.md, "Issue 47, stage 4d and the ws dispatch (redone)"): at the table's four d
#: 128 shapes our Triton backward (the table's baseline), the Gluon default (the split) and the ws backward's
#: candidates; and its 300-s call: at 1x32x32768x128 cuDNN, the split, the one-pass reduce rebuild and the ws rows.
#: (Its commands' "ws .*" meant the two ws candidates of then: since issue 47's ws refill added three, named here.)
STAGE_4D_TABLE_ONLY = [r"^(1x32x32768x128|4x32x4096x128|8x32x2048x128|4x16x8192x128 full) "
                       r"(triton|ws[+]gluon-bwd|ws[+]gluon-bwd-ws ws 64x128 s2( rebuild)?)$"]
STAGE_4D_ONLY = [r"^1x32x32768x128 (cudnn|ws[+]gluon-bwd( 64x128 w8 s2 rebuild)?|"
                 r"ws[+]gluon-bwd-ws ws 64x128 s2( rebuild)?)$"]
#: Issue 47's ws refill call (NOTES.md, "Issue 47, the ws backward's refill"): at the table's four d 128 shapes cuDNN,
#: the one-pass refill_first config, the ws default and its three refill variants.
WS_REFILL_ONLY = [r"^(1x32x32768x128|4x32x4096x128|8x32x2048x128|4x16x8192x128 full) (cudnn|ws[+]gluon-bwd 64x128 w8 "
                  r"s2 rebuild prefetch refill-first|ws[+]gluon-bwd-ws ws 64x128 s[23] rebuild( release-before-dq)?)$"]


def test_the_plan_has_the_ws_backward_candidates(probe):
    """Stage 4d: one "ws+gluon-bwd-ws" row per flash_gluon_bwd_ws.CANDIDATE_CONFIGS (rebuild, stage 3b's, then issue
    47's ws refill variants, then the row statistics through the ring with two and three slots) at each d 128 table
    shape and (issue 47, ws d 64) at 1x16x16384x64, after the shape's "gluon-bwd" row, then at the d 64 table shapes
    between cuDNN and Triton; none at d 80 / 96, none with --skip-ws."""
    from impl.attention import flash_gluon_bwd_ws as ws

    rows = probe.plan(skip_triton=True)
    labels = [probe.row_label(r) for r in rows]
    assert len(labels) == len(set(labels))
    table = ("1x32x32768x128", "4x32x4096x128", "8x32x2048x128", "4x16x8192x128 full", "1x16x16384x64")
    d64 = ("4x32x4096x64", "4x16x8192x64 full")
    want = [f"{s} ws+gluon-bwd-ws {v}" for s in table + d64 for v in (
        "ws 64x128 s2 rebuild", "ws 64x128 s2", "ws 64x128 s2 rebuild release-before-dq", "ws 64x128 s3 rebuild",
        "ws 64x128 s3 rebuild release-before-dq", "ws 64x128 s2 rebuild prescaled-lse stats-smem",
        "ws 64x128 s3 rebuild prescaled-lse stats-smem", "ws 64x128 s3 rebuild release-before-dq prescaled-lse "
        "stats-smem")]
    assert [x for x in labels if "ws+gluon-bwd-ws" in x] == want
    n = len(ws.CANDIDATE_CONFIGS)
    assert [r["config"] for r in rows if r["impl"] == "ws+gluon-bwd-ws"][:n] == list(ws.CANDIDATE_CONFIGS)
    for s in table:
        assert labels.index(f"{s} ws+gluon-bwd-ws ws 64x128 s2 rebuild") == labels.index(f"{s} gluon-bwd") + 1
    for s in d64:
        assert [x for x in labels if x.startswith(s + " ")] == [f"{s} cudnn", *[x for x in want if x.startswith(s)]]
        assert probe.plan(only=(f"^{s} ",))[-1]["impl"] == "triton"
    assert not any("ws+gluon-bwd-ws" in probe.row_label(r) for r in probe.plan(skip_triton=True, skip_ws=True))
    assert probe.cfg_text(None) == "" and probe.default_config("ws+gluon-bwd-ws", 128) == ws.GluonBwdWsConfig()


#: Issue 47, ws d 64 (NOTES.md, "Issue 47, the ws backward at head dim 64"): the lead's call, at the two d 64 causal
#: shapes cuDNN, the ws default and its refill variants and our Triton backward (the table's baseline); the full
#: shape in a second call.
WS_D64_ONLY = [r"^(1x16x16384x64|4x32x4096x64) (cudnn|triton|ws[+]gluon-bwd-ws ws 64x128 s[23] rebuild"
               r"( release-before-dq)?)$"]
WS_D64_FULL_ONLY = [r"^4x16x8192x64 full (cudnn|triton|ws[+]gluon-bwd-ws ws 64x128 s[23] rebuild"
                    r"( release-before-dq)?)$"]


def test_the_ws_d64_selections_keep_their_rows_within_their_calls(probe, capsys):
    """Issue 47, ws d 64: per d 64 causal shape cuDNN, the four rebuild ws rows, then Triton (its autotuning last),
    under ~170 s of estimate; the full shape's call alike; the d 128 rows' labels unchanged; the dry run prints it."""
    ws = [f"ws+gluon-bwd-ws ws 64x128 {v}" for v in (
        "s2 rebuild", "s2 rebuild release-before-dq", "s3 rebuild", "s3 rebuild release-before-dq")]
    for only, shapes in ((WS_D64_ONLY, ("1x16x16384x64", "4x32x4096x64")), (WS_D64_FULL_ONLY, ("4x16x8192x64 full",))):
        rows = probe.plan(only=tuple(only))
        assert [probe.row_label(r) for r in rows] == [f"{s} {x}" for s in shapes for x in ("cudnn", *ws, "triton")]
        assert sum(r["est"] for r in rows) < 170
    probe.main(["--dry-run", "--only", WS_D64_ONLY[0]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("12 rows, estimate") and sum("ws 64x128 s3 rebuild" in line for line in out) == 4
    d128 = [probe.row_label(r) for r in probe.plan(only=tuple(WS_REFILL_ONLY))]
    assert all(x.split()[0].endswith("x128") for x in d128) and len(d128) == 4 * 5 + 2


def test_stage_4d_selections_keep_their_rows_within_their_calls(probe):
    """The kernel-table call: per table shape the split, the two ws rows and Triton, estimated under its 450-s call;
    the 300-s call: five rows at 1x32x32768x128."""
    rows = probe.plan(only=tuple(STAGE_4D_TABLE_ONLY))
    table = ("1x32x32768x128", "4x32x4096x128", "8x32x2048x128", "4x16x8192x128 full")
    assert [probe.row_label(r) for r in rows] == [
        x for s in table for x in (f"{s} ws+gluon-bwd", f"{s} ws+gluon-bwd-ws ws 64x128 s2 rebuild",
                                   f"{s} ws+gluon-bwd-ws ws 64x128 s2", f"{s} triton")]
    assert sum(r["est"] for r in rows) < 430
    rows = probe.plan(skip_triton=True, only=tuple(STAGE_4D_ONLY))
    assert [probe.row_label(r) for r in rows] == [
        "1x32x32768x128 cudnn", "1x32x32768x128 ws+gluon-bwd", "1x32x32768x128 ws+gluon-bwd-ws ws 64x128 s2 rebuild",
        "1x32x32768x128 ws+gluon-bwd-ws ws 64x128 s2", "1x32x32768x128 ws+gluon-bwd 64x128 w8 s2 rebuild"]
    assert sum(r["est"] for r in rows) < 250


def test_the_ws_refill_selection_keeps_its_rows_within_its_call(probe):
    """Issue 47's ws refill call: per table shape cuDNN and the ws default with its three refill variants, and the
    one-pass refill_first config where the sweep has it (the two causal shapes it was timed at), estimated well
    under the 300-s call."""
    rows = probe.plan(only=tuple(WS_REFILL_ONLY))
    labels = [probe.row_label(r) for r in rows]
    table = ("1x32x32768x128", "4x32x4096x128", "8x32x2048x128", "4x16x8192x128 full")
    ws = [f"ws+gluon-bwd-ws ws 64x128 {v}" for v in (
        "s2 rebuild", "s2 rebuild release-before-dq", "s3 rebuild", "s3 rebuild release-before-dq")]
    refill_first = "ws+gluon-bwd 64x128 w8 s2 rebuild prefetch refill-first"
    assert sorted(labels) == sorted([f"{s} {x}" for s in table for x in ("cudnn", *ws)]
                                    + [f"{s} {refill_first}" for s in table[:2]])
    assert sum(r["est"] for r in rows) < 150


def test_ws_trials_add_each_trial_at_the_head_dims_it_runs_at(probe):
    """Issue 47, ws 128-row query tiles, ws dQ over a consumer's own keys, its ping-pong, the prescaled lse, the
    dQ by one consumer and the handshakes without ds_free: --ws-trials adds a "ws 128x128 s2 rebuild", a "ws 64x128 s2
    rebuild dq-own-keys", a "... dq-own-keys pingpong", a "ws 64x128 s2 rebuild prescaled-lse", a "... dq-own-keys
    prescaled-lse", a "ws 64x128 s2 rebuild prescaled-lse stats-smem dq-one" and a "... stats-smem lean-sync" row
    (flash_gluon_bwd_ws.TRIAL_CONFIGS, in order) after the ws candidates at each d 64 shape, and the prescaled-lse and
    lean-sync rows at each d 128 table shape; without it the plan is unchanged."""
    from impl.attention import flash_gluon_bwd_ws as ws

    plain = [probe.row_label(r) for r in probe.plan(skip_triton=True)]
    rows = probe.plan(skip_triton=True, ws_trials=True)
    labels = [probe.row_label(r) for r in rows]
    label = "ws+gluon-bwd-ws ws 128x128 s2 rebuild"
    own = "ws+gluon-bwd-ws ws 64x128 s2 rebuild dq-own-keys"
    pp = own + " pingpong"
    plse = "ws+gluon-bwd-ws ws 64x128 s2 rebuild prescaled-lse"
    own_plse = own + " prescaled-lse"
    dq_one = "ws+gluon-bwd-ws ws 64x128 s2 rebuild prescaled-lse stats-smem dq-one"
    lean = "ws+gluon-bwd-ws ws 64x128 s2 rebuild prescaled-lse stats-smem lean-sync"
    last = "ws+gluon-bwd-ws ws 64x128 s3 rebuild release-before-dq prescaled-lse stats-smem"  # the last candidate
    shapes = ("1x16x16384x64", "4x32x4096x64", "4x16x8192x64 full")
    d128 = ("1x32x32768x128", "4x32x4096x128", "8x32x2048x128", "4x16x8192x128 full")
    assert [x for x in labels if x not in plain] == [f"{s} {x}" for s in d128 for x in (plse, lean)] + [
        f"{s} {x}" for s in shapes for x in (label, own, pp, plse, own_plse, dq_one, lean)]
    for s in shapes:
        assert labels.index(f"{s} {label}") == labels.index(f"{s} {last}") + 1
        assert labels.index(f"{s} {own}") == labels.index(f"{s} {label}") + 1
        assert labels.index(f"{s} {pp}") == labels.index(f"{s} {own}") + 1
        assert labels.index(f"{s} {own_plse}") == labels.index(f"{s} {plse}") + 1 == labels.index(f"{s} {pp}") + 2
        assert labels.index(f"{s} {dq_one}") == labels.index(f"{s} {own_plse}") + 1
        assert labels.index(f"{s} {lean}") == labels.index(f"{s} {dq_one}") + 1
    for s in d128:
        assert labels.index(f"{s} {lean}") == labels.index(f"{s} {plse}") + 1 == labels.index(f"{s} {last}") + 2
    assert [r["config"] for r in rows if r["config"] in ws.TRIAL_CONFIGS] == [
        ws.TRIAL_CONFIGS[3], ws.TRIAL_CONFIGS[6]] * 4 + list(ws.TRIAL_CONFIGS) * 3
    assert ws.TRIAL_CONFIGS == (ws.GluonBwdWsConfig(block_m=128), ws.GluonBwdWsConfig(dq_own_keys=True),
                                ws.GluonBwdWsConfig(dq_own_keys=True, pingpong=True),
                                ws.GluonBwdWsConfig(prescaled_lse=True),
                                ws.GluonBwdWsConfig(dq_own_keys=True, prescaled_lse=True),
                                ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, dq_one_consumer=True),
                                ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, lean_sync=True))
    # the device command's selection (NOTES.md): cuDNN, the default, own-keys and its ping-pong at each shape
    regex = (r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full) (cudnn|ws[+]gluon-bwd-ws ws 64x128 s2 rebuild"
             r"( dq-own-keys( pingpong)?)?)$")
    both = probe.plan(ws_trials=True, only=(regex,))
    assert [probe.row_label(r) for r in both] == [f"{s} {x}" for s in shapes for x in (
        "cudnn", "ws+gluon-bwd-ws ws 64x128 s2 rebuild", own, pp)]
    assert "ws 128x128" not in " ".join(plain)
    only = probe.plan(ws_trials=True, only=(r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full) (cudnn|ws[+]gluon-bwd-ws "
                                            r"ws (64|128)x128 s2 rebuild)$",))
    assert [probe.row_label(r) for r in only] == [f"{s} {x}" for s in shapes for x in (
        "cudnn", "ws+gluon-bwd-ws ws 64x128 s2 rebuild", label)]
    assert sum(r["est"] for r in only) < 60
    own_only = probe.plan(ws_trials=True, only=(r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full) (cudnn|ws[+]gluon"
                                                r"-bwd-ws ws 64x128 s2 rebuild( dq-own-keys)?)$",))
    assert [probe.row_label(r) for r in own_only] == [f"{s} {x}" for s in shapes for x in (
        "cudnn", "ws+gluon-bwd-ws ws 64x128 s2 rebuild", own)]
    assert sum(r["est"] for r in own_only) < 60



#: Issue 47, stage 4's min_seq (NOTES.md, "Issue 47, stage 4: the kernel table's min_seq"): the lead's short call,
#: at d 128 and 64 causal cuDNN, the ws config the table names there and Triton.
SHORT_ONLY = [r"^4x32x\d+x128 (cudnn|triton|ws[+]gluon-bwd-ws ws 64x128 s3 rebuild release-before-dq)$",
              r"^4x32x\d+x64 (cudnn|triton|ws[+]gluon-bwd-ws ws 64x128 s2 rebuild)$"]


def test_the_short_plan_times_the_ws_candidates_as_called_with_triton_last(probe, capsys):
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS
    rows = probe.plan(short=True)
    shapes = [(4, 32, n, d, causal) for n in probe.SHORT_SEQS for d, causal in probe.SHORT_KEYS]
    assert list(dict.fromkeys(r["shape"] for r in rows)) == shapes and probe.SHORT_SEQS[-1] == 3000
    for s in shapes:
        assert [(r["impl"], r["config"]) for r in rows if r["shape"] == s] == [
            ("cudnn", None), *[("ws+gluon-bwd-ws", c) for c in CANDIDATE_CONFIGS], ("triton", None)]
    assert all(r["timer"] == "called" for r in rows)
    assert not any("timer" in r for r in probe.plan())  # the default plan: do_bench, as before
    rows = probe.plan(short=True, only=tuple(SHORT_ONLY))
    assert len(rows) == 24 and [probe.row_label(r) for r in rows[3:7]] == [
        "4x32x512x64 cudnn", "4x32x512x64 ws+gluon-bwd-ws ws 64x128 s2 rebuild", "4x32x512x64 triton",
        "4x32x1024x128 cudnn"]
    probe.main(["--dry-run", "--short", *[a for rx in SHORT_ONLY for a in ("--only", rx)]])
    assert capsys.readouterr().out.splitlines()[-1].startswith("24 rows, estimate")


def test_a_short_row_runs_the_ws_kernels_through_the_dispatch(probe, monkeypatch):
    """The kernels="auto" path once the table named the ws backward (plans included): the forward at its default
    config, the backward at the row's, as the table's pairs."""
    from impl.attention import flash_dispatch, flash_gluon_ws
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS
    from impl.attention.kernel_table import config_pairs
    calls = []
    monkeypatch.setattr(flash_dispatch, "gluon_forward", lambda *a: calls.append(a) or ("o", "lse", "record"))
    monkeypatch.setattr(flash_dispatch, "gluon_backward", lambda *a: calls.append(a) or ("dq", "dk", "dv", "record"))

    class Q:
        shape = (4, 32, 512, 128)
    fwd, bwd, both = probe._auto_ws(Q(), "k", "v", "do", True, CANDIDATE_CONFIGS[4])
    assert bwd() == ("dq", "dk", "dv") and both() == ("dq", "dk", "dv")
    assert [(c[5], c[6]) for c in calls if len(c) == 7] == [
        ("gluon_ws", config_pairs(flash_gluon_ws.default_config(128)))] * 2
    assert [(c[7].kernels, c[8], c[9]) for c in calls if len(c) == 10] == [
        ("auto", "gluon_ws", config_pairs(CANDIDATE_CONFIGS[4]))] * 2


#: Two rows at one shape: cuDNN (its bwd a difference) and the ws backward's default.
ROUNDS_ONLY = [r"^4x32x4096x128 (cudnn|ws[+]gluon-bwd-ws ws 64x128 s2 rebuild)$"]


def test_rounds_below_one_are_refused_by_name(probe, capsys):
    with pytest.raises(SystemExit):
        probe.main(["--dry-run", "--rounds", "0"])
    assert "argument --rounds: must be >= 1" in capsys.readouterr().err


def test_one_round_is_the_plan_as_before_and_rounds_add_the_timings_without_compiles(probe, capsys):
    argv = ["--dry-run", "--skip-triton", "--only", ROUNDS_ONLY[0]]
    probe.main(argv)
    before = capsys.readouterr().out
    probe.main([*argv, "--rounds", "1"])
    assert capsys.readouterr().out == before and before.splitlines()[-1].endswith("; budget 420 s")
    rows = probe.plan(skip_triton=True, only=tuple(ROUNDS_ONLY))
    later = sum(probe.est_s(r["shape"], r["impl"], False) for r in rows)
    assert later < sum(r["est"] for r in rows)  # the first round pays the ws row's compile
    probe.main([*argv, "--rounds", "3"])
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == before.splitlines()[:-1]
    assert out[-1].startswith(f"2 rows, estimate {sum(r['est'] for r in rows) + 2 * later:.0f} s (3 rounds")


def test_rounds_reverse_the_order_and_report_each_quantitys_median(probe, monkeypatch, tmp_path):
    cudnn, ws = "4x32x4096x128 cudnn", "4x32x4096x128 ws+gluon-bwd-ws ws 64x128 s2 rebuild"
    times = {cudnn: [dict(fwd=1.0, bwd=2.0, **{"fwd+bwd": 3.0}), dict(fwd=1.2, bwd=2.6, **{"fwd+bwd": 3.8}),
                     dict(fwd=1.1, bwd=2.3, **{"fwd+bwd": 3.4})],
             ws: [dict(fwd=1.0, bwd=3.0, **{"fwd+bwd": 4.0}), dict(fwd=0.9, bwd=2.9, **{"fwd+bwd": 3.8}),
                  dict(fwd=1.3, bwd=3.1, **{"fwd+bwd": 4.4})]}
    res, order = run_faked(monkeypatch, probe, ["--only", ROUNDS_ONLY[0], "--rounds", "3"], tmp_path / "bwd.json",
                           times)
    assert order == [cudnn, ws, ws, cudnn, cudnn, ws] and res["rounds"] == 3
    c, w = res["rows"]
    assert c["fwd+bwd_rounds"] == [3.0, 3.8, 3.4] and c["fwd+bwd"] == 3.4 and c["bwd"] == 2.3 and c["rounds"] == 3
    assert (w["fwd"], w["bwd"], w["fwd+bwd"]) == (1.0, 3.0, 4.0) and w["/cudnn"] == pytest.approx(4.0 / 3.4)
    assert "dq_ms_rounds" not in w  # no dQ kernel timed alone


#: Issue 47, ws prescaled lse (NOTES.md): the device command's selection, cuDNN, the ws default and the trial at the
#: three d 64 shapes and at 4x32x4096x128.
WS_PRESCALED_ONLY = [r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full|4x32x4096x128) (cudnn|ws[+]gluon-bwd-ws ws "
                     r"64x128 s2 rebuild( prescaled-lse)?)$"]


def test_the_ws_prescaled_lse_selection_keeps_its_rows_within_its_call(probe, capsys):
    """The prescaled-lse call: per shape cuDNN, the default and the trial (12 rows, the d 128 shape first as the plan
    orders it), 4 rounds estimated under the probe's 120-s budget; the dry run prints them."""
    rows = probe.plan(ws_trials=True, only=tuple(WS_PRESCALED_ONLY))
    shapes = ("4x32x4096x128", "1x16x16384x64", "4x32x4096x64", "4x16x8192x64 full")
    assert [probe.row_label(r) for r in rows] == [f"{s} {x}" for s in shapes for x in (
        "cudnn", "ws+gluon-bwd-ws ws 64x128 s2 rebuild", "ws+gluon-bwd-ws ws 64x128 s2 rebuild prescaled-lse")]
    probe.main(["x.json", "--dry-run", "--ws-trials", "--rounds", "4", "--budget-s", "120",
                "--only", WS_PRESCALED_ONLY[0]])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("12 rows, estimate") and int(out[-1].split()[3]) < 120, out[-1]
    assert sum(line.rstrip().split(" est ")[0].endswith("prescaled-lse") for line in out) == 4


#: Issue 47, the statistics' candidates in the kernel table (NOTES.md): the two long calls' selections, cuDNN, Triton,
#: the table's ws configs (s2 rebuild; s3 rebuild, with and without release-before-dq) and the three statistics
#: candidates at the d 128 table shapes, then at the d 64 ones; and the short call's: Triton and the statistics
#: candidates at every SHORT_KEYS key.
_WS_TABLE_ROWS = (r"(cudnn|triton|ws[+]gluon-bwd-ws ws 64x128 (s2 rebuild|s3 rebuild( release-before-dq)?)"
                  r"( prescaled-lse stats-smem)?)$")
WS_TABLE_D128_ONLY = r"^(1x32x32768x128|4x32x4096x128|8x32x2048x128|4x16x8192x128 full) " + _WS_TABLE_ROWS
WS_TABLE_D64_ONLY = r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full) " + _WS_TABLE_ROWS
WS_TABLE_SHORT_ONLY = (r"^4x32x\d+x(128|64)( full)? (triton|ws[+]gluon-bwd-ws ws 64x128 (s2 rebuild|s3 rebuild"
                       r"( release-before-dq)?) prescaled-lse stats-smem)$")


def test_the_ws_table_calls_select_the_table_configs_beside_the_statistics_candidates(probe, capsys):
    """The long calls: per shape cuDNN, the three table configs, the three statistics candidates and Triton (8 rows;
    not stage 3b's kernel nor s2 release-before-dq, which no table entry names); the short call: at each of the 16
    short shapes (d 64 full too) the three statistics candidates and Triton, as called; the dry runs print them."""
    from impl.attention import flash_gluon_bwd_ws as ws

    stats = [c for c in ws.CANDIDATE_CONFIGS if c.stats_smem]
    table = [ws.GluonBwdWsConfig(), ws.GluonBwdWsConfig(num_stages=3),
             ws.GluonBwdWsConfig(num_stages=3, release_before_dq=True)]
    for regex, n_shapes in ((WS_TABLE_D128_ONLY, 4), (WS_TABLE_D64_ONLY, 3)):
        rows = probe.plan(only=(regex,))
        assert len(rows) == 8 * n_shapes and len({r["shape"] for r in rows}) == n_shapes
        for s in {r["shape"] for r in rows}:
            got = [(r["impl"], r["config"]) for r in rows if r["shape"] == s]
            assert sorted(map(str, got)) == sorted(map(str, [("cudnn", None), ("triton", None)] + [
                ("ws+gluon-bwd-ws", c) for c in table + stats])), s
    rows = probe.plan(short=True, only=(WS_TABLE_SHORT_ONLY,))
    assert len(rows) == 4 * 16 and (4, 32, 512, 64, False) in {r["shape"] for r in rows}
    assert all(r["config"] in stats or r["impl"] == "triton" for r in rows)
    probe.main(["x.json", "--dry-run", "--short", "--only", WS_TABLE_SHORT_ONLY])
    assert capsys.readouterr().out.splitlines()[-1].startswith("64 rows, estimate")


#: Issue 47's d 64 backward trials on the table's d 64 config (the statistics through the ring, two slots), each with
#: its device command's selection (NOTES.md): cuDNN, that config and the trial at the three d 64 shapes. dq_one: ws
#: dQ by one consumer; lean_sync: the handshakes without ds_free.
WS_D64_TRIAL_ONLY = {
    field: (r"^(1x16x16384x64|4x32x4096x64|4x16x8192x64 full) (cudnn|ws[+]gluon-bwd-ws ws 64x128 s2 rebuild "
            rf"prescaled-lse stats-smem( {label})?)$")
    for field, label in (("dq_one_consumer", "dq-one"), ("lean_sync", "lean-sync"))}


@pytest.mark.parametrize("field", list(WS_D64_TRIAL_ONLY))
def test_a_d64_trial_selection_keeps_its_rows_within_its_call(probe, capsys, field):
    """--ws-trials with the trial's selection: the 9 rows (cuDNN, the table's config and the trial, each shape), the
    trial right after its base; the dry run's 5 rounds fit the call's 160-s budget."""
    from impl.attention import flash_gluon_bwd_ws as ws

    only = WS_D64_TRIAL_ONLY[field]
    rows = probe.plan(ws_trials=True, only=(only,))
    base = ws.GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)
    for k in range(3):
        assert [r["config"] for r in rows[3 * k:3 * k + 3]] == [None, base, replace(base, **{field: True})]
        assert len({r["shape"] for r in rows[3 * k:3 * k + 3]}) == 1
    assert len(rows) == 9
    probe.main(["x.json", "--dry-run", "--ws-trials", "--rounds", "5", "--budget-s", "160", "--only", only])
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("9 rows, estimate") and int(out[-1].split()[3]) < 160, out[-1]
