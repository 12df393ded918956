"""Tiled exact attention in plain PyTorch, written to read like the papers.

* ``flash1_forward``: FlashAttention (Dao et al., 2022), Algorithm 1.
* ``flash2_forward``: FlashAttention-2 (Dao, 2023), Algorithm 1.
* ``flash_backward``: the recomputation backward pass both papers share (FA2 Algorithm 2).

They only ever hold ``(block_m, block_n)`` score tiles, so memory is linear in the sequence
length, and they skip key blocks outside ``ioattn.masks.key_block_range`` as the kernels do.
Batch and heads are vectorised; only tiles are looped over. Internally q is viewed as
``(batch, nheads_kv, group, seqlen, d)`` and k, v as ``(batch, nheads_kv, 1, seqlen, d)`` so that
GQA is plain broadcasting and dk/dv reduce over ``group``. The maths runs in float32 (float64 for
float64 inputs); results come back in the input dtype, the log-sum-exp in the compute dtype.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from ioattn.kernels.constants import LOG2E
from ioattn.masks import key_block_range



@dataclass
class _Problem:
    q: torch.Tensor  # (batch, nheads_kv, group, seqlen_q, d), compute dtype
    k: torch.Tensor  # (batch, nheads_kv, 1, seqlen_k, d)
    v: torch.Tensor  # (batch, nheads_kv, 1, seqlen_k, d_v)
    scale: float
    window: tuple[int, int]
    softcap: float
    slopes: Optional[torch.Tensor]  # broadcastable to (batch, nheads_kv, group, 1, 1)
    dropout_p: float
    keep: Optional[torch.Tensor]  # (batch, nheads_kv, group, seqlen_q, seqlen_k)
    block_m: int
    block_n: int
    dtype: torch.dtype  # the caller's dtype, for the results

    @property
    def seqlen_q(self) -> int:
        return self.q.shape[-2]

    @property
    def seqlen_k(self) -> int:
        return self.k.shape[-2]

    def q_starts(self) -> range:
        return range(0, self.seqlen_q, self.block_m)

    def kv_starts(self) -> range:
        return range(0, self.seqlen_k, self.block_n)

    def visible(self, m0: int) -> range:
        """Start columns of the key blocks query block ``m0`` can see."""
        lo, hi = key_block_range(m0, self.block_m, self.block_n, self.seqlen_q, self.seqlen_k, self.window)
        return range(lo * self.block_n, hi * self.block_n, self.block_n)

    def scores(self, m0: int, n0: int, unit: float = 1.0):
        """Score tile for rows ``m0:m0+block_m`` and columns ``n0:n0+block_n``, times ``unit``.

        ``unit = log2(e)`` gives FA2's base-2 scores with the factor folded into the scale, as the
        kernels do. Returns ``(s, t)`` with ``t = tanh(raw / softcap)`` (``None`` without softcap),
        which the backward pass needs for the softcap derivative.
        """
        qt = self.q[..., m0:m0 + self.block_m, :]
        kt = self.k[..., n0:n0 + self.block_n, :]
        qk = qt @ kt.transpose(-1, -2)
        t = None
        if self.softcap > 0:
            t = torch.tanh(qk * (self.scale / self.softcap))
            s = t * (self.softcap * unit)
        else:
            s = qk * (self.scale * unit)
        # Same rule as ioattn.masks.keep_mask, restricted to this tile; query i sits at key
        # position i + seqlen_k - seqlen_q (bottom-right alignment).
        i = torch.arange(m0, m0 + qt.shape[-2], device=s.device).unsqueeze(1) + (self.seqlen_k - self.seqlen_q)
        j = torch.arange(n0, n0 + kt.shape[-2], device=s.device).unsqueeze(0)
        left, right = self.window
        if left >= 0:
            s = s.masked_fill(j < i - left, float("-inf"))
        if right >= 0:
            s = s.masked_fill(j > i + right, float("-inf"))
        if self.slopes is not None:
            s = s - (self.slopes * unit) * (i - j).abs().to(s.dtype)
        return s, t

    def dropout(self, p: torch.Tensor, m0: int, n0: int) -> torch.Tensor:
        """Apply the tile's slice of the keep mask, rescaling survivors by 1 / (1 - p)."""
        if self.dropout_p == 0.0:
            return p
        z = self.keep(m0, m0 + p.shape[-2], n0, n0 + p.shape[-1])
        z = z.reshape(p.shape[0], p.shape[1], p.shape[2], *z.shape[-2:])
        return p.masked_fill(~z, 0.0) / (1.0 - self.dropout_p)

    def rows(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, nheads_kv, group, seqlen, d) back to (batch, seqlen, nheads, d), caller's dtype."""
        b, hk, g, s, d = x.shape
        return x.reshape(b, hk * g, s, d).transpose(1, 2).to(self.dtype)


