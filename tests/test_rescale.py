"""Conditional rescaling in the Triton forward (FlashAttention-4; ``dispatch.rescale_threshold``).

With a threshold tau > 0 the forward rescales its accumulator only when some row max grows by more
than tau (log2 units) within one key tile, and otherwise keeps the stale max as the reference
(``kernels/common.softmax_step_lazy``): the same function, not an approximation. The inputs here are
built so that the row max climbs along the sequence: every key carries a level that rises by a small
step (< tau: the rescale is skipped) or jumps (> tau: taken) from one key tile to the next.
``_decisions`` replays the kernel's per-tile choice in float64, so each test asserts which branches
its inputs exercise. Same criterion as tests/test_kernels.py: the float64 ``attention_ref`` oracle,
at most twice PyTorch's own same-dtype error, NaN-poisoned output buffers (``poison_alloc``).
"""
from __future__ import annotations

import math

import pytest
import torch

from conftest import DEVICE, assert_lse_close, assert_matches_oracles, attention_oracles, max_err
from ioattn import flash_attn_func
from ioattn.plan import dispatch
from ioattn.plan.dispatch import TileConfig
from ioattn.masks import key_block_range, keep_mask

FP16, BF16, FP32 = torch.float16, torch.bfloat16, torch.float32
LOG2E = 1.4426950408889634
TILES = TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)  # the same on CPU and CUDA
# level rise (log2 units) at each of the 7 key tiles of 203 keys: small steps, one jump of 20
# (> 16: had the kernel skipped that rescale, fp16 p = 2**20 would overflow to inf)
STEPS = [0, 2, 2, 20, 1, 3, 2]


@pytest.fixture(autouse=True)
def _triton(poison_alloc, tile_override):
    tile_override("fwd", TILES)
    with dispatch.forced_backend("triton"):
        yield


