"""MLA decoding in Gluon for Hopper: multi-head latent attention's decode step (DeepSeek-V2/V3) over a
latent cache of one KV head, q and keys ``DV + DR`` wide (512 latent + 64 rotary), V the keys' first
``DV`` columns, read from the same shared-memory tile (docs/mla.md).

One program per (64 packed query rows, split, sequence): packed row ``r`` is query token ``r // group``
of head ``r % group`` (one KV head: every query head reads the same cache). Its eight warps are two
warpgroups over one 64-row tile: the score tile S (64 x BLOCK_N) splits its keys between them and the
output (64 x DV) its columns, as the [4, 2] wgmma layouts say, so every product is issued once and the
row max and sum cross the warpgroups through Triton's reductions. Q lives in shared memory for the
whole program (64 x 576 in registers beside the 64 x 512 accumulator is what spilled the portable
kernel); P goes through a shared buffer, from which both warpgroups read it whole.

The key range of the sequence, cut into BLOCK_N-key tiles aligned to absolute columns (a tile never
crosses a page: the host keeps page sizes a multiple of BLOCK_N), is dealt to the splits in runs of
``cdiv(tiles, num_splits)``. A ring of ``STAGES`` K tiles (main and rotary columns in two buffers)
is filled by TMA ``STAGES`` tiles ahead; a slot is refilled once both warpgroups' P V product on it
has retired. Rows of the tile the sequence's end cuts are zeroed in the V columns before use (an
unused cache slot may hold NaN, and 0 x NaN is NaN), and the scores past the end (or past a query's
diagonal, ``IS_CAUSAL``) are masked.

Output: the normalised rows and their natural-log lse, to ``Out`` / ``Lse`` (one split) or as fp32
partials to ``Opart`` / ``Lpart`` for the LSE merge (``ioattn.launch.merge``), -inf for a split that
saw no key, as the split-KV kernel's.

Reference twin: ``ioattn.reference.decode.kvcache_attention_ref``. Test: ``tests/test_mla_decode.py``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)

from ioattn.kernels.hopper_common import LN2, _zero_v_tail


@gluon.constexpr_function
def _mla_layout(cols):
    """The wgmma accumulator layout of a 64-row product ``cols`` wide over two warpgroups side by side
    (each its half of the columns)."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, cols // 2, 16])


