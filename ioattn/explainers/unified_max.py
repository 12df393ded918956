"""Page 7: FlashDecoding++'s unified max.

Every split subtracts one fixed value φ instead of its running max, so nothing is rescaled. The
decode kernel (``ioattn/kernels/decode.py``, ``UNIFIED``) keeps φ for a split only while the split's
row max m satisfies φ − below ≤ m ≤ φ + above in log2 units (``PHI_RANGE`` of ``ioattn.decode``, by
the probabilities' dtype) and otherwise runs the split again with the exact online softmax. ``data``
applies that rule to a cache with one large score, for every φ on the slider, in float32 (the
kernel's arithmetic) and in float64, and merges the splits by their log-sum-exps.
"""
from __future__ import annotations

import math

import torch

from ioattn import decode
from ioattn.explainers.numbers import max_diff, name, plain, randn
from ioattn.kernels.constants import LOG2E
from ioattn.reference.merge import merge_states_ref
from ioattn.reference.naive import attention_ref
from ioattn.reference.tiled import flash2_forward

SEED = 0
KEYS, HEAD_DIM, SPLITS = 64, 64, 4
SINK, SINK_SCORE = 45, 60.0  # one key whose score (after the softmax scale) is 60, in split 2
PHIS = list(range(-60, 121, 2))
F32 = torch.float32


def inputs():
    """q (1, 1, 1, 64), k, v (1, 64, 1, 64), float64, from ``SEED``; key ``SINK`` is q scaled so that
    its score is ``SINK_SCORE``, the others are N(0, 1) (scores of about ±3)."""
    q, k, v = randn(SEED, (1, 1, 1, HEAD_DIM), (1, KEYS, 1, HEAD_DIM), (1, KEYS, 1, HEAD_DIM))
    k[0, SINK, 0] = q[0, 0, 0] * (SINK_SCORE * math.sqrt(HEAD_DIM) / q.pow(2).sum())
    return q, k, v


def fp32_bounds() -> dict:
    """Where exp(x) leaves float32, x in natural-log units: above ``overflow`` it is inf, below
    ``normal`` subnormal, below ``zero`` it rounds to 0 (half the smallest subnormal, 2^-150)."""
    fi = torch.finfo(F32)
    return dict(overflow=math.log(fi.max), normal=math.log(fi.tiny), zero=math.log(fi.tiny * fi.eps / 2))


def safe_range(dtype=F32):
    """The kernel's rule for ``dtype``: (below, above) in natural-log units around φ."""
    below, above = decode.PHI_RANGE[dtype]
    return below / LOG2E, above / LOG2E


def unified_split(q, k, v, phi):
    """One split with φ subtracted (the kernel's ``UNIFIED`` loop, in q's dtype): the probabilities
    exp2(s·log2e − φ·log2e), their sum l, and (output, lse) if l is a positive finite number, else None."""
    s2 = (q[0, 0, 0] @ k[0, :, 0].T) * (HEAD_DIM ** -0.5 * LOG2E)
    p = torch.exp2(s2 - phi * LOG2E)
    l = p.sum()
    if not (torch.isfinite(l) and l > 0):
        return p, l, None
    return p, l, ((p @ v[0, :, 0]) / l, phi + torch.log(l) / LOG2E)


def split_under_rule(q, k, v, phi, dtype):
    """One split the way the kernel runs it in ``dtype``: kept with φ inside the safe range, else
    recomputed exactly (``flash2_forward``). Returns the facts shown and (output, lse)."""
    q, k, v = (t.to(dtype) for t in (q, k, v))
    m = ((q[0, 0, 0] @ k[0, :, 0].T) * HEAD_DIM ** -0.5).max().item()
    below, above = safe_range()
    kept = -below <= m - phi <= above
    p, l, result = unified_split(q, k, v, phi)
    if not kept or result is None:
        out, lse = flash2_forward(q, k, v, block_m=1, block_n=KEYS)
        result = (out[0, 0, 0], lse[0, 0, 0])
    top = p.max()
    facts = dict(m=m, gap2=(m - phi) * LOG2E, kept=kept, top=_finite(top), top_state=_state(top, dtype),
                 l=_finite(l), l_state=_state(l, dtype))
    return facts, result


def _finite(x):
    return x.item() if torch.isfinite(x) else None


def _state(x, dtype):
    """Where a positive value landed in ``dtype``: "inf", "0", "subnormal" or "normal"."""
    if torch.isinf(x):
        return "inf"
    if x == 0:
        return "0"
    return "subnormal" if x < torch.finfo(dtype).tiny else "normal"


def at_phi(q, k, v, phi, ref_out):
    """Every split at one φ: the float32 facts, and both merges' differences from float64 attention."""
    per = KEYS // SPLITS
    splits, diffs = [], {}
    for dtype, label in ((F32, "f32"), (torch.float64, "f64")):
        outs, lses = [], []
        for i in range(SPLITS):
            cols = slice(i * per, (i + 1) * per)
            facts, (o, lse) = split_under_rule(q, k[:, cols], v[:, cols], phi, dtype)
            outs.append(o.to(torch.float64))
            lses.append(lse.to(torch.float64))
            if dtype == F32:
                splits.append(facts)
        out, _ = merge_states_ref(torch.stack(outs), torch.stack(lses))
        diffs[label] = max_diff(out, ref_out[0, 0, 0])
    return dict(phi=phi, splits=splits, diff_f32=diffs["f32"], diff_f64=diffs["f64"])


def data() -> dict:
    """Page 7's numbers: the scores, the float32 bounds, the kernel's safe ranges, and every φ."""
    q, k, v = inputs()
    ref_out, ref_lse = attention_ref(q, k, v)
    per = KEYS // SPLITS
    split_lses = [attention_ref(q, k[:, a:a + per], v[:, a:a + per])[1] for a in range(0, KEYS, per)]
    below, above = safe_range()
    return dict(
        source=(f"computed at build time from seed {SEED} (torch.randn, float64; key {SINK} set to a score of "
                f"{SINK_SCORE:g}): the rule of the decode kernel's UNIFIED path with ioattn.decode.PHI_RANGE, "
                f"replayed in PyTorch in float32 and float64, the exact fallback by {name(flash2_forward)}, the "
                f"splits merged by {name(merge_states_ref)}, against {name(attention_ref)}"),
        keys=KEYS, splits=SPLITS, sink=SINK,
        scores=plain((q[0, 0, 0] @ k[0, :, 0].T) * HEAD_DIM ** -0.5),
        fp32=fp32_bounds(), below=below, above=above,
        phi_range={str(dt).replace("torch.", ""): list(decode.PHI_RANGE[dt]) for dt in decode.PHI_RANGE},
        weights=[plain(torch.exp(x - ref_lse).item()) for x in split_lses],
        default_phi=0, phis=[at_phi(q, k, v, phi, ref_out) for phi in PHIS])
