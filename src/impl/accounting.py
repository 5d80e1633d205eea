"""Closed-form memory and communication models (pure Python, no torch), tested in
correctness/test_accounting.py and printed by the report through perf/test_communication_accounting.py.

Units: bytes, seconds, FLOP. Decimal GB (1e9 bytes) where a device capacity is quoted ("H100 80GB",
"v5p 95GB"), since that is how the assignment states capacities. Every constant of the assignment is
a named parameter whose default is the assignment's value.

Sections:
  1. model memory: parameters, gradients, AdamW state, activations autograd saves (basics LM)
  2. communication_accounting (assignment 2.4): the XXL FFN stack, FSDP sharding, TPU v5p batch
  3. ddp_overlap_bucketed (b): bucket overhead model, and the latency/bandwidth fit for all-reduce
  4. per-rank communication volumes of DDP, the simple sharded optimizer, ZeRO-1 and FSDP
  5. gradient_checkpointing
  6. fsdp_accounting (2026 edition): FSDP's predicted peak saving
The 2026 edition's parallelism calculations (alternate_ring_all_reduce, data_parallel_calcs,
fsdp_calcs, tp_calcs, fsdp_tp_calcs) live in impl.parallelism_calcs and are re-exported here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from impl.parallelism_calcs import (  # noqa: F401 - re-exported: impl.accounting is the models' entry point
    TP_BACKWARD_EQUATIONS, TPU_V5P_FIGURES, Answer, DeviceFigures, Formula, MeshSplit, ParallelismBounds,
    alternate_ring_all_reduce_bytes, alternate_ring_all_reduce_time, answers, data_parallel_bounds,
    data_parallel_calcs, fsdp_bounds, fsdp_calcs, fsdp_tp_best_split, fsdp_tp_best_split_serial, fsdp_tp_bounds,
    fsdp_tp_calcs, parallelism_bounds, ring_all_gather_bytes, ring_all_gather_time, ring_all_reduce_bytes,
    ring_all_reduce_time, ring_reduce_scatter_bytes, ring_reduce_scatter_time, tp_bounds, tp_calcs)

FP32, BF16 = 4, 2

# ----------------------------------------------------------------------------------------------
# 1. Model memory


def param_bytes(n_params: int, bytes_per: int = FP32) -> int:
    return n_params * bytes_per


def grad_bytes(n_params: int, bytes_per: int = FP32) -> int:
    """Gradients have the parameters' dtype (fp32 master weights → fp32 grads, also under autocast)."""
    return n_params * bytes_per


def adam_state_bytes(n_params: int, bytes_per: int = FP32) -> int:
    """AdamW keeps two moments (m, v) per parameter in fp32; the step counter is a scalar and ignored."""
    return 2 * n_params * bytes_per


def training_state_bytes(n_params: int, bytes_per: int = FP32) -> int:
    """Parameters + gradients + AdamW moments, all fp32: 16 bytes per parameter."""
    return param_bytes(n_params, bytes_per) + grad_bytes(n_params, bytes_per) + adam_state_bytes(n_params, bytes_per)


def adamw_step_bytes(n_params: int, bytes_per: int = FP32) -> int:
    """The least memory traffic of one AdamW step over fp32 state: read parameter, gradient and both
    moments, write parameter and both moments, each once (28 bytes per parameter)."""
    return 7 * n_params * bytes_per


def residual_stream_bytes(batch: int, seq: int, d_model: int, bytes_per_elem: int = FP32) -> int:
    """One (batch, seq, d_model) activation tensor, e.g. the input of one Transformer block."""
    return batch * seq * d_model * bytes_per_elem


