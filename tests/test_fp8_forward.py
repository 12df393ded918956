"""The FP8 (e4m3) forward: ``flash_attn_func`` / ``flash_attn_varlen_func`` with e4m3 q, k, v and
their descales, against float64 attention of the dequantised inputs.

The bound is derived, per output element: the kernel quantises P (times ``P_SCALE``) to e4m3, whose
3 mantissa bits round within 2^-4 relative, or within 2^-10 absolute in the subnormals (2^-18 in P's
units); the sum l is exact fp32. So |o_kernel - o| <= sum_j max(2^-4 p_j, 2^-18) |v_j| / l, plus
the bf16 output's rounding (2^-8 |o|) and fp32 slack. A kernel that skipped a descale or dropped a
key would break it by orders of magnitude.
"""
import dataclasses

import pytest
import torch

import ioattn
from ioattn.plan import dispatch
from ioattn.reference import fp8 as ref8
from ioattn.reference.naive import attention_ref

F64 = torch.float64
CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"


def _inputs(b, sq, sk, h, h_kv, d, granularity="head", seed=0, varlen=False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, generator=g, dtype=F64) for s, n in ((sq, h), (sk, h_kv), (sk, h_kv)))
    quant = [ref8.quantize_fp8_ref(t, granularity) for t in (q, k, v)]
    return [(t.to(DEV), s.to(DEV)) for t, s in quant]


def _bound(qd, kd, vd, window, scale=None, softcap=0.0):
    """(exact output, per-element bound) of float64 attention over the dequantised inputs."""
    group = qd.shape[2] // kd.shape[2]
    kd, vd = (t.repeat_interleave(group, dim=2) for t in (kd, vd))
    scale = qd.shape[-1] ** -0.5 if scale is None else scale
    s = torch.einsum("bqhd,bkhd->bhqk", qd, kd) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    sq, sk = s.shape[-2:]
    i, j = torch.arange(sq)[:, None] + (sk - sq), torch.arange(sk)[None, :]
    keep = torch.ones(sq, sk, dtype=torch.bool)
    if window[0] >= 0:
        keep &= j >= i - window[0]
    if window[1] >= 0:
        keep &= j <= i + window[1]
    s = s.masked_fill(~keep.to(s.device), float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True).nan_to_num(neginf=0.0))
    l = p.sum(-1, keepdim=True).clamp(min=1e-300)
    out = torch.einsum("bhqk,bkhd->bqhd", p / l, vd)
    dp = torch.maximum(p * 2.0 ** -4, torch.full_like(p, 2.0 ** -18)) * keep.to(p.device)
    err = torch.einsum("bhqk,bkhd->bqhd", dp / l, vd.abs())
    return out, err + 2.0 ** -8 * out.abs() + 1e-5


def _dequant(pairs):
    return [ref8.dequantize_fp8_ref(t.cpu(), s.cpu()) for t, s in pairs]


def _check(out, exact, bound, dtype=torch.bfloat16):
    assert out.dtype == dtype and not out.isnan().any()
    excess = ((out.cpu().double() - exact).abs() - bound).max().item()
    assert excess <= 0, f"over the FP8 bound by {excess:.3g}"


@pytest.mark.interpreter
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 64, 80, 4, 2, 32), (1, 33, 17, 2, 2, 64), (1, 70, 130, 2, 1, 40)])
def test_fp8_forward_within_the_e4m3_bound(shape, causal, poison_alloc):
    b, sq, sk, h, h_kv, d = shape
    pairs = _inputs(*shape, seed=sum(shape))
    out = ioattn.flash_attn_func(*(t for t, _ in pairs), causal=causal, q_descale=pairs[0][1],
                                 k_descale=pairs[1][1], v_descale=pairs[2][1])
    exact, bound = _bound(*_dequant(pairs), (-1, 0) if causal else (-1, -1))
    _check(out, exact, bound)


@pytest.mark.interpreter
def test_fp8_forward_window_softcap_fp16_out_and_lse(poison_alloc):
    pairs = _inputs(1, 48, 64, 2, 1, 32, seed=3)
    out, lse, probs = ioattn.flash_attn_func(*(t for t, _ in pairs), window_size=(20, 3), softcap=2.0,
                                             q_descale=pairs[0][1], k_descale=pairs[1][1], v_descale=pairs[2][1],
                                             out_dtype=torch.float16, return_attn_probs=True)
    qd, kd, vd = _dequant(pairs)
    exact, bound = _bound(qd, kd, vd, (20, 3), softcap=2.0)
    _check(out, exact, bound, torch.float16)
    _, lse64 = attention_ref(qd, kd, vd, window=(20, 3), softcap=2.0)
    assert probs.numel() == 0 and (lse.cpu().double() - lse64).abs().max() < 1e-4


