"""KV-cache decoding, the readable way: the ground truth for ``flash_attn_with_kvcache`` semantics.

Cache layouts (flash-attn's):

* contiguous: ``k_cache``/``v_cache`` (batch_cache, seqlen_cache, nheads_kv, d); sequence ``b`` uses
  cache row ``cache_batch_idx[b]`` (default ``b``);
* paged: ``k_cache``/``v_cache`` (num_pages, page_size, nheads_kv, d) with ``block_table`` int32
  (batch, max_pages_per_seq): token ``t`` of sequence ``b`` lives in page
  ``block_table[b, t // page_size]``, row ``t % page_size``.

Positions are *absolute cache columns*. ``cache_seqlens[b]`` is the column one past the last valid
token already cached; ``cache_leftpad[b]`` (default 0) is the first valid column (the columns before
it are padding and never attended). New tokens ``k``/``v`` (batch, seqlen_new, nheads_kv, d) are
written at columns ``cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1`` and the attention then
runs over the keys at columns ``[cache_leftpad[b], cache_seqlens[b] + seqlen_new)``, with the mask
rules of ``ioattn.masks`` counted from the first valid key (bottom-right aligned).

Rotary embedding (``rotary_cos``/``rotary_sin`` (seqlen_ro, rotary_dim / 2)) is applied to the new
keys at their absolute columns and to the queries: with ``causal`` or a window, query ``i`` is at
column ``cache_seqlens[b] + i``; otherwise every query is rotated at column ``cache_seqlens[b]``.

Known divergence from flash-attn's CUDA code (v2): it resets a window side ``>= `` the cache
capacity to -1 before deciding whether the call is "local", so a window wider than the cache counts
as "no window" there (for the rotary rule above and for that side of the mask). Here a window is
whatever ``normalize_window`` returns. Also, flash-attn refuses ``cache_leftpad`` together with a
``block_table``; the reference accepts the combination (the meaning is the same column rule).

FP8 caches (``torch.float8_e4m3fn``) hold ``value / descale`` with one descale per (sequence, KV
head) (``k_descale``/``v_descale``, broadcast to (batch, nheads_kv)): new tokens are quantised on
append (``quantize_kv_ref``) and the attention runs over the dequantised keys and values.
"""
from __future__ import annotations

import torch

from ioattn.masks import normalize_window
from ioattn.reference.fp8 import E4M3, E4M3_MAX
from ioattn.reference.naive import attention_ref

# ---------------------------------------------------------------- small helpers

def _int_vector(name, x, batch, device):
    """``x`` (an int, or an integer tensor of shape (batch,)) as an int64 tensor of shape (batch,)."""
    if isinstance(x, bool):
        raise TypeError(f"{name} must be an int or an int32 tensor of shape ({batch},), got a bool")
    if isinstance(x, int):
        return torch.full((batch,), x, dtype=torch.long, device=device)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be an int or an int32 tensor of shape ({batch},), got {type(x).__name__}")
    if x.dtype.is_floating_point or x.dtype.is_complex or x.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor (int32), got {x.dtype}")
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must have shape ({batch},), got {tuple(x.shape)}")
    return x.to(device=device, dtype=torch.long)


def _check_cache(k_cache, v_cache, block_table, cache_batch_idx, batch):
    """Validate the cache layout; returns the per-sequence capacity (tokens)."""
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must agree in all but the head dim, got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is for the contiguous cache only; it cannot be used with block_table")
        if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
            raise TypeError(f"block_table must be an int32 tensor, got "
                            f"{block_table.dtype if isinstance(block_table, torch.Tensor) else type(block_table).__name__}")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_pages_per_seq), got {tuple(block_table.shape)}")
        return block_table.shape[1] * k_cache.shape[1]
    return k_cache.shape[1]


def _check_targets(first, k_cache, block_table, cache_batch_idx):
    if first.numel() and (first.min() < 0 or first.max() >= k_cache.shape[0]):
        what = "block_table entries (pages)" if block_table is not None else "cache_batch_idx entries (cache rows)"
        raise ValueError(f"{what} in use must lie in [0, {k_cache.shape[0]}), got values "
                         f"{first.min().item()}..{first.max().item()}")


