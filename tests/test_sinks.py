"""Learnable attention sinks (``sinks=`` of ``flash_attn_func`` / ``flash_attn_varlen_func``): a logit per
head in every row's softmax denominator, as one more column whose value is 0.

Checked against ``reference.naive.attention_ref(..., sinks=)`` in float64, forward (output and lse)
and backward (dq, dk, dv and the sinks' own gradient), within twice PyTorch's own error in the same
dtype, on the Triton kernels (the interpreter here) and the CPU path.
"""
import pytest
import torch

import ioattn
from conftest import DEVICE, assert_within_torch_error
from ioattn.plan import dispatch
from ioattn.reference.naive import attention_ref

F64 = torch.float64


def _inputs(shape_q, shape_kv, nheads, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g, dtype=F64)
    k, v = (torch.randn(shape_kv, generator=g, dtype=F64) for _ in range(2))
    sinks = torch.randn(nheads, generator=g, dtype=F64) * 2
    dout = torch.randn(shape_q, generator=g, dtype=F64)
    return q, k, v, sinks, dout


def _grads(fn, q, k, v, sinks, dout, dtype, device):
    leaves = [t.to(device, dtype).requires_grad_(True) for t in (q, k, v)]
    s = sinks.to(device, torch.float32 if dtype != F64 else F64).requires_grad_(True)
    out, lse = fn(*leaves, s)
    grads = torch.autograd.grad(out, [*leaves, s], dout.to(device, out.dtype))
    return out.detach(), lse.detach(), grads


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
@pytest.mark.parametrize("causal", [False, True])
def test_sinks_match_the_reference(backend, causal):
    """GQA 4:2, seqlen_q > seqlen_k under the causal mask (its first rows see no key: output 0, lse -inf)."""
    q, k, v, sinks, dout = _inputs((2, 48, 4, 32), (2, 40, 2, 32), 4, torch.float16, seed=3 + causal)
    window = (-1, 0) if causal else (-1, -1)

    def ours(q, k, v, s):
        out, lse, _ = ioattn.flash_attn_func(q, k, v, causal=causal, sinks=s, return_attn_probs=True)
        return out, lse

    def ref(q, k, v, s):
        return attention_ref(q, k, v, window=window, sinks=s, upcast=q.dtype == F64)

    with dispatch.forced_backend(backend):
        out, lse, grads = _grads(ours, q, k, v, sinks, dout, torch.float16, DEVICE)
    out64, lse64, grads64 = _grads(ref, q, k, v, sinks, dout, F64, "cpu")
    out16, _, grads16 = _grads(ref, q, k, v, sinks, dout, torch.float16, "cpu")
    assert_within_torch_error("out", out.cpu(), out64, out16)
    for name, g, g64, g16 in zip(("dq", "dk", "dv", "dsinks"), grads, grads64, grads16):
        assert not g.isnan().any(), name
        assert_within_torch_error(name, g.cpu(), g64, g16)
    finite = torch.isfinite(lse64)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert (lse.cpu()[finite].double() - lse64[finite]).abs().max() < 1e-3
    if causal:  # rows 0..7 see no key: they stay empty whatever the sink
        assert (out[:, :8] == 0).all() and torch.isneginf(lse[:, :, :8]).all()


@pytest.mark.interpreter
def test_sinks_in_packed_sequences():
    """varlen: each sequence equals its own batched call with the same sinks."""
    g = torch.Generator().manual_seed(7)
    cu = torch.tensor([0, 17, 40, 41], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(41, h, 16, generator=g).to(DEVICE, torch.float16) for h in (4, 2, 2))
    sinks = torch.randn(4, generator=g).to(DEVICE)
    out = ioattn.flash_attn_varlen_func(q, k, v, cu, cu, 23, 23, causal=True, sinks=sinks)
    for lo, hi in ((0, 17), (17, 40), (40, 41)):
        ref, _ = attention_ref(*(t[lo:hi].unsqueeze(0).cpu().double() for t in (q, k, v)), window=(-1, 0),
                               sinks=sinks.cpu().double())
        assert (out[lo:hi].cpu().double() - ref[0]).abs().max() < 4e-3


