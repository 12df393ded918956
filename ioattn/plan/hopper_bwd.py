"""When and how the Gluon Hopper backward (``ioattn.kernels.hopper_backward_ws``) runs: the call forms
it covers (``bwd_call_supported``), the default policy by head dim, mask and length (``bwd_policy``),
the decision for a call (``bwd_plan``) and the kernel's launch configuration (``kernel_config``).

The dispatch's backward is the warp-specialised "ws" kernel. Its dQ additions land in arrival order
unless ``deterministic=True`` (``bwd_deterministic``), which runs its ordered mode: key blocks in a
fixed order (docs/decisions/deterministic-backward.md). Pure Python: nothing here touches a GPU.
"""
from __future__ import annotations

import torch

from ioattn.kernels.hopper_flags import ALIBI_FP32_COLS, ALIBI_MAGIC, WS_WORKER_REGS
from ioattn.plan import dispatch, hopper, options


# tuned: docs/decisions/hopper-backward-kernel.md
prefer_hopper_bwd = dispatch.Preference(False, env="IOATTN_HOPPER_BWD")  # ``with prefer_hopper_bwd(True): ...``


bwd_deterministic = dispatch.Preference(False)  # ``with bwd_deterministic(True): ...`` (the API's deterministic=True)


# d=256: the ws kernel's column-split form. tuned: docs/decisions/hopper-backward-kernel.md
BWD_HEADDIMS = (64, 128, 256)


# The default policy: (head dim, causal) -> the shortest seqlen_q from which "ws" runs; other rows
# keep the portable backward. tuned: docs/decisions/hopper-backward-kernel.md
BWD_AUTO_MIN_SEQLEN = {(128, False): 512, (128, True): 512, (64, False): 512, (64, True): 512,
                       (256, False): 512, (256, True): 512}


# Packed (varlen) batches: the "ws" kernel's IS_VARLEN form, by the longest sequence (max_seqlen_q),
# as VARLEN_AUTO_MIN_SEQLEN does for the forward. tuned: docs/decisions/gluon-varlen.md
BWD_VARLEN_AUTO_MIN_SEQLEN = {(64, False): 437, (64, True): 875, (128, False): 218, (128, True): 218,
                              (256, False): 218, (256, True): 218}


# Sliding windows (flash-attn's (left, right), not the causal (-1, 0)): the ws kernel's WINDOW form,
# judged by the lengths' table's non-causal row and by the window's width (left + right + 1, an
# unbounded side as seqlen_k): head dim -> the narrowest width from which it is taken.
# tuned: docs/decisions/sliding-windows.md
BWD_WINDOW_MIN_WIDTH = {64: 129, 128: 65, 256: 65}


# ALiBi in the Gluon backward: the ws kernel's ALIBI form, at every head dim, by the lengths' and
# windows' tables as without it, with a softcap too. ``BWD_ALIBI_SOFTCAP_REFUSED``: head dims whose
# ALiBi + softcap calls the portable backward takes (none now). tuned: docs/decisions/alibi.md
BWD_ALIBI_SOFTCAP_REFUSED = ()


# The backward's ALiBi forms (``_probs``, the forward's numbers): the query columns converted per step
# (``ALIBI_FP32_COLS``), or with a softcap at these head dims the magic-number distance with the
# queries split as hi / lo (``ALIBI_MAGIC``; its masks too), which brings d = 128's key split from
# hundreds of bytes of spills to a few. tuned: docs/decisions/alibi.md
BWD_ALIBI_MAGIC_SOFTCAP_HEADDIMS = (128,)


def bwd_alibi_form(d: int, softcap: float) -> int:
    """The ws backward's ``ALIBI`` for an ALiBi call at head dim ``d`` (the kernels', a padded call's
    ``hopper.padded_headdim``; ``BWD_ALIBI_MAGIC_SOFTCAP_HEADDIMS``)."""
    d = hopper.padded_headdim(d) or d
    return ALIBI_MAGIC if softcap > 0 and d in BWD_ALIBI_MAGIC_SOFTCAP_HEADDIMS else ALIBI_FP32_COLS


