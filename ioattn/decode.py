"""``flash_attn_with_kvcache``: attention of a few new query tokens over a KV cache (decoding).

Semantics are flash-attn's, stated in ``ioattn.reference.decode`` (the oracle): optional rotary on
q and the new keys, an in-place append of the new k/v into the cache (contiguous, optionally
through ``cache_batch_idx``, or paged through ``block_table``), then attention over each sequence's
valid columns ``[cache_leftpad, cache_seqlens + seqlen_new)``.

Every argument is checked before the cache is touched: a refused call raises ``ValueError`` or
``TypeError`` naming the argument and leaves ``k_cache``/``v_cache`` as they were. The value checks
(cache_seqlens, block_table, cache_batch_idx, cache_leftpad ranges) read those tensors back to the
host once.

FP8 (e4m3) caches hold ``value / descale`` with one descale per (sequence, KV head): new tokens
are quantised into them on append, and the attention reads them dequantised (``k_descale`` and
``v_descale``, FlashAttention-3's convention).

On CUDA (or under ``TRITON_INTERPRET=1``) the attention is the Flash-Decoding split-KV kernel of
``ioattn.kernels.decode`` followed by the LSE merge, planned by ``ioattn.plan.decode`` and launched
by ``ioattn.launch.decode``; elsewhere a plain PyTorch path computing in float32.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from typing import Optional

import torch

from ioattn.plan import dispatch
from ioattn.plan.decode import PHI_RANGE, DecodePlan, decode_config, head_blocks, plan
from ioattn.api import _DTYPES, _check_sinks
from ioattn.autograd import join_sinks
from ioattn.backends import _scalars
from ioattn.fp8 import check_descale, check_descale_values, is_fp8
from ioattn.semantics import Semantics
from ioattn.launch.decode import split_kv_attention
from ioattn.launch.mla import mla_attention
from ioattn.masks import normalize_window
from ioattn.reference.decode import apply_rotary_ref, gather_kv_ref, quantize_kv_ref
from ioattn.reference.naive import attention_ref

# the public names (the plan's two are defined in ioattn.plan.decode)
__all__ = ["flash_attn_with_kvcache", "explain_decode", "decode_config", "DecodePlan"]

# Head dims decoding takes: q and k up to MLA's 576 (512 latent + 64 rotary), V up to its 512.
MAX_HEADDIM = 576
MAX_HEADDIM_V = 512


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
              num_splits, check_values=True, unified_max=None, k_descale=None, v_descale=None):
    """All checks; returns the normalised call (nothing has been written yet).

    Shapes, dtypes and devices are always checked. With ``check_values`` the index tensors' values
    are checked too, read back to the host in one transfer, and an FP8 cache's descales (one more
    read); without it (or while a CUDA graph is being captured, when no read-back is possible) they
    are trusted and the returned max end is None. The descales come back as float32 (batch,
    nheads_kv) tensors, or None for 16- and 32-bit caches."""
    shapes = _check_caches(q, k_cache, v_cache)
    descales = _check_descales(q, k_cache, k_descale, v_descale)
    capacity = _check_layout(q, k_cache, cache_batch_idx, block_table, shapes)
    seqlen_new = _check_new_tokens(q, k_cache, v_cache, k, v, cache_seqlens)
    seqlens = _check_lengths(q, cache_seqlens, cache_leftpad, capacity)
    softmax_scale, softcap, window = _check_scalars(q, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                                    num_splits, unified_max)
    _check_rotary(q, rotary_cos, rotary_sin)
    if not check_values or (q.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return softmax_scale, softcap, window, seqlen_new, None, descales
    for name, descale in zip(("k_descale", "v_descale"), descales or ()):
        check_descale_values(name, descale)
    max_end = _check_index_values(q, k_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, rotary_cos,
                                  seqlens, seqlen_new, capacity, window)
    return softmax_scale, softcap, window, seqlen_new, max_end, descales


def _check_caches(q, k_cache, v_cache) -> str:
    """q and the caches: tensors, 4-D, one dtype (or FP8 caches for a 16-bit q) and device, matching
    head dims and heads; returns the shapes' text for later messages."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES and not (name != "q" and is_fp8(t)):
            extra = "" if name == "q" else " (or float8_e4m3fn)"
            raise TypeError(f"{name} must be float16, bfloat16 or float32{extra}, got {t.dtype}")
    shapes = f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
    if is_fp8(k_cache) or is_fp8(v_cache):
        if not (is_fp8(k_cache) and is_fp8(v_cache)):
            raise TypeError(f"k_cache and v_cache must both be FP8 (float8_e4m3fn) or neither, got {k_cache.dtype} "
                            f"and {v_cache.dtype}")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"q must be float16 or bfloat16 with FP8 caches, got {q.dtype}")
    elif not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    device = q.device
    if not (k_cache.device == v_cache.device == device):
        raise ValueError(f"q, k_cache, v_cache must be on one device, got {device}, {k_cache.device}, {v_cache.device}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must agree in all but the head dim, got {shapes}")
    nheads, d = q.shape[2], q.shape[3]
    nheads_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache must have the same head dim, got {shapes}")
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEADDIM}, got {d} ({shapes})")
    if not 1 <= v_cache.shape[3] <= MAX_HEADDIM_V:
        raise ValueError(f"value head dim (v_cache.shape[-1]) must be between 1 and {MAX_HEADDIM_V}, got "
                         f"{v_cache.shape[3]} ({shapes})")
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"number of query heads ({nheads}) must be a multiple of the number of key/value "
                         f"heads ({nheads_kv}): {shapes}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"k_cache and v_cache must be contiguous in the head dim (stride 1), got strides "
                         f"{k_cache.stride()} and {v_cache.stride()}")
    return shapes


