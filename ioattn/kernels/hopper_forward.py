"""Hopper forward in Gluon (FlashAttention-3 structure). EXPERIMENTAL: compiled for sm_90 in CI
(ahead of time, no GPU), not yet run on a device, never dispatched by default.

One program per (query block, batch * head), two warp-specialised partitions:

* **Producer** (1 warp, few registers): TMA bulk copies of K and V tiles into a ``STAGES``-deep
  shared-memory ring; ``k_ready``/``v_ready`` barriers complete when a tile's bytes have landed,
  ``k_empty``/``v_empty`` when the consumer has finished reading it.
* **Consumer** (the kernel's warps, one warpgroup per 64 query rows): Q arrives once by TMA; per key
  tile j it issues the asynchronous wgmma for S(j+1) = Q K(j+1)^T *before* the softmax of S(j), so
  the exponentials of one tile overlap the next tile's product (FA3's intra-warpgroup overlap), then
  waits for P(j-1) V(j-1), rescales the accumulator and issues P(j) V(j) asynchronously.

Inputs: contiguous (batch, seqlen, nheads, d) tensors seen as 2-D (batch * seqlen, nheads * d) by the
descriptors. A key tile that runs past its sequence reads the next sequence's rows (or the zero fill
at the end of the tensor): those columns are masked to -inf, and their P entries are 0, so the rows
of V they meet do not matter. Query rows past the sequence are computed and not stored (pointer
stores, masked). Causal masks are bottom-right aligned, as in the portable kernel.

Reference twin: ``ioattn.reference.tiled.flash2_forward``. Portable fallback: ``kernels/forward.py``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

LOG2E = gl.constexpr(1.4426950408889634)
LN2 = gl.constexpr(0.6931471805599453)


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
              n_tiles, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    for i in range(n_tiles):
        s = i % STAGES
        reuse_phase = ((i // STAGES) & 1) ^ 1  # the consumer's release of this slot's previous tile
        row = kv_row0 + (n_lo + i) * BLOCK_N
        mbarrier.wait(k_empty.index(s), reuse_phase, pred=i >= STAGES)
        mbarrier.expect(k_ready.index(s), k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [row, kv_col], k_ready.index(s), k_smem.index(s))
        mbarrier.wait(v_empty.index(s), reuse_phase, pred=i >= STAGES)
        mbarrier.expect(v_ready.index(s), v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(v_desc, [row, kv_col], v_ready.index(s), v_smem.index(s))


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d,
                  MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Scale (log2 domain), mask, online-softmax step: returns (p, alpha, m_new, l_new)."""
    s = s * qk_scale
    if MASKED:
        rows = (m_start + rows_1d)[:, None]
        cols = (n_start + cols_1d)[None, :]
        keep = cols < seqlen_k
        if IS_CAUSAL:
            keep = keep & (cols <= rows + (seqlen_k - seqlen_q))
        s = gl.where(keep, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 gives 0, not NaN
    p = gl.exp2(s - m_use[:, None])
    alpha = gl.exp2(m_i - m_use)
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _issue_pv(o, alpha, p, v_smem, v_ready, i, o_layout: gl.constexpr, p_layout: gl.constexpr,
              STAGES: gl.constexpr):
    """Rescale the finished accumulator by alpha and issue O += P(i) V(i) asynchronously."""
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
    p16 = gl.convert_layout(p.to(v_smem.dtype), p_layout)
    cur = i % STAGES
    mbarrier.wait(v_ready.index(cur), (i // STAGES) & 1)
    return warpgroup_mma(p16, v_smem.index(cur), o, is_async=True)


@gluon.jit
def _consumer(q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Out, Lse,
              q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, stride_lse_h, lse_base,
              qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr):
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
    tma.async_copy_global_to_shared(q_desc, [q_row0, q_col], q_bar, q_smem)
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
                                               cols_1d, True, IS_CAUSAL)
        else:
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d,
                                               cols_1d, False, IS_CAUSAL)
        # P(i-1) V(i-1) done (S(i+1) may still run): rescale, then issue P(i) V(i)
        o = warpgroup_mma_wait(1, deps=[acc])
        mbarrier.arrive(v_empty.index((i + STAGES - 1) % STAGES), count=1, pred=i > 0)
        acc = _issue_pv(o, alpha, p, v_smem, v_ready, i, o_layout, p_layout, STAGES)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(nxt), count=1)

    # the last tile (it also carries the key-end and diagonal masks)
    last = n_tiles - 1
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, (n_lo + last) * BLOCK_N, seqlen_q, seqlen_k,
                                       rows_1d, cols_1d, True, IS_CAUSAL)
    o = warpgroup_mma_wait(0, deps=[acc])
    acc = _issue_pv(o, alpha, p, v_smem, v_ready, last, o_layout, p_layout, STAGES)
    o = warpgroup_mma_wait(0, deps=[acc])

    # epilogue: normalise once, rows that saw no key give 0 and lse -inf
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    l_safe = gl.where(l_o == 0.0, 1.0, l_o)
    o = o / l_safe[:, None]
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(gl.where(l_i == 0.0, 1.0, l_i))) * LN2)
    lse_rows = m_start + rows_1d
    gl.store(Lse + lse_base + lse_rows, lse, mask=lse_rows < seqlen_q)
    o_rows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    ptrs = Out + (q_row0 - m_start + o_rows).to(gl.int64)[:, None] * stride_om + q_col + o_cols[None, :]
    gl.store(ptrs, o.to(Out.dtype.element_ty), mask=(o_rows < seqlen_q)[:, None])


