"""Pieces of the Gluon Hopper backward: the probabilities of a transposed score tile (masks, softcap,
ALiBi), the dQ tile's layouts, the key-block walk and the dK / dV stores, shared by the dispatched
warp-specialised kernel (``hopper_backward_ws``) and by this module's base kernel
(``hopper_bwd_dkdv_kernel``: one program per 128-key block, dQ by fp32 atomics; an A/B baseline,
not dispatched). The design: docs/hopper-backward.md."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ioattn.kernels.hopper_common import ALIBI_MAGIC, LOG2E, MAGIC_BITS, _io_dim, _magic_to_f32


@gluon.jit
def _issue_q_do(q_desc, do_desc, q_smem, do_smem, bar, t, m_lo, n_m, h0, b, seqlen_q,
                HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr):
    """TMA loads of step ``t``'s Q and dO tiles (query head h0 + t // n_m, block m_lo + t % n_m) into
    slot t % 2; both complete on that slot's barrier."""
    s = t % 2
    h = h0 + t // n_m
    row = b * seqlen_q + (m_lo + t % n_m) * BLOCK_M
    col = h * HEAD_DIM
    mbarrier.expect(bar.index(s), q_desc.block_type.nbytes + do_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row, col], bar.index(s), q_smem.index(s))
    tma.async_copy_global_to_shared(do_desc, [row, col], bar.index(s), do_smem.index(s))


@gluon.jit
def _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d,
           MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, LSE_IN_ACC: gl.constexpr = False,
           WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
           DTYPE: gl.constexpr = None, ALIBI: gl.constexpr = False, alibi_a=0.0):
    """P^T of one (BLOCK_N keys x BLOCK_M queries) tile, fp32, masked entries 0; ``lse_log2`` one
    value per query (column), in S^T's column layout. ``LSE_IN_ACC``: ``s`` is already S^T - lse /
    softmax_scale (``WS_LSE_IN_ACC``), ``lse_log2`` unused. ``WINDOW`` (``IS_CAUSAL`` False): key j
    visible to query i iff i + off - win_left <= j <= i + off + win_right (off = seqlen_k - seqlen_q).
    ``SOFTCAP``: ``s`` is t = tanh(S^T * softmax_scale / cap) (``qk_scale`` cap * log2 e), and the result
    the pair (P^T in ``DTYPE``, dV's operand; P^T (1 - t^2), the fp32 factor dS^T is formed from), both
    formed here so that t dies with P^T's fp32 tile (held longer, it spilled). ``ALIBI``: flash-attn's
    bias added to ``s`` for the exponent (the tanh's derivative takes t itself), alibi_a = -slope in the
    units of ``s``; ``ALIBI_FP32_COLS``: the query columns as fp32 from this step's ``m_start``;
    ``ALIBI_MAGIC``: the forward's magic-number distance with the queries split as hi (a constant per
    register) and lo (one value per thread), the masks' query tests on hi too."""
    z = s  # the exponent's scores: with ALiBi biased
    if ALIBI == ALIBI_MAGIC:  # the distance (query + off - key) by the forward's magic-number conversion
        rel = seqlen_k - seqlen_q - n_start + m_start + MAGIC_BITS - keys_1d  # each key row's, biased
        hi = queries_1d & ~6  # a constant per register (as the forward's ``_alibi``)
        lo = queries_1d & 6  # one value per thread
        d = _magic_to_f32((rel[:, None] + lo[None, :]) + hi[None, :])
        z = s + alibi_a * gl.abs(d)
    elif ALIBI:
        rel = (seqlen_k - seqlen_q - n_start - keys_1d).to(gl.float32)  # each key row's - key + off
        queries_f = (m_start + queries_1d).to(gl.float32)
        z = s + alibi_a * gl.abs(rel[:, None] + queries_f[None, :])
    if LSE_IN_ACC:
        p = gl.exp2(z * qk_scale)
    else:
        p = gl.exp2(z * qk_scale - lse_log2[None, :])
    if MASKED:
        keys = (n_start + keys_1d)[:, None]
        queries = (m_start + queries_1d)[None, :]
        if ALIBI == ALIBI_MAGIC:  # the queries split as the bias's (hi per register, lo per thread): no column vector
            qhi = (queries_1d & ~6)[None, :]
            qlo = (queries_1d & 6)[None, :]
            first = keys - (seqlen_k - seqlen_q) - m_start - qlo  # hi of the query on this key's diagonal
            keep = (keys < seqlen_k) & (qhi < seqlen_q - m_start - qlo)
            if IS_CAUSAL:
                keep = keep & (qhi >= first)
            if WINDOW:
                keep = keep & (qhi >= first - win_right) & (qhi <= first + win_left)
        else:
            keep = (keys < seqlen_k) & (queries < seqlen_q)
            if IS_CAUSAL:
                keep = keep & (keys <= queries + (seqlen_k - seqlen_q))
            if WINDOW:
                keep = keep & (keys <= queries + (seqlen_k - seqlen_q + win_right))
                keep = keep & (keys >= queries + (seqlen_k - seqlen_q - win_left))
        p = gl.where(keep, p, 0.0)  # a select: also drops any inf formed from a masked entry's score
    if SOFTCAP:
        out = (p.to(DTYPE), p * (1.0 - s * s))
    else:
        out = p
    return out