def _check_descales(q, k_cache, k_descale, v_descale):
    """FP8 caches need both descales (broadcasting to (batch, nheads_kv)), other caches take none;
    returns them as contiguous float32 (batch, nheads_kv) tensors, or None."""
    pairs = (("k_descale", k_descale), ("v_descale", v_descale))
    if not is_fp8(k_cache):
        for name, descale in pairs:
            if descale is not None:
                raise ValueError(f"{name} is only for FP8 (float8_e4m3fn) caches, but the caches are {k_cache.dtype}")
        return None
    return tuple(check_descale(name, descale, q.shape[0], k_cache.shape[2], q.device) for name, descale in pairs)


def _check_layout(q, k_cache, cache_batch_idx, block_table, shapes) -> int:
    """The cache's layout (paged by ``block_table`` or contiguous, ``cache_batch_idx``); returns the
    tokens a sequence can hold."""
    batch, device = q.shape[0], q.device
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is for the contiguous cache only; it cannot be used with block_table")
        _check_index_tensor("block_table", block_table, f"({batch}, max_pages_per_seq)", 2, device)
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_pages_per_seq), got {tuple(block_table.shape)}")
        page_size = k_cache.shape[1]
        if page_size == 0 or page_size % 16:
            raise ValueError(f"page size (k_cache.shape[1]) must be a positive multiple of 16, got {page_size}")
        return block_table.shape[1] * page_size
    if cache_batch_idx is not None:
        _check_index_tensor("cache_batch_idx", cache_batch_idx, f"({batch},)", 1, device)
        if cache_batch_idx.shape[0] != batch:
            raise ValueError(f"cache_batch_idx must have shape ({batch},), got {tuple(cache_batch_idx.shape)}")
    elif k_cache.shape[0] < batch:
        raise ValueError(f"the contiguous cache needs a row per sequence (or cache_batch_idx): batch {batch} "
                         f"> k_cache.shape[0] {k_cache.shape[0]} ({shapes})")
    return k_cache.shape[1]