def _locate(positions, k_cache, block_table, cache_batch_idx, check=True):
    """Storage coordinates ``(first_index, row)``, each like ``positions`` (batch, n), of the absolute
    cache columns ``positions``: (page, row in page) for a paged cache, (cache row, column) otherwise."""
    batch = positions.shape[0]
    if block_table is not None:
        page_size = k_cache.shape[1]
        first = block_table.to(device=positions.device, dtype=torch.long).gather(1, positions // page_size)
        row = positions % page_size
    else:
        rows = (_int_vector("cache_batch_idx", cache_batch_idx, batch, positions.device)
                if cache_batch_idx is not None else torch.arange(batch, device=positions.device))
        first, row = rows[:, None].expand_as(positions), positions
    if check:
        _check_targets(first, k_cache, block_table, cache_batch_idx)
    return first, row


# ---------------------------------------------------------------- rotary

def apply_rotary_ref(x, cos, sin, positions, interleaved):
    """Rotary embedding of ``x`` (batch, seqlen, heads, d) at integer ``positions`` (batch, seqlen).

    ``cos``/``sin`` (seqlen_ro, rotary_dim / 2); only the first ``rotary_dim`` features rotate. Pair
    ``j`` is ``(x[2j], x[2j+1])`` when ``interleaved`` (GPT-J) and ``(x[j], x[j + rotary_dim/2])``
    otherwise (GPT-NeoX); it becomes ``(x1 cos - x2 sin, x1 sin + x2 cos)`` with the angle of row
    ``positions[b, i]``. Computed in float32 (float64 for float64 inputs); returns a new tensor of
    ``x``'s dtype.
    """
    if cos.dim() != 2 or cos.shape != sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                         f"{tuple(cos.shape)} and {tuple(sin.shape)}")
    half = cos.shape[1]
    rotary_dim, d = 2 * half, x.shape[-1]
    if not 0 < rotary_dim <= d:
        raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be in (0, head dim {d}]")
    if tuple(positions.shape) != tuple(x.shape[:2]):
        raise ValueError(f"positions must have shape {tuple(x.shape[:2])}, got {tuple(positions.shape)}")
    positions = positions.to(device=cos.device, dtype=torch.long)
    if positions.numel() and (positions.min() < 0 or positions.max() >= cos.shape[0]):
        raise ValueError(f"rotary positions {positions.min().item()}..{positions.max().item()} fall outside "
                         f"rotary_cos's {cos.shape[0]} rows")
    ctype = torch.promote_types(x.dtype, torch.float32)
    c = cos.to(ctype)[positions][:, :, None, :]  # (batch, seqlen, 1, half)
    s = sin.to(ctype)[positions][:, :, None, :]
    xr = x[..., :rotary_dim].to(ctype)
    if interleaved:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)
    else:
        x1, x2 = xr[..., :half], xr[..., half:]
        rotated = torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), x[..., rotary_dim:]), dim=-1)


# ---------------------------------------------------------------- FP8 (e4m3) caches

def descale_per_head(descale, batch, nheads_kv, device):
    """A descale (a tensor that broadcasts to (batch, nheads_kv)) as float32 of that shape."""
    if descale is None:
        raise ValueError("an FP8 (float8_e4m3fn) cache needs its descale (k_descale / v_descale)")
    return torch.as_tensor(descale).to(device=device, dtype=torch.float32).expand(batch, nheads_kv)


def quantize_kv_ref(x, descale):
    """New tokens ``x`` (batch, n, nheads_kv, d) as e4m3 cache values: ``x / descale`` in float32
    (``descale`` broadcast to (batch, nheads_kv)), clamped to ±448 and rounded to nearest even, so a
    value past e4m3's range saturates instead of becoming NaN."""
    s = descale_per_head(descale, x.shape[0], x.shape[2], x.device)[:, None, :, None]
    return (x.float() / s).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def dequantize_kv_ref(x, descale):
    """Cache values ``x`` (batch, n, nheads_kv, d) times their descale (broadcast to (batch,
    nheads_kv)), in float64: exact for e4m3 values and a float32 descale."""
    s = descale_per_head(descale, x.shape[0], x.shape[2], x.device)[:, None, :, None]
    return x.double() * s.double()


