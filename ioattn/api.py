"""flash-attn-compatible public functions: validate -> normalise -> one autograd op.

The signatures are flash-attn 2.8's, argument for argument (names, order, defaults). Every function
checks its arguments before anything is launched and raises ``TypeError`` or ``ValueError`` naming
the argument and the shapes it got, and ``NotImplementedError`` naming the argument for a
flash-attn feature ioattn lacks (only ``block_table`` in the varlen functions). Layouts are flash-attn's:
``(batch, seqlen, nheads, headdim)``, or ``(total_tokens, nheads, headdim)`` with ``cu_seqlens``
for the varlen functions. The causal mask is aligned to the bottom-right corner when
``seqlen_q != seqlen_k`` (see ``ioattn.masks`` for the picture).
"""
from __future__ import annotations

import contextlib
import math

import torch

from ioattn import fp8, mods
from ioattn.plan import dispatch, hopper_bwd
from ioattn.autograd import attention, fp8_attention, mod_attention
from ioattn.modcall import ModCall
from ioattn.masks import normalize_window
from ioattn.reference.naive import scores_ref

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEADDIM = 256


def _check_tensor(name, t, ndim):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES and not fp8.is_fp8(t):
        raise TypeError(f"{name} must be float16, bfloat16, float32 or float8_e4m3fn, got {t.dtype}")


def _contiguous_last(t):
    # the kernels take any strides except in the head dimension
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_qkv(q, k, v, varlen):
    nd = 3 if varlen else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, nd)

    def shapes():  # built only for a message: this runs on every call
        return f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"

    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must agree in all but the head dim, got {shapes()}")
    if not varlen and q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k must have the same batch size, got {shapes()}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim, got {shapes()}")
    for what, d in (("head dim", q.shape[-1]), ("value head dim (v.shape[-1])", v.shape[-1])):
        if not 1 <= d <= MAX_HEADDIM:
            raise ValueError(f"{what} must be between 1 and {MAX_HEADDIM}, got {d} ({shapes()})")
    nheads, nheads_kv = q.shape[-2], k.shape[-2]
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"number of query heads ({nheads}) must be a multiple of the number of "
                         f"key/value heads ({nheads_kv}): {shapes()}")


def _check_scalars(dropout_p, softmax_scale, softcap, window_size, causal, alibi_slopes, q, batch):
    if not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {dropout_p!r}")
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    elif not isinstance(softmax_scale, (int, float)) or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")
    if not isinstance(softcap, (int, float)) or softcap < 0 or not math.isfinite(softcap):
        raise ValueError(f"softcap must be a finite number >= 0, got {softcap!r}")
    window = normalize_window(window_size, bool(causal))
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor):
            raise TypeError(f"alibi_slopes must be a tensor or None, got {type(alibi_slopes).__name__}")
        nheads = q.shape[-2]
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), "
                             f"got {tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != q.device:
            raise ValueError(f"alibi_slopes must be on {q.device}, got {alibi_slopes.device}")
        alibi_slopes = alibi_slopes.to(torch.float32).contiguous()
    return float(dropout_p), float(softmax_scale), float(softcap), window, alibi_slopes


def _check_cu_seqlens(name, cu, total, max_seqlen, max_name, device):
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 2:
        raise ValueError(f"{name} must be 1-D with batch + 1 >= 2 entries, got shape {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} must be on {device}, got {cu.device}")
    if not isinstance(max_seqlen, int) or max_seqlen < 0:
        raise ValueError(f"{max_name} must be an int >= 0, got {max_seqlen!r}")
    # Value checks read the tensor back (a host sync on CUDA); skipped while tracing or capturing.
    if torch.compiler.is_compiling() or (cu.is_cuda and torch.cuda.is_current_stream_capturing()):
        return
    lens = cu[1:] - cu[:-1]
    first, last, min_len, max_len = torch.stack([cu[0], cu[-1], lens.min(), lens.max()]).tolist()
    if first != 0 or min_len < 0:
        raise ValueError(f"{name} must start at 0 and be non-decreasing, got {cu.tolist()}")
    if last > total:
        raise ValueError(f"{name} ends at {last} but the packed tensor has only {total} tokens")
    if max_len > max_seqlen:
        raise ValueError(f"{max_name}={max_seqlen} is smaller than the longest sequence in {name} ({max_len})")


