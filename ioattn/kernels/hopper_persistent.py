"""The Gluon forward's persistent variant (``PERSISTENT``): at most one program per SM walking its
tiles, the next tile's Q prefetched, the ping-pong consumers' main loop reused per tile."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

from ioattn.kernels.hopper_common import _io_dim, _load_rows
from ioattn.kernels.hopper_fwd_tile import (_epilogue, _pp_mainloop, _pp_shared, _producer, _split_ring,
                                            _store_no_key_rows, _wg_acc_layout)
from ioattn.kernels.hopper_tiles import _kv_tile_count, _walk, _walk_steps, _tile_bhm


@gluon.jit
def _walk_first(num_tiles, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, table=None):
    """A table walk's first tile, read ahead of the loop (0, unused, for a computed walk)."""
    if table is None:
        return 0
    return _walk(0, num_tiles, IS_CAUSAL, PAIRED, table)


@gluon.jit
def _walk_next(k, t_next, num_tiles, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, table=None):
    """(walk step k's tile, the tile read ahead for step k + 1): a table walk's next tile is read a step
    ahead, its load's latency under a tile's work; a computed walk needs none (``t_next`` unused)."""
    if table is None:
        return _walk(k, num_tiles, IS_CAUSAL, PAIRED), t_next
    return t_next, _walk(k + 1, num_tiles, IS_CAUSAL, PAIRED, table)


@gluon.jit
def _persistent_producer(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, num_tiles,
                         num_m, nheads, group, seqlen_q, seqlen_k, IO_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                         BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                         KV_TAIL: gl.constexpr, PAIRED: gl.constexpr = False, divs=None, table=None, kv_hi=None):
    """``_producer`` over this program's tiles (``_walk``: the same walk as ``_persistent_consumer``'s),
    the ring's use count running on across tiles, so it loads the next tile's K/V while the
    consumers finish the current one. A ``table`` walk is read a step ahead. ``IO_DIM``: the tensors'
    head dim (``_io_dim``)."""
    g0 = 0
    tails = 0
    t_next = _walk_first(num_tiles, IS_CAUSAL, PAIRED, table)
    for k in range(0, _walk_steps(num_tiles, PAIRED, table)):
        t, t_next = _walk_next(k, t_next, num_tiles, IS_CAUSAL, PAIRED, table)
        if t < num_tiles:
            b, h, m_block = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)
            n_tiles = gl.maximum(
                _kv_tile_count(m_block * BLOCK_M, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL), 0)
            tails = _producer(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                              b * seqlen_k, (h // group) * IO_DIM, 0, n_tiles, seqlen_k, BLOCK_N, STAGES, KV_TAIL,
                              g0, tails, kv_hi)
            g0 += n_tiles



@gluon.jit
def _tile_rows(t, num_m, num_tiles, nheads, seqlen_q, stride_lse_b, stride_lse_h, row_off, IO_DIM: gl.constexpr,
               CTA_M: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr = False, divs=None):
    """Tile t's rows for a warpgroup ``row_off`` rows into it: (first row, its packed Q/O row, the
    head's column, the lse offset); ``IO_DIM``: the tensors' head dim (``_io_dim``)."""
    b, h, m_block = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)
    m_start = m_block * CTA_M + row_off
    return m_start, b * seqlen_q + m_start, h * IO_DIM, b.to(gl.int64) * stride_lse_b + h.to(gl.int64) * stride_lse_h



@gluon.jit
def _load_q(q_desc, q_smem, q_bar, j, t, num_m, num_tiles, nheads, seqlen_q, row_off, IO_DIM: gl.constexpr,
            CTA_M: gl.constexpr, Q0: gl.constexpr, Q_BUFS: gl.constexpr, IS_CAUSAL: gl.constexpr,
            PAIRED: gl.constexpr, divs=None):
    """This warpgroup's j-th Q load (tile ``t``'s rows) into its buffer j mod ``Q_BUFS`` (``Q0`` + that
    in the kernel's array); ``IO_DIM``: the tensors' head dim (``_io_dim``)."""
    b, h, m_block = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)
    buf = Q0 + j % Q_BUFS
    mbarrier.expect(q_bar.index(buf), q_desc.block_type.nbytes)
    _load_rows(q_desc, b * seqlen_q + m_block * CTA_M + row_off, h * IO_DIM, q_bar.index(buf), q_smem.index(buf))



