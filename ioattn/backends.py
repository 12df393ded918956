"""The two implementations behind every call, with one calling convention.

Layouts: batched ``q (batch, seqlen_q, nheads, d)``, ``k/v (batch, seqlen_k, nheads_kv, d)``, lse
``(batch, nheads, seqlen_q)``; varlen (``cu_seqlens_q`` given) ``q (total_q, nheads, d)``,
``k/v (total_k, nheads_kv, d)``, lse ``(nheads, total_q)``. Arguments arrive validated (see
``ioattn.api``); the scalars as one ``ioattn.semantics.Semantics`` (``sem``).
"""
from __future__ import annotations

import torch

from ioattn.launch import gluon_fwd
from ioattn.plan import dispatch, hopper, hopper_bwd
from ioattn.plan import backward as backward_plan
from ioattn.plan import forward as forward_plan
from ioattn.plan import mods as mods_plan
from ioattn.kernels import cpu
from ioattn.kernels.constants import LOG2E
from ioattn.reference.fp8 import FP8_BLOCK_ROWS
from ioattn.reference.philox import dropout_threshold


class _Problem:
    """Sequence bookkeeping shared by the launchers: batch/varlen shapes and strides in one place."""

    def __init__(self, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        self.varlen = cu_seqlens_q is not None
        if self.varlen:
            self.batch = cu_seqlens_q.numel() - 1
            self.seqlen_q, self.seqlen_k = max_seqlen_q, max_seqlen_k
        else:
            self.batch, self.seqlen_q = q.shape[0], q.shape[1]
            self.seqlen_k = k.shape[1]
        self.nheads, self.headdim = q.shape[-2], q.shape[-1]
        self.nheads_kv = k.shape[-2]
        self.headdim_v = v.shape[-1]

    def value_dims(self):
        """V's head dim where it differs from q's and k's (the tiles' ``headdim_v``), else None."""
        return self.headdim_v if self.headdim_v != self.headdim else None

    def strides(self, t):
        """(batch, row, head) element strides; batch stride 0 for varlen (rows come from cu_seqlens)."""
        if self.varlen:
            return 0, t.stride(0), t.stride(1)
        return t.stride(0), t.stride(1), t.stride(2)

    def lse_empty(self, q):
        if self.varlen:
            return torch.empty(self.nheads, q.shape[0], device=q.device, dtype=torch.float32)
        return torch.empty(self.batch, self.nheads, self.seqlen_q, device=q.device, dtype=torch.float32)

    def outputs(self, q, v, dtype=None):
        """(out, lse) buffers, out in ``dtype`` (q's by default) with V's head dim (q's layout where the
        head dims agree, else contiguous: ``ioattn.layout.output_like``). Packed tensors may hold tokens
        after cu_seqlens[-1] that no sequence owns: those rows are defined (output 0, lse -inf) rather
        than left uninitialised."""
        lse = self.lse_empty(q)
        if v.shape[-1] == q.shape[-1]:
            out = (torch.zeros_like if self.varlen else torch.empty_like)(q, dtype=dtype)
        else:
            out = (torch.zeros if self.varlen else torch.empty)(*q.shape[:-1], v.shape[-1], dtype=dtype or q.dtype,
                                                                device=q.device)
        return (out, lse.fill_(float("-inf"))) if self.varlen else (out, lse)

    def grads(self, q, k, v):
        """dq, dk, dv buffers; zero for varlen, where tokens outside every sequence get no gradient."""
        alloc = torch.zeros_like if self.varlen else torch.empty_like
        return alloc(q), alloc(k), alloc(v)

    def lse_strides(self, lse):
        return (0, lse.stride(0)) if self.varlen else (lse.stride(0), lse.stride(1))


def _scalars(sem):
    """(qk_scale, dropout threshold, dropout scale) of the portable kernels: qk_scale is the scale in log2
    units (the kernels use exp2); with a softcap the kernels compute cap * tanh(qk * scale / cap), so
    qk_scale becomes scale / cap."""
    qk_scale = sem.softmax_scale / sem.softcap if sem.softcap > 0 else sem.scale_log2
    return qk_scale, dropout_threshold(sem.dropout_p), 1.0 / (1.0 - sem.dropout_p)


def _alibi_args(alibi_slopes, q):
    if alibi_slopes is None:
        return q.new_empty(0, dtype=torch.float32), 0, False
    stride_ab = alibi_slopes.stride(0) if alibi_slopes.dim() == 2 else 0
    return alibi_slopes, stride_ab, True


def hopper_forward(q, k, v, softmax_scale, causal, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                   max_seqlen_k=None, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """(out, lse) of the Gluon Hopper forward, as the portable forward returns them; the call must pass
    ``hopper.hopper_supports``. Batched: q (batch, seqlen_q, nheads, d), lse (batch, nheads, seqlen_q).
    Varlen (``cu_seqlens_q`` given, with cu_seqlens_k and the max lengths): packed q (total_q, nheads,
    d), k/v (total_k, ...), lse (nheads, total_q); rows no sequence owns give output 0 and lse -inf.
    ``window``: flash-attn's (left, right), bottom-right aligned; the causal mask is ``causal=True``.
    ``softcap`` > 0: cap * tanh(s * scale / cap). ``alibi_slopes``: fp32 (nheads,) or (batch, nheads),
    flash-attn's bias -slope * |i + seqlen_k - seqlen_q - j|."""
    route = gluon_forward_route(q, k, v, softmax_scale, causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, window, softcap, alibi_slopes)
    return route(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)


def gluon_forward_route(q, k, v, softmax_scale, causal, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None,
                        max_seqlen_k=None, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """The Gluon forward of ``hopper_forward``'s call, prepared for every call laid out as this one: a
    callable ``(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes) -> (out, lse)``. The plan
    (``ioattn.plan.forward``) is made once a signature; the launch (``ioattn.launch.gluon_fwd``)
    carries it out."""
    varlen = cu_seqlens_q is not None
    nheads = q.shape[-2]
    if alibi_slopes is not None:
        n_batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
        if tuple(alibi_slopes.shape) not in ((nheads,), (n_batch, nheads)) or alibi_slopes.dtype != torch.float32 \
                or alibi_slopes.stride(-1) != 1:
            raise ValueError(f"alibi_slopes must be fp32 of shape ({nheads},) or ({n_batch}, {nheads}) with unit "
                             f"head stride, got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
    plan = forward_plan.plan_forward(forward_signature(q, k, softmax_scale, causal, cu_seqlens_q, max_seqlen_q,
                                                       max_seqlen_k, window, softcap, alibi_slopes))
    if plan.pad_copies:  # a head dim the kernels lack, not a multiple of 8: on zero-padded copies
        return _PaddedForward(plan.pad_to, q, k, v, softmax_scale, causal)
    if alibi_slopes is not None:
        form = dict(plan.constexprs)["ALIBI"]
        refusal = hopper.alibi_length_refusal(q, k, varlen, form)
        if refusal:
            raise ValueError(refusal)
    return gluon_fwd.ForwardLaunch(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                   cached=dispatch.cached_launch())


def forward_signature(q, k, softmax_scale, causal, cu_seqlens_q=None, max_seqlen_q=None, max_seqlen_k=None,
                      window=(-1, -1), softcap=0.0, alibi_slopes=None, fp8_blocks=False) -> forward_plan.Signature:
    """The Gluon forward plan's signature of a call (``window`` (-1, -1) with ``causal``; ``fp8_blocks``:
    FP8 descales per block of rows)."""
    varlen = cu_seqlens_q is not None
    return forward_plan.Signature(
        batch=cu_seqlens_q.numel() - 1 if varlen else q.shape[0], seqlen_q=max_seqlen_q if varlen else q.shape[1],
        seqlen_k=max_seqlen_k if varlen else k.shape[1], nheads=q.shape[-2], nheads_kv=k.shape[-2],
        head_dim=q.shape[-1], element_size=q.element_size(), varlen=varlen, causal=bool(causal),
        window=tuple(int(w) for w in window), softcap=float(softcap), softmax_scale=float(softmax_scale),
        alibi=alibi_slopes is not None, device_sms=gluon_fwd.device_sms(q.device), fp8_blocks=fp8_blocks)


def backward_signature(q, k, softmax_scale, causal, deterministic=False, cu_seqlens_q=None, max_seqlen_q=None,
                       max_seqlen_k=None, window=(-1, -1), softcap=0.0, alibi=False) -> backward_plan.BackwardSignature:
    """The Gluon backward plan's signature of a call (``window`` (-1, -1) with ``causal``)."""
    varlen = cu_seqlens_q is not None
    return backward_plan.BackwardSignature(
        batch=cu_seqlens_q.numel() - 1 if varlen else q.shape[0], seqlen_q=int(max_seqlen_q) if varlen else q.shape[1],
        seqlen_k=int(max_seqlen_k) if varlen else k.shape[1], nheads=q.shape[-2], nheads_kv=k.shape[-2],
        head_dim=q.shape[-1], varlen=varlen, causal=bool(causal), window=tuple(int(w) for w in window),
        softcap=float(softcap), softmax_scale=float(softmax_scale), alibi=bool(alibi),
        deterministic=bool(deterministic), longest=max(q.shape[0 if varlen else 1], k.shape[0 if varlen else 1]))


class _PaddedForward:
    """The Gluon forward of a head dim the kernels lack (not a multiple of 8) on zero-padded copies of
    q, k, v (``plan.pad_to`` columns), the output sliced back."""

    def __init__(self, pad_to, q, k, v, softmax_scale, causal):
        self.pad_to, self.d = pad_to, q.shape[-1]
        padded = [gluon_fwd.pad_head(t, pad_to) for t in (q, k, v)]
        self.inner = gluon_forward_route(*padded, softmax_scale, causal)
        self.cacheable = getattr(self.inner, "cacheable", True)

    def __call__(self, q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None):
        out, lse = self.inner(*(gluon_fwd.pad_head(t, self.pad_to) for t in (q, k, v)))
        return out[..., :self.d].contiguous(), lse


_UNSET = object()
# call key (``_forward_key``) -> the Gluon forward prepared for it (``gluon_forward_route``), or None where
# the portable kernels take the call: the policy, the plan and the launch's preparation run once a key
_FWD_ROUTES: dict = {}
_ROUTES_MAX = 512


def clear_routes():
    """Forget every prepared call (after a policy table was changed in place: the keys hold the
    switches and environment variables, not the tables)."""
    _FWD_ROUTES.clear()
    _BWD_ROUTES.clear()
    _FP8_ROUTES.clear()
    _MOD_ROUTES.clear()
    _MOD_BWD_ROUTES.clear()
    forward_plan._PLANS.clear()
    backward_plan._PLANS.clear()


def _forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes):
    """What decides a forward's route, plan and specialization: shapes, strides, dtype, device, 16-byte
    alignment of every tensor, the scalars and the switches (not the tensors' values or addresses)."""
    varlen = None if cu_seqlens_q is None else (cu_seqlens_q.shape, cu_seqlens_q.data_ptr() % 16,
                                                 cu_seqlens_k.shape, cu_seqlens_k.data_ptr() % 16)
    alibi = None if alibi_slopes is None else (alibi_slopes.shape, alibi_slopes.stride(), alibi_slopes.dtype,
                                               alibi_slopes.data_ptr() % 16)
    return (q.shape, q.stride(), k.shape, k.stride(), v.shape, v.stride(), q.dtype, k.dtype, v.dtype, q.device,
            q.data_ptr() % 16, k.data_ptr() % 16, v.data_ptr() % 16, varlen, alibi, max_seqlen_q, max_seqlen_k,
            sem, dispatch.switch_state(), hopper.active_variant(),
            hopper.exp2_fma_share())


def _forward_route(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes):
    varlen = cu_seqlens_q is not None
    seqlen_q = max_seqlen_q if varlen else q.shape[1]
    if not hopper.fwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q)[0]:
        return None
    return gluon_forward_route(q, k, v, sem.softmax_scale, sem.causal, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                               max_seqlen_k, sem.band_window, sem.softcap, alibi_slopes)


def triton_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed):
    key = _forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes)
    route = _FWD_ROUTES.get(key, _UNSET)
    if route is _UNSET:
        route = _forward_route(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes)
        if getattr(route, "cacheable", True):
            if len(_FWD_ROUTES) >= _ROUTES_MAX:
                _FWD_ROUTES.clear()
            _FWD_ROUTES[key] = route
    if route is not None:
        return route(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    return portable_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed)