def attn_probs_block_n(headdim):
    """Width of the key blocks that ``S_dmask``'s values are relative to (see ``_probs_for_return``).

    flash-attn's kernels write each key block's probabilities relative to the running row maximum
    they hold when they reach that block, walking the key blocks from the last to the first; its
    tests rebuild the normalised probabilities knowing the block width (``_get_block_size_n``). These
    are the widths its kernels use with dropout, the only case in which ``S_dmask`` is returned:
    the same on every GPU generation, so a copy of its helpers gives the same answer on ioattn's
    ``S_dmask`` as on its own.
    """
    if headdim <= 32:
        return 128
    if 96 < headdim <= 128:
        return 32
    return 64


def _round128(n):
    return -(-n // 128) * 128


def _unnormalised_probs(q, k, softmax_scale, window, softcap, alibi_slopes, keep, block_n):
    """(batch, nheads, seqlen_q, seqlen_k) float32: ``exp(s - m)`` where ``m`` is the row maximum of
    the scores over the key block of the entry and every block after it (``block_n`` wide, from key
    0), as a kernel walking the blocks from the last leaves them; 0 where masked. Entries that
    dropout removed (``keep`` False) are negated."""
    s = scores_ref(q.float(), k.float(), softmax_scale, window, softcap, alibi_slopes)
    sk = s.shape[-1]
    if sk:
        nblocks = -(-sk // block_n)
        padded = torch.nn.functional.pad(s, (0, nblocks * block_n - sk), value=float("-inf"))
        block_max = padded.unflatten(-1, (nblocks, block_n)).amax(-1)
        # max over this block and the ones after it: a cumulative max taken from the right
        m = block_max.flip(-1).cummax(-1).values.flip(-1)
        m = m.repeat_interleave(block_n, dim=-1)[..., :sk]
        # a row with nothing visible from this block on: its entries are exp(-inf) = 0
        s = torch.exp(s - torch.where(torch.isneginf(m), 0.0, m))
    if keep is not None:
        s = torch.where(keep, s, -s)
    return s


def _probs_for_return(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window, softcap,
                      alibi_slopes, dropout_p, rng_state):
    """``S_dmask`` in flash-attn's layout, for testing only (it materialises the score matrix).

    Shape (batch, nheads, seqlen_q rounded up to a multiple of 128, seqlen_k likewise), the longest
    sequences (``max_seqlen_q/k``) for varlen calls, each sequence from row and column 0; q's dtype.
    Values are unnormalised: ``exp(s - m)`` with ``m`` the running maximum described in
    ``_unnormalised_probs`` (block width ``attn_probs_block_n(headdim)``); multiplying a block's
    entries by ``exp(m - lse)`` gives the probabilities. Dropped entries are negated (the sign bit
    encodes the mask, so a dropped 0 reads as kept, as in flash-attn); masked entries and the
    padding are 0. The mask is the kernels' (``ioattn.reference.philox``, padded numbering)."""
    from ioattn.reference.philox import LazyDropoutMask

    q, k = q.detach(), k.detach()
    block_n = attn_probs_block_n(q.shape[-1])
    h = q.shape[-2]
    if cu_seqlens_q is None:
        batch, max_seqlen_q, max_seqlen_k = q.shape[0], q.shape[1], k.shape[1]
        sequence = lambda i: (q[i:i + 1], k[i:i + 1])  # noqa: E731
    else:
        batch = cu_seqlens_q.numel() - 1
        cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
        sequence = lambda i: (q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None])  # noqa: E731
    probs = q.new_zeros(batch, h, _round128(max_seqlen_q), _round128(max_seqlen_k))
    # one sequence at a time, so that the float32 scores and the mask's counters stay one
    # sequence's worth (flash-attn's own tests ask for S_dmask at batch 60 x 1024 x 1024)
    for i in range(batch):
        qi, ki = sequence(i)
        sq, sk = qi.shape[1], ki.shape[1]
        keep = LazyDropoutMask(int(rng_state[0]), dropout_p, batch, h, max_seqlen_q, max_seqlen_k, batch_index=i,
                               device=q.device)(0, sq, 0, sk)
        slopes = alibi_slopes[i:i + 1] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        probs[i, :, :sq, :sk] = _unnormalised_probs(qi, ki, scale, window, softcap, slopes, keep, block_n)[0]
    return probs


def _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
         causal, window_size, softcap, alibi_slopes, return_attn_probs, deterministic=False, descales=(None,) * 3,
         out_dtype=None, quantize=False, sinks=None, mod_args=(None, None, None)):
    varlen = cu_seqlens_q is not None
    _check_qkv(q, k, v, varlen)
    if varlen:
        _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.shape[0], max_seqlen_q, "max_seqlen_q", q.device)
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, k.shape[0], max_seqlen_k, "max_seqlen_k", q.device)
        if cu_seqlens_q.numel() != cu_seqlens_k.numel():
            raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length (batch + 1), got "
                             f"{cu_seqlens_q.numel()} and {cu_seqlens_k.numel()}")
        batch = cu_seqlens_q.numel() - 1
    else:
        batch = q.shape[0]
        max_seqlen_q, max_seqlen_k = q.shape[1], k.shape[1]
    dropout_p, scale, softcap, window, alibi_slopes = _check_scalars(
        dropout_p, softmax_scale, softcap, window_size, causal, alibi_slopes, q, batch)
    q, k, v = _contiguous_last(q), _contiguous_last(k), _contiguous_last(v)
    if sinks is not None:
        _check_sinks(sinks, q, quantize or fp8.is_fp8(q))
    if any(m is not None for m in mod_args):
        out, lse = _run_mods(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, scale,
                             window, softcap, alibi_slopes, batch, descales, out_dtype, quantize, sinks, mod_args)
        return (out, lse, q.new_empty(0)) if return_attn_probs else out
    if quantize:  # fp8=True: the library quantises (its scales, its rotation) and returns q's dtype
        _check_one_call(q, k, v, descales, out_dtype)
        out_dtype = q.dtype
        q, k, v, descales = fp8.quantize_qkv(q, k, v, cu_seqlens_q, cu_seqlens_k)
    if fp8.is_fp8(q) or any(d is not None for d in descales) or out_dtype is not None:
        out, lse = _run_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, scale,
                            window, softcap, alibi_slopes, batch, descales, out_dtype, check_values=not quantize)
        return (out, lse, q.new_empty(0, dtype=out.dtype)) if return_attn_probs else out
    # deterministic: that forward's backward adds dQ in a fixed order (ioattn.plan.hopper_bwd.bwd_plan); the
    # switches in force at the forward decide the backward of that forward (ioattn.autograd)
    with hopper_bwd.bwd_deterministic(True) if deterministic else contextlib.nullcontext():
        out, lse, rng_state = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                        scale, window, softcap, alibi_slopes, dropout_p, sinks)
    if not return_attn_probs:
        return out
    # As in flash-attn, the probabilities come back only with dropout (an empty tensor otherwise):
    # callers that ask for return_attn_probs to get the lse must not pay for an N x N matrix.
    if dropout_p == 0:
        return out, lse, q.new_empty(0)
    return out, lse, _probs_for_return(q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                                       window, softcap, alibi_slopes, dropout_p, rng_state)


