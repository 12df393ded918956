"""The Gluon forward's policy for calls with score or mask functions or a block mask
(``ioattn.modcall.ModCall``): whether the ping-pong kernel takes the call, and its tiles; the plan itself is
``ioattn.plan.forward.plan_forward_mods``."""
from __future__ import annotations

import torch

from ioattn.plan import hopper, hopper_bwd

# the ping-pong kernel's (block_m, block_n, stages) for them by head dim: 64-key tiles where a function
# captures a tensor (its gathered values spill the consumers' registers at 128-key tiles, d = 64 and 128),
# the built-in kernel's 128-key tiles where none does; at d = 64 three consumer warpgroups (192 query
# rows, as the built-in forward there) where none does and a block mask's lists regroup into 192-row
# query blocks, with 64-key tiles (at 128 keys the masked builds spill) (``tiles``).
# tuned: docs/decisions/programmable-attention.md
TILES = {64: (128, 64, 4), 128: (128, 64, 3), 256: (128, 64, 2)}
WIDE_TILES = {64: (128, 128, 3), 128: (128, 128, 2)}
WG3_TILES = {64: (192, 64, 3)}


def tiles(d, captures, block_size, exact=True):
    """(block_m, block_n, stages) at head dim ``d``: ``WG3_TILES`` where no function captures a tensor and
    the block mask (``block_size``, or None) is built from a mask function (``exact``: its query blocks
    regroup, ``BlockMask.regrouped``) with key blocks a multiple of them; else ``WIDE_TILES`` where no
    function captures a tensor and the key block is a multiple of them; else ``TILES``."""
    for table, regroups in ((WG3_TILES, exact), (WIDE_TILES, True)):
        t = table.get(d)
        if t and not captures and (block_size is None or (regroups and block_size[1] % t[1] == 0)):
            return t
    return TILES[d]


def q_block(block_m, block_size):
    """The query block of the lists the kernel walks (its ``Q_BLOCK``): the block mask's, or the tile's
    own where the tile does not divide it (the lists regrouped, ``BlockMask.regrouped``: a block mask
    from a mask function only, ``call_supported``); 0 without one."""
    if block_size is None:
        return 0
    return block_size[0] if block_size[0] % block_m == 0 else block_m


def fwd_plan(q, k, v, varlen, sem, block_size, captures, exact=True) -> tuple[bool, str]:
    """(taken, why) for a call with score or mask functions or a block mask (``block_size``: the block
    mask's (query, key) block, or None; ``captures``: whether a function captures a tensor; ``exact``:
    whether the block mask's lists come from a mask function) on the Gluon
    ping-pong forward: on sm_90 wherever it covers the call (``call_supported``), unless
    ``hopper.prefer_hopper(False)`` asks for the portable kernels.
    tuned: docs/decisions/programmable-attention.md"""
    if hopper.prefer_hopper.value is False:
        return False, "prefer_hopper(False): the portable kernels"
    ok, why = hopper._device_ok(q)
    return call_supported(q, k, v, varlen, sem, block_size, captures, exact) if ok else (False, why)


def call_supported(q, k, v, varlen, sem, block_size, captures=True, exact=True) -> tuple[bool, str]:
    """``fwd_plan``'s checks of the call itself: pure Python, testable anywhere."""
    d = q.shape[-1]
    if hopper.value_dim_refusal(q, v):
        return False, hopper.value_dim_refusal(q, v)
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, "score and mask functions on the Gluon kernel: fp16/bf16 only"
    if d not in TILES:
        return False, f"score and mask functions on the Gluon kernel: head dims {list(TILES)}"
    if varlen:
        return False, "score and mask functions on the Gluon kernel: fixed lengths (varlen: the portable kernels)"
    if sem.causal or sem.window != (-1, -1) or sem.softcap > 0 or sem.alibi or sem.dropout_p > 0:
        return False, ("score and mask functions on the Gluon kernel: without built-in masks, softcap, ALiBi or "
                       "dropout (fold them into the functions)")
    block_m, block_n, _ = tiles(d, captures, block_size, exact)
    if block_size is not None and ((block_size[0] % block_m and not exact) or block_size[1] % block_n):
        return False, (f"a block mask of {block_size[0]} x {block_size[1]} blocks: the Gluon kernel needs multiples "
                       f"of its {block_m} x {block_n} tiles (query blocks of other sizes: a block mask from a mask "
                       f"function, whose lists regroup)")
    return True, "the Gluon ping-pong forward"


def bwd_plan(q, k, v, varlen, sem, block_size, score_grads, heads_share_lists) -> tuple[bool, str]:
    """(taken, why) for the backward of a call with score or mask functions or a block mask on the Gluon
    ws kernel: on sm_90 wherever it covers the call (``bwd_call_supported``), unless
    ``hopper.prefer_hopper(False)`` or ``hopper_bwd.prefer_hopper_bwd(False)`` asks for the portable
    kernels. ``score_grads``: a score function whose captured tensors take gradients (the portable kernels);
    ``heads_share_lists``: the block mask's lists are one for every head (or there is none)."""
    if hopper.prefer_hopper.value is False or hopper_bwd.prefer_hopper_bwd.value is False:
        return False, "prefer_hopper(False): the portable kernels"
    ok, why = hopper._device_ok(q)
    return bwd_call_supported(q, k, v, varlen, sem, block_size, score_grads, heads_share_lists) if ok \
        else (False, why)


def bwd_call_supported(q, k, v, varlen, sem, block_size, score_grads, heads_share_lists) -> tuple[bool, str]:
    """``bwd_plan``'s checks of the call itself: pure Python, testable anywhere."""
    if score_grads:
        return False, "a score function's captured tensors' gradients: the portable backward"
    if varlen:
        return False, "score and mask functions on the Gluon backward: fixed lengths (varlen: the portable kernels)"
    if sem.causal or sem.window != (-1, -1) or sem.softcap > 0 or sem.alibi or sem.dropout_p > 0:
        return False, ("score and mask functions on the Gluon backward: without built-in masks, softcap, ALiBi or "
                       "dropout (fold them into the functions)")
    if hopper_bwd.bwd_deterministic.wanted():
        return False, "deterministic: the portable kernels"
    d = q.shape[-1]
    if d not in BWD_HEADDIMS:
        return False, f"score and mask functions on the Gluon backward: head dims {BWD_HEADDIMS}"
    if q.shape[-2] != k.shape[-2] and not heads_share_lists:
        return False, "a block mask with lists of its own for each head under GQA: the portable kernels"
    ok, why = hopper_bwd.bwd_call_supported(q, k, v, varlen, sem, None)
    if not ok:
        return False, why
    cfg = hopper_bwd.kernel_config(d, "ws", mods=True)
    if block_size is not None and (block_size[0] % cfg["block_m"] or block_size[1] % cfg["block_n"]):
        return False, (f"a block mask of {block_size[0]} x {block_size[1]} blocks: the Gluon backward needs "
                       f"multiples of its {cfg['block_m']} x {cfg['block_n']} tiles")
    return True, "the Gluon ws backward"


# head dims the ws kernel takes the functions at: compiled for sm_90, their consumers keep a captured
# tensor's gather in registers (d = 64 at 64 query rows a step, ``hopper_bwd.WS_SCORE_MOD_BLOCK_M``: at
# 128 it spilled inside the loop); d = 256 splits the head dim (tools/compile_check_hopper_bwd.py --mods)
BWD_HEADDIMS = (64, 128)
