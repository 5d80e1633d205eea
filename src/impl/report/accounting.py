"""Report sections: communication_accounting (2.4), the ddp_overlap_bucketed (b) model, per-rank
communication volumes, and memory_accounting, from the rows perf/test_communication_accounting.py
records (closed forms of impl.accounting; every number is read from the rows' details["results"])."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from impl.model import size_rank
from impl.report.markdown import gib, num, table



def _gb(nbytes, digits: int = 1) -> str:
    return "–" if nbytes is None else f"{nbytes / 1e9:,.{digits}f}"


def _mib(nbytes) -> str:
    return f"{nbytes / 2**20:,.1f}"


def _xxl(r: dict) -> str:
    m, st, cb, tpu = r["model"], r["state"], r["compute_bound"], r["tpu"]
    apt = r["activation_bytes_per_token"]
    out = ["## communication_accounting",
           f"XXL model: {m['num_blocks']} blocks of two linears (d_model {m['d_model']:,} → d_ff {m['d_ff']:,} → "
           f"d_model), no attention or embeddings: P = {m['num_blocks']}·2·{m['d_model']}·{m['d_ff']} = "
           f"{r['n_params']:,} parameters. Decimal GB (1e9 bytes), as device capacities are quoted.",
           "**(a)** FP32 master weights (4P), accumulated gradients (4P) and AdamW moments m, v (8P):",
           table(["item", "GB", "GiB"], [[k.replace("_", " "), _gb(v), gib(v)] for k, v in st.items()]),
           f"That is {r['h100_needed']} H100 80GB GPUs' worth of memory (⌈{_gb(st['total'])} / "
           f"{_gb(r['h100_bytes'])}⌉) before any activation. Activations saved for backward (BF16): each "
           f"linear's weight gradient needs its input, so per token and block d_model + d_ff values, "
           f"2·{m['num_blocks']}·({m['d_model']} + {m['d_ff']}) = {apt:,} bytes per token "
           f"({_gb(apt * 1024)} GB per 1,024 tokens); A(T) = {apt:,}·T bytes for a batch of T tokens.",
           "**(b)** With master weights, optimizer state, gradients and half of the activations (every second "
           "layer's) sharded over N_FSDP devices, and the other half of the activations kept whole on every "
           "device, per device: M(N) = 16P / N + A(T) / (2N) + A(T) / 2. M(N) < 95 GB needs "
           "N > (16P + A/2) / (95 GB − A/2):",
           table(["batch T (tokens)", "A(T) GB", "smallest N_FSDP", "M at that N (GB)"],
                 [[f"{x['tokens']:,}", _gb(x["activation_bytes"]),
                   "none (A/2 ≥ 95 GB)" if x["n_fsdp"] is None else x["n_fsdp"], _gb(x["per_device_bytes"], 3)]
                  for x in r["fsdp"]]),
           f"T = 0 is the weights-and-state answer; above T ≈ {r['fsdp_max_tokens']:,} tokens the unsharded half "
           f"of the activations alone exceeds {_gb(r['v5p_bytes'])} GB and no N_FSDP suffices (checkpointing or "
           f"tensor parallelism must cut it).",
           f"**(c)** TPU v5p: W_ici = {tpu['w_ici']:.3g} B/s, C = {tpu['c']:.3g} FLOP/s, M_X = {tpu['m_x']}, "
           f"M_Y = {tpu['m_y']}, X = {tpu['x']} (FSDP), Y = {tpu['y']} (TP), N = XY = {cb['n_chips']}; forward "
           f"only, bf16 on the wire. Per block, with B the global batch in tokens (Scaling Book, FSDP + TP): "
           f"T_math = 4BDF / (NC); T_FSDP = 4DF / (Y·W_ici·M_X) (all-gather of both weights' TP slices over X); "
           f"T_TP = 4BD / (X·W_ici·M_Y) (all-gather in, reduce-scatter out, over Y). With α = C / W_ici = "
           f"{num(cb['alpha'], 1)} and communication overlapped with compute:",
           table(["condition", "per-device tokens B/N", "overall batch B (tokens)"], [
               ["T_math ≥ T_FSDP ⇔ B/N ≥ α / (M_X·Y)", num(cb["per_device_tokens"], 1),
                num(cb["global_tokens"], 0)],
               ["rounded up to whole tokens", cb["per_device_tokens_int"], f"{cb['global_tokens_int']:,}"],
               ["if the two collectives serialise: T_math ≥ T_FSDP + T_TP", num(cb["per_device_tokens_serialised"], 1),
                num(cb["global_tokens_serialised"], 0)],
               [f"Scaling Book α² / (M_X·M_Y·F), valid only with X = X_opt ≈ {num(cb['book_optimal_x'], 1)} "
                f"(not X = {tpu['x']})", num(cb["book_optimal_x_per_device_tokens"], 1),
                num(cb["book_optimal_x_per_device_tokens"] * cb["n_chips"], 0)]]),
           f"T_math ≥ T_TP reduces to F ≥ α·Y / M_Y, independent of the batch: "
           f"{'holds' if cb['tp_compute_bound'] else 'fails'} for F = {m['d_ff']:,}. So on this mesh the weight "
           f"all-gathers set the bound: about {cb['per_device_tokens_int']} tokens per device, "
           f"{cb['global_tokens_int']:,} tokens per step overall (e.g. {cb['global_tokens_int'] // 2048} sequences "
           f"of 2,048). At that batch one block's forward takes {r['times_at_bound']['t_math'] * 1e3:.2f} ms of "
           f"compute against {r['times_at_bound']['t_fsdp'] * 1e3:.2f} ms of FSDP and "
           f"{r['times_at_bound']['t_tp'] * 1e3:.2f} ms of TP communication.",
           "**(d)** Ways to stay compute bound at a smaller batch: (1) shift parallelism from FSDP to tensor / "
           "sequence parallelism, which shards compute without re-gathering weights (the optimal-X row above: "
           "fewer FSDP ways cut the per-device batch the all-gathers need); (2) pipeline parallelism across "
           "layers, whose communication is small activations, not weights; (3) fewer bytes on the wire: fp8 or "
           "compressed weight all-gathers and gradient reduce-scatters scale the bound down linearly; (4) "
           "gather each layer's weights once per step, not once per micro-batch (keep them gathered across "
           "gradient-accumulation micro-batches, memory permitting), and prefetch so all-gathers overlap the "
           "previous layer's compute; (5) map the sharded axes onto the fastest links (more ICI axes per "
           "collective raises M_X)."]
    return "\n\n".join(out)


def _bucket(r: dict) -> str:
    rows = [[num(x["bucket_mb"], 0), num(x["n_buckets"], 1), f"{x['overhead_s'] * 1e3:.2f}"] for x in r["rows"]]
    return "\n\n".join([
        "### ddp_overlap_bucketed (b): bucket overhead model",
        "Assume computing a bucket's gradients takes as long as communicating it, n_b equal buckets of s / n_b "
        "bytes, a fixed per-call overhead o and all-reduce algorithm bandwidth w (bytes per rank ÷ time, the "
        "nccl-tests algbw). Every bucket but the last overlaps backward; what remains after backward is "
        "T(n_b) = n_b·o + s / (n_b·w). dT/dn_b = 0 gives n_b* = √(s / (o·w)), i.e. the optimal bucket size "
        "s / n_b* = √(s·o·w), and T* = 2√(s·o / w).",
        f"Example for {r['model']} fp32 gradients (s = {_gb(r['total_bytes'])} GB) with **placeholder** "
        f"o = {r['o_s'] * 1e6:.0f} µs and w = {_gb(r['w_Bps'])} GB/s (inputs, not measurements; the distributed "
        f"section fits o and w to its all-reduce timings): optimal bucket {r['optimal_bucket_bytes'] / 1e6:,.1f} MB "
        f"(n_b* = {num(r['optimal_n_buckets'], 1)}), T* = {r['min_overhead_s'] * 1e3:.2f} ms vs "
        f"{r['single_bucket_s'] * 1e3:.2f} ms with one bucket.",
        table(["bucket size (MB)", "n_b", "modelled overhead T (ms)"], rows)])


def _volumes(r: dict) -> str:
    rows = [[x["world_size"]] + [_gb(x[k]) for k in ("ddp", "sharded_simple", "zero1", "fsdp")] for x in r["rows"]]
    return "\n\n".join([
        "### Communication volume per rank and step",
        f"Ψ = {r['model']} fp32 gradient bytes = {_gb(r['psi_bytes'])} GB; ring collectives, bytes each rank "
        "sends (= receives). DDP all-reduce 2(n−1)/n·Ψ; the simple sharded optimizer adds each owner's "
        "broadcast of its updated shard, (n−1)/n·Ψ more (3(n−1)/n·Ψ); ZeRO-1 replaces all-reduce + broadcast by "
        "reduce-scatter of gradients and all-gather of parameters, 2(n−1)/n·Ψ, the same as DDP; FSDP gathers "
        "parameters twice (forward, backward) and reduce-scatters gradients, 3(n−1)/n·Ψ.",
        table(["ranks", "DDP (GB)", "sharded optimizer (GB)", "ZeRO-1 (GB)", "FSDP (GB)"], rows)])


def _memory(res: dict) -> str:
    sizes = sorted(res, key=lambda s: size_rank(s))
    first = res[sizes[0]]
    contexts = list(first["activation_bytes"])
    ws = first["world_size"]
    rows = []
    for s in sizes:
        r = res[s]
        rows.append([s, f"{r['n_params'] / 1e6:,.1f}", gib(r["training_state_bytes"]), gib(r["stages"]["1"]["total"])]
                    + [gib(r["activation_bytes"][c]) for c in contexts]
                    + [_mib(r["residual_stream_bytes"][contexts[0]])])
    return "\n\n".join([
        "## memory_accounting",
        f"Closed forms (impl.accounting), fp32 throughout. Training state = parameters + gradients + AdamW "
        f"moments = 16 bytes per parameter (DDP: the same on every rank); with the optimizer state sharded over "
        f"{ws} ranks (simple sharded optimizer or ZeRO-1) a rank keeps 4 + 4 + 8/{ws} bytes per parameter. "
        f"Activations = the bytes autograd keeps from forward into backward at batch {first['batch']} with naive "
        f"attention, fp32, no autocast: per block the two RMSNorms' inputs, rsqrt results and normalised "
        f"inputs, the two norm outputs, RoPE tables, q and k after RoPE, a contiguous v, the causal mask, the "
        f"softmax probabilities (b·h·s², the quadratic term; raw scores are freed), the merged attention "
        f"output and five SwiGLU intermediates; plus the final norm, and cross-entropy's shifted logits, their "
        f"exp and row sums. The count equals the storages autograd holds, checked in correctness/test_accounting.py.",
        table(["size", "params (M)", "train state GiB (DDP, per rank)", f"… state sharded over {ws} (GiB/rank)"]
              + [f"activations ctx {c} (GiB)" for c in contexts] + [f"one residual stream ctx {contexts[0]} (MiB)"],
              rows)])


def render(df: pd.DataFrame, device: str, fig_dir: Path, fig_rel: str) -> str | None:
    if "problem" not in df:
        return None
    comm = df[df.problem == "communication_accounting"]
    mem = df[df.problem == "memory_accounting"]
    parts = []
    if not comm.empty:
        by = {r["cfg.case"]: r["details"]["results"] for _, r in comm.iterrows()}
        if "xxl" in by:
            parts.append(_xxl(by["xxl"]))
        if "bucket_model" in by:
            parts.append(_bucket(by["bucket_model"]))
        if "comm_volumes" in by:
            parts.append(_volumes(by["comm_volumes"]))
    if not mem.empty:
        parts.append(_memory({r["cfg.size"]: r["details"]["results"] for _, r in mem.iterrows()}))
    return "\n\n".join(parts) if parts else None
