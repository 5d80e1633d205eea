"""Interleaved timing rounds for the do_bench probes (flash_gluon_fwd, flash_gluon_bwd, flash_ncu_fwd_ws --time).

A row timed once, always at the same place in its shape's order, carries that place's drift (clocks, heat, what
ran before) into an A/B ratio (NOTES.md, "Issue 47, the early_q slowdown", hypothesis 1). So a probe's `--rounds R`
measures a shape's rows once as before, then times them all R-1 more times, the order reversed every other round
(round_order): no row is always last. A row's headline time is the median over its rounds (settle).

Budget: a later round starts only whole (every row of the shape, or none): a partial round would time some rows
more often than others, in one order only. ShapeRounds.finish reports the rounds done; the probes stop the run there
(as a budget stop between rows does), the rows keeping the medians of the rounds they have.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

T = TypeVar("T")
Times = Dict[str, float]


def check_rounds(text: str) -> int:
    """--rounds' argparse type: an integer >= 1 (1: each row timed once, as before)."""
    try:
        rounds = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}") from None
    if rounds < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (1: one timing per row), got {rounds}")
    return rounds


def round_order(items: Sequence[T], r: int) -> List[T]:
    """Round r's order (0-based): as given on even rounds, reversed on odd ones."""
    return list(items) if r % 2 == 0 else list(items)[::-1]


def time_rounds(names: Sequence[str], fns: Sequence[Callable[[], object]], rounds: int,
                bench: Callable[[Callable[[], object]], float]) -> Dict[str, List[float]]:
    """bench(fn) (ms) of every named fn, `rounds` times in round_order: name -> its times in the order measured."""
    out: Dict[str, List[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name, fn in round_order(list(zip(names, fns)), r):
            out[name].append(bench(fn))
    return out


def settle(row: dict, times: Dict[str, List[float]]) -> None:
    """Writes into row, per timed quantity q, the per-round times ("q_rounds", in the order measured) and their
    median as row[q]; row["rounds"]: how many rounds the row was timed in."""
    for q, values in times.items():
        row[f"{q}_rounds"] = list(values)
        row[q] = statistics.median(values)
    row["rounds"] = max(len(v) for v in times.values())


@dataclasses.dataclass
class _Timed:
    row: dict
    again: Optional[Callable[[], Times]]  # None once a round of it failed
    est_s: float
    times: Dict[str, List[float]]


class ShapeRounds:
    """One shape's rows, each measured once (its first times), then re-timed in rounds 2..`rounds` by finish."""

    def __init__(self, rounds: int, quantities: Sequence[str]):
        self.rounds, self.quantities = rounds, tuple(quantities)
        self.rows: List[_Timed] = []

    def add(self, row: dict, again: Callable[[], Times], est_s: float) -> None:
        """row measured once (its timed quantities' first values in it); again() times them once more (a dict of
        some of self.quantities), ~est_s seconds. At one round: nothing to do."""
        if self.rounds > 1:
            first = {q: [row[q]] for q in self.quantities if row.get(q) is not None}
            self.rows.append(_Timed(row, again, est_s, first))

    @property
    def measured(self) -> List[dict]:
        """The rows added since the last finish, in the order added."""
        return [t.row for t in self.rows]

    def finish(self, fits: Callable[[float], bool]) -> int:
        """Rounds 2.. of the rows added (round_order over them, each round started only if fits(its estimate));
        settles every row (medians of the rounds it has) and empties the list. Returns the rounds done (the
        requested count unless a round did not fit). A row whose re-timing raises keeps its error text ("round
        N: ...") and the rounds before it, and leaves the later rounds."""
        done = self.rounds
        for r in range(1, self.rounds):
            live = [t for t in self.rows if t.again is not None]
            if not live:
                break
            if not fits(sum(t.est_s for t in live)):
                done = r
                break
            for t in round_order(live, r):
                try:
                    for q, ms in t.again().items():
                        t.times.setdefault(q, []).append(ms)
                except Exception as e:  # noqa: BLE001 - a failed round is a result; the other rows go on
                    t.row["error"] = f"round {r + 1}: {type(e).__name__}: {str(e)[:300]}"
                    t.again = None
        for t in self.rows:
            if t.times:
                settle(t.row, t.times)
        self.rows = []
        return done


def close_shape(later: ShapeRounds, res: dict, rest: Sequence[dict], elapsed: Callable[[], float], budget_s: float,
                refresh: Callable[[], None], line: Callable[[dict], str], label: Callable[[dict], str],
                dump: Callable[[], None]) -> bool:
    """A probe's shape ends: its later rounds (each only if it fits budget_s after elapsed()), the ratios refreshed,
    its rows printed again with their medians, the JSON dumped. False: a round did not fit, so the run stops there,
    as a budget stop between rows does (res: stopped_by_budget, rounds_cut, and the `rest` rows' labels left_out)."""
    measured = later.measured
    if not measured:
        return True
    done = later.finish(lambda est: elapsed() + est <= budget_s)
    refresh()
    name = measured[0]["shape_name"]
    print(f"{name}: {done} of {later.rounds} rounds (medians)", flush=True)
    print("\n".join(line(r) for r in measured), flush=True)
    dump()
    if done == later.rounds:
        return True
    res["stopped_by_budget"], res["rounds_cut"] = True, f"{name}: {done} of {later.rounds}"
    res["left_out"] = res["left_out"] or [label(s) for s in rest]
    print(f"budget: stopped after {elapsed():.0f} s, {done} of {later.rounds} rounds, {len(rest)} rows left out",
          flush=True)
    return False


def plan_line(n_rows: int, first_s: float, later_s: float, rounds: int, budget_s: float) -> str:
    """The dry run's last line: rows and the estimate (first round's compiles and timings, then each later round's
    timings), the budget. rounds 1: the line as before --rounds."""
    if rounds == 1:
        return f"{n_rows} rows, estimate {first_s:.0f} s; budget {budget_s:.0f} s"
    return (f"{n_rows} rows, estimate {first_s + (rounds - 1) * later_s:.0f} s ({rounds} rounds: the first "
            f"{first_s:.0f} s, each later one {later_s:.0f} s); budget {budget_s:.0f} s")


def note(rounds: int) -> Optional[str]:
    """The printed tables' note under their header (None at one round)."""
    if rounds == 1:
        return None
    return (f"times: medians over {rounds} rounds a shape (the first with the compiles and checks; the row order "
            f"reversed every other round); per-round times in the JSON's '<quantity>_rounds'")
