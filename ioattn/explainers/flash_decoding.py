"""Page 6: Flash-Decoding, one query token over a KV cache split across programs.

Each split attends to its own contiguous run of keys (``attention_ref``) and returns its normalised
output and log-sum-exp; ``merge_states_ref`` (the float64 twin of ``ioattn.merge_attention_states``)
combines them exactly. ``data`` runs every
split count on the slider and checks the merge against unsplit attention; the occupancy table counts
the programs of one decode step against an H100's SMs.
"""
from __future__ import annotations

import math

import torch

from ioattn.explainers.numbers import max_diff, name, plain, randn
from ioattn.reference.merge import merge_states_ref
from ioattn.reference.naive import attention_ref

SEED = 0
KEYS, HEAD_DIM = 64, 16
SPLITS = (1, 2, 4, 8, 16)
# the occupancy table: an H100 / H200 has 132 SMs; 32 query heads sharing 8 KV heads, whose GQA group
# one program of ioattn's decode kernel serves at once, so a step has batch × 8 programs per split
SMS, HEADS_Q, HEADS_KV = 132, 32, 8
BATCHES = (1, 2, 4, 8, 16, 32, 64)


def inputs():
    """One query token q (1, 1, 1, 16) and a cache k, v (1, 64, 1, 16), float64, from ``SEED``."""
    return randn(SEED, (1, 1, 1, HEAD_DIM), (1, KEYS, 1, HEAD_DIM), (1, KEYS, 1, HEAD_DIM))


def bounds(splits: int):
    """The key ranges [a, b) of ``splits`` programs: contiguous runs of ceil(KEYS / splits)."""
    per = math.ceil(KEYS / splits)
    return [[a, min(a + per, KEYS)] for a in range(0, KEYS, per)]


def split_run(q, k, v, splits: int):
    """Each split's partial output and lse, their exact merge, and its difference from unsplit attention."""
    parts = [attention_ref(q, k[:, a:b], v[:, a:b]) for a, b in bounds(splits)]
    outs, lses = [o for o, _ in parts], [lse for _, lse in parts]
    out, lse = merge_states_ref(torch.stack(outs), torch.stack(lses))
    ref_out, ref_lse = attention_ref(q, k, v)
    return dict(
        splits=splits, bounds=bounds(splits),
        outs=[plain(o.flatten()) for o in outs], lses=[plain(x.item()) for x in lses],
        weights=[plain(torch.exp(x - lse).item()) for x in lses],
        out=plain(out.flatten()), lse=plain(lse.item()),
        diff_out=max_diff(out, ref_out), diff_lse=max_diff(lse, ref_lse))


def occupancy():
    """Programs of one decode step (batch × KV heads × splits) and the share of the SMs they fill."""
    return [dict(batch=b, splits=s, programs=b * HEADS_KV * s, busy=min(b * HEADS_KV * s, SMS) / SMS,
                 waves=math.ceil(b * HEADS_KV * s / SMS))
            for b in BATCHES for s in SPLITS]


def data() -> dict:
    """Page 6's numbers: the query, the unsplit result, a run per split count, the occupancy table."""
    q, k, v = inputs()
    ref_out, ref_lse = attention_ref(q, k, v)
    scores = (q[0, 0, 0] @ k[0, :, 0].T) * HEAD_DIM ** -0.5
    return dict(
        source=(f"computed at build time from seed {SEED} (torch.randn, float64): each split by "
                f"{name(attention_ref)}, merged by {name(merge_states_ref)} (the float64 twin "
                "of ioattn.merge_attention_states), against unsplit attention_ref"),
        keys=KEYS, head_dim=HEAD_DIM, scores=plain(scores), ref_out=plain(ref_out.flatten()),
        ref_lse=plain(ref_lse.item()), default_splits=4, runs={str(s): split_run(q, k, v, s) for s in SPLITS},
        sms=SMS, heads_q=HEADS_Q, heads_kv=HEADS_KV, batches=list(BATCHES), split_counts=list(SPLITS),
        occupancy=occupancy(), full_batch=math.ceil(SMS / HEADS_KV))
