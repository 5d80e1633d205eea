"""FlashAttentionTriton's kernel table (issue 47, stage 4): built from the committed probes, refused when
malformed, consulted only under FlashOptions(kernels="auto") on an sm_90 CUDA device.

CPU: the committed table equals the one tools/probes/kernel_table.py builds from reports/data's probes; bad
entries and settings are refused by name; the pure decision picks the table's Gluon kernel only for a (9, 0)
CUDA capability with an entry; "auto" on CPU tensors (the interpreter) runs the Triton kernels, bit-identical
to "triton", and records that. GPU (marked, H100/H200): with "auto" at each (d, causal) the table has an
entry for, the forward and backward match the float64 reference and the launch records name the kernels the
table names.
"""
from __future__ import annotations

import dataclasses
import json
import os

import pytest
import torch

from impl.attention import FlashAttentionTriton, FlashOptions, LaunchRecorder, kernel_table as kt
from impl.workloads.attention import launch_kernels
from kits.gluon import WS_BWD_CANDIDATE_IDS, needs_gluon
from kits.probes import probe_module

HAS_CUDA = torch.cuda.is_available()
IS_SM90 = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
TRITON_OK = HAS_CUDA or os.environ.get("TRITON_INTERPRET") == "1"
needs_triton = pytest.mark.skipif(not TRITON_OK, reason="no CUDA and TRITON_INTERPRET != 1")


GOOD = dict(direction="fwd", arch="sm_90", d=128, causal=True, dtype="bfloat16", kernel="gluon_ws",
            config={"block_m": 64, "num_stages": 3},
            measured=[dict(probe="p.json", device="H100", shape=[1, 2, 512, 128], ms=1.0, triton_ms=1.5, err=1e-3)])


def _table(*entries) -> kt.KernelTable:
    return kt.table_from_json({"rule": "test", "entries": list(entries)})


# ----------------------------------------------------------------------------- the table and its builder

@needs_gluon
def test_the_committed_table_is_the_one_the_committed_probes_give():
    """Rebuilt from reports/data/*/probes/flash_gluon_{fwd,bwd}_*.json: after new probes, run
    `tools/probes/kernel_table.py build` and commit the table with them."""
    with probe_module("kernel_table") as builder:
        built = kt.dumps(builder.build())
        with open(builder.TABLE_PATH) as f:
            assert f.read() == built
    assert kt.table_from_json(json.loads(built)) == kt.shipped_table()


def _config_classes():
    """(direction, kernel) -> the config dataclass its launcher takes."""
    from impl.attention.flash_gluon_bwd import GluonBwdConfig
    from impl.attention.flash_gluon_bwd_ws import GluonBwdWsConfig
    from impl.attention.flash_gluon_ws import GluonWsConfig
    return {("fwd", "gluon_ws"): GluonWsConfig, ("bwd", "gluon"): GluonBwdConfig,
            ("bwd", "gluon_ws"): GluonBwdWsConfig}


@needs_gluon
def test_each_committed_entry_names_a_config_its_kernel_accepts():
    configs = _config_classes()
    assert set(configs) == {(d, k) for d, kernels in kt.KERNELS.items() for k in kernels}
    assert kt.shipped_table().entries, "the probes gave no entry at all"
    for e in kt.shipped_table().entries:
        configs[e.direction, e.kernel](**dict(e.config))
        assert all(m.ms < m.triton_ms and m.err <= 2e-2 for m in e.measured), e


@needs_gluon
def test_an_entry_from_before_later_config_fields_loads_as_the_same_config():
    """A bwd entry written before GluonBwdConfig grew dq_stages (3d), rebuild (4b), prefetch and refill_first (4c)
    loads, round-trips through the JSON form unchanged, and names the config the current table names (each later
    field at its default, the behaviour the entry was measured with); one that sets the new fields round-trips too."""
    from impl.attention.flash_gluon_bwd import GluonBwdConfig

    old = {"block_m": 64, "block_n": 128, "dq": "triton", "dq_tiles": [128, 64, 3], "num_stages": 2, "num_warps": 8}
    entry = dict(direction="bwd", arch="sm_90", d=128, causal=True, dtype="bfloat16", kernel="gluon", config=old,
                 measured=[dict(probe="p.json", device="H100", shape=[1, 2, 512, 128], ms=1.0, triton_ms=1.5,
                                err=1e-3)])
    table = _table(entry)
    assert kt.table_from_json(kt.table_to_json(table)) == table
    config = GluonBwdConfig(**dict(table.entries[0].config))
    assert config == GluonBwdConfig(dq="triton") and not (config.rebuild or config.prefetch or config.refill_first)
    new = dict(entry, config=dict(old, dq="reduce", dq_stages=1, rebuild=True, prefetch=True, refill_first=True))
    table = _table(new)
    assert kt.table_from_json(json.loads(kt.dumps(table))) == table
    assert GluonBwdConfig(**dict(table.entries[0].config)) == GluonBwdConfig(rebuild=True, prefetch=True,
                                                                            refill_first=True)


