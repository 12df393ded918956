"""FlashAttention-2 forward in Triton: one program per (query block, batch*head); the Q tile stays
in registers while K/V tiles stream past; online softmax in exp2 form with the normalisation
deferred to the end; the row log-sum-exp is written for the backward pass.

Reference twin: ``ioattn.reference.tiled.flash2_forward``. Test: ``tests/test_kernels.py``.
"""
import triton
import triton.language as tl

from ioattn.kernels.common import (FP8_BLOCK_ROWS, LOG2E, P_SCALE, block_list_run, block_row, dropout_keep, kv_block_range,
                                   listed_block, mma, softmax_finish, softmax_step, softmax_step_lazy, tile_coords,
                                   tile_scores, tile_start)


@triton.jit
def _fwd_inner(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn, offs_m, offs_d,
               offs_dv, n_block_lo, n_block_hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
               window_right, slope_log2, seed, dropout_threshold, drop_row_base, seqlen_k_max,
               HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
               HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, EVEN_DV: tl.constexpr, USE_TMA: tl.constexpr,
               MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
               HAS_DROPOUT: tl.constexpr, RESCALE_TAU: tl.constexpr, IS_FP8: tl.constexpr, mods=None,
               kv_list=None, SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, SUB: tl.constexpr = 1,
               k_scales=None):
    """Key tiles ``n_block_lo`` .. ``n_block_hi`` - 1 into the running (acc, m_i, l_i): K's ``HEAD_DIM``
    columns (``offs_d``, ``BLOCK_D`` padded), V's ``HEAD_DIM_V`` (``offs_dv``, ``BLOCK_DV``). ``kv_list``: a
    block mask's row of key-block indices, tile i then being sub-tile i % ``SUB`` of the block at
    ``kv_list[i // SUB]``. ``SCORE_MOD`` / ``MASK_MOD`` (``ioattn.kernels.modgen``): the user's
    functions, ``mods`` = (b, h, softmax_scale, the score's and the mask's captured tensors).
    ``k_scales``: FP8 keys' descales per block of ``FP8_BLOCK_ROWS`` (this head's), each tile's own
    folded into its scores' scale (``BLOCK_N`` divides the block)."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for i in range(n_block_lo, n_block_hi):
        n_block = listed_block(i, kv_list, SUB)
        offs_n = n_block * BLOCK_N + offs_n0
        if USE_TMA:
            # bulk tensor copies (zero-filled past seqlen_k and head_dim), which Triton pipelines
            # through a multi-stage shared-memory ring; rows past seqlen_k are masked in the scores
            k = k_desc.load([b, n_block * BLOCK_N, h_kv, 0]).reshape(BLOCK_N, BLOCK_D)
            qk = mma(q, tl.trans(k))
        else:
            # K is loaded as (d, n) so q @ k needs no transpose; pointers are int64 via the base
            k_ptrs = k_base + offs_n[None, :].to(tl.int64) * stride_kn + offs_d[:, None]
            if MASKED:
                k = tl.load(k_ptrs, mask=(offs_n[None, :] < seqlen_k) & (offs_d[:, None] < HEAD_DIM), other=0.0)
            elif EVEN_D:
                k = tl.load(k_ptrs)
            else:
                k = tl.load(k_ptrs, mask=offs_d[:, None] < HEAD_DIM, other=0.0)
            qk = mma(q, k)
        if SCORE_MOD is not None:  # the user's score in natural units, then the log2 domain
            qk = SCORE_MOD(qk * mods[2], mods[0], mods[1], offs_m[:, None], offs_n[None, :], mods[3])
        tile_scale = qk_scale
        if k_scales is not None:
            tile_scale = qk_scale * tl.load(k_scales + n_block * BLOCK_N // FP8_BLOCK_ROWS)
        s = tile_scores(qk, offs_m, offs_n, seqlen_q, seqlen_k, tile_scale, softcap, window_left,
                        window_right, slope_log2, MASKED, HAS_SOFTCAP, HAS_ALIBI)
        if MASK_MOD is not None:
            s = tl.where(MASK_MOD(mods[0], mods[1], offs_m[:, None], offs_n[None, :], mods[4]), s, float("-inf"))
        GUARD: tl.constexpr = MASKED or MASK_MOD is not None or SCORE_MOD is not None
        if RESCALE_TAU > 0:  # FlashAttention-4: rescale acc only when a row max grows by > TAU
            p, m_i, l_i, acc = softmax_step_lazy(s, m_i, l_i, acc, RESCALE_TAU, GUARD)
        else:
            p, m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, GUARD)
        if HAS_DROPOUT:
            keep = dropout_keep(seed, dropout_threshold, drop_row_base, offs_n, seqlen_k_max)
            p = tl.where(keep, p, 0.0)
        if USE_TMA:
            v = v_desc.load([b, n_block * BLOCK_N, h_kv, 0]).reshape(BLOCK_N, BLOCK_DV)
        else:
            v_ptrs = v_base + offs_n[:, None].to(tl.int64) * stride_vn + offs_dv[None, :]
            if MASKED:
                v = tl.load(v_ptrs, mask=(offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < HEAD_DIM_V), other=0.0)
            elif EVEN_DV:
                v = tl.load(v_ptrs)
            else:
                v = tl.load(v_ptrs, mask=offs_dv[None, :] < HEAD_DIM_V, other=0.0)
        if IS_FP8:  # P in [0, 1] lifted into e4m3's normal range; undone with the normalisation
            acc = mma((p * P_SCALE).to(v.dtype), v, acc)
        else:
            acc = mma(p.to(v.dtype), v, acc)
    return acc, m_i, l_i


@triton.jit
def attn_fwd_kernel(
    Q, K, V, Out, Lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, k_desc, v_desc, Descales,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_ab,
    nheads, qheads_per_kvhead, seqlen_q_max, seqlen_k_max,
    qk_scale, softcap, window_left, window_right, seed, dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr,
    RESCALE_TAU: tl.constexpr = 0.0, IS_FP8: tl.constexpr = False, HEAD_DIM_V: tl.constexpr = 0,
    BLOCK_DV: tl.constexpr = 0, mods=None, blocks=None, SCORE_MOD: tl.constexpr = None,
    MASK_MOD: tl.constexpr = None, SUB: tl.constexpr = 1, Q_BLOCK: tl.constexpr = 0, FP8_BLOCKS: tl.constexpr = False,
):
    """``USE_TMA``: K and V arrive through host-built tensor descriptors over their
    (batch, seqlen_k, nheads_kv, headdim) view (batched inputs with 16-byte aligned strides). One
    program a tile (``tile_coords``: query blocks fastest, the longest first).
    ``RESCALE_TAU`` > 0: rescale the accumulator only when a row max grows by more than that many
    log2 units (``common.softmax_step_lazy``); 0 keeps ``softmax_step``'s rescale at every tile.
    ``IS_FP8``: e4m3 Q, K, V; ``Descales`` fp32 (batch, nheads + 2 * nheads_kv), each row the
    query heads' descales, then the key heads', then the value heads'; P goes to e4m3 (times
    ``P_SCALE``) for P V. ``FP8_BLOCKS``: Q's and K's descales per block of ``FP8_BLOCK_ROWS`` rows
    (``ioattn.fp8.descale_rows``'s block layout, the block counts those of ``seqlen_q_max`` and
    ``seqlen_k_max``; ``BLOCK_M`` and ``BLOCK_N`` divide the block). ``SCORE_MOD`` / ``MASK_MOD``: a score and a mask function
    (``ioattn.kernels.modgen``), ``mods`` = (softmax_scale, the score's and the mask's captured
    tensors); with them the host's
    ``qk_scale`` is log2(e). ``blocks`` (a block mask's (kv_num, kv_idx, full_num, full_idx,
    stride_b, stride_h, key blocks a row), its blocks ``Q_BLOCK`` queries by ``SUB * BLOCK_N`` keys):
    only the listed key blocks run, the full ones without the mask function. ``HEAD_DIM_V`` /
    ``BLOCK_DV``: V's and the output's head dim and its power-of-two padding where it differs from Q's
    and K's (0: ``HEAD_DIM`` / ``BLOCK_D``)."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV else BLOCK_D
    num_m = tl.cdiv(seqlen_q_max, BLOCK_M)
    m_block, bh = tile_coords(num_m, True)
    _fwd_tile(m_block, bh, Q, K, V, Out, Lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, k_desc, v_desc, Descales, stride_qb,
              stride_qm, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh, stride_ob,
              stride_om, stride_oh, stride_lb, stride_lh, stride_ab, nheads, qheads_per_kvhead, seqlen_q_max,
              seqlen_k_max, qk_scale, softcap, window_left, window_right, seed, dropout_threshold, dropout_scale,
              HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_VARLEN, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, USE_TMA, RESCALE_TAU, IS_FP8,
              DV, BDV, mods, blocks, SCORE_MOD, MASK_MOD, SUB, Q_BLOCK, FP8_BLOCKS)