def portable_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed,
                     descales=None, out_dtype=None, mods=None):
    """(out, lse) of the portable Triton forward (``kernels/forward.py``). ``descales``: e4m3 inputs'
    fp32 (batch, nheads + 2 * nheads_kv) descales (``ioattn.fp8.descale_rows``), the output in
    ``out_dtype``. ``mods``: the call's ``ioattn.modcall.ModCall`` (score and mask functions, block
    mask)."""
    from ioattn.kernels.forward import attn_fwd_kernel

    pb = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out, lse = pb.outputs(q, v, out_dtype)
    if q.numel() == 0 or pb.seqlen_q == 0:
        lse.fill_(float("-inf"))
        return out.zero_(), lse
    use_tma = dispatch.fwd_uses_tma(k, v, pb.varlen)
    window, softcap, dropout_p = sem.window, sem.softcap, sem.dropout_p
    cfg = dispatch.tiles("fwd", pb.headdim, q.device, seqlen_q=pb.seqlen_q, masked_right=window[1] >= 0,
                         band=sum(window) + 1 if min(window) >= 0 else None,
                         tma=use_tma, headdim_v=pb.value_dims())
    if descales is not None and (cfg.block_m > FP8_BLOCK_ROWS or cfg.block_n > FP8_BLOCK_ROWS):
        # (block descales: a tile within one block; the tiles are powers of two)
        cfg = dispatch.TileConfig(min(cfg.block_m, FP8_BLOCK_ROWS), min(cfg.block_n, FP8_BLOCK_ROWS), cfg.num_warps,
                                  cfg.num_stages)
    qk_scale, threshold, dropout_scale = _scalars(sem)
    mod_kw = {}
    if mods is not None:
        cfg = mods.fit_tiles(cfg)
        mod_kw = mods.forward_kwargs(sem.softmax_scale, cfg)
        if mods.score is not None:  # the kernel scales the score before the user's function
            qk_scale = LOG2E
    alibi, stride_ab, has_alibi = _alibi_args(alibi_slopes, q)
    cu_q = cu_seqlens_q if pb.varlen else q.new_empty(0, dtype=torch.int32)
    cu_k = cu_seqlens_k if pb.varlen else q.new_empty(0, dtype=torch.int32)
    fp8 = descales is not None
    bd, bdv = dispatch.block_d(pb.headdim), dispatch.block_d(pb.headdim_v)
    if fp8:  # an e4m3 product's reduction (q.k over the head dim) spans at least 32 elements
        bd = max(bd, 32)
    k_desc = v_desc = None
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k_desc, v_desc = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, cfg.block_n, 1, block])
                          for t, block in ((k, bd), (v, bdv)))
    # 1-D grid, query blocks fastest (blocks of one head share K/V in L2); CUDA's y and z grid
    # dimensions stop at 65535, too few for batch * nheads in large varlen batches
    grid = (dispatch.cdiv(pb.seqlen_q, cfg.block_m) * pb.batch * pb.nheads,)
    fp8_blocks = fp8 and descale_blocks(descales, pb.nheads, pb.nheads_kv, pb.seqlen_q, pb.seqlen_k) != (1, 1)
    attn_fwd_kernel[grid](
        q, k, v, out, lse, cu_q, cu_k, alibi, k_desc, v_desc, descales if fp8 else cu_q,
        *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(out), *pb.lse_strides(lse), stride_ab,
        pb.nheads, pb.nheads // pb.nheads_kv, pb.seqlen_q, pb.seqlen_k,
        qk_scale, float(softcap), window[0], window[1], seed, threshold, dropout_scale,
        HEAD_DIM=pb.headdim, BLOCK_D=bd, HEAD_DIM_V=pb.headdim_v, BLOCK_DV=bdv, BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n, IS_VARLEN=pb.varlen, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=has_alibi, HAS_DROPOUT=dropout_p > 0,
        USE_TMA=use_tma,
        # FP8's P must stay in [0, 1] to fit e4m3 once scaled: the accumulator is rescaled at every tile
        RESCALE_TAU=0.0 if fp8 else dispatch.fwd_rescale_tau(), IS_FP8=fp8,
        **({"FP8_BLOCKS": True} if fp8_blocks else {}),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **mod_kw,
    )
    return out, lse


