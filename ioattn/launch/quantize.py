"""Launches of the FP8 quantisation (``ioattn.kernels.quantize.quantize_fp8_kernel``) for
``ioattn.fp8.quantize_fp8``: per block of rows in one pass; per tensor or (sequence, head) in two,
the first taking the group's amax by atomic max, the second scaling with the descale it makes of it."""
from __future__ import annotations

import math

import torch

from ioattn.launch.cached import launcher_for
from ioattn.reference.fp8 import E4M3

# rows of one (sequence, head) per program in the two-pass modes: a tile of up to 2048 features
_TILE_ELEMENTS = 2048
# features a thread holds: with its rotary partner and tables, a tile fits the registers unspilled
_PER_THREAD = 16
_GRID_YZ = 65535  # CUDA's limit on a grid's y and z sizes (heads, sequences)


def quantize_fp8(x, granularity, block_rows, signs, cos, sin, interleaved, cu_seqlens, max_seqlen, cached):
    """(e4m3 values shaped like ``x``, float32 descale) of the checked call. ``x`` (batch, seqlen,
    heads, d), or (total, heads, d) with ``cu_seqlens`` and ``max_seqlen``; ``signs``: the rotation's
    ±1 vector or None; ``cos``/``sin``: contiguous rotary tables or None. The descale is () per
    tensor, (batch, heads) per head, (batch, heads, blocks) per block."""
    packed = cu_seqlens is not None
    batch = cu_seqlens.numel() - 1 if packed else x.shape[0]
    seqlen, heads, d = (max_seqlen if packed else x.shape[1]), x.shape[-2], x.shape[-1]
    if max(batch, heads) > _GRID_YZ:
        raise ValueError(f"quantize_fp8: x has {batch} sequences and {heads} heads; the kernel's grid takes at most "
                         f"{_GRID_YZ} of each")
    block_d = 1 << (d - 1).bit_length()
    if granularity == "block":
        rows = block_rows
    else:
        rows = max(1, min(_TILE_ELEMENTS // block_d, 1 << max(seqlen - 1, 0).bit_length()))
    tiles = -(-seqlen // rows)
    values = torch.empty(x.shape, device=x.device, dtype=E4M3)
    x_strides = (0,) + x.stride() if packed else x.stride()
    v_strides = (0,) + values.stride() if packed else values.stride()
    common = dict(x=x, values=values, signs=signs, cos=cos, sin=sin, cu_seqlens=cu_seqlens, seqlen=seqlen,
                  rows=rows, strides=x_strides[:3] + v_strides[:3], interleaved=interleaved,
                  cached=cached)
    grid = (tiles, heads, batch)
    if granularity == "block":
        descale = torch.empty(batch, heads, tiles, device=x.device, dtype=torch.float32)
        _launch(grid, descale=descale, amax=descale, store=True, own=True, **common)
        return values, descale
    # per tensor one cell (the kernel's strides 0), per head one a (sequence, head): the first pass's
    # atomic max lands there, the second makes the descale of it (amax / 448, 1 for an all-zero group)
    shape = () if granularity == "tensor" else (batch, heads)
    amax = torch.zeros(shape, device=x.device, dtype=torch.float32)
    descale = torch.empty(shape, device=x.device, dtype=torch.float32)
    _launch(grid, descale=descale, amax=amax, store=False, own=False, **common)
    _launch(grid, descale=descale, amax=amax, store=True, own=False, **common)
    return values, descale


def _launch(grid, *, x, values, descale, amax, signs, cos, sin, cu_seqlens, seqlen, rows, strides,
            interleaved, store, own, cached):
    from ioattn.kernels.quantize import quantize_fp8_kernel

    d = x.shape[-1]
    block_d = 1 << (d - 1).bit_length()
    block_m = 1 << (rows - 1).bit_length()
    d_strides = (descale.stride() + (0, 0))[:2]  # () per tensor: one value for every (b, h)
    a_strides = (amax.stride() + (0, 0))[:2]  # the amax cells: () per tensor, (batch, heads) per head
    table = cos if cos is not None else x
    args = (x, values, descale, amax, signs if signs is not None else x, table,
            sin if sin is not None else x, cu_seqlens if cu_seqlens is not None else x,
            seqlen, rows, *strides, *d_strides, *a_strides, table.stride(0))
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m, PACKED=cu_seqlens is not None,
                      HADAMARD=signs is not None, LOG_D=block_d.bit_length() - 1 if signs is not None else 0,
                      SQRT_D=math.sqrt(d) if signs is not None else 1.0,
                      ROTARY_DIM=2 * cos.shape[1] if cos is not None else 0, INTERLEAVED=bool(interleaved),
                      STORE_VALUES=store, OWN_DESCALE=own,
                      num_warps=min(16, max(1, block_m * block_d // (32 * _PER_THREAD))))
    launcher_for(quantize_fp8_kernel)(grid, args, constexprs, cached=cached)