def activation_breakdown(batch: int, seq: int, d_model: int, d_ff: int, num_heads: int, num_layers: int,
                         vocab: int = 10_000, bytes_per: int = FP32) -> dict[str, int]:
    """Bytes that autograd keeps alive from the end of the forward pass into backward, for the basics
    Transformer LM (impl.model) with naive attention and our cross-entropy, in fp32 without autocast.

    Counted per block (b=batch, s=seq, d=d_model, f=d_ff, h=num_heads, hd=d/h), from what each op's
    backward needs:
      RMSNorm ×2   input x (bsd), rsqrt result (bs), x·rms (bsd)           pow, rsqrt, the two muls
      norm outputs ×2  (bsd): inputs of q/k/v projections and of w1/w3
      RoPE tables  cos/sin gathered at the positions, per call (q and k): 2·s·hd
                   (mul by a constant table saves the table, not the rotated input)
      q, k after RoPE (2·bsd): inputs of QK^T;  v as a contiguous copy (bsd): input of PV
      causal mask  (s·s bools, 1 byte each): kept by masked_fill
      softmax probs (b·h·s·s): kept by softmax and by PV. The raw and masked scores are NOT kept:
                   division by a constant and masked_fill need no input for their gradient
      attention output, heads merged (bsd): input of the output projection
      SwiGLU       w1x, sigmoid(w1x), silu(w1x), w3x, silu·w3x (5·bsf)
    Outside the blocks: final RMSNorm (2·bsd + bs), its output (bsd, LM-head input), and in
    cross-entropy the shifted logits (logits − max, bsV: gather's backward keeps its whole input,
    though it needs only the shape), their exp (bsV) and its row sums (bs). The raw logits are freed.
    Not counted: parameters, buffers, token ids and targets (the caller's inputs).
    Under bf16 autocast the mix changes (bf16 copies for matmuls, fp32 norms); `bytes_per` then only
    gives a uniform-size estimate."""
    b, s, d, f, h = batch, seq, d_model, d_ff, num_heads
    hd = d // h
    bsd = b * s * d
    per_block = {
        "rmsnorm (x, rms, x*rms) x2": 2 * (2 * bsd + b * s) * bytes_per,
        "norm outputs (matmul inputs) x2": 2 * bsd * bytes_per,
        "rope cos/sin tables": 2 * s * hd * bytes_per,
        "q, k after rope": 2 * bsd * bytes_per,
        "v (contiguous copy)": bsd * bytes_per,
        "causal mask (bool)": s * s,
        "softmax probs (b,h,s,s)": b * h * s * s * bytes_per,
        "attention output (merged heads)": bsd * bytes_per,
        "swiglu w1x, sigmoid, silu, w3x, product": 5 * b * s * f * bytes_per,
    }
    out = {f"blocks: {k}": num_layers * v for k, v in per_block.items()}
    out["final rmsnorm + lm-head input"] = (3 * bsd + b * s) * bytes_per
    out["cross-entropy shifted logits, exp, row sums"] = (2 * b * s * vocab + b * s) * bytes_per
    return out


def activation_bytes(batch: int, seq: int, d_model: int, d_ff: int, num_heads: int, num_layers: int,
                     vocab: int = 10_000, bytes_per: int = FP32) -> int:
    """Total of activation_breakdown (see there for exactly which tensors are counted)."""
    return sum(activation_breakdown(batch, seq, d_model, d_ff, num_heads, num_layers, vocab, bytes_per).values())


def attention_scores_bytes(batch: int, seq: int, num_heads: int, bytes_per: int = FP32) -> int:
    """One (b, h, s, s) score/probability matrix: the term that makes naive attention quadratic."""
    return batch * num_heads * seq * seq * bytes_per


ZERO_STAGES = {0: "DDP (replicated)", 1: "optimizer state sharded (simple sharded optimizer / ZeRO-1)",
               2: "+ gradients sharded (ZeRO-2)", 3: "+ parameters sharded (ZeRO-3 / FSDP)"}


def memory_breakdown(n_params: int, world_size: int = 1, zero_stage: int = 0, activations: int = 0,
                     bytes_per: int = FP32) -> dict[str, float]:
    """Per-rank bytes of parameters, gradients and AdamW state (all fp32 by default), plus the
    caller's activation bytes (never sharded here: each rank holds those of its own micro-batch).

    zero_stage 0 = plain DDP; 1 = optimizer state ÷ world (what both the simple sharded optimizer and
    ZeRO-1 do: they differ in communication, not memory); 2 also shards gradients; 3 also parameters.
    Sharding is taken as ideal (÷ world); a by-parameter balance leaves the largest shard slightly
    above that."""
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"zero_stage must be one of {sorted(ZERO_STAGES)}, got {zero_stage}")
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    n = world_size
    out = {
        "parameters": param_bytes(n_params, bytes_per) / (n if zero_stage >= 3 else 1),
        "gradients": grad_bytes(n_params, bytes_per) / (n if zero_stage >= 2 else 1),
        "optimizer_state": adam_state_bytes(n_params, bytes_per) / (n if zero_stage >= 1 else 1),
        "activations": float(activations),
    }
    out["total"] = sum(out.values())
    return out


