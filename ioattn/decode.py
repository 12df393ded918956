"""``flash_attn_with_kvcache``: attention of a few new query tokens over a KV cache (decoding).

Semantics are flash-attn's, stated in ``ioattn.reference.decode`` (the oracle): optional rotary on
q and the new keys, an in-place append of the new k/v into the cache (contiguous, optionally
through ``cache_batch_idx``, or paged through ``block_table``), then attention over each sequence's
valid columns ``[cache_leftpad, cache_seqlens + seqlen_new)``.

Every argument is checked before the cache is touched: a refused call raises ``ValueError`` or
``TypeError`` naming the argument and leaves ``k_cache``/``v_cache`` as they were. The value checks
(cache_seqlens, block_table, cache_batch_idx, cache_leftpad ranges) read those tensors back to the
host once.

On CUDA (or under ``TRITON_INTERPRET=1``) the attention is the Flash-Decoding split-KV kernel of
``ioattn.kernels.decode`` followed by ``merge_attention_states``; elsewhere a plain PyTorch path
computing in float32.
"""
from __future__ import annotations

import math

import torch
import triton

from ioattn import dispatch
from ioattn.api import _DTYPES, MAX_HEADDIM
from ioattn.backends import _scalars
from ioattn.masks import normalize_window
from ioattn.merge import merge_attention_states
from ioattn.reference.decode import apply_rotary_ref, gather_kv_ref
from ioattn.reference.naive import attention_ref

# Split heuristic: aim for about one program per SM of an H100/H200 (132 SMs).
DEFAULT_NUM_SMS = 132
MAX_SPLITS = 128

# Tiles: untuned (no device sweep yet). BLOCK_N 64 on CUDA; 16 under the interpreter so that the
# small test caches cross several chunks and splits. Both shrink to divide the page size.
# BLOCK_M is the packed row count (group * seqlen_q) rounded up to a power of two, >= 16, <= 64.
_BLOCK_N_CUDA = 64
_BLOCK_N_INTERPRETER = 16
_MAX_BLOCK_M = 64
_NUM_WARPS = 4
_NUM_STAGES = 2


def _type_name(x):
    return x.dtype if isinstance(x, torch.Tensor) else type(x).__name__


