"""The tiled reference algorithms and the Philox twin against their oracles.

Forward passes are checked against ``attention_ref`` in float64; the backward pass against
autograd through ``attention_ref``; ``philox_randint`` bit for bit against ``tl.randint`` run by
the Triton interpreter.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch

from ioattn.masks import keep_mask, key_block_range
from ioattn.reference import (attention_ref, dropout_keep_mask, dropout_threshold, flash1_forward,
                              flash2_forward, flash_backward, philox_randint)

# ----------------------------------------------------------------------------------------------
# Philox
# ----------------------------------------------------------------------------------------------

# Runs in a child process: TRITON_INTERPRET must be set before triton is first imported, and
# setting it in this process would also switch every other test module's kernels to the
# interpreter (including on GPU machines).
_TRITON_RANDINT = r"""
import json, sys
import torch
import triton
import triton.language as tl

@triton.jit
def randint_kernel(out_ptr, off_ptr, seed, n, BLOCK: tl.constexpr):
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    off = tl.load(off_ptr + idx, mask=idx < n, other=0)
    tl.store(out_ptr + idx, tl.randint(seed, off), mask=idx < n)

seeds, offsets = json.loads(sys.stdin.read())
offsets = torch.tensor(offsets, dtype=torch.int64)
result = []
for seed in seeds:
    out = torch.full_like(offsets, -1)
    randint_kernel[(triton.cdiv(offsets.numel(), 64),)](out, offsets, seed, offsets.numel(), BLOCK=64)
    result.append(out.tolist())