@gluon.jit
def hopper_fwd_kernel(q_desc, k_desc, v_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                      stride_lse_b, stride_lse_h, qk_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      IS_CAUSAL: gl.constexpr):
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    pid = gl.program_id(0)
    m_block = pid % num_m
    if IS_CAUSAL:
        m_block = num_m - 1 - m_block  # the longest rows first: a balanced tail
    bh = pid // num_m
    b = bh // nheads
    h = bh % nheads
    m_start = m_block * BLOCK_M
    n_hi = gl.cdiv(seqlen_k, BLOCK_N)
    if IS_CAUSAL:
        last_row = gl.minimum(m_start + BLOCK_M, seqlen_q) - 1
        n_hi = gl.minimum(n_hi, gl.cdiv(gl.maximum(last_row + 1 + seqlen_k - seqlen_q, 0), BLOCK_N))
    n_lo = 0
    n_tiles = n_hi - n_lo
    # masks: the last tile always (key end, diagonal); under a causal mask also the tiles the
    # diagonal crosses (checked per tile); no other tile can be cut, since only the last one reaches
    # the key end
    MASK_ALL: gl.constexpr = IS_CAUSAL

    lse_base = b.to(gl.int64) * stride_lse_b + h.to(gl.int64) * stride_lse_h
    q_row0 = b * seqlen_q + m_start
    q_col = h * HEAD_DIM
    if n_tiles <= 0:  # causal rows that see no key (seqlen_q > seqlen_k): output 0, lse -inf
        zl: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [gl.num_warps(), 1], [1, 0])
        rows = m_start + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, zl))
        cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, zl))
        ptrs = Out + (q_row0 - m_start + rows).to(gl.int64)[:, None] * stride_om + q_col + cols[None, :]
        gl.store(ptrs, gl.zeros([BLOCK_M, HEAD_DIM], Out.dtype.element_ty, layout=zl), mask=(rows < seqlen_q)[:, None])
        gl.store(Lse + lse_base + rows, gl.full([BLOCK_M], float("-inf"), gl.float32, layout=gl.SliceLayout(1, zl)),
                 mask=rows < seqlen_q)
        return

    dtype: gl.constexpr = q_desc.dtype
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    mbarrier.init(q_bar, count=1)
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=1)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=1)
    fence_async_shared()

    kv_row0 = b * seqlen_k
    kv_col = (h // group) * HEAD_DIM
    gl.warp_specialize([
        (_consumer, (q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Out, Lse, q_row0,
                     q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, stride_lse_h, lse_base, qk_scale,
                     HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL, MASK_ALL)),
        (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
                     n_tiles, BLOCK_N, STAGES)),
    ], [1], [24])
