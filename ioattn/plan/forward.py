"""The Gluon forward's plan: every decision a launch of ``hopper_fwd_kernel`` needs, made once per call
signature (shapes, dtype, mask, score modifications, the switches' state) and cached, so that a
repeated call costs a dictionary lookup here and the launch (``ioattn.launch.gluon_fwd``) only
allocates, builds descriptors and launches."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ioattn.kernels.constants import LOG2E
from ioattn.plan import dispatch, hopper, mods


@dataclass(frozen=True)
class Signature:
    """What the plan depends on in a call, hashable: the tensors' shapes (varlen: the longest lengths),
    the mask and the score modifications. ``scale_negative``: the lean softmax flips q's sign then."""
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int          # the tensors' head dim
    element_size: int
    varlen: bool
    causal: bool
    window: tuple          # (-1, -1) unless a sliding window (never the causal (-1, 0))
    softcap: float
    softmax_scale: float
    alibi: bool
    device_sms: int        # the device's SM count (the persistent grid)
    fp8_blocks: bool = False  # FP8 descales of Q and K per block of rows (``ioattn.fp8.descale_rows``)


@dataclass(frozen=True)
class GluonForwardPlan:
    """One launch of ``hopper_fwd_kernel``: its variant, grid and compile-time options, and the runtime
    scalars that follow from the call. ``pad_to``: the kernel's head dim where the tensors' is one it
    lacks; ``pad_copies``: computed on zero-padded copies by the padded call's plan (the other fields
    are that plan's), else read in place through head-padded descriptors."""
    variant: str
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    io_dim: int
    pad_to: int
    pad_copies: bool
    q_rows: int
    block_m: int
    block_n: int
    num_m: int
    num_tiles: int
    programs: int
    num_warps: int
    ring_split: bool
    out_tma: bool
    walk_table: tuple | None   # (kv_tiles, group_heads, tile cost) of the persistent causal walk's host table
    without_table: tuple | None  # (constexprs, walk_div) where that table cannot be built (a graph capture)
    walk_div: int
    negate_q: bool
    qk_scale: float
    softcap_a: float
    alibi_unit: float
    win_left: int
    win_right: int
    constexprs: tuple      # (name, value) pairs, the kernel's compile-time arguments


def plan_forward(sig: Signature) -> GluonForwardPlan:
    """The plan for ``sig``, from the cache when the switches have not changed since it was made."""
    key = (sig, dispatch.switch_state(), hopper.active_variant(), hopper.exp2_fma_share())
    return _PLANS.get(key, lambda: _make(sig))


_PLANS = dispatch.PlanCache()


def _check(sig: Signature) -> None:
    if sig.causal and sig.window != (-1, -1):
        raise ValueError(f"causal=True with window {sig.window}: pass the window alone (its right side 0)")
    if sig.window == (-1, 0):
        raise ValueError("window (-1, 0) is the causal mask: pass causal=True")
    if len(sig.window) != 2 or min(sig.window) < -1:
        raise ValueError(f"window must be (left, right) with each side >= 0 or -1 (unbounded), got {sig.window}")
    if not sig.softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: none), got {sig.softcap}")
    if sig.alibi and not hopper.alibi_scale_ok(True, sig.softcap, sig.softmax_scale):
        raise ValueError("ALiBi needs softmax_scale != 0 here (the bias joins the scores in their units)")