def hopper_backward(dout, q, k, v, out, lse, softmax_scale, causal, deterministic=False, cu_seqlens_q=None,
                    cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, window=(-1, -1), softcap=0.0,
                    alibi_slopes=None):
    """(dq, dk, dv) of the Gluon Hopper backward (the ws kernel) for bf16/fp16 tensors in
    ``hopper_forward``'s layouts and its (out, lse); the call must pass ``hopper_bwd.bwd_call_supported``.
    ``causal``, ``window``, ``softcap``, ``alibi_slopes``, varlen: as ``hopper_forward``'s.
    ``deterministic``: dQ's partial sums added in a fixed order (bitwise reproducible)."""
    route = gluon_backward_route(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, cu_seqlens_q,
                                 cu_seqlens_k, max_seqlen_q, max_seqlen_k, window, softcap, alibi_slopes)
    return route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)


def gluon_backward_route(dout, q, k, v, out, lse, softmax_scale, causal, deterministic=False, cu_seqlens_q=None,
                         cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, window=(-1, -1), softcap=0.0,
                         alibi_slopes=None):
    """The Gluon backward of ``hopper_backward``'s call, prepared for every call laid out as this one: a
    callable ``(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes) -> (dq, dk, dv)``. The
    plan (``ioattn.plan.backward``) is made once a signature; the launch (``ioattn.launch.gluon_bwd``)
    carries it out."""
    from ioattn.launch import gluon_bwd

    varlen = cu_seqlens_q is not None
    nheads = q.shape[-2]
    batch = cu_seqlens_q.numel() - 1 if varlen else q.shape[0]
    window = tuple(int(w) for w in window)
    if causal and window == (-1, 0):
        window = (-1, -1)
    if alibi_slopes is not None and (tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads))
                                     or alibi_slopes.dtype != torch.float32 or alibi_slopes.stride(-1) != 1):
        raise ValueError(f"alibi_slopes must be fp32 of shape ({nheads},) or ({batch}, {nheads}) with unit "
                         f"head stride, got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}")
    plan = backward_plan.plan_backward(backward_signature(q, k, softmax_scale, causal, deterministic, cu_seqlens_q,
                                                          max_seqlen_q, max_seqlen_k, window, softcap,
                                                          alibi_slopes is not None))
    if plan.pad_copies:  # a head dim the kernels lack, not a multiple of 8: on zero-padded copies
        return _PaddedBackward(plan.pad_to, dout, q, k, v, out, lse, softmax_scale, causal, deterministic)
    return gluon_bwd.BackwardLaunch(plan, dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                    cached=dispatch.cached_launch())


