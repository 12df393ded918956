"""The plan and launch layers on the CPU: the portable tile policy, the Hopper policy tables through
their named options and ``explain_dispatch``, the launchers' wiring (fake launches stand in for the GPU)
and the backward's preprocess in the Hopper layout (interpreted)."""
from __future__ import annotations

import os
from dataclasses import replace

import pytest
import torch

from ioattn import flash_attn_func
from ioattn.plan import dispatch
from ioattn.semantics import Semantics

from conftest import fake_launches

FP16, BF16 = torch.float16, torch.bfloat16
# the Gluon forward's lean softmax and its options (the kernel's constexprs), short for the tables below
COND, WARP, QREG, DSUM, MASK = "COND_RESCALE", "RESCALE_BY_WARP", "Q_IN_REGS", "DEFERRED_SUM", "MASK_BRANCH"
LEAN_FLAGS = ("LEAN", COND, WARP, QREG, DSUM, MASK, "PTX_BARRIERS")
# This file uses CPU tensors; they reach the Triton kernels only through the interpreter.
_NO_INTERPRETER = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                     reason="CPU tensors run the Triton kernels only under TRITON_INTERPRET=1 "
                                            "(a CUDA machine covers them in test_kernels.py)")


def _lean(*flags):
    """A Gluon forward build's lean-softmax flags: the lean softmax with the named options on."""
    return frozenset(("LEAN",) + flags)


def _lean_of(cfg):
    """The lean-softmax flags a ``kernel_config`` turns on (none: the lean softmax off); each a bool."""
    assert all(type(cfg["constexprs"][f]) is bool for f in LEAN_FLAGS), cfg["constexprs"]
    return frozenset(f for f in LEAN_FLAGS if cfg["constexprs"][f])


def test_tile_policy_short_causal():
    """The dispatch table is host policy with measured provenance: pin the rules it states."""
    import torch as _t

    from ioattn.plan import dispatch

    cuda = _t.device("cuda")
    assert dispatch.tiles("fwd", 64, cuda, seqlen_q=512, masked_right=True) == dispatch._FWD_SHORT_CAUSAL
    assert dispatch.tiles("fwd", 64, cuda, seqlen_q=4096, masked_right=True) == dispatch._FWD_TILES[64]
    assert dispatch.tiles("fwd", 64, cuda, seqlen_q=512, masked_right=False) == dispatch._FWD_TILES[64]
    assert dispatch.tiles("fwd", 128, cuda, seqlen_q=512, masked_right=True) == dispatch._FWD_TILES[128]
    assert dispatch.tiles("fwd", 59, _t.device("cpu")) == dispatch.INTERPRETER_TILES