@gluon.jit
def _prefetch_next_q(q_desc, q_smem, q_bar, q_issued, k, num_m, num_tiles, nheads, seqlen_q, seqlen_k, row_off,
                     IO_DIM: gl.constexpr, CTA_M: gl.constexpr, BLOCK_N: gl.constexpr, Q0: gl.constexpr,
                     Q_BUFS: gl.constexpr, IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, divs=None,
                     table=None, t_ahead=None):
    """The Q load of this warpgroup's tile after walk step ``k`` (if it exists and sees a key), as its
    ``q_issued``-th load; returns the loads issued. A ``table`` walk's tile is ``t_ahead``, as the
    partition's loop read it a step ahead."""
    if table is None:
        t_next = _walk(k + 1, num_tiles, IS_CAUSAL, PAIRED)
    else:
        t_next = t_ahead
    if _sees_keys(t_next, num_m, num_tiles, nheads, seqlen_q, seqlen_k, CTA_M, BLOCK_N, IS_CAUSAL, PAIRED, divs):
        _load_q(q_desc, q_smem, q_bar, q_issued, t_next, num_m, num_tiles, nheads, seqlen_q, row_off, IO_DIM,
                CTA_M, Q0, Q_BUFS, IS_CAUSAL, PAIRED, divs)
        q_issued += 1
    return q_issued



@gluon.jit
def _sees_keys(t, num_m, num_tiles, nheads, seqlen_q, seqlen_k, CTA_M: gl.constexpr, BLOCK_N: gl.constexpr,
               IS_CAUSAL: gl.constexpr, PAIRED: gl.constexpr, divs=None):
    """Tile ``t`` exists and some row of it sees a key (so its Q is loaded)."""
    b, h, m_block = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)
    return (t < num_tiles) & (_kv_tile_count(m_block * CTA_M, seqlen_q, seqlen_k, CTA_M, BLOCK_N, IS_CAUSAL) > 0)



