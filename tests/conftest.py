import os
import zlib

import torch

# Without a GPU the Triton kernels run under Triton's interpreter; this must be set before any
# kernel module is imported, since @triton.jit reads it at decoration time.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def _seed(request):
    # a fresh but reproducible draw per test (never zeros): the seed comes from the test's name
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def max_err(a, b):
    return (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max().item()


def assert_within_torch_error(name, got, ref64, torch_same_dtype, floor=1e-5):
    """flash-attn's criterion: the kernel's error against the float64 oracle is at most twice the
    error of PyTorch's standard attention computed in the same dtype (plus a tiny floor for fp32)."""
    assert not torch.isnan(got).any(), f"{name}: NaN in output"
    err, base = max_err(got, ref64), max_err(torch_same_dtype, ref64)
    assert err <= 2 * base + floor, f"{name}: error {err:.3e} > 2 x torch's {base:.3e} + {floor:g}"


# ---- shared helpers for test_kernels.py / test_api.py (oracle bundles and the 2x criterion) ----

def _leaf(t, dtype=None):
    t = t.detach()
    return (t.to(dtype) if dtype is not None else t.clone()).requires_grad_()


def attention_oracles(q, k, v, dout, **ref_kw):
    """The float64 oracle and PyTorch's same-dtype standard attention for one batched problem.

    Returns a dict with out64, lse64, grads64 (dq, dk, dv of the float64 oracle for ``dout``) and
    out_t, grads_t (the same computed by ``attention_ref(..., upcast=False)`` in the input dtype).
    ``ref_kw`` are ``attention_ref``'s keyword arguments (normalised window, softcap, alibi, ...).
    """
    from ioattn.reference import attention_ref

    q64, k64, v64 = (_leaf(x, torch.float64) for x in (q, k, v))
    out64, lse64 = attention_ref(q64, k64, v64, **ref_kw)
    grads64 = torch.autograd.grad(out64, (q64, k64, v64), dout.detach().double(), allow_unused=True)
    qt, kt, vt = (_leaf(x) for x in (q, k, v))
    out_t, _ = attention_ref(qt, kt, vt, upcast=False, **ref_kw)
    grads_t = torch.autograd.grad(out_t, (qt, kt, vt), dout.detach(), allow_unused=True)
    fix = lambda gs, ref: tuple(torch.zeros_like(r) if g is None else g for g, r in zip(gs, ref))  # noqa: E731
    return dict(out64=out64.detach(), lse64=lse64.detach(), grads64=fix(grads64, (q64, k64, v64)),
                out_t=out_t.detach(), grads_t=fix(grads_t, (qt, kt, vt)))


def assert_lse_close(name, lse, lse64, atol=1e-3):
    """lse against the oracle's: -inf exactly where the oracle is -inf, finite and close elsewhere."""
    assert lse.dtype == torch.float32, f"{name}: lse dtype {lse.dtype}"
    assert lse.shape == lse64.shape, f"{name}: lse shape {tuple(lse.shape)} != {tuple(lse64.shape)}"
    assert not torch.isnan(lse).any(), f"{name}: NaN in lse"
    empty = torch.isneginf(lse64)
    assert torch.equal(torch.isneginf(lse), empty), f"{name}: -inf pattern of lse differs from the oracle's"
    if (~empty).any():
        assert torch.isfinite(lse[~empty]).all(), f"{name}: non-finite lse on rows that see a key"
        err = max_err(lse[~empty], lse64[~empty])
        assert err <= atol, f"{name}: lse error {err:.3e} > {atol:g}"


def assert_matches_oracles(name, out, grads, oracles, floor=1e-5):
    """Output and (dq, dk, dv) within twice PyTorch's own same-dtype error of the float64 oracle."""
    assert out.shape == oracles["out64"].shape and out.dtype == oracles["out_t"].dtype, name
    assert_within_torch_error(f"{name} out", out, oracles["out64"], oracles["out_t"], floor)
    if grads is not None:
        for gname, g, g64, gt in zip(("dq", "dk", "dv"), grads, oracles["grads64"], oracles["grads_t"]):
            assert g.shape == g64.shape, f"{name} {gname}: shape {tuple(g.shape)} != {tuple(g64.shape)}"
            assert torch.isfinite(g).all(), f"{name} {gname}: non-finite gradient"
            assert_within_torch_error(f"{name} {gname}", g, g64, gt, floor)


@pytest.fixture
def tile_override():
    """Yields ``set(kind, TileConfig)``; every override is removed after the test."""
    from ioattn import dispatch

    kinds = []

    def _set(kind, config):
        kinds.append(kind)
        dispatch.set_tile_override(kind, config)

    yield _set
    for kind in kinds:
        dispatch.set_tile_override(kind, None)
