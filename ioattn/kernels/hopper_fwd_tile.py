"""One query tile of the Gluon forward: the TMA producer's K / V ring, the consumer warpgroups
(base, ping-pong, split, three-warpgroup) with their turn protocol, the P V products and the epilogue's
stores. The kernel entry is ``hopper_forward.hopper_fwd_kernel``; the design: docs/hopper-forward.md."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from ioattn import _compat
from ioattn.kernels import ptx_barriers as _ptx_barriers
from ioattn.kernels.hopper_common import (ALIBI_FP32_COLS, FP8_BLOCK_ROWS, LN2, P_SCALE_LOG2, TRACE_EVENTS, _io_dim, _load_rows,
                                          _prod_dim, _qk_mma, _softcap, _tile_layout, _zero_v_tail)
from ioattn.kernels.hopper_softmax import (_alibi, _mods_softmax, _mods_tile, _rescale_rows, _softmax_tile, _step_softmax, _thread_row_sums,
                                           _window_cuts)
from ioattn.kernels.hopper_tiles import _full_tile, _key_tile, _kv_tile_count

# The PTX barrier pass (``ptx_barriers``) acts only on PTX carrying its marker (``_ptx_barriers_marker``).
# Its compile-stage hook follows Triton 3.6's protocol (from 3.7 on Triton also calls the hook with no
# arguments, for a cache key): on a Triton the Gluon kernels do not run on (``_compat.gluon_status``)
# it stays out of every kernel's compile.
if _compat.gluon_status()[0]:
    _ptx_barriers.install()


@gluon.jit
def _store_no_key_rows(Out, Lse, lse_base, q_row0, m_start, q_col, seqlen_q, stride_om, ROWS: gl.constexpr,
                       HEAD_DIM: gl.constexpr, WIDE: gl.constexpr = False, IO_DIM: gl.constexpr = 0):
    """Rows [m_start, m_start + ROWS) that see no key (causal, seqlen_q > seqlen_k): output 0, lse
    -inf, in chunks of the largest power of two dividing ROWS (gl.arange needs one: the whole block
    at 128, three chunks of 64 at 192). ``WIDE`` (``hopper.NO_KEY_WIDE_HEADDIMS``): 16-byte stores, a row
    over HEAD_DIM / 8 threads (as ``_epilogue``'s), for in the persistent kernel this cold path sits
    inside the consumer's tile loop, between the epilogue and the loop's back edge, where a store an
    element compiles to twice the instructions in the instruction cache's way; a one-tile program runs
    it once, before its key loop. ``IO_DIM``: the output's head dim where it is below HEAD_DIM
    (``_io_dim``), its columns alone stored."""
    if WIDE:
        row_threads: gl.constexpr = HEAD_DIM // 8  # <= 32: HEAD_DIM <= 256
        zl: gl.constexpr = gl.BlockedLayout([1, 8], [32 // row_threads, row_threads], [gl.num_warps(), 1], [1, 0])
    else:
        zl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [gl.num_warps(), 1], [1, 0])
    Z_ROWS: gl.constexpr = ROWS & -ROWS
    for c in gl.static_range(ROWS // Z_ROWS):
        rows = m_start + c * Z_ROWS + gl.arange(0, Z_ROWS, layout=gl.SliceLayout(1, zl))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, zl))
        ptrs = Out + (q_row0 - m_start + rows).to(gl.int64)[:, None] * stride_om + q_col + cols[None, :]
        gl.store(ptrs, gl.zeros([Z_ROWS, HEAD_DIM], Out.dtype.element_ty, layout=zl),
                 mask=(rows < seqlen_q)[:, None] & (cols < _io_dim(HEAD_DIM, IO_DIM))[None, :])
        gl.store(Lse + lse_base + rows, gl.full([Z_ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, zl)),
                 mask=rows < seqlen_q)


PTX_BARRIERS_MARKER = gl.constexpr(_ptx_barriers.MARKER)  # a constexpr global: in Triton's cache key



@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
              n_tiles, seqlen_k, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KV_TAIL: gl.constexpr, g0=0, tails=0,
              kv_hi=None, vt_row0=0, lists=None, SUB: gl.constexpr = 1):
    """K and V tiles n_lo .. n_lo + n_tiles - 1 into the ring; ``g0``: ring uses before this call
    (a persistent program's running count), which fixes each tile's slot and phase. The V tile the
    key end falls in (a sequence length not a multiple of BLOCK_N) lands instead on ``v_tail`` (the
    extra barrier at ``v_ready[STAGES]``), its rows past the end are zeroed here (``_zero_v_tail``),
    and only then is it released to the consumers, by a plain arrive on its ``v_ready`` (count 1, no
    bytes pending); compiled only with ``KV_TAIL`` (the host sets it for varlen calls and key lengths
    not a multiple of BLOCK_N). ``tails``: such tiles before this call (``v_tail``'s phase); returns
    the count after it. ``kv_hi`` (the split ring, ``_split_ring``): (k_hi_desc, v_hi_desc, k_hi, v_hi),
    each tile's columns 128: in rings of their own, loaded beside the first 128 on the same barriers.
    FP8 (e4m3 descriptors): V arrives transposed, [HEAD_DIM, BLOCK_N] tiles of the (heads * d, keys)
    view from row ``vt_row0`` (``_v_operand``); the columns past the keys zero-filled by TMA. ``lists``: a
    block mask's (``_block_lists``), whose tiles are loaded in its order (``_key_tile``)."""
    V_T: gl.constexpr = v_desc.dtype == gl.float8e4nv
    gl.static_assert(not (V_T and (KV_TAIL or kv_hi is not None)), "FP8: whole V^T tiles, no split ring")
    tails = tails + 0 * n_tiles  # a runtime integer whatever the caller passed (loop-carried)
    k_bytes: gl.constexpr = k_desc.block_type.nbytes + (0 if kv_hi is None else kv_hi[0].block_type.nbytes)
    v_bytes: gl.constexpr = v_desc.block_type.nbytes + (0 if kv_hi is None else kv_hi[1].block_type.nbytes)
    C_HI: gl.constexpr = k_desc.block_type.shape[-1]  # the split ring's high columns start here
    v_tail = v_ready.index(STAGES)
    for j in range(n_tiles):
        i = g0 + j
        s = i % STAGES
        reuse_phase = ((i // STAGES) & 1) ^ 1  # the consumers' release of this slot's previous tile
        tile = _key_tile(j, n_lo, lists, SUB)
        row = kv_row0 + tile * BLOCK_N
        mbarrier.wait(k_empty.index(s), reuse_phase, pred=i >= STAGES)
        mbarrier.expect(k_ready.index(s), k_bytes)
        _load_rows(k_desc, row, kv_col, k_ready.index(s), k_smem.index(s))
        if kv_hi is not None:
            _load_rows(kv_hi[0], row, kv_col, k_ready.index(s), kv_hi[2].index(s), C_HI)
        mbarrier.wait(v_empty.index(s), reuse_phase, pred=i >= STAGES)
        if KV_TAIL and (tile + 1) * BLOCK_N > seqlen_k:
            mbarrier.expect(v_tail, v_bytes)
            _load_rows(v_desc, row, kv_col, v_tail, v_smem.index(s))
            if kv_hi is not None:
                _load_rows(kv_hi[1], row, kv_col, v_tail, kv_hi[3].index(s), C_HI)
            mbarrier.wait(v_tail, tails & 1)
            tails += 1
            _zero_v_tail(v_smem.index(s), seqlen_k - tile * BLOCK_N, BLOCK_N, v_desc.block_type.shape[-1])
            if kv_hi is not None:
                _zero_v_tail(kv_hi[3].index(s), seqlen_k - tile * BLOCK_N, BLOCK_N,
                             kv_hi[1].block_type.shape[-1])
            mbarrier.arrive(v_ready.index(s), count=1)
        elif V_T:
            mbarrier.expect(v_ready.index(s), v_bytes)
            tma.async_copy_global_to_shared(v_desc, [vt_row0, tile * BLOCK_N], v_ready.index(s), v_smem.index(s))
        else:
            mbarrier.expect(v_ready.index(s), v_bytes)
            _load_rows(v_desc, row, kv_col, v_ready.index(s), v_smem.index(s))
            if kv_hi is not None:
                _load_rows(kv_hi[1], row, kv_col, v_ready.index(s), kv_hi[3].index(s), C_HI)
    return tails



@gluon.jit
def _stamp(trace, section, EVENT: gl.constexpr):
    """The SM's cycle counter (``%clock64``) into ``trace[section * TRACE_EVENTS + EVENT]``, the schedule
    record of ``hopper_fwd_kernel``'s ``Trace``; nothing without one (``trace`` None)."""
    if trace is not None:
        t = gl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=gl.int64, is_pure=False, pack=1)
        gl.store(trace + section * TRACE_EVENTS + EVENT, t)



@gluon.constexpr_function
def _marker_asm():
    return f"mov.b32 $0, $1; // {PTX_BARRIERS_MARKER.value}"



@gluon.jit
def _ptx_barriers_marker(x):
    """The comment that asks ``ioattn.kernels.ptx_barriers`` to run on this kernel's PTX (``PTX_BARRIERS``),
    carried by a move of ``x`` (an int32 tensor) that nothing reads (not pure: it stays)."""
    gl.inline_asm_elementwise(_marker_asm(), "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)



@gluon.jit
def _issue_pv(o, alpha, p, v_smem, v_ready, i, o_layout: gl.constexpr, p_layout: gl.constexpr,
              STAGES: gl.constexpr):
    """Rescale the finished accumulator by alpha and issue O += P(i) V(i) asynchronously."""
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    cur = i % STAGES
    mbarrier.wait(v_ready.index(cur), (i // STAGES) & 1)
    return _pv_mma(o, p16, v_smem, i, STAGES)



@gluon.jit
def _pv_mma(o, p16, v_smem, i, STAGES: gl.constexpr):
    """Issue O += P(i) V(i) asynchronously (P from registers, V(i) from its ring slot, already landed)."""
    return warpgroup_mma(p16, _v_operand(v_smem.index(i % STAGES)), o, is_async=True)



@gluon.jit
def _v_operand(v_tile):
    """The P V product's B operand: the [BLOCK_N, HEAD_DIM] V tile, or for FP8 the transposed view of
    its [HEAD_DIM, BLOCK_N] V^T tile (8-bit wgmma reads B only K-major: the keys contiguous)."""
    if v_tile.dtype == gl.float8e4nv:
        operand = v_tile.permute((1, 0))
    else:
        operand = v_tile
    return operand



@gluon.jit
def _p_operand(p, dtype: gl.constexpr, layout: gl.constexpr, p_smem=None):
    """P as the P V product's A operand in ``dtype``: registers in ``layout`` (16-bit), or e4m3 P in the
    warpgroup's shared buffer ``p_smem``, written here (the caller does so only once the previous P V has
    retired); e4m3 P comes ``P_SCALE`` times larger from the softmax (``P_LOG2``), into e4m3's normal
    range. (e4m3 P as the register operand, kept alive past the wait by a move, measured slower:
    docs/decisions/fp8-forward.md.)"""
    if p_smem is not None:
        gl.static_assert(dtype == gl.float8e4nv, "P through shared memory: e4m3")
        p_smem.store(p.to(dtype))
        fence_async_shared()  # each thread's writes before the wgmma's reads (the async proxy)
        gl.thread_barrier()  # the whole warpgroup's rows
        operand = p_smem
    else:
        operand = gl.convert_layout(p.to(dtype), layout)
    return operand



@gluon.jit
def _pv_wait(o_tok, p_op, p_smem=None):
    """Wait for P(i) V(i): its accumulator, with P's registers kept alive until then (16-bit P; e4m3 P
    in shared memory, ``p_smem``, needs nothing)."""
    if p_smem is not None:
        o = warpgroup_mma_wait(0, deps=[o_tok])
    else:
        o, p_op = warpgroup_mma_wait(0, deps=[o_tok, p_op])
    return o, p_op



@gluon.jit
def _pv_mma_split(o, o_hi, p16, v_smem, i, STAGES: gl.constexpr, v_hi=None):
    """Issue O += P(i) V(i) over three quarters of the tile's columns asynchronously, as two products
    (two commit groups): ``o`` the first half (0:128 of 256, 0:64 of 128), ``o_hi`` the next quarter.
    ``v_hi``: the split ring's high columns (``_split_ring``), ``v_smem`` then 128 wide."""
    v = v_smem.index(i % STAGES)
    LO: gl.constexpr = o.shape[1]
    if v_hi is None:
        v_h = v.slice(LO, o_hi.shape[1], dim=1)
    else:
        v_h = v_hi.index(i % STAGES)
    lo = warpgroup_mma(p16, v.slice(0, LO, dim=1), o, is_async=True)
    hi = warpgroup_mma(gl.convert_layout(p16, gl.DotOperandLayout(0, o_hi.type.layout, 2), assert_trivial=True),
                       v_h, o_hi, is_async=True)
    return lo, hi



@gluon.jit
def _cols_join(a, b):
    """[a | b]: two accumulators of one warpgroup's rows side by side, in the wider product's layout
    (a register renaming: the wgmma layout's column bits above the narrower width are register bits)."""
    M: gl.constexpr = a.shape[0]
    N: gl.constexpr = a.shape[1]
    ab = gl.join(a, b).permute((0, 2, 1)).reshape([M, 2 * N])
    return gl.convert_layout(ab, _wg_acc_layout(2 * N), assert_trivial=True)



@gluon.jit
def _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om,
              o_layout: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr, ROW_STORES: gl.constexpr = 0,
              stage=None, o_desc=None, b=None, IO_DIM: gl.constexpr = 0, out_scale=None):
    """Normalise once and store ``ROWS`` rows of output and lse from row ``m_start``; rows that saw
    no key give 0 and lse -inf; rows past ``seqlen_q`` are not stored. ``ROW_STORES``: the output
    stored as whole rows, 16 bytes a thread, converted first through shared memory: 1, Triton's
    layout conversion (its own scratch); 2, written to ``stage`` (a dead [ROWS, HEAD_DIM] buffer of
    the output's dtype: the warpgroup's Q, whose last reader has retired) and read back by rows;
    3 (the persistent kernel), written to ``stage`` and stored from there by one TMA bulk copy
    (``o_desc``: the output as (batch, seqlen_q, nheads * d), [1, ROWS, HEAD_DIM] boxes, so the copy
    itself drops the rows past ``seqlen_q``; ``b``: the batch index). The copy runs on after the
    return: the stage's next writer (the warpgroup's Q load) waits for its reads
    (``tma.store_wait``; ``_persistent_consumer``). ``IO_DIM`` (``_io_dim``): the output's head dim where
    it is below HEAD_DIM: its columns alone are stored (a 4-D ``o_desc``, ``_store_rows_tma``).
    ``out_scale`` (FP8): the output's factor besides 1 / l (V's descale)."""
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    lse_rows = m_start + rows_1d
    gl.store(Lse + lse_base + lse_rows, lse, mask=lse_rows < seqlen_q)
    # one division a row, then a multiply an element (as the portable kernel's epilogue): a division
    # an element compiled to a few instructions each (range scaling, reciprocal, select), ~184 more in
    # a warpgroup's code at d = 128 (docs/decisions/forward-output-stores.md)
    if out_scale is None:
        o = o * gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))[:, None]
    else:
        o = o * gl.convert_layout(out_scale / l_safe, gl.SliceLayout(1, o_layout))[:, None]
    o16 = o.to(Out.dtype.element_ty)
    if ROW_STORES:
        row_threads: gl.constexpr = HEAD_DIM // 8  # <= 32: HEAD_DIM <= 256
        st_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // row_threads, row_threads], [gl.num_warps(), 1],
                                                   [1, 0])
        if ROW_STORES == 3:
            gl.static_assert(stage.shape[0] == ROWS and stage.shape[1] == HEAD_DIM, "a ROWS x HEAD_DIM buffer")
            stage.store(o16)
            fence_async_shared()  # each thread's writes before the bulk copy's reads (the async proxy)
            gl.thread_barrier()
            _store_rows_tma(o_desc, b, m_start, q_col, stage)
        else:
            if ROW_STORES == 2:
                gl.static_assert(stage.shape[0] == ROWS and stage.shape[1] == HEAD_DIM, "a ROWS x HEAD_DIM buffer")
                stage.store(o16)
                gl.thread_barrier()  # this warpgroup's rows, written in the accumulator layout, read back by rows
                o16 = stage.load(st_layout)
            else:
                o16 = gl.convert_layout(o16, st_layout)
            _store_tile(Out, o16, m_start, q_row0, q_col, seqlen_q, stride_om, st_layout, ROWS, HEAD_DIM, IO_DIM)
    else:
        _store_tile(Out, o16, m_start, q_row0, q_col, seqlen_q, stride_om, o_layout, ROWS, HEAD_DIM, IO_DIM)



@gluon.jit
def _store_tile(Out, o16, m_start, q_row0, q_col, seqlen_q, stride_om, layout: gl.constexpr, ROWS: gl.constexpr,
                HEAD_DIM: gl.constexpr, IO_DIM: gl.constexpr = 0):
    """``ROWS`` rows of output (``o16``, in ``layout``) from row ``m_start``, rows past seqlen_q masked
    (and with ``IO_DIM``, the columns past the output's head dim)."""
    o_rows = m_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, layout))
    ptrs = Out + (q_row0 - m_start + o_rows).to(gl.int64)[:, None] * stride_om + q_col + o_cols[None, :]
    if IO_DIM:
        gl.store(ptrs, o16, mask=(o_rows < seqlen_q)[:, None] & (o_cols < IO_DIM)[None, :])
    else:
        gl.store(ptrs, o16, mask=(o_rows < seqlen_q)[:, None])



@gluon.jit
def _store_rows_tma(o_desc, b, m_start, q_col, stage):
    """The bulk copy of ``stage`` ([ROWS, HEAD_DIM], the finished output rows from ``m_start`` of batch
    element ``b``, head column ``q_col``) to global memory: ``o_desc`` is the output as (batch, seqlen_q,
    nheads * d) in [1, ROWS, HEAD_DIM] boxes, or (a head dim d below HEAD_DIM, ``gluon_fwd.padded_rows_desc``)
    the same view with its column split into 8-column groups and an offset bounded by d, in [1, 1, ROWS,
    HEAD_DIM] boxes; the copy drops what lies past the bounds (rows past seqlen_q, columns past d)."""
    ROWS: gl.constexpr = stage.shape[0]
    HEAD_DIM: gl.constexpr = stage.shape[1]
    if len(o_desc.block_type.shape) == 4:
        tma.async_copy_shared_to_global(o_desc, [q_col // 8, b, m_start, 0], stage.reshape([1, 1, ROWS, HEAD_DIM]))
    else:
        tma.async_copy_shared_to_global(o_desc, [b, m_start, q_col], stage.reshape([1, ROWS, HEAD_DIM]))



@gluon.jit
def _consumer(q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Out, Lse,
              q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, stride_lse_h, lse_base,
              qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr, EXP2_FMA: gl.constexpr,
              ROW_STORES: gl.constexpr, KEY_MASKS: gl.constexpr = True, IO_DIM: gl.constexpr = 0):
    num_warps: gl.constexpr = gl.num_warps()
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_1d = gl.arange(0, BLOCK_M, layout=row_layout)
    cols_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _load_rows(q_desc, q_row0, q_col, q_bar, q_smem)
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = warpgroup_mma_init(gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout))

    # S(0)
    mbarrier.wait(k_ready.index(0), 0)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0), count=1)

    for i in range(n_tiles - 1):
        # S(i+1) in flight while the softmax of S(i) runs
        nxt = (i + 1) % STAGES
        mbarrier.wait(k_ready.index(nxt), ((i + 1) // STAGES) & 1)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        n_start = (n_lo + i) * BLOCK_N
        # under a causal mask only the tiles that reach past the block's first row's diagonal need it
        if MASK_ALL and n_start + BLOCK_N - 1 > m_start + seqlen_k - seqlen_q:
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d,
                                               cols_1d, True, IS_CAUSAL, False, EXP2_FMA)
        else:
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d,
                                               cols_1d, False, IS_CAUSAL, False, EXP2_FMA)
        # P(i-1) V(i-1) done (S(i+1) may still run): rescale, then issue P(i) V(i)
        o = warpgroup_mma_wait(1, deps=[acc])
        mbarrier.arrive(v_empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)
        acc = _issue_pv(o, alpha, p, v_smem, v_ready, i, o_layout, p_layout, STAGES)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(nxt), count=1)

    # the last tile (it also carries the key-end and diagonal masks)
    last = n_tiles - 1
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, (n_lo + last) * BLOCK_N, seqlen_q, seqlen_k,
                                       rows_1d, cols_1d, KEY_MASKS, IS_CAUSAL, False, EXP2_FMA)
    o = warpgroup_mma_wait(0, deps=[acc])
    acc = _issue_pv(o, alpha, p, v_smem, v_ready, last, o_layout, p_layout, STAGES)
    o = warpgroup_mma_wait(0, deps=[acc])

    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om, o_layout,
              BLOCK_M, HEAD_DIM, ROW_STORES, IO_DIM=IO_DIM)



