"""Merge of the persistent Gluon forward's stream-K pieces (NOTES §71).

Under ``STREAM_K`` the persistent forward (``ioattn.kernels.hopper_forward``, ``_unit``) computes the
tiles of its whole waves as usual and cuts the (tile, key tile) steps of the tiles left over into one
contiguous range per program: program p of P takes steps [p * S // P, (p + 1) * S // P) of the S =
R * nb steps of the R leftover tiles (nb key tiles each), in tile order. A range is at most one
tile long, so it meets at most two tiles; its piece of each is written to workspace slot 2 * p + j
(j = 0 for the first tile it meets, 1 for the second) as O / l and lse in fp32. This kernel merges,
for each leftover tile, the pieces of the programs whose ranges meet it, exactly (the log-sum-exp
merge of ``ioattn.kernels.combine``), and writes the tile's output and lse. The host's twin of the
partition, for tests and the plan: ``ioattn.hopper.stream_k_pieces``.
"""
import triton
import triton.language as tl


@triton.jit
def stream_k_merge_kernel(Part_O, Part_L, Out, Lse, num_dp, sk_steps, nprog, nb, num_m, nheads, seqlen_q, stride_om,
                          stride_lse_b, stride_lse_h, CTA_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                          ROWS: tl.constexpr):
    """Grid (R leftover tiles, CTA_M // ROWS): ``ROWS`` rows of the r-th leftover tile (tile
    ``num_dp * nprog + r`` of the non-causal walk: (batch * heads) x query blocks, each head's query
    blocks in turn). ``Out``: (batch * seqlen_q) rows of ``stride_om`` elements, head h at column h *
    HEAD_DIM; ``Lse``: (batch, nheads, seqlen_q) by its strides."""
    r = tl.program_id(0)
    rows = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, HEAD_DIM)
    t = num_dp * nprog + r
    m_block = t % num_m
    b = (t // num_m) // nheads
    h = (t // num_m) % nheads
    # the programs whose ranges hold the tile's first and last step: the last p with p * S // P <= x
    x0 = r * nb
    p_first = ((x0 + 1) * nprog - 1) // sk_steps
    p_last = ((x0 + nb) * nprog - 1) // sk_steps
    m = tl.full([ROWS], float("-inf"), tl.float32)
    den = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, HEAD_DIM], tl.float32)
    for p in range(p_first, p_last + 1):
        lo = (p * sk_steps) // nprog
        hi = ((p + 1) * sk_steps) // nprog
        if hi > lo:  # an empty range (fewer steps than programs) holds no piece
            slot = 2 * p + (r - lo // nb)
            lse_p = tl.load(Part_L + slot * CTA_M + rows)
            o_p = tl.load(Part_O + (slot * CTA_M + rows).to(tl.int64)[:, None] * HEAD_DIM + cols[None, :])
            m_new = tl.maximum(m, lse_p)  # every piece saw a key: lse_p finite, so m_new is
            alpha = tl.exp(m - m_new)
            w = tl.exp(lse_p - m_new)
            acc = acc * alpha[:, None] + w[:, None] * o_p
            den = den * alpha + w
            m = m_new
    q_rows = m_block * CTA_M + rows
    ok = q_rows < seqlen_q
    out = acc / den[:, None]
    ptrs = Out + (b * seqlen_q + q_rows).to(tl.int64)[:, None] * stride_om + h * HEAD_DIM + cols[None, :]
    tl.store(ptrs, out.to(Out.dtype.element_ty), mask=ok[:, None])
    tl.store(Lse + b.to(tl.int64) * stride_lse_b + h.to(tl.int64) * stride_lse_h + q_rows, m + tl.log(den), mask=ok)
