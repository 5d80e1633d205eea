"""Rank workers for correctness/test_parallelism_calcs.py and test_tensor_parallel.py: the ring
collectives against torch's, TensorParallel and the 2-D FSDP × TP FFN against single-process
references. Module-level so spawn can import them; each returns plain dicts, the tests assert."""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.distributed as dist

from impl.distributed.release import released
from impl.distributed.fsdp_tp import FSDPTPFeedForward, make_mesh
from impl.distributed.ring import (Traffic, alternate_ring_all_reduce, ring_all_gather, ring_all_reduce,
                                   ring_reduce_scatter)
from impl.distributed.tensor_parallel import TensorParallel
from impl.model import SwiGLU, TransformerLM, cross_entropy

ELEM = 4  # float32


def _ints(seed: int, numel: int) -> torch.Tensor:
    """Integer-valued float32: sums are exact whatever order a collective adds in."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-50, 50, (numel,), generator=g).float()


def _case(result: torch.Tensor, expected: torch.Tensor, traffic: Traffic) -> dict:
    return dict(max_diff=(result - expected).abs().max().item(), bytes_sent=traffic.bytes_sent,
                steps=traffic.steps, calls=traffic.calls, payload_bytes=traffic.payload_bytes)


def _subgroups(world: int, sizes: list[int]) -> dict:
    """size -> process group of ranks 0..size−1 (None for the whole world). Every rank calls
    new_group for every size, in the same order, as torch requires."""
    return {n: None if n == world else dist.new_group(list(range(n))) for n in sizes}


def ring_simulation(rank: int, world: int, sizes: list[int], numels: list[int]) -> dict:
    """For each group size N (ranks 0..N−1) and numel: every ring collective on rank-dependent data,
    against torch's collective (or the exact sum). Key (N, op, numel); numel is each rank's input
    size (the shard, for all-gather). Ranks outside a group skip it."""
    out = {}
    for n, group in _subgroups(world, sizes).items():
        if rank >= n:
            continue
        for numel in numels:
            x = _ints(1000 * rank + numel, numel)
            total = x.clone()
            released(dist.all_reduce, total, group=group)

            t = Traffic()
            parts = [torch.empty_like(x) for _ in range(n)]
            released(dist.all_gather, parts, x, group=group)
            out[n, "all_gather", numel] = _case(ring_all_gather(x, group, t), torch.cat(parts), t)
            t = Traffic()
            out[n, "reduce_scatter", numel] = _case(ring_reduce_scatter(x, group, t),
                                                    torch.tensor_split(total, n)[rank], t)
            t = Traffic()
            out[n, "all_reduce", numel] = _case(ring_all_reduce(x.clone(), group, t), total, t)
            t = Traffic()
            out[n, "alternate_all_reduce", numel] = _case(alternate_ring_all_reduce(x.clone(), group, t), total, t)
    return out


# ---- TensorParallel ---------------------------------------------------------------------------

TINY_LM = dict(d_model=16, num_heads=4, d_ff=32, num_layers=2, vocab_size=50, context_length=16)
BATCH, SEQ = 2, 8


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


@dataclass
class _Reference:
    """The unsharded model's results: logits, loss, gradients, and its state after one SGD step."""
    logits: torch.Tensor
    loss: float
    grads: dict[str, torch.Tensor]
    stepped: dict[str, torch.Tensor]


@torch.no_grad()
def _sgd_step(model: torch.nn.Module, lr: float = 0.1) -> None:
    """Plain SGD by hand: a torch.optim optimizer's first construction imports for seconds per rank."""
    for p in model.parameters():
        p.sub_(lr * p.grad)