@triton.jit
def _fwd_tile(
    m_block, bh, Q, K, V, Out, Lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes, k_desc, v_desc, Descales,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_ob, stride_om, stride_oh,
    stride_lb, stride_lh, stride_ab,
    nheads, qheads_per_kvhead, seqlen_q_max, seqlen_k_max,
    qk_scale, softcap, window_left, window_right, seed, dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, USE_TMA: tl.constexpr, RESCALE_TAU: tl.constexpr, IS_FP8: tl.constexpr,
    HEAD_DIM_V: tl.constexpr, BLOCK_DV: tl.constexpr, mods=None, blocks=None, SCORE_MOD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, SUB: tl.constexpr = 1,
    Q_BLOCK: tl.constexpr = 0, FP8_BLOCKS: tl.constexpr = False,
):
    """One (query block, batch * head) tile: the FlashAttention-2 forward of ``BLOCK_M`` query rows."""
    b, h, h_kv, q_start, seqlen_q, k_start, seqlen_k, m_start = tile_start(
        m_block, bh, nheads, qheads_per_kvhead, cu_seqlens_q, cu_seqlens_k, seqlen_q_max, seqlen_k_max, BLOCK_M, IS_VARLEN)
    if m_start >= seqlen_q:
        return

    b64 = b.to(tl.int64)
    q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qm + h * stride_qh
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_kn + h_kv * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vn + h_kv * stride_vh
    o_base = Out + b64 * stride_ob + q_start.to(tl.int64) * stride_om + h * stride_oh
    lse_base = Lse + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start

    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    EVEN_DV: tl.constexpr = HEAD_DIM_V == BLOCK_DV
    q_mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(q_base + offs_m[:, None].to(tl.int64) * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)

    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(alibi_slopes + b * stride_ab + h).to(tl.float32) * LOG2E
    drop_row_base = (b64 * nheads + h) * seqlen_q_max + offs_m
    out_scale = dropout_scale
    k_scales = None
    if IS_FP8:  # this (batch, head)'s descales: Q's and K's scale the scores, V's the output
        nheads_kv = nheads // qheads_per_kvhead
        if FP8_BLOCKS:  # Q's of this tile's block, K's a key tile (``_fwd_inner``)
            blocks_q = tl.cdiv(seqlen_q_max, FP8_BLOCK_ROWS)
            blocks_k = tl.cdiv(seqlen_k_max, FP8_BLOCK_ROWS)
            row = Descales + b64 * (nheads * blocks_q + nheads_kv * blocks_k + nheads_kv)
            qk_scale = qk_scale * tl.load(row + h * blocks_q + m_start // FP8_BLOCK_ROWS)
            k_scales = row + nheads * blocks_q + h_kv * blocks_k
            out_scale = tl.load(row + nheads * blocks_q + nheads_kv * blocks_k + h_kv) / P_SCALE
        else:
            row = Descales + b64 * (nheads + 2 * nheads_kv)
            qk_scale = qk_scale * tl.load(row + h) * tl.load(row + nheads + h_kv)
            out_scale = tl.load(row + nheads + nheads_kv + h_kv) / P_SCALE

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    if SCORE_MOD is not None or MASK_MOD is not None:
        tile_mods = (b, h, mods[0], mods[1], mods[2])
    else:
        tile_mods = None
    if blocks is not None:  # a block mask: its row's partial key blocks (the mask function), then its full ones
        row = block_row(blocks, b, h, m_start, Q_BLOCK)
        for run in tl.static_range(3):  # partial blocks (the mask function), full ones, the last full one
            kv_list, lo, hi = block_list_run(blocks, row, run, SUB, IS_VARLEN)
            acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn,
                                       offs_m, offs_d, offs_dv, lo, hi, seqlen_q, seqlen_k, qk_scale, softcap,
                                       window_left, window_right, slope_log2, seed, dropout_threshold, drop_row_base,
                                       seqlen_k_max, HEAD_DIM, BLOCK_N, BLOCK_D, EVEN_D, HEAD_DIM_V, BLOCK_DV, EVEN_DV,
                                       USE_TMA, run != 1, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, RESCALE_TAU, IS_FP8,
                                       tile_mods, kv_list, SCORE_MOD, MASK_MOD if run == 0 else None, SUB)
    else:
        acc, m_i, l_i = _fwd_dense(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn,
                                   offs_m, offs_d, offs_dv, m_start, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                                   window_right, slope_log2, seed, dropout_threshold, drop_row_base, seqlen_k_max,
                                   HEAD_DIM, BLOCK_M, BLOCK_N, BLOCK_D, EVEN_D, HEAD_DIM_V, BLOCK_DV, EVEN_DV, USE_TMA,
                                   HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, RESCALE_TAU, IS_FP8, tile_mods, SCORE_MOD,
                                   MASK_MOD, k_scales=k_scales)

    out, lse = softmax_finish(acc, m_i, l_i, out_scale)
    row_ok = offs_m < seqlen_q
    tl.store(lse_base + offs_m, lse, mask=row_ok)
    tl.store(o_base + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :],
             out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < seqlen_q) & (offs_dv[None, :] < HEAD_DIM_V))