@needs_gluon
def test_the_builder_takes_only_same_run_correct_wins(tmp_path):
    """A (d, causal) is in the table only where a run timed both kernels, and a config only if it won at every
    shape each run that timed it timed Triton; a wrong or failed row rules its config out; a backward row
    without config_used (its None config was that commit's default) is not read, nor a carve-out twin."""
    def row(shape, impl, config, ms, err=1e-3, wrong=False, error=None, **extra):
        return dict(shape=shape, impl=impl, config=config, ms=ms, bwd=ms, err=err, wrong=wrong, error=error, **extra)
    s1, s2, s3 = [1, 2, 4096, 128, True], [2, 2, 2048, 128, True], [1, 2, 4096, 64, False]
    fwd = [row(s1, "triton", "autotuned", 2.0), row(s1, "gluon-ws", "2x64x128 s3 pp", 1.5),
           row(s1, "gluon-ws", "2x64x128 s2 pp", 1.0),  # faster here, but not timed at s2: not a candidate
           row(s2, "triton", "autotuned", 1.0), row(s2, "gluon-ws", "2x64x128 s3 pp", 0.9),
           row(s3, "triton", "autotuned", 1.0), row(s3, "gluon-ws", "2x64x128 s3 pp", 0.5, err=0.5, wrong=True),
           row([1, 2, 4096, 80, True], "gluon-ws", "2x64x128 s3 pp", 0.1)]  # no Triton row: no entry
    bwd = [row(s1, "triton", None, 3.0), row(s1, "ws+gluon-bwd", None, 2.0),
           row(s3, "triton", None, 3.0), row(s3, "ws+gluon-bwd", None, 2.0, config_used="64x128 w8 s2"),
           # the same kernel under another shared-memory carve-out: not what the launcher runs, not read
           row(s3, "ws+gluon-bwd", None, 5.0, config_used="64x128 w8 s2", carveout=72)]
    # A later run that times a new config (no ping-pong) beside Triton at one shape: judged by that run alone.
    later = [row(s1, "triton", "autotuned", 2.2), row(s1, "gluon-ws", "2x64x128 s3", 1.1),
             row(s1, "gluon-ws", "2x64x128 s2 pp", 2.5)]  # uncovered in the first run, slower here: out
    probes = tmp_path / "reports" / "data" / "m" / "probes"
    probes.mkdir(parents=True)
    for name, rows in (("flash_gluon_fwd_x.json", fwd), ("flash_gluon_bwd_x.json", bwd), ("flash_gluon_fwd_y.json",
                                                                                            later)):
        (probes / name).write_text(json.dumps(dict(device="GPU", capability=[9, 0], rows=rows)))
    with probe_module("kernel_table") as builder:
        table = builder.build(str(tmp_path))
    assert [(e.direction, e.d, e.causal) for e in table.entries] == [("fwd", 128, True), ("bwd", 64, False)]
    fwd128 = table.entries[0]
    assert dict(fwd128.config)["pingpong"] is False  # 1.1 / 2.2 against the default's (1.5 / 2.0 * 0.9 / 1.0)^0.5
    assert [(m.probe.rsplit("_", 1)[1], m.shape, m.ms, m.triton_ms) for m in fwd128.measured] == [
        ("y.json", (1, 2, 4096, 128), 1.1, 2.2)]
    without_later = tmp_path / "later.json"
    (probes / "flash_gluon_fwd_y.json").rename(without_later)
    with probe_module("kernel_table") as builder:
        fwd128 = builder.build(str(tmp_path)).entries[0]
    assert dict(fwd128.config)["pingpong"] is True and dict(fwd128.config)["num_stages"] == 3
    assert [(m.shape, m.ms, m.triton_ms) for m in fwd128.measured] == [((1, 2, 4096, 128), 1.5, 2.0),
                                                                       ((2, 2, 2048, 128), 0.9, 1.0)]
    assert dict(table.entries[1].config)["dq"] == "reduce"


def _fwd_rows(key_rows, label="2x64x128 s3 pp"):
    """Forward probe rows: per (d, causal), (seq, gluon ms, triton ms) at 4x32xseq; Triton 1.0 unless given."""
    rows = []
    for (d, causal), timings in key_rows.items():
        for n, ms, *triton in timings:
            s = [4, 32, n, d, causal]
            rows += [dict(shape=s, impl="triton", config="autotuned", ms=(triton or [1.0])[0], error=None),
                     dict(shape=s, impl="gluon-ws", config=label, ms=ms, err=1e-3, wrong=False, error=None)]
    return rows


def _build(tmp_path, **files):
    probes = tmp_path / "reports" / "data" / "m" / "probes"
    probes.mkdir(parents=True, exist_ok=True)
    for name, rows in files.items():
        (probes / f"{name}.json").write_text(json.dumps(dict(device="GPU", capability=[9, 0], rows=rows)))
    with probe_module("kernel_table") as builder:
        return builder.build(str(tmp_path))


@needs_gluon
def test_the_builder_sets_min_seq_above_the_measured_losses(tmp_path):
    """An entry holds from the shortest measured length above every loss of its config (0: no loss), with a win
    there; the losses are kept in the entry. Losses at 512 and 1024, wins from 2048: 2048; a loss only at the
    longest shape: no entry; no loss: 0; a loss above a win (1024 over 512): above the loss, the 512 win kept."""
    table = _build(tmp_path, flash_gluon_fwd_short=_fwd_rows({
        (128, True): [(512, 1.2), (1024, 1.0), (2048, 0.9), (4096, 0.8)],  # 1024: a tie is no win
        (64, True): [(4096, 0.9), (16384, 1.1)],
        (128, False): [(512, 0.9), (8192, 0.8)],
        (80, True): [(512, 0.9), (1024, 1.1), (2048, 0.9), (3000, 0.95)]}))
    got = {(e.d, e.causal): e for e in table.entries}
    assert sorted(got) == [(80, True), (128, False), (128, True)]
    assert {k: e.min_seq for k, e in got.items()} == {(80, True): 2048, (128, False): 0, (128, True): 2048}
    causal = got[128, True]
    assert [(m.shape[2], m.ms, m.triton_ms) for m in causal.losses] == [(512, 1.2, 1.0), (1024, 1.0, 1.0)]
    assert [m.shape[2] for m in causal.measured] == [2048, 4096] and causal.losses[0].probe.endswith("short.json")
    assert [m.shape[2] for m in got[80, True].measured] == [512, 2048, 3000]
    assert [m.shape[2] for m in got[80, True].losses] == [1024]
    assert kt.table_from_json(json.loads(kt.dumps(table))) == table
    assert "min_seq" in table.rule


@needs_gluon
def test_the_builder_prefers_the_config_faster_as_called(tmp_path):
    """Of two configs, the one whose calls are faster over the key's shapes wins, Triton counted below min_seq:
    a config 30% faster from 2048 beats one 1% faster everywhere; at 1% faster above, the other."""
    def rows(gain):
        short = _fwd_rows({(128, True): [(512, 1.2), (2048, 1 - gain), (4096, 1 - gain)]})
        return short + [r for r in _fwd_rows({(128, True): [(512, 0.99), (2048, 0.99), (4096, 0.99)]},
                                             label="2x64x128 s3 pp persist") if r["impl"] != "triton"]
    (entry,) = _build(tmp_path, flash_gluon_fwd_a=rows(0.3)).entries
    assert entry.min_seq == 2048 and dict(entry.config)["persistent"] is False
    (entry,) = _build(tmp_path, flash_gluon_fwd_a=rows(0.01)).entries  # (1 x 0.99 x 0.99)^(1/3) > 0.99
    assert entry.min_seq == 0 and dict(entry.config)["persistent"] is True


@needs_gluon
def test_a_config_unmeasured_at_the_keys_short_lengths_holds_from_its_shortest(tmp_path):
    """A config no run timed as short as another run timed the key holds from its own shortest measured length, not
    0 (nothing says it wins shorter), and is scored over the same lengths as one that was: Triton (1) below."""
    def files(persist_ms):
        short = _fwd_rows({(128, True): [(512, 1.2), (4096, 0.8)]})
        long = _fwd_rows({(128, True): [(4096, persist_ms)]}, label="2x64x128 s3 pp persist")
        return dict(flash_gluon_fwd_long=long, flash_gluon_fwd_short=short)
    (entry,) = _build(tmp_path, **files(0.9)).entries  # (1 x 0.8)^0.5 against (1 x 0.9)^0.5
    assert (entry.min_seq, dict(entry.config)["persistent"], len(entry.losses)) == (4096, False, 1)
    (entry,) = _build(tmp_path, **files(0.7)).entries
    assert (entry.min_seq, dict(entry.config)["persistent"], entry.losses) == (4096, True, ())


