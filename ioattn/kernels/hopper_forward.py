"""Hopper forward in Gluon (FlashAttention-3 structure). EXPERIMENTAL: compiled for sm_90 in CI
(ahead of time, no GPU), opt-in, never dispatched by default.

One program per (query block, batch * head), warp-specialised partitions; two compile-time variants
of the consumer side (``PINGPONG``), the producer and the softmax/PV helpers shared:

* **Producer** (1 warp, 24 registers): TMA bulk copies of K and V tiles into a ``STAGES``-deep
  shared-memory ring; ``k_ready``/``v_ready`` barriers complete when a tile's bytes have landed,
  ``k_empty``/``v_empty`` when every consumer has finished reading it (count = consumers).
* **Base consumer** (``PINGPONG=False``, the default; the kernel's warps, one warpgroup per 64
  query rows, all in one partition and so in lockstep): Q arrives once by TMA; per key tile j it
  issues the asynchronous wgmma for S(j+1) = Q K(j+1)^T *before* the softmax of S(j), so the
  exponentials of one tile overlap the next tile's product (FA3's intra-warpgroup overlap), then
  waits for P(j-1) V(j-1), rescales the accumulator and issues P(j) V(j) asynchronously. Note:
  ptxas (12.8, Triton 3.6) reports C7514 for it and serialises every wgmma (a wait after each
  k-step), because P(j) V(j) stays in flight across the loop's back edge; the ping-pong consumer
  retires both GEMMs inside each step (FA3's order) and compiles without it.
* **Ping-pong consumers** (``PINGPONG=True``): two consumer warpgroups, 64 query rows each of the
  CTA's 128-row tile, in two partitions of their own (the default one and a 4-warp worker, 240
  registers each), sharing the K/V ring. Each issues its S(j+1) and P(j) V(j) back to back inside a
  critical section ordered against the other warpgroup by two mbarriers (``turn``), then runs the
  softmax of S(j+1) outside it: warpgroup 0's softmax overlaps warpgroup 1's GEMMs and vice versa
  (FA3 Section 3.1, "pingpong scheduling"), on top of each warpgroup's own overlap of softmax(j+1)
  with its P(j) V(j). ``ORDERED=False`` compiles the ordering out (diagnostic "split" variant:
  the same two warpgroups, free-running) so a device A/B can tell the ordering's share.

Why 64 rows per warpgroup (a 128-row CTA tile), not a 128-row tile per warpgroup (a 256-row CTA):
FA3 (Section 3.1; its sm90 launch shape at d = 128 is kBlockM = 128 with two MMA warpgroups of 64
rows) splits one tile between the two warpgroups, and the register budget leaves no choice: 65536
registers per SM, the producer warpgroup at 24 and two consumers at 240 (24 * 128 + 2 * 240 * 128
= 64512, FA3's figures for two MMA warpgroups). A 64-row warpgroup holds, per thread, S (64 x 128
fp32: 64 registers), O (64 x d fp32: 32 at d = 64, 64 at d = 128), P (bf16, 32) and the next P
being formed: ptxas fits it in 240 without spills. A 128-row warpgroup doubles each (S 128, O 128
at d = 128, P 64: over 240 before any temporaries) and would spill; the 256-row CTA would only
save K/V shared-memory reads, which are not the bottleneck. Shared memory (228 KB per SM, 227 KB
per block): Q 2 x 64 x d, K and V STAGES x 128 x d each, bf16: 160 KB at d = 128 with 2 stages
(FA3's 2; 3 stages, 224 KB, would fit with 2.6 KB to spare), 112 KB at d = 64 with 3 stages.

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
        reuse_phase = ((i // STAGES) & 1) ^ 1  # the consumers' release of this slot's previous tile
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
    return _pv_mma(o, p16, v_smem, i, STAGES)


@gluon.jit
def _pv_mma(o, p16, v_smem, i, STAGES: gl.constexpr):
    """Issue O += P(i) V(i) asynchronously (P from registers, V(i) from its ring slot, already landed)."""
    return warpgroup_mma(p16, v_smem.index(i % STAGES), o, is_async=True)


@gluon.jit
def _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om,
              o_layout: gl.constexpr, ROWS: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Normalise once and store ``ROWS`` rows of output and lse from row ``m_start``; rows that saw
    no key give 0 and lse -inf; rows past ``seqlen_q`` are not stored."""
    l_o = gl.convert_layout(l_i, gl.SliceLayout(1, o_layout))
    l_safe = gl.where(l_o == 0.0, 1.0, l_o)
    o = o / l_safe[:, None]
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(gl.where(l_i == 0.0, 1.0, l_i))) * LN2)
    lse_rows = m_start + rows_1d
    gl.store(Lse + lse_base + lse_rows, lse, mask=lse_rows < seqlen_q)
    o_rows = m_start + gl.arange(0, ROWS, layout=gl.SliceLayout(1, o_layout))
    o_cols = gl.arange(0, HEAD_DIM, layout=gl.SliceLayout(0, o_layout))
    ptrs = Out + (q_row0 - m_start + o_rows).to(gl.int64)[:, None] * stride_om + q_col + o_cols[None, :]
    gl.store(ptrs, o.to(Out.dtype.element_ty), mask=(o_rows < seqlen_q)[:, None])


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

    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om, o_layout,
              BLOCK_M, HEAD_DIM)