@pytest.mark.interpreter
def test_fp8_forward_descale_forms(poison_alloc):
    """A scalar descale (per tensor), the query's per query head, and per (batch, KV head) agree with
    the same values dequantised by hand."""
    pairs = _inputs(2, 40, 40, 4, 2, 32, granularity="tensor", seed=5)
    (q, qs), (k, ks), (v, vs) = pairs
    q_heads = torch.full((2, 4), qs.item(), device=DEV)
    kv = torch.full((2, 2), ks.item(), device=DEV)
    a = ioattn.flash_attn_func(q, k, v, q_descale=qs, k_descale=ks.view(1, 1), v_descale=vs)
    b = ioattn.flash_attn_func(q, k, v, q_descale=q_heads, k_descale=kv, v_descale=vs.expand(2, 2))
    assert torch.equal(a, b)
    exact, bound = _bound(*_dequant(pairs), (-1, -1))
    _check(a, exact, bound)


@pytest.mark.interpreter
def test_fp8_varlen_matches_each_sequence(poison_alloc):
    g = torch.Generator().manual_seed(11)
    lens = [23, 1, 40]
    cu = torch.tensor([0, 23, 24, 64], dtype=torch.int32, device=DEV)
    x = [torch.randn(64 + 3, n, 32, generator=g, dtype=F64) for n in (4, 2, 2)]  # 3 rows no sequence owns
    vals = [(t.abs().amax() / 448).float() for t in x]
    q8, k8, v8 = ((t / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(DEV) for t, s in zip(x, vals))
    ds = [s.to(DEV).expand(3, 2) for s in vals]
    out = ioattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, 40, 40, causal=True, q_descale=ds[0], k_descale=ds[1],
                                        v_descale=ds[2])
    assert out[64:].eq(0).all()
    for i, n in enumerate(lens):
        lo = int(cu[i])
        part = [t[lo:lo + n].unsqueeze(0).cpu().double() * s for t, s in zip((q8, k8, v8), vals)]
        exact, bound = _bound(*part, (-1, 0))
        _check(out[lo:lo + n].unsqueeze(0), exact, bound)


def test_fp8_cpu_path_is_float32_attention_of_the_dequantised_inputs():
    pairs = [(t.cpu(), s.cpu()) for t, s in _inputs(1, 30, 50, 2, 1, 16, seed=7)]
    with dispatch.forced_backend("reference"):
        out = ioattn.flash_attn_func(*(t for t, _ in pairs), causal=True, q_descale=pairs[0][1],
                                     k_descale=pairs[1][1], v_descale=pairs[2][1])
    exact, _ = attention_ref(*_dequant(pairs), window=(-1, 0))
    assert out.dtype == torch.bfloat16 and (out.double() - exact).abs().max() <= 2.0 ** -8 * exact.abs().max()


def _bad_call(pairs, **kw):
    args = dict(q_descale=pairs[0][1], k_descale=pairs[1][1], v_descale=pairs[2][1])
    args.update(kw)
    q, k, v = (args.pop(n, t) for n, t in zip("qkv", (t for t, _ in pairs)))
    return ioattn.flash_attn_func(q, k, v, **args)