def _problem(q, k, v, softmax_scale, window, softcap, alibi_slopes, dropout_p, dropout_keep,
             block_m, block_n) -> _Problem:
    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k.shape[2]
    if nheads % nheads_kv != 0:
        raise ValueError(f"nheads ({nheads}) must be a multiple of nheads_kv ({nheads_kv})")
    group = nheads // nheads_kv
    cdtype = torch.float64 if q.dtype == torch.float64 else torch.float32

    def heads_kv(x):
        return x.to(cdtype).transpose(1, 2).unsqueeze(2)

    qh = q.to(cdtype).transpose(1, 2).reshape(batch, nheads_kv, group, seqlen_q, d)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=q.device, dtype=cdtype).reshape(-1, nheads_kv, group, 1, 1)
    keep = None
    if dropout_p > 0.0:
        if dropout_keep is None:
            raise ValueError("dropout_p > 0 needs a dropout_keep mask")
        # a bool (batch, nheads, seqlen_q, seqlen_k) tensor, or a callable (m0, m1, n0, n1) -> that
        # tile of it (LazyDropoutMask: memory stays linear in the sequence length)
        keep = dropout_keep if callable(dropout_keep) else (
            lambda m0, m1, n0, n1: dropout_keep[..., m0:m1, n0:n1])
    return _Problem(
        q=qh, k=heads_kv(k), v=heads_kv(v),
        scale=1.0 / math.sqrt(d) if softmax_scale is None else float(softmax_scale),
        window=(int(window[0]), int(window[1])), softcap=float(softcap), slopes=slopes,
        dropout_p=float(dropout_p), keep=keep, block_m=block_m, block_n=block_n, dtype=q.dtype)


def _finite_or_zero(x: torch.Tensor) -> torch.Tensor:
    """Replace -inf row maxima by 0 so that ``exp(s - max)`` gives 0, not NaN, on empty rows."""
    return torch.where(x == float("-inf"), torch.zeros_like(x), x)


def flash1_forward(q, k, v, *, softmax_scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                   dropout_p=0.0, dropout_keep=None, block_m=64, block_n=64):
    """FlashAttention-1 forward (Algorithm 1): KV blocks outside, Q blocks inside.

    O, l and m live in full-size "HBM" tensors, read and written back at every step, and O is
    kept normalised throughout. Returns ``(out, lse)`` like ``attention_ref``.
    """
    pb = _problem(q, k, v, softmax_scale, window, softcap, alibi_slopes, dropout_p, dropout_keep,
                  block_m, block_n)
    o = pb.q.new_zeros(*pb.q.shape[:-1], pb.v.shape[-1])
    l = pb.q.new_zeros(pb.q.shape[:-1])
    m = pb.q.new_full(pb.q.shape[:-1], float("-inf"))
    for n0 in pb.kv_starts():
        vj = pb.v[..., n0:n0 + pb.block_n, :]
        for m0 in pb.q_starts():
            if n0 not in pb.visible(m0):
                continue
            rows = slice(m0, m0 + pb.block_m)
            oi, li, mi = o[..., rows, :], l[..., rows], m[..., rows]
            s, _ = pb.scores(m0, n0)
            m_tile = s.amax(dim=-1)
            p = torch.exp(s - _finite_or_zero(m_tile)[..., None])
            l_tile = p.sum(dim=-1)
            m_new = torch.maximum(mi, m_tile)
            m_safe = _finite_or_zero(m_new)
            alpha, beta = torch.exp(mi - m_safe), torch.exp(m_tile - m_safe)
            l_new = alpha * li + beta * l_tile
            # Dropout touches only what is multiplied into V: l normalises the undropped softmax.
            pv = pb.dropout(p, m0, n0) @ vj
            l_div = torch.where(l_new == 0, torch.ones_like(l_new), l_new)
            o[..., rows, :] = ((alpha * li)[..., None] * oi + beta[..., None] * pv) / l_div[..., None]
            l[..., rows], m[..., rows] = l_new, m_new
    lse = m + torch.log(l)  # untouched rows: -inf + log(0) = -inf
    return pb.rows(o), lse.flatten(1, 2)