def _stairs(steps, b, sq, sk, h, hk, d, dtype, block_n=TILES.block_n):
    """(q, k, v, dout): log2-domain scores = the level of the key's tile (cumulative ``steps``) plus
    noise of std ~0.5, through a constant channel (q[..., 0] = 1, k[..., 0] = level / scale)."""
    assert len(steps) == -(-sk // block_n)
    scale_log2 = d ** -0.5 * LOG2E
    level = torch.tensor(steps, dtype=torch.float64).cumsum(0)[torch.arange(sk) // block_n]
    q, k = torch.randn(b, sq, h, d) * 0.6, torch.randn(b, sk, hk, d) * 0.6
    q[..., 0] = 1.0
    k[..., 0] = (level / scale_log2).float()[None, :, None]
    v, dout = torch.randn(b, sk, hk, d), torch.randn(b, sq, h, d)
    return tuple(t.to(dtype=dtype, device=DEVICE) for t in (q, k, v, dout))


def _decisions(q, k, window, tau, tiles=TILES):
    """The kernel's choice per (query block, head, key tile), replayed in float64: the number of key
    tiles that rescale, those that skip, the rescales no row's first key forced (jumps), those where
    a row meets its first key after the block's first tile (late first keys), and the skips while
    some row has seen no key yet (padding rows past seqlen_q left out)."""
    sq, sk, h, d = q.shape[1], k.shape[1], q.shape[2], q.shape[3]
    kk = k.double().repeat_interleave(h // k.shape[2], dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), kk) * d ** -0.5 * LOG2E
    s = s.masked_fill(~keep_mask(sq, sk, window, device=s.device), -math.inf)
    n = dict(taken=0, skipped=0, jumps=0, late_first_keys=0, skipped_with_empty_rows=0)
    for m0 in range(0, sq, tiles.block_m):
        m = torch.full(s[:, :, m0:m0 + tiles.block_m, 0].shape, -math.inf, dtype=torch.float64, device=s.device)
        for t in range(*key_block_range(m0, tiles.block_m, tiles.block_n, sq, sk, window)):
            tile = s[:, :, m0:m0 + tiles.block_m, t * tiles.block_n:(t + 1) * tiles.block_n]
            m_new = torch.maximum(m, tile.amax(-1))
            taken = (m_new - m.clamp(min=-3.4028234663852886e38)).amax(-1) > tau
            n["taken"] += int(taken.sum())
            n["skipped"] += int((~taken).sum())
            n["jumps"] += int((taken & torch.isfinite(m).all(-1)).sum())
            late = (torch.isneginf(m) & torch.isfinite(m_new)).any(-1) & torch.isfinite(m).any(-1)
            n["late_first_keys"] += int((taken & late).sum())
            n["skipped_with_empty_rows"] += int((~taken & torch.isneginf(m_new).any(-1)).sum())
            m = torch.where(taken[..., None], m_new, m)
    return n


def _run(q, k, v, dout, tau, window=(-1, -1), grads=True):
    qg, kg, vg = (x.clone().requires_grad_(grads) for x in (q, k, v))
    with dispatch.rescale_threshold(tau):
        out, lse, _ = flash_attn_func(qg, kg, vg, window_size=window, return_attn_probs=True)
    g = torch.autograd.grad(out, (qg, kg, vg), dout) if grads else None
    return out.detach(), lse, g


MASKS = {"full": (-1, -1), "causal": (-1, 0),
         # a band: rows of one query block reach their first key in different key tiles, and a
         # row's first key must force the rescale
         "window": (50, 10)}


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", [FP16, BF16, FP32], ids=["fp16", "bf16", "fp32"])
def test_matches_reference(dtype, mask):
    # GQA 2:1, seqlens not multiples of the 32-row / 32-key tiles; forward, lse and the backward
    # (which reads the lse) against the float64 oracle
    q, k, v, dout = _stairs(STEPS, 1, 113, 203, 2, 1, 64, dtype)
    window = MASKS[mask]
    n = _decisions(q, k, window, 8.0)
    assert n["skipped"] > 0 and n["jumps"] > 0, n  # both branches, a jump past the first tile
    if mask == "window":
        assert n["late_first_keys"] > 0, n
    out, lse, grads = _run(q, k, v, dout, 8.0, window)
    oracles = attention_oracles(q, k, v, dout, window=window)
    name = f"tau=8 {dtype} {mask}"
    assert_matches_oracles(name, out, None, oracles)
    assert_lse_close(name, lse, oracles["lse64"].float())
    _assert_gradients(name, q, k, v, dout, window, grads, oracles)


def _assert_gradients(name, q, k, v, dout, window, grads, oracles):
    """The backward reads the rescaled forward's out and lse: its gradients within twice PyTorch's own
    error, or, where the inputs' rows each weigh a few keys (the stairs' jumps put them there, the
    backward's known limitation: test_kernels.py's few-keys test), no further from the oracle than the
    gradients after the default forward (which rescales at every tile)."""
    default = None
    for i, (gname, g, g64, gt) in enumerate(zip(("dq", "dk", "dv"), grads, oracles["grads64"], oracles["grads_t"])):
        err, base = max_err(g, g64), max_err(gt, g64)
        if err <= 2 * base + 1e-5:
            continue
        if default is None:
            default = _run(q, k, v, dout, 0.0, window)[2]
        assert err <= 1.01 * max_err(default[i], g64), \
            f"{name} {gname}: error {err:.3e} > 2 x torch's {base:.3e}, and above the default forward's"


@pytest.mark.parametrize("dtype", [FP16, BF16], ids=["fp16", "bf16"])
def test_rows_without_keys(dtype, tile_override):
    # causal with seqlen_q > seqlen_k: rows 0..19 see no key. With 64-row tiles, block 0 also holds
    # rows that reach into key tile 1, which is skipped while rows 0..19 are still at -inf (the
    # guard against -inf - -inf = NaN in the skip path)
    tiles = TileConfig(block_m=64, block_n=32, num_warps=4, num_stages=1)
    tile_override("fwd", tiles)
    q, k, v, dout = _stairs([0, 2, 2, 20, 2], 2, 150, 130, 2, 1, 32, dtype)
    n = _decisions(q, k, (-1, 0), 8.0, tiles)
    assert n["skipped_with_empty_rows"] > 0 and n["jumps"] > 0, n
    out, lse, grads = _run(q, k, v, dout, 8.0, (-1, 0))
    empty = ~keep_mask(150, 130, (-1, 0), device=DEVICE).any(dim=1)
    assert int(empty.sum()) == 20
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert (out[:, empty] == 0).all(), "rows without keys must output exactly 0"
    assert torch.isneginf(lse[:, :, empty]).all() and torch.isfinite(lse[:, :, ~empty]).all()
    assert (grads[0][:, empty] == 0).all(), "rows without keys must get dq = 0"
    oracles = attention_oracles(q, k, v, dout, window=(-1, 0))
    assert_matches_oracles(f"rows without keys {dtype}", out, grads, oracles)
    assert_lse_close(f"rows without keys {dtype}", lse, oracles["lse64"].float())


def test_branch_is_observable():
    # level steps of 2 at every tile: tau = 0.5 rescales at every tile, which is exactly the default
    # step (bit for bit under the interpreter); tau = 8 skips, which changes the rounding (p and l
    # are taken against another max) but not the result
    q, k, v, dout = _stairs([0, 2, 2, 2, 2], 1, 64, 160, 2, 1, 64, FP16)
    assert _decisions(q, k, (-1, -1), 0.5)["skipped"] == 0
    assert _decisions(q, k, (-1, -1), 8.0)["skipped"] > 0
    out0, lse0, _ = _run(q, k, v, dout, 0.0, grads=False)
    out_half, lse_half, _ = _run(q, k, v, dout, 0.5, grads=False)
    out8, lse8, _ = _run(q, k, v, dout, 8.0, grads=False)
    if DEVICE == "cpu":  # the interpreter runs the same numpy operations in the same order
        assert torch.equal(out_half, out0) and torch.equal(lse_half, lse0)
    assert not (torch.equal(out8, out0) and torch.equal(lse8, lse0)), "tau=8 never took the skip path"
    oracles = attention_oracles(q, k, v, dout)
    for tau, out, lse in ((0.5, out_half, lse_half), (8.0, out8, lse8)):
        assert_matches_oracles(f"tau={tau}", out, None, oracles)
        assert_lse_close(f"tau={tau}", lse, oracles["lse64"].float())


def test_off_is_the_default_bit_for_bit(monkeypatch):
    q, k, v, _ = _stairs([0, 2, 2, 2, 2], 1, 64, 160, 2, 1, 64, FP16)
    monkeypatch.delenv("IOATTN_RESCALE_TAU", raising=False)
    default = flash_attn_func(q, k, v, return_attn_probs=True)[:2]
    with dispatch.rescale_threshold(0.0):
        off = flash_attn_func(q, k, v, return_attn_probs=True)[:2]
    assert all(torch.equal(a, b) for a, b in zip(default, off))
    # the environment variable reaches the kernel (tau = 8 skips here, see above) ...
    monkeypatch.setenv("IOATTN_RESCALE_TAU", "8")
    from_env = flash_attn_func(q, k, v, return_attn_probs=True)[:2]
    assert not all(torch.equal(a, b) for a, b in zip(default, from_env))
    with dispatch.rescale_threshold(8.0):
        assert all(torch.equal(a, b) for a, b in zip(from_env, flash_attn_func(q, k, v, return_attn_probs=True)[:2]))
    # ... unless the context manager is active
    with dispatch.rescale_threshold(0.0):
        assert all(torch.equal(a, b) for a, b in zip(default, flash_attn_func(q, k, v, return_attn_probs=True)[:2]))


@pytest.mark.parametrize("tau", [-1.0, 16.0, 15.01, math.inf, math.nan, "eight", None])
def test_bad_threshold_raises(tau):
    with pytest.raises(ValueError, match="dispatch.rescale_threshold"), dispatch.rescale_threshold(tau):
        pass


def test_bad_threshold_from_env_or_default_raises(monkeypatch):
    q, k, v, _ = _stairs([0, 2], 1, 8, 40, 1, 1, 16, FP16)
    with dispatch.rescale_threshold(15.0):  # the largest accepted
        assert dispatch.fwd_rescale_tau() == 15.0
    monkeypatch.setenv("IOATTN_RESCALE_TAU", "20")
    with pytest.raises(ValueError, match="IOATTN_RESCALE_TAU"):
        flash_attn_func(q, k, v)
    monkeypatch.delenv("IOATTN_RESCALE_TAU")
    monkeypatch.setattr(dispatch, "FWD_RESCALE_TAU", -2.0)
    with pytest.raises(ValueError, match="FWD_RESCALE_TAU"):
        flash_attn_func(q, k, v)