@gluon.jit
def _tile_row(BlockTable, bt_row, b, capacity, tile, BLOCK_N: gl.constexpr, PAGE_SIZE: gl.constexpr,
              PAGED: gl.constexpr, num_pages):
    """The cache row (of the (rows, d) view) where key tile ``tile`` of sequence ``b`` starts: in its
    page (a page index outside the pool clamped into it), or in the sequence's contiguous row."""
    col = tile * BLOCK_N
    if PAGED:
        page = gl.load(BlockTable + bt_row + col // PAGE_SIZE)
        page = gl.minimum(gl.maximum(page, 0), num_pages - 1)
        return page * PAGE_SIZE + col % PAGE_SIZE
    return b * capacity + col


@gluon.jit
def _load_tile(k_desc, kr_desc, row, bar, k_main, k_rope):
    """TMA copies of one key tile's main and rotary columns, completing on ``bar``."""
    mbarrier.expect(bar, k_desc.block_type.nbytes + kr_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(k_desc, [row, 0], bar, k_main)
    tma.async_copy_global_to_shared(kr_desc, [row, 0], bar, k_rope)


@gluon.jit
def mla_decode_kernel(q_desc, qr_desc, k_desc, kr_desc, Out, Lse, Opart, Lpart, SeqLens, BlockTable,
                      stride_ob, stride_om, stride_oh, stride_ps, stride_pb, stride_pm, stride_ph,
                      stride_ls, stride_lb, stride_lm, stride_lh, stride_btb, seqlen_base, seqlen_new, seqlen_q,
                      group, capacity, num_pages, qk_scale,
                      BLOCK_N: gl.constexpr, STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr,
                      HAS_SEQLENS: gl.constexpr, IS_CAUSAL: gl.constexpr, SPLIT: gl.constexpr):
    """Grid (row blocks, splits, batch); eight warps. ``q_desc`` / ``qr_desc``: q as (batch * seqlen_q *
    nheads, d) rows in [64, DV] / [64, DR] boxes (the main and rotary columns); ``k_desc`` / ``kr_desc``:
    the latent cache as (rows, d) (contiguous: ``capacity`` rows a sequence; paged: ``PAGE_SIZE`` rows a
    page, ``BlockTable`` int32 rows ``stride_btb`` apart) in [BLOCK_N, DV] / [BLOCK_N, DR] boxes.
    Sequence b ends at ``SeqLens[b]`` (``HAS_SEQLENS``, else ``seqlen_base``) + ``seqlen_new``, clamped
    to ``capacity``. ``qk_scale``: the softmax scale times log2(e). ``SPLIT``: partials to ``Opart``
    (splits, batch, seqlen_q, nheads, DV) fp32 and ``Lpart`` (splits, batch, seqlen_q, nheads), else
    ``Out`` (batch, seqlen_q, nheads, DV) and ``Lse`` (batch, nheads, seqlen_q)."""
    DV: gl.constexpr = k_desc.block_type.shape[1]
    DR: gl.constexpr = kr_desc.block_type.shape[1]
    ROWS: gl.constexpr = q_desc.block_type.shape[0]
    gl.static_assert(ROWS == 64 and gl.num_warps() == 8, "64 packed rows over two warpgroups")
    dtype: gl.constexpr = q_desc.dtype
    m_blk, split, b = gl.program_id(0), gl.program_id(1), gl.program_id(2)
    num_splits = gl.num_programs(1)
    nheads = group  # one KV head
    rows_valid = group * seqlen_q

    end = seqlen_new + (gl.load(SeqLens + b) if HAS_SEQLENS else seqlen_base)
    end = gl.minimum(gl.maximum(end, 0), capacity)
    n_all = gl.cdiv(end, BLOCK_N)
    per = gl.cdiv(n_all, num_splits)
    t_lo = split * per
    n_tiles = gl.maximum(gl.minimum(t_lo + per, n_all) - t_lo, 0)
    bt_row = b.to(gl.int64) * stride_btb

    s_layout: gl.constexpr = _mla_layout(BLOCK_N)
    o_layout: gl.constexpr = _mla_layout(DV)
    q_main = gl.allocate_shared_memory(dtype, [ROWS, DV], q_desc.layout)
    q_rope = gl.allocate_shared_memory(dtype, [ROWS, DR], qr_desc.layout)
    k_main = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DV], k_desc.layout)
    k_rope = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, DR], kr_desc.layout)
    p_smem = gl.allocate_shared_memory(dtype, [ROWS, BLOCK_N],
                                       gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], dtype))
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    _fill_ring(q_desc, qr_desc, k_desc, kr_desc, q_main, q_rope, k_main, k_rope, q_bar, ready, m_blk, seqlen_q,
               group, BlockTable, bt_row, b, capacity, t_lo, n_tiles, num_pages, BLOCK_N, STAGES, PAGE_SIZE, PAGED)

    rows = m_blk * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, s_layout))
    cols0 = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    if IS_CAUSAL:  # query token t sits at column end - seqlen_q + t: it sees the keys before the next one
        limit = gl.minimum(end - seqlen_q + rows // group + 1, end)
    else:
        limit = gl.zeros_like(rows) + end
    m_i = gl.full([ROWS], float("-inf"), gl.float32, layout=gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([ROWS], gl.float32, layout=gl.SliceLayout(1, s_layout))
    s_zero = gl.zeros([ROWS, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([ROWS, DV], gl.float32, layout=o_layout)
    mbarrier.wait(q_bar, 0)

    for i in range(n_tiles):
        slot = i % STAGES
        tile = t_lo + i
        mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
        valid = end - tile * BLOCK_N
        if valid < BLOCK_N:  # the tile the sequence's end cuts: its V rows past the end to 0
            _zero_v_tail(k_main.index(slot), valid, BLOCK_N, DV)
        s_tok = warpgroup_mma(q_main, k_main.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s_tok, is_async=True)
        s = warpgroup_mma_wait(0, deps=[s_tok])
        p, alpha, m_i, l_i = _online_softmax(s, tile * BLOCK_N + cols0, limit, m_i, l_i, qk_scale)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p_smem.store(p.to(dtype))
        fence_async_shared()
        gl.thread_barrier()  # P whole in shared memory before either warpgroup reads it
        o_tok = warpgroup_mma(p_smem, k_main.index(slot), acc, is_async=True)  # V: the tile's first DV columns
        acc = warpgroup_mma_wait(0, deps=[o_tok])
        gl.thread_barrier()  # both P V products retired: the slot and P's buffer are free
        if i + STAGES < n_tiles:
            row = _tile_row(BlockTable, bt_row, b, capacity, tile + STAGES, BLOCK_N, PAGE_SIZE, PAGED, num_pages)
            _load_tile(k_desc, kr_desc, row, ready.index(slot), k_main.index(slot), k_rope.index(slot))

    for i in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(i))
    mbarrier.invalidate(q_bar)
    _mla_epilogue(acc, m_i, l_i, rows, rows_valid, group, b, split, Out, Lse, Opart, Lpart, stride_ob, stride_om,
                  stride_oh, stride_ps, stride_pb, stride_pm, stride_ph, stride_ls, stride_lb, stride_lm, stride_lh,
                  nheads, seqlen_q, o_layout, SPLIT)


@gluon.jit
def _fill_ring(q_desc, qr_desc, k_desc, kr_desc, q_main, q_rope, k_main, k_rope, q_bar, ready, m_blk, seqlen_q,
               group, BlockTable, bt_row, b, capacity, t_lo, n_tiles, num_pages, BLOCK_N: gl.constexpr,
               STAGES: gl.constexpr, PAGE_SIZE: gl.constexpr, PAGED: gl.constexpr):
    """The barriers initialised, then row block ``m_blk``'s Q rows and the first ``STAGES`` key tiles on
    their way."""
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    fence_async_shared()
    q_row = (b * seqlen_q * group + m_blk * q_main.shape[0]).to(gl.int32)
    mbarrier.expect(q_bar, q_desc.block_type.nbytes + qr_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row, 0], q_bar, q_main)
    tma.async_copy_global_to_shared(qr_desc, [q_row, 0], q_bar, q_rope)
    for i in gl.static_range(STAGES):
        if i < n_tiles:
            row = _tile_row(BlockTable, bt_row, b, capacity, t_lo + i, BLOCK_N, PAGE_SIZE, PAGED, num_pages)
            _load_tile(k_desc, kr_desc, row, ready.index(i), k_main.index(i), k_rope.index(i))


@gluon.jit
def _online_softmax(s, cols, limit, m_i, l_i, qk_scale):
    """One key tile's step of the online softmax: (P, the accumulator's factor, the new max and row
    sum); keys at or past a row's ``limit`` are masked."""
    s = gl.where(cols[None, :] < limit[:, None], s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 gives 0, not NaN
    alpha = gl.exp2(m_i - m_use)
    p = gl.exp2(s - m_use[:, None])
    return p, alpha, m_new, l_i * alpha + gl.sum(p, 1)


@gluon.jit
def _mla_epilogue(acc, m_i, l_i, rows, rows_valid, group, b, split, Out, Lse, Opart, Lpart, stride_ob, stride_om,
                  stride_oh, stride_ps, stride_pb, stride_pm, stride_ph, stride_ls, stride_lb, stride_lm, stride_lh,
                  nheads, seqlen_q, o_layout: gl.constexpr, SPLIT: gl.constexpr):
    """Normalise the rows and store them with their lse (rows that saw no key: 0 and -inf); packed
    rows past ``rows_valid`` are not stored."""
    DV: gl.constexpr = acc.shape[1]
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    tok, head = rows // group, rows % group
    row_ok = rows < rows_valid
    b64 = b.to(gl.int64)
    if SPLIT:
        gl.store(Lpart + split * stride_ls + b64 * stride_lb + tok * stride_lm + head * stride_lh, lse, mask=row_ok)
    else:
        gl.store(Lse + (b64 * nheads + head) * seqlen_q + tok, lse, mask=row_ok)
    o = acc * gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))[:, None]
    o_rows = gl.convert_layout(rows, gl.SliceLayout(1, o_layout))
    o_tok, o_head = o_rows // group, o_rows % group
    cols = gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    ok = (o_rows < rows_valid)[:, None]
    if SPLIT:
        base = Opart + split.to(gl.int64) * stride_ps + b64 * stride_pb
        gl.store(base + (o_tok * stride_pm + o_head * stride_ph)[:, None] + cols[None, :], o, mask=ok)
    else:
        base = Out + b64 * stride_ob
        gl.store(base + (o_tok * stride_om + o_head * stride_oh)[:, None] + cols[None, :],
                 o.to(Out.dtype.element_ty), mask=ok)
