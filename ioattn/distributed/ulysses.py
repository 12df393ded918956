"""All-to-all (Ulysses) attention: trade sequence shards for head shards, attend over the whole
sequence, trade back (Jacobs et al., "DeepSpeed Ulysses"). Each rank sends every other rank that
rank's share of the heads of its tokens (one ``all_to_all_single``), so that it holds all the tokens
of nheads / W heads; attention runs on one device with ``flash_attn_func`` (or, given a ring group,
as ``ring_attention`` across that group: the two-dimensional combination of USP); the output goes
back the same way. Communication per call: q, k, v and the output, each once, (W - 1) / W of them
crossing the network, and the same in the backward for their gradients.
"""
from __future__ import annotations

import functools

import torch
import torch.distributed as dist

from ioattn.api import flash_attn_func, flash_attn_varlen_func
from ioattn.distributed import checks
from ioattn.distributed.arguments import validate
from ioattn.distributed.ring import ring_attention
from ioattn.plan import ring as plan


def _all_to_all(x, group, world, scatter_dim, gather_dim):
    """Split ``x`` into ``world`` pieces along ``scatter_dim``, send piece p to rank p, and join the
    pieces received along ``gather_dim`` in rank order."""
    send = torch.stack(x.chunk(world, scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, world, scatter_dim, gather_dim):
        ctx.args = (group, world, gather_dim, scatter_dim)
        return _all_to_all(x, group, world, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        return _all_to_all(grad.contiguous(), *ctx.args), None, None, None, None


@functools.lru_cache(maxsize=8)
def _order(layout, world, local, device):
    """The permutation that puts the shards, joined in rank order, in global order (None when they
    already are); made once per shape and device."""
    if layout == "contiguous":
        return None
    joined = [p for r in range(world) for p in plan.positions(layout, world, r, local)]
    return torch.tensor(joined, device=device).argsort()


def ulysses_attention(q, k, v, group=None, causal=False, layout="contiguous", *, ring_group=None,
                      softmax_scale=None, window_size=(-1, -1), softcap=0.0, deterministic=False, return_lse=False,
                      cu_seqlens=None, check=True):
    """Exact attention over a sequence sharded across the ranks of ``group``, by all-to-all.

    Arguments and results as ``ring_attention``'s. ``nheads`` must be a multiple of the group's
    size; key/value heads that are not are repeated up to ``nheads`` first (GQA / MQA with fewer
    key/value heads than ranks).

    ``ring_group``: run the attention over the gathered shard as ``ring_attention`` across this group
    (for more ranks than heads: W = ulysses size x ring size, the groups from ``ulysses_ring_groups``).
    ``layout`` then describes how the sequence is sharded across the ring, and each ring shard is split
    ``"contiguous"`` across ``group``: ``shard(shard(x, layout, ring_group), "contiguous", group)``.
    Without ``ring_group``, ``layout`` is the sharding across ``group``.
    """
    fn = "ulysses_attention"
    rings = 1 if ring_group is None else checks.group_info(ring_group, fn)[0]
    spec = validate(fn, q, k, v, group, causal, "contiguous" if ring_group else layout, softmax_scale, window_size,
                    softcap, cu_seqlens, check, heads_per_rank=True, groups_spanned=rings)
    world = spec.world
    varlen = cu_seqlens is not None
    seq, heads = (0, 1) if varlen else (1, 2)
    if k.shape[-2] % world:  # fewer key/value heads than ranks: every query head's own copy
        k, v = (t.repeat_interleave(q.shape[-2] // k.shape[-2], dim=heads) for t in (k, v))
    q, k, v = (_AllToAll.apply(t, group, world, heads, seq) for t in (q, k, v))
    order = None if ring_group is not None else _order(layout, world, q.shape[seq] // world, q.device)
    if order is not None:
        q, k, v = (t.index_select(seq, order) for t in (q, k, v))
    kw = dict(softmax_scale=spec.scale, window_size=spec.window, softcap=spec.softcap, deterministic=deterministic)
    if ring_group is not None:
        out, lse = ring_attention(q, k, v, ring_group, causal, layout, return_lse=True, cu_seqlens=cu_seqlens,
                                  check=check, **kw)
    elif varlen:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        longest = int(lengths.max()) if lengths.numel() else 0
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest, causal=causal,
                                             return_attn_probs=True, **kw)
    else:
        out, lse, _ = flash_attn_func(q, k, v, causal=causal, return_attn_probs=True, **kw)
    if order is not None:
        back = order.argsort()
        out, lse = out.index_select(seq, back), lse.index_select(lse.dim() - 1, back)
    out = _AllToAll.apply(out, group, world, seq, heads)
    if not return_lse:
        return out
    with torch.no_grad():
        lse = _all_to_all(lse.contiguous(), group, world, lse.dim() - 1, lse.dim() - 2)
    return out, lse


def ulysses_ring_groups(ulysses_size):
    """(ulysses group, ring group) of this rank, for W = ulysses_size x ring size ranks of the
    default group: ranks r, r + 1, ..., of one block of ``ulysses_size`` share heads; ranks
    ``ulysses_size`` apart form a ring. Every rank must call it (it creates every group)."""
    world, rank = checks.group_info(None, "ulysses_ring_groups")
    if not isinstance(ulysses_size, int) or ulysses_size < 1 or world % ulysses_size:
        raise ValueError(f"ulysses_ring_groups: ulysses_size must divide the world size {world}, got {ulysses_size!r}")
    rings = world // ulysses_size
    mine = [None, None]
    for i in range(rings):
        ranks = list(range(i * ulysses_size, (i + 1) * ulysses_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            mine[0] = g
    for u in range(ulysses_size):
        ranks = list(range(u, world, ulysses_size))
        g = dist.new_group(ranks)
        if rank in ranks:
            mine[1] = g
    return tuple(mine)
