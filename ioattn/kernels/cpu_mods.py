"""The CPU path of calls with a score function, a mask function or a block mask: dense scores a band
of query rows at a time, the user's functions applied to them as torch calls over broadcast index
tensors (as ``ioattn.mods`` traced them), float32 arithmetic (float64 inputs keep float64).

The backward recomputes each band's scores with autograd recording the score function, and pushes
dS = P * (dP - D) back through it: the gradients of q, k and of the tensors the function captures.

Reference twin: ``ioattn.reference.naive.attention_ref`` with ``mask_mod`` / ``score_mod``.
Test: ``tests/test_mods.py``.
"""
from __future__ import annotations

import torch

from ioattn.reference.naive import mod_index

_BAND_ELEMENTS = 1 << 22  # scores a band: (heads x rows x keys)


def _work_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _scores(q, k, scale, b, m0, m1, score_fn, mask_fn, block_keep, window):
    """Band [m0, m1) of one sequence's scores (1, nheads, rows, seqlen_k): scaled, the score function,
    the masks (-inf). q (rows, nheads, d), k (seqlen_k, nheads, d) already repeated to q's heads."""
    nheads, seqlen_k = q.shape[1], k.shape[0]
    s = torch.einsum("ihd,jhd->hij", q, k).unsqueeze(0) * scale
    idx = mod_index(1, nheads, m1 - m0, seqlen_k, q.device, b_offset=b, q_offset=m0)
    if score_fn is not None:
        s = score_fn(s, *idx)
    keep = None
    if mask_fn is not None:
        keep = mask_fn(*idx)
    if block_keep is not None:
        keep = block_keep if keep is None else keep & block_keep
    if window is not None:
        keep = window if keep is None else keep & window
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    return s


def _band_rows(nheads, seqlen_k):
    return max(1, _BAND_ELEMENTS // max(1, nheads * seqlen_k))


def _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
    """(b, q rows, k rows) per sequence: batch entries, or the packed sequences of cu_seqlens."""
    if cu_seqlens_q is None:
        return [(b, slice(None), slice(None)) for b in range(q.shape[0])]
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    return [(b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def _pick(t, b, rows, varlen):
    return t[rows] if varlen else t[b]


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, score_fn, mask_fn, block_keep_fn, window_fn):
    """(out like q, lse float32 in the call's layout). ``score_fn`` / ``mask_fn``: the user's functions
    or None; ``block_keep_fn(b, m0, m1, seqlen_q, seqlen_k)`` / ``window_fn(m0, m1, seqlen_q, seqlen_k)``:
    bool tensors broadcasting to a band's scores, or None."""
    varlen = cu_seqlens_q is not None
    nheads, group = q.shape[-2], q.shape[-2] // k.shape[-2]
    out = q.new_zeros(*q.shape[:-1], v.shape[-1])  # the output in V's head dim
    lse = (torch.full((nheads, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device) if varlen
           else torch.full((q.shape[0], nheads, q.shape[1]), float("-inf"), dtype=torch.float32, device=q.device))
    wd = _work_dtype(q)
    for b, rq, rk in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = _pick(q, b, rq, varlen), _pick(k, b, rk, varlen), _pick(v, b, rk, varlen)
        ks, vs = ks.repeat_interleave(group, 1).to(wd), vs.repeat_interleave(group, 1).to(wd)
        sq, sk = qs.shape[0], ks.shape[0]
        step = _band_rows(nheads, sk)
        for m0 in range(0, sq, step):
            m1 = min(sq, m0 + step)
            s = _scores(qs[m0:m1].to(wd), ks, scale, b, m0, m1, score_fn, mask_fn,
                        block_keep_fn and block_keep_fn(b, m0, m1, sq, sk), window_fn and window_fn(m0, m1, sq, sk))
            band_lse = torch.logsumexp(s, -1)  # (1, nheads, rows)
            p = torch.exp(s - band_lse.masked_fill(band_lse == float("-inf"), 0.0)[..., None])
            o = torch.einsum("hij,jhd->ihd", p[0], vs)
            if varlen:
                out[rq][m0:m1] = o.to(q.dtype)  # a view of out: rq is a slice
                lse[:, rq][:, m0:m1] = band_lse[0].float()
            else:
                out[b, m0:m1] = o.to(q.dtype)
                lse[b, :, m0:m1] = band_lse[0].float()
    return out, lse


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, scale, score_fn, mask_fn, block_keep_fn,
             window_fn, captures):
    """(dq, dk, dv, gradients of ``captures``) against the saved (out, lse), which may include sinks."""
    varlen = cu_seqlens_q is not None
    nheads, nheads_kv = q.shape[-2], k.shape[-2]
    group = nheads // nheads_kv
    wd = _work_dtype(q)
    dq = torch.zeros_like(q, dtype=wd)
    dk = torch.zeros_like(k, dtype=wd)
    dv = torch.zeros_like(v, dtype=wd)
    cap_grads = [torch.zeros_like(c, dtype=torch.float32 if c.dtype != torch.float64 else c.dtype)
                 for c in captures]
    for b, rq, rk in _sequences(q, k, cu_seqlens_q, cu_seqlens_k):
        qs, ks, vs = _pick(q, b, rq, varlen), _pick(k, b, rk, varlen), _pick(v, b, rk, varlen)
        dos, os_ = _pick(dout, b, rq, varlen).to(wd), _pick(out, b, rq, varlen).to(wd)
        ls = (lse[:, rq] if varlen else lse[b]).to(wd)  # (nheads, rows)
        kr = ks.repeat_interleave(group, 1).to(wd).requires_grad_(True)
        vr = vs.repeat_interleave(group, 1).to(wd)
        sq, sk = qs.shape[0], ks.shape[0]
        step = _band_rows(nheads, sk)
        dkr = torch.zeros_like(kr)
        dvr = torch.zeros_like(vr)
        for m0 in range(0, sq, step):
            m1 = min(sq, m0 + step)
            qb = qs[m0:m1].to(wd).requires_grad_(True)
            with torch.enable_grad():
                s = _scores(qb, kr, scale, b, m0, m1, score_fn, mask_fn,
                            block_keep_fn and block_keep_fn(b, m0, m1, sq, sk),
                            window_fn and window_fn(m0, m1, sq, sk))[0]
            l_band = ls[:, m0:m1]
            p = torch.exp(s.detach() - l_band.masked_fill(l_band == float("-inf"), float("inf"))[..., None])
            do_b = dos[m0:m1]
            dp = torch.einsum("ihd,jhd->hij", do_b, vr)
            delta = (do_b * os_[m0:m1]).sum(-1).transpose(0, 1)  # (nheads, rows)
            ds = p * (dp - delta[..., None])
            wrt = [qb, kr] + list(captures)
            grads = torch.autograd.grad(s, wrt, ds, allow_unused=True)
            dq_b = grads[0]
            if varlen:
                dq[rq][m0:m1] += dq_b
            else:
                dq[b, m0:m1] += dq_b
            dkr += grads[1]
            for g, acc in zip(grads[2:], cap_grads):
                if g is not None:
                    acc += g.to(acc.dtype)
            dvr += torch.einsum("hij,ihd->jhd", p, do_b)
        dk_b = dkr.view(sk, nheads_kv, group, -1).sum(2)
        dv_b = dvr.view(sk, nheads_kv, group, -1).sum(2)
        if varlen:
            dk[rk] += dk_b
            dv[rk] += dv_b
        else:
            dk[b] += dk_b
            dv[b] += dv_b
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), cap_grads