# ----------------------------------------------------------------------------------------------
# 2. communication_accounting: the XXL model (126 blocks of two linears, no attention/embeddings)

XXL = dict(d_model=16384, d_ff=53248, num_blocks=126)
H100_BYTES = 80e9   # "H100 80GB"
V5P_BYTES = 95e9    # "1 v5p TPU (95GB per device)"


def xxl_params(d_model: int = XXL["d_model"], d_ff: int = XXL["d_ff"], num_blocks: int = XXL["num_blocks"]) -> int:
    """Each block: d_model→d_ff and d_ff→d_model, no biases."""
    return num_blocks * 2 * d_model * d_ff


def xxl_state_bytes(d_model: int = XXL["d_model"], d_ff: int = XXL["d_ff"], num_blocks: int = XXL["num_blocks"],
                    bytes_per: int = FP32) -> dict[str, int]:
    """(a) fp32 master weights, accumulated gradients and AdamW state (m, v)."""
    p = xxl_params(d_model, d_ff, num_blocks)
    out = {"master_weights": param_bytes(p, bytes_per), "gradients": grad_bytes(p, bytes_per),
           "optimizer_state": adam_state_bytes(p, bytes_per)}
    out["total"] = sum(out.values())
    return out


def xxl_activation_bytes(tokens: int, d_model: int = XXL["d_model"], d_ff: int = XXL["d_ff"],
                         num_blocks: int = XXL["num_blocks"], act_bytes: int = BF16) -> int:
    """(a) activations saved for backward in bf16: per block and token, the input of each linear
    (d_model for the first, d_ff for the second); a linear's weight gradient needs its input and
    nothing else. (Any nonlinearity between the two linears would add its own input; the model
    as stated has none.)"""
    return tokens * num_blocks * (d_model + d_ff) * act_bytes


def devices_needed(nbytes: float, device_bytes: float = H100_BYTES) -> int:
    return math.ceil(nbytes / device_bytes)


def fsdp_bytes_per_device(n_fsdp: int, tokens: int = 0, activation_shared_fraction: float = 0.5,
                          **xxl) -> float:
    """(b) Per-device bytes when master weights, gradients, optimizer state and half of the
    activations (every second layer's) are sharded over N_FSDP devices:

        M(N) = S / N + A·φ / N + A·(1−φ),   S = 16·P (fp32 state),  A = activations of `tokens`, φ = 0.5

    `tokens` is the batch whose activations A are counted (the (a) quantity); the unsharded half
    stays whole on every device."""
    s = xxl_state_bytes(**xxl)["total"]
    a = xxl_activation_bytes(tokens, **xxl)
    phi = activation_shared_fraction
    return s / n_fsdp + a * phi / n_fsdp + a * (1 - phi)


def min_fsdp_devices(tokens: int = 0, device_bytes: float = V5P_BYTES, activation_shared_fraction: float = 0.5,
                     **xxl) -> int | None:
    """(b) Smallest N_FSDP with M(N) < device_bytes; None when the unsharded activations alone do not
    fit (then no N helps). Solves (S + A·φ) / N < cap − A·(1−φ) for N."""
    s = xxl_state_bytes(**xxl)["total"]
    a = xxl_activation_bytes(tokens, **xxl)
    phi = activation_shared_fraction
    room = device_bytes - a * (1 - phi)
    if room <= 0:
        return None
    n = math.floor((s + a * phi) / room) + 1  # strict "<": the smallest integer above the ratio
    assert fsdp_bytes_per_device(n, tokens, phi, **xxl) < device_bytes
    return n


