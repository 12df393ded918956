"""Page 8: FP8 outliers and the random Hadamard rotation.

q, k and v in FlashAttention-3's setting (N(0, 1), plus with probability 0.001 per element an added
N(0, 10²) outlier: ``ioattn bench fp8-accuracy``'s inputs), quantised to e4m3 per tensor by
``ioattn.reference.fp8.quantize_fp8_ref`` with and without q and k rotated by ``rotate``, and FP8
attention (``attention_fp8_ref``, float64 emulation) against float64 attention of the unquantised
inputs. Without outliers, the same comparison again.
"""
from __future__ import annotations

import torch

from ioattn.bench.fp8_accuracy import OUTLIER_PROB, OUTLIER_STD, outlier_inputs
from ioattn.explainers.numbers import name, plain
from ioattn.reference.fp8 import E4M3_MAX, attention_fp8_ref, dequantize_fp8_ref, quantize_fp8_ref, random_signs, rotate
from ioattn.reference.naive import attention_ref

SEED = 0
SEQLEN, HEAD_DIM = 512, 64


def rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item()


def recipe(q, k, v, signs, rotated: bool) -> dict:
    """Per-tensor e4m3 of q, k, v (q and k rotated first where ``rotated``): the channels' largest
    magnitudes, the descales, the quantisation errors, the scores' errors and the output's RMSE."""
    if rotated:
        q, k = rotate(q, signs), rotate(k, signs)
    (q8, qs), (k8, ks), (v8, vs) = (quantize_fp8_ref(t, "tensor") for t in (q, k, v))
    qd, kd = dequantize_fp8_ref(q8, qs), dequantize_fp8_ref(k8, ks)
    scale = HEAD_DIM ** -0.5
    ds = (qd[0, :, 0] @ kd[0, :, 0].T - q[0, :, 0] @ k[0, :, 0].T) * scale  # QKᵀ is the same rotated or not
    out = attention_fp8_ref(q8, k8, v8, qs, ks, vs)
    ref, _ = attention_ref(q, k, v)
    worst = divmod(ds.abs().argmax().item(), ds.shape[1])
    return dict(
        rotated=rotated, worst=list(worst), q_channels=plain(q.abs().amax(dim=(0, 1, 2))), k_channels=plain(k.abs().amax(dim=(0, 1, 2))),
        q_descale=qs.item(), k_descale=ks.item(),
        q_error=rms(qd - q), k_error=rms(kd - k), score_error=rms(ds), score_error_max=ds.abs().max().item(),
        rmse=rms(out - ref), ref_rms=rms(ref))


def _channels(added: torch.Tensor, row: int) -> list:
    """The channels of token ``row`` that received an outlier (``added``: the outliers alone)."""
    return added[0, row, 0].ne(0).nonzero().flatten().tolist()


def data() -> dict:
    """Page 8's numbers: both recipes on the outlier inputs, and both without outliers."""
    signs = random_signs(HEAD_DIM, SEED + 1)
    q, k, v = outlier_inputs(1, 1, SEQLEN, HEAD_DIM, SEED)
    q0, k0, v0 = outlier_inputs(1, 1, SEQLEN, HEAD_DIM, SEED, prob=0.0)  # the same draw without the outliers
    recipes = [recipe(q, k, v, signs, r) for r in (False, True)]
    i, j = recipes[0]["worst"]  # the query and key of the largest score error, unrotated
    return dict(
        source=(f"float64 emulation, computed at build time: inputs by ioattn.bench.fp8_accuracy.outlier_inputs (seed "
                f"{SEED}), signs by {name(random_signs)} (seed {SEED + 1}), e4m3 per tensor by {name(quantize_fp8_ref)}, "
                f"the rotation by {name(rotate)}, FP8 attention by {name(attention_fp8_ref)}, against "
                f"{name(attention_ref)} of the unquantised inputs"),
        seqlen=SEQLEN, head_dim=HEAD_DIM, outlier_prob=OUTLIER_PROB, outlier_std=OUTLIER_STD, e4m3_max=E4M3_MAX,
        outliers={"q": int((q - q0).ne(0).sum()), "k": int((k - k0).ne(0).sum())},
        recipes=recipes, worst_channels=dict(q=_channels(q - q0, i), k=_channels(k - k0, j)),
        no_outliers=[recipe(q0, k0, v0, signs, r)["rmse"] for r in (False, True)])
