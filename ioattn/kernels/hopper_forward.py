"""Hopper forward in Gluon (FlashAttention-3 structure): the default forward on sm_90 where
``ioattn.plan.hopper.policy`` says so; compiled for sm_90 in CI (ahead of time, no GPU), run on the device by
tests/gpu/test_gpu.py.

One program per (query block, batch * head), or per SM for the persistent variant (``PERSISTENT``,
``_persistent_fwd``): a TMA producer warp fills a K / V ring; the consumer warpgroups (``PINGPONG``,
``NUM_WG``, ``ORDERED``: base, ping-pong, split, three-warpgroup ring) issue S = Q K^T and P V by wgmma,
their critical sections ordered by turn mbarriers so that one warpgroup's softmax overlaps another's
GEMMs. The structure, the turn and ring protocol and every compile-time option: docs/hopper-forward.md;
the host side (variants, tiles, options): ``ioattn.plan.hopper``.

Reference twin: ``ioattn.reference.tiled.flash2_forward``. Portable fallback: ``kernels/forward.py``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier

from ioattn.kernels.hopper_common import FP8_BLOCK_ROWS, TRACE_EVENTS, _io_dim, _prod_dim, _tile_layout
from ioattn.kernels.hopper_softmax import _window_tiles
from ioattn.kernels.hopper_fwd_tile import _consumer, _pingpong_consumer, _pp_shared, _producer, _split_ring, \
    _store_no_key_rows, _init_ring
from ioattn.kernels.hopper_persistent import _persistent_fwd
from ioattn.kernels.hopper_tiles import _block_lists, _kv_tile_count, _tile_bhm


@gluon.constexpr_function
def _p_layout(block_n):
    """e4m3 P's [64, block_n] buffer: rows of block_n bytes, swizzled as wgmma reads its A operand."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, block_n), element_bitwidth=8, rank=2)


