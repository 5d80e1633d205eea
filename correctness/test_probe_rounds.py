"""tools/probes/rounds.py (the interleaved timing rounds of flash_gluon_fwd / flash_gluon_bwd --rounds and
flash_ncu_fwd_ws --time) on the CPU: the order reversal, the medians, a budget cut only between whole rounds, a row
failing in a later round, the dry run's estimate line and --rounds' refusal below 1."""
from __future__ import annotations

import argparse

import pytest

from kits.probes import probe_module


@pytest.fixture(scope="module")
def rounds():
    with probe_module("rounds") as module:
        yield module


def test_round_order_reverses_every_other_round(rounds):
    assert [rounds.round_order("abc", r) for r in range(4)] == [list("abc"), list("cba"), list("abc"), list("cba")]


def test_time_rounds_alternates_and_keeps_the_order_measured(rounds):
    calls = []
    times = rounds.time_rounds(["a", "b", "c"], ["fa", "fb", "fc"], 3, lambda fn: calls.append(fn) or len(calls))
    assert calls == ["fa", "fb", "fc", "fc", "fb", "fa", "fa", "fb", "fc"]
    assert times == {"a": [1, 6, 7], "b": [2, 5, 8], "c": [3, 4, 9]}


def _timed(rounds, n_rounds, values, calls, fail_at=None):
    """A ShapeRounds of rows a, b, c measured once; row x's later timings come from values[x] in turn."""
    later = rounds.ShapeRounds(n_rounds, ("ms", "dq_ms"))
    rows = {name: {"ms": values[name][0], "dq_ms": None} for name in "abc"}
    for name, row in rows.items():
        def again(name=name):
            calls.append(name)
            if (name, len([c for c in calls if c == name])) == fail_at:
                raise RuntimeError("lost")
            return {"ms": values[name][len([c for c in calls if c == name])]}
        later.add(row, again, est_s=2.0)
    return later, rows


def test_later_rounds_reverse_the_order_and_the_headline_is_the_median(rounds):
    calls = []
    later, rows = _timed(rounds, 4, {"a": [5.0, 1.0, 2.0, 9.0], "b": [1.0, 1.0, 1.0, 1.0], "c": [3.0, 4.0, 1.0, 2.0]},
                         calls)
    assert later.measured == list(rows.values())
    assert later.finish(lambda est: est == 6.0) == 4
    assert calls == list("cbaabccba")  # rounds 2-4: the first round's order (a, b, c) reversed, then as is, reversed
    assert rows["a"] == {"ms": 3.5, "ms_rounds": [5.0, 1.0, 2.0, 9.0], "dq_ms": None, "rounds": 4}  # even: the mean
    assert rows["c"]["ms"] == 2.5 and rows["b"]["ms_rounds"] == [1.0] * 4  # of the middle two
    assert later.measured == [] and later.finish(lambda est: False) == 4  # emptied: nothing more to time


def test_a_round_that_does_not_fit_is_not_started_and_the_rows_keep_the_rounds_they_have(rounds):
    calls, budget = [], [10.0]

    def fits(est):  # 6 s a round (three rows at 2 s): two rounds fit in 10 + 2
        ok = est <= budget[0]
        budget[0] -= est
        return ok

    later, rows = _timed(rounds, 5, {x: [1.0, 2.0, 3.0, 4.0, 5.0] for x in "abc"}, calls)
    assert later.finish(fits) == 2 and len(calls) == 3  # round 3 did not fit: none of it ran
    assert all(r["rounds"] == 2 and r["ms_rounds"] == [1.0, 2.0] and r["ms"] == 1.5 for r in rows.values())


def test_a_row_failing_in_a_later_round_keeps_its_rounds_and_leaves_the_rest(rounds):
    calls = []
    later, rows = _timed(rounds, 4, {x: [1.0, 2.0, 3.0, 4.0] for x in "abc"}, calls, fail_at=("b", 2))
    assert later.finish(lambda est: True) == 4
    assert calls == list("cba") + list("abc") + list("ca")  # b left after its failure; the others go on
    assert rows["b"]["error"].startswith("round 3: RuntimeError: lost") and rows["b"]["ms_rounds"] == [1.0, 2.0]
    assert rows["a"]["rounds"] == 4 and rows["a"]["ms"] == 2.5


def test_one_round_adds_nothing(rounds):
    later = rounds.ShapeRounds(1, ("ms",))
    row = {"ms": 1.0}
    later.add(row, lambda: pytest.fail("timed again at one round"), 2.0)
    assert later.measured == [] and later.finish(lambda est: True) == 1 and row == {"ms": 1.0}
    assert rounds.note(1) is None and "median" in rounds.note(3)


def test_the_plan_line_counts_the_later_rounds(rounds):
    assert rounds.plan_line(6, 122.0, 12.0, 1, 420) == "6 rows, estimate 122 s; budget 420 s"  # as before --rounds
    assert rounds.plan_line(6, 122.0, 12.0, 5, 420) == (
        "6 rows, estimate 170 s (5 rounds: the first 122 s, each later one 12 s); budget 420 s")


@pytest.mark.parametrize("text, match", [("0", ">= 1"), ("-2", ">= 1"), ("two", "integer")])
def test_rounds_below_one_are_refused(rounds, text, match):
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        rounds.check_rounds(text)
    assert rounds.check_rounds("1") == 1 and rounds.check_rounds("5") == 5
