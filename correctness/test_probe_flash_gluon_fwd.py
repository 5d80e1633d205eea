"""tools/probes/flash_gluon_fwd.py (issue 47's probe of the Gluon forwards) on the CPU: its --short plan (the
kernel table's min_seq), the --only selection of the lead's call, that the short rows run the kernels=auto
path; --shapes / --rows select the rows a trial's GPU call times, and the default plan has no trial rows; --rounds
(rows timed again in rounds, the order reversed every other one, medians reported) with a faked measure."""
from __future__ import annotations

import argparse

import pytest

from kits.probes import probe_module, run_faked

pytest.importorskip("triton.experimental.gluon")  # the plan reads flash_gluon_ws's configs

#: The lead's short call (NOTES.md, "Issue 47, stage 4: the kernel table's min_seq"): d 128 and 64 causal, cuDNN,
#: the table's ws config and Triton.
SHORT_ONLY = [r"^4x32x\d+x(128|64) (cudnn|triton autotuned|gluon-ws 2x64x128 s3 pp)$"]


@pytest.fixture(scope="module")
def probe():
    with probe_module("flash_gluon_fwd") as module:
        yield module


def test_the_short_plan_times_the_table_candidates_as_called_with_triton_last(probe):
    rows = probe.plan(short=True)
    shapes = [(4, 32, n, d, causal) for n in probe.SHORT_SEQS for d, causal in probe.SHORT_KEYS]
    assert list(dict.fromkeys(r["shape"] for r in rows)) == shapes and probe.SHORT_SEQS[-1] == 3000
    for s in shapes:
        assert [(r["impl"], probe.cfg_text(r["config"])) for r in rows if r["shape"] == s] == [
            ("cudnn", ""), ("gluon-ws", "2x64x128 s3 pp"), ("gluon-ws", "2x64x128 s3 pp persist"),
            ("gluon-ws", "2x64x128 s3 pp persist dynamic"), ("triton", "autotuned")]
    assert all(r["timer"] == "called" for r in rows)
    assert not any("timer" in r for r in probe.plan())  # the default plan: do_bench, as before


def test_the_leads_short_call_fits_its_estimate(probe, capsys):
    rows = probe.plan(short=True, only=tuple(SHORT_ONLY))
    assert [probe.row_label(r) for r in rows[:3]] == ["4x32x512x128 cudnn", "4x32x512x128 gluon-ws 2x64x128 s3 pp",
                                                      "4x32x512x128 triton autotuned"]
    # compiles at 5 s each (~2x the H100's), the public call's Triton backward autotune (12 configs) once per key
    assert len(rows) == 24 and sum(r["est"] for r in rows) <= 330
    probe.main(["--dry-run", "--short", "--only", SHORT_ONLY[0]])
    assert capsys.readouterr().out.splitlines()[-1].startswith("24 rows, estimate")
    with pytest.raises(SystemExit):
        probe.main(["--dry-run", "--only", "no such row"])


def test_a_short_row_runs_the_forward_through_the_dispatch(probe, monkeypatch):
    """The kernels="auto" path once the table named the config (plans included), with the config as the table's
    pairs."""
    from impl.attention import flash_dispatch, flash_gluon_ws
    from impl.attention.kernel_table import config_pairs
    calls = []
    monkeypatch.setattr(flash_dispatch, "gluon_forward", lambda *a: calls.append(a) or ("o", "lse", "record"))
    config = flash_gluon_ws.default_config(128)
    assert probe.auto_forward(config)("q", "k", "v", True, config) == ("o", "lse")
    ((q, k, v, causal, options, kernel, pairs),) = calls
    assert (options.kernels, kernel, pairs) == ("auto", "gluon_ws", config_pairs(config))
    assert flash_gluon_ws.GluonWsConfig(**dict(pairs)) == config


def _labels(probe, rows):
    return [f"{probe.shape_name(r['shape'])} {r['impl']} {probe.cfg_text(r['config'])}".strip() for r in rows]


