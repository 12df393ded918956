"""Autograd: one forward and one backward that every public variant (batched, varlen, packed)
reshapes into, reached two ways.

* Traced (``torch.compile``, ``torch.export``, fake tensors, any dispatch mode, tensor subclasses):
  the ``torch.library`` ops ``ioattn::fwd`` / ``ioattn::bwd`` with fake implementations, so that
  ``torch.compile(fullgraph=True)`` traces through them.
* Eager on plain tensors: ``_Eager``, a ``torch.autograd.Function`` calling the same backends
  directly (or the forward alone when no input needs a gradient), without the custom op's
  dispatch cost (docs/decisions/eager-path.md). The two ways run the same kernels and give the
  same results (tests/test_autograd_paths.py)."""
from __future__ import annotations

from typing import Optional

import torch

from ioattn import backends
from ioattn.layout import output_like
from ioattn.plan import hopper_bwd
from ioattn.semantics import Semantics


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                  cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                  softmax_scale: float, window_left: int, window_right: int, softcap: float,
                  alibi_slopes: Optional[torch.Tensor], dropout_p: float, sinks: Optional[torch.Tensor] = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The dropout seed is drawn here, inside the op, from torch's CPU generator (no device sync),
    # and returned so the backward replays exactly the same mask.
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    sem = Semantics(softmax_scale, (window_left, window_right), softcap, dropout_p, alibi_slopes is not None)
    out, lse = backends.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                                seed)
    if sinks is not None:
        out, lse = join_sinks(out, lse, sinks, cu_seqlens_q is not None)
    rng_state = torch.zeros(2, dtype=torch.int64)  # (seed, offset); cheaper than torch.tensor
    if seed:
        rng_state[0] = seed
    return out, lse, rng_state


_fwd_op = torch.library.custom_op("ioattn::fwd", _forward_impl, mutates_args=())


@_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
      window_right, softcap, alibi_slopes, dropout_p, sinks=None):
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return output_like(q, v), lse, torch.empty(2, dtype=torch.int64)


def _backward_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                   cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: float, window_left: int, window_right: int, softcap: float,
                   alibi_slopes: Optional[torch.Tensor], dropout_p: float, rng_state: torch.Tensor,
                   sinks: Optional[torch.Tensor] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = int(rng_state[0]) if dropout_p > 0 else 0
    sem = Semantics(softmax_scale, (window_left, window_right), softcap, dropout_p, alibi_slopes is not None)
    dout = dout.contiguous() if dout.stride(-1) != 1 else dout
    # with sinks, out and lse are the joined ones: the backward recomputes P against that lse, which
    # is the softmax with the sinks in its denominator (join_sinks)
    dq, dk, dv = backends.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                   max_seqlen_k, sem, alibi_slopes, seed)
    dsinks = lse.new_empty(0) if sinks is None else sinks_grad(dout, out, lse, sinks, cu_seqlens_q is not None)
    return dq, dk, dv, dsinks


_bwd_op = torch.library.custom_op("ioattn::bwd", _backward_impl, mutates_args=())


@_bwd_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state, sinks=None):
    dsinks = lse.new_empty(0) if sinks is None else torch.empty_like(sinks, dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), dsinks


_FWD_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale",
             "window_left", "window_right", "softcap", "alibi_slopes", "dropout_p")


def _setup_context(ctx, inputs, output):
    q, k, v, *rest, sinks = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state, sinks)
    ctx.args = rest  # the non-differentiable arguments, in _FWD_ARGS order
    # the Gluon backward's switches as they stood when the forward ran (None: unset, the default
    # policy or the environment decides), so that ``with hopper_bwd.prefer_hopper_bwd(True): out =
    # f(...)`` (or deterministic=True, which sets hopper_bwd.bwd_deterministic) governs the backward of
    # that forward wherever the backward later runs
    ctx.hopper_bwd = hopper_bwd.prefer_hopper_bwd.value
    ctx.deterministic = hopper_bwd.bwd_deterministic.value