def _check_new_tokens(q, k_cache, v_cache, k, v, cache_seqlens) -> int:
    """The new tokens ``k``, ``v`` (both or neither); returns their count."""
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (or neither)")
    if k is None:
        return 0
    batch, d, nheads_kv, dv = q.shape[0], q.shape[3], k_cache.shape[2], v_cache.shape[3]
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {t.device}")
    if (k.dim() != 4 or v.dim() != 4 or k.shape[:2] != v.shape[:2] or k.shape[0] != batch
            or tuple(k.shape[2:]) != (nheads_kv, d) or tuple(v.shape[2:]) != (nheads_kv, dv)):
        raise ValueError(f"k and v must both be (batch={batch}, seqlen_new, nheads_kv={nheads_kv}, head dim), with "
                         f"k_cache's head dim {d} and v_cache's {dv}, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if cache_seqlens is None:
        raise ValueError("cache_seqlens is required when new k/v are given (it says where they are written)")
    return k.shape[1]


def _check_lengths(q, cache_seqlens, cache_leftpad, capacity):
    """``cache_seqlens`` and ``cache_leftpad``; returns the lengths as a list, or None where they are a
    device tensor (read with the other index values)."""
    batch, device = q.shape[0], q.device
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
        seqlens = None
    if cache_leftpad is not None:
        _check_index_tensor("cache_leftpad", cache_leftpad, f"({batch},)", 1, device)
        if cache_leftpad.shape[0] != batch:
            raise ValueError(f"cache_leftpad must have shape ({batch},), got {tuple(cache_leftpad.shape)}")
    return seqlens


def _check_scalars(q, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits, unified_max):
    """The scalar arguments and ALiBi's slopes; returns (scale, softcap, normalised window)."""
    batch, nheads, d = q.shape[0], q.shape[2], q.shape[3]
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
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes must be on {q.device}, got {alibi_slopes.device}")
    if unified_max is not None and (isinstance(unified_max, bool) or not isinstance(unified_max, (int, float))
                                    or not math.isfinite(unified_max)):
        raise ValueError(f"unified_max must be a finite number or None, got {unified_max!r}")
    return float(softmax_scale), float(softcap), window


def _check_rotary(q, rotary_cos, rotary_sin) -> None:
    """The rotary tables' types, devices and shapes (their length is checked with the index values)."""
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together (or neither)")
    if rotary_cos is None:
        return
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {_type_name(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} must be on {q.device}, got {t.device}")
    if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape:
        raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                         f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
    rotary_dim = 2 * rotary_cos.shape[1]
    if not 0 < rotary_dim <= q.shape[3]:
        raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be in (0, head dim {q.shape[3]}]")


def _check_index_values(q, k_cache, cache_seqlens, cache_leftpad, cache_batch_idx, block_table, rotary_cos, seqlens,
                        seqlen_new, capacity, window) -> int:
    """The index tensors' values, read back in one transfer, against the cache; returns the longest
    sequence end."""
    batch, seqlen_q = q.shape[0], q.shape[1]
    parts = [t for t in (cache_seqlens if seqlens is None else None, cache_leftpad, cache_batch_idx, block_table)
             if t is not None]
    values = torch.cat([t.reshape(-1) for t in parts]).tolist() if parts else []
    if seqlens is None:
        seqlens, values = values[:batch], values[batch:]
    if any(s < 0 or s + seqlen_new > capacity for s in seqlens):
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {capacity}] (the cache capacity), got "
                         f"cache_seqlens {seqlens} with seqlen_new {seqlen_new}")
    ends = [s + seqlen_new for s in seqlens]
    if cache_leftpad is not None:
        pads, values = values[:batch], values[batch:]
        if any(p < 0 or p > e for p, e in zip(pads, ends)):
            raise ValueError(f"need 0 <= cache_leftpad <= cache_seqlens + seqlen_new, got cache_leftpad {pads}, "
                             f"cache_seqlens + seqlen_new {ends}")
    if cache_batch_idx is not None:
        rows, values = values[:batch], values[batch:]
        if rows and (min(rows) < 0 or max(rows) >= k_cache.shape[0]):
            raise ValueError(f"cache_batch_idx entries must lie in [0, {k_cache.shape[0]}) (k_cache rows), "
                             f"got values {min(rows)}..{max(rows)}")
    if block_table is not None and values:
        num_pages = k_cache.shape[0]
        if min(values) < 0 or max(values) >= num_pages:
            raise ValueError(f"block_table entries must lie in [0, {num_pages}) (k_cache has {num_pages} pages), "
                             f"got values {min(values)}..{max(values)}")
    if rotary_cos is not None:
        per_token = window != (-1, -1)
        need = max([s + max(seqlen_new, seqlen_q if per_token else 1) for s in seqlens], default=0)
        if need > rotary_cos.shape[0]:
            raise ValueError(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} rows but positions up to "
                             f"{need - 1} are rotated (cache_seqlens {seqlens}, seqlen_q {seqlen_q}, "
                             f"seqlen_new {seqlen_new})")
    return max(ends, default=0)