def _make(sig: Signature) -> GluonForwardPlan:
    _check(sig)
    if sig.element_size == 1:
        return _make_fp8(sig)
    io_dim, causal, has_window = sig.head_dim, sig.causal, sig.window != (-1, -1)
    dp = hopper.padded_headdim(io_dim) or 0
    window_or_causal = (-1, 0) if causal else sig.window
    if dp:
        refusal = hopper.padded_refusal(io_dim, sig.varlen, window_or_causal, sig.softcap, True if sig.alibi else None)
        if refusal:
            raise ValueError(refusal)
    if dp and not hopper.padded_in_place(io_dim):  # computed on zero-padded copies: the padded call's plan
        return replace(_make(replace(sig, head_dim=dp)), pad_to=dp, pad_copies=True)
    d = dp or io_dim
    form = (hopper.alibi_form(d, causal, has_window, sig.varlen, sig.seqlen_q, sig.softcap > 0)
            if sig.alibi else 0)
    cfg = hopper.kernel_config(d, hopper.variant_for(d, causal, sig.seqlen_q, sig.varlen,
                                                     has_window or sig.softcap > 0, form),
                               causal, sig.seqlen_q, form)
    name = cfg["variant"]
    for wanted, variants, what in ((has_window, hopper.WINDOW_VARIANTS, "a sliding window"),
                                   (sig.softcap > 0, hopper.SOFTCAP_VARIANTS, "a softcap"),
                                   (sig.alibi, hopper.alibi_variants(form), "ALiBi")):
        if wanted and name not in variants:
            raise ValueError(f"{what} needs one of the variants {variants}, got {name!r}")
    consts = dict(cfg["constexprs"])
    block_m, block_n = cfg["block_m"], cfg["block_n"]
    scale, negate_q = sig.softmax_scale, consts["LEAN"] and sig.softmax_scale < 0
    if negate_q:
        # the lean softmax scales the row maximum of the raw scores, which needs scale >= 0:
        # softmax(q k^T c) = softmax((-q) k^T |c|), exactly (a sign flip; a copy of q, rare case)
        scale = -scale
    kv_tail = sig.varlen or sig.seqlen_k % block_n != 0  # a key tile may reach past a sequence's end
    prod_dim = hopper.split_cols_for(d, io_dim if dp else 0, name)
    # the split products read Q from shared memory
    consts["Q_IN_REGS"] = hopper.split_cols_q_in_regs(consts["Q_IN_REGS"], prod_dim)
    ring_split = bool(dp) and hopper.split_ring_for(d, io_dim, name, kv_tail)
    if ring_split:  # the split ring: K / V in 128- and 64-column boxes (from column 128)
        consts["STAGES"] = hopper.SPLIT_RING_STAGES
    num_m = dispatch.cdiv(sig.seqlen_q, block_m)
    num_tiles = num_m * sig.batch * sig.nheads
    programs = min(num_tiles, sig.device_sms) if name == "persistent" else num_tiles
    popts = hopper.persistent_options(d, name, causal, num_m)
    walk = without_table = None
    if name == "persistent" and hopper.walk_table_for(d, name, causal, num_m):
        kv_tiles = tuple(_kv_tiles(m * block_m, sig.seqlen_q, sig.seqlen_k, block_m, block_n) for m in range(num_m))
        # a (batch, head)'s share of its K / V head's bytes (GQA: consecutive heads share one)
        kv_bytes = 2 * sig.seqlen_k * io_dim * sig.element_size * sig.nheads_kv // sig.nheads
        walk = (kv_tiles, hopper.walk_group_heads(kv_bytes, d), hopper.WALK_TABLE_TILE_COST)
        with hopper.walk_table(False):
            alt = hopper.persistent_options(d, name, causal, num_m)
        without_table = (alt, walk_divisor(num_m, sig.batch * sig.nheads, causal, alt["PAIRED"]))
    walk_div = walk_divisor(num_m, sig.batch * sig.nheads, causal, popts["PAIRED"])
    # a window's unbounded side: a bound past every row of either length (added to row indices)
    unbounded = sig.seqlen_q + sig.seqlen_k + 1
    win_left, win_right = (w if w >= 0 else unbounded for w in sig.window) if has_window else (0, 0)
    cap = sig.softcap
    consts.update(IS_CAUSAL=causal, IS_VARLEN=sig.varlen, LPT=False, KV_TAIL=kv_tail,
                  KEY_MASKS=has_window or hopper.key_masks(d, name, causal, kv_tail, sig.seqlen_k),
                  WINDOW=has_window, SOFTCAP=cap > 0, ALIBI=form,
                  DIAG_TRIM=hopper.diag_trim_for(d, name, causal, sig.seqlen_q),
                  EXP2_FMA=hopper.exp2_fma_cols(hopper.exp2_fma_share(), block_n),
                  ROW_STORES=hopper.row_stores(d, name), **popts,
                  IO_DIM=io_dim if dp else 0, PROD_DIM=prod_dim)
    if without_table is not None:
        without_table = (tuple(dict(consts, **without_table[0]).items()), without_table[1])
    return GluonForwardPlan(
        variant=name, seqlen_q=sig.seqlen_q, seqlen_k=sig.seqlen_k, head_dim=d, io_dim=io_dim, pad_to=dp, pad_copies=False, q_rows=cfg["q_rows"],
        block_m=block_m, block_n=block_n, num_m=num_m, num_tiles=num_tiles, programs=programs, num_warps=cfg["num_warps"],
        ring_split=ring_split, out_tma=consts["ROW_STORES"] == 3, walk_table=walk, without_table=without_table,
        walk_div=walk_div,
        negate_q=negate_q,
        # with a softcap the scores reach the softmax as tanh(s * softcap_a): the cap is the softmax's scale
        qk_scale=(cap if cap > 0 else scale) * LOG2E, softcap_a=scale / cap if cap > 0 else 0.0,
        # ALiBi: the slope to the scores' units (after a sign flip, the scale's absolute value)
        alibi_unit=-1.0 / (cap if cap > 0 else scale) if sig.alibi else 0.0,
        win_left=win_left, win_right=win_right, constexprs=tuple(consts.items()))