@gluon.jit
def _turn_wait(my_turn, section, TURN0: gl.constexpr, ORDERED: gl.constexpr):
    """Block until this warpgroup may issue the GEMMs of its ``section``-th critical section (a no-op
    when not ``ORDERED``: the "split" diagnostic variant, free-running consumer warpgroups).

    The ``NUM_WG`` consumer warpgroups form a ring: ``turn[w]`` gets one arrive from warpgroup w - 1 at
    the end of each of its sections, so sections run in one global order, WG0#0, WG1#0, ..., WG0#1, ...
    WG w >= 1 waits for completion k of its barrier (``TURN0 = 0``); WG0 at k >= 1 for completion k - 1
    (``TURN0 = 1``), WG0#0 not at all. Every turn barrier is at most one phase ahead of its waiter (no
    parity aliasing), and each wait names an earlier section (no deadlock): the argument is in
    docs/hopper-forward.md, "The ping-pong protocol"."""
    if ORDERED:
        mbarrier.wait(my_turn, (section + TURN0) & 1, pred=(section > 0) | (TURN0 == 0))



@gluon.jit
def _turn_pass(next_turn, ORDERED: gl.constexpr):
    """End of a critical section: the GEMMs are issued (Triton puts a barrier over this partition's
    four warps before the single-thread arrive, so all four have issued), the next warpgroup's turn
    (``turn[(w + 1) % NUM_WG]``)."""
    if ORDERED:
        mbarrier.arrive(next_turn, count=1)



