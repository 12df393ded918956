"""ioattn.launch.cached: the specialization key of a cached launch, the fallbacks, and (on a GPU) that a
cached launch computes what Triton's own launch computes."""
import pytest
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from ioattn.launch.cached import CachedLaunch, _arg_key
from ioattn.plan import dispatch


def _add(X, Y, n, BLOCK: tl.constexpr, SCALE: tl.constexpr = 2):
    i = tl.arange(0, BLOCK)
    tl.store(Y + i, tl.load(X + i, mask=i < n) * SCALE, mask=i < n)


def _runtime_after_constexpr(X, BLOCK: tl.constexpr, n):
    tl.store(X + tl.arange(0, BLOCK), n)


def test_arg_key_separates_what_triton_specializes_on():
    x = torch.randn(64, dtype=torch.float16)
    assert _arg_key(x) == (torch.float16, x.data_ptr() % 16 == 0)
    assert _arg_key(x[1:]) != _arg_key(x[8:])  # 2-byte offset: not 16-byte aligned; 16-byte offset: aligned
    assert _arg_key(x.float()) != _arg_key(x)  # dtype
    assert _arg_key(16) != _arg_key(17) and _arg_key(1) != _arg_key(2)  # values (divisibility, the value 1)
    assert _arg_key(True) != _arg_key(1)  # a bool is i1, not an int
    assert _arg_key(0.5) == _arg_key(3.0)  # floats are always fp32 arguments
    assert _arg_key(None) is None
    with pytest.raises(TypeError, match="no key"):
        _arg_key("a string")


def test_tensor_descriptor_key():
    from triton.tools.tensor_descriptor import TensorDescriptor
    t = torch.randn(4, 32, 16, dtype=torch.bfloat16)
    a = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 16, 16])
    b = TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 8, 16])
    assert _arg_key(a) != _arg_key(b) and _arg_key(a) == _arg_key(
        TensorDescriptor(t.clone(), list(t.shape), list(t.stride()), [1, 16, 16]))


def test_cached_launch_structure_and_fallback(monkeypatch):
    """A JIT kernel with every constexpr after the runtime arguments is launched directly; one with a
    runtime argument after a constexpr, an interpreted kernel, or IOATTN_CACHED_LAUNCH=0 go through
    Triton's own launch."""
    assert CachedLaunch(JITFunction(_add)).enabled()
    assert not CachedLaunch(JITFunction(_runtime_after_constexpr)).enabled()
    assert dispatch.cached_launch()
    monkeypatch.setenv("IOATTN_CACHED_LAUNCH", "0")
    assert not dispatch.cached_launch()  # the callers pass it as ``cached``
    monkeypatch.delenv("IOATTN_CACHED_LAUNCH")
    calls = []

    class Fake:  # stands in for an interpreted kernel: indexing by the grid gives the launch
        def __getitem__(self, grid):
            return lambda *a, **k: calls.append((grid, a, k))
    launch = CachedLaunch(Fake())
    launch((3,), (1, 2), {"BLOCK": 4})
    assert calls == [((3,), (1, 2), {"BLOCK": 4})]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cached_launch_matches_triton_launch():
    kernel = triton.jit(_add)
    launch = CachedLaunch(kernel)
    x = torch.randn(1000, device="cuda")
    for n, scale in ((1000, 2), (999, 3), (1000, 2)):
        y = torch.full_like(x, float("nan"))
        launch((1,), (x, y, n), {"BLOCK": 1024, "SCALE": scale})
        expect = torch.where(torch.arange(1000, device="cuda") < n, x * scale, float("nan"))
        torch.testing.assert_close(y, expect, equal_nan=True, rtol=0, atol=0)
    assert len(launch._kernels) == 2  # the third call reused the first call's kernel
    y = torch.empty(1001, device="cuda")[1:]  # a 4-byte offset: not 16-byte aligned, a new key
    launch((1,), (x, y, 1000), {"BLOCK": 1024})
    torch.testing.assert_close(y, 2 * x, rtol=0, atol=0)
    assert len(launch._kernels) == 3
