"""The exact log-sum-exp merge of partial attention results (the Flash-Decoding combine step).

If ``(o_i, lse_i)`` is attention of the same queries over disjoint key sets ``K_i`` (``o_i``
normalised, ``lse_i`` the natural-log sum of exp(scores) over ``K_i``), then attention over their
union is ``lse = log(sum_i exp(lse_i))`` and ``o = sum_i exp(lse_i - lse) * o_i``: exact, because
each ``o_i`` is already divided by its own ``exp(lse_i)``.
"""
import torch


def merge_states_ref(outs: torch.Tensor, lses: torch.Tensor):
    """outs ``(splits, ..., d)``, lses ``(splits, ...)`` -> ``(out (..., d), lse (...))``.

    Splits whose lse is -inf (no visible key) weigh 0; if every split is -inf the row's output is 0
    and its lse -inf. Differentiable (plain torch ops); computes in float32 or better."""
    work = torch.promote_types(lses.dtype, torch.float32)
    lses = lses.to(work)
    lse = torch.logsumexp(lses, dim=0)
    weights = torch.exp(lses - torch.where(torch.isinf(lse), 0.0, lse))  # all -inf rows: exp(-inf) = 0
    out = (weights.unsqueeze(-1) * outs.to(work)).sum(0)
    return out.to(outs.dtype), lse