@needs_gluon
def test_a_short_run_of_one_config_does_not_hand_the_key_to_another(tmp_path):
    """Configs are ranked over the lengths all of them were measured at: a --short run timing only the table's config
    (a loss at 512, a weak win at 3000) sets its min_seq, while the config the long run ranked second, unmeasured at
    3000, does not take the key by its long-shape mean standing in there."""
    long = _fwd_rows({(128, True): [(2048, 0.7), (4096, 0.7)]})
    long += [r for r in _fwd_rows({(128, True): [(2048, 0.75), (4096, 0.75)]}, label="2x64x128 s3 pp persist")
             if r["impl"] != "triton"]
    (entry,) = _build(tmp_path, flash_gluon_fwd_long=long,
                      flash_gluon_fwd_short=_fwd_rows({(128, True): [(512, 1.2), (3000, 0.95)]})).entries
    assert (entry.min_seq, dict(entry.config)["persistent"]) == (2048, False)
    assert [m.shape[2] for m in entry.losses] == [512] and len(entry.measured) == 3


@needs_gluon
def test_set_aside_rows_are_skipped_and_each_names_a_stored_row(tmp_path, monkeypatch):
    """kernel_table.SET_ASIDE: the rows of a run that timed a defect of the path since fixed are not read (run a's
    loss at 512 would set the config's floor; run b's rows stand); each committed key names a probe file and a row
    in it, so none goes stale silently."""
    from impl.attention import flash_gluon_ws
    dyn = "2x64x128 s3 pp persist dynamic"
    probes = tmp_path / "reports" / "data" / "m" / "probes"
    probes.mkdir(parents=True)
    for name, timings in (("a", [(512, 1.2)]), ("b", [(512, 0.9), (2048, 0.9)])):
        rows = _fwd_rows({(128, True): timings}, label=dyn)
        (probes / f"flash_gluon_fwd_{name}.json").write_text(json.dumps(dict(device="GPU", capability=[9, 0],
                                                                              rows=rows)))
    with probe_module("kernel_table") as builder:
        committed = dict(builder.SET_ASIDE)
        config = flash_gluon_ws.GluonWsConfig(persistent=True, dynamic=True)
        monkeypatch.setattr(builder, "_labels", lambda direction: {"gluon_ws": {dyn: config}})  # as if a candidate
        (before,) = builder.build(str(tmp_path)).entries
        monkeypatch.setattr(builder, "SET_ASIDE", {("reports/data/m/probes/flash_gluon_fwd_a.json", "gluon-ws", dyn):
                                                   "why"})
        (after,) = builder.build(str(tmp_path)).entries
    assert (before.min_seq, [m.shape[2] for m in before.losses]) == (2048, [512])
    assert (after.min_seq, after.losses, dict(after.config)["dynamic"]) == (0, (), True)
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for (probe, impl, label), why in committed.items():
        stored = json.load(open(os.path.join(repo, probe)))["rows"]
        assert why and any(r["impl"] == impl and r.get("config") == label for r in stored), probe


def test_min_seq_round_trips_and_is_left_out_at_zero():
    loss = dict(GOOD["measured"][0], shape=[4, 32, 512, 128], ms=2.0, triton_ms=1.0)
    win = dict(GOOD["measured"][0], shape=[4, 32, 2048, 128])
    raw = {"rule": "test", "entries": [dict(GOOD, min_seq=2048, measured=[win], losses=[loss])]}
    table = kt.table_from_json(raw)
    (entry,) = table.entries
    assert entry.min_seq == 2048 and entry.losses[0].shape == (4, 32, 512, 128)
    assert kt.table_to_json(table) == raw and kt.table_from_json(json.loads(kt.dumps(table))) == table
    zero = kt.table_to_json(_table(GOOD))["entries"][0]
    assert "min_seq" not in zero and "losses" not in zero and _table(GOOD).entries[0].min_seq == 0
    assert list(kt.table_to_json(table)["entries"][0]) == ["direction", "arch", "d", "causal", "dtype", "kernel",
                                                           "config", "min_seq", "measured", "losses"]


def test_the_lookup_holds_the_call_length_against_min_seq():
    table = _table(dict(GOOD, min_seq=512))
    (entry,) = table.entries
    got = [table.lookup("fwd", "sm_90", 128, True, "bfloat16", n) for n in (1, 511, 512, 513, 1 << 20)]
    assert got == [None, None, entry, entry, entry]
    assert kt.choose(table, "fwd", "auto", (9, 0), 128, True, "bfloat16", 511) is None
    assert kt.choose(table, "fwd", "auto", (9, 0), 128, True, "bfloat16", 512) is entry


WS_BWD = dict(GOOD, direction="bwd", kernel="gluon_ws", config={"rebuild": True})


@needs_gluon
def test_the_builder_reads_the_ws_backward_rows_as_gluon_ws(tmp_path):
    """Stage 4d: "ws+gluon-bwd-ws" rows are the table's bwd "gluon_ws", competing with "gluon" by the same rule;
    their rows from before config_used (stage 3b's) are not read."""
    def row(shape, impl, ms, config_used=None, config=None):
        return dict(shape=shape, impl=impl, config=config, bwd=ms, err=1e-3, wrong=False, error=None,
                    **({} if config_used is None else dict(config_used=config_used)))
    causal1, causal2, full = [1, 2, 4096, 128, True], [2, 2, 2048, 128, True], [1, 2, 4096, 128, False]
    split = "64x128 w8 s2 dq-triton"
    rows = [row(s, impl, ms, used) for s, impl, ms, used in (
        (causal1, "triton", 3.0, None), (causal1, "ws+gluon-bwd", 2.5, split),
        (causal1, "ws+gluon-bwd-ws", 2.0, "ws 64x128 s2 rebuild"), (causal1, "ws+gluon-bwd-ws", 2.9, "ws 64x128 s2"),
        (causal2, "triton", 1.0, None), (causal2, "ws+gluon-bwd", 0.9, split),
        (causal2, "ws+gluon-bwd-ws", 0.8, "ws 64x128 s2 rebuild"), (causal2, "ws+gluon-bwd-ws", 0.95, "ws 64x128 s2"),
        (full, "triton", 3.0, None), (full, "ws+gluon-bwd", 2.0, split),
        (full, "ws+gluon-bwd-ws", 2.6, "ws 64x128 s2 rebuild"))]
    rows.append(row(full, "ws+gluon-bwd-ws", 0.1))  # stage 3b's row: no config_used, not read
    probes = tmp_path / "reports" / "data" / "m" / "probes"
    probes.mkdir(parents=True)
    (probes / "flash_gluon_bwd_x.json").write_text(json.dumps(dict(device="GPU", capability=[9, 0], rows=rows)))
    with probe_module("kernel_table") as builder:
        table = builder.build(str(tmp_path))
    got = {(e.d, e.causal): (e.kernel, dict(e.config)) for e in table.entries}
    assert got[128, True] == ("gluon_ws", {"rebuild": True, "num_stages": 2, "release_before_dq": False})
    assert got[128, False][0] == "gluon" and got[128, False][1]["dq"] == "triton"
    assert [m.ms for m in table.lookup("bwd", "sm_90", 128, True, "bfloat16", 4096).measured] == [2.0, 0.8]


