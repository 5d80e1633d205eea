"""Workers for correctness/test_ddp_reduce_to_owner.py (spawn imports them by qualified name): the
ZeRO-2 gradient sync (impl.distributed.DDPReduceToOwner) beside DDPBucketed on the same seed."""
from __future__ import annotations

import torch

from impl.distributed.ddp import DDPBucketed, DDPReduceToOwner
from impl.distributed.sharded_optimizer import ShardedOptimizer
from kits.distributed import PER_RANK_BATCH, _device, local_slice, make_batch, make_model

KINDS = ("mlp", "tied", "frozen")  # frozen: a frozen weight and a trainable parameter the forward never uses
BUCKETS_MB = {"per_param": 1e-9, "few": 5e-4, "one": 1000.0}  # the mlp is ~2 KB: a bucket a param, a few, one
STEPS = 2


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}


def equivalence(rank: int, world_size: int, average: bool) -> dict:
    """Per (model kind, bucket size): STEPS steps of the all-reduce path (DDPBucketed + ShardedOptimizer)
    and the reduce-to-owner path (the same optimizer's owners), each model from a rank-dependent seed
    (the broadcast makes them equal). Per step: the names whose grads differ bit for bit on owned
    parameters, the non-owned that hold a grad, the params with a grad between backward and the
    finish (all freed into buckets), the bytes sent; after the steps, the params whose weights
    differ bit for bit, the largest difference, and how far training moved them."""
    device = _device(rank)
    out = {}
    for kind in KINDS:
        for bucket_name, mb in BUCKETS_MB.items():
            ref_model, model = make_model(kind, 10 + rank, device), make_model(kind, 10 + rank, device)
            ref_opt = ShardedOptimizer(ref_model.parameters(), torch.optim.AdamW, lr=1e-2)
            ref_ddp = DDPBucketed(ref_model, mb, average=average)
            opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-2)
            ddp = DDPReduceToOwner(model, mb, owner=opt.owner, average=average)
            init = [p.detach().clone() for p in model.parameters()]
            names = dict(model.named_parameters())
            owned = {n for n, p in names.items() if opt.owner[id(p)] == rank}
            steps = []
            for step in range(STEPS):
                batch = local_slice(make_batch(kind, step, PER_RANK_BATCH * world_size, device), rank, world_size)
                for m, d, o in ((ref_model, ref_ddp, ref_opt), (model, ddp, opt)):
                    o.zero_grad()
                    m.loss(batch).backward()
                    if m is model:
                        held = sorted(n for n, p in names.items() if p.grad is not None)
                    d.finish_gradient_synchronization()
                ref_grads, grads = _grads(ref_model), _grads(model)
                both = [n for n in owned if grads[n] is not None and ref_grads[n] is not None]
                steps.append(dict(
                    owned_differ=sorted(n for n in both if not torch.equal(grads[n], ref_grads[n])),
                    owned_max_diff=max((_rel(grads[n], ref_grads[n]) for n in both), default=0.0),
                    owned_grad_none_differ=sorted(n for n in owned if (grads[n] is None) != (ref_grads[n] is None)),
                    owned_with_grad=sorted(n for n in owned if grads[n] is not None),
                    not_owned_with_grad=sorted(n for n in names if n not in owned and grads[n] is not None),
                    grad_is_bucket_view=all(p.grad._base is not None for n, p in names.items()
                                            if n in owned and p.grad is not None),
                    held_before_finish=held,
                    buffers_after_finish=sum(b.buffer is not None for b in ddp.buckets),
                    bytes=ddp.bytes_communicated_last_step, ref_bytes=ref_ddp.bytes_communicated_last_step))
                ref_opt.step()
                opt.step()
            out[(kind, bucket_name)] = dict(
                steps=steps, owned=sorted(owned), buckets=[(b.owner, len(b.params)) for b in ddp.buckets],
                ref_buckets=len(ref_ddp.buckets),
                mixed_buckets=any(opt.owner[id(p)] != b.owner for b in ddp.buckets for p in b.params),
                weights_differ=[n for (n, p), q in zip(ref_model.named_parameters(), model.parameters())
                                if not torch.equal(p, q)],
                weights_max_diff=max((p - q).abs().max().item() for p, q in zip(ref_model.parameters(),
                                                                                 model.parameters())),
                moved=max((p - p0).abs().max().item() for p0, p in zip(init, model.parameters())))
    return out
