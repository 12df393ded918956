"""The Gluon backward's plan: every decision a launch of ``hopper_bwd_ws_kernel`` (with its preprocess
and dQ passes) needs, made once per call signature and cached, as ``ioattn.plan.forward`` does for the
forward; the launch (``ioattn.launch.gluon_bwd``) allocates, builds descriptors and launches."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ioattn.kernels.constants import LOG2E
from ioattn.plan import dispatch, hopper, hopper_bwd


@dataclass(frozen=True)
class BackwardSignature:
    """What the backward's plan depends on in a call, hashable. ``window``: flash-attn's (left, right),
    (-1, -1) unless a sliding window (the causal mask is ``causal``); ``longest``: the longest length
    the ALiBi bound judges (packed: the totals)."""
    batch: int
    seqlen_q: int
    seqlen_k: int
    nheads: int
    nheads_kv: int
    head_dim: int          # the tensors' head dim
    varlen: bool
    causal: bool
    window: tuple
    softcap: float
    softmax_scale: float
    alibi: bool
    deterministic: bool
    longest: int


@dataclass(frozen=True)
class GluonBackwardPlan:
    """One backward: the preprocess pass (D, the lse rows, the zeroed flat dQ accumulator), the ws
    kernel's grid, tiles and compile-time options, and dQ's scaling pass. ``pad_to``: the kernel's head
    dim where the tensors' is one it lacks; ``pad_copies``: computed on zero-padded copies by the padded
    call's plan (the other fields are that plan's), else read in place through head-padded descriptors."""
    head_dim: int          # the kernel's
    io_dim: int            # the tensors'
    pad_to: int
    pad_copies: bool
    varlen: bool
    seqlen_q: int
    seqlen_k: int
    block_m: int
    block_n: int
    num_warps: int
    grid: tuple
    stat_stride: int       # each head's row of D / lse: seqlen_q padded to whole query blocks
    dq_flat: bool          # dQ accumulated in the flat order (``WS_DQ_FLAT``), else (rows, nheads, d)
    dq_block: tuple        # the dQ descriptor's box
    dq_hi_block: tuple | None  # the high half's box with the products over 192 columns
    dq_swizzle: int        # the dQ staging tile's swizzle (bytes; 0 flat)
    semaphores: int        # dQ's ordering counters (deterministic), else 1
    consumer_warps: int    # the warps whose accumulator layout orders the flat dQ tile
    lse_unit: float        # the preprocess pass's factor on lse (log2 e, or 1 / scale with LSE_IN_ACC)
    softmax_scale: float
    qk_scale: float        # the exponentials' scale, log2 units (the cap's with a softcap)
    softcap_a: float
    alibi_unit: float
    win_left: int
    win_right: int
    constexprs: tuple      # (name, value) pairs, the ws kernel's compile-time arguments


def plan_backward(sig: BackwardSignature) -> GluonBackwardPlan:
    """The plan for ``sig``, from the cache when the switches have not changed since it was made."""
    key = (sig, dispatch.switch_state())
    return _PLANS.get(key, lambda: _make(sig))


_PLANS = dispatch.PlanCache()


def _check(sig: BackwardSignature, d: int) -> None:
    if sig.window == (-1, 0):
        raise ValueError("window (-1, 0) is the causal mask: pass causal=True")
    if sig.causal and sig.window != (-1, -1):
        raise ValueError(f"causal=True with window {sig.window}: pass the window alone (its right side 0)")
    if not sig.softcap >= 0:
        raise ValueError(f"softcap must be >= 0 (0: none), got {sig.softcap}")
    if sig.alibi:
        if sig.softcap <= 0 and sig.softmax_scale == 0:
            raise ValueError("ALiBi needs softmax_scale != 0 here (the bias joins the scores in their units)")
        form = hopper_bwd.bwd_alibi_form(d, sig.softcap)
        if sig.longest > hopper.alibi_max_seqlen(form):
            raise ValueError(f"ALiBi: sequences up to {hopper.alibi_max_seqlen(form)} tokens (the bias's exact "
                             f"conversion; here {sig.longest})")


def _make(sig: BackwardSignature, mods: bool = False) -> GluonBackwardPlan:
    io_dim = sig.head_dim
    dp = hopper.padded_headdim(io_dim) or 0
    if dp:
        window = (-1, 0) if sig.causal else sig.window
        refusal = hopper.padded_refusal(io_dim, sig.varlen, window, sig.softcap, True if sig.alibi else None)
        if refusal:
            raise ValueError(refusal)
        if not hopper.padded_in_place(io_dim):  # computed on zero-padded copies: the padded call's plan
            return replace(_make(replace(sig, head_dim=dp), mods), pad_to=dp, pad_copies=True)
    d = dp or io_dim
    _check(sig, d)
    cfg = hopper_bwd.kernel_config(d, "ws", sig.softcap > 0, sig.alibi, mods)
    consts = dict(cfg["constexprs"])
    consts["LSE_IN_ACC"] = consts["LSE_IN_ACC"] and sig.softmax_scale > 0
    bm, bn = cfg["block_m"], cfg["block_n"]
    has_window = sig.window != (-1, -1)
    # the products over 192 columns (hopper.bwd_split_cols): dQ's high half 64 columns wide
    prod_dim = hopper.bwd_split_cols_for(d, io_dim if dp else 0, consts["COL_SPLIT"])
    # a window's unbounded side: a bound past every row of either length (the kernel's arithmetic adds it
    # to row indices, so no larger than int32 needs)
    unbounded = sig.seqlen_q + sig.seqlen_k + 1
    win_left, win_right = (w if w >= 0 else unbounded for w in sig.window) if has_window else (0, 0)
    cap, scale = sig.softcap, sig.softmax_scale
    consts.update(ALIBI=hopper_bwd.bwd_alibi_form(d, cap) if sig.alibi else 0, IS_CAUSAL=sig.causal,
                  DETERMINISTIC=sig.deterministic, IS_VARLEN=sig.varlen, WINDOW=has_window,
                  IO_DIM=io_dim if dp else 0, PROD_DIM=prod_dim,
                  DQ_HI_FIRST=hopper_bwd.dq_hi_first(d, consts["COL_SPLIT"], prod_dim))
    return GluonBackwardPlan(
        head_dim=d, io_dim=io_dim, pad_to=dp, pad_copies=False, varlen=sig.varlen, seqlen_q=sig.seqlen_q,
        seqlen_k=sig.seqlen_k, block_m=bm, block_n=bn, num_warps=cfg["num_warps"],
        grid=(dispatch.cdiv(sig.seqlen_k, bn), sig.batch * sig.nheads_kv),
        stat_stride=dispatch.cdiv(sig.seqlen_q, bm) * bm, dq_flat=cfg["dq_flat"], dq_block=tuple(cfg["dq_block"]),
        dq_hi_block=(bm, prod_dim - d // 2) if prod_dim else None,
        dq_swizzle=0 if cfg["dq_flat"] else hopper_bwd.WS_DQ_SWIZZLE[d],
        consumer_warps=hopper_bwd.BWD_NUM_WARPS,
        semaphores=sig.batch * sig.nheads * dispatch.cdiv(sig.seqlen_q, bm) if sig.deterministic else 1,
        lse_unit=1.0 / scale if consts["LSE_IN_ACC"] else LOG2E, softmax_scale=scale,
        # with a softcap the scores reach the exponentials as tanh(s * softcap_a): the cap times log2 e
        # scales them (the Gluon forward's convention)
        qk_scale=(cap if cap > 0 else scale) * LOG2E, softcap_a=scale / cap if cap > 0 else 0.0,
        # ALiBi: the slope to the scores' units (as the forward's)
        alibi_unit=-1.0 / (cap if cap > 0 else scale) if sig.alibi else 0.0,
        win_left=win_left, win_right=win_right, constexprs=tuple(consts.items()))


def plan_backward_mods(sig: BackwardSignature, block_size: tuple | None, score: bool = False) -> GluonBackwardPlan:
    """The plan for a call with score or mask functions or a block mask (``plan.mods.bwd_plan``'s): the ws
    kernel at its own tiles, none of the built-in forms (the functions stand for them); ``score``: a score
    function, whose scores reach the exponentials in its own units (log2 e scales them, the lse not in
    S^T's accumulator); a block mask's
    (``block_size``: its (query, key) block, or None) query blocks as ``SUB`` steps of ``block_m`` rows
    for each key block of ``KV_BLOCK`` keys, and the padded lse / D rows whole query blocks of it, so
    that every listed step reads and adds inside its own head's rows."""
    key = ("mods", sig, block_size, score, dispatch.switch_state())
    return _PLANS.get(key, lambda: _make_mods(sig, block_size, score))


def _make_mods(sig: BackwardSignature, block_size: tuple | None, score: bool) -> GluonBackwardPlan:
    plan = _make(sig, mods=True)
    consts = dict(plan.constexprs, SUB=1, KV_BLOCK=0)
    if score:
        consts["LSE_IN_ACC"] = False
        plan = replace(plan, lse_unit=LOG2E, qk_scale=LOG2E)
    if block_size is None:
        return replace(plan, constexprs=tuple(consts.items()))
    bq, bk = block_size
    if bq % plan.block_m or bk % plan.block_n:
        raise ValueError(f"a block mask of {bq} x {bk} blocks: the Gluon backward needs multiples of its "
                         f"{plan.block_m} x {plan.block_n} tiles")
    consts.update(SUB=bq // plan.block_m, KV_BLOCK=bk)
    return replace(plan, stat_stride=dispatch.cdiv(sig.seqlen_q, bq) * bq, constexprs=tuple(consts.items()))