def flash2_forward(q, k, v, *, softmax_scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None,
                   dropout_p=0.0, dropout_keep=None, block_m=64, block_n=64):
    """FlashAttention-2 forward: Q blocks outside, visible KV blocks inside.

    Online softmax in base 2 on an unnormalised accumulator, divided once at the end.
    Returns ``(out, lse)`` with the natural-log lse of shape (batch, nheads, seqlen_q).
    """
    pb = _problem(q, k, v, softmax_scale, window, softcap, alibi_slopes, dropout_p, dropout_keep,
                  block_m, block_n)
    o = pb.q.new_empty(*pb.q.shape[:-1], pb.v.shape[-1])
    lse = pb.q.new_empty(pb.q.shape[:-1])
    for m0 in pb.q_starts():
        rows = slice(m0, m0 + pb.block_m)
        shape = pb.q[..., rows, 0].shape
        acc = pb.q.new_zeros(*shape, pb.v.shape[-1])
        l = pb.q.new_zeros(shape)
        m = pb.q.new_full(shape, float("-inf"))  # running max, in log2 units
        for n0 in pb.visible(m0):
            s2, _ = pb.scores(m0, n0, unit=LOG2E)
            m_new = torch.maximum(m, s2.amax(dim=-1))
            m_safe = _finite_or_zero(m_new)
            p = torch.exp2(s2 - m_safe[..., None])
            alpha = torch.exp2(m - m_safe)
            l = alpha * l + p.sum(dim=-1)
            acc = alpha[..., None] * acc + pb.dropout(p, m0, n0) @ pb.v[..., n0:n0 + pb.block_n, :]
            m = m_new
        o[..., rows, :] = acc / torch.where(l == 0, torch.ones_like(l), l)[..., None]
        lse[..., rows] = (m + torch.log2(l)) / LOG2E  # empty rows: -inf
    return pb.rows(o), lse.flatten(1, 2)


def flash_backward(q, k, v, out, dout, lse, *, softmax_scale=None, window=(-1, -1), softcap=0.0,
                   alibi_slopes=None, dropout_p=0.0, dropout_keep=None, block_m=64, block_n=64):
    """Recomputation backward from the forward's lse: KV blocks outside, Q blocks inside.

    Returns ``(dq, dk, dv)``; dk and dv have nheads_kv heads (summed over each KV head's group).
    Rows that see no key get zero gradient.
    """
    pb = _problem(q, k, v, softmax_scale, window, softcap, alibi_slopes, dropout_p, dropout_keep,
                  block_m, block_n)
    b, hk, g, sq, _ = pb.q.shape
    do = dout.to(pb.q.dtype).transpose(1, 2).reshape(b, hk, g, sq, dout.shape[-1])
    o = out.to(pb.q.dtype).transpose(1, 2).reshape(b, hk, g, sq, out.shape[-1])
    delta = (do * o).sum(dim=-1)  # D_i = dO_i . O_i = sum_j P_ij dP_ij, dropout included
    # Empty rows have lse = -inf and scores all -inf; any finite stand-in makes P = 0 there.
    lse = _finite_or_zero(lse.to(pb.q.dtype).reshape(b, hk, g, sq))
    dq = torch.zeros_like(pb.q)
    dk, dv = torch.zeros_like(pb.k), torch.zeros_like(pb.v)
    for n0 in pb.kv_starts():
        cols = slice(n0, n0 + pb.block_n)
        kj, vj = pb.k[..., cols, :], pb.v[..., cols, :]
        for m0 in pb.q_starts():
            if n0 not in pb.visible(m0):
                continue
            rows = slice(m0, m0 + pb.block_m)
            s, t = pb.scores(m0, n0)
            p = torch.exp(s - lse[..., rows, None])
            doi = do[..., rows, :]
            dv[..., cols, :] += (pb.dropout(p, m0, n0).transpose(-1, -2) @ doi).sum(2, keepdim=True)
            dp = pb.dropout(doi @ vj.transpose(-1, -2), m0, n0)
            ds = p * (dp - delta[..., rows, None])
            if t is not None:
                ds = ds * (1.0 - t * t)
            dq[..., rows, :] += (ds @ kj) * pb.scale
            dk[..., cols, :] += (ds.transpose(-1, -2) @ pb.q[..., rows, :]).sum(2, keepdim=True) * pb.scale
    return pb.rows(dq), pb.rows(dk), pb.rows(dv)