@pytest.mark.parametrize("kw, error, match", [
    (dict(k_descale=None), ValueError, "k_descale is required"),
    (dict(v_descale=torch.ones(3, 2)), ValueError, r"v_descale must broadcast to \(2, 2\)"),
    (dict(q_descale=torch.ones(2, 3)), ValueError, r"q_descale must broadcast to \(2, 2\) or \(2, 4\)"),
    (dict(k_descale=torch.ones(2, 2, dtype=torch.int32)), TypeError, "k_descale must be a floating-point"),
    (dict(q_descale=torch.tensor(0.0)), ValueError, "q_descale must hold finite positive values"),
    (dict(v_descale=torch.tensor(float("nan"))), ValueError, "v_descale must hold finite positive values"),
    (dict(k_descale=[1.0]), TypeError, "k_descale must be a torch.Tensor"),
    (dict(out_dtype=torch.float32), ValueError, "out_dtype must be torch.bfloat16 or torch.float16"),
    (dict(dropout_p=0.1), ValueError, "dropout_p must be 0 with FP8 inputs"),
    (dict(v=torch.zeros(2, 8, 2, 16, dtype=torch.bfloat16)), TypeError, "q, k, v must share one dtype"),
])
def test_fp8_bad_input_is_refused_before_any_launch(kw, error, match):
    pairs = [(t.cpu(), s.cpu()) for t, s in _inputs(2, 8, 8, 4, 2, 16, seed=1)]
    with dispatch.forced_backend("reference"), pytest.raises(error, match=match):
        _bad_call(pairs, **kw)


def test_fp8_refuses_gradients_and_descales_on_other_dtypes():
    pairs = [(t.cpu(), s.cpu()) for t, s in _inputs(1, 8, 8, 2, 2, 16, seed=2)]
    q = pairs[0][0].clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="FP8 inputs have no backward"):
        _bad_call(pairs, q=q)
    x = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="q_descale applies to FP8"):
        ioattn.flash_attn_func(x, x, x, q_descale=torch.ones(1, 2))


def test_explain_dispatch_names_the_fp8_path():
    q = torch.randn(1, 16, 2, 32).to(torch.float8_e4m3fn)
    with dispatch.forced_backend("reference"):
        plan = ioattn.explain_dispatch(q, q, q)
    assert "dequantised" in plan.forward["fp8"] and "no backward" in plan.backward["refused"]
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q, q, q)
    if plan.backend == "triton":  # (refused where the interpreter's e4m3 conversion is wrong)
        assert plan.forward["kernel"].endswith("attn_fwd_kernel") and "P_SCALE" in plan.forward["fp8"]


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon FP8 kernel: sm_90")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 300, 700, 2, 2), (1, 640, 256, 6, 1)])
def test_gluon_fp8_forward(shape, causal, d, poison_alloc):
    """The Gluon FP8 kernel (the default on sm_90) within the e4m3 bound, and where it applies."""
    b, sq, sk, h, h_kv = shape
    pairs = _inputs(b, sq, sk, h, h_kv, d, seed=d + sq)
    plan = ioattn.explain_dispatch(pairs[0][0], pairs[1][0], pairs[2][0], causal=causal)
    assert "Gluon" in plan.forward["kernel"], plan.forward
    out = ioattn.flash_attn_func(*(t for t, _ in pairs), causal=causal, q_descale=pairs[0][1],
                                 k_descale=pairs[1][1], v_descale=pairs[2][1])
    exact, bound = _bound(*_dequant(pairs), (-1, 0) if causal else (-1, -1))
    _check(out, exact, bound)


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon FP8 kernel: sm_90")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_fp8_varlen(causal, d, poison_alloc):
    """The Gluon FP8 kernel over packed sequences (lengths off the tiles, an empty one, more keys than
    queries, GQA, rows no sequence owns) within each sequence's e4m3 bound, the unowned rows zero; its
    plan the Gluon one."""
    g = torch.Generator().manual_seed(d + causal)
    lens_q, lens_k = [300, 1, 0, 200, 129], [300, 130, 0, 450, 129]
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
                  for n in (lens_q, lens_k))
    x = [torch.randn(int(cu[-1]) + 5, n, d, generator=g, dtype=F64) for cu, n in ((cu_q, 4), (cu_k, 2), (cu_k, 2))]
    vals = [(t.abs().amax() / 448).float() for t in x]
    q8, k8, v8 = ((t / s).clamp(-448, 448).to(torch.float8_e4m3fn).to(DEV) for t, s in zip(x, vals))
    ds = [s.to(DEV).expand(len(lens_q), 2) for s in vals]
    plan = ioattn.explain_dispatch(q8, k8, v8, causal=causal, cu_seqlens_q=cu_q, max_seqlen_q=max(lens_q))
    assert "Gluon" in plan.forward["kernel"], plan.forward
    out = ioattn.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                        q_descale=ds[0], k_descale=ds[1], v_descale=ds[2])
    assert out[int(cu_q[-1]):].eq(0).all()
    for b, (nq, nk) in enumerate(zip(lens_q, lens_k)):
        if nq == 0:
            continue
        lo_q, lo_k = int(cu_q[b]), int(cu_k[b])
        part = [t[lo:lo + n].unsqueeze(0).cpu().double() * s
                for t, s, lo, n in zip((q8, k8, v8), vals, (lo_q, lo_k, lo_k), (nq, nk, nk))]
        exact, bound = _bound(*part, (-1, 0) if causal else (-1, -1))
        _check(out[lo_q:lo_q + nq].unsqueeze(0), exact, bound)


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon FP8 kernel: sm_90")
@pytest.mark.parametrize("kw", [dict(window_size=(100, 20)), dict(softcap=3.0), dict(softmax_scale=0.05)])
def test_gluon_fp8_forward_options(kw, poison_alloc):
    pairs = _inputs(1, 512, 512, 4, 2, 128, seed=9)
    out = ioattn.flash_attn_func(*(t for t, _ in pairs), q_descale=pairs[0][1], k_descale=pairs[1][1],
                                 v_descale=pairs[2][1], **kw)
    exact, bound = _bound(*_dequant(pairs), kw.get("window_size", (-1, -1)), kw.get("softmax_scale"),
                          kw.get("softcap", 0.0))
    _check(out, exact, bound)


