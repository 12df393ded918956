"""The Triton kernels (forward + backward), through the public API.

On a machine without CUDA the kernels run under Triton's interpreter on CPU tensors (conftest sets
TRITON_INTERPRET=1); on a GPU machine the same tests run on CUDA. Every numerical check follows one
rule: fresh ``torch.randn`` inputs, the float64 ``attention_ref`` as the oracle, and the kernel's
max abs error (output, dq, dk, dv) at most twice that of PyTorch's standard attention computed in
the same dtype (``attention_ref(..., upcast=False)``), see ``conftest.assert_within_torch_error``.

Under the interpreter, conftest makes bfloat16 behave as on the GPU (Triton 3.6's interpreter
multiplies bf16 bit patterns in tl.dot and truncates fp32 -> bf16 casts; see
``conftest._interpreter_bf16``), and every buffer the launchers allocate starts as NaN
(``conftest.poison_alloc``), so an element a kernel forgets to write cannot pass.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import DEVICE, assert_lse_close, assert_matches_oracles, attention_oracles, max_err
from ioattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                    flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from ioattn.plan import dispatch
from ioattn.plan.dispatch import TileConfig
from ioattn.masks import keep_mask
from ioattn.reference import dropout_keep_mask

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32


@pytest.fixture(autouse=True)
def _triton_backend(poison_alloc):
    # every test in this file runs the Triton kernels (interpreted on CPU, compiled on CUDA), with
    # the buffers the launchers allocate filled with NaN first (see conftest.poison_alloc)
    with dispatch.forced_backend("triton"):
        yield


# ----------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------

def _randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def _inputs(b, sq, sk, h, hk, d, dtype):
    return (_randn(b, sq, h, d, dtype=dtype), _randn(b, sk, hk, d, dtype=dtype),
            _randn(b, sk, hk, d, dtype=dtype), _randn(b, sq, h, d, dtype=dtype))


def _slopes(kind, b, h):
    """ALiBi slopes exactly representable in fp16/bf16, so that PyTorch's same-dtype yardstick does
    not get extra error from rounding them."""
    if kind is None:
        return None
    shape = (h,) if kind == "heads" else (b, h)
    return (torch.rand(*shape, device=DEVICE) * 0.5 + 0.05).to(torch.bfloat16).float()


def _norm_window(window_size, causal):
    if isinstance(window_size, torch.Tensor):
        window_size = window_size.tolist()
    left, right = (int(x) for x in window_size)
    return (left, 0 if causal else right)


def _grads(out, dout, *leaves):
    return torch.autograd.grad(out, leaves, dout)


def check_case(b=1, sq=113, sk=203, h=2, hk=1, d=64, dtype=FP16, causal=False, window_size=(-1, -1),
               softcap=0.0, alibi=None, softmax_scale=None, name=""):
    """Run flash_attn_func forward + backward on fresh random inputs and check out, lse, dq, dk, dv
    against the oracle. Returns the tensors for further checks."""
    q, k, v, dout = _inputs(b, sq, sk, h, hk, d, dtype)
    slopes = _slopes(alibi, b, h)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_func(qg, kg, vg, softmax_scale=softmax_scale, causal=causal,
                                  window_size=window_size, softcap=softcap, alibi_slopes=slopes,
                                  return_attn_probs=True)
    grads = _grads(out, dout, qg, kg, vg)
    window = _norm_window(window_size, causal)
    oracles = attention_oracles(q, k, v, dout, softmax_scale=softmax_scale, window=window,
                                softcap=softcap, alibi_slopes=slopes)
    name = name or f"b{b} s{sq}x{sk} h{h}/{hk} d{d} {dtype} causal={causal} w={window} cap={softcap} alibi={alibi}"
    assert out.dtype == dtype and out.shape == q.shape
    assert_matches_oracles(name, out, grads, oracles)
    assert_lse_close(name, lse, oracles["lse64"].float())
    return dict(q=q, k=k, v=v, dout=dout, out=out, lse=lse, grads=grads, window=window, oracles=oracles)


# ----------------------------------------------------------------------------------------------
# head dims, dtypes, seqlens
# ----------------------------------------------------------------------------------------------

HEADDIMS = [1, 16, 59, 64, 72, 80, 96, 111, 128, 192, 256]


@pytest.mark.parametrize("d", HEADDIMS)
@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_headdims(d, dtype):
    # default feature set: GQA 2, causal, unequal seqlens crossing several tiles
    sq, sk = ((113, 203), (203, 113))[dtype == BF16]
    check_case(b=1, sq=sq, sk=sk, h=2, hk=1, d=d, dtype=dtype, causal=True)


@pytest.mark.parametrize("d", [59, 64])
def test_fp32(d):
    check_case(b=2, sq=97, sk=70, h=2, hk=2, d=d, dtype=FP32, causal=d == 64, softcap=0.0 if d == 64 else 2.5)


SEQLENS = [(1, 1), (113, 203), (203, 113), (128, 128), (5, 2), (64, 300), (1, 77), (77, 1), (31, 33)]


@pytest.mark.parametrize("seqlens", SEQLENS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_seqlens(seqlens, causal):
    sq, sk = seqlens
    dtype = BF16 if (sq + sk) % 2 else FP16
    check_case(b=2, sq=sq, sk=sk, h=2, hk=1, d=64 if sq != sk else 80, dtype=dtype, causal=causal)


# ----------------------------------------------------------------------------------------------
# masks and score modifiers
# ----------------------------------------------------------------------------------------------

WINDOWS = [(-1, -1), (16, 0), (7, 3), (0, 0), (-1, 5), (40, -1)]


@pytest.mark.parametrize("window", WINDOWS, ids=lambda w: f"w{w[0]},{w[1]}")
@pytest.mark.parametrize("seqlens", [(113, 203), (203, 113)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_windows(window, seqlens):
    sq, sk = seqlens
    check_case(b=1, sq=sq, sk=sk, h=2, hk=1, d=64 if sq < sk else 96, dtype=FP16 if sq < sk else BF16,
               window_size=window)


@pytest.mark.parametrize("kind", ["tuple", "list", "tensor"])
def test_window_size_types(kind):
    window = {"tuple": (16, 4), "list": [16, 4], "tensor": torch.tensor([16, 4])}[kind]
    res = check_case(b=1, sq=70, sk=90, h=2, hk=1, d=32, window_size=window)
    # all three spellings give bit-identical results
    with torch.no_grad():
        again = flash_attn_func(res["q"], res["k"], res["v"], window_size=(16, 4))
    assert torch.equal(res["out"], again)


def test_causal_with_window():
    # causal clamps the right side of the window to 0
    check_case(b=1, sq=90, sk=130, h=2, hk=1, d=64, causal=True, window_size=(20, 7))


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1), (3, 1)], ids=lambda h: f"h{h[0]}/{h[1]}")
def test_gqa_mqa(heads):
    h, hk = heads
    check_case(b=2, sq=77, sk=100, h=h, hk=hk, d=64, dtype=BF16 if h == 4 else FP16, causal=h != 3)


@pytest.mark.parametrize("causal,dtype,d", [(False, FP16, 64), (True, BF16, 128), (True, FP16, 59)])
def test_softcap(causal, dtype, d):
    check_case(b=1, sq=113, sk=140, h=2, hk=1, d=d, dtype=dtype, causal=causal, softcap=3.0)


@pytest.mark.parametrize("alibi,causal,dtype", [("heads", False, FP16), ("heads", True, BF16),
                                                ("batch_heads", True, FP16), ("batch_heads", False, BF16)])
def test_alibi(alibi, causal, dtype):
    check_case(b=2, sq=100, sk=130, h=4, hk=2, d=64, dtype=dtype, causal=causal, alibi=alibi)


def test_everything_at_once():
    check_case(b=2, sq=91, sk=150, h=4, hk=2, d=80, dtype=BF16, causal=True, window_size=(45, -1),
               softcap=3.0, alibi="batch_heads", softmax_scale=0.07)


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_large_scores(dtype):
    # scores with a std of ~25: the running max changes often across key blocks, so the online
    # softmax rescaling (alpha) and the lse carry most of the result
    res_scale = 5.0
    q, k, v, dout = _inputs(1, 100, 150, 2, 1, 64, dtype)
    q = (q.float() * res_scale).to(dtype)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_func(qg, kg, vg, window_size=(60, 20), return_attn_probs=True)
    grads = _grads(out, dout, qg, kg, vg)
    oracles = attention_oracles(q, k, v, dout, window=(60, 20))
    assert_matches_oracles("large scores", out, grads, oracles)
    assert_lse_close("large scores", lse, oracles["lse64"].float(), atol=2e-3)


def test_custom_softmax_scale():
    check_case(b=1, sq=64, sk=96, h=2, hk=2, d=64, softmax_scale=0.3)


# ----------------------------------------------------------------------------------------------
# rows that see no key
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seqlens,causal,window", [((5, 2), True, (-1, -1)), ((203, 113), True, (-1, -1)),
                                                   ((60, 40), False, (0, 0)), ((70, 40), False, (5, 2))])
def test_rows_without_keys(seqlens, causal, window):
    sq, sk = seqlens
    res = check_case(b=2, sq=sq, sk=sk, h=2, hk=1, d=32, causal=causal, window_size=window,
                     softcap=2.0, alibi="heads")
    empty = ~keep_mask(sq, sk, res["window"], device=DEVICE).any(dim=1)
    assert empty.any() and not empty.all()
    assert (res["out"][:, empty] == 0).all(), "rows without keys must output exactly 0"
    assert torch.isneginf(res["lse"][:, :, empty]).all()
    assert torch.isfinite(res["lse"][:, :, ~empty]).all()
    dq, dk, dv = res["grads"]
    assert (dq[:, empty] == 0).all(), "rows without keys must get dq = 0"
    unseen = ~keep_mask(sq, sk, res["window"], device=DEVICE).any(dim=0)
    assert (dk[:, unseen] == 0).all() and (dv[:, unseen] == 0).all()


# On a GPU the 12 draws meet the criterion (the device suite saw it pass), so there it must pass.
FEW_KEYS_XFAIL = pytest.mark.xfail(
    DEVICE == "cpu", strict=True,
    reason="backward precision when rows see only 1-3 keys: D = rowsum(dO * O) is computed from O "
           "rounded to fp16/bf16 (backward.py attn_bwd_preprocess_kernel; tiled.py flash_backward), and "
           "dS = P (dP - D) cancels, so dq/dk reach 3-5x PyTorch's same-dtype error; with D from the "
           "fp32 O the ratio stays <= 1")


@FEW_KEYS_XFAIL
def test_backward_precision_rows_with_few_keys():
    # 12 draws of a problem whose rows see 1 or 2 keys; every draw must meet the 2x criterion
    for seed in range(12):
        torch.manual_seed(seed)
        check_case(b=2, sq=5, sk=2, h=2, hk=1, d=64, dtype=FP16, causal=True, name=f"5x2 causal seed {seed}")


def test_seqlen_k_zero():
    q, k, v, dout = _inputs(2, 9, 0, 2, 1, 32, FP16)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    out, lse, _ = flash_attn_func(qg, kg, vg, return_attn_probs=True)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 2, 9) and torch.isneginf(lse).all()
    dq, dk, dv = _grads(out, dout, qg, kg, vg)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


# ----------------------------------------------------------------------------------------------
# dropout
# ----------------------------------------------------------------------------------------------

def _expected_seed(manual_seed):
    """The seed the op draws from torch's CPU generator right after ``torch.manual_seed``."""
    torch.manual_seed(manual_seed)
    return int(torch.randint(0, 2**62, (1,)).item())