def _grads(dq, dk, dv, dsinks, sinks):
    """The gradients of (q, k, v, *_FWD_ARGS, sinks)."""
    return (dq, dk, dv) + (None,) * len(_FWD_ARGS) + (None if sinks is None else dsinks.to(sinks.dtype),)


def _backward(ctx, dout, dlse, drng):
    q, k, v, out, lse, rng_state, sinks = ctx.saved_tensors
    with hopper_bwd.prefer_hopper_bwd(ctx.hopper_bwd), hopper_bwd.bwd_deterministic(ctx.deterministic):
        dq, dk, dv, dsinks = _bwd_op(dout, q, k, v, out, lse, *ctx.args, rng_state, sinks)
    return _grads(dq, dk, dv, dsinks, sinks)


torch.library.register_autograd("ioattn::fwd", _backward, setup_context=_setup_context)


class _Eager(torch.autograd.Function):
    """The ops' implementations and autograd formula without the custom-op dispatch (eager calls)."""

    @staticmethod
    def forward(ctx, q, k, v, *args):
        out, lse, rng_state = _forward_impl(q, k, v, *args)
        # the lse stays differentiable with zero gradient, as in flash-attn
        ctx.mark_non_differentiable(rng_state)
        _setup_context(ctx, (q, k, v, *args), (out, lse, rng_state))
        return out, lse, rng_state

    @staticmethod
    def backward(ctx, dout, dlse, drng):
        q, k, v, out, lse, rng_state, sinks = ctx.saved_tensors
        with hopper_bwd.prefer_hopper_bwd(ctx.hopper_bwd), hopper_bwd.bwd_deterministic(ctx.deterministic):
            dq, dk, dv, dsinks = _backward_impl(dout, q, k, v, out, lse, *ctx.args, rng_state, sinks)
        return _grads(dq, dk, dv, dsinks, sinks)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


# ---- learnable sinks: one logit a head in every row's softmax denominator ----

def _rows(x, varlen):
    """``x`` (a per-row factor in lse's layout) in the output's layout, broadcast over the head dim."""
    return (x.transpose(0, 1) if varlen else x.transpose(1, 2)).unsqueeze(-1)


def _sink_logits(lse, sinks, varlen):
    """The sinks (nheads,) in float32, broadcast to ``lse``'s layout ((batch, nheads, seqlen) or (nheads, total))."""
    z = sinks.to(torch.float32)
    return z[:, None] if varlen else z[None, :, None]


def join_sinks(out, lse, sinks, varlen):
    """(out, lse) of attention over the keys and each head's sink (a column of logit ``sinks[h]`` whose value is
    0): an exact merge with an empty partial state, lse' = log(e^lse + e^sink), out' = out e^(lse - lse'). A row
    that sees no key keeps output 0 and lse -inf."""
    z = _sink_logits(lse, sinks, varlen)
    joined = torch.where(lse == float("-inf"), lse, torch.logaddexp(lse, z))
    scale = torch.where(lse == float("-inf"), torch.zeros_like(lse), torch.exp(lse - joined))
    return (out.float() * _rows(scale, varlen)).to(out.dtype), joined


def sinks_grad(dout, out, lse, sinks, varlen):
    """d loss / d sinks[h] = -sum over the head's rows of P(sink) (dout . out), P(sink) = e^(sink - lse) with
    the joined lse (rows that see no key contribute nothing)."""
    z = _sink_logits(lse, sinks, varlen)
    p_sink = torch.where(lse == float("-inf"), torch.zeros_like(lse), torch.exp(z - lse))
    delta = (dout.float() * out.float()).sum(-1)  # (batch, seqlen, nheads) or (total, nheads)
    delta = delta.transpose(0, 1) if varlen else delta.transpose(1, 2)
    per_head = -(p_sink * delta)
    return per_head.sum(-1) if varlen else per_head.sum(dim=(0, 2))