def _reference(model: TransformerLM, tokens, targets) -> _Reference:
    ref = copy.deepcopy(model)
    logits = ref(tokens)
    loss = cross_entropy(logits, targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    _sgd_step(ref)
    return _Reference(logits.detach(), loss.item(), grads, ref.state_dict())


def _tp_run(model: TransformerLM, reference: _Reference, tokens, targets, kind: str, group) -> dict:
    """One TensorParallel copy of `model` against the unsharded `reference`: forward, loss,
    gradients, gathered parameters after one SGD step."""
    tp = TensorParallel(copy.deepcopy(model), group=group, collectives=kind)
    logits = tp(tokens)
    loss = cross_entropy(logits, targets)
    fwd = copy.deepcopy(tp.forward_traffic)
    loss.backward()
    bwd = copy.deepcopy(tp.backward_traffic)
    grad_diff = {}
    for name, p in tp.module.named_parameters():
        expected = reference.grads[name]
        dim = tp.sharded.get(name)
        if dim is not None:
            expected = expected.chunk(tp.world_size, dim)[tp.rank]
        grad_diff[name] = _max_abs(p.grad, expected)
    _sgd_step(tp)
    full = tp.gather_full_params()
    stepped = reference.stepped
    return dict(
        logits=_max_abs(logits, reference.logits), loss=abs(loss.item() - reference.loss),
        grads=grad_diff, sharded=sorted(tp.sharded),
        params_after_step=max(_max_abs(full[k], stepped[k]) for k in stepped),
        keys_equal=list(full) == list(stepped),
        local_heads=[blk.attn.num_heads for blk in tp.module.layers],
        forward=vars(fwd), backward=vars(bwd))


def tp_equivalence(rank: int, world: int, sizes: list[int]) -> dict:
    """For each group size N (ranks 0..N−1; a subgroup exercises `group=`): TensorParallel with
    torch's and with our ring collectives against the unsharded model, and the errors for
    indivisible heads / d_ff. Key N, then "torch" / "ring" / "errors"."""
    torch.manual_seed(0)
    model = TransformerLM(**TINY_LM)
    tokens = torch.randint(0, TINY_LM["vocab_size"], (BATCH, SEQ))
    targets = torch.randint(0, TINY_LM["vocab_size"], (BATCH, SEQ))
    reference = _reference(model, tokens, targets)
    out = {}
    for n, group in _subgroups(world, sizes).items():
        if rank >= n:
            continue
        res = {kind: _tp_run(model, reference, tokens, targets, kind, group) for kind in ("torch", "ring")}
        # Indivisible sizes; and d_ff of rank 0 unlike the others' (refused on every rank of the group).
        configs = {"heads": dict(TINY_LM, d_model=12, num_heads=3), "d_ff": dict(TINY_LM, d_ff=31),
                   "disagree": dict(TINY_LM, d_ff=TINY_LM["d_ff"] * (1 if rank == 0 else 2))}
        res["errors"] = {label: _value_error(lambda: TensorParallel(TransformerLM(**cfg), group=group))
                         for label, cfg in configs.items()}
        out[n] = res
    return out


# ---- 2-D FSDP x TP FFN ---------------------------------------------------------------------------

FFN_DIMS = dict(d_model=8, d_ff=16, batch=4, seq=3)


def fsdp_tp_equivalence(rank: int, world: int, n_tp: int, n_fsdp: int) -> dict:
    """The 2-D FFN (torch and ring collectives) against the single-process SwiGLU on the full batch:
    output rows of this rank's batch slice, weight gradients of its block, gathered weights."""
    d, f, b, s = FFN_DIMS["d_model"], FFN_DIMS["d_ff"], FFN_DIMS["batch"], FFN_DIMS["seq"]
    torch.manual_seed(0)
    ffn = SwiGLU(d, f)
    x = torch.randn(b, s, d, requires_grad=True)  # an FFN inside a model passes dx on: TP's backward all-reduce
    dy = torch.randn(b, s, d)  # loss = <y, dy>, summed over the global batch
    ref = copy.deepcopy(ffn)
    y_ref = ref(x)
    (y_ref * dy).sum().backward()
    mesh = make_mesh(n_tp, n_fsdp)
    rows = slice(mesh.fsdp_index * b // n_fsdp, (mesh.fsdp_index + 1) * b // n_fsdp)
    out = dict(tp_index=mesh.tp_index, fsdp_index=mesh.fsdp_index)
    for kind in ("torch", "ring"):
        m = FSDPTPFeedForward(copy.deepcopy(ffn), mesh, collectives=kind)
        x_local = x.detach()[rows].requires_grad_()
        y = m(x_local)
        (y * dy[rows]).sum().backward()
        full = m.gather_full_params()
        out[kind] = dict(
            output=_max_abs(y, y_ref[rows]), input_grad=_max_abs(x_local.grad, x.grad[rows]),
            grads={n: _max_abs(getattr(m, n).grad, m.shard_of(getattr(ref, n).weight.grad, n))
                   for n in ("w1", "w2", "w3")},
            shard_shapes={n: tuple(getattr(m, n).shape) for n in ("w1", "w2", "w3")},
            gathered=max(_max_abs(full[n], getattr(ffn, n).weight) for n in ("w1", "w2", "w3")),
            traffic={f"{axis}/{phase}": vars(t) for (axis, phase), t in m.traffic.items()})
    out["error"] = _value_error(lambda: FSDPTPFeedForward(SwiGLU(d + 1, f), mesh))
    out["disagree"] = _value_error(lambda: FSDPTPFeedForward(SwiGLU(d, f if rank == 0 else 2 * f), mesh))
    return out


def _value_error(build) -> str | None:
    """The message of the ValueError `build()` raises, None if it raises none."""
    try:
        build()
    except ValueError as e:
        return str(e)
    return None