TPU_V5P = dict(w_ici=TPU_V5P_FIGURES.W, c=TPU_V5P_FIGURES.C, m_x=2, m_y=1, x=16, y=4)


def fsdp_tp_forward_times(tokens: float, d_model: int = XXL["d_model"], d_ff: int = XXL["d_ff"],
                          w_ici: float = TPU_V5P["w_ici"], c: float = TPU_V5P["c"], m_x: int = TPU_V5P["m_x"],
                          m_y: int = TPU_V5P["m_y"], x: int = TPU_V5P["x"], y: int = TPU_V5P["y"],
                          comm_bytes: int = BF16) -> dict[str, float]:
    """(c) Forward time of one block (two linears) on an X (FSDP) × Y (TP) mesh, following the
    Scaling Book's FSDP + tensor-parallel analysis. `tokens` = global batch B in tokens, N = X·Y chips:

      T_math = 2 matmuls · 2·B·D·F FLOP / (N·C)
      T_FSDP = all-gather over X of both weight matrices' TP slice, bf16: 2·(D·F/Y)·2 bytes
               at M_X·W_ici (all-gather cost ≈ bytes / bandwidth of the links used; (X−1)/X ≈ 1)
      T_TP   = all-gather of the input activations and reduce-scatter of the output over Y,
               each (B/X)·D bf16 values, at M_Y·W_ici
    """
    n = x * y
    t_math = 2 * 2 * tokens * d_model * d_ff / (n * c)
    t_fsdp = 2 * comm_bytes * d_model * d_ff / y / (w_ici * m_x)
    t_tp = 2 * comm_bytes * tokens * d_model / x / (w_ici * m_y)
    return {"t_math": t_math, "t_fsdp": t_fsdp, "t_tp": t_tp}


def compute_bound_batch(d_model: int = XXL["d_model"], d_ff: int = XXL["d_ff"], w_ici: float = TPU_V5P["w_ici"],
                        c: float = TPU_V5P["c"], m_x: int = TPU_V5P["m_x"], m_y: int = TPU_V5P["m_y"],
                        x: int = TPU_V5P["x"], y: int = TPU_V5P["y"], comm_bytes: int = BF16) -> dict[str, float]:
    """(c) Per-device token batch b = B/N at which the forward is compute bound on the fixed X×Y mesh.

    With α = C / W_ici and communication overlapped with compute (the two collectives use different
    mesh axes, so they also overlap each other): T_math ≥ max(T_FSDP, T_TP).
      T_math ≥ T_FSDP  ⇔  b ≥ α / (M_X · Y)            (weights gathered once, amortised over b)
      T_math ≥ T_TP    ⇔  F ≥ α · Y / M_Y              (independent of the batch: a check, not a bound)
    Also returned: the bound if the two collectives serialise (T_math ≥ T_FSDP + T_TP), and the Scaling
    Book's closed form α² / (M_X·M_Y·F), which holds when X is chosen optimally for the batch
    (X_opt = sqrt(B·M_X·N / (F·M_Y))) rather than fixed; that X is reported too."""
    n = x * y
    alpha = c / w_ici
    # comm_bytes / 2 rescales the bf16 (2-byte) derivation to another wire dtype.
    k = comm_bytes / 2
    b_fsdp = k * alpha / (m_x * y)
    tp_ok = d_ff >= k * alpha * y / m_y
    denom = 1 - k * alpha * y / (m_y * d_ff)
    b_serial = b_fsdp / denom if denom > 0 else math.inf
    b_book = (k * alpha) ** 2 / (m_x * m_y * d_ff)
    per_device = math.ceil(b_fsdp)
    return {
        "alpha": alpha, "n_chips": n,
        "per_device_tokens": b_fsdp, "per_device_tokens_int": per_device, "global_tokens": b_fsdp * n,
        "global_tokens_int": per_device * n, "tp_compute_bound": tp_ok,
        "per_device_tokens_serialised": b_serial, "global_tokens_serialised": b_serial * n,
        "book_optimal_x_per_device_tokens": b_book,
        "book_optimal_x": math.sqrt(b_book * n * n * m_x / (d_ff * m_y)),
    }


