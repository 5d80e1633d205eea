"""Workers for correctness/test_fsdp.py (the perf file's worker commands are impl.workloads.fsdp_steps).

Every rank builds the same reference model (rank 0's seed) and trains it in one
process on the full batch; the FSDP copy starts from a rank-dependent seed (FSDP broadcasts rank
0's weights) and trains on this rank's slice. With a compute dtype the reference applies the same
casts (a parametrization casts each Linear/Embedding weight, a pre-hook casts the layer's float
inputs) over fp32 master weights. Workers return plain numbers; the tests assert.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from impl.distributed.fsdp import FSDP
from kits.distributed import refusals
from impl.distributed.launcher import device_for
from impl.distributed.release import released
from impl.model import AdamW, Embedding, Linear, RMSNorm, TransformerLM, cross_entropy
from impl.model import MODEL_CONFIGS
from impl.model.transformer import TransformerBlock

VOCAB, SEQ, PER_RANK_BATCH = 97, 8, 3
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class ToyLM(nn.Module):
    """Embedding -> Linear -> RMSNorm -> Linear head (odd sizes: shards need padding)."""

    def __init__(self):
        super().__init__()
        self.embed = Embedding(VOCAB, 13)
        self.up = Linear(13, 29)
        self.norm = RMSNorm(29)
        self.head = Linear(29, VOCAB)

    def forward(self, tokens):
        return self.head(self.norm(torch.tanh(self.up(self.embed(tokens)))))


class Stage(nn.Module):
    """x + out(tanh(proj(x))): a group of two Linears (TiedLM ties the `proj` of its two stages)."""

    def __init__(self, d: int):
        super().__init__()
        self.proj = Linear(d, d)
        self.out = Linear(d, d)

    def forward(self, x):
        return x + self.out(torch.tanh(self.proj(x)))


class TiedLM(nn.Module):
    """Embedding -> Stage -> Stage -> RMSNorm -> head, the head tied to the embedding (both outside
    every Stage) and the stages sharing `proj` (a tie across two groups when the unit is Stage)."""

    def __init__(self, d: int = 11):
        super().__init__()
        self.embed = Embedding(VOCAB, d)
        self.s0, self.s1 = Stage(d), Stage(d)
        self.s1.proj.weight = self.s0.proj.weight
        self.norm = RMSNorm(d)
        self.head = Linear(d, VOCAB)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.norm(self.s1(self.s0(self.embed(tokens)))))


# FSDP's `unit` by name: one unit per weight, per TransformerBlock, per Stage, the whole ToyLM.
UNITS = {"layer": None, "block": TransformerBlock, "stage": Stage, "whole": ToyLM}


@dataclass(frozen=True)
class Case:
    """One training run: model kind, compute dtype, optimizer, prefetch depth, unit name (UNITS)
    and micro-batches per step (more than one: gradients accumulate over that many backwards)."""

    kind: str
    dtype: str
    opt: str
    prefetch: int
    unit: str = "layer"
    micro: int = 1

    @property
    def id(self) -> str:
        return "-".join(map(str, (self.kind, self.dtype, self.opt, self.prefetch, self.unit, self.micro)))


def build(kind: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "toy":
        return ToyLM()
    if kind == "tied":
        return TiedLM()
    if kind == "tiny_lm":
        return TransformerLM(**MODEL_CONFIGS["tiny"].replace(vocab_size=VOCAB), context_length=SEQ)
    raise ValueError(kind)


class _Cast(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, w):
        return w.to(self.dtype)


def cast_reference(model: nn.Module, dtype) -> nn.Module:
    """The single-process model with FSDP's casts: weights of Linear/Embedding layers and their
    float inputs in `dtype`, master weights fp32."""
    if dtype is None:
        return model
    for m in list(model.modules()):
        if isinstance(m, (Linear, Embedding)):
            parametrize.register_parametrization(m, "weight", _Cast(dtype), unsafe=True)
            m.register_forward_pre_hook(
                lambda mod, args: tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                                        for a in args))
    return model


def ref_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k.replace("parametrizations.weight.original", "weight"): v
            for k, v in model.state_dict().items()}


OPTIMIZERS = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.2),
    "adamw_impl": lambda ps: AdamW(ps, lr=1e-2, weight_decay=0.1),
    "adamw_torch": lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1),
}


def batch(step: int, n: int, device=None):
    g = torch.Generator().manual_seed(500 + step)
    tokens = torch.randint(0, VOCAB, (n, SEQ + 1), generator=g).to(device or "cpu")
    return tokens[:, :-1], tokens[:, 1:]


def _device(rank: int) -> torch.device:
    """This rank's device under the group's backend: its own GPU under NCCL, the CPU under gloo."""
    return device_for(dist.get_backend(), rank)


def _loss(model, x, y):
    return cross_entropy(model(x).float(), y)


def _max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b), (list(a), list(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def equivalence(rank, world_size, cases: list[Case], steps):
    """Per case the max over steps of the parameter difference (gather_full_params vs the
    reference), loss difference, and checks of the sharded layout."""
    torch.set_num_threads(1)  # two ranks share a small CPU host
    dev = _device(rank)
    out = {"backend": dist.get_backend()}
    for case in cases:
        dtype = DTYPES[case.dtype]
        ref = cast_reference(build(case.kind, 0).to(dev), dtype)
        fsdp = FSDP(build(case.kind, 7 * rank).to(dev), compute_dtype=dtype, prefetch=case.prefetch,
                    unit=UNITS[case.unit])  # rank 0 = the reference seed
        init = {k: v.clone() for k, v in ref_state(ref).items()}
        res = dict(init_diff=_max_diff(ref_state(ref), fsdp.gather_full_params()), max_diff=0.0, loss_diff=0.0)
        ref_opt, opt = OPTIMIZERS[case.opt](ref.parameters()), OPTIMIZERS[case.opt](fsdp.parameters())
        n = PER_RANK_BATCH
        for step in range(steps):
            x, y = batch(step, n * world_size, dev)
            ref_opt.zero_grad()
            ref_loss = _loss(ref, x, y)
            ref_loss.backward()
            ref_opt.step()

            opt.zero_grad()
            loss = torch.zeros((), device=dev)
            # Micro-batches weighted by their share of the rank's batch: the gradients that
            # accumulate over the backwards are those of the whole batch's mean loss.
            for rows in torch.arange(rank * n, (rank + 1) * n).tensor_split(case.micro):
                part = _loss(fsdp, x[rows], y[rows]) * (len(rows) / n)
                part.backward()
                loss += part.detach()
            fsdp.finish_gradient_synchronization()
            opt.step()
            released(dist.all_reduce, loss)
            res["loss_diff"] = max(res["loss_diff"], abs(loss.item() / world_size - ref_loss.item()))
            res["max_diff"] = max(res["max_diff"], _max_diff(ref_state(ref), fsdp.gather_full_params()))
        full = fsdp.gather_full_params()
        res.update(
            moved=_max_diff(init, ref_state(ref)),
            keys_equal=list(full) == list(build(case.kind, 0).state_dict()),
            device=str(full[next(iter(full))].device),
            all_fp32=all(v.dtype == torch.float32 for v in full.values()),
            shard_dtypes=sorted({str(u.shard.dtype) for u in fsdp.units}),
            shard_grad_dtypes=sorted({str(u.shard.grad.dtype) for u in fsdp.units}),
            sharded_numel=fsdp.sharded_numel(),
            full_sharded_numel=sum(u.numel for u in fsdp.units),
            num_units=len(fsdp.units), unit_names=[u.name for u in fsdp.units],
            unit_keys=[[s.key for s in u.slots] for u in fsdp.units],
            weights_none=all(getattr(m, "weight", 0) is None for m in fsdp.module.modules()
                             if isinstance(m, (Linear, Embedding))),
            bytes=fsdp.bytes_communicated_last_step,
            prefetched=fsdp.prefetched_last_step,
            num_visits=len(fsdp._visits), num_regathered=len(fsdp._packed_visits),
            opt_numel=sum(p.numel() for p in fsdp.parameters()),
        )
        res["expected_bytes"] = _expected_bytes(fsdp, dtype, case.micro)
        out[case] = res
    return out


def timeline(rank, world_size, cases, steps, max_rows):
    """cases: [(model kind, dtype name, prefetch, unit name)]. Trains two FSDP copies in lockstep, one with
    record_timeline, and returns per case whether they stayed identical and the recorded copy's
    last timeline (full and downsampled to `max_rows`) with the call structure to check it against."""
    torch.set_num_threads(1)
    dev = _device(rank)
    out = {}
    for kind, dtype_name, prefetch, unit in cases:
        dtype = DTYPES[dtype_name]
        plain, timed = (FSDP(build(kind, 7 * rank).to(dev), compute_dtype=dtype, prefetch=prefetch,
                             record_timeline=rec, unit=UNITS[unit]) for rec in (False, True))
        opts = [torch.optim.SGD(m.parameters(), lr=0.2) for m in (plain, timed)]
        n, losses_equal = PER_RANK_BATCH, True
        for step in range(steps):
            x, y = batch(step, n * world_size, dev)
            losses = []
            for m, opt in zip((plain, timed), opts):
                opt.zero_grad()
                loss = _loss(m, x[rank * n:(rank + 1) * n], y[rank * n:(rank + 1) * n])
                loss.backward()
                m.finish_gradient_synchronization()
                opt.step()
                losses.append(loss.item())
            losses_equal &= losses[0] == losses[1]
        out[(kind, dtype_name, prefetch, unit)] = dict(
            max_diff=_max_diff(plain.gather_full_params(), timed.gather_full_params()),
            losses_equal=losses_equal, plain_timeline=plain.last_timeline(),
            timeline=timed.last_timeline(), small=timed.last_timeline(max_rows=max_rows),
            num_visits=len(timed._visits), packed_visits=list(timed._packed_visits),
            num_units=len(timed.units), prefetched=timed.prefetched_last_step)
    return out


def _expected_bytes(fsdp: FSDP, dtype, micro: int) -> int:
    """Payload of one step of `micro` forward/backward pairs: per pair every visit of a unit
    gathered once in forward (compute dtype) and once more in backward if autograd saved one of its
    weights (the visits FSDP recorded; the tests pin how many there are per model: a Linear's
    weight is saved, an Embedding's not), every unit's flat gradient reduce-scattered once in fp32;
    then the replicated grads all-reduced in fp32. Every collective moves the padded flat buffer."""
    size = (dtype or torch.float32).itemsize
    gathers = sum(u.gather_numel for u in fsdp._visits)
    regathers = sum(fsdp._visits[v].gather_numel for v in fsdp._packed_visits)
    reduces = sum(u.gather_numel for u in fsdp.units)
    per_pair = (gathers + regathers) * size + reduces * 4
    return micro * per_pair + sum(p.numel() for p in fsdp.replicated) * 4


def misuse(rank, world_size, refusal_cases):
    """Error paths that need a process group, and the refusals (kits.distributed.DISAGREEING) of
    ranks that disagree."""
    torch.set_num_threads(1)
    errors = {"refusals": refusals(rank, world_size, refusal_cases)}
    for label, fn in {
        "bad_dtype": lambda: FSDP(ToyLM(), compute_dtype=torch.int32),
        "bad_prefetch": lambda: FSDP(ToyLM(), prefetch=5),
        "bad_outstanding": lambda: FSDP(ToyLM(), max_outstanding_reduce_scatters=0),
        "biased_half": lambda: FSDP(nn.Sequential(nn.Linear(4, 4)), compute_dtype=torch.bfloat16),
        "unit_name": lambda: FSDP(ToyLM(), unit="TransformerBlock"),
        "unit_instance": lambda: FSDP(ToyLM(), unit=Stage(3)),
        "unit_tuple": lambda: FSDP(ToyLM(), unit=(Linear, int)),
        "unit_empty": lambda: FSDP(ToyLM(), unit=()),
        "unit_no_match": lambda: FSDP(ToyLM(), unit=TransformerBlock),
    }.items():
        try:
            fn()
            errors[label] = None
        except ValueError as e:
            errors[label] = str(e)
    import warnings

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        f = FSDP(nn.Sequential(RMSNorm(4)))
    errors["no_layers_warning"] = [str(x.message) for x in w if "no Linear/Embedding" in str(x.message)]
    errors["no_layers_units"] = len(f.units)
    # torch.nn layers with a bias: sharded weight, replicated bias; one step must run.
    model = FSDP(nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10)))
    loss = F.cross_entropy(model(torch.randint(0, 10, (4,))), torch.randint(0, 10, (4,)))
    loss.backward()
    model.finish_gradient_synchronization()
    errors["torch_layers_units"] = len(model.units)
    errors["torch_layers_bias_grad"] = model.module[1].bias.grad is not None
    return errors


def fail_in_fsdp(rank, world_size):
    """Rank 1 raises mid-step; rank 0 blocks in the next collective until the parent kills it."""
    torch.set_num_threads(1)
    fsdp = FSDP(ToyLM())
    x, y = batch(0, PER_RANK_BATCH)
    if rank == 1:
        raise RuntimeError("deliberate failure inside an FSDP step")
    _loss(fsdp, x, y).backward()
    fsdp.finish_gradient_synchronization()
    return rank


def collectives_released(rank, world_size):
    """Issue 23's cause, checked directly: after each FSDP call returns (construction, a step's
    finish, gather_full_params), has gloo's worker let go of every tensor FSDP handed to an
    all-reduce or a broadcast? (The tensor-to-tensor all-gather and reduce-scatter of gloo hold
    none after their wait.) A tensor the worker still holds when the interpreter shuts down aborts
    the process. Returns, per call, the largest use count above the one at the collective (that one
    includes Released's C++ hold, so a released tensor reads -1; 0 where the call issues none)."""
    torch.set_num_threads(1)
    sent: list[tuple[torch.Tensor, int]] = []

    def spy(real):
        def call(tensor, *args, **kwargs):
            sent.append((tensor, tensor._use_count()))
            return real(tensor, *args, **kwargs)
        return call

    def held() -> int:
        out = max((t._use_count() - before for t, before in sent), default=0)
        sent.clear()
        return out

    real = dist.all_reduce, dist.broadcast
    dist.all_reduce, dist.broadcast = spy(dist.all_reduce), spy(dist.broadcast)
    try:
        fsdp = FSDP(build("toy", rank))
        out = {"construct": held(), "finish": 0}
        for step in range(4):
            _loss(fsdp, *batch(step, PER_RANK_BATCH)).backward()
            sent.clear()  # the forward and backward issue no all-reduce or broadcast
            fsdp.finish_gradient_synchronization()
            out["finish"] = max(out["finish"], held())
        fsdp.gather_full_params()
        out["gather"] = held()
    finally:
        dist.all_reduce, dist.broadcast = real
    return out
