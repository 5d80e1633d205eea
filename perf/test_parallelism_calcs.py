"""The 2026 edition's parallelism calculations, run: alternate_ring_all_reduce, data_parallel_calcs,
fsdp_calcs, tp_calcs and fsdp_tp_calcs, one benchmark group each.

Every row times, over N gloo ranks, the communication its formula prices, written with send/recv
(impl.distributed.ring): the alternate and the chunked ring all-reduce of S bytes; DP's all-reduce
of the FFN's three weight gradients; FSDP's weight all-gather (forward) and all-gather +
reduce-scatter (backward); the tensor-parallel FFN's forward and backward (ParallelSwiGLU, its
activation all-reduces through the ring); the FSDP × TP FFN on a 2 × 2 mesh. One round is one such
command on every rank after a barrier, timed by each rank's clock, the slowest rank's time counting
(impl.bench.worker_group.measure_on_ranks). details["counted"] holds what each rank sent (bytes,
exchange steps) and details["formula"] what impl.parallelism_calcs says it sends; the test fails
where they differ. Metric.GBPS is the bytes a rank sent over the median: its effective egress W.
"""
import pytest

from impl import parallelism_calcs as pc
from impl.workloads import parallelism_steps as ps
from impl.bench.row import Metric, Status
from impl.workloads.problems import Problem
from impl.workloads.sweeps import grid
from impl.bench.worker_group import Workers, measure_on_ranks
from impl.runtime import profile_name

G = grid("parallelism_calcs", profile_name())
BACKEND = "gloo"
FP16, FP32 = 2, 4
FFN = G.ffn
D, D_FF, TOKENS = FFN.d_model, FFN.d_ff, FFN.tokens


@pytest.fixture(scope="module")
def workers():
    """One group per world size, kept for the whole file (ranks start once per N)."""
    groups: dict[int, Workers] = {}
    yield groups
    for w in groups.values():
        w.close()


def _group(workers, bench, problem, config, n):
    w = workers.setdefault(n, Workers(G.budget_s, G.timeout_s, ps.WorkerState))
    if w.skip(bench, problem=problem, config=config, world_size=n, backend=BACKEND):
        return None
    return w.get(n, BACKEND)


def _expect(volume: float, steps: int, symbolic: str) -> dict:
    return dict(bytes_sent=volume, steps=steps, symbolic=symbolic)


def _run(bench, workers, problem: Problem, n: int, config: dict, setup, setup_kwargs: dict, step, round: str,
         formula: dict[str, dict]):
    """Time `step` on n ranks; check and store each counter's bytes sent and steps against `formula`."""
    config = dict(config, world_size=n, backend=BACKEND)
    group = _group(workers, bench, problem, config, n)
    if group is None:
        return
    group.call(setup, **setup_kwargs)
    row, timed = measure_on_ranks(bench, group, step, problem=problem, config=config, round=round,
                                  warmup=G.warmup, rounds=G.rounds)
    if row.status is not Status.MEASURED or bench.benchmark.stats is None:
        return
    last = timed[-1]
    counted = [{k: vars(t) for k, t in reply.traffic.items()} for reply in last]
    sent = max(sum(t["bytes_sent"] for t in rank.values()) for rank in counted)
    row.details.update(counted=counted, formula=formula)
    row.metrics[Metric.BYTES] = sent
    row.metrics[Metric.GBPS] = sent / bench.benchmark.stats.stats.median / 1e9
    bench.save(row)
    for rank, per in enumerate(counted):
        for key, want in formula.items():
            assert per[key]["bytes_sent"] == pytest.approx(want["bytes_sent"]), (rank, key)
            assert per[key]["steps"] == want["steps"], (rank, key)


def _collective_row(bench, workers, problem, n, numel, collectives: list[str], formula, what: str, **config):
    _run(bench, workers, problem, n, dict(config, numel=numel, payload_bytes=numel * FP16, dtype="fp16"),
         ps.collective_setup, dict(collectives=collectives, numel=numel), ps.collective,
         f"{what} on each of {n} gloo ranks (send/recv ring; slowest rank's time)", formula)


CASES = [(n, s) for n in G.world_sizes for s in G.numels]
IDS = [f"N{n}-{s * FP16 // 1024}KiB" for n, s in CASES]


@pytest.mark.parametrize("variant", ["alternate", "chunked"])
@pytest.mark.parametrize("n,numel", CASES, ids=IDS)
def test_alternate_ring_all_reduce(bench, workers, n, numel, variant):
    """The alternate ring (whole inputs passed on, (N−1)·S per device) against the chunked ring
    (2(N−1)/N·S) on the same payload."""
    s = numel * FP16
    name, fn = (("alternate_all_reduce", pc.alternate_ring_all_reduce_bytes) if variant == "alternate"
                else ("all_reduce", pc.ring_all_reduce_bytes))
    _collective_row(bench, workers, Problem.ALTERNATE_RING_ALL_REDUCE, n, numel, [name],
                    {name: _expect(fn(s, n), pc.RING_STEPS[name](n), fn.symbolic)},
                    f"one {variant} ring all-reduce of {s:,} bytes", variant=variant)


