"""Attention on the CPU without Triton: the path ``ioattn.backends`` takes for CPU tensors.

Two routes, chosen per call by ``route``:

* ``"aten"``: PyTorch's own fused CPU flash-attention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), the kernel behind
  ``F.scaled_dot_product_attention`` on the CPU. It covers calls without dropout, softcap or ALiBi
  whose window is full or causal, in every dtype, any head dim and GQA (the kernel takes fewer
  key/value heads and sums their gradients itself). It reads our (batch, seqlen, heads, d) tensors
  through transposed views, without copies. Its causal mask is aligned top-left; ours bottom-right
  (``ioattn.masks``), so for ``seqlen_q != seqlen_k`` the call is cut into pieces the two agree on
  (``_causal_pieces``).
* ``"tiled"``: everything else (windows, softcap, ALiBi, dropout). Exact attention in PyTorch ops,
  one block of query rows at a time against all the keys the block can see: the scores of a block
  are one matrix product, the softmax is done in place in base 2 with the scale folded into q, and
  memory is linear in the sequence length (``block_m x seqlen_k`` scores per head). Dropout uses the
  Triton kernels' Philox mask (``ioattn.reference.philox``), so both paths drop the same entries.

Layouts are ``ioattn.backends``': batched q (batch, seqlen_q, nheads, d), k/v (batch, seqlen_k,
nheads_kv, d), lse float32 (batch, nheads, seqlen_q); varlen (packed, ``cu_seqlens`` given) q
(total_q, nheads, d), lse (nheads, total_q), one sequence at a time. Rows that see no key give
output 0 and lse -inf.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ioattn.reference.philox import LazyDropoutMask

_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
_F32_MIN = torch.finfo(torch.float32).min

# the fused kernels, looked up once (a torch.ops attribute lookup costs microseconds per call)
_aten_fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_aten_bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default

_forced_route: str | None = None


@contextlib.contextmanager
def forced_route(name: str):
    """Run the CPU calls inside on one route: 'aten' where it applies, or 'tiled' (tests, A/B runs)."""
    global _forced_route
    if name not in ("aten", "tiled"):
        raise ValueError(f"route must be 'aten' or 'tiled', got {name!r}")
    previous, _forced_route = _forced_route, name
    try:
        yield
    finally:
        _forced_route = previous


def _full_window(window, seqlen_q, seqlen_k):
    """The window with sides that hide nothing replaced by -1: query i sits at key position
    i + seqlen_k - seqlen_q, so a left side >= seqlen_k - 1 and a right side >= seqlen_q - 1 reach
    past the sequence's ends."""
    left, right = window
    return (-1 if left >= seqlen_k - 1 else left), (-1 if right >= seqlen_q - 1 else right)


def route(window, softcap, alibi_slopes, dropout_p, seqlen_q, seqlen_k) -> str:
    """'aten' when PyTorch's fused kernel computes exactly this call, else 'tiled'."""
    if _forced_route == "tiled":
        return "tiled"
    left, right = _full_window(window, seqlen_q, seqlen_k)
    fits = dropout_p == 0 and softcap == 0 and alibi_slopes is None and left == -1 and right in (-1, 0)
    return "aten" if fits else "tiled"


# ---- the aten route ---------------------------------------------------------------------------

def _heads_first(t):
    return t.transpose(1, 2)  # (batch, seqlen, heads, d) <-> (batch, heads, seqlen, d), a view


def _float_heads_first(t):
    """(batch, seqlen, heads, d) in any dtype -> contiguous float32 (batch, heads, seqlen, d)."""
    b, s, h, d = t.shape
    return torch.empty(b, h, s, d, dtype=torch.float32).copy_(t.transpose(1, 2))


@dataclass
class _Piece:
    """One kernel call of a causal problem: query rows ``rows`` against key columns ``cols``."""
    rows: slice
    cols: slice
    causal: bool