def _storage_index(positions, block_table, cache_batch_idx, page_size):
    """(first index, row) of the absolute cache columns ``positions`` (batch, n)."""
    if block_table is not None:
        first = block_table.long().gather(1, positions // page_size)
        return first, positions % page_size
    batch = positions.shape[0]
    rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(batch, device=positions.device)
    return rows[:, None].expand_as(positions), positions


def explain_decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, num_splits=0):
    """What ``flash_attn_with_kvcache`` would run for these tensors (nothing is launched): a dict with
    ``path`` ("triton" or "torch"), the launch ``plan`` (``DecodePlan``'s fields) and ``reason`` (the
    rules that chose it, in order). ``cache_seqlens``: as in the call, before any append; a tensor's
    largest value is read back to the host here (the call itself plans by it only when
    ``check_values`` reads it, else by the capacity)."""
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if isinstance(cache_seqlens, torch.Tensor):
        span = min(int(cache_seqlens.max()), capacity) if cache_seqlens.numel() else 0
    else:
        span = capacity if cache_seqlens is None else min(int(cache_seqlens), capacity)
    if not dispatch.use_triton(q.device):
        fp8 = " (the FP8 cache dequantised in float32)" if is_fp8(k_cache) else ""
        return {"path": "torch", "plan": None, "reason": f"no Triton for this device: the PyTorch path{fp8}"}
    cfg = plan(q, k_cache, v_cache, paged, span, num_splits)
    fields = asdict(cfg)
    return {"path": "triton", "plan": {k: v for k, v in fields.items() if k != "reason"}, "reason": cfg.reason}


def _attention_torch(q, k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad, scale, window,
                     softcap, alibi_slopes, descales):
    """The PyTorch path, in float32 (an FP8 cache dequantised: its values times the descales)."""
    kv = gather_kv_ref(k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad)
    outs, lses = [], []
    for b, (kb, vb) in enumerate(kv):
        if descales is not None:
            kb, vb = (x.float() * s[b][None, None, :, None] for x, s in zip((kb, vb), descales))
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(q[b:b + 1].float(), kb.float(), vb.float(), softmax_scale=scale, window=window,
                               softcap=softcap, alibi_slopes=None if slopes is None else slopes.float(),
                               upcast=False)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses).float()


