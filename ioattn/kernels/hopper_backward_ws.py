"""The Gluon Hopper backward the dispatch runs ("ws", FlashAttention-3's structure): a TMA producer warp
(K / V once, Q and dO rings), two consumer warpgroups at 240 registers computing S^T, dP^T, dV, dK and
dQ, and a dQ writer warp adding each step's fp32 block by a TMA bulk reduce-add; its ordered
(deterministic) dQ mode, packed sequences, windows, softcap and ALiBi. At head dim 256 the two
warpgroups split every product by its columns (``COL_SPLIT``). The design: docs/hopper-backward.md;
the launch: ``ioattn.launch.gluon_bwd``. Reference twin: ``ioattn.reference.tiled.flash2_backward``."""
from triton._C.libtriton import ir
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language._core import builtin
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ioattn.kernels import hopper_flags as _flags
from ioattn.kernels.hopper_backward import (_acc_layout, _cols_mma, _dq_flat_layout, _dq_layout, _key_block,
                                            _step_probs, _store_dkdv, _store_rows, _ws_dq_acc_layout)
from ioattn.kernels.hopper_common import (_io_dim, _load_rows, _prod_dim, _qk_mma, _softcap, _tile_layout,
                                          _zero_v_tail as _zero_rows_from)
from ioattn.kernels.hopper_tiles import _block_lists, _full_tile, _key_tile

WS_WORKER_REGS = gl.constexpr(_flags.WS_WORKER_REGS)
WS_CONSUMER_REGS = gl.constexpr(_flags.WS_CONSUMER_REGS)


@builtin
def _tma_reduce_add(tensor_desc, coord, src, _semantic=None):
    """``cp.reduce.async.bulk.tensor ... .add``: add the shared-memory tile ``src`` into the global
    tile of ``tensor_desc`` at ``coord``, asynchronously (one bulk-async group; ``tma.store_wait``
    waits for its reads of ``src``). Triton 3.6's Gluon builder has the op (AsyncTMAReduceOp) but its
    ``hopper.tma`` module exports no wrapper for it, so this is a four-line one in the module's own
    style (``tma.async_copy_shared_to_global`` with the reduce kind added). It uses Triton internals
    (the builder binding, ``_convert_to_ir_values``): a Triton upgrade may move them, and the sm_90
    compile test would then fail here first."""
    coord = _semantic._convert_to_ir_values(coord, require_i64=False)
    _semantic.builder.create_async_tma_reduce(ir.DESCRIPTOR_REDUCE_KIND.ADD, tensor_desc.handle, coord, src.handle)


@gluon.jit
def _load_with_stat(desc, stat_desc, row, col, stat, bar, ring, stat_ring, i):
    """A Q or dO tile and its lse or D row (at ``stat``) into slot ``i`` of ``ring`` / ``stat_ring``,
    both on ``bar``."""
    mbarrier.expect(bar, desc.block_type.nbytes + stat_desc.block_type.nbytes)
    _load_rows(desc, row, col, bar, ring.index(i))
    tma.async_copy_global_to_shared(stat_desc, [stat], bar, stat_ring.index(i))