def _make_fp8(sig: Signature) -> GluonForwardPlan:
    """The FP8 (e4m3) plan: the one-tile ping-pong kernel (``hopper.FP8_TILES``), V read transposed
    (packed sequences: each in its own zero-padded rows, ``launch.gluon_fwd.transposed_v``), P through
    shared memory, the descales read by the kernel (``hopper_fwd_kernel``'s ``Descales``)."""
    d, causal, has_window, cap = sig.head_dim, sig.causal, sig.window != (-1, -1), sig.softcap
    if d not in hopper.FP8_TILES or sig.alibi:
        raise ValueError(f"the Gluon FP8 forward takes head dims {sorted(hopper.FP8_TILES)}, no ALiBi; got d={d}, "
                         f"alibi={sig.alibi}")
    block_n, stages, _ = hopper.FP8_TILES[d]
    num_wg = hopper.fp8_warpgroups(d, causal, sig.varlen, sig.fp8_blocks)
    block_m = 64 * num_wg
    num_m = dispatch.cdiv(sig.seqlen_q, block_m)
    unbounded = sig.seqlen_q + sig.seqlen_k + 1
    win_left, win_right = (w if w >= 0 else unbounded for w in sig.window) if has_window else (0, 0)
    off = dict.fromkeys(("LEAN", "COND_RESCALE", "RESCALE_BY_WARP", "Q_IN_REGS", "DEFERRED_SUM", "MASK_BRANCH",
                         "PTX_BARRIERS", "PERSISTENT", "KV_TAIL", "FEWER_MASKS", "PAIRED", "FAST_DIV", "NO_KEY_WIDE",
                         "DIAG_TRIM"), False)
    consts = dict(off, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, PINGPONG=True, NUM_WG=num_wg,
                  ORDERED=True, IS_CAUSAL=causal, IS_VARLEN=sig.varlen, LPT=False,
                  EXP2_FMA=hopper.exp2_fma_cols(hopper.exp2_fma_share(), block_n),
                  ROW_STORES=1, Q_BUFS=1, KEY_MASKS=True, WINDOW=has_window, SOFTCAP=cap > 0, ALIBI=0, IO_DIM=0,
                  PROD_DIM=0, **({"FP8_BLOCKS": True} if sig.fp8_blocks else {}))
    scale = sig.softmax_scale
    return GluonForwardPlan(
        variant="pingpong", seqlen_q=sig.seqlen_q, seqlen_k=sig.seqlen_k, head_dim=d, io_dim=d, pad_to=0,
        pad_copies=False, q_rows=block_m // num_wg, block_m=block_m, block_n=block_n, num_m=num_m,
        num_tiles=num_m * sig.batch * sig.nheads, programs=num_m * sig.batch * sig.nheads, num_warps=4,
        ring_split=False, out_tma=False, walk_table=None, without_table=None,
        walk_div=walk_divisor(num_m, sig.batch * sig.nheads, causal, False), negate_q=False,
        qk_scale=(cap if cap > 0 else scale) * LOG2E, softcap_a=scale / cap if cap > 0 else 0.0, alibi_unit=0.0,
        win_left=win_left, win_right=win_right, constexprs=tuple(consts.items()))


