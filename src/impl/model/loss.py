import torch

REDUCTIONS = ("mean", "sum")


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Mean (or, with reduction="sum", sum) over all positions of -log softmax(logits)[target].

    logits (..., vocab), targets (...) integer. Computed through logsumexp with the row max
    subtracted, so large logits neither overflow nor lose the target's contribution."""
    check_reduction(reduction)
    if logits.shape[:-1] != targets.shape:
        raise ValueError(f"cross_entropy: logits {tuple(logits.shape)} and targets {tuple(targets.shape)} "
                         "must agree on every dim but the last")
    if targets.dtype.is_floating_point or targets.dtype == torch.bool:
        raise ValueError(f"cross_entropy: targets must be integer class ids, got {targets.dtype}")
    logits = logits.float()
    row_max = logits.amax(dim=-1, keepdim=True).detach()
    shifted = logits - row_max
    log_norm = shifted.exp().sum(dim=-1).log()
    target_logit = shifted.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    per_token = log_norm - target_logit
    return per_token.sum() if reduction == "sum" else per_token.mean()