class _PaddedBackward:
    """The Gluon backward of a head dim the kernels lack (not a multiple of 8) on zero-padded copies of
    dout, q, k, v, out (``pad_to`` columns), the gradients sliced back."""

    def __init__(self, pad_to, dout, q, k, v, out, lse, softmax_scale, causal, deterministic):
        self.pad_to, self.d = pad_to, q.shape[-1]
        padded = [gluon_fwd.pad_head(t, pad_to) for t in (dout, q, k, v, out)]
        self.inner = gluon_backward_route(*padded, lse, softmax_scale, causal, deterministic)
        self.cacheable = True

    def __call__(self, dout, q, k, v, out, lse, cu_seqlens_q=None, cu_seqlens_k=None, alibi_slopes=None):
        grads = self.inner(*(gluon_fwd.pad_head(t, self.pad_to) for t in (dout, q, k, v, out)), lse)
        return tuple(g[..., :self.d].contiguous() for g in grads)


_BWD_ROUTES: dict = {}


def _backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                    alibi_slopes):
    varlen = cu_seqlens_q is not None
    seqlen_q = max_seqlen_q if varlen else q.shape[1]
    if not hopper_bwd.bwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q)[0]:
        return None
    return gluon_backward_route(dout, q, k, v, out, lse, sem.softmax_scale, sem.causal,
                                hopper_bwd.bwd_deterministic.wanted(), cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                max_seqlen_k, sem.band_window, sem.softcap, alibi_slopes)