@needs_gluon
def test_the_builder_makes_a_d64_gluon_ws_backward_entry_from_the_probe_labels(tmp_path):
    """Issue 47, ws d 64: the probe's d 64 ws rows, labelled by its own cfg_text (one label per candidate, distinct),
    give a d 64 causal "gluon_ws" entry with the fastest candidate faster than Triton in the run."""
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS, GluonBwdWsConfig
    with probe_module("flash_gluon_bwd") as probe:
        labels = [probe.cfg_text(c) for c in CANDIDATE_CONFIGS]
    assert len(set(labels)) == len(labels) and labels[3] == "ws 64x128 s3 rebuild"
    shapes = [[1, 16, 16384, 64, True], [4, 32, 4096, 64, True]]
    rows = [dict(shape=s, impl="triton", config=None, bwd=4.0, err=None, wrong=None, error=None) for s in shapes]
    rows += [dict(shape=s, impl="ws+gluon-bwd-ws", config=label, config_used=label, bwd=3.0 + 0.1 * abs(i - 3),
                  err=1e-3, wrong=False, error=None) for s in shapes for i, label in enumerate(labels)]
    probes = tmp_path / "reports" / "data" / "m" / "probes"
    probes.mkdir(parents=True)
    (probes / "flash_gluon_bwd_x.json").write_text(json.dumps(dict(device="GPU", capability=[9, 0], rows=rows)))
    with probe_module("kernel_table") as builder:
        table = builder.build(str(tmp_path))
    (entry,) = table.entries
    assert (entry.direction, entry.d, entry.causal, entry.kernel) == ("bwd", 64, True, "gluon_ws")
    assert GluonBwdWsConfig(**dict(entry.config)) == CANDIDATE_CONFIGS[3] and "block_m" not in dict(entry.config)


@needs_gluon
def test_the_builder_leaves_later_fields_out_at_their_default():
    """GluonBwdWsConfig.block_m (issue 47, 128-row query tiles) came after the table's ws entries: an entry names it
    only when it is not 64, so the entries of the configs from before it are unchanged; 128 is kept."""
    from impl.attention.flash_gluon_bwd_ws import GluonBwdWsConfig
    from impl.attention.flash_gluon_ws import GluonWsConfig
    with probe_module("kernel_table") as builder:
        assert dict(builder._config_pairs(GluonBwdWsConfig())) == {"rebuild": True, "num_stages": 2,
                                                                   "release_before_dq": False}
        wide = dict(builder._config_pairs(GluonBwdWsConfig(block_m=128)))
        assert wide["block_m"] == 128 and GluonBwdWsConfig(**wide) == GluonBwdWsConfig(block_m=128)
        assert dict(builder._config_pairs(GluonWsConfig()))["block_m"] == GluonWsConfig().block_m  # the forward's
        assert "lpt" not in dict(builder._config_pairs(GluonWsConfig()))  # the forward's trial grid order (issue 47)
        assert GluonWsConfig(**dict(builder._config_pairs(GluonWsConfig(lpt=True)))) == GluonWsConfig(lpt=True)
        assert "early_q" not in dict(builder._config_pairs(GluonWsConfig()))  # the forward's early-Q trial
        early = GluonWsConfig(persistent=True, early_q=True)
        assert GluonWsConfig(**dict(builder._config_pairs(early))) == early
        assert "o_regs" not in dict(builder._config_pairs(GluonWsConfig()))  # early_q's A/B (its store alone)
        regs = GluonWsConfig(persistent=True, o_regs=True)
        assert GluonWsConfig(**dict(builder._config_pairs(regs))) == regs
        own = GluonBwdWsConfig(dq_own_keys=True)  # issue 47, ws own-keys dQ and its ping-pong: named only when set
        assert "pingpong" not in dict(builder._config_pairs(own))
        pp = GluonBwdWsConfig(dq_own_keys=True, pingpong=True)
        assert dict(builder._config_pairs(pp))["pingpong"] is True
        assert GluonBwdWsConfig(**dict(builder._config_pairs(pp))) == pp
        assert "prescaled_lse" not in dict(builder._config_pairs(pp))  # issue 47, ws prescaled lse: only when set
        for plse in (GluonBwdWsConfig(prescaled_lse=True), GluonBwdWsConfig(dq_own_keys=True, prescaled_lse=True)):
            assert dict(builder._config_pairs(plse))["prescaled_lse"] is True
            assert GluonBwdWsConfig(**dict(builder._config_pairs(plse))) == plse
            assert "stats_smem" not in dict(builder._config_pairs(plse))  # issue 47, ws stats_smem: only when set
        stats = GluonBwdWsConfig(prescaled_lse=True, stats_smem=True)
        assert dict(builder._config_pairs(stats))["stats_smem"] is True
        assert GluonBwdWsConfig(**dict(builder._config_pairs(stats))) == stats
        assert "dq_one_consumer" not in dict(builder._config_pairs(stats))  # issue 47, ws dQ by one consumer
        one = GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, dq_one_consumer=True)
        assert dict(builder._config_pairs(one))["dq_one_consumer"] is True
        assert GluonBwdWsConfig(**dict(builder._config_pairs(one))) == one
        assert "lean_sync" not in dict(builder._config_pairs(stats))  # issue 47, the d 64 backward's handshakes
        lean = GluonBwdWsConfig(prescaled_lse=True, stats_smem=True, lean_sync=True)
        assert dict(builder._config_pairs(lean))["lean_sync"] is True
        assert GluonBwdWsConfig(**dict(builder._config_pairs(lean))) == lean