@gluon.jit
def _pingpong_consumer(q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn,
                       Out, Lse, q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, lse_base,
                       qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr, TURN0: gl.constexpr,
                       ORDERED: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr,
                       RESCALE_BY_WARP: gl.constexpr, Q_IN_REGS: gl.constexpr, DEFERRED_SUM: gl.constexpr,
                       MASK_BRANCH: gl.constexpr, PTX_BARRIERS: gl.constexpr, EXP2_FMA: gl.constexpr,
                       ROW_STORES: gl.constexpr, FEWER_MASKS: gl.constexpr = False,
                       KEY_MASKS: gl.constexpr = True, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                       SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False, alibi_a=0.0,
                       IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, kv_hi=None, out_scale=None,
                       p_smem=None, trace=None, mods=None, lists=None, SCORE_MOD: gl.constexpr = None,
                       MASK_MOD: gl.constexpr = None, SUB: gl.constexpr = 1, k_scales=None):
    """One consumer warpgroup of the ping-pong (``NUM_WG`` = 2) or three-warpgroup ring (3) variant:
    ``BLOCK_M`` (= 64) query rows of its own, the K/V ring shared with the other consumer warpgroups.

    Per key tile it issues, inside a critical section ordered against the other warpgroups
    (``_turn_wait`` ... arrive on ``next_turn``), S(i+1) = Q K(i+1)^T and O += P(i) V(i), then leaves
    the section and runs the softmax of S(i+1) while its own P(i) V(i) and the other warpgroups' GEMMs
    occupy the tensor cores. n + 1 sections a warpgroup (n = the CTA's key-tile count, the same for
    all); K(t) released after S(t)'s wait, V(t) after P(t) V(t)'s; K / V readiness waited for before
    taking the turn. Why this cannot deadlock or alias a parity, and how fully masked tiles and rows
    with no key come out: docs/hopper-forward.md, "The ping-pong protocol". ``trace``: this
    warpgroup's row of the schedule record (``_stamp``), or None. ``mods``, ``lists``, ``SCORE_MOD``,
    ``MASK_MOD``, ``SUB``: the user's functions and block mask; ``k_scales``: FP8 keys' block descales
    (``_pp_mainloop``)."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _load_rows(q_desc, q_row0, q_col, q_bar, q_smem)
    mbarrier.wait(q_bar, 0)
    o, m_i, l_i = _pp_mainloop(q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn,
                               m_start, seqlen_q, seqlen_k, n_lo, n_tiles, qk_scale, 0, 0, HEAD_DIM, BLOCK_M, BLOCK_N,
                               STAGES, IS_CAUSAL, MASK_ALL, TURN0, ORDERED, LEAN, COND_RESCALE, RESCALE_BY_WARP,
                               Q_IN_REGS, DEFERRED_SUM, MASK_BRANCH, PTX_BARRIERS, False, EXP2_FMA, FEWER_MASKS,
                               KEY_MASKS, False, WINDOW, win_left, win_right, SOFTCAP, softcap_a, ALIBI, alibi_a,
                               PROD_DIM, kv_hi, p_smem, trace, mods, lists, SCORE_MOD, MASK_MOD, SUB,
                               k_scales=k_scales)
    MMA_K: gl.constexpr = _mma_k(q_desc.dtype)
    rows_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, _wg_acc_layout(BLOCK_N, MMA_K)))
    # ROW_STORES 2: staged in this warpgroup's Q buffer (its S products all retired in the key loop)
    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om,
              _wg_acc_layout(HEAD_DIM, MMA_K), BLOCK_M, HEAD_DIM, ROW_STORES, q_smem, IO_DIM=IO_DIM,
              out_scale=out_scale)



@gluon.jit
def _issue_s0(q_op, k_smem, k_ready, my_turn, next_turn, g0, sec0, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, TURN0: gl.constexpr, ORDERED: gl.constexpr, PD: gl.constexpr, k_hi=None):
    """A tile's critical section #0 (``_pp_mainloop``): S(0) = Q K(0)^T issued once K(0) has landed and
    the turn is this warpgroup's; returns its token. ``q_op``: Q's shared-memory buffer, or its
    registers (``Q_IN_REGS``). ``PD``, ``k_hi`` (the ring's): ``_qk_mma``'s."""
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=_wg_acc_layout(BLOCK_N, _mma_k(k_smem.dtype)))
    mbarrier.wait(k_ready.index(g0 % STAGES), (g0 // STAGES) & 1)
    _turn_wait(my_turn, sec0, TURN0, ORDERED)
    s_tok = _qk_mma(q_op, k_smem.index(g0 % STAGES), s_zero, PD, k_hi, g0 % STAGES)
    _turn_pass(next_turn, ORDERED)
    return s_tok



@gluon.constexpr_function
def _wg_acc_layout(cols, k=16):
    """The wgmma accumulator layout of one warpgroup's (64 rows x ``cols``) product: S (``cols`` =
    BLOCK_N) and O (``cols`` = HEAD_DIM) of a ping-pong consumer. ``k``: the instruction's depth, 16
    for 16-bit operands, 32 for 8-bit (``_mma_k``)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, k])



