"""Launches of the Gluon MLA decode kernel (``ioattn.kernels.hopper_mla.mla_decode_kernel``) from its
plan (a ``DecodePlan`` with ``kernel == "mla"``): q and the latent cache as rows under TMA descriptors
(main and rotary columns apart), the output, lse and split buffers, then the LSE merge of the splits."""
from __future__ import annotations

import torch

from ioattn.launch.cached import launcher_for
from ioattn.launch.gluon_fwd import rebased, template_desc
from ioattn.launch.merge import merge_states


_TEMPLATES: dict = {}


def _rows_desc(rows, first, width, block_rows):
    """A descriptor over columns [first, first + width) of the (n, d) row view ``rows``, in
    [block_rows, width] boxes: a template made once per shape (its layout and checks), rebased here."""
    key = (rows.shape, rows.stride(0), rows.dtype, rows.device, first, width, block_rows)
    template = _TEMPLATES.get(key)
    if template is None:
        from triton.experimental.gluon import language as gl

        gdt = gl.bfloat16 if rows.dtype == torch.bfloat16 else gl.float16
        block = [block_rows, width]
        if len(_TEMPLATES) >= 64:
            _TEMPLATES.clear()
        template = _TEMPLATES[key] = template_desc([rows.shape[0], width], [rows.stride(0), 1], block,
                                                   gl.NVMMASharedLayout.get_default_for(block, gdt), rows.dtype,
                                                   rows.device)
    return rebased(template, rows[:, first:] if first else rows)


def mla_attention(cfg, q, k_cache, dv, cache_seqlens, seqlen_new, block_table, qk_scale, causal, *, cached):
    """(out, lse) of one MLA decode call as ``cfg`` says: q (batch, seqlen_q, nheads, d) over the latent
    cache ``k_cache`` (rows or pages, page or capacity, 1, d), V its first ``dv`` columns.
    ``cache_seqlens``: the int32 tensor, an int, or None (= the capacity); sequence b ends at
    ``cache_seqlens[b] + seqlen_new``. ``qk_scale``: the softmax scale times log2(e)."""
    from ioattn.kernels.hopper_mla import mla_decode_kernel

    batch, seqlen_q, nheads, d = q.shape
    paged = block_table is not None
    page_size = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    if not q.is_contiguous() or q.data_ptr() % 16:  # TMA: packed rows from a 16-byte aligned base
        q = q.clone(memory_format=torch.contiguous_format)
    rows_q = q.view(batch * seqlen_q * nheads, d)
    rows_k = k_cache.as_strided((k_cache.shape[0] * k_cache.shape[1], d), (k_cache.stride(1), 1))
    descs = (_rows_desc(rows_q, 0, dv, cfg.block_m), _rows_desc(rows_q, dv, d - dv, cfg.block_m),
             _rows_desc(rows_k, 0, dv, cfg.block_n), _rows_desc(rows_k, dv, d - dv, cfg.block_n))
    out = torch.empty(batch, seqlen_q, nheads, dv, device=q.device, dtype=q.dtype)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    split = cfg.num_splits > 1
    if split:
        opart = torch.empty(cfg.num_splits, batch, seqlen_q, nheads, dv, device=q.device, dtype=torch.float32)
        lpart = torch.empty(cfg.num_splits, batch, seqlen_q, nheads, device=q.device, dtype=torch.float32)
    else:  # never written
        opart = lpart = lse
    has_seqlens = isinstance(cache_seqlens, torch.Tensor)
    seqlen_base = capacity if cache_seqlens is None else 0 if has_seqlens else int(cache_seqlens)
    strides_p = opart.stride()[:4] if split else (0, 0, 0, 0)
    strides_l = lpart.stride() if split else (0, 0, 0, 0)
    grid = (-(-(nheads * seqlen_q) // cfg.block_m), cfg.num_splits, batch)
    launcher_for(mla_decode_kernel)(grid, (
        *descs, out, lse, opart, lpart, cache_seqlens.contiguous() if has_seqlens else lse,
        block_table.contiguous() if paged else lse,
        out.stride(0), out.stride(1), out.stride(2), *strides_p, *strides_l,
        block_table.shape[1] if paged else 0, seqlen_base, seqlen_new, seqlen_q, nheads, capacity,
        k_cache.shape[0], qk_scale),
        dict(BLOCK_N=cfg.block_n, STAGES=cfg.num_stages, PAGE_SIZE=max(page_size, 1), PAGED=paged,
             HAS_SEQLENS=has_seqlens, IS_CAUSAL=bool(causal), SPLIT=split, num_warps=cfg.num_warps), cached=cached)
    if split:
        merge_states(opart, lpart, block_d=dv, cached=cached, lse_bhm=True, out=out, lse=lse)
    return out, lse