def test_fp8_plan_is_the_pingpong_kernel_without_the_lean_options():
    """The FP8 plan (pure Python): the one-tile ping-pong kernel at ``hopper.FP8_TILES``'s tiles, the lean
    softmax and the persistent walk off, and the calls it leaves to the portable kernel."""
    from ioattn.plan import forward as forward_plan, hopper
    from ioattn.semantics import Semantics

    sig = forward_plan.Signature(batch=2, seqlen_q=1000, seqlen_k=1000, nheads=4, nheads_kv=2, head_dim=256,
                                 element_size=1, varlen=False, causal=True, window=(-1, -1), softcap=0.0,
                                 softmax_scale=0.0625, alibi=False, device_sms=132)
    plan = forward_plan.plan_forward(sig)
    c = dict(plan.constexprs)
    assert plan.variant == "pingpong" and (plan.block_m, plan.block_n) == (128, hopper.FP8_TILES[256][0])
    assert c["PINGPONG"] and not (c["LEAN"] or c["PERSISTENT"] or c["KV_TAIL"] or c["Q_IN_REGS"]) and c["IS_CAUSAL"]
    assert plan.programs == 8 * 2 * 4
    q = torch.zeros(1, 8, 2, 96).to(torch.float8_e4m3fn)
    sem = Semantics(0.1, (-1, -1), 0.0, 0.0, False)
    assert not hopper.fp8_call_supported(q, q, q, False, sem, None)[0]  # head dim 96
    q = torch.zeros(1, 8, 2, 128).to(torch.float8_e4m3fn)
    assert hopper.fp8_call_supported(q, q, q, False, sem, None)[0]
    assert hopper.fp8_call_supported(q, q, q, True, sem, None)[0]  # varlen
    assert not hopper.fp8_call_supported(q, q, q, False, sem, torch.ones(2))[0]  # ALiBi
    packed = dict(forward_plan.plan_forward(dataclasses.replace(sig, varlen=True)).constexprs)
    assert packed["IS_VARLEN"] and not packed["KV_TAIL"] and packed["KEY_MASKS"]