def triton_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                    alibi_slopes, seed, mods=None, mod_grads=()):
    """(dq, dk, dv): the Gluon backward where its plan takes the call, else the portable kernels.
    ``mods``: the call's ``ioattn.modcall.ModCall`` (the portable kernels); ``mod_grads``: fp32 buffers
    the captured tensors' gradients are added into."""
    if mods is None:
        route = _cached_backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                   sem, alibi_slopes)
        if route is not None:
            return route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    return portable_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                             alibi_slopes, seed, mods, mod_grads)


def _cached_backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                           alibi_slopes):
    # the forward's key with dO's, O's and lse's layouts (the deterministic switch is in the switches)
    key = (_forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes),
           dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16, out.shape, out.stride(), out.dtype,
           out.data_ptr() % 16, lse.shape, lse.stride())
    route = _BWD_ROUTES.get(key, _UNSET)
    if route is _UNSET:
        route = _backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                sem, alibi_slopes)
        if len(_BWD_ROUTES) >= _ROUTES_MAX:
            _BWD_ROUTES.clear()
        _BWD_ROUTES[key] = route
    return route


def portable_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                      alibi_slopes, seed, mods=None, mod_grads=()):
    """(dq, dk, dv) of the portable Triton backward (``kernels/backward.py``)."""
    from ioattn.kernels.backward import (attn_bwd_dkdv_kernel, attn_bwd_dq_kernel,
                                         attn_bwd_preprocess_kernel)

    pb = _Problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    dq, dk, dv = pb.grads(q, k, v)
    if q.numel() == 0 or k.numel() == 0:
        return dq.zero_(), dk.zero_(), dv.zero_()
    cfg = dispatch.tiles("bwd", pb.headdim, q.device, headdim_v=pb.value_dims())
    bd, bdv = dispatch.block_d(pb.headdim), dispatch.block_d(pb.headdim_v)
    softmax_scale, window, softcap, dropout_p = sem.softmax_scale, sem.window, sem.softcap, sem.dropout_p
    qk_scale, threshold, dropout_scale = _scalars(sem)
    dkdv_kw = dq_kw = {}
    if mods is not None:
        cfg = mods.fit_tiles(cfg)
        dkdv_kw, dq_kw = mods.backward_kwargs(softmax_scale, cfg, mod_grads)
        if mods.score is not None:  # the kernels scale the score before the user's function
            qk_scale = LOG2E
    alibi, stride_ab, has_alibi = _alibi_args(alibi_slopes, q)
    cu_q = cu_seqlens_q if pb.varlen else q.new_empty(0, dtype=torch.int32)
    cu_k = cu_seqlens_k if pb.varlen else q.new_empty(0, dtype=torch.int32)
    delta = torch.empty_like(lse)
    attn_bwd_preprocess_kernel[(dispatch.cdiv(pb.seqlen_q, 64) * pb.batch * pb.nheads,)](
        out, dout, delta, cu_q, *pb.strides(out), *pb.strides(dout), *pb.lse_strides(lse),
        pb.nheads, pb.seqlen_q, HEAD_DIM=pb.headdim_v, BLOCK_D=bdv, BLOCK_M=64, IS_VARLEN=pb.varlen)
    common = dict(HEAD_DIM=pb.headdim, BLOCK_D=bd, HEAD_DIM_V=pb.headdim_v, BLOCK_DV=bdv, BLOCK_M=cfg.block_m,
                  BLOCK_N=cfg.block_n, IS_VARLEN=pb.varlen, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=has_alibi,
                  HAS_DROPOUT=dropout_p > 0, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    scalars = (pb.nheads, pb.nheads // pb.nheads_kv, pb.seqlen_q, pb.seqlen_k, softmax_scale, qk_scale,
               float(softcap), window[0], window[1], seed, threshold, dropout_scale)
    attn_bwd_dkdv_kernel[(dispatch.cdiv(pb.seqlen_k, cfg.block_n) * pb.batch * pb.nheads_kv,)](
        q, k, v, dout, lse, delta, dk, dv, cu_q, cu_k, alibi,
        *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(dout), *pb.strides(dk),
        *pb.strides(dv), *pb.lse_strides(lse), stride_ab, *scalars, **common, **dkdv_kw)
    attn_bwd_dq_kernel[(dispatch.cdiv(pb.seqlen_q, cfg.block_m) * pb.batch * pb.nheads,)](
        q, k, v, dout, lse, delta, dq, cu_q, cu_k, alibi,
        *pb.strides(q), *pb.strides(k), *pb.strides(v), *pb.strides(dout), *pb.strides(dq),
        *pb.lse_strides(lse), stride_ab, *scalars, **common, **dq_kw)
    return dq, dk, dv


# ---- CPU path: ioattn.kernels.cpu (PyTorch's fused CPU kernel where it applies, else tiled) ----

def reference_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed):
    return cpu.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem.softmax_scale,
                       sem.window, sem.softcap, alibi_slopes, sem.dropout_p, seed)