@torch.compiler.disable  # traced by the library itself (ioattn.mods.trace): a graph break under torch.compile
def _run_mods(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, scale, window, softcap,
              alibi_slopes, batch, descales, out_dtype, quantize, sinks, mod_args):
    """A call with ``score_mod``, ``mask_mod`` or ``block_mask``: the portable kernels (or the CPU path)."""
    call = ModCall.make(*mod_args)
    if quantize or fp8.is_fp8(q) or any(d is not None for d in descales) or out_dtype is not None:
        raise ValueError("score_mod, mask_mod and block_mask are not supported with FP8 inputs or fp8=True")
    if dropout_p > 0:
        raise ValueError("score_mod, mask_mod and block_mask are not supported with dropout_p > 0")
    if call.score is not None and (softcap > 0 or alibi_slopes is not None):
        raise ValueError("score_mod with softcap or alibi_slopes: the order would be ambiguous; fold them into "
                         "the score function (ioattn.mods.softcap, ioattn.mods.alibi)")
    if call.block_mask is not None and window != (-1, -1):
        raise ValueError(f"block_mask with causal=True or window_size {window}: put the mask in the block mask's "
                         f"function (ioattn.mods.and_masks with ioattn.mods.bottom_right_causal or sliding_window)")
    call.check(batch, q.shape[-2], max_seqlen_q, max_seqlen_k, q.device)
    builtin = _builtin_form(call, q, max_seqlen_q, max_seqlen_k, cu_seqlens_q, window, softcap, alibi_slopes)
    if builtin is not None:
        # library functions with a built-in form run the built-in kernels (the Gluon ones where they apply)
        out, lse, _ = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale,
                                builtin["window"], builtin["softcap"], builtin["alibi_slopes"], 0.0, sinks)
        return out, lse
    if (alibi_slopes is not None or softcap > 0) and not dispatch.use_triton(q.device):
        # the CPU path takes the built-in forms as a score function
        call = _with_builtin_scores(call, q, k, varlen=cu_seqlens_q is not None, cu_seqlens_q=cu_seqlens_q,
                                    cu_seqlens_k=cu_seqlens_k, softcap=softcap, alibi_slopes=alibi_slopes)
        softcap, alibi_slopes = 0.0, None
    return mod_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window, softcap,
                         alibi_slopes, sinks, call)