@needs_gluon
def test_a_gluon_ws_backward_entry_round_trips_to_its_config():
    """JSON -> table -> JSON is the identity, and the entry's config is the launcher's typed config, for each ws
    candidate (issue 47's ws refill variants too) and the prescaled-lse trials (stats_smem too); an entry from before
    num_stages / release_before_dq (rebuild alone) loads as the same config with those at their defaults."""
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS, TRIAL_CONFIGS, GluonBwdWsConfig
    for config in CANDIDATE_CONFIGS + tuple(c for c in TRIAL_CONFIGS if c.prescaled_lse):
        raw = {"rule": "test", "entries": [dict(WS_BWD, config=dataclasses.asdict(config))]}
        table = kt.table_from_json(raw)
        assert kt.table_to_json(table) == raw and kt.table_from_json(json.loads(kt.dumps(table))) == table
        (entry,) = table.entries
        assert GluonBwdWsConfig(**dict(entry.config)) == config
        assert entry.config == tuple(sorted(dataclasses.asdict(config).items()))
    for rebuild in (True, False):
        (entry,) = kt.table_from_json({"rule": "test", "entries": [dict(WS_BWD, config={"rebuild": rebuild})]}).entries
        assert GluonBwdWsConfig(**dict(entry.config)) == GluonBwdWsConfig(rebuild=rebuild, num_stages=2,
                                                                          release_before_dq=False)


@pytest.mark.parametrize("change, match", [
    (dict(kernel="gluon_tlx"), "unknown kernel 'gluon_tlx'"),
    (dict(kernel="triton"), "unknown kernel 'triton'.*no entry means triton"),
    (dict(direction="sideways"), "unknown direction 'sideways'"),
    (dict(direction="bwd", kernel="gluon_tlx"), "unknown kernel 'gluon_tlx'.*'gluon', 'gluon_ws'"),
    (dict(direction="bwd", d=80, config={"rebuild": True}), "kernel 'gluon_ws' runs at head dims \\(64, 128\\) only"),
    (dict(arch="sm_100"), "runs on sm_90 only, not sm_100"),
    (dict(d=112), "head dim must be one of"),
    (dict(dtype="float32"), "dtype one of"),
    (dict(measured=[]), "needs measurements"),
    (dict(measured=[dict(GOOD["measured"][0], ms=2.0)]), "faster than triton"),
    (dict(speed="fast"), "unknown field"),
    (dict(min_seq=-1), "min_seq must be an int >= 0"),
    (dict(min_seq=1024), "needs a measured win at a sequence length >= min_seq 1024"),
    (dict(min_seq=256, losses=[dict(GOOD["measured"][0], shape=[1, 2, 256, 128], ms=2.0)]), "shorter than min_seq"),
    (dict(min_seq=512, losses=[dict(GOOD["measured"][0], shape=[1, 2, 256, 128])]), "not faster than triton"),
])
def test_a_bad_table_entry_is_refused_by_name(change, match):
    with pytest.raises(ValueError, match=match):
        _table(dict(GOOD, **change))


def test_a_table_with_two_entries_for_one_key_is_refused():
    with pytest.raises(ValueError, match="more than one entry"):
        _table(GOOD, GOOD)


def test_an_unknown_kernels_setting_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown flash kernels setting 'gluon'"):
        FlashOptions(kernels="gluon")
    assert FlashOptions().kernels == "triton"  # "auto" becomes the default after its GPU run (NOTES.md)


# ----------------------------------------------------------------------------- the decision

def test_the_decision_picks_gluon_only_for_sm90_cuda_with_an_entry():
    table = _table(GOOD)
    (entry,) = table.entries
    assert kt.choose(table, "fwd", "auto", (9, 0), 128, True, "bfloat16", 1) is entry  # min_seq 0: any length
    misses = [("fwd", "triton", (9, 0), 128, True, "bfloat16"),  # not asked for
              ("fwd", "auto", None, 128, True, "bfloat16"),  # not a CUDA tensor
              ("fwd", "auto", (8, 0), 128, True, "bfloat16"), ("fwd", "auto", (10, 0), 128, True, "bfloat16"),
              ("fwd", "auto", (9, 0), 64, True, "bfloat16"), ("fwd", "auto", (9, 0), 128, False, "bfloat16"),
              ("fwd", "auto", (9, 0), 128, True, "float16"), ("bwd", "auto", (9, 0), 128, True, "bfloat16")]
    assert [kt.choose(table, *m, 4096) for m in misses] == [None] * len(misses)


@needs_gluon
def test_the_backward_dispatch_runs_the_kernel_its_entry_names(monkeypatch):
    """A table (synthetic) whose d 128 causal bf16 backward is "gluon_ws" and full is "gluon": on an sm_90 device
    (the capability stubbed; the launchers stubbed, CPU tensors) each call reaches its own launcher with the
    entry's typed config and records its kernel; another capability, dtype or head dim, or kernels "triton",
    chooses nothing (Triton)."""
    from impl.attention import flash_dispatch, flash_gluon_bwd, flash_gluon_bwd_ws
    split = {"block_m": 64, "block_n": 128, "dq": "triton", "num_stages": 2, "num_warps": 8}
    table = _table(WS_BWD, dict(WS_BWD, causal=False, kernel="gluon", config=split))
    capability = [(9, 0)]
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: table)
    monkeypatch.setattr(flash_dispatch, "_capability", lambda t: capability[0])
    calls = []

    def launcher(name):
        def run(q, k, v, o, do, lse, causal, config, *rest):
            calls.append((name, causal, config))
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        return run

    monkeypatch.setattr(flash_gluon_bwd_ws, "flash_gluon_backward_ws", launcher("ws"))
    monkeypatch.setattr(flash_gluon_bwd, "flash_gluon_backward", launcher("gluon"))
    q, k, v, o, do = (torch.randn(1, 2, 40, 128).to(torch.bfloat16) for _ in range(5))
    lse = torch.zeros(1, 2, 40)
    rec = LaunchRecorder()
    opts = FlashOptions(kernels="auto", recorder=rec)
    for causal in (True, False):
        *grads, record = flash_dispatch.backward(q, k, v, o, do, lse, causal, opts)
        assert record.kernel == rec.last["bwd"].kernel == ("gluon_ws" if causal else "gluon")
        assert launch_kernels(rec) == {"bwd": record.kernel}  # what the perf rows' details["kernels"] say
    assert calls == [("ws", True, flash_gluon_bwd_ws.GluonBwdWsConfig(rebuild=True)),
                     ("gluon", False, flash_gluon_bwd.GluonBwdConfig(dq="triton"))]
    choice = lambda x, causal=True, o=opts: flash_dispatch._gluon_choice("bwd", x, x, causal, o, lambda: None)  # noqa
    assert choice(q).kernel == "gluon_ws"
    misses = [choice(q.half()), choice(q[..., :64]), choice(q, o=FlashOptions(kernels="triton"))]
    capability[0] = (8, 0)
    assert misses + [choice(q)] == [None] * 4