def bwd_call_supported(q, k, v, varlen, sem, alibi_slopes) -> tuple[bool, str]:
    """Whether the Gluon backward covers this call (``sem``: its ``Semantics``; the call itself, without
    the device): pure Python."""
    window, softcap, dropout_p = sem.window, sem.softcap, sem.dropout_p
    if hopper.value_dim_refusal(q, v):
        return False, hopper.value_dim_refusal(q, v)
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, "fp16/bf16 only"
    dp = hopper.padded_headdim(q.shape[-1])
    plain = not hopper.call_forms(varlen, window, softcap, alibi_slopes)
    if dp:  # zero-padded to dp (``PADDED_RANGE``)
        refusal = hopper.padded_refusal(q.shape[-1], varlen, window, softcap, alibi_slopes)
        if refusal:
            return False, refusal
        if plain:  # any layout (made contiguous, or padded copies)
            return (False, "no dropout") if dropout_p > 0 else (True, "")
    kd = dp or q.shape[-1]  # the kernels' head dim (in place, a padded call's forms take its checks)
    if kd not in BWD_HEADDIMS:
        return False, f"head dims {BWD_HEADDIMS} only"
    # a score softcap: the ws kernel's SOFTCAP form at every head dim, by the lengths' and windows'
    # tables as without it (docs/decisions/softcap.md)
    if alibi_slopes is not None:
        if softcap > 0 and kd in BWD_ALIBI_SOFTCAP_REFUSED:
            return False, (f"ALiBi with a softcap at head dim {kd}: the portable backward "
                           "(hopper_bwd.BWD_ALIBI_SOFTCAP_REFUSED)")
        if hopper.alibi_length_refusal(q, k, varlen, bwd_alibi_form(q.shape[-1], softcap)):
            return False, hopper.alibi_length_refusal(q, k, varlen, bwd_alibi_form(q.shape[-1], softcap))
    if dropout_p > 0:
        return False, "no dropout"
    return hopper._rows_layout_ok(q, k, v, varlen, sem.causal, backward=True)


def bwd_policy(q, seqlen_q: int | None = None, causal: bool = False, varlen: bool = False,
               window_width: int | None = None) -> tuple[bool, str]:
    """(wanted, why) for the Gluon backward, as ``policy`` for the forward: ``prefer_hopper_bwd``'s
    value inside its block, else ``IOATTN_HOPPER_BWD`` ("1" / "0") if set, else
    ``BWD_AUTO_MIN_SEQLEN`` (packed batches: ``BWD_VARLEN_AUTO_MIN_SEQLEN`` with the longest
    sequence) for q's head dim, the mask and ``seqlen_q`` (default q.shape[1]); a sliding window
    (``window_width``: left + right + 1) also needs ``BWD_WINDOW_MIN_WIDTH``'s width."""
    if prefer_hopper_bwd.value is not None:
        return prefer_hopper_bwd.value, f"hopper_bwd.prefer_hopper_bwd({prefer_hopper_bwd.value})"
    env = options.env("IOATTN_HOPPER_BWD")
    if env:
        return env == "1", f"IOATTN_HOPPER_BWD={env}"
    d, n = q.shape[-1], q.shape[1] if seqlen_q is None else seqlen_q
    kd = hopper.padded_headdim(d)
    if kd:
        forms = varlen or window_width is not None
        if not forms or not hopper.padded_in_place(d):
            return hopper._padded_policy("bwd", d, n, causal, forms)
    # in place, a padded call's windows and packed sequences (and softcap / ALiBi, which take the lengths'
    # rules here at every dim) by the padded dim's own rules (docs/decisions/padded-head-dims.md)
    label = f"{d} (zero-padded to {kd})" if kd else f"{d}"
    d = kd or d
    mask = ("causal" if causal else "non-causal") + (" varlen" if varlen else "")
    table = "BWD_VARLEN_AUTO_MIN_SEQLEN" if varlen else "BWD_AUTO_MIN_SEQLEN"
    least = globals()[table].get((d, bool(causal)))
    if least is None:
        return False, f"default policy: head dim {label} {mask} is not in hopper_bwd.{table}"
    if window_width is not None:
        narrowest = BWD_WINDOW_MIN_WIDTH.get(d)
        if narrowest is None or window_width < narrowest:
            return False, (f"default policy: head dim {label} sliding windows from width {narrowest} "
                           f"(hopper_bwd.BWD_WINDOW_MIN_WIDTH; here {window_width})")
        mask += f" window of width {window_width}"
    return n >= least, f"default policy: head dim {label} {mask} from seqlen_q >= {least} (here {n})"


def bwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q: int | None = None) -> tuple[bool, str]:
    """(taken, why) for the backward of this call (``sem``: its ``Semantics``): where ``bwd_policy``
    wants it and it applies (an sm_90 GPU, Gluon, ``bwd_call_supported``). ``seqlen_q``: the query length
    the policy judges (a varlen call's max_seqlen_q; default q.shape[1]); the scale and a value head
    dim of its own as ``fwd_plan``'s."""
    if varlen and seqlen_q is None:
        raise ValueError("bwd_plan: a varlen call needs seqlen_q (its max_seqlen_q)")
    if hopper.value_dim_refusal(q, v):
        return False, hopper.value_dim_refusal(q, v)
    # a sliding window's width, an unbounded side as seqlen_k (varlen: the longest query length)
    width = hopper.window_width_of(sem.window, None if varlen else k.shape[-3], seqlen_q)
    wanted, why = bwd_policy(q, seqlen_q, causal=sem.causal, varlen=varlen, window_width=width)
    if not wanted:
        return False, why
    ok, reason = hopper._device_ok(q)
    if ok:
        ok, reason = bwd_call_supported(q, k, v, varlen, sem, alibi_slopes)
    if ok and not hopper.alibi_scale_ok(alibi_slopes, sem.softcap, sem.softmax_scale):
        ok, reason = False, "ALiBi with softmax_scale 0: the portable kernels (the bias is added in the scores' units)"
    det = ", deterministic (dQ in key-block order)" if bwd_deterministic.wanted() else ""
    return (True, f"{why}, variant ws{det}") if ok else (False, reason)


# The backward's one kernel, the warp-specialised "ws" (the first, "base", measured slower and removed:
# docs/decisions/hopper-backward-kernel.md)
BWD_VARIANTS = ("ws",)


# head dims it compiles for (at 256 its column-split form, docs/hopper-backward.md)
BWD_VARIANT_HEADDIMS = {"ws": (64, 128, 256)}


BWD_BLOCK_N = 128   # key rows per program (two warpgroups of 64): FA3's hdim-128 kBlockN


BWD_NUM_WARPS = 8   # the two (consumer) warpgroups: FA3's two MMA warpgroups at hdim 128


# "ws": Q / dO ring depth per head dim. d = 128: 2, FA3's hdim-128 backward (2 stages of Q and of dO):
# the load of step t + 2 is issued when step t releases its slot, a whole step ahead; a third stage
# fits (231104 B of the 232448 B a block may have) and measured level. d = 64: 3, from shared-memory
# arithmetic: a step does half the FLOPs of d = 128, so a third stage keeps about the same time ahead
# for the loads; 114 KiB. (Shared-memory figures: the compile check's.)
# d = 256 (the column-split form, COL_SPLIT): Q 2, dO 1. With K, V (32 KiB each at 64 keys), Q and dO
# tiles of 32 KiB, P^T and dS^T (8 KiB each) and the dQ staging, two dO stages and a half-width dQ buffer
# (32 KiB) come to 241 KiB, over the 227 KiB a block may have; the dO ring gives a stage (dO is read first
# by dP^T, which waits behind S^T, and its slot is released once dV retires, mid-step) rather than Q
# (read by S^T at the step's start, released only when dK retires at its end). (Q / dO stages.)
# tuned: docs/decisions/backward-ws-step.md
WS_STAGES = {64: (3, 3), 128: (2, 2), 256: (2, 1)}


# "ws" at these head dims: the column-split form (``_ws_consumer_dsplit``), 64 keys a program
WS_COL_SPLIT_HEADDIMS = (256,)


WS_COL_SPLIT_BLOCK_N = 64


# "ws" with a score softcap (``SOFTCAP``): also the column-split form at these head dims (an A/B
# switch). The key split at d = 128 holds 238 of its 240 registers a thread without the cap; the cap's
# tanh beside P^T spills there (more with a window), where the column split compiles to ~150 registers,
# no spill; the key split is still the faster (the column split reads every Q / dO tile and adds every
# dQ block twice as often per key). tuned: docs/decisions/softcap.md
WS_SOFTCAP_COL_SPLIT_HEADDIMS = ()


# "ws": the swizzle of the fp32 dQ staging tile (bytes). The consumers store it from the wgmma
# accumulator layout, 8 B a thread, a warp's rows r..r+7 at 32 B each; with the 128 B swizzle (the
# default for the shape) rows r and r ^ 1 of a half-warp land on the same banks (2 wavefronts where 1
# would do); with 32 B, four rows fill one 128 B line and the stores are conflict-free, at 8 columns a
# bulk reduce message instead of 32 (16 messages a d=128 block). d=256 keeps 128 B: its writer warp
# (24 registers) spills issuing 2 x 16 messages a step. (The swizzled tile is the A/B arm of
# ``WS_DQ_FLAT``.) tuned: docs/decisions/backward-dq-path.md
WS_DQ_SWIZZLE = {64: 32, 128: 32, 256: 128}


