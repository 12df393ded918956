"""torch.compile and torch.library checks of the ``ioattn::fwd`` / ``ioattn::bwd`` custom ops.

A tiny block (linear -> q, k, v -> flash_attn_func(causal) -> linear) is compiled with
``fullgraph=True`` (any graph break raises) and compared with eager, forward and backward, on the
CPU reference backend and on the Triton kernels (run by the interpreter when there is no GPU).
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import DEVICE, max_err
from ioattn import flash_attn_func, flash_attn_varlen_func
from ioattn.plan import dispatch

import ioattn.autograd  # noqa: F401  (registers torch.ops.ioattn.*)

BACKENDS = ["reference", "triton"]

COMPILE_BACKENDS = ["reference", "triton"]


class Block(nn.Module):
    def __init__(self, dim=32, heads=4, heads_kv=2, head_dim=16):
        super().__init__()
        self.h, self.hk, self.d = heads, heads_kv, head_dim
        self.q = nn.Linear(dim, heads * head_dim)
        self.kv = nn.Linear(dim, 2 * heads_kv * head_dim)
        self.out = nn.Linear(heads * head_dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d)
        k, v = self.kv(x).view(b, s, 2, self.hk, self.d).unbind(2)
        o = flash_attn_func(q, k, v, causal=True, softcap=5.0)
        return self.out(o.reshape(b, s, self.h * self.d))


def _fresh_compile():
    torch._dynamo.reset()


def _compile_and_compare(backend, compiler, dtype=torch.float32):
    torch.manual_seed(0)
    model = Block().to(DEVICE, dtype)
    x = torch.randn(2, 37, 32, device=DEVICE, dtype=dtype)
    dy = torch.randn(2, 37, 32, device=DEVICE, dtype=dtype)
    _fresh_compile()
    compiled = torch.compile(model, fullgraph=True, backend=compiler)
    with dispatch.forced_backend(backend):
        y_eager = model(x)
        g_eager = torch.autograd.grad(y_eager, list(model.parameters()), dy)
        y_comp = compiled(x)
        g_comp = torch.autograd.grad(y_comp, list(model.parameters()), dy)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert y_comp.shape == y_eager.shape and not y_comp.isnan().any()
    assert max_err(y_comp, y_eager) <= tol, f"forward: {max_err(y_comp, y_eager):.2e}"
    for (name, _), a, b in zip(model.named_parameters(), g_comp, g_eager):
        assert max_err(a, b) <= tol * max(1.0, b.abs().max().item()), f"grad {name}: {max_err(a, b):.2e}"


@pytest.mark.parametrize("backend", COMPILE_BACKENDS)
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compile_fullgraph_matches_eager(backend, compiler):
    _compile_and_compare(backend, compiler)


def test_compile_fullgraph_bf16_triton():
    _compile_and_compare("triton", "aot_eager", dtype=torch.bfloat16)


def test_compile_counts_no_graph_break():
    # explain() reports graph breaks directly (fullgraph=True above would raise on one anyway)
    model = Block()
    x = torch.randn(1, 9, 32)
    _fresh_compile()
    with dispatch.forced_backend("reference"):
        explanation = torch._dynamo.explain(model)(x)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_compile_varlen_and_dropout(backend):
    # varlen: the value checks of cu_seqlens are skipped while tracing; dropout: the seed is drawn
    # inside the op, so a compiled and an eager call after the same manual_seed agree
    lens = [5, 2, 9]
    cu = torch.tensor([0, 5, 7, 16], dtype=torch.int32, device=DEVICE)
    q, k, v = (torch.randn(sum(lens), 2, 16, device=DEVICE, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, dropout_p=0.2, causal=True) * 2.0

    _fresh_compile()
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with dispatch.forced_backend(backend):
        torch.manual_seed(3)
        y_eager = f(q, k, v)
        g_eager = torch.autograd.grad(y_eager.sum(), (q, k, v))
        torch.manual_seed(3)
        y_comp = compiled(q, k, v)
        g_comp = torch.autograd.grad(y_comp.sum(), (q, k, v))
    assert max_err(y_comp, y_eager) <= 1e-6
    for a, b in zip(g_comp, g_eager):
        assert max_err(a, b) <= 1e-5


@pytest.mark.parametrize("backend,varlen", [pytest.param("reference", False),
                                            ("reference", True), ("triton", False), ("triton", True)],
                         ids=["reference-batched", "reference-varlen", "triton-batched", "triton-varlen"])
def test_opcheck_fwd(backend, varlen):
    torch.manual_seed(0)
    if varlen:
        q = torch.randn(9, 4, 16, device=DEVICE, requires_grad=True)
        k = torch.randn(11, 2, 16, device=DEVICE, requires_grad=True)
        v = torch.randn(11, 2, 16, device=DEVICE, requires_grad=True)
        cu_q = torch.tensor([0, 4, 9], dtype=torch.int32, device=DEVICE)
        cu_k = torch.tensor([0, 6, 11], dtype=torch.int32, device=DEVICE)
        args = (q, k, v, cu_q, cu_k, 5, 6, 0.25, -1, 0, 0.0, None, 0.0)
    else:
        q = torch.randn(2, 7, 4, 16, device=DEVICE, requires_grad=True)
        k = torch.randn(2, 9, 2, 16, device=DEVICE, requires_grad=True)
        v = torch.randn(2, 9, 2, 16, device=DEVICE, requires_grad=True)
        slopes = torch.rand(4, device=DEVICE)
        args = (q, k, v, None, None, 7, 9, 0.25, 4, 2, 3.0, slopes, 0.0)
    with dispatch.forced_backend(backend):
        torch.library.opcheck(torch.ops.ioattn.fwd.default, args)


@pytest.mark.parametrize("backend", BACKENDS)
def test_opcheck_bwd(backend):
    torch.manual_seed(0)
    q = torch.randn(1, 7, 2, 16, device=DEVICE)
    k = torch.randn(1, 9, 2, 16, device=DEVICE)
    v = torch.randn(1, 9, 2, 16, device=DEVICE)
    with dispatch.forced_backend(backend):
        out, lse, rng = torch.ops.ioattn.fwd(q, k, v, None, None, 7, 9, 0.25, -1, 0, 0.0, None, 0.0)
        args = (torch.randn_like(out), q, k, v, out, lse, None, None, 7, 9, 0.25, -1, 0, 0.0, None, 0.0, rng)
        torch.library.opcheck(torch.ops.ioattn.bwd.default, args)


@pytest.mark.parametrize("backend,layout", [
    pytest.param("reference", "contiguous"),
    ("reference", "bhsd-transposed"),  # here the transposed buffer happens to have q's strides
    ("triton", "contiguous"), ("triton", "bhsd-transposed")])
def test_fake_shapes_match_real(backend, layout):
    # the fake (meta) implementation's outputs agree with the real one in shape, dtype and strides
    from torch._subclasses.fake_tensor import FakeTensorMode

    device = DEVICE if backend == "triton" else "cpu"  # the Triton kernels take CPU tensors only interpreted
    q = torch.randn(2, 7, 4, 16, dtype=torch.float16, device=device)
    k = torch.randn(2, 9, 2, 16, dtype=torch.float16, device=device)
    if layout != "contiguous":
        q, k = q.transpose(1, 2).contiguous().transpose(1, 2), k.transpose(1, 2).contiguous().transpose(1, 2)
    with dispatch.forced_backend(backend):
        real = torch.ops.ioattn.fwd(q, k, k, None, None, 7, 9, 0.25, -1, -1, 0.0, None, 0.0)
    with FakeTensorMode() as mode:
        fq, fk = mode.from_tensor(q), mode.from_tensor(k)
        fake = torch.ops.ioattn.fwd(fq, fk, fk, None, None, 7, 9, 0.25, -1, -1, 0.0, None, 0.0)
    for r, f in zip(real, fake):
        assert r.shape == f.shape and r.dtype == f.dtype and r.device == f.device
        assert r.stride() == f.stride()


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_forward_op_compiles_and_matches_eager(backend):
    """The FP8 forward (``ioattn::fwd_fp8``) under ``torch.compile(fullgraph=True)``: e4m3 inputs with
    their descales, the same output as eager; and the op's fake implementation (``torch.library.opcheck``)."""
    from ioattn.reference.fp8 import quantize_fp8_ref

    g = torch.Generator().manual_seed(1)
    pairs = [quantize_fp8_ref(torch.randn(1, 40, h, 16, generator=g), "head") for h in (4, 2, 2)]
    (q, qs), (k, ks), (v, vs) = [(t.to(DEVICE), s.to(DEVICE)) for t, s in pairs]

    def f(q, k, v, qs, ks, vs):
        return flash_attn_func(q, k, v, causal=True, q_descale=qs, k_descale=ks, v_descale=vs)

    _fresh_compile()
    with dispatch.forced_backend(backend):
        eager = f(q, k, v, qs, ks, vs)
        compiled = torch.compile(f, fullgraph=True, backend="eager")(q, k, v, qs, ks, vs)
        rows = torch.cat([qs, ks, vs], dim=1).float()
        torch.library.opcheck(torch.ops.ioattn.fwd_fp8.default,
                              (q, k, v, rows, None, None, 40, 40, 0.25, -1, 0, 0.0, None, False),
                              test_utils=("test_faketensor",))  # (its schema test multiplies e4m3 tensors)
    assert compiled.dtype == torch.bfloat16 and torch.equal(compiled, eager)