def _check_index_tensor(name, t, shape_text, ndim, device):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor {shape_text}, got {_type_name(t)}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
              cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
              num_splits):
    """All checks; returns the normalised call (nothing has been written yet)."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    shapes = f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    device = q.device
    if not (k_cache.device == v_cache.device == device):
        raise ValueError(f"q, k_cache, v_cache must be on one device, got {device}, {k_cache.device}, {v_cache.device}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {shapes}")
    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache must have the same head dim, got {shapes}")
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEADDIM}, got {d} ({shapes})")
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"number of query heads ({nheads}) must be a multiple of the number of key/value "
                         f"heads ({nheads_kv}): {shapes}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"k_cache and v_cache must be contiguous in the head dim (stride 1), got strides "
                         f"{k_cache.stride()} and {v_cache.stride()}")

    # cache layout
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is for the contiguous cache only; it cannot be used with block_table")
        _check_index_tensor("block_table", block_table, f"({batch}, max_pages_per_seq)", 2, device)
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_pages_per_seq), got {tuple(block_table.shape)}")
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        if page_size == 0 or page_size % 16:
            raise ValueError(f"page size (k_cache.shape[1]) must be a positive multiple of 16, got {page_size}")
        if block_table.numel():
            lo, hi = (int(x) for x in torch.stack([block_table.min(), block_table.max()]).tolist())
            if lo < 0 or hi >= num_pages:
                raise ValueError(f"block_table entries must lie in [0, {num_pages}) (k_cache has {num_pages} pages), "
                                 f"got values {lo}..{hi}")
        capacity = block_table.shape[1] * page_size
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is not None:
            _check_index_tensor("cache_batch_idx", cache_batch_idx, f"({batch},)", 1, device)
            if cache_batch_idx.shape[0] != batch:
                raise ValueError(f"cache_batch_idx must have shape ({batch},), got {tuple(cache_batch_idx.shape)}")
            if batch:
                lo, hi = (int(x) for x in torch.stack([cache_batch_idx.min(), cache_batch_idx.max()]).tolist())
                if lo < 0 or hi >= k_cache.shape[0]:
                    raise ValueError(f"cache_batch_idx entries must lie in [0, {k_cache.shape[0]}) (k_cache rows), "
                                     f"got values {lo}..{hi}")
        elif k_cache.shape[0] < batch:
            raise ValueError(f"the contiguous cache needs a row per sequence (or cache_batch_idx): batch {batch} "
                             f"> k_cache.shape[0] {k_cache.shape[0]} ({shapes})")

    # new tokens
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (or neither)")
    seqlen_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
            if t.device != device:
                raise ValueError(f"{name} must be on {device}, got {t.device}")
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != batch or tuple(k.shape[2:]) != (nheads_kv, d):
            raise ValueError(f"k and v must both be (batch={batch}, seqlen_new, nheads_kv={nheads_kv}, d={d}), got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        seqlen_new = k.shape[1]
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required when new k/v are given (it says where they are written)")

    # lengths
    if cache_seqlens is None:
        seqlens = [capacity] * batch
    elif isinstance(cache_seqlens, bool):
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor of shape ({batch},), got a bool")
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * batch
    else:
        _check_index_tensor("cache_seqlens", cache_seqlens, f"({batch},)", 1, device)
        if cache_seqlens.shape[0] != batch:
            raise ValueError(f"cache_seqlens must have shape ({batch},), got {tuple(cache_seqlens.shape)}")
        seqlens = cache_seqlens.tolist()
    if any(s < 0 or s + seqlen_new > capacity for s in seqlens):
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {capacity}] (the cache capacity), got "
                         f"cache_seqlens {seqlens} with seqlen_new {seqlen_new}")
    ends = [s + seqlen_new for s in seqlens]
    if cache_leftpad is not None:
        _check_index_tensor("cache_leftpad", cache_leftpad, f"({batch},)", 1, device)
        if cache_leftpad.shape[0] != batch:
            raise ValueError(f"cache_leftpad must have shape ({batch},), got {tuple(cache_leftpad.shape)}")
        pads = cache_leftpad.tolist()
        if any(p < 0 or p > e for p, e in zip(pads, ends)):
            raise ValueError(f"need 0 <= cache_leftpad <= cache_seqlens + seqlen_new, got cache_leftpad {pads}, "
                             f"cache_seqlens + seqlen_new {ends}")

    # scalars
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0 \
            or not math.isfinite(softcap):
        raise ValueError(f"softcap must be a finite number >= 0, got {softcap!r}")
    window = normalize_window(window_size, bool(causal))
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 = heuristic), got {num_splits!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point():
            raise TypeError(f"alibi_slopes must be a floating-point tensor or None, got {_type_name(alibi_slopes)}")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), got "
                             f"{tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise ValueError(f"alibi_slopes must be on {device}, got {alibi_slopes.device}")

    # rotary
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together (or neither)")
    if rotary_cos is not None:
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {_type_name(t)}")
            if t.device != device:
                raise ValueError(f"{name} must be on {device}, got {t.device}")
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape:
            raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                             f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        rotary_dim = 2 * rotary_cos.shape[1]
        if not 0 < rotary_dim <= d:
            raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be in (0, head dim {d}]")
        per_token = window != (-1, -1)
        need = max([s + max(seqlen_new, seqlen_q if per_token else 1) for s in seqlens], default=0)
        if need > rotary_cos.shape[0]:
            raise ValueError(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} rows but positions up to "
                             f"{need - 1} are rotated (cache_seqlens {seqlens}, seqlen_q {seqlen_q}, "
                             f"seqlen_new {seqlen_new})")
    return float(softmax_scale), float(softcap), window, seqlen_new, max(ends, default=0)


def _storage_index(positions, block_table, cache_batch_idx, page_size):
    """(first index, row) of the absolute cache columns ``positions`` (batch, n)."""
    if block_table is not None:
        first = block_table.long().gather(1, positions // page_size)
        return first, positions % page_size
    batch = positions.shape[0]
    rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(batch, device=positions.device)
    return rows[:, None].expand_as(positions), positions


def _heuristic_splits(programs, max_end, block_n):
    """Enough splits that the grid about fills ``DEFAULT_NUM_SMS`` SMs, but at least one key chunk
    per split of the longest sequence, and at most ``MAX_SPLITS``."""
    if programs >= DEFAULT_NUM_SMS or max_end == 0:
        return 1
    chunks = triton.cdiv(max_end, block_n)
    return max(1, min(triton.cdiv(DEFAULT_NUM_SMS, programs), chunks, MAX_SPLITS))


def _attention_torch(q, k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad, scale, window,
                     softcap, alibi_slopes):
    kv = gather_kv_ref(k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad)
    outs, lses = [], []
    for b, (kb, vb) in enumerate(kv):
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(q[b:b + 1].float(), kb.float(), vb.float(), softmax_scale=scale, window=window,
                               softcap=softcap, alibi_slopes=None if slopes is None else slopes.float(),
                               upcast=False)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses).float()


def _attention_triton(q, k_cache, v_cache, ends, max_end, block_table, cache_batch_idx, cache_leftpad, scale,
                      window, softcap, alibi_slopes, num_splits):
    from ioattn.kernels.decode import decode_split_kernel

    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k_cache.shape[2]
    group = nheads // nheads_kv
    paged = block_table is not None
    block_n = _BLOCK_N_CUDA if q.is_cuda else _BLOCK_N_INTERPRETER
    page_size = k_cache.shape[1] if paged else 0
    if paged:
        while page_size % block_n:
            block_n //= 2
    rows = group * seqlen_q
    block_m = min(_MAX_BLOCK_M, max(16, triton.next_power_of_2(rows)))
    num_m_blocks = triton.cdiv(rows, block_m)
    programs = batch * nheads_kv * num_m_blocks
    if num_splits == 0:
        num_splits = _heuristic_splits(programs, max_end, block_n)

    opart = torch.empty(num_splits, batch, seqlen_q, nheads, d, device=q.device, dtype=torch.float32)
    lpart = torch.empty(num_splits, batch, seqlen_q, nheads, device=q.device, dtype=torch.float32)
    has_alibi = alibi_slopes is not None
    slopes = alibi_slopes.float().contiguous() if has_alibi else q
    stride_ab = slopes.stride(0) if has_alibi and slopes.dim() == 2 else 0
    qk_scale, _, _ = _scalars(scale, softcap, 0.0)  # log2(e) or 1/cap folded in, as in the forward
    dummy = ends  # any int32 tensor stands in for the absent index tensors (never read)
    decode_split_kernel[(programs * num_splits,)](
        q, k_cache, v_cache, opart, lpart, ends,
        cache_leftpad.contiguous() if cache_leftpad is not None else dummy,
        block_table.contiguous() if paged else dummy,
        cache_batch_idx.contiguous() if cache_batch_idx is not None else dummy,
        slopes,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.shape[1] if paged else 0, stride_ab,
        opart.stride(0), opart.stride(1), opart.stride(2), opart.stride(3),
        lpart.stride(0), lpart.stride(1), lpart.stride(2),
        nheads_kv, group, seqlen_q, num_m_blocks, num_splits,
        qk_scale, float(softcap), window[0], window[1],
        HEAD_DIM=d, BLOCK_D=dispatch.block_d(d), BLOCK_M=block_m, BLOCK_N=block_n,
        PAGE_SIZE=max(page_size, 1), PAGED=paged, HAS_BATCH_IDX=cache_batch_idx is not None,
        HAS_LEFTPAD=cache_leftpad is not None, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=has_alibi,
        num_warps=_NUM_WARPS, num_stages=_NUM_STAGES,
    )
    if num_splits == 1:
        out, lse = opart[0], lpart[0]
    else:
        out, lse = merge_attention_states(opart, lpart)
    return out.to(q.dtype), lse.transpose(1, 2).contiguous()


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention of ``q`` over a KV cache, after appending ``k``/``v`` to it in place (flash-attn API).

    q: (batch, seqlen_q, nheads, d). k_cache/v_cache: (batch_cache, seqlen_cache, nheads_kv, d), or
    paged (num_pages, page_size, nheads_kv, d) with ``block_table`` int32 (batch, max_pages_per_seq)
    and page_size a multiple of 16. k/v: optional new tokens (batch, seqlen_new, nheads_kv, d), written
    at columns ``cache_seqlens[b] ..`` (``cache_seqlens``: int32 (batch,) or int; None = every cache
    full, not allowed with k/v). ``cache_batch_idx`` int32 (batch,): the contiguous cache row of each
    sequence. ``cache_leftpad`` int32 (batch,): the first valid column. ``rotary_cos/sin``
    (seqlen_ro, rotary_dim / 2): rotary on q and the new k (``rotary_interleaved``: GPT-J pairs, else
    GPT-NeoX halves). ``causal``, ``window_size``, ``softcap``, ``alibi_slopes`` ((nheads,) or
    (batch, nheads)) as in ``flash_attn_func``, bottom-right aligned to each sequence's valid length.
    ``num_splits``: key-range splits of the split-KV kernel (0 = heuristic, 1 = no split).

    Returns ``out`` (batch, seqlen_q, nheads, d) in q's dtype, and with ``return_softmax_lse`` also
    ``softmax_lse`` (batch, nheads, seqlen_q) float32 (-inf for rows that see no key; their output is 0).
    """
    scale, softcap, window, seqlen_new, max_end = _validate(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits)
    batch, seqlen_q = q.shape[:2]
    device = q.device
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]
    if cache_seqlens is None:
        starts = torch.full((batch,), capacity, dtype=torch.long, device=device)
    elif isinstance(cache_seqlens, int):
        starts = torch.full((batch,), cache_seqlens, dtype=torch.long, device=device)
    else:
        starts = cache_seqlens.long()

    if rotary_cos is not None:
        steps = torch.arange(seqlen_q, device=device)
        per_token = window != (-1, -1)  # causal or a window: query i sits at cache_seqlens + i
        q = apply_rotary_ref(q, rotary_cos, rotary_sin, starts[:, None] + (steps if per_token else 0 * steps),
                             rotary_interleaved)
        if k is not None:
            k = apply_rotary_ref(k, rotary_cos, rotary_sin,
                                 starts[:, None] + torch.arange(seqlen_new, device=device), rotary_interleaved)
    if k is not None and seqlen_new:
        positions = starts[:, None] + torch.arange(seqlen_new, device=device)
        first, row = _storage_index(positions, block_table, cache_batch_idx, k_cache.shape[1])
        k_cache[first, row] = k
        v_cache[first, row] = v

    ends = starts + seqlen_new
    if dispatch.use_triton(device) and batch and seqlen_q:
        q = q if q.stride(-1) == 1 else q.contiguous()
        out, lse = _attention_triton(q, k_cache, v_cache, ends.to(torch.int32).contiguous(), max_end, block_table,
                                     cache_batch_idx, cache_leftpad, scale, window, softcap, alibi_slopes,
                                     num_splits)
    elif batch and seqlen_q:
        out, lse = _attention_torch(q, k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad, scale,
                                    window, softcap, alibi_slopes)
    else:
        out = q.new_zeros(q.shape)
        lse = torch.full((batch, q.shape[2], seqlen_q), float("-inf"), device=device)
    return (out, lse) if return_softmax_lse else out