def plan_forward_mods(sig: Signature, score: bool, block_size: tuple | None, captures: bool,
                      exact: bool = True) -> GluonForwardPlan:
    """The plan for a call with score or mask functions or a block mask (``plan.mods.call_supported``'s):
    the one-tile ping-pong kernel (two consumer warpgroups, or three at ``plan.mods.WG3_TILES``) at its own
    tiles and options, no built-in mask (the functions mask
    the key end too), the block mask's blocks as ``SUB`` key tiles by ``Q_BLOCK`` queries. ``score``: a
    score function, which takes the scaled score (the softmax's scale is then log2 e); ``captures``:
    whether a function captures a tensor, ``exact``: whether the block mask comes from a mask function
    (``plan.mods.tiles``: 192-row tiles then walk its lists regrouped, ``Q_BLOCK``). The functions
    themselves are the launch's to bind (``SCORE_MOD`` / ``MASK_MOD``)."""
    key = ("mods", sig, score, block_size, captures, exact, dispatch.switch_state())
    return _PLANS.get(key, lambda: _make_mods(sig, score, block_size, captures, exact))


def _make_mods(sig: Signature, score: bool, block_size: tuple | None, captures: bool, exact: bool) -> GluonForwardPlan:
    d = sig.head_dim
    block_m, block_n, stages = mods.tiles(d, captures, block_size, exact)
    variant = "wg3" if block_m == 192 else "pingpong"
    cfg = hopper.kernel_config(d, variant, False, sig.seqlen_q)
    consts = dict(cfg["constexprs"], BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages)
    kv_tail = sig.seqlen_k % block_n != 0
    scale = sig.softmax_scale
    negate_q = consts["LEAN"] and scale < 0 and not score  # (a score function gets the signed scale's score)
    # a block mask's rows in the causal walk's order, the last query blocks first over the whole grid: the
    # longest first wherever later rows list more key blocks (causal, prefix-LM), any order elsewhere
    lpt = block_size is not None
    consts.update(IS_CAUSAL=False, IS_VARLEN=False, LPT=lpt, LONGEST_FIRST=lpt, KV_TAIL=kv_tail, KEY_MASKS=kv_tail,
                  WINDOW=False, SOFTCAP=False, ALIBI=0, DIAG_TRIM=False, FEWER_MASKS=False, EXP2_FMA=0,
                  ROW_STORES=hopper.row_stores(d, variant), IO_DIM=0, PROD_DIM=0,
                  SUB=block_size[1] // block_n if block_size else 1, Q_BLOCK=mods.q_block(block_m, block_size))
    num_m = dispatch.cdiv(sig.seqlen_q, block_m)
    consts.update(hopper.persistent_options(d, variant, False, num_m))  # (the one-tile kernel's: all off)
    return GluonForwardPlan(
        variant=variant, seqlen_q=sig.seqlen_q, seqlen_k=sig.seqlen_k, head_dim=d, io_dim=d, pad_to=0,
        pad_copies=False, q_rows=cfg["q_rows"], block_m=block_m, block_n=block_n, num_m=num_m,
        num_tiles=num_m * sig.batch * sig.nheads, programs=num_m * sig.batch * sig.nheads,
        num_warps=cfg["num_warps"], ring_split=False, out_tma=False, walk_table=None, without_table=None,
        walk_div=walk_divisor(num_m, sig.batch * sig.nheads, lpt, False), negate_q=negate_q,
        qk_scale=LOG2E if score else abs(scale) * LOG2E if negate_q else scale * LOG2E, softcap_a=0.0,
        alibi_unit=0.0, win_left=0, win_right=0, constexprs=tuple(consts.items()))


def walk_divisor(num_m: int, batch_heads: int, causal: bool, paired: bool) -> int:
    """The divisor of the persistent walk's tile index (``hopper_tiles._tile_bhm``, ``LPT`` True):
    num_m / 2 for the paired walk, the (batch, head) count for the causal LPT order, else num_m."""
    if paired:
        return num_m // 2
    return batch_heads if causal else num_m


def _kv_tiles(m_start: int, seqlen_q: int, seqlen_k: int, block_m: int, block_n: int) -> int:
    """Key tiles the causal query rows [m_start, m_start + block_m) see, as the kernel's
    ``_kv_tile_count`` counts them (<= 0: none)."""
    last_row = min(m_start + block_m, seqlen_q) - 1
    return min(dispatch.cdiv(seqlen_k, block_n), dispatch.cdiv(max(last_row + 1 + seqlen_k - seqlen_q, 0), block_n))
