"""merge_attention_states: the exact LSE merge, against attention over the union of the key sets."""
import pytest
import torch

import ioattn
from conftest import DEVICE
from ioattn.plan import dispatch
from ioattn.reference import attention_ref
from ioattn.reference.merge import merge_states_ref

BACKENDS = ["reference", "triton"]
pytestmark = pytest.mark.usefixtures("poison_alloc")  # buffers the merge allocates start as NaN


def _split_attention(q, k, v, bounds):
    """Attention of q over each slice of the keys: (outs, lses) in merge layout (lse like out[..., 0])."""
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, lse = attention_ref(q, k[:, a:b], v[:, a:b])
        outs.append(o)
        lses.append(lse.transpose(1, 2))  # (batch, nheads, seqlen) -> (batch, seqlen, nheads)
    return outs, lses


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bounds", [(0, 100), (0, 37, 100), (0, 1, 2, 50, 99, 100), (0, 0, 60, 60, 100),
                                    tuple(range(0, 100, 1)) + (100,)])  # 100 sets: more than one 64-split load
def test_merge_equals_attention_over_the_union(backend, bounds):
    q = torch.randn(2, 5, 3, 24, dtype=torch.float64, device=DEVICE)
    k = torch.randn(2, 100, 3, 24, dtype=torch.float64, device=DEVICE)
    v = torch.randn(2, 100, 3, 24, dtype=torch.float64, device=DEVICE)
    full, full_lse = attention_ref(q, k, v)
    outs, lses = _split_attention(q, k, v, bounds)  # empty slices give lse -inf and out 0
    outs = [o.float() for o in outs]
    lses = [lse.float() for lse in lses]
    with dispatch.forced_backend(backend):
        out, lse = ioattn.merge_attention_states(outs, lses)
    assert out.shape == full.shape and lse.shape == full_lse.transpose(1, 2).shape
    assert (out.double() - full).abs().max() < 1e-5
    assert (lse.double() - full_lse.transpose(1, 2)).abs().max() < 1e-5


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_of_empty_sets(backend):
    """Rows where every split saw no key: output 0 and lse -inf, never NaN; mixed rows unaffected."""
    outs = torch.randn(3, 4, 2, 8, device=DEVICE)
    lses = torch.randn(3, 4, 2, device=DEVICE)
    lses[:, 0] = float("-inf")   # row 0: every split empty
    lses[1, 1] = float("-inf")   # row 1: one split empty
    with dispatch.forced_backend(backend):
        out, lse = ioattn.merge_attention_states(outs, lses)
    assert torch.isneginf(lse[0]).all() and (out[0] == 0).all()
    assert not torch.isnan(out).any() and torch.isfinite(lse[1:]).all()
    ref_out, ref_lse = merge_states_ref(outs[[0, 2], 1:2], lses[[0, 2], 1:2])
    assert torch.allclose(out[1:2], ref_out, atol=1e-6) and torch.allclose(lse[1:2], ref_lse, atol=1e-6)


def test_merge_with_ioattn_kernels_and_bf16_outputs():
    """Partials from the project's own kernel (causal off, so key slices are independent)."""
    q = torch.randn(1, 33, 4, 64, dtype=torch.bfloat16)
    k, v = torch.randn(1, 90, 2, 64, dtype=torch.bfloat16), torch.randn(1, 90, 2, 64, dtype=torch.bfloat16)
    parts = [ioattn.flash_attn_func(q, k[:, a:b], v[:, a:b], return_attn_probs=True) for a, b in ((0, 45), (45, 90))]
    out, lse = ioattn.merge_attention_states([p[0] for p in parts], [p[1].transpose(1, 2) for p in parts])
    full, full_lse, _ = ioattn.flash_attn_func(q, k, v, return_attn_probs=True)
    ref, _ = attention_ref(q, k, v)
    assert out.dtype == torch.bfloat16
    assert (out.double() - ref).abs().max() <= 2 * (full.double() - ref).abs().max() + 1e-2
    assert (lse - full_lse.transpose(1, 2)).abs().max() < 1e-3


def test_merge_is_differentiable():
    outs = torch.randn(2, 3, 4, 8, dtype=torch.float64, requires_grad=True)
    lses = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda o, s: ioattn.merge_attention_states(o, s), (outs, lses))


@pytest.mark.parametrize("outs,lses,err,match", [
    (torch.randn(2, 3, 4, 8), torch.randn(2, 3, 5), ValueError, "shape of outs without its last"),
    ([torch.randn(3, 4, 8), torch.randn(3, 4, 9)], [torch.randn(3, 4)] * 2, ValueError, "every tensor in outs"),
    (torch.randn(0, 3, 4, 8), torch.randn(0, 3, 4), ValueError, "at least one partial"),
    ("outs", torch.randn(2, 3), TypeError, "outs must be a tensor or a sequence"),
    (torch.ones(2, 3, 4, 8, dtype=torch.int32), torch.randn(2, 3, 4), TypeError, "floating point"),
])
def test_merge_bad_input(outs, lses, err, match):
    with pytest.raises(err, match=match):
        ioattn.merge_attention_states(outs, lses)


def _merged_halves(varlen):
    """(merged (out, lse), full (out, lse)): two real calls over halves of the keys merged with
    lse_layout='flash_attn', and the call over all keys."""
    q = torch.randn(2, 9, 4, 32, device=DEVICE)
    k = torch.randn(2, 40, 2, 32, device=DEVICE)
    v = torch.randn(2, 40, 2, 32, device=DEVICE)
    halves = [(0, 15), (15, 40)]
    if varlen:  # the same two sequences packed: (tokens, heads, d) and lse (heads, tokens)
        cu_q = torch.tensor([0, 9, 18], dtype=torch.int32, device=DEVICE)

        def call(a, b):
            cu_k = torch.tensor([0, b - a, 2 * (b - a)], dtype=torch.int32, device=DEVICE)
            return ioattn.flash_attn_varlen_func(q.flatten(0, 1), k[:, a:b].flatten(0, 1), v[:, a:b].flatten(0, 1),
                                                 cu_q, cu_k, 9, b - a, return_attn_probs=True)[:2]
    else:
        def call(a, b):
            return ioattn.flash_attn_func(q, k[:, a:b], v[:, a:b], return_attn_probs=True)[:2]
    parts = [call(a, b) for a, b in halves]
    merged = ioattn.merge_attention_states([p[0] for p in parts], [p[1] for p in parts], lse_layout="flash_attn")
    return merged, call(0, 40)


@pytest.mark.parametrize("varlen", [False, True])
def test_merge_takes_flash_attn_lse_as_it_comes(varlen):
    """The merged lse comes back in the layout it came in; the result is the call over all keys."""
    (out, lse), (full_out, full_lse) = _merged_halves(varlen)
    assert lse.shape == full_lse.shape and out.shape == full_out.shape
    assert (out - full_out).abs().max() < 1e-5 and (lse - full_lse).abs().max() < 1e-5


def test_merge_lse_layout_refusals():
    outs = torch.randn(2, 1, 5, 3, 8)
    flash_lse = torch.randn(2, 1, 3, 5)
    with pytest.raises(ValueError, match="lse_layout='flash_attn'"):  # the message names the fix
        ioattn.merge_attention_states(outs, flash_lse)
    with pytest.raises(ValueError, match="lse_layout must be one of"):
        ioattn.merge_attention_states(outs, flash_lse, lse_layout="bhs")
    with pytest.raises(ValueError, match="heads before the sequence"):
        ioattn.merge_attention_states(outs, flash_lse.transpose(-1, -2), lse_layout="flash_attn")
