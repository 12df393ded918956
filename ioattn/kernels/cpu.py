"""Attention on the CPU without Triton: the path ``ioattn.backends`` takes for CPU tensors.

Two routes, chosen per call by ``route``:

* ``"aten"``: PyTorch's own fused CPU flash-attention kernel
  (``aten::_scaled_dot_product_flash_attention_for_cpu`` and its backward), the kernel behind
  ``F.scaled_dot_product_attention`` on the CPU, for every call without dropout or softcap, in
  every dtype, any head dim and GQA (the kernel takes fewer key/value heads and sums their
  gradients itself). It reads our (batch, seqlen, heads, d) tensors through transposed views.
  A full or causal window without ALiBi is one call (``_whole_forward``): the kernel's causal mask
  is aligned top-left, ours bottom-right (``ioattn.masks``), so for ``seqlen_q != seqlen_k`` the
  call is cut into pieces the two agree on (``_causal_pieces``). Other windows and ALiBi go
  through the kernel's additive mask, one block of query rows at a time against the keys the
  block can see (``_masked_forward``), so the mask stays ``block_m x seqlen_k``.
* ``"tiled"``: softcap, dropout and a value head dim other than q's and k's (the kernel wants
  one head size), which the kernel has no way to take. Exact attention in
  PyTorch ops, one block of query rows at a time against all the keys the block can see: the
  scores of a block are one matrix product, the softmax is done in place in base 2 with the scale
  folded into q, and memory is linear in the sequence length (``block_m x seqlen_k`` scores per
  head). Dropout uses the Triton kernels' Philox mask (``ioattn.reference.philox``), so both
  paths drop the same entries.

The maths is float32 throughout, except the kernel in bfloat16 / float16: its forward keeps float32
scores and accumulators itself; its backward runs in the input dtype without a causal mask
(``_backward_dtype``). Layouts are ``ioattn.backends``': batched q (batch,
seqlen_q, nheads, d), k/v (batch, seqlen_k, nheads_kv, d), lse float32 (batch, nheads,
seqlen_q); varlen (packed, ``cu_seqlens`` given) q (total_q, nheads, d), lse (nheads, total_q),
one sequence at a time. Rows that see no key give output 0 and lse -inf.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ioattn.kernels.constants import LOG2E
from ioattn.layout import output_like
from ioattn.reference.philox import LazyDropoutMask

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


def route(softcap, dropout_p, device_type="cpu", value_dim_differs=False) -> str:
    """'aten' when PyTorch's fused CPU kernel can compute the call exactly, else 'tiled' (also for
    tensors on another device, where ``dispatch.forced_backend("reference")`` sends them, and for
    ``value_dim_differs``: v's head dim is not q's and k's, which the kernel refuses)."""
    if (_forced_route == "tiled" or softcap > 0 or dropout_p > 0 or device_type != "cpu"
            or value_dim_differs):
        return "tiled"
    return "aten"


# ---- geometry and layouts shared by the routes ------------------------------------------------

def _full_window(window, seqlen_q, seqlen_k):
    """The window with sides that hide nothing replaced by -1: query i sits at key position
    i + seqlen_k - seqlen_q, so a left side >= seqlen_k - 1 and a right side >= seqlen_q - 1 reach
    past the sequence's ends."""
    left, right = window
    return (-1 if left >= seqlen_k - 1 else left), (-1 if right >= seqlen_q - 1 else right)


def _row_blocks(seqlen_q, seqlen_k, window, block_m):
    """(m0, m1, n0, n1): query rows m0:m1 and the key columns n0:n1 that any of them can see
    (none when n1 <= n0)."""
    left, right = window
    off = seqlen_k - seqlen_q
    for m0 in range(0, seqlen_q, block_m):
        m1 = min(m0 + block_m, seqlen_q)
        n0 = 0 if left < 0 else min(seqlen_k, max(0, m0 + off - left))
        n1 = seqlen_k if right < 0 else min(seqlen_k, max(0, m1 + off + right))
        yield m0, m1, n0, n1