def reference_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                       alibi_slopes, seed):
    return cpu.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                        sem.softmax_scale, sem.window, sem.softcap, alibi_slopes, sem.dropout_p, seed)


def _dequantize(t, scale, cu_seqlens):
    """float32 ``t * scale`` for e4m3 ``t`` and its (batch, heads) ``scale``, or (batch, heads, blocks) per
    block of ``FP8_BLOCK_ROWS`` rows from each sequence's start (per sequence for packed t)."""
    if scale.dim() == 2:
        scale = scale[:, :, None]
    if cu_seqlens is None:  # row i of a sequence: its block i // FP8_BLOCK_ROWS
        per_row = scale.repeat_interleave(FP8_BLOCK_ROWS, dim=2)[:, :, :t.shape[1]] if scale.shape[2] > 1 else scale
        return t.float() * per_row.transpose(1, 2)[..., None]
    starts, total = cu_seqlens.long(), t.shape[0]
    row = torch.arange(total, device=t.device)
    seq = (torch.searchsorted(starts, row, right=True) - 1).clamp(max=scale.shape[0] - 1)
    owned = row < starts[-1]  # rows no sequence owns: descale 1
    block = ((row - starts[seq]) // FP8_BLOCK_ROWS).clamp(max=scale.shape[2] - 1)
    per_row = torch.where(owned[:, None], scale[seq, :, block], torch.ones_like(scale[seq, :, block]))
    return t.float() * per_row[:, :, None]


def descale_blocks(descales, nheads: int, nheads_kv: int, max_seqlen_q: int, max_seqlen_k: int):
    """(blocks_q, blocks_k) of ``ioattn.fp8.descale_rows``'s layout: both 1 for per-head descales, else the
    block counts of the longest sequences (the two layouts agree where both are 1)."""
    if descales.shape[1] == nheads + 2 * nheads_kv:
        return 1, 1
    return -(-max_seqlen_q // FP8_BLOCK_ROWS), -(-max_seqlen_k // FP8_BLOCK_ROWS)


def _fp8_scales(descales, nheads, nheads_kv, blocks_q, blocks_k):
    """``ioattn.fp8.descale_rows``'s layout back to (q's (batch, nheads, blocks_q), k's (batch, nheads_kv,
    blocks_k), v's (batch, nheads_kv))."""
    batch = descales.shape[0]
    q_s, k_s, v_s = descales.split([nheads * blocks_q, nheads_kv * blocks_k, nheads_kv], dim=1)
    return q_s.reshape(batch, nheads, blocks_q), k_s.reshape(batch, nheads_kv, blocks_k), v_s


_FP8_ROUTES: dict = {}


def _fp8_route(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, out_dtype,
               fp8_blocks=False):
    """The Gluon FP8 forward prepared for calls laid out as this one (``hopper.fp8_fwd_plan``; descales
    per block of rows with ``fp8_blocks``), or None where the portable kernel takes it."""
    varlen = cu_seqlens_q is not None
    if not hopper.fp8_fwd_plan(q, k, v, varlen, sem, alibi_slopes)[0]:
        return None
    plan = forward_plan.plan_forward(forward_signature(q, k, sem.softmax_scale, sem.causal, cu_seqlens_q, max_seqlen_q,
                                                       max_seqlen_k, sem.band_window, sem.softcap, alibi_slopes,
                                                       fp8_blocks))
    return gluon_fwd.ForwardLaunch(plan, q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes,
                                   cached=dispatch.cached_launch(), out_dtype=out_dtype)


def fp8_forward(q, k, v, descales, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                out_dtype):
    """(out, lse) of e4m3 q, k, v with their descales (``ioattn.fp8.descale_rows``), out in ``out_dtype``:
    the portable kernel (P through e4m3), or on the CPU path float32 attention of the dequantised inputs."""
    if dispatch.use_triton(q.device, q.dtype):
        blocks = descale_blocks(descales, q.shape[-2], k.shape[-2], max_seqlen_q, max_seqlen_k) != (1, 1)
        key = (_forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes),
               out_dtype, blocks)
        route = _FP8_ROUTES.get(key, _UNSET)
        if route is _UNSET:
            route = _fp8_route(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                               out_dtype, blocks)
            if len(_FP8_ROUTES) >= _ROUTES_MAX:
                _FP8_ROUTES.clear()
            _FP8_ROUTES[key] = route
        if route is not None:
            return route(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, descales)
        return portable_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                                0, descales, out_dtype)
    h, h_kv = q.shape[-2], k.shape[-2]
    scales = _fp8_scales(descales, h, h_kv, *descale_blocks(descales, h, h_kv, max_seqlen_q, max_seqlen_k))
    q32, k32, v32 = (_dequantize(t, s, cu) for t, s, cu in zip((q, k, v), scales, (cu_seqlens_q, cu_seqlens_k,
                                                                                     cu_seqlens_k)))
    out, lse = reference_forward(q32, k32, v32, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                                 alibi_slopes, 0)
    return out.to(out_dtype), lse


def forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed):
    """(out, lse) of the call; ``sem``: its ``ioattn.semantics.Semantics``."""
    impl = triton_forward if dispatch.use_triton(q.device, q.dtype) else reference_forward
    return impl(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed)


def backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, seed):
    """(dq, dk, dv) of the call; ``sem``: its ``ioattn.semantics.Semantics``."""
    impl = triton_backward if dispatch.use_triton(q.device, q.dtype) else reference_backward
    return impl(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                seed)


# ---- calls with score / mask functions or block masks (ioattn.modcall.ModCall): the portable kernels,
# or on the CPU ioattn.kernels.cpu_mods ----

def _cpu_mod_args(call, sem):
    """The CPU path's (score_fn, mask_fn, block_keep_fn, window_fn) of a call."""
    block_keep_fn = None if call.block_mask is None else _block_keep(call.block_mask)
    window_fn = None if sem.window == (-1, -1) else _window_keep(sem.window)
    return call.score, call.mask, block_keep_fn, window_fn


def _block_keep(bm):
    listed = bm.classes() != 0
    bq, bk = bm.block_size

    def block_keep(b, m0, m1, seqlen_q, seqlen_k):
        rows = listed[min(b, listed.shape[0] - 1)].repeat_interleave(bq, -2).repeat_interleave(bk, -1)
        return rows[None, :, m0:m1, :seqlen_k]
    return block_keep


