"""The attention masks and score modifiers, stated once.

Index conventions (flash-attn >= 2.1): query row ``i`` in ``[0, seqlen_q)``, key column ``j`` in
``[0, seqlen_k)``. When ``seqlen_q != seqlen_k`` the query block is aligned to the *bottom-right*
corner of the score matrix: query ``i`` sits at key position ``i + seqlen_k - seqlen_q``.

A sliding window ``(left, right)`` keeps key ``j`` for query ``i`` when::

    i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right

with ``-1`` on either side meaning "unbounded". ``causal=True`` is the window ``(left, 0)``.
For example ``seqlen_q = 2``, ``seqlen_k = 5``, causal::

    1 1 1 1 0
    1 1 1 1 1

and ``seqlen_q = 5``, ``seqlen_k = 2``, causal (the first three rows see no key: their output is 0
and their log-sum-exp is -inf)::

    0 0
    0 0
    0 0
    1 0
    1 1

Score pipeline, in this order (same as flash-attn): ``s = (q . k) * softmax_scale``; softcap
``s = cap * tanh(s / cap)`` when ``cap > 0``; masked entries become ``-inf``; ALiBi adds
``-slope * |i + seqlen_k - seqlen_q - j|``; softmax over ``j``; dropout on the probabilities.

ALiBi note: flash-attn's CUDA kernel adds ``slope * j`` under a causal mask instead, which differs
from the rule above by a constant per row: the output is the same, the log-sum-exp is not. We use
the one rule above everywhere so that the LSE means the same thing with and without ``causal``.
"""
from __future__ import annotations

from typing import Sequence

import torch


def normalize_window(window_size, causal: bool) -> tuple[int, int]:
    """Turn a user ``window_size`` (tuple, list or 2-element tensor) into ``(left, right)`` ints.

    ``causal`` clamps the right side to 0. Raises on malformed input; values are validated
    (``>= -1``) by the caller's argument checks.
    """
    if isinstance(window_size, torch.Tensor):
        if window_size.numel() != 2:
            raise ValueError(f"window_size must have 2 elements, got a tensor of shape {tuple(window_size.shape)}")
        window_size = [int(x) for x in window_size.tolist()]
    if not isinstance(window_size, Sequence) or isinstance(window_size, str) or len(window_size) != 2:
        raise TypeError(f"window_size must be a pair of ints (left, right), got {window_size!r}")
    left, right = (int(x) for x in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size values must be >= -1 (-1 = unbounded), got ({left}, {right})")
    if causal:
        right = 0
    return left, right


def keep_mask(seqlen_q: int, seqlen_k: int, window: tuple[int, int], device=None) -> torch.Tensor:
    """Boolean ``(seqlen_q, seqlen_k)``: True where query ``i`` may attend to key ``j``."""
    left, right = window
    i = torch.arange(seqlen_q, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=device).unsqueeze(0)
    keep = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if left >= 0:
        keep &= j >= i - left
    if right >= 0:
        keep &= j <= i + right
    return keep


def alibi_bias(slopes: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """ALiBi bias ``-slope * |i + seqlen_k - seqlen_q - j|`` of shape ``(..., seqlen_q, seqlen_k)``.

    ``slopes`` is ``(nheads,)`` or ``(batch, nheads)``; the result broadcasts against scores of shape
    ``(batch, nheads, seqlen_q, seqlen_k)``.
    """
    i = torch.arange(seqlen_q, device=slopes.device).unsqueeze(1) + (seqlen_k - seqlen_q)
    j = torch.arange(seqlen_k, device=slopes.device).unsqueeze(0)
    dist = (i - j).abs().to(slopes.dtype)
    return -slopes[..., None, None] * dist


def key_block_range(m_start: int, block_m: int, block_n: int, seqlen_q: int, seqlen_k: int,
                    window: tuple[int, int]) -> tuple[int, int]:
    """Half-open range ``[n_block_min, n_block_max)`` of key blocks that query rows
    ``[m_start, m_start + block_m)`` can see; key blocks outside it are fully masked and skipped.
    The Triton kernels compute the same range in-kernel; this host twin documents and tests it."""
    left, right = window
    offset = seqlen_k - seqlen_q
    m_end = min(m_start + block_m, seqlen_q) - 1
    hi = seqlen_k if right < 0 else max(0, min(seqlen_k, m_end + offset + right + 1))
    lo = 0 if left < 0 else max(0, m_start + offset - left)
    n_min = lo // block_n
    n_max = -(-hi // block_n)
    return n_min, max(n_min, n_max)