def test_the_lpt_call_times_cudnn_the_default_grid_and_the_lpt_grid_per_shape(probe):
    """The lpt grid's GPU call (NOTES.md, "Issue 47, the ws forward's causal gap at N 2048-4096"): per shape cuDNN,
    the default ws config, the same config with lpt; the default plan keeps no lpt row."""
    shapes = [probe.parse_shape(s) for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")]
    labels = _labels(probe, probe.plan(shapes=shapes, kinds=("cudnn", "ws", "ws-lpt")))
    assert labels == [f"{s} {row}" for s in ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128")
                      for row in ("cudnn", "gluon-ws 2x64x128 s3 pp", "gluon-ws 2x64x128 s3 pp lpt")]
    assert not any("lpt" in label for label in _labels(probe, probe.plan()))
    assert _labels(probe, probe.plan(shapes=shapes[:1])) == _labels(probe, probe.plan())[:6]  # the default shape rows


def test_the_lpt_call_counts_the_triton_reference_compile_once(probe):
    """A Gluon row's error is measured against the Triton forward's output: without a triton row, the first Gluon
    row of a (d, causal) pays the autotune compile in its estimate."""
    shapes = [probe.parse_shape("4x32x4096x128"), probe.parse_shape("4x32x2048x128")]
    rows = probe.plan(shapes=shapes, kinds=("ws", "ws-lpt"))
    assert rows[0]["est"] >= probe.TRITON_FWD_CONFIGS * probe.COMPILE_S and all(r["est"] < 10 for r in rows[1:])


@pytest.mark.parametrize("text", ["4x32x4096", "4x32x4096x128:causal", "4xAx4096x128"])
def test_a_malformed_shape_is_refused_by_name(probe, text):
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        probe.parse_shape(text)
    assert probe.parse_shape("4x32x4096x128:full") == (4, 32, 4096, 128, False)


def test_the_early_q_call_times_the_persistent_grid_with_and_without_it(probe):
    """The early_q trial's GPU call (NOTES.md, "Issue 47, the ws forward's per-CTA fixed cost"): per shape cuDNN, the
    default ws grid, persistent, persistent with early_q; the default plan (and --rows' default) keeps no trial row."""
    names = ("4x32x4096x128", "4x32x2048x128", "4x16x16384x128", "4x32x4096x128:full")
    shapes = [probe.parse_shape(s) for s in names]
    labels = _labels(probe, probe.plan(shapes=shapes, kinds=("cudnn", "ws", "ws-persistent", "ws-early-q")))
    assert labels == [f"{s.replace(':full', ' full')} {row}" for s in names
                      for row in ("cudnn", "gluon-ws 2x64x128 s3 pp", "gluon-ws 2x64x128 s3 pp persist",
                                  "gluon-ws 2x64x128 s3 pp persist early-q")]
    assert not any("early-q" in label for label in _labels(probe, probe.plan()) + _labels(probe, probe.plan(shapes)))
    assert not any(k in probe.SHAPE_ROWS for k in ("ws-lpt", "ws-early-q", "ws-o-regs", "ws-rotate", "ws-lazy-sum",
                                                   "ws-prefetch-q", "ws-dynamic", "ws-dynamic-pq"))


#: Each trial row of the forward probe (ws-dynamic's config now a table candidate): its kind, the config flags it must have set and clear, its label at 4x32x4096.
TRIAL_ROWS = [
    ("ws-early-q", ("early_q", "persistent"), (), "persist early-q"),
    ("ws-o-regs", ("o_regs",), ("early_q",), "persist o-regs"),
    ("ws-rotate", ("rotate",), ("persistent",), "rotate"),
    ("ws-lazy-sum", ("lazy_sum",), ("rotate",), "lazy-sum"),
    ("ws-prefetch-q", ("prefetch_q",), ("persistent",), "prefetch-q"),
    ("ws-dynamic", ("dynamic", "persistent"), (), "persist dynamic"),
    ("ws-dynamic-pq", ("dynamic", "prefetch_q"), (), "persist prefetch-q dynamic"),
]


@pytest.mark.parametrize("kind,on,off,label", TRIAL_ROWS, ids=[t[0] for t in TRIAL_ROWS])
def test_each_trial_row_times_its_trial_config(probe, kind, on, off, label):
    from impl.attention import flash_gluon_ws

    (row,) = probe.plan(shapes=[probe.parse_shape("4x32x4096x128")], kinds=(kind,))
    cfg = row["config"]
    assert cfg in flash_gluon_ws.TRIAL_CONFIGS + flash_gluon_ws.CANDIDATE_CONFIGS  # dynamic: a candidate since 9a30e6b
    assert all(getattr(cfg, f) for f in on) and not any(getattr(cfg, f) for f in off), cfg
    assert _labels(probe, [row]) == [f"4x32x4096x128 gluon-ws 2x64x128 s3 pp {label}"]


#: The early_q A/B's call (NOTES.md, "Probe rounds"): each shape's rows timed in 5 rounds.
EARLY_Q_AB = ["--shapes", "4x16x16384x128", "4x32x4096x128:full", "--rows", "cudnn", "ws-persistent", "ws-early-q"]


def test_rounds_below_one_are_refused_by_name(probe, capsys):
    for bad in ("0", "-1", "x"):
        with pytest.raises(SystemExit):
            probe.main(["--dry-run", *EARLY_Q_AB, "--rounds", bad])
        assert "argument --rounds:" in capsys.readouterr().err


def test_one_round_is_the_plan_as_before_and_rounds_add_their_estimate(probe, capsys):
    probe.main(["--dry-run", *EARLY_Q_AB])
    before = capsys.readouterr().out
    probe.main(["--dry-run", *EARLY_Q_AB, "--rounds", "1"])
    assert capsys.readouterr().out == before
    assert before.splitlines()[-1] == "6 rows, estimate 122 s; budget 420 s"
    probe.main(["--dry-run", *EARLY_Q_AB, "--rounds", "5"])
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == before.splitlines()[:-1]  # the same rows; 4 later rounds of 6 rows at RETIME_S each
    assert out[-1] == "6 rows, estimate 170 s (5 rounds: the first 122 s, each later one 12 s); budget 420 s"


def _early_q_times(shape, cudnn, persistent, early_q):
    return {f"{shape} cudnn": [{"ms": x} for x in cudnn],
            f"{shape} gluon-ws 2x64x128 s3 pp persist": [{"ms": x} for x in persistent],
            f"{shape} gluon-ws 2x64x128 s3 pp persist early-q": [{"ms": x} for x in early_q]}


def test_rounds_reverse_the_order_and_report_medians_and_their_ratios(probe, monkeypatch, tmp_path, capsys):
    times = {**_early_q_times("4x16x16384x128", [1.0, 3.0, 2.0], [2.0, 2.2, 9.0], [3.0, 2.4, 2.2]),
             **_early_q_times("4x32x4096x128 full", [1.0] * 3, [1.5] * 3, [1.6] * 3)}
    res, order = run_faked(monkeypatch, probe, [*EARLY_Q_AB, "--rounds", "3"], tmp_path / "fwd.json", times)
    labels = list(times)
    assert order == labels[:3] + labels[:3][::-1] + labels[:3] + labels[3:] + labels[3:][::-1] + labels[3:]
    assert res["rounds"] == 3 and not res["stopped_by_budget"]
    cudnn, persistent, early_q = res["rows"][:3]
    assert (cudnn["ms"], cudnn["ms_rounds"], cudnn["rounds"]) == (2.0, [1.0, 3.0, 2.0], 3)
    assert persistent["ms"] == 2.2 and persistent["/cudnn"] == pytest.approx(1.1)  # median over median
    assert early_q["ms"] == 2.4 and early_q["ms_rounds"] == [3.0, 2.4, 2.2]
    out = capsys.readouterr().out
    assert "medians over 3 rounds" in out and "4x16x16384x128: 3 of 3 rounds (medians)" in out


def test_one_round_writes_the_json_as_before(probe, monkeypatch, tmp_path):
    times = {**_early_q_times("4x16x16384x128", [1.0], [2.0], [3.0]),
             **_early_q_times("4x32x4096x128 full", [1.0], [1.5], [1.6])}
    res, order = run_faked(monkeypatch, probe, EARLY_Q_AB, tmp_path / "fwd.json", times)
    assert order == list(times) and "rounds" not in res
    assert set(res["rows"][1]) == {"shape", "shape_name", "impl", "config", "ms", "err", "wrong", "error", "s",
                                   "tflops", "/cudnn", "/triton"} and res["rows"][1]["/cudnn"] == 2.0


def test_a_round_past_the_budget_stops_the_run_between_whole_rounds(probe, monkeypatch, tmp_path):
    """cuDNN and SDPA flash (2 s estimates, no compile) at two shapes, 5 s a fake timing, budget 20 s: the first
    shape's round 2 (4 s) starts at 10 s, its round 3 would end past 20 s: the run stops, the second shape left
    out."""
    argv = ["--shapes", "4x32x4096x128", "4x32x2048x128", "--rows", "cudnn", "sdpa-flash", "--rounds", "3",
            "--budget-s", "20"]
    times = {f"{s} {impl}": [{"ms": 1.0}, {"ms": 2.0}] for s in ("4x32x4096x128", "4x32x2048x128")
             for impl in ("cudnn", "sdpa flash")}
    res, order = run_faked(monkeypatch, probe, argv, tmp_path / "fwd.json", times, step_s=5.0)
    assert len(order) == 4 and res["stopped_by_budget"] and res["rounds_cut"] == "4x32x4096x128: 2 of 3"
    assert res["left_out"] == ["4x32x2048x128 cudnn", "4x32x2048x128 sdpa flash"]
    assert [(r["rounds"], r["ms"]) for r in res["rows"]] == [(2, 1.5), (2, 1.5)]
