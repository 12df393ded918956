"""The Gluon forward's online softmax on a score tile: masks (causal, window, key tail), the score
modifications (softcap, ALiBi), the exponentials (MUFU or FMA polynomial), the conditional rescale of
the accumulator and the row sums. Reference twin: ``ioattn.reference.tiled.flash2_forward``."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ioattn.kernels.hopper_common import MAGIC_BITS, ALIBI_FP32_COLS, _magic_to_f32
from ioattn.kernels.hopper_tiles import _full_tile


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



# FlashAttention-4's conditional rescaling (the kernel's ``COND_RESCALE``, ``_softmax_tile`` and
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
                  COND_RESCALE: gl.constexpr = False, DEFERRED_SUM: gl.constexpr = False,
                  EXP2_FMA: gl.constexpr = 0, KEY_END: gl.constexpr = True, WINDOW: gl.constexpr = False,
                  win_left=0, win_right=0, P_LOG2: gl.constexpr = 0):
    """Scale (log2 domain), mask, online-softmax step: returns (p, alpha, m_new, l_new). ``P_LOG2``
    (e4m3 P): the max kept that much below the true one, so p = exp2(s - m) comes out ``2 ** P_LOG2``
    times larger (into e4m3's normal range) at no cost an element; l grows with it, so O / l and the
    lse (m + log2 l) are unchanged. ``WINDOW`` (a
    sliding window, ``IS_CAUSAL`` False): the masked form also keeps key j for row i only where
    i + off - win_left <= j <= i + off + win_right (off = seqlen_k - seqlen_q; an unbounded side comes as
    a bound past every key). ``EXP2_FMA``: p's exponentials of that many of the tile's columns on the FMA
    units (``_exp2_tile``). ``KEY_END`` False (causal only): no key-end test; a stored row r < seqlen_q
    sees keys up to r + seqlen_k - seqlen_q <= seqlen_k - 1, so the diagonal test implies it (rows past
    seqlen_q, never stored, may then see keys past the end, which reach only their own row).
    ``LEAN`` (the same values up to rounding): the scale folded into the exponent (one FFMA an element,
    the row max on raw scores, which needs scale >= 0) and the masks on per-register column constants
    (``_mask_scores``: ``cols & ~6`` a constant per register, ``cols & 6`` one value per thread), so no
    per-column registers live across the key loop, which 160-register consumers cannot afford. With it,
    ``COND_RESCALE``: the max moves only by more than ``RESCALE_TAU``; ``DEFERRED_SUM``: l as each
    thread's partial sums (``_thread_row_sums``)."""
    gl.static_assert(KEY_END or IS_CAUSAL, "without the diagonal test the key end is the only mask")
    if LEAN:
        if MASKED:
            s = _mask_scores(s, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d, IS_CAUSAL, KEY_END, WINDOW,
                             win_left, win_right)
        m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale - P_LOG2)
        if COND_RESCALE:  # conditional rescaling: the max moves only by more than RESCALE_TAU (a first
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
        m_new = gl.maximum(m_i, gl.max(s, 1) - P_LOG2)
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet: exp2 gives 0, not NaN
        x = s - m_use[:, None]
    if EXP2_FMA == 0:  # MUFU.EX2 alone, called here and not through _exp2_tile: the default kernel's code
        p = gl.exp2(x)  # and debug labels stay as they were without the option (ptxas schedules by them)
    else:
        p = _exp2_tile(x, EXP2_FMA)
    alpha = gl.exp2(m_i - m_use)
    if DEFERRED_SUM:  # l kept as each thread's partial sums (``_thread_row_sums``), the quad's sum deferred
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
                  IS_CAUSAL: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr, DEFERRED_SUM: gl.constexpr,
                  MASK_BRANCH: gl.constexpr, EXP2_FMA: gl.constexpr, KEY_END: gl.constexpr,
                  BRANCH_OK: gl.constexpr = False, KEY_MASKS: gl.constexpr = True, WINDOW: gl.constexpr = False,
                  win_left=0, win_right=0, P_LOG2: gl.constexpr = 0):
    """A key tile's softmax step whose mask is decided at run time (``need_mask``): two inlined copies of
    ``_softmax_tile``, masked and unmasked, under the branch; or (``MASK_BRANCH`` and ``BRANCH_OK``)
    one copy, the mask alone under the branch (``_mask_scores``), so that the consumer's code holds one
    softmax body there instead of two (less code for the instruction cache). ``BRANCH_OK``: no product
    in flight at this call (a tile's first key step): ptxas waits for every wgmma in flight at a branch's
    join, so in the key loop the join ahead of the softmax would serialise it with this warpgroup's
    P V (docs/decisions/forward-masked-tiles.md). ``KEY_MASKS`` False: no tile is ever masked
    (``hopper_fwd_kernel``'s ``KEY_MASKS``), ``need_mask`` is ignored and only the unmasked body is
    compiled. ``WINDOW``: the masks include the window's edges; ``LEAN``, ``COND_RESCALE``,
    ``DEFERRED_SUM``, ``P_LOG2``: ``_softmax_tile``'s."""
    if not KEY_MASKS:
        p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, IS_CAUSAL, LEAN, COND_RESCALE, DEFERRED_SUM,
                                               EXP2_FMA, P_LOG2=P_LOG2)
    elif MASK_BRANCH and BRANCH_OK:
        if need_mask:
            s = _mask_scores(s, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d, IS_CAUSAL, KEY_END, WINDOW,
                             win_left, win_right)
        p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, IS_CAUSAL, LEAN, COND_RESCALE, DEFERRED_SUM,
                                               EXP2_FMA, P_LOG2=P_LOG2)
    else:
        if need_mask:
            p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                                   rows_1d, cols_1d, True, IS_CAUSAL, LEAN, COND_RESCALE,
                                                   DEFERRED_SUM, EXP2_FMA, KEY_END, WINDOW, win_left, win_right,
                                                   P_LOG2=P_LOG2)
        else:
            p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                                   rows_1d, cols_1d, False, IS_CAUSAL, LEAN, COND_RESCALE,
                                                   DEFERRED_SUM, EXP2_FMA, P_LOG2=P_LOG2)
    return p, alpha, m_new, l_new