@pytest.mark.parametrize("n", G.world_sizes)
def test_data_parallel_calcs(bench, workers, n):
    """The backward's gradient all-reduce of the FFN's 3·D·D_FF fp16 values."""
    numel = 3 * D * D_FF
    volume = pc.dp_backward_comm_time(D, D_FF, n, 1.0)  # at W = 1 byte/s: the bytes a device sends
    _collective_row(bench, workers, Problem.DATA_PARALLEL_CALCS, n, numel, ["all_reduce"],
                    {"all_reduce": _expect(volume, pc.RING_STEPS["all_reduce"](n), pc.dp_backward_comm_time.symbolic)},
                    f"the all-reduce of the FFN's weight gradients (D {D}, D_FF {D_FF})", d_model=D, d_ff=D_FF)


@pytest.mark.parametrize("phase", ["forward", "backward"])
@pytest.mark.parametrize("n", G.world_sizes)
def test_fsdp_calcs(bench, workers, n, phase):
    """Forward: all-gather of the three weights; backward: all-gather again, reduce-scatter of the
    weight gradients."""
    numel, s = 3 * D * D_FF, 3 * D * D_FF * FP16
    steps = pc.RING_STEPS["all_gather"](n)
    formula = {"all_gather": _expect(pc.ring_all_gather_bytes(s, n), steps, pc.fsdp_forward_comm_time.symbolic)}
    names = ["all_gather"]
    if phase == "backward":
        formula["reduce_scatter"] = _expect(pc.ring_reduce_scatter_bytes(s, n), pc.RING_STEPS["reduce_scatter"](n),
                                            pc.fsdp_backward_comm_time.symbolic)
        names.append("reduce_scatter")
        assert sum(f["bytes_sent"] for f in formula.values()) == pytest.approx(
            pc.fsdp_backward_comm_time(D, D_FF, n, 1.0))
    else:
        assert formula["all_gather"]["bytes_sent"] == pytest.approx(pc.fsdp_forward_comm_time(D, D_FF, n, 1.0))
    _collective_row(bench, workers, Problem.FSDP_CALCS, n, numel, names, formula,
                    f"the {phase} collectives of FSDP on the FFN's weights (D {D}, D_FF {D_FF})",
                    phase=phase, d_model=D, d_ff=D_FF)


@pytest.mark.parametrize("n", G.world_sizes)
def test_tp_calcs(bench, workers, n):
    """The tensor-parallel FFN's forward and backward: one all-reduce of y (forward) and of dx
    (backward), each of B·D fp32 values."""
    steps = pc.RING_STEPS["all_reduce"](n)
    formula = {phase: _expect(fn(TOKENS, D, n, 1.0, FP32), steps, fn.symbolic)
               for phase, fn in (("forward", pc.tp_forward_comm_time), ("backward", pc.tp_backward_comm_time))}
    _run(bench, workers, Problem.TP_CALCS, n, dict(d_model=D, d_ff=D_FF, tokens=TOKENS, dtype="fp32"),
         ps.tp_ffn_setup, dict(d_model=D, d_ff=D_FF, tokens=TOKENS), ps.ffn_step,
         f"forward + backward of the tensor-parallel FFN (B {TOKENS}, D {D}, D_FF {D_FF}) on each of {n} ranks",
         formula)


def test_fsdp_tp_calcs(bench, workers):
    """The FFN on an N_FSDP × N_TP mesh: per axis and pass, the weight all-gathers (and gradient
    reduce-scatters) over the FSDP axis, the activation all-reduces over the TP axis."""
    n_tp, n_fsdp = G.mesh
    n = n_tp * n_fsdp
    weights = 3 * D * D_FF // n_tp * FP32  # each weight's TP slice, gathered over the FSDP axis
    ag, rs, ar = (pc.ring_all_gather_bytes(weights, n_fsdp), pc.ring_reduce_scatter_bytes(weights, n_fsdp),
                  pc.ring_all_reduce_bytes(TOKENS // n_fsdp * D * FP32, n_tp))
    assert ag == pytest.approx(pc.fsdp_tp_fsdp_comm_time(D, D_FF, n_tp, n_fsdp, 1.0, FP32))
    assert ar == pytest.approx(pc.fsdp_tp_tp_comm_time(TOKENS, D, n_tp, n_fsdp, 1.0, FP32))
    gather_steps = 3 * pc.RING_STEPS["all_gather"](n_fsdp)  # one all-gather per weight
    formula = {
        "fsdp forward": _expect(ag, gather_steps, pc.fsdp_tp_fsdp_comm_time.symbolic),
        "fsdp backward": _expect(ag + rs, gather_steps + 3 * pc.RING_STEPS["reduce_scatter"](n_fsdp),
                                 "2 · T_FSDP (all-gather again, reduce-scatter)"),
        "tp forward": _expect(ar, pc.RING_STEPS["all_reduce"](n_tp), pc.fsdp_tp_tp_comm_time.symbolic),
        "tp backward": _expect(ar, pc.RING_STEPS["all_reduce"](n_tp), "T_TP (all-reduce of dx)"),
    }
    _run(bench, workers, Problem.FSDP_TP_CALCS, n,
         dict(d_model=D, d_ff=D_FF, tokens=TOKENS, n_tp=n_tp, n_fsdp=n_fsdp, dtype="fp32"),
         ps.fsdp_tp_ffn_setup, dict(n_tp=n_tp, n_fsdp=n_fsdp, d_model=D, d_ff=D_FF, tokens=TOKENS), ps.ffn_step,
         f"forward + backward of the FSDP × TP FFN on a {n_fsdp} × {n_tp} mesh (slowest rank's time)", formula)