def _causal_pieces(seqlen_q, seqlen_k, causal):
    """Kernel calls that make up our mask from the kernel's (top-left aligned) one.

    Non-causal, or causal with seqlen_q == seqlen_k: one call. Causal with more queries than keys:
    the first seqlen_q - seqlen_k rows see nothing, the rest form a square. Causal with more keys:
    every row sees the first seqlen_k - seqlen_q keys (a plain call) and the rest causally (a
    square); the two are merged by their log-sum-exps."""
    every = slice(0, None)
    if not causal or seqlen_q == seqlen_k:
        return [_Piece(every, every, causal)]
    if seqlen_q > seqlen_k:
        return [_Piece(slice(seqlen_q - seqlen_k, None), every, True)]
    prefix = seqlen_k - seqlen_q
    return [_Piece(every, slice(0, prefix), False), _Piece(every, slice(prefix, None), True)]


def _merge(parts, dtype):
    """Combine (out, lse) of calls over disjoint key sets: lse = log(sum exp lse_i) and out the
    lse-weighted sum (in float32). Every row sees a key in the calls made here, so lse is finite."""
    lse = torch.logsumexp(torch.stack([l for _, l in parts]), dim=0)
    out = None
    for o, l in parts:
        term = o.float() * torch.exp(l - lse).unsqueeze(-1)
        out = term if out is None else out.add_(term)
    return out.to(dtype), lse


def _aten_forward(q, k, v, scale, causal, out, lse):
    """One batched problem through the kernel, into ``out`` (batch, seqlen_q, heads, d) and ``lse``
    (batch, heads, seqlen_q) when given (views of a varlen output), else into new tensors.
    Returns (out, lse)."""
    sq, sk = q.shape[1], k.shape[1]
    pieces = _causal_pieces(sq, sk, causal)
    # pieces to merge run in float32, so that the output is rounded once, as the kernel's own is
    view = _float_heads_first_view if len(pieces) > 1 else _heads_first
    qh, kh, vh = view(q), view(k), view(v)
    parts = [_aten_fwd(qh[:, :, p.rows], kh[:, :, p.cols], vh[:, :, p.cols], 0.0, p.causal, scale=scale)
             for p in pieces]
    if len(parts) > 1:
        parts = [_merge(parts, q.dtype)]
    o, l = parts[0]
    rows = pieces[0].rows
    if out is None and rows.start == 0:
        # the kernel writes out as (batch, seqlen, heads, d), our layout, and the lse as a
        # transposed view of (batch, seqlen, heads): the op promises contiguous lse
        return _in_layout(_heads_first(o), q), l.contiguous()
    if out is None:
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], sq, dtype=torch.float32)
    out[:, :rows.start].zero_()  # the rows that see no key
    lse[:, :, :rows.start].fill_(float("-inf"))
    out[:, rows].copy_(_heads_first(o))
    lse[:, :, rows].copy_(l)
    return out, lse


def _aten_backward(dout, q, k, v, out, lse, scale, causal, grads):
    """Gradients of one batched problem through the kernel's backward. Each piece gets the merged
    out and lse: its probabilities exp(s - lse) and the row terms sum(dout * out) are then those of
    the whole softmax, so the pieces' gradients add up to the exact ones. ``grads`` (dq, dk, dv):
    views to write into, or None for new tensors.

    The kernel adds each block's contribution into gradients of the input dtype; in bfloat16 or
    float16 those roundings pile up (dv about 3.5x the error of PyTorch's plain attention in
    bfloat16 at 2048 causal keys), so reduced precision runs the kernel in float32, a few heads at
    a time (``_head_chunks``) to bound the float32 copies."""
    pieces = _causal_pieces(q.shape[1], k.shape[1], causal)
    if (grads is None and len(pieces) == 1 and pieces[0].rows.start == 0 and q.dtype == torch.float32):
        g = _aten_bwd(*(_heads_first(t) for t in (dout, q, k, v, out)), lse, 0.0, causal, scale=scale)
        return tuple(_in_layout(_heads_first(t), like) for t, like in zip(g, (q, k, v)))
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    rows = pieces[0].rows  # the same for every piece
    dq[:, :rows.start].zero_()  # rows that see no key
    group = q.shape[2] // k.shape[2]
    for hk in _head_chunks(q, k):
        hq = slice(hk.start * group, hk.stop * group)
        dh, qh, oh = (_float_heads_first_view(t[:, rows, hq]) for t in (dout, q, out))
        dq_rows = None
        for p in pieces:
            kh, vh = (_float_heads_first_view(t[:, p.cols, hk]) for t in (k, v))
            g = _aten_bwd(dh, qh, kh, vh, oh, lse[:, hq, rows], 0.0, p.causal, scale=scale)
            dq_rows = g[0] if dq_rows is None else dq_rows.add_(g[0])
            dk[:, p.cols, hk].copy_(_heads_first(g[1]))
            dv[:, p.cols, hk].copy_(_heads_first(g[2]))
        dq[:, rows, hq].copy_(_heads_first(dq_rows))
    return dq, dk, dv


