"""Flash-Decoding split-KV attention over a KV cache (contiguous or paged), in Triton.

1-D grid over units, a unit being one (sequence, KV head, block of query rows): the first
``num_whole`` units one program each, then every later unit ``num_splits`` programs (splits fastest),
each one split of the unit's key range. Usually ``num_whole`` is 0 (every unit split, or
``num_splits`` = 1) or every unit; the host sets it in between when the units alone would leave the
last wave of programs a small fraction of the SMs (``ioattn.decode.plan``): then only that tail is
split, so the step does not end on a few SMs reading one whole unit each.

* **Row packing.** The query rows of *all* the query heads of one KV head's GQA group, for all the
  ``seqlen_q`` query tokens, form one tile: packed row ``r`` is query token ``r // group`` of query
  head ``h_kv * group + r % group`` (heads fastest). Every K/V byte a split reads therefore serves the
  whole group at once. Rows past ``group * seqlen_q`` have a token index ``>= seqlen_q`` and are
  masked like any out-of-range query row. ``num_m_blocks`` is 1 unless ``group * seqlen_q`` exceeds
  the row tile (long appends / prefill through the cache), then row blocks become separate programs.
* **Key range.** Sequence ``b`` attends to absolute cache columns ``[leftpad[b], end[b])``
  (``end = cache_seqlens + seqlen_new``), trimmed by the window's left edge for the first row of the
  tile. The range is cut into ``BLOCK_N``-column chunks aligned to absolute columns (so with
  ``page_size % BLOCK_N == 0`` a chunk never crosses a page) and the chunks are dealt to the splits
  in contiguous runs of ``cdiv(n_chunks, num_splits)``; a split past the last chunk is empty.
* **Masks.** Query token ``i`` sits at column ``end - seqlen_q + i`` (bottom-right aligned w.r.t. the
  valid length, flash-attn's rule: leftpad shifts nothing since both ends count from ``end``);
  ``tile_scores`` applies scale, softcap, causal/window, the key end and ALiBi with ``seqlen_k =
  end``; the leftpad boundary is masked here. Every chunk is masked (decode chunks are few).
* **K/V loads.** Pointer loads, or (``USE_TMA``) bulk tensor copies through host-built descriptors
  over the cache's (rows or pages, columns, nheads_kv, d) view, which Triton software-pipelines
  through a multi-stage shared-memory ring: the double-buffered KV stream of a flat (few-row) GEMM.
  Copies are zero-filled only past the cache's capacity (or page), so columns past a sequence's end
  are masked in the scores and their V rows zeroed (an unused cache slot may hold NaN).
* **FP8 caches.** With ``KV_FP8`` the cache holds e4m3 values: each K/V tile is converted to q's
  dtype in registers right after its load (exact: every e4m3 value is a bf16 / fp16 value), the
  sequence's per-KV-head ``k_descale`` is folded into the score scale and ``v_descale`` into the
  final normalisation, so the key loop does no extra work.
* **Unified max (FlashDecoding++).** With ``UNIFIED`` every split subtracts one fixed value ``phi``
  (log2 units) instead of its running max, so no step rescales the accumulator. The split also
  tracks its true row max; if any row's max lies outside ``[phi - PHI_BELOW, phi + PHI_ABOVE]``
  (where exp2 could overflow the probability dtype, or lose precision to underflow) the split runs
  its chunks again with the exact online softmax. Either way the result is exact.
* **Untrusted indices.** ``end`` is clamped to the cache capacity, ``leftpad`` to ``[0, end]``,
  page and row indices to the pool: a call whose index values were not checked on the host (CUDA
  graphs, ``check_values=False``) can compute garbage from bad values but never reads outside the
  cache.
* **Head dims.** V's (``HEAD_DIM_V``, the output's) may differ from q's and K's; past 256, q.k runs
  as two blocks (``BLOCK_D_TAIL``: 576 = 512 + 64). V a view of K's first columns (MLA's latent cache)
  is read as its own tile (docs/decisions/value-head-dim.md).
* **Output.** Each split writes its normalised partial output (fp32) and its natural-log lse
  (-inf for a split that saw no key) to scratch ``(num_splits, batch - part_b0, seqlen_q, nheads, dv)``
  / ``(num_splits, batch - part_b0, seqlen_q, nheads)`` (the split units are the batch elements from
  ``part_b0`` on); the merge kernel combines the splits into the output (q's dtype) and the lse in
  flash-attn's layout. A whole unit writes those directly: a decode step is one or two launches.
  ``USE_PDL``: each program lets the merge kernel launch (programmatic dependent launch, Hopper) once
  it has read its keys (a merge grid resident from the start holds room the split programs' loads
  could use: docs/decisions/decode-launches.md); the merge
  waits for this grid's writes itself (``kernels/combine.py``), so where the hint sits changes timing
  only. ``PDL_WAIT``: this
  kernel is itself launched by programmatic dependent launch after whatever the stream ran before it
  and waits for that work's writes first thing, so its launch overlaps the previous kernel's end.

Reference twin: ``ioattn.reference.decode.kvcache_attention_ref``. Test: ``tests/test_decode.py``.
"""
import triton
import triton.language as tl
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control: the host never sets USE_PDL / PDL_WAIT there
    @triton.jit
    def gdc_launch_dependents():
        pass

    @triton.jit
    def gdc_wait():
        pass

