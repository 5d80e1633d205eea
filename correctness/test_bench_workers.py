"""The distributed benchmarks' machinery (impl.bench.worker_group, dist_steps, traces): the clock
that makes the slowest rank's time the benchmark's stats, the worker group's commands and errors on
2 gloo ranks, and the profiler-timeline arithmetic."""
import pytest

from impl.workloads import dist_steps
from impl.workloads.dist_steps import StepReply, StepSummary, WorkerState
from impl.bench.traces import build_timeline
from impl.bench.worker_group import RankError, SlowestRankClock, Timed, WorkerGroup


class FakeGroup:
    """Replies as given, one list per call."""

    def __init__(self, *replies):
        self.replies = list(replies)

    def call(self, fn, **kwargs):
        return self.replies.pop(0)


def test_clock_advances_by_the_slowest_rank_and_skips_idle_ranks():
    clock = SlowestRankClock()
    run = clock.command(FakeGroup([Timed(0.2), Timed(0.5)], [Timed(0.3), None]), dist_steps.step)
    assert clock() == 0.0
    run()
    assert clock() == pytest.approx(0.5)
    run()  # rank 1 sat this one out (the single-GPU floor)
    assert clock() == pytest.approx(0.8)
    assert clock.last(1) == [[Timed(0.3), None]]


def test_clock_refuses_a_command_without_timed_replies():
    with pytest.raises(RuntimeError, match="no rank returned a timed reply"):
        SlowestRankClock().command(FakeGroup([None, None]), dist_steps.step)()


def _reply(fwd_bwd, comm, nbytes):
    return StepReply(seconds=1.0, fwd_bwd_s=fwd_bwd, opt_s=0.1, comm_s=comm, bytes=nbytes, loss=1.0)


def test_step_summary_is_the_mean_of_the_slowest_ranks():
    steps = [[_reply(0.2, 0.1, 8), _reply(0.4, 0.3, 8)], [_reply(0.6, None, 8), None]]
    s = StepSummary.of(steps)
    assert s.fwd_bwd_s == pytest.approx(0.5)  # (0.4 + 0.6) / 2
    assert s.comm_s == pytest.approx(0.3)  # only the first step measured it
    assert s.bytes_per_step == 8


def test_timeline_busy_overlap_and_phases_from_the_step_start():
    ops = [("compute", 0, 5), ("compute", 10, 20), ("compute", 12, 15), ("communication", 14, 30),
           ("compute", 100, 110), ("communication", 105, 106)]
    phases = [("forward", 10, 15), ("backward", 15, 25), ("forward", 0, 5)]
    tl = build_timeline(ops, phases, start_us=10, max_intervals=100, source="test")
    assert tl["busy_us"] == dict(compute=20, communication=17)  # [10,20] + [100,110]; [14,30] + [105,106]
    assert tl["overlap_us"] == 7  # [14,20] and [105,106]
    assert tl["span_us"] == 100
    assert tl["lanes"]["compute"] == [[0, 10], [90, 10]]
    assert [p["name"] for p in tl["phases"]] == ["forward", "backward"]  # the earlier step's phase dropped


def test_timeline_coarsens_lanes_to_max_intervals_but_keeps_exact_totals():
    ops = [("compute", 10 * i, 10 * i + 1) for i in range(50)] + [("communication", 0, 1)]
    tl = build_timeline(ops, [], start_us=0, max_intervals=5, source="test")
    assert len(tl["lanes"]["compute"]) <= 5
    assert tl["busy_us"]["compute"] == 50


@pytest.fixture(scope="module")
def group():
    g = WorkerGroup(2, "gloo", WorkerState, command_timeout_s=120)
    yield g
    g.close()


def test_group_runs_a_command_on_every_rank(group):
    replies = group.call(dist_steps.allreduce, nbytes=4096)
    assert [type(r) for r in replies] == [Timed, Timed] and all(r.seconds > 0 for r in replies)


def test_group_ddp_step_hands_every_gradient_to_one_all_reduce(group):
    setup = group.call(dist_steps.ddp_setup, size="tiny", max_context=8, context=8, batch=1, variant="naive")[0]
    replies = group.call(dist_steps.step)
    assert all(r.bytes == setup.grad_bytes and 0 <= r.comm_s <= r.seconds for r in replies)
    probed = group.call(dist_steps.memory_step, named=True)
    assert all(r.memory.named_before.gradients == setup.grad_bytes for r in probed)
    group.call(dist_steps.teardown)


def test_a_failing_rank_fails_the_call_with_its_error_first_and_kills_the_group():
    g = WorkerGroup(2, "gloo", WorkerState, command_timeout_s=120)
    try:
        with pytest.raises(RankError, match=r"^rank \d of 2 failed in 'ddp_setup': ValueError: variant must be one of"):
            g.call(dist_steps.ddp_setup, size="tiny", max_context=8, context=8, batch=1, variant="bogus")
        assert g.dead and all(not p.is_alive() for p in g.procs)
        with pytest.raises(RuntimeError, match="closed or failed"):
            g.call(dist_steps.teardown)
    finally:
        g.kill()


def test_idle_ranks_sit_the_single_gpu_floor_out(group):
    group.call(dist_steps.ddp_setup, size="tiny", max_context=8, context=8, batch=1, variant="single")
    replies = group.call(dist_steps.step)
    assert replies[1] is None and replies[0].comm_s is None and replies[0].seconds > 0
    group.call(dist_steps.teardown)