def _hidden_bands(m0, m1, n0, n1, seqlen_q, seqlen_k, window, device=None):
    """Where the window hides keys inside a block: (c0, c1, bool (rows, c1 - c0)) for the column
    ranges its edges cross, each at most block_m wide (the columns between are visible to every
    row of the block, and the block's key range already drops those no row sees)."""
    left, right = window
    off = seqlen_k - seqlen_q
    i = torch.arange(m0, m1, device=device).unsqueeze(1) + off  # the rows' key positions
    bands = []
    if left >= 0 and m1 - 1 + off - left > n0:  # the last row's left edge is past n0
        c1 = min(n1, m1 - 1 + off - left)
        bands.append((n0, c1, torch.arange(n0, c1, device=device) < i - left))
    if right >= 0 and m0 + off + right + 1 < n1:  # the first row's right edge is before n1
        c0 = max(n0, m0 + off + right + 1)
        bands.append((c0, n1, torch.arange(c0, n1, device=device) > i + right))
    return bands


def _alibi_distance(m0, m1, n0, n1, seqlen_q, seqlen_k, device=None):
    """|i + seqlen_k - seqlen_q - j| for a block, float32 (rows, keys)."""
    i = torch.arange(m0, m1, device=device).unsqueeze(1) + (seqlen_k - seqlen_q)
    return (i - torch.arange(n0, n1, device=device)).abs_().float()


# Scores (or ALiBi mask entries) held at once, in elements over all heads: a block's query rows
# fill this, between MIN_BLOCK_M and the route's maximum, keeping the per-block Python work small
# against the arithmetic while the scratch stays a few tens of MB and linear in seqlen_k.
SCORE_BUDGET = 1 << 21
MIN_BLOCK_M, MAX_BLOCK_M = 16, 512  # MAX_BLOCK_M: the tiled route's (the masked route's below)