@gluon.jit
def _turn_wait(my_turn, section, TURN0: gl.constexpr, ORDERED: gl.constexpr):
    """Block until this warpgroup may issue the GEMMs of its ``section``-th critical section (a no-op
    when not ``ORDERED``: the "split" diagnostic variant, two free-running consumer warpgroups).

    ``my_turn`` completes one phase per critical section of the *other* warpgroup (its single
    arrive, count 1, after issuing). Sections run WG0#0, WG1#0, WG0#1, WG1#1, ...: WG1#k needs
    completion k of its barrier (parity k & 1, ``TURN0 = 0``); WG0#k, k >= 1, needs completion k - 1
    (parity (k - 1) & 1 = (k + 1) & 1, ``TURN0 = 1``) and WG0#0 does not wait (predicated off; the
    parity-1 wait on a fresh barrier would pass at once anyway). No waiter can fall two phases
    behind (parity aliasing): the other warpgroup cannot complete phase k + 1 before this one has
    passed section k and arrived on the other's barrier."""
    if ORDERED:
        mbarrier.wait(my_turn, (section + TURN0) & 1, pred=(section > 0) | (TURN0 == 0))


@gluon.jit
def _turn_pass(next_turn, ORDERED: gl.constexpr):
    """End of a critical section: the GEMMs are issued (Triton puts a barrier over this partition's
    four warps before the single-thread arrive, so all four have issued), the other warpgroup's turn."""
    if ORDERED:
        mbarrier.arrive(next_turn, count=1)


