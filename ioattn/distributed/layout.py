"""Which tokens each rank holds: ``shard`` takes a rank's part of a full tensor, ``unshard`` puts the
parts back together. The layouts themselves (which global tokens a rank holds) are in
``ioattn.plan.ring``.

* ``"contiguous"``: rank r holds the r-th of W equal slices.
* ``"zigzag"``: the sequence cut into 2W equal chunks, rank r holds chunks r and 2W - 1 - r, in
  that order. Under a causal mask every rank then has the same work (one early chunk, one late).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ioattn.distributed import checks
from ioattn.plan.ring import LAYOUTS, chunk_count, chunks


def check_layout(fn, layout):
    if layout not in LAYOUTS:
        raise ValueError(f"{fn}: layout must be one of {LAYOUTS}, got {layout!r}")


def check_divides(fn, layout, world, n, what):
    parts = world * chunk_count(layout)
    if n % parts:
        raise ValueError(f"{fn}: {what} is {n}, which the {layout!r} layout over {world} ranks cannot cut into "
                         f"{parts} equal chunks: make it a multiple of {parts}")


def shard(x, layout="contiguous", group=None, dim=1):
    """This rank's shard of ``x``, the full tensor (the same on every rank), along ``dim`` (1: the
    sequence of flash-attn's (batch, seqlen, heads, dim); 0 for packed tokens). Differentiable; a
    view for ``"contiguous"``, a copy for ``"zigzag"``. Communicates nothing.

    For Ulysses combined with the ring, shard over the ring group first, then that shard
    ``"contiguous"`` over the Ulysses group."""
    world, rank = checks.group_info(group, "shard")
    check_layout("shard", layout)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"shard: x must be a torch.Tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ValueError(f"shard: dim {dim} is out of range for x of shape {tuple(x.shape)}")
    n = x.shape[dim]
    check_divides("shard", layout, world, n, f"dimension {dim} of x {tuple(x.shape)}")
    pieces = [x.narrow(dim, g, length) for g, _, length in chunks(layout, world, rank, n // world)]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim)


def unshard(x, layout="contiguous", group=None, dim=1):
    """The full tensor from every rank's shard ``x`` (the inverse of ``shard``): an ``all_gather``
    of the shards, then each chunk put in its place. Not differentiable. Shards of different shapes
    raise on every rank."""
    world, rank = checks.group_info(group, "unshard")
    error = None
    try:
        check_layout("unshard", layout)
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"unshard: x must be a torch.Tensor, got {type(x).__name__}")
        checks.check_device("unshard", group, x)
        if layout == "zigzag" and x.shape[dim] % 2:
            raise ValueError(f"unshard: a 'zigzag' shard holds two equal chunks, but dimension {dim} of x "
                             f"{tuple(x.shape)} is odd")
    except (TypeError, ValueError) as e:
        error = e
    checks.agree("unshard", group, world, error, {"shard shape": checks.shape_field(x, 6)})
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    n = x.shape[dim]
    placed = [(g, part.narrow(dim, local, length)) for r, part in enumerate(parts)
              for g, local, length in chunks(layout, world, r, n)]
    return torch.cat([p for _, p in sorted(placed, key=lambda gp: gp[0])], dim)