@triton.jit
def _fwd_dense(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn, offs_m, offs_d,
               offs_dv, m_start, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right, slope_log2, seed,
               dropout_threshold, drop_row_base, seqlen_k_max, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
               BLOCK_DV: tl.constexpr, EVEN_DV: tl.constexpr, USE_TMA: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
               RESCALE_TAU: tl.constexpr, IS_FP8: tl.constexpr, mods, SCORE_MOD: tl.constexpr,
               MASK_MOD: tl.constexpr, k_scales=None):
    """Every key tile the window (or the causal mask) leaves: three runs of ``_fwd_inner``."""
    n_min, n_full_lo, n_full_hi, n_max = kv_block_range(
        m_start, BLOCK_M, BLOCK_N, seqlen_q, seqlen_k, window_left, window_right)
    # window's left edge (masked), the interior (no mask), the diagonal / seqlen_k edge (masked)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn, offs_m, offs_d,
                               offs_dv, n_min, n_full_lo, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                               window_right, slope_log2, seed, dropout_threshold, drop_row_base,
                               seqlen_k_max, HEAD_DIM, BLOCK_N, BLOCK_D, EVEN_D, HEAD_DIM_V, BLOCK_DV, EVEN_DV, USE_TMA, True, HAS_SOFTCAP, HAS_ALIBI,
                               HAS_DROPOUT, RESCALE_TAU, IS_FP8, mods, None, SCORE_MOD, MASK_MOD,
                               k_scales=k_scales)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn, offs_m, offs_d,
                               offs_dv, n_full_lo, n_full_hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                               window_right, slope_log2, seed, dropout_threshold, drop_row_base,
                               seqlen_k_max, HEAD_DIM, BLOCK_N, BLOCK_D, EVEN_D, HEAD_DIM_V, BLOCK_DV, EVEN_DV, USE_TMA, False, HAS_SOFTCAP, HAS_ALIBI,
                               HAS_DROPOUT, RESCALE_TAU, IS_FP8, mods, None, SCORE_MOD, MASK_MOD,
                               k_scales=k_scales)
    acc, m_i, l_i = _fwd_inner(acc, m_i, l_i, q, k_base, v_base, k_desc, v_desc, b, h_kv, stride_kn, stride_vn, offs_m, offs_d,
                               offs_dv, n_full_hi, n_max, seqlen_q, seqlen_k, qk_scale,
                               softcap, window_left, window_right, slope_log2, seed, dropout_threshold,
                               drop_row_base, seqlen_k_max, HEAD_DIM, BLOCK_N, BLOCK_D, EVEN_D, HEAD_DIM_V, BLOCK_DV, EVEN_DV, USE_TMA, True,
                               HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, RESCALE_TAU, IS_FP8, mods, None, SCORE_MOD, MASK_MOD,
                               k_scales=k_scales)

    return acc, m_i, l_i