def _attention_triton(q, k_cache, v_cache, cache_seqlens, seqlen_new, span, block_table, cache_batch_idx,
                      cache_leftpad, scale, window, softcap, alibi_slopes, num_splits, unified_max, descales):
    """The split-KV kernel's path: the call's plan (``ioattn.plan.decode``), then its launch
    (``ioattn.launch.decode``)."""
    semantics = Semantics(scale, window=window, softcap=softcap)
    used = (("window", semantics.sliding), ("softcap", softcap > 0), ("alibi", alibi_slopes is not None),
            ("leftpad", cache_leftpad is not None), ("batch_idx", cache_batch_idx is not None),
            ("unified_max", unified_max is not None))
    features = tuple(name for name, on in used if on)
    cfg = plan(q, k_cache, v_cache, block_table is not None, span, num_splits, features)
    qk_scale, _, _ = _scalars(semantics)  # log2(e) or 1/cap folded in, as in the forward
    if cfg.kernel == "mla":
        return mla_attention(cfg, q, k_cache, v_cache.shape[-1], cache_seqlens, seqlen_new, block_table, qk_scale,
                             semantics.causal, cached=dispatch.cached_launch())
    k_descale, v_descale = descales or (None, None)
    block_d, block_d_tail = head_blocks(q.shape[-1])
    return split_kv_attention(cfg, q, k_cache, v_cache, cache_seqlens, seqlen_new, block_table, cache_batch_idx,
                              cache_leftpad, qk_scale, softcap, window, alibi_slopes, unified_max,
                              block_d=block_d, block_d_tail=block_d_tail, block_dv=dispatch.block_d(v_cache.shape[-1]),
                              phi_range=PHI_RANGE[q.dtype], cached=dispatch.cached_launch(), k_descale=k_descale,
                              v_descale=v_descale)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, check_values=True, unified_max=None, k_descale=None,
                            v_descale=None, sinks=None):
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
    v_cache (and v) may have a head dim of their own, the output's (MLA: q and k_cache up to 576 wide,
    v_cache up to 512, best a view ``k_cache[..., :512]`` of the latent cache, read once; ``docs/mla.md``).

    Beyond flash-attn's arguments (keyword only):

    * ``check_values`` (default True): check the values of ``cache_seqlens``, ``block_table``,
      ``cache_batch_idx`` and ``cache_leftpad`` before anything is written, at the cost of one
      device-to-host read per call. ``False`` trusts them (as flash-attn does) so a decode loop never
      waits for the device; the kernel still clamps every index to the cache, so bad values give
      wrong numbers, never reads outside it. Under CUDA graph capture the values are never read
      (the graph replays with whatever values the tensors hold then).
    * ``unified_max`` (float or None): FlashDecoding++'s asynchronous softmax. Every split subtracts
      this fixed score value (after softmax_scale and softcap, natural-log units) instead of a
      running max; a split whose scores leave the safe range around it is recomputed exactly, so the
      result is exact either way. Choose it from typical scores of the model (a calibration sample).
      The CPU path ignores it (it is exact already).
    * ``k_descale``, ``v_descale``: for FP8 (``torch.float8_e4m3fn``) caches, and required there: the
      cache holds ``value / descale``, one descale per (sequence, KV head), shape (batch, nheads_kv)
      or anything that broadcasts to it (a scalar tensor: one for the whole cache). q, k, v stay
      float16 / bfloat16; new k/v are quantised into the cache (clamped to ±448, rounded to nearest
      even). Their values (finite, positive) are checked with ``check_values``.
    * ``sinks`` (nheads,): learnable attention sinks, as in ``flash_attn_func`` (joined with the kernel's
      output and lse; rows that see no key stay empty).

    Returns ``out`` (batch, seqlen_q, nheads, v_cache's head dim) in q's dtype, and with ``return_softmax_lse`` also
    ``softmax_lse`` (batch, nheads, seqlen_q) float32 (-inf for rows that see no key; their output is 0).
    """
    if sinks is not None and isinstance(q, torch.Tensor) and q.dim() == 4:  # (a bad q: its own check names it)
        _check_sinks(sinks, q, False)  # (FP8 caches too: the sinks join the output after the kernel)
    if torch.compiler.is_compiling() and isinstance(window_size, (tuple, list)):
        # one opaque op in the traced graph (the value checks, the append and the launches inside)
        seqlens_t = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
        out, lse = torch.ops.ioattn.kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens_t,
            None if seqlens_t is not None else cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
            softmax_scale, bool(causal), int(window_size[0]), int(window_size[1]), float(softcap),
            bool(rotary_interleaved), alibi_slopes, num_splits, bool(check_values), unified_max, k_descale, v_descale)
    else:
        out, lse = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, num_splits, check_values, unified_max, k_descale,
                            v_descale)
    if sinks is not None:
        out, lse = join_sinks(out, lse, sinks, varlen=False)
    return (out, lse) if return_softmax_lse else out


def _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
             check_values, unified_max, k_descale=None, v_descale=None):
    """``flash_attn_with_kvcache``'s work: checks, append, attention; returns (out, lse)."""
    scale, softcap, window, seqlen_new, max_end, descales = _validate(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits, check_values,
        unified_max, k_descale, v_descale)
    batch, seqlen_q = q.shape[:2]
    device = q.device
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]

    def starts():  # int64 (batch,) on the device; built only where needed (each op is a launch)
        if isinstance(cache_seqlens, torch.Tensor):
            return cache_seqlens.long()
        return torch.full((batch,), capacity if cache_seqlens is None else cache_seqlens, dtype=torch.long,
                          device=device)

    if rotary_cos is not None:
        steps = torch.arange(seqlen_q, device=device)
        per_token = window != (-1, -1)  # causal or a window: query i sits at cache_seqlens + i
        first = starts()[:, None]
        q = apply_rotary_ref(q, rotary_cos, rotary_sin, first + (steps if per_token else 0 * steps),
                             rotary_interleaved)
        if k is not None:
            k = apply_rotary_ref(k, rotary_cos, rotary_sin, first + torch.arange(seqlen_new, device=device),
                                 rotary_interleaved)
    if k is not None and seqlen_new:
        positions = starts()[:, None] + torch.arange(seqlen_new, device=device)
        first, row = _storage_index(positions, block_table, cache_batch_idx, k_cache.shape[1])
        if descales is not None:  # FP8: value / descale, saturated at ±448
            k, v = quantize_kv_ref(k, descales[0]), quantize_kv_ref(v, descales[1])
        k_cache[first, row] = k
        v_cache[first, row] = v

    if dispatch.use_triton(device, q.dtype) and batch and seqlen_q:
        q = q if q.stride(-1) == 1 else q.contiguous()
        span = capacity if max_end is None else max_end  # the plan never waits for device values
        out, lse = _attention_triton(q, k_cache, v_cache, cache_seqlens, seqlen_new, span, block_table,
                                     cache_batch_idx, cache_leftpad, scale, window, softcap, alibi_slopes,
                                     num_splits, unified_max, descales)
    elif batch and seqlen_q:
        out, lse = _attention_torch(q, k_cache, v_cache, starts() + seqlen_new, block_table, cache_batch_idx,
                                    cache_leftpad, scale, window, softcap, alibi_slopes, descales)
    else:
        out = q.new_zeros(*q.shape[:3], v_cache.shape[3])
        lse = torch.full((batch, q.shape[2], seqlen_q), float("-inf"), device=device)
    return out, lse