def test_fp8_plan_takes_a_third_warpgroup_where_it_fits():
    """``hopper.fp8_warpgroups``: three consumer warpgroups (192 query rows, 64 each) at d = 64 and at
    d = 128 non-causal fixed-length calls with per-head descales; two at d = 256, where three spill (d = 128
    causal or packed), and with block descales (a query tile within one block)."""
    from ioattn.plan import forward as forward_plan

    sig = forward_plan.Signature(batch=1, seqlen_q=4096, seqlen_k=4096, nheads=2, nheads_kv=2, head_dim=128,
                                 element_size=1, varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                 softmax_scale=0.1, alibi=False, device_sms=132)
    cases = {(64, False, False, False): 3, (64, True, True, False): 3, (128, False, False, False): 3,
             (128, True, False, False): 2, (128, False, True, False): 2, (128, False, False, True): 2,
             (256, False, False, False): 2}
    for (d, causal, varlen, blocks), num_wg in cases.items():
        plan = forward_plan.plan_forward(dataclasses.replace(sig, head_dim=d, causal=causal, varlen=varlen,
                                                             fp8_blocks=blocks))
        c = dict(plan.constexprs)
        assert (c["NUM_WG"], plan.block_m, plan.q_rows) == (num_wg, 64 * num_wg, 64), (d, causal, varlen, blocks)
        assert plan.num_m == -(-4096 // plan.block_m)


def test_fp8_packed_v_is_transposed_into_rows_of_its_own_sequence():
    """The Gluon FP8 kernel's V^T of packed sequences (``launch.gluon_fwd.transposed_v``): sequence b's
    keys in its own rows from column 0, zeros past its end (a tile its end cuts reads no other
    sequence), the rows no sequence owns left out, 16-byte aligned rows."""
    from ioattn.launch.gluon_fwd import transposed_v

    lens, heads, d = [5, 0, 17, 3], 2, 16
    cu = torch.tensor([0, 5, 5, 22, 25], dtype=torch.int32)
    v = (torch.randn(25 + 2, heads, d) * 8).to(torch.float8_e4m3fn)  # 2 rows no sequence owns
    vt = transposed_v(v, cu, (4, 17, heads, d))
    assert vt.shape == (4 * heads * d, 17) and vt.stride() == (32, 1) and vt.dtype == torch.float8_e4m3fn
    got = vt.view(torch.uint8).view(4, heads, d, 17)
    raw = v.view(torch.uint8)
    for b, n in enumerate(lens):
        lo = int(cu[b])
        assert torch.equal(got[b, :, :, :n], raw[lo:lo + n].permute(1, 2, 0))
        assert not got[b, :, :, n:].any()
    fixed = transposed_v(v[:24].view(2, 12, heads, d))
    assert torch.equal(fixed.view(torch.uint8).reshape(2, heads, d, 12),
                       v[:24].view(torch.uint8).view(2, 12, heads, d).permute(0, 2, 3, 1))


@pytest.mark.interpreter
@pytest.mark.parametrize("d", [64, 48])
def test_one_call_fp8_quantises_rotates_and_returns_q_dtype(d, poison_alloc):
    """``fp8=True`` on fp16 inputs: the same as quantising with ``fp8.quantize_qkv`` (per head, q and k
    rotated where d is a power of two) and calling the FP8 forward, within the e4m3 bound of attention
    over those quantised inputs; and close to exact attention of the originals (RMSE < 5 % of RMS)."""
    from ioattn import fp8

    g = torch.Generator().manual_seed(d)
    q, k, v = (torch.randn(2, 160, h, d, generator=g).to(DEV, torch.float16) for h in (4, 2, 2))
    out = ioattn.flash_attn_func(q, k, v, causal=True, fp8=True)
    assert out.dtype == torch.float16
    q8, k8, v8, (qs, ks, vs) = fp8.quantize_qkv(q, k, v)
    assert qs.shape == (2, 4) and ks.shape == (2, 2) and vs.shape == (2, 2)
    exact, bound = _bound(*_dequant([(q8, qs), (k8, ks), (v8, vs)]), (-1, 0))
    _check(out, exact, bound, torch.float16)
    ref, _ = attention_ref(q.cpu().double(), k.cpu().double(), v.cpu().double(), window=(-1, 0))
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    assert rms(out.cpu().double() - ref) < 0.05 * rms(ref)


def test_one_call_fp8_refusals():
    x = torch.randn(1, 8, 2, 16, dtype=torch.float16)
    with dispatch.forced_backend("reference"):
        with pytest.raises(ValueError, match="fp8=True computes the descales"):
            ioattn.flash_attn_func(x, x, x, fp8=True, q_descale=torch.ones(1, 2))
        with pytest.raises(TypeError, match="fp8=True takes bfloat16 or float16"):
            ioattn.flash_attn_func(x.float(), x.float(), x.float(), fp8=True)
        with pytest.raises(RuntimeError, match="fp8=True has no backward"):
            ioattn.flash_attn_func(x.clone().requires_grad_(True), x, x, fp8=True)
        with pytest.raises(ValueError, match="already float8_e4m3fn"):
            y = x.to(torch.float8_e4m3fn)
            ioattn.flash_attn_func(y, y, y, fp8=True)


@pytest.mark.interpreter
def test_one_call_fp8_varlen(poison_alloc):
    """``fp8=True`` on packed sequences: scales per (sequence, head); each sequence's output close to exact
    attention of its own rows (RMSE < 5 % of RMS)."""
    g = torch.Generator().manual_seed(4)
    cu = torch.tensor([0, 30, 31, 90], dtype=torch.int32, device=DEV)
    q, k, v = (torch.randn(90, h, 32, generator=g).to(DEV, torch.float16) for h in (4, 2, 2))
    out = ioattn.flash_attn_varlen_func(q, k, v, cu, cu, 59, 59, causal=True, fp8=True)
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    for lo, hi in ((0, 30), (30, 31), (31, 90)):
        ref, _ = attention_ref(*(t[lo:hi].unsqueeze(0).cpu().double() for t in (q, k, v)), window=(-1, 0))
        assert rms(out[lo:hi].unsqueeze(0).cpu().double() - ref) < 0.05 * rms(ref)


def test_one_call_descales_are_not_read_back(monkeypatch):
    """``fp8=True`` makes its descales itself (positive by construction) and passes them on unchecked:
    no device read a call; descales a caller gives are still checked."""
    import ioattn.fp8 as fp8_mod
    checked = []
    real = fp8_mod.descale_rows

    def spy(*args, **kw):
        checked.append(args[-1] if len(args) > 7 else kw.get("check_values", True))
        return real(*args, **kw)
    monkeypatch.setattr(fp8_mod, "descale_rows", spy)
    x = torch.randn(1, 16, 2, 32, dtype=torch.bfloat16)
    with dispatch.forced_backend("reference"):
        ioattn.flash_attn_func(x, x, x, fp8=True)
        pairs = [(t.cpu(), s.cpu()) for t, s in _inputs(1, 8, 8, 2, 2, 16, seed=3)]
        _bad_call(pairs)
    assert checked == [False, True], checked
    with pytest.raises(ValueError, match="finite positive"):
        real(torch.tensor(float("nan")), torch.ones(()), torch.ones(()), 1, 2, 2, "cpu")
    assert real(torch.tensor(float("nan")), torch.ones(()), torch.ones(()), 1, 2, 2, "cpu",
                check_values=False).isnan().any()


def _block_inputs(b, sq, sk, h, h_kv, d, seed):
    """q and k quantised per block of ``FP8_BLOCK_ROWS`` rows (scales apart by block: each block of
    rows drawn at its own magnitude), v per (batch, head)."""
    g = torch.Generator().manual_seed(seed)

    def draw(s, n):  # (magnitudes 1/4 to 4: FP8 products accumulate in less than fp32 on Hopper)
        mag = 2.0 ** torch.randint(-2, 3, (b, -(-s // 128), n), generator=g).to(F64)
        return torch.randn(b, s, n, d, generator=g, dtype=F64) * mag.repeat_interleave(128, 1)[:, :s, :, None]
    q, k, v = draw(sq, h), draw(sk, h_kv), torch.randn(b, sk, h_kv, d, generator=g, dtype=F64)
    quant = [ref8.quantize_fp8_ref(t, gran) for t, gran in ((q, "block"), (k, "block"), (v, "head"))]
    return [(t.to(DEV), s.to(DEV)) for t, s in quant]


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_fp8_forward_block_descales(backend, causal, poison_alloc):
    """Q's and K's descales per block of 128 rows ((batch, heads, blocks), ``quantize_fp8``'s block
    output), V's per head; a per-head q descale beside a per-block k one is taken too."""
    pairs = _block_inputs(2, 140, 300, 2, 1, 32, seed=21 + causal)
    (q, qs), (k, ks), (v, vs) = pairs
    assert qs.shape == (2, 2, 2) and ks.shape == (2, 1, 3)
    with dispatch.forced_backend(backend):
        out = ioattn.flash_attn_func(q, k, v, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)
        exact, bound = _bound(*_dequant(pairs), (-1, 0) if causal else (-1, -1))
        _check(out, exact, bound)
        q_head = qs.amax(-1)  # q's values read per head: a coarser scale, the same real values up to e4m3
        q8 = (ref8.dequantize_fp8_ref(q.cpu(), qs.cpu()) / q_head.cpu()[:, None, :, None]).clamp(-448, 448)
        q8 = q8.to(torch.float8_e4m3fn).to(DEV)
        mixed = ioattn.flash_attn_func(q8, k, v, causal=causal, q_descale=q_head, k_descale=ks, v_descale=vs)
        exact, bound = _bound(*_dequant([(q8, q_head), (k, ks), (v, vs)]), (-1, 0) if causal else (-1, -1))
        _check(mixed, exact, bound)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_fp8_varlen_block_descales(backend, poison_alloc):
    """Packed sequences with ``quantize_fp8(..., "block", cu_seqlens=)``'s descales: blocks from each
    sequence's first row."""
    g = torch.Generator().manual_seed(12)
    lens = [150, 1, 260]
    cu = torch.tensor([0, 150, 151, 411], dtype=torch.int32, device=DEV)
    mag = torch.exp(torch.randn(411 // 64 + 1, generator=g, dtype=F64)).repeat_interleave(64)[:411, None, None]
    x = [(torch.randn(411, n, 32, generator=g, dtype=F64) * mag).to(DEV) for n in (2, 1, 1)]  # blocks apart
    with dispatch.forced_backend("reference"):  # the quantisation itself is tested elsewhere
        (q8, qs), (k8, ks) = (ioattn.quantize_fp8(t.float(), "block", cu_seqlens=cu) for t in x[:2])
        v8, vs = ioattn.quantize_fp8(x[2].float(), "head", cu_seqlens=cu)
    assert qs.shape == (3, 2, 3)
    with dispatch.forced_backend(backend):
        out = ioattn.flash_attn_varlen_func(q8, k8, v8, cu, cu, 260, 260, causal=True, q_descale=qs, k_descale=ks,
                                            v_descale=vs)
    for i, n in enumerate(lens):
        lo = int(cu[i])
        part = [ref8.dequantize_fp8_ref(t[lo:lo + n].unsqueeze(0).cpu(), s[i:i + 1].cpu())
                for t, s in ((q8, qs), (k8, ks), (v8, vs))]
        exact, bound = _bound(*part, (-1, 0))
        _check(out[lo:lo + n].unsqueeze(0), exact, bound)


def test_fp8_block_descales_of_the_wrong_count_are_refused():
    """A block descale of another block count is refused by name; v's descale takes no blocks."""
    pairs = [(t.cpu(), s.cpu()) for t, s in _inputs(1, 200, 200, 2, 2, 16, seed=4)]
    with dispatch.forced_backend("reference"), pytest.raises(ValueError, match=r"per block of 128 rows \(1, heads, 2\)"):
        _bad_call(pairs, k_descale=torch.ones(1, 2, 3))
    with dispatch.forced_backend("reference"), pytest.raises(ValueError, match=r"v_descale must broadcast to \(1, 2\), got"):
        _bad_call(pairs, v_descale=torch.ones(1, 2, 2))


@pytest.mark.skipif(not CUDA or torch.cuda.get_device_capability()[0] != 9, reason="the Gluon FP8 kernel: sm_90")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_fp8_block_descales(causal, d, poison_alloc):
    """The Gluon FP8 kernel with Q's and K's descales per block of 128 rows (blocks drawn at their own
    magnitudes, lengths off the blocks), fixed lengths and packed; its plan the Gluon one."""
    pairs = _block_inputs(2, 300, 700, 4, 2, d, seed=d + causal)
    (q, qs), (k, ks), (v, vs) = pairs
    assert "Gluon" in ioattn.explain_dispatch(q, k, v, causal=causal).forward["kernel"]
    out = ioattn.flash_attn_func(q, k, v, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)
    _check(out, *_bound(*_dequant(pairs), (-1, 0) if causal else (-1, -1)))
    cu = torch.tensor([0, 300, 600], dtype=torch.int32, device=DEV)
    packed = [t.reshape(-1, *t.shape[2:]) for t in (q, k[:, :300], v[:, :300])]
    ks300 = ks[:, :, :3].contiguous()
    out = ioattn.flash_attn_varlen_func(*packed, cu, cu, 300, 300, causal=causal, q_descale=qs, k_descale=ks300,
                                        v_descale=vs)
    for b in range(2):
        part = _dequant([(q[b:b + 1], qs[b:b + 1]), (k[b:b + 1, :300], ks300[b:b + 1]), (v[b:b + 1, :300], vs[b:b + 1])])
        _check(out[300 * b:300 * (b + 1)].unsqueeze(0), *_bound(*part, (-1, 0) if causal else (-1, -1)))