# ---------------------------------------------------------------- append / gather

def append_kv_ref(k_cache, v_cache, k, v, cache_seqlens, block_table=None, cache_batch_idx=None, k_descale=None,
                  v_descale=None):
    """Write the new tokens ``k``/``v`` (batch, seqlen_new, nheads_kv, d) into the cache, in place,
    at columns ``cache_seqlens[b] .. cache_seqlens[b] + seqlen_new - 1`` (paged or contiguous); an
    FP8 cache gets them quantised with ``k_descale``/``v_descale`` (``quantize_kv_ref``)."""
    if k.shape[:3] != v.shape[:3] or k.dim() != 4:
        raise ValueError(f"k and v must be (batch, seqlen_new, nheads_kv, d), got {tuple(k.shape)} and {tuple(v.shape)}")
    batch, seqlen_new = k.shape[:2]
    capacity = _check_cache(k_cache, v_cache, block_table, cache_batch_idx, batch)
    if k.shape[2:] != k_cache.shape[2:] or v.shape[2:] != v_cache.shape[2:]:
        raise ValueError(f"new k/v {tuple(k.shape)}/{tuple(v.shape)} do not match the cache's (nheads_kv, d): "
                         f"{tuple(k_cache.shape)}/{tuple(v_cache.shape)}")
    start = _int_vector("cache_seqlens", cache_seqlens, batch, k_cache.device)
    if batch and (start.min() < 0 or start.max() + seqlen_new > capacity):
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {capacity}] (the cache capacity), got "
                         f"cache_seqlens {start.tolist()} with seqlen_new {seqlen_new}")
    positions = start[:, None] + torch.arange(seqlen_new, device=start.device)
    first, row = _locate(positions, k_cache, block_table, cache_batch_idx)
    if k_cache.dtype == E4M3:
        k, v = quantize_kv_ref(k, k_descale), quantize_kv_ref(v, v_descale)
    k_cache[first, row] = k.to(k_cache.dtype)
    v_cache[first, row] = v.to(v_cache.dtype)


def gather_kv_ref(k_cache, v_cache, seqlens, block_table=None, cache_batch_idx=None, cache_leftpad=None):
    """The valid tokens of each sequence: a list of ``(k_b, v_b)``, each (1, len_b, nheads_kv, d), a
    copy of the cache columns ``[cache_leftpad[b], seqlens[b])`` in order (``seqlens`` are end columns,
    like ``cache_seqlens``). The batch size comes from ``block_table``, else ``seqlens`` (a tensor),
    else ``cache_batch_idx``, else the contiguous cache's first dimension."""
    if block_table is not None:
        batch = block_table.shape[0]
    elif isinstance(seqlens, torch.Tensor):
        batch = seqlens.shape[0]
    elif cache_batch_idx is not None:
        batch = cache_batch_idx.shape[0]
    else:
        batch = k_cache.shape[0]
    capacity = _check_cache(k_cache, v_cache, block_table, cache_batch_idx, batch)
    end = _int_vector("seqlens", seqlens, batch, k_cache.device)
    start = (_int_vector("cache_leftpad", cache_leftpad, batch, k_cache.device) if cache_leftpad is not None
             else torch.zeros_like(end))
    if batch and (start.min() < 0 or (end < start).any() or end.max() > capacity):
        raise ValueError(f"need 0 <= cache_leftpad <= seqlens <= {capacity} (the cache capacity), got "
                         f"cache_leftpad {start.tolist()}, seqlens {end.tolist()}")
    positions = torch.arange(capacity, device=k_cache.device).expand(batch, capacity)
    first, row = _locate(positions, k_cache, block_table, cache_batch_idx, check=False)
    out = []
    for b in range(batch):
        cols = slice(int(start[b]), int(end[b]))
        _check_targets(first[b:b + 1, cols], k_cache, block_table, cache_batch_idx)
        sel = (first[b, cols], row[b, cols])
        out.append((k_cache[sel][None], v_cache[sel][None]))  # advanced indexing: copies
    return out


# ---------------------------------------------------------------- attention