def _float_heads_first_view(t):
    """(batch, seqlen, heads, d) as the kernel's (batch, heads, seqlen, d) in float32: a view of a
    float32 tensor, else a contiguous float32 copy (the layout the backward kernel wants for
    grad_out, which it would otherwise copy again)."""
    return _heads_first(t) if t.dtype == torch.float32 else _float_heads_first(t)


# float32 copies a reduced-precision backward call may hold (inputs and gradients of its heads)
FP32_SCRATCH_BYTES = 16 << 20


def _head_chunks(q, k):
    """Slices of key/value heads for the backward's calls: all at once in float32; in reduced
    precision as many heads as fit FP32_SCRATCH_BYTES of float32 copies, but at least enough
    query heads to keep every thread busy (the kernel shares batch x heads among them)."""
    hk = k.shape[2]
    if q.dtype == torch.float32:
        return [slice(0, hk)]
    b, group, d = q.shape[0], q.shape[2] // hk, q.shape[3]
    per_head = 4 * b * d * 4 * (group * q.shape[1] + k.shape[1])  # q, out, dout, dq and k, v, dk, dv
    busy = -(-torch.get_num_threads() // (b * group))
    per_call = min(hk, max(busy, FP32_SCRATCH_BYTES // per_head, 1))
    return [slice(h, min(h + per_call, hk)) for h in range(0, hk, per_call)]


def _in_layout(t, like):
    """``t`` with the strides of ``torch.empty_like(like)`` (what the op promises), copied only when
    they differ; the kernel's (batch, seqlen, heads, d) are those of contiguous inputs."""
    if like.is_contiguous():
        return t.contiguous()
    if t.stride() == torch.empty_like(like, device="meta").stride():
        return t
    return torch.empty_like(like).copy_(t)


# ---- the tiled route --------------------------------------------------------------------------

@dataclass
class _Spec:
    """The score rule of one batched problem (see ``ioattn.masks`` for the conventions)."""
    scale: float
    window: tuple[int, int]
    softcap: float
    slopes: Optional[torch.Tensor]  # float32, (batch or 1, nheads_kv, group, 1, 1)
    dropout_p: float
    keep: Optional[Callable]  # (m0, m1, n0, n1) -> bool (batch or 1, nheads, m1 - m0, n1 - n0)

    @property
    def q_factor(self) -> float:
        """What q is multiplied by before q @ k^T: the scores come out in log2 units without
        softcap; with softcap they are tanh's argument."""
        return self.scale / self.softcap if self.softcap > 0 else self.scale * _LOG2E


# Scores held at once, in elements over all heads: the query block is sized to fill this
# (between MIN_BLOCK_M and MAX_BLOCK_M rows), keeping the per-block Python work small against the
# arithmetic while the scratch stays a few tens of MB and linear in seqlen_k.
SCORE_BUDGET = 1 << 22
MIN_BLOCK_M, MAX_BLOCK_M = 16, 512


def block_rows(batch, nheads, seqlen_k) -> int:
    rows = SCORE_BUDGET // max(1, batch * nheads * seqlen_k)
    rows = 1 << max(rows, 1).bit_length() - 1  # a power of two at most ``rows``
    return max(MIN_BLOCK_M, min(MAX_BLOCK_M, rows))


class _Tiles:
    """q, k, v of one batched problem in float32 (batch, nheads_kv, seqlen, d) with q as
    (batch, nheads_kv, group, seqlen_q, d), and the per-block score computation."""

    def __init__(self, q, k, v, spec: _Spec):
        self.spec = spec
        b, sq, h, d = q.shape
        hk = k.shape[2]
        self.group = h // hk
        self.q = _float_heads_first(q).view(b, hk, self.group, sq, d)
        self.k, self.v = _float_heads_first(k), _float_heads_first(v)
        self.sq, self.sk = sq, k.shape[1]
        self.block_m = block_rows(b, h, self.sk)

    def blocks(self):
        """(m0, m1, n0, n1): each query block and the key columns its rows can see (empty: n1 <= n0)."""
        left, right = self.spec.window
        off = self.sk - self.sq
        for m0 in range(0, self.sq, self.block_m):
            m1 = min(m0 + self.block_m, self.sq)
            n0 = 0 if left < 0 else min(self.sk, max(0, m0 + off - left))
            n1 = self.sk if right < 0 else min(self.sk, max(0, m1 + off + right))
            yield m0, m1, n0, n1

    def q_rows(self, m0, m1):
        """q rows m0:m1 as (batch, nheads_kv, group * rows, d) (GQA's group joins the rows): a copy,
        or a view of q without GQA, so never written to."""
        return self.q[..., m0:m1, :].flatten(2, 3)

    def scores(self, qs, m0, m1, n0, n1, keep_tanh=False):
        """Scores of rows m0:m1 (``qs``: q_rows times ``spec.q_factor``) against keys n0:n1 in log2
        units, masked and biased, as (batch, nheads_kv, group, rows, keys); with ``keep_tanh``
        also tanh's output for the softcap derivative (None without softcap)."""
        s = torch.matmul(qs, self.k[..., n0:n1, :].transpose(-1, -2))
        s = s.view(*s.shape[:2], self.group, m1 - m0, n1 - n0)
        t = None
        if self.spec.softcap > 0:
            cap = self.spec.softcap * _LOG2E
            t = s.tanh_()
            s = t * cap if keep_tanh else t.mul_(cap)
        i = torch.arange(m0, m1).unsqueeze(1) + (self.sk - self.sq)
        j = torch.arange(n0, n1).unsqueeze(0)
        hidden = self._hidden(i, j, m0, m1, n0, n1)
        if hidden is not None:
            s.masked_fill_(hidden, float("-inf"))
        if self.spec.slopes is not None:
            s.addcmul_(self.spec.slopes, (i - j).abs().to(s.dtype), value=-_LOG2E)
        return s, t

    def _hidden(self, i, j, m0, m1, n0, n1):
        """Bool (rows, keys), True where the window hides a key; None when the block's key range
        is exactly what each of its rows sees (no row's window edge falls inside it)."""
        left, right = self.spec.window
        off = self.sk - self.sq
        cut_left = left >= 0 and m1 - 1 + off - left > n0
        cut_right = right >= 0 and m0 + off + right + 1 < n1
        if not (cut_left or cut_right):
            return None
        hidden = torch.zeros(i.shape[0], j.shape[1], dtype=torch.bool)
        if cut_left:
            hidden |= j < i - left
        if cut_right:
            hidden |= j > i + right
        return hidden

    def keep(self, m0, m1, n0, n1):
        """The dropout keep mask of a block as (batch or 1, nheads_kv, group, rows, keys)."""
        z = self.spec.keep(m0, m1, n0, n1)
        return z.view(z.shape[0], -1, self.group, *z.shape[-2:])


def _tiled_forward(q, k, v, spec, out, lse):
    """Fill ``out`` (batch, seqlen_q, heads, d) and ``lse`` (batch, heads, seqlen_q)."""
    tl = _Tiles(q, k, v, spec)
    hk, g = tl.k.shape[1], tl.group
    out5, lse4 = out.unflatten(2, (hk, g)), lse.unflatten(1, (hk, g))
    for m0, m1, n0, n1 in tl.blocks():
        if n1 <= n0:
            out5[:, m0:m1].zero_()
            lse4[..., m0:m1].fill_(float("-inf"))
            continue
        s, _ = tl.scores(tl.q_rows(m0, m1) * spec.q_factor, m0, m1, n0, n1)
        # empty rows (max -inf) get a finite stand-in so that exp2(s - max) is 0, not NaN
        m = s.amax(dim=-1, keepdim=True).clamp_(min=_F32_MIN)
        p = s.sub_(m).exp2_()
        l = p.sum(dim=-1, keepdim=True)
        lse4[..., m0:m1].copy_(m.add_(l.log2()).squeeze(-1).mul_(_LN2))  # empty rows: log2(0) = -inf
        if spec.dropout_p > 0:  # dropped after the sum: l normalises the undropped softmax
            p.masked_fill_(~tl.keep(m0, m1, n0, n1), 0.0)
            l.mul_(1.0 - spec.dropout_p)
        o = torch.matmul(p.flatten(2, 3), tl.v[..., n0:n1, :]).view(*p.shape[:-1], -1)
        o.div_(l.clamp_(min=torch.finfo(torch.float32).tiny))
        out5[:, m0:m1].copy_(o.permute(0, 3, 1, 2, 4))
    return out, lse


def _tiled_backward(dout, q, k, v, out, lse, spec, dq, dk, dv):
    """Fill ``dq``, ``dk``, ``dv`` (each in its input's layout) from the forward's out and lse."""
    tl = _Tiles(q, k, v, spec)
    hk, g = tl.k.shape[1], tl.group
    dk32, dv32 = torch.zeros_like(tl.k), torch.zeros_like(tl.v)
    dq5 = dq.unflatten(2, (hk, g))
    # lse in log2 units, -inf (rows without keys) made finite: their scores are all -inf anyway
    lse2 = (lse.float() * _LOG2E).clamp_(min=_F32_MIN).unflatten(1, (hk, g))
    # D_i = dO_i . O_i = sum_j P_ij dP_ij (dropout included), per row
    delta = (dout.float() * out.float()).sum(dim=-1).transpose(1, 2).unflatten(1, (hk, g))
    do_h = _float_heads_first(dout).unflatten(1, (hk, g))
    for m0, m1, n0, n1 in tl.blocks():
        if n1 <= n0:
            dq5[:, m0:m1].zero_()
            continue
        qb = tl.q_rows(m0, m1)
        s, t = tl.scores(qb * spec.q_factor, m0, m1, n0, n1, keep_tanh=True)
        p = s.sub_(lse2[..., m0:m1, None]).exp2_()
        do_b = do_h[..., m0:m1, :].flatten(2, 3)
        kn, vn = tl.k[..., n0:n1, :], tl.v[..., n0:n1, :]
        dp = torch.matmul(do_b, vn.transpose(-1, -2)).view_as(p)
        pv = p
        if spec.dropout_p > 0:
            dropped, kept = ~tl.keep(m0, m1, n0, n1), 1.0 / (1.0 - spec.dropout_p)
            pv = p.masked_fill(dropped, 0.0).mul_(kept)
            dp.masked_fill_(dropped, 0.0).mul_(kept)
        dv32[..., n0:n1, :] += torch.matmul(pv.flatten(2, 3).transpose(-1, -2), do_b)
        ds = dp.sub_(delta[..., m0:m1, None]).mul_(p)
        if t is not None:
            ds.mul_(t.square_().neg_().add_(1.0))  # tanh' = 1 - tanh^2
        ds = ds.mul_(spec.scale).flatten(2, 3)
        dq5[:, m0:m1].copy_(torch.matmul(ds, kn).unflatten(2, (g, m1 - m0)).permute(0, 3, 1, 2, 4))
        dk32[..., n0:n1, :] += torch.matmul(ds.transpose(-1, -2), qb)
    dk.copy_(dk32.transpose(1, 2))
    dv.copy_(dv32.transpose(1, 2))
    return dq, dk, dv


# ---- one batched problem, either route ----------------------------------------------------------

def _spec(q, k, scale, window, softcap, slopes, dropout_p, keep):
    hk = k.shape[-2]
    if slopes is not None:
        slopes = slopes.to(torch.float32).reshape(-1, hk, q.shape[-2] // hk, 1, 1)
    return _Spec(scale, window, softcap, slopes, dropout_p, keep)


def _forward_one(q, k, v, scale, window, softcap, slopes, dropout_p, keep, out=None, lse=None):
    """(out, lse) of a batched problem; written into ``out``/``lse`` when given."""
    sq, sk = q.shape[1], k.shape[1]
    if route(window, softcap, slopes, dropout_p, sq, sk) == "aten" and min(q.shape) > 0 and sk > 0:
        return _aten_forward(q, k, v, scale, _full_window(window, sq, sk)[1] == 0, out, lse)
    if out is None:
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[0], q.shape[2], sq, dtype=torch.float32)
    if min(q.shape) == 0:
        return out, lse
    if sk == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    spec = _spec(q, k, scale, _full_window(window, sq, sk), softcap, slopes, dropout_p, keep)
    return _tiled_forward(q, k, v, spec, out, lse)


def _backward_one(dout, q, k, v, out, lse, scale, window, softcap, slopes, dropout_p, keep, grads=None):
    """(dq, dk, dv) of a batched problem; written into ``grads`` when given."""
    sq, sk = q.shape[1], k.shape[1]
    if route(window, softcap, slopes, dropout_p, sq, sk) == "aten" and min(q.shape) > 0 and sk > 0:
        return _aten_backward(dout, q, k, v, out, lse, scale, _full_window(window, sq, sk)[1] == 0, grads)
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    if min(q.shape) == 0 or sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    spec = _spec(q, k, scale, _full_window(window, sq, sk), softcap, slopes, dropout_p, keep)
    return _tiled_backward(dout, q, k, v, out, lse, spec, dq, dk, dv)


# ---- the entry points: batched, or varlen one sequence at a time ---------------------------------

def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(index, q rows, k rows) of each packed sequence."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        yield b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])


def _dropout_mask(seed, dropout_p, batch, nheads, seqlen_q, seqlen_k, b=None):
    """The Triton kernels' keep mask, drawn a block at a time (sequence ``b`` of a varlen batch)."""
    if dropout_p == 0:
        return None
    return LazyDropoutMask(seed, dropout_p, batch, nheads, seqlen_q, seqlen_k, batch_index=b)


def _seq_slopes(alibi_slopes, b):
    if alibi_slopes is None or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[b:b + 1]


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
            softcap, alibi_slopes, dropout_p, seed):
    """(out, lse) in ``ioattn.backends``' calling convention."""
    nheads = q.shape[-2]
    if cu_seqlens_q is None:
        keep = _dropout_mask(seed, dropout_p, q.shape[0], nheads, q.shape[1], k.shape[1])
        return _forward_one(q, k, v, softmax_scale, window, softcap, alibi_slopes, dropout_p, keep)
    # tokens after cu_seqlens[-1] belong to no sequence: output 0, lse -inf
    out = torch.zeros_like(q)
    lse = torch.full((nheads, q.shape[0]), float("-inf"), dtype=torch.float32)
    batch = cu_seqlens_q.numel() - 1
    for b, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        keep = _dropout_mask(seed, dropout_p, batch, nheads, max_seqlen_q, max_seqlen_k, b)
        _forward_one(q[rq][None], k[rk][None], v[rk][None], softmax_scale, window, softcap,
                     _seq_slopes(alibi_slopes, b), dropout_p, keep, out=out[rq][None], lse=lse[:, rq][None])
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, window, softcap, alibi_slopes, dropout_p, seed):
    """(dq, dk, dv) in ``ioattn.backends``' calling convention."""
    nheads = q.shape[-2]
    if cu_seqlens_q is None:
        keep = _dropout_mask(seed, dropout_p, q.shape[0], nheads, q.shape[1], k.shape[1])
        return _backward_one(dout, q, k, v, out, lse, softmax_scale, window, softcap, alibi_slopes,
                             dropout_p, keep)
    # tokens outside every sequence, and keys of sequences without queries, get no gradient
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    batch = cu_seqlens_q.numel() - 1
    for b, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start:
            continue
        keep = _dropout_mask(seed, dropout_p, batch, nheads, max_seqlen_q, max_seqlen_k, b)
        _backward_one(dout[rq][None], q[rq][None], k[rk][None], v[rk][None], out[rq][None], lse[:, rq][None],
                      softmax_scale, window, softcap, _seq_slopes(alibi_slopes, b), dropout_p, keep,
                      grads=(dq[rq][None], dk[rk][None], dv[rk][None]))
    return dq, dk, dv
