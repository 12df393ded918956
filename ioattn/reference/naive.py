"""Standard attention: materialises the full score matrix. The test oracle (run it in float64)
and the "PyTorch's own error" yardstick (run it in the input dtype)."""
from __future__ import annotations

import math

import torch

from ioattn.masks import alibi_bias, keep_mask


def mod_index(batch, nheads, seqlen_q, seqlen_k, device=None, b_offset=0, q_offset=0):
    """The arguments (b, h, q_idx, kv_idx) of ``ioattn.mods``' functions over a (batch, nheads, seqlen_q,
    seqlen_k) score matrix: int32 tensors broadcasting to it, batch entries from ``b_offset`` and query
    positions from ``q_offset`` (one sequence of a varlen call, one band of rows)."""
    i32 = torch.int32
    return (torch.arange(batch, dtype=i32, device=device).view(-1, 1, 1, 1) + b_offset,
            torch.arange(nheads, dtype=i32, device=device).view(1, -1, 1, 1),
            torch.arange(seqlen_q, dtype=i32, device=device).view(1, 1, -1, 1) + q_offset,
            torch.arange(seqlen_k, dtype=i32, device=device).view(1, 1, 1, -1))


def _index(scores, b_offset):
    return mod_index(*scores.shape, scores.device, b_offset)


def scores_ref(q, k, softmax_scale, window=(-1, -1), softcap=0.0, alibi_slopes=None, score_mod=None,
               mask_mod=None, b_offset=0):
    """The full score matrix (batch, nheads, seqlen_q, seqlen_k) in q's dtype: scale, softcap, the score
    function, mask (-inf; the window and the mask function), ALiBi -- the pipeline of ``ioattn.masks``
    and ``ioattn.mods``, materialised. ``b_offset``: the batch index of q's first entry (one sequence
    of a varlen call)."""
    seqlen_q, nheads, seqlen_k = q.shape[1], q.shape[2], k.shape[1]
    k = k.repeat_interleave(nheads // k.shape[2], dim=2)
    scores = torch.einsum("bihd,bjhd->bhij", q, k) * softmax_scale
    if softcap > 0:
        scores = torch.tanh(scores / softcap) * softcap
    if score_mod is not None:
        scores = score_mod(scores, *_index(scores, b_offset)).to(scores.dtype)
    scores = scores.masked_fill(~keep_mask(seqlen_q, seqlen_k, tuple(window), device=q.device), float("-inf"))
    if mask_mod is not None:
        scores = scores.masked_fill(~mask_mod(*_index(scores, b_offset)), float("-inf"))
    if alibi_slopes is not None:
        scores = scores + alibi_bias(alibi_slopes.to(scores.dtype), seqlen_q, seqlen_k).to(scores.dtype)
    return scores


def attention_ref(q, k, v, *, softmax_scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                  dropout_p=0.0, dropout_keep=None, upcast=True, sinks=None, score_mod=None, mask_mod=None,
                  b_offset=0):
    """softmax(mask(softcap(q k^T * scale)) + alibi) v, the textbook way.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_kv, headdim[_v]) with
    nheads a multiple of nheads_kv (GQA: query head h reads KV head h // (nheads // nheads_kv)).
    ``window`` is the normalised ``(left, right)`` pair (see ``ioattn.masks``; causal = (left, 0)).
    ``dropout_keep``: optional bool (batch, nheads, seqlen_q, seqlen_k); kept probabilities are
    scaled by 1 / (1 - dropout_p). ``upcast=True`` computes in float64. ``sinks`` (nheads,): a learnable
    logit per head joining every row's softmax as one more column whose value is 0 (gpt-oss's sinks);
    a row that sees no key keeps lse -inf. ``score_mod`` / ``mask_mod``: ``ioattn.mods``'s functions,
    applied densely (``scores_ref``).

    Returns ``(out, lse)``: out like q (headdim of v), lse float32-or-64 (batch, nheads, seqlen_q),
    -inf on rows with no visible key (whose output is 0).
    """
    dtype = q.dtype
    if upcast:
        q, k, v = q.double(), k.double(), v.double()
    nheads, d = q.shape[2], q.shape[3]
    nheads_kv = k.shape[2]
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    scores = scores_ref(q, k, softmax_scale, window, softcap, alibi_slopes, score_mod, mask_mod, b_offset)
    v = v.repeat_interleave(nheads // nheads_kv, dim=2)
    seen = (scores > float("-inf")).any(dim=-1)  # rows with a visible key
    if sinks is not None:  # one more column, the head's sink logit
        sink = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, sink], dim=-1)
    lse = torch.logsumexp(scores.float() if not upcast else scores, dim=-1)
    lse = lse.masked_fill(~seen, float("-inf"))  # a row that sees no key stays empty, sink or not
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)  # rows with no visible key: 0/0 -> 0
    if sinks is not None:
        probs = probs[..., :-1]  # the sink's column carries no value
    if dropout_p > 0.0:
        probs = probs.masked_fill(~dropout_keep, 0.0) / (1.0 - dropout_p)
    out = torch.einsum("bhij,bjhd->bihd", probs, v)
    return out.to(dtype) if not upcast else out, lse