@torch.library.custom_op("ioattn::kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                cache_seqlens: Optional[torch.Tensor], cache_seqlens_int: Optional[int],
                cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool, window_left: int,
                window_right: int, softcap: float, rotary_interleaved: bool, alibi_slopes: Optional[torch.Tensor],
                num_splits: int, check_values: bool, unified_max: Optional[float], k_descale: Optional[torch.Tensor],
                v_descale: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_with_kvcache`` as one op for ``torch.compile`` (the caches mutated in place);
    ``cache_seqlens`` as a tensor or, in ``cache_seqlens_int``, an int (both None: every cache full)."""
    seqlens = cache_seqlens if cache_seqlens is not None else cache_seqlens_int
    return _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens, cache_batch_idx, cache_leftpad,
                    block_table, softmax_scale, causal, (window_left, window_right), softcap, rotary_interleaved,
                    alibi_slopes, num_splits, check_values, unified_max, k_descale, v_descale)


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlens_int, cache_batch_idx,
      cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
      alibi_slopes, num_splits, check_values, unified_max, k_descale, v_descale):
    # shapes, dtypes and devices are checked while tracing (a bad call fails there); values at run time
    _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
              cache_seqlens if cache_seqlens is not None else cache_seqlens_int, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, (window_left, window_right), softcap, alibi_slopes, num_splits,
              check_values=False, unified_max=unified_max, k_descale=k_descale, v_descale=v_descale)
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(batch, seqlen_q, nheads, v_cache.shape[3]), q.new_empty((batch, nheads, seqlen_q),
                                                                                dtype=torch.float32)