def _eager(*tensors) -> bool:
    """True when nothing traces or intercepts the call: no compiler, no dispatch mode (fake
    tensors, meta-device tracing, FlopCounterMode...), no torch-function mode, and plain tensors."""
    return (not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._is_torch_function_mode_enabled()
            and all(t is None or type(t) in _PLAIN for t in tensors))


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
              softcap, alibi_slopes, dropout_p, sinks=None):
    """Validated arguments in, ``(out, lse, rng_state)`` out, differentiable in q, k, v (and ``sinks``)."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            window[0], window[1], softcap, alibi_slopes, dropout_p, sinks)
    if not _eager(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks):
        return _fwd_op(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or (sinks is not None and sinks.requires_grad)):
        return _Eager.apply(*args)
    return _forward_impl(*args)  # nothing to differentiate: no graph to record


# ---- FP8: a forward without a backward (FP8 attention here is for inference) ----

def _fp8_forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, descales: torch.Tensor,
                      cu_seqlens_q: Optional[torch.Tensor], cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int,
                      max_seqlen_k: int, softmax_scale: float, window_left: int, window_right: int, softcap: float,
                      alibi_slopes: Optional[torch.Tensor], out_fp16: bool) -> tuple[torch.Tensor, torch.Tensor]:
    sem = Semantics(softmax_scale, (window_left, window_right), softcap, 0.0, alibi_slopes is not None)
    return backends.fp8_forward(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                                alibi_slopes, torch.float16 if out_fp16 else torch.bfloat16)


_fp8_op = torch.library.custom_op("ioattn::fwd_fp8", _fp8_forward_impl, mutates_args=())


@_fp8_op.register_fake
def _(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
      window_right, softcap, alibi_slopes, out_fp16):
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return output_like(q, v, dtype=torch.float16 if out_fp16 else torch.bfloat16), lse


def fp8_attention(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
                  softcap, alibi_slopes, out_dtype):
    """Validated e4m3 arguments in, ``(out, lse)`` out; no gradient."""
    args = (q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window[0],
            window[1], softcap, alibi_slopes, out_dtype == torch.float16)
    if not _eager(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        return _fp8_op(*args)
    return _fp8_forward_impl(*args)


# ---- score / mask functions and block masks (ioattn.modcall.ModCall): eager only ----

class _ModAttention(torch.autograd.Function):
    """Attention with a call's ``ModCall``; differentiable in q, k, v, sinks and the tensors the score
    function captures (``grad_captures``, passed after the arguments so autograd routes their
    gradients)."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, call, args, *grad_captures):
        cu_q, cu_k, max_q, max_k, scale, window, softcap, alibi_slopes = args
        sem = Semantics(scale, window, softcap, 0.0, alibi_slopes is not None)
        out, lse = backends.mod_forward(q, k, v, cu_q, cu_k, max_q, max_k, sem, alibi_slopes, call)
        if sinks is not None:
            out, lse = join_sinks(out, lse, sinks, cu_q is not None)
        ctx.save_for_backward(q, k, v, out, lse, sinks, *grad_captures)
        ctx.call, ctx.args = call, args
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse, sinks, *grad_captures = ctx.saved_tensors
        cu_q, cu_k, max_q, max_k, scale, window, softcap, alibi_slopes = ctx.args
        dout = dout.contiguous() if dout.stride(-1) != 1 else dout
        sem = Semantics(scale, window, softcap, 0.0, alibi_slopes is not None)
        dq, dk, dv, dcaps = backends.mod_backward(dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, sem,
                                                  alibi_slopes, ctx.call)
        dsinks = None if sinks is None else sinks_grad(dout, out, lse, sinks, cu_q is not None).to(sinks.dtype)
        return (dq, dk, dv, dsinks, None, None, *(g.to(c.dtype) for g, c in zip(dcaps, grad_captures)))


def mod_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window, softcap,
                  alibi_slopes, sinks, call):
    """Validated arguments and a ``ModCall`` in, ``(out, lse)`` out."""
    args = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, tuple(window), softcap,
            alibi_slopes)
    return _ModAttention.apply(q, k, v, sinks, call, args, *call.grad_captures())