def _builtin_form(call, q, max_seqlen_q, max_seqlen_k, cu_seqlens_q, window, softcap, alibi_slopes):
    """``ModCall.builtin``'s arguments where the call has no built-in ones of its own and its ALiBi
    slopes are the built-in's (fp32 (nheads,) on q's device); else None."""
    if window != (-1, -1) or softcap > 0 or alibi_slopes is not None:
        return None
    form = call.builtin(max_seqlen_q, max_seqlen_k, cu_seqlens_q is not None)
    slopes = None if form is None else form["alibi_slopes"]
    if slopes is not None and (tuple(slopes.shape) != (q.shape[-2],) or slopes.dtype != torch.float32
                               or slopes.device != q.device):
        return None
    return form


def _with_builtin_scores(call, q, k, varlen, cu_seqlens_q, cu_seqlens_k, softcap, alibi_slopes):
    """``call`` with softcap / ALiBi (flash-attn's rules, bottom-right per sequence) as its score function."""
    parts = []
    if softcap > 0:
        parts.append(mods.softcap(softcap))
    if alibi_slopes is not None:
        if varlen:
            offset = ((cu_seqlens_k[1:] - cu_seqlens_k[:-1]) - (cu_seqlens_q[1:] - cu_seqlens_q[:-1])).to(torch.int32)
        else:
            offset = torch.full((q.shape[0],), k.shape[1] - q.shape[1], dtype=torch.int32, device=q.device)
        parts.append(mods.alibi(alibi_slopes.float().contiguous(), offset))

    def builtin_scores(score, b, h, q_idx, kv_idx):
        for part in parts:
            score = part(score, b, h, q_idx, kv_idx)
        return score
    return ModCall(mods.trace(builtin_scores, "score"), call.mask, call.block_mask)