@gluon.jit
def _thread_row_sums(p):
    """Each thread's own part of p's row sums, [M, 4]: in the wgmma accumulator layout a row's N
    columns are spread over the four threads of a quad (column c on thread (c >> 1) & 3, as
    8 j + 2 t + e), so summing over j and e stays in registers and the quad's shuffles (two a row)
    wait until the key loop ends (``DEFERRED_SUM``)."""
    M: gl.constexpr = p.shape[0]
    N: gl.constexpr = p.shape[1]
    return gl.sum(gl.sum(p.reshape([M, N // 8, 4, 2]), 3), 1)



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
def _mods_softmax(s, j, lists, mods, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k, rows_1d, cols_1d,
                  MASK_MOD: gl.constexpr, KEY_END: gl.constexpr, LEAN: gl.constexpr, COND_RESCALE: gl.constexpr,
                  DEFERRED_SUM: gl.constexpr, EXP2_FMA: gl.constexpr):
    """Key step ``j``'s softmax with the user's mask function (the score function already applied): the
    mask and, with ``KEY_END``, the key end (``_mods_tile``) only on the tiles that need them (a block
    mask's partial blocks, the tile the key end cuts; without a block mask every tile), under a run-time
    branch over two copies of the softmax body, as ``_step_softmax``'s: the branch joins after the
    softmax, so this warpgroup's P V stays in flight beside it."""
    BLOCK_N: gl.constexpr = s.shape[1]
    if lists is None:
        if MASK_MOD is not None:
            need = True
        elif KEY_END:
            need = n_start + BLOCK_N > seqlen_k
        else:
            need = False
    else:
        need = j < lists[2]
        if KEY_END:
            need = need | (n_start + BLOCK_N > seqlen_k)
    if need:
        masked = _mods_tile(s, mods, m_start, n_start, seqlen_k, rows_1d, cols_1d, _full_tile(j, lists), None,
                            MASK_MOD, KEY_END)
        p, alpha, m_new, l_new = _softmax_tile(masked, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, False, LEAN, COND_RESCALE, DEFERRED_SUM,
                                               EXP2_FMA)
    else:
        p, alpha, m_new, l_new = _softmax_tile(s, m_i, l_i, qk_scale, m_start, n_start, seqlen_q, seqlen_k,
                                               rows_1d, cols_1d, False, False, LEAN, COND_RESCALE, DEFERRED_SUM,
                                               EXP2_FMA)
    return p, alpha, m_new, l_new



@gluon.jit
def _mods_tile(s, mods, m_start, n_start, seqlen_k, rows_1d, cols_1d, full, SCORE_MOD: gl.constexpr,
               MASK_MOD: gl.constexpr, KEY_END: gl.constexpr):
    """A score tile through the user's functions (``ioattn.kernels.modgen``; ``mods`` = (b, h,
    softmax_scale, the score's captures, the mask's)): the score function on the scaled scores (the
    softmax then takes log2 e as its scale), the mask function where the tile is not ``full`` (a block
    mask's full block), ``KEY_END``: keys past ``seqlen_k`` masked too. No branch: the selects keep
    this warpgroup's P V in flight across the call."""
    q_idx = (m_start + rows_1d)[:, None]
    kv_idx = (n_start + cols_1d)[None, :]
    if SCORE_MOD is not None:
        s = SCORE_MOD(s * mods[2], mods[0], mods[1], q_idx, kv_idx, mods[3])
    if MASK_MOD is not None:
        keep = MASK_MOD(mods[0], mods[1], q_idx, kv_idx, mods[4]) | full
        if KEY_END:
            keep = keep & (kv_idx < seqlen_k)
        s = gl.where(keep, s, float("-inf"))
    elif KEY_END:
        s = gl.where(kv_idx < seqlen_k, s, float("-inf"))
    return s