@pytest.mark.parametrize("p,causal,alibi,softcap,heads,dtype,d,seqlens", [
    (0.17, False, None, 0.0, (2, 1), FP16, 64, (77, 113)),
    (0.3, True, None, 0.0, (4, 2), BF16, 80, (77, 113)),
    (0.1, True, "batch_heads", 3.0, (2, 2), FP16, 59, (77, 113)),
    (0.2, True, "heads", 0.0, (2, 1), BF16, 32, (113, 77)),  # rows without keys
])
def test_dropout(p, causal, alibi, softcap, heads, dtype, d, seqlens):
    b, (sq, sk) = 2, seqlens
    h, hk = heads
    q, k, v, dout = _inputs(b, sq, sk, h, hk, d, dtype)
    slopes = _slopes(alibi, b, h)
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    seed = _expected_seed(1234)
    torch.manual_seed(1234)
    out, lse, probs = flash_attn_func(qg, kg, vg, dropout_p=p, causal=causal, softcap=softcap,
                                      alibi_slopes=slopes, return_attn_probs=True)
    grads = _grads(out, dout, qg, kg, vg)
    keep = dropout_keep_mask(seed, p, b, h, sq, sk, device=DEVICE)
    # S_dmask is padded to multiples of 128; the sign pattern of its entries is the Philox mask
    # (where they are not 0)
    assert probs.shape == (b, h, -(-sq // 128) * 128, -(-sk // 128) * 128)
    assert (probs[:, :, sq:] == 0).all() and (probs[..., sk:] == 0).all()
    probs = probs[:, :, :sq, :sk]
    nz = probs != 0
    visible = keep_mask(sq, sk, _norm_window((-1, -1), causal), device=DEVICE).expand_as(nz)
    assert not (nz & ~visible).any(), "masked entries of probs must be 0"
    if alibi is None:  # (ALiBi legitimately underflows far-away probabilities to 0)
        assert nz.sum() >= 0.9 * visible.sum()
    assert torch.equal(probs[nz] > 0, keep[nz]), "dropped entries of probs do not match the Philox mask"
    # about (1 - p) of the entries are kept
    kept = (probs[nz] > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.02, f"kept fraction {kept:.3f}, expected {1 - p:.3f}"
    window = _norm_window((-1, -1), causal)
    oracles = attention_oracles(q, k, v, dout, window=window, softcap=softcap, alibi_slopes=slopes,
                                dropout_p=p, dropout_keep=keep)
    assert_matches_oracles(f"dropout p={p}", out, grads, oracles)
    assert_lse_close("dropout lse", lse, oracles["lse64"].float())  # lse is the undropped softmax's


def test_dropout_same_seed_same_output():
    q, k, v, dout = _inputs(1, 64, 64, 2, 1, 32, FP16)

    def run(s):
        torch.manual_seed(s)
        qg = q.clone().requires_grad_()
        out = flash_attn_func(qg, k, v, dropout_p=0.25, causal=True)
        (dq,) = torch.autograd.grad(out, (qg,), dout)
        return out, dq

    out1, dq1 = run(7)
    out2, dq2 = run(7)
    out3, _ = run(8)
    assert torch.equal(out1, out2) and torch.equal(dq1, dq2)
    assert not torch.equal(out1, out3)
    # two calls in a row (no reseeding) draw different masks
    torch.manual_seed(7)
    a = flash_attn_func(q, k, v, dropout_p=0.25)
    b = flash_attn_func(q, k, v, dropout_p=0.25)
    assert not torch.equal(a, b)


def test_dropout_keep_rate():
    p = 0.35
    q, k, v, _ = _inputs(1, 128, 128, 2, 2, 16, FP16)
    torch.manual_seed(99)
    _, _, probs = flash_attn_func(q, k, v, dropout_p=p, return_attn_probs=True)
    nz = probs != 0
    assert nz.double().mean() > 0.99
    kept = (probs[nz] > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 0.015, kept


def test_dropout_varlen():
    p = 0.2
    lens_q, lens_k = [37, 0, 64, 5], [50, 9, 33, 0]
    max_q, max_k = 70, 64  # larger than the true maxima: the mask counters use these
    h, hk, d = 2, 1, 64
    res = _varlen_run(lens_q, lens_k, h, hk, d, FP16, dict(causal=True, dropout_p=p),
                      max_seqlens=(max_q, max_k), manual_seed=4321)
    seed = _expected_seed(4321)
    keep = dropout_keep_mask(seed, p, len(lens_q), h, max_q, max_k, device=DEVICE)
    _varlen_check(res, lens_q, lens_k, dict(window=(-1, 0), dropout_p=p),
                  keep=lambda i, lq, lk: keep[i:i + 1, :, :lq, :lk])


# ----------------------------------------------------------------------------------------------
# varlen and packed variants
# ----------------------------------------------------------------------------------------------

def _cu(lens):
    return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32, device=DEVICE)


def _varlen_run(lens_q, lens_k, h, hk, d, dtype, kwargs, max_seqlens=None, manual_seed=None):
    tq, tk = sum(lens_q), sum(lens_k)
    q, k, v = _randn(tq, h, d, dtype=dtype), _randn(tk, hk, d, dtype=dtype), _randn(tk, hk, d, dtype=dtype)
    dout = _randn(tq, h, d, dtype=dtype)
    max_q, max_k = max_seqlens or (max(lens_q), max(lens_k))
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    if manual_seed is not None:
        torch.manual_seed(manual_seed)
    out, lse, probs = flash_attn_varlen_func(qg, kg, vg, _cu(lens_q), _cu(lens_k), max_q, max_k,
                                             return_attn_probs=True, **kwargs)
    if kwargs.get("dropout_p", 0) > 0:
        # padded to the longest sequences rounded up to 128, as flash-attn returns S_dmask
        assert probs.shape == (len(lens_q), h, -(-max_q // 128) * 128, -(-max_k // 128) * 128)
    else:
        assert probs.shape == (0,)
    grads = _grads(out, dout, qg, kg, vg)
    return dict(q=q, k=k, v=v, dout=dout, out=out, lse=lse, grads=grads)


def _varlen_check(res, lens_q, lens_k, ref_kw, keep=None, slopes=None):
    q, k, v, dout, out, lse = (res[n] for n in ("q", "k", "v", "dout", "out", "lse"))
    dq, dk, dv = res["grads"]
    assert lse.shape == (q.shape[1], q.shape[0]) and lse.dtype == torch.float32
    cq, ck = _cu(lens_q).tolist(), _cu(lens_k).tolist()
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        sq, sk = slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])
        kw = dict(ref_kw)
        if keep is not None:
            kw["dropout_keep"] = keep(i, lq, lk)
        if slopes is not None:
            kw["alibi_slopes"] = slopes[i] if slopes.dim() == 2 else slopes
        if lq == 0:
            continue
        if lk == 0:
            assert (out[sq] == 0).all() and torch.isneginf(lse[:, sq]).all() and (dq[sq] == 0).all()
            continue
        oracles = attention_oracles(q[sq][None], k[sk][None], v[sk][None], dout[sq][None], **kw)
        name = f"varlen seq {i} ({lq}x{lk})"
        assert_matches_oracles(name, out[sq][None], (dq[sq][None], dk[sk][None], dv[sk][None]), oracles)
        assert_lse_close(name, lse[:, sq][None], oracles["lse64"].float())
    # keys of sequences that no query sees get zero gradient
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        if lq == 0 and lk > 0:
            assert (dk[ck[i]:ck[i + 1]] == 0).all() and (dv[ck[i]:ck[i + 1]] == 0).all()


@pytest.mark.parametrize("case", ["full", "causal-gqa-alibi", "window-softcap-bf16"])
def test_varlen(case):
    lens_q = [37, 0, 64, 101, 1, 45]
    lens_k = [50, 3, 64, 77, 1, 0]
    if case == "full":
        h, hk, d, dtype, kwargs, ref_kw = 2, 2, 64, FP16, {}, dict(window=(-1, -1))
        slopes = None
    elif case == "causal-gqa-alibi":
        h, hk, d, dtype = 4, 2, 59, FP16
        slopes = _slopes("batch_heads", len(lens_q), h)
        kwargs, ref_kw = dict(causal=True, alibi_slopes=slopes), dict(window=(-1, 0))
    else:
        h, hk, d, dtype, slopes = 2, 1, 128, BF16, None
        kwargs, ref_kw = dict(window_size=(20, 5), softcap=3.0), dict(window=(20, 5), softcap=3.0)
    res = _varlen_run(lens_q, lens_k, h, hk, d, dtype, kwargs)
    _varlen_check(res, lens_q, lens_k, ref_kw, slopes=slopes)


def test_varlen_tokens_past_cu_seqlens_get_zero_grad():
    # the API accepts cu_seqlens[-1] < total (only > total is refused): trailing tokens belong to
    # no sequence, influence no output, and must get zero gradient, not whatever memory held
    lens = [20, 20]
    q, k, v = (_randn(50, 2, 16, dtype=FP16).requires_grad_() for _ in range(3))
    out = flash_attn_varlen_func(q, k, v, _cu(lens), _cu(lens), 20, 20)
    dout = torch.zeros_like(out)
    dout[:40] = torch.randn_like(out[:40])
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
    assert torch.isfinite(out[:40]).all() and torch.isfinite(dq[:40]).all()
    for g in (dq, dk, dv):
        assert (g[40:] == 0).all(), "gradient of tokens past cu_seqlens[-1] is not zero"


def test_varlen_matches_batched():
    # equal lengths: the varlen call equals the batched call on the same data, bit for bit
    b, s, h, d = 3, 45, 2, 64
    q, k, v, dout = _inputs(b, s, s, h, h, d, FP16)
    cu = _cu([s] * b)
    out_b, lse_b, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    out_v, lse_v, _ = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, s, s,
                                             causal=True, return_attn_probs=True)
    assert torch.equal(out_v.view(b, s, h, d), out_b)
    assert torch.equal(lse_v.view(h, b, s).transpose(0, 1), lse_b)


def _packed_grads(out, dout, leaf):
    (g,) = torch.autograd.grad(out, (leaf,), dout)
    return g


@pytest.mark.parametrize("causal", [False, True])
def test_qkvpacked(causal):
    b, s, h, d = 2, 70, 2, 64
    qkv = _randn(b, s, 3, h, d, dtype=FP16)
    dout = _randn(b, s, h, d, dtype=FP16)
    leaf = qkv.clone().requires_grad_()
    out = flash_attn_qkvpacked_func(leaf, causal=causal, window_size=(30, -1))
    g = _packed_grads(out, dout, leaf)
    q, k, v = (qkv[:, :, i].clone().requires_grad_() for i in range(3))
    out_ref = flash_attn_func(q, k, v, causal=causal, window_size=(30, -1))
    assert torch.equal(out, out_ref)
    assert torch.equal(g, torch.stack(_grads(out_ref, dout, q, k, v), dim=2))


def test_kvpacked():
    b, sq, sk, h, hk, d = 2, 50, 83, 4, 2, 48
    q = _randn(b, sq, h, d, dtype=BF16)
    kv = _randn(b, sk, 2, hk, d, dtype=BF16)
    dout = _randn(b, sq, h, d, dtype=BF16)
    ql, kvl = q.clone().requires_grad_(), kv.clone().requires_grad_()
    out = flash_attn_kvpacked_func(ql, kvl, causal=True, softcap=3.0)
    dq, dkv = torch.autograd.grad(out, (ql, kvl), dout)
    q2, k2, v2 = q.clone().requires_grad_(), kv[:, :, 0].clone().requires_grad_(), kv[:, :, 1].clone().requires_grad_()
    out_ref = flash_attn_func(q2, k2, v2, causal=True, softcap=3.0)
    g = _grads(out_ref, dout, q2, k2, v2)
    assert torch.equal(out, out_ref)
    assert torch.equal(dq, g[0]) and torch.equal(dkv, torch.stack(g[1:], dim=2))


def test_varlen_qkvpacked():
    lens = [30, 0, 65, 7]
    h, d = 2, 64
    qkv = _randn(sum(lens), 3, h, d, dtype=FP16)
    dout = _randn(sum(lens), h, d, dtype=FP16)
    cu = _cu(lens)
    leaf = qkv.clone().requires_grad_()
    out = flash_attn_varlen_qkvpacked_func(leaf, cu, max(lens), causal=True)
    g = _packed_grads(out, dout, leaf)
    q, k, v = (qkv[:, i].clone().requires_grad_() for i in range(3))
    out_ref = flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert torch.equal(out, out_ref)
    assert torch.equal(g, torch.stack(_grads(out_ref, dout, q, k, v), dim=1))


def test_varlen_kvpacked():
    lens_q, lens_k = [30, 12, 65], [41, 0, 33]
    h, hk, d = 4, 1, 32
    q = _randn(sum(lens_q), h, d, dtype=BF16)
    kv = _randn(sum(lens_k), 2, hk, d, dtype=BF16)
    dout = _randn(sum(lens_q), h, d, dtype=BF16)
    cq, ck = _cu(lens_q), _cu(lens_k)
    ql, kvl = q.clone().requires_grad_(), kv.clone().requires_grad_()
    out = flash_attn_varlen_kvpacked_func(ql, kvl, cq, ck, max(lens_q), max(lens_k), window_size=(10, 10))
    dq, dkv = torch.autograd.grad(out, (ql, kvl), dout)
    q2, k2, v2 = q.clone().requires_grad_(), kv[:, 0].clone().requires_grad_(), kv[:, 1].clone().requires_grad_()
    out_ref = flash_attn_varlen_func(q2, k2, v2, cq, ck, max(lens_q), max(lens_k), window_size=(10, 10))
    g = _grads(out_ref, dout, q2, k2, v2)
    assert torch.equal(out, out_ref)
    assert torch.equal(dq, g[0]) and torch.equal(dkv, torch.stack(g[1:], dim=1))


# ----------------------------------------------------------------------------------------------
# strides, determinism, tiles
# ----------------------------------------------------------------------------------------------

def test_non_contiguous_inputs():
    b, sq, sk, h, hk, d = 2, 70, 90, 4, 2, 64
    # q: transpose of a (b, h, s, d) tensor; k: a slice of a wider last dim; v: a slice along the
    # sequence; dout: a transpose as well. All keep the head dim contiguous.
    q = _randn(b, h, sq, d, dtype=FP16).transpose(1, 2)
    k = _randn(b, sk, hk, 2 * d, dtype=FP16)[..., d:]
    v = _randn(b, sk + 9, hk, d, dtype=FP16)[:, 4:4 + sk]
    dout = _randn(b, h, sq, d, dtype=FP16).transpose(1, 2)
    assert not any(x.is_contiguous() for x in (q, k, v, dout))
    assert all(x.stride(-1) == 1 for x in (q, k, v, dout))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]  # clone keeps the strides
    assert not leaves[0].is_contiguous()
    out = flash_attn_func(*leaves, causal=True, softcap=3.0)
    grads = _grads(out, dout, *leaves)
    cleaves = [x.contiguous().requires_grad_() for x in (q, k, v)]
    out_c = flash_attn_func(*cleaves, causal=True, softcap=3.0)
    grads_c = _grads(out_c, dout.contiguous(), *cleaves)
    assert torch.equal(out, out_c)
    for g, gc in zip(grads, grads_c):
        assert torch.equal(g, gc)


def test_non_unit_last_stride_inputs():
    # a head dim that is not contiguous is copied by the API; results still equal the contiguous call
    b, s, h, d = 1, 40, 2, 32
    q = _randn(b, s, h, 2 * d, dtype=BF16)[..., ::2]
    k = _randn(b, s, h, d, dtype=BF16)
    v = _randn(b, s, h, 2 * d, dtype=BF16)[..., 1::2]
    dout = _randn(b, s, h, 2 * d, dtype=BF16)[..., ::2]
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = flash_attn_func(*leaves, causal=True)
    grads = _grads(out, dout, *leaves)
    cleaves = [x.contiguous().requires_grad_() for x in (q, k, v)]
    out_c = flash_attn_func(*cleaves, causal=True)
    grads_c = _grads(out_c, dout.contiguous(), *cleaves)
    assert torch.equal(out, out_c)
    for g, gc in zip(grads, grads_c):
        assert torch.equal(g, gc)


def test_expanded_dout():
    # out.sum().backward() hands the op a zero-stride dout
    q, k, v, _ = _inputs(1, 40, 50, 2, 1, 32, FP16)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    flash_attn_func(*leaves, causal=True).sum().backward()
    leaves2 = [x.clone().requires_grad_() for x in (q, k, v)]
    out2 = flash_attn_func(*leaves2, causal=True)
    grads2 = _grads(out2, torch.ones_like(out2), *leaves2)
    for a, g in zip(leaves, grads2):
        assert torch.equal(a.grad, g)


def test_deterministic_backward():
    q, k, v, dout = _inputs(2, 113, 150, 4, 1, 64, BF16)
    slopes = _slopes("heads", 2, 4)

    def run():
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = flash_attn_func(*leaves, causal=True, alibi_slopes=slopes, deterministic=True)
        return _grads(out, dout, *leaves)

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize("config", [TileConfig(16, 64, 4, 1), TileConfig(64, 16, 4, 1)],
                         ids=["16x64", "64x16"])
@pytest.mark.parametrize("case", ["causal", "window-gqa", "varlen"])
def test_tile_sizes(config, case, tile_override):
    tile_override("fwd", config)
    tile_override("bwd", config)
    if case == "causal":
        check_case(b=1, sq=113, sk=203, h=2, hk=1, d=64, causal=True, softcap=3.0)
    elif case == "window-gqa":
        check_case(b=1, sq=203, sk=113, h=4, hk=2, d=80, dtype=BF16, window_size=(7, 3), alibi="heads")
    else:
        lens_q, lens_k = [37, 0, 100, 17], [61, 5, 64, 3]
        res = _varlen_run(lens_q, lens_k, 2, 1, 32, FP16, dict(causal=True))
        _varlen_check(res, lens_q, lens_k, dict(window=(-1, 0)))


def test_tile_override_is_used(tile_override):
    # the override really reaches the kernels: a different tiling changes the rounding, not the maths
    q, k, v, _ = _inputs(1, 100, 100, 2, 2, 64, FP16)
    base = flash_attn_func(q, k, v, causal=True)
    tile_override("fwd", TileConfig(16, 16, 4, 1))
    tiled = flash_attn_func(q, k, v, causal=True)
    assert max_err(base, tiled) < 5e-3


# ----------------------------------------------------------------------------------------------
# forward through tensor descriptors (TMA)
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["causal-gqa", "window-alibi-softcap-bf16", "dropout", "rows-without-keys",
                                  "seq-slice"])