@gluon.jit
def _persistent_consumer(q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn,
                         next_turn, Out, Lse, num_tiles, num_m, nheads, seqlen_q, seqlen_k, stride_om, stride_lse_b,
                         stride_lse_h, qk_scale, row_off, HEAD_DIM: gl.constexpr, CTA_M: gl.constexpr,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                         MASK_ALL: gl.constexpr, TURN0: gl.constexpr, ORDERED: gl.constexpr,
                         EXP2_FMA: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr,
                         RESCALE_BY_WARP: gl.constexpr, Q_IN_REGS: gl.constexpr, DEFERRED_SUM: gl.constexpr,
                         MASK_BRANCH: gl.constexpr, PTX_BARRIERS: gl.constexpr, ROW_STORES: gl.constexpr,
                         FEWER_MASKS: gl.constexpr = False, Q0: gl.constexpr = 0, Q_BUFS: gl.constexpr = 1,
                         PAIRED: gl.constexpr = False, divs=None, o_desc=None, NO_KEY_WIDE: gl.constexpr = False,
                         KEY_MASKS: gl.constexpr = True, DIAG_TRIM: gl.constexpr = False, table=None,
                         IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, kv_hi=None):
    """A ping-pong consumer warpgroup of the persistent kernel: rows [row_off, row_off + BLOCK_M) of
    each of this program's CTA_M-row tiles (``_walk``; the producer walks the same list). Per tile:
    ``_pp_mainloop`` with the ring's use count (``g0``) and this warpgroup's critical-section count
    (``sec0``) running on across tiles (n + 1 sections a tile, 0 for a tile no row of which sees a key);
    every V slot is released (the next tile reloads it). Q (``q_smem``: this warpgroup's buffers ``Q0``
    ... ``Q0`` + ``Q_BUFS`` - 1, its j-th load to Q0 + j mod Q_BUFS) is loaded ahead of its turn: with one
    buffer after this tile's S products have retired (after the output has left it, where it is staged
    there), with two as soon as this tile's own Q has landed. ``ROW_STORES`` = 3: every Q load first
    waits until the warpgroup's output copies have read their buffer (``tma.store_wait(0)``).
    ``IO_DIM``: the tensors' head dim where it is below HEAD_DIM (``_io_dim``; 0: HEAD_DIM)."""
    D_IO: gl.constexpr = _io_dim(HEAD_DIM, IO_DIM)
    o_layout: gl.constexpr = _wg_acc_layout(HEAD_DIM)
    row_layout: gl.constexpr = gl.SliceLayout(1, _wg_acc_layout(BLOCK_N))
    rows_1d = gl.arange(0, BLOCK_M, layout=row_layout)
    g0 = 0
    sec0 = 0
    q_used = 0
    q_issued = 0
    # a table walk's next tile, read a step ahead (the load's latency under a tile's work). Written out
    # here rather than through _walk_next: the same steps through a helper compile this partition
    # differently (ptxas 12.8), and this is the build that was measured
    t_next = None
    if table is not None:
        t_next = _walk(0, num_tiles, IS_CAUSAL, PAIRED, table)
    for k in range(0, _walk_steps(num_tiles, PAIRED, table)):
        if table is None:
            t = _walk(k, num_tiles, IS_CAUSAL, PAIRED)
        else:
            t = t_next
            t_next = _walk(k + 1, num_tiles, IS_CAUSAL, PAIRED, table)
        if t < num_tiles:
            # only the tile index, its key-tile count and first row stay live across the key loop (the
            # rest is recomputed from t after it: 240 registers leave no room, ptxas spilled otherwise)
            b, h, m_block = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)
            n_tiles = _kv_tile_count(m_block * CTA_M, seqlen_q, seqlen_k, CTA_M, BLOCK_N, IS_CAUSAL)
            m_start = m_block * CTA_M + row_off
            if n_tiles > 0:
                if q_issued == q_used:
                    if ROW_STORES == 3:
                        tma.store_wait(0)
                    _load_q(q_desc, q_smem, q_bar, q_issued, t, num_m, num_tiles, nheads, seqlen_q, row_off,
                            D_IO, CTA_M, Q0, Q_BUFS, IS_CAUSAL, PAIRED, divs)
                    q_issued += 1
                buf = Q0 + q_used % Q_BUFS
                mbarrier.wait(q_bar.index(buf), (q_used // Q_BUFS) & 1)
                q_used += 1
                if Q_BUFS == 2:  # the next tile's Q into the other buffer now
                    if ROW_STORES == 3:  # once the previous tile's output copy has read it
                        tma.store_wait(0)
                    q_issued = _prefetch_next_q(q_desc, q_smem, q_bar, q_issued, k, num_m, num_tiles, nheads,
                                                seqlen_q, seqlen_k, row_off, D_IO, CTA_M, BLOCK_N, Q0, Q_BUFS,
                                                IS_CAUSAL, PAIRED, divs, table, t_next)
                o, m_i, l_i = _pp_mainloop(q_smem.index(buf), k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                           my_turn, next_turn, m_start, seqlen_q, seqlen_k, 0, n_tiles, qk_scale, g0,
                                           sec0, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL, MASK_ALL, TURN0,
                                           ORDERED, LEAN, COND_RESCALE, RESCALE_BY_WARP, Q_IN_REGS, DEFERRED_SUM,
                                           MASK_BRANCH, PTX_BARRIERS, True, EXP2_FMA, FEWER_MASKS, KEY_MASKS,
                                           DIAG_TRIM, PROD_DIM=PROD_DIM, kv_hi=kv_hi)
                g0 += n_tiles
                sec0 += n_tiles + 1
                # the next tile's Q into the buffer this tile's S products have released: before the epilogue,
                # or (ROW_STORES = 2 / 3: the output staged in that buffer) once every thread has read it back
                # / the copy has read it
                LOAD_Q_AFTER: gl.constexpr = ROW_STORES >= 2
                if (Q_BUFS == 1) & (not LOAD_Q_AFTER):
                    q_issued = _prefetch_next_q(q_desc, q_smem, q_bar, q_issued, k, num_m, num_tiles, nheads,
                                                seqlen_q, seqlen_k, row_off, D_IO, CTA_M, BLOCK_N, Q0, Q_BUFS,
                                                IS_CAUSAL, PAIRED, divs, table, t_next)
                _tile_epilogue(o, m_i, l_i, t, Out, Lse, rows_1d, num_m, num_tiles, nheads, seqlen_q, stride_om,
                               stride_lse_b, stride_lse_h, row_off, o_layout, HEAD_DIM, CTA_M, BLOCK_M, IS_CAUSAL,
                               ROW_STORES, PAIRED, q_smem.index(buf), divs, o_desc, IO_DIM)
                if LOAD_Q_AFTER & (Q_BUFS == 1):  # the output staged in the Q buffer has left it
                    if ROW_STORES == 3:
                        tma.store_wait(0)
                    gl.thread_barrier()
                    fence_async_shared()  # the stage's generic-proxy accesses before the TMA's write
                    q_issued = _prefetch_next_q(q_desc, q_smem, q_bar, q_issued, k, num_m, num_tiles, nheads,
                                                seqlen_q, seqlen_k, row_off, D_IO, CTA_M, BLOCK_N, Q0, Q_BUFS,
                                                IS_CAUSAL, PAIRED, divs, table, t_next)
            else:
                m_start, q_row0, q_col, lse_base = _tile_rows(t, num_m, num_tiles, nheads, seqlen_q, stride_lse_b,
                                                              stride_lse_h, row_off, D_IO, CTA_M, IS_CAUSAL,
                                                              PAIRED, divs)
                _store_no_key_rows(Out, Lse, lse_base, q_row0, m_start, q_col, seqlen_q, stride_om, BLOCK_M, HEAD_DIM,
                                   NO_KEY_WIDE, IO_DIM)
    if ROW_STORES == 3:  # the last output copies have read their buffers before the program exits
        tma.store_wait(0)



@gluon.jit
def _tile_epilogue(o, m_i, l_i, t, Out, Lse, rows_1d, num_m, num_tiles, nheads, seqlen_q, stride_om, stride_lse_b,
                   stride_lse_h, row_off, o_layout: gl.constexpr, HEAD_DIM: gl.constexpr, CTA_M: gl.constexpr,
                   BLOCK_M: gl.constexpr, IS_CAUSAL: gl.constexpr, ROW_STORES: gl.constexpr, PAIRED: gl.constexpr,
                   stage=None, divs=None, o_desc=None, IO_DIM: gl.constexpr = 0):
    """``_epilogue`` of a persistent program's tile ``t`` (its rows recomputed from the index); ``stage``:
    the warpgroup's dead Q buffer, used by ``ROW_STORES`` = 2 / 3 only (3: ``o_desc``)."""
    m_start, q_row0, q_col, lse_base = _tile_rows(t, num_m, num_tiles, nheads, seqlen_q, stride_lse_b, stride_lse_h,
                                                  row_off, _io_dim(HEAD_DIM, IO_DIM), CTA_M, IS_CAUSAL, PAIRED, divs)
    b = None
    if ROW_STORES == 3:  # the copy's coordinates are (batch, row, column)
        b = _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL, True, PAIRED, divs)[0]
    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om, o_layout,
              BLOCK_M, HEAD_DIM, ROW_STORES, stage, o_desc, b, IO_DIM)



