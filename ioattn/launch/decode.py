"""Launches of the split-KV decode kernel (``ioattn.kernels.decode.decode_split_kernel``) from its plan
(``ioattn.plan.decode.DecodePlan``): the output, lse and split buffers, the TMA descriptors over the
cache, the kernel's arguments, then the LSE merge of the split units (``ioattn.launch.merge``)."""
from __future__ import annotations

import torch

from ioattn.kernels.constants import LOG2E
from ioattn.launch.cached import launcher_for
from ioattn.launch.merge import merge_states


def split_kv_attention(cfg, q, k_cache, v_cache, cache_seqlens, seqlen_new, block_table, cache_batch_idx,
                       cache_leftpad, qk_scale, softcap, window, alibi_slopes, unified_max, *, block_d, phi_range,
                       cached, k_descale=None, v_descale=None, block_d_tail=0, block_dv=None):
    """(out, lse) of one decode call: the split kernel launched as ``cfg`` (a ``DecodePlan``) says, then
    the merge of its split units. ``cache_seqlens``: the int32 tensor, an int, or None (= the
    capacity); sequence b ends at ``cache_seqlens[b] + seqlen_new``. ``qk_scale``: the softmax scale
    with log2(e) or 1/softcap folded in; ``block_d``: the kernel's padded head dim of q and K, or with
    ``block_d_tail`` the first of its two blocks; ``block_dv``: V's padded head dim (``block_d`` when
    None: V's head dim is q's); ``phi_range``:
    the unified max's (below, above) for q's dtype; ``cached``: through ``launch.cached``.
    ``k_descale`` / ``v_descale``: float32 contiguous (batch, nheads_kv), for a plan of FP8 caches."""
    from ioattn.kernels.decode import decode_split_kernel

    batch, seqlen_q, nheads, d = q.shape
    nheads_kv, dv = k_cache.shape[2], v_cache.shape[3]
    block_dv = block_d if block_dv is None else block_dv
    group = nheads // nheads_kv
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    num_m_blocks = -(-(group * seqlen_q) // cfg.block_m)  # ceiling division
    programs = batch * nheads_kv * num_m_blocks

    # units (sequence, KV head, row block) taken whole write out / lse; the rest, a batch suffix from
    # b0, are split and merged
    num_whole = (programs if cfg.num_splits == 1 else 0) if cfg.num_whole is None else cfg.num_whole
    b0 = num_whole // (nheads_kv * num_m_blocks)
    split = cfg.num_splits > 1 and b0 < batch
    out = torch.empty(batch, seqlen_q, nheads, dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    if split:
        opart = torch.empty(cfg.num_splits, batch - b0, seqlen_q, nheads, dv, device=q.device, dtype=torch.float32)
        lpart = torch.empty(cfg.num_splits, batch - b0, seqlen_q, nheads, device=q.device, dtype=torch.float32)
    else:  # never written
        opart, lpart = out.new_empty(1, 1, 1, 1, 1, dtype=torch.float32), lse.new_empty(1, 1, 1, 1)
    has_seqlens = isinstance(cache_seqlens, torch.Tensor)
    seqlen_base = capacity if cache_seqlens is None else 0 if has_seqlens else int(cache_seqlens)
    has_alibi = alibi_slopes is not None
    slopes = alibi_slopes.float().contiguous() if has_alibi else q
    stride_ab = slopes.stride(0) if has_alibi and slopes.dim() == 2 else 0
    k_desc = v_desc = None
    if cfg.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k_desc, v_desc = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, cfg.block_n, 1, block])
                          for t, block in ((k_cache, block_d), (v_cache, block_dv)))
    below, above = phi_range
    dummy = lpart  # any tensor stands in for the absent index tensors (never read)
    if cfg.kv_fp8 and (k_descale is None or v_descale is None):
        raise ValueError("an FP8 cache's launch needs k_descale and v_descale")
    launcher_for(decode_split_kernel)((num_whole + (programs - num_whole) * cfg.num_splits,), (
        q, k_cache, v_cache, out, lse, opart, lpart, cache_seqlens.contiguous() if has_seqlens else dummy,
        cache_leftpad.contiguous() if cache_leftpad is not None else dummy,
        block_table.contiguous() if paged else dummy,
        cache_batch_idx.contiguous() if cache_batch_idx is not None else dummy,
        slopes, k_desc, v_desc, k_descale if cfg.kv_fp8 else dummy, v_descale if cfg.kv_fp8 else dummy,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.shape[1] if paged else 0, stride_ab,
        *opart.stride()[:4], *lpart.stride(), seqlen_base, seqlen_new, nheads_kv, group, seqlen_q, num_m_blocks,
        cfg.num_splits, num_whole, b0, capacity, k_cache.shape[0],
        qk_scale, float(softcap), window[0], window[1], 0.0 if unified_max is None else unified_max * LOG2E),
        dict(HEAD_DIM=d, BLOCK_D=block_d, HEAD_DIM_V=dv, BLOCK_DV=block_dv, BLOCK_D_TAIL=block_d_tail,
             BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
             PAGE_SIZE=max(page_size, 1), PAGED=paged, HAS_BATCH_IDX=cache_batch_idx is not None,
             HAS_LEFTPAD=cache_leftpad is not None, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=has_alibi,
             USE_TMA=cfg.use_tma, UNIFIED=unified_max is not None, PHI_BELOW=below, PHI_ABOVE=above,
             HAS_SEQLENS=has_seqlens, USE_PDL=cfg.pdl and split, PDL_WAIT=cfg.pdl_wait, KV_FP8=cfg.kv_fp8,
             num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"maxnreg": cfg.max_regs} if cfg.max_regs else {}),
             **({"launch_pdl": True} if cfg.pdl_wait else {})), cached=cached)
    if split:
        merge_states(opart, lpart, block_d=block_dv, cached=cached, lse_bhm=True, pdl=cfg.pdl,
                     out=out[b0:], lse=lse[b0:])
    return out, lse
