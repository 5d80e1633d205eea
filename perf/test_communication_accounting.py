"""2.4 communication_accounting (the XXL model on FSDP × TP), the ddp_overlap_bucketed (b) bucket
model, per-rank communication volumes of DDP / sharded optimizer / ZeRO-1 / FSDP, and the
memory_accounting of the five model sizes: closed forms from impl.accounting. Each row times the
computation of its table (impl.accounting's arithmetic, in Python: microseconds) and carries the
table in its details["results"], which the report reads; the timing is what the computation
costs, the table is the point."""
import pytest

from impl import accounting as acc
from impl.model import MODEL_SIZES, VOCAB_SIZE, param_count
from impl.runtime import profile_name
from impl.workloads.problems import Problem, StoredGroup
from impl.workloads.sweeps import grid

PROFILE = profile_name()
COMM = grid("communication_accounting", PROFILE)
MEM = grid("memory_accounting", PROFILE)


def xxl_results() -> dict:
    state = acc.xxl_state_bytes()
    fsdp = []
    for tokens in COMM.fsdp_tokens:
        n = acc.min_fsdp_devices(tokens)
        fsdp.append(dict(tokens=tokens, activation_bytes=acc.xxl_activation_bytes(tokens), n_fsdp=n,
                         per_device_bytes=None if n is None else acc.fsdp_bytes_per_device(n, tokens)))
    # The largest batch for which some N_FSDP fits: the replicated half of the activations < 95 GB.
    max_tokens = int(2 * acc.V5P_BYTES / acc.xxl_activation_bytes(1))
    return dict(
        model=acc.XXL, n_params=acc.xxl_params(), state=state, h100_bytes=acc.H100_BYTES,
        h100_needed=acc.devices_needed(state["total"], acc.H100_BYTES),
        activation_bytes_per_token=acc.xxl_activation_bytes(1),
        v5p_bytes=acc.V5P_BYTES, fsdp=fsdp, fsdp_max_tokens=max_tokens,
        tpu=acc.TPU_V5P, compute_bound=acc.compute_bound_batch(),
        times_at_bound=acc.fsdp_tp_forward_times(acc.compute_bound_batch()["global_tokens"]),
    )


def bucket_results() -> dict:
    size = COMM.bucket_model_size
    s = acc.grad_bytes(param_count(**MODEL_SIZES[size]))
    o, w = COMM.bucket_o_s, COMM.bucket_w_Bps
    rows = [dict(bucket_mb=mb, n_buckets=max(1.0, s / (mb * 1e6)),
                 overhead_s=acc.overhead_for_bucket_size(s, mb * 1e6, o, w)) for mb in COMM.bucket_sizes_mb]
    return dict(model=size, total_bytes=s, o_s=o, w_Bps=w, placeholder=True, rows=rows,
                optimal_n_buckets=acc.optimal_n_buckets(s, o, w), optimal_bucket_bytes=acc.optimal_bucket_bytes(s, o, w),
                min_overhead_s=acc.min_bucketed_overhead(s, o, w), single_bucket_s=acc.bucketed_overhead(s, 1, o, w))


def volume_results() -> dict:
    size = COMM.bucket_model_size
    psi = acc.grad_bytes(param_count(**MODEL_SIZES[size]))
    return dict(model=size, psi_bytes=psi,
                rows=[dict(world_size=n, **acc.comm_volume_per_rank(psi, n)) for n in COMM.world_sizes])


CASES = {"xxl": xxl_results, "bucket_model": bucket_results, "comm_volumes": volume_results}


@pytest.mark.parametrize("case", list(CASES))
def test_communication_accounting(bench, case):
    fn = CASES[case]
    bench.measure(problem=Problem.COMMUNICATION_ACCOUNTING, config=dict(case=case), fn=fn,
                  round=f"computing the {case} tables (impl.accounting closed forms)", warmup=COMM.warmup,
                  rounds=COMM.rounds, details=dict(results=fn()))


def memory_results(size: str) -> dict:
    shape = MODEL_SIZES[size]
    n = param_count(**shape)
    b, ws = MEM.batch, MEM.world_size
    acts = {str(c): acc.activation_bytes(b, c, shape["d_model"], shape["d_ff"], shape["num_heads"],
                                         shape["num_layers"], VOCAB_SIZE, acc.FP32) for c in MEM.contexts}
    return dict(
        n_params=n, training_state_bytes=acc.training_state_bytes(n),
        residual_stream_bytes={str(c): acc.residual_stream_bytes(b, c, shape["d_model"], acc.FP32)
                               for c in MEM.contexts},
        activation_bytes=acts, batch=b, world_size=ws,
        stages={str(z): acc.memory_breakdown(n, ws, z) for z in (0, 1)},
    )


@pytest.mark.parametrize("size", MEM.sizes)
def test_memory_accounting(bench, size):
    bench.measure(problem=StoredGroup.MEMORY_ACCOUNTING, config=dict(size=size), fn=lambda: memory_results(size),
                  round=f"computing the memory_accounting table of {size} (impl.accounting closed forms)",
                  warmup=MEM.warmup, rounds=MEM.rounds, details=dict(results=memory_results(size)))
