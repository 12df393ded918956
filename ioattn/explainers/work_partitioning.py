"""Page 4: FlashAttention-2's work partitioning, on the plan of ioattn's Hopper forward.

FlashAttention-2 gives each (query block, batch, head) its own program, splits the query block's rows
across warps (so no two warps share an output row and nothing is reduced between them), and under a
causal mask skips the key blocks above the diagonal. For each point of the sliders this module asks
the plan layer (``ioattn.plan.forward.plan_forward``, pure Python, an H100 / H200's 132 SMs) for the
tiles, warpgroups, variant and programs of 16 heads of one sequence, and ``ioattn.masks.key_block_range``
for the key blocks each query block visits: whole, cut by the diagonal (masked) or skipped.
"""
from __future__ import annotations

from ioattn.explainers.numbers import name
from ioattn.masks import key_block_range
from ioattn.plan import forward as forward_plan

SEQLENS = (512, 1024, 2048, 4096, 8192)
HEAD_DIMS = (64, 128, 256)
NHEADS, SMS = 16, 132


def blocks(seqlen: int, block_m: int, block_n: int, causal: bool) -> list:
    """Per query block: [first visited key block, first masked one, end]: blocks [first, masked) whole,
    [masked, end) cut by the diagonal or the key end, the rest skipped."""
    out = []
    for m_start in range(0, seqlen, block_m):
        lo, hi = key_block_range(m_start, block_m, block_n, seqlen, seqlen, (-1, 0) if causal else (-1, -1))
        # whole: every column inside the keys and at or below the block's first row's diagonal
        last_whole_col = m_start if causal else seqlen - 1
        out.append([lo, min(hi, max(lo, (last_whole_col + 1) // block_n)), hi])
    return out


def point(seqlen: int, headdim: int, causal: bool) -> dict:
    sig = forward_plan.Signature(batch=1, seqlen_q=seqlen, seqlen_k=seqlen, nheads=NHEADS, nheads_kv=NHEADS,
                                 head_dim=headdim, element_size=2, varlen=False, causal=causal, window=(-1, -1),
                                 softcap=0.0, softmax_scale=headdim ** -0.5, alibi=False, device_sms=SMS)
    plan = forward_plan.plan_forward(sig)
    consts = dict(plan.constexprs)
    spans = blocks(seqlen, plan.block_m, plan.block_n, causal)
    num_n = -(-seqlen // plan.block_n)
    visited = sum(hi - lo for lo, _, hi in spans)
    return dict(n=seqlen, d=headdim, causal=causal, variant=plan.variant, block_m=plan.block_m,
                block_n=plan.block_n, warpgroups=consts["NUM_WG"] if consts["PINGPONG"] else plan.block_m // 64,
                persistent=bool(consts["PERSISTENT"]), num_m=plan.num_m, num_n=num_n, tiles=plan.num_tiles,
                programs=plan.programs, spans=spans, visited=visited,
                masked=sum(hi - whole for _, whole, hi in spans), skipped=plan.num_m * num_n - visited)


def data() -> dict:
    """Page 4's numbers: every (N, d, causal) point of the controls."""
    return dict(
        source=(f"computed at build time by {name(forward_plan.plan_forward)} (the plan ioattn's Hopper forward "
                f"launches; {NHEADS} heads of one bf16 sequence, {SMS} SMs) and {name(key_block_range)}"),
        seqlens=list(SEQLENS), head_dims=list(HEAD_DIMS), nheads=NHEADS, sms=SMS,
        points=[point(n, d, c) for c in (False, True) for d in HEAD_DIMS for n in SEQLENS],
        default=dict(n=2048, d=128, causal=True))