print(json.dumps(result))
"""


def test_philox_matches_triton_randint():
    gen = torch.Generator().manual_seed(0)
    offsets = torch.cat([
        torch.arange(0, 70),
        torch.tensor([2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 2**33 + 12345, 2**47 - 3,
                      2**62 + 7, 2**63 - 1, -1, -(2**40)]),
        torch.randint(0, 2**62, (40,), generator=gen),
    ]).to(torch.int64)
    seeds = [0, 1, 42, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**32 + 1, 0x1234_5678_9ABC_DEF0, 2**63 - 1]
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_RANDINT], input=json.dumps([seeds, offsets.tolist()]),
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    expected = torch.tensor(json.loads(proc.stdout.strip().splitlines()[-1]), dtype=torch.int64)
    for seed, exp in zip(seeds, expected):
        got = philox_randint(seed, offsets)
        assert got.dtype == torch.int64
        assert torch.equal(got, exp), f"seed {seed}: first mismatch at {(got != exp).nonzero()[0].item()}"


def test_dropout_threshold():
    assert dropout_threshold(0.0) == 0
    assert dropout_threshold(0.5) == 2**31
    assert dropout_threshold(0.25) == 2**30
    assert dropout_threshold(1.0) == 2**32 - 1


def test_dropout_keep_mask_layout_and_rate():
    seed, p, b, h, sq, sk = 1234, 0.3, 2, 3, 17, 29
    keep = dropout_keep_mask(seed, p, b, h, sq, sk)
    assert keep.shape == (b, h, sq, sk) and keep.dtype == torch.bool
    for bi, hi, i, j in [(0, 0, 0, 0), (1, 2, 16, 28), (1, 0, 5, 7), (0, 2, 9, 3)]:
        counter = ((bi * h + hi) * sq + i) * sk + j
        rnd = philox_randint(seed, torch.tensor([counter])).item()
        assert keep[bi, hi, i, j].item() == (rnd >= dropout_threshold(p))
    assert abs(keep.double().mean().item() - (1 - p)) < 0.03
    assert dropout_keep_mask(seed, 0.0, b, h, sq, sk).all()


# ----------------------------------------------------------------------------------------------
# key_block_range
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seqlens", [(1, 1), (113, 203), (203, 113), (64, 128), (5, 2), (37, 37), (60, 40)])
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (20, 0), (7, 3), (0, 0), (-1, 5), (40, -1)])
@pytest.mark.parametrize("blocks", [(64, 64), (16, 32), (32, 16), (7, 5)])
def test_key_block_range_covers_keep_mask(seqlens, window, blocks):
    sq, sk = seqlens
    bm, bn = blocks
    keep = keep_mask(sq, sk, window)
    n_blocks = -(-sk // bn)
    for m0 in range(0, sq, bm):
        lo, hi = key_block_range(m0, bm, bn, sq, sk, window)
        assert 0 <= lo <= hi <= n_blocks
        for nb in range(n_blocks):
            has_visible = bool(keep[m0:m0 + bm, nb * bn:(nb + 1) * bn].any())
            # Skipping must be safe (no visible entry outside) and, since consecutive rows' windows
            # overlap into one contiguous span, also tight (no wasted tile inside).
            assert has_visible == (lo <= nb < hi), f"q block {m0}, key block {nb}, range {(lo, hi)}"


# ----------------------------------------------------------------------------------------------
# Tiled forward / backward against the float64 oracle
# ----------------------------------------------------------------------------------------------

_SEQLENS = [(1, 1), (113, 203), (203, 113), (64, 128), (5, 2)]
_WINDOWS = [(-1, -1), (-1, 0), (30, 0), (7, 3), (0, 0)]
_HEADDIMS = [1, 59, 64, 80]
_HEADS = [(2, 2), (4, 2), (4, 1)]  # (nheads, nheads_kv): GQA ratios 1, 2, 4
_SOFTCAPS = [0.0, 2.5]
_ALIBI = [None, "heads", "batch_heads"]
_DROPOUT = [0.0, 0.0, 0.17]
_BLOCKS = [(64, 64), (16, 32), (32, 16), (128, 128)]


def _make_cases():
    # Seqlens x windows in full; the other axes cycle with co-prime periods so that every value
    # of each appears, in varied combinations, without a full Cartesian product.
    cases = []
    for idx, (seqlens, window) in enumerate(itertools.product(_SEQLENS, _WINDOWS)):
        cases.append(dict(seqlens=seqlens, window=window, headdim=_HEADDIMS[idx % 4],
                          heads=_HEADS[idx % 3], softcap=_SOFTCAPS[idx % 2], alibi=_ALIBI[idx % 3],
                          dropout_p=_DROPOUT[(idx // 2) % 3], blocks=_BLOCKS[idx % 4], batch=1 + idx % 2))
    # Everything at once, a value head dim unlike q's, and a custom softmax scale.
    cases.append(dict(seqlens=(113, 203), window=(50, 9), headdim=80, headdim_v=33, heads=(4, 1),
                      softcap=2.5, alibi="batch_heads", dropout_p=0.25, blocks=(32, 16), batch=2,
                      softmax_scale=0.3))
    cases.append(dict(seqlens=(203, 113), window=(-1, 0), headdim=59, headdim_v=8, heads=(4, 2),
                      softcap=0.0, alibi="heads", dropout_p=0.1, blocks=(16, 32), batch=2))
    return cases


_CASES = _make_cases()


def _case_id(c):
    return (f"s{c['seqlens'][0]}x{c['seqlens'][1]}-w{c['window'][0]},{c['window'][1]}-d{c['headdim']}"
            f"-h{c['heads'][0]}/{c['heads'][1]}-cap{c['softcap']}-alibi{c['alibi']}-p{c['dropout_p']}"
            f"-blk{c['blocks'][0]}x{c['blocks'][1]}")


def _inputs(case, seed, dtype=torch.float64):
    """Fresh random tensors and keyword args for one case."""
    gen = torch.Generator().manual_seed(seed)
    (sq, sk), (h, hk), b = case["seqlens"], case["heads"], case["batch"]
    d, dv = case["headdim"], case.get("headdim_v", case["headdim"])
    q = torch.randn(b, sq, h, d, generator=gen, dtype=dtype)
    k = torch.randn(b, sk, hk, d, generator=gen, dtype=dtype)
    v = torch.randn(b, sk, hk, dv, generator=gen, dtype=dtype)
    dout = torch.randn(b, sq, h, dv, generator=gen, dtype=dtype)
    slopes = None
    if case["alibi"] == "heads":
        slopes = torch.rand(h, generator=gen, dtype=dtype) * 0.5 + 0.05
    elif case["alibi"] == "batch_heads":
        slopes = torch.rand(b, h, generator=gen, dtype=dtype) * 0.5 + 0.05
    kw = dict(softmax_scale=case.get("softmax_scale"), window=case["window"], softcap=case["softcap"],
              alibi_slopes=slopes, dropout_p=case["dropout_p"])
    if case["dropout_p"] > 0:
        kw["dropout_keep"] = dropout_keep_mask(seed + 7, case["dropout_p"], b, h, sq, sk)
    return q, k, v, dout, kw


def _assert_close(actual, expected, rtol=1e-10):
    assert actual.dtype == expected.dtype
    finite = expected[torch.isfinite(expected)]
    atol = rtol * max(1.0, finite.abs().max().item() if finite.numel() else 1.0)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def _blocks(case):
    bm, bn = case["blocks"]
    return dict(block_m=bm, block_n=bn)


@pytest.mark.parametrize("case", _CASES, ids=_case_id)
@pytest.mark.parametrize("forward", [flash1_forward, flash2_forward], ids=["flash1", "flash2"])
def test_forward_matches_reference(case, forward):
    q, k, v, _, kw = _inputs(case, seed=_CASES.index(case))
    out_ref, lse_ref = attention_ref(q, k, v, **kw)
    out, lse = forward(q, k, v, **kw, **_blocks(case))
    assert out.shape == out_ref.shape and lse.shape == lse_ref.shape
    _assert_close(out, out_ref)
    _assert_close(lse, lse_ref)


@pytest.mark.parametrize("case", _CASES, ids=_case_id)
def test_backward_matches_autograd(case):
    q, k, v, dout, kw = _inputs(case, seed=1000 + _CASES.index(case))
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out_ref, lse_ref = attention_ref(q, k, v, **kw)
    grads_ref = torch.autograd.grad(out_ref, (q, k, v), dout)
    out, lse = flash2_forward(q.detach(), k.detach(), v.detach(), **kw, **_blocks(case))
    grads = flash_backward(q.detach(), k.detach(), v.detach(), out, dout, lse, **kw, **_blocks(case))
    for name, g, g_ref in zip("qkv", grads, grads_ref):
        assert g.shape == g_ref.shape, name
        assert torch.isfinite(g).all(), name
        _assert_close(g, g_ref)


@pytest.mark.parametrize("seqlens,window", [((5, 2), (-1, 0)), ((203, 113), (-1, 0)), ((60, 40), (0, 0)),
                                            ((70, 20), (3, 1))])
def test_rows_without_keys(seqlens, window):
    sq, sk = seqlens
    case = dict(seqlens=seqlens, window=window, headdim=16, heads=(4, 2), softcap=2.5, alibi="heads",
                dropout_p=0.1, blocks=(16, 32), batch=2)
    q, k, v, dout, kw = _inputs(case, seed=sq * 1000 + sk)
    empty = ~keep_mask(sq, sk, window).any(dim=1)
    assert empty.any() and not empty.all()
    for forward in (flash1_forward, flash2_forward):
        out, lse = forward(q, k, v, **kw, **_blocks(case))
        assert not out.isnan().any() and not lse.isnan().any()
        assert (out[:, empty] == 0).all()
        assert (lse[:, :, empty] == float("-inf")).all()
        assert torch.isfinite(lse[:, :, ~empty]).all()
    dq, dk, dv = flash_backward(q, k, v, out, dout, lse, **kw, **_blocks(case))
    for g in (dq, dk, dv):
        assert torch.isfinite(g).all()
    assert (dq[:, empty] == 0).all()
    # Keys no row can see get no gradient either.
    unseen = ~keep_mask(sq, sk, window).any(dim=0)
    assert (dk[:, unseen] == 0).all() and (dv[:, unseen] == 0).all()
    qr, kr, vr = (x.clone().requires_grad_() for x in (q, k, v))
    out_ref, _ = attention_ref(qr, kr, vr, **kw)
    for g, g_ref in zip((dq, dk, dv), torch.autograd.grad(out_ref, (qr, kr, vr), dout)):
        _assert_close(g, g_ref)


def test_float32_inputs_keep_dtype():
    case = dict(seqlens=(45, 70), window=(-1, 0), headdim=32, heads=(4, 2), softcap=0.0, alibi=None,
                dropout_p=0.0, blocks=(16, 16), batch=2)
    q, k, v, dout, kw = _inputs(case, seed=5, dtype=torch.float32)
    out_ref, lse_ref = attention_ref(q, k, v, **kw)
    for forward in (flash1_forward, flash2_forward):
        out, lse = forward(q, k, v, **kw, **_blocks(case))
        assert out.dtype == torch.float32 and lse.dtype == torch.float32
        torch.testing.assert_close(out, out_ref.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(lse, lse_ref.float(), rtol=1e-5, atol=1e-5)
    dq, dk, dv = flash_backward(q, k, v, out, dout, lse, **kw, **_blocks(case))
    assert dq.dtype == dk.dtype == dv.dtype == torch.float32
    assert dk.shape == k.shape and dv.shape == v.shape


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (10, 5)])
def test_tiles_small_and_skipped(monkeypatch, window):
    """Every score tile is at most block_m x block_n (memory linear in seqlen), and exactly the
    tiles inside key_block_range are computed."""
    import ioattn.reference.tiled as tiled

    seen = []
    scores = tiled._Problem.scores

    def spy(self, m0, n0, unit=1.0):
        s, t = scores(self, m0, n0, unit)
        seen.append(tuple(s.shape[-2:]))
        return s, t

    monkeypatch.setattr(tiled._Problem, "scores", spy)
    case = dict(seqlens=(100, 150), window=window, headdim=8, heads=(2, 1), softcap=0.0, alibi=None,
                dropout_p=0.0, blocks=(32, 16), batch=1)
    q, k, v, dout, kw = _inputs(case, seed=3)
    out, lse = flash2_forward(q, k, v, **kw, **_blocks(case))
    flash1_forward(q, k, v, **kw, **_blocks(case))
    flash_backward(q, k, v, out, dout, lse, **kw, **_blocks(case))
    ranges = [key_block_range(m0, 32, 16, 100, 150, window) for m0 in range(0, 100, 32)]
    n_tiles = sum(hi - lo for lo, hi in ranges)
    assert n_tiles <= math.ceil(100 / 32) * math.ceil(150 / 16)
    assert len(seen) == 3 * n_tiles
    assert all(m <= 32 and n <= 16 for m, n in seen)