def test_the_shipped_table_sends_the_d128_causal_bf16_forward_to_gluon_ws():
    shipped = kt.shipped_table()
    assert kt.choose(shipped, "fwd", "auto", (9, 0), 128, True, "bfloat16", 4096).kernel == "gluon_ws"
    assert kt.choose(shipped, "fwd", "auto", (8, 0), 128, True, "bfloat16", 4096) is None


@needs_triton
def test_auto_off_cuda_runs_the_triton_kernels_and_records_it():
    """Where the table has no entry (fp32; on a GPU too) or the tensors are off CUDA (the interpreter), "auto"
    is "triton": the same outputs and gradients bit for bit, and the launch records say triton; CPU tensors
    stay on Triton also at a (d, causal, dtype) the table sends to Gluon on an H100."""
    from impl.attention import flash_dispatch
    device = "cuda" if HAS_CUDA else "cpu"
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 2, 40, 64, generator=g).to(device) for _ in range(4))
    out = {}
    for kernels in ("triton", "auto"):
        rec = LaunchRecorder()
        opts = FlashOptions(autotune=False, kernels=kernels, recorder=rec)
        qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
        o = FlashAttentionTriton.apply(qi, ki, vi, True, opts)
        o.backward(do)
        out[kernels] = (o, qi.grad, ki.grad, vi.grad)
        assert (rec.last["fwd"].kernel, rec.last["bwd"].kernel) == ("triton", "triton")
        assert launch_kernels(rec) == {"fwd": "triton", "bwd": "triton"}
    assert all(torch.equal(a, b) for a, b in zip(out["triton"], out["auto"]))
    bf16 = q.cpu().to(torch.bfloat16)  # the shipped table has d 64 causal bf16: still Triton off CUDA
    assert flash_dispatch._gluon_choice("fwd", bf16, bf16, True, FlashOptions(kernels="auto"), lambda: None) is None


@needs_triton
def test_auto_reaches_the_dispatch_through_torch_compile():
    """The custom ops (torch.compile's boundary) dispatch as the eager call does: fp32, no entry, Triton."""
    device = "cuda" if HAS_CUDA else "cpu"
    rec = LaunchRecorder()
    opts = FlashOptions(autotune=False, kernels="auto", recorder=rec)
    q, k, v, do = (torch.randn(1, 2, 24, 16, generator=torch.Generator().manual_seed(i)).to(device) for i in range(4))
    compiled = torch.compile(lambda a, b, c: FlashAttentionTriton.apply(a, b, c, True, opts), fullgraph=True,
                             backend="aot_eager")
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    compiled(*leaves).backward(do)
    assert rec.count == 2 and (rec.last["fwd"].kernel, rec.last["bwd"].kernel) == ("triton", "triton")


def test_the_kernel_table_keeps_gluon_off_the_default_paths():
    """The table and the dispatch are pure Python until a call picks a Gluon kernel."""
    from kits.sm90_compile import run_without_interpreter
    out = run_without_interpreter(
        "import sys, impl.attention, impl.attention.flash_triton, impl.attention.flash_dispatch\n"
        "impl.attention.kernel_table.shipped_table()\n"
        "print(*(f'impl.attention.{m}' in sys.modules for m in ('flash_gluon_ws', 'flash_gluon_bwd', "
        "'flash_gluon_common')))")
    assert out.split() == ["False", "False", "False"]


# ----------------------------------------------------------------------------- GPU (unrun until a GPU session)

def _table_keys():
    return sorted({(e.d, e.causal) for e in kt.shipped_table().entries if e.arch == "sm_90"})


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
@pytest.mark.parametrize("shape", [(2, 3, 300), (1, 4, 1029), (1, 2, 4096)], ids=["2x3x300", "1x4x1029", "1x2x4096"])
@pytest.mark.parametrize("d, causal", _table_keys(), ids=lambda x: str(x))
def test_auto_on_sm90_matches_the_reference_and_records_the_table_kernels(d, causal, shape):
    """Each entry's kernel at or above its min_seq, Triton below (1x2x4096: at or above most floors, NOTES.md)."""
    from test_attention import reference, rel_err, tolerance
    dtype = torch.bfloat16
    g = torch.Generator().manual_seed(d)
    q, k, v, do = (torch.randn(*shape, d, generator=g).to("cuda", dtype) for _ in range(4))
    rec = LaunchRecorder()
    qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
    # autotune off: the Triton halves (where the table has no entry) run one config, as in test_attention
    o = FlashAttentionTriton.apply(qi, ki, vi, causal, FlashOptions(autotune=False, kernels="auto", recorder=rec))
    o.backward(do)
    ref_o, _, dq, dk, dv = reference(q, k, v, causal, do, o_saved=o)
    tol = tolerance(dtype, "cuda")
    errs = {name: rel_err(got, ref) for name, got, ref in
            (("o", o, ref_o), ("dq", qi.grad, dq), ("dk", ki.grad, dk), ("dv", vi.grad, dv))}
    assert all(e < tol for e in errs.values()), errs
    table = kt.shipped_table()
    for direction in ("fwd", "bwd"):
        entry = table.lookup(direction, "sm_90", d, causal, "bfloat16", shape[2])
        assert rec.last[direction].kernel == (entry.kernel if entry else "triton"), direction


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the table's Gluon kernels run on sm_90 (H100/H200)")
def test_auto_on_sm90_takes_triton_where_the_gluon_launcher_refuses(monkeypatch):
    """fp32 and a head-dim stride the TMA cannot take: no Gluon launch, the Triton kernels' result (the table's
    floors set to 0: these short calls would reach the launcher but for them)."""
    from impl.attention import flash_dispatch
    shipped = kt.shipped_table()
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: kt.KernelTable(
        tuple(dataclasses.replace(e, min_seq=0, losses=()) for e in shipped.entries), shipped.rule))
    d = _table_keys()[0][0]
    rec = LaunchRecorder()
    q = torch.randn(1, 2, 128, d, device="cuda")
    opts = FlashOptions(autotune=False, kernels="auto", recorder=rec)
    FlashAttentionTriton.apply(q, q, q, True, opts)
    assert rec.last["fwd"].kernel == "triton"
    x = torch.randn(1, 2, 128, 2 * d, device="cuda", dtype=torch.bfloat16)[..., ::2]
    FlashAttentionTriton.apply(x, x, x, True, opts)
    assert rec.last["fwd"].kernel == "triton"


