"""Page 2: online softmax on a 4×6 score matrix, one block of keys at a time.

``steps`` replays the recurrence of ``ioattn.reference.tiled.flash2_forward`` (base 2, an
unnormalised accumulator divided once at the end) on one block of query rows and records the state
after every key block; ``data`` runs it for every block size and checks its result against
``flash2_forward`` and ``attention_ref``.
"""
from __future__ import annotations

import torch

from ioattn.explainers.numbers import max_diff, name, plain, randn
from ioattn.kernels.constants import LOG2E
from ioattn.reference.naive import attention_ref
from ioattn.reference.tiled import flash2_forward

SEED = 0
ROWS, KEYS, HEAD_DIM, VALUE_DIM = 4, 6, 4, 2


def inputs():
    """q (4, 4), k (6, 4), v (6, 2), float64, from ``SEED``."""
    return randn(SEED, (ROWS, HEAD_DIM), (KEYS, HEAD_DIM), (KEYS, VALUE_DIM))


def steps(q, k, v, block_n):
    """The online softmax of ``softmax(q kᵀ / sqrt(d)) v`` over key blocks of ``block_n``: one dict
    per block (its columns, the block's max, the running max m before and after, the rescale
    factor, the sum l and the unnormalised output acc), then the output acc / l and the lse.
    m and the block max are in natural-log units (the recurrence runs in base 2, as the kernels do)."""
    s2 = (q @ k.T) * (HEAD_DIM ** -0.5 * LOG2E)  # scores times log2(e): exp2 of them is exp of the scores
    m = torch.full((q.shape[0],), float("-inf"), dtype=q.dtype)
    l = torch.zeros_like(m)
    acc = torch.zeros(q.shape[0], v.shape[1], dtype=q.dtype)
    record = []
    for n0 in range(0, k.shape[0], block_n):
        block = s2[:, n0:n0 + block_n]
        m_new = torch.maximum(m, block.amax(dim=-1))
        p = torch.exp2(block - m_new[:, None])
        alpha = torch.exp2(m - m_new)  # exp(m_old - m_new); 0 on the first block (m_old = -inf)
        l = alpha * l + p.sum(dim=-1)
        acc = alpha[:, None] * acc + p @ v[n0:n0 + block_n]
        record.append(dict(cols=[n0, n0 + block.shape[1]], block_max=block.amax(dim=-1) / LOG2E,
                           m_old=m / LOG2E, m=m_new / LOG2E, alpha=alpha, p=p, l=l, acc=acc))
        m = m_new
    return record, acc / l[:, None], (m + torch.log2(l)) / LOG2E


def _as_batch(x):
    return x[None, :, None, :]  # (seqlen, d) -> (batch 1, seqlen, heads 1, d)


def run(block_n):
    """The steps for one block size, with the final output checked against the library's two."""
    q, k, v = inputs()
    record, out, lse = steps(q, k, v, block_n)
    flash_out, flash_lse = flash2_forward(*map(_as_batch, (q, k, v)), block_m=ROWS, block_n=block_n)
    ref_out, _ = attention_ref(*map(_as_batch, (q, k, v)))
    return dict(
        block_n=block_n,
        steps=[{key: val if key == "cols" else plain(val) for key, val in st.items()} for st in record],
        out=plain(out), lse=plain(lse),
        diff_flash2=max_diff(out, flash_out[0, :, 0]), diff_flash2_lse=max_diff(lse, flash_lse[0, 0]),
        diff_ref=max_diff(out, ref_out[0, :, 0]),
        rescaled=sum(int((st["alpha"] < 1).sum()) for st in record[1:]),
        row_steps=ROWS * (len(record) - 1))


def data() -> dict:
    """Page 2's numbers: the scores, V, the one-shot softmax and output, and the steps of every
    block size from 1 to 6."""
    q, k, v = inputs()
    scores = (q @ k.T) * HEAD_DIM ** -0.5
    ref_out, ref_lse = attention_ref(_as_batch(q), _as_batch(k), _as_batch(v))
    return dict(
        source=(f"computed at build time from seed {SEED} (torch.randn, float64): the recurrence of "
                f"{name(flash2_forward)}, replayed block by block, its output checked against "
                f"{name(flash2_forward)} and {name(attention_ref)}"),
        scores=plain(scores), v=plain(v), probs=plain(torch.softmax(scores, dim=-1)),
        out_ref=plain(ref_out[0, :, 0]), lse_ref=plain(ref_lse[0, 0]),
        default_block=2, runs={str(b): run(b) for b in range(1, KEYS + 1)})