@gluon.jit
def _pingpong_consumer(q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn,
                       Out, Lse, q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, lse_base,
                       qk_scale, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                       STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr, TURN0: gl.constexpr,
                       ORDERED: gl.constexpr):
    """One consumer warpgroup of the ping-pong variant: ``BLOCK_M`` (= 64) query rows of its own, the
    K/V ring shared with the other consumer warpgroup.

    Per key tile it issues, inside a critical section ordered against the other warpgroup
    (``_turn_wait`` ... arrive on ``next_turn``), S(i+1) = Q K(i+1)^T and O += P(i) V(i), then leaves
    the section and runs the softmax of S(i+1) while its own P(i) V(i) and the other warpgroup's two
    GEMMs occupy the tensor cores (FA3's inter-warpgroup ping-pong on top of its intra-warpgroup
    overlap). Sections per warpgroup: #0 = S(0); #(i+1) = loop step i (S(i+1), P(i) V(i)), i < n - 1;
    #n = the last P(n-1) V(n-1): n + 1 each, the same count for both warpgroups, whatever n >= 1.

    Invariants (n = ``n_tiles`` >= 1, the same for both warpgroups: the CTA's count):
    * K(t) is released (one arrive on ``k_empty``, initialised with count 2) right after S(t) is
      waited for; V(t) (``v_empty``, count 2) right after P(t) V(t) is, for t < n - 1 (the last slot
      is never reloaded). Every slot use therefore gets exactly one arrive per warpgroup.
    * K/V readiness is waited for *before* taking the turn, so no warpgroup holds the turn while it
      waits for memory. No cycle (deadlock-free for STAGES >= 2): section #t needs K(t), V(t-1) and
      the other warpgroup's section #(t-1) (WG1: #t). The producer loads K(t) once both warpgroups
      released K(t-S) (step t-S-1) and V(t-1-S) (end of step t-1-S); a warpgroup that has issued
      section #(t-1) has finished those steps, and finishing a step needs nothing from the other
      warpgroup (only its own wgmma to retire), so the producer never waits on a later section.
      Parity waits cannot alias: a slot is refilled only after both releases, a turn barrier
      completes again only after this warpgroup's own next section.
    * A key tile may be fully masked for these rows (causal: the other warpgroup's rows reach one
      tile further): p = 0 and alpha = 1 (or 0 for a row with no key yet), so m, l and O are
      unchanged; rows that see no key at all end with l = 0 and store 0 and lse = -inf.
    """
    num_warps: gl.constexpr = gl.num_warps()
    gl.static_assert(num_warps == 4, "a ping-pong consumer is one warpgroup")
    gl.static_assert(STAGES >= 2, "S(i+1) and P(i) V(i) are in flight together")
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_1d = gl.arange(0, BLOCK_M, layout=row_layout)
    cols_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    dtype: gl.constexpr = v_smem.dtype

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [q_row0, q_col], q_bar, q_smem)
    mbarrier.wait(q_bar, 0)

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    o = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)
    diag = m_start + seqlen_k - seqlen_q  # the last key column this warpgroup's first row may see

    # section #0: S(0); its softmax (always masked: it may be the last tile) runs outside the turn
    mbarrier.wait(k_ready.index(0), 0)
    _turn_wait(my_turn, 0, TURN0, ORDERED)
    s_tok = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    _turn_pass(next_turn, ORDERED)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(0), count=1)
    p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_lo * BLOCK_N, seqlen_q, seqlen_k, rows_1d,
                                       cols_1d, True, IS_CAUSAL)
    p16 = gl.convert_layout(p.to(dtype), p_layout)  # O is still 0: no rescale

    for i in range(n_tiles - 1):
        # section #(i+1): S(i+1) and P(i) V(i), issued back to back, then the turn passes on
        nxt = (i + 1) % STAGES
        cur = i % STAGES
        mbarrier.wait(k_ready.index(nxt), ((i + 1) // STAGES) & 1)
        mbarrier.wait(v_ready.index(cur), (i // STAGES) & 1)
        _turn_wait(my_turn, i + 1, TURN0, ORDERED)
        s_tok = warpgroup_mma(q_smem, k_smem.index(nxt).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        o_tok = _pv_mma(o, p16, v_smem, i, STAGES)
        _turn_pass(next_turn, ORDERED)
        # S(i+1) done (groups retire in order; P(i) V(i) may still run)
        s = warpgroup_mma_wait(1, deps=[s_tok])
        mbarrier.arrive(k_empty.index(nxt), count=1)
        n_start = (n_lo + i + 1) * BLOCK_N
        # masks: the last tile always (key end, diagonal); under a causal mask also a tile that
        # reaches past this warpgroup's first row's diagonal
        need_mask = i + 1 == n_tiles - 1
        if MASK_ALL:
            need_mask = need_mask | (n_start + BLOCK_N - 1 > diag)
        if need_mask:
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d,
                                               cols_1d, True, IS_CAUSAL)
        else:
            p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d,
                                               cols_1d, False, IS_CAUSAL)
        # P(i) V(i) done: P(i)'s registers may go (listed so they stay alive until here), V(i)'s slot too
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        mbarrier.arrive(v_empty.index(cur), count=1)
        o = o * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
        p16 = gl.convert_layout(p.to(dtype), p_layout)

    # section #n: the last P(n-1) V(n-1) (its slot is never reloaded: no release)
    last = n_tiles - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    _turn_wait(my_turn, n_tiles, TURN0, ORDERED)
    o_tok = _pv_mma(o, p16, v_smem, last, STAGES)
    _turn_pass(next_turn, ORDERED)
    o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])

    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om, o_layout,
              BLOCK_M, HEAD_DIM)


