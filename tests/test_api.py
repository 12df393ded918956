"""The public API: argument validation, return conventions, empty problems, and the CPU reference
path (``dispatch.forced_backend("reference")``) against the float64 oracle."""
from __future__ import annotations

import os

import pytest
import torch

from conftest import (assert_lse_close, assert_matches_oracles, assert_varlen_sequences, attention_oracles,
                      max_err)
from ioattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                    flash_attn_varlen_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from ioattn.plan import dispatch
from ioattn.masks import keep_mask

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
# This file uses CPU tensors; they reach the Triton kernels only through the interpreter.
_NO_INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                     reason="CPU tensors run the Triton kernels only under TRITON_INTERPRET=1 "
                                            "(a CUDA machine covers them in test_kernels.py)")
TRITON = pytest.param("triton", marks=_NO_INTERPRETER)
BACKENDS = ["reference", TRITON]


def _inputs(b, sq, sk, h, hk, d, dtype):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype), torch.randn(b, sq, h, d, dtype=dtype))


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _leaves(*xs):
    return [x.clone().requires_grad_() for x in xs]


def _slopes(shape):
    return (torch.rand(*shape) * 0.5 + 0.05).to(torch.bfloat16).float()


# ----------------------------------------------------------------------------------------------
# the CPU reference path against the oracle
# ----------------------------------------------------------------------------------------------