def _window_keep(window):
    from ioattn.masks import keep_mask

    def window_keep(m0, m1, seqlen_q, seqlen_k):
        return keep_mask(seqlen_q, seqlen_k, window)[m0:m1]
    return window_keep


_MOD_ROUTES: dict = {}


def mod_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes, call):
    """(out, lse) of a call with score / mask functions or a block mask (on the CPU without softcap and
    ALiBi: the caller folds them into the score function): the Gluon ping-pong forward where
    ``plan.mods.fwd_plan`` takes the call, else the portable kernel."""
    if dispatch.use_triton(q.device, q.dtype):
        varlen = cu_seqlens_q is not None
        key = (_forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes),
               call.key)
        route = _MOD_ROUTES.get(key, _UNSET)
        if route is _UNSET:
            route = None
            if mods_plan.fwd_plan(q, k, v, varlen, sem, call.block_size(), call.captures(), call.exact_lists())[0]:
                plan = forward_plan.plan_forward_mods(forward_signature(q, k, sem.softmax_scale, False),
                                                      call.score is not None, call.block_size(), call.captures(),
                                                      call.exact_lists())
                route = gluon_fwd.ForwardLaunch(plan, q, k, v, cached=False, functions=call.functions())
            if len(_MOD_ROUTES) >= _ROUTES_MAX:
                _MOD_ROUTES.clear()
            _MOD_ROUTES[key] = route
        if route is not None:
            return route(q, k, v, mod_args=call.gluon_forward_args(sem.softmax_scale, route.q_block))
        return portable_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                                0, mods=call)
    from ioattn.kernels import cpu_mods
    return cpu_mods.forward(q, k, v, cu_seqlens_q, cu_seqlens_k, sem.softmax_scale, *_cpu_mod_args(call, sem))


_MOD_BWD_ROUTES: dict = {}


def _mod_backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem,
                        alibi_slopes, call):
    """The Gluon backward prepared for calls with these functions laid out as this one, or None."""
    key = (_forward_key(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes), call.key,
           dout.shape, dout.stride(), dout.dtype, dout.data_ptr() % 16, out.shape, out.stride(), out.dtype,
           out.data_ptr() % 16, lse.shape, lse.stride())
    route = _MOD_BWD_ROUTES.get(key, _UNSET)
    if route is _UNSET:
        route = None
        if mods_plan.bwd_plan(q, k, v, cu_seqlens_q is not None, sem, call.block_size(), bool(call.grad_captures()),
                              call.heads_share_lists())[0]:
            from ioattn.launch import gluon_bwd
            plan = backward_plan.plan_backward_mods(backward_signature(q, k, sem.softmax_scale, False),
                                                    call.block_size(), call.score is not None)
            route = gluon_bwd.BackwardLaunch(plan, dout, q, k, v, out, lse, cached=dispatch.cached_launch(),
                                             functions=call.backward_functions())
        if len(_MOD_BWD_ROUTES) >= _ROUTES_MAX:
            _MOD_BWD_ROUTES.clear()
        _MOD_BWD_ROUTES[key] = route
    return route


def mod_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, sem, alibi_slopes,
                 call):
    """(dq, dk, dv, the captured tensors' gradients (fp32)) of ``mod_forward``'s call: the Gluon ws
    backward where ``plan.mods.bwd_plan`` takes the call (no captured tensor taking a gradient), else the
    portable kernels."""
    if dispatch.use_triton(q.device, q.dtype):
        from ioattn.modcall import empty_grads
        route = _mod_backward_route(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    sem, alibi_slopes, call)
        if route is not None:
            return (*route(dout, q, k, v, out, lse, mod_args=call.gluon_backward_args()), [])
        grads = empty_grads(call, q.device)
        dq, dk, dv = portable_backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                       max_seqlen_k, sem, alibi_slopes, 0, mods=call, mod_grads=grads)
        return dq, dk, dv, list(grads)
    from ioattn.kernels import cpu_mods
    return cpu_mods.backward(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, sem.softmax_scale,
                             *_cpu_mod_args(call, sem), call.grad_captures())