@gluon.constexpr_function
def _mma_k(dtype):
    """A wgmma instruction's depth for operands of ``dtype``: 32 bytes of them."""
    return 32 if dtype == gl.float8e4nv else 16



@gluon.jit
def _pp_mainloop(q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn, m_start, seqlen_q,
                 seqlen_k, n_lo, n_tiles, qk_scale, g0, sec0, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr,
                 TURN0: gl.constexpr, ORDERED: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr,
                 RESCALE_BY_WARP: gl.constexpr, Q_IN_REGS: gl.constexpr, DEFERRED_SUM: gl.constexpr,
                 MASK_BRANCH: gl.constexpr, PTX_BARRIERS: gl.constexpr, RELEASE_LAST: gl.constexpr,
                 EXP2_FMA: gl.constexpr, FEWER_MASKS: gl.constexpr = False, KEY_MASKS: gl.constexpr = True,
                 DIAG_TRIM: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                 SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False, alibi_a=0.0,
                 PROD_DIM: gl.constexpr = 0, kv_hi=None, p_smem=None, trace=None, mods=None, lists=None,
                 SCORE_MOD: gl.constexpr = None, MASK_MOD: gl.constexpr = None, SUB: gl.constexpr = 1,
                 k_scales=None):
    """One query tile's key loop for one ping-pong warpgroup (Q already in ``q_smem``): returns the
    unnormalised (O, m, l). ``g0``: ring uses before this tile, ``sec0``: this warpgroup's critical
    sections before it (both 0 for a one-tile program; a persistent program's running counts), so
    slots, phases and turns continue across tiles. ``RELEASE_LAST``: release the last V slot too (a
    persistent program reloads it). ``FEWER_MASKS`` / ``KEY_MASKS``: which tiles take the masked
    softmax. ``DIAG_TRIM``: this warpgroup computes only the key tiles its own rows see
    (``_kv_tile_count``) and passes the sections of the rest (``_pp_skip``), so both warpgroups still run
    n_tiles + 1 sections and release every slot. ``WINDOW`` / ``SOFTCAP`` / ``ALIBI`` (one-tile
    programs): the window's band from ``n_lo``, tiles an edge crosses masked; each score tile capped
    (``_softcap``, ``qk_scale`` = cap * log2 e) and biased (``_alibi``) before the masks. ``PROD_DIM``:
    the products over 192 of 256 or 96 of 128 columns (S two chained products, O two accumulators
    returned side by side with the unused columns' zeros); ``kv_hi``: the split ring's (k_hi, v_hi).
    ``p_smem``: e4m3 P's buffer (``_p_operand``). ``trace``: the schedule record's row (``_stamp``; the
    one-tile kernels). ``SCORE_MOD`` / ``MASK_MOD`` with ``mods`` (``_mods_tile``; non-causal one-tile
    programs): the score function on every score tile, the mask function and the key end
    (``KEY_MASKS``) on the first and then only where a tile needs them (``_mods_softmax``), so the
    built-in masks stay off; ``lists``: a block mask's walk (``_key_tile``, ``SUB``).
    ``LEAN`` and its options (``COND_RESCALE``, ``RESCALE_BY_WARP``, ``Q_IN_REGS``, ``DEFERRED_SUM``,
    ``MASK_BRANCH``, ``PTX_BARRIERS``): the kernel's. The options: docs/hopper-forward.md. ``k_scales``
    (FP8 block descales): this head's K descales per block of ``FP8_BLOCK_ROWS`` keys, each tile's read
    a tile ahead and folded into its scale (``_key_block_scale``)."""
    PD: gl.constexpr = _prod_dim(HEAD_DIM, PROD_DIM)
    MODS: gl.constexpr = SCORE_MOD is not None or MASK_MOD is not None
    gl.static_assert(not MODS or not (IS_CAUSAL or WINDOW or SOFTCAP or ALIBI or DIAG_TRIM or FEWER_MASKS),
                     "score and mask functions: the one-tile kernels without built-in masks or modifications")
    SOFTMAX_MASKS: gl.constexpr = KEY_MASKS and not MODS  # with MODS, _mods_tile masks the key end
    k_hi = None if kv_hi is None else kv_hi[0]
    v_hi = None if kv_hi is None else kv_hi[1]
    SPLIT: gl.constexpr = PD != HEAD_DIM
    PV_GROUPS: gl.constexpr = 2 if SPLIT else 1  # commit groups of one P V (groups retire in order)
    gl.static_assert(not (SPLIT and Q_IN_REGS), "the split products read Q from shared memory")
    gl.static_assert(not WINDOW or (KEY_MASKS and not IS_CAUSAL and not DIAG_TRIM),
                     "a sliding window: masked tiles, not causal (the window (-1, 0) is), one-tile programs")
    num_warps: gl.constexpr = gl.num_warps()
    gl.static_assert(num_warps == 4, "a ping-pong consumer is one warpgroup")
    gl.static_assert(STAGES >= 2, "S(i+1) and P(i) V(i) are in flight together")
    MMA_K: gl.constexpr = _mma_k(v_smem.dtype)
    s_layout: gl.constexpr = _wg_acc_layout(BLOCK_N, MMA_K)
    O_COLS: gl.constexpr = HEAD_DIM // 2 if SPLIT else HEAD_DIM  # the (first) accumulator's columns
    o_layout: gl.constexpr = _wg_acc_layout(O_COLS, MMA_K)
    dtype: gl.constexpr = v_smem.dtype
    # e4m3 P: the softmax's max kept log2(P_SCALE) low, so P comes out P_SCALE times larger (``_softmax_tile``)
    P_LOG2: gl.constexpr = P_SCALE_LOG2 if dtype == gl.float8e4nv else 0
    # a 32-bit register of P's operand holds 4 e4m3 or 2 bf16 values
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout,
                                                 k_width=4 if dtype == gl.float8e4nv else 2)
    gl.static_assert(dtype != gl.float8e4nv or not (SPLIT or Q_IN_REGS), "FP8: whole products, Q in shared memory")
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_1d = gl.arange(0, BLOCK_M, layout=row_layout)
    cols_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if DEFERRED_SUM:
        l_i = _thread_row_sums(s_zero)
    else:
        l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    o = gl.zeros([BLOCK_M, O_COLS], gl.float32, layout=o_layout)
    if SPLIT:  # O's columns O_COLS:PD
        o_hi = gl.zeros([BLOCK_M, PD - O_COLS], gl.float32, layout=_wg_acc_layout(PD - O_COLS))
    diag = m_start + seqlen_k - seqlen_q  # the last key column this warpgroup's first row may see
    if ALIBI:  # each row's diagonal key (an integer: ``_alibi`` converts the differences)
        diag_rows = diag + rows_1d
        cols_f = cols_1d.to(gl.float32) if ALIBI == ALIBI_FP32_COLS else cols_1d
    else:
        diag_rows: gl.constexpr = None
        cols_f: gl.constexpr = None
    if PTX_BARRIERS:
        _ptx_barriers_marker(rows_1d)
    if Q_IN_REGS:  # Q as the products' register operand: loaded once a tile
        q_op = q_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        q_op = q_smem

    # section #0: S(0); its softmax runs outside the turn
    s_tok = _issue_s0(q_op, k_smem, k_ready, my_turn, next_turn, g0, sec0, BLOCK_M, BLOCK_N, STAGES, TURN0, ORDERED,
                      PD, k_hi)
    _stamp(trace, 0, 0)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    _stamp(trace, 0, 1)
    mbarrier.arrive(k_empty.index(g0 % STAGES), count=1)
    n0 = _key_tile(0, n_lo, lists, SUB) * BLOCK_N
    tile_qk, tile_cap = _key_block_scale(k_scales, n0, qk_scale, softcap_a, SOFTCAP)
    s = _score_tile(s, 0, n0, m_start, seqlen_k, rows_1d, cols_1d, SOFTCAP, tile_cap, ALIBI, alibi_a, diag_rows,
                    cols_f, MODS, mods, lists, SCORE_MOD, MASK_MOD, KEY_MASKS)
    KEY_END: gl.constexpr = not (FEWER_MASKS and IS_CAUSAL)
    if FEWER_MASKS:
        need_mask = n_tiles == 1
        if MASK_ALL:
            need_mask = need_mask | (n0 + BLOCK_N - 1 > diag)
        if WINDOW:
            need_mask = need_mask | _window_cuts(n0, m_start, seqlen_q, seqlen_k, win_left, win_right,
                                                 BLOCK_M, BLOCK_N)
        p, alpha, m_i, l_i = _step_softmax(s, need_mask, m_i, l_i, tile_qk, m_start, n0, seqlen_q,
                                           seqlen_k, rows_1d, cols_1d, IS_CAUSAL, LEAN, COND_RESCALE, DEFERRED_SUM,
                                           MASK_BRANCH, EXP2_FMA, KEY_END, True, SOFTMAX_MASKS, WINDOW, win_left,
                                           win_right, P_LOG2=P_LOG2)
    else:
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, tile_qk, m_start, n0, seqlen_q, seqlen_k,
                                           rows_1d, cols_1d, SOFTMAX_MASKS, IS_CAUSAL, LEAN, COND_RESCALE, DEFERRED_SUM,
                                           EXP2_FMA, True, WINDOW, win_left, win_right, P_LOG2=P_LOG2)
    _stamp(trace, 0, 2)
    p16 = _p_operand(p, dtype, p_layout, p_smem)  # O is still 0: no rescale

    n_own = n_tiles  # key tiles this warpgroup computes
    if DIAG_TRIM:
        gl.static_assert(IS_CAUSAL and RELEASE_LAST, "the diagonal trimmed: causal, persistent")
        # this warpgroup's own rows' tiles, at least one (a warpgroup none of whose rows sees a key computes
        # its first tile masked, as without the trim: its rows come out empty)
        n_own = gl.maximum(gl.minimum(_kv_tile_count(m_start, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, True) - n_lo,
                                      n_tiles), 1)

    for i in range(n_own - 1):
        # section #(i+1): S(i+1) and P(i) V(i), issued back to back, then the turn passes on
        nxt = (g0 + i + 1) % STAGES
        cur = (g0 + i) % STAGES
        if k_scales is not None:  # S(i+1)'s key block descale, read before its product is issued
            tile_qk, tile_cap = _key_block_scale(k_scales, _key_tile(i + 1, n_lo, lists, SUB) * BLOCK_N, qk_scale,
                                                 softcap_a, SOFTCAP)
        mbarrier.wait(k_ready.index(nxt), ((g0 + i + 1) // STAGES) & 1)
        mbarrier.wait(v_ready.index(cur), ((g0 + i) // STAGES) & 1)
        _turn_wait(my_turn, sec0 + i + 1, TURN0, ORDERED)
        _stamp(trace, i + 1, 0)
        s_tok = _qk_mma(q_op, k_smem.index(nxt), s_zero, PD, k_hi, nxt)
        if SPLIT:
            o_tok, oh_tok = _pv_mma_split(o, o_hi, p16, v_smem, g0 + i, STAGES, v_hi)
        else:
            o_tok = _pv_mma(o, p16, v_smem, g0 + i, STAGES)
        _turn_pass(next_turn, ORDERED)
        # S(i+1) done (groups retire in order; P(i) V(i) may still run)
        s = warpgroup_mma_wait(PV_GROUPS, deps=[s_tok])
        _stamp(trace, i + 1, 1)
        mbarrier.arrive(k_empty.index(nxt), count=1)
        n_start = _key_tile(i + 1, n_lo, lists, SUB) * BLOCK_N
        if MODS:  # the score function on every tile, the mask only where the tile needs it
            s = _score_tile(s, i + 1, n_start, m_start, seqlen_k, rows_1d, cols_1d, False, softcap_a, False, alibi_a,
                            diag_rows, cols_f, MODS, mods, lists, SCORE_MOD, None, False)
            p, alpha, m_i, l_i = _mods_softmax(s, i + 1, lists, mods, m_i, l_i, qk_scale, m_start, n_start, seqlen_q,
                                               seqlen_k, rows_1d, cols_1d, MASK_MOD, KEY_MASKS, LEAN, COND_RESCALE,
                                               DEFERRED_SUM, EXP2_FMA)
        else:
            s = _score_tile(s, i + 1, n_start, m_start, seqlen_k, rows_1d, cols_1d, SOFTCAP, tile_cap, ALIBI,
                            alibi_a, diag_rows, cols_f, MODS, mods, lists, SCORE_MOD, MASK_MOD, KEY_MASKS)
            # masks: the last tile always (key end, diagonal); under a causal mask also a tile that
            # reaches past this warpgroup's first row's diagonal
            need_mask = i + 1 == n_tiles - 1
            if MASK_ALL:
                need_mask = need_mask | (n_start + BLOCK_N - 1 > diag)
            if WINDOW:
                need_mask = need_mask | _window_cuts(n_start, m_start, seqlen_q, seqlen_k, win_left, win_right,
                                                     BLOCK_M, BLOCK_N)
            p, alpha, m_i, l_i = _step_softmax(s, need_mask, m_i, l_i, tile_qk, m_start, n_start, seqlen_q,
                                               seqlen_k, rows_1d, cols_1d, IS_CAUSAL, LEAN, COND_RESCALE,
                                               DEFERRED_SUM, MASK_BRANCH, EXP2_FMA, KEY_END, False, SOFTMAX_MASKS,
                                               WINDOW, win_left, win_right, P_LOG2=P_LOG2)
        _stamp(trace, i + 1, 2)
        # P(i) V(i) done: P(i)'s registers may go (listed so they stay alive until here), V(i)'s slot too.
        # (With KEY_MASKS False, no branch above, ptxas hoists this wait to just after S(i+1)'s: the
        # softmax then runs after this warpgroup's P V, not beside it; docs/decisions/forward-masked-tiles.md)
        if SPLIT:
            o, o_hi, p16 = warpgroup_mma_wait(0, deps=[o_tok, oh_tok, p16])
            o_hi = _rescale_rows(o_hi, alpha, COND_RESCALE, RESCALE_BY_WARP)
        else:
            o, p16 = _pv_wait(o_tok, p16, p_smem)
        _stamp(trace, i + 1, 3)
        mbarrier.arrive(v_empty.index(cur), count=1)
        o = _rescale_rows(o, alpha, COND_RESCALE, RESCALE_BY_WARP)
        p16 = _p_operand(p, dtype, p_layout, p_smem)

    # section #n: the last P(n-1) V(n-1)
    last = g0 + n_own - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    _turn_wait(my_turn, sec0 + n_own, TURN0, ORDERED)
    _stamp(trace, n_own, 0)
    if SPLIT:
        o_tok, oh_tok = _pv_mma_split(o, o_hi, p16, v_smem, last, STAGES, v_hi)
        _turn_pass(next_turn, ORDERED)
        o, o_hi, p16 = warpgroup_mma_wait(0, deps=[o_tok, oh_tok, p16])
        # O over the tile's whole width: the columns past PD are 0 (the epilogue stores IO_DIM of them)
        o = _cols_join(o, _cols_join(o_hi, gl.zeros_like(o_hi)))
    else:
        o_tok = _pv_mma(o, p16, v_smem, last, STAGES)
        _turn_pass(next_turn, ORDERED)
        o, p16 = _pv_wait(o_tok, p16, p_smem)
    _stamp(trace, n_own, 3)
    if RELEASE_LAST:
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
    if DIAG_TRIM:  # the tiles past this warpgroup's own: their sections and slots
        _pp_skip(k_ready, k_empty, v_ready, v_empty, my_turn, next_turn, g0, sec0, n_own, n_tiles, STAGES, TURN0,
                 ORDERED)
    if DEFERRED_SUM:  # the quad's sum of the threads' partial row sums, once a tile
        l_i = gl.convert_layout(gl.sum(l_i, 1), row_layout, assert_trivial=True)
    return o, m_i, l_i



@gluon.jit
def _key_block_scale(k_scales, n_start, qk_scale, softcap_a, SOFTCAP: gl.constexpr):
    """(qk_scale, softcap_a) for the key tile from ``n_start``: as given, or with FP8 block descales
    (``k_scales``: this head's K descales per block of ``FP8_BLOCK_ROWS`` keys, which ``BLOCK_N``
    divides) times that tile's, folded where the raw scores are scaled (into the softcap's factor
    with ``SOFTCAP``)."""
    if k_scales is not None:
        kd = gl.load(k_scales + n_start // FP8_BLOCK_ROWS)
        if SOFTCAP:
            softcap_a = softcap_a * kd
        else:
            qk_scale = qk_scale * kd
    return qk_scale, softcap_a


@gluon.jit
def _score_tile(s, j, n_start, m_start, seqlen_k, rows_1d, cols_1d, SOFTCAP: gl.constexpr, softcap_a,
                ALIBI: gl.constexpr, alibi_a, diag_rows, cols_f, MODS: gl.constexpr, mods, lists,
                SCORE_MOD: gl.constexpr, MASK_MOD: gl.constexpr, KEY_MASKS: gl.constexpr):
    """Key tile ``j``'s scores (from key ``n_start``) as the softmax takes them: capped (``_softcap``),
    biased (``_alibi``), and through the user's functions (``_mods_tile``; on a block mask's full
    blocks the score function alone)."""
    if SOFTCAP:
        s = _softcap(s, softcap_a)
    if ALIBI:
        s = _alibi(s, alibi_a, diag_rows - n_start, cols_1d, cols_f, ALIBI)
    if MODS:
        s = _mods_tile(s, mods, m_start, n_start, seqlen_k, rows_1d, cols_1d, _full_tile(j, lists), SCORE_MOD,
                       MASK_MOD, KEY_MASKS)
    return s


@gluon.jit
def _pp_skip(k_ready, k_empty, v_ready, v_empty, my_turn, next_turn, g0, sec0, n_own, n_tiles, STAGES: gl.constexpr,
             TURN0: gl.constexpr, ORDERED: gl.constexpr):
    """``DIAG_TRIM``: the sections of the CTA's key tiles ``n_own`` ... ``n_tiles`` - 1, which no row of
    this warpgroup sees: each turn taken and passed on with nothing issued, each slot released once it
    has landed (a release before the load would count towards the slot's previous use)."""
    for j in range(n_own, n_tiles):
        g = g0 + j
        mbarrier.wait(k_ready.index(g % STAGES), (g // STAGES) & 1)
        mbarrier.wait(v_ready.index(g % STAGES), (g // STAGES) & 1)
        _turn_wait(my_turn, sec0 + j + 1, TURN0, ORDERED)
        _turn_pass(next_turn, ORDERED)
        mbarrier.arrive(k_empty.index(g % STAGES), count=1)
        mbarrier.arrive(v_empty.index(g % STAGES), count=1)



@gluon.jit
def _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES: gl.constexpr, RELEASERS: gl.constexpr):
    """The K/V ring's barriers: a slot is ready after one expect-tx arrive (the producer's TMA), and
    free again after ``RELEASERS`` arrives (one per consumer that reads it); ``v_ready[STAGES]`` is
    the producer's own ``v_tail`` (count 1)."""
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=RELEASERS)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=RELEASERS)
    mbarrier.init(v_ready.index(STAGES), count=1)



@gluon.jit
def _pp_shared(q_desc, k_desc, v_desc, NUM_WG: gl.constexpr, WG_ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
               HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, Q_BUFS: gl.constexpr = 1, k_hi_desc=None):
    """The ping-pong kernels' shared memory: NUM_WG x ``Q_BUFS`` Q tiles (warpgroup w's at w * Q_BUFS
    ...), the K/V ring, and their barriers, initialised (K/V slots released by every warpgroup).
    ``k_hi_desc`` (the split ring; None: whole tiles): the ring's K / V tiles are their descriptors'
    width (128 columns; the columns from 128 in ``_split_ring``'s rings)."""
    dtype: gl.constexpr = q_desc.dtype
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    KV_COLS: gl.constexpr = HEAD_DIM if k_hi_desc is None else k_desc.block_type.shape[-1]
    q_smem = gl.allocate_shared_memory(dtype, [NUM_WG * Q_BUFS, WG_ROWS, HEAD_DIM], _tile_layout(q_desc.layout))
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, KV_COLS], _tile_layout(k_desc.layout))
    if dtype == gl.float8e4nv:  # V^T tiles (``_v_operand``)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, HEAD_DIM, BLOCK_N], v_desc.layout)
    else:
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, KV_COLS], _tile_layout(v_desc.layout))
    q_bar = gl.allocate_shared_memory(gl.int64, [NUM_WG * Q_BUFS, 1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], bar_layout)  # + v_tail (_producer)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    turn = gl.allocate_shared_memory(gl.int64, [NUM_WG, 1], bar_layout)
    for w in gl.static_range(NUM_WG * Q_BUFS):
        mbarrier.init(q_bar.index(w), count=1)
    for w in gl.static_range(NUM_WG):
        mbarrier.init(turn.index(w), count=1)
    _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES, NUM_WG)  # every warpgroup releases each slot
    fence_async_shared()
    return q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn



@gluon.jit
def _split_ring(k_hi_desc, v_hi_desc, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    """The split ring's high columns (``hopper_fwd_kernel``'s ``k_hi_desc`` / ``v_hi_desc``: the
    products over 192 columns, ``PROD_DIM``): K's and V's columns 128:192 in rings of their own, beside
    ``_pp_shared``'s 128-column ones (48 KB a stage against the 256-wide tiles' 64). Returns (kv_hi,
    the producer's (k_hi_desc, v_hi_desc, k_hi, v_hi))."""
    dtype: gl.constexpr = k_hi_desc.dtype
    HI_COLS: gl.constexpr = k_hi_desc.block_type.shape[-1]
    k_hi = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HI_COLS], _tile_layout(k_hi_desc.layout))
    v_hi = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HI_COLS], _tile_layout(v_hi_desc.layout))
    return (k_hi, v_hi), (k_hi_desc, v_hi_desc, k_hi, v_hi)