def _check_sinks(sinks, q, low_precision):
    if not isinstance(sinks, torch.Tensor):
        raise TypeError(f"sinks must be a torch.Tensor or None, got {type(sinks).__name__}")
    if tuple(sinks.shape) != (q.shape[-2],):
        raise ValueError(f"sinks must have shape (nheads,) = ({q.shape[-2]},), got {tuple(sinks.shape)}")
    if not sinks.is_floating_point() or sinks.dtype.itemsize < 2:
        raise TypeError(f"sinks must be float32, float16 or bfloat16, got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(f"sinks must be on q's device {q.device}, got {sinks.device}")
    if low_precision:
        raise ValueError("sinks are not supported with FP8 inputs or fp8=True yet")


def _check_one_call(q, k, v, descales, out_dtype):
    if fp8.is_fp8(q):
        raise ValueError("fp8=True quantises bf16 / fp16 inputs itself; q, k, v are already float8_e4m3fn: pass "
                         "their descales instead")
    if any(d is not None for d in descales) or out_dtype is not None:
        raise ValueError("fp8=True computes the descales and returns q's dtype: leave q_descale, k_descale, "
                         "v_descale and out_dtype unset")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError("fp8=True has no backward (FP8 attention is for inference): pass tensors that do "
                           "not require grad, or run under torch.no_grad()")


def _run_fp8(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, scale, window, softcap,
             alibi_slopes, batch, descales, out_dtype, check_values=True):
    """The FP8 forward's own checks, then the call: e4m3 inputs with their descales, no dropout, no
    gradient (FP8 attention here is for inference). ``check_values`` False: descales from ``fp8=True``'s
    own quantisation, not read back (``fp8.descale_rows``)."""
    if not fp8.is_fp8(q):
        given = [n for n, d in zip(("q_descale", "k_descale", "v_descale"), descales) if d is not None]
        name = given[0] if given else "out_dtype"
        raise ValueError(f"{name} applies to FP8 (float8_e4m3fn) inputs only; q, k, v are {q.dtype}")
    if dropout_p > 0:
        raise ValueError(f"dropout_p must be 0 with FP8 inputs (FP8 attention is for inference), got {dropout_p}")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise RuntimeError("FP8 inputs have no backward in ioattn (FP8 attention is for inference): pass "
                           "tensors that do not require grad, or run under torch.no_grad()")
    out_dtype = fp8.fp8_output_dtype(out_dtype)
    rows = fp8.descale_rows(*descales, batch, q.shape[-2], k.shape[-2], q.device, check_values,
                            blocks_q=-(-max_seqlen_q // fp8.FP8_BLOCK_ROWS),
                            blocks_k=-(-max_seqlen_k // fp8.FP8_BLOCK_ROWS))
    return fp8_attention(q, k, v, rows, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scale, window,
                         softcap, alibi_slopes, out_dtype)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                    softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, *,
                    q_descale=None, k_descale=None, v_descale=None, out_dtype=None, fp8=False, sinks=None,
                    mask_mod=None, score_mod=None, block_mask=None):
    """Exact attention, softmax(q k^T * softmax_scale) v, without materialising the score matrix.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim), nheads a
    multiple of nheads_k (MQA/GQA). v may have a head dim of its own (MLA's 192 / 128; each up to 256),
    and the output then has v's (``docs/mla.md``). ``window_size=(left, right)`` keeps keys within ``left`` before
    and ``right`` after the query's (bottom-right aligned) position; -1 is unbounded. ``softcap``
    applies ``cap * tanh(s / cap)`` to the scaled scores. ``alibi_slopes`` (nheads,) or
    (batch, nheads) adds ``-slope * |i + seqlen_k - seqlen_q - j|``. ``deterministic=True`` makes
    the backward bitwise reproducible: dQ's partial sums are added in a fixed order (see
    ``ioattn.plan.hopper_bwd.bwd_plan``), where the default Gluon backward on Hopper adds them as they arrive.

    Returns ``out`` (batch, seqlen_q, nheads, headdim), or with ``return_attn_probs=True``
    ``(out, softmax_lse (batch, nheads, seqlen_q) fp32, S_dmask)`` in flash-attn's layout. Without
    dropout ``S_dmask`` is an empty tensor. With ``dropout_p > 0`` (testing only, small shapes) it is
    (batch, nheads, seqlen_q and seqlen_k each rounded up to a multiple of 128) in q's dtype, holding
    unnormalised probabilities: ``exp(s - m)`` where ``m`` is the row maximum over the entry's key
    block and the blocks after it, blocks ``attn_probs_block_n(headdim)`` wide from key 0, so that
    ``|S_dmask| * exp(m - softmax_lse)`` is the softmax. Entries that dropout removed are negated
    (``S_dmask >= 0`` is the keep mask); masked entries and the rounding padding are 0.

    FP8 (FlashAttention-3's interface): q, k, v of dtype ``torch.float8_e4m3fn`` with ``q_descale``,
    ``k_descale``, ``v_descale`` (the real values are ``fp8 * descale``), each of shape
    (batch, nheads_kv) or broadcasting to it (q's may be (batch, nheads)); fp32 accumulation, P
    through e4m3 for the P V product, the output in ``out_dtype`` (bfloat16, or float16). Forward
    only, no dropout. ``ioattn.quantize_fp8`` makes such inputs. ``fp8=True`` does it for bf16 / fp16
    q, k, v: one scale per (batch, head), q and k rotated by one random-sign Hadamard matrix where
    the head dim is a power of two (``ioattn.fp8.quantize_qkv``), the output in q's dtype.

    ``sinks`` (nheads,): a learnable logit per head added to every row's softmax denominator as one
    more column whose value is 0 (gpt-oss's attention sinks), differentiable; the returned lse
    includes it (rows that see no key keep output 0 and lse -inf).

    Programmable attention (``ioattn.mods``): ``mask_mod(b, h, q_idx, kv_idx) -> bool`` keeps pairs,
    ``score_mod(score, b, h, q_idx, kv_idx)`` rewrites the scaled score (differentiable, also in the
    tensors it captures), ``block_mask`` (``ioattn.create_block_mask``) skips the blocks its mask
    empties; compiled into the portable kernels, with causal / window_size (not with a block mask)
    and GQA; not with dropout or FP8. Their positions are top-left (``q_idx`` from 0 in q, ``kv_idx``
    in k).
    """
    return _run(q, k, v, None, None, None, None, dropout_p, softmax_scale, causal, window_size, softcap,
                alibi_slopes, return_attn_probs, deterministic, (q_descale, k_descale, v_descale), out_dtype, fp8,
                sinks, (score_mod, mask_mod, block_mask))


def _unbind_packed(name, t, index_dim, count):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != index_dim + 3 or t.shape[index_dim] != count:
        raise ValueError(f"{name} must have {index_dim + 3} dimensions with size {count} in dimension {index_dim}, "
                         f"got shape {tuple(t.shape)}")
    return t.unbind(index_dim)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``qkv`` (batch, seqlen, 3, nheads, headdim); otherwise as ``flash_attn_func``."""
    q, k, v = _unbind_packed("qkv", qkv, 2, 3)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """``kv`` (batch, seqlen_k, 2, nheads_k, headdim); otherwise as ``flash_attn_func``."""
    k, v = _unbind_packed("kv", kv, 2, 2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None, *,
                           q_descale=None, k_descale=None, v_descale=None, out_dtype=None, fp8=False, sinks=None,
                           mask_mod=None, score_mod=None, block_mask=None):
    """Sequences packed without padding. q: (total_q, nheads, headdim); k, v: (total_k, nheads_k,
    headdim); ``cu_seqlens_q/k`` int32 (batch + 1,) cumulative lengths starting at 0; ``max_seqlen_q/k``
    the longest sequence. Masks apply per sequence; v may have a head dim of its own, the output's (as in
    ``flash_attn_func``). Returns ``out`` (total_q, nheads, headdim) or
    ``(out, softmax_lse (nheads, total_q), S_dmask)``, ``S_dmask`` as ``flash_attn_func``'s with
    (batch, nheads, max_seqlen_q, max_seqlen_k) rounded up to multiples of 128, each sequence from
    row and column 0.

    ``block_table`` (flash-attn: k, v as a paged KV cache) is accepted as None only: paged KV in the
    varlen functions is not implemented (``flash_attn_with_kvcache`` takes a paged cache).

    FP8 inputs, ``fp8=True``, ``sinks``, ``mask_mod``, ``score_mod`` and ``block_mask`` as in
    ``flash_attn_func``, the descales' (and the functions' ``b``) batch being the number of sequences,
    the functions' positions within each sequence, a block mask built for (sequences, heads,
    max_seqlen_q, max_seqlen_k)."""
    if block_table is not None:
        raise NotImplementedError("flash_attn_varlen_func: block_table (a paged KV cache for the varlen "
                                  "functions) is not supported by ioattn; pass block_table=None with k, v "
                                  "packed like q, or use flash_attn_with_kvcache for a paged cache")
    if cu_seqlens_q is None or cu_seqlens_k is None:
        raise ValueError("cu_seqlens_q and cu_seqlens_k are required for the varlen functions")
    return _run(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                causal, window_size, softcap, alibi_slopes, return_attn_probs, deterministic,
                (q_descale, k_descale, v_descale), out_dtype, fp8, sinks, (score_mod, mask_mod, block_mask))


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None,
                                     causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                     deterministic=False, return_attn_probs=False):
    """``qkv`` (total, 3, nheads, headdim); otherwise as ``flash_attn_varlen_func``."""
    q, k, v = _unbind_packed("qkv", qkv, 1, 3)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                                    softcap=0.0, alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False):
    """``kv`` (total_k, 2, nheads_k, headdim); otherwise as ``flash_attn_varlen_func``."""
    k, v = _unbind_packed("kv", kv, 1, 2)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)
