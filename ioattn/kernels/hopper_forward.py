"""Hopper forward in Gluon (FlashAttention-3 structure): the default forward on sm_90 where
``ioattn.hopper.policy`` says so; compiled for sm_90 in CI (ahead of time, no GPU), run on the device by
tests/gpu/test_gpu.py.

One program per (query block, batch * head), or per SM for the persistent variant (``PERSISTENT``,
``_persistent_fwd``): a TMA producer warp fills a K / V ring; the consumer warpgroups (``PINGPONG``,
``NUM_WG``, ``ORDERED``: base, ping-pong, split, three-warpgroup ring) issue S = Q K^T and P V by wgmma,
their critical sections ordered by turn mbarriers so that one warpgroup's softmax overlaps another's
GEMMs. The structure, the turn and ring protocol and every compile-time option: docs/hopper-forward.md;
the host side (variants, tiles, options): ``ioattn.hopper``.

Reference twin: ``ioattn.reference.tiled.flash2_forward``. Portable fallback: ``kernels/forward.py``.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_init, warpgroup_mma_wait)

from ioattn import _compat
from ioattn.kernels import hopper_flags as _flags
from ioattn.kernels import ptx_barriers as _ptx_barriers
from ioattn.kernels import constants

LOG2E = gl.constexpr(constants.LOG2E)
LN2 = gl.constexpr(constants.LN2)
# ``LEAN``'s option bits (``ioattn.hopper``: the host sets them)
LEAN_COND_RESCALE = gl.constexpr(_flags.LEAN_COND_RESCALE)
LEAN_BY_WARP = gl.constexpr(_flags.LEAN_BY_WARP)
LEAN_Q_REGS = gl.constexpr(_flags.LEAN_Q_REGS)
LEAN_DEFERRED_SUM = gl.constexpr(_flags.LEAN_DEFERRED_SUM)
LEAN_MASK_BRANCH = gl.constexpr(_flags.LEAN_MASK_BRANCH)
LEAN_PTX_BARRIERS = gl.constexpr(_flags.LEAN_PTX_BARRIERS)
# acts only on PTX carrying its marker (``_ptx_barriers_marker``). Its compile-stage hook follows Triton
# 3.6's protocol (from 3.7 on Triton also calls the hook with no arguments, for a cache key): on a Triton
# the Gluon kernels do not run on (``_compat.gluon_status``) it stays out of every kernel's compile.
if _compat.gluon_status()[0]:
    _ptx_barriers.install()
PTX_BARRIERS_MARKER = gl.constexpr(_ptx_barriers.MARKER)  # a constexpr global: in Triton's cache key


@gluon.constexpr_function
def _io_dim(head_dim, io_dim):
    """The tensors' head dim: ``IO_DIM`` where the kernel computes at a larger ``HEAD_DIM`` (the
    columns past it zero-filled by TMA, ``_load_rows``), else ``HEAD_DIM``."""
    return io_dim if io_dim else head_dim


@gluon.constexpr_function
def _tile_layout(layout):
    """The shared layout of the [rows, HEAD_DIM] tiles a descriptor with ``layout`` fills: its own, or
    for a head-padded descriptor (rank 3, ``_load_rows``) the same swizzle at rank 2."""
    if layout.rank == 2:
        return layout
    return gl.NVMMASharedLayout(swizzle_byte_width=layout.swizzle_byte_width,
                                element_bitwidth=layout.element_bitwidth, rank=2)


@gluon.jit
def _load_rows(desc, row, col, bar, dst, c0=0):
    """TMA copy of the [rows, HEAD_DIM] tile at (``row``, ``col``) of the (rows, nheads * d) view into
    ``dst``, completing on ``bar`` (``col``: a head's first column, head * d). A 3-D ``desc``
    (``ioattn.hopper.padded_rows_desc``: the tensors' head dim d below the kernel's HEAD_DIM, a
    multiple of 8) reads the same view with its column split into 8-column groups and an offset
    bounded by d, so the columns past d land as zeros (TMA's fill of a box past the bounds): the
    kernel computes at HEAD_DIM on zero-padded heads without a padded copy. ``c0``: the box's first
    column within the head (the K / V tiles' columns 128: in buffers of their own, ``_split_ring``)."""
    if len(desc.block_type.shape) == 3:
        tma.async_copy_global_to_shared(desc, [col // 8, row, c0], bar,
                                        dst.reshape([1, dst.shape[0], dst.shape[1]]))
    else:
        tma.async_copy_global_to_shared(desc, [row, col + c0], bar, dst)


@gluon.jit
def _producer(k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col, n_lo,
              n_tiles, seqlen_k, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, KV_TAIL: gl.constexpr, g0=0, tails=0,
              kv_hi=None):
    """K and V tiles n_lo .. n_lo + n_tiles - 1 into the ring; ``g0``: ring uses before this call
    (a persistent program's running count), which fixes each tile's slot and phase. The V tile the
    key end falls in (a sequence length not a multiple of BLOCK_N) lands instead on ``v_tail`` (the
    extra barrier at ``v_ready[STAGES]``), its rows past the end are zeroed here (``_zero_v_tail``),
    and only then is it released to the consumers, by a plain arrive on its ``v_ready`` (count 1, no
    bytes pending); compiled only with ``KV_TAIL`` (the host sets it for varlen calls and key lengths
    not a multiple of BLOCK_N). ``tails``: such tiles before this call (``v_tail``'s phase); returns
    the count after it. ``kv_hi`` (the split ring, ``_split_ring``): (k_hi_desc, v_hi_desc, k_hi, v_hi),
    each tile's columns 128: in rings of their own, loaded beside the first 128 on the same barriers."""
    tails = tails + 0 * n_tiles  # a runtime integer whatever the caller passed (loop-carried)
    k_bytes: gl.constexpr = k_desc.block_type.nbytes + (0 if kv_hi is None else kv_hi[0].block_type.nbytes)
    v_bytes: gl.constexpr = v_desc.block_type.nbytes + (0 if kv_hi is None else kv_hi[1].block_type.nbytes)
    C_HI: gl.constexpr = k_desc.block_type.shape[-1]  # the split ring's high columns start here
    v_tail = v_ready.index(STAGES)
    for j in range(n_tiles):
        i = g0 + j
        s = i % STAGES
        reuse_phase = ((i // STAGES) & 1) ^ 1  # the consumers' release of this slot's previous tile
        row = kv_row0 + (n_lo + j) * BLOCK_N
        mbarrier.wait(k_empty.index(s), reuse_phase, pred=i >= STAGES)
        mbarrier.expect(k_ready.index(s), k_bytes)
        _load_rows(k_desc, row, kv_col, k_ready.index(s), k_smem.index(s))
        if kv_hi is not None:
            _load_rows(kv_hi[0], row, kv_col, k_ready.index(s), kv_hi[2].index(s), C_HI)
        mbarrier.wait(v_empty.index(s), reuse_phase, pred=i >= STAGES)
        if KV_TAIL and (n_lo + j + 1) * BLOCK_N > seqlen_k:
            mbarrier.expect(v_tail, v_bytes)
            _load_rows(v_desc, row, kv_col, v_tail, v_smem.index(s))
            if kv_hi is not None:
                _load_rows(kv_hi[1], row, kv_col, v_tail, kv_hi[3].index(s), C_HI)
            mbarrier.wait(v_tail, tails & 1)
            tails += 1
            _zero_v_tail(v_smem.index(s), seqlen_k - (n_lo + j) * BLOCK_N, BLOCK_N, v_desc.block_type.shape[-1])
            if kv_hi is not None:
                _zero_v_tail(kv_hi[3].index(s), seqlen_k - (n_lo + j) * BLOCK_N, BLOCK_N,
                             kv_hi[1].block_type.shape[-1])
            mbarrier.arrive(v_ready.index(s), count=1)
        else:
            mbarrier.expect(v_ready.index(s), v_bytes)
            _load_rows(v_desc, row, kv_col, v_ready.index(s), v_smem.index(s))
            if kv_hi is not None:
                _load_rows(kv_hi[1], row, kv_col, v_ready.index(s), kv_hi[3].index(s), C_HI)
    return tails


@gluon.jit
def _zero_v_tail(v_tile, valid, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr):
    """Rows >= ``valid`` of a V tile in shared memory set to 0: keys past the sequence's end, which
    the TMA box read from the next sequence's (or batch element's) rows. Their probabilities are 0,
    but 0 x NaN is NaN in the P V product, so a NaN or inf there would reach this sequence's output.
    By the producer warp (a consumer warpgroup has no registers to spare at the last tile: the
    three-warpgroup kernel spilled); the rows the end falls in are read, masked and written back.
    Then a proxy fence (the consumers' wgmma reads through the async proxy; the arrive that follows
    orders them after it) and a barrier over the warp."""
    # [8, 64] pieces: 8 rows (the 128-byte swizzle's atom) x 64 columns (one swizzle span; the tile
    # is stored as HEAD_DIM / 64 such column groups), 16 elements a thread in one warp
    ROWS: gl.constexpr = 8
    COLS: gl.constexpr = 64
    zl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
    zeros = gl.zeros([ROWS, COLS], v_tile.dtype, layout=zl)
    for r in gl.static_range(BLOCK_N // ROWS):
        if (r + 1) * ROWS > valid:
            rows = r * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, zl))
            for g in gl.static_range(HEAD_DIM // COLS):
                piece = v_tile.slice(r * ROWS, ROWS).slice(g * COLS, COLS, dim=1)
                if r * ROWS >= valid:  # wholly past the end
                    piece.store(zeros)
                else:  # the piece the end falls in
                    piece.store(gl.where((rows < valid)[:, None], piece.load(zl), zeros))
    fence_async_shared()
    gl.thread_barrier()


# exp2 on the FMA units (``EXP2_FMA``, FlashAttention-4's relief of the MUFU unit): 2**x = 2**n 2**f
# with n = round(x), f = x - n in [-1/2, 1/2]. Adding 1.5 * 2**23 rounds x to an integer (the sum's
# unit in the last place is 1, round-to-nearest), whose low mantissa bits then hold n (two's
# complement, mod 2**23); 2**f is the cubic 1 + f (C1 + f (C2 + f C3)), a fit of its relative error
# with the constant term fixed at 1 (so 2**0 is exactly 1), by ``ioattn.reference.exp2_poly``
# (``fit_exp2_cubic``, which also states the error bound); 2**n is added to the cubic's exponent bits.
EXP2_ROUND = gl.constexpr(12582912.0)  # 1.5 * 2**23
EXP2_C1 = gl.constexpr(0.6932829022407532)
EXP2_C2 = gl.constexpr(0.2422109991312027)
EXP2_C3 = gl.constexpr(0.05500893294811249)


@gluon.jit
def _exp2_poly(x):
    """2**x for x <= 1/2 without the MUFU unit. Eight instructions as compiled for sm_90 (FMNMX, three
    FADD, three FFMA, one LEA: the FP32 pipe takes 128 a clock per SM, the integer/ALU pipe 64)
    where MUFU.EX2 is one instruction but 16 results a clock per SM. Maximum relative error 1.02e-4
    for x in [-126, 1/2] (the cubic's; P is then rounded to bf16, 2**-8 = 3.9e-3, or fp16, 2**-11 =
    4.9e-4, for P V); exactly 2**x at integers, 1 at x = 0. x is clamped at -127 first, where n =
    -127 and f = 0 give the bits 0: 0.0 for -inf (masked scores) and everything below -127; between
    -127 and -126 the result is a subnormal below 2**-126 (where MUFU.EX2 flushes to 0)."""
    x = gl.maximum(x, -127.0)
    r = x + EXP2_ROUND
    f = x - (r - EXP2_ROUND)
    q = 1.0 + f * (EXP2_C1 + f * (EXP2_C2 + f * EXP2_C3))
    return (q.to(gl.int32, bitcast=True) + (r.to(gl.int32, bitcast=True) << 23)).to(gl.float32, bitcast=True)


@gluon.jit
def _exp2_tile(x, FMA_COLS: gl.constexpr):
    """exp2 of a [rows, N] tile, its last ``FMA_COLS`` columns by ``_exp2_poly`` on the FMA units and
    the rest by MUFU.EX2, so that both units work at once (``FMA_COLS`` = 0: ``gl.exp2`` alone).
    ``FMA_COLS`` must be N / 2**k: the tile is halved by its column index's top bit, k times, the
    last half of each halving going on, the first to MUFU. In the wgmma
    accumulator layout a thread holds every 8-column group of its rows, so the column index's bits
    from 8 up are register bits: a halving (reshape to [rows, 2, N / 2], the size-2 dimension moved
    last, gl.split) and the join back are register renamings, which the final conversion to the
    input's layout asserts (``assert_trivial``)."""
    N: gl.constexpr = x.shape[1]
    gl.static_assert((FMA_COLS >= 0) & (FMA_COLS <= N), "EXP2_FMA: columns of the key tile")
    if FMA_COLS == 0:
        y = gl.exp2(x)
    elif FMA_COLS == N:
        y = _exp2_poly(x)
    else:
        gl.static_assert(FMA_COLS <= N // 2, "EXP2_FMA: the key tile's columns / 2**k")
        M: gl.constexpr = x.shape[0]
        lo, hi = gl.split(x.reshape([M, 2, N // 2]).permute(0, 2, 1))
        lo = gl.exp2(lo)
        hi = _exp2_tile(hi, FMA_COLS)
        y = gl.join(lo, hi).permute(0, 2, 1).reshape([M, N])
        y = gl.convert_layout(y, x.type.layout, assert_trivial=True)
    return y


# FlashAttention-4's conditional rescaling (the kernel's ``LEAN`` bit 1, ``_softmax_tile`` and
# ``_rescale_rows``): a row's running max moves only when a key tile raises it by more than
# ``RESCALE_TAU`` (log2 units); otherwise the stale max stays, p = exp2(s - m) <= 2**RESCALE_TAU = 256
# (exact in bf16 and fp16, whose P V products accumulate in fp32), alpha is exactly 1 and the
# accumulator's rescale is skipped. The final normalisation O / l uses the same stale max in O and l,
# so the result is exact: only the rounding of P moves (relative, the same at any magnitude). FA4's
# value of tau (8, a factor 256).
RESCALE_TAU = gl.constexpr(8.0)
# the rescale's branch covers this many of a thread's accumulator elements (a 64-row warpgroup holds
# HEAD_DIM / 2: one branch at d = 64, two at 128, four at 256); at 8 ptxas turned the branches into
# predicated multiplies, which still take their issue slots; at 32 it keeps a real branch.
RESCALE_PACK = gl.constexpr(32)


@gluon.constexpr_function
def _rescale_asm(pack, by_warp):
    """PTX for ``pack`` elements: outputs $0..pack-1, the accumulator inputs $pack..2 pack-1 tied to
    them (the same registers), the row factors $2 pack..3 pack-1 and the flags $3 pack..4 pack-1 (all
    equal: one is tested). Where the flag is 0 the code branches over the multiplies and keeps the
    registers as they were; ``by_warp``: the flag is the warp's (``bra.uni``: no divergence to
    handle), else the thread's."""
    mul = " ".join(f"mul.f32 ${i}, ${i}, ${2 * pack + i};" for i in range(pack))
    bra = "bra.uni" if by_warp else "bra"
    return f"{{ .reg .pred skip; setp.eq.u32 skip, ${3 * pack}, 0; @skip {bra} RESCALED; {mul} RESCALED: }}"


@gluon.constexpr_function
def _rescale_constraints(pack):
    return ",".join(["=f"] * pack + [str(i) for i in range(pack)] + ["f"] * pack + ["r"] * pack)


@gluon.constexpr_function
def _rescale_flag_asm(by_warp):
    """PTX for a thread's two row factors ($2, $3): $0 = $1 = 1 if either is not 1, else 0;
    ``by_warp``: 1 if any thread of the warp has one (``vote.sync.any``)."""
    vote = "vote.sync.any.pred p, p, 0xffffffff; " if by_warp else ""
    return ("{ .reg .pred p, q; setp.ne.f32 p, $2, 0f3F800000; setp.ne.f32 q, $3, 0f3F800000; "
            f"or.pred p, p, q; {vote}selp.u32 $0, 1, 0, p; mov.b32 $1, $0; }}")


@gluon.jit
def _rescale_rows(o, alpha, COND: gl.constexpr, BY_WARP: gl.constexpr = False):
    """O's rows times alpha (alpha in S's row layout). ``COND`` (conditional rescaling): the
    multiplies are branched over where every row has alpha == 1: each thread's two rows
    (``BY_WARP`` False: a warp whose threads disagree runs the multiplies for those that need them,
    as without the option, and the branch is divergent, with its convergence barrier), or all the
    warp's (``BY_WARP``: one vote, a uniform branch; a warp with one such row multiplies every row,
    the others' by exactly 1). Never the warpgroup's (a block-wide decision costs barriers a tile:
    docs/decisions/conditional-rescale.md). In the 64-row wgmma layout of four warps a thread holds two rows
    (r and r + 8 of its warp's 16), which the flag's one asm instance (``pack=2``) sees together."""
    a = gl.convert_layout(alpha, gl.SliceLayout(1, o.type.layout))
    if COND:
        gl.static_assert(o.shape[0] == 16 * gl.num_warps(), "a thread's rows: two of its warp's 16")
        # one branch over a thread's whole share where it is smaller (the 32-column accumulator of the
        # products over 96 of 128 columns: 16 a thread)
        PACK: gl.constexpr = RESCALE_PACK if o.shape[1] // 2 >= RESCALE_PACK else o.shape[1] // 2
        gl.static_assert(o.shape[1] // 2 % PACK == 0, "the branch's elements divide a thread's (d / 2)")
        flag = gl.inline_asm_elementwise(_rescale_flag_asm(BY_WARP), "=r,=r,f,f", [a], dtype=gl.int32,
                                         is_pure=True, pack=2)
        o = gl.inline_asm_elementwise(_rescale_asm(PACK, BY_WARP), _rescale_constraints(PACK),
                                      [o, a[:, None], flag[:, None]], dtype=gl.float32, is_pure=True,
                                      pack=PACK)
    else:
        o = o * a[:, None]
    return o


@gluon.jit
def _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d,
                  MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr, LEAN: gl.constexpr = False,
                  EXP2_FMA: gl.constexpr = 0, KEY_END: gl.constexpr = True, WINDOW: gl.constexpr = False,
                  win_left=0, win_right=0):
    """Scale (log2 domain), mask, online-softmax step: returns (p, alpha, m_new, l_new). ``WINDOW`` (a
    sliding window, ``IS_CAUSAL`` False): the masked form also keeps key j for row i only where
    i + off - win_left <= j <= i + off + win_right (off = seqlen_k - seqlen_q; an unbounded side comes as
    a bound past every key). ``EXP2_FMA``: p's exponentials of that many of the tile's columns on the FMA
    units (``_exp2_tile``). ``KEY_END`` False (causal only): no key-end test; a stored row r < seqlen_q
    sees keys up to r + seqlen_k - seqlen_q <= seqlen_k - 1, so the diagonal test implies it (rows past
    seqlen_q, never stored, may then see keys past the end, which reach only their own row).
    ``LEAN`` (the same values up to rounding): the scale folded into the exponent (one FFMA an element,
    the row max on raw scores, which needs scale >= 0) and the masks on per-register column constants
    (``_mask_scores``: ``cols & ~6`` a constant per register, ``cols & 6`` one value per thread), so no
    per-column registers live across the key loop, which 160-register consumers cannot afford."""
    gl.static_assert(KEY_END or IS_CAUSAL, "without the diagonal test the key end is the only mask")
    if LEAN:
        if MASKED:
            s = _mask_scores(s, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d, IS_CAUSAL, KEY_END, WINDOW,
                             win_left, win_right)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
        if LEAN & LEAN_COND_RESCALE:  # conditional rescaling: the max moves only by more than RESCALE_TAU (a first
            m_new = gl.where(m_new > m_i + RESCALE_TAU, m_new, m_i)  # key: -inf + tau = -inf, it moves)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 gives 0, not NaN
        x = s * qk_scale - m_use[:, None]
    else:
        s = s * qk_scale
        if MASKED:
            rows = (m_start + rows_1d)[:, None]
            cols = (n_start + cols_1d)[None, :]
            if IS_CAUSAL:
                keep = cols <= rows + (seqlen_k - seqlen_q)
                if KEY_END:
                    keep = keep & (cols < seqlen_k)
            else:
                keep = cols < seqlen_k
                if WINDOW:
                    keep = keep & (cols <= rows + (seqlen_k - seqlen_q + win_right))
                    keep = keep & (cols >= rows + (seqlen_k - seqlen_q - win_left))
            s = gl.where(keep, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 gives 0, not NaN
        x = s - m_use[:, None]
    if EXP2_FMA == 0:  # MUFU.EX2 alone, called here and not through _exp2_tile: the default kernel's code
        p = gl.exp2(x)  # and debug labels stay as they were without the option (ptxas schedules by them)
    else:
        p = _exp2_tile(x, EXP2_FMA)
    alpha = gl.exp2(m_i - m_use)
    if LEAN & LEAN_DEFERRED_SUM:  # l kept as each thread's partial sums (``_thread_row_sums``), the quad's sum deferred
        l_new = l_i * gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout),
                                        assert_trivial=True)[:, None] + _thread_row_sums(p)
    else:
        l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@gluon.jit
def _mask_scores(s, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d, IS_CAUSAL: gl.constexpr,
                 KEY_END: gl.constexpr = True, WINDOW: gl.constexpr = False, win_left=0, win_right=0):
    """The lean softmax's mask (``_softmax_tile``): raw scores of keys a row may not see set to -inf."""
    hi = cols_1d & ~6
    lo = cols_1d & 6
    if IS_CAUSAL:
        limit = m_start + rows_1d + (seqlen_k - seqlen_q) - n_start
        keep = hi[None, :] <= limit[:, None] - lo[None, :]
        if KEY_END:
            keep = keep & (hi[None, :] < (seqlen_k - n_start - lo)[None, :])
    else:
        keep = hi[None, :] < (seqlen_k - n_start - lo)[None, :]
        if WINDOW:  # both edges, per row: hi + lo <= row's last key, hi + lo >= row's first key
            limit = m_start + rows_1d + (seqlen_k - seqlen_q) - n_start
            keep = keep & (hi[None, :] <= (limit + win_right)[:, None] - lo[None, :])
            keep = keep & (hi[None, :] >= (limit - win_left)[:, None] - lo[None, :])
    return gl.where(keep, s, float("-inf"))


@gluon.jit
def _step_softmax(s, need_mask, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d,
                  IS_CAUSAL: gl.constexpr, LEAN: gl.constexpr, EXP2_FMA: gl.constexpr, KEY_END: gl.constexpr,
                  BRANCH_OK: gl.constexpr = False, KEY_MASKS: gl.constexpr = True, WINDOW: gl.constexpr = False,
                  win_left=0, win_right=0):
    """A key tile's softmax step whose mask is decided at run time (``need_mask``): two inlined copies of
    ``_softmax_tile``, masked and unmasked, under the branch; or (``LEAN_MASK_BRANCH`` and ``BRANCH_OK``)
    one copy, the mask alone under the branch (``_mask_scores``), so that the consumer's code holds one
    softmax body there instead of two (less code for the instruction cache). ``BRANCH_OK``: no product
    in flight at this call (a tile's first key step): ptxas waits for every wgmma in flight at a branch's
    join, so in the key loop the join ahead of the softmax would serialise it with this warpgroup's
    P V (docs/decisions/forward-masked-tiles.md). ``KEY_MASKS`` False: no tile is ever masked
    (``hopper_fwd_kernel``'s ``KEY_MASKS``), ``need_mask`` is ignored and only the unmasked body is
    compiled. ``WINDOW``: the masks include the window's edges (``_softmax_tile``)."""
    if not KEY_MASKS:
        p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, IS_CAUSAL, LEAN, EXP2_FMA)
    elif (LEAN & LEAN_MASK_BRANCH) and BRANCH_OK:
        if need_mask:
            s = _mask_scores(s, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d, IS_CAUSAL, KEY_END, WINDOW,
                             win_left, win_right)
        p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, IS_CAUSAL, LEAN, EXP2_FMA)
    else:
        if need_mask:
            p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                                   rows_1d, cols_1d, True, IS_CAUSAL, LEAN, EXP2_FMA, KEY_END,
                                                   WINDOW, win_left, win_right)
        else:
            p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                                   rows_1d, cols_1d, False, IS_CAUSAL, LEAN, EXP2_FMA)
    return p, alpha, m_new, l_new


@gluon.constexpr_function
def _marker_asm():
    return f"mov.b32 $0, $1; // {PTX_BARRIERS_MARKER.value}"


@gluon.jit
def _ptx_barriers_marker(x):
    """The comment that asks ``ioattn.kernels.ptx_barriers`` to run on this kernel's PTX (LEAN bit 6),
    carried by a move of ``x`` (an int32 tensor) that nothing reads (not pure: it stays)."""
    gl.inline_asm_elementwise(_marker_asm(), "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _thread_row_sums(p):
    """Each thread's own part of p's row sums, [M, 4]: in the wgmma accumulator layout a row's N
    columns are spread over the four threads of a quad (column c on thread (c >> 1) & 3, as
    8 j + 2 t + e), so summing over j and e stays in registers and the quad's shuffles (two a row)
    wait until the key loop ends (``LEAN_DEFERRED_SUM``)."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    return gl.sum(gl.sum(p.reshape([M, N // 8, 4, 2]), 3), 1)


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


@gluon.constexpr_function
def _prod_dim(head_dim, prod_dim):
    """The head-dim columns the products cover: ``head_dim`` (``prod_dim`` 0), or three quarters of the
    tile, 192 of 256 or 96 of 128 (``hopper.split_cols_for``: a padded head dim of 136-192 or 72-96
    columns, whose tiles are 256 / 128 wide because Gluon's buffers and register tensors must have
    power-of-two shapes): the products then run over the tile's first half and the next quarter."""
    prod_dim = int(prod_dim)
    assert prod_dim in (0, int(head_dim)) or (int(head_dim) in (128, 256) and prod_dim == 3 * int(head_dim) // 4), \
        (head_dim, prod_dim)
    return int(head_dim) if prod_dim == 0 else prod_dim


@gluon.jit
def _qk_mma(q_smem, k_tile, s_zero, PROD_DIM: gl.constexpr, k_hi=None, slot=0):
    """Issue S = Q K^T asynchronously over the first ``PROD_DIM`` head-dim columns (``_prod_dim``): one
    product, or (three quarters of the tile) two chained ones, over its first half and the next
    quarter (192 of 256: columns 0:128 and 128:192; 96 of 128: 0:64 and 64:96), the second accumulating
    onto the first (two commit groups). The backward's S^T = K Q^T and dP^T = V dO^T are the same call
    with the operands in that order. ``k_hi``: the forward's split ring (``_split_ring``), K's columns
    128:PROD_DIM in a ring of their own (its tile at ``slot``), ``k_tile`` then 128 wide."""
    HEAD_DIM: gl.constexpr = k_tile.shape[1]
    if k_hi is not None:
        gl.static_assert(HEAD_DIM == 128 and k_hi.shape[2] == PROD_DIM - 128, "the split ring: 128 + 64 columns")
        s_tok = warpgroup_mma(q_smem.slice(0, 128, dim=1), k_tile.permute((1, 0)), s_zero, use_acc=False,
                              is_async=True)
        s_tok = warpgroup_mma(q_smem.slice(128, PROD_DIM - 128, dim=1), k_hi.index(slot).permute((1, 0)), s_tok,
                              is_async=True)
    elif PROD_DIM == HEAD_DIM:
        s_tok = warpgroup_mma(q_smem, k_tile.permute((1, 0)), s_zero, use_acc=False, is_async=True)
    else:
        LO: gl.constexpr = HEAD_DIM // 2
        s_tok = warpgroup_mma(q_smem.slice(0, LO, dim=1), k_tile.slice(0, LO, dim=1).permute((1, 0)), s_zero,
                              use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_smem.slice(LO, PROD_DIM - LO, dim=1),
                              k_tile.slice(LO, PROD_DIM - LO, dim=1).permute((1, 0)), s_tok, is_async=True)
    return s_tok


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
              stage=None, o_desc=None, b=None, IO_DIM: gl.constexpr = 0):
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
    it is below HEAD_DIM: its columns alone are stored (a 4-D ``o_desc``, ``_store_rows_tma``)."""
    l_safe = gl.where(l_i == 0.0, 1.0, l_i)
    lse = gl.where(l_i == 0.0, float("-inf"), (m_i + gl.log2(l_safe)) * LN2)
    lse_rows = m_start + rows_1d
    gl.store(Lse + lse_base + lse_rows, lse, mask=lse_rows < seqlen_q)
    # one division a row, then a multiply an element (as the portable kernel's epilogue): a division
    # an element compiled to a few instructions each (range scaling, reciprocal, select), ~184 more in
    # a warpgroup's code at d = 128 (docs/decisions/forward-output-stores.md)
    o = o * gl.convert_layout(1.0 / l_safe, gl.SliceLayout(1, o_layout))[:, None]
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
    nheads * d) in [1, ROWS, HEAD_DIM] boxes, or (a head dim d below HEAD_DIM, ``hopper.padded_rows_desc``)
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
                       ORDERED: gl.constexpr, LEAN: gl.constexpr, EXP2_FMA: gl.constexpr,
                       ROW_STORES: gl.constexpr, FEWER_MASKS: gl.constexpr = False,
                       KEY_MASKS: gl.constexpr = True, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                       SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False, alibi_a=0.0,
                       IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0, kv_hi=None):
    """One consumer warpgroup of the ping-pong (``NUM_WG`` = 2) or three-warpgroup ring (3) variant:
    ``BLOCK_M`` (= 64) query rows of its own, the K/V ring shared with the other consumer warpgroups.

    Per key tile it issues, inside a critical section ordered against the other warpgroups
    (``_turn_wait`` ... arrive on ``next_turn``), S(i+1) = Q K(i+1)^T and O += P(i) V(i), then leaves
    the section and runs the softmax of S(i+1) while its own P(i) V(i) and the other warpgroups' GEMMs
    occupy the tensor cores. n + 1 sections a warpgroup (n = the CTA's key-tile count, the same for
    all); K(t) released after S(t)'s wait, V(t) after P(t) V(t)'s; K / V readiness waited for before
    taking the turn. Why this cannot deadlock or alias a parity, and how fully masked tiles and rows
    with no key come out: docs/hopper-forward.md, "The ping-pong protocol"."""
    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    _load_rows(q_desc, q_row0, q_col, q_bar, q_smem)
    mbarrier.wait(q_bar, 0)
    o, m_i, l_i = _pp_mainloop(q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn,
                               m_start, seqlen_q, seqlen_k, n_lo, n_tiles, qk_scale, 0, 0, HEAD_DIM, BLOCK_M, BLOCK_N,
                               STAGES, IS_CAUSAL, MASK_ALL, TURN0, ORDERED, LEAN, False, EXP2_FMA, FEWER_MASKS,
                               KEY_MASKS, False, WINDOW, win_left, win_right, SOFTCAP, softcap_a, ALIBI, alibi_a,
                               PROD_DIM, kv_hi)
    rows_1d = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, _wg_acc_layout(BLOCK_N)))
    # ROW_STORES 2: staged in this warpgroup's Q buffer (its S products all retired in the key loop)
    _epilogue(o, m_i, l_i, Out, Lse, lse_base, rows_1d, m_start, q_row0, q_col, seqlen_q, stride_om,
              _wg_acc_layout(HEAD_DIM), BLOCK_M, HEAD_DIM, ROW_STORES, q_smem, IO_DIM=IO_DIM)


@gluon.jit
def _issue_s0(q_op, k_smem, k_ready, my_turn, next_turn, g0, sec0, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
              STAGES: gl.constexpr, TURN0: gl.constexpr, ORDERED: gl.constexpr, PD: gl.constexpr, k_hi=None):
    """A tile's critical section #0 (``_pp_mainloop``): S(0) = Q K(0)^T issued once K(0) has landed and
    the turn is this warpgroup's; returns its token. ``q_op``: Q's shared-memory buffer, or its
    registers (``LEAN_Q_REGS``). ``PD``, ``k_hi`` (the ring's): ``_qk_mma``'s."""
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=_wg_acc_layout(BLOCK_N))
    mbarrier.wait(k_ready.index(g0 % STAGES), (g0 // STAGES) & 1)
    _turn_wait(my_turn, sec0, TURN0, ORDERED)
    s_tok = _qk_mma(q_op, k_smem.index(g0 % STAGES), s_zero, PD, k_hi, g0 % STAGES)
    _turn_pass(next_turn, ORDERED)
    return s_tok


@gluon.constexpr_function
def _wg_acc_layout(cols):
    """The wgmma accumulator layout of one warpgroup's (64 rows x ``cols``) product: S (``cols`` =
    BLOCK_N) and O (``cols`` = HEAD_DIM) of a ping-pong consumer."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, cols, 16])


@gluon.jit
def _pp_mainloop(q_smem, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, my_turn, next_turn, m_start, seqlen_q,
                 seqlen_k, n_lo, n_tiles, qk_scale, g0, sec0, HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr,
                 BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr, MASK_ALL: gl.constexpr,
                 TURN0: gl.constexpr, ORDERED: gl.constexpr, LEAN: gl.constexpr, RELEASE_LAST: gl.constexpr,
                 EXP2_FMA: gl.constexpr, FEWER_MASKS: gl.constexpr = False, KEY_MASKS: gl.constexpr = True,
                 DIAG_TRIM: gl.constexpr = False, WINDOW: gl.constexpr = False, win_left=0, win_right=0,
                 SOFTCAP: gl.constexpr = False, softcap_a=0.0, ALIBI: gl.constexpr = False, alibi_a=0.0,
                 PROD_DIM: gl.constexpr = 0, kv_hi=None):
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
    The options: docs/hopper-forward.md."""
    PD: gl.constexpr = _prod_dim(HEAD_DIM, PROD_DIM)
    k_hi = None if kv_hi is None else kv_hi[0]
    v_hi = None if kv_hi is None else kv_hi[1]
    SPLIT: gl.constexpr = PD != HEAD_DIM
    PV_GROUPS: gl.constexpr = 2 if SPLIT else 1  # commit groups of one P V (groups retire in order)
    gl.static_assert(not (SPLIT and (LEAN & LEAN_Q_REGS)), "the split products read Q from shared memory")
    gl.static_assert(not WINDOW or (KEY_MASKS and not IS_CAUSAL and not DIAG_TRIM),
                     "a sliding window: masked tiles, not causal (the window (-1, 0) is), one-tile programs")
    num_warps: gl.constexpr = gl.num_warps()
    gl.static_assert(num_warps == 4, "a ping-pong consumer is one warpgroup")
    gl.static_assert(STAGES >= 2, "S(i+1) and P(i) V(i) are in flight together")
    s_layout: gl.constexpr = _wg_acc_layout(BLOCK_N)
    O_COLS: gl.constexpr = HEAD_DIM // 2 if SPLIT else HEAD_DIM  # the (first) accumulator's columns
    o_layout: gl.constexpr = _wg_acc_layout(O_COLS)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    rows_1d = gl.arange(0, BLOCK_M, layout=row_layout)
    cols_1d = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    dtype: gl.constexpr = v_smem.dtype
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    if LEAN & LEAN_DEFERRED_SUM:
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
    if LEAN & LEAN_PTX_BARRIERS:
        _ptx_barriers_marker(rows_1d)
    if LEAN & LEAN_Q_REGS:  # Q as the products' register operand: loaded once a tile
        q_op = q_smem.load(gl.DotOperandLayout(operand_index=0, parent=s_layout, k_width=2))
    else:
        q_op = q_smem

    # section #0: S(0); its softmax runs outside the turn
    s_tok = _issue_s0(q_op, k_smem, k_ready, my_turn, next_turn, g0, sec0, BLOCK_M, BLOCK_N, STAGES, TURN0, ORDERED,
                      PD, k_hi)
    s = warpgroup_mma_wait(0, deps=[s_tok])
    mbarrier.arrive(k_empty.index(g0 % STAGES), count=1)
    if SOFTCAP:
        s = _softcap(s, softcap_a)
    if ALIBI:
        s = _alibi(s, alibi_a, diag_rows - n_lo * BLOCK_N, cols_1d, cols_f, ALIBI)
    KEY_END: gl.constexpr = not (FEWER_MASKS and IS_CAUSAL)
    if FEWER_MASKS:
        need_mask = n_tiles == 1
        if MASK_ALL:
            need_mask = need_mask | (n_lo * BLOCK_N + BLOCK_N - 1 > diag)
        if WINDOW:
            need_mask = need_mask | _window_cuts(n_lo * BLOCK_N, m_start, seqlen_q, seqlen_k, win_left, win_right,
                                                 BLOCK_M, BLOCK_N)
        p, alpha, m_i, l_i = _step_softmax(s, need_mask, m_i, l_i, qk_scale, m_start, n_lo * BLOCK_N, seqlen_q,
                                           seqlen_k, rows_1d, cols_1d, IS_CAUSAL, LEAN, EXP2_FMA, KEY_END, True,
                                           KEY_MASKS, WINDOW, win_left, win_right)
    else:
        p, alpha, m_i, l_i = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_lo * BLOCK_N, seqlen_q, seqlen_k,
                                           rows_1d, cols_1d, KEY_MASKS, IS_CAUSAL, LEAN, EXP2_FMA, True, WINDOW,
                                           win_left, win_right)
    p16 = gl.convert_layout(p.to(dtype), p_layout)  # O is still 0: no rescale

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
        mbarrier.wait(k_ready.index(nxt), ((g0 + i + 1) // STAGES) & 1)
        mbarrier.wait(v_ready.index(cur), ((g0 + i) // STAGES) & 1)
        _turn_wait(my_turn, sec0 + i + 1, TURN0, ORDERED)
        s_tok = _qk_mma(q_op, k_smem.index(nxt), s_zero, PD, k_hi, nxt)
        if SPLIT:
            o_tok, oh_tok = _pv_mma_split(o, o_hi, p16, v_smem, g0 + i, STAGES, v_hi)
        else:
            o_tok = _pv_mma(o, p16, v_smem, g0 + i, STAGES)
        _turn_pass(next_turn, ORDERED)
        # S(i+1) done (groups retire in order; P(i) V(i) may still run)
        s = warpgroup_mma_wait(PV_GROUPS, deps=[s_tok])
        mbarrier.arrive(k_empty.index(nxt), count=1)
        if SOFTCAP:
            s = _softcap(s, softcap_a)
        n_start = (n_lo + i + 1) * BLOCK_N
        if ALIBI:
            s = _alibi(s, alibi_a, diag_rows - n_start, cols_1d, cols_f, ALIBI)
        # masks: the last tile always (key end, diagonal); under a causal mask also a tile that
        # reaches past this warpgroup's first row's diagonal
        need_mask = i + 1 == n_tiles - 1
        if MASK_ALL:
            need_mask = need_mask | (n_start + BLOCK_N - 1 > diag)
        if WINDOW:
            need_mask = need_mask | _window_cuts(n_start, m_start, seqlen_q, seqlen_k, win_left, win_right, BLOCK_M,
                                                 BLOCK_N)
        p, alpha, m_i, l_i = _step_softmax(s, need_mask, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                           rows_1d, cols_1d, IS_CAUSAL, LEAN, EXP2_FMA, KEY_END, False, KEY_MASKS,
                                           WINDOW, win_left, win_right)
        # P(i) V(i) done: P(i)'s registers may go (listed so they stay alive until here), V(i)'s slot too.
        # (With KEY_MASKS False, no branch above, ptxas hoists this wait to just after S(i+1)'s: the
        # softmax then runs after this warpgroup's P V, not beside it; docs/decisions/forward-masked-tiles.md)
        if SPLIT:
            o, o_hi, p16 = warpgroup_mma_wait(0, deps=[o_tok, oh_tok, p16])
            o_hi = _rescale_rows(o_hi, alpha, LEAN & LEAN_COND_RESCALE, LEAN & LEAN_BY_WARP)
        else:
            o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
        mbarrier.arrive(v_empty.index(cur), count=1)
        o = _rescale_rows(o, alpha, LEAN & LEAN_COND_RESCALE, LEAN & LEAN_BY_WARP)
        p16 = gl.convert_layout(p.to(dtype), p_layout)

    # section #n: the last P(n-1) V(n-1)
    last = g0 + n_own - 1
    mbarrier.wait(v_ready.index(last % STAGES), (last // STAGES) & 1)
    _turn_wait(my_turn, sec0 + n_own, TURN0, ORDERED)
    if SPLIT:
        o_tok, oh_tok = _pv_mma_split(o, o_hi, p16, v_smem, last, STAGES, v_hi)
        _turn_pass(next_turn, ORDERED)
        o, o_hi, p16 = warpgroup_mma_wait(0, deps=[o_tok, oh_tok, p16])
        # O over the tile's whole width: the columns past PD are 0 (the epilogue stores IO_DIM of them)
        o = _cols_join(o, _cols_join(o_hi, gl.zeros_like(o_hi)))
    else:
        o_tok = _pv_mma(o, p16, v_smem, last, STAGES)
        _turn_pass(next_turn, ORDERED)
        o, p16 = warpgroup_mma_wait(0, deps=[o_tok, p16])
    if RELEASE_LAST:
        mbarrier.arrive(v_empty.index(last % STAGES), count=1)
    if DIAG_TRIM:  # the tiles past this warpgroup's own: their sections and slots
        _pp_skip(k_ready, k_empty, v_ready, v_empty, my_turn, next_turn, g0, sec0, n_own, n_tiles, STAGES, TURN0,
                 ORDERED)
    if LEAN & LEAN_DEFERRED_SUM:  # the quad's sum of the threads' partial row sums, once a tile
        l_i = gl.convert_layout(gl.sum(l_i, 1), row_layout, assert_trivial=True)
    return o, m_i, l_i


@gluon.jit
def _softcap(s, softcap_a):
    """tanh(s * softcap_a) elementwise (softcap_a = softmax_scale / cap): the softcap's saturation,
    before the masks (tanh(-inf) would be -1, not -inf). ``tanh.approx.f32``: one MUFU.TANH an
    element (maximum relative error about 2**-11, below the bf16 / fp16 rounding of P V's operand)."""
    return gl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [s * softcap_a], dtype=gl.float32,
                                     is_pure=True, pack=1)


ALIBI_MAGIC = gl.constexpr(_flags.ALIBI_MAGIC)  # ``ALIBI``'s forms: the distance by the magic-number conversion
ALIBI_FP32_COLS = gl.constexpr(_flags.ALIBI_FP32_COLS)  # the tile's columns held as fp32
MAGIC_BITS = gl.constexpr(0x4B400000)  # 1.5 * 2^23 as fp32's bits: (MAGIC_BITS + n) read as fp32 is MAGIC_F32 + n
MAGIC_F32 = gl.constexpr(12582912.0)  # for |n| < 2^22


@gluon.jit
def _magic_to_f32(biased):
    """n as fp32, exactly, from the int32 ``biased`` = MAGIC_BITS + n (|n| < 2^22): a bit cast and one
    FADD, no conversion instruction; the caller adds MAGIC_BITS where it folds (``_alibi``)."""
    return biased.to(gl.float32, bitcast=True) - MAGIC_F32


@gluon.jit
def _alibi(s, alibi_a, rel, cols, cols_f, FORM: gl.constexpr):
    """s + alibi_a * |rel_i - c| for a (rows x keys) score tile: ``rel`` each row's diagonal key (i +
    seqlen_k - seqlen_q) less the tile's first key, ``cols`` the tile's columns 0, 1, ..., both int32:
    flash-attn's ALiBi bias -slope * |i + seqlen_k - seqlen_q - j|, alibi_a = -slope in the units of
    ``s`` (-slope / softmax_scale on raw scores, -slope / cap after a softcap). Added after the softcap,
    before the masks (the reference's order). ``FORM`` ``ALIBI_MAGIC``: the difference converted by the
    magic number (``_magic_to_f32``, exact while |rel - c| < 2^22), the columns split as the masks split
    them (c = hi + lo, hi = c & ~6 a constant per register, lo = c & 6 one value per thread), so no
    register holds the columns; three operations an element (IADD, FADD, FFMA with |.|).
    ``ALIBI_FP32_COLS``: ``cols_f``, the columns as fp32 held across the key loop (two operations an
    element, BLOCK_N / 4 registers a thread). Which form where: docs/decisions/alibi.md."""
    if FORM == ALIBI_FP32_COLS:
        d = rel.to(gl.float32)[:, None] - cols_f[None, :]
    else:
        hi = cols & ~6
        lo = cols & 6
        d = _magic_to_f32(((rel + MAGIC_BITS)[:, None] - lo[None, :]) - hi[None, :])
    return s + alibi_a * gl.abs(d)


@gluon.jit
def _window_cuts(n_start, m_start, seqlen_q, seqlen_k, win_left, win_right, ROWS: gl.constexpr,
                 BLOCK_N: gl.constexpr):
    """Whether an edge of the sliding window crosses the key tile from ``n_start`` for the query rows
    [m_start, m_start + ROWS): the first row's right edge (the rows' smallest) before the tile's last
    key, or the last row's left edge (their largest) past its first key."""
    off = seqlen_k - seqlen_q
    return (n_start + BLOCK_N - 1 > m_start + off + win_right) | (n_start < m_start + ROWS - 1 + off - win_left)


@gluon.jit
def _window_tiles(m_start, seqlen_q, seqlen_k, win_left, win_right, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """(n_lo, n_tiles): the key tiles some row of [m_start, m_start + BLOCK_M) sees under a sliding
    window, from the first row's first key to the last row's last one (n_tiles 0: no row sees a key)."""
    off = seqlen_k - seqlen_q
    first = gl.maximum(m_start + off - win_left, 0)
    last_row = gl.minimum(m_start + BLOCK_M, seqlen_q) - 1
    end = gl.minimum(last_row + off + win_right + 1, seqlen_k)  # one past the last row's last key
    n_lo = first // BLOCK_N
    n_tiles = gl.where(first < end, gl.cdiv(gl.maximum(end, 0), BLOCK_N) - n_lo, 0)
    return n_lo, n_tiles


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


def magic_divisor(d: int) -> tuple[int, int, int]:
    """(d, mul, shift) such that n // d == (umulhi(n, mul) + n) >> shift for every 0 <= n < 2**31
    (``_div_by``; 1 <= d < 2**31): the round-up multiplier of Granlund and Montgomery's division by
    invariant integers (PLDI 1994), shift = ceil(log2 d) and mul = floor(2**(32 + shift) / d) - 2**32
    + 1 < 2**32. ``mul`` is returned as the int32 of the same bits, so the launch passes one type."""
    if not 1 <= d < 2 ** 31:
        raise ValueError(f"magic_divisor: the divisor must be in [1, 2**31), got {d}")
    shift = (d - 1).bit_length()
    mul = (1 << (32 + shift)) // d - (1 << 32) + 1
    return d, mul - (1 << 32) if mul >= 1 << 31 else mul, shift


@gluon.jit
def _div_by(n, d, magic=None):
    """(n // d, n % d) for 0 <= n < 2**31: the division, or with ``magic`` (``magic_divisor(d)``,
    d itself its first entry) a multiply-high, an add and a shift (a run-time division is ~20
    instructions on sm_90: a float reciprocal and two corrections)."""
    if magic is None:
        return n // d, n % d
    else:
        nu = n.to(gl.uint32, bitcast=True)
        hi = gl.umulhi(nu, magic[1].to(gl.uint32, bitcast=True))
        q = ((hi + nu) >> magic[2].to(gl.uint32, bitcast=True)).to(gl.int32, bitcast=True)
        return q, n - q * magic[0]


@gluon.jit
def _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL: gl.constexpr, LPT: gl.constexpr, PAIRED: gl.constexpr = False,
              divs=None):
    """Tile ``t`` of the (batch * heads) x (query blocks) grid -> (b, h, m_block). Non-causal: each
    head's query blocks in turn. Causal: the longest rows first, either within each head (``LPT``
    False) or over the whole grid (``LPT`` True: every head's last query block, then every head's
    second to last, ...; longest-processing-time order, so tiles taken in order finish together).
    ``PAIRED`` (causal, an even ``num_m``): tiles in pairs of equal total length, head by head: pair
    q = t // 2 is query blocks num_m - 1 - i (t even) and i (t odd), num_m + 1 key tiles together on
    the diagonal. ``divs`` (the persistent kernel's ``FAST_DIV``): (the walk's divisor, the head
    count), each as ``magic_divisor`` gives it (``walk_divisor`` on the host: num_m / 2 paired, the
    (batch, head) count under LPT, else num_m), for ``_div_by``'s multiply-high instead of the
    divisions. The walks: docs/decisions/persistent-causal-walk.md."""
    if divs is None:
        walk = None
        heads = None
    else:
        walk = divs[0]
        heads = divs[1]
    if PAIRED:
        bh, i = _div_by(t // 2, num_m // 2, walk)
        m_block = i + (1 - t % 2) * (num_m - 1 - 2 * i)
    elif IS_CAUSAL and LPT:
        j, bh = _div_by(t, num_tiles // num_m, walk)
        m_block = num_m - 1 - j
    else:
        bh, m_block = _div_by(t, num_m, walk)
        if IS_CAUSAL:
            m_block = num_m - 1 - m_block
    b, h = _div_by(bh, nheads, heads)
    return b, h, m_block


@gluon.jit
def _walk(k, num_tiles, SNAKE: gl.constexpr, PAIRED: gl.constexpr = False, table=None):
    """A persistent program's k-th tile: waves of ``num_programs`` tiles, program p taking the p-th
    of each wave, or (``SNAKE``) the p-th from the end of every odd wave, so that under the causal
    LPT order the programs that drew the longest tile of one wave draw the shortest of the next.
    ``PAIRED`` (``_tile_bhm``'s paired order): waves of ``num_programs`` pairs, program p taking the
    p-th pair of each, its two tiles in turn (k even: the long one). May be >= num_tiles in the last
    wave (no tile); ``_walk_steps`` gives the walk's length.
    ``table`` (the kernel's ``Walk``, ``hopper.walk_table_for``): the walk read from the host's table
    instead, ``table[1 + k * programs + p]`` (tile indices in ``_tile_bhm``'s LPT encoding, num_tiles
    for none; one row past the walk's end, so a read a step ahead stays inside it)."""
    nprog = gl.num_programs(0)
    pid = gl.program_id(0)
    if table is not None:
        return gl.load(table + 1 + k * nprog + pid)
    if PAIRED:
        return 2 * ((k // 2) * nprog + pid) + k % 2
    if SNAKE:
        pid = pid + (k % 2) * (nprog - 1 - 2 * pid)  # odd waves: nprog - 1 - pid
    return k * nprog + pid


@gluon.jit
def _walk_steps(num_tiles, PAIRED: gl.constexpr, table=None):
    """Steps of a persistent program's walk (``_walk``): waves of programs tiles, or of programs pairs,
    or the table's first entry (its longest program's tile count)."""
    if table is not None:
        return gl.load(table)
    if PAIRED:
        return 2 * gl.cdiv(num_tiles // 2, gl.num_programs(0))
    return gl.cdiv(num_tiles, gl.num_programs(0))


@gluon.jit
def _kv_tile_count(m_start, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   IS_CAUSAL: gl.constexpr):
    """Key tiles (from the first) that the query rows [m_start, m_start + BLOCK_M) see: all of
    them, or under a causal mask up to the last row's diagonal (<= 0: no row sees a key)."""
    n_hi = gl.cdiv(seqlen_k, BLOCK_N)
    if IS_CAUSAL:
        last_row = gl.minimum(m_start + BLOCK_M, seqlen_q) - 1
        n_hi = gl.minimum(n_hi, gl.cdiv(gl.maximum(last_row + 1 + seqlen_k - seqlen_q, 0), BLOCK_N))
    return n_hi


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
    # a table walk's next tile, read a step ahead (the load's latency under a tile's work). Written out
    # in both partitions: the same steps through a helper compiled the consumers differently (ptxas
    # 12.8), and this is the build that was measured
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
                         EXP2_FMA: gl.constexpr, LEAN: gl.constexpr, ROW_STORES: gl.constexpr,
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
    # in both partitions: the same steps through a helper compiled the consumers differently (ptxas
    # 12.8), and this is the build that was measured
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
                                           ORDERED, LEAN, True, EXP2_FMA, FEWER_MASKS, KEY_MASKS, DIAG_TRIM,
                                           PROD_DIM=PROD_DIM, kv_hi=kv_hi)
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


@gluon.jit
def _persistent_fwd(q_desc, k_desc, v_desc, o_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                    stride_lse_b, stride_lse_h, qk_scale, num_tiles, num_m, HEAD_DIM: gl.constexpr,
                    BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, IS_CAUSAL: gl.constexpr,
                    ORDERED: gl.constexpr,
                    KV_TAIL: gl.constexpr, EXP2_FMA: gl.constexpr, LEAN: gl.constexpr, ROW_STORES: gl.constexpr,
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
                                 1 if w == 0 else 0, ORDERED, EXP2_FMA, LEAN, ROW_STORES, FEWER_MASKS, w * Q_BUFS,
                                 Q_BUFS, PAIRED, divs, o_desc, NO_KEY_WIDE, KEY_MASKS, DIAG_TRIM and w == 0, table,
                                 IO_DIM, PROD_DIM, kv_hi))
         if w < 2 else
         (_persistent_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty,
                                 num_tiles, num_m, nheads, group, seqlen_q, seqlen_k, _io_dim(HEAD_DIM, IO_DIM),
                                 BLOCK_M, BLOCK_N,
                                 STAGES, IS_CAUSAL, KV_TAIL, PAIRED, divs, table, kv_hi_load))
         for w in (0, 1, 2)],
        [4, 1], [240, 32])


# the magic numbers vary with the shape: one compiled kernel for all of them (no specialisation on 1
# or on divisibility by 16)
@gluon.jit(do_not_specialize=["walk_div", "walk_mul", "walk_shift", "head_mul", "head_shift"])
def hopper_fwd_kernel(q_desc, k_desc, v_desc, o_desc, Out, Lse, Cu_q, Cu_k, seqlen_q, seqlen_k, nheads, group,
                      stride_om, stride_lse_b, stride_lse_h, qk_scale, walk_div, walk_mul, walk_shift, head_mul,
                      head_shift,
                      HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
                      IS_CAUSAL: gl.constexpr, PINGPONG: gl.constexpr = False, NUM_WG: gl.constexpr = 2,
                      ORDERED: gl.constexpr = True, LEAN: gl.constexpr = False, IS_VARLEN: gl.constexpr = False,
                      PERSISTENT: gl.constexpr = False, LPT: gl.constexpr = False, KV_TAIL: gl.constexpr = False,
                      EXP2_FMA: gl.constexpr = 0, ROW_STORES: gl.constexpr = False,
                      FEWER_MASKS: gl.constexpr = False, Q_BUFS: gl.constexpr = 1, PAIRED: gl.constexpr = False,
                      FAST_DIV: gl.constexpr = False, NO_KEY_WIDE: gl.constexpr = False,
                      KEY_MASKS: gl.constexpr = True, DIAG_TRIM: gl.constexpr = False,
                      WINDOW: gl.constexpr = False, SOFTCAP: gl.constexpr = False, num_tiles=0, Walk=None,
                      win_left=0, win_right=0, softcap_a=0.0, ALIBI: gl.constexpr = False, Alibi=None,
                      stride_ab=0, alibi_unit=0.0, IO_DIM: gl.constexpr = 0, PROD_DIM: gl.constexpr = 0,
                      k_hi_desc=None, v_hi_desc=None):
    """The Gluon Hopper forward. ``PINGPONG=False`` (launched with num_warps = 4 * BLOCK_M // 64): one
    consumer partition of BLOCK_M // 64 warpgroups in lockstep. ``PINGPONG=True`` (num_warps = 4,
    BLOCK_M = 64 * NUM_WG): ``NUM_WG`` consumer warpgroups of 64 rows each in separate partitions,
    ordered in a ring by NUM_WG mbarriers (``ORDERED`` False: free-running). All: one TMA producer warp.
    ``PERSISTENT``: at most one program per SM walking ``num_tiles`` tiles (``_persistent_fwd``).
    ``IS_VARLEN``: packed sequences by ``Cu_q`` / ``Cu_k`` (``seqlen_q`` / ``seqlen_k`` the maxima). The
    other constexprs (``LEAN`` and its bits, ``LPT``, ``KV_TAIL``, ``EXP2_FMA``, ``ROW_STORES``,
    ``FEWER_MASKS``, ``KEY_MASKS``, ``Q_BUFS``, ``PAIRED``, ``Walk``, ``FAST_DIV``, ``NO_KEY_WIDE``,
    ``DIAG_TRIM``, ``WINDOW``, ``SOFTCAP``, ``ALIBI``, ``IO_DIM``, ``PROD_DIM``, ``k_hi_desc``): see
    docs/hopper-forward.md, "Compile-time options"; the host sets them (``ioattn.hopper.hopper_forward``)."""
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
    if PERSISTENT:
        gl.static_assert(PINGPONG and NUM_WG == 2 and not IS_VARLEN,
                         "persistent: the two-warpgroup ping-pong kernel, fixed-length batches")
        gl.static_assert(IS_CAUSAL or not PAIRED, "the paired walk is a causal order")
        gl.static_assert(Walk is None or (IS_CAUSAL and not PAIRED), "the walk table: causal, LPT-encoded tiles")
        _persistent_fwd(q_desc, k_desc, v_desc, o_desc, Out, Lse, seqlen_q, seqlen_k, nheads, group, stride_om,
                        stride_lse_b, stride_lse_h, qk_scale, num_tiles, num_m, HEAD_DIM, BLOCK_M, BLOCK_N, STAGES,
                        IS_CAUSAL, ORDERED, KV_TAIL, EXP2_FMA, LEAN, ROW_STORES, FEWER_MASKS, Q_BUFS, PAIRED,
                        ((walk_div, walk_mul, walk_shift), (nheads, head_mul, head_shift)) if FAST_DIV else None,
                        NO_KEY_WIDE, KEY_MASKS, DIAG_TRIM, Walk, IO_DIM, PROD_DIM, k_hi_desc, v_hi_desc)
        return
    b, h, m_block = _tile_bhm(gl.program_id(0), num_m, gl.num_programs(0), nheads, IS_CAUSAL, LPT)
    m_start = m_block * BLOCK_M
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
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
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
                                   IS_CAUSAL, MASK_ALL, 1 if w == 0 else 0, ORDERED, LEAN, EXP2_FMA, TILE_ROW_STORES,
                                   FEWER_MASKS, KEY_MASKS, WINDOW, win_left, win_right, SOFTCAP, softcap_a, ALIBI,
                                   alibi_a, IO_DIM, PROD_DIM, kv_hi))
             if w < NUM_WG else
             (_producer, (k_desc, v_desc, k_smem, v_smem, k_ready, k_empty, v_ready, v_empty, kv_row0, kv_col,
                          n_lo, n_tiles, seqlen_k, BLOCK_N, STAGES, KV_TAIL, 0, 0, kv_hi_load))
             for w in (0, 1, 2, 3)[:NUM_WG + 1]],
            [4] * (NUM_WG - 1) + [1], [CONSUMER_REGS] * (NUM_WG - 1) + [PRODUCER_REGS])
    else:
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