@gluon.constexpr_function
def _acc_layout(num_warps, cols):
    """wgmma accumulator layout of a (key rows x ``cols``) product: keys split over every warp (S^T,
    dP^T with ``cols`` = BLOCK_M; dK, dV with ``cols`` = HEAD_DIM)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, cols, 16])


@gluon.jit
def _cols_mma(a_smem, b_tile, acc, acc_hi):
    """Issue acc += A B[:, 0:128] and acc_hi += A B[:, 128:128 + acc_hi's columns] asynchronously (two
    commit groups): a product over 192 of a 256-wide tile's columns (``_ws_consumer_dsplit``)."""
    lo = warpgroup_mma(a_smem, b_tile.slice(0, acc.shape[1], dim=1), acc, is_async=True)
    hi = warpgroup_mma(a_smem, b_tile.slice(acc.shape[1], acc_hi.shape[1], dim=1), acc_hi, is_async=True)
    return lo, hi


@gluon.constexpr_function
def _dq_layout(num_warps, head_dim):
    """Accumulator of a 64-row product whose ``head_dim`` columns the warpgroups split: dQ (64 query
    rows x d) in both kernels; in the column-split kernel every product (S^T, dP^T: 64 keys x 64
    queries; dK, dV: 64 keys x d; a dQ half)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, num_warps // 4],
                                     instr_shape=[16, head_dim // (num_warps // 4), 16])


@gluon.constexpr_function
def _dq_acc_layout(num_warps, block_m, head_dim):
    """The key-split consumers' dQ accumulator (``block_m`` query rows x ``head_dim``): at 64 rows the
    warpgroups split the columns (``_dq_layout``), at 128 the rows (``_acc_layout``)."""
    if block_m == 64:
        return _dq_layout(num_warps, head_dim)
    return _acc_layout(num_warps, head_dim)


@gluon.constexpr_function
def _ws_dq_acc_layout(num_warps, block_m, head_dim, wg_split):
    """The ws consumers' dQ accumulator: ``_dq_acc_layout``; with ``wg_split`` (``WS_WG_PARTITIONS``: a
    warpgroup a partition) one warpgroup's half, 64 rows x (head_dim / 2 at 64 query rows a step, else
    head_dim)."""
    if wg_split:
        return _acc_layout(num_warps, head_dim // 2 if block_m == 64 else head_dim)
    return _dq_acc_layout(num_warps, block_m, head_dim)


@gluon.constexpr_function
def dq_flat_bases(num_warps, block_m, head_dim):
    """The flat dQ tile's order (``WS_DQ_FLAT``): for each bit of the shared-memory offset (in fp32
    elements), lowest first, the (row, column) of the [block_m, head_dim] block it steps, one bit of
    one coordinate each (a permutation of the coordinates' bits). The order follows the accumulator
    layout (``_dq_acc_layout``: wgmma m64nN tiles, warps_per_cta [WM, WN]): a thread's column pair
    and row + 8 first (its four registers of one 8-column group), then the lane (columns +2, +4;
    rows +1, +2, +4), then the thread's 8-column groups, then the warps (rows +16, +32, ...; then
    the column halves)."""
    wn = num_warps // 4 if block_m == 64 else 1
    wm = num_warps // wn
    instr_n = head_dim // wn
    bases = [[0, 1], [8, 0], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]]
    bases += [[0, 8 << i] for i in range((instr_n // 8).bit_length() - 1)]
    bases += [[16 << i, 0] for i in range(wm.bit_length() - 1)]
    bases += [[0, instr_n << i] for i in range(wn.bit_length() - 1)]
    assert 1 << len(bases) == block_m * head_dim and 16 * wm == block_m, (num_warps, block_m, head_dim)
    return bases


@gluon.constexpr_function
def _dq_flat_layout(num_warps, block_m, head_dim):
    """Shared layout of the flat dQ staging tile (``dq_flat_bases``), 128 B aligned for the bulk copy."""
    return gl.SharedLinearLayout(offset_bases=dq_flat_bases(num_warps, block_m, head_dim), alignment=128)


@gluon.jit
def _key_block(nheads_kv, BLOCK_N: gl.constexpr, REVERSED: gl.constexpr = False):
    """This program's (batch, KV head, first key) from the grid (key blocks, batch * KV heads);
    ``REVERSED``: the key blocks in reverse grid order (the last one launched first)."""
    bh = gl.program_id(1)
    n = gl.program_id(0)
    if REVERSED:
        n = gl.num_programs(0) - 1 - n
    return bh // nheads_kv, bh % nheads_kv, n * BLOCK_N


@gluon.jit
def _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout: gl.constexpr,
                HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, COALESCED: gl.constexpr = False,
                IO_DIM: gl.constexpr = 0):
    """The key block's dK (times softmax_scale) and dV, fp32 accumulators in ``kv_layout``, stored in
    the inputs' dtype with masked pointer stores (keys past seqlen_k are not written): both kernels'
    epilogue. ``COALESCED``: converted first (through shared memory) to rows of 16-byte pieces, one a
    thread, so a warp writes whole rows (the accumulator layout writes 4 B a thread, half of each
    32 B sector a message). ``IO_DIM``: the gradients' head dim where it is below HEAD_DIM (``_io_dim``;
    the tile's columns past it, zero, are not stored)."""
    if COALESCED:
        num_warps: gl.constexpr = gl.num_warps()
        row_threads: gl.constexpr = HEAD_DIM // 8
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // row_threads, row_threads], [num_warps, 1], [1, 0])
        _store_rows(dV, dv.to(dV.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k, st_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM)
        _store_rows(dK, (dk * softmax_scale).to(dK.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k,
                    st_layout, HEAD_DIM, BLOCK_N, IO_DIM)
    else:
        _store_rows(dV, dv.to(dV.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k, kv_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM)
        _store_rows(dK, (dk * softmax_scale).to(dK.dtype.element_ty), k_row0, h_kv, nheads_kv, n_start, seqlen_k,
                    kv_layout, HEAD_DIM, BLOCK_N, IO_DIM)


@gluon.jit
def _store_rows(ptr, x, k_row0, h_kv, nheads_kv, n_start, seqlen_k, layout: gl.constexpr, HEAD_DIM: gl.constexpr,
                BLOCK_N: gl.constexpr, IO_DIM: gl.constexpr = 0):
    """One (BLOCK_N keys x HEAD_DIM) tile ``x`` into the (rows, nheads_kv, HEAD_DIM) gradient at this key
    block (``k_row0``: the row of the sequence's key 0, b * seqlen_k, or cu_seqlens_k[b] when varlen), in
    ``layout``, keys past the sequence's seqlen_k masked. ``IO_DIM`` (``_io_dim``): the gradient is
    (rows, nheads_kv, IO_DIM), the tile's columns past it not stored."""
    D_IO: gl.constexpr = _io_dim(HEAD_DIM, IO_DIM)
    x = gl.convert_layout(x, layout)
    out_keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
    out_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    out_base = ((k_row0 + n_start).to(gl.int64) * nheads_kv + h_kv) * D_IO
    offs = out_keys[:, None] * (nheads_kv * D_IO) + out_cols[None, :]
    key_ok = (n_start + out_keys < seqlen_k)[:, None]
    if IO_DIM:
        gl.store(ptr + out_base + offs, x, mask=key_ok & (out_cols < IO_DIM)[None, :])
    else:
        gl.store(ptr + out_base + offs, x, mask=key_ok)


@gluon.jit
def _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d, queries_1d,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
                LSE_IN_ACC: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                SOFTCAP: gl.constexpr = False, DTYPE: gl.constexpr = None, ALIBI: gl.constexpr = False,
                alibi_a=0.0):
    """``_probs`` with the masks only where this step's tile needs them: keys past seqlen_k (not
    ``keys_inside``), queries past seqlen_q, or (causal) a tile the diagonal crosses (``off`` =
    seqlen_k - seqlen_q); ``WINDOW``: also a tile either edge of the window crosses."""
    need_mask = (not keys_inside) | (m_start + BLOCK_M > seqlen_q)
    if IS_CAUSAL:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off)
    if WINDOW:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off + win_right)
        need_mask = need_mask | (n_start < m_start + BLOCK_M - 1 + off - win_left)
    if need_mask:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, True,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a)
    else:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, False,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a)
    return p