@gluon.jit
def _persistent_fwd(q_desc, k_desc, v_desc, o_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                    stride_lse_b, stride_lse_h, qk_scale, num_tiles, num_m, HEAD_DIM: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    ORDERED: gl.constexpr,
                    KV_TAIL: gl.constexpr, EXP2_FMA: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr,
                    RESCALE_BY_WARP: gl.constexpr, Q_IN_REGS: gl.constexpr, DEFERRED_SUM: gl.constexpr,
                    MASK_BRANCH: gl.constexpr, PTX_BARRIERS: gl.constexpr, ROW_STORES: gl.constexpr,
                    FEWER_MASKS: gl.constexpr = False, Q_BUFS: gl.constexpr = 1, PAIRED: gl.constexpr = False,
                    divs=None, NO_KEY_WIDE: gl.constexpr = False, KEY_MASKS: gl.constexpr = True,
                    DIAG_TRIM: gl.constexpr = False, table=None, IO_DIM: gl.constexpr = 0,
                    PROD_DIM: gl.constexpr = 0, k_hi_desc=None, v_hi_desc=None):
    """The persistent ping-pong kernel's body (``hopper_fwd_kernel(PERSISTENT=True)``): the same
    shared memory and partitions as the one-tile kernel (two consumer warpgroups of 64 rows, the
    producer warp, 240 / 24 registers), each partition walking this program's tiles; ``Q_BUFS`` Q
    buffers per consumer warpgroup (``_persistent_consumer``). ``DIAG_TRIM``: warpgroup 0's only (the
    rows whose diagonal ends mid-tile when seqlen_q = seqlen_k; ``_pp_mainloop``)."""
    WG_ROWS: gl.constexpr = BLOCK_M // 2
    gl.static_assert(q_desc.block_type.shape[-2] == WG_ROWS, "ping-pong: Q descriptor block is [64, HEAD_DIM]")
    gl.static_assert((Q_BUFS == 1) | (Q_BUFS == 2), "one or two Q buffers per consumer warpgroup")
    gl.static_assert((ROW_STORES != 2) | (Q_BUFS == 1), "the output staged in the Q buffer: one buffer a warpgroup")
    if ROW_STORES == 3:
        gl.static_assert(o_desc.block_type.shape[-2] == WG_ROWS, "the output's copy: [1, 64, HEAD_DIM] boxes")
    q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn = _pp_shared(
        q_desc, k_desc, v_desc, 2, WG_ROWS, BLOCK_N, HEAD_DIM, STAGES, Q_BUFS, k_hi_desc)
    # the split ring's high columns: the consumers' rings, the producer's descriptors and rings (without it
    # None, a constexpr: a plain None does not pass to the partitions)
    if k_hi_desc is not None:
        kv_hi, kv_hi_load = _split_ring(k_hi_desc, v_hi_desc, BLOCK_N, STAGES)
    else:
        kv_hi: gl.constexpr = None
        kv_hi_load: gl.constexpr = None
    gl.warp_specialize(
        [(_persistent_consumer, (q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready,
                                 v_empty, turn.index(w), turn.index((w + 1) % 2), Out, Lse, num_tiles, num_m, nheads,
                                 seqlen_q, seqlen_k, stride_om, stride_lse_b, stride_lse_h, qk_scale, w * WG_ROWS,
                                 HEAD_DIM, BLOCK_M, WG_ROWS, BLOCK_N, STAGES, IS_CAUSAL, IS_CAUSAL,
                                 1 if w == 0 else 0, ORDERED, EXP2_FMA, LEAN, COND_RESCALE, RESCALE_BY_WARP,
                                 Q_IN_REGS, DEFERRED_SUM, MASK_BRANCH, PTX_BARRIERS, ROW_STORES, FEWER_MASKS,
                                 w * Q_BUFS, Q_BUFS, PAIRED, divs, o_desc, NO_KEY_WIDE, KEY_MASKS, DIAG_TRIM and w == 0,
                                 table, IO_DIM, PROD_DIM, kv_hi))
         if w < 2 else
         (_persistent_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                 num_tiles, num_m, nheads, group, seqlen_q, seqlen_k, _io_dim(HEAD_DIM, IO_DIM),
                                 BLOCK_M, BLOCK_N,
                                 STAGES, IS_CAUSAL, KV_TAIL, PAIRED, divs, table, kv_hi_load))
         for w in (0, 1, 2)],
        [4, 1], [240, 32])
