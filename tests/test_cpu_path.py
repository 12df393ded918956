"""The CPU path without Triton (``ioattn.kernels.cpu``): both of its routes against the float64
oracle, forward and backward, and that calls take the route they should.

TRITON_INTERPRET is unset for every test here, so CPU tensors reach the CPU path through the
default dispatch, as they do for a user without a GPU."""
from __future__ import annotations

import pytest
import torch

from conftest import (_PoisonedTorch, assert_lse_close, assert_matches_oracles, assert_varlen_sequences,
                      attention_oracles, max_err)
from ioattn import flash_attn_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from ioattn.plan import dispatch
from ioattn.kernels import cpu
from ioattn.masks import keep_mask
from ioattn.reference.philox import dropout_keep_mask

import ioattn.autograd  # noqa: F401  (registers torch.ops.ioattn.*)

FP32, BF16 = torch.float32, torch.bfloat16
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def cpu_path(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not dispatch.use_triton(torch.device("cpu"))


class _Calls(dict):
    bwd_dtypes: list

    def __init__(self, **counts):
        super().__init__(**counts)
        self.bwd_dtypes = []


@pytest.fixture
def aten_calls(monkeypatch):
    """Counts the fused kernel's forward and backward calls, and those given a mask:
    {'fwd': n, 'bwd': n, 'masked': n}; ``calls.bwd_dtypes`` lists the dtype of each backward call."""
    calls = _Calls(fwd=0, bwd=0, masked=0)
    real_fwd, real_bwd = cpu._aten_fwd, cpu._aten_bwd

    def fwd(*args, **kwargs):
        calls["fwd"] += 1
        calls["masked"] += kwargs.get("attn_mask") is not None
        return real_fwd(*args, **kwargs)

    def bwd(*args, **kwargs):
        calls["bwd"] += 1
        calls.bwd_dtypes.append(args[1].dtype)
        calls["masked"] += kwargs.get("attn_mask") is not None
        return real_bwd(*args, **kwargs)

    monkeypatch.setattr(cpu, "_aten_fwd", fwd)
    monkeypatch.setattr(cpu, "_aten_bwd", bwd)
    return calls


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty / empty_like inside ioattn.kernels.cpu return NaN: unwritten outputs show."""
    monkeypatch.setattr(cpu, "torch", _PoisonedTorch("torch"))


@pytest.fixture
def small_blocks(monkeypatch):
    """Query blocks of 16 rows on the masked and tiled routes, so that the test shapes cross many."""
    monkeypatch.setattr(cpu, "MAX_BLOCK_M", 16)
    monkeypatch.setattr(cpu, "MASKED_BLOCK_M", 16)


def _inputs(b, sq, sk, h, hk, d, dtype):
    return (torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype),
            torch.randn(b, sk, hk, d, dtype=dtype), torch.randn(b, sq, h, d, dtype=dtype))


def _leaves(*xs):
    return [x.clone().requires_grad_() for x in xs]


def _slopes(shape):
    return (torch.rand(*shape) * 0.5 + 0.05).to(torch.bfloat16).float()


def _cu(lens):
    return torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)


def _check(case, dtype, route, b=2, lse_atol=1e-4):
    """Run ``case`` on ``route`` and compare out, lse and grads with the float64 oracle."""
    q, k, v, dout = _inputs(b, case["sq"], case["sk"], case["h"], case["hk"], case["d"], dtype)
    slopes = _slopes(case["alibi"]) if case.get("alibi") else None
    window, causal, softcap = case.get("window", (-1, -1)), case.get("causal", False), case.get("softcap", 0.0)
    qg, kg, vg = _leaves(q, k, v)
    with cpu.forced_route(route):
        out, lse, _ = flash_attn_func(qg, kg, vg, causal=causal, window_size=window, softcap=softcap,
                                      alibi_slopes=slopes, return_attn_probs=True)
        grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    ref_window = (window[0], 0 if causal else window[1])
    oracles = attention_oracles(q, k, v, dout, window=ref_window, softcap=softcap, alibi_slopes=slopes)
    assert_matches_oracles(f"{route} {case}", out, grads, oracles)
    assert_lse_close(f"{route} {case} lse", lse, oracles["lse64"].float(), atol=lse_atol)
    empty = ~keep_mask(case["sq"], case["sk"], ref_window).any(dim=1)
    assert (out[:, empty] == 0).all() and (grads[0][:, empty] == 0).all()
    return out, lse


# ----------------------------------------------------------------------------------------------
# the cases PyTorch's fused kernel covers, on both routes
# ----------------------------------------------------------------------------------------------

KERNEL_CASES = [
    dict(sq=150, sk=150, h=4, hk=4, d=64),
    dict(sq=130, sk=130, h=4, hk=2, d=32, causal=True),
    dict(sq=90, sk=200, h=4, hk=1, d=48, causal=True),  # bottom-right: a plain and a causal piece
    dict(sq=200, sk=90, h=2, hk=2, d=64, causal=True),  # the first 110 rows see no key
    dict(sq=70, sk=333, h=2, hk=1, d=128),
    dict(sq=60, sk=80, h=2, hk=2, d=16, window=(500, 90)),  # a window wider than the sequences
    dict(sq=1, sk=70, h=2, hk=1, d=16, causal=True),
]


def _case_id(c):
    extra = "".join(f"-{k}{c[k]}" for k in ("causal", "window", "softcap", "alibi") if c.get(k))
    return f"{c['sq']}x{c['sk']}-h{c['h']}/{c['hk']}-d{c['d']}{extra}"


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", KERNEL_CASES, ids=_case_id)
def test_kernel_route_matches_oracle(case, dtype, aten_calls, poisoned):
    _check(case, dtype, "aten")
    assert aten_calls["fwd"] > 0 and aten_calls["bwd"] > 0 and aten_calls["masked"] == 0


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", KERNEL_CASES, ids=_case_id)
def test_tiled_route_matches_oracle_on_kernel_cases(case, dtype, aten_calls, small_blocks, poisoned):
    _check(case, dtype, "tiled")
    assert aten_calls == {"fwd": 0, "bwd": 0, "masked": 0}


def test_fp16_kernel_route(aten_calls):
    _check(dict(sq=100, sk=140, h=4, hk=2, d=32, causal=True), torch.float16, "aten")
    assert aten_calls["fwd"] == 2 and aten_calls["bwd"] >= 2  # two pieces each


@pytest.mark.parametrize("window", [(-1, -1), (20, 3)], ids=["whole", "masked"])
def test_bf16_forward_with_kv_copies(window, monkeypatch, aten_calls):
    # long sequences hand the reduced-precision kernel contiguous copies of K and V
    monkeypatch.setattr(cpu, "KV_COPY_MIN_KEYS", 1)
    _check(dict(sq=70, sk=90, h=4, hk=2, d=32, window=window), BF16, "aten")
    assert aten_calls["fwd"] > 0


def test_bf16_causal_backward_runs_in_float32(aten_calls):
    # PyTorch's kernel adds every block's gradient into a bfloat16 buffer; with a causal mask at this
    # length that gives dv about 3.5x the error of plain bfloat16 attention. The route must not.
    _check(dict(sq=2048, sk=2048, h=2, hk=2, d=64, causal=True), BF16, "aten", b=1)
    assert aten_calls.bwd_dtypes and set(aten_calls.bwd_dtypes) == {FP32}


@pytest.mark.parametrize("dtype", [BF16, torch.float16], ids=["bf16", "fp16"])
def test_reduced_precision_backward_without_mask_runs_in_its_dtype(dtype, aten_calls):
    # without a causal mask the kernel's own reduced-precision backward stays within the bound
    # (docs/decisions/cpu-path.md), at the length where the causal one does not
    _check(dict(sq=2048, sk=2048, h=2, hk=1, d=64), dtype, "aten", b=1)
    assert aten_calls.bwd_dtypes == [dtype]


# ----------------------------------------------------------------------------------------------
# windows and ALiBi: the kernel's additive mask, block by block (and the tiled route's own)
# ----------------------------------------------------------------------------------------------

MASKED_CASES = [
    dict(sq=150, sk=150, h=4, hk=1, d=80, window=(16, 7)),
    dict(sq=97, sk=130, h=2, hk=1, d=128, causal=True, window=(30, -1), alibi=(2,)),
    dict(sq=130, sk=64, h=4, hk=4, d=32, window=(-1, 5), alibi=(2, 4)),
    dict(sq=100, sk=20, h=2, hk=1, d=16, window=(3, 0)),  # rows 0..76 (whole blocks) see no key
    dict(sq=64, sk=64, h=2, hk=2, d=16, window=(0, 0)),  # the diagonal alone
    dict(sq=80, sk=120, h=2, hk=2, d=16, window=(5, 2), alibi=(2, 2)),
    dict(sq=90, sk=90, h=4, hk=2, d=32, alibi=(4,)),  # ALiBi alone
]


@pytest.mark.parametrize("route", ["aten", "tiled"])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", MASKED_CASES, ids=_case_id)
def test_windows_and_alibi(case, dtype, route, aten_calls, small_blocks, poisoned):
    _check(case, dtype, route)
    if route == "aten":
        assert aten_calls["fwd"] > 0 and aten_calls["bwd"] > 0
        assert aten_calls["masked"] == aten_calls["fwd"] + aten_calls["bwd"]
    else:
        assert aten_calls == {"fwd": 0, "bwd": 0, "masked": 0}


# ----------------------------------------------------------------------------------------------
# what only the tiled route computes: softcap, dropout
# ----------------------------------------------------------------------------------------------

SOFTCAP_CASES = [
    dict(sq=150, sk=150, h=4, hk=1, d=80, window=(16, 7), softcap=3.0),
    dict(sq=130, sk=64, h=4, hk=4, d=32, window=(-1, 5), softcap=2.0, alibi=(2, 4)),
    dict(sq=90, sk=200, h=4, hk=2, d=32, causal=True, softcap=30.0),
    dict(sq=100, sk=20, h=2, hk=1, d=16, window=(3, 0), softcap=5.0),
]


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", SOFTCAP_CASES, ids=_case_id)
def test_softcap(case, dtype, aten_calls, small_blocks, poisoned):
    # asked for the kernel, these still run tiled: the kernel has no softcap
    _check(case, dtype, "aten")
    assert aten_calls == {"fwd": 0, "bwd": 0, "masked": 0}


def test_tiled_route_default_blocks():
    # the default block size (one block at these lengths) and the in-place softmax on it
    _check(SOFTCAP_CASES[0], FP32, "tiled")
    _check(MASKED_CASES[1], FP32, "tiled")


def _dropout_run(q, k, v, dout, p, causal, softcap, slopes, cu_q=None, cu_k=None, max_lens=None):
    """Forward and backward through the ops, returning the seed the forward drew."""
    sq, sk = max_lens or (q.shape[1], k.shape[1])
    args = (cu_q, cu_k, sq, sk, q.shape[-1] ** -0.5, -1, 0 if causal else -1, softcap, slopes, p)
    out, lse, rng = torch.ops.ioattn.fwd(q, k, v, *args)
    grads = torch.ops.ioattn.bwd(dout, q, k, v, out, lse, *args, rng)[:3]  # (the fourth: the sinks', none here)
    return out, lse, grads, int(rng[0])


@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_dropout_uses_the_kernels_mask(dtype, small_blocks):
    b, sq, sk, h, hk, d, p = 2, 70, 90, 4, 2, 32, 0.3
    q, k, v, dout = _inputs(b, sq, sk, h, hk, d, dtype)
    slopes = _slopes((h,))
    out, lse, grads, seed = _dropout_run(q, k, v, dout, p, True, 3.0, slopes)
    keep = dropout_keep_mask(seed, p, b, h, sq, sk)
    oracles = attention_oracles(q, k, v, dout, window=(-1, 0), softcap=3.0, alibi_slopes=slopes, dropout_p=p,
                                dropout_keep=keep)
    assert_matches_oracles("dropout", out, grads, oracles)
    assert_lse_close("dropout lse", lse, oracles["lse64"].float(), atol=1e-4)


def test_dropout_varlen_uses_padded_counters():
    lens_q, lens_k, h, d, p = [30, 3, 45, 7], [41, 5, 33, 0], 2, 16, 0.25
    q = torch.randn(sum(lens_q), h, d)
    k, v = torch.randn(sum(lens_k), 1, d), torch.randn(sum(lens_k), 1, d)
    dout = torch.randn_like(q)
    cq, ck = _cu(lens_q), _cu(lens_k)
    out, lse, (dq, dk, dv), seed = _dropout_run(q, k, v, dout, p, False, 0.0, None, cq, ck,
                                                max_lens=(max(lens_q), max(lens_k)))
    keep = dropout_keep_mask(seed, p, len(lens_q), h, max(lens_q), max(lens_k))
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        rq, rk = slice(cq[i].item(), cq[i + 1].item()), slice(ck[i].item(), ck[i + 1].item())
        if lk == 0:
            assert (out[rq] == 0).all() and torch.isneginf(lse[:, rq]).all() and (dq[rq] == 0).all()
            continue
        oracles = attention_oracles(q[rq][None], k[rk][None], v[rk][None], dout[rq][None], dropout_p=p,
                                    dropout_keep=keep[i:i + 1, :, :lq, :lk])
        assert_matches_oracles(f"seq {i}", out[rq][None], (dq[rq][None], dk[rk][None], dv[rk][None]), oracles)


# ----------------------------------------------------------------------------------------------
# varlen, layouts, routing
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("route", ["aten", "tiled"])
@pytest.mark.parametrize("dtype", [FP32, BF16], ids=["fp32", "bf16"])
def test_varlen(route, dtype, aten_calls, poisoned):
    # sequences with more queries than keys, more keys than queries, no keys and no queries
    lens_q, lens_k = [37, 2, 64, 101, 1, 9, 0], [50, 3, 64, 77, 1, 0, 6]
    h, hk, d = 4, 2, 48
    q, k, v = (torch.randn(sum(n), hh, d, dtype=dtype) for n, hh in ((lens_q, h), (lens_k, hk), (lens_k, hk)))
    q = torch.cat([q, torch.randn(3, h, d, dtype=dtype)])  # tokens no sequence owns
    dout = torch.randn_like(q)
    qg, kg, vg = _leaves(q, k, v)
    cq, ck = _cu(lens_q), _cu(lens_k)
    with cpu.forced_route(route):
        out, lse, _ = flash_attn_varlen_func(qg, kg, vg, cq, ck, max(lens_q), max(lens_k), causal=True,
                                             return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert_varlen_sequences(f"{route} varlen", q, k, v, dout, out, lse, (dq, dk, dv), cq, ck, lse_atol=1e-4,
                            window=(-1, 0))
    assert (out[-3:] == 0).all() and torch.isneginf(lse[:, -3:]).all() and (dq[-3:] == 0).all()
    assert (aten_calls["fwd"] > 0) == (route == "aten") and (aten_calls["bwd"] > 0) == (route == "aten")


@pytest.mark.parametrize("softcap", [0.0, 3.0], ids=["masked", "tiled"])
def test_varlen_features(softcap):
    lens_q, lens_k = [37, 2, 64, 9], [50, 3, 64, 0]
    h, hk, d = 4, 2, 16
    slopes = _slopes((len(lens_q), h))
    q, k, v = (torch.randn(sum(n), hh, d) for n, hh in ((lens_q, h), (lens_k, hk), (lens_k, hk)))
    dout = torch.randn_like(q)
    qg, kg, vg = _leaves(q, k, v)
    cq, ck = _cu(lens_q), _cu(lens_k)
    out, lse, _ = flash_attn_varlen_func(qg, kg, vg, cq, ck, max(lens_q), max(lens_k), window_size=(9, 4),
                                         softcap=softcap, alibi_slopes=slopes, return_attn_probs=True)
    grads = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert_varlen_sequences("varlen features", q, k, v, dout, out, lse, grads, cq, ck, lse_atol=1e-4,
                            seq_kw=lambda i: dict(alibi_slopes=slopes[i]), window=(9, 4), softcap=softcap)


@pytest.mark.parametrize("layout", ["qkvpacked", "bhsd-transposed"])
def test_kernel_route_layouts(layout, aten_calls):
    # inputs that are views: the kernel reads them in place, and the outputs have the strides the
    # op's fake implementation promises (those of torch.empty_like)
    b, s, h, d = 2, 50, 4, 32
    if layout == "qkvpacked":
        qkv = torch.randn(b, s, 3, h, d, requires_grad=True)
        out = flash_attn_qkvpacked_func(qkv, causal=True)
        (grad,) = torch.autograd.grad(out.sum(), (qkv,))
        q, k, v = qkv.detach().unbind(2)
        grads = grad.unbind(2)
    else:
        q, k, v = (torch.randn(b, h, s, d).transpose(1, 2) for _ in range(3))
        qg, kg, vg = _leaves(q, k, v)
        out = flash_attn_func(qg, kg, vg, causal=True)
        grads = torch.autograd.grad(out.sum(), (qg, kg, vg))
    assert aten_calls["fwd"] == 1 and aten_calls["bwd"] == 1
    assert out.stride() == torch.empty_like(q).stride()
    oracles = attention_oracles(q, k, v, torch.ones_like(q), window=(-1, 0))
    assert_matches_oracles(layout, out, grads, oracles)


@pytest.mark.parametrize("args", [
    dict(sq=7, sk=9, causal=True, dtype=FP32),
    dict(sq=9, sk=7, causal=True, dtype=BF16),
    dict(sq=7, sk=9, causal=False, dtype=FP32),
], ids=lambda a: f"{a['sq']}x{a['sk']}-causal{int(a['causal'])}-{str(a['dtype'])[6:]}")
def test_opcheck_kernel_route(args, aten_calls):
    # torch.library's checks (fake vs real outputs, strides included) on the kernel route's shapes
    q = torch.randn(2, args["sq"], 4, 16, dtype=args["dtype"])
    k, v = (torch.randn(2, args["sk"], 2, 16, dtype=args["dtype"]) for _ in range(2))
    fwd_args = (q, k, v, None, None, args["sq"], args["sk"], 0.25, -1, 0 if args["causal"] else -1, 0.0, None, 0.0)
    torch.library.opcheck(torch.ops.ioattn.fwd.default, fwd_args)
    out, lse, rng = torch.ops.ioattn.fwd(*fwd_args)
    torch.library.opcheck(torch.ops.ioattn.bwd.default, (torch.randn_like(out), q, k, v, out, lse, *fwd_args[3:], rng))
    assert aten_calls["fwd"] > 0 and aten_calls["bwd"] > 0


@pytest.mark.parametrize("softcap,dropout_p,expected", [
    (0.0, 0.0, "aten"), (1.0, 0.0, "tiled"), (0.0, 0.1, "tiled"), (2.0, 0.5, "tiled")])
def test_route_choice(softcap, dropout_p, expected):
    assert cpu.route(softcap, dropout_p) == expected
    with cpu.forced_route("tiled"):
        assert cpu.route(softcap, dropout_p) == "tiled"


@pytest.mark.parametrize("window,seqlens,whole", [
    ((-1, -1), (100, 100), True),
    ((-1, 0), (50, 100), True),
    ((99, 0), (100, 100), True),  # the left side reaches key 0 from every row
    ((10, 49), (50, 10), True),
    ((98, 0), (100, 100), False),
    ((-1, 1), (100, 100), False),
])
def test_whole_calls(window, seqlens, whole, aten_calls):
    # full and causal windows (once sides that reach past the sequence are dropped) are one
    # unmasked kernel call; others are masked blocks
    q, k, v, _ = _inputs(1, seqlens[0], seqlens[1], 2, 2, 16, FP32)
    flash_attn_func(q, k, v, window_size=window)
    assert aten_calls["fwd"] >= 1 and (aten_calls["masked"] == 0) == whole


def test_default_dispatch_takes_the_kernel(aten_calls):
    # no forced backend or route: plain and causal calls run PyTorch's kernel, forward and backward
    q, k, v, dout = _inputs(1, 64, 64, 2, 2, 16, FP32)
    qg, kg, vg = _leaves(q, k, v)
    for causal in (False, True):
        torch.autograd.grad(flash_attn_func(qg, kg, vg, causal=causal), (qg, kg, vg), dout)
    assert aten_calls == {"fwd": 2, "bwd": 2, "masked": 0}


def test_forced_route_rejects_unknown_name():
    with pytest.raises(ValueError, match="route"):
        with cpu.forced_route("fast"):
            pass


@pytest.mark.parametrize("route", ["aten", "tiled"])
def test_empty_problems(route):
    with cpu.forced_route(route):
        q = torch.randn(2, 0, 2, 16, requires_grad=True)
        k = torch.randn(2, 5, 2, 16, requires_grad=True)
        out, lse, _ = flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
        out.sum().backward()
        assert out.shape == q.shape and lse.shape == (2, 2, 0) and (k.grad == 0).all()
        q2 = torch.randn(2, 4, 2, 16, requires_grad=True)
        out, lse, _ = flash_attn_func(q2, k[:, :0], k[:, :0], return_attn_probs=True)
        out.sum().backward()
        assert (out == 0).all() and torch.isneginf(lse).all() and (q2.grad == 0).all()


def test_tiled_matches_kernel_closely():
    # fp32 on both routes: the same attention up to float32 rounding
    q, k, v, dout = _inputs(2, 120, 150, 4, 2, 32, FP32)
    res = {}
    for route in ("aten", "tiled"):
        qg, kg, vg = _leaves(q, k, v)
        with cpu.forced_route(route):
            out = flash_attn_func(qg, kg, vg, causal=True)
            res[route] = (out, *torch.autograd.grad(out, (qg, kg, vg), dout))
    for name, a, b in zip(("out", "dq", "dk", "dv"), res["aten"], res["tiled"]):
        assert max_err(a, b) < 2e-5, name


def test_other_devices_take_the_tiled_route():
    assert cpu.route(0.0, 0.0, "cuda") == "tiled" and cpu.route(0.0, 0.0, "cpu") == "aten"
    assert "cuda tensors" in cpu.plan(64, 64, (-1, -1), 0.0, False, device_type="cuda")["route"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(softcap=5.0, window_size=(8, 3)), dict(dropout_p=0.2)],
                         ids=["plain", "causal", "softcap-window", "dropout"])
def test_reference_backend_on_cuda_tensors(kw):
    # dispatch.forced_backend("reference") sends CUDA tensors here: the tiled route on their device
    q, k, v, dout = _inputs(2, 45, 61, 4, 2, 32, FP32)
    results = []
    for device in ("cpu", "cuda"):
        leaves = [t.to(device).requires_grad_() for t in (q, k, v)]
        torch.manual_seed(3)  # the same dropout seed
        with dispatch.forced_backend("reference"):
            out = flash_attn_func(*leaves, **kw)
            grads = torch.autograd.grad(out, leaves, dout.to(device))
        assert out.device.type == device
        results.append([t.cpu() for t in (out, *grads)])
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        assert max_err(a, b) < 1e-4, name