@needs_gluon
def test_the_ws_backward_head_dims_are_the_kernels():
    """Issue 47, ws d 64: the table accepts gluon_ws backward entries at the head dims its launcher accepts."""
    from impl.attention import flash_gluon_bwd_ws as ws

    assert kt.KERNEL_HEAD_DIMS[("bwd", "gluon_ws")] == ws.HEAD_DIMS == (64, 128)
    table = _table(*(dict(WS_BWD, d=d) for d in ws.HEAD_DIMS))
    kernels = [kt.choose(table, "bwd", "auto", (9, 0), d, True, "bfloat16", 4096).kernel for d in ws.HEAD_DIMS]
    assert kernels == ["gluon_ws"] * 2


WS_GPU_PARAMS = [
    pytest.mark.gpu,
    pytest.mark.skipif(not IS_SM90, reason="the ws backward runs on sm_90 (H100/H200)"),
    pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"]),
    pytest.mark.parametrize("shape", [(2, 3, 300), (1, 4, 1029), (1, 2, 4096)],
                            ids=["2x3x300", "1x4x1029", "1x2x4096"]),
    pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"]),
    pytest.mark.parametrize("config", range(len(WS_BWD_CANDIDATE_IDS)), ids=WS_BWD_CANDIDATE_IDS),
]


def _gpu_ws_params(test):
    for mark in reversed(WS_GPU_PARAMS):
        test = mark(test)
    return test


@_gpu_ws_params
def test_auto_on_sm90_runs_the_ws_backward_where_the_table_names_it(config, causal, shape, dtype, monkeypatch):
    """Stage 4d through the public path: a table (the shipped one with its d 128 backward entry for this key
    replaced by "gluon_ws" with one of the ws CANDIDATE_CONFIGS, in order: issue 47's ws refill variants too) sends
    FlashAttentionTriton's backward to the ws kernel; gradients match the float64 reference at ragged lengths, and
    the launch record names gluon_ws and the config."""
    _auto_ws_backward(config, causal, shape, dtype, 128, monkeypatch)