# "ws": the fp32 dQ staging tile in the accumulator's own order ("flat"), an A/B switch by head dim (the
# key-split form only). Each thread's four values of one 8-column group (two adjacent columns, two rows
# 8 apart) become 16 contiguous bytes and a warp's 32 threads 512 contiguous bytes: one conflict-free
# STS.128 where the swizzled 2-D tile takes two STS.64. The writer's bulk reduce-add then reads the
# tile as a dense [BLOCK_M * d / 32, 32] box into a dQ accumulator kept in the same order, one 32 KB
# region per (batch, head, query block): whole 128 B rows a message where the 32 B swizzle sends
# 32 B pieces (the L2 takes one request a sector, and its crossbar input was the busiest unit). The
# host puts dQ back in (batch, seqlen, heads, d) order in its scaling pass (``dq_from_flat``). False: the
# swizzled tile (ab_bwd's "gluon-ws-dq32"). tuned: docs/decisions/backward-dq-path.md
WS_DQ_FLAT = {64: True, 128: True}


# "ws": lse folded into S^T's accumulator (by head dim, the key-split form only): the host
# pads lse / softmax_scale instead of lse * log2 e, S^T's product starts at minus it and the
# exponentials are exp2(S^T * softmax_scale * log2 e). The lse read moves from after the step's first
# two products (where it queued behind their shared-memory reads and the first FFMA of the
# exponentials waited on it) to the step's start, before S^T is issued. fp32 accumulation of minus
# lse / scale plus the products: an absolute error ~1e-6 of the exponent, far below bf16's. Off at
# d = 64, whose BLOCK_M = 128 puts 32 lse values a thread, beside D's 32, ahead of the step's first
# products. tuned: docs/decisions/backward-ws-step.md
WS_LSE_IN_ACC = {64: False, 128: True}


# "ws": each consumer warpgroup its own partition (by head dim; the key-split form with the flat dQ
# tile; an A/B switch). In one 8-warp partition every release (and Triton's barrier before each
# arrive) is a barrier over both warpgroups, so each step holds them in lockstep four times: a
# warpgroup waits for the other's dV, dQ and dK to retire. In two 4-warp partitions the barriers are
# each warpgroup's own; they meet once a step, at dS^T's exchange (an mbarrier of count 2: both halves
# stored before either dQ product reads them), and the rings' and the dQ hand-off's barriers count
# both. Each warpgroup computes dQ's half (columns at 64 query rows a step, rows at 128) into its own
# staging buffer (the halves of the flat tile: the writer adds them as two bulk copies). Before a
# warpgroup overwrites its dS^T half, the other's previous dQ must have read it: it waits for the
# previous step's dQ hand-off by both (``dq_full``). Off at d = 64 (128 rows a step: the releases'
# barriers are a smaller share there). tuned: docs/decisions/backward-ws-step.md
WS_WG_PARTITIONS = {64: False, 128: True}


# "ws": query rows a step by head dim (the key-split form; the column split needs 64). 128 at d = 64
# doubles a step's products (S^T / dP^T 64 keys x 128 queries a warpgroup) against the same per-step
# costs (barriers, hand-offs, waits), at d = 128's register count with D in dP^T's accumulator. d = 128
# at 128 rows would need 64 more registers a thread. tuned: docs/decisions/backward-ws-step.md
WS_BLOCK_M = {64: 128, 128: 64, 256: 64}


# "ws" with a score softcap (``SOFTCAP``) or ALiBi (``ALIBI``): query rows a step where they differ
# from ``WS_BLOCK_M``. At d = 64 the 128-row step spills with the cap (the tanh beside P^T's 64
# registers a thread, ptxas 12.8 via compile_check_hopper_bwd.py --softcap) and sits at the register
# limit with ALiBi (the query columns as fp32; it spills packed or deterministic causal); 64 rows
# compile without spills with either or both, and with a mask function capturing a tensor (which
# spills inside the loop at 128). tuned: docs/decisions/softcap.md, docs/decisions/alibi.md
WS_SCORE_MOD_BLOCK_M = {64: 64}


# "ws": dK / dV written as whole-row 16-byte stores (the accumulator layout writes half of each 32 B
# sector a store). The key-split form (d = 64 / 128) converts them in registers through shared memory
# (``_store_dkdv``'s ``COALESCED``). The column-split form (d = 256) has no shared memory left for the
# conversion's 64 KB: it stages them through its Q ring, free after the loop (``_store_dkdv_staged``).
# False: the accumulator-layout stores (ab_bwd's "gluon-ws-accstore").
# tuned: docs/decisions/backward-ws-step.md
WS_COALESCED_STORE = True