def test_sinks_change_the_output_and_large_sinks_silence_it():
    q, k, v, _, _ = _inputs((1, 16, 2, 8), (1, 16, 2, 8), 2, torch.float32, seed=1)
    base = ioattn.flash_attn_func(q.float(), k.float(), v.float())
    small = ioattn.flash_attn_func(q.float(), k.float(), v.float(), sinks=torch.full((2,), -30.0))
    big = ioattn.flash_attn_func(q.float(), k.float(), v.float(), sinks=torch.full((2,), 60.0))
    assert torch.allclose(small, base, atol=1e-6) and big.abs().max() < 1e-12


@pytest.mark.parametrize("sinks, error, match", [
    (torch.zeros(3), ValueError, r"sinks must have shape \(nheads,\) = \(2,\)"),
    (torch.zeros(2, dtype=torch.int64), TypeError, "sinks must be float32"),
    ([0.0, 0.0], TypeError, "sinks must be a torch.Tensor"),
])
def test_bad_sinks_are_refused(sinks, error, match):
    x = torch.randn(1, 8, 2, 16)
    with pytest.raises(error, match=match):
        ioattn.flash_attn_func(x, x, x, sinks=sinks)


def test_sinks_under_torch_compile_and_the_ops_fake_implementations():
    """``torch.compile(fullgraph=True)`` through a call with sinks: the same output and gradients as eager
    (the custom ops take the sinks and return their gradient); ``opcheck`` of both ops with sinks."""
    import ioattn.autograd  # noqa: F401  (registers torch.ops.ioattn.*)

    q, k, v, sinks, dout = _inputs((1, 24, 2, 16), (1, 24, 2, 16), 2, torch.float32, seed=5)
    q, k, v, sinks = (t.float().requires_grad_(True) for t in (q, k, v, sinks))

    def f(q, k, v, s):
        return ioattn.flash_attn_func(q, k, v, causal=True, sinks=s)

    torch._dynamo.reset()
    with dispatch.forced_backend("reference"):
        eager = f(q, k, v, sinks)
        g_eager = torch.autograd.grad(eager, (q, k, v, sinks), dout.float())
        compiled = torch.compile(f, fullgraph=True, backend="eager")(q, k, v, sinks)
        g_comp = torch.autograd.grad(compiled, (q, k, v, sinks), dout.float())
        args = (None, None, 24, 24, 0.25, -1, 0, 0.0, None, 0.0, sinks.detach())
        torch.library.opcheck(torch.ops.ioattn.fwd.default, (q.detach(), k.detach(), v.detach(), *args))
        out, lse, rng = torch.ops.ioattn.fwd(q.detach(), k.detach(), v.detach(), *args)
        torch.library.opcheck(torch.ops.ioattn.bwd.default,
                              (dout.float(), q.detach(), k.detach(), v.detach(), out, lse, *args[:-1], rng, args[-1]))
    assert torch.allclose(compiled, eager, atol=1e-6)
    for a, b in zip(g_comp, g_eager):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_sinks_in_decoding_equal_the_forwards(backend):
    """``flash_attn_with_kvcache(..., sinks=)`` over full caches equals ``flash_attn_func`` with the same
    sinks (one query token sees every key); bad sinks are refused before the cache changes."""
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 1, 4, 32, generator=g).to(DEVICE, torch.float16)
    k_cache, v_cache = (torch.randn(2, 80, 2, 32, generator=g).to(DEVICE, torch.float16) for _ in range(2))
    sinks = torch.randn(4, generator=g).to(DEVICE)
    with dispatch.forced_backend(backend):
        out, lse = ioattn.flash_attn_with_kvcache(q, k_cache, v_cache, sinks=sinks, return_softmax_lse=True)
        ref, ref_lse, _ = ioattn.flash_attn_func(q, k_cache, v_cache, sinks=sinks, return_attn_probs=True)
        assert (out.float() - ref.float()).abs().max() < 2e-3 and (lse - ref_lse).abs().max() < 1e-3
        new = torch.randn(2, 1, 2, 32, generator=g).to(DEVICE, torch.float16)
        before = k_cache.clone()
        with pytest.raises(ValueError, match=r"sinks must have shape \(nheads,\) = \(4,\)"):
            ioattn.flash_attn_with_kvcache(q, k_cache, v_cache, k=new, v=new, cache_seqlens=40, sinks=sinks[:2])
        assert torch.equal(k_cache, before)