@_gpu_ws_params
def test_auto_on_sm90_runs_the_d64_ws_backward_where_the_table_names_it(config, causal, shape, dtype, monkeypatch):
    """Issue 47, ws d 64: the same through a table whose d 64 backward entry for this key is "gluon_ws"."""
    _auto_ws_backward(config, causal, shape, dtype, 64, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the ws backward runs on sm_90 (H100/H200)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("shape", [(2, 3, 300), (1, 4, 1029), (1, 2, 4096)], ids=["2x3x300", "1x4x1029", "1x2x4096"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_on_sm90_runs_the_d64_ws_backward_m128_where_the_table_names_it(causal, shape, dtype, monkeypatch):
    """Issue 47, ws 128-row query tiles (TRIAL_CONFIGS: never in the shipped table): a d 64 entry naming it (its JSON
    config with block_m 128) runs it through the public path."""
    from impl.attention.flash_gluon_bwd_ws import TRIAL_CONFIGS, GluonBwdWsConfig

    config = GluonBwdWsConfig(block_m=128)
    assert config in TRIAL_CONFIGS
    _auto_ws_backward(config, causal, shape, dtype, 64, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the ws backward runs on sm_90 (H100/H200)")
@pytest.mark.parametrize("shape", [(2, 3, 300), (1, 4, 1029), (1, 2, 4096)], ids=["2x3x300", "1x4x1029", "1x2x4096"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_on_sm90_runs_the_d64_ws_backward_own_keys_where_the_table_names_it(causal, shape, monkeypatch):
    """Issue 47, ws dQ over a consumer's own keys (TRIAL_CONFIGS: never in the shipped table): a d 64 entry naming it
    (its JSON config with dq_own_keys) runs it through the public path, bf16."""
    from impl.attention.flash_gluon_bwd_ws import TRIAL_CONFIGS, GluonBwdWsConfig

    config = GluonBwdWsConfig(dq_own_keys=True)
    assert config in TRIAL_CONFIGS
    _auto_ws_backward(config, causal, shape, torch.bfloat16, 64, monkeypatch)


@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the ws backward runs on sm_90 (H100/H200)")
@pytest.mark.timeout(120)  # a turn protocol that hangs fails here
@pytest.mark.parametrize("shape", [(2, 3, 300), (1, 4, 1029), (1, 2, 4096)], ids=["2x3x300", "1x4x1029", "1x2x4096"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_on_sm90_runs_the_d64_ws_backward_own_keys_pingpong_where_the_table_names_it(causal, shape,
                                                                                          monkeypatch):
    """Issue 47, ws ping-pong (TRIAL_CONFIGS): a d 64 entry whose JSON config has dq_own_keys and pingpong runs it
    through the public path, bf16."""
    from impl.attention.flash_gluon_bwd_ws import TRIAL_CONFIGS, GluonBwdWsConfig

    config = GluonBwdWsConfig(dq_own_keys=True, pingpong=True)
    assert config in TRIAL_CONFIGS
    _auto_ws_backward(config, causal, shape, torch.bfloat16, 64, monkeypatch)



@pytest.mark.gpu
@pytest.mark.skipif(not IS_SM90, reason="the ws backward runs on sm_90 (H100/H200)")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", [(2, 3, 301), (1, 2, 4096)], ids=["2x3x301", "1x2x4096"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128], ids=["d64", "d128"])
@pytest.mark.parametrize("fields", [dict(prescaled_lse=True), dict(prescaled_lse=True, stats_smem=True)],
                         ids=["prescaled_lse", "stats_smem"])
def test_auto_on_sm90_runs_the_ws_backward_statistics_trials_where_the_table_names_them(fields, d, causal, shape,
                                                                                        monkeypatch):
    """Issue 47, ws prescaled lse (TRIAL_CONFIGS) and ws stats in shared memory (CANDIDATE_CONFIGS): an entry whose
    JSON config has prescaled_lse (and stats_smem) runs it through the public path, bf16: the preprocessing launch's
    −lse·log2 e buffer among the launcher's (stats_smem: both statistics padded, 301 query rows in rows of 304);
    called twice, the second through the call plan (a backward plan with a fifth buffer, its buffers in the
    launcher's shapes)."""
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS, TRIAL_CONFIGS, GluonBwdWsConfig

    config = GluonBwdWsConfig(**fields)
    assert config in (CANDIDATE_CONFIGS if config.stats_smem else TRIAL_CONFIGS)
    for _ in range(2):
        _auto_ws_backward(config, causal, shape, torch.bfloat16, d, monkeypatch)


def _auto_ws_backward(config, causal, shape, dtype, d, monkeypatch):
    """FlashAttentionTriton with kernels "auto" under the shipped table whose (bwd, d, causal, dtype) entry is
    gluon_ws at CANDIDATE_CONFIGS[config] (or config itself): the record names it, the gradients match the float64
    reference."""
    from test_attention import reference, rel_err, tolerance

    from impl.attention import flash_dispatch
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS
    if isinstance(config, int):
        assert len(CANDIDATE_CONFIGS) == len(WS_BWD_CANDIDATE_IDS)
        config = CANDIDATE_CONFIGS[config]
    name = str(dtype).removeprefix("torch.")
    ws = dict(WS_BWD, d=d, causal=causal, dtype=name, config=dataclasses.asdict(config))
    shipped = kt.table_to_json(kt.shipped_table())
    others = [e for e in shipped["entries"] if (e["direction"], e["d"], e["causal"], e["dtype"]) !=
              ("bwd", d, causal, name)]
    monkeypatch.setattr(flash_dispatch, "shipped_table", lambda: _table(*others, ws))
    g = torch.Generator().manual_seed(shape[-1])
    q, k, v, do = (torch.randn(*shape, d, generator=g).to("cuda", dtype) for _ in range(4))
    rec = LaunchRecorder()
    qi, ki, vi = (x.clone().requires_grad_(True) for x in (q, k, v))
    o = FlashAttentionTriton.apply(qi, ki, vi, causal, FlashOptions(autotune=False, kernels="auto", recorder=rec))
    o.backward(do)
    assert rec.last["bwd"].kernel == "gluon_ws"
    assert rec.last["bwd"].configs == (("bwd", repr(config)),)
    ref_o, _, dq, dk, dv = reference(q, k, v, causal, do, o_saved=o)
    tol = tolerance(dtype, "cuda")
    errs = {name: rel_err(got, ref) for name, got, ref in
            (("o", o, ref_o), ("dq", qi.grad, dq), ("dk", ki.grad, dk), ("dv", vi.grad, dv))}
    assert all(e < tol for e in errs.values()), errs


def test_options_with_auto_compare_unequal_to_triton():
    """kernels is part of the options' value: plans and caches keyed on options keep the two apart."""
    assert FlashOptions(kernels="auto") != FlashOptions() and dataclasses.replace(
        FlashOptions(kernels="auto"), kernels="triton") == FlashOptions()


def _public_bwd_rows(timings, kernel="gluon_ws"):
    """Backward --short rows at 4x32xseq d 128 causal: (seq, ws bwd, Triton bwd, ws public, Triton public), the
    public times left out where None; the ws row's public call ran `kernel` for the backward."""
    label, rows = "ws 64x128 s3 rebuild release-before-dq prescaled-lse stats-smem", []
    for n, bwd, triton_bwd, public, triton_public in timings:
        s = [4, 32, n, 128, True]
        rows += [dict(shape=s, impl="triton", config=None, bwd=triton_bwd, err=1e-3, wrong=False, error=None,
                      timer="called", **({} if triton_public is None else dict(
                          public_fwd_bwd=triton_public, public_kernels={"fwd": "triton", "bwd": "triton"}))),
                 dict(shape=s, impl="ws+gluon-bwd-ws", config=label, config_used=label, bwd=bwd, err=1e-3,
                      wrong=False, error=None, timer="called", **({} if public is None else dict(
                          public_fwd_bwd=public, public_kernels={"fwd": "triton", "bwd": kernel})))]
    return rows


@needs_gluon
def test_the_builder_judges_a_length_by_the_public_call_where_both_rows_have_it(tmp_path):
    """Issue 47's public call (tools/probes/public_call.py): 1024, a win by the backward alone (0.8 vs 1.0) but a
    loss as FlashAttentionTriton.apply calls it (1.1 vs 1.0), is a loss, which moves min_seq from 1024 to 2048; the
    entry's measurements are the public times and say so, as the rule does. A run without the field (before it)
    builds as before; a ws row whose public call ran Triton (its launcher refused) is judged by its own time."""
    timings = [(512, 1.2, 1.0, 1.3, 1.0), (1024, 0.8, 1.0, 1.1, 1.0), (2048, 0.7, 1.0, 0.9, 1.0)]
    with probe_module("kernel_table") as builder:
        (entry,) = _build(tmp_path / "public", flash_gluon_bwd_p=_public_bwd_rows(timings)).entries
        assert entry.min_seq == 2048
        assert [(m.shape[2], m.ms, m.triton_ms, m.quantity) for m in entry.losses] == [
            (512, 1.3, 1.0, "public_fwd_bwd"), (1024, 1.1, 1.0, "public_fwd_bwd")]
        assert [(m.shape[2], m.ms, m.quantity) for m in entry.measured] == [(2048, 0.9, "public_fwd_bwd")]
        table = _build(tmp_path / "public")
        assert table.rule == builder.RULE + builder.RULE_PUBLIC
        assert kt.table_from_json(json.loads(kt.dumps(table))) == table
        assert json.loads(kt.dumps(table))["entries"][0]["losses"][1]["quantity"] == "public_fwd_bwd"
        old = [(n, bwd, triton, None, None) for n, bwd, triton, _, _ in timings]
        (entry,) = (table := _build(tmp_path / "old", flash_gluon_bwd_o=_public_bwd_rows(old))).entries
        assert entry.min_seq == 1024 and table.rule == builder.RULE
        assert [(m.shape[2], m.ms, m.quantity) for m in entry.losses] == [(512, 1.2, "")]
        assert "quantity" not in json.dumps(kt.table_to_json(table))  # old runs: the table's format as before
        refused = _public_bwd_rows(timings, kernel="triton")
        (entry,) = _build(tmp_path / "refused", flash_gluon_bwd_r=refused).entries
        assert entry.min_seq == 1024 and {m.quantity for m in entry.measured + entry.losses} == {""}
        judged = {}
        builder.build(str(tmp_path / "public"), judged)
        assert judged == {"public_fwd_bwd": 3} and "public_fwd_bwd (the public call as called): 3" in \
            builder.judged_text(judged)


@needs_gluon
def test_the_builder_prints_which_quantity_judged_the_committed_table(capsys):
    """The committed runs mix both kinds: the eca0b29 short runs judged by the public call, the older ones by the
    probes' own field; the rebuild is the committed table, and check stays clean."""
    with probe_module("kernel_table") as builder:
        judged = {}
        assert kt.dumps(builder.build(judged=judged)) == open(builder.TABLE_PATH).read()
        assert judged.get("public_fwd_bwd", 0) > 0 and judged[""] > 0
        assert builder.main(["check"]) == 0