def test_tma_forward(case, tile_override):
    """``dispatch.prefer_tma(True)``: K/V loads through tensor descriptors. The result must equal the
    pointer kernel's bit for bit (same tiles, same arithmetic) and pass the oracle check."""
    kw = {}
    if case == "causal-gqa":
        b, sq, sk, h, hk, d, dtype, kw = 2, 113, 203, 4, 2, 64, FP16, dict(causal=True)
    elif case == "window-alibi-softcap-bf16":
        b, sq, sk, h, hk, d, dtype = 2, 150, 97, 2, 1, 128, BF16
        kw = dict(window_size=(20, 5), softcap=3.0, alibi_slopes=_slopes("batch_heads", 2, 2))
    elif case == "dropout":
        b, sq, sk, h, hk, d, dtype, kw = 1, 77, 100, 2, 1, 32, FP16, dict(dropout_p=0.2, causal=True)
    elif case == "rows-without-keys":
        b, sq, sk, h, hk, d, dtype, kw = 2, 70, 40, 2, 1, 16, FP16, dict(causal=True)
    else:
        b, sq, sk, h, hk, d, dtype = 2, 64, 90, 2, 2, 64, BF16
    q, k, v, dout = _inputs(b, sq, sk, h, hk, d, dtype)
    if case == "seq-slice":  # a view with 16-byte aligned strides, not contiguous
        k = _randn(b, sk + 16, hk, d, dtype=dtype)[:, 8:8 + sk]
        v = _randn(b, sk, 2 * hk, d, dtype=dtype)[:, :, hk:]
        assert not k.is_contiguous() and not v.is_contiguous()
    # the same tiles on both paths (the plan picks short causal calls' tiles by path on a GPU: another
    # row-sum order, so an lse one ulp apart)
    tile_override("fwd", dispatch.tiles("fwd", d, q.device, tma=True))
    with dispatch.prefer_tma(True):
        assert dispatch.fwd_uses_tma(k, v, varlen=False), "the case must take the descriptor path"
        torch.manual_seed(5)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out, lse, _ = flash_attn_func(*leaves, return_attn_probs=True, **kw)
        grads = _grads(out, dout, *leaves)
    with dispatch.prefer_tma(False):
        assert not dispatch.fwd_uses_tma(k, v, varlen=False)
        torch.manual_seed(5)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out_p, lse_p, _ = flash_attn_func(*leaves, return_attn_probs=True, **kw)
        grads_p = _grads(out_p, dout, *leaves)
    assert torch.equal(out, out_p) and torch.equal(lse, lse_p)
    for g, gp in zip(grads, grads_p):
        assert torch.equal(g, gp)
    if "dropout_p" not in kw:
        window = _norm_window(kw.get("window_size", (-1, -1)), kw.get("causal", False))
        oracles = attention_oracles(q, k, v, dout, window=window, softcap=kw.get("softcap", 0.0),
                                    alibi_slopes=kw.get("alibi_slopes"))
        assert_matches_oracles(f"tma {case}", out, grads, oracles)
        assert_lse_close(f"tma {case}", lse, oracles["lse64"].float())