# ----------------------------------------------------------------------------------------------
# 3. ddp_overlap_bucketed (b): bucket overhead model; latency/bandwidth fit of all-reduce timings


def bucketed_overhead(total_bytes: float, n_buckets: float, per_call_overhead: float, bandwidth: float) -> float:
    """Time left after backward ends, T(n_b) = n_b·o + s / (n_b·w).

    Assumptions (the assignment's): n_b equal buckets of s/n_b bytes; computing a bucket's gradients
    takes as long as communicating it, so every bucket but the last is hidden behind backward and
    the last one's transfer, s/(n_b·w), is exposed; each all-reduce call costs a fixed o that does
    not overlap (launch/synchronisation). w is the all-reduce *algorithm* bandwidth (bytes per rank
    ÷ time), as the assignment defines it."""
    if n_buckets <= 0:
        raise ValueError("n_buckets must be positive")
    return n_buckets * per_call_overhead + total_bytes / (n_buckets * bandwidth)


def optimal_n_buckets(total_bytes: float, per_call_overhead: float, bandwidth: float) -> float:
    """dT/dn_b = o − s/(n_b²·w) = 0  ⇒  n_b* = sqrt(s / (o·w))."""
    return math.sqrt(total_bytes / (per_call_overhead * bandwidth))


def optimal_bucket_bytes(total_bytes: float, per_call_overhead: float, bandwidth: float) -> float:
    """s / n_b* = sqrt(s·o·w)."""
    return math.sqrt(total_bytes * per_call_overhead * bandwidth)


def min_bucketed_overhead(total_bytes: float, per_call_overhead: float, bandwidth: float) -> float:
    """T(n_b*) = 2·sqrt(s·o / w): both terms equal at the optimum."""
    return 2 * math.sqrt(total_bytes * per_call_overhead / bandwidth)


def overhead_for_bucket_size(total_bytes: float, bucket_bytes: float, per_call_overhead: float,
                             bandwidth: float) -> float:
    """T at n_b = max(1, s / bucket_bytes) (a bucket larger than the model is one bucket)."""
    return bucketed_overhead(total_bytes, max(1.0, total_bytes / bucket_bytes), per_call_overhead, bandwidth)


def fit_latency_bandwidth(sizes_bytes: Sequence[float], times_s: Sequence[float],
                          relative: bool = False) -> tuple[float, float]:
    """Least-squares fit of t = o + S/w to all-reduce timings; returns (o seconds, w bytes/s).

    S must be each rank's buffer size, so w is the algorithm bandwidth (nccl-tests `algbw` = S/t at
    large S), the w of bucketed_overhead; bus bandwidth is bus_bandwidth(w, n). Needs ≥ 2 distinct
    sizes; a fitted intercept below zero (noise at tiny sizes) is returned as is, for the caller to see.

    relative: minimise the relative residuals (weights 1/t²) instead of the absolute ones. Sizes
    spanning decades make the absolute fit a line through the largest sizes alone, whose intercept
    goes negative when the per-byte cost grows with size (gloo's at 100 MB-1 GB); the relative fit
    weighs every size alike, so o is what the small sizes show."""
    xs, ys = [float(v) for v in sizes_bytes], [float(v) for v in times_s]
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("need matching lists with at least two distinct sizes")
    ws = [1.0 / (t * t) if relative else 1.0 for t in ys]
    n = sum(ws)
    mx, my = sum(w * a for w, a in zip(ws, xs)) / n, sum(w * b for w, b in zip(ws, ys)) / n
    sxx = sum(w * (a - mx) ** 2 for w, a in zip(ws, xs))
    slope = sum(w * (a - mx) * (b - my) for w, a, b in zip(ws, xs, ys)) / sxx
    if slope <= 0:
        raise ValueError("time does not grow with size: no bandwidth can be fitted")
    return my - slope * mx, 1.0 / slope


def algbw(nbytes: float, seconds: float) -> float:
    """nccl-tests algorithm bandwidth: bytes per rank ÷ time."""
    return nbytes / seconds


BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
              "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def bus_bandwidth(alg_bandwidth: float, world_size: int, op: str = "all_reduce") -> float:
    """nccl-tests bus bandwidth: algbw × the op's factor (all-reduce 2(n−1)/n), comparable to link
    bandwidth whatever n is."""
    return alg_bandwidth * BUS_FACTOR[op](world_size)