def test_explain_dispatch_matches_the_policy():
    """explain_dispatch reports the backend and the dispatch tables' choice for the call."""
    import ioattn
    from ioattn.plan import dispatch

    q = torch.randn(2, 100, 4, 64, dtype=FP16)
    k = torch.randn(2, 100, 2, 64, dtype=FP16)
    with dispatch.forced_backend("reference"):
        plan = ioattn.explain_dispatch(q, k, k, causal=True)
        assert plan.backend == "reference" and plan.forward["route"] == "aten"
        assert ioattn.explain_dispatch(q, k, k, softcap=5.0).forward["route"].startswith("tiled (softcap")
        assert "pieces" in ioattn.explain_dispatch(q, k[:, :60], k[:, :60], causal=True).forward["calls"]
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q, k, k, causal=True)
    assert plan.backend == "triton" and "forced" in plan.reason
    cfg = dispatch.tiles("fwd", 64, q.device, seqlen_q=100, masked_right=True, tma=True)
    assert plan.forward["tiles"] == (cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages)
    assert plan.forward["kv_loads"] == ("tma" if dispatch.fwd_uses_tma(k, k, False) else "pointer")
    assert plan.forward["programs"] == plan.forward["tiles_count"] == -(-100 // cfg.block_m) * 2 * 4
    assert "backward: " in plan.describe() and plan.backward["atomics"] is False
    with dispatch.forced_backend("triton"), dispatch.prefer_tma(False):
        assert ioattn.explain_dispatch(q, k, k).forward["kv_loads"] == "pointer"


def _lean_flag_set(hopper, flag, causal):
    """The (variant, head dim) pairs whose Gluon forward build has its constexpr ``flag`` on."""
    return {(v, d) for v in hopper.VARIANTS for d in hopper.TILE_TABLE[v]
            if hopper.kernel_config(d, v, causal)["constexprs"][flag]}


def test_hopper_kernel_policy_and_refusals(monkeypatch):
    """The Gluon Hopper forward's default policy (hopper.AUTO_MIN_SEQLEN, from the device runs): head
    dims 128 and 256 from 512 query rows, both masks, head dim 64 from 512 (both masks); not when the
    caller fixed the forward's tiles; prefer_hopper and IOATTN_HOPPER override it both ways. It runs only
    for the calls it covers; elsewhere (here: a CPU) the portable path runs and the reason is given."""
    import ioattn
    from ioattn.plan import dispatch, hopper

    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_TILES", raising=False)
    long128 = torch.empty(1, 4096, 2, 128, dtype=torch.bfloat16)
    assert hopper.wanted(long128) and hopper.wanted(long128, causal=True)
    n512 = torch.empty(1, 512, 2, 128, dtype=torch.bfloat16)
    assert hopper.wanted(n512) and hopper.wanted(n512, causal=True)  # causal 512: since FEWER_MASKS
    for causal in (False, True):
        assert not hopper.wanted(torch.empty(1, 511, 2, 128, dtype=torch.bfloat16), causal=causal)
    for causal in (False, True):
        assert hopper.wanted(torch.empty(1, 512, 2, 256), causal=causal)
        assert not hopper.wanted(torch.empty(1, 511, 2, 256), causal=causal)
    # d=64: non-causal from 512 (persistent up to 1024, then wg3), causal from 512 (persistent up to 4096)
    assert hopper.wanted(torch.empty(1, 512, 2, 64)) and not hopper.wanted(torch.empty(1, 511, 2, 64))
    assert hopper.wanted(torch.empty(1, 512, 2, 64), causal=True)
    assert not hopper.wanted(torch.empty(1, 511, 2, 64), causal=True)
    assert hopper.wanted(torch.empty(8192, 2, 128), seqlen_q=8192)  # varlen: the caller's max seqlen
    assert not hopper.wanted()
    dispatch.set_tile_override("fwd", dispatch.TileConfig(64, 64, 4, 3))
    try:
        assert not hopper.wanted(long128)
    finally:
        dispatch.set_tile_override("fwd", None)
    with hopper.prefer_hopper(False):
        assert not hopper.wanted(long128)
    monkeypatch.setenv("IOATTN_HOPPER", "0")
    assert not hopper.wanted(long128)
    monkeypatch.setenv("IOATTN_HOPPER", "1")
    assert hopper.wanted(torch.empty(1, 64, 2, 64))
    monkeypatch.delenv("IOATTN_HOPPER")
    # no variant named: each head dim its default (wg3 at 64, ping-pong at 128 and 256)
    assert hopper.active_variant() is None and hopper.DEFAULT_VARIANT == "pingpong"
    assert [hopper.variant_for(d) for d in (64, 128, 256)] == ["wg3", "pingpong", "pingpong"]
    assert list(hopper.TILES) == [64, 128, 256] and hopper.TILES[64] == hopper.TILE_TABLE["wg3"][64]
    assert hopper.kernel_config(64)["constexprs"]["NUM_WG"] == 3
    with hopper.variant("split"):
        assert hopper.active_variant() == "split" and hopper.TILES[128] == hopper.TILE_TABLE["split"][128]
        assert hopper.variant_for(64) == "split" and hopper.kernel_config(64)["constexprs"]["NUM_WG"] == 2
    with hopper.variant("wg3"):  # three 64-row consumer warpgroups: a 192-row tile, head dim 64 only
        assert list(hopper.TILES) == [64] and hopper.kernel_config(64)["block_m"] == 192
        cfg = hopper.kernel_config(64)
        assert (cfg["q_rows"], cfg["num_warps"]) == (64, 4) and cfg["constexprs"]["NUM_WG"] == 3
    assert hopper.kernel_config(64, "pingpong")["constexprs"]["NUM_WG"] == 2
    # persistent: the ping-pong kernel's tiles and warpgroups, the tile loop on; no varlen
    cfg = hopper.kernel_config(128, "persistent")
    assert cfg["constexprs"]["PERSISTENT"] and not hopper.kernel_config(128, "pingpong")["constexprs"]["PERSISTENT"]
    assert hopper.TILE_TABLE["persistent"] == hopper.TILE_TABLE["pingpong"] and cfg["constexprs"]["NUM_WG"] == 2
    # the lean softmax: every ping-pong variant by default (measured faster), off by choice except wg3
    # (its 160-register consumers need it); never the base kernel. With it, conditional rescaling decided
    # by the warp (COND_RESCALE and RESCALE_BY_WARP) everywhere but the persistent kernel at d = 64
    # (measured slower) (and Q as S = Q K^T's register operand, Q_IN_REGS, in the two-warpgroup kernels
    # at d = 128; the row sum's quad reduction deferred, DEFERRED_SUM, in the ping-pong kernel at
    # d = 128 / 256, the persistent kernel at every head dim and wg3 without the causal mask)
    # (the flags here without the partition-barrier pass, PTX_BARRIERS, whose policy is checked on its own below)
    monkeypatch.setattr(hopper.ptx_barriers, "value", False)
    lean = {(v, d): _lean_of(hopper.kernel_config(d, v)) for v in hopper.VARIANTS for d in hopper.TILE_TABLE[v]}
    assert {k: x for k, x in lean.items() if x != _lean(COND, WARP)} == {
        **{("base", d): frozenset() for d in hopper.TILE_TABLE["base"]},
        ("persistent", 64): _lean(DSUM), ("split", 128): _lean(COND, WARP, QREG),
        ("pingpong", 128): _lean(COND, WARP, QREG, DSUM), ("persistent", 128): _lean(COND, WARP, QREG, DSUM),
        ("pingpong", 256): _lean(COND, WARP, DSUM), ("persistent", 256): _lean(COND, WARP, DSUM),
        ("wg3", 64): _lean(COND, WARP, DSUM)}, lean
    lean_causal = {(v, d): _lean_of(hopper.kernel_config(d, v, causal=True))
                   for v in hopper.VARIANTS for d in hopper.TILE_TABLE[v]}
    # the same under the mask but wg3's (its causal build without the deferred sum) and, MASK_BRANCH, a
    # tile's first-step mask under its own branch in the two-warpgroup kernels at d = 128 / 256
    branched = {(v, d): lean[(v, d)] | {MASK} for v in ("pingpong", "split", "persistent") for d in (128, 256)
                if d in hopper.TILE_TABLE[v]}
    assert lean_causal == {**lean, ("wg3", 64): _lean(COND, WARP), **branched}, lean_causal
    monkeypatch.setenv(hopper.CONDITIONAL_RESCALE_ENV, "0")
    assert _lean_of(hopper.kernel_config(128, "pingpong")) == _lean(QREG, DSUM)
    assert _lean_of(hopper.kernel_config(256, "split")) == _lean()
    with hopper.conditional_rescale(True):  # the block's value wins over the environment
        assert _lean_of(hopper.kernel_config(64, "persistent")) == _lean(COND, WARP, DSUM)
    monkeypatch.setenv(hopper.CONDITIONAL_RESCALE_ENV, "1")
    assert _lean_of(hopper.kernel_config(64, "persistent")) == _lean(COND, WARP, DSUM)
    monkeypatch.setenv(hopper.CONDITIONAL_RESCALE_ENV, "yes")
    with pytest.raises(ValueError, match="IOATTN_HOPPER_COND_RESCALE must be 0 .* got 'yes'"):
        hopper.kernel_config(128, "pingpong")
    monkeypatch.delenv(hopper.CONDITIONAL_RESCALE_ENV)
    with hopper.conditional_rescale(False):
        assert _lean_of(hopper.kernel_config(256, "pingpong")) == _lean(DSUM)
    with hopper.rescale_by_warp(False):  # COND_RESCALE alone: the thread's decision
        assert _lean_of(hopper.kernel_config(256, "split")) == _lean(COND)
    with hopper.lean_softmax(False):
        assert not hopper.kernel_config(128, "pingpong")["constexprs"]["LEAN"]
        assert not _lean_of(hopper.kernel_config(256, "persistent"))  # and none of its options
        assert _lean_of(hopper.kernel_config(64, "wg3", causal=True)) == _lean(COND, WARP)  # wg3 stays lean
    # Q as S = Q K^T's register operand (Q_IN_REGS): by default in the two-warpgroup kernels at d = 128
    # (measured faster; slower at d = 64); forced on, wherever it fits: those kernels at d <= 128 with
    # the lean softmax (wg3 and d = 256 spilled); forced off, nowhere
    with hopper.q_in_registers(True):
        qr = _lean_flag_set(hopper, QREG, False)
        assert qr == {(v, d) for v in ("pingpong", "split", "persistent") for d in (64, 128)}, qr
        # with the deferred row sum (DEFERRED_SUM), the persistent kernel's default at d = 64
        assert _lean_of(hopper.kernel_config(64, "persistent")) == _lean(QREG, DSUM)
        assert _lean_of(hopper.kernel_config(64, "pingpong")) == _lean(COND, WARP, QREG)
        with hopper.lean_softmax(False):
            assert not hopper.kernel_config(128, "pingpong")["constexprs"]["LEAN"]
    with hopper.q_in_registers(False):
        assert not _lean_flag_set(hopper, QREG, False)
    assert {k for k, x in lean.items() if QREG in x} == {(v, 128) for v in hopper.Q_IN_REGISTERS_FITS}
    # the row sum's quad reduction deferred (DEFERRED_SUM): by default where measured faster (above); when
    # asked, in the two-warpgroup kernels with the lean softmax, and in wg3 without the causal mask (its
    # causal build spilled); forced off, nowhere
    assert {k for k, x in lean.items() if DSUM in x} == set(hopper.DEFERRED_ROW_SUM_ON)
    assert {k for k, x in lean_causal.items() if DSUM in x} == set(hopper.DEFERRED_ROW_SUM_ON) - {("wg3", 64)}
    for causal in (False, True):
        with hopper.deferred_row_sum(True):
            ds = _lean_flag_set(hopper, DSUM, causal)
            assert ds == ({(v, d) for v in ("pingpong", "split", "persistent") for d in (64, 128, 256)}
                          | (set() if causal else {("wg3", 64)})), (causal, ds)
            want = _lean(COND, WARP, DSUM, MASK) if causal else _lean(COND, WARP, DSUM)
            assert _lean_of(hopper.kernel_config(256, "split", causal)) == want
            with hopper.lean_softmax(False):
                assert not _lean_of(hopper.kernel_config(128, "persistent", causal))
        with hopper.deferred_row_sum(False):
            assert not _lean_flag_set(hopper, DSUM, causal)
    # a tile's first-step mask under its own branch (MASK_BRANCH): by default in causal calls of the
    # two-warpgroup kernels at d = 128 / 256 (measured faster there, slower non-causal); when asked, every
    # lean kernel, either mask; forced off, nowhere
    assert not any(MASK in x for x in lean.values())
    assert {k for k, x in lean_causal.items() if MASK in x} == set(branched)
    for causal in (False, True):
        with hopper.mask_branch(True):
            assert _lean_flag_set(hopper, MASK, causal) == {k for k, x in lean.items() if x}
        with hopper.mask_branch(False):
            assert not _lean_flag_set(hopper, MASK, causal)
    # the consumers' partition-barrier pass (PTX_BARRIERS): by default in every lean ping-pong / persistent
    # kernel, not wg3 (no gain measured there) nor split; forced on, every lean kernel; forced off, nowhere
    monkeypatch.setattr(hopper.ptx_barriers, "value", None)  # the policy
    for causal in (False, True):
        assert _lean_flag_set(hopper, "PTX_BARRIERS", causal) == {(v, d) for v in ("pingpong", "persistent")
                                                                  for d in hopper.TILE_TABLE[v]}
        with hopper.ptx_barriers(True):
            assert _lean_flag_set(hopper, "PTX_BARRIERS", causal) == {k for k, x in lean.items() if x}
        with hopper.ptx_barriers(False):
            assert not _lean_flag_set(hopper, "PTX_BARRIERS", causal)
    # the output stored as whole rows at d = 64 / 128 through Triton's conversion (mode 1), at d = 256
    # staged in the Q buffer (mode 2: the one-tile ping-pong kernels); the persistent kernel's copied by
    # TMA from the Q buffer at every head dim (mode 3); off everywhere by choice
    rows = {(v, d): hopper.row_stores(d, v) for v in hopper.VARIANTS for d in hopper.TILE_TABLE[v]}
    assert all(rows.values()), rows
    assert [key for key, mode in rows.items() if mode == 2] == [("pingpong", 256), ("split", 256)], rows
    assert [key for key, mode in rows.items() if mode == 3] == [("persistent", d) for d in (64, 128, 256)], rows
    with hopper.out_tma_store(False):  # the persistent kernel as before it: pointer stores at d = 64
        assert [hopper.row_stores(d, "persistent") for d in (64, 128, 256)] == [0, 1, 2]
    with hopper.out_tma_store(True):  # the one-tile kernels have no copy (docs/decisions/forward-output-stores.md)
        assert hopper.row_stores(128, "pingpong") == 1
    with hopper.out_row_stores(False):
        assert not any(hopper.row_stores(d, v) for v, d in rows)
    # fewer masked key tiles in the two-warpgroup ping-pong kernels (wg3's consumers spilled with it)
    fewer = {v: hopper.kernel_config(min(hopper.TILE_TABLE[v], key=lambda d: abs(d - 128)), v)["constexprs"]
             ["FEWER_MASKS"] for v in hopper.VARIANTS}
    assert fewer == {"base": False, "pingpong": True, "split": True, "wg3": False, "persistent": True}
    # the plan's grid: a program per tile, or for the persistent variant one per SM at most
    from ioattn.plan import forward as forward_plan
    sig = forward_plan.Signature(batch=8, seqlen_q=1024, seqlen_k=1024, nheads=16, nheads_kv=16, head_dim=128,
                                 element_size=2, varlen=False, causal=False, window=(-1, -1), softcap=0.0,
                                 softmax_scale=0.1, alibi=False, device_sms=132)
    with hopper.variant("pingpong"):
        plan = forward_plan.plan_forward(sig)
        assert plan.programs == plan.num_tiles == 8 * 16 * (1024 // plan.block_m)
    with hopper.variant("persistent"):
        assert forward_plan.plan_forward(sig).programs == 132
        few = forward_plan.plan_forward(replace(sig, batch=1, nheads=1, nheads_kv=1))
        assert few.programs == few.num_tiles < 132
    # per call: short fixed-length calls take the persistent variant (PERSISTENT_MAX_SEQLEN, by head dim and
    # mask, and where listed from PERSISTENT_MIN_SEQLEN: nowhere now)
    assert set(hopper.PERSISTENT_MAX_SEQLEN) == {(64, False), (64, True), (128, False), (128, True), (256, False),
                                                 (256, True)}
    assert not hopper.PERSISTENT_MIN_SEQLEN
    for (d, causal), most in hopper.PERSISTENT_MAX_SEQLEN.items():
        assert hopper.variant_for(d, causal, most) == "persistent"
        assert hopper.variant_for(d, causal, most + 1) == hopper.variant_for(d) != "persistent"
        default = hopper.variant_for(d)
        assert hopper.variant_for(d, causal, most, varlen=True) == default
        least = hopper.PERSISTENT_MIN_SEQLEN.get((d, causal))
        if least:
            assert hopper.variant_for(d, causal, least) == "persistent"
            assert hopper.variant_for(d, causal, least - 1) == default
    assert hopper.variant_for(128, True, 16384) == hopper.variant_for(256, False, 16384) == "pingpong"
    with hopper.variant("pingpong"):  # a variant set by name wins
        assert hopper.variant_for(128, False, 512) == "pingpong"
    with hopper.variant("persistent"):
        q16 = torch.empty(64, 2, 128, dtype=torch.bfloat16)
        monkeypatch.setattr(hopper, "GLUON_VARLEN", True)
        assert hopper.call_supported(q16, q16, q16, True, Semantics(0.125, (-1, -1)), None) == (
            False, "varlen: not in the persistent variant")
        monkeypatch.setattr(hopper, "GLUON_VARLEN", False)
    monkeypatch.setenv("IOATTN_HOPPER_VARIANT", "base")
    assert hopper.active_variant() == "base" and 256 not in hopper.TILES
    with pytest.raises(ValueError, match="unknown Hopper kernel variant 'nope'"):
        with hopper.variant("nope"):
            pass
    monkeypatch.setenv("IOATTN_HOPPER_VARIANT", "nope")
    with pytest.raises(ValueError, match="unknown Hopper kernel variant 'nope'"):
        hopper.active_variant()
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT")
    n500 = torch.empty(1, 500, 2, 128, dtype=torch.bfloat16)
    assert "head dim 128 causal from seqlen_q >= 512 (here 500)" in hopper.policy(n500, causal=True)[1]
    assert "head dim 48 non-causal is not in hopper.AUTO_MIN_SEQLEN" in hopper.policy(torch.empty(1, 9, 2, 48))[1]
    # the plan says why the Gluon kernel is not taken (here: no sm_90 GPU)
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(long128, long128, long128)
    assert plan.forward["gluon_hopper"].startswith("not applicable (needs an sm_90") and "gluon_hopper=" in plan.describe()

    q = torch.randn(1, 64, 2, 64, dtype=torch.bfloat16)
    ok, why = hopper.hopper_supports(q, q, q, False, Semantics(0.125, (-1, -1)), None)
    assert not ok and "sm_90" in why
    with hopper.prefer_hopper(True):
        assert hopper.wanted(q)
        out = flash_attn_func(q, q, q, causal=True)  # still the CPU path, no error
    assert out.shape == q.shape and torch.isfinite(out).all()


def test_hopper_persistent_variant_by_call(monkeypatch):
    """Without a variant named, a short call takes the persistent variant (one program per SM) and the
    plan says so, with its walk and Q buffers; longer or varlen calls take the head dim's default.
    (The device check is replaced by the pure-Python call checks, as if on an sm_90 GPU.)"""
    import ioattn
    from ioattn.plan import hopper
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)
    most, most_causal = hopper.PERSISTENT_MAX_SEQLEN[(128, False)], hopper.PERSISTENT_MAX_SEQLEN[(128, True)]
    with dispatch.forced_backend("triton"):
        for n, causal, variant in ((most, False, "persistent"), (most_causal, True, "persistent"),
                                   (most_causal * 2, True, "pingpong"), (most * 2, False, "pingpong")):
            q = torch.empty(4, n, 16, 128, dtype=BF16)
            plan = ioattn.explain_dispatch(q, q, q, causal=causal)
            if causal and n < hopper.AUTO_MIN_SEQLEN[(128, True)]:
                assert "hopper" not in plan.forward["kernel"]
                continue
            assert plan.forward["kernel"].endswith(f"(Gluon, {variant})"), (n, causal, plan.forward["kernel"])
            tiles = -(-n // 128) * 4 * 16
            assert plan.forward["tiles_count"] == tiles
            assert plan.forward["programs"] == (min(tiles, 132) if variant == "persistent" else tiles)
            # the options the plan reports follow the variant's lean flags: at d = 128 Q in registers and
            # the row sum deferred in both (hopper.Q_IN_REGISTERS_HEADDIMS, DEFERRED_ROW_SUM_ON)
            assert plan.forward["q_operand"].startswith("registers"), plan.forward
            assert plan.forward["row_sum"] == "per-thread partial sums, reduced once a query tile", plan.forward
            with hopper.deferred_row_sum(False):
                assert ioattn.explain_dispatch(q, q, q, causal=causal).forward["row_sum"] == "reduced every key tile"
            if variant == "persistent":  # at d = 128 by default: two Q buffers, causal calls walked by the
                # host's table (else in pairs), the output by TMA, the tile index by multiply-high
                assert plan.forward["q_buffers"] == 2, plan.forward
                walk = plan.forward["walk"]
                assert walk.startswith("a host-built table") if causal else walk == "head by head", plan.forward
                if causal:
                    with hopper.walk_table(False):
                        off = ioattn.explain_dispatch(q, q, q, causal=causal).forward
                        assert off["walk"] == "pairs of query blocks, head by head", off
                assert plan.forward["out_stores"] == "TMA bulk copies (staged in the Q buffer)", plan.forward
                assert plan.forward["tile_index"] == "multiply-high (magic divisors)", plan.forward
                with hopper.out_tma_store(False), hopper.fast_tile_div(False):
                    off = ioattn.explain_dispatch(q, q, q, causal=causal).forward
                    assert off["out_stores"] == "whole-row pointer stores (Triton's layout conversion)", off
                    assert off["tile_index"] == "integer divisions", off
            else:
                assert "walk" not in plan.forward and "q_buffers" not in plan.forward
                assert "tile_index" not in plan.forward and plan.forward["out_stores"].startswith("whole-row")
            assert not plan.forward["mask"].startswith("none"), plan.forward  # masked: causal, or past 512
        # the unmasked key loop (docs/decisions/forward-masked-tiles.md): short non-causal persistent calls with
        # whole key tiles
        for n, d, unmasked in ((512, 128, True), (1024, 64, True), (1024, 128, False), (600, 64, False)):
            q = torch.empty(4, n, 16, d, dtype=BF16)
            mask = ioattn.explain_dispatch(q, q, q).forward["mask"]
            assert mask.startswith("none") == unmasked, (n, d, mask)
        # warpgroup 0's diagonal trimmed (docs/decisions/causal-diagonal-trim.md): persistent causal calls at d =
        # 256 to 2048, d = 128 to 512
        for n, d, trimmed in ((512, 128, True), (1024, 128, False), (2048, 256, True), (8192, 256, True),
                              (1024, 64, False)):
            q = torch.empty(4, n, 16, d, dtype=BF16)
            fwd = ioattn.explain_dispatch(q, q, q, causal=True).forward
            assert fwd["diagonal"].startswith("trimmed") == trimmed, (n, d, fwd)
            assert fwd["tiles"][1] == (64 if (n, d) == (512, 128) or d == 256 else 128), fwd  # short causal tiles
            assert "diagonal" not in ioattn.explain_dispatch(q, q, q).forward  # no causal mask


def test_hopper_varlen_switch_and_policy(monkeypatch):
    """Varlen through the Gluon forward (its IS_VARLEN specialisation): on (hopper.GLUON_VARLEN) and
    taken by default where its own table says (VARLEN_AUTO_MIN_SEQLEN, by the longest sequence; head
    dim 64 never); with the switch off, the call checks refuse varlen naming it; the plan reports
    either; the launcher passes cu_seqlens and the max lengths through to hopper_forward. (On this
    CPU hopper_supports refuses for sm_90 first, so the device check is replaced by the pure-Python
    call checks, hopper.call_supported.)"""
    import ioattn
    from ioattn import backends
    from ioattn.plan import hopper
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    q = torch.randn(10, 2, 64, dtype=BF16)  # packed (total, nheads, d)
    cu = torch.tensor([0, 4, 9], dtype=torch.int32)  # one trailing token no sequence owns
    assert hopper.GLUON_VARLEN is True
    ok, why = hopper.hopper_supports(q, q, q, True, Semantics(0.125, (-1, 0)), None)
    assert not ok and "sm_90" in why
    assert hopper.call_supported(q, q, q, True, Semantics(0.125, (-1, 0)), None) == (True, "")
    assert not hopper.call_supported(q, q, q, True, Semantics(0.125, (-1, 0), 0.0, 0.5), None)[0]  # dropout: refused
    # the varlen policy: its own table, by the longest sequence
    for (d, causal), least in hopper.VARLEN_AUTO_MIN_SEQLEN.items():
        packed = torch.empty(8, 2, d)
        assert hopper.wanted(packed, least, causal, varlen=True)
        assert not hopper.wanted(packed, least - 1, causal, varlen=True)
    assert (64, False) not in hopper.VARLEN_AUTO_MIN_SEQLEN and (64, True) not in hopper.VARLEN_AUTO_MIN_SEQLEN
    assert "not in hopper.VARLEN_AUTO_MIN_SEQLEN" in hopper.policy(q, 100000, False, varlen=True)[1]
    assert hopper.wanted(q[None], 100000) and not hopper.wanted(q, 100000, varlen=True)  # d=64: fixed only
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)  # as if on an sm_90 GPU
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q, q, q, causal=True, cu_seqlens_q=cu, max_seqlen_q=5)
        assert plan.forward["gluon_hopper"].startswith("not taken (default policy: head dim 64 causal varlen")
        q128 = torch.randn(10, 2, 128, dtype=BF16)
        least = hopper.VARLEN_AUTO_MIN_SEQLEN[(128, True)]
        plan = ioattn.explain_dispatch(q128, q128, q128, causal=True, cu_seqlens_q=cu, max_seqlen_q=least)
        assert "hopper_fwd_kernel" in plan.forward["kernel"] and plan.forward["gluon_hopper"].startswith("taken")
    with dispatch.forced_backend("triton"), hopper.prefer_hopper(True):
        monkeypatch.setattr(hopper, "GLUON_VARLEN", False)
        ok, why = hopper.call_supported(q, q, q, True, Semantics(0.125, (-1, 0)), None)
        assert not ok and "hopper.GLUON_VARLEN" in why and "varlen" in why
        plan = ioattn.explain_dispatch(q, q, q, causal=True, cu_seqlens_q=cu, max_seqlen_q=5)
        assert "GLUON_VARLEN" in plan.forward["gluon_hopper"] and "hopper" not in plan.forward["kernel"]
        monkeypatch.setattr(hopper, "GLUON_VARLEN", True)
        plan = ioattn.explain_dispatch(q, q, q, causal=True, cu_seqlens_q=cu, max_seqlen_q=5)
        assert "hopper_fwd_kernel" in plan.forward["kernel"] and plan.forward["gluon_hopper"].startswith("taken")
        assert plan.forward["tiles_count"] == -(-5 // hopper.TILES[64][0]) * 2 * 2  # cdiv(max_q, bm) * batch * h
        with hopper.unmasked_full_keys(True):  # a varlen call masks every sequence's own key end
            plan = ioattn.explain_dispatch(q, q, q, cu_seqlens_q=cu, max_seqlen_q=5)
            assert "hopper_fwd_kernel" in plan.forward["kernel"] and not plan.forward["mask"].startswith("none")
        calls = []
        monkeypatch.setattr(backends, "gluon_forward_route",
                            lambda *a: calls.append(a) or (lambda *tensors: ("out", "lse")))
        assert backends.triton_forward(q, q, q, cu, cu, 5, 5, Semantics(0.125, (-1, 0)), None, 0) == ("out", "lse")
    ((args),) = calls
    assert args[3:5] == (0.125, True) and args[5] is cu and args[6] is cu and args[7] == args[8] == 5


@_NO_INTERPRETER
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("ragged", [False, True])
def test_hopper_backward_flat_dq_order(d, ragged):
    """The flat dQ order (``WS_DQ_FLAT``): ``dq_flat_bases`` steps every (row, column) of a
    [block_m, d] block once, a thread's four values of an 8-column group first; ``dq_from_flat``
    puts a flat accumulator built from a known dQ by those bases back in (batch, seqlen, heads, d)
    order, scaled and cast, with seqlen a multiple of block_m (written through a view of dQ) or not
    (through a padded buffer)."""
    pytest.importorskip("triton.experimental.gluon")
    import ioattn.kernels.hopper_backward as hb
    from ioattn.plan import hopper_bwd
    from ioattn.launch import gluon_bwd
    block_m = hopper_bwd.WS_BLOCK_M[d]
    bases = hb.dq_flat_bases(hopper_bwd.BWD_NUM_WARPS, block_m, d)
    assert bases[:2] == [[0, 1], [8, 0]]  # a thread's registers of one 8-column group: 16 contiguous bytes
    offs = torch.arange(block_m * d)
    rows, cols = torch.zeros_like(offs), torch.zeros_like(offs)
    for bit, (r, c) in enumerate(bases):
        rows += ((offs >> bit) & 1) * r
        cols += ((offs >> bit) & 1) * c
    assert len(set(zip(rows.tolist(), cols.tolist()))) == block_m * d and rows.max() == block_m - 1
    batch, heads, seqlen = 2, 3, 3 * block_m - (5 if ragged else 0)
    n_m = -(-seqlen // block_m)
    full = torch.randn(batch, n_m * block_m, heads, d)
    blocks = full.view(batch, n_m, block_m, heads, d).permute(0, 3, 1, 2, 4)
    flat = blocks[:, :, :, rows, cols].reshape(-1)
    q = torch.empty(batch, seqlen, heads, d, dtype=torch.bfloat16)
    dq = gluon_bwd.dq_from_flat(flat, q, block_m, 0.5, hopper_bwd.BWD_NUM_WARPS)
    assert dq.shape == q.shape and dq.dtype == q.dtype and dq.is_contiguous()
    assert torch.equal(dq, (full[:, :seqlen] * 0.5).to(torch.bfloat16))


@pytest.mark.parametrize("d, block_m", [(64, 128), (128, 64), (256, 64)])
@pytest.mark.parametrize("seqlen", [128, 200, 64 * 5 + 1])
@pytest.mark.parametrize("zero_dq", [False, True])
@_NO_INTERPRETER
def test_backward_preprocess_padded_rows(d, block_m, seqlen, zero_dq):
    """The preprocess kernel in the Hopper "ws" layout (``PADDED``: ``hopper_backward``'s launch) against
    torch on poisoned outputs: per (batch, head) seqlen_q rounded up to the query block of rows, D =
    rowsum(dO * O) in fp32 and 0 past seqlen_q; the lse rows times their unit, 0 for a row with no
    visible key (-inf) and past seqlen_q; with ``ZERO_DQ`` every value of the flat dQ accumulator 0 (and
    without it untouched)."""
    from ioattn.kernels.backward import attn_bwd_preprocess_kernel
    batch, heads = 2, 3
    stat = -(-seqlen // block_m) * block_m
    g = torch.Generator().manual_seed(seqlen + d)
    out, dout = (torch.randn(batch, seqlen, heads, d, generator=g).to(torch.bfloat16) for _ in range(2))
    lse = torch.randn(batch, heads, seqlen, generator=g) * 3
    lse[0, 1, ::7] = float("-inf")
    delta = torch.full((batch, heads, stat), float("nan"))
    lse2 = torch.full_like(delta, float("nan"))
    dq = torch.full((batch * heads * stat * d,), float("nan"))
    unit = 1.4426950408889634
    attn_bwd_preprocess_kernel[(stat // 64 * batch * heads,)](
        out, dout, delta, torch.empty(0, dtype=torch.int32), out.stride(0), out.stride(1), out.stride(2),
        dout.stride(0), dout.stride(1), dout.stride(2), delta.stride(0), delta.stride(1), heads, seqlen,
        HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=False, Lse=lse, LseOut=lse2, DQacc=dq,
        stride_slb=lse.stride(0), stride_slh=lse.stride(1), stat_rows=stat, lse_unit=unit, PADDED=True,
        ZERO_DQ=zero_dq)
    want = torch.zeros(batch, heads, stat)
    want[:, :, :seqlen] = (out.float() * dout.float()).sum(-1).transpose(1, 2)
    torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-5)
    want_lse = torch.zeros(batch, heads, stat)
    want_lse[:, :, :seqlen] = torch.where(lse == float("-inf"), 0.0, lse * unit)
    torch.testing.assert_close(lse2, want_lse, rtol=1e-6, atol=0)
    assert (dq == 0).all() if zero_dq else dq.isnan().all()


@pytest.mark.parametrize("d, block_m", [(64, 128), (128, 64)])
@_NO_INTERPRETER
def test_backward_preprocess_padded_rows_varlen(d, block_m):
    """The padded preprocess on packed sequences (``IS_VARLEN``, the Hopper varlen backward's launch):
    per (sequence, head) the longest sequence rounded up to the query block of stat rows, D and the
    lse rows (lse (nheads, total_q), as the varlen forward returns it) of that sequence's rows from
    cu_seqlens_q, 0 past its length; NaN in the rows no sequence owns stays out."""
    from ioattn.kernels.backward import attn_bwd_preprocess_kernel
    lens, heads, extra = [5, 0, 2 * block_m + 3, block_m], 3, 4
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    batch, total = len(lens), sum(lens)
    stat = -(-max(lens) // block_m) * block_m
    g = torch.Generator().manual_seed(d)
    out, dout = (torch.randn(total + extra, heads, d, generator=g).to(torch.bfloat16) for _ in range(2))
    out[total:] = float("nan")
    lse = torch.randn(heads, total + extra, generator=g) * 3
    lse[1, ::5] = float("-inf")
    lse[:, total:] = float("nan")
    delta = torch.full((batch, heads, stat), float("nan"))
    lse2 = torch.full_like(delta, float("nan"))
    dq = torch.full((batch * heads * stat * d,), float("nan"))
    attn_bwd_preprocess_kernel[(stat // 64 * batch * heads,)](
        out, dout, delta, cu, 0, out.stride(0), out.stride(1), 0, dout.stride(0), dout.stride(1),
        delta.stride(0), delta.stride(1), heads, max(lens), HEAD_DIM=d, BLOCK_D=d, BLOCK_M=64, IS_VARLEN=True,
        Lse=lse, LseOut=lse2, DQacc=dq, stride_slb=0, stride_slh=lse.stride(0), stat_rows=stat, lse_unit=0.5,
        PADDED=True, ZERO_DQ=True)
    want, want_lse = torch.zeros(batch, heads, stat), torch.zeros(batch, heads, stat)
    for b, n in enumerate(lens):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        want[b, :, :n] = (out[rows].float() * dout[rows].float()).sum(-1).T
        want_lse[b, :, :n] = torch.where(lse[:, rows] == float("-inf"), 0.0, lse[:, rows] * 0.5)
    torch.testing.assert_close(delta, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2, want_lse, rtol=1e-6, atol=0)
    assert (dq == 0).all()


@pytest.mark.parametrize("d", [64, 128])
@_NO_INTERPRETER
def test_hopper_backward_flat_dq_varlen(d):
    """``dq_from_flat`` on packed sequences: the flat accumulator's blocks per (sequence, head), as many
    as the longest sequence has, go to the sequence's rows from cu_seqlens_q (scaled, cast); the rows
    past each sequence's length in its last block and the rows no sequence owns are not taken (0)."""
    pytest.importorskip("triton.experimental.gluon")
    import ioattn.kernels.hopper_backward as hb
    from ioattn.plan import hopper_bwd
    from ioattn.launch import gluon_bwd
    block_m = hopper_bwd.WS_BLOCK_M[d]
    bases = hb.dq_flat_bases(hopper_bwd.BWD_NUM_WARPS, block_m, d)
    offs = torch.arange(block_m * d)
    rows, cols = torch.zeros_like(offs), torch.zeros_like(offs)
    for bit, (r, c) in enumerate(bases):
        rows += ((offs >> bit) & 1) * r
        cols += ((offs >> bit) & 1) * c
    lens, heads, extra = [3, block_m + 1, 0, 2 * block_m], 2, 5
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    n_m = -(-max(lens) // block_m)
    full = torch.randn(len(lens), n_m * block_m, heads, d)  # per sequence, padded to n_m blocks
    blocks = full.view(len(lens), n_m, block_m, heads, d).permute(0, 3, 1, 2, 4)
    flat = blocks[:, :, :, rows, cols].reshape(-1)
    q = torch.empty(sum(lens) + extra, heads, d, dtype=torch.bfloat16)
    dq = gluon_bwd.dq_from_flat(flat, q, block_m, 0.5, hopper_bwd.BWD_NUM_WARPS, cu, n_m)
    want = torch.zeros(sum(lens) + extra, heads, d)
    for b, n in enumerate(lens):
        want[int(cu[b]):int(cu[b + 1])] = full[b, :n] * 0.5
    assert dq.shape == q.shape and dq.dtype == q.dtype and dq.is_contiguous()
    assert torch.equal(dq, want.to(torch.bfloat16))


@pytest.mark.parametrize("d", [64, 128])
def test_hopper_backward_flat_dq_halves(d):
    """With a partition a consumer warpgroup (``WS_WG_PARTITIONS``) each warpgroup stages its half of
    the dQ block in a 4-warp flat tile of its own and the writer adds them one after the other; that
    is the 8-warp flat order ``dq_from_flat`` undoes only if the 4-warp order, with the warpgroup as
    one more top bit, is the 8-warp order: half W holds the columns [W d/2, (W + 1) d/2) at 64 query
    rows a step, the rows [64 W, 64 W + 64) at 128."""
    pytest.importorskip("triton.experimental.gluon")
    import ioattn.kernels.hopper_backward as hb
    from ioattn.plan import hopper_bwd
    block_m = hopper_bwd.WS_BLOCK_M[d]
    half_m, half_n = (block_m // 2, d) if block_m == 128 else (block_m, d // 2)
    whole = hb.dq_flat_bases(hopper_bwd.BWD_NUM_WARPS, block_m, d)
    half = hb.dq_flat_bases(4, half_m, half_n)
    assert whole == half + [[half_m, 0] if block_m == 128 else [0, half_n]]


def test_hopper_copy_env(monkeypatch):
    """IOATTN_HOPPER_COPY=1 / 0 takes or refuses the copies at any length, below the switch's own
    setting; any other value is refused by name."""
    from ioattn.plan import hopper
    monkeypatch.setenv("IOATTN_HOPPER_COPY", "1")
    assert hopper.copy_for_layout(128, False, 64) == (True, "IOATTN_HOPPER_COPY=1")
    with hopper.copy_strided(False):
        assert hopper.copy_for_layout(128, False, 64) == (False, "hopper.copy_strided(False)")
    monkeypatch.setenv("IOATTN_HOPPER_COPY", "0")
    assert hopper.copy_for_layout(128, False, 1 << 20) == (False, "IOATTN_HOPPER_COPY=0")
    monkeypatch.setenv("IOATTN_HOPPER_COPY", "yes")
    with pytest.raises(ValueError, match="IOATTN_HOPPER_COPY must be 0 or 1, got 'yes'"):
        hopper.copy_for_layout(128, False, 64)
    monkeypatch.delenv("IOATTN_HOPPER_COPY")
    least = hopper.COPY_MIN_SEQLEN["bwd"][(128, True)]
    assert hopper.copy_for_layout(128, True, least, backward=True)[0]
    assert not hopper.copy_for_layout(128, True, least - 1, backward=True)[0]
    assert hopper.copy_for_layout(96, True, 1 << 20) == (
        False, "head dim 96 causal is not in hopper.COPY_MIN_SEQLEN['fwd']")


def test_hopper_layouts_without_copy():
    """The Gluon kernels read q, k, v through 2-D (rows, heads * d) descriptor views
    (``layout.tma_rows_view``): contiguous tensors and the views of packed ones (what
    flash_attn_qkvpacked_func / kvpacked and fused projections hand over) qualify without a copy;
    layouts with no such view are refused by name, with their shape and strides."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    from ioattn.layout import tma_rows_view

    b, n, h, d = 2, 24, 3, 64
    qkv = torch.randn(b, n, 3, h, d, dtype=torch.bfloat16)
    for t in qkv.unbind(2):
        rows = tma_rows_view(t)
        assert rows.shape == (b * n, h * d) and rows.stride() == (3 * h * d, 1)
        assert rows.data_ptr() == t.data_ptr() and torch.equal(rows, t.reshape(b * n, h * d))
    packed = torch.randn(50, 2, h, d, dtype=torch.float16)  # varlen kv: (total, 2, heads, d)
    assert tma_rows_view(packed[:, 1]).stride() == (2 * h * d, 1)
    c = torch.randn(b, n, h, d, dtype=torch.bfloat16)
    assert tma_rows_view(c).stride() == (h * d, 1)
    assert tma_rows_view(qkv[:1, :1].unbind(2)[2]).shape == (1, h * d)  # one row: any stride
    refused = {
        "transposed (b, h, n, d)": torch.randn(1, h, 16384, d, dtype=torch.bfloat16).transpose(1, 2),
        "padded head dim": torch.randn(b, n, h, d + 16, dtype=torch.bfloat16)[..., :d],
        "batch not by whole sequences": torch.randn(b, 2 * n, h, d, dtype=torch.bfloat16)[:, :n],
        "misaligned base": torch.randn(b * n * h * d + 1, dtype=torch.bfloat16)[1:].view(b, n, h, d),
        "expanded (zero strides)": torch.randn(1, 1, 1, d, dtype=torch.bfloat16).expand(b, n, h, d),
    }
    for what, t in refused.items():
        assert tma_rows_view(t) is None, what
    assert tma_rows_view(torch.randn(b, n, h, d)[:, :0]) is None  # empty: nothing to describe

    q, k, v = qkv.unbind(2)
    none = (False, Semantics(0.125, (-1, 0)), None)
    assert hopper.call_supported(q, k, v, *none) == (True, "")
    assert hopper_bwd.bwd_call_supported(q, k, v, *none) == (True, "")
    assert hopper.inputs_note(q, k, v, False, True) == "in place (2-D (rows, heads * d) views)"
    # a layout with no view: the kernels take contiguous copies from hopper.COPY_MIN_SEQLEN's lengths
    bad = refused["transposed (b, h, n, d)"]
    for which, check in (("fwd", hopper.call_supported), ("bwd", hopper_bwd.bwd_call_supported)):
        least = hopper.COPY_MIN_SEQLEN[which][(d, True)]
        short = bad[:, :least - 1]
        ok, why = check(short, short, short, *none)
        assert not ok and why.startswith(f"q of shape {tuple(short.shape)} and strides {tuple(short.stride())}")
        assert f"no contiguous copy ({which} copies at head dim {d} causal from seqlen_q >= {least}, " \
               f"here {least - 1})" in why
        with hopper.copy_strided(True):
            assert check(q, bad, v, *none) == (True, "")
        long = [torch.randn(1, h, least, d, dtype=torch.bfloat16).transpose(1, 2) for _ in range(3)]
        assert check(*long, *none) == (True, "")
        assert hopper.inputs_note(*long, False, True, backward=which == "bwd") == (
            f"contiguous copies of q, k, v ({which} copies at head dim {d} causal from seqlen_q >= {least}, "
            f"here {least})")
    with hopper.copy_strided(False):
        assert "no contiguous copy (hopper.copy_strided(False))" in hopper.call_supported(*long, *none)[1]
    flat = [torch.randn(least, h, d, dtype=torch.bfloat16) for _ in range(3)]  # a varlen call's (total, heads, d)
    flat[1] = torch.randn(h, least, d, dtype=torch.bfloat16).transpose(0, 1)
    with hopper.copy_strided(True):  # varlen: never copied
        assert not hopper.call_supported(*flat, True, Semantics(0.125), None)[0]
        assert hopper.inputs_note(*flat, True, False) == "k: no (rows, heads * d) view (varlen: not copied)"


def test_hopper_backward_policy_and_wiring(monkeypatch):
    """The Gluon backward's default policy (hopper_bwd.BWD_AUTO_MIN_SEQLEN per head dim and mask, the
    reason in the plan); prefer_hopper_bwd / IOATTN_HOPPER_BWD override it; it is taken only where
    it applies (sm_90, fp16/bf16, head dim 64/128/256, no ALiBi/dropout; varlen, windows and softcap in
    the ws variant only); when
    taken, triton_backward hands the call to hopper_backward with the selected variant, and
    deterministic=True passes its ordered mode on."""
    from ioattn import backends
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    q = torch.randn(1, 70, 2, 64, dtype=torch.bfloat16)
    none = (False, Semantics(0.125), None)
    taken, why = hopper_bwd.bwd_plan(q, q, q, *none)
    least = hopper_bwd.BWD_AUTO_MIN_SEQLEN[(64, False)]
    assert not taken and why == f"default policy: head dim 64 non-causal from seqlen_q >= {least} (here 70)"
    for (d, causal), least in hopper_bwd.BWD_AUTO_MIN_SEQLEN.items():
        assert hopper_bwd.bwd_policy(torch.empty(1, least, 2, d), causal=causal)[0]
        assert not hopper_bwd.bwd_policy(torch.empty(1, least - 1, 2, d), causal=causal)[0]
    assert "not in hopper_bwd.BWD_AUTO_MIN_SEQLEN" in hopper_bwd.bwd_policy(torch.empty(1, 9000, 2, 48))[1]
    long = torch.empty(1, 16384, 2, 128, dtype=torch.bfloat16)  # wanted, but no sm_90 here
    assert hopper_bwd.bwd_plan(long, long, long, *none) == (False, "needs an sm_90 (Hopper) GPU")
    with hopper_bwd.prefer_hopper_bwd(False):
        assert hopper_bwd.bwd_policy(long) == (False, "hopper_bwd.prefer_hopper_bwd(False)")
    with hopper_bwd.prefer_hopper_bwd(True):
        assert hopper_bwd.bwd_plan(q, q, q, *none) == (False, "needs an sm_90 (Hopper) GPU")
    monkeypatch.setenv("IOATTN_HOPPER_BWD", "1")
    assert "sm_90" in hopper_bwd.bwd_plan(q, q, q, *none)[1]
    monkeypatch.setenv("IOATTN_HOPPER_BWD", "0")
    assert hopper_bwd.bwd_policy(long) == (False, "IOATTN_HOPPER_BWD=0")
    monkeypatch.delenv("IOATTN_HOPPER_BWD")
    assert hopper_bwd.bwd_call_supported(q, q, q, *none) == (True, "")
    assert hopper_bwd.bwd_call_supported(q.float(), q, q, *none)[1] == "fp16/bf16 only"
    q256 = torch.randn(1, 8, 2, 256, dtype=torch.bfloat16)
    assert hopper_bwd.bwd_call_supported(q256, q256, q256, *none) == (True, "")
    q48 = torch.randn(1, 8, 2, 48, dtype=torch.bfloat16)
    assert "head dims" in hopper_bwd.bwd_call_supported(q48, q48, q48, *none)[1]
    # sliding windows: the ws kernel's WINDOW form
    assert hopper_bwd.bwd_call_supported(q, q, q, False, Semantics(0.125, (4, 0)), None) == (True, "")
    assert hopper_bwd.bwd_call_supported(q, q, q, False, Semantics(0.125, (-1, -1), 1.0), None) == (True, "")  # the SOFTCAP form
    assert hopper_bwd.bwd_call_supported(q, q, q, False, Semantics(0.125, (-1, -1), 0.0, 0.1), None) == (False, "no dropout")
    with monkeypatch.context() as m:
        m.setitem(hopper_bwd.BWD_WINDOW_MIN_WIDTH, 64, 300)
        long64 = torch.empty(1, 4096, 2, 64)
        assert hopper_bwd.bwd_policy(long64, window_width=300)[0]
        assert hopper_bwd.bwd_policy(long64, window_width=299) == (
            False, "default policy: head dim 64 sliding windows from width 300 (hopper_bwd.BWD_WINDOW_MIN_WIDTH; here 299)")
    # packed (varlen) calls: the ws variant's IS_VARLEN form, judged by the longest sequence
    flat = torch.randn(300, 2, 64, dtype=torch.bfloat16)
    assert hopper_bwd.bwd_call_supported(flat, flat, flat, True, Semantics(0.125, (-1, -1)), None) == (True, "")
    with pytest.raises(ValueError, match="needs seqlen_q"):
        hopper_bwd.bwd_plan(flat, flat, flat, True, Semantics(0.125, (-1, -1)), None)
    for (d, causal), least in hopper_bwd.BWD_VARLEN_AUTO_MIN_SEQLEN.items():
        x = torch.empty(100, 2, d)
        assert hopper_bwd.bwd_policy(x, least, causal=causal, varlen=True)[0]
        assert hopper_bwd.bwd_policy(x, least - 1, causal=causal, varlen=True) == (
            False, f"default policy: head dim {d} {'causal' if causal else 'non-causal'} varlen from seqlen_q >= "
                   f"{least} (here {least - 1})")

    # wiring: a faked sm_90 decision sends the backward to the Gluon route, arguments passed through
    with pytest.raises(ValueError, match="unknown backward variant 'nope'"):
        hopper_bwd.kernel_config(64, "nope")
    with pytest.raises(ValueError, match="ws variant covers head dims 64, 128, 256, not 96"):
        hopper_bwd.kernel_config(96, "ws")
    # d=256: the ws kernel's column-split form (64 keys a program, one dO stage, dQ in two halves, the
    # high one through the Q ring);
    # 64 and 128: keys split between the warpgroups, equal rings, whole dQ blocks; d=64 takes 128 query
    # rows a step (docs/decisions/backward-ws-step.md)
    wide = hopper_bwd.kernel_config(256, "ws")
    assert wide["kernel"] == "hopper_bwd_ws_kernel" and (wide["block_n"], wide["dq_cols"]) == (64, 128)
    assert wide["constexprs"] == dict(HEAD_DIM=256, BLOCK_M=64, BLOCK_N=64, STAGES=2, DO_STAGES=1, COL_SPLIT=True,
                                      COALESCED_STORE=True, DQ_FLAT=False, LSE_IN_ACC=False, WG_SPLIT=False,
                                      SOFTCAP=False)
    for d, block_m, stages in ((64, 128, 3), (128, 64, 2)):
        flat = hopper_bwd.WS_DQ_FLAT[d]
        cfg = hopper_bwd.kernel_config(d, "ws")
        assert cfg["constexprs"] == dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=128, STAGES=stages, DO_STAGES=stages,
                                         COL_SPLIT=False, COALESCED_STORE=True, DQ_FLAT=flat,
                                         LSE_IN_ACC=hopper_bwd.WS_LSE_IN_ACC[d], WG_SPLIT=hopper_bwd.WS_WG_PARTITIONS[d] and flat,
                                         SOFTCAP=False)
        split = hopper_bwd.WS_WG_PARTITIONS[d] and flat  # a warpgroup a partition: the box and the warps halved
        assert cfg["dq_block"] == ([block_m * d // (64 if split else 32), 32] if flat else [block_m, d])
        assert cfg["num_warps"] == (4 if split else 8)
    # a warpgroup a partition (``WS_WG_PARTITIONS``): the kernel's 4 warps (warpgroup 0; warpgroup 1 a
    # worker), the flat tile's box in halves; never without the flat tile or in the column split
    with monkeypatch.context() as m:
        m.setattr(hopper_bwd, "WS_WG_PARTITIONS", {64: True, 128: True, 256: True})
        for d, rows in ((64, 128), (128, 128)):
            cfg = hopper_bwd.kernel_config(d, "ws")
            assert cfg["num_warps"] == 4 and cfg["constexprs"]["WG_SPLIT"] and cfg["dq_block"] == [rows, 32]
        assert not hopper_bwd.kernel_config(256, "ws")["constexprs"]["WG_SPLIT"]
        m.setattr(hopper_bwd, "WS_DQ_FLAT", {64: False, 128: False})
        lockstep = hopper_bwd.kernel_config(128, "ws")
        assert not lockstep["constexprs"]["WG_SPLIT"] and lockstep["num_warps"] == 8
    # the flat dQ tile (``WS_DQ_FLAT``): a [block_m * d / 32, 32] box, the column split never flat
    with monkeypatch.context() as m:
        m.setattr(hopper_bwd, "WS_DQ_FLAT", {64: True, 128: True, 256: True})
        m.setattr(hopper_bwd, "WS_WG_PARTITIONS", {64: False, 128: False})
        assert hopper_bwd.kernel_config(128, "ws")["dq_block"] == [256, 32] and hopper_bwd.kernel_config(128, "ws")["dq_flat"]
        assert not hopper_bwd.kernel_config(256, "ws")["dq_flat"] and hopper_bwd.kernel_config(256, "ws")["dq_block"] == [64, 128]
    # lse in S^T's accumulator (``WS_LSE_IN_ACC``): the key split only
    with monkeypatch.context() as m:
        m.setattr(hopper_bwd, "WS_LSE_IN_ACC", {64: True, 128: True, 256: True})
        assert hopper_bwd.kernel_config(64, "ws")["constexprs"]["LSE_IN_ACC"]
        assert not hopper_bwd.kernel_config(256, "ws")["constexprs"]["LSE_IN_ACC"]
    x = torch.randn(1, 8, 2, 64, dtype=torch.bfloat16)
    # the causal mask only as causal=True, alone: refused before any launch
    lse = torch.zeros(1, 2, 8)
    for kw, match in ((dict(window=(-1, 0)), r"window \(-1, 0\) is the causal mask"),
                      (dict(window=(4, 0), causal=True), r"causal=True with window \(4, 0\)")):
        kw = {"causal": False, **kw}
        with pytest.raises(ValueError, match=match):
            backends.hopper_backward(x, x, x, x, x, lse, 0.125, kw.pop("causal"), **kw)
    seen = {}

    def fake(dout, q_, k_, v_, out, lse, scale, causal, deterministic, cu_q, cu_k, max_q, max_k, window, softcap,
             alibi_slopes):
        seen.update(scale=scale, causal=causal, deterministic=deterministic, window=window, softcap=softcap,
                    alibi_slopes=alibi_slopes)
        return lambda *t: (torch.zeros_like(q_), torch.zeros_like(k_), torch.zeros_like(v_))
    monkeypatch.setattr(hopper_bwd, "bwd_plan", lambda *a: (True, "faked"))
    monkeypatch.setattr(backends, "gluon_backward_route", fake)
    lse = torch.zeros(1, 2, 70)
    grads = backends.triton_backward(q, q, q, q, q, lse, None, None, 70, 70, Semantics(0.125, (-1, 0)), None, 0)
    assert seen == dict(scale=0.125, causal=True, deterministic=False,
                        window=(-1, -1), softcap=0.0, alibi_slopes=None) and len(grads) == 3
    backends.triton_backward(q, q, q, q, q, lse, None, None, 70, 70, Semantics(0.125, (-1, -1), 30.0), None, 0)
    assert seen["softcap"] == 30.0 and not seen["causal"]
    slopes = torch.rand(2)
    backends.triton_backward(q, q, q, q, q, lse, None, None, 70, 70, Semantics(0.125, alibi=True), slopes, 0)
    assert seen["alibi_slopes"] is slopes
    backends.triton_backward(q, q, q, q, q, lse, None, None, 70, 70, Semantics(0.125, (30, 2)), None, 0)
    assert seen["window"] == (30, 2) and not seen["causal"]
    with hopper_bwd.bwd_deterministic(True):
        backends.triton_backward(q, q, q, q, q, lse, None, None, 70, 70, Semantics(0.125), None, 0)
    assert seen["deterministic"] and not seen["causal"]
    # varlen: the packed call's cu_seqlens and longest lengths passed through
    plans = []
    monkeypatch.setattr(hopper_bwd, "bwd_plan", lambda *a: plans.append(a) or (True, "faked"))
    monkeypatch.setattr(backends, "gluon_backward_route",
                        lambda *a: seen.update(zip(("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q"), a[9:12]))
                        or (lambda *t: (None, None, None)))
    cu, flat = torch.tensor([0, 30, 70], dtype=torch.int32), torch.randn(70, 2, 64, dtype=torch.bfloat16)
    backends.triton_backward(flat, flat, flat, flat, flat, torch.zeros(2, 70), cu, cu, 40, 40, Semantics(0.125),
                             None, 0)
    assert plans[-1][3] is True and plans[-1][6] == 40 and plans[-1][4].softmax_scale == 0.125  # seqlen_q, scale
    assert seen["cu_seqlens_q"] is cu and seen["cu_seqlens_k"] is cu and seen["max_seqlen_q"] == 40

    # the switch in force when the forward ran governs that forward's backward, wherever it runs
    # (the backward's value of the switch, seen by the Triton path's decision or the CPU path)
    states, real_ref = [], backends.reference_backward

    def spy_plan(*args):
        states.append((hopper_bwd.prefer_hopper_bwd.value, hopper_bwd.bwd_deterministic.value))
        return False, "spied"

    def spy_ref(*args):
        states.append((hopper_bwd.prefer_hopper_bwd.value, hopper_bwd.bwd_deterministic.value))
        return real_ref(*args)
    monkeypatch.setattr(hopper_bwd, "bwd_plan", spy_plan)
    monkeypatch.setattr(backends, "reference_backward", spy_ref)
    x = torch.randn(1, 20, 2, 16, requires_grad=True)
    with hopper_bwd.prefer_hopper_bwd(True):
        y = flash_attn_func(x, x, x)
    y.sum().backward()
    flash_attn_func(x, x, x).sum().backward()
    # deterministic=True: hopper_bwd.bwd_deterministic set for that forward's backward
    with hopper_bwd.prefer_hopper_bwd(True):
        y = flash_attn_func(x, x, x, deterministic=True)
    y.sum().backward()
    assert states == [(True, None), (None, None), (True, True)] and hopper_bwd.prefer_hopper_bwd.value is None
    assert hopper_bwd.bwd_deterministic.value is None
    monkeypatch.undo()
    # the plan: deterministic=True takes the Gluon backward's ordered mode
    monkeypatch.setenv("IOATTN_HOPPER_BWD", "1")
    with hopper_bwd.bwd_deterministic(True):
        for window in ((-1, -1), (-1, 0)):  # the ordered mode for both masks (only the GPU is missing here)
            assert hopper_bwd.bwd_plan(q, q, q, False, Semantics(0.125, window), None) == (False, "needs an sm_90 (Hopper) GPU")


def test_host_integer_helpers():
    from ioattn.plan import dispatch

    assert [dispatch.cdiv(a, b) for a, b in ((0, 4), (1, 4), (4, 4), (5, 4), (129, 64))] == [0, 1, 1, 2, 3]
    assert [dispatch.next_power_of_2(n) for n in (0, 1, 2, 3, 4, 5, 16, 17)] == [1, 1, 2, 4, 4, 8, 16, 32]


def _fake_gluon_routes(monkeypatch) -> list:
    """``backends.gluon_forward_route`` (the Gluon forward prepared for a call) replaced by a fake whose
    route returns ("out", "lse"); each preparation recorded as (q, k, v, scale, causal) and the other
    arguments by name."""
    from ioattn import backends
    calls = []
    names = ("cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "window", "softcap", "alibi_slopes")

    def route(*a):
        calls.append((a[:5], dict(zip(names, a[5:]))))
        return lambda *tensors: ("out", "lse")
    monkeypatch.setattr(backends, "gluon_forward_route", route)
    return calls


def _fake_forward_launches(monkeypatch) -> list:
    """The Gluon forward's kernel faked (``conftest.fake_launches``)."""
    import ioattn.kernels.hopper_forward as hf
    return fake_launches(monkeypatch, hf, "hopper_fwd_kernel")


def _fake_backward_launches(monkeypatch) -> list:
    """The Gluon ws backward's kernel faked (``conftest.fake_launches``)."""
    from ioattn.launch import gluon_bwd
    return fake_launches(monkeypatch, gluon_bwd, "hopper_bwd_ws_kernel")


def test_hopper_forward_launch_constexprs(monkeypatch):
    """What the Gluon forward's launcher passes to its kernel (a fake stands in for the launch: no GPU
    here): the variant's constexprs and grid (persistent: one program per SM at most), the one-tile
    grid's causal order within each head (no LPT), KV_TAIL exactly when a key
    tile can run past a sequence's end (seqlen_k not a multiple of the key tile, or varlen), and
    EXP2_FMA (key columns whose exponentials go to the FMA units) 0 unless hopper.exp2_fma(share) /
    IOATTN_HOPPER_EXP2_FMA ask for a share of the variant's key tile."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.launch import gluon_fwd
    from ioattn.kernels.hopper_tiles import magic_divisor
    launches = _fake_forward_launches(monkeypatch)
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_EXP2_FMA", raising=False)

    def launch(sq, sk, causal, d=128, varlen=False):
        launches.clear()
        q = torch.randn(2, sq, 4, d, dtype=BF16)
        k = torch.randn(2, sk, 2, d, dtype=BF16)
        if varlen:
            cu = torch.tensor([0, sq, 2 * sq], dtype=torch.int32)
            backends.hopper_forward(q.view(-1, 4, d), k.view(-1, 2, d), k.view(-1, 2, d), 0.1, causal,
                                  cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=sq, max_seqlen_k=sq)
        else:
            backends.hopper_forward(q, k, k, 0.1, causal)
        ((grid, args, kw),) = launches
        return grid, dict(kw, args=args)

    bm = hopper.TILE_TABLE["pingpong"][128][0]
    bn = hopper.TILE_TABLE["pingpong"][128][1]
    tiles = -(-16384 // bm) * 2 * 4
    grid, kw = launch(16384, 16384, True)  # causal, long: ping-pong, one program per tile, no LPT, no tail
    assert grid == (tiles,) and kw["PINGPONG"] and not kw["PERSISTENT"] and not kw["LPT"] and not kw["KV_TAIL"]
    assert kw["num_tiles"] == tiles and kw["IS_CAUSAL"]
    assert launch(16384, 16384 - 1, True)[1]["KV_TAIL"] and not launch(16384, 16384 - bn, True)[1]["KV_TAIL"]
    assert launch(16384, 16384, True, varlen=True)[1]["KV_TAIL"]  # varlen: always
    # key tiles never masked (hopper.unmasked_full_keys, docs/decisions/forward-masked-tiles.md): by default the
    # persistent kernel's non-causal calls at d = 64 and at d = 128 up to 512 keys; when asked, every non-causal
    # call whose key tiles all lie inside the sequence
    assert not launch(512, 512, False)[1]["KEY_MASKS"] and not launch(1024, 1024, False, d=64)[1]["KEY_MASKS"]
    assert not launch(8192, 8192, False, d=256)[1]["KEY_MASKS"]  # d = 256 over its persistent range
    assert launch(1024, 1024, False)[1]["KEY_MASKS"] and launch(16384, 16384, False)[1]["KEY_MASKS"]
    assert launch(512, 512 - 1, False)[1]["KEY_MASKS"] and launch(512, 512, True)[1]["KEY_MASKS"]
    with hopper.unmasked_full_keys(False):
        assert launch(512, 512, False)[1]["KEY_MASKS"]
    with hopper.unmasked_full_keys(True):
        assert not launch(512, 512, False)[1]["KEY_MASKS"]  # persistent
        assert not launch(16384, 16384, False)[1]["KEY_MASKS"]  # ping-pong
        assert not launch(16384, 16384, False, d=64)[1]["KEY_MASKS"]  # wg3
        assert launch(16384, 16384, True)[1]["KEY_MASKS"]  # the causal diagonal
        assert launch(16384, 16384 - 1, False)[1]["KEY_MASKS"]  # a key tile cut by the key end
        assert launch(16384, 16384, False, varlen=True)[1]["KEY_MASKS"]  # varlen: the sequences' own ends
    # warpgroup 0's diagonal trimmed (hopper.diag_trim, docs/decisions/causal-diagonal-trim.md): by default the
    # persistent causal calls at d = 256 (to 8192, its range) and at d = 128 up to 512, there with 64-key tiles
    # four deep (hopper.SHORT_CAUSAL_TILES); when asked, every persistent causal call
    kw = launch(512, 512, True)[1]
    assert kw["DIAG_TRIM"] and kw["PERSISTENT"] and (kw["BLOCK_M"], kw["BLOCK_N"], kw["STAGES"]) == (128, 64, 4)
    kw = launch(1024, 1024, True)[1]
    assert not kw["DIAG_TRIM"] and kw["PERSISTENT"] and (kw["BLOCK_N"], kw["STAGES"]) == (128, 2)
    assert launch(512, 512, False)[1]["BLOCK_N"] == 128  # non-causal: the variant's own tiles
    assert launch(8192, 8192, True, d=256)[1]["DIAG_TRIM"] and not launch(16384, 16384, True, d=256)[1]["DIAG_TRIM"]
    assert not launch(512, 512, True, d=64)[1]["DIAG_TRIM"] and not launch(512, 512, False)[1]["DIAG_TRIM"]
    with hopper.diag_trim(False):
        assert not launch(512, 512, True)[1]["DIAG_TRIM"]
    with hopper.diag_trim(True):
        assert launch(512, 512, True)[1]["DIAG_TRIM"] and launch(1024, 1024, True, d=64)[1]["DIAG_TRIM"]
        assert not launch(512, 512, False)[1]["DIAG_TRIM"]  # no diagonal
        assert not launch(16384, 16384, True)[1]["DIAG_TRIM"]  # the one-tile ping-pong kernel
    grid, kw = launch(512, 512, False)  # short, non-causal: persistent, one program per SM (132 here)
    assert kw["PERSISTENT"] and grid == (min(132, -(-512 // bm) * 2 * 4),) and kw["num_tiles"] == 4 * 2 * 4
    assert kw["Q_BUFS"] == 2 and not kw["PAIRED"]  # two Q buffers at d = 128; pairs are a causal walk
    kw = launch(512, 512, True)[1]  # short causal: persistent, walked by the host's table (4 query blocks)
    assert kw["PERSISTENT"] and kw["Q_BUFS"] == 2 and not kw["PAIRED"] and kw["Walk"] is not None
    with hopper.walk_table(False):
        assert launch(512, 512, True)[1]["PAIRED"]  # without it: in pairs
        assert not launch(640, 640, True)[1]["PAIRED"]  # 5 query blocks: the LPT walk
    assert launch(16384, 16384, True)[1]["Q_BUFS"] == 1  # the one-tile kernel: its own Q buffer
    # exp2 on the FMA units: off by default, else the share of the launched variant's key tile
    assert kw["EXP2_FMA"] == 0 and launch(16384, 16384, True)[1]["EXP2_FMA"] == 0
    with hopper.exp2_fma(25):
        assert launch(16384, 16384, True)[1]["EXP2_FMA"] == bn // 4
        assert launch(512, 512, False)[1]["EXP2_FMA"] == bn // 4  # persistent: the same tile
        kw = launch(16384, 16384, True, d=64)[1]  # wg3 at d = 64
        assert kw["NUM_WG"] == 3 and kw["EXP2_FMA"] == hopper.TILE_TABLE["wg3"][64][1] // 4
        kw = launch(16384, 16384, False, d=256)[1]  # 64-key tiles at d = 256
        assert kw["EXP2_FMA"] == hopper.TILE_TABLE["pingpong"][256][1] // 4 == 16
        with hopper.exp2_fma(0):  # the innermost block wins
            assert launch(16384, 16384, True)[1]["EXP2_FMA"] == 0
    monkeypatch.setenv("IOATTN_HOPPER_EXP2_FMA", "12.5")
    assert launch(16384, 16384, True)[1]["EXP2_FMA"] == bn // 8
    with hopper.exp2_fma(50):  # a block over the environment
        assert launch(16384, 16384, True)[1]["EXP2_FMA"] == bn // 2
    monkeypatch.delenv("IOATTN_HOPPER_EXP2_FMA")
    assert launch(16384, 16384, True)[1]["EXP2_FMA"] == 0
    # the persistent kernel: the output by TMA through a (batch, seqlen_q, nheads * d) descriptor of
    # [1, 64, d] boxes, and the walk's and the head count's magic divisors (the positional arguments
    # after qk_scale: walk_div, walk_mul, walk_shift, head_mul, head_shift), for each walk
    with hopper.walk_table(False):
        for sq, causal, walk in ((512, False, 4), (512, True, 2), (520, True, 2 * 4)):  # 5 query blocks: LPT
            kw = launch(sq, sq, causal)[1]
            assert kw["PERSISTENT"] and kw["ROW_STORES"] == 3 and kw["FAST_DIV"]
            assert kw["PAIRED"] == (sq == 512 and causal)
            o_desc = kw["args"][3]
            assert list(o_desc.shape) == [2, sq, 4 * 128] and list(o_desc.block_shape) == [1, 64, 128]
            assert kw["args"][16:21] == (walk, *magic_divisor(walk)[1:], *magic_divisor(4)[1:]), kw["args"]
    kw = launch(16384, 16384, True)[1]  # the one-tile kernel: no copy, its divisions (once a program)
    assert kw["ROW_STORES"] != 3 and not kw["FAST_DIV"] and kw["args"][3] is None
    # the causal walk from the host's table (hopper.walk_table, docs/decisions/persistent-causal-walk.md): by
    # default the persistent causal calls at d = 64 / 128, every length (docs/decisions/persistent-causal-walk.md);
    # forced, every persistent causal call at d = 64 / 128 gets an int32 table of every tile (LPT-encoded: the walk
    # divisor is the (batch, head) count) and no paired walk; others get none
    assert launch(512, 512, True)[1]["Walk"] is not None and launch(1024, 1024, True, d=64)[1]["Walk"] is not None
    assert launch(512, 512, True, d=64)[1]["Walk"] is not None  # 4 query blocks at d = 64 too
    with hopper.walk_table(False):
        assert launch(512, 512, True, d=64)[1]["Walk"] is None  # off: the computed LPT walk
    assert all(launch(sq, sq, c)[1]["Walk"] is None for sq, c in ((512, False), (16384, True)))
    with hopper.walk_table(True):
        kw = launch(512, 512, True)[1]
        walk = kw["Walk"]
        assert kw["PERSISTENT"] and not kw["PAIRED"] and walk.dtype == torch.int32
        assert kw["args"][16] == 2 * 4  # walk_div: the (batch, head) count
        steps, tiles = walk[0].item(), kw["num_tiles"]
        entries = walk[1:].tolist()
        assert len(entries) == (steps + 1) * 32 and sorted(t for t in entries if t != tiles) == list(range(tiles))
        assert launch(512, 512, True, d=64)[1]["Walk"] is not None
        assert launch(512, 512, False)[1]["Walk"] is None and launch(16384, 16384, True)[1]["Walk"] is None
        assert launch(512, 512, True, d=256)[1]["Walk"] is None  # outside WALK_TABLE_FITS
    # a shape's first call inside a CUDA graph's capture (no host copy allowed there): the computed walk
    # and its options (pairs at d = 128); a shape built before the capture keeps its table
    gluon_fwd._WALK_TABLES.clear()
    launch(512, 512, True)
    monkeypatch.setattr(gluon_fwd, "_capturing", lambda device: True)
    assert launch(512, 512, True)[1]["Walk"] is not None  # built before
    kw = launch(1024, 1024, True)[1]
    assert kw["Walk"] is None and kw["PAIRED"] and kw["args"][16] == 4  # walk_div: half the query blocks


@_NO_INTERPRETER
def test_hopper_forward_window_launch_and_policy(monkeypatch):
    """Sliding windows in the Gluon forward (the kernel's ``WINDOW`` form): the launcher passes the
    window's sides (an unbounded one as seqlen_q + seqlen_k + 1), masked key tiles and a one-tile
    ping-pong variant even where the lengths would take the persistent kernel; it refuses a causal
    window without causal=True, causal=True with another window, and a bad side, before any launch;
    the call checks refuse windows in a variant without the form (named), the policy wants
    ``WINDOW_MIN_WIDTH``'s width, the plan names the window, and the API's launcher passes the window
    through (the causal mask as causal=True). (No GPU here: a fake stands in for the launch, and the
    device check is replaced by the pure-Python call checks.)"""
    import ioattn
    from ioattn import backends
    from ioattn.plan import hopper
    launches = _fake_forward_launches(monkeypatch)
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)

    def launch(n, d, window, causal=False, varlen=False):
        launches.clear()
        q, k = torch.randn(2, n, 4, d, dtype=BF16), torch.randn(2, n, 2, d, dtype=BF16)
        if varlen:
            cu = torch.tensor([0, n, 2 * n], dtype=torch.int32)
            backends.hopper_forward(q.view(-1, 4, d), k.view(-1, 2, d), k.view(-1, 2, d), 0.1, causal,
                                  cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n, window=window)
        else:
            backends.hopper_forward(q, k, k, 0.1, causal, window=window)
        ((grid, args, kw),) = launches
        return grid, kw

    n = hopper.PERSISTENT_MAX_SEQLEN[(128, False)]  # the persistent kernel's range without a window
    assert launch(n, 128, (-1, -1))[1]["PERSISTENT"]
    grid, kw = launch(n, 128, (100, 0))
    assert kw["WINDOW"] and not kw["PERSISTENT"] and kw["PINGPONG"] and kw["NUM_WG"] == 2 and not kw["IS_CAUSAL"]
    assert kw["KEY_MASKS"] and (kw["win_left"], kw["win_right"]) == (100, 0)
    assert grid == (-(-n // kw["BLOCK_M"]) * 2 * 4,)  # one program per query tile
    assert (launch(n, 128, (-1, 7))[1]["win_left"], launch(n, 128, (9, -1))[1]["win_right"]) == (2 * n + 1,) * 2
    kw = launch(4096, 64, (256, 256))[1]  # d = 64: the three-warpgroup variant
    assert kw["WINDOW"] and kw["NUM_WG"] == 3 and (kw["win_left"], kw["win_right"]) == (256, 256)
    kw = launch(300, 256, (5, 5), varlen=True)[1]
    assert kw["WINDOW"] and kw["IS_VARLEN"] and kw["KV_TAIL"]
    for window, causal in (((-1, -1), False), ((-1, -1), True)):
        assert not launch(n, 128, window, causal)[1]["WINDOW"]  # no window, or the causal mask's own path
    for window, causal, match in (((-1, 0), False, r"window \(-1, 0\) is the causal mask"),
                                  ((8, 0), True, r"causal=True with window \(8, 0\)"),
                                  ((-2, 4), False, r"window must be \(left, right\)")):
        launches.clear()
        with pytest.raises(ValueError, match=match):
            launch(256, 128, window, causal)
        assert not launches
    with hopper.variant("persistent"), pytest.raises(ValueError, match="a sliding window needs one of the variants"):
        launch(256, 128, (8, 0))
    # the call checks: windows in the variants that have the form
    q = torch.empty(1, 4096, 2, 128, dtype=BF16)
    assert hopper.call_supported(q, q, q, False, Semantics(0.125, (100, 0)), None) == (True, "")
    for name in ("persistent", "base"):
        with hopper.variant(name):
            assert hopper.call_supported(q, q, q, False, Semantics(0.125, (100, 0)), None) == (
                False, f"sliding window: the variants {hopper.WINDOW_VARIANTS} only (here {name})")
            assert hopper.call_supported(q, q, q, False, Semantics(0.125, (-1, 0)), None)[0]  # causal: its own path
    assert hopper.call_supported(q, q, q, False, Semantics(0.125, (100, 0), 0.0, 0.1), None) == (False, "no dropout yet")
    # the policy: the lengths' non-causal row, then the window's width (an unbounded side as seqlen_k)
    assert hopper.window_width_of((100, 0), 4096) == 101 and hopper.window_width_of((-1, 5), 4096) == 4102
    assert hopper.window_width_of((-1, 5), None, 900) == 906  # varlen: the longest query length
    assert hopper.window_width_of((-1, 0), 4096) is None and hopper.window_width_of((-1, -1), 4096) is None
    with monkeypatch.context() as m:
        m.setitem(hopper.WINDOW_MIN_WIDTH, 128, 300)
        assert hopper.policy(q, window_width=300) == (
            True, "default policy: head dim 128 non-causal window of width 300 from seqlen_q >= 512 (here 4096)")
        assert hopper.policy(q, window_width=299) == (
            False, "default policy: head dim 128 sliding windows from width 300 (hopper.WINDOW_MIN_WIDTH; here 299)")
        assert not hopper.policy(q[:, :100], window_width=4000)[0]  # the lengths' table first
        m.delitem(hopper.WINDOW_MIN_WIDTH, 128)
        assert hopper.policy(q, window_width=4000) == (
            False, "default policy: head dim 128 sliding windows are not in hopper.WINDOW_MIN_WIDTH")
        m.setitem(hopper.WINDOW_MIN_WIDTH, 128, 300)
        monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)  # as if on an sm_90 GPU
        with dispatch.forced_backend("triton"):
            plan = ioattn.explain_dispatch(q, q, q, window_size=(299, 0))
            assert plan.forward["gluon_hopper"].startswith("taken") and plan.forward["window"].startswith("(299, 0)")
            assert plan.forward["kernel"].endswith("(Gluon, pingpong)") and not plan.forward["mask"].startswith("none")
            assert "window" not in ioattn.explain_dispatch(q, q, q, causal=True).forward
            plan = ioattn.explain_dispatch(q, q, q, window_size=(298, 0))
            assert "hopper" not in plan.forward["kernel"] and "WINDOW_MIN_WIDTH" in plan.forward["gluon_hopper"]
            calls = _fake_gluon_routes(m)
            qs = q[:, :600]
            for window in ((400, 0), (-1, 0)):
                assert backends.triton_forward(qs, qs, qs, None, None, 600, 600, Semantics(0.125, window), None,
                                               0) == ("out", "lse")
    (a1, kw1), (a2, kw2) = calls
    assert a1[3:] == (0.125, False) and kw1["window"] == (400, 0)
    assert a2[3:] == (0.125, True) and kw2["window"] == (-1, -1)


@_NO_INTERPRETER
def test_hopper_forward_softcap_launch_and_policy(monkeypatch):
    """A score softcap in the Gluon forward (the kernel's ``SOFTCAP`` form): the launcher passes
    softcap_a = scale / cap and the cap (times log2 e) as the softmax's scale, in a one-tile ping-pong
    variant even where the lengths would take the persistent kernel, with or without a window; it
    refuses a negative cap before any launch; the call checks refuse it in a variant without the form
    (named) and the policy in a head dim outside ``SOFTCAP_HEADDIMS``; the API's launcher passes it
    through. (No GPU here: fakes stand in.)"""
    import math

    import ioattn
    from ioattn import backends
    from ioattn.plan import hopper
    launches = _fake_forward_launches(monkeypatch)
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    n = hopper.PERSISTENT_MAX_SEQLEN[(128, True)]
    q = torch.randn(1, n, 4, 128, dtype=BF16)
    for causal, window in ((True, (-1, -1)), (False, (100, 0)), (False, (-1, -1))):
        launches.clear()
        backends.hopper_forward(q, q, q, 0.1, causal, window=window, softcap=20.0)
        ((grid, args, kw),) = launches
        assert kw["SOFTCAP"] and not kw["PERSISTENT"] and kw["PINGPONG"] and kw["IS_CAUSAL"] == causal
        assert math.isclose(kw["softcap_a"], 0.1 / 20.0) and math.isclose(args[15], 20.0 * math.log2(math.e))
    launches.clear()
    backends.hopper_forward(q, q, q, 0.1, True)
    assert not launches[0][2]["SOFTCAP"] and math.isclose(launches[0][1][15], 0.1 * math.log2(math.e))
    with pytest.raises(ValueError, match="softcap must be >= 0"):
        launches.clear()
        backends.hopper_forward(q, q, q, 0.1, True, softcap=-1.0)
    assert not launches
    assert hopper.call_supported(q, q, q, False, Semantics(0.125, (-1, 0), 20.0), None) == (True, "")
    with hopper.variant("persistent"):
        assert hopper.call_supported(q, q, q, False, Semantics(0.125, (-1, 0), 20.0), None) == (
            False, f"softcap: the variants {hopper.SOFTCAP_VARIANTS} only (here persistent)")
    assert hopper.call_supported(q, q, q, False, Semantics(0.125, (-1, 0), 20.0, 0.5), None) == (False, "no dropout yet")
    assert hopper.policy(q, causal=True, softcap=True)[1].endswith(f"causal softcap from seqlen_q >= 512 (here {n})")
    with monkeypatch.context() as m:
        m.setattr(hopper, "SOFTCAP_HEADDIMS", (64,))
        assert hopper.policy(q, causal=True, softcap=True) == (
            False, "default policy: head dim 128 with a softcap is not in hopper.SOFTCAP_HEADDIMS")
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)  # as if on an sm_90 GPU
    calls = _fake_gluon_routes(monkeypatch)
    with dispatch.forced_backend("triton"):
        assert backends.triton_forward(q, q, q, None, None, n, n, Semantics(0.125, (-1, 0), 30.0), None, 0) == ("out", "lse")
        plan = ioattn.explain_dispatch(q, q, q, causal=True, softcap=30.0)  # the plan of the same call
        assert plan.forward["kernel"].endswith("(Gluon, pingpong)") and plan.forward["softcap"].startswith("30 * tanh")
        assert "softcap" in plan.forward["gluon_hopper"]
        assert "softcap" not in ioattn.explain_dispatch(q, q, q, causal=True).forward
    ((a, kw),) = calls
    assert a[3:] == (0.125, True) and kw["softcap"] == 30.0


@_NO_INTERPRETER
def test_hopper_backward_softcap_launch_and_policy(monkeypatch):
    """A score softcap in the Gluon backward (the ws kernel's ``SOFTCAP`` form): the configuration
    takes lse out of S^T's accumulator (the tanh needs the raw scores), ``WS_SCORE_MOD_BLOCK_M``'s rows
    a step and, at ``WS_SOFTCAP_COL_SPLIT_HEADDIMS``, the column split; the launcher passes the cap
    (times log2 e) as the exponentials' scale and softcap_a = scale / cap; a negative cap, or a cap
    in the base variant, is refused before any launch; the plan names the form. (No GPU here: a fake
    kernel records the launch; the portable preprocess runs under the interpreter.)"""
    import math

    import ioattn
    from ioattn.plan import hopper_bwd
    from ioattn import backends
    for d in (64, 128, 256):
        plain, capped = hopper_bwd.kernel_config(d, "ws"), hopper_bwd.kernel_config(d, "ws", softcap=True)
        assert capped["constexprs"]["SOFTCAP"] and not plain["constexprs"]["SOFTCAP"]
        assert not capped["constexprs"]["LSE_IN_ACC"]
        assert capped["block_m"] == hopper_bwd.WS_SCORE_MOD_BLOCK_M.get(d, hopper_bwd.WS_BLOCK_M[d]) == \
            capped["constexprs"]["BLOCK_M"]
        assert capped["constexprs"]["COL_SPLIT"] == (d == 256 or d in hopper_bwd.WS_SOFTCAP_COL_SPLIT_HEADDIMS)
    with monkeypatch.context() as m:
        m.setattr(hopper_bwd, "WS_SOFTCAP_COL_SPLIT_HEADDIMS", (128,))
        cfg = hopper_bwd.kernel_config(128, "ws", softcap=True)
        assert cfg["constexprs"]["COL_SPLIT"] and cfg["block_n"] == 64 and cfg["dq_cols"] == 64
        assert not cfg["dq_flat"] and not hopper_bwd.kernel_config(128, "ws")["constexprs"]["COL_SPLIT"]

    launches = _fake_backward_launches(monkeypatch)
    lse = torch.randn(1, 2, 8)
    for d in (64, 128):
        x = torch.randn(1, 8, 2, d, dtype=torch.bfloat16)
        for causal, window in ((False, (-1, -1)), (True, (-1, -1)), (False, (3, 0))):
            launches.clear()
            backends.hopper_backward(x, x, x, x, x, lse, 0.1, causal, window=window, softcap=20.0)
            ((grid, args, kw),) = launches
            assert kw["SOFTCAP"] and not kw["LSE_IN_ACC"] and kw["IS_CAUSAL"] == causal
            assert kw["BLOCK_M"] == hopper_bwd.WS_SCORE_MOD_BLOCK_M.get(d, hopper_bwd.WS_BLOCK_M[d])
            assert math.isclose(args[18], 20.0 * math.log2(math.e)) and math.isclose(args[21], 0.1 / 20.0)
        launches.clear()
        backends.hopper_backward(x, x, x, x, x, lse, 0.1, False)
        assert not launches[0][2]["SOFTCAP"] and math.isclose(launches[0][1][18], 0.1 * math.log2(math.e))
        launches.clear()
        with pytest.raises(ValueError, match="softcap must be >= 0"):
            backends.hopper_backward(x, x, x, x, x, lse, 0.1, False, softcap=-1.0)
        assert not launches
    # the plan of a softcap call, the backward taken (faked as on an sm_90 GPU)
    q = torch.randn(1, 4096, 4, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(hopper_bwd, "bwd_plan", lambda *a: (True, "faked"))
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q, q, q, causal=True, softcap=30.0)
        assert "hopper_backward" in plan.backward["kernels"]
        assert plan.backward["softcap"].startswith("SOFTCAP form") and "key split" in plan.backward["softcap"]
        assert "softcap" not in ioattn.explain_dispatch(q, q, q, causal=True).backward


@_NO_INTERPRETER
def test_hopper_alibi_launch_and_policy(monkeypatch):
    """ALiBi in the Gluon kernels (their ``ALIBI`` forms): the forward takes a one-tile variant (never
    the persistent walk) in the call's form (``alibi_form``): without a mask at d = 64 / 128 the
    magic-number form in the head dim's plain configuration (wg3; 128-key tiles), else the fp32 columns
    in a two-warpgroup variant with ``ALIBI_KEY_TILES``' key tiles; the backward ``WS_SCORE_MOD_BLOCK_M``'s rows a step; both
    launchers pass the slopes, their batch stride and -1 / softmax_scale (-1 / cap with a softcap);
    bad slopes and a zero scale are refused before any launch, the plans route a zero scale to the
    portable kernels; the API passes the slopes through and the plan names the forms. (No GPU here:
    fakes stand in.)"""
    import math

    import ioattn
    from ioattn.plan import hopper_bwd
    from ioattn import backends
    from ioattn.plan import hopper
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    magic, cols = hopper.ALIBI_MAGIC, hopper.ALIBI_FP32_COLS
    assert [hopper.alibi_form(d) for d in (64, 128, 256)] == [magic, magic, cols]
    least64 = hopper.ALIBI_MAGIC_CAUSAL_MIN_SEQLEN[64]
    assert hopper.alibi_form(64, causal=True, seqlen_q=least64 - 1) == hopper.alibi_form(64, window=True) == cols
    assert hopper.alibi_form(64, causal=True, seqlen_q=least64) == magic
    assert hopper.alibi_form(128, varlen=True) == magic and hopper.alibi_form(64, varlen=True) == cols
    # with a mask: causal from ALIBI_MAGIC_CAUSAL_MIN_SEQLEN's length, windows at ALIBI_MAGIC_WINDOW_HEADDIMS
    least = hopper.ALIBI_MAGIC_CAUSAL_MIN_SEQLEN[128]
    assert hopper.alibi_form(128, causal=True) == hopper.alibi_form(128, window=True) == magic
    assert hopper.alibi_form(128, causal=True, seqlen_q=least) == magic
    assert hopper.alibi_form(128, causal=True, seqlen_q=least - 1) == cols
    assert hopper.alibi_form(128, window=True, seqlen_q=least - 1) == magic
    with monkeypatch.context() as m:
        m.setattr(hopper, "ALIBI_MAGIC_CAUSAL_MIN_SEQLEN", {64: 0})
        m.setattr(hopper, "ALIBI_MAGIC_WINDOW_HEADDIMS", ())
        assert hopper.alibi_form(128, causal=True) == hopper.alibi_form(128, window=True) == cols
        assert hopper.alibi_form(64, causal=True) == magic  # but not with a softcap or packed (wg3 spills)
        assert hopper.alibi_form(64, causal=True, softcap=True) == hopper.alibi_form(64, causal=True, varlen=True) == cols
    assert hopper.alibi_form(64, softcap=True) == magic
    assert hopper.variant_for(64, alibi=magic) == hopper.variant_for(64) == "wg3"
    assert hopper.variant_for(64, True, alibi=cols) == "pingpong" and hopper.variant_for(64, True, alibi=magic) == "wg3"
    n = hopper.PERSISTENT_MAX_SEQLEN[(128, True)]
    assert hopper.variant_for(128, True, n) == "persistent" and hopper.variant_for(128, True, n, alibi=cols) == "pingpong"
    cfg = hopper.kernel_config(128, "pingpong", causal=True, alibi=cols)
    assert (cfg["block_n"], cfg["stages"]) == hopper.ALIBI_KEY_TILES[128] == (cfg["constexprs"]["BLOCK_N"], 4)
    for d, form in ((128, magic), (256, cols)):
        assert hopper.kernel_config(d, "pingpong", alibi=form)["block_n"] == hopper.TILE_TABLE["pingpong"][d][1]
    q64 = torch.randn(1, 8, 4, 64, dtype=BF16)
    assert hopper.call_supported(q64, q64, q64, False, Semantics(0.125, (-1, -1), alibi=True), torch.ones(4)) == (True, "")
    assert hopper.call_supported(q64, q64, q64, False, Semantics(0.125, (-1, 0), alibi=True), torch.ones(4)) == (True, "")
    with hopper.variant("persistent"):
        assert hopper.call_supported(q64, q64, q64, False, Semantics(0.125, (-1, -1), alibi=True), torch.ones(4)) == (
            False, f"ALiBi: the variants {hopper.ALIBI_VARIANTS} only (here persistent)")
    with hopper.variant("wg3"):  # causal: the fp32 columns, which wg3 has no room for
        assert hopper.call_supported(q64, q64, q64, False, Semantics(0.125, (-1, 0), alibi=True), torch.ones(4)) == (
            False, f"ALiBi: the variants {hopper.ALIBI_FP32_VARIANTS} only (here wg3)")
    # each form's exact bound (a view: no memory): 2^22 by the magic number, 2^24 as fp32
    longest = hopper.alibi_max_seqlen(magic)
    assert longest == (1 << 22) - 256 and hopper.alibi_max_seqlen(cols) == (1 << 24) - 256
    long_k = q64[:, :1].expand(1, longest + 1, 4, 64)
    assert hopper.call_supported(q64, long_k, long_k, False, Semantics(0.125, (-1, -1), alibi=True), torch.ones(4)) == (
        False, f"ALiBi: sequences up to {longest} tokens (the bias's exact conversion; here {longest + 1})")
    assert hopper.call_supported(q64, long_k, long_k, False, Semantics(0.125, (-1, 0), alibi=True), torch.ones(4))[1] != (
        f"ALiBi: sequences up to {longest} tokens (the bias's exact conversion; here {longest + 1})")

    launches = _fake_forward_launches(monkeypatch)
    q = torch.randn(2, n, 4, 128, dtype=BF16)
    for slopes, softcap, unit, least in ((torch.rand(4), 0.0, -1 / 0.1, n + 1),
                                         (torch.rand(2, 4), 20.0, -1 / 20.0, n)):
        launches.clear()
        with monkeypatch.context() as m:  # causal: the fp32 columns at 64-key tiles, or the magic form
            m.setattr(hopper, "ALIBI_MAGIC_CAUSAL_MIN_SEQLEN", {128: least})
            backends.hopper_forward(q, q, q, 0.1, True, softcap=softcap, alibi_slopes=slopes)
        ((grid, args, kw),) = launches
        assert (kw["ALIBI"], kw["BLOCK_N"]) == ((magic, 128) if least <= n else (cols, 64))
        assert kw["Alibi"] is slopes and not kw["PERSISTENT"]
        assert kw["stride_ab"] == (4 if slopes.dim() == 2 else 0) and math.isclose(kw["alibi_unit"], unit)
    launches.clear()
    backends.hopper_forward(q, q, q, 0.1, False, alibi_slopes=torch.rand(4))  # no mask: the plain key tiles
    assert launches[0][2]["ALIBI"] == magic and launches[0][2]["BLOCK_N"] == hopper.TILE_TABLE["pingpong"][128][1] == 128
    launches.clear()
    q4 = torch.randn(2, n, 4, 64, dtype=BF16)
    short = q4[:, :hopper.ALIBI_MAGIC_CAUSAL_MIN_SEQLEN[64] - 1]
    for t, causal, form, num_wg in ((q4, False, magic, 3), (short, True, cols, 2), (q4, True, magic, 3)):
        backends.hopper_forward(t, t, t, 0.1, causal, alibi_slopes=torch.rand(4))  # d = 64: wg3 in the magic form
        assert (launches[-1][2]["ALIBI"], launches[-1][2]["NUM_WG"]) == (form, num_wg)
    launches.clear()
    backends.hopper_forward(q, q, q, 0.1, True)
    assert launches[0][2]["ALIBI"] == 0 and launches[0][2]["Alibi"] is None
    launches.clear()
    with pytest.raises(ValueError, match=f"ALiBi: sequences up to {longest} tokens"):  # the magic form's bound
        backends.hopper_forward(q64, long_k, long_k, 0.1, False, alibi_slopes=torch.rand(4))
    for slopes, scale, match in ((torch.rand(3), 0.1, "alibi_slopes must be fp32 of shape"),
                                 (torch.rand(4, dtype=torch.float64), 0.1, "alibi_slopes must be fp32"),
                                 (torch.rand(4), 0.0, "ALiBi needs softmax_scale != 0")):
        with pytest.raises(ValueError, match=match):
            backends.hopper_forward(q, q, q, scale, True, alibi_slopes=slopes)
    assert not launches
    # the policy and the plans
    assert hopper.policy(q, causal=True, alibi=True)[1].endswith(f"causal ALiBi from seqlen_q >= 512 (here {n})")
    with monkeypatch.context() as m:
        m.setattr(hopper, "ALIBI_HEADDIMS", (64,))
        assert hopper.policy(q, causal=True, alibi=True) == (
            False, "default policy: head dim 128 with ALiBi is not in hopper.ALIBI_HEADDIMS")
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)  # as if on an sm_90 GPU
    slopes = torch.rand(4)
    assert hopper.fwd_plan(q, q, q, False, Semantics(0.1, (-1, 0), alibi=True), slopes)[0]
    assert hopper.fwd_plan(q, q, q, False, Semantics(0.0, (-1, 0), alibi=True), slopes) == (
        False, "ALiBi with softmax_scale 0: the portable kernels (the bias is added in the scores' units)")
    assert hopper.fwd_plan(q, q, q, False, Semantics(0.0, (-1, 0), 5.0, alibi=True), slopes)[0]  # a cap: its units
    calls = _fake_gluon_routes(monkeypatch)
    with dispatch.forced_backend("triton"):
        assert backends.triton_forward(q, q, q, None, None, n, n, Semantics(0.125, (-1, 0), alibi=True), slopes, 0) == ("out", "lse")
        with monkeypatch.context() as m:  # causal in the fp32 columns (64-key tiles at d = 128)
            m.setattr(hopper, "ALIBI_MAGIC_CAUSAL_MIN_SEQLEN", {})
            plan = ioattn.explain_dispatch(q, q, q, causal=True, alibi_slopes=slopes)
        assert plan.forward["kernel"].endswith("(Gluon, pingpong)") and plan.forward["tiles"][1] == 64
        assert plan.forward["alibi"].startswith("-slope") and "ALiBi" in plan.forward["gluon_hopper"]
        assert plan.forward["alibi"].endswith("the key columns held as fp32)")
        plan = ioattn.explain_dispatch(q, q, q, alibi_slopes=slopes)
        assert plan.forward["alibi"].endswith("magic-number conversion)") and plan.forward["tiles"][1] == 128
        assert "alibi" not in ioattn.explain_dispatch(q, q, q, causal=True).forward
    assert calls[0][1]["alibi_slopes"] is slopes

    # the backward: the call checks, the configuration, the launcher
    assert hopper_bwd.bwd_call_supported(q64, q64, q64, False, Semantics(0.125, (-1, -1), alibi=True), slopes) == (True, "")
    assert hopper_bwd.bwd_call_supported(q64, q64, q64, False, Semantics(0.125, (-1, -1), 5.0, alibi=True), slopes) == (True, "")
    assert hopper_bwd.bwd_call_supported(q, q, q, False, Semantics(0.125, (-1, -1), 5.0, alibi=True), slopes) == (True, "")
    with monkeypatch.context() as m:
        m.setattr(hopper_bwd, "BWD_ALIBI_SOFTCAP_REFUSED", (128,))
        assert hopper_bwd.bwd_call_supported(q, q, q, False, Semantics(0.125, (-1, -1), 5.0, alibi=True), slopes) == (
            False, "ALiBi with a softcap at head dim 128: the portable backward (hopper_bwd.BWD_ALIBI_SOFTCAP_REFUSED)")
    # the backward's forms: the magic-number distance with a softcap at d = 128, and its length bound
    assert [hopper_bwd.bwd_alibi_form(d, 5.0) for d in (64, 128, 256)] == [cols, magic, cols]
    assert hopper_bwd.bwd_alibi_form(128, 0.0) == cols
    q128 = torch.randn(1, 8, 4, 128, dtype=BF16)
    long_k128 = q128[:, :1].expand(1, longest + 1, 4, 128)
    assert hopper_bwd.bwd_call_supported(q128, long_k128, long_k128, False, Semantics(0.125, (-1, -1), 5.0, alibi=True), slopes) == (
        False, f"ALiBi: sequences up to {longest} tokens (the bias's exact conversion; here {longest + 1})")
    assert hopper_bwd.bwd_call_supported(q128, long_k128, long_k128, False, Semantics(0.125, (-1, -1), alibi=True), slopes)[1] != (
        f"ALiBi: sequences up to {longest} tokens (the bias's exact conversion; here {longest + 1})")
    for d in (64, 128, 256):
        assert hopper_bwd.kernel_config(d, "ws", alibi=True)["block_m"] == hopper_bwd.WS_SCORE_MOD_BLOCK_M.get(d, hopper_bwd.WS_BLOCK_M[d])
    bwd_launches = _fake_backward_launches(monkeypatch)
    x = torch.randn(2, 8, 4, 64, dtype=BF16)
    lse = torch.randn(2, 4, 8)
    for slopes, softcap, unit in ((torch.rand(4), 0.0, -1 / 0.1), (torch.rand(2, 4), 20.0, -1 / 20.0)):
        bwd_launches.clear()
        backends.hopper_backward(x, x, x, x, x, lse, 0.1, True, softcap=softcap, alibi_slopes=slopes)
        ((grid, args, kw),) = bwd_launches
        assert kw["ALIBI"] == cols and kw["Alibi"] is slopes and kw["BLOCK_M"] == hopper_bwd.WS_SCORE_MOD_BLOCK_M[64]
        assert math.isclose(args[22], unit) and args[23] == (4 if slopes.dim() == 2 else 0)
    bwd_launches.clear()
    x128 = torch.randn(2, 8, 4, 128, dtype=BF16)
    backends.hopper_backward(x128, x128, x128, x128, x128, lse, 0.1, True, softcap=20.0, alibi_slopes=torch.rand(4))
    assert bwd_launches[0][2]["ALIBI"] == magic and bwd_launches[0][2]["SOFTCAP"]
    bwd_launches.clear()
    backends.hopper_backward(x, x, x, x, x, lse, 0.1, True)
    assert bwd_launches[0][2]["ALIBI"] == 0 and bwd_launches[0][2]["Alibi"].numel() == 0  # a tensor, never None
    bwd_launches.clear()
    long_x = x128[:, :1].expand(2, longest + 1, 4, 128)  # the magic form's bound (a view: no memory)
    with pytest.raises(ValueError, match=f"ALiBi: sequences up to {longest} tokens"):
        backends.hopper_backward(x128, x128, long_x, long_x, x128, lse, 0.1, False, softcap=20.0,
                                 alibi_slopes=torch.rand(4))
    for kw, match in ((dict(alibi_slopes=torch.rand(3)), "alibi_slopes must be fp32 of shape"),
                      (dict(alibi_slopes=torch.rand(4), scale=0.0), "ALiBi needs softmax_scale != 0")):
        kw = {"scale": 0.1, **kw}
        with pytest.raises(ValueError, match=match):
            backends.hopper_backward(x, x, x, x, x, lse, kw.pop("scale"), False, **kw)
    assert not bwd_launches
    # the backward's plan: a zero scale without a softcap to the portable backward (the device faked)
    monkeypatch.setattr(hopper, "_device_ok", lambda q: (True, ""))
    with hopper_bwd.prefer_hopper_bwd(True):
        assert hopper_bwd.bwd_plan(q64, q64, q64, False, Semantics(0.1, (-1, -1), alibi=True), slopes)[0]
        assert hopper_bwd.bwd_plan(q64, q64, q64, False, Semantics(0.0, (-1, -1), alibi=True), slopes) == (
            False, "ALiBi with softmax_scale 0: the portable kernels (the bias is added in the scores' units)")
        assert hopper_bwd.bwd_plan(q64, q64, q64, False, Semantics(0.0, (-1, -1), 5.0, alibi=True), slopes)[0]
    monkeypatch.setattr(hopper_bwd, "bwd_plan", lambda *a: (True, "faked"))
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q64, q64, q64, alibi_slopes=slopes)
        assert plan.backward["alibi"].startswith("ALIBI form") and "64 query rows" in plan.backward["alibi"]


def test_hopper_exp2_fma_switch(monkeypatch):
    """hopper.exp2_fma / IOATTN_HOPPER_EXP2_FMA: off by default, only the shares the kernel can split
    a key tile into (a power-of-two fraction of its columns), and the plan reports the share and the
    columns when the Gluon forward is taken. (The device check is replaced by the pure-Python call
    checks, as if on an sm_90 GPU.)"""
    import ioattn
    from ioattn.plan import hopper
    monkeypatch.delenv("IOATTN_HOPPER_EXP2_FMA", raising=False)
    assert hopper.EXP2_FMA_DEFAULT == 0 and hopper.exp2_fma_share() == 0
    for bad in (30, -25, 200, "half"):
        with pytest.raises(ValueError, match="share of exponentials on the FMA units"):
            with hopper.exp2_fma(bad):
                pass
    monkeypatch.setenv("IOATTN_HOPPER_EXP2_FMA", "33")
    with pytest.raises(ValueError, match="IOATTN_HOPPER_EXP2_FMA"):
        hopper.exp2_fma_share()
    monkeypatch.setenv("IOATTN_HOPPER_EXP2_FMA", "25")
    assert hopper.exp2_fma_share() == 25
    monkeypatch.delenv("IOATTN_HOPPER_EXP2_FMA")
    assert [hopper.exp2_fma_cols(s, 128) for s in hopper.EXP2_FMA_SHARES] == [0, 16, 32, 64, 128]
    assert [hopper.exp2_fma_cols(s, 64) for s in hopper.EXP2_FMA_SHARES] == [0, 8, 16, 32, 64]
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)
    q = torch.empty(1, 8192, 2, 128, dtype=BF16)
    with dispatch.forced_backend("triton"), hopper.prefer_hopper(True):
        assert ioattn.explain_dispatch(q, q, q).forward["exp2_fma"] == "off (MUFU.EX2 only)"
        with hopper.exp2_fma(50):
            plan = ioattn.explain_dispatch(q, q, q, causal=True)
    assert plan.forward["exp2_fma"] == "50% (64 of 128 key columns on the FMA units)"
    assert "exp2_fma=50% (64 of 128" in plan.describe()
    with dispatch.forced_backend("triton"), hopper.prefer_hopper(False), hopper.exp2_fma(50):
        assert "exp2_fma" not in ioattn.explain_dispatch(q, q, q).forward  # the portable kernel: no such option


def test_persistent_kernel_options_follow_their_switches():
    """hopper.persistent_options: the persistent kernel's two Q buffers only where they fit (d = 64 /
    128), by default there (since the output's bulk copy at d = 64) or when forced; the paired walk only
    for causal calls with an even number of query blocks, by default at d = 128 / 256 and at d = 64 from
    16 query blocks; the tile index by multiply-high by default at every head dim; every other variant
    one buffer, no pairs, divisions. The no-key rows' wide stores: the persistent kernel at d = 64 only
    (hopper.NO_KEY_WIDE_HEADDIMS, docs/decisions/persistent-forward-options.md), whatever the switches. Where the
    walk from the host's table is on, no pairs."""
    from ioattn.plan import hopper

    def opts(q_bufs, paired, fast_div=True, d=128):
        return dict(Q_BUFS=q_bufs, PAIRED=paired, FAST_DIV=fast_div, NO_KEY_WIDE=d == 64)

    # the walk from the host's table (hopper.walk_table, docs/decisions/persistent-causal-walk.md) takes the place
    # of the pairs where it is on: by default at d = 64 / 128, every length (docs/decisions/persistent-causal-walk.md)
    assert hopper.persistent_options(128, "persistent", True, 4) == opts(2, False)
    assert hopper.persistent_options(64, "persistent", True, 16) == opts(2, False, d=64)
    assert hopper.persistent_options(256, "persistent", True, 4) == opts(1, True)  # not at d = 256
    with hopper.walk_table(False):
        _persistent_options_without_table(hopper, opts)


def _persistent_options_without_table(hopper, opts):
    # the defaults (the measured tables): two buffers at d = 64 / 128, pairs at d = 128 / 256
    assert hopper.persistent_options(128, "persistent", True, 4) == opts(2, True)
    assert hopper.persistent_options(128, "persistent", True, 5) == opts(2, False)
    assert hopper.persistent_options(64, "persistent", True, 4) == opts(2, False, d=64)
    # d = 64: paired from 16 query blocks (N = 2048 at 128 rows), LPT below (docs/decisions/persistent-causal-walk.md)
    assert hopper.persistent_options(64, "persistent", True, 14) == opts(2, False, d=64)
    assert hopper.persistent_options(64, "persistent", True, 16) == opts(2, True, d=64)
    assert hopper.persistent_options(64, "persistent", False, 16) == opts(2, False, d=64)
    assert hopper.persistent_options(256, "persistent", True, 4) == opts(1, True)
    with hopper.persistent_q_prefetch(False), hopper.paired_walk(False), hopper.fast_tile_div(False):
        assert hopper.persistent_options(128, "persistent", True, 4) == opts(1, False, False)
        assert hopper.persistent_options(64, "persistent", False, 4) == opts(1, False, False, d=64)
    with hopper.persistent_q_prefetch(True), hopper.paired_walk(True), hopper.fast_tile_div(True):
        assert hopper.persistent_options(128, "persistent", True, 4) == opts(2, True)
        assert hopper.persistent_options(64, "persistent", False, 4) == opts(2, False, d=64)
        assert hopper.persistent_options(256, "persistent", True, 3) == opts(1, False)
        assert hopper.persistent_options(128, "pingpong", True, 4) == opts(1, False, False)
        assert not hopper.persistent_options(64, "pingpong", True, 4)["NO_KEY_WIDE"]


def test_magic_divisor_divides_exactly():
    """hopper_tiles.magic_divisor (the persistent kernel's FAST_DIV): (umulhi(n, mul) + n) >> shift,
    computed here in 32-bit unsigned arithmetic as the kernel's ``_div_by`` does, equals n // d for
    every divisor tried (1 ... 4096, powers of two and their neighbours, random ones up to 2**31 - 1)
    and dividends at the ends of the range, around multiples of d and at random; 0 and 2**31 are
    refused. walk_divisor gives the divisor ``_tile_bhm`` divides the tile index by."""
    import random

    from ioattn.plan import forward
    from ioattn.kernels.hopper_tiles import magic_divisor

    rng = random.Random(1)
    divisors = list(range(1, 4097)) + [2 ** k + e for k in range(1, 31) for e in (-1, 0, 1)] + \
        [rng.randrange(1, 2 ** 31) for _ in range(2000)]
    for d in divisors:
        if not 1 <= d < 2 ** 31:
            continue
        d_, mul, shift = magic_divisor(d)
        assert d_ == d and -2 ** 31 <= mul < 2 ** 31 and 0 <= shift <= 31
        mul &= 0xFFFFFFFF  # the kernel's bitcast to uint32
        top = (2 ** 31 - 1) // d * d
        for n in [0, 1, d - 1, d, d + 1, top - 1, top, 2 ** 31 - 1] + [rng.randrange(2 ** 31) for _ in range(20)]:
            if 0 <= n < 2 ** 31:
                s = ((n * mul) >> 32) + n
                assert s < 2 ** 32 and s >> shift == n // d, (d, n)
    for bad in (0, 2 ** 31):
        with pytest.raises(ValueError, match="divisor"):
            magic_divisor(bad)
    assert forward.walk_divisor(8, 96, False, False) == 8  # non-causal: query blocks of a head in turn
    assert forward.walk_divisor(8, 96, True, False) == 96  # causal LPT: every head's block in turn
    assert forward.walk_divisor(8, 96, True, True) == 4  # pairs: half the query blocks


def test_padded_head_dims_policy_refusals_and_exact_padding(monkeypatch):
    """Head dims the Gluon kernels lack run them zero-padded to the next one (``hopper.PADDED_RANGE``,
    docs/decisions/padded-head-dims.md): which dims, which run in place (``padded_in_place``: d a multiple of 8)
    and which on padded copies, the policy by ``padded_min_seqlen``'s table (forward and backward), plain
    fixed-length calls only (the causal mask allowed; windows, softcap, ALiBi, packed sequences, dropout
    refused by name, in the policy, the call checks and both launchers), any layout (copies); and the
    launchers' padding (the copies' path) is exact: with a stand-in kernel at the padded dim that records its inputs and
    returns the float64 oracle there, the forward's output and the backward's gradients equal the
    oracle at the call's own dim (contiguous, the padded columns zero on the way in); the plan names
    the padded kernels and their inputs (the device faked)."""
    import ioattn
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.launch import gluon_fwd
    from ioattn.plan import hopper_bwd
    from ioattn.reference.naive import attention_ref
    assert [hopper.padded_headdim(d) for d in (48, 64, 65, 80, 96, 127, 128, 129, 192, 255, 256, 320)] == \
        [None, None, 128, 128, 128, 128, None, 256, 256, 256, None, None]
    pad = gluon_fwd.pad_head(torch.arange(6.0).view(1, 2, 3), 5)
    assert pad.is_contiguous() and pad.tolist() == [[[0, 1, 2, 0, 0], [3, 4, 5, 0, 0]]]
    assert [hopper.padded_in_place(d) for d in (64, 72, 80, 100, 128, 136, 196, 200)] == \
        [False, True, True, False, False, True, False, True]
    # d = 136-192 in place: both kernels' products over 192 of the 256 columns (docs/decisions/split-products.md), named
    # in the plan's inputs; d = 72-96: the forward's over 96 of 128; d = 200 and 104 (past three
    # quarters of their tiles) not; the switches turn them off
    assert [(hopper.split_cols_for(256, d, "persistent"), hopper.bwd_split_cols_for(256, d, True))
            for d in (136, 192, 200)] == [(192, 192), (192, 192), (0, 0)]
    assert [hopper.split_cols_for(128, d, "pingpong") for d in (72, 96, 104)] == [96, 96, 0]
    assert hopper.split_cols_for(256, 192, "base") == 0 and hopper.split_cols_for(128, 96, "wg3") == 0
    # Q from shared memory
    assert hopper.split_cols_q_in_regs(True, 96) is False and hopper.split_cols_q_in_regs(True, 0) is True
    assert hopper.padded_inputs_note(96).endswith(
        "to 96 columns, the products over 96 of the 128 columns (hopper.split_cols)")
    assert hopper.bwd_split_cols_for(256, 192, False) == 0
    ring = (", K / V in 128- and 64-column tiles three deep where the keys fill whole 64-key tiles "
            "(hopper.split_ring)")
    for backward, name in ((False, "split_cols"), (True, "bwd_split_cols")):
        assert hopper.padded_inputs_note(192, backward).endswith(
            f"to 192 columns, the products over 192 of the 256 columns (hopper.{name})" + ("" if backward else ring))
        with hopper.split_ring(False):  # the forward's split ring named only where it runs
            assert hopper.padded_inputs_note(192, backward).endswith(f"(hopper.{name})")
        assert hopper.split_ring_for(256, 192, "persistent") and not hopper.split_ring_for(256, 192, "base")
        assert not hopper.split_ring_for(256, 192, "persistent", kv_tail=True)
        assert not hopper.split_ring_for(256, 200, "persistent")
        assert "products" not in hopper.padded_inputs_note(200, backward)
        assert "products" not in hopper.padded_inputs_note(104, backward)
        assert ("products" in hopper.padded_inputs_note(96, backward)) == (not backward)
        with getattr(hopper, name)(False):
            assert "products" not in hopper.padded_inputs_note(192, backward)
            assert (hopper.split_cols_for(256, 192, "persistent") if not backward
                    else hopper.bwd_split_cols_for(256, 192, True)) == 0
    # the policy: from each table's length, by pass, padded dim and mask (in place: d = dp - 32; copies:
    # d = dp - 28, not a multiple of 8)
    for table, off in ((hopper.PADDED_IN_PLACE_MIN_SEQLEN, 32), (hopper.PADDED_MIN_SEQLEN, 28)):
        for (pass_, dp, causal), least in table.items():
            d = dp - off
            assert hopper.padded_min_seqlen(pass_, d, causal)[0] == least
            judge = hopper.policy if pass_ == "fwd" else hopper_bwd.bwd_policy
            assert judge(torch.empty(1, least, 2, d), causal=causal) == (
                True, f"default policy: head dim {d} (zero-padded to {dp}) {'causal' if causal else 'non-causal'} "
                      f"from seqlen_q >= {least} (here {least})")
            assert least == 1 or not judge(torch.empty(1, least - 1, 2, d), causal=causal)[0]
    # on copies (d = 100) the forms are declined; in place (d = 96 / 192) windows, softcap and ALiBi by the
    # padded dim's rules, packed sequences in the backward only (docs/decisions/padded-head-dims.md)
    assert hopper.policy(torch.empty(1, 1 << 16, 2, 100), window_width=300) == (
        False, "default policy: head dim 100 (zero-padded to 128) non-causal: plain fixed-length calls only")
    assert not hopper_bwd.bwd_policy(torch.empty(1, 1 << 16, 2, 100), window_width=300)[0]
    assert hopper.policy(torch.empty(1, 4096, 2, 96), window_width=300) == (
        True, "default policy: head dim 96 (zero-padded to 128) non-causal window of width 300 from seqlen_q >= "
              f"{hopper.AUTO_MIN_SEQLEN[(128, False)]} (here 4096)")
    narrowest = hopper.WINDOW_MIN_WIDTH[128]
    assert hopper.policy(torch.empty(1, 4096, 2, 96), window_width=narrowest - 1) == (
        False, f"default policy: head dim 96 (zero-padded to 128) sliding windows from width {narrowest} "
               f"(hopper.WINDOW_MIN_WIDTH; here {narrowest - 1})")
    assert hopper.policy(torch.empty(1, 4096, 2, 192), causal=True, softcap=True, alibi=True)[0]
    assert hopper.policy(torch.empty(1 << 16, 2, 96), seqlen_q=1 << 16, varlen=True) == (
        False, "default policy: head dim 96 (zero-padded to 128) packed sequences: the portable forward (measured "
               "behind it at some lengths, docs/decisions/padded-head-dims.md)")
    least = hopper_bwd.BWD_VARLEN_AUTO_MIN_SEQLEN[(256, True)]
    assert hopper_bwd.bwd_policy(torch.empty(1 << 16, 2, 192), seqlen_q=least, causal=True, varlen=True) == (
        True, f"default policy: head dim 192 (zero-padded to 256) causal varlen from seqlen_q >= {least} "
              f"(here {least})")
    assert not hopper_bwd.bwd_policy(torch.empty(1 << 16, 2, 192), seqlen_q=least - 1, causal=True, varlen=True)[0]
    assert hopper_bwd.bwd_policy(torch.empty(1, 4096, 2, 192), window_width=300)[0]
    assert not hopper_bwd.bwd_policy(torch.empty(1, 4096, 2, 192), window_width=hopper_bwd.BWD_WINDOW_MIN_WIDTH[256] - 1)[0]
    # the call checks: plain calls, any layout; in place (d = 96) the kernels' forms at the padded dim by
    # its own checks, on copies (d = 100) the rest refused by name
    none = (False, Semantics(0.125), None)
    for d in (96, 100):
        q = torch.randn(1, 8, 2, d, dtype=torch.bfloat16)
        qt = torch.randn(1, 2, 8, d, dtype=torch.bfloat16).transpose(1, 2)  # no (rows, heads * d) view
        for check in (hopper.call_supported, hopper_bwd.bwd_call_supported):
            assert check(q, q, q, *none) == (True, "") and check(qt, qt, qt, *none) == (True, "")
            assert check(q, q, q, False, Semantics(0.125, (-1, 0)), None) == (True, "")
            assert "dropout" in check(q, q, q, False, Semantics(0.125, (-1, -1), 0.0, 0.1), None)[1]
            forms = (check(q, q, q, False, Semantics(0.125, (4, 0)), None),
                     check(q, q, q, False, Semantics(0.125, (-1, -1), 5.0, alibi=True), torch.ones(2)),
                     check(q[0], q[0], q[0], True, Semantics(0.125, (-1, -1)), None))
            if d == 96:
                assert forms == ((True, ""), (True, ""), (True, "")), forms
            else:
                assert forms[0] == (False, "head dim 100 runs zero-padded to 128 on copies (not a multiple of 8): "
                                           "plain fixed-length calls only (here a sliding window)")
                assert "(here a softcap, ALiBi)" in forms[1][1] and "(here packed sequences)" in forms[2][1]
    # the launchers refuse what the checks refuse, before any launch
    q = torch.randn(1, 8, 2, 100, dtype=torch.bfloat16)
    lse = torch.zeros(1, 2, 8)
    with pytest.raises(ValueError, match="plain fixed-length calls only \\(here a softcap\\)"):
        backends.hopper_forward(q, q, q, 0.1, False, softcap=5.0)
    with pytest.raises(ValueError, match="plain fixed-length calls only \\(here a sliding window\\)"):
        backends.hopper_backward(q, q, q, q, q, lse, 0.1, False, window=(4, 0))
    # exact padding, through stand-in kernels at the padded dim (float64 oracle; GQA, causal, scale 0.3)
    seen = {}
    real_fwd, real_route = backends.hopper_forward, backends.gluon_forward_route
    real_bwd, real_bwd_route = backends.hopper_backward, backends.gluon_backward_route

    def fake_route(q, k, v, scale, causal, *rest):
        if q.shape[-1] not in (64, 128, 256):
            return real_route(q, k, v, scale, causal, *rest)

        def route(q, k, v, *varlen):
            seen["fwd"] = (q, k, v, scale)
            out, lse = attention_ref(q, k, v, softmax_scale=scale, window=(-1, 0) if causal else (-1, -1))
            return out.to(q.dtype), lse.float()
        return route

    def fake_bwd_route(dout, q, k, v, out, lse, scale, causal, deterministic, *rest):
        if q.shape[-1] not in (64, 128, 256):
            return real_bwd_route(dout, q, k, v, out, lse, scale, causal, deterministic, *rest)

        def route(dout, q, k, v, out, lse, *varlen):
            seen["bwd"] = (dout, q, k, v, out, scale, deterministic)
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            ref, _ = attention_ref(*leaves, softmax_scale=scale, window=(-1, 0) if causal else (-1, -1))
            return torch.autograd.grad(ref, leaves, dout)
        return route

    monkeypatch.setattr(backends, "gluon_forward_route", fake_route)
    monkeypatch.setattr(backends, "gluon_backward_route", fake_bwd_route)
    g = torch.Generator().manual_seed(5)
    for d, causal in ((100, True), (196, False)):  # not multiples of 8: the padded copies
        q = torch.randn(2, 37, 4, d, dtype=torch.float64, generator=g)
        k, v, = (torch.randn(2, 45, 2, d, dtype=torch.float64, generator=g) for _ in range(2))
        out, lse = real_fwd(q, k, v, 0.3, causal)
        dp = hopper.padded_headdim(d)
        assert all(t.shape[-1] == dp and not t[..., d:].any() for t in seen["fwd"][:3]) and seen["fwd"][3] == 0.3
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        ref, ref_lse = attention_ref(*leaves, softmax_scale=0.3, window=(-1, 0) if causal else (-1, -1))
        assert out.shape == q.shape and out.is_contiguous()
        torch.testing.assert_close(out, ref.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse.double(), ref_lse.detach(), rtol=1e-6, atol=1e-6)
        dout = torch.randn(out.shape, dtype=torch.float64, generator=g)
        grads = real_bwd(dout, q, k, v, out, lse, 0.3, causal, deterministic=True)
        assert all(t.shape[-1] == dp and not t[..., d:].any() for t in seen["bwd"][:5])
        assert seen["bwd"][5] == 0.3 and seen["bwd"][6] is True
        for got, want in zip(grads, torch.autograd.grad(ref, leaves, dout)):
            assert got.shape == want.shape and got.is_contiguous()
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    # the plan (the device faked): both Gluon kernels at the padded dim by the default policy, inputs named
    monkeypatch.setattr(hopper, "_device_ok", lambda q: (True, ""))
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)
    for d, dp in ((96, 128), (100, 128), (192, 256)):
        long = torch.empty(1, 16384, 2, d, dtype=torch.bfloat16)
        with dispatch.forced_backend("triton"):
            plan = ioattn.explain_dispatch(long, long, long, causal=True)
        least = hopper.padded_min_seqlen("fwd", d, True)[0]
        assert plan.forward["gluon_hopper"] == (f"taken (default policy: head dim {d} (zero-padded to {dp}) causal "
                                                f"from seqlen_q >= {least} (here 16384))")
        assert plan.backward["gluon_hopper"].startswith("taken (default policy: head dim")
        assert plan.forward["head_dim_padded"] == dp
        if d % 8:
            assert "zero-padded copies" in plan.forward["inputs"]
            assert "zero-padded copies of q, k, v, out, dout" in plan.backward["inputs"]
        else:
            fwd_products, bwd_products = ((", the products over 192 of the 256 columns (hopper.split_cols), K / V in "
                                           "128- and 64-column tiles three deep where the keys fill whole 64-key "
                                           "tiles (hopper.split_ring)",
                                           ", the products over 192 of the 256 columns (hopper.bwd_split_cols)")
                                          if d == 192 else
                                          (", the products over 96 of the 128 columns (hopper.split_cols)", "")
                                          if d == 96 else ("", ""))
            assert plan.forward["inputs"] == (f"read in place at head dim {dp}, the columns past {d} zero-filled by "
                                              f"TMA (gluon_fwd.padded_rows_desc), the output stored to {d} columns"
                                              + fwd_products)
            assert plan.backward["inputs"].endswith(f"the gradients stored to {d} columns" + bwd_products)
        with dispatch.forced_backend("triton"):
            short = ioattn.explain_dispatch(*(long[:, :least // 2] for _ in range(3)), causal=True)
        assert short.forward["gluon_hopper"].startswith("not taken (default policy") and \
            "attn_fwd_kernel" in short.forward["kernel"]
    # in place, a window by the padded dim's rules, both ways (d = 96)
    long = torch.empty(1, 16384, 2, 96, dtype=torch.bfloat16)
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(long, long, long, window_size=(1024, 0))
    assert plan.forward["gluon_hopper"].startswith("taken (default policy: head dim 96 (zero-padded to 128) "
                                                   "non-causal window of width 1025"), plan.forward
    assert plan.backward["gluon_hopper"].startswith("taken (default policy: head dim 96 (zero-padded to 128)")
    assert plan.forward["inputs"].startswith("read in place") and "pingpong" in plan.forward["kernel"]


def _tma_box(desc, coords):
    """What a TMA load of ``desc``'s box at ``coords`` reads: the elements of ``desc.base``'s storage at
    sum(index * stride) for the box's indices inside ``desc.shape``, zero past it (TMA's fill)."""
    full = desc.base.as_strided(desc.shape, desc.strides)
    box = torch.zeros(desc.block_shape, dtype=desc.base.dtype)
    valid = [max(0, min(b, n - c)) for b, n, c in zip(desc.block_shape, desc.shape, coords)]
    box[tuple(slice(0, v) for v in valid)] = full[tuple(slice(c, c + v) for c, v in zip(coords, valid))]
    return box


def test_padded_in_place_descriptors_read_and_store_the_padded_tiles():
    """The descriptors a padded call is read and stored through in place (``gluon_fwd.padded_rows_desc``,
    ``padded_out_desc``; the kernels' ``_load_rows`` / ``_store_rows_tma`` coordinates): with TMA's
    addressing and its zero fill past the bounds emulated on the CPU, a box at (head * d / 8, row, 0)
    holds exactly the zero-padded copy's tile (``pad_head``: the head's d columns, zeros to the padded dim,
    zero rows past the tensor), for a contiguous tensor and for a packed qkv's view (a row stride above
    heads * d); and the output's 4-D copy at (head * d / 8, batch, row, 0) writes the stage's d columns of
    the rows before seqlen_q and nothing else."""
    pytest.importorskip("triton.experimental.gluon")
    from triton.experimental.gluon import language as gl

    from ioattn.plan import hopper
    from ioattn.launch import gluon_fwd
    g = torch.Generator().manual_seed(3)
    for d, heads in ((80, 3), (96, 2), (200, 2)):
        dp, rows_box = hopper.padded_headdim(d), 64
        qkv = torch.randn(2, 37, 3, heads, d, generator=g).to(torch.bfloat16)
        for t in (qkv[:, :, 0].contiguous(), qkv.unbind(2)[1]):
            desc = gluon_fwd.padded_rows_desc(t, rows_box, dp, gl.bfloat16)
            assert desc.block_shape == [1, rows_box, dp] and desc.strides[0] == 8 and desc.shape[2] == d
            padded = gluon_fwd.pad_head(t, dp).reshape(-1, heads, dp)
            for h in range(heads):
                for row in (0, 10, 50):  # 50: the box runs past the 74 rows
                    want = torch.zeros(rows_box, dp, dtype=t.dtype)
                    part = padded[row:row + rows_box, h]
                    want[:part.shape[0]] = part
                    assert torch.equal(_tma_box(desc, [h * d // 8, row, 0])[0], want), (d, h, row)
        out = torch.zeros(2, 37, heads, d, dtype=torch.bfloat16)
        odesc = gluon_fwd.padded_out_desc(out, rows_box, dp, gl.bfloat16)
        assert odesc.block_shape == [1, 1, rows_box, dp]
        stage = torch.randn(rows_box, dp, generator=g).to(torch.bfloat16)
        b, m, h = 1, 0, heads - 1
        full = out.as_strided(odesc.shape, odesc.strides)
        coords = [h * d // 8, b, m, 0]
        valid = [max(0, min(bs, n - c)) for bs, n, c in zip(odesc.block_shape, odesc.shape, coords)]
        full[tuple(slice(c, c + v) for c, v in zip(coords, valid))] = \
            stage.view(1, 1, rows_box, dp)[tuple(slice(0, v) for v in valid)]
        want = torch.zeros_like(out)
        want[b, m:, h] = stage[:37 - m, :d]
        assert torch.equal(out, want)


@_NO_INTERPRETER
def test_prepared_forward_launch_reads_each_calls_tensors(monkeypatch):
    """A prepared Gluon forward (``backends.gluon_forward_route``) launched again with new tensors of the
    same layout reads those tensors: inputs without a (rows, heads * d) view (transposed from
    (batch, heads, seqlen, d)) through contiguous copies of the call's own tensors, a head dim read
    head-padded in place (d = 96) through its 3-D descriptors; each descriptor's base holds the call's
    values (the kernel faked)."""
    from ioattn import backends
    launches = _fake_forward_launches(monkeypatch)
    for d, transposed in ((128, True), (96, False)):
        def make():
            if transposed:
                return torch.randn(2, 4, 64, d, dtype=BF16).transpose(1, 2)
            return torch.randn(2, 64, 4, d, dtype=BF16)
        q0 = make()
        route = backends.gluon_forward_route(q0, q0, q0, 0.1, False)
        for _ in range(2):
            q, k, v = make(), make(), make()
            launches.clear()
            route(q, k, v)
            ((grid, args, kw),) = launches
            for desc, t in zip(args[:3], (q, k, v)):
                assert torch.equal(desc.base.reshape(-1), t.contiguous().reshape(-1))


@_NO_INTERPRETER
def test_forward_routes_are_keyed_on_layout_and_switches(monkeypatch):
    """``backends.triton_forward`` prepares a route once per call key: a second call laid out the same
    reuses it (each call still launches, with its own tensors); a switch set, an environment variable
    set or another layout makes a new one, which the launch follows (the kernel faked, an sm_90 GPU
    faked)."""
    from ioattn import backends
    from ioattn.plan import hopper
    launches = _fake_forward_launches(monkeypatch)
    monkeypatch.setattr(hopper, "hopper_supports", hopper.call_supported)
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT", raising=False)
    made, real_route = [], backends.gluon_forward_route
    monkeypatch.setattr(backends, "gluon_forward_route", lambda *a: made.append(a[0].shape) or real_route(*a))
    sem = Semantics(0.1, (-1, 0))

    def call(q):
        with dispatch.forced_backend("triton"), hopper.prefer_hopper(True):
            return backends.triton_forward(q, q, q, None, None, q.shape[1], q.shape[1], sem, None, 0)

    q = torch.randn(2, 600, 4, 128, dtype=BF16)
    call(q), call(torch.randn_like(q))
    assert len(made) == 1 and len(launches) == 2 and launches[1][1][0].base is not launches[0][1][0].base
    default = launches[-1][2]["PERSISTENT"]
    with hopper.variant("pingpong" if default else "persistent"):
        call(q)
    assert len(made) == 2 and launches[-1][2]["PERSISTENT"] != default
    monkeypatch.setenv("IOATTN_HOPPER_VARIANT", "pingpong" if default else "persistent")
    call(q)
    assert len(made) == 3 and launches[-1][2]["PERSISTENT"] != default
    monkeypatch.delenv("IOATTN_HOPPER_VARIANT")
    call(q)  # the first key again
    assert len(made) == 3 and launches[-1][2]["PERSISTENT"] == default
    call(torch.randn(2, 600, 3, 4, 128, dtype=BF16)[:, :, 0])  # a packed qkv's q: other strides, another route
    assert len(made) == 4
