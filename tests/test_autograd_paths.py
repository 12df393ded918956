"""The two ways into the attention op (``ioattn.autograd``): eager calls on plain tensors go through
``_Eager`` (an autograd.Function), everything traced or intercepted through the torch.library op.
Both must run the same kernels and give the same results."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

import ioattn.autograd as ag
from ioattn import flash_attn_func, flash_attn_varlen_func


class _PassThrough(TorchFunctionMode):
    """Intercepts nothing, but its presence means the call may be traced: the op path must run."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    real = ag._fwd_op

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(ag, "_fwd_op", counted)
    return calls


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device")])]


def _run(q, k, v, dout, **kw):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out, lse, _ = flash_attn_func(*leaves, return_attn_probs=True, **kw)
    return (out, lse) + torch.autograd.grad(out, leaves, dout)


@pytest.mark.parametrize("kw", [dict(), dict(causal=True, softcap=5.0), dict(dropout_p=0.2)],
                         ids=["plain", "causal-softcap", "dropout"])
@pytest.mark.parametrize("device", DEVICES)
def test_eager_and_op_paths_agree(kw, device, op_calls):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v, dout = (torch.randn(2, 37, 4, 32, device=device, dtype=dtype) for _ in range(4))
    kw = dict(kw, deterministic=True)  # the GPU backward may add dQ in any order otherwise
    k, v = k[:, :, :2], v[:, :, :2]  # GQA
    torch.manual_seed(1)
    eager = _run(q, k, v, dout, **kw)
    assert not op_calls
    torch.manual_seed(1)  # the same dropout seed
    with _PassThrough():
        traced = _run(q, k, v, dout, **kw)
    assert op_calls
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), eager, traced):
        assert torch.equal(a, b), name


def test_varlen_takes_the_eager_path(op_calls):
    q = torch.randn(50, 4, 16, requires_grad=True)
    cu = torch.tensor([0, 20, 50], dtype=torch.int32)
    out = flash_attn_varlen_func(q, q, q, cu, cu, 30, 30, causal=True)
    out.sum().backward()
    assert not op_calls and torch.isfinite(q.grad).all()


def test_lse_has_zero_gradient_and_the_seed_none():
    # flash-attn's convention: a loss through the lse runs, and gives q, k, v no gradient
    q = torch.randn(1, 8, 2, 16, requires_grad=True)
    out, lse, rng = ag.attention(q, q, q, None, None, 8, 8, 0.25, (-1, -1), 0.0, None, 0.0)
    assert out.requires_grad and lse.requires_grad and not rng.requires_grad
    lse.sum().backward()
    assert q.grad is None or (q.grad == 0).all()


def test_parameters_are_plain_tensors():
    p = torch.nn.Parameter(torch.randn(1, 8, 2, 16))
    assert ag._eager(p, None)
    with _PassThrough():
        assert not ag._eager(p)


def test_calls_without_gradients_record_no_graph(monkeypatch):
    applied = []
    real = ag._Eager.apply
    monkeypatch.setattr(ag._Eager, "apply", lambda *a: applied.append(1) or real(*a))
    q = torch.randn(1, 9, 2, 16, requires_grad=True)
    with torch.no_grad():
        a = flash_attn_func(q, q, q, causal=True)
    b = flash_attn_func(q.detach(), q.detach(), q.detach(), causal=True)
    assert not applied and a.grad_fn is None and b.grad_fn is None
    c = flash_attn_func(q, q, q, causal=True)
    assert applied and c.grad_fn is not None
    assert torch.equal(a, b) and torch.equal(a, c.detach())
