"""tools/probes/public_call.py (issue 47, stage 4: the kernel table's min_seq from the public call) on the CPU: the
one-entry table a --short row runs under, its replacement of flash_dispatch's table for that row only (restored
after it, also when the row raises), and the probes' --short rows that time the public call (their plans, dry runs
and timers)."""
from __future__ import annotations

import pytest
import torch

from impl.attention import flash_dispatch, kernel_table as kt
from kits.probes import probe_module

pytest.importorskip("triton.experimental.gluon")  # the probes' plans read the Gluon configs


@pytest.fixture(scope="module")
def public():
    with probe_module("public_call") as module:
        yield module


def _ws_bwd_config():
    from impl.attention.flash_gluon_bwd_ws import CANDIDATE_CONFIGS
    return CANDIDATE_CONFIGS[0]


def test_the_row_table_holds_just_the_rows_entry_from_every_length(public):
    config = _ws_bwd_config()
    table = public.only_entry_table("bwd", "gluon_ws", config, "sm_90", 128, True, "bfloat16")
    (entry,) = table.entries
    assert table.lookup("bwd", "sm_90", 128, True, "bfloat16", 1) is entry and entry.min_seq == 0
    assert entry.config == kt.config_pairs(config)
    assert table.lookup("fwd", "sm_90", 128, True, "bfloat16", 1 << 20) is None  # the other half: Triton
    assert table.lookup("bwd", "sm_90", 128, False, "bfloat16", 1 << 20) is None
    assert public.only_entry_table("bwd", None, "autotuned", "sm_90", 128, True, "bfloat16").entries == ()


def test_the_table_is_replaced_for_the_row_only_also_when_it_raises(public):
    shipped = flash_dispatch.shipped_table
    table = public.only_entry_table("fwd", None, None, "sm_90", 128, True, "bfloat16")
    with public.table_replaced(table):
        assert flash_dispatch.shipped_table() is table
    assert flash_dispatch.shipped_table is shipped
    with pytest.raises(RuntimeError, match="row failed"):
        with public.table_replaced(table):
            raise RuntimeError("row failed")
    assert flash_dispatch.shipped_table is shipped


def test_time_public_times_the_public_call_under_the_rows_table_and_restores_it(public):
    """The timer gets FlashAttentionTriton.apply forward+backward (attention_step "fwd_bwd") while the dispatch
    reads the row's table; a timer raising (a failed row) leaves the shipped table in place."""
    shipped = flash_dispatch.shipped_table
    table = public.only_entry_table("bwd", "gluon_ws", _ws_bwd_config(), "sm_90", 128, True, "bfloat16")
    q, k, v, do = (torch.zeros(1, 1, 4, 128) for _ in range(4))
    seen = []

    def timer(fn):
        seen.append((flash_dispatch.shipped_table(), fn.__name__))
        return 0.5

    got = public.time_public(timer, table, q, k, v, do, True, (("fwd_bwd", public.PUBLIC), ("fwd", public.PUBLIC_FWD)))
    assert got == {"public_fwd_bwd": 0.5, "public_fwd": 0.5} and public.PUBLIC == "public_fwd_bwd"
    assert seen[0] == (table, "fwd_bwd") and seen[1][0] is table
    assert flash_dispatch.shipped_table is shipped

    def failing(fn):
        raise RuntimeError("launch failed")
    with pytest.raises(RuntimeError, match="launch failed"):
        public.time_public(failing, table, q, k, v, do, True)
    assert flash_dispatch.shipped_table is shipped


@pytest.mark.parametrize("name, gluon_impl", [("flash_gluon_fwd", "gluon-ws"), ("flash_gluon_bwd", "ws+gluon-bwd-ws")])
def test_the_short_plans_time_the_public_call_at_the_gluon_and_triton_rows(name, gluon_impl, capsys):
    with probe_module(name) as probe:
        rows = probe.plan(short=True)
        public = [r for r in rows if probe.times_public(r)]
        assert {r["impl"] for r in public} == {gluon_impl, "triton"}
        assert [r for r in rows if r not in public and r["impl"] != "cudnn"] == []
        assert not any(probe.times_public(r) for r in probe.plan())  # the default plan: as before
        probe.main(["x.json", "--dry-run", "--short"])
    lines = capsys.readouterr().out.splitlines()[:-1]
    assert len(lines) == len(rows)
    assert [line.endswith("+ public call") for line in lines] == [probe.times_public(r) for r in rows]


@pytest.mark.parametrize("name, gluon_impl, direction, kernel", [
    ("flash_gluon_fwd", "gluon-ws", "fwd", "gluon_ws"), ("flash_gluon_bwd", "ws+gluon-bwd-ws", "bwd", "gluon_ws")])
def test_a_short_rows_public_timer_runs_under_the_rows_one_entry_table(name, gluon_impl, direction, kernel,
                                                                        monkeypatch):
    """The Gluon row's table holds its config for the direction under test only; the Triton row's none; the
    kernels the public call ran are recorded once (not re-recorded by later rounds)."""
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda: (9, 0))
    with probe_module(name) as probe:
        import public_call
        calls = []

        def fake_time_public(timer, table, *args, kernels=None, **kw):
            calls.append((table, kernels))
            if kernels is not None:
                kernels[direction] = kernel
            return {"public_fwd_bwd": 1.0}
        monkeypatch.setattr(public_call, "time_public", fake_time_public)
        rows = [r for r in probe.plan(short=True) if probe.times_public(r)]
        gluon, triton = (next(r for r in rows if r["impl"] == i) for i in (gluon_impl, "triton"))
        tensors = tuple(torch.zeros(1, 1, 4, 128) for _ in range(4 if direction == "bwd" else 3))

        def timer_of(row):
            return probe.public_timer(row, tensors, {}) if direction == "fwd" else probe.public_timer(row, tensors)
        for spec in (gluon, triton):
            row = dict(spec)
            timer = timer_of(row)
            assert timer() == {"public_fwd_bwd": 1.0} and timer() == {"public_fwd_bwd": 1.0}
            assert row["public_kernels"] == {direction: kernel}
        (table, first), (_, again), (empty, _), _ = calls
        (entry,) = table.entries
        assert (entry.direction, entry.kernel, entry.config) == (direction, kernel, kt.config_pairs(gluon["config"]))
        assert first is not None and again is None and empty.entries == ()
        assert timer_of(dict(gluon, timer=None)) is None  # not a --short row: no public call