def test_tma_not_used_when_unsupported():
    q, k, v, _ = _inputs(1, 8, 8, 2, 2, 59, FP16)  # rows of 118 bytes: strides not 16-byte aligned
    with dispatch.prefer_tma(True):
        assert not dispatch.fwd_uses_tma(k, v, varlen=False)
        assert not dispatch.fwd_uses_tma(k.flatten(0, 1), v.flatten(0, 1), varlen=True)
        q1, k1, v1, _ = _inputs(1, 8, 8, 2, 2, 1, FP16)  # 2-byte rows
        assert not dispatch.fwd_uses_tma(k1, v1, varlen=False)
        out = flash_attn_func(q, k, v)
    assert torch.equal(out, flash_attn_func(q, k, v))


# ----------------------------------------------------------------------------------------------
# property test
# ----------------------------------------------------------------------------------------------

@st.composite
def _problems(draw):
    causal = draw(st.booleans())
    window = draw(st.sampled_from([(-1, -1), "random"]))
    if window == "random":
        window = (draw(st.integers(-1, 60)), draw(st.integers(-1, 60)))
    return dict(
        b=draw(st.integers(1, 2)),
        sq=draw(st.integers(1, 150)),
        sk=draw(st.integers(1, 150)),
        hk=draw(st.sampled_from([1, 2])),
        group=draw(st.sampled_from([1, 2, 3])),
        d=draw(st.sampled_from([8, 16, 40, 64, 96, 128])),
        causal=causal,
        window=window,
        softcap=draw(st.sampled_from([0.0, 3.0])),
        dtype=draw(st.sampled_from([FP16, BF16])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


# derandomize: the same 15 problems on every run. Random draws occasionally land on tiny problems
# whose rows see only 1-3 keys (e.g. seqlens 1 x 2), where the FA2 backward is known to exceed the
# 2x criterion (see test_backward_precision_rows_with_few_keys); that known limitation would make a
# randomised run flaky. To explore new problems, set derandomize=False and pass --hypothesis-seed.
@settings(max_examples=15, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pb=_problems())
def test_property(pb):
    torch.manual_seed(pb["seed"])
    check_case(b=pb["b"], sq=pb["sq"], sk=pb["sk"], h=pb["hk"] * pb["group"], hk=pb["hk"], d=pb["d"],
               dtype=pb["dtype"], causal=pb["causal"], window_size=pb["window"], softcap=pb["softcap"])


def test_tma_tiles_table():
    """The descriptor forward takes its own tiles where the device A/B says so, else the table's."""
    cuda = torch.device("cuda")  # a device object only: nothing runs
    tiles = dispatch.tiles
    assert tiles("fwd", 64, cuda, seqlen_q=8192, tma=True) == dispatch._FWD_TILES_TMA[64]
    assert tiles("fwd", 64, cuda, seqlen_q=8192, masked_right=True, tma=True) == dispatch._FWD_TILES_TMA[64]
    assert tiles("fwd", 64, cuda, seqlen_q=4096, masked_right=True, tma=True) == dispatch._FWD_TMA_CAUSAL_SHORT
    # a sliding window bounded on both sides: its width judged as a causal call's length
    assert tiles("fwd", 64, cuda, seqlen_q=16384, masked_right=True, tma=True, band=1025) == \
        dispatch._FWD_TMA_CAUSAL_SHORT
    assert tiles("fwd", 64, cuda, seqlen_q=16384, masked_right=True, tma=True, band=8193) == dispatch._FWD_TILES_TMA[64]
    assert tiles("fwd", 128, cuda, seqlen_q=16384, masked_right=True, tma=True, band=257) == dispatch._FWD_TILES_TMA[128]
    assert tiles("fwd", 128, cuda, seqlen_q=512, tma=True) == dispatch._FWD_TILES_TMA[128]
    assert tiles("fwd", 64, cuda, seqlen_q=4096) == dispatch._FWD_TILES[64]  # pointer loads: the table
    assert tiles("fwd", 128, cuda, seqlen_q=4096) == dispatch._FWD_TILES[128]
    assert tiles("fwd", 256, cuda, seqlen_q=4096, tma=True) == dispatch._FWD_TILES[256]