# "ws", the column-split form: the products' widths (``PROD_DIM``, 256 for the native d = 256) at which
# dQ's high half (staged in the step's Q slot) goes to the writer before the low half, the slot
# released as soon as it is read (``DQ_HI_FIRST``: ``_ws_consumer_dsplit``, ``_ws_dq_writer``; the low
# half first keeps the slot until after both halves' stores and reads, but its store runs beside dK
# and the high half's products). ab_bwd's "gluon-ws-dqhifirst" / ab_padded's "gluon-pad-dqlofirst" time
# the other order. tuned: docs/decisions/split-products.md
WS_DQ_HI_FIRST = (192,)


def dq_hi_first(d: int, col_split: bool, prod_dim: int) -> bool:
    """The ws kernel's ``DQ_HI_FIRST`` for head dim ``d`` (the column split's, ``col_split``) at the
    launcher's ``PROD_DIM`` (0: the whole head dim): ``WS_DQ_HI_FIRST``'s choice by product width."""
    return bool(col_split) and (prod_dim or d) in WS_DQ_HI_FIRST


def kernel_config(d: int, variant: str = "ws", softcap: bool = False, alibi: bool = False, mods: bool = False) -> dict:
    """Launch configuration of the backward kernel of ``variant`` (``BWD_VARIANTS``) at head dim ``d``
    (the launcher and tools/compile_check_hopper_bwd.py share it): ``kernel`` the jit function,
    ``num_warps`` the kernel's warps (the consumers' for "ws": the producer and writer warps come on
    top, from ``warp_specialize``; with ``WS_WG_PARTITIONS`` warpgroup 0's 4, warpgroup 1 a worker),
    tiles, ``stages`` (Q / dO buffers; "ws": the Q ring's, the dO ring's in the constexprs),
    ``dq_cols`` ("ws": the columns of one dQ handover, the dQ descriptor's block) and the constexprs.
    "ws" at d = 256 is its column-split form (``COL_SPLIT``); ``softcap`` ("ws"): the ``SOFTCAP`` form
    (``WS_SCORE_MOD_BLOCK_M``'s rows a step; lse not in S^T's accumulator, where the tanh needs the raw
    scores); ``alibi`` ("ws"): ``WS_SCORE_MOD_BLOCK_M``'s rows a step (the kernel's ``ALIBI`` is the
    launcher's, as its other flags); ``mods`` ("ws"): a mask function's, the same."""
    if variant in BWD_VARIANTS and d not in BWD_VARIANT_HEADDIMS[variant]:
        raise ValueError(f"the Hopper backward's {variant} variant covers head dims "
                         f"{', '.join(map(str, BWD_VARIANT_HEADDIMS[variant]))}, not {d}")
    if variant == "ws":
        split = d in WS_COL_SPLIT_HEADDIMS or (softcap and d in WS_SOFTCAP_COL_SPLIT_HEADDIMS)
        block_n = WS_COL_SPLIT_BLOCK_N if split else BWD_BLOCK_N
        stages, do_stages = WS_STAGES[d]
        block_m = WS_SCORE_MOD_BLOCK_M.get(d, WS_BLOCK_M[d]) if softcap or alibi or mods else WS_BLOCK_M[d]
        flat = bool(WS_DQ_FLAT.get(d, False)) and not split
        wg_split = bool(WS_WG_PARTITIONS.get(d, False)) and flat
        # the kernel's warps: the consumers' 8, or warpgroup 0's 4 with a partition a warpgroup (warpgroup 1
        # is a worker then); the flat tile's box: halves with a partition a warpgroup
        return dict(kernel="hopper_bwd_ws_kernel", block_m=block_m, block_n=block_n,
                    num_warps=BWD_NUM_WARPS // 2 if wg_split else BWD_NUM_WARPS,
                    stages=stages, worker_regs=WS_WORKER_REGS, dq_cols=d // 2 if split else d,
                    dq_flat=flat, dq_block=[block_m * d // (64 if wg_split else 32), 32] if flat
                    else [block_m, d // 2 if split else d],
                    constexprs=dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages,
                                    DO_STAGES=do_stages, COL_SPLIT=split,
                                    COALESCED_STORE=WS_COALESCED_STORE, DQ_FLAT=flat,
                                    LSE_IN_ACC=bool(WS_LSE_IN_ACC.get(d, False)) and not split and not softcap,
                                    WG_SPLIT=wg_split, SOFTCAP=bool(softcap)))
    raise ValueError(f"unknown backward variant {variant!r}; one of {BWD_VARIANTS}")
