"""FlashAttention-2 backward in Triton, by recomputation from Q, K, V and the saved LSE.

Three launches, no atomics, so the gradients are bit-identical from run to run:
  1. ``attn_bwd_preprocess_kernel``: D = rowsum(dO * O), one fp32 per query row;
  2. ``attn_bwd_dkdv_kernel``: one program per (key block, batch * KV head) accumulates dK and dV in
     registers over every query head of its GQA group and every query block that sees it;
  3. ``attn_bwd_dq_kernel``: one program per (query block, batch * head) accumulates dQ.
Reference twin: ``ioattn.reference.tiled.flash_backward``.
"""
import triton
import triton.language as tl

from ioattn.kernels.common import (LOG2E, block_list_run, block_row, dropout_keep, kv_block_range, listed_block, mma,
                                   q_block_range, seq_info, tanh, tile_coords, tile_scores, tile_start)


@triton.jit
def attn_bwd_preprocess_kernel(Out, dOut, Delta, cu_seqlens_q,
                               stride_ob, stride_om, stride_oh, stride_dob, stride_dom, stride_doh,
                               stride_lb, stride_lh, nheads, seqlen_q_max,
                               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                               IS_VARLEN: tl.constexpr, Lse=None, LseOut=None, DQacc=None, stride_slb=0,
                               stride_slh=0, stat_rows=0, lse_unit=1.0, PADDED: tl.constexpr = False,
                               ZERO_DQ: tl.constexpr = False, DQ_DIM: tl.constexpr = 0):
    """D = rowsum(dO * O) for BLOCK_M query rows of one (batch, head).

    ``PADDED`` (the Hopper backward's "ws" kernel): the grid covers each (batch, head)'s ``stat_rows``
    rows (seqlen_q, or varlen the longest sequence, rounded up to that kernel's query block), and the
    program also writes, for its rows, the padded stat rows that kernel reads (``Delta``: D, 0 past
    the sequence's seqlen_q; ``LseOut``: ``Lse`` (natural log, (batch, nheads, seqlen_q), or varlen
    (nheads, total_q) with ``stride_slb`` 0, its rows from cu_seqlens_q) times ``lse_unit``, 0 for a
    row that saw no key (-inf) or past seqlen_q) and, with ``ZERO_DQ``,
    zeroes its rows of the flat fp32 dQ accumulator (per (batch, head) ``stat_rows`` x ``HEAD_DIM``
    contiguous values, rows in any order within a query block, so a program's BLOCK_M x HEAD_DIM
    run is its own). One launch instead of the three fills and four small element-wise kernels
    the launcher ran around it (FA3's preprocess kernel does the same three jobs). ``DQ_DIM``: the flat
    accumulator's head dim where it is above HEAD_DIM (a head-padded call; BLOCK_D >= it), else 0."""
    num_blocks = tl.cdiv(stat_rows, BLOCK_M) if PADDED else tl.cdiv(seqlen_q_max, BLOCK_M)
    m_block, bh = tile_coords(num_blocks, False)
    b = bh // nheads
    h = bh % nheads
    q_start, seqlen_q, _, _ = seq_info(b, cu_seqlens_q, cu_seqlens_q, seqlen_q_max, seqlen_q_max, IS_VARLEN)
    if not PADDED:
        if m_block * BLOCK_M >= seqlen_q:
            return
    b64 = b.to(tl.int64)
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM)
    rows = (q_start + offs_m[:, None]).to(tl.int64)
    o = tl.load(Out + b64 * stride_ob + h * stride_oh + rows * stride_om + offs_d[None, :], mask=mask, other=0.0)
    do = tl.load(dOut + b64 * stride_dob + h * stride_doh + rows * stride_dom + offs_d[None, :], mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    stat = b64 * stride_lb + h.to(tl.int64) * stride_lh + offs_m
    if PADDED:  # every row of the padded stat rows written: D is 0 past seqlen_q (masked loads)
        tl.store(Delta + stat, delta)
        in_q = offs_m < seqlen_q
        lse = tl.load(Lse + b64 * stride_slb + h.to(tl.int64) * stride_slh + q_start + offs_m, mask=in_q,
                      other=float("-inf"))
        lse_out = tl.where(lse == float("-inf"), 0.0, lse * lse_unit)
        tl.store(LseOut + stat, lse_out)
        if ZERO_DQ:
            ACC_DIM: tl.constexpr = DQ_DIM if DQ_DIM else HEAD_DIM
            dq = DQacc + (bh.to(tl.int64) * stat_rows + m_block * BLOCK_M) * ACC_DIM
            tl.store(dq + tl.arange(0, BLOCK_M)[:, None] * ACC_DIM + offs_d[None, :],
                     tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=offs_d[None, :] < ACC_DIM)
    else:  # Delta in lse's layout (varlen: (nheads, total_q), rows from q_start)
        tl.store(Delta + stat + q_start, delta, mask=offs_m < seqlen_q)


@triton.jit
def _probs_and_dscores(q, k, v, do, lse_log2, delta, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale,
                       softcap, window_left, window_right, slope_log2, seed, dropout_threshold,
                       dropout_scale, drop_row_base, seqlen_k_max, MASKED: tl.constexpr,
                       HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr, mods=None,
                       SCORE_MOD: tl.constexpr = None, SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
                       GRADS: tl.constexpr = False):
    """Recompute one (BLOCK_M, BLOCK_N) tile: the probabilities as applied to V (after dropout) and
    dS, the gradient with respect to the raw q.k product divided by softmax_scale. ``SCORE_MOD`` /
    ``MASK_MOD`` (``ioattn.kernels.modgen``), ``mods`` = (b, h, softmax_scale, the score's captured
    tensors, the mask's, the score's captured tensors' fp32 gradients): the forward's functions;
    dS goes back through the score function's gradient ``SCORE_GRAD``, which with ``GRADS`` also adds into the
    captured tensors' gradients (one of the two passes does)."""
    qk = mma(q, tl.trans(k))
    if SCORE_MOD is not None:
        s_raw = qk * mods[2]
        qk = SCORE_MOD(s_raw, mods[0], mods[1], offs_m[:, None], offs_n[None, :], mods[3])
    s = tile_scores(qk, offs_m, offs_n, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                    window_right, slope_log2, MASKED, HAS_SOFTCAP, HAS_ALIBI)
    if MASK_MOD is not None:
        s = tl.where(MASK_MOD(mods[0], mods[1], offs_m[:, None], offs_n[None, :], mods[4]), s, float("-inf"))
    p = tl.math.exp2(s - lse_log2[:, None])
    dp = mma(do, tl.trans(v))
    if HAS_DROPOUT:
        keep = dropout_keep(seed, dropout_threshold, drop_row_base, offs_n, seqlen_k_max)
        p_used = tl.where(keep, p * dropout_scale, 0.0)
        dp = tl.where(keep, dp * dropout_scale, 0.0)
    else:
        p_used = p
    ds = p * (dp - delta[:, None])
    if HAS_SOFTCAP:
        t = tanh(qk * qk_scale)
        ds = ds * (1.0 - t * t)
    if SCORE_MOD is not None:
        ds = SCORE_GRAD(s_raw, mods[0], mods[1], offs_m[:, None], offs_n[None, :], ds, mods[3], mods[5], GRADS)
    return p_used, ds


@triton.jit
def _tile_mods(b, h, mods, SCORE_MOD: tl.constexpr, MASK_MOD: tl.constexpr):
    """The generated functions' arguments of a tile (``_probs_and_dscores``'): this program's (b, h)
    before ``mods``' (softmax_scale, the score's and the mask's captures, their gradients), or None
    without functions."""
    if SCORE_MOD is not None or MASK_MOD is not None:
        out = (b, h, mods[0], mods[1], mods[2], mods[3])
    else:
        out = None
    return out


@triton.jit
def _load_rows(base, offs_m, offs_d, stride_m, seqlen, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr,
               EVEN_D: tl.constexpr):
    ptrs = base + offs_m[:, None].to(tl.int64) * stride_m + offs_d[None, :]
    if MASKED:
        return tl.load(ptrs, mask=(offs_m[:, None] < seqlen) & (offs_d[None, :] < HEAD_DIM), other=0.0)
    elif EVEN_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


@triton.jit
def _load_row_stats(lse_base, delta_base, offs_m, seqlen_q, MASKED: tl.constexpr):
    if MASKED:
        lse = tl.load(lse_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen_q, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    # a row that sees no key has lse = -inf and only -inf scores: use 0 so exp2 gives 0, not NaN
    return tl.where(lse == float("-inf"), 0.0, lse * LOG2E), delta


@triton.jit
def _dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, offs_n,
                offs_d, offs_dv, m_block_lo, m_block_hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                window_right, slope_log2, seed, dropout_threshold, dropout_scale, drop_head_base,
                seqlen_k_max, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr,
                HEAD_DIM_V: tl.constexpr, EVEN_DV: tl.constexpr, MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                HAS_ALIBI: tl.constexpr,
                HAS_DROPOUT: tl.constexpr, mods=None, q_list=None, SCORE_MOD: tl.constexpr = None,
                SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, SUB: tl.constexpr = 1):
    """Query blocks ``m_block_lo`` .. ``m_block_hi`` - 1 into (dK, dV); ``q_list``: a block mask's
    column of query-block indices (block i: sub-block i % ``SUB`` of ``q_list[i // SUB]``)."""
    for i in range(m_block_lo, m_block_hi):
        m_block = listed_block(i, q_list, SUB)
        offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
        q = _load_rows(q_base, offs_m, offs_d, stride_qm, seqlen_q, HEAD_DIM, MASKED, EVEN_D)
        do = _load_rows(do_base, offs_m, offs_dv, stride_dom, seqlen_q, HEAD_DIM_V, MASKED, EVEN_DV)
        lse_log2, delta = _load_row_stats(lse_base, delta_base, offs_m, seqlen_q, MASKED)
        p, ds = _probs_and_dscores(q, k, v, do, lse_log2, delta, offs_m, offs_n, seqlen_q, seqlen_k,
                                   qk_scale, softcap, window_left, window_right, slope_log2, seed,
                                   dropout_threshold, dropout_scale, drop_head_base + offs_m,
                                   seqlen_k_max, MASKED, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, SCORE_MOD,
                                   SCORE_GRAD, MASK_MOD, True)
        dv = mma(tl.trans(p.to(do.dtype)), do, dv)
        dk = mma(tl.trans(ds.to(q.dtype)), q, dk)
    return dk, dv


@triton.jit
def attn_bwd_dkdv_kernel(
    Q, K, V, dOut, Lse, Delta, dK, dV, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh, stride_dkb, stride_dkn, stride_dkh,
    stride_dvb, stride_dvn, stride_dvh, stride_lb, stride_lh, stride_ab,
    nheads, qheads_per_kvhead, seqlen_q_max, seqlen_k_max,
    softmax_scale, qk_scale, softcap, window_left, window_right, seed, dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0, mods=None, blocks=None,
    SCORE_MOD: tl.constexpr = None, SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
    SUB: tl.constexpr = 1, KV_BLOCK: tl.constexpr = 0,
):
    """One (key block, batch * KV head): dK and dV over every query head of the group. ``mods`` =
    (softmax_scale, the score's captured tensors, the mask's, their gradients' fp32 buffers) with the
    functions (``_probs_and_dscores``); ``blocks``: a block mask's transposed lists (``KV_BLOCK`` keys
    by ``SUB * BLOCK_M`` queries; as the forward's ``blocks``), the partial query blocks with the mask
    function, the full ones without. ``HEAD_DIM_V`` / ``BLOCK_DV``: V's (and dO's, dV's) head dim and its
    padding where it differs from Q's and K's (0: ``HEAD_DIM`` / ``BLOCK_D``)."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV else BLOCK_D
    n_block, bh = tile_coords(tl.cdiv(seqlen_k_max, BLOCK_N), False)
    nheads_kv = nheads // qheads_per_kvhead
    b, h_kv, _, q_start, seqlen_q, k_start, seqlen_k, n_start = tile_start(
        n_block, bh, nheads_kv, 1, cu_seqlens_q, cu_seqlens_k, seqlen_q_max, seqlen_k_max, BLOCK_N, IS_VARLEN)
    if n_start >= seqlen_k:
        return
    b64 = b.to(tl.int64)
    offs_n = n_start + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    kv_mask = (offs_n[:, None] < seqlen_k) & (offs_d[None, :] < HEAD_DIM)
    v_mask = (offs_n[:, None] < seqlen_k) & (offs_dv[None, :] < DV)
    rows_k = (k_start + offs_n[:, None]).to(tl.int64)
    k = tl.load(K + b64 * stride_kb + h_kv * stride_kh + rows_k * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + b64 * stride_vb + h_kv * stride_vh + rows_k * stride_vn + offs_dv[None, :], mask=v_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BDV], dtype=tl.float32)
    m_min, m_full_lo, m_full_hi, m_max = q_block_range(
        n_start, BLOCK_M, BLOCK_N, seqlen_q, seqlen_k, window_left, window_right)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    EVEN_DV: tl.constexpr = DV == BDV

    for g in range(0, qheads_per_kvhead):
        h = h_kv * qheads_per_kvhead + g
        q_base = Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qm + h * stride_qh
        do_base = dOut + b64 * stride_dob + q_start.to(tl.int64) * stride_dom + h * stride_doh
        lse_base = Lse + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
        delta_base = Delta + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start
        slope_log2 = 0.0
        if HAS_ALIBI:
            slope_log2 = tl.load(alibi_slopes + b * stride_ab + h).to(tl.float32) * LOG2E
        drop_head_base = (b64 * nheads + h) * seqlen_q_max
        tile_mods = _tile_mods(b, h, mods, SCORE_MOD, MASK_MOD)
        if blocks is not None:
            col = block_row(blocks, b, h, n_start, KV_BLOCK)
            for run in tl.static_range(3):  # partial blocks (the mask function), full ones, the last full one
                q_list, lo, hi = block_list_run(blocks, col, run, SUB, IS_VARLEN)
                dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                     offs_n, offs_d, offs_dv, lo, hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left,
                                     window_right, slope_log2, seed, dropout_threshold, dropout_scale, drop_head_base,
                                     seqlen_k_max, HEAD_DIM, BLOCK_M, EVEN_D, DV, EVEN_DV, run != 1, HAS_SOFTCAP,
                                     HAS_ALIBI, HAS_DROPOUT, tile_mods, q_list, SCORE_MOD, SCORE_GRAD,
                                     MASK_MOD if run == 0 else None, SUB)
        else:
            dk, dv = _dkdv_dense(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                                 offs_n, offs_d, offs_dv, m_min, m_full_lo, m_full_hi, m_max, seqlen_q, seqlen_k, qk_scale,
                                 softcap, window_left, window_right, slope_log2, seed, dropout_threshold,
                                 dropout_scale, drop_head_base, seqlen_k_max, HEAD_DIM, BLOCK_M, EVEN_D, DV,
                                 EVEN_DV, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, tile_mods, SCORE_MOD, SCORE_GRAD,
                                 MASK_MOD)

    dk = dk * softmax_scale
    tl.store(dK + b64 * stride_dkb + h_kv * stride_dkh + rows_k * stride_dkn + offs_d[None, :],
             dk.to(dK.dtype.element_ty), mask=kv_mask)
    tl.store(dV + b64 * stride_dvb + h_kv * stride_dvh + rows_k * stride_dvn + offs_dv[None, :],
             dv.to(dV.dtype.element_ty), mask=v_mask)


@triton.jit
def _dkdv_dense(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom, offs_n, offs_d, offs_dv,
                m_min, m_full_lo, m_full_hi, m_max, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right,
                slope_log2, seed, dropout_threshold, dropout_scale, drop_head_base, seqlen_k_max,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
                EVEN_DV: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                mods, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr, MASK_MOD: tl.constexpr):
    """Every query block the window (or the causal mask) leaves: three runs of ``_dkdv_inner``, the masked
    blocks before the full ones, the full ones unmasked, the masked ones after them."""
    for run in tl.static_range(3):
        dk, dv = _dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qm, stride_dom,
                             offs_n, offs_d, offs_dv, m_min if run == 0 else m_full_lo if run == 1 else m_full_hi,
                             m_full_lo if run == 0 else m_full_hi if run == 1 else m_max, seqlen_q, seqlen_k,
                             qk_scale, softcap, window_left, window_right, slope_log2, seed, dropout_threshold,
                             dropout_scale, drop_head_base, seqlen_k_max, HEAD_DIM, BLOCK_M, EVEN_D, HEAD_DIM_V,
                             EVEN_DV, run != 1, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, None, SCORE_MOD, SCORE_GRAD,
                             MASK_MOD)
    return dk, dv


@triton.jit
def _dq_inner(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
              n_block_lo, n_block_hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right,
              slope_log2, seed, dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM_V: tl.constexpr,
              EVEN_DV: tl.constexpr, MASKED: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, mods=None, kv_list=None, SCORE_MOD: tl.constexpr = None,
              SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None, SUB: tl.constexpr = 1):
    """Key blocks ``n_block_lo`` .. ``n_block_hi`` - 1 into dQ (``kv_list``: as the forward's)."""
    for i in range(n_block_lo, n_block_hi):
        n_block = listed_block(i, kv_list, SUB)
        offs_n = n_block * BLOCK_N + tl.arange(0, BLOCK_N)
        k = _load_rows(k_base, offs_n, offs_d, stride_kn, seqlen_k, HEAD_DIM, MASKED, EVEN_D)
        v = _load_rows(v_base, offs_n, offs_dv, stride_vn, seqlen_k, HEAD_DIM_V, MASKED, EVEN_DV)
        _, ds = _probs_and_dscores(q, k, v, do, lse_log2, delta, offs_m, offs_n, seqlen_q, seqlen_k,
                                   qk_scale, softcap, window_left, window_right, slope_log2, seed,
                                   dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max,
                                   MASKED, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, SCORE_MOD, SCORE_GRAD,
                                   MASK_MOD, False)
        dq = mma(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def attn_bwd_dq_kernel(
    Q, K, V, dOut, Lse, Delta, dQ, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
    stride_qb, stride_qm, stride_qh, stride_kb, stride_kn, stride_kh, stride_vb, stride_vn, stride_vh,
    stride_dob, stride_dom, stride_doh, stride_dqb, stride_dqm, stride_dqh, stride_lb, stride_lh,
    stride_ab, nheads, qheads_per_kvhead, seqlen_q_max, seqlen_k_max,
    softmax_scale, qk_scale, softcap, window_left, window_right, seed, dropout_threshold, dropout_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_VARLEN: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
    HAS_DROPOUT: tl.constexpr, HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0, mods=None, blocks=None,
    SCORE_MOD: tl.constexpr = None, SCORE_GRAD: tl.constexpr = None, MASK_MOD: tl.constexpr = None,
    SUB: tl.constexpr = 1, Q_BLOCK: tl.constexpr = 0,
):
    """One (query block, batch * head): dQ. ``mods``, the functions and ``blocks``: as the forward's
    (``mods`` with the gradients' buffers last, unused here: the dK / dV pass adds into them);
    ``HEAD_DIM_V`` / ``BLOCK_DV`` as the dK/dV kernel's."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV else BLOCK_D
    m_block, bh = tile_coords(tl.cdiv(seqlen_q_max, BLOCK_M), True)
    b, h, h_kv, q_start, seqlen_q, k_start, seqlen_k, m_start = tile_start(
        m_block, bh, nheads, qheads_per_kvhead, cu_seqlens_q, cu_seqlens_k, seqlen_q_max, seqlen_k_max, BLOCK_M, IS_VARLEN)
    if m_start >= seqlen_q:
        return
    b64 = b.to(tl.int64)
    EVEN_D: tl.constexpr = HEAD_DIM == BLOCK_D
    EVEN_DV: tl.constexpr = DV == BDV
    offs_m = m_start + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BDV)
    q = _load_rows(Q + b64 * stride_qb + q_start.to(tl.int64) * stride_qm + h * stride_qh, offs_m, offs_d,
                   stride_qm, seqlen_q, HEAD_DIM, True, EVEN_D)
    do = _load_rows(dOut + b64 * stride_dob + q_start.to(tl.int64) * stride_dom + h * stride_doh, offs_m,
                    offs_dv, stride_dom, seqlen_q, DV, True, EVEN_DV)
    lse_log2, delta = _load_row_stats(Lse + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start,
                                      Delta + b64 * stride_lb + h.to(tl.int64) * stride_lh + q_start,
                                      offs_m, seqlen_q, True)
    k_base = K + b64 * stride_kb + k_start.to(tl.int64) * stride_kn + h_kv * stride_kh
    v_base = V + b64 * stride_vb + k_start.to(tl.int64) * stride_vn + h_kv * stride_vh
    slope_log2 = 0.0
    if HAS_ALIBI:
        slope_log2 = tl.load(alibi_slopes + b * stride_ab + h).to(tl.float32) * LOG2E
    drop_row_base = (b64 * nheads + h) * seqlen_q_max + offs_m
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    tile_mods = _tile_mods(b, h, mods, SCORE_MOD, MASK_MOD)
    if blocks is not None:
        row = block_row(blocks, b, h, m_start, Q_BLOCK)
        for run in tl.static_range(3):  # partial blocks (the mask function), full ones, the last full one
            kv_list, lo, hi = block_list_run(blocks, row, run, SUB, IS_VARLEN)
            dq = _dq_inner(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
                           lo, hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right, slope_log2, seed,
                           dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max, HEAD_DIM, BLOCK_N, EVEN_D, DV,
                           EVEN_DV, run != 1, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, tile_mods, kv_list, SCORE_MOD,
                           SCORE_GRAD, MASK_MOD if run == 0 else None, SUB)
    else:
        dq = _dq_dense(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
                       m_start,
                       seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right, slope_log2, seed,
                       dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max, HEAD_DIM, BLOCK_M, BLOCK_N,
                       EVEN_D, DV, EVEN_DV, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, tile_mods, SCORE_MOD, SCORE_GRAD,
                       MASK_MOD)
    dq = dq * softmax_scale
    tl.store(dQ + b64 * stride_dqb + q_start.to(tl.int64) * stride_dqm + h * stride_dqh
             + offs_m[:, None].to(tl.int64) * stride_dqm + offs_d[None, :],
             dq.to(dQ.dtype.element_ty), mask=(offs_m[:, None] < seqlen_q) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _dq_dense(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv, m_start,
              seqlen_q,
              seqlen_k, qk_scale, softcap, window_left, window_right, slope_log2, seed, dropout_threshold,
              dropout_scale, drop_row_base, seqlen_k_max, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, EVEN_D: tl.constexpr, HEAD_DIM_V: tl.constexpr, EVEN_DV: tl.constexpr,
              HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, mods, SCORE_MOD: tl.constexpr, SCORE_GRAD: tl.constexpr,
              MASK_MOD: tl.constexpr):
    """Every key block the window (or the causal mask) leaves: three runs of ``_dq_inner``."""
    n_min, n_full_lo, n_full_hi, n_max = kv_block_range(
        m_start, BLOCK_M, BLOCK_N, seqlen_q, seqlen_k, window_left, window_right)
    dq = _dq_inner(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
                   n_min, n_full_lo, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right,
                   slope_log2, seed, dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max,
                   HEAD_DIM, BLOCK_N, EVEN_D, HEAD_DIM_V, EVEN_DV, True, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, None,
                   SCORE_MOD, SCORE_GRAD, MASK_MOD)
    dq = _dq_inner(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
                   n_full_lo, n_full_hi, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right,
                   slope_log2, seed, dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max,
                   HEAD_DIM, BLOCK_N, EVEN_D, HEAD_DIM_V, EVEN_DV, False, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, None,
                   SCORE_MOD, SCORE_GRAD, MASK_MOD)
    dq = _dq_inner(dq, q, do, lse_log2, delta, k_base, v_base, stride_kn, stride_vn, offs_m, offs_d, offs_dv,
                   n_full_hi, n_max, seqlen_q, seqlen_k, qk_scale, softcap, window_left, window_right,
                   slope_log2, seed, dropout_threshold, dropout_scale, drop_row_base, seqlen_k_max,
                   HEAD_DIM, BLOCK_N, EVEN_D, HEAD_DIM_V, EVEN_DV, True, HAS_SOFTCAP, HAS_ALIBI, HAS_DROPOUT, mods, None,
                   SCORE_MOD, SCORE_GRAD, MASK_MOD)
    return dq


@triton.jit
def dq_from_blocks_kernel(Acc, RowOff, ColOff, dQ, seqlen_q, nheads, num_m, stride_b, stride_m, stride_h, scale,
                          cu_seqlens_q, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr, IS_VARLEN: tl.constexpr = False,
                          D_OUT: tl.constexpr = 0):
    """dQ = scale * Acc, cast to dQ's dtype, where the fp32 accumulator Acc holds per (batch, head,
    query block) one [BLOCK_M, HEAD_DIM] block in a permuted order: element (r, c) of block p at
    p * BLOCK_M * HEAD_DIM + RowOff[r] + ColOff[c] (int32 tables; the Hopper backward's flat dQ order,
    ``hopper_backward.dq_flat_bases``). One program per block, rows past seqlen_q not stored.
    ``IS_VARLEN``: ``num_m`` blocks per (batch, head) (from the longest sequence), sequence b's rows
    from cu_seqlens_q[b] in the packed dQ (``stride_b`` 0), its length from cu_seqlens_q. ``D_OUT``: dQ's
    head dim where it is below the accumulator's HEAD_DIM (a head-padded call), its columns alone
    read and stored."""
    p = tl.program_id(0)
    m = p % num_m
    bh = p // num_m
    b = bh // nheads
    h = bh % nheads
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, HEAD_DIM)
    offs = tl.load(RowOff + rows)[:, None] + tl.load(ColOff + cols)[None, :]
    q_start, seqlen_q, _, _ = seq_info(b, cu_seqlens_q, cu_seqlens_q, seqlen_q, seqlen_q, IS_VARLEN)
    if m * BLOCK_M >= seqlen_q:
        return
    q_rows = m * BLOCK_M + rows
    ptrs = (dQ + b.to(tl.int64) * stride_b + (q_start + q_rows[:, None]).to(tl.int64) * stride_m + h * stride_h
            + cols[None, :])
    if D_OUT:
        in_cols = (cols < D_OUT)[None, :]
        acc = tl.load(Acc + p.to(tl.int64) * (BLOCK_M * HEAD_DIM) + offs, mask=in_cols, other=0.0)
        tl.store(ptrs, (acc * scale).to(dQ.dtype.element_ty), mask=(q_rows < seqlen_q)[:, None] & in_cols)
    else:
        acc = tl.load(Acc + p.to(tl.int64) * (BLOCK_M * HEAD_DIM) + offs)
        tl.store(ptrs, (acc * scale).to(dQ.dtype.element_ty), mask=(q_rows < seqlen_q)[:, None])