# ----------------------------------------------------------------------------------------------
# 4. Per-rank communication volume per training step (bytes each rank sends, = bytes it receives
#    for these ring algorithms). Ψ = bytes of the full gradient (= of the parameters, same dtype).


# ring_all_reduce_bytes, ring_reduce_scatter_bytes, ring_all_gather_bytes(S, N): impl.parallelism_calcs
# (imported above), where the 2026 edition's calculations use them too.


def comm_volume_per_rank(psi: float, n: int) -> dict[str, float]:
    """Per-rank bytes per step:
      ddp             all-reduce of the gradients                         2(n−1)/n·Ψ
      sharded_simple  all-reduce of gradients, then each owner broadcasts its updated shard
                      (n broadcasts of Ψ/n; a rank receives all shards but its own)  3(n−1)/n·Ψ
      zero1           reduce-scatter of gradients to the shard owners, all-gather of the updated
                      parameters                                           2(n−1)/n·Ψ (= DDP)
      fsdp            all-gather of parameters in forward and again in backward, reduce-scatter of
                      gradients                                             3(n−1)/n·Ψ
    With n = 1 every volume is zero."""
    ar, rs, ag = ring_all_reduce_bytes(psi, n), ring_reduce_scatter_bytes(psi, n), ring_all_gather_bytes(psi, n)
    return {"ddp": ar, "sharded_simple": ar + ag, "zero1": rs + ag, "fsdp": 2 * ag + rs}


# ----------------------------------------------------------------------------------------------
# 5. gradient_checkpointing: peak activation memory and recomputation per policy (impl.checkpointing)
#
# L blocks; B = bytes one block saves for backward; R = one residual-stream tensor (a checkpoint
# boundary). Gradient buffers in flight (a few R) and the parts outside the blocks (embedding
# output, final norm, logits, loss) are not in these block-stack figures; the caller adds them.

CHECKPOINT_POLICIES = ("none", "every_k", "nested")


def checkpoint_terms(batch: int, seq: int, d_model: int, d_ff: int, num_heads: int, vocab: int = 10_000,
                     bytes_per: int = FP32) -> dict[str, int]:
    """B (a_block), R (a_resid) and the outside-the-blocks bytes (a_outside), from
    activation_breakdown: B = activations(L=1) − activations(L=0)."""
    one = activation_bytes(batch, seq, d_model, d_ff, num_heads, 1, vocab, bytes_per)
    zero = activation_bytes(batch, seq, d_model, d_ff, num_heads, 0, vocab, bytes_per)
    return dict(a_block=one - zero, a_resid=residual_stream_bytes(batch, seq, d_model, bytes_per), a_outside=zero)


def _segments(num_layers: int, k: int) -> list[int]:
    return [min(k, num_layers - lo) for lo in range(0, num_layers, k)]


def nested_first_half(n: int) -> int:
    """Same split as impl.checkpointing.nested_split (kept torch-free here; a test ties the two)."""
    return n // 2


def _nested_peak(n: int, a_block: float, a_resid: float) -> float:
    """P(n): peak bytes of an n-block segment, its own input included (a plain block's B already
    holds its input: RMSNorm saves it). Forward keeps the segment's input (R, saved by the first
    half's checkpoint) while the second half recurses; backward then recomputes the first half
    under the same scheme: P(n) = max(R + P(n − h), P(h)), P(1) = B, so P(L) = ceil(log2 L)·R + B."""
    if n <= 1:
        return a_block * n
    h = nested_first_half(n)
    return max(a_resid + _nested_peak(n - h, a_block, a_resid), _nested_peak(h, a_block, a_resid))


def _nested_recompute(n: int) -> int:
    """Rc(n) = Rc(n − h) + h + Rc(h), Rc(1) = 0: the first half is run once more in backward, and
    that rerun's own backward recomputes its first half, and so on."""
    if n <= 1:
        return 0
    h = nested_first_half(n)
    return _nested_recompute(n - h) + h + _nested_recompute(h)