@gluon.jit
def _load_zeroed(desc, stat_desc, row, col, stat, tail_bar, tails, ring, stat_ring, ready, i, seqlen_q, m_start,
                 ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """``_load_with_stat`` of a tile reaching past the owned rows: through ``tail_bar`` (its ``tails``-th
    use gives the phase), the rows past seqlen_q zeroed, then slot ``i`` released by a plain arrive on
    its ``ready`` barrier. Returns the uses of ``tail_bar`` so far. (The loads written out, not through
    ``_load_with_stat``: the nested call compiled the varlen kernel to other SASS.)"""
    mbarrier.expect(tail_bar, desc.block_type.nbytes + stat_desc.block_type.nbytes)
    _load_rows(desc, row, col, tail_bar, ring.index(i))
    tma.async_copy_global_to_shared(stat_desc, [stat], tail_bar, stat_ring.index(i))
    mbarrier.wait(tail_bar, tails & 1)
    tails += 1
    _zero_rows_from(ring.index(i), seqlen_q - m_start, ROWS, HEAD_DIM)
    mbarrier.arrive(ready.index(i), count=1)
    return tails


@gluon.jit
def _ws_producer(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem, lse_smem,
                 delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, tail_bar, b, h0, kv_row, kv_col, m_lo, n_m,
                 n_iter, q_row0, nheads, stat_stride, seqlen_q, seqlen_k, n_start, q_owned, k_owned,
                 HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                 DO_STAGES: gl.constexpr, IS_VARLEN: gl.constexpr, IO_DIM: gl.constexpr = 0, qlists=None,
                 SUB: gl.constexpr = 1):
    """The 1-warp TMA producer: K and V of the key block once, then per step t (query head
    h0 + t // n_m, query block m_lo + t % n_m) Q with its lse row into slot t % STAGES of the Q ring
    (``q_ready``) and dO with its D row into slot t % DO_STAGES of the dO ring (``do_ready``), each
    after the consumers have released that slot's previous tile (``q_empty`` / ``do_empty``). Q / dO
    rows from ``q_row0`` (b * seqlen_q, or cu_seqlens_q[b] when varlen), K / V from ``kv_row``; the
    lse / D rows at (b, h, m_start) of the padded (batch, nheads, stat_stride). ``IS_VARLEN``: a tile
    reaching past ``q_owned`` / ``k_owned`` (the rows the sequences own) may read anything (0 x NaN is
    NaN in the products), so it lands on ``tail_bar``, this warp zeroes its rows past the sequence's end
    (the forward's ``_zero_v_tail``) and releases it by a plain arrive on its ready barrier.
    ``IO_DIM``: the tensors' head dim where it is below HEAD_DIM (``_io_dim``). ``qlists``: a block
    mask's query blocks for this key block (``_block_lists`` of the transposed lists), walked instead of
    m_lo ...: step j of a head is its j-th listed query block (``_key_tile``)."""
    tails = 0 * n_iter  # tiles on tail_bar so far (its phase); a runtime integer (loop-carried)
    if IS_VARLEN and kv_row + BLOCK_N > k_owned:
        mbarrier.expect(tail_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _load_rows(k_desc, kv_row, kv_col, tail_bar, k_smem.index(0))
        _load_rows(v_desc, kv_row, kv_col, tail_bar, v_smem.index(0))
        mbarrier.wait(tail_bar, 0)
        tails += 1
        _zero_rows_from(k_smem.index(0), seqlen_k - n_start, BLOCK_N, HEAD_DIM)
        _zero_rows_from(v_smem.index(0), seqlen_k - n_start, BLOCK_N, HEAD_DIM)
        mbarrier.arrive(kv_bar, count=1)
    else:
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        _load_rows(k_desc, kv_row, kv_col, kv_bar, k_smem.index(0))
        _load_rows(v_desc, kv_row, kv_col, kv_bar, v_smem.index(0))
    for t in range(n_iter):
        s = t % STAGES
        reuse_phase = ((t // STAGES) & 1) ^ 1  # the consumers' release of this slot's previous tile
        if DO_STAGES == STAGES:
            s_do = s
            reuse_phase_do = reuse_phase
        else:
            s_do = t % DO_STAGES
            reuse_phase_do = ((t // DO_STAGES) & 1) ^ 1
        h = h0 + t // n_m
        if qlists is None:
            m_start = (m_lo + t % n_m) * BLOCK_M
        else:
            m_start = _key_tile(t % n_m, m_lo, qlists, SUB) * BLOCK_M
        row = q_row0 + m_start
        col = h * _io_dim(HEAD_DIM, IO_DIM)
        stat = (b * nheads + h) * stat_stride + m_start
        mbarrier.wait(q_empty.index(s), reuse_phase, pred=t >= STAGES)
        if IS_VARLEN and row + BLOCK_M > q_owned:  # Q and dO both through tail_bar, zeroed past the end
            tails = _load_zeroed(q_desc, lse_desc, row, col, stat, tail_bar, tails, q_smem, lse_smem, q_ready, s,
                                 seqlen_q, m_start, BLOCK_M, HEAD_DIM)
            mbarrier.wait(do_empty.index(s_do), reuse_phase_do, pred=t >= DO_STAGES)
            tails = _load_zeroed(do_desc, delta_desc, row, col, stat, tail_bar, tails, do_smem, delta_smem, do_ready,
                                 s_do, seqlen_q, m_start, BLOCK_M, HEAD_DIM)
        else:
            _load_with_stat(q_desc, lse_desc, row, col, stat, q_ready.index(s), q_smem, lse_smem, s)
            mbarrier.wait(do_empty.index(s_do), reuse_phase_do, pred=t >= DO_STAGES)
            _load_with_stat(do_desc, delta_desc, row, col, stat, do_ready.index(s_do), do_smem, delta_smem, s_do)


@gluon.jit
def _bulk_complete_and_release(sem):
    """Wait until this thread's bulk async copies have completed (their writes performed, not only
    their shared-memory reads: ``tma.store_wait`` waits for the reads), order them before later
    generic-proxy accesses, then add 1 to ``sem`` with release semantics. Returns the old value."""
    gl.inline_asm_elementwise("cp.async.bulk.wait_group 0;\nfence.proxy.async.global;\nmov.u32 $0, 0;", "=r", [],
                              dtype=gl.int32, is_pure=False, pack=1)
    return gl.atomic_add(sem, 1, sem="release", scope="gpu")


@gluon.jit
def _ws_dq_writer(dq_desc, dq_smem, dq_full, dq_empty, q_smem, q_empty, dq_hi_full, Sem, b, h0, m_lo, n_m, n_iter,
                  q_row0, seqlen_q, seqlen_k, nheads, n_m_total, n_block, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                  BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr, DETERMINISTIC: gl.constexpr, DQ_COLS: gl.constexpr,
                  STAGES: gl.constexpr, DQ_FLAT: gl.constexpr = False, dq_smem1=None,
                  WG_SPLIT: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, dq_hi_desc=None,
                  DQ_HI_FIRST: gl.constexpr = False, qlists=None, SUB: gl.constexpr = 1):
    """The 1-warp dQ writer: per step, once the consumers have put the step's dQ block (fp32,
    unscaled) in ``dq_smem`` (``dq_full``), one TMA reduce-add of it into the dQ accumulator; when
    the bulk copy has read the tile, the buffer goes back to the consumers (``dq_empty``). ``DQ_COLS``
    < HEAD_DIM (the column split): the block in two halves, the high one announced on ``dq_hi_full``
    and read from step t's Q slot; both released (``dq_empty``, ``q_empty``) once both are read, so
    neither full barrier can complete twice before its wait (``DQ_HI_FIRST``: the high half first, the
    slot released as soon as it is read). ``DETERMINISTIC``: the reduce-adds into each (batch, head,
    query block) in a fixed key-block order by the counters in ``Sem`` (causal: descending, the key
    blocks launched in reverse). ``DQ_FLAT`` / ``WG_SPLIT``: the flat tile, in one or two boxes.
    ``n_m_total``: query blocks of one (batch, head) in the accumulator and ``Sem``; ``dq_hi_desc``: the
    64-column high half at the products over 192 columns; ``qlists``: the producer's. The protocols:
    docs/hopper-backward.md."""
    PIECES: gl.constexpr = HEAD_DIM // DQ_COLS  # 1; the column-split kernel's 2 halves
    FLAT_ROWS: gl.constexpr = BLOCK_M * HEAD_DIM // 32
    # the pieces' order: FIRST, FIRST + STEP, ... (the high half first with ``DQ_HI_FIRST``)
    FIRST: gl.constexpr = PIECES - 1 if DQ_HI_FIRST else 0
    STEP: gl.constexpr = -1 if DQ_HI_FIRST else 1
    for t in range(n_iter):
        h = h0 + t // n_m
        if qlists is None:
            m = m_lo + t % n_m
        else:
            m = _key_tile(t % n_m, m_lo, qlists, SUB)
        row = q_row0 + m * BLOCK_M
        for j in gl.static_range(FIRST, FIRST + STEP * PIECES, STEP):
            # piece j: columns [j * DQ_COLS, (j + 1) * DQ_COLS) of the block
            if j == 0:  # the dQ buffer; the column split's high half on its own barrier, in the Q slot
                mbarrier.wait(dq_full, t & 1)
            else:
                mbarrier.wait(dq_hi_full, t & 1)
            if DETERMINISTIC and j == FIRST:  # the order is per query block: wait once, before its first piece
                sem = Sem + (b * nheads + h) * n_m_total + m
                rank = n_block
                if IS_CAUSAL:  # the last key block reaching query block m goes first
                    last = gl.minimum(gl.cdiv(seqlen_k, BLOCK_N) - 1,
                                      (m * BLOCK_M + BLOCK_M - 1 + seqlen_k - seqlen_q) // BLOCK_N)
                    rank = last - n_block
                if WINDOW:  # ascending from the first key block reaching query block m (its left edge)
                    rank = n_block - gl.maximum(m * BLOCK_M + seqlen_k - seqlen_q - win_left, 0) // BLOCK_N
                while gl.atomic_add(sem, 0, sem="acquire", scope="gpu") != rank:
                    pass
            if WG_SPLIT:  # the two halves of the block's region
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS, 0],
                                dq_smem._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS + FLAT_ROWS // 2, 0],
                                dq_smem1._reinterpret(gl.float32, [FLAT_ROWS // 2, 32], dq_desc.layout))
            elif DQ_FLAT:  # (batch, head, query block)'s region of the flat accumulator
                _tma_reduce_add(dq_desc, [((b * nheads + h) * n_m_total + m) * FLAT_ROWS, 0],
                                dq_smem._reinterpret(gl.float32, [FLAT_ROWS, 32], dq_desc.layout))
            elif j == 0:
                _tma_reduce_add(dq_desc, [row, h * HEAD_DIM], dq_smem)
            elif dq_hi_desc is None:
                _tma_reduce_add(dq_desc, [row, h * HEAD_DIM + j * DQ_COLS],
                                q_smem.index(t % STAGES)._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], dq_smem.layout))
            else:
                _tma_reduce_add(dq_hi_desc, [row, h * HEAD_DIM + j * DQ_COLS],
                                q_smem.index(t % STAGES)._reinterpret(gl.float32, [BLOCK_M, DQ_COLS], dq_smem.layout)
                                .slice(0, dq_hi_desc.block_type.shape[1], dim=1))
            if DQ_HI_FIRST:
                if j == 1:  # the high half read: Q (and lse) slot back to the producer now
                    tma.store_wait(0)
                    mbarrier.arrive(q_empty.index(t % STAGES), count=1)
        # every piece read, then the buffers back: the low half's release (the consumers' next store)
        # follows the wait for the high half, so neither full barrier gets two phases ahead
        if DETERMINISTIC:  # every piece's additions complete, then the next key block
            _bulk_complete_and_release(sem)
        else:
            tma.store_wait(0)  # the pieces are read (their additions into L2 complete on their own)
        mbarrier.arrive(dq_empty, count=1)
        if PIECES == 2 and not DQ_HI_FIRST:
            mbarrier.arrive(q_empty.index(t % STAGES), count=1)  # Q (and lse) slot back to the producer


@gluon.jit
def _opaque_zero():
    """0, from an asm move LLVM cannot see through or hoist (not pure): an in-loop value that keeps
    loop-invariant address arithmetic inside the loop, for one instruction."""
    return gl.inline_asm_elementwise("mov.u32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _step_start(m_blk, h_in_group, Alibi_h0, alibi_unit, BLOCK_M: gl.constexpr, ALIBI: gl.constexpr):
    """A consumer step's first query row, its head's ALiBi slope in the units of S^T (0.0 without
    ``ALIBI``; read early: a scalar load) and an in-loop zero (``_opaque_zero``: it keeps the K, V and
    dS wgmma descriptors inside the loop, as the removed base kernel's ``z`` did)."""
    m_start = m_blk * BLOCK_M
    alibi_a = 0.0
    if ALIBI:
        alibi_a = gl.load(Alibi_h0 + h_in_group) * alibi_unit
    return m_start, alibi_a, _opaque_zero()


@gluon.jit
def _next_query_block(m_blk, h_in_group, m_lo, n_m):
    """The next step's query block and query head in the group: a counter wrapping at ``m_lo + n_m``
    (no integer division on the path from dK's retirement to the next S^T)."""
    m_blk += 1
    if m_blk == m_lo + n_m:  # the next query head of the group
        m_blk = m_lo
        h_in_group += 1
    return m_blk, h_in_group


@gluon.jit
def _step_probs16(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d, queries_1d,
                  BLOCK_M: gl.constexpr, ROWS: gl.constexpr, IS_CAUSAL: gl.constexpr, LSE_IN_ACC: gl.constexpr,
                  WINDOW: gl.constexpr, win_left, win_right, SOFTCAP: gl.constexpr, dtype: gl.constexpr,
                  ALIBI: gl.constexpr, alibi_a, mask_args=None, MASK_MOD: gl.constexpr = None, grad_s=None):
    """``_step_probs`` for a consumer step: P^T in ``dtype`` (the dV product's operand) and the fp32
    P^T that dS^T is formed from (``SOFTCAP``: times the tanh's derivative, ``_probs``; ``grad_s``: times
    the score function's derivative, ``_score_fn``)."""
    if SOFTCAP:
        p16, p = _step_probs(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                             queries_1d, BLOCK_M, ROWS, IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, True,
                             dtype, ALIBI, alibi_a)
    else:
        p = _step_probs(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                        queries_1d, BLOCK_M, ROWS, IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, False, None,
                        ALIBI, alibi_a, mask_args, MASK_MOD)
        p16 = p.to(dtype)
        if grad_s is not None:
            p = p * grad_s
    return p16, p


@gluon.jit
def _score_fn(s, softmax_scale, b, h, m_start, n_start, queries_1d, keys_1d, caps, SCORE_MOD: gl.constexpr,
              SCORE_GRAD: gl.constexpr):
    """S^T (raw q.k, keys x queries) through the user's score function (``ioattn.kernels.modgen``, on the
    scaled scores, as the forward's ``_mods_tile``) and the function's derivative there: its gradient
    function at an output gradient of ones (the gradient is linear in it; no captured tensor takes a
    gradient on this path). The indices are S^T's: queries along the columns."""
    s_raw = s * softmax_scale
    q_idx = (m_start + queries_1d)[None, :]
    kv_idx = (n_start + keys_1d)[:, None]
    grad_s = SCORE_GRAD(s_raw, b, h, q_idx, kv_idx, gl.full_like(s_raw, 1.0), caps, None, False)
    return SCORE_MOD(s_raw, b, h, q_idx, kv_idx, caps), grad_s


@gluon.jit
def _mma_t_minus(a, b_cur, st_zero, row):
    """a b_cur^T (S^T from K and Q, dP^T from V and dO), issued async; with a ``row`` (one value a
    query column: lse or D) the product itself subtracts it, its accumulator starting at minus the
    row (None: at zero)."""
    if row is None:
        tok = warpgroup_mma(a, b_cur.permute((1, 0)), st_zero, use_acc=False, is_async=True)
    else:
        tok = warpgroup_mma(a, b_cur.permute((1, 0)), st_zero - row[None, :], is_async=True)
    return tok


@gluon.jit
def _ws_consumer(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty,
                 do_ready, do_empty, dq_full, dq_empty, ds_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m,
                 n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                 COALESCED_STORE: gl.constexpr = False, LSE_IN_ACC: gl.constexpr = False,
                 WG_SPLIT: gl.constexpr = False, W: gl.constexpr = 0, WINDOW: gl.constexpr = False, win_left=0,
                 win_right=0, SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False,
                 Alibi_h0=None, alibi_unit=0.0, IO_DIM: gl.constexpr = 0, qlists=None, SUB: gl.constexpr = 1,
                 mods=None, b=0, h0=0, MASK_MOD: gl.constexpr = None, SCORE_MOD: gl.constexpr = None,
                 SCORE_GRAD: gl.constexpr = None):
    """The two consumer warpgroups (the default partition: the kernel's 8 warps, 64 key rows each, in
    lockstep). The math per step is the removed base kernel's, in FA3's order (dV issued before dS
    is formed, dQ before dK: docs/hopper-backward.md); the loads come from the
    rings, and dQ goes to ``dq_smem`` for the writer warp instead of into atomics. ``LSE_IN_ACC``
    (``WS_LSE_IN_ACC``): the lse slot holds lse / softmax_scale and S^T's accumulator starts at minus
    it, so the exponentials need no shared-memory read after S^T retires. ``WG_SPLIT``
    (``WS_WG_PARTITIONS``): this is warpgroup ``W`` alone, in a partition of its own: key rows
    [64 W, 64 W + 64) of the block, dQ's half W into its own ``dq_smem``, the dS^T exchange on
    ``ds_full`` (unused otherwise). ``SOFTCAP``: the scores are cap * tanh(S * softcap_a) (the
    host's ``qk_scale`` cap * log2 e), dS^T times the tanh's derivative (``_probs``). ``ALIBI``: the
    slope of the step's query head read from ``Alibi_h0`` (the group's first head's, + the head's
    place in the group), times ``alibi_unit`` (-1 / softmax_scale, or -1 / cap), biases S^T (``_probs``).
    ``qlists``: the producer's walk of a block mask's query blocks; ``MASK_MOD`` with ``mods`` (the score
    function's captured tensors, the mask function's), ``b`` and the group's first query head ``h0``: the
    user's mask function on the steps that are not the block mask's full blocks (``_step_probs``);
    ``SCORE_MOD`` / ``SCORE_GRAD``: the user's score function on S^T, dS^T times its derivative
    (``_score_fn``; ``qk_scale`` is then log2 e)."""
    num_warps: gl.constexpr = gl.num_warps()
    # key rows this partition computes; dQ's part: columns (64 query rows a step) or rows (128)
    ROWS: gl.constexpr = BLOCK_N // 2 if WG_SPLIT else BLOCK_N
    DQ_M: gl.constexpr = BLOCK_M // 2 if WG_SPLIT and BLOCK_M == 128 else BLOCK_M
    DQ_N: gl.constexpr = HEAD_DIM // 2 if WG_SPLIT and BLOCK_M == 64 else HEAD_DIM
    dtype: gl.constexpr = k_smem.dtype
    # D subtracted inside dP^T's product (its accumulator starts at -D) at 128 query rows a step, where
    # D in S^T's column layout is 32 registers a thread, live across P^T's formation otherwise
    D_IN_ACC: gl.constexpr = BLOCK_M == 128
    off = seqlen_k - seqlen_q
    st_layout: gl.constexpr = _acc_layout(num_warps, BLOCK_M)
    kv_layout: gl.constexpr = _acc_layout(num_warps, HEAD_DIM)
    dq_layout: gl.constexpr = _ws_dq_acc_layout(num_warps, BLOCK_M, HEAD_DIM, WG_SPLIT)
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    keys_1d = gl.arange(0, ROWS, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=col_layout)

    n_own = n_start + W * ROWS  # this partition's first key
    dk = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    dv = gl.zeros([ROWS, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([ROWS, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([DQ_M, DQ_N], gl.float32, layout=dq_layout)
    keys_inside = n_own + ROWS <= seqlen_k
    mbarrier.wait(kv_bar, 0)

    # The step's query block is stepped by a counter (wrapping at each query head of the group) and
    # the in-loop zero comes from an asm move: ``t % n_m`` and ``t // n_iter`` were two integer
    # divisions a step on the path from dK's retirement to the next S^T, where the tensor cores
    # idle (docs/decisions/backward-ws-step.md)
    m_blk, h_in_group = m_lo, 0  # the step's query block, and its query head in the group (``ALIBI``'s slope)
    for t in range(n_iter):
        s_idx = t % STAGES
        phase = (t // STAGES) & 1
        if qlists is None:
            m_start, alibi_a, z = _step_start(m_blk, h_in_group, Alibi_h0, alibi_unit, BLOCK_M, ALIBI)
        else:  # the step's listed query block (m_lo is 0)
            m_start, alibi_a, z = _step_start(_key_tile(m_blk, 0, qlists, SUB), h_in_group, Alibi_h0, alibi_unit,
                                              BLOCK_M, ALIBI)
        if MASK_MOD is not None:  # (b, the step's query head, the captures, whether a full block)
            mask_args = (b, h0 + h_in_group, mods[1], _full_tile(m_blk, qlists))
        else:
            mask_args = None
        k_all = k_smem.index(z)
        ds_all = ds_smem.index(z)
        q_cur = q_smem.index(s_idx)
        do_cur = do_smem.index(s_idx)
        if WG_SPLIT:  # this warpgroup's key rows; dQ's operands for its half
            k_cur = k_all.slice(W * ROWS, ROWS)
            v_cur = v_smem.index(z).slice(W * ROWS, ROWS)
            ds_cur = ds_all.slice(W * ROWS, ROWS)
            if BLOCK_M == 64:  # dQ's columns [W * DQ_N, ...): all of dS, K's column half
                dq_a = ds_all.permute((1, 0))
                dq_b = k_all.slice(W * DQ_N, DQ_N, dim=1)
            else:  # dQ's rows [W * DQ_M, ...): dS's query half, all of K
                dq_a = ds_all.slice(W * DQ_M, DQ_M, dim=1).permute((1, 0))
                dq_b = k_all
        else:
            k_cur = k_all
            v_cur = v_smem.index(z)
            ds_cur = ds_all
            dq_a = ds_all.permute((1, 0))
            dq_b = k_all

        # S^T as soon as Q has landed, dP^T once dO has
        mbarrier.wait(q_ready.index(s_idx), phase)
        # ``LSE_IN_ACC``: S^T - lse / softmax_scale from the product itself: the lse read happens here, at
        # the step's start, not behind this step's products in the shared-memory queue, where the first
        # FFMA of the exponentials waited for it
        lse_s = lse_smem.index(s_idx).load(col_layout) if LSE_IN_ACC else None
        s_tok = _mma_t_minus(k_cur, q_cur, st_zero, lse_s)
        mbarrier.wait(do_ready.index(s_idx), phase)
        # ``D_IN_ACC``: dP^T - D from the product itself (one value a query column), so D's registers die
        # before P^T's are formed
        delta = delta_smem.index(s_idx).load(col_layout) if D_IN_ACC else None
        dp_tok = _mma_t_minus(v_cur, do_cur, st_zero, delta)
        # lse (log2, -inf rows already 0, rows past seqlen_q 0: the host's padded copy) read from its
        # slot straight into S^T's column layout (a broadcast shared-memory read)
        if LSE_IN_ACC:
            lse_log2 = lse_s  # unused
        elif not SOFTCAP and SCORE_MOD is None:
            lse_log2 = lse_smem.index(s_idx).load(col_layout)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        if SOFTCAP:
            s = _softcap(s, softcap_a)
            lse_log2 = lse_smem.index(s_idx).load(col_layout)
        if SCORE_MOD is not None:
            s, grad_s = _score_fn(s, softmax_scale, b, h0 + h_in_group, m_start, n_own, queries_1d, keys_1d, mods[0],
                                  SCORE_MOD, SCORE_GRAD)
            lse_log2 = lse_smem.index(s_idx).load(col_layout)
        else:
            grad_s = None
        p16, p = _step_probs16(s, lse_log2, qk_scale, n_own, m_start, off, keys_inside, seqlen_q, seqlen_k, keys_1d,
                               queries_1d, BLOCK_M, ROWS, IS_CAUSAL, LSE_IN_ACC, WINDOW, win_left, win_right, SOFTCAP,
                               dtype, ALIBI, alibi_a, mask_args, MASK_MOD, grad_s)
        pa = gl.convert_layout(p16, a_layout)
        # dV += P^T dO queued behind dP^T: it runs while dS is formed and stored below
        dv_tok = warpgroup_mma(pa, do_cur, dv, is_async=True)
        if D_IN_ACC:
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            ds16 = (p * dp).to(dtype)
        else:
            delta = delta_smem.index(s_idx).load(col_layout)
            dp = warpgroup_mma_wait(1, deps=[dp_tok])
            ds16 = (p * (dp - delta[None, :])).to(dtype)
        dsa = gl.convert_layout(ds16, a_layout)
        # dS^T to shared memory for dQ = dS K. No barrier needed before the store (WAR on ds_smem):
        # every warp passed the previous step's last barrier after its dQ product had retired;
        # ``WG_SPLIT``: the other warpgroup's previous dQ too, once both handed it over (``dq_full``)
        if WG_SPLIT:
            mbarrier.wait(dq_full, (t & 1) ^ 1, pred=t > 0)
        ds_cur.store(ds16)
        fence_async_shared()
        # both warpgroups' halves of dS^T written (``WG_SPLIT``: this one's) before either product reads them
        gl.thread_barrier()
        if WG_SPLIT:  # the other warpgroup's half: its arrive on ds_full (count 2)
            mbarrier.arrive(ds_full, count=1)
            mbarrier.wait(ds_full, t & 1)
        # dQ first, then dK: dQ retires first and is handed to the writer warp while dK runs
        dq_tok = warpgroup_mma(dq_a, dq_b, dq_zero, use_acc=False, is_async=True)
        dk_tok = warpgroup_mma(dsa, q_cur, dk, is_async=True)

        # Releases, as the wgmma groups (retiring in order: dV, dQ, dK) allow. Each arrive is one
        # thread's, after a barrier over the partition's warps (8: both warpgroups' products retired;
        # ``WG_SPLIT``: this warpgroup's 4, the barrier counting both partitions' arrives; Triton adds
        # one before every arrive anyway: it orders the arrive after all shared-memory
        # accesses). The dO slot has no barrier of its own: it goes back with the dQ block, after both
        # warpgroups' dQ (and so dV, which retires before it) has retired: one barrier a step fewer than
        # a release of its own as soon as dV retires (docs/decisions/backward-dq-path.md)
        dv, pa, dq = warpgroup_mma_wait(1, deps=[dv_tok, pa, dq_tok])
        # the dQ block to the writer warp: wait until it has read the previous one (handed over a
        # whole step ago: normally long done), store, fence for the bulk copy, hand over
        mbarrier.wait(dq_empty, (t & 1) ^ 1, pred=t > 0)
        dq_smem.store(dq)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(do_empty.index(s_idx), count=1)  # dO and D done with
        mbarrier.arrive(dq_full, count=1)
        dk, dsa = warpgroup_mma_wait(0, deps=[dk_tok, dsa])
        gl.thread_barrier()
        mbarrier.arrive(q_empty.index(s_idx), count=1)  # Q (and lse) done with
        m_blk, h_in_group = _next_query_block(m_blk, h_in_group, m_lo, n_m)

    _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_own, seqlen_k, softmax_scale, kv_layout, HEAD_DIM, ROWS,
                COALESCED_STORE, IO_DIM)


@gluon.jit
def _dq_half_mma(ds_cur, k_cur, COL0: gl.constexpr, COLS: gl.constexpr, zero):
    """One column range of the step's dQ block, dS K[:, COL0:COL0 + COLS], issued async (the column
    split's halves)."""
    return warpgroup_mma(ds_cur.permute((1, 0)), k_cur.slice(COL0, COLS, dim=1), zero, use_acc=False, is_async=True)


@gluon.jit
def _dq_hi_buf(q_cur, dq_smem, BLOCK_M: gl.constexpr, HALF: gl.constexpr, PD: gl.constexpr):
    """dQ's high half's staging in the step's Q slot (once dK, the slot's last reader, has retired;
    the writer releases the slot once its bulk copy has read the half): the slot as an fp32 [BLOCK_M,
    HALF] tile in the dQ buffer's layout, its first PD - HALF columns (the products over 192 columns:
    64)."""
    buf = q_cur._reinterpret(gl.float32, [BLOCK_M, HALF], dq_smem.layout)
    if PD - HALF != HALF:
        buf = buf.slice(0, PD - HALF, dim=1)
    return buf


@gluon.jit
def _hand_over(buf, x, full):
    """Store ``x`` into ``buf`` and announce it on ``full``: a proxy fence for the writer's bulk copy,
    a barrier over the partition's warps, one thread's arrive."""
    buf.store(x)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(full, count=1)


@gluon.jit
def _ws_consumer_dsplit(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar,
                        q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv,
                        n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr,
                        BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DO_STAGES: gl.constexpr,
                        IS_CAUSAL: gl.constexpr, STAGED_STORE: gl.constexpr = False, WINDOW: gl.constexpr = False,
                        win_left=0, win_right=0, SOFTCAP: gl.constexpr = False, softcap_a=0.0,
                        ALIBI: gl.constexpr = False, Alibi_h0=None, alibi_unit=0.0, IO_DIM: gl.constexpr = 0,
                        PROD_DIM: gl.constexpr = 0, DQ_HI_FIRST: gl.constexpr = False):
    """The two consumer warpgroups of the column-split kernel (``COL_SPLIT``, head dim 256;
    docs/hopper-backward.md, "The column split"): one 64-key block, every product split by its columns
    between the warpgroups (``_dq_layout``), so warpgroup c holds dK and dV columns [c d/2, (c + 1) d/2),
    and S^T, dP^T, P^T, dS^T for queries [32c, 32c + 32). P^T and dS^T go through shared memory
    (``p_smem``, ``ds_smem``); dQ in two column halves, the low one through the half-width dQ buffer,
    the high one through the step's Q slot (released by the writer). ``SOFTCAP``, ``ALIBI``: as
    ``_ws_consumer``. ``PROD_DIM``: the products over the tiles' first 192 of 256 columns (S^T and dP^T
    two chained products, dV and dK two accumulators each, dQ's high half 64 columns wide).
    ``DQ_HI_FIRST``: dK, then dQ's high half, then its low half, the high half handed to the writer
    first, so that the Q slot it is staged in goes back to the producer sooner; both stores follow the
    wait for the writer to have read the previous step's low half."""
    num_warps: gl.constexpr = gl.num_warps()
    dtype: gl.constexpr = k_smem.dtype
    HALF: gl.constexpr = HEAD_DIM // 2
    PD: gl.constexpr = _prod_dim(HEAD_DIM, PROD_DIM)
    SPLIT: gl.constexpr = PD != HEAD_DIM
    NG: gl.constexpr = 2 if SPLIT else 1  # commit groups of one S^T / dP^T / dV / dK product
    gl.static_assert(not SPLIT or STAGED_STORE, "the split accumulators are stored through the Q slots")
    off = seqlen_k - seqlen_q
    st_layout: gl.constexpr = _dq_layout(num_warps, BLOCK_M)    # S^T, dP^T: warpgroup c its 32 query columns
    kv_layout: gl.constexpr = _dq_layout(num_warps, HEAD_DIM)   # dK, dV: warpgroup c its d / 2 columns
    dq_layout: gl.constexpr = _dq_layout(num_warps, HALF)       # one dQ half: warpgroup c its d / 4 columns
    col_layout: gl.constexpr = gl.SliceLayout(0, st_layout)
    keys_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, st_layout))
    queries_1d = gl.arange(0, BLOCK_M, layout=col_layout)

    if SPLIT:  # columns 0:128 and 128:PD
        dk = gl.zeros([BLOCK_N, 128], gl.float32, layout=_dq_layout(num_warps, 128))
        dv = gl.zeros([BLOCK_N, 128], gl.float32, layout=_dq_layout(num_warps, 128))
        dk_hi = gl.zeros([BLOCK_N, PD - 128], gl.float32, layout=_dq_layout(num_warps, PD - 128))
        dv_hi = gl.zeros([BLOCK_N, PD - 128], gl.float32, layout=_dq_layout(num_warps, PD - 128))
    else:
        dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
        dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, layout=kv_layout)
    st_zero = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, layout=st_layout)
    dq_zero = gl.zeros([BLOCK_M, HALF], gl.float32, layout=dq_layout)
    if SPLIT:  # dQ's high half: columns 128:PD
        dq_hi_zero = gl.zeros([BLOCK_M, PD - HALF], gl.float32, layout=_dq_layout(num_warps, PD - HALF))
    keys_inside = n_start + BLOCK_N <= seqlen_k
    mbarrier.wait(kv_bar, 0)

    # the query block by a counter and the in-loop zero from an asm move, as the key-split consumer
    # (docs/decisions/backward-ws-step.md)
    m_blk, h_in_group = m_lo, 0  # the step's query block, and its query head in the group (``ALIBI``'s slope)
    for t in range(n_iter):
        q_idx = t % STAGES
        do_idx = t % DO_STAGES
        m_start, alibi_a, z = _step_start(m_blk, h_in_group, Alibi_h0, alibi_unit, BLOCK_M, ALIBI)
        k_cur = k_smem.index(z)
        v_cur = v_smem.index(z)
        p_cur = p_smem.index(z)
        ds_cur = ds_smem.index(z)
        q_cur = q_smem.index(q_idx)
        do_cur = do_smem.index(do_idx)

        # S^T as soon as Q has landed, dP^T once dO has: each warpgroup its 32 query columns, over the
        # whole head dim
        mbarrier.wait(q_ready.index(q_idx), (t // STAGES) & 1)
        s_tok = _qk_mma(k_cur, q_cur, st_zero, PD)
        mbarrier.wait(do_ready.index(do_idx), (t // DO_STAGES) & 1)
        dp_tok = _qk_mma(v_cur, do_cur, st_zero, PD)
        lse_log2 = lse_smem.index(q_idx).load(col_layout)
        s = warpgroup_mma_wait(NG, deps=[s_tok])
        if SOFTCAP:
            s = _softcap(s, softcap_a)
        p16, p = _step_probs16(s, lse_log2, qk_scale, n_start, m_start, off, keys_inside, seqlen_q, seqlen_k,
                               keys_1d, queries_1d, BLOCK_M, BLOCK_N, IS_CAUSAL, False, WINDOW, win_left, win_right,
                               SOFTCAP, dtype, ALIBI, alibi_a)
        # P^T (16-bit) to shared memory, both halves before dV reads it. No barrier before the store
        # (WAR on p_smem): the previous step's dV retired in every warp before its dO barrier.
        p_cur.store(p16)
        fence_async_shared()
        gl.thread_barrier()
        # dV[:, own columns] += P^T dO, queued behind dP^T: it runs while dS^T is formed and stored
        if SPLIT:
            dv_tok, dvh_tok = _cols_mma(p_cur, do_cur, dv, dv_hi)
        else:
            dv_tok = warpgroup_mma(p_cur, do_cur, dv, is_async=True)
        delta = delta_smem.index(do_idx).load(col_layout)
        dp = warpgroup_mma_wait(NG, deps=[dp_tok])
        # dS^T from the fp32 P^T (registers; WAR on ds_smem: the previous step's readers retired in
        # every warp before its last barrier)
        ds_cur.store((p * (dp - delta[None, :])).to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        # ``DQ_HI_FIRST``: dK, dQ's high half, dQ's low half: the high half (and with it the Q slot) is
        # handed to the writer while the low half runs, the low half while the next step starts. Else
        # dQ's low half, then dK, then dQ's high half: the low half is handed to the writer while dK
        # runs, the high half while the next step starts
        if not DQ_HI_FIRST:
            dq_lo_tok = _dq_half_mma(ds_cur, k_cur, 0, HALF, dq_zero)
        if SPLIT:
            dk_tok, dkh_tok = _cols_mma(ds_cur, q_cur, dk, dk_hi)
        else:
            dk_tok = warpgroup_mma(ds_cur, q_cur, dk, is_async=True)
        dq_hi_tok = _dq_half_mma(ds_cur, k_cur, HALF, PD - HALF, dq_hi_zero if SPLIT else dq_zero)
        if DQ_HI_FIRST:
            dq_lo_tok = _dq_half_mma(ds_cur, k_cur, 0, HALF, dq_zero)
        # releases as the groups retire (dV first), each arrive one thread's after a barrier over the
        # partition's 8 warps (the ws consumer's discipline)
        if SPLIT:
            dv, dv_hi = warpgroup_mma_wait(NG + 2, deps=[dv_tok, dvh_tok])
        else:
            dv = warpgroup_mma_wait(NG + 2, deps=[dv_tok])
        gl.thread_barrier()
        mbarrier.arrive(do_empty.index(do_idx), count=1)  # dO and D done with (and P^T)
        if DQ_HI_FIRST:  # then dK, dQ high, dQ low
            if SPLIT:
                dk, dk_hi = warpgroup_mma_wait(2, deps=[dk_tok, dkh_tok])
            else:
                dk = warpgroup_mma_wait(2, deps=[dk_tok])
            gl.thread_barrier()
            dq = warpgroup_mma_wait(1, deps=[dq_hi_tok])
            # handover t: after the writer has read step t - 1's low half, its last piece
            mbarrier.wait(dq_empty, (t + 1) & 1, pred=t > 0)
            _hand_over(_dq_hi_buf(q_cur, dq_smem, BLOCK_M, HALF, PD), dq, dq_hi_full)
            dq = warpgroup_mma_wait(0, deps=[dq_lo_tok])
            _hand_over(dq_smem, dq, dq_full)
        else:  # then dQ low, dK, dQ high
            dq = warpgroup_mma_wait(NG + 1, deps=[dq_lo_tok])
            # the buffer's handover t: after the writer has read both halves of step t - 1
            mbarrier.wait(dq_empty, (t + 1) & 1, pred=t > 0)
            _hand_over(dq_smem, dq, dq_full)
            if SPLIT:
                dk, dk_hi = warpgroup_mma_wait(1, deps=[dk_tok, dkh_tok])
            else:
                dk = warpgroup_mma_wait(1, deps=[dk_tok])
            gl.thread_barrier()  # dK retired in every warp: the Q slot is free for the high half
            dq = warpgroup_mma_wait(0, deps=[dq_hi_tok])
            _hand_over(_dq_hi_buf(q_cur, dq_smem, BLOCK_M, HALF, PD), dq, dq_hi_full)
        m_blk, h_in_group = _next_query_block(m_blk, h_in_group, m_lo, n_m)

    # the writer's reads of the last high halves in the Q ring done before the slots are rewritten:
    # slot i's last release (steps t < n_iter with t % STAGES == i; a parity wait is exact here, the
    # slot's release before that one preceded its last load)
    for i in gl.static_range(STAGES):
        uses = (n_iter - i + STAGES - 1) // STAGES
        mbarrier.wait(q_empty.index(i), (uses + 1) & 1, pred=uses > 0)
    if SPLIT:
        _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, HEAD_DIM,
                           BLOCK_N, IO_DIM, dk_hi, dv_hi)
    elif STAGED_STORE:
        _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, HEAD_DIM,
                           BLOCK_N, IO_DIM)
    else:
        _store_dkdv(dK, dV, dk, dv, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale, kv_layout, HEAD_DIM,
                    BLOCK_N, IO_DIM=IO_DIM)


@gluon.jit
def _store_dkdv_staged(dK, dV, dk, dv, q_smem, k_row0, h_kv, nheads_kv, n_start, seqlen_k, softmax_scale,
                       HEAD_DIM: gl.constexpr, BLOCK_N: gl.constexpr, IO_DIM: gl.constexpr = 0, dk_hi=None,
                       dv_hi=None):
    """``_store_dkdv`` in whole rows of 16-byte pieces, staged through the Q ring (free once the last
    step's dK product, its last reader, has retired in both warpgroups: the column-split kernel has no
    shared memory left for a conversion's scratch). dK into slot 0, dV into slot 1 (each a BLOCK_N x
    HEAD_DIM tile in the Q layout), read back row-wise and stored with the keys past seqlen_k masked.
    ``dk_hi`` / ``dv_hi`` (``_ws_consumer_dsplit``'s split products): ``dk`` / ``dv`` are the columns 0:128
    and these the next ones, staged side by side (the slot's columns past them hold stale Q, never
    stored: IO_DIM is at most their end)."""
    gl.static_assert(q_smem.shape[0] >= 2, "two Q slots: dK and dV")
    gl.static_assert(q_smem.shape[1] == BLOCK_N, "a Q slot holds one key block's tile")
    num_warps: gl.constexpr = gl.num_warps()
    row_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (HEAD_DIM // 8), HEAD_DIM // 8], [num_warps, 1],
                                                [1, 0])
    gl.thread_barrier()  # every warp's last dK product (which reads Q) retired before the slots are overwritten
    if dk_hi is None:
        q_smem.index(0).store((dk * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(1).store(dv.to(dV.dtype.element_ty))
    else:
        LO: gl.constexpr = dk.shape[1]
        HI: gl.constexpr = dk_hi.shape[1]
        gl.static_assert(0 < IO_DIM and IO_DIM <= LO + HI, "the stored columns lie in the two parts")
        q_smem.index(0).slice(0, LO, dim=1).store((dk * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(0).slice(LO, HI, dim=1).store((dk_hi * softmax_scale).to(dK.dtype.element_ty))
        q_smem.index(1).slice(0, LO, dim=1).store(dv.to(dV.dtype.element_ty))
        q_smem.index(1).slice(LO, HI, dim=1).store(dv_hi.to(dV.dtype.element_ty))
    gl.thread_barrier()
    _store_rows(dK, q_smem.index(0).load(row_layout), k_row0, h_kv, nheads_kv, n_start, seqlen_k, row_layout, HEAD_DIM,
                BLOCK_N, IO_DIM)
    _store_rows(dV, q_smem.index(1).load(row_layout), k_row0, h_kv, nheads_kv, n_start, seqlen_k, row_layout, HEAD_DIM,
                BLOCK_N, IO_DIM)


@gluon.jit
def _ws_consumers(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar, q_ready,
                  q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo,
                  n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM: gl.constexpr,
                  BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, DO_STAGES: gl.constexpr,
                  IS_CAUSAL: gl.constexpr, COL_SPLIT: gl.constexpr, COALESCED_STORE: gl.constexpr,
                  LSE_IN_ACC: gl.constexpr = False, WG_SPLIT: gl.constexpr = False, W: gl.constexpr = 0,
                  WINDOW: gl.constexpr = False, win_left=0, win_right=0, SOFTCAP: gl.constexpr = False,
                  softcap_a=0.0, ALIBI: gl.constexpr = False, Alibi_h0=None, alibi_unit=0.0,
                  IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, DQ_HI_FIRST: gl.constexpr = False,
                  qlists=None, SUB: gl.constexpr = 1, mods=None, b=0, h0=0, MASK_MOD: gl.constexpr = None,
                  SCORE_MOD: gl.constexpr = None, SCORE_GRAD: gl.constexpr = None):
    """The default partition: ``_ws_consumer`` (warpgroups split the keys) or, with ``COL_SPLIT``,
    ``_ws_consumer_dsplit`` (warpgroups split the head dim, P^T in ``p_smem``), on the same arguments
    (``LSE_IN_ACC``, a block mask's walk and the user's functions: the key split only). ``WG_SPLIT``:
    warpgroup ``W`` of the key split alone (the default partition and one worker), ``dq_hi_full`` its
    dS^T exchange barrier."""
    if COL_SPLIT:
        gl.static_assert(qlists is None and MASK_MOD is None and SCORE_MOD is None,
                         "score and mask functions and block masks: the key split")
        _ws_consumer_dsplit(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem, dq_smem, kv_bar,
                            q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv,
                            nheads_kv, n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale,
                            HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DO_STAGES, IS_CAUSAL, COALESCED_STORE, WINDOW,
                            win_left, win_right, SOFTCAP, softcap_a, ALIBI, Alibi_h0, alibi_unit, IO_DIM, PROD_DIM,
                            DQ_HI_FIRST)
    else:
        gl.static_assert(PROD_DIM == 0, "the split products: the column-split consumers")
        _ws_consumer(k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, ds_smem, dq_smem, kv_bar, q_ready, q_empty,
                     do_ready, do_empty, dq_full, dq_empty, dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m,
                     n_iter, seqlen_q, seqlen_k, softmax_scale, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                     IS_CAUSAL, COALESCED_STORE, LSE_IN_ACC, WG_SPLIT, W, WINDOW, win_left, win_right, SOFTCAP,
                     softcap_a, ALIBI, Alibi_h0, alibi_unit, IO_DIM, qlists, SUB, mods, b, h0, MASK_MOD, SCORE_MOD,
                     SCORE_GRAD)


@gluon.jit
def hopper_bwd_ws_kernel(q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, dq_desc, dK, dV, Sem, Cu_q, Cu_k,
                         seqlen_q, seqlen_k, nheads, group, stat_stride, softmax_scale, qk_scale, win_left, win_right,
                         softcap_a, alibi_unit, stride_ab, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                         STAGES: gl.constexpr, DO_STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                         DETERMINISTIC: gl.constexpr = False, COL_SPLIT: gl.constexpr = False,
                         COALESCED_STORE: gl.constexpr = False, DQ_FLAT: gl.constexpr = False,
                         LSE_IN_ACC: gl.constexpr = False, WG_SPLIT: gl.constexpr = False,
                         IS_VARLEN: gl.constexpr = False, WINDOW: gl.constexpr = False,
                         SOFTCAP: gl.constexpr = False, ALIBI: gl.constexpr = False, Alibi=None,
                         IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, dq_hi_desc=None,
                         DQ_HI_FIRST: gl.constexpr = False, mods=None, blocks=None, MASK_MOD: gl.constexpr = None,
                         SUB: gl.constexpr = 1, KV_BLOCK: gl.constexpr = 0, SCORE_MOD: gl.constexpr = None,
                         SCORE_GRAD: gl.constexpr = None):
    """The Gluon backward (variant "ws"). Grid (cdiv(seqlen_k, BLOCK_N), batch * nheads_kv); dK, dV:
    contiguous, k's shape, in the input dtype; num_warps = 8 (the consumers; 4
    with ``WG_SPLIT``); the producer and dQ-writer warps are added by ``warp_specialize``. lse_desc /
    delta_desc: 1-D over the host's padded (batch, nheads, stat_stride) fp32 lse rows (in the kernel's
    unit, -inf -> 0) and D, zero past seqlen_q. dq_desc: the zeroed fp32 accumulator, 2-D (rows, nheads
    * HEAD_DIM) or, with ``DQ_FLAT``, a (-1, 32) view of the flat one. Sem: with ``DETERMINISTIC``, the
    zeroed int32 counters. STAGES / DO_STAGES: the Q and dO rings' depths. ``COL_SPLIT`` (head dim
    256): BLOCK_N = 64, the consumers split the head dim (``_ws_consumer_dsplit``). ``IS_VARLEN``,
    ``WINDOW``, ``SOFTCAP`` (not with ``LSE_IN_ACC``), ``ALIBI``: the forms in docs/hopper-backward.md;
    ``Cu_q`` / ``Cu_k``, ``win_left`` / ``win_right``, ``softcap_a``, ``Alibi`` / ``stride_ab`` /
    ``alibi_unit`` their arguments. ``MASK_MOD`` / ``SCORE_MOD`` with ``SCORE_GRAD`` (the user's mask and
    score functions, ``ioattn.kernels.modgen``; no captured tensor takes a gradient here) with ``mods``
    (their captured tensors: (the score function's, the mask function's)) and ``blocks`` (a block mask's transposed lists, ``ioattn.modcall``'s
    layout: the query blocks of each key block of ``KV_BLOCK`` keys, ``SUB`` query steps each; the
    query heads of a KV head share one row of them): fixed lengths, none of the built-in forms. The
    other flags: the module's ``WS_*`` tables, through ``kernel_config``."""
    num_warps: gl.constexpr = gl.num_warps()
    if WG_SPLIT:  # (``WS_WG_PARTITIONS``) the default partition is warpgroup 0, a worker warpgroup 1
        gl.static_assert(num_warps == 4 and DQ_FLAT and not COL_SPLIT, "a warpgroup a partition: the flat key split")
    else:
        gl.static_assert(num_warps == 8, "two consumer warpgroups")
    if COL_SPLIT:
        gl.static_assert(BLOCK_N == 64, "column split: one 64-key block, the warpgroups split the head dim")
        gl.static_assert(not LSE_IN_ACC, "lse in S^T's accumulator: the key split only")
    else:
        gl.static_assert(BLOCK_N == 128, "two consumer warpgroups of 64 key rows")
        gl.static_assert(DO_STAGES == STAGES, "one slot index for both rings")
    gl.static_assert(not (SOFTCAP and LSE_IN_ACC), "a softcap needs the raw scores in S^T's accumulator")
    gl.static_assert((PROD_DIM == 0) == (dq_hi_desc is None), "the split products: dQ's high half by dq_hi_desc")
    # columns of one dQ handover (the dQ descriptor's block): the column split hands dQ over in halves
    DQ_COLS: gl.constexpr = HEAD_DIM // 2 if COL_SPLIT else HEAD_DIM
    if COL_SPLIT:
        gl.static_assert(BLOCK_M == 64, "the dQ halves' M: one 64-row wgmma tile")
    else:
        gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128, "dQ: one 64-row tile, or a 64-row tile a warpgroup")
    gl.static_assert(STAGES >= 2, "a load in flight while a step computes")
    if COL_SPLIT:
        gl.static_assert(HEAD_DIM * q_desc.dtype.primitive_bitwidth == DQ_COLS * 32,
                         "a Q slot holds one fp32 dQ half")
    gl.static_assert(DO_STAGES >= 1 and DO_STAGES <= STAGES, "dO ring no deeper than Q's")
    dtype: gl.constexpr = q_desc.dtype

    nheads_kv = nheads // group
    # deterministic + causal: the key blocks launch in reverse, the order their dQ additions take
    b, h_kv, n_start = _key_block(nheads_kv, BLOCK_N, DETERMINISTIC and IS_CAUSAL)
    # query blocks per (batch, head) in the padded stat rows, the flat dQ accumulator and Sem
    n_m_total = stat_stride // BLOCK_M
    if IS_VARLEN:  # this sequence's first rows and lengths (seqlen_q / seqlen_k from here on are its own)
        q_row0 = gl.load(Cu_q + b)
        seqlen_q = gl.load(Cu_q + b + 1) - q_row0
        k_row0 = gl.load(Cu_k + b)
        seqlen_k = gl.load(Cu_k + b + 1) - k_row0
        # the end of the rows the sequences own (the producer zeroes what a tile reads past it)
        q_owned = gl.load(Cu_q + gl.num_programs(1) // nheads_kv)
        k_owned = gl.load(Cu_k + gl.num_programs(1) // nheads_kv)
    else:
        q_row0 = b * seqlen_q
        k_row0 = b * seqlen_k
        q_owned = 0  # unused
        k_owned = 0
    n_m_seq = gl.cdiv(seqlen_q, BLOCK_M)  # this sequence's query blocks
    m_lo = 0
    if IS_CAUSAL:
        m_lo = gl.minimum(gl.maximum(n_start - (seqlen_k - seqlen_q), 0) // BLOCK_M, n_m_seq)
    n_m = n_m_seq - m_lo
    if WINDOW:  # the query blocks this key block's band reaches: [m_lo, m_hi)
        gl.static_assert(not IS_CAUSAL, "a causal mask is the window (-1, 0): IS_CAUSAL's own path")
        m_lo = gl.minimum(gl.maximum(n_start - (seqlen_k - seqlen_q) - win_right, 0) // BLOCK_M, n_m_seq)
        last_row = n_start + BLOCK_N - 1 - (seqlen_k - seqlen_q) + win_left  # the last query that sees a key here
        m_hi = gl.minimum(gl.cdiv(gl.maximum(last_row + 1, 0), BLOCK_M), n_m_seq)
        n_m = gl.maximum(m_hi - m_lo, 0)
    if IS_VARLEN:  # a key block past its sequence's end (the grid covers the longest): no step, no store
        n_m = gl.where(n_start < seqlen_k, n_m, 0)
    h0 = h_kv * group
    if MASK_MOD is not None or SCORE_MOD is not None:
        gl.static_assert(not (IS_CAUSAL or WINDOW or IS_VARLEN or DETERMINISTIC or COL_SPLIT or SOFTCAP or ALIBI),
                         "score and mask functions: fixed lengths, the key split, none of the built-in forms")
    if SCORE_MOD is not None:
        gl.static_assert(SCORE_GRAD is not None and not LSE_IN_ACC, "a score function: its gradient, lse in the slot")
    if blocks is not None:  # the query blocks the block mask lists for this key block, partial ones first
        gl.static_assert(not (IS_CAUSAL or WINDOW or IS_VARLEN or DETERMINISTIC or COL_SPLIT or SOFTCAP or ALIBI),
                         "a block mask: fixed lengths, the key split, none of the built-in forms")
        qlists, n_m = _block_lists(blocks, b, h0, n_start, SUB, KV_BLOCK)
        m_lo = 0
    else:
        qlists: gl.constexpr = None
    n_iter = group * n_m
    # the slopes of this program's group of query heads (read only under ``ALIBI``; the launcher passes
    # an empty tensor without: a None handed on to the partitions does not compile at run time)
    Alibi_h0 = Alibi + b * stride_ab + h0

    ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_M], dtype)
    k_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], _tile_layout(k_desc.layout))
    v_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, HEAD_DIM], _tile_layout(v_desc.layout))
    q_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_M, HEAD_DIM], _tile_layout(q_desc.layout))
    do_smem = gl.allocate_shared_memory(dtype, [DO_STAGES, BLOCK_M, HEAD_DIM], _tile_layout(do_desc.layout))
    lse_smem = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_M], lse_desc.layout)
    delta_smem = gl.allocate_shared_memory(gl.float32, [DO_STAGES, BLOCK_M], delta_desc.layout)
    ds_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    # one dQ buffer (FA3 has one): handed over once a step (column split: once a half), read by the
    # bulk copy long before the next handover
    if WG_SPLIT:  # each warpgroup's dQ half in its own buffer: the flat tile's two halves (its top bit)
        DQ_M: gl.constexpr = BLOCK_M // 2 if BLOCK_M == 128 else BLOCK_M
        DQ_N: gl.constexpr = HEAD_DIM // 2 if BLOCK_M == 64 else HEAD_DIM
        dq_smem = gl.allocate_shared_memory(gl.float32, [DQ_M, DQ_N], _dq_flat_layout(4, DQ_M, DQ_N))
        dq_smem1 = gl.allocate_shared_memory(gl.float32, [DQ_M, DQ_N], _dq_flat_layout(4, DQ_M, DQ_N))
    elif DQ_FLAT:  # in the accumulator's order (``WS_DQ_FLAT``); dq_desc: the dense 2-D view's [rows, 32] box
        gl.static_assert(not COL_SPLIT, "the flat dQ tile: key-split form only")
        dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, DQ_COLS], _dq_flat_layout(num_warps, BLOCK_M,
                                                                                            HEAD_DIM))
        dq_smem1 = dq_smem  # unused
    else:
        dq_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, DQ_COLS], dq_desc.layout)
        dq_smem1 = dq_smem  # unused
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    q_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    do_ready = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], bar_layout)
    do_empty = gl.allocate_shared_memory(gl.int64, [DO_STAGES, 1], bar_layout)
    dq_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    dq_empty = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    if IS_VARLEN:  # the producer's own barrier for the tiles it zeroes past the owned rows
        tail_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(tail_bar, count=1)
    else:
        tail_bar = kv_bar  # unused
    # every barrier completes on one arrive: a TMA's expect-tx (ready, kv), the consumer partition's
    # single thread after a barrier over its 8 warps (empty, dq_full), the writer warp (dq_empty);
    # ``WG_SPLIT``: the consumers' on two, one a warpgroup partition (CONSUMERS)
    CONSUMERS: gl.constexpr = 2 if WG_SPLIT else 1
    mbarrier.init(kv_bar, count=1)
    mbarrier.init(dq_full, count=CONSUMERS)
    mbarrier.init(dq_empty, count=1)
    if COL_SPLIT:  # the high half's handover (dq_full: the low half's)
        dq_hi_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(dq_hi_full, count=1)
    elif WG_SPLIT:  # the key split's dS^T exchange between the two consumer partitions (``ds_full``)
        dq_hi_full = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        mbarrier.init(dq_hi_full, count=2)
    else:
        dq_hi_full = dq_full  # unused
    for i in gl.static_range(STAGES):
        mbarrier.init(q_ready.index(i), count=1)
        mbarrier.init(q_empty.index(i), count=CONSUMERS)
        if i < DO_STAGES:
            mbarrier.init(do_ready.index(i), count=1)
            mbarrier.init(do_empty.index(i), count=CONSUMERS)
    fence_async_shared()
    if COL_SPLIT:
        # P^T, which passes between the warpgroups as dS^T does (its own allocation: one shared with dS^T
        # made Triton order the dS^T store after the dV product's issue with one more barrier a step)
        p_smem = gl.allocate_shared_memory(dtype, [1, BLOCK_N, BLOCK_M], ds_layout)
    else:
        p_smem = ds_smem  # unused by ``_ws_consumer``

    # Registers (FA3's split for two MMA warpgroups): producer and writer warps 24 each (they share
    # one padded warpgroup: 12 warps, 384 threads), the default (consumer) partition gets the rest,
    # (65536 - 24 * 128) / 256 -> 240, what setmaxnreg shows in the PTX (the compile check asserts it).
    # ``WG_SPLIT``: warpgroup 1 a worker partition of its own at the consumers' 240 (the default
    # partition, warpgroup 0, gets the rest: the same split of the registers)
    gl.warp_specialize([
        (_ws_consumers, (k_smem, v_smem, q_smem, do_smem, lse_smem, delta_smem, p_smem, ds_smem,
                         dq_smem1 if w else dq_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, dq_full, dq_empty,
                         dq_hi_full, dK, dV, k_row0, h_kv, nheads_kv, n_start, m_lo, n_m, n_iter, seqlen_q, seqlen_k,
                         softmax_scale, qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, DO_STAGES, IS_CAUSAL, COL_SPLIT,
                         COALESCED_STORE, LSE_IN_ACC, WG_SPLIT, w, WINDOW, win_left, win_right, SOFTCAP, softcap_a,
                         ALIBI, Alibi_h0, alibi_unit, IO_DIM, PROD_DIM, DQ_HI_FIRST, qlists, SUB, mods, b, h0,
                         MASK_MOD, SCORE_MOD, SCORE_GRAD))
        if w < CONSUMERS else
        (_ws_producer, (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc, k_smem, v_smem, q_smem, do_smem,
                        lse_smem, delta_smem, kv_bar, q_ready, q_empty, do_ready, do_empty, tail_bar, b, h0,
                        k_row0 + n_start, h_kv * _io_dim(HEAD_DIM, IO_DIM), m_lo, n_m, n_iter, q_row0, nheads,
                        stat_stride, seqlen_q, seqlen_k, n_start, q_owned, k_owned, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                        DO_STAGES, IS_VARLEN, IO_DIM, qlists, SUB))
        if w == CONSUMERS else
        (_ws_dq_writer, (dq_desc, dq_smem, dq_full, dq_empty, q_smem, q_empty, dq_hi_full, Sem, b, h0, m_lo, n_m,
                         n_iter, q_row0, seqlen_q, seqlen_k, nheads, n_m_total, n_start // BLOCK_N, HEAD_DIM, BLOCK_M, BLOCK_N,
                         IS_CAUSAL, DETERMINISTIC, DQ_COLS, STAGES, DQ_FLAT, dq_smem1, WG_SPLIT, WINDOW, win_left,
                         dq_hi_desc, DQ_HI_FIRST, qlists, SUB))
        for w in (0, 1, 2, 3)[:CONSUMERS + 2]
    ], [4, 1, 1] if WG_SPLIT else [1, 1],
        [WS_CONSUMER_REGS, WS_WORKER_REGS, WS_WORKER_REGS] if WG_SPLIT else [WS_WORKER_REGS, WS_WORKER_REGS])
