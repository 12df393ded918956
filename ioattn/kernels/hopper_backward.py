"""Pieces of the Gluon Hopper backward (``hopper_backward_ws``): the probabilities of a transposed score
tile (masks, softcap, ALiBi), the dQ tile's layouts, the key-block walk and the dK / dV stores. The
design: docs/hopper-backward.md."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma

from ioattn.kernels.hopper_common import ALIBI_MAGIC, MAGIC_BITS, _io_dim, _magic_to_f32


@gluon.jit
def _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d,
           MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, LSE_IN_ACC: gl.constexpr = False,
           WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
           DTYPE: gl.constexpr = None, ALIBI: gl.constexpr = False, alibi_a=0.0, mask_args=None,
           MASK_MOD: gl.constexpr = None):
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
    register) and lo (one value per thread), the masks' query tests on hi too. ``MASK_MOD`` (the user's
    mask function, ``ioattn.kernels.modgen``) with ``mask_args`` = (b, h, its captures, full): the masked
    form keeps what it keeps too, unless the tile is a block mask's ``full`` block."""
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
            if MASK_MOD is not None:
                keep = keep & (MASK_MOD(mask_args[0], mask_args[1], queries, keys, mask_args[2]) | mask_args[3])
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
                alibi_a=0.0, mask_args=None, MASK_MOD: gl.constexpr = None):
    """``_probs`` with the masks only where this step's tile needs them: keys past seqlen_k (not
    ``keys_inside``), queries past seqlen_q, or (causal) a tile the diagonal crosses (``off`` =
    seqlen_k - seqlen_q); ``WINDOW``: also a tile either edge of the window crosses; ``MASK_MOD``: also
    a tile that is not a block mask's full block (``mask_args[3]``)."""
    need_mask = (not keys_inside) | (m_start + BLOCK_M > seqlen_q)
    if MASK_MOD is not None:
        need_mask = need_mask | (mask_args[3] == 0)
    if IS_CAUSAL:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off)
    if WINDOW:
        need_mask = need_mask | (n_start + BLOCK_N - 1 > m_start + off + win_right)
        need_mask = need_mask | (n_start < m_start + BLOCK_M - 1 + off - win_left)
    if need_mask:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, True,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a, mask_args,
                   MASK_MOD)
    else:
        p = _probs(s, lse_log2, qk_scale, n_start, m_start, seqlen_q, seqlen_k, keys_1d, queries_1d, False,
                   IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP, DTYPE, ALIBI, alibi_a)
    return p