def checkpoint_peak_activation_bytes(policy: str, num_layers: int, a_block: float, a_resid: float,
                                     k: int | None = None) -> float:
    """Peak bytes the block stack keeps for backward under a policy (see impl.checkpointing). A
    boundary is one R; a plain block's B already includes its own input (RMSNorm saves it).
      none     L·B
      every_k  n_seg segments of k (the last k_last), all but the last checkpointed. End of forward:
               (n_seg − 1)·R + k_last·B. Backward of segment j: the inputs of segments 0..j−1 plus
               the recomputed k·B (which holds segment j's input): (n_seg − 2)·R + k·B at most.
               Peak = the larger, ≈ (L/k)·R + k·B
      nested   P(L) = ceil(log2 L)·R + B (see _nested_peak): O(log L) boundaries, one block."""
    L = num_layers
    if policy == "none":
        return L * a_block
    if policy == "every_k":
        if k is None or k < 1:
            raise ValueError(f"every_k needs k >= 1, got {k!r}")
        seg = _segments(L, k)
        if len(seg) == 1:
            return L * a_block
        n = len(seg)
        return max((n - 1) * a_resid + seg[-1] * a_block, (n - 2) * a_resid + max(seg) * a_block)
    if policy == "nested":
        return _nested_peak(L, a_block, a_resid)
    raise ValueError(f"unknown policy {policy!r}; expected one of {CHECKPOINT_POLICIES}")


def checkpoint_block_forwards(policy: str, num_layers: int, k: int | None = None) -> int:
    """Block forward calls per training step (forward + backward), recomputation included:
    none L; every_k L + (L − k_last) (every checkpointed block once more); nested L + Rc(L),
    = L + (L/2)·log2 L for L a power of two."""
    L = num_layers
    if policy == "none":
        return L
    if policy == "every_k":
        return L + L - _segments(L, k)[-1]
    if policy == "nested":
        return L + _nested_recompute(L)
    raise ValueError(f"unknown policy {policy!r}; expected one of {CHECKPOINT_POLICIES}")


def checkpoint_recompute_flops(policy: str, num_layers: int, block_forward_flops: float, k: int | None = None) -> float:
    """FLOPs spent recomputing: (block forwards − L) × one block's forward FLOPs."""
    return (checkpoint_block_forwards(policy, num_layers, k) - num_layers) * block_forward_flops


def best_every_k(num_layers: int, a_block: float, a_resid: float) -> int:
    """The k in 1..L minimising checkpoint_peak_activation_bytes("every_k"); ties go to the larger
    k (fewer segments, the same recomputation). Minimising (L/k)·R + k·B over real k gives
    k ≈ sqrt(L·R / B): when a block saves many residual-streams' worth (B ≫ R, long sequences with
    naive attention) the best k is small."""
    peaks = {k: checkpoint_peak_activation_bytes("every_k", num_layers, a_block, a_resid, k)
             for k in range(1, num_layers + 1)}
    low = min(peaks.values())
    return max(k for k, v in peaks.items() if v == low)