from ioattn.kernels.common import LOG2E, mma, softmax_finish, softmax_step, tile_scores


@triton.jit
def _split_chunks(acc, m_i, l_i, q, q_tail, K, V, k_desc, v_desc, bt_row, cache_row, h_kv, lp, end, tok,
                  seqlen_q, c_start, c_end, num_pages, stride_kb, stride_kn, stride_vb, stride_vn, k_head, v_head,
                  offs_d, d_ok, offs_t, t_ok, offs_dv, dv_ok, qk_scale, softcap, window_left, window_right,
                  slope_log2, phi, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, PAGE_SIZE: tl.constexpr,
                  PAGED: tl.constexpr, USE_TMA: tl.constexpr, UNIFIED: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_ALIBI: tl.constexpr, BLOCK_D_TAIL: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Key chunks [c_start, c_end) of one split into (acc, m, l). ``UNIFIED``: probabilities are
    exp2(s - phi) and ``m_i`` only records the true row max (for the range check). Paged:
    ``bt_row`` is the sequence's block-table row. K/V tiles are converted to q's dtype once, after
    their load (a no-op unless the cache is FP8). ``BLOCK_D_TAIL``: K's columns past ``BLOCK_D``
    (``offs_t``) as a second tile, its product with ``q_tail`` added to the scores."""
    offs_n0 = tl.arange(0, BLOCK_N)
    if PAGED:
        # The page of chunk c is read one chunk ahead: the K/V addresses depend on it, so read in
        # place it put a block-table round trip before every chunk's loads
        # (docs/decisions/decode-paged-loads.md).
        next_page = tl.load(bt_row + (c_start * BLOCK_N) // PAGE_SIZE, mask=c_start < c_end, other=0)
    for c in range(c_start, c_end):
        col0 = c * BLOCK_N
        offs_n = col0 + offs_n0
        kv_ok = (offs_n >= lp) & (offs_n < end)
        if PAGED:
            page = tl.minimum(tl.maximum(next_page, 0), num_pages - 1).to(tl.int64)
            next_page = tl.load(bt_row + ((c + 1) * BLOCK_N) // PAGE_SIZE, mask=c + 1 < c_end, other=0)
            row = page
            col_in = col0 % PAGE_SIZE
        else:
            row = cache_row
            col_in = col0
        if USE_TMA:
            k = k_desc.load([row.to(tl.int32), col_in, h_kv, 0]).reshape(BLOCK_N, BLOCK_D).to(q.dtype)
            qk = mma(q, tl.trans(k))
        else:
            offs_in = (col_in + offs_n0).to(tl.int64)
            # K as (d, n) so q @ k needs no transpose
            k = tl.load(K + k_head + row * stride_kb + offs_in[None, :] * stride_kn + offs_d[:, None],
                        mask=kv_ok[None, :] & d_ok[:, None], other=0.0).to(q.dtype)
            qk = mma(q, k)
            if BLOCK_D_TAIL:
                k_tail = tl.load(K + k_head + row * stride_kb + offs_in[None, :] * stride_kn + offs_t[:, None],
                                 mask=kv_ok[None, :] & t_ok[:, None], other=0.0).to(q.dtype)
                qk = mma(q_tail, k_tail, qk)
        s = tile_scores(qk, tok, offs_n, seqlen_q, end, qk_scale, softcap, window_left, window_right,
                        slope_log2, True, HAS_SOFTCAP, HAS_ALIBI)
        s = tl.where(kv_ok[None, :], s, float("-inf"))  # leftpad columns (the key end is in tile_scores)
        if UNIFIED:
            m_i = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - phi)
            l_i += tl.sum(p, 1)
        else:
            p, m_i, l_i, acc = softmax_step(s, m_i, l_i, acc, True)
        if USE_TMA:
            v = v_desc.load([row.to(tl.int32), col_in, h_kv, 0]).reshape(BLOCK_N, BLOCK_DV).to(q.dtype)
            v = tl.where(kv_ok[:, None], v, 0.0)
        else:
            v = tl.load(V + v_head + row * stride_vb + offs_in[:, None] * stride_vn + offs_dv[None, :],
                        mask=kv_ok[:, None] & dv_ok[None, :], other=0.0).to(q.dtype)
        acc = mma(p.to(v.dtype), v, acc)
    return acc, m_i, l_i


@triton.jit
def decode_split_kernel(
    Q, K, V, Out, Lse, Opart, Lpart, SeqLens, Leftpad, BlockTable, CacheBatchIdx, alibi_slopes, k_desc, v_desc,
    KDescale, VDescale,
    stride_qb, stride_qm, stride_qh,
    stride_kb, stride_kn, stride_kh,
    stride_vb, stride_vn, stride_vh,
    stride_btb, stride_ab,
    stride_os, stride_ob, stride_om, stride_oh,
    stride_ls, stride_lb, stride_lm, stride_lh,
    seqlen_base, seqlen_new, nheads_kv, group, seqlen_q, num_m_blocks, num_splits, num_whole, part_b0, capacity,
    num_rows,
    qk_scale, softcap, window_left, window_right, phi,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, PAGED: tl.constexpr, HAS_BATCH_IDX: tl.constexpr, HAS_LEFTPAD: tl.constexpr,
    HAS_SOFTCAP: tl.constexpr, HAS_ALIBI: tl.constexpr, USE_TMA: tl.constexpr, UNIFIED: tl.constexpr,
    PHI_BELOW: tl.constexpr, PHI_ABOVE: tl.constexpr, HAS_SEQLENS: tl.constexpr, USE_PDL: tl.constexpr = False,
    PDL_WAIT: tl.constexpr = False, KV_FP8: tl.constexpr = False, BLOCK_D_TAIL: tl.constexpr = 0,
    HEAD_DIM_V: tl.constexpr = 0, BLOCK_DV: tl.constexpr = 0,
):
    """``num_rows``: pages in the pool (paged) or rows of the contiguous cache. Sequence b ends at
    ``SeqLens[b] + seqlen_new`` (``seqlen_base + seqlen_new`` without ``HAS_SEQLENS``).
    Programs ``pid < num_whole`` take unit ``pid`` whole and write the final output ``Out`` (q's
    dtype, contiguous (batch, seqlen_q, nheads, d)) and ``Lse`` (contiguous (batch, nheads,
    seqlen_q)); the units after them are split ``num_splits`` ways, split fastest, into the partials
    ``Opart`` / ``Lpart`` at batch index ``b - part_b0`` (a unit is a (sequence, KV head, row block)).
    ``KV_FP8``: e4m3 caches, ``KDescale`` / ``VDescale`` float32 contiguous (batch, nheads_kv).
    ``BLOCK_D_TAIL`` > 0: q's and K's ``HEAD_DIM`` columns as ``BLOCK_D`` (a power of two below it)
    and a second block of ``BLOCK_D_TAIL`` for the rest, where one power-of-two block would be mostly
    padding (MLA's 576 = 512 + 64). ``HEAD_DIM_V`` / ``BLOCK_DV``: V's and the output's head dim and its
    padding where it differs from q's and K's (0: ``HEAD_DIM`` / ``BLOCK_D``)."""
    DV: tl.constexpr = HEAD_DIM_V if HEAD_DIM_V else HEAD_DIM
    BDV: tl.constexpr = BLOCK_DV if BLOCK_DV else BLOCK_D
    if PDL_WAIT:
        gdc_wait()  # launched early (programmatic dependent launch): the previous kernel's writes from here on
    pid = tl.program_id(0)
    tail = pid >= num_whole
    r = tl.maximum(pid - num_whole, 0)
    split = tl.where(tail, r % num_splits, 0)
    nsplit = tl.where(tail, num_splits, 1)
    rest = tl.where(tail, num_whole + r // num_splits, pid)
    m_block = rest % num_m_blocks
    rest = rest // num_m_blocks
    h_kv = rest % nheads_kv
    b = rest // nheads_kv
    b64 = b.to(tl.int64)
    bt_row = BlockTable + b64 * stride_btb

    if HAS_SEQLENS:
        end = tl.load(SeqLens + b) + seqlen_new
    else:
        end = b * 0 + seqlen_base + seqlen_new
    end = tl.minimum(tl.maximum(end, 0), capacity)
    lp = end * 0  # a tensor either way (it is reassigned under runtime ifs below)
    if HAS_LEFTPAD:
        lp = tl.minimum(tl.maximum(tl.load(Leftpad + b), 0), end)

    # packed rows -> (query token, query head)
    rows = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // group
    hq = h_kv * group + rows % group
    row_ok = tok < seqlen_q
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BDV)
    dv_ok = offs_dv < DV
    q_row = Q + b64 * stride_qb + tok[:, None].to(tl.int64) * stride_qm + hq[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_row + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    offs_t = offs_d
    t_ok = d_ok
    q_tail = q
    if BLOCK_D_TAIL:
        offs_t = BLOCK_D + tl.arange(0, BLOCK_D_TAIL)
        t_ok = offs_t < HEAD_DIM
        q_tail = tl.load(q_row + offs_t[None, :], mask=row_ok[:, None] & t_ok[None, :], other=0.0)

    slope_log2 = tl.zeros([BLOCK_M, 1], dtype=tl.float32)
    if HAS_ALIBI:
        slope = tl.load(alibi_slopes + b * stride_ab + hq, mask=row_ok, other=0.0).to(tl.float32)
        slope_log2 = (slope * LOG2E)[:, None]

    # key columns this row block can see: [lo, hi)
    lo = lp
    if window_left >= 0:
        first_tok = (m_block * BLOCK_M) // group
        lo = tl.maximum(lo, first_tok + end - seqlen_q - window_left)
    hi = end
    if window_right >= 0:
        last_tok = tl.minimum((m_block * BLOCK_M + BLOCK_M - 1) // group, seqlen_q - 1)
        hi = tl.minimum(hi, tl.maximum(last_tok + end - seqlen_q + window_right + 1, 0))
    c_lo = lo // BLOCK_N
    c_hi = tl.maximum(tl.cdiv(hi, BLOCK_N), c_lo)
    per_split = tl.cdiv(c_hi - c_lo, nsplit)
    c_start = c_lo + split * per_split
    c_end = tl.minimum(c_start + per_split, c_hi)

    out_scale = 1.0
    if KV_FP8:  # the sequence's descales: K's into the score scale, V's into the final normalisation
        qk_scale = qk_scale * tl.load(KDescale + b * nheads_kv + h_kv)
        out_scale = tl.load(VDescale + b * nheads_kv + h_kv)

    cache_row = b64
    if HAS_BATCH_IDX:
        cache_row = tl.minimum(tl.maximum(tl.load(CacheBatchIdx + b), 0), num_rows - 1).to(tl.int64)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BDV], dtype=tl.float32)
    k_head = h_kv.to(tl.int64) * stride_kh
    v_head = h_kv.to(tl.int64) * stride_vh
    acc, m_i, l_i = _split_chunks(acc, m_i, l_i, q, q_tail, K, V, k_desc, v_desc, bt_row, cache_row, h_kv, lp,
                                  end, tok, seqlen_q, c_start, c_end, num_rows, stride_kb, stride_kn, stride_vb,
                                  stride_vn, k_head, v_head, offs_d, d_ok, offs_t, t_ok, offs_dv, dv_ok, qk_scale,
                                  softcap, window_left, window_right, slope_log2, phi, BLOCK_D, BLOCK_N, PAGE_SIZE,
                                  PAGED, USE_TMA, UNIFIED, HAS_SOFTCAP, HAS_ALIBI, BLOCK_D_TAIL, BDV)
    if UNIFIED:
        # a row max outside phi's safe range (rows with no key are fine): redo this split exactly
        gap = m_i - phi
        unsafe = (m_i != float("-inf")) & ((gap > PHI_ABOVE) | (gap < -PHI_BELOW))
        if tl.max(unsafe.to(tl.int32), 0) > 0:
            acc, m_i, l_i = _split_chunks(
                tl.zeros([BLOCK_M, BDV], dtype=tl.float32), tl.full([BLOCK_M], float("-inf"), dtype=tl.float32),
                tl.zeros([BLOCK_M], dtype=tl.float32), q, q_tail, K, V, k_desc, v_desc, bt_row, cache_row, h_kv,
                lp, end, tok, seqlen_q, c_start, c_end, num_rows, stride_kb, stride_kn, stride_vb, stride_vn, k_head,
                v_head, offs_d, d_ok, offs_t, t_ok, offs_dv, dv_ok, qk_scale, softcap, window_left, window_right,
                slope_log2, phi, BLOCK_D, BLOCK_N, PAGE_SIZE, PAGED, USE_TMA, False, HAS_SOFTCAP, HAS_ALIBI,
                BLOCK_D_TAIL, BDV)
        else:
            m_i = tl.where(m_i == float("-inf"), m_i, phi)  # what was subtracted, for the lse

    if USE_PDL:
        gdc_launch_dependents()  # a hint: the merge grid may launch once every program has read its keys
    # rows (or whole splits) that saw no key: output 0, lse -inf
    out, lse = softmax_finish(acc, m_i, l_i, out_scale)
    tok64 = tok.to(tl.int64)
    hq64 = hq.to(tl.int64)
    if nsplit == 1:  # the final output and lse
        nheads = nheads_kv * group
        rows_out = (b64 * seqlen_q + tok64) * nheads + hq64
        tl.store(Out + rows_out[:, None] * DV + offs_dv[None, :], out.to(Out.dtype.element_ty),
                 mask=row_ok[:, None] & dv_ok[None, :])
        tl.store(Lse + (b64 * nheads + hq64) * seqlen_q + tok64, lse, mask=row_ok)
    else:
        split64 = split.to(tl.int64)
        bp64 = b64 - part_b0
        o_ptrs = (Opart + split64 * stride_os + bp64 * stride_ob + tok64[:, None] * stride_om
                  + hq64[:, None] * stride_oh + offs_dv[None, :])
        tl.store(o_ptrs, out, mask=row_ok[:, None] & dv_ok[None, :])
        tl.store(Lpart + split64 * stride_ls + bp64 * stride_lb + tok64 * stride_lm + hq64 * stride_lh, lse,
                 mask=row_ok)