@gluon.jit
def _fp8_scales(Descales, b, h, nheads, group, qk_scale, softcap_a, SOFTCAP: gl.constexpr, HEAD_DIM: gl.constexpr,
                m_start=0, blocks_q=1, blocks_k=1, FP8_BLOCKS: gl.constexpr = False):
    """This head's FP8 descales (``Descales``: fp32 (batch, nheads + 2 * nheads_kv)): Q's and K's folded
    into the scores' scale (``SOFTCAP``: into ``softcap_a``, through which the raw scores reach tanh),
    V's into the output's; and V^T's first row. ``FP8_BLOCKS``: Q's and K's
    per block of ``FP8_BLOCK_ROWS`` rows (``ioattn.fp8.descale_rows``'s block layout, ``blocks_q`` /
    ``blocks_k`` a head): Q's of the block from ``m_start`` folded here, K's left to each key tile
    (``_fp8_key_scales``). Returns (qk_scale, softcap_a, out_scale, vt_row0)."""
    nheads_kv = nheads // group
    if FP8_BLOCKS:
        drow = Descales + b * (nheads * blocks_q + nheads_kv * blocks_k + nheads_kv)
        qk_descale = gl.load(drow + h * blocks_q + m_start // FP8_BLOCK_ROWS)
        v_row = drow + nheads * blocks_q + nheads_kv * blocks_k
    else:
        drow = Descales + b * (nheads + 2 * nheads_kv)
        qk_descale = gl.load(drow + h) * gl.load(drow + nheads + h // group)
        v_row = drow + nheads + nheads_kv
    if SOFTCAP:
        softcap_a = softcap_a * qk_descale
    else:
        qk_scale = qk_scale * qk_descale
    out_scale = gl.load(v_row + h // group)  # P's multiplier cancels in O / l (``P_LOG2``)
    return qk_scale, softcap_a, out_scale, (b * nheads_kv + h // group) * HEAD_DIM


@gluon.jit
def _fp8_key_scales(Descales, b, h, nheads, group, blocks_q, blocks_k):
    """``FP8_BLOCKS``: where this head's K descales start (one per block of ``FP8_BLOCK_ROWS`` keys)."""
    nheads_kv = nheads // group
    return Descales + b * (nheads * blocks_q + nheads_kv * blocks_k + nheads_kv) + nheads * blocks_q + \
        (h // group) * blocks_k


# the magic numbers vary with the shape: one compiled kernel for all of them (no specialisation on 1
# or on divisibility by 16)
@gluon.jit(do_not_specialize=["walk_div", "walk_mul", "walk_shift", "head_mul", "head_shift"])
def hopper_fwd_kernel(q_desc, k_desc, v_desc, o_desc, Out, Lse, Cu_q, Cu_k, seqlen_q, seqlen_k, nheads, group,
                      stride_om, stride_lse_b, stride_lse_h, qk_scale, walk_div, walk_mul, walk_shift, head_mul,
                      head_shift,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr = False, NUM_WG: gl.constexpr = 2,
                      ORDERED: gl.constexpr = True, LEAN: gl.constexpr = False, COND_RESCALE: gl.constexpr = False,
                      RESCALE_BY_WARP: gl.constexpr = False, Q_IN_REGS: gl.constexpr = False,
                      DEFERRED_SUM: gl.constexpr = False, MASK_BRANCH: gl.constexpr = False,
                      PTX_BARRIERS: gl.constexpr = False, IS_VARLEN: gl.constexpr = False,
                      PERSISTENT: gl.constexpr = False, LPT: gl.constexpr = False, KV_TAIL: gl.constexpr = False,
                      EXP2_FMA: gl.constexpr = 0, ROW_STORES: gl.constexpr = False,
                      FEWER_MASKS: gl.constexpr = False, Q_BUFS: gl.constexpr = 1, PAIRED: gl.constexpr = False,
                      FAST_DIV: gl.constexpr = False, NO_KEY_WIDE: gl.constexpr = False,
                      KEY_MASKS: gl.constexpr = True, DIAG_TRIM: gl.constexpr = False,
                      WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = False, num_tiles=0, Walk=None,
                      win_left=0, win_right=0, softcap_a=0.0, ALIBI: gl.constexpr = False, Alibi=None,
                      stride_ab=0, alibi_unit=0.0, IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0,
                      k_hi_desc=None, v_hi_desc=None, Descales=None, Trace=None,
                      trace_sections=0, mods=None, blocks=None, SCORE_MOD: gl.constexpr = None,
                      MASK_MOD: gl.constexpr = None, SUB: gl.constexpr = 1, Q_BLOCK: gl.constexpr = 0,
                      FP8_BLOCKS: gl.constexpr = False, LONGEST_FIRST: gl.constexpr = False):
    """The Gluon Hopper forward. ``PINGPONG=False`` (launched with num_warps = 4 * BLOCK_M // 64): one
    consumer partition of BLOCK_M // 64 warpgroups in lockstep. ``PINGPONG=True`` (num_warps = 4,
    BLOCK_M = 64 * NUM_WG): ``NUM_WG`` consumer warpgroups of 64 rows each in separate partitions,
    ordered in a ring by NUM_WG mbarriers (``ORDERED`` False: free-running). All: one TMA producer warp.
    ``PERSISTENT``: at most one program per SM walking ``num_tiles`` tiles (``_persistent_fwd``).
    ``IS_VARLEN``: packed sequences by ``Cu_q`` / ``Cu_k`` (``seqlen_q`` / ``seqlen_k`` the maxima). The
    other constexprs (``LEAN`` and its options ``COND_RESCALE``, ``RESCALE_BY_WARP``, ``Q_IN_REGS``,
    ``DEFERRED_SUM``, ``MASK_BRANCH``, ``PTX_BARRIERS``, ``LPT``, ``KV_TAIL``, ``EXP2_FMA``, ``ROW_STORES``,
    ``FEWER_MASKS``, ``KEY_MASKS``, ``Q_BUFS``, ``PAIRED``, ``Walk``, ``FAST_DIV``, ``NO_KEY_WIDE``,
    ``DIAG_TRIM``, ``WINDOW``, ``SOFTCAP``, ``ALIBI``, ``IO_DIM``, ``PROD_DIM``, ``k_hi_desc``): see
    docs/hopper-forward.md, "Compile-time options"; the host sets them (``ioattn.plan.backends.hopper_forward``).
    FP8 (e4m3 descriptors; the ping-pong kernels): ``v_desc`` reads V^T as (batch * nheads_kv * d,
    keys), ``Descales`` fp32 (batch, nheads + 2 * nheads_kv) as the portable kernel's, or with
    ``FP8_BLOCKS`` its block layout (Q's and K's per block of ``FP8_BLOCK_ROWS`` rows, which BLOCK_M = 128
    and BLOCK_N divide: ``_fp8_scales``); P through a shared buffer a warpgroup (``hopper_fwd_tile._p_operand``). ``Trace``
    (int64, programs x NUM_WG x ``trace_sections`` x ``TRACE_EVENTS``; the one-tile ping-pong kernels): the
    schedule record, each consumer warpgroup's clock at the events of each of its critical sections
    (``hopper_fwd_tile._stamp``); None: no record, the kernel as it is launched for attention.
    ``SCORE_MOD`` / ``MASK_MOD`` (``ioattn.kernels.modgen``; the two-warpgroup one-tile ping-pong kernel,
    fixed lengths, 16-bit inputs): the user's functions, ``mods`` = (softmax_scale, the score's captures,
    the mask's); ``blocks``: a block mask's lists (``hopper_tiles._block_lists``), its blocks ``Q_BLOCK``
    queries by ``SUB`` key tiles. ``LONGEST_FIRST``: the tiles in the causal walk's order (the last query
    blocks first, over the whole grid with ``LPT``) without the causal mask."""
    D_IO: gl.constexpr = _io_dim(HEAD_DIM, IO_DIM)
    gl.static_assert(_prod_dim(HEAD_DIM, PROD_DIM) >= D_IO, "the products cover the tensors' columns")
    gl.static_assert(PROD_DIM == 0 or PINGPONG, "the split products: the ping-pong consumers")
    gl.static_assert(k_hi_desc is None or (PROD_DIM == 192 and v_hi_desc is not None and not KV_TAIL),
                     "the split ring: with the split products, both descriptors, whole key tiles")
    num_m = gl.cdiv(seqlen_q, BLOCK_M)
    gl.static_assert(PERSISTENT or ROW_STORES != 3, "the output's bulk copy: the persistent kernel only")
    # the one-tile path below is compiled (dead) after the persistent kernel's return too
    TILE_ROW_STORES: gl.constexpr = 0 if ROW_STORES == 3 else ROW_STORES
    gl.static_assert(KEY_MASKS or not (IS_CAUSAL or KV_TAIL or IS_VARLEN),
                     "key tiles unmasked: only without a causal mask, every key tile inside the sequence")
    gl.static_assert(not DIAG_TRIM or (PERSISTENT and IS_CAUSAL), "the diagonal trimmed: persistent, causal")
    gl.static_assert(not WINDOW or (PINGPONG and not PERSISTENT and not IS_CAUSAL and KEY_MASKS),
                     "a sliding window: the one-tile ping-pong kernels, masked tiles, not causal (the window (-1, 0))")
    gl.static_assert(not SOFTCAP or (PINGPONG and not PERSISTENT), "a softcap: the one-tile ping-pong kernels")
    gl.static_assert(not ALIBI or (PINGPONG and not PERSISTENT), "ALiBi: the one-tile ping-pong kernels")
    gl.static_assert(LEAN or not (COND_RESCALE or Q_IN_REGS or DEFERRED_SUM or MASK_BRANCH or PTX_BARRIERS),
                     "the lean softmax's options need it")
    gl.static_assert(COND_RESCALE or not RESCALE_BY_WARP, "RESCALE_BY_WARP decides the conditional rescaling")
    gl.static_assert(Trace is None or (PINGPONG and not PERSISTENT), "the schedule record: one-tile ping-pong kernels")
    MODS: gl.constexpr = SCORE_MOD is not None or MASK_MOD is not None
    gl.static_assert(not (MODS or blocks is not None) or (PINGPONG and not (PERSISTENT or IS_VARLEN)),
                     "score and mask functions, block masks: the one-tile ping-pong kernels, fixed lengths")
    gl.static_assert(blocks is None or Q_BLOCK % BLOCK_M == 0, "a block mask's query blocks hold whole query tiles")
    if PERSISTENT:
        gl.static_assert(PINGPONG and NUM_WG == 2 and not IS_VARLEN,
                         "persistent: the two-warpgroup ping-pong kernel, fixed-length batches")
        gl.static_assert(IS_CAUSAL or not PAIRED, "the paired walk is a causal order")
        gl.static_assert(Walk is None or (IS_CAUSAL and not PAIRED), "the walk table: causal, LPT-encoded tiles")
        _persistent_fwd(q_desc, k_desc, v_desc, o_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                        stride_lse_b, stride_lse_h, qk_scale, num_tiles, num_m, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                        IS_CAUSAL, ORDERED, KV_TAIL, EXP2_FMA, LEAN, COND_RESCALE, RESCALE_BY_WARP, Q_IN_REGS,
                        DEFERRED_SUM, MASK_BRANCH, PTX_BARRIERS, ROW_STORES, FEWER_MASKS, Q_BUFS, PAIRED,
                        ((walk_div, walk_mul, walk_shift), (nheads, head_mul, head_shift)) if FAST_DIV else None,
                        NO_KEY_WIDE, KEY_MASKS, DIAG_TRIM, Walk, IO_DIM, PROD_DIM, k_hi_desc, v_hi_desc)
        return
    # (LONGEST_FIRST: the causal walk's order without its mask, for a block mask's rows)
    b, h, m_block = _tile_bhm(gl.program_id(0), num_m, gl.num_programs(0), nheads, IS_CAUSAL or LONGEST_FIRST, LPT)
    m_start = m_block * BLOCK_M
    if FP8_BLOCKS:
        max_seqlen_q, max_seqlen_k = seqlen_q, seqlen_k  # (the longest: the block descales' counts)
    if IS_VARLEN:
        start_q = gl.load(Cu_q + b)
        seqlen_q = gl.load(Cu_q + b + 1) - start_q
        start_k = gl.load(Cu_k + b)
        seqlen_k = gl.load(Cu_k + b + 1) - start_k
        if m_start >= seqlen_q:  # past this sequence's queries (the grid covers the longest): nothing
            return
    n_lo = 0
    n_tiles = _kv_tile_count(m_start, seqlen_q, seqlen_k, BLOCK_M, BLOCK_N, IS_CAUSAL)
    if WINDOW:  # the band's key tiles: from the one the first row's left edge falls in
        n_lo, n_tiles = _window_tiles(m_start, seqlen_q, seqlen_k, win_left, win_right, BLOCK_M, BLOCK_N)
    if blocks is not None:  # a block mask: its listed key blocks, partial ones first
        lists, n_tiles = _block_lists(blocks, b, h, m_start, SUB, Q_BLOCK)
    else:
        lists: gl.constexpr = None
    if MODS:
        tile_mods = (b, h, mods[0], mods[1], mods[2])
    else:
        tile_mods: gl.constexpr = None
    # masks: the last tile always (key end, diagonal); under a causal mask also the tiles the
    # diagonal crosses (checked per tile); no other tile can be cut, since only the last one reaches
    # the key end
    MASK_ALL: gl.constexpr = IS_CAUSAL

    if LEAN:
        # 32 bits (one register, not two, held across the key loop): the launcher's lse is a
        # contiguous (batch, nheads, seqlen_q) fp32 tensor, and 2^31 of its elements would mean a q
        # of 2^31 x 64 bf16 values (256 GiB) at the head dim 64 "wg3" serves
        gl.static_assert(PINGPONG, "LEAN is a ping-pong option")
        lse_base = b * stride_lse_b + h * stride_lse_h
    else:
        lse_base = b.to(gl.int64) * stride_lse_b + h.to(gl.int64) * stride_lse_h
    if IS_VARLEN:
        lse_base += start_q  # lse (nheads, total_q): the sequence's rows from its packed start
        q_row0 = start_q + m_start
    else:
        q_row0 = b * seqlen_q + m_start
    q_col = h * D_IO
    alibi_a = 0.0
    if ALIBI:  # this (batch, head)'s slope in the scores' units: alibi_unit = -1 / (softmax_scale or cap)
        alibi_a = gl.load(Alibi + b * stride_ab + h) * alibi_unit
    if n_tiles <= 0:  # rows that see no key (causal or windowed, seqlen_q > seqlen_k): output 0, lse -inf
        _store_no_key_rows(Out, Lse, lse_base, q_row0, m_start, q_col, seqlen_q, stride_om, BLOCK_M, HEAD_DIM,
                           IO_DIM=IO_DIM)
        return

    dtype: gl.constexpr = q_desc.dtype
    FP8: gl.constexpr = dtype == gl.float8e4nv
    if FP8:
        # (packed sequences: V^T holds each in its own zero-padded rows, so its tiles need no tail)
        gl.static_assert(PINGPONG and not (PERSISTENT or KV_TAIL or LEAN or ALIBI or PROD_DIM or MODS),
                         "FP8: the one-tile ping-pong kernels, whole V^T tiles")
        gl.static_assert(not FP8_BLOCKS or (BLOCK_M == FP8_BLOCK_ROWS and FP8_BLOCK_ROWS % BLOCK_N == 0),
                         "FP8 block descales: a query tile one block, a key tile within one")
        if FP8_BLOCKS:
            blocks_q, blocks_k = gl.cdiv(max_seqlen_q, FP8_BLOCK_ROWS), gl.cdiv(max_seqlen_k, FP8_BLOCK_ROWS)
            qk_scale, softcap_a, out_scale, vt_row0 = _fp8_scales(Descales, b, h, nheads, group, qk_scale,
                                                                  softcap_a, SOFTCAP, HEAD_DIM, m_start, blocks_q,
                                                                  blocks_k, True)
            k_scales = _fp8_key_scales(Descales, b, h, nheads, group, blocks_q, blocks_k)
        else:
            qk_scale, softcap_a, out_scale, vt_row0 = _fp8_scales(Descales, b, h, nheads, group, qk_scale,
                                                                  softcap_a, SOFTCAP, HEAD_DIM)
            k_scales: gl.constexpr = None
    else:
        out_scale: gl.constexpr = None
        vt_row0 = 0
        k_scales: gl.constexpr = None
    if IS_VARLEN:
        kv_row0 = start_k
    else:
        kv_row0 = b * seqlen_k
    kv_col = (h // group) * D_IO
    if PINGPONG:
        # NUM_WG consumer warpgroups, 64 query rows each, sharing the K/V ring: every slot use is
        # released by all of them (empty barriers count NUM_WG). q_bar[w]: warpgroup w's own Q tile
        # landed. turn[w]: warpgroup w may issue its next GEMM pair (one arrive, by warpgroup w - 1
        # mod NUM_WG: the ring WG0 -> WG1 (-> WG2) -> WG0 ..., see _turn_wait).
        gl.static_assert((NUM_WG == 2) | (NUM_WG == 3), "two (ping-pong) or three consumer warpgroups")
        gl.static_assert(BLOCK_M == 64 * NUM_WG, "one consumer warpgroup per 64 query rows")
        WG_ROWS: gl.constexpr = BLOCK_M // NUM_WG
        gl.static_assert(q_desc.block_type.shape[-2] == WG_ROWS, "ping-pong: Q descriptor block is [64, HEAD_DIM]")
        q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty, turn = _pp_shared(
            q_desc, k_desc, v_desc, NUM_WG, WG_ROWS, BLOCK_N, HEAD_DIM, STAGES, 1, k_hi_desc)
        if FP8:  # each consumer warpgroup's P (``_p_operand``)
            p_smem = gl.allocate_shared_memory(dtype, [NUM_WG, WG_ROWS, BLOCK_N], _p_layout(BLOCK_N))
        else:
            p_smem: gl.constexpr = None
        if k_hi_desc is not None:  # the split ring's high columns (``_split_ring``)
            kv_hi, kv_hi_load = _split_ring(k_hi_desc, v_hi_desc, BLOCK_N, STAGES)
        else:
            kv_hi: gl.constexpr = None
            kv_hi_load: gl.constexpr = None
        # Register budget: 65536 per SM; the producer warp is padded to a warpgroup (Triton), so
        # NUM_WG + 1 warpgroups of 128 threads; the producer at 24, the consumers share the rest in
        # multiples of 8: (65536 / 128 - 24) / NUM_WG rounded down to 8.
        # - NUM_WG = 2 (FA3's figures for two MMA warpgroups): 240; 24 * 128 + 240 * 256 = 64512.
        # - NUM_WG = 3 (FA3's d = 64: 160): 160; 24 * 128 + 160 * 384 = 64512 <= 65536, while 168
        #   would need 67584. Triton's allocator (AllocateWarpGroups) hands the 1024 left over to the
        #   default partition (warpgroup 0): (65536 - 24 * 128 - 2 * 160 * 128) / 128 = 168.
        PRODUCER_REGS: gl.constexpr = 24
        CONSUMER_REGS: gl.constexpr = (65536 // 128 - PRODUCER_REGS) // NUM_WG // 8 * 8
        # Partition w < NUM_WG: consumer warpgroup w (w = 0: the default partition, the kernel's 4
        # warps), rows [64 w, 64 w + 64) of the block, waiting on turn[w] and passing to turn[w + 1];
        # the last entry: the producer. (Gluon builds lists only from tuple comprehensions, hence the
        # index tuple and the conditional.)
        gl.warp_specialize(
            [(_pingpong_consumer, (q_desc, q_smem.index(w), q_bar.index(w), k_smem, v_smem, k_ready, k_empty, v_ready,
                                   v_empty, turn.index(w), turn.index((w + 1) % NUM_WG), Out, Lse,
                                   q_row0 + w * WG_ROWS, q_col, m_start + w * WG_ROWS, seqlen_q, seqlen_k, n_lo,
                                   n_tiles, stride_om, lse_base, qk_scale, HEAD_DIM, WG_ROWS, BLOCK_N, STAGES,
                                   IS_CAUSAL, MASK_ALL, 1 if w == 0 else 0, ORDERED, LEAN, COND_RESCALE,
                                   RESCALE_BY_WARP, Q_IN_REGS, DEFERRED_SUM, MASK_BRANCH, PTX_BARRIERS, EXP2_FMA,
                                   TILE_ROW_STORES, FEWER_MASKS, KEY_MASKS, WINDOW, win_left, win_right, SOFTCAP,
                                   softcap_a, ALIBI, alibi_a, IO_DIM, PROD_DIM, kv_hi, out_scale,
                                   p_smem.index(w) if FP8 else None,
                                   None if Trace is None else
                                   Trace + (gl.program_id(0) * NUM_WG + w) * (trace_sections * TRACE_EVENTS),
                                   tile_mods, lists, SCORE_MOD, MASK_MOD, SUB, k_scales))
             if w < NUM_WG else
             (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col,
                          n_lo, n_tiles, seqlen_k, BLOCK_N, STAGES, KV_TAIL, 0, 0, kv_hi_load, vt_row0, lists, SUB))
             for w in (0, 1, 2, 3)[:NUM_WG + 1]],
            [4] * (NUM_WG - 1) + [1], [CONSUMER_REGS] * (NUM_WG - 1) + [PRODUCER_REGS])
    else:
        _tiled_fwd(q_desc, k_desc, v_desc, Out, Lse, q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles,
                   stride_om, stride_lse_h, lse_base, qk_scale, kv_row0, kv_col, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                   IS_CAUSAL, MASK_ALL, EXP2_FMA, TILE_ROW_STORES, KEY_MASKS, KV_TAIL, IO_DIM)


@gluon.jit
def _tiled_fwd(q_desc, k_desc, v_desc, Out, Lse, q_row0, q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles,
               stride_om, stride_lse_h, lse_base, qk_scale, kv_row0, kv_col, HEAD_DIM: gl.constexpr,
               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
               MASK_ALL: gl.constexpr, EXP2_FMA: gl.constexpr, TILE_ROW_STORES: gl.constexpr,
               KEY_MASKS: gl.constexpr, KV_TAIL: gl.constexpr, IO_DIM: gl.constexpr):
    """``PINGPONG=False``: one consumer partition of BLOCK_M // 64 warpgroups in lockstep and the TMA
    producer warp, over one query tile's shared Q, K / V ring and barriers."""
    dtype: gl.constexpr = q_desc.dtype
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], _tile_layout(q_desc.layout))
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], _tile_layout(k_desc.layout))
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], _tile_layout(v_desc.layout))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    v_ready = gl.allocate_shared_memory(gl.int64, [STAGES + 1, 1], bar_layout)  # + v_tail (_producer)
    v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], bar_layout)
    mbarrier.init(q_bar, count=1)
    _init_ring(k_ready, k_empty, v_ready, v_empty, STAGES, 1)
    fence_async_shared()
    gl.warp_specialize([
        (_consumer, (q_desc, q_smem, q_bar, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, Out, Lse, q_row0,
                     q_col, m_start, seqlen_q, seqlen_k, n_lo, n_tiles, stride_om, stride_lse_h, lse_base,
                     qk_scale, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES, IS_CAUSAL, MASK_ALL, EXP2_FMA,
                     TILE_ROW_STORES, KEY_MASKS, IO_DIM)),
        (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col,
                     n_lo, n_tiles, seqlen_k, BLOCK_N, STAGES, KV_TAIL)),
    ], [1], [24])