def every_k_neighbours(k: int, num_layers: int) -> list[int]:
    """k with k/2, k±1, 2k, and round(sqrt(L)) (the textbook choice, as a reference), in 1..L."""
    cand = {max(1, k // 2), k - 1, k, k + 1, 2 * k, max(1, round(math.sqrt(num_layers)))}
    return sorted(c for c in cand if 1 <= c <= num_layers)


def checkpoint_forward_end_bytes(policy: str, num_layers: int, a_block: float, a_resid: float,
                                 k: int | None = None) -> float:
    """Block-stack bytes kept at the end of forward (before any recomputation): none L·B; every_k
    (n_seg − 1)·R + k_last·B; nested its peak P(L) (reached there). Forward's end is where the
    loss' tensors and, under autocast, the cast-weight cache also live, so a step's peak is the
    larger of this phase and backward's (checkpoint_peak_activation_bytes plus the gradients)."""
    if policy == "every_k":
        seg = _segments(num_layers, k)
        return (len(seg) - 1) * a_resid + seg[-1] * a_block
    return checkpoint_peak_activation_bytes(policy, num_layers, a_block, a_resid, k)


def checkpoint_step_peak_bytes(policy: str, num_layers: int, a_block: float, a_resid: float, a_outside: float,
                               param_bytes_: float, grad_bytes_: float, cast_cache_bytes: float = 0.0,
                               k: int | None = None) -> dict[str, float]:
    """Peak of one forward+backward step (gradients set to None before it, no optimizer state):
      forward end  parameters + autocast's cast-weight cache (kept until autocast exits, i.e. the
                   end of forward; 0 without autocast) + block stack at forward end + a_outside
      backward     parameters + gradients + the block stack's peak (the head's tensors are freed
                   in its backward, before the stack's; at that point few gradients exist, so all
                   gradients is an upper estimate)
    Returns both phases and their maximum ("peak")."""
    fwd = (param_bytes_ + cast_cache_bytes + a_outside
           + checkpoint_forward_end_bytes(policy, num_layers, a_block, a_resid, k))
    bwd = param_bytes_ + grad_bytes_ + checkpoint_peak_activation_bytes(policy, num_layers, a_block, a_resid, k)
    return dict(forward_end=fwd, backward=bwd, peak=max(fwd, bwd))


# ----------------------------------------------------------------------------------------------
# 6. fsdp_accounting (a), 2026 edition: FSDP's saving at the peak, against replicated DDP


@dataclass(frozen=True)
class FSDPPeakSaving:
    """Predicted per-rank peaks (bytes) of DDP (ZeRO-0) and FSDP (ZeRO-3) and their difference."""
    ddp_peak: float
    fsdp_peak: float
    in_flight: float   # FSDP's unsharded buffers at its peak (see fsdp_peak_saving)
    saving: float      # ddp_peak − fsdp_peak
    fraction: float    # saving / ddp_peak


def largest_sharded_layer_numel(d_model: int, d_ff: int, vocab: int = 10_000) -> int:
    """The biggest weight FSDP gathers whole in the basics LM: embedding / LM head (V·d) or an FFN
    matrix (d·d_ff); attention projections are d·d."""
    return max(vocab * d_model, d_model * d_ff, d_model * d_model)


def fsdp_peak_saving(n_params: int, world_size: int, largest_layer_numel: int, activations: float = 0.0,
                     prefetch: int = 1, outstanding_reduce_scatters: int = 2, gather_bytes: int = FP32,
                     bytes_per: int = FP32) -> FSDPPeakSaving:
    """fsdp_accounting (a). From memory_breakdown: DDP keeps parameters, gradients and AdamW state
    whole (16 bytes per parameter in fp32), FSDP keeps 1/N of each; activations are the same per
    rank in both (each rank runs its own micro-batch), so they cancel in the saving:

        saving = (P + G + S)·(N − 1)/N − in_flight

    in_flight: what impl.distributed.FSDP holds unsharded at its peak (start of backward), an upper
    estimate with the largest layer L: the weight in use plus `prefetch` prefetched ones, gathered in
    `gather_bytes`, and `outstanding_reduce_scatters` + 1 full fp32 gradient buffers (the one being
    produced and those whose reduce-scatter is still in flight). For xl on 2 GPUs that is ~0.3 GB
    against a saving of ~16 GB: the saving is (N−1)/N of the 16-byte state."""
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if prefetch < 0 or outstanding_reduce_scatters < 0:
        raise ValueError(f"prefetch and outstanding_reduce_scatters must be >= 0, got {prefetch}, "
                         f"{outstanding_reduce_scatters}")
    ddp = memory_breakdown(n_params, world_size, 0, activations, bytes_per)["total"]
    fsdp = memory_breakdown(n_params, world_size, 3, activations, bytes_per)["total"]
    in_flight = 0.0
    if world_size > 1:
        in_flight = ((1 + prefetch) * gather_bytes + (outstanding_reduce_scatters + 1) * FP32) * largest_layer_numel
    fsdp += in_flight
    return FSDPPeakSaving(ddp_peak=ddp, fsdp_peak=fsdp, in_flight=in_flight, saving=ddp - fsdp,
                          fraction=(ddp - fsdp) / ddp if ddp else 0.0)