REF_CASES = [
    dict(sq=113, sk=203, h=2, hk=2, d=64, causal=False, window=(-1, -1), softcap=0.0, alibi=None),
    dict(sq=203, sk=113, h=4, hk=2, d=59, causal=True, window=(-1, -1), softcap=0.0, alibi=None),
    dict(sq=150, sk=150, h=4, hk=1, d=80, causal=False, window=(16, 7), softcap=3.0, alibi=None),
    dict(sq=97, sk=130, h=2, hk=1, d=128, causal=True, window=(30, -1), softcap=0.0, alibi=(2,)),
    dict(sq=130, sk=64, h=4, hk=4, d=32, causal=False, window=(-1, 5), softcap=2.0, alibi=(2, 4)),
    dict(sq=90, sk=40, h=2, hk=1, d=16, causal=True, window=(-1, -1), softcap=0.0, alibi=None),
]


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: f"{c['sq']}x{c['sk']}-h{c['h']}/{c['hk']}-d{c['d']}")
def test_reference_path_matches_oracle(case, dtype):
    b = 2
    q, k, v, dout = _inputs(b, case["sq"], case["sk"], case["h"], case["hk"], case["d"], dtype)
    slopes = _slopes(case["alibi"]) if case["alibi"] else None
    qg, kg, vg = _leaves(q, k, v)
    with dispatch.forced_backend("reference"):
        out, lse, _ = flash_attn_func(qg, kg, vg, causal=case["causal"], window_size=case["window"],
                                      softcap=case["softcap"], alibi_slopes=slopes, return_attn_probs=True)
        grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    window = (case["window"][0], 0 if case["causal"] else case["window"][1])
    oracles = attention_oracles(q, k, v, dout, window=window, softcap=case["softcap"], alibi_slopes=slopes)
    assert_matches_oracles(f"reference {case}", out, grads, oracles)
    assert_lse_close("reference lse", lse, oracles["lse64"].float(), atol=1e-4)


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_reference_path_varlen(dtype):
    # (a sequence with no queries is tested separately: test_reference_backward_zero_length_queries)
    lens_q, lens_k = [37, 2, 64, 101, 1, 9], [50, 3, 64, 77, 1, 0]
    h, hk, d = 4, 2, 48
    slopes = _slopes((len(lens_q), h))
    q, k, v = (torch.randn(sum(n), hh, d, dtype=dtype) for n, hh in ((lens_q, h), (lens_k, hk), (lens_k, hk)))
    dout = torch.randn_like(q)
    qg, kg, vg = _leaves(q, k, v)
    cq, ck = _cu(lens_q), _cu(lens_k)
    with dispatch.forced_backend("reference"):
        out, lse, probs = flash_attn_varlen_func(qg, kg, vg, cq, ck, max(lens_q), max(lens_k), causal=True,
                                                 softcap=3.0, alibi_slopes=slopes, return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert lse.shape == (h, sum(lens_q)) and probs.shape == (0,)
    assert_varlen_sequences("reference varlen", q, k, v, dout, out, lse, (dq, dk, dv), cq, ck, lse_atol=1e-4,
                            seq_kw=lambda i: dict(alibi_slopes=slopes[i]), window=(-1, 0), softcap=3.0)


def _run_both(fn, seed):
    """fn() under each backend after the same torch.manual_seed; returns {backend: result}."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors run the Triton kernels only under TRITON_INTERPRET=1")
    results = {}
    for backend in ("reference", "triton"):
        with dispatch.forced_backend(backend):
            torch.manual_seed(seed)
            results[backend] = fn()
    return results


def test_dropout_same_mask_on_both_paths():
    # fp32 on both paths (the Triton kernels use IEEE fp32 dots): the same seed must give the same
    # Philox mask, hence outputs and gradients equal up to fp32 rounding
    q, k, v, dout = _inputs(2, 70, 90, 4, 2, 32, FP32)
    slopes = _slopes((4,))

    def run():
        qg, kg, vg = _leaves(q, k, v)
        out, lse, probs = flash_attn_func(qg, kg, vg, dropout_p=0.3, causal=True, softcap=3.0,
                                          alibi_slopes=slopes, return_attn_probs=True)
        return (out, *torch.autograd.grad(out, (qg, kg, vg), dout)), probs

    res = _run_both(run, seed=31)
    (ref, probs_ref), (tri, probs_tri) = res["reference"], res["triton"]
    assert torch.equal(probs_ref < 0, probs_tri < 0)
    for name, a, b in zip(("out", "dq", "dk", "dv"), ref, tri):
        assert max_err(a, b) < 2e-5, f"{name}: reference and Triton paths disagree ({max_err(a, b):.2e})"
    # and a different seed gives a different output
    with dispatch.forced_backend("reference"):
        torch.manual_seed(32)
        other = flash_attn_func(q, k, v, dropout_p=0.3, causal=True, softcap=3.0, alibi_slopes=slopes)
    assert max_err(other, ref[0]) > 1e-2


def test_dropout_same_mask_on_both_paths_varlen():
    lens_q, lens_k = [30, 3, 45, 7], [41, 5, 33, 0]
    q = torch.randn(sum(lens_q), 2, 16)
    k, v = torch.randn(sum(lens_k), 1, 16), torch.randn(sum(lens_k), 1, 16)
    dout = torch.randn_like(q)

    def run():
        qg, kg, vg = _leaves(q, k, v)
        out = flash_attn_varlen_func(qg, kg, vg, _cu(lens_q), _cu(lens_k), 50, 60, dropout_p=0.25)
        return (out, *torch.autograd.grad(out, (qg, kg, vg), dout))

    res = _run_both(run, seed=77)
    for name, a, b in zip(("out", "dq", "dk", "dv"), res["reference"], res["triton"]):
        assert max_err(a, b) < 2e-5, f"{name}: reference and Triton paths disagree ({max_err(a, b):.2e})"


# ----------------------------------------------------------------------------------------------
# bad input
# ----------------------------------------------------------------------------------------------

def _ok(b=2, sq=8, sk=8, h=4, hk=2, d=16, dtype=FP16):
    q, k, v, _ = _inputs(b, sq, sk, h, hk, d, dtype)
    return q, k, v


def _varlen_ok():
    q = torch.randn(12, 4, 16, dtype=FP16)
    k = torch.randn(10, 2, 16, dtype=FP16)
    v = torch.randn(10, 2, 16, dtype=FP16)
    return dict(q=q, k=k, v=v, cu_seqlens_q=_cu([5, 7]), cu_seqlens_k=_cu([6, 4]), max_seqlen_q=7, max_seqlen_k=6)


def _batched(**over):
    q, k, v = _ok()
    args = dict(q=q, k=k, v=v)
    args.update(over)
    return lambda: flash_attn_func(**args)


def _varlen(**over):
    args = _varlen_ok()
    args.update(over)
    return lambda: flash_attn_varlen_func(**args)


BAD_INPUTS = {
    # name: (call, exception, message regex naming the argument)
    "batch mismatch": (lambda: flash_attn_func(*_ok()[:1], *_ok(b=3)[1:]), ValueError, r"batch size"),
    "head dim mismatch": (lambda: flash_attn_func(_ok(d=32)[0], *_ok(d=16)[1:]), ValueError, r"head dim"),
    "k v shape mismatch": (lambda: flash_attn_func(*_ok()[:2], _ok(sk=9)[2]), ValueError, r"k and v"),
    "nheads not multiple": (lambda: flash_attn_func(_ok(h=3)[0], *_ok(hk=2)[1:]), ValueError,
                            r"multiple of the number of key/value heads"),
    "nheads_kv zero": (lambda: flash_attn_func(_ok()[0], *_ok(hk=0)[1:]), ValueError, r"key/value heads"),
    "dtype differs": (lambda: flash_attn_func(_ok()[0], *_ok(dtype=BF16)[1:]), TypeError, r"share one dtype"),
    "int dtype": (lambda: flash_attn_func(*(torch.ones(1, 4, 2, 16, dtype=torch.int32),) * 3), TypeError,
                  r"^q must be float16, bfloat16, float32 or float8_e4m3fn"),
    "float64": (lambda: flash_attn_func(*(torch.ones(1, 4, 2, 16, dtype=torch.float64),) * 3), TypeError,
                r"^q must be"),
    "head dim 257": (lambda: flash_attn_func(*_ok(d=257)), ValueError, r"head dim must be between 1 and 256"),
    "head dim 0": (lambda: flash_attn_func(*_ok(d=0)), ValueError, r"head dim"),
    "q 3-D": (lambda: flash_attn_func(_ok()[0][0], *_ok()[1:]), ValueError, r"^q must have 4 dimensions"),
    "v 5-D": (lambda: flash_attn_func(*_ok()[:2], _ok()[2][None]), ValueError, r"^v must have 4 dimensions"),
    "q not a tensor": (lambda: flash_attn_func(_ok()[0].tolist(), *_ok()[1:]), TypeError, r"^q must be a torch.Tensor"),
    "varlen q 4-D": (_varlen(q=torch.randn(1, 12, 4, 16, dtype=FP16)), ValueError, r"^q must have 3 dimensions"),
    "cu_seqlens int64": (_varlen(cu_seqlens_q=_cu([5, 7]).long()), TypeError, r"cu_seqlens_q must be int32"),
    "cu_seqlens_k float": (_varlen(cu_seqlens_k=_cu([6, 4]).float()), TypeError, r"cu_seqlens_k must be int32"),
    "cu_seqlens list": (_varlen(cu_seqlens_q=[0, 5, 12]), TypeError, r"cu_seqlens_q must be a torch.Tensor"),
    "cu_seqlens None": (_varlen(cu_seqlens_k=None), ValueError, r"cu_seqlens_q and cu_seqlens_k are required"),
    "cu_seqlens decreasing": (_varlen(cu_seqlens_q=torch.tensor([0, 7, 5], dtype=torch.int32)), ValueError,
                              r"cu_seqlens_q must start at 0 and be non-decreasing"),
    "cu_seqlens not from 0": (_varlen(cu_seqlens_k=torch.tensor([1, 6, 10], dtype=torch.int32)), ValueError,
                              r"cu_seqlens_k must start at 0"),
    "cu_seqlens past total": (_varlen(cu_seqlens_k=_cu([6, 5])), ValueError, r"cu_seqlens_k ends at 11"),
    "cu_seqlens 2-D": (_varlen(cu_seqlens_q=_cu([5, 7])[None]), ValueError, r"cu_seqlens_q must be 1-D"),
    "cu_seqlens one entry": (_varlen(cu_seqlens_q=torch.zeros(1, dtype=torch.int32)), ValueError,
                             r"cu_seqlens_q must be 1-D"),
    "cu_seqlens q vs k length": (_varlen(cu_seqlens_k=_cu([6, 4, 0])), ValueError,
                                 r"cu_seqlens_q and cu_seqlens_k must have the same length"),
    "max_seqlen_q too small": (_varlen(max_seqlen_q=6), ValueError, r"max_seqlen_q=6 is smaller"),
    "max_seqlen_k too small": (_varlen(max_seqlen_k=5), ValueError, r"max_seqlen_k=5 is smaller"),
    "max_seqlen negative": (_varlen(max_seqlen_q=-1), ValueError, r"max_seqlen_q must be an int"),
    "max_seqlen float": (_varlen(max_seqlen_k=6.0), ValueError, r"max_seqlen_k must be an int"),
    "window (-2, 0)": (_batched(window_size=(-2, 0)), ValueError, r"window_size"),
    "window (0, -3) causal": (_batched(window_size=(0, -3), causal=True), ValueError, r"window_size"),
    "window 3 values": (_batched(window_size=(1, 2, 3)), TypeError, r"window_size"),
    "window tensor 3 values": (_batched(window_size=torch.tensor([1, 2, 3])), ValueError, r"window_size"),
    "window int": (_batched(window_size=4), TypeError, r"window_size"),
    "window string": (_batched(window_size="ab"), TypeError, r"window_size"),
    "dropout 1.0": (_batched(dropout_p=1.0), ValueError, r"dropout_p must be in \[0, 1\)"),
    "dropout -0.1": (_batched(dropout_p=-0.1), ValueError, r"dropout_p must be in \[0, 1\)"),
    "dropout nan": (_batched(dropout_p=float("nan")), ValueError, r"dropout_p"),
    "dropout tensor": (_batched(dropout_p=torch.tensor(0.1)), ValueError, r"dropout_p"),
    "alibi wrong shape": (_batched(alibi_slopes=torch.rand(2)), ValueError, r"alibi_slopes must have shape"),
    "alibi batch wrong": (_batched(alibi_slopes=torch.rand(3, 4)), ValueError, r"alibi_slopes must have shape"),
    "alibi kv heads": (_batched(alibi_slopes=torch.rand(2, 2)), ValueError, r"alibi_slopes must have shape"),
    "alibi 3-D": (_batched(alibi_slopes=torch.rand(1, 2, 4)), ValueError, r"alibi_slopes must have shape"),
    "alibi list": (_batched(alibi_slopes=[0.1] * 4), TypeError, r"alibi_slopes must be a tensor"),
    "varlen alibi batch": (_varlen(alibi_slopes=torch.rand(3, 4)), ValueError, r"alibi_slopes must have shape"),
    "softcap negative": (_batched(softcap=-1.0), ValueError, r"softcap must be a finite number >= 0"),
    "softcap inf": (_batched(softcap=float("inf")), ValueError, r"softcap"),
    "softcap nan": (_batched(softcap=float("nan")), ValueError, r"softcap"),
    "softmax_scale inf": (_batched(softmax_scale=float("inf")), ValueError, r"softmax_scale"),
    "softmax_scale nan": (_batched(softmax_scale=float("nan")), ValueError, r"softmax_scale"),
    "softmax_scale string": (_batched(softmax_scale="0.1"), ValueError, r"softmax_scale"),
    "qkvpacked size 4": (lambda: flash_attn_qkvpacked_func(torch.randn(2, 8, 4, 4, 16, dtype=FP16)), ValueError,
                         r"qkv must have 5 dimensions with size 3 in dimension 2"),
    "qkvpacked 2-D": (lambda: flash_attn_qkvpacked_func(torch.randn(2, 8, dtype=FP16)), ValueError,
                      r"^qkv must have 5 dimensions with size 3 in dimension 2"),
    "qkvpacked tuple": (lambda: flash_attn_qkvpacked_func(tuple(_ok())), TypeError, r"^qkv must be a torch.Tensor"),
    "kvpacked size 3": (lambda: flash_attn_kvpacked_func(_ok()[0], torch.randn(2, 8, 3, 2, 16, dtype=FP16)),
                        ValueError, r"kv must have 5 dimensions with size 2 in dimension 2"),
    "varlen qkvpacked size 2": (lambda: flash_attn_varlen_qkvpacked_func(torch.randn(12, 2, 4, 16, dtype=FP16),
                                                                         _cu([5, 7]), 7),
                                ValueError, r"qkv must have 4 dimensions with size 3 in dimension 1"),
    "varlen kvpacked size 3": (lambda: flash_attn_varlen_kvpacked_func(torch.randn(12, 4, 16, dtype=FP16),
                                                                       torch.randn(10, 3, 2, 16, dtype=FP16),
                                                                       _cu([5, 7]), _cu([6, 4]), 7, 6),
                               ValueError, r"kv must have 4 dimensions with size 2 in dimension 1"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS), ids=lambda c: c.replace(" ", "-"))
def test_bad_input_raises(case):
    call, exc, pattern = BAD_INPUTS[case]
    with pytest.raises(exc, match=pattern):
        call()


@pytest.mark.skip(reason="inputs on two different devices need a GPU; this machine has none "
                         "(the check is ioattn.api._check_qkv's device comparison)")
def test_different_devices_raise():
    pass


def test_refused_call_leaves_inputs_untouched():
    q, k, v = (x.requires_grad_() for x in _ok())
    slopes = torch.rand(4)
    before = [x.detach().clone() for x in (q, k, v, slopes)]
    for bad in (dict(dropout_p=1.0), dict(window_size=(-2, 0)), dict(alibi_slopes=torch.rand(3)),
                dict(softcap=-2.0)):
        kwargs = dict(alibi_slopes=slopes)
        kwargs.update(bad)
        with pytest.raises((ValueError, TypeError)):
            flash_attn_func(q, k, v, **kwargs)
    with pytest.raises(ValueError):
        flash_attn_func(q, k, v[:, :-1], alibi_slopes=slopes)
    for x, b in zip((q, k, v, slopes), before):
        assert torch.equal(x.detach(), b) and x.grad is None
    args = _varlen_ok()
    cu = torch.tensor([0, 7, 5], dtype=torch.int32)
    saved = {n: t.clone() for n, t in args.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(ValueError):
        flash_attn_varlen_func(**dict(args, cu_seqlens_q=cu))
    assert torch.equal(cu, torch.tensor([0, 7, 5], dtype=torch.int32))
    for n, t in saved.items():
        assert torch.equal(args[n], t), n


def test_forced_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="backend"):
        with dispatch.forced_backend("cuda"):
            pass


# ----------------------------------------------------------------------------------------------
# return conventions
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
def test_return_conventions(backend):
    b, sq, sk, h, hk, d = 2, 37, 45, 4, 2, 16
    q, k, v, _ = _inputs(b, sq, sk, h, hk, d, FP16)
    with dispatch.forced_backend(backend):
        out = flash_attn_func(q, k, v)
        assert isinstance(out, torch.Tensor) and out.shape == q.shape and out.dtype == FP16
        res = flash_attn_func(q, k, v, causal=True, window_size=(8, -1), return_attn_probs=True)
        _, _, probs = flash_attn_func(q, k, v, causal=True, window_size=(8, -1), return_attn_probs=True,
                                      dropout_p=0.3)
    assert isinstance(res, tuple) and len(res) == 3
    out, lse, no_probs = res
    # as flash-attn: the N x N matrix only comes back with dropout, an empty tensor without
    assert no_probs.shape == (0,) and no_probs.dtype == FP16
    assert out.shape == q.shape and out.dtype == FP16
    assert lse.shape == (b, h, sq) and lse.dtype == torch.float32
    # flash-attn's S_dmask layout: lengths rounded up to 128, zero padding
    assert probs.shape == (b, h, 128, 128) and probs.dtype == FP16
    assert (probs[:, :, sq:] == 0).all() and (probs[..., sk:] == 0).all()
    probs = probs[:, :, :sq, :sk]
    keep = keep_mask(sq, sk, (8, 0))
    assert (probs[..., ~keep] == 0).all()
    assert (probs < 0).any() and (probs > 0).any()  # dropped entries negated, kept ones positive
    # d = 16: one key block (128 wide) covers every key, so each row is exp(s - the row's max)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double().repeat_interleave(h // hk, 2)) / d ** 0.5
    s = s.masked_fill(~keep, float("-inf"))
    assert max_err(probs.abs(), torch.exp(s - s.amax(-1, keepdim=True))) < 2e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_conventions_varlen(backend):
    lens = [5, 0, 9]
    h, d = 2, 16
    q, k, v = (torch.randn(sum(lens), h, d, dtype=BF16) for _ in range(3))
    with dispatch.forced_backend(backend):
        res = flash_attn_varlen_func(q, k, v, _cu(lens), _cu(lens), 9, 9, return_attn_probs=True)
        res_packed = flash_attn_varlen_qkvpacked_func(torch.stack([q, k, v], 1), _cu(lens), 9,
                                                      return_attn_probs=True)
    for r in (res, res_packed):
        assert isinstance(r, tuple) and len(r) == 3
        out, lse, probs = r
        assert out.shape == q.shape and out.dtype == BF16
        assert lse.shape == (h, sum(lens)) and lse.dtype == torch.float32 and torch.isfinite(lse).all()
        assert probs.shape == (0,)
    assert torch.equal(res[0], res_packed[0]) and torch.equal(res[1], res_packed[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_return_probs(backend):
    qkv = torch.randn(1, 20, 3, 2, 16, dtype=FP16)
    with dispatch.forced_backend(backend):
        torch.manual_seed(7)
        out, lse, probs = flash_attn_qkvpacked_func(qkv, causal=True, return_attn_probs=True, dropout_p=0.1)
        torch.manual_seed(7)
        out2, lse2, probs2 = flash_attn_kvpacked_func(qkv[:, :, 0], qkv[:, :, 1:], causal=True,
                                                      return_attn_probs=True, dropout_p=0.1)
    assert torch.equal(out, out2) and torch.equal(lse, lse2) and torch.equal(probs, probs2)
    assert probs.shape == (1, 2, 128, 128)


def test_lse_gradient_is_not_propagated():
    # flash-attn convention: lse is returned for inspection; a loss through it gets no gradient
    # through the kernel (documented here so a change of behaviour is noticed)
    q, k, v = _leaves(*_ok(b=1, sq=6, sk=6, h=2, hk=2, d=16, dtype=FP32))
    with dispatch.forced_backend("reference"):
        _, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
        lse.sum().backward()
    assert all(x.grad is None or (x.grad == 0).all() for x in (q, k, v))


BACKENDS_EMPTY_Q = ["reference", TRITON]


# ----------------------------------------------------------------------------------------------
# empty problems
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [FP16, FP32], ids=["fp16", "fp32"])
def test_seqlen_k_zero(backend, dtype):
    q, k, v, dout = _inputs(2, 7, 0, 4, 2, 16, dtype)
    qg, kg, vg = _leaves(q, k, v)
    with dispatch.forced_backend(backend):
        out, lse, probs = flash_attn_func(qg, kg, vg, causal=True, return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert out.shape == q.shape and (out == 0).all()
    assert lse.shape == (2, 4, 7) and torch.isneginf(lse).all()
    assert probs.shape == (0,)
    assert (dq == 0).all() and dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("backend", BACKENDS_EMPTY_Q)
def test_seqlen_q_zero(backend):
    q, k, v, dout = _inputs(2, 0, 9, 2, 2, 16, FP16)
    qg, kg, vg = _leaves(q, k, v)
    with dispatch.forced_backend(backend):
        out, lse, _ = flash_attn_func(qg, kg, vg, return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert out.shape == q.shape and lse.shape == (2, 2, 0)
    assert (dk == 0).all() and (dv == 0).all()


@pytest.mark.parametrize("backend", BACKENDS_EMPTY_Q)
def test_varlen_with_empty_sequences(backend):
    lens_q, lens_k = [0, 6, 4, 0], [3, 0, 5, 0]
    h, d = 2, 16
    q = torch.randn(sum(lens_q), h, d, dtype=FP16)
    k, v = torch.randn(sum(lens_k), h, d, dtype=FP16), torch.randn(sum(lens_k), h, d, dtype=FP16)
    dout = torch.randn_like(q)
    qg, kg, vg = _leaves(q, k, v)
    with dispatch.forced_backend(backend):
        out, lse, _ = flash_attn_varlen_func(qg, kg, vg, _cu(lens_q), _cu(lens_k), 6, 5, return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    # sequence 1 has queries but no keys; sequence 0 has keys but no queries
    assert (out[:6] == 0).all() and torch.isneginf(lse[:, :6]).all() and (dq[:6] == 0).all()
    assert (dk[:3] == 0).all() and (dv[:3] == 0).all()
    oracles = attention_oracles(q[6:][None], k[3:][None], v[3:][None], dout[6:][None])
    assert_matches_oracles("varlen seq 2", out[6:][None], (dq[6:][None], dk[3:][None], dv[3:][None]), oracles)


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_all_empty(backend):
    q = torch.randn(0, 2, 16, dtype=FP16)
    cu = _cu([0, 0])
    with dispatch.forced_backend(backend):
        out, lse, _ = flash_attn_varlen_func(q, q, q, cu, cu, 0, 0, return_attn_probs=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)


@pytest.mark.parametrize("backend", BACKENDS_EMPTY_Q)
def test_batch_zero(backend):
    q = torch.randn(0, 5, 2, 16, dtype=FP16, requires_grad=True)
    with dispatch.forced_backend(backend):
        out, lse, _ = flash_attn_func(q, q, q, causal=True, return_attn_probs=True)
        out.sum().backward()
    assert out.shape == q.shape and lse.shape == (0, 2, 5) and q.grad.shape == q.shape


def test_reference_backward_zero_length_queries():
    # the CPU default path: a varlen batch where one sequence has keys but no queries
    lens_q, lens_k = [4, 0, 3], [5, 2, 3]
    q = torch.randn(sum(lens_q), 2, 16, requires_grad=True)
    k, v = (torch.randn(sum(lens_k), 2, 16, requires_grad=True) for _ in range(2))
    with dispatch.forced_backend("reference"):
        out = flash_attn_varlen_func(q, k, v, _cu(lens_q), _cu(lens_k), 4, 5)
        out.sum().backward()
    assert (k.grad[5:7] == 0).all() and torch.isfinite(q.grad).all()


def test_qkvpacked_wrong_ndim_names_qkv():
    with pytest.raises(ValueError, match=r"^qkv"):
        flash_attn_qkvpacked_func(torch.randn(2, 8, 3, dtype=FP16))


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_dropout_probs_give_the_mask(backend):
    """Varlen S_dmask: each sequence's block is padded, and its negated entries are the dropout mask the
    kernel applied: the output recomputed from that mask matches."""
    from ioattn.reference import attention_ref

    lens_q, lens_k = [7, 12], [9, 12]
    h, d, p = 2, 16, 0.25
    q = torch.randn(sum(lens_q), h, d, dtype=torch.float32)
    k, v = (torch.randn(sum(lens_k), h, d, dtype=torch.float32) for _ in range(2))
    cq, ck = _cu(lens_q), _cu(lens_k)
    with dispatch.forced_backend(backend):
        out, _, probs = flash_attn_varlen_func(q, k, v, cq, ck, 7 + 5, 12, dropout_p=p, causal=True,
                                               return_attn_probs=True)
    assert probs.shape == (2, h, 128, 128)  # max_seqlen_q/k rounded up to 128, as flash-attn
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        assert (probs[i, :, lq:] == 0).all() and (probs[i, :, :, lk:] == 0).all()  # padding
        # one key block covers the sequence: each row is exp(s - its max), so its largest entry is 1
        # (lk >= lq: every row sees a key)
        row_max = probs[i, :, :lq, :lk].abs().amax(-1)
        assert torch.allclose(row_max, torch.ones_like(row_max))
        keep = probs[i:i + 1, :, :lq, :lk] >= 0
        ref, _ = attention_ref(q[cq[i]:cq[i + 1]][None], k[ck[i]:ck[i + 1]][None], v[ck[i]:ck[i + 1]][None],
                               window=(-1, 0), dropout_p=p, dropout_keep=keep)
        assert (out[cq[i]:cq[i + 1]].double() - ref[0]).abs().max() < 1e-4