@gluon.jit
def _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES: gl.constexpr, RELEASERS: gl.constexpr):
    """The K/V ring's barriers: a slot is ready after one expect-tx arrive (the producer's TMA), and
    free again after ``RELEASERS`` arrives (one per consumer that reads it)."""
    for s in gl.static_range(STAGES):
        mbarrier.init(k_ready.index(s), count=1)
        mbarrier.init(k_empty.index(s), count=RELEASERS)
        mbarrier.init(v_ready.index(s), count=1)
        mbarrier.init(v_empty.index(s), count=RELEASERS)


@gluon.jit
def hopper_fwd_kernel(q_desc, k_desc, v_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                      stride_lse_b, stride_lse_h, qk_scale,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr = False, ORDERED: gl.constexpr = True):
    """``PINGPONG=False`` (the default, launched with num_warps = 4 * BLOCK_M // 64): one consumer
    partition of BLOCK_M // 64 warpgroups in lockstep, Q descriptor block [BLOCK_M, HEAD_DIM].
    ``PINGPONG=True`` (launched with num_warps = 4, BLOCK_M = 128): two consumer warpgroups of 64
    rows each in separate partitions (the default one and a worker), ordered by two mbarriers; Q
    descriptor block [64, HEAD_DIM]. Both: one producer warp, 24 registers."""
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
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    kv_row0 = b * seqlen_k
    kv_col = (h // group) * HEAD_DIM
    if PINGPONG:
        # Two consumer warpgroups, 64 query rows each, sharing the K/V ring: every slot use is
        # released by both (empty barriers count 2). q_bar[w]: warpgroup w's own Q tile landed.
        # turn[w]: warpgroup w may issue its next GEMM pair (one arrive, by the other warpgroup).
        gl.static_assert(BLOCK_M == 128, "ping-pong: two consumer warpgroups of 64 rows")
        WG_ROWS: gl.constexpr = BLOCK_M // 2
        gl.static_assert(q_desc.block_type.shape[0] == WG_ROWS, "ping-pong: Q descriptor block is [64, HEAD_DIM]")
        q_smem = gl.allocate_shared_memory(dtype, [2, WG_ROWS, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        turn = gl.allocate_shared_memory(gl.int64, [2, 1], bar_layout)
        for w in gl.static_range(2):
            mbarrier.init(q_bar.index(w), count=1)
            mbarrier.init(turn.index(w), count=1)
        _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES, 2)  # both warpgroups release each slot
        fence_async_shared()
        # Register budget (FA3's for two consumer warpgroups + producer): the producer warp is padded
        # to a warpgroup, 384 threads in all; 24 * 128 + 240 * 256 = 64512 <= 65536 registers per SM.
        gl.warp_specialize([
            (_pingpong_consumer, (q_desc, q_smem.index(0), q_bar.index(0), k_smem, v_smem, k_ready, k_empty, v_ready,
                                  v_empty, turn.index(0), turn.index(1), Out, Lse, q_row0, q_col, m_start, seqlen_q,
                                  seqlen_k, n_lo, n_tiles, stride_om, lse_base, qk_scale, HEAD_DIM, WG_ROWS, BLOCK_N,
                                  STAGES, IS_CAUSAL, MASK_ALL, 1, ORDERED)),
            (_pingpong_consumer, (q_desc, q_smem.index(1), q_bar.index(1), k_smem, v_smem, k_ready, k_empty, v_ready,
                                  v_empty, turn.index(1), turn.index(0), Out, Lse, q_row0 + WG_ROWS, q_col,
                                  m_start + WG_ROWS, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, lse_base, qk_scale,
                                  HEAD_DIM, WG_ROWS, BLOCK_N, STAGES, IS_CAUSAL, MASK_ALL, 0, ORDERED)),
            (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
                         n_tiles, BLOCK_N, STAGES)),
        ], [4, 1], [240, 24])
    else:
        q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], q_desc.layout)
        k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], k_desc.layout)
        v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
        mbarrier.init(q_bar, count=1)
        _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES, 1)
        fence_async_shared()
        gl.warp_specialize([
            (_consumer, (q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Out, Lse, q_row0,
                         q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, stride_lse_h, lse_base,
                         qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL, MASK_ALL)),
            (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
                         n_tiles, BLOCK_N, STAGES)),
        ], [1], [24])
