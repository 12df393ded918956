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
from ioattn.plan import hopper_bwd
from ioattn.semantics import Semantics


def _forward_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                  cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                  softmax_scale: float, window_left: int, window_right: int, softcap: float,
                  alibi_slopes: Optional[torch.Tensor], dropout_p: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # The dropout seed is drawn here, inside the op, from torch's CPU generator (no device sync),
    # and returned so the backward replays exactly the same mask.
    seed = int(torch.randint(0, 2**62, (1,)).item()) if dropout_p > 0 else 0
    sem = Semantics(softmax_scale, (window_left, window_right), softcap, dropout_p, alibi_slopes is not None)
    out, lse = backends.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                                seed)
    rng_state = torch.zeros(2, dtype=torch.int64)  # (seed, offset); cheaper than torch.tensor
    if seed:
        rng_state[0] = seed
    return out, lse, rng_state


_fwd_op = torch.library.custom_op("ioattn::fwd", _forward_impl, mutates_args=())


@_fwd_op.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window_left,
      window_right, softcap, alibi_slopes, dropout_p):
    if cu_seqlens_q is None:
        lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)
    else:
        lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)
    return torch.empty_like(q), lse, torch.empty(2, dtype=torch.int64)


def _backward_impl(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, cu_seqlens_q: Optional[torch.Tensor],
                   cu_seqlens_k: Optional[torch.Tensor], max_seqlen_q: int, max_seqlen_k: int,
                   softmax_scale: float, window_left: int, window_right: int, softcap: float,
                   alibi_slopes: Optional[torch.Tensor], dropout_p: float, rng_state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    seed = int(rng_state[0]) if dropout_p > 0 else 0
    sem = Semantics(softmax_scale, (window_left, window_right), softcap, dropout_p, alibi_slopes is not None)
    return backends.backward(dout.contiguous() if dout.stride(-1) != 1 else dout, q, k, v, out, lse,
                             cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed)


_bwd_op = torch.library.custom_op("ioattn::bwd", _backward_impl, mutates_args=())


@_bwd_op.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
      window_left, window_right, softcap, alibi_slopes, dropout_p, rng_state):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


_FWD_ARGS = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale",
             "window_left", "window_right", "softcap", "alibi_slopes", "dropout_p")


def _setup_context(ctx, inputs, output):
    q, k, v, *rest = inputs
    out, lse, rng_state = output
    ctx.save_for_backward(q, k, v, out, lse, rng_state)
    ctx.args = rest  # the non-differentiable arguments, in _FWD_ARGS order
    # the Gluon backward's switches as they stood when the forward ran (None: unset, the default
    # policy or the environment decides), so that ``with hopper_bwd.prefer_hopper_bwd(True): out =
    # f(...)`` (or deterministic=True, which sets hopper_bwd.bwd_deterministic) governs the backward of
    # that forward wherever the backward later runs
    ctx.hopper_bwd = hopper_bwd.prefer_hopper_bwd.value
    ctx.deterministic = hopper_bwd.bwd_deterministic.value


def _backward(ctx, dout, dlse, drng):
    q, k, v, out, lse, rng_state = ctx.saved_tensors
    with hopper_bwd.prefer_hopper_bwd(ctx.hopper_bwd), hopper_bwd.bwd_deterministic(ctx.deterministic):
        dq, dk, dv = _bwd_op(dout, q, k, v, out, lse, *ctx.args, rng_state)
    return (dq, dk, dv) + (None,) * len(_FWD_ARGS)


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
        q, k, v, out, lse, rng_state = ctx.saved_tensors
        with hopper_bwd.prefer_hopper_bwd(ctx.hopper_bwd), hopper_bwd.bwd_deterministic(ctx.deterministic):
            dq, dk, dv = _backward_impl(dout, q, k, v, out, lse, *ctx.args, rng_state)
        return (dq, dk, dv) + (None,) * len(_FWD_ARGS)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _eager(*tensors) -> bool:
    """True when nothing traces or intercepts the call: no compiler, no dispatch mode (fake
    tensors, meta-device tracing, FlopCounterMode...), no torch-function mode, and plain tensors."""
    return (not torch.compiler.is_compiling() and torch._C._len_torch_dispatch_stack() == 0
            and not torch._C._is_torch_function_mode_enabled()
            and all(t is None or type(t) in _PLAIN for t in tensors))


def attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
              softcap, alibi_slopes, dropout_p):
    """Validated arguments in, ``(out, lse, rng_state)`` out, differentiable in q, k, v."""
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
            window[0], window[1], softcap, alibi_slopes, dropout_p)
    if not _eager(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        return _fwd_op(*args)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
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
    return torch.empty_like(q, dtype=torch.float16 if out_fp16 else torch.bfloat16), lse


def fp8_attention(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window,
                  softcap, alibi_slopes, out_dtype):
    """Validated e4m3 arguments in, ``(out, lse)`` out; no gradient."""
    args = (q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, window[0],
            window[1], softcap, alibi_slopes, out_dtype == torch.float16)
    if not _eager(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, alibi_slopes):
        return _fp8_op(*args)
    return _fp8_forward_impl(*args)