def _block_rows(elements_per_row, max_rows, window) -> int:
    """Rows per block: a power of two keeping ``rows * elements_per_row`` within SCORE_BUDGET,
    between MIN_BLOCK_M and ``max_rows``, and at most a quarter of a two-sided window's width (a
    block computes its rows against the keys any of them sees: rows + width columns, of which
    each row needs width)."""
    rows = SCORE_BUDGET // max(1, elements_per_row)
    if min(window) >= 0:
        rows = min(rows, (window[0] + window[1] + 1) // 4)
    rows = 1 << max(rows, 1).bit_length() - 1
    return max(MIN_BLOCK_M, min(max_rows, rows))


def _heads_first(t):
    return t.transpose(1, 2)  # (batch, seqlen, heads, d) <-> (batch, heads, seqlen, d), a view


def _float_heads_first(t):
    """(batch, seqlen, heads, d) in any dtype -> contiguous float32 (batch, heads, seqlen, d)."""
    b, s, h, d = t.shape
    return torch.empty(b, h, s, d, dtype=torch.float32, device=t.device).copy_(t.transpose(1, 2))


def _kernel_view(t, dtype):
    """(batch, seqlen, heads, d) as the kernel's (batch, heads, seqlen, d) in ``dtype``: a view, or
    a contiguous float32 copy (the layout the backward kernel wants for grad_out)."""
    return _heads_first(t) if t.dtype == dtype else _float_heads_first(t)


# From this many keys the reduced-precision forward gets K and V as contiguous (batch, heads,
# seqlen, d) copies: the kernel reads them slower through the strided view of our layout, and the
# copies pay for themselves from there (float32 does not gain). tuned: docs/decisions/cpu-path.md
KV_COPY_MIN_KEYS = 4096


def _kv_for_forward(t):
    """K or V as the forward kernel reads it: a heads-first view, or a contiguous copy (see above)."""
    if t.dtype != torch.float32 and t.shape[1] >= KV_COPY_MIN_KEYS:
        return _heads_first(t).contiguous()
    return _heads_first(t)


def _in_layout(t, like):
    """``t`` with the strides of ``torch.empty_like(like)`` (what the op promises), copied only when
    they differ; the kernel's (batch, seqlen, heads, d) are those of contiguous inputs."""
    if like.is_contiguous():
        return t.contiguous()
    if t.stride() == torch.empty_like(like, device="meta").stride():
        return t
    return torch.empty_like(like).copy_(t)


# ---- the aten route: whole calls ----------------------------------------------------------------

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


def _whole_forward(q, k, v, scale, causal, out, lse):
    """One batched problem through the kernel, into ``out`` (batch, seqlen_q, heads, d) and ``lse``
    (batch, heads, seqlen_q) when given (views of a varlen output), else into new tensors.
    Returns (out, lse)."""
    sq, sk = q.shape[1], k.shape[1]
    pieces = _causal_pieces(sq, sk, causal)
    # pieces to merge run in float32, so that the output is rounded once, as the kernel's own is
    if len(pieces) > 1:
        qh, kh, vh = (_kernel_view(t, torch.float32) for t in (q, k, v))
    else:
        qh, kh, vh = _heads_first(q), _kv_for_forward(k), _kv_for_forward(v)
    if len(pieces) == 1 and pieces[0].rows.start == 0:  # one call over everything: no slicing
        parts = [_aten_fwd(qh, kh, vh, 0.0, causal, scale=scale)]
    else:
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
        lse = torch.empty(q.shape[0], q.shape[2], sq, dtype=torch.float32, device=q.device)
    out[:, :rows.start].zero_()  # the rows that see no key
    lse[:, :, :rows.start].fill_(float("-inf"))
    out[:, rows].copy_(_heads_first(o))
    lse[:, :, rows].copy_(l)
    return out, lse


def _backward_dtype(q, causal):
    """The dtype the kernel's backward runs in: the input's, except a causal mask in bfloat16 or
    float16, which runs in float32. The kernel adds every query block's dk and dv into buffers of the
    input dtype; with a causal mask the first keys' gradients are large sums and those roundings pile
    up past twice the error of PyTorch's plain attention in that dtype (docs/decisions/cpu-path.md)."""
    return torch.float32 if causal else q.dtype


def _whole_backward(dout, q, k, v, out, lse, scale, causal, grads):
    """Gradients of one batched problem through the kernel's backward. Each piece gets the merged
    out and lse: its probabilities exp(s - lse) and the row terms sum(dout * out) are then those of
    the whole softmax, so the pieces' gradients add up to the exact ones. ``grads`` (dq, dk, dv):
    views to write into, or None for new tensors. A float32 backward of reduced-precision inputs
    (``_backward_dtype``) runs a few heads at a time (``_head_chunks``) to bound the copies."""
    pieces = _causal_pieces(q.shape[1], k.shape[1], causal)
    dtype = _backward_dtype(q, causal)
    if grads is None and len(pieces) == 1 and pieces[0].rows.start == 0 and dtype == q.dtype:
        g = _aten_bwd(*(_heads_first(t) for t in (dout, q, k, v, out)), lse, 0.0, causal, scale=scale)
        return tuple(_in_layout(_heads_first(t), like) for t, like in zip(g, (q, k, v)))
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    rows = pieces[0].rows  # the same for every piece
    dq[:, :rows.start].zero_()  # rows that see no key
    group = q.shape[2] // k.shape[2]
    for hk in _head_chunks(q, k, dtype):
        hq = slice(hk.start * group, hk.stop * group)
        dh, qh, oh = (_kernel_view(t[:, rows, hq], dtype) for t in (dout, q, out))
        dq_rows = None
        for p in pieces:
            kh, vh = (_kernel_view(t[:, p.cols, hk], dtype) for t in (k, v))
            g = _aten_bwd(dh, qh, kh, vh, oh, lse[:, hq, rows], 0.0, p.causal, scale=scale)
            dq_rows = g[0] if dq_rows is None else dq_rows.add_(g[0])
            dk[:, p.cols, hk].copy_(_heads_first(g[1]))
            dv[:, p.cols, hk].copy_(_heads_first(g[2]))
        dq[:, rows, hq].copy_(_heads_first(dq_rows))
    return dq, dk, dv


# float32 copies a reduced-precision backward call may hold (inputs and gradients of its heads)
FP32_SCRATCH_BYTES = 16 << 20


def _head_chunks(q, k, dtype):
    """Slices of key/value heads for the backward's calls: all at once in the input dtype; in
    float32 from reduced precision as many heads as fit FP32_SCRATCH_BYTES of copies, but at least
    enough query heads to keep every thread busy (the kernel shares batch x heads among them)."""
    hk = k.shape[2]
    if dtype == q.dtype:
        return [slice(0, hk)]
    b, group, d = q.shape[0], q.shape[2] // hk, q.shape[3]
    per_head = 4 * b * d * 4 * (group * q.shape[1] + k.shape[1])  # q, out, dout, dq and k, v, dk, dv
    busy = -(-torch.get_num_threads() // (b * group))
    per_call = min(hk, max(busy, FP32_SCRATCH_BYTES // per_head, 1))
    return [slice(h, min(h + per_call, hk)) for h in range(0, hk, per_call)]


# ---- the aten route: masked blocks (windows, ALiBi) ------------------------------------------------

# Most query rows per masked call: the kernel computes the whole rectangle of a block's rows and
# key range, so narrow blocks waste little on a band; ALiBi's per-head mask counts against
# SCORE_BUDGET.
MASKED_BLOCK_M = 128


def _masked_rows(q, k, window, slopes):
    per_row = k.shape[1] * (q.shape[0] * q.shape[2] if slopes is not None else 1)
    return _block_rows(per_row, MASKED_BLOCK_M, window)


def _block_mask(m0, m1, n0, n1, seqlen_q, seqlen_k, window, slopes):
    """The kernel's additive float mask for a block: -inf where the window hides a key, ALiBi's
    -slope * |i + seqlen_k - seqlen_q - j| elsewhere, as (batch or 1, heads or 1, rows, keys);
    None when the block needs neither. ``slopes``: float32 (batch or 1, heads) or None."""
    bands = _hidden_bands(m0, m1, n0, n1, seqlen_q, seqlen_k, window)
    if slopes is None and not bands:
        return None
    if slopes is None:
        mask = torch.zeros(1, 1, m1 - m0, n1 - n0)
    else:
        mask = _alibi_distance(m0, m1, n0, n1, seqlen_q, seqlen_k) * slopes.neg()[..., None, None]
    for c0, c1, hidden in bands:
        mask[..., c0 - n0:c1 - n0].masked_fill_(hidden, float("-inf"))
    return mask


def _rows_without_keys(seqlen_q, seqlen_k, window):
    """Bool (seqlen_q,): the rows whose window holds no key."""
    left, right = window
    pos = torch.arange(seqlen_q) + (seqlen_k - seqlen_q)
    lo = (pos - left).clamp_(min=0) if left >= 0 else torch.zeros_like(pos)
    hi = (pos + right).clamp_(max=seqlen_k - 1) if right >= 0 else torch.full_like(pos, seqlen_k - 1)
    return lo > hi


def _masked_forward(q, k, v, scale, window, slopes, out, lse):
    """Fill ``out`` and ``lse`` block by block through the kernel's additive mask."""
    sq, sk = q.shape[1], k.shape[1]
    qh, kh, vh = _heads_first(q), _kv_for_forward(k), _kv_for_forward(v)
    for m0, m1, n0, n1 in _row_blocks(sq, sk, window, _masked_rows(q, k, window, slopes)):
        if n1 <= n0:
            out[:, m0:m1].zero_()
            continue
        mask = _block_mask(m0, m1, n0, n1, sq, sk, window, slopes)
        o, l = _aten_fwd(qh[:, :, m0:m1], kh[:, :, n0:n1], vh[:, :, n0:n1], 0.0, False, attn_mask=mask,
                         scale=scale)
        out[:, m0:m1].copy_(_heads_first(o))
        lse[:, :, m0:m1].copy_(l)
    # the kernel gives rows without keys output 0 and lse 0; ours is -inf
    lse.masked_fill_(_rows_without_keys(sq, sk, window), float("-inf"))
    return out, lse


def _masked_backward(dout, q, k, v, out, lse, scale, window, slopes, dq, dk, dv):
    """Fill ``dq``, ``dk``, ``dv`` block by block: each block's call gives its rows' dq and its
    keys' share of dk and dv, summed here in float32 (the kernel runs in float32 throughout, see
    ``_whole_backward``)."""
    sq, sk = q.shape[1], k.shape[1]
    dh, qh, kh, vh, oh = (_kernel_view(t, torch.float32) for t in (dout, q, k, v, out))
    dk32, dv32 = (torch.zeros(t.shape, dtype=torch.float32) for t in (k, v))
    lse = lse.clamp(min=_F32_MIN)  # rows without keys: exp(-inf - finite) = 0
    for m0, m1, n0, n1 in _row_blocks(sq, sk, window, _masked_rows(q, k, window, slopes)):
        if n1 <= n0:
            dq[:, m0:m1].zero_()
            continue
        mask = _block_mask(m0, m1, n0, n1, sq, sk, window, slopes)
        r, c = slice(m0, m1), slice(n0, n1)
        g = _aten_bwd(dh[:, :, r], qh[:, :, r], kh[:, :, c], vh[:, :, c], oh[:, :, r], lse[:, :, r], 0.0, False,
                      attn_mask=mask, scale=scale)
        dq[:, r].copy_(_heads_first(g[0]))
        dk32[:, c] += _heads_first(g[1])
        dv32[:, c] += _heads_first(g[2])
    dk.copy_(dk32)
    dv.copy_(dv32)
    return dq, dk, dv


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
        return self.scale / self.softcap if self.softcap > 0 else self.scale * LOG2E


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
        self.block_m = _block_rows(b * h * self.sk, MAX_BLOCK_M, spec.window)

    def blocks(self):
        return _row_blocks(self.sq, self.sk, self.spec.window, self.block_m)

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
            cap = self.spec.softcap * LOG2E
            t = s.tanh_()
            s = t * cap if keep_tanh else t.mul_(cap)
        dev = s.device
        for c0, c1, hidden in _hidden_bands(m0, m1, n0, n1, self.sq, self.sk, self.spec.window, dev):
            s[..., c0 - n0:c1 - n0].masked_fill_(hidden, float("-inf"))
        if self.spec.slopes is not None:
            s.addcmul_(self.spec.slopes, _alibi_distance(m0, m1, n0, n1, self.sq, self.sk, dev),
                           value=-LOG2E)
        return s, t

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
    lse2 = (lse.float() * LOG2E).clamp_(min=_F32_MIN).unflatten(1, (hk, g))
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

def _tiled_spec(q, k, scale, window, softcap, slopes, dropout_p, keep):
    hk = k.shape[-2]
    if slopes is not None:
        slopes = slopes.reshape(-1, hk, q.shape[-2] // hk, 1, 1)
    return _Spec(scale, window, softcap, slopes, dropout_p, keep)


def _whole_call(window, slopes):
    """Whether the kernel takes the call whole: a full or causal window and no ALiBi."""
    return slopes is None and window[0] == -1 and window[1] in (-1, 0)


def plan(seqlen_q, seqlen_k, window, softcap, has_alibi, dropout_p=0.0, device_type="cpu",
         value_dim_differs=False) -> dict:
    """What ``forward`` / ``backward`` run for such a call (``explain_dispatch``), from the same
    rules they use."""
    window = _full_window(window, seqlen_q, seqlen_k)
    if route(softcap, dropout_p, device_type, value_dim_differs) == "tiled":
        why = ("softcap" if softcap > 0 else "dropout" if dropout_p > 0 else
               f"{device_type} tensors" if device_type != "cpu" else
               "value head dim differs" if value_dim_differs else "forced")
        return {"route": f"tiled ({why}: blocks of query rows against the keys they see, PyTorch ops)"}
    kernel = "aten::_scaled_dot_product_flash_attention_for_cpu (PyTorch's fused CPU kernel)"
    if has_alibi or not _whole_call(window, None):
        how = "blocks of query rows, the window / ALiBi as the kernel's additive mask"
    elif window[1] == 0 and seqlen_q != seqlen_k:
        how = "pieces whose causal masks agree with the bottom-right alignment, merged by their lse"
    else:
        how = "one call"
    return {"route": "aten", "kernel": kernel, "calls": how}


def _forward_one(q, k, v, scale, window, softcap, slopes, dropout_p, keep, out=None, lse=None):
    """(out, lse) of a batched problem; written into ``out``/``lse`` when given."""
    sq, sk = q.shape[1], k.shape[1]
    window = _full_window(window, sq, sk)
    fused = route(softcap, dropout_p, q.device.type, v.shape[-1] != q.shape[-1]) == "aten"
    if fused and _whole_call(window, slopes) and min(q.shape) > 0 and sk > 0:
        return _whole_forward(q, k, v, scale, window[1] == 0, out, lse)
    if out is None:
        out = output_like(q, v)
        lse = torch.empty(q.shape[0], q.shape[2], sq, dtype=torch.float32, device=q.device)
    if min(q.shape) == 0:
        return out, lse
    if sk == 0:
        return out.zero_(), lse.fill_(float("-inf"))
    if fused:
        return _masked_forward(q, k, v, scale, window, slopes, out, lse)
    spec = _tiled_spec(q, k, scale, window, softcap, slopes, dropout_p, keep)
    return _tiled_forward(q, k, v, spec, out, lse)


def _backward_one(dout, q, k, v, out, lse, scale, window, softcap, slopes, dropout_p, keep, grads=None):
    """(dq, dk, dv) of a batched problem; written into ``grads`` when given."""
    sq, sk = q.shape[1], k.shape[1]
    window = _full_window(window, sq, sk)
    fused = route(softcap, dropout_p, q.device.type, v.shape[-1] != q.shape[-1]) == "aten"
    if fused and _whole_call(window, slopes) and min(q.shape) > 0 and sk > 0:
        return _whole_backward(dout, q, k, v, out, lse, scale, window[1] == 0, grads)
    dq, dk, dv = grads if grads is not None else (torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    if min(q.shape) == 0 or sk == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    if fused:
        return _masked_backward(dout, q, k, v, out, lse, scale, window, slopes, dq, dk, dv)
    spec = _tiled_spec(q, k, scale, window, softcap, slopes, dropout_p, keep)
    return _tiled_backward(dout, q, k, v, out, lse, spec, dq, dk, dv)


# ---- the entry points: batched, or varlen one sequence at a time ---------------------------------

def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(index, q rows, k rows) of each packed sequence."""
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for b in range(len(cq) - 1):
        yield b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])


def _dropout_mask(seed, dropout_p, batch, nheads, seqlen_q, seqlen_k, b=None, device=None):
    """The Triton kernels' keep mask, drawn a block at a time (sequence ``b`` of a varlen batch)."""
    if dropout_p == 0:
        return None
    return LazyDropoutMask(seed, dropout_p, batch, nheads, seqlen_q, seqlen_k, batch_index=b, device=device)


def _slopes(alibi_slopes, nheads, b=None):
    """ALiBi slopes as float32 (batch or 1, nheads), of sequence ``b`` when given (varlen)."""
    if alibi_slopes is None:
        return None
    slopes = alibi_slopes.float().reshape(-1, nheads)
    return slopes if b is None or slopes.shape[0] == 1 else slopes[b:b + 1]


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
            softcap, alibi_slopes, dropout_p, seed):
    """(out, lse) in ``ioattn.backends``' calling convention."""
    nheads = q.shape[-2]
    if cu_seqlens_q is None:
        keep = _dropout_mask(seed, dropout_p, q.shape[0], nheads, q.shape[1], k.shape[1], device=q.device)
        return _forward_one(q, k, v, softmax_scale, window, softcap, _slopes(alibi_slopes, nheads), dropout_p,
                            keep)
    # tokens after cu_seqlens[-1] belong to no sequence: output 0, lse -inf
    out = output_like(q, v, zeros=True)
    lse = torch.full((nheads, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    batch = cu_seqlens_q.numel() - 1
    for b, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        keep = _dropout_mask(seed, dropout_p, batch, nheads, max_seqlen_q, max_seqlen_k, b, q.device)
        _forward_one(q[rq][None], k[rk][None], v[rk][None], softmax_scale, window, softcap,
                     _slopes(alibi_slopes, nheads, b), dropout_p, keep, out=out[rq][None], lse=lse[:, rq][None])
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
             softmax_scale, window, softcap, alibi_slopes, dropout_p, seed):
    """(dq, dk, dv) in ``ioattn.backends``' calling convention."""
    nheads = q.shape[-2]
    if cu_seqlens_q is None:
        keep = _dropout_mask(seed, dropout_p, q.shape[0], nheads, q.shape[1], k.shape[1], device=q.device)
        return _backward_one(dout, q, k, v, out, lse, softmax_scale, window, softcap,
                             _slopes(alibi_slopes, nheads), dropout_p, keep)
    # tokens outside every sequence, and keys of sequences without queries, get no gradient
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    batch = cu_seqlens_q.numel() - 1
    for b, rq, rk in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rq.stop == rq.start:
            continue
        keep = _dropout_mask(seed, dropout_p, batch, nheads, max_seqlen_q, max_seqlen_k, b, q.device)
        _backward_one(dout[rq][None], q[rq][None], k[rk][None], v[rk][None], out[rq][None], lse[:, rq][None],
                      softmax_scale, window, softcap, _slopes(alibi_slopes, nheads, b), dropout_p, keep,
                      grads=(dq[rq][None], dk[rk][None], dv[rk][None]))
    return dq, dk, dv