@gluon.jit
def hopper_bwd_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, Lse, Delta, DQacc, dK, dV,
                           seqlen_q, seqlen_k, nheads, group,
                           stride_lse_b, stride_lse_h, stride_delta_b, stride_delta_h,
                           softmax_scale, qk_scale,
                           HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                           IS_CAUSAL: gl.constexpr):
    """Grid (cdiv(seqlen_k, BLOCK_N), batch * nheads_kv), num_warps = BLOCK_N // 16 (two warpgroups
    at BLOCK_N = 128). Descriptors: Q, dO blocks [BLOCK_M, HEAD_DIM]; K, V blocks [BLOCK_N, HEAD_DIM].
    dK, dV: contiguous (batch, seqlen_k, nheads_kv, HEAD_DIM) in the input dtype; DQacc: contiguous
    (batch, seqlen_q, nheads, HEAD_DIM) fp32, zeroed, receives the unscaled dS K sums."""
    num_warps: gl.constexpr = gl.num_warps()
    gl.static_assert(BLOCK_N == 16 * num_warps, "one 16-row wgmma slice of the key block per warp")
    gl.static_assert(num_warps % 4 == 0, "whole warpgroups")
    gl.static_assert(BLOCK_M == 64, "the dQ product's M: one 64-row wgmma tile")
    dtype: gl.constexpr = q_desc.dtype

    nheads_kv = nheads // group
    b, h_kv, n_start = _key_block(nheads_kv, BLOCK_N)
    off = seqlen_k - seqlen_q  # causal: key j visible to query i iff j <= i + off

    # layouts: keys x queries (S^T, dP^T), keys x d (dK, dV), queries x d (dQ: the two warpgroups
    # split d)
    st_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_M)
    kv_layout: gl.constexpr = _acc_layout(num_warps, HEAD_DIM)
    dq_layout: gl.constexpr = _dq_layout(num_warps, HEAD_DIM)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    keys_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(0, st_layout))
    rows_1d = gl.arange(0, BLOCK_M, layout=gl.BlockedLayout([1], [32], [num_warps], [0]))
    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)

    # shared memory and barriers
    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], v_desc.layout)
    q_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], q_desc.layout)
    do_smem = gl.allocate_shared_memory(dtype, [2, BLOCK_M, HEAD_DIM], do_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    qdo_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
    mbarrier.init(kv_bar, count=1)
    for i in gl.static_range(2):
        mbarrier.init(qdo_bar.index(i), count=1)
    fence_async_shared()

    # the query blocks that see this key block: causal from the first row reaching its first key
    n_m_total = gl.cdiv(seqlen_q, BLOCK_M)
    m_lo = 0
    if IS_CAUSAL:
        m_lo = gl.minimum(gl.maximum(n_start - off, 0) // BLOCK_M, n_m_total)
    n_m = n_m_total - m_lo
    n_iter = group * n_m
    h0 = h_kv * group

    kv_row = b * seqlen_k + n_start
    kv_col = h_kv * HEAD_DIM
    mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [kv_row, kv_col], kv_bar, k_smem.index(0))
    tma.async_copy_global_to_shared(v_desc, [kv_row, kv_col], kv_bar, v_smem.index(0))
    if n_iter > 0:
        _issue_q_do(q_desc, do_desc, q_smem, do_smem, qdo_bar, 0, m_lo, n_m, h0, b, seqlen_q, HEAD_DIM, BLOCK_M)
    mbarrier.wait(kv_bar, 0)

    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=dq_layout)
    dq_rows_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, dq_layout))
    dq_cols_1d = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, dq_layout))
    # tiles needing no mask: the key block inside seqlen_k, the query block inside seqlen_q and
    # (causal) its first query row at or past the key block's last key
    keys_inside = n_start + BLOCK_N <= seqlen_k

    for t in range(n_iter):
        # next step's Q / dO into the other slot (free: docs/hopper-backward.md, "The base kernel")
        if t + 1 < n_iter:
            _issue_q_do(q_desc, do_desc, q_smem, do_smem, qdo_bar, t + 1, m_lo, n_m, h0, b, seqlen_q, HEAD_DIM,
                        BLOCK_M)
        s_idx = t % 2
        h = h0 + t // n_m
        m_start = (m_lo + t % n_m) * BLOCK_M
        q_cur = q_smem.index(s_idx)
        # z == 0 always (t < n_iter) but opaque to LLVM: indexing the single-slot K, V and dS buffers
        # with it keeps their 16 + 16 wgmma descriptors (64-bit, one per k-step) computed inside the
        # loop. With a constant index LLVM hoists them (64 registers live across the loop at d = 128,
        # the spills of the first version); one 32-bit division per step instead.
        z = t // n_iter
        k_cur = k_smem.index(z)
        v_cur = v_smem.index(z)
        ds_cur = ds_smem.index(z)
        do_cur = do_smem.index(s_idx)

        # per-query rows: lse (natural log -> log2; -inf rows -> 0) and D; rows past seqlen_q -> 0.
        # Loaded compactly (one element per thread: one address register, not 16 per vector) and
        # spread to the columns of S^T after the products (a layout conversion through shared memory).
        q_idx = m_start + rows_1d
        q_ok = q_idx < seqlen_q
        lse_c = gl.load(Lse + b.to(gl.int64) * stride_lse_b + h.to(gl.int64) * stride_lse_h + q_idx, mask=q_ok,
                        other=0.0)
        lse_c = gl.where(lse_c == float("-inf"), 0.0, lse_c * LOG2E)
        delta_c = gl.load(Delta + b.to(gl.int64) * stride_delta_b + h.to(gl.int64) * stride_delta_h + q_idx,
                          mask=q_ok, other=0.0)

        mbarrier.wait(qdo_bar.index(s_idx), (t // 2) & 1)
        # S^T and dP^T issued together (both operands in shared memory); P^T from S^T (in place: the
        # fp32 S^T dies) while dP^T is in flight, then dS^T in place of dP^T. At most two fp32
        # 128 x 64 tiles (P^T, dP^T) live next to dK, dV (the register budget, see the docstring).
        s_tok = warpgroup_mma(k_cur, q_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        dp_tok = warpgroup_mma(v_cur, do_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        lse_log2 = gl.convert_layout(lse_c, gl.SliceLayout(0, st_layout))
        p = _step_probs(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                        queries_1d, BLOCK_M, BLOCK_N, IS_CAUSAL)
        dp = warpgroup_mma_wait(0, deps=[dp_tok])
        delta = gl.convert_layout(delta_c, gl.SliceLayout(0, st_layout))
        # dS^T = P^T (dP^T - D) from the fp32 P^T (as the portable backward): 0 wherever P^T was masked
        # to 0 (dP^T is finite: products of finite rows)
        ds16 = (p * (dp - delta[None, :])).to(dtype)
        pa = gl.convert_layout(p.to(dtype), a_layout)
        dsa = gl.convert_layout(ds16, a_layout)
        dv_tok = warpgroup_mma(pa, do_cur, dv, is_async=True)
        dk_tok = warpgroup_mma(dsa, q_cur, dk, is_async=True)
        # the register A operands listed so that they stay alive until their products retire. Waited
        # here, before the barrier below: the slot argument (docs/hopper-backward.md) needs every warp's last
        # wgmma reading Q / dO of this step retired before any warp passes that barrier.
        dv, dk, pa, dsa = warpgroup_mma_wait(0, deps=[dv_tok, dk_tok, pa, dsa])

        # dS^T to shared memory for dQ = dS K. The first barrier: every warp is past its previous
        # step's dQ product (the WAR on ds_smem) and past this step's last reads of Q / dO, so the
        # slot is free for step t + 2, whose loads are issued at the start of step t + 1. The
        # second: all of dS^T (both warpgroups' halves) written and fenced before either reads it.
        gl.thread_barrier()
        ds_cur.store(ds16)
        fence_async_shared()
        gl.thread_barrier()
        dq = warpgroup_mma(ds_cur.permute((1, 0)), k_cur, dq_zero, use_acc=False)

        # a 64-bit scalar base and 32-bit offsets inside the tile (64 x 64-bit pointers per thread
        # would cost 64 registers next to dK and dV)
        dq_base = DQacc + ((b * seqlen_q + m_start).to(gl.int64) * nheads + h) * HEAD_DIM
        dq_offs = dq_rows_1d[:, None] * (nheads * HEAD_DIM) + dq_cols_1d[None, :]
        gl.atomic_add(dq_base + dq_offs, dq, mask=(m_start + dq_rows_1d < seqlen_q)[:, None], sem="relaxed")

    for i in gl.static_range(2):
        mbarrier.invalidate(qdo_bar.index(i))
    mbarrier.invalidate(kv_bar)

    _store_dkdv(dK, dV, dk, dv, b * seqlen_k, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout, HEAD_DIM,
                BLOCK_N)


# ---------------------------------------------------------------------------------------------------
# Variant "ws": warp-specialised (FlashAttention-3's backward structure). See docs/hopper-backward.md.
# ---------------------------------------------------------------------------------------------------