def kvcache_attention_ref(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                          cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                          softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                          rotary_interleaved=True, alibi_slopes=None, upcast=True, k_descale=None,
                          v_descale=None):
    """``flash_attn_with_kvcache`` in plain PyTorch (see the module docstring for the semantics).

    Applies rotary to the new keys and to q, appends ``k``/``v`` to the cache **in place** (as
    flash-attn does), then runs ``attention_ref`` per sequence over its valid keys. As in flash-attn,
    ``cache_seqlens=None`` means every sequence fills its whole cache (the capacity: seqlen_cache, or
    max_pages_per_seq * page_size), and is then refused together with new ``k``/``v``. An FP8 cache
    is dequantised with ``k_descale``/``v_descale`` (to float64 with ``upcast``, else to q's dtype).

    Returns ``(out, lse)``: out (batch, seqlen_q, nheads, d_v), lse (batch, nheads, seqlen_q), in
    float64 when ``upcast`` (like ``attention_ref``), else out in q's dtype and lse in float32.
    Rows that see no key have output 0 and lse -inf.
    """
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError(f"q must be a 4-D tensor (batch, seqlen_q, nheads, d), got "
                         f"{tuple(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__}")
    batch, seqlen_q, nheads, d = q.shape
    capacity = _check_cache(k_cache, v_cache, block_table, cache_batch_idx, batch)
    nheads_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache must have the same head dim, got q {tuple(q.shape)}, "
                         f"k_cache {tuple(k_cache.shape)}")
    if nheads % nheads_kv != 0:
        raise ValueError(f"number of query heads ({nheads}) must be a multiple of the number of key/value heads "
                         f"({nheads_kv}): q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}")
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (or neither)")
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together (or neither)")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
        raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), got "
                         f"{tuple(alibi_slopes.shape)}")
    if cache_seqlens is None and k is not None:
        raise ValueError("cache_seqlens is required when new k/v are given (it says where they are written)")
    window = normalize_window(window_size, bool(causal))
    seqlens = _int_vector("cache_seqlens", capacity if cache_seqlens is None else cache_seqlens, batch, q.device)
    seqlen_new = 0 if k is None else k.shape[1]
    if k is not None and (k.dim() != 4 or k.shape[0] != batch):
        raise ValueError(f"k must be (batch={batch}, seqlen_new, nheads_kv, d), got {tuple(k.shape)}")

    if rotary_cos is not None:
        steps = torch.arange(seqlen_q, device=q.device)
        per_token = window != (-1, -1)  # causal or a window: query i sits at cache_seqlens + i
        q_pos = seqlens[:, None] + (steps if per_token else torch.zeros_like(steps))
        q = apply_rotary_ref(q, rotary_cos, rotary_sin, q_pos, rotary_interleaved)
        if k is not None:
            k_pos = seqlens[:, None] + torch.arange(seqlen_new, device=q.device)
            k = apply_rotary_ref(k, rotary_cos, rotary_sin, k_pos, rotary_interleaved)
    if k is not None:
        append_kv_ref(k_cache, v_cache, k, v, seqlens, block_table, cache_batch_idx, k_descale, v_descale)

    kv = gather_kv_ref(k_cache, v_cache, seqlens + seqlen_new, block_table, cache_batch_idx, cache_leftpad)
    fp8 = k_cache.dtype == E4M3
    if fp8:
        k_descale, v_descale = (descale_per_head(s, batch, nheads_kv, q.device) for s in (k_descale, v_descale))
    outs, lses = [], []
    for b, (kb, vb) in enumerate(kv):
        if fp8:  # exact in float64 (the oracle), else rounded to q's dtype (PyTorch's own error)
            wide = torch.float64 if upcast else q.dtype
            kb = dequantize_kv_ref(kb, k_descale[b:b + 1]).to(wide)
            vb = dequantize_kv_ref(vb, v_descale[b:b + 1]).to(wide)
        else:
            kb, vb = kb.to(q.dtype), vb.to(q.dtype)
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(q[b:b + 1], kb, vb, softmax_scale=softmax_scale,
                               window=window, softcap=softcap, alibi_slopes=slopes, upcast=upcast)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)
