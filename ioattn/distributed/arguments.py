"""The arguments of a context-parallel call, checked on this rank and then across the ranks
(``checks.agree``), so that bad input raises the same error on every rank."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ioattn import api
from ioattn.distributed import checks
from ioattn.distributed.layout import check_layout
from ioattn.plan.ring import LAYOUTS

_DTYPE_CODE = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_DEVICE_CODE = {"cpu": 0, "cuda": 1, "xpu": 2, "meta": 3}


@dataclass(frozen=True)
class Spec:
    """A checked call: the group's size and this rank's place, the normalised scalars, the packed
    sequences' global (start, end) (None when not packed)."""
    world: int
    rank: int
    scale: float
    window: tuple
    softcap: float
    sequences: tuple | None


def validate(fn, q, k, v, group, causal, layout, softmax_scale, window_size, softcap, cu_seqlens, check,
             heads_per_rank=False, groups_spanned=1):
    """The call's ``Spec``, or the same exception on every rank (one ``all_gather`` when nothing is
    wrong; with ``check=False`` this rank's own checks only). ``heads_per_rank``: the heads are
    shared out among the ranks (Ulysses), so their count must divide evenly. ``groups_spanned``: how
    many such groups the sequence spans (Ulysses over a ring: the ring's size)."""
    world, rank = checks.group_info(group, fn)
    spec, error = None, None
    try:
        spec = _local(fn, q, k, v, group, world, rank, causal, layout, softmax_scale, window_size, softcap,
                      cu_seqlens, heads_per_rank, groups_spanned)
    except (TypeError, ValueError) as e:
        error = e if str(e).startswith(fn) else type(e)(f"{fn}: {e}")
    if check:
        checks.agree(fn, group, world, error, _fields(q, k, v, causal, layout, spec, cu_seqlens is not None),
                     floats=("softmax_scale", "softcap"))
    elif error is not None:
        raise error
    return spec


def _local(fn, q, k, v, group, world, rank, causal, layout, softmax_scale, window_size, softcap, cu_seqlens,
           heads_per_rank, groups_spanned):
    """This rank's checks: ``Spec`` or a TypeError / ValueError."""
    varlen = cu_seqlens is not None
    api._check_qkv(q, k, v, varlen)
    if q.dtype not in api._DTYPES:
        raise TypeError(f"{fn}: q, k, v must be float16, bfloat16 or float32, got {q.dtype}")
    if k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"{fn}: q and k must have the same batch and sequence shard, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    checks.check_device(fn, group, q)
    check_layout(fn, layout)
    local = q.shape[0] if varlen else q.shape[1]
    if layout == "zigzag" and local % 2:
        raise ValueError(f"{fn}: a 'zigzag' shard holds two equal chunks, but this rank's shard has {local} tokens: "
                         f"the sequence must be a multiple of {2 * world} tokens (shard() makes such shards)")
    if heads_per_rank and q.shape[-2] % world:
        raise ValueError(f"{fn}: q has {q.shape[-2]} heads, which the {world} ranks of the all-to-all cannot share "
                         f"equally: make the head count a multiple of the group's size, or use a smaller group with "
                         f"ring_group for the rest of the ranks")
    _, scale, softcap, window, _ = api._check_scalars(0.0, softmax_scale, softcap, window_size, causal, None, q, 1)
    sequences = _sequences(fn, cu_seqlens, world * groups_spanned * local) if varlen else None
    return Spec(world, rank, scale, window, softcap, sequences)


def _sequences(fn, cu_seqlens, total):
    """The packed sequences' global (start, end) from ``cu_seqlens`` (read on the host)."""
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 \
            or cu_seqlens.numel() < 2:
        got = tuple(cu_seqlens.shape) if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens).__name__
        raise TypeError(f"{fn}: cu_seqlens must be a 1-D int32 tensor of batch + 1 >= 2 entries, got {got}")
    cu = cu_seqlens.tolist()
    if cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])) or cu[-1] > total:
        raise ValueError(f"{fn}: cu_seqlens must start at 0, not decrease and end at most at the global token "
                         f"count {total} (every rank's tokens), got {cu}")
    return tuple(zip(cu[:-1], cu[1:]))


def _fields(q, k, v, causal, layout, spec, varlen):
    """What every rank must share, as ``checks.agree`` fields (placeholders where this rank refused)."""
    nd = 3 if varlen else 4
    return {"q shape": checks.shape_field(q, nd), "k shape": checks.shape_field(k, nd),
            "v shape": checks.shape_field(v, nd), "dtype": (_DTYPE_CODE.get(getattr(q, "dtype", None), -1),),
            "device type": (_DEVICE_CODE.get(getattr(getattr(q, "device", None), "type", None), -1),),
            "causal": (int(bool(causal)),), "layout": (LAYOUTS.index(layout) if layout in LAYOUTS else -1,),
            "window_size": tuple(spec.window) if spec else (-9, -9),
            "softmax_scale": checks.float_field(spec.scale if spec else 0.0),
            "softcap": checks.float_field(spec.softcap if spec else 0.0),
            "cu_seqlens": _cu_field(spec.sequences if spec else None)}


def _cu_field(sequences):
    """The packed sequences as a field: their count, their total and a checksum of the lengths."""
    if sequences is None:
        return (-1, -1, -1)
    digest = 0
    for a, b in sequences:
        digest = (digest * 1000003 + b - a) % (1 << 61)
    return (len(sequences), sequences[-1][1], digest)
