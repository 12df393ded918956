"""Ring attention: each rank holds a shard of the sequence; the key/value shards travel around the
ring of ranks, and each rank attends its queries to every shard that passes (Liu et al., "Ring
Attention with Blockwise Transformers"; the exact merge is Flash-Decoding's).

Forward, at ring step s rank r holds the keys and values of rank (r - s) mod W. It posts their
exchange for step s + 1 (``batch_isend_irecv``: send to r + 1, receive from r - 1) before it computes
step s, so the transfer runs behind the kernels; then it runs the step's calls
(``ioattn.plan.ring.schedule``) and merges each call's (out, lse) into float32 accumulators with
``merge_attention_states``.

Backward, every call's block backward (``ioattn.autograd._backward_impl``) runs against the final
merged out and lse of the local queries, so its probabilities are those of the whole softmax and
the blocks' gradients add up to the exact ones. dQ stays home; the dK/dV accumulators (float32)
travel with their shard: each step adds its blocks' dK, dV to the accumulator that arrived and
passes it on, and after the last step each goes back to the rank that owns its shard.

On CUDA the transfers run on the process group's own stream (NCCL's), which waits for the current
stream when an exchange is posted; ``Work.wait()`` makes the current stream wait for the transfer
without blocking the host. Buffers stay referenced until their exchange is waited for.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ioattn import api
from ioattn.autograd import _backward_impl, _forward_impl
from ioattn.distributed import checks
from ioattn.distributed.arguments import validate
from ioattn.merge import merge_attention_states
from ioattn.plan import hopper_bwd
from ioattn.plan import ring as plan

_KV_TAG, _GRAD_TAG = 0, 1  # Gloo matches sends to receives by tag; NCCL ignores tags


class _Exchange:
    """Tensors sent to one rank while buffers of the same shapes are received from another, until
    ``wait``. ``to``/``frm``: global ranks."""

    def __init__(self, tensors, to, frm, group, tag):
        self.sent = tensors  # referenced until the transfer is waited for
        self.received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, to, group, tag) for t in tensors]
        ops += [dist.P2POp(dist.irecv, t, frm, group, tag) for t in self.received]
        self.works = dist.batch_isend_irecv(ops)

    def wait(self):
        for w in self.works:
            w.wait()
        self.sent = None
        return self.received


@dataclass(frozen=True)
class Ring:
    """One call's ring: the group, this rank's place in it and its schedule, the mask's scalars.
    ``packed``: (cu_q, cu_k, max_q, max_k) of each packed call, keyed by the call."""
    group: object
    world: int
    rank: int
    steps: tuple
    scale: float
    softcap: float
    deterministic: bool
    varlen: bool
    packed: dict

    def peer(self, offset):
        return checks.global_rank(self.group, (self.rank + offset) % self.world)


def _rows(t, span, varlen):
    """Rows [a, b) of the sequence dimension of ``t`` (1 for batched tensors, 0 for packed ones)."""
    return t[span[0]:span[1]] if varlen else t[:, span[0]:span[1]]


def _lse_rows(lse, span):
    return lse[..., span[0]:span[1]]


def _kernel_args(ring, call, q_rows, k_cols):
    if call.seqlens is None:
        return None, None, q_rows.shape[1], k_cols.shape[1]
    return ring.packed[call]


def _block_forward(ring, call, q, k, v):
    q_rows = _rows(q, call.rows, ring.varlen)
    k_cols, v_cols = _rows(k, call.cols, ring.varlen), _rows(v, call.cols, ring.varlen)
    cu_q, cu_k, max_q, max_k = _kernel_args(ring, call, q_rows, k_cols)
    out, lse, _ = _forward_impl(q_rows, k_cols, v_cols, cu_q, cu_k, max_q, max_k, ring.scale, *call.window,
                                ring.softcap, None, 0.0)
    return out, lse


def _overlaps(span, spans):
    return any(span[0] < b and a < span[1] for a, b in spans)


def ring_forward(ring, q, k, v):
    """(out in q's dtype, lse float32) of this rank's queries against every shard's keys."""
    acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    lse_shape = (q.shape[1], q.shape[0]) if ring.varlen else (q.shape[0], q.shape[2], q.shape[1])
    acc_lse = torch.full(lse_shape, float("-inf"), dtype=torch.float32, device=q.device)
    written = []  # the row spans merged so far: a span merged for the first time is copied
    kv = (k, v)
    for s, calls in enumerate(ring.steps):
        pending = _Exchange(kv, ring.peer(1), ring.peer(-1), ring.group, _KV_TAG) if s + 1 < len(ring.steps) else None
        for call in calls:
            out, lse = _block_forward(ring, call, q, *kv)
            rows, rows_lse = _rows(acc, call.rows, ring.varlen), _lse_rows(acc_lse, call.rows)
            if _overlaps(call.rows, written):
                out, lse = merge_attention_states([rows, out.float()], [rows_lse, lse], lse_layout="flash_attn")
            rows.copy_(out)
            rows_lse.copy_(lse)
            written.append(call.rows)
        if pending is not None:
            kv = tuple(pending.wait())
    return acc.to(q.dtype), acc_lse


def _block_backward(ring, call, dout, q, k, v, out, lse):
    span = call.rows
    q_rows, dout_rows, out_rows = (_rows(t, span, ring.varlen) for t in (q, dout, out))
    k_cols, v_cols = _rows(k, call.cols, ring.varlen), _rows(v, call.cols, ring.varlen)
    cu_q, cu_k, max_q, max_k = _kernel_args(ring, call, q_rows, k_cols)
    no_rng = torch.zeros(2, dtype=torch.int64)
    with hopper_bwd.bwd_deterministic(True) if ring.deterministic else contextlib.nullcontext():
        dq, dk, dv, _ = _backward_impl(dout_rows, q_rows, k_cols, v_cols, out_rows, _lse_rows(lse, span).contiguous(),
                                       cu_q, cu_k, max_q, max_k, ring.scale, *call.window, ring.softcap, None, 0.0,
                                       no_rng)
    return dq, dk, dv


def ring_backward(ring, dout, q, k, v, out, lse):
    """(dq, dk, dv) of this rank's shards, in their dtypes."""
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    kv, n = (k, v), len(ring.steps)
    grads = None  # the dK/dV accumulators of the shard held, on their way
    for s, calls in enumerate(ring.steps):
        pending = _Exchange(kv, ring.peer(1), ring.peer(-1), ring.group, _KV_TAG) if s + 1 < n else None
        parts = [(call, *_block_backward(ring, call, dout, q, *kv, out, lse)) for call in calls]
        if grads is None:
            acc = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in kv]
        else:
            acc = grads.wait()
        for call, dq_c, dk_c, dv_c in parts:
            _rows(dq, call.rows, ring.varlen).add_(dq_c)
            _rows(acc[0], call.cols, ring.varlen).add_(dk_c)
            _rows(acc[1], call.cols, ring.varlen).add_(dv_c)
        # on to the next rank; after the last step, back to the shard's owner, rank - s
        to, frm = (1, -1) if s + 1 < n else (-s, s)
        grads = _Exchange(acc, ring.peer(to), ring.peer(frm), ring.group, _GRAD_TAG) if to % ring.world else None
        if grads is None:
            dk, dv = acc
        if pending is not None:
            kv = tuple(pending.wait())
    if grads is not None:
        dk, dv = grads.wait()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring):
        out, lse = ring_forward(ring, q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring = ring
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(ctx.ring, dout.contiguous(), q, k, v, out, lse)
        return dq, dk, dv, None


def _packed_args(steps, device):
    """(cu_q, cu_k, max_q, max_k) of each packed call, on ``device`` (one host-to-device copy each)."""
    out = {}
    for call in (c for calls in steps for c in calls if c.seqlens is not None):
        lens_q, lens_k = [sq for sq, _ in call.seqlens], [sk for _, sk in call.seqlens]
        cu = torch.tensor([[0, 0]] + list(call.seqlens), dtype=torch.int32).cumsum(0, dtype=torch.int32)
        cu = cu.to(device)
        out[call] = (cu[:, 0].contiguous(), cu[:, 1].contiguous(), max(lens_q), max(lens_k))
    return out


def ring_attention(q, k, v, group=None, causal=False, layout="contiguous", *, softmax_scale=None,
                   window_size=(-1, -1), softcap=0.0, deterministic=False, return_lse=False, cu_seqlens=None,
                   check=True):
    """Exact attention over a sequence sharded across the ranks of ``group``, by ring.

    ``q`` (batch, seqlen_shard, nheads, headdim), ``k``, ``v`` (batch, seqlen_shard, nheads_k, headdim):
    this rank's shard of the sequence in ``layout`` (``"contiguous"`` or ``"zigzag"``: see
    ``ioattn.distributed.shard``), every rank's shard of one shape. Returns this rank's shard of the
    output, and with ``return_lse=True`` also its log-sum-exp (batch, nheads, seqlen_shard), float32.
    Differentiable in q, k, v. ``group``: a ``torch.distributed`` process group (None: the default).

    ``softmax_scale``, ``causal``, ``window_size`` (in global positions), ``softcap`` and GQA / MQA
    are flash-attn's; ``deterministic=True`` runs the blocks' deterministic backward (the ring's
    order is fixed). Dropout and ALiBi are not offered across shards.

    Packed sequences: ``q`` (tokens_shard, nheads, headdim) and ``cu_seqlens``, the int32 cumulative
    lengths of the global packed sequence (the same on every rank, read on the host); the packed
    tokens are sharded as a sequence is, and sequences may cross shard boundaries. The lse is then
    (nheads, tokens_shard).

    ``check=True`` first gathers a few integers from every rank so that bad input (shards of different
    shapes, different arguments, a refused argument on one rank) raises the same error on every rank
    instead of leaving the others waiting: one small ``all_gather`` a call, and a host wait on CUDA.
    ``check=False`` skips it. Eager only: ``torch.compile`` of a model that calls it is untested (wrap the
    call in ``torch.compiler.disable`` there).
    """
    spec = validate("ring_attention", q, k, v, group, causal, layout, softmax_scale, window_size, softcap, cu_seqlens,
                    check)
    varlen = cu_seqlens is not None
    local = q.shape[0] if varlen else q.shape[1]
    steps = plan.schedule(layout, spec.world, spec.rank, local, spec.window, spec.sequences)
    ring = Ring(group, spec.world, spec.rank, steps, spec.scale, spec.softcap, bool(deterministic), varlen,
                _packed_args(steps, q.device))
    out, lse = _RingAttention.apply(api._contiguous_last(q), k.contiguous(), v.contiguous(), ring)
    return (out, lse) if return_lse else out

