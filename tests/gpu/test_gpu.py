"""The compiled Triton kernels on a real GPU, at sizes the interpreter cannot reach (skipped on CPU).
Run on the device; the log of the last run is committed under benchmarks/results/."""
import pytest
import torch

import ioattn
from ioattn.reference import attention_ref
from ioattn.semantics import Semantics

from conftest import assert_lse_close, assert_varlen_sequences, assert_within_torch_error, attention_oracles

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _assert_grads_match_oracle(grads, q, k, v, dout, window):
    """(dq, dk, dv) of a backward kernel called directly: no NaN, and within 2x PyTorch's own error
    in q's dtype of the float64 oracle's gradients."""
    ref_in = [t.double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_in, window=window)
    ref_grads = torch.autograd.grad(ref, ref_in, dout.double())
    same_in = [t.clone().requires_grad_() for t in (q, k, v)]
    same, _ = attention_ref(*same_in, window=window, upcast=False)
    same_grads = torch.autograd.grad(same, same_in, dout)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, ref_grads, same_grads):
        assert not g.isnan().any(), name
        assert_within_torch_error(name, g, r, s)


def _check(b, sq, sk, h, hkv, d, dtype, causal=False, window=(-1, -1), softcap=0.0, alibi=False, varlen=False,
           q_scale=1.0):
    """``q_scale``: q drawn with that standard deviation (larger: peaked rows, scores far apart)."""
    q = (torch.randn(b, sq, h, d, device="cuda", dtype=dtype) * q_scale).requires_grad_()
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True)
    _check_tensors(q, k, v, causal, window, softcap, alibi)


def _check_tensors(q, k, v, causal=False, window=(-1, -1), softcap=0.0, alibi=False):
    """``_check`` on given leaf tensors (requires_grad) of shapes (b, sq, h, d) / (b, sk, hkv, d)."""
    b, h = q.shape[0], q.shape[2]
    slopes = torch.rand(b, h, device="cuda") * 0.3 if alibi else None
    out = ioattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, (window[0], 0) if causal else window, softcap, slopes)


def _assert_out_and_grads(out, grads, dout, q, k, v, window, softcap=0.0, slopes=None):
    """``out`` and its (dq, dk, dv) for ``dout`` against the float64 oracle (``window`` as the oracle
    takes it: causal is (left, 0)), within 2x PyTorch's own error in q's dtype."""
    ref_in = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ref, _ = attention_ref(*ref_in, window=window, softcap=softcap, alibi_slopes=slopes)
    ref_grads = torch.autograd.grad(ref, ref_in, dout.double())
    same_in = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    same, _ = attention_ref(*same_in, window=window, softcap=softcap, alibi_slopes=slopes, upcast=False)
    same_grads = torch.autograd.grad(same, same_in, dout)
    assert_within_torch_error("out", out, ref, same)
    for name, g, r, s in zip(("dq", "dk", "dv"), grads, ref_grads, same_grads):
        assert_within_torch_error(name, g, r, s)


@pytest.mark.parametrize("d", [32, 59, 64, 80, 96, 111, 128, 192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_headdims(d, causal):
    _check(2, 777, 777, 4, 2, d, torch.bfloat16, causal=causal)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("sq,sk", [(1, 1000), (1000, 1), (513, 2049), (2049, 513)])
def test_ragged_causal(dtype, sq, sk):
    _check(1, sq, sk, 8, 1, 128, dtype, causal=True)


@pytest.mark.parametrize("window", [(256, 0), (100, 37), (0, 0)])
def test_window_softcap_alibi(window):
    _check(2, 1024, 1024, 4, 4, 64, torch.bfloat16, window=window, softcap=20.0, alibi=True)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(8, 8), (8, 2)])
@pytest.mark.parametrize("tma", [False, True])
def test_value_headdim_192_128(causal, heads, tma, poison_alloc):
    """MLA's training head dims (q and k 192, v 128) at N = 1024: the portable kernels (the Gluon plans
    decline the call), through pointer loads and TMA, with and without GQA; the output 128 wide."""
    from ioattn.plan import dispatch
    h, hkv = heads
    q = torch.randn(2, 1024, h, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(2, 1024, hkv, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(2, 1024, hkv, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    with dispatch.prefer_tma(tma):
        _check_tensors(q, k, v, causal)


def test_value_headdim_varlen_192_128(poison_alloc):
    """The packed form of MLA's training head dims, every sequence against the oracle."""
    cu = torch.tensor([0, 300, 1024, 1500], dtype=torch.int32, device="cuda")
    q = torch.randn(1500, 8, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1500, 8, 192, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1500, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, lse, _ = ioattn.flash_attn_varlen_func(q, k, v, cu, cu, 724, 724, causal=True, return_attn_probs=True)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    assert_varlen_sequences("varlen 192/128", q.detach(), k.detach(), v.detach(), dout, out.detach(), lse, grads,
                            cu, cu, window=(-1, 0))


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("latent", [True, False])
@pytest.mark.parametrize("splits", [0, 1])
def test_mla_decode(paged, latent, splits, poison_alloc):
    """MLA's decoding: 128 query heads over one KV head, q and the keys 576 wide, V 512 (``latent``: the
    view of the cache's first 512 columns), a token appended, caches of 4096 tokens."""
    from ioattn.decode import flash_attn_with_kvcache
    from ioattn.reference.decode import kvcache_attention_ref
    kw, rnd = _decode_setup(2, 4096, hkv=1, d=576, paged=paged)
    kw["v_cache"] = kw["k_cache"][..., :512] if latent else kw["v_cache"][..., :512].contiguous()
    q, k = rnd(2, 1, 128, 576), rnd(2, 1, 1, 576)
    v = k[..., :512].clone() if latent else rnd(2, 1, 1, 512)

    def copies():
        c = {n: t.clone() for n, t in kw.items()}
        c["v_cache"] = c["k_cache"][..., :512] if latent else c["v_cache"]
        return c
    ref, _ = kvcache_attention_ref(q, k=k, v=v, **copies())
    same, _ = kvcache_attention_ref(q, k=k, v=v, **copies(), upcast=False)
    got_kw = copies()
    out = flash_attn_with_kvcache(q, k=k, v=v, **got_kw, num_splits=splits)
    assert out.shape == (2, 1, 128, 512)
    assert_within_torch_error("mla decode out", out, ref, same)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("use_tma", [False, True])
def test_decode_value_headdim_128_64(paged, use_tma, poison_alloc):
    """A value head dim narrower than q's in the decode kernel's usual tiles: V's descriptor boxes of
    their own width (TMA) or pointer loads, GQA 4, split by the heuristic."""
    from ioattn.decode import decode_config, flash_attn_with_kvcache
    from ioattn.reference.decode import kvcache_attention_ref
    kw, rnd = _decode_setup(2, 8192, paged=paged)
    kw["v_cache"] = kw["v_cache"][..., :64].contiguous()
    q = rnd(2, 1, 32, 128)
    with decode_config(use_tma=use_tma):
        out = flash_attn_with_kvcache(q, **kw)
    ref, _ = kvcache_attention_ref(q, **{n: t.clone() for n, t in kw.items()})
    same, _ = kvcache_attention_ref(q, **{n: t.clone() for n, t in kw.items()}, upcast=False)
    assert_within_torch_error("decode 128/64 out", out, ref, same)


def test_deterministic_backward():
    q, k, v = (torch.randn(2, 1024, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    out = ioattn.flash_attn_func(q, k, v, causal=True, deterministic=True)
    dout = torch.randn_like(out)
    g1 = torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    g2 = torch.autograd.grad(out, (q, k, v), dout)
    for a, b in zip(g1, g2):
        assert torch.equal(a, b)


def test_large_index_no_overflow():
    # batch * seqlen * heads * headdim > 2**31: 64-bit offsets must reach the last batch entry
    b, s, h, d = 2, 65536, 128, 128  # 2.1e9 elements per tensor
    q = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)
    k = q[:, :128].clone()
    v = torch.randn_like(k)
    out = ioattn.flash_attn_func(q, k, v)
    ref, _ = attention_ref(q[-1:, -64:], k[-1:], v[-1:])
    assert (out[-1:, -64:].double() - ref).abs().max().item() < 2e-2


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_tma_forward(d, causal):
    from ioattn.plan import dispatch
    with dispatch.prefer_tma(True):
        k = torch.randn(2, 1000, 2, d, device="cuda", dtype=torch.bfloat16)
        assert dispatch.fwd_uses_tma(k, k, False)
        _check(2, 777, 1000, 4, 2, d, torch.bfloat16, causal=causal)


# ---------------------------------------------------------------- decoding on the device

def _decode_setup(batch, capacity, hkv=8, group=4, d=128, paged=False, page_size=256, dtype=torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(7)

    def rnd(*s):
        return torch.randn(*s, device="cuda", dtype=dtype, generator=g)
    kw = {}
    if paged:
        pages = batch * capacity // page_size
        kw["block_table"] = torch.randperm(pages, device="cuda", generator=g).view(batch, -1).to(torch.int32)
        shape = (pages, page_size, hkv, d)
    else:
        shape = (batch, capacity, hkv, d)
    kw["k_cache"], kw["v_cache"] = rnd(*shape), rnd(*shape)
    kw["cache_seqlens"] = torch.randint(capacity // 2, capacity - 8, (batch,), device="cuda", generator=g,
                                        dtype=torch.int32)
    return kw, rnd


_SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.parametrize("pdl", [False, True, "wait"])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_step_cuda_graph(paged, pdl):
    """A decode step (append one token, attend over the cache) captured once and replayed for several
    steps with new inputs copied into the static tensors and cache_seqlens advanced in place: each
    replay equals the eager call on a copy of the cache. ``pdl``: the merge launched by programmatic
    dependent launch, in the graph and in the eager call; "wait": the split kernel too, right behind
    the append that writes the cache it reads (it must wait for those writes)."""
    from ioattn.decode import decode_config, flash_attn_with_kvcache
    batch, capacity, hkv, group, d = 3, 2048, 8, 4, 128
    kw, rnd = _decode_setup(batch, capacity, hkv, group, d, paged=paged)
    q, k, v = rnd(batch, 1, hkv * group, d), rnd(batch, 1, hkv, d), rnd(batch, 1, hkv, d)

    def step():
        with decode_config(pdl=bool(pdl), pdl_wait=pdl == "wait"):
            return flash_attn_with_kvcache(q, kw["k_cache"], kw["v_cache"], k=k, v=v,
                                           cache_seqlens=kw["cache_seqlens"], block_table=kw.get("block_table"),
                                           causal=True)

    eager_kw = {n: t.clone() for n, t in kw.items()}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (compiles) outside the capture
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    kw["k_cache"].copy_(eager_kw["k_cache"])
    kw["v_cache"].copy_(eager_kw["v_cache"])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for _ in range(3):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        with decode_config(pdl=bool(pdl), pdl_wait=pdl == "wait"):
            expect = flash_attn_with_kvcache(q, eager_kw["k_cache"], eager_kw["v_cache"], k=k, v=v,
                                             cache_seqlens=eager_kw["cache_seqlens"],
                                             block_table=eager_kw.get("block_table"), causal=True,
                                             check_values=False)  # the captured call's plan (from the capacity)
        torch.cuda.synchronize()
        assert torch.equal(out, expect)
        assert torch.equal(kw["k_cache"], eager_kw["k_cache"]) and torch.equal(kw["v_cache"], eager_kw["v_cache"])
        kw["cache_seqlens"] += 1
        eager_kw["cache_seqlens"] += 1


@pytest.mark.parametrize("pdl", [False, True, "wait"])
@pytest.mark.parametrize("use_tma", [False, True])
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("splits", [1, 7, 0])
def test_decode_long_cache(use_tma, paged, splits, pdl):
    """Decode at serving sizes against the float64 oracle: long caches, GQA 4, both load paths, the
    merge launched normally or by programmatic dependent launch, and ("wait") the split kernel too (the
    same arithmetic: bit-identical)."""
    from ioattn.plan import decode
    from ioattn.decode import decode_config, flash_attn_with_kvcache
    from ioattn.reference.decode import kvcache_attention_ref
    kw, rnd = _decode_setup(2, 16384, paged=paged)
    q = rnd(2, 1, 32, 128)
    with decode_config(use_tma=use_tma, pdl=bool(pdl), pdl_wait=pdl == "wait"):
        out = flash_attn_with_kvcache(q, **kw, num_splits=splits)
        cfg = decode.plan(q, kw["k_cache"], kw["v_cache"], paged, kw["k_cache"].shape[1] if not paged else
                          kw["block_table"].shape[1] * kw["k_cache"].shape[1], splits)
    assert cfg.pdl == (bool(pdl) and cfg.num_splits > 1 and _SM90)
    assert cfg.pdl_wait == (pdl == "wait" and _SM90)
    if pdl:  # bit-identical to the plain launch
        with decode_config(use_tma=use_tma, pdl=False):
            assert torch.equal(out, flash_attn_with_kvcache(q, **kw, num_splits=splits))
    ref, _ = kvcache_attention_ref(q, **{n: t.clone() for n, t in kw.items()})
    same, _ = kvcache_attention_ref(q, **{n: t.clone() for n, t in kw.items()}, upcast=False)
    assert_within_torch_error("decode out", out, ref, same)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("pdl_wait", [False, True])
@pytest.mark.parametrize("per_sm", [4, 5])
@pytest.mark.parametrize("paged", [False, True])
def test_decode_one_wave_launch(pdl_wait, per_sm, paged, poison_alloc):
    """The launch for 4-5 programs an SM (decode.ONE_WAVE_BLOCK_N: 64-key chunks, 2 stages, registers
    capped) against the float64 oracle: sequences of ragged lengths (one empty, one full, the rest not
    a multiple of the chunk), GQA 4, causal with one appended token; the plan is checked to be that
    launch on this GPU."""
    from ioattn.plan import decode
    from ioattn.decode import decode_config, flash_attn_with_kvcache
    from ioattn.reference.decode import kvcache_attention_ref
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    batch = per_sm * sms // 8  # 8 KV heads: per_sm programs an SM
    capacity = 1024 if paged else 1000  # paged: 4 pages of 256 a sequence, in a random order
    kw, rnd = _decode_setup(batch, capacity, paged=paged)
    kw["cache_seqlens"][0], kw["cache_seqlens"][1] = 0, capacity - 1  # + the appended token: the capacity
    q, k, v = rnd(batch, 1, 32, 128), rnd(batch, 1, 8, 128), rnd(batch, 1, 8, 128)
    cfg = decode.plan(q, kw["k_cache"], kw["v_cache"], paged, capacity)
    assert (cfg.block_n, cfg.num_stages, cfg.max_regs, cfg.num_splits, cfg.use_tma) == (
        decode.ONE_WAVE_BLOCK_N, decode.ONE_WAVE_STAGES, decode.ONE_WAVE_MAX_REGS[per_sm], 1, False), cfg
    ref_kw = {n: t.clone() for n, t in kw.items()}
    same_kw = {n: t.clone() for n, t in kw.items()}
    with decode_config(pdl_wait=pdl_wait):
        out = flash_attn_with_kvcache(q, **kw, k=k, v=v, causal=True)
    ref, _ = kvcache_attention_ref(q, **ref_kw, k=k, v=v, causal=True)
    same, _ = kvcache_attention_ref(q, **same_kw, k=k, v=v, causal=True, upcast=False)
    assert torch.equal(kw["k_cache"], ref_kw["k_cache"]) and torch.equal(kw["v_cache"], ref_kw["v_cache"])
    assert_within_torch_error("decode out (one wave)", out, ref, same)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
def test_decode_paged_load_path_policy():
    """The plan's load path and tiles: a paged cache through TMA (128-key chunks, 2 stages; 64-key
    chunks where a split holds one 128-key chunk) without splits and with many splits
    (decode._PAGED_TMA_MIN_SPLITS), through pointers with the split
    tiles (64 keys, 3 stages) between, and through pointers with the one-wave tiles where 4-5 programs
    an SM hold every unit (the last case assumes a 132-SM GPU's counts); a contiguous cache through
    pointers, split tiles when split, at least decode.MIN_KEYS_PER_SPLIT keys per split."""
    from ioattn.plan import decode
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, kvlen, tma, tiles in ((1, 16384, True, (128, 2)), (8, 8192, False, (64, 3)),
                                     (96, 4096, True, (128, 2)), (1, 4096, True, (64, 2)),  # 96: 768 units
                                     (4 * sms // 8, 4096, False, (64, 2))):  # the last: one-wave
        kw, rnd = _decode_setup(batch, kvlen, paged=True)
        q = rnd(batch, 1, 32, 128)
        cfg = decode.plan(q, kw["k_cache"], kw["v_cache"], True, kvlen)
        one_wave = cfg.max_regs in decode.ONE_WAVE_MAX_REGS.values()  # pointer loads without splits
        assert cfg.use_tma == tma and \
            (cfg.num_splits >= decode._PAGED_TMA_MIN_SPLITS or cfg.num_splits == 1) == (tma or one_wave)
        assert (cfg.block_n, cfg.num_stages) == tiles
        kw, rnd = _decode_setup(batch, kvlen)
        cfg = decode.plan(q, kw["k_cache"], kw["v_cache"], False, kvlen)
        wide = (decode.ONE_WAVE_BLOCK_N, decode.ONE_WAVE_STAGES) if 3 * sms < batch * 8 <= 5 * sms else (128, 2)
        assert not cfg.use_tma and (cfg.block_n, cfg.num_stages) == (wide if cfg.num_splits == 1 else (64, 3))
        assert kvlen // cfg.num_splits >= decode.MIN_KEYS_PER_SPLIT


# ---------------------------------------------------------------- the Gluon Hopper forward (experimental)

@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["base", "pingpong", "split", "wg3", "persistent"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
# (3, 129, 64): one key tile, and under causal a warpgroup with no visible key; (2, 300, 340, 3, 1):
# seqlen_k - seqlen_q = 40, so ping-pong's first warpgroup gets a fully masked extra tile (and GQA 3);
# (1, 64, 1000): the second warpgroup's rows all lie past seqlen_q (computed, not stored)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2),
                                   (2, 300, 340, 3, 1), (1, 64, 1000, 2, 2)])
def test_hopper_forward(variant, d, causal, dtype, shape, poison_alloc):
    """Against the float64 oracle (2x PyTorch's own error), forward and the gradients of the portable
    backward fed by this forward's output and lse; NaN-poisoned outputs would show. Every kernel
    variant (base, FA3 ping-pong, ping-pong's structure without the ordering, three warpgroups, the
    persistent ping-pong)."""
    from ioattn.plan import hopper
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype)
    with hopper.variant(variant):
        ok, why = hopper.hopper_supports(q, k, k, False, Semantics(0.125, (-1, 0) if causal else (-1, -1)), None)
        assert ok, why
        with hopper.prefer_hopper(True):
            assert "hopper_fwd_kernel" in ioattn.explain_dispatch(q, k, k, causal=causal).forward["kernel"]
            _check(b, sq, sk, h, hkv, d, dtype, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["base", "pingpong", "split", "wg3", "persistent"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (3, 129, 64, 2, 2), (2, 300, 340, 3, 1),
                                   (1, 64, 1000, 2, 2)])
def test_hopper_forward_accumulator_stores(variant, d, causal, shape, poison_alloc):
    """``hopper.out_row_stores(False)``: the output stored from the wgmma accumulator layout instead of
    as whole rows (the default but in the persistent variant at d = 64 / 256, ``hopper.row_stores``,
    which ``test_hopper_forward`` covers), every variant, against the float64 oracle as
    ``test_hopper_forward``; the shapes with rows past seqlen_q (masked stores) and warpgroups with no
    visible key."""
    from ioattn.plan import hopper
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    with hopper.variant(variant), hopper.out_row_stores(False), hopper.prefer_hopper(True):
        assert not hopper.row_stores(d, variant)
        assert "hopper_fwd_kernel" in ioattn.explain_dispatch(q, k, k, causal=causal).forward["kernel"]
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "split", "persistent"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
# one key tile (the first is the last), ragged ends, rows with no visible key (seqlen_q > seqlen_k),
# key tiles no row sees, GQA; (1, 2048, 2048, 16, 8): several tiles a persistent program (one batch:
# 16 workers' float64 references at 3 x 16 heads ran out of device memory)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (3, 129, 64, 2, 2), (2, 300, 340, 3, 1),
                                   (1, 64, 1000, 2, 2), (1, 1000, 300, 4, 4), (1, 2048, 2048, 16, 8)])
def test_hopper_forward_fewer_masks(variant, d, causal, shape, poison_alloc):
    """The two-warpgroup ping-pong kernels' fewer masked key tiles (the kernel's ``FEWER_MASKS``,
    ``hopper.FEWER_MASKS_NUM_WG``): the first key tile masked only where the loop's rule asks for it,
    causal masks without the key-end test, at the shapes where those rules matter, against the
    float64 oracle as ``test_hopper_forward``, gradients included."""
    from ioattn.plan import hopper
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16)
    with hopper.variant(variant), hopper.prefer_hopper(True):
        assert hopper.kernel_config(d, variant)["constexprs"]["FEWER_MASKS"]
        assert "hopper_fwd_kernel" in ioattn.explain_dispatch(q, k, k, causal=causal).forward["kernel"]
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "split"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (3, 129, 64, 2, 2), (2, 300, 340, 3, 1),
                                   (1, 64, 1000, 2, 2)])
def test_hopper_forward_row_stores_via_q(variant, causal, dtype, shape, poison_alloc):
    """d=256's output staged in each consumer warpgroup's Q buffer and stored as whole rows (the
    kernel's ``ROW_STORES`` 2, the one-tile ping-pong kernels' default, ``hopper.row_stores``), both
    dtypes, against the float64 oracle as ``test_hopper_forward``; rows past seqlen_q (masked
    stores), warpgroups with no visible key."""
    from ioattn.plan import hopper
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, 256, device="cuda", dtype=dtype)
    k = torch.randn(b, sk, hkv, 256, device="cuda", dtype=dtype)
    with hopper.variant(variant), hopper.prefer_hopper(True):
        assert hopper.row_stores(256, variant) == 2
        assert "hopper_fwd_kernel" in ioattn.explain_dispatch(q, k, k, causal=causal).forward["kernel"]
        _check(b, sq, sk, h, hkv, 256, dtype, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "wg3"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hopper_forward_varlen(variant, d, causal, dtype, monkeypatch, poison_alloc):
    """Packed (varlen) batches through the Gluon forward's IS_VARLEN specialisation (switched on here:
    hopper.GLUON_VARLEN), per sequence against the float64 oracle (2x PyTorch's own error), the lse
    too, and the gradients of the portable backward fed by this forward's (out, lse). Sequences: length
    1, shorter than a tile, several tiles, seqlen_q != seqlen_k both ways (causal: 133 rows that see
    no key), one with no queries, one with no keys; 7 trailing tokens in q and k/v that no sequence
    owns (output 0, lse -inf, zero gradients), NaN in k and v."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.plan import hopper_bwd
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    monkeypatch.setattr(hopper, "GLUON_VARLEN", True)
    lens_q, lens_k, extra, h, hkv = [1, 100, 700, 333, 0, 64, 50], [1, 37, 900, 200, 40, 300, 0], 7, 4, 2
    cu = lambda lens: torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,  # noqa: E731
                                   device="cuda")
    cq, ck, max_q, max_k = cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)
    q = torch.randn(sum(lens_q) + extra, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(sum(lens_k) + extra, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    # the unowned trailing rows hold NaN: the last sequence's last key tile reads them (TMA box), and
    # only the producer's zeroing of those V rows (KV_TAIL) keeps them out of its output
    k[sum(lens_k):], v[sum(lens_k):] = float("nan"), float("nan")
    dout = torch.randn_like(q)
    window = (-1, 0) if causal else (-1, -1)
    # the portable backward (its own switch: the Gluon varlen backward has test_hopper_backward_varlen)
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(False):
        ok, why = hopper.hopper_supports(q, k, v, True, Semantics(0.125, window), None)
        assert ok, why
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, cu_seqlens_q=cq, max_seqlen_q=max_q)
        assert "hopper_fwd_kernel" in plan.forward["kernel"] and variant in plan.forward["kernel"]
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, causal=causal,
                                                    return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
        # the API's forward is this kernel's (the forward is deterministic)
        direct = backends.hopper_forward(q, k, v, d ** -0.5, causal, cu_seqlens_q=cq, cu_seqlens_k=ck,
                                       max_seqlen_q=max_q, max_seqlen_k=max_k)
    assert torch.equal(out.detach(), direct[0]) and torch.equal(lse, direct[1])
    assert lse.shape == (h, q.shape[0]) and lse.dtype == torch.float32
    tq, tk = sum(lens_q), sum(lens_k)
    assert (out[tq:] == 0).all() and torch.isneginf(lse[:, tq:]).all()
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"{variant} varlen", q, k, v, dout, out, lse, (dq, dk, dv), cq, ck, window=window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["base", "pingpong", "split", "wg3", "persistent"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sk", [200, 77, 1000])  # none a multiple of the key tile: a tail in every sequence
def test_hopper_forward_next_batch_rows_do_not_leak(variant, d, causal, sk):
    """Batch element 1's V is NaN: element 0's last key tile reads element 1's first rows (the TMA box
    runs past seqlen_k), and the producer zeroes those V rows before the P V product (KV_TAIL), so
    element 0's output and lse are finite and bitwise those of element 0 alone (where the box runs
    past the tensor's end and TMA fills zeros)."""
    from ioattn.plan import hopper
    from ioattn import backends
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    q = torch.randn(2, 300, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, sk, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v[1] = float("nan")
    with hopper.variant(variant):
        out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal)
        alone, lse_alone = backends.hopper_forward(q[:1].contiguous(), k[:1].contiguous(), v[:1].contiguous(),
                                                 d ** -0.5, causal)
    assert torch.isfinite(out[0]).all() and not torch.isnan(lse[0]).any()
    assert torch.equal(out[0], alone[0]) and torch.equal(lse[0], lse_alone[0])
    assert torch.isnan(out[1]).any()  # element 1's own NaN is its own


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "wg3"])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_forward_negative_scale(variant, causal, poison_alloc):
    """A negative softmax_scale through the Gluon forward (wg3's lean softmax flips q's sign for it)
    against the float64 oracle with the same scale."""
    from ioattn.plan import hopper
    q, k, v = (torch.randn(2, 300, 2, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with hopper.variant(variant), hopper.prefer_hopper(True):
        out = ioattn.flash_attn_func(q, k, v, softmax_scale=-0.1, causal=causal)
    window = (-1, 0) if causal else (-1, -1)
    ref, _ = attention_ref(q.double(), k.double(), v.double(), softmax_scale=-0.1, window=window)
    same, _ = attention_ref(q, k, v, softmax_scale=-0.1, window=window, upcast=False)
    assert_within_torch_error("out", out, ref, same)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
# (head dim, seqlen, causal, the variant expected or None for the portable kernel)
@pytest.mark.parametrize("d, n, causal, variant", [(128, 8192, False, "persistent"), (128, 16384, False, "pingpong"),
                                                   (128, 512, True, "persistent"), (128, 500, True, None),
                                                   (128, 16384, True, "pingpong"), (256, 2048, True, "persistent"),
                                                   (256, 512, False, "persistent"), (256, 16384, False, "pingpong"),
                                                   (256, 8192, True, "persistent"), (256, 512, True, "persistent"),
                                                   (64, 1024, False, "persistent"), (64, 4096, False, "wg3"),
                                                   (64, 4096, True, "persistent"), (64, 8192, True, "wg3"),
                                                   (64, 512, True, "persistent"), (64, 256, True, None)])
def test_default_dispatch_takes_the_gluon_kernel_where_measured_faster(d, n, causal, variant, poison_alloc):
    """Without any switch, the forward goes to the Gluon kernel exactly where the policy in
    ioattn.plan.hopper (AUTO_MIN_SEQLEN, PERSISTENT_MAX_SEQLEN, DEFAULT_VARIANT_BY_HEADDIM, from the device
    runs) says, with the variant and options it says, else to the portable kernel, and the result
    passes the float64 oracle, gradients included."""
    from ioattn.plan import hopper
    q = torch.randn(1, n, 2, d, device="cuda", dtype=torch.bfloat16)
    plan = ioattn.explain_dispatch(q, q, q, causal=causal)
    if variant is None:
        assert "hopper_fwd_kernel" not in plan.forward["kernel"]
    else:
        assert plan.forward["kernel"] == f"ioattn.kernels.hopper_forward.hopper_fwd_kernel (Gluon, {variant})"
        # conditional rescaling by the warp, except where it measured slower (docs/decisions/conditional-rescale.md)
        off = (variant, d) in hopper.CONDITIONAL_RESCALE_OFF
        assert plan.forward["cond_rescale"].startswith("off" if off else "by warp"), plan.forward
    _check(1, n, n, 2, 2, d, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_through_the_api(d, causal, monkeypatch, poison_alloc):
    """The opt-in switch (hopper_bwd.prefer_hopper_bwd): flash_attn_func's gradients come from the Gluon
    backward (the plan says so) and pass the float64 oracle; refused calls keep the portable one."""
    from ioattn.plan import hopper_bwd
    with hopper_bwd.prefer_hopper_bwd(True):
        q = torch.randn(2, 700, 4, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, 900, 2, d, device="cuda", dtype=torch.bfloat16)
        plan = ioattn.explain_dispatch(q, k, k, causal=causal)
        assert "hopper_backward" in plan.backward["kernels"] and plan.backward["gluon_hopper"].startswith("taken")
        _check(2, 700, 900, 4, 2, d, torch.bfloat16, causal=causal)
        # a head dim it does not cover (96 is: zero-padded to 128, ``hopper.PADDED_RANGE``)
        other = torch.randn(1, 64, 2, 48, device="cuda", dtype=torch.bfloat16)
        assert "attn_bwd_dkdv_kernel" in ioattn.explain_dispatch(other, other, other).backward["kernels"]
        wide = torch.randn(1, 64, 2, 256, device="cuda", dtype=torch.bfloat16)  # the column split
        assert "hopper_backward" in ioattn.explain_dispatch(wide, wide, wide).backward["kernels"]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_d256_through_the_api(causal, poison_alloc):
    """Head dim 256 is in the dispatch's BWD_HEADDIMS: by default (the policy, no switch),
    flash_attn_func's gradients come from the ws kernel's column-split form (the plan names the ws
    variant and its 64-key tiles) and pass the float64 oracle."""
    from ioattn.plan import hopper_bwd
    assert 256 in hopper_bwd.BWD_HEADDIMS
    q = torch.randn(2, 700, 4, 256, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(2, 900, 2, 256, device="cuda", dtype=torch.bfloat16)
    plan = ioattn.explain_dispatch(q, k, k, causal=causal)
    assert plan.backward["kernels"] == "ioattn.kernels.hopper_backward_ws.hopper_bwd_ws_kernel (Gluon, ws)", plan.backward
    assert plan.backward["gluon_hopper"].startswith("taken") and plan.backward["tiles"] == (64, 64, 8, 2)
    _check(2, 700, 900, 4, 2, 256, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("packing", ["qkv", "kv"])
@pytest.mark.parametrize("n", [1000, 4096])  # 1000: the persistent kernel (both masks); 4096: one-tile kernels too
def test_hopper_packed_inputs_without_copy(d, causal, packing, n, poison_alloc):
    """flash_attn_qkvpacked_func / kvpacked (views of one packed tensor, rows 3 or 2 heads-blocks
    apart) through the Gluon forward and backward, read in place by the descriptors: the plan names
    both Gluon kernels, the output is bitwise the one of contiguous copies (the forward is
    deterministic), and output and packed gradients pass the float64 oracle. kv: GQA 2."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    b, h = 2, 4
    hkv = h if packing == "qkv" else h // 2
    sk = n if packing == "qkv" else n - 100
    if packing == "qkv":
        packed = torch.randn(b, n, 3, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        q, k, v = packed.unbind(2)
    else:
        q = torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        packed = torch.randn(b, sk, 2, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k, v = packed.unbind(2)
    assert not k.is_contiguous()
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal)
        assert "hopper_fwd_kernel" in plan.forward["kernel"], plan.forward
        assert "hopper_backward" in plan.backward["kernels"], plan.backward
        if packing == "qkv":
            out = ioattn.flash_attn_qkvpacked_func(packed, causal=causal)
        else:
            out = ioattn.flash_attn_kvpacked_func(q, packed, causal=causal)
        dout = torch.randn_like(out)
        leaves = (packed,) if packing == "qkv" else (q, packed)
        grads = torch.autograd.grad(out, leaves, dout)
        copies = ioattn.flash_attn_func(*(t.detach().contiguous() for t in (q, k, v)), causal=causal)
    assert torch.equal(out, copies)
    grads = grads[0].unbind(2) if packing == "qkv" else (grads[0], *grads[1].unbind(2))
    _assert_out_and_grads(out, grads, dout, q, k, v, (-1, 0) if causal else (-1, -1))


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_varlen_packed_inputs_without_copy(d, causal, poison_alloc):
    """flash_attn_varlen_qkvpacked_func on (total, 3, heads, d): the Gluon varlen forward reads the
    views in place (the plan names it), its output bitwise that of contiguous copies, and output,
    lse and gradients pass the float64 oracle sequence by sequence."""
    from ioattn.plan import hopper
    lens = [1, 300, 1200, 77, 0, 640]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
    qkv = torch.randn(sum(lens), 3, 4, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv.unbind(1)
    with hopper.prefer_hopper(True):
        variant = hopper.variant_for(d, causal, max(lens), varlen=True)
        if d not in hopper.TILE_TABLE[variant]:
            pytest.skip(f"no varlen Gluon forward at d = {d}")
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, cu_seqlens_q=cu, max_seqlen_q=max(lens))
        assert "hopper_fwd_kernel" in plan.forward["kernel"], plan.forward
        out, lse, _ = ioattn.flash_attn_varlen_qkvpacked_func(qkv, cu, max(lens), causal=causal,
                                                              return_attn_probs=True)
        copies = ioattn.flash_attn_varlen_func(*(t.detach().contiguous() for t in (q, k, v)), cu, cu, max(lens),
                                               max(lens), causal=causal)
    assert torch.equal(out, copies)
    dout = torch.randn_like(out)
    (dqkv,) = torch.autograd.grad(out, (qkv,), dout)
    assert_varlen_sequences("varlen qkvpacked", q.detach(), k.detach(), v.detach(), dout, out, lse,
                            dqkv.unbind(1), cu, cu, window=(-1, 0) if causal else (-1, -1))


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("copy", [False, True])
def test_hopper_layout_without_a_view(d, causal, copy, poison_alloc):
    """q, k, v transposed from (batch, heads, seqlen, d) have no (rows, heads * d) view: with the
    copy refused (hopper.copy_strided(False)) the plan says why and the portable kernels run; with it
    (True) both Gluon kernels run on contiguous copies, the output bitwise that of copies made by the
    caller. Either way output and gradients pass the float64 oracle."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    q, k, v = (torch.randn(2, 4, 700, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for _ in range(3))
    with hopper.copy_strided(copy), hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal)
        if copy:
            assert "hopper_fwd_kernel" in plan.forward["kernel"] and "hopper_backward" in plan.backward["kernels"]
            assert plan.forward["inputs"].startswith("contiguous copies of q, k, v"), plan.forward
            out = ioattn.flash_attn_func(q, k, v, causal=causal)
            assert torch.equal(out, ioattn.flash_attn_func(*(t.detach().contiguous() for t in (q, k, v)),
                                                           causal=causal))
        else:
            assert "hopper_fwd_kernel" not in plan.forward["kernel"]
            assert "no contiguous copy (hopper.copy_strided(False))" in plan.forward["gluon_hopper"], plan.forward
            assert "hopper_backward" not in plan.backward["kernels"], plan.backward
        _check_tensors(q, k, v, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
# more tiles than SMs, so every program walks several: 256 tiles each; (8, 777, 300, 8, 4) / (8, 700,
# 300, 8, 4): causal tiles whose rows see no key (seqlen_q > seqlen_k) between tiles that do, an odd /
# even number of query blocks (the paired walk takes only the even one); GQA 2 and 4
# (16, 512, 100, 8, 4): one key tile a tile (its first step is its last)
@pytest.mark.parametrize("shape", [(4, 1000, 1000, 8, 4), (1, 2048, 2048, 16, 8), (8, 777, 300, 8, 4),
                                   (8, 700, 300, 8, 4), (16, 512, 100, 8, 4)])
# the kernel's options: two Q buffers a warpgroup (hopper.persistent_q_prefetch, d = 64 / 128) and the
# causal walk by pairs (hopper.paired_walk)
@pytest.mark.parametrize("q_prefetch, paired", [(False, False), (True, False), (False, True), (True, True)])
def test_hopper_forward_persistent_tile_loop(d, causal, shape, q_prefetch, paired, poison_alloc):
    """The persistent ping-pong kernel with several tiles per program (the ring's use count, the
    turn order and the Q prefetch carried across tiles) against the float64 oracle, with the
    gradients of the backward it feeds."""
    from ioattn.plan import hopper
    if paired and not causal:
        pytest.skip("the paired walk is a causal order")
    if q_prefetch and d not in hopper.PERSISTENT_Q2_FITS:
        pytest.skip(f"one Q buffer a warpgroup at d = {d}")
    b, sq, sk, h, hkv = shape
    num_m = -(-sq // hopper.TILE_TABLE["persistent"][d][0])
    assert num_m * b * h > torch.cuda.get_device_properties(0).multi_processor_count
    with hopper.persistent_q_prefetch(q_prefetch), hopper.paired_walk(paired):
        opts = hopper.persistent_options(d, "persistent", causal, num_m)
        assert opts == dict(Q_BUFS=2 if q_prefetch else 1, PAIRED=paired and num_m % 2 == 0,
                            FAST_DIV=opts["FAST_DIV"], NO_KEY_WIDE=d in hopper.NO_KEY_WIDE_HEADDIMS), opts
        with hopper.variant("persistent"), hopper.prefer_hopper(True):
            _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
# the tile loop's shapes (above): rows past seqlen_q in the last query block (1000, 777, 700), rows
# that see no key between tiles that do (777 / 700 causal), one key tile a tile (512 x 100)
@pytest.mark.parametrize("shape", [(4, 1000, 1000, 8, 4), (1, 2048, 2048, 16, 8), (8, 777, 300, 8, 4),
                                   (8, 700, 300, 8, 4), (16, 512, 100, 8, 4)])
# the output's bulk copies (hopper.out_tma_store) with one and two Q buffers (the copy's buffer is the
# next Q load's), the tile index by multiply-high (hopper.fast_tile_div), and both
@pytest.mark.parametrize("tma_store, fast_div, q_prefetch", [(True, False, False), (True, False, True),
                                                             (False, True, None), (True, True, None)])
def test_hopper_forward_persistent_store_and_index(d, causal, shape, tma_store, fast_div, q_prefetch, poison_alloc):
    """The persistent kernel's output copied by TMA from the Q buffer (``ROW_STORES`` = 3) and its tile
    index without divisions (``FAST_DIV``), on poisoned outputs, against the float64 oracle with the
    gradients of the backward it feeds."""
    from ioattn.plan import hopper
    if q_prefetch and d not in hopper.PERSISTENT_Q2_FITS:
        pytest.skip(f"one Q buffer a warpgroup at d = {d}")
    b, sq, sk, h, hkv = shape
    num_m = -(-sq // hopper.TILE_TABLE["persistent"][d][0])
    with hopper.out_tma_store(tma_store), hopper.fast_tile_div(fast_div), hopper.persistent_q_prefetch(q_prefetch):
        assert (hopper.row_stores(d, "persistent") == 3) == tma_store
        assert hopper.persistent_options(d, "persistent", causal, num_m)["FAST_DIV"] == fast_div
        with hopper.variant("persistent"), hopper.prefer_hopper(True):
            _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("persistent", 64), ("persistent", 128), ("persistent", 256),
                                        ("pingpong", 128), ("pingpong", 256), ("split", 128), ("wg3", 64),
                                        ("base", 64)])
# key lengths a multiple of the key tile (128; 64 at d = 256) with rows past seqlen_q (777, 129), GQA,
# one key tile, many tiles; and (2, 300, 1000, 4, 2), a key length that cuts a tile: masked as before
@pytest.mark.parametrize("shape", [(3, 777, 1024, 4, 2), (2, 129, 128, 2, 2), (1, 2048, 2048, 16, 8),
                                   (2, 300, 1000, 4, 2)])
def test_hopper_forward_unmasked_keys(variant, d, shape, poison_alloc):
    """No key tile masked where none can be cut (hopper.unmasked_full_keys, the kernel's ``KEY_MASKS``
    False; the default for the short persistent calls, docs/decisions/forward-masked-tiles.md), forced on:
    non-causal calls on poisoned outputs against the float64 oracle, with the gradients of the backward it feeds; a key
    length that is not a multiple of the key tile keeps its masks."""
    from ioattn.plan import hopper
    b, sq, sk, h, hkv = shape
    with hopper.unmasked_full_keys(True), hopper.variant(variant), hopper.prefer_hopper(True):
        block_n = hopper.TILE_TABLE[variant][d][1]
        assert hopper.key_masks(d, variant, False, sk % block_n != 0) == (sk % block_n != 0)
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=False)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
# seqlen_q = seqlen_k (warpgroup 0's last tile skipped with 64-key tiles: d = 256, and d = 128 up to
# 512, hopper.SHORT_CAUSAL_TILES), with rows past seqlen_q (1000); keys ahead of the queries by two
# 128-key tiles, the key end inside the last (400 x 656); queries ahead of the keys: rows that see no
# key, a warpgroup with a tile fewer than its CTA's at every head dim (500 x 300), one key tile (512 x
# 100); GQA throughout
@pytest.mark.parametrize("shape", [(4, 512, 512, 8, 4), (2, 1000, 1000, 4, 2), (2, 400, 656, 4, 2),
                                   (3, 500, 300, 6, 2), (16, 512, 100, 8, 4)])
def test_hopper_forward_diag_trim(d, shape, poison_alloc):
    """Warpgroup 0 of the persistent causal kernel computing only the keys its own rows see
    (hopper.diag_trim, the kernel's ``DIAG_TRIM``; docs/decisions/causal-diagonal-trim.md), forced on: poisoned
    outputs against the float64 oracle with the gradients of the backward it feeds; and the lse against the same
    kernel's without it (the same function: equal to fp32 rounding, rows with no key included)."""
    from ioattn.plan import hopper
    from ioattn import backends
    b, sq, sk, h, hkv = shape
    with hopper.variant("persistent"), hopper.prefer_hopper(True):
        with hopper.diag_trim(True):
            assert hopper.diag_trim_for(d, "persistent", True) and not hopper.diag_trim_for(d, "persistent", False)
            _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=True)
        q, k, v = (torch.randn(b, n, hh, d, device="cuda", dtype=torch.bfloat16)
                   for n, hh in ((sq, h), (sk, hkv), (sk, hkv)))
        with hopper.diag_trim(False):
            out0, lse0 = backends.hopper_forward(q, k, v, d ** -0.5, True)
        with hopper.diag_trim(True):
            out1, lse1 = backends.hopper_forward(q, k, v, d ** -0.5, True)
    assert torch.equal(lse0.isinf(), lse1.isinf()) and not lse1.isnan().any() and not out1.isnan().any()
    seen = lse0.isfinite()
    assert ((lse1[seen] - lse0[seen]).abs() / lse0[seen].abs().clamp(min=1.0)).max().item() <= 1e-5


def _ramp_inputs(b, sq, sk, h, hkv, d, dtype, growth=60.0):
    """q, k, v (leaves) whose scores climb along the keys by about ``growth`` log2 units over the
    sequence for some rows (5 of each 16: in every warp's rows, a thread's two rows r and r + 8 apart
    in some threads only) and fall for the others, on top of the random part: a row's max then grows
    by less than 8 over one 128-key tile and by more over two, so conditional rescaling keeps a
    stale max for a tile and then moves it, and threads of one warp take different branches."""
    q = torch.randn(b, sq, h, d, device="cuda")
    k = torch.randn(b, sk, hkv, d, device="cuda")
    sign = torch.where(torch.arange(sq, device="cuda") % 16 < 5, 1.0, -1.0)
    q[..., 0] = 4.0 * sign[None, :, None]
    # q0 k0 d^-1/2 log2(e) = growth at the last key
    k[..., 0] = torch.linspace(0, growth * d ** 0.5 / (4.0 * 1.4426950408889634), sk, device="cuda")[None, :, None]
    v = torch.randn(b, sk, hkv, d, device="cuda")
    return [t.to(dtype).requires_grad_() for t in (q, k, v)]


def _check_forward(q, k, v, causal):
    """The forward alone against the float64 oracle (2x PyTorch's own error in the same dtype)."""
    out = ioattn.flash_attn_func(q, k, v, causal=causal)
    win = (-1, 0) if causal else (-1, -1)
    ref, _ = attention_ref(*(t.double() for t in (q, k, v)), window=win)
    same, _ = attention_ref(q, k, v, window=win, upcast=False)
    assert_within_torch_error("out", out, ref, same)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 64), ("pingpong", 128), ("pingpong", 256), ("split", 128),
                                        ("wg3", 64), ("persistent", 64), ("persistent", 128), ("persistent", 256)])
@pytest.mark.parametrize("by_warp", [False, True], ids=["thread", "warp"])
@pytest.mark.parametrize("causal", [False, True])
# ragged, one key tile with rows that see no key (causal), several tiles a persistent program
@pytest.mark.parametrize("shape", [(1, 777, 1500, 2, 1), (3, 129, 64, 2, 2), (1, 2048, 2048, 16, 8)])
def test_hopper_forward_conditional_rescale(variant, d, by_warp, causal, shape, poison_alloc):
    """FA4's conditional rescaling (hopper.conditional_rescale, the kernel's COND_RESCALE; decided by
    the thread or the warp, RESCALE_BY_WARP) against the float64 oracle: forward and gradients on random
    inputs; the forward on scores that climb along the keys (``_ramp_inputs``: stale maxima,
    rescales after two tiles, threads of a warp on both branches; their gradients are not a test of
    the option: the backward reads only O and the lse, and the large ramp features make dq / dk
    ill-conditioned for any bf16 implementation); and on those, the lse against the same kernel's
    without the option: the same function, so equal up to fp32 rounding (a stale max changes where
    l and O are rounded), rows with no key included, yet not bitwise equal where rows see more than
    two key tiles (the option reached the kernel)."""
    from ioattn.plan import hopper
    from ioattn import backends
    b, sq, sk, h, hkv = shape
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper.conditional_rescale(True), \
            hopper.rescale_by_warp(by_warp):
        consts = hopper.kernel_config(d, variant)["constexprs"]
        assert consts["COND_RESCALE"] and consts["RESCALE_BY_WARP"] == by_warp
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)
        _check_forward(*(t.detach() for t in _ramp_inputs(b, sq, sk, h, hkv, d, torch.bfloat16)), causal)
        plan = ioattn.explain_dispatch(torch.empty(b, sq, h, d, device="cuda", dtype=torch.bfloat16),
                                       torch.empty(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16),
                                       torch.empty(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16), causal=causal)
        assert plan.forward["cond_rescale"].startswith("by warp" if by_warp else "by thread"), plan.forward
    q, k, v = (t.detach() for t in _ramp_inputs(b, sq, sk, h, hkv, d, torch.bfloat16))
    with hopper.variant(variant):
        with hopper.conditional_rescale(False):
            out0, lse0 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
        with hopper.conditional_rescale(True), hopper.rescale_by_warp(by_warp):
            out1, lse1 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
    assert torch.equal(lse0.isinf(), lse1.isinf()) and not lse1.isnan().any() and not out1.isnan().any()
    seen = lse0.isfinite()
    assert ((lse1[seen] - lse0[seen]).abs() / lse0[seen].abs().clamp(min=1.0)).max().item() <= 1e-5
    if sk > 2 * hopper.TILE_TABLE[variant][d][1]:
        assert not torch.equal(lse0, lse1)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 64), ("pingpong", 128), ("split", 128), ("persistent", 64),
                                        ("persistent", 128)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
# ragged, one key tile with rows that see no key (causal), several tiles a persistent program
@pytest.mark.parametrize("shape", [(1, 777, 1500, 2, 1), (3, 129, 64, 2, 2), (1, 2048, 2048, 16, 8)])
def test_hopper_forward_q_in_registers(variant, d, dtype, causal, shape, poison_alloc):
    """Q as the register operand of S = Q K^T (hopper.q_in_registers, the kernel's Q_IN_REGS; the
    default at d = 128): the products' operands are the same bf16 / fp16 values as without it."""
    from ioattn.plan import hopper
    _check_forward_option(variant, d, causal, shape, dtype, hopper.q_in_registers, "Q_IN_REGS")


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 64), ("pingpong", 128), ("pingpong", 256), ("split", 128),
                                        ("persistent", 64), ("persistent", 128), ("persistent", 256), ("wg3", 64)])
@pytest.mark.parametrize("causal", [False, True])
# ragged, one key tile with rows that see no key (causal), several tiles a persistent program
@pytest.mark.parametrize("shape", [(1, 777, 1500, 2, 1), (3, 129, 64, 2, 2), (1, 2048, 2048, 16, 8)])
def test_hopper_forward_deferred_row_sum(variant, d, causal, shape, poison_alloc):
    """The row sum kept as each thread's partial sums, the quad's reduction once a tile
    (hopper.deferred_row_sum, the kernel's DEFERRED_SUM; by default at hopper.DEFERRED_ROW_SUM_ON): the
    same terms summed in another order. wg3 only without the causal mask (where it fits)."""
    from ioattn.plan import hopper
    if variant == "wg3" and causal:
        pytest.skip("wg3's causal build does not take the option (it spilled)")
    _check_forward_option(variant, d, causal, shape, torch.bfloat16, hopper.deferred_row_sum, "DEFERRED_SUM")


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 64), ("pingpong", 128), ("pingpong", 256), ("split", 128),
                                        ("persistent", 64), ("persistent", 128), ("persistent", 256), ("wg3", 64)])
@pytest.mark.parametrize("causal", [False, True])
# ragged, one key tile with rows that see no key (causal: the first tile masked), several tiles a
# persistent program (masked and unmasked steps in every tile)
@pytest.mark.parametrize("shape", [(1, 777, 1500, 2, 1), (3, 129, 64, 2, 2), (1, 2048, 2048, 16, 8)])
def test_hopper_forward_mask_branch(variant, d, causal, shape, poison_alloc):
    """A tile's first-step mask under its own branch ahead of one softmax body (hopper.mask_branch, the
    kernel's MASK_BRANCH; by default causal at d = 128 / 256): the same operations on the same values,
    so the same function."""
    from ioattn.plan import hopper
    _check_forward_option(variant, d, causal, shape, torch.bfloat16, hopper.mask_branch, "MASK_BRANCH")


def _check_forward_option(variant, d, causal, shape, dtype, option, flag):
    """A Gluon forward option (``option``: a hopper preference that sets the kernel's constexpr ``flag``)
    against the float64 oracle, forward and gradients, with the default options beside it; and the
    lse against the same kernel's without it, which computes the same function: equal to fp32
    rounding, rows with no key included."""
    from ioattn.plan import hopper
    from ioattn import backends
    b, sq, sk, h, hkv = shape
    with hopper.variant(variant), hopper.prefer_hopper(True), option(True):
        assert hopper.kernel_config(d, variant, causal)["constexprs"][flag]
        _check(b, sq, sk, h, hkv, d, dtype, causal=causal)
    q, k, v = (torch.randn(b, n, hh, d, device="cuda", dtype=dtype) for n, hh in ((sq, h), (sk, hkv), (sk, hkv)))
    with hopper.variant(variant):
        with option(False):
            assert not hopper.kernel_config(d, variant, causal)["constexprs"][flag]
            out0, lse0 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
        with option(True):
            out1, lse1 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
    assert torch.equal(lse0.isinf(), lse1.isinf()) and not lse1.isnan().any() and not out1.isnan().any()
    seen = lse0.isfinite()
    assert ((lse1[seen] - lse0[seen]).abs() / lse0[seen].abs().clamp(min=1.0)).max().item() <= 1e-5


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 128), ("wg3", 64), ("persistent", 256)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("by_warp", [False, True], ids=["thread", "warp"])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_forward_conditional_rescale_extreme(variant, d, dtype, by_warp, causal, poison_alloc):
    """Conditional rescaling under large logits (q with standard deviation 30: maxima that jump by
    hundreds of log2 units between key tiles; forward and gradients) and steep climbing scores
    (forward), in fp16 too (P up to 2**8 must stay finite): no NaN, the float64 oracle's criterion."""
    from ioattn.plan import hopper
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper.conditional_rescale(True), \
            hopper.rescale_by_warp(by_warp):
        _check(2, 1000, 1000, 4, 2, d, dtype, causal=causal, q_scale=30.0)
        _check_forward(*(t.detach() for t in _ramp_inputs(2, 1000, 1000, 4, 2, d, dtype, growth=300.0)), causal)


# exp2 on the FMA units (hopper.exp2_fma, the kernel's EXP2_FMA): the shares the A/B times (12.5, 25, 50)
# and all of them (100) in bf16, 50 in fp16 (its finer rounding of P shows the cubic's error sooner)
_EXP2_FMA_CASES = [(12.5, torch.bfloat16), (25, torch.bfloat16), (50, torch.bfloat16), (50, torch.float16),
                   (100, torch.bfloat16)]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 128), ("pingpong", 256), ("wg3", 64), ("persistent", 128)])
@pytest.mark.parametrize("share, dtype", _EXP2_FMA_CASES, ids=[f"fma{s:g}-{str(t)[6:]}" for s, t in _EXP2_FMA_CASES])
@pytest.mark.parametrize("causal", [False, True])
# (1, 777, 1500, 2, 1): ragged (neither length a multiple of a tile); (3, 129, 64, 2, 2): one key tile,
# and under causal rows that see no key (p = exp2(-inf) must be exactly 0 on the FMA columns too)
@pytest.mark.parametrize("shape", [(1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
def test_hopper_forward_exp2_fma(variant, d, share, dtype, causal, shape, poison_alloc):
    """The Gluon forward with ``share`` % of every key tile's exponentials on the FMA units against
    the float64 oracle (2x PyTorch's own error), with the gradients of the backward it feeds; and
    its lse against the same kernel's without the option: within the cubic's relative error
    (ioattn.reference.exp2_poly.MAX_REL_ERROR) plus float32 rounding, yet not bitwise equal where
    the polynomial's columns (each key tile's last ones) hold keys: the option reached the kernel."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.reference.exp2_poly import MAX_REL_ERROR
    b, sq, sk, h, hkv = shape
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper.exp2_fma(share):
        plan = ioattn.explain_dispatch(torch.empty(b, sq, h, d, device="cuda", dtype=dtype),
                                       torch.empty(b, sk, hkv, d, device="cuda", dtype=dtype),
                                       torch.empty(b, sk, hkv, d, device="cuda", dtype=dtype), causal=causal)
        assert variant in plan.forward["kernel"] and plan.forward["exp2_fma"].startswith(f"{share:g}% ")
        _check(b, sq, sk, h, hkv, d, dtype, causal=causal)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    with hopper.variant(variant):
        out0, lse0 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
        with hopper.exp2_fma(share):
            out1, lse1 = backends.hopper_forward(q, k, v, d ** -0.5, causal)
    assert torch.equal(lse0.isinf(), lse1.isinf()) and not lse1.isnan().any()  # the same rows see no key
    seen = lse0.isfinite()
    assert (lse1[seen] - lse0[seen]).abs().max().item() <= 1.5 * MAX_REL_ERROR + 1e-5
    if sk >= hopper.TILE_TABLE[variant][d][1]:  # else the key tile's last columns are all past seqlen_k
        assert not torch.equal(lse0, lse1)
    assert torch.equal(out1[~seen.transpose(1, 2)], torch.zeros_like(out1[~seen.transpose(1, 2)]))


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant, d", [("pingpong", 128), ("wg3", 64)])
@pytest.mark.parametrize("share", [50, 100])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_forward_exp2_fma_extreme_scores(variant, d, share, causal, poison_alloc):
    """Large logits (q with standard deviation 30: score spreads of hundreds of log2 units, so many
    exponent arguments lie below -127, where the polynomial must give 0, and a row maximum can jump
    by far more than 127 from one key tile to the next) with exponentials on the FMA units: no NaN,
    and the float64 oracle's criterion, forward and gradients."""
    from ioattn.plan import hopper
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper.exp2_fma(share):
        _check(2, 1000, 1000, 4, 2, d, torch.bfloat16, causal=causal, q_scale=30.0)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_backward_default_policy_and_deterministic(causal, monkeypatch, poison_alloc):
    """Without any switch, a long enough head-dim-128 call takes the Gluon backward (variant
    ws, by hopper_bwd.BWD_AUTO_MIN_SEQLEN) and passes the float64 oracle;
    deterministic=True gives gradients that are bitwise the same run to run
    (docs/decisions/deterministic-backward.md: the ordered Gluon mode or the portable backward)."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    n = hopper_bwd.BWD_AUTO_MIN_SEQLEN[(128, causal)]
    q = torch.randn(1, n, 4, 128, device="cuda", dtype=torch.bfloat16)
    kv = q[:, :, :2].contiguous()
    plan = ioattn.explain_dispatch(q, kv, kv, causal=causal)
    assert plan.backward["gluon_hopper"].startswith("taken (default policy")
    assert "hopper_backward" in plan.backward["kernels"]
    _check(1, n, n, 4, 2, 128, torch.bfloat16, causal=causal)
    qkv = [torch.randn(1, n, h, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for h in (4, 2, 2)]
    dout = torch.randn(1, n, 4, 128, device="cuda", dtype=torch.bfloat16)
    runs = [torch.autograd.grad(ioattn.flash_attn_func(*qkv, causal=causal, deterministic=True), qkv, dout)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert not a.isnan().any() and torch.equal(a, b)
    fast = torch.autograd.grad(ioattn.flash_attn_func(*qkv, causal=causal), qkv, dout)
    for a, b in zip(runs[0], fast):  # the two backward kernels agree to bf16 rounding
        assert (a.float() - b.float()).abs().max() <= 0.05 * b.float().abs().max() + 1e-3


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (3, 129, 64, 2, 2), (1, 1000, 300, 4, 4),
                                   (1, 300, 2000, 3, 1), (1, 4096, 4096, 8, 2)])
@pytest.mark.parametrize("block_m", [64, 128])
@pytest.mark.parametrize("dq_flat", [False, True])
@pytest.mark.parametrize("wg_split", [False, True])
def test_hopper_backward_deterministic(d, causal, shape, block_m, dq_flat, wg_split, poison_alloc, monkeypatch):
    """The ws backward's ordered dQ mode (deterministic=True: reduce-adds in key-block order through
    per-query-block semaphores): three runs bitwise equal, and within 2x PyTorch's error of the
    float64 oracle. Shapes: many key blocks per query block, rows with no visible key, causal with
    seqlen_q > seqlen_k (key blocks no query sees), GQA 3. d=256: the column-split form (64-key
    blocks, each query block's dQ added in two halves under one turn of the order, the high one from
    the step's Q slot). block_m: d=64 at its default 128 query rows a step and at 64 (``WS_BLOCK_M``,
    docs/decisions/backward-ws-step.md). dq_flat: the flat dQ tile and accumulator or the swizzled 2-D tile
    (``WS_DQ_FLAT``, d = 64 / 128 at their default rows a step). wg_split: with the flat tile, each consumer warpgroup
    a partition of its own (``WS_WG_PARTITIONS``: the writer adds the tile's halves as two copies)."""
    from ioattn.plan import hopper_bwd
    from ioattn import backends
    from ioattn.backends import hopper_backward
    if block_m != hopper_bwd.WS_BLOCK_M[d]:
        if d != 64 or dq_flat:
            pytest.skip("a second row count a step at d=64 only, with the swizzled dQ tile")
        monkeypatch.setitem(hopper_bwd.WS_BLOCK_M, d, block_m)
    if d in hopper_bwd.WS_DQ_FLAT:
        monkeypatch.setitem(hopper_bwd.WS_DQ_FLAT, d, dq_flat)
    elif dq_flat:
        pytest.skip("the flat dQ tile: the key-split form (d = 64 / 128)")
    if wg_split:
        if not dq_flat or d not in hopper_bwd.WS_WG_PARTITIONS:
            pytest.skip("a warpgroup a partition: the flat key split (d = 64 / 128)")
        monkeypatch.setitem(hopper_bwd.WS_WG_PARTITIONS, d, True)
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    scale = d ** -0.5
    out, lse = backends.hopper_forward(q, k, v, scale, causal)
    dout = torch.randn_like(out)
    runs = [hopper_backward(dout, q, k, v, out, lse, scale, causal, deterministic=True)
            for _ in range(3)]
    for name, *gs in zip(("dq", "dk", "dv"), *runs):
        assert not gs[0].isnan().any() and all(torch.equal(gs[0], g) for g in gs[1:]), name
    _assert_grads_match_oracle(runs[0], q, k, v, dout, (-1, 0) if causal else (-1, -1))


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("causal", [False, True])
def test_deterministic_through_the_api_with_the_ordered_gluon_mode(causal, monkeypatch, poison_alloc):
    """deterministic=True takes the Gluon backward's ordered mode, causal (descending key-block order,
    docs/decisions/deterministic-backward.md) or not, and the plan says so; two backward passes give bitwise equal
    gradients."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    qkv = [torch.randn(2, 2048, hh, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for hh in (8, 2, 2)]
    with hopper_bwd.bwd_deterministic(True):
        plan = ioattn.explain_dispatch(*[t.detach() for t in qkv], causal=causal)
    assert plan.backward["gluon_hopper"].startswith("taken")
    assert "deterministic" in plan.backward["gluon_hopper"] and "hopper_backward" in plan.backward["kernels"]
    dout = torch.randn(2, 2048, 8, 128, device="cuda", dtype=torch.bfloat16)
    runs = [torch.autograd.grad(ioattn.flash_attn_func(*qkv, causal=causal, deterministic=True), qkv, dout)
            for _ in range(2)]
    for a, b in zip(*runs):
        assert not a.isnan().any() and torch.equal(a, b)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("forward", ["gluon", "portable"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
# (3, 129, 64): queries with no visible key (lse -inf); (1, 1000, 300): causal with seqlen_q > seqlen_k;
# (1, 64, 1000): key blocks no query sees (zeros); (2, 300, 340, 3, 1): GQA 3, tiles across sequences
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2),
                                   (2, 300, 340, 3, 1), (1, 64, 1000, 2, 2), (1, 1000, 300, 4, 4),
                                   (2, 4096, 4096, 8, 2)])
def test_hopper_backward(forward, d, causal, dtype, shape, poison_alloc):
    """The Gluon backward (the warp-specialised kernel as each head dim's tables set it: dQ by TMA
    reduce-add, at d = 256 its column-split form), fed by the Gluon forward's or the portable forward's
    (out, lse), against the float64 oracle: dq, dk, dv within 2x PyTorch's own error. (The tables' other
    settings, the A/B arms of ``benchmarks/ab_bwd.py``, are checked there against the oracle before they
    are timed, and compiled for sm_90 by ``tests/test_sm90_compile_bwd.py``.)"""
    from ioattn import backends
    from ioattn.plan import hopper
    from ioattn.backends import hopper_backward
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype) for _ in range(2))
    scale = d ** -0.5
    window = (-1, 0) if causal else (-1, -1)
    if forward == "gluon":
        out, lse = backends.hopper_forward(q, k, v, scale, causal)
    else:
        with hopper.prefer_hopper(False):
            out, lse = backends.triton_forward(q, k, v, None, None, sq, sk, Semantics(scale, window), None, 0)
    dout = torch.randn_like(out)
    grads = hopper_backward(dout, q, k, v, out, lse, scale, causal)
    _assert_grads_match_oracle(grads, q, k, v, dout, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("groups", ["l2", "one_head"])
# several tiles a program (many waves: 8 x 8 x 8 tiles), rows past seqlen_q, causal rows with no key
# (seqlen_q > seqlen_k), one key tile a tile, GQA 3, a grid of fewer tiles than SMs
@pytest.mark.parametrize("shape", [(8, 1000, 1000, 8, 4), (8, 777, 300, 8, 4), (16, 512, 100, 8, 4),
                                   (2, 300, 340, 3, 1), (2, 512, 512, 16, 16), (3, 129, 64, 2, 2)])
def test_hopper_forward_walk_table(d, groups, shape, monkeypatch, poison_alloc):
    """``hopper.walk_table``: the persistent causal forward walking the host's table
    (``gluon_fwd.build_walk_table``, the kernel's ``Walk``) against the float64 oracle on poisoned
    outputs, with the gradients of the backward it feeds; groups of heads as the L2 budget sets them,
    or of one head each (every group boundary inside the walks); the launch used a table."""
    from ioattn.plan import hopper
    from ioattn.launch import gluon_fwd
    if groups == "one_head":
        monkeypatch.setattr(hopper, "WALK_TABLE_L2_BYTES", {d: 1})
    gluon_fwd._WALK_TABLES.clear()
    b, sq, sk, h, hkv = shape
    with hopper.variant("persistent"), hopper.prefer_hopper(True), hopper.walk_table(True):
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=True)
    assert gluon_fwd._WALK_TABLES, "no walk table built: the launch did not use one"


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("built_before", [False, True])
def test_hopper_forward_walk_table_cuda_graph(built_before):
    """The persistent causal forward (d = 128, N = 512: the walk from the host's table by default)
    captured in a CUDA graph. A shape whose table was built before the capture keeps it; one first
    seen inside the capture takes the computed walk (no host copy allowed there) and builds nothing.
    Each replay on new inputs equals the eager call bitwise (a tile's result does not depend on the
    program that walks it)."""
    from ioattn.plan import hopper
    from ioattn.launch import gluon_fwd
    q, k, v = (torch.randn(4, 512, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))

    def fwd():
        with hopper.prefer_hopper(True), torch.no_grad():
            return ioattn.flash_attn_func(q, k, v, causal=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # both builds compiled outside the capture
        fwd()
        with hopper.walk_table(False):
            fwd()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    if not built_before:
        gluon_fwd._WALK_TABLES.clear()
    before = dict(gluon_fwd._WALK_TABLES)
    assert bool(before) == built_before
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fwd()
    assert gluon_fwd._WALK_TABLES == before  # nothing built inside the capture; a table built before kept
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))
        graph.replay()
        expect = fwd()
        torch.cuda.synchronize()
        assert torch.equal(out, expect)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "wg3", "persistent"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
# the persistent tile loop's shapes (several tiles a program; rows past seqlen_q; causal rows with no key
# between tiles that do; one key tile a tile) and the one-tile kernels' (a warpgroup with no visible key,
# a fully masked extra tile, GQA 3)
@pytest.mark.parametrize("shape", [(4, 1000, 1000, 8, 4), (8, 777, 300, 8, 4), (16, 512, 100, 8, 4),
                                   (3, 129, 64, 2, 2), (2, 300, 340, 3, 1), (2, 512, 512, 16, 16)])
def test_hopper_forward_ptx_barriers(variant, d, causal, shape, poison_alloc):
    """``hopper.ptx_barriers``: the consumers' partition barriers before mbarrier waits and the arrives
    that follow a warpgroup-wide wgmma dropped from the PTX (``ioattn.kernels.ptx_barriers``). Against
    the float64 oracle on poisoned outputs with the gradients of the backward it feeds (a hang or a
    lapped phase would show as a timeout or wrong rows), and the marked kernel's PTX has nothing left
    for the pass to drop (it ran on this build)."""
    from ioattn.plan import hopper
    from ioattn.kernels import hopper_forward as hf
    from ioattn.kernels import ptx_barriers as pb
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    b, sq, sk, h, hkv = shape
    with hopper.variant(variant), hopper.prefer_hopper(True), hopper.ptx_barriers(True):
        _check(b, sq, sk, h, hkv, d, torch.bfloat16, causal=causal)
    marked = [kernel.asm["ptx"] for cache in hf.hopper_fwd_kernel.device_caches.values()
              for kernel in cache[0].values() if pb.MARKER in kernel.asm["ptx"]]
    assert marked, "no marked build compiled"
    for ptx in marked:
        counts = pb.drop_partition_barriers(ptx)[1]
        assert counts["wait"] == counts["arrive"] == 0, counts


def _ragged_packed(d):
    """Packed sequences for the varlen backward's tests, bf16, 4 query heads, GQA 2: lengths 1, shorter
    than a tile, several tiles, seqlen_q != seqlen_k both ways, one with no queries, one with no keys;
    7 trailing rows that no sequence owns hold NaN in q, k, v and dO. (q, k, v, dout, cu_seqlens_q,
    cu_seqlens_k, max_seqlen_q, max_seqlen_k)."""
    lens_q, lens_k, extra, h, hkv = [1, 100, 700, 333, 0, 64, 50], [1, 37, 900, 200, 40, 300, 0], 7, 4, 2
    cu = lambda lens: torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32,  # noqa: E731
                                   device="cuda")
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq + extra, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(tk + extra, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    for t, n in ((q, tq), (k, tk), (v, tk), (dout, tq)):
        t[n:] = float("nan")
    return q, k, v, dout, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mode", ["api", "deterministic", "swizzled"])
def test_hopper_backward_varlen(d, causal, mode, monkeypatch, poison_alloc):
    """The ws backward's packed-sequence form (``IS_VARLEN``) through flash_attn_varlen_func, the plan
    naming it, per sequence against the float64 oracle (2x PyTorch's own error): sequences of length
    1, shorter than a tile, several tiles, seqlen_q != seqlen_k both ways (causal: rows that see no
    key, keys no query sees), one with no queries, one with no keys, GQA 2; 7 trailing rows that no
    sequence owns hold NaN in q, k, v and dO (the producer zeroes what the last tiles read of them)
    and get zero gradients. ``deterministic``: the ordered dQ mode, two runs bitwise equal;
    ``swizzled``: the 2-D dQ tile instead of the flat one (d = 64 / 128), with the (rows, heads * d)
    accumulator the column-split form (d = 256) always uses."""
    from ioattn.plan import hopper_bwd
    from ioattn import backends
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    if mode == "swizzled":
        if d not in hopper_bwd.WS_DQ_FLAT:
            pytest.skip("d = 256 has the 2-D accumulator in every mode")
        monkeypatch.setitem(hopper_bwd.WS_DQ_FLAT, d, False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    window = (-1, 0) if causal else (-1, -1)
    deterministic = mode == "deterministic"
    with hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(deterministic):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, cu_seqlens_q=cq, max_seqlen_q=max_q)
    assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
    assert "hopper_backward" in plan.backward["kernels"], plan.backward
    runs = []
    for _ in range(2 if deterministic else 1):
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        with hopper_bwd.prefer_hopper_bwd(True):
            out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, causal=causal,
                                                        deterministic=deterministic, return_attn_probs=True)
        runs.append(torch.autograd.grad(out, (qg, kg, vg), dout))
    dq, dk, dv = runs[0]
    if deterministic:
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    # the kernel itself, called directly, gives the API's gradients (bitwise where its order is fixed)
    direct = backends.hopper_backward(dout, q, k, v, out.detach(), lse, d ** -0.5, causal,
                                deterministic=deterministic, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_q,
                                max_seqlen_k=max_k)
    assert torch.equal(direct[1], dk) and torch.equal(direct[2], dv)
    if deterministic:
        assert torch.equal(direct[0], dq)
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"ws varlen {mode}", q, k, v, dout, out.detach(), lse, (dq, dk, dv), cq, ck,
                            window=window)


# sliding windows (flash-attn's (left, right), -1 unbounded): a causal band, a symmetric one, a right
# edge alone (the causal mask shifted), a left edge alone, and the diagonal only
_BWD_WINDOWS = [(100, 0), (256, 256), (-1, 30), (70, -1), (0, 0)]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", _BWD_WINDOWS)
# (2, 1000, 1000, 4, 2): GQA 2; (1, 777, 1500, 2, 1): seqlen_q < seqlen_k (bottom-right aligned);
# (3, 129, 64, 2, 2): seqlen_q > seqlen_k (rows that see no key), tiles across batch entries
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
def test_hopper_backward_window(d, window, shape, monkeypatch, poison_alloc):
    """The ws backward's sliding-window form (``WINDOW``) through flash_attn_func (the plan naming
    it), output and gradients against the float64 oracle (2x PyTorch's own error)."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), window_size=window)
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        out = ioattn.flash_attn_func(q, k, v, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", _BWD_WINDOWS)
def test_hopper_backward_window_deterministic(d, window, monkeypatch, poison_alloc):
    """The window form's ordered dQ mode (ascending key blocks from the first one each query block's
    band reaches): two runs bitwise equal, and within 2x PyTorch's error of the float64 oracle."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    qkv = [torch.randn(2, 1000, hh, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for hh in (4, 2, 2)]
    dout = torch.randn(2, 1000, 4, d, device="cuda", dtype=torch.bfloat16)
    with hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(True):
        plan = ioattn.explain_dispatch(*[t.detach() for t in qkv], window_size=window)
    assert plan.backward["gluon_hopper"].startswith("taken") and "deterministic" in plan.backward["gluon_hopper"]
    runs = []
    for _ in range(2):
        with hopper_bwd.prefer_hopper_bwd(True):
            out = ioattn.flash_attn_func(*qkv, window_size=window, deterministic=True)
        runs.append(torch.autograd.grad(out, qkv, dout))
    assert all(not a.isnan().any() and torch.equal(a, b) for a, b in zip(*runs))
    _assert_out_and_grads(out, runs[0], dout, *qkv, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [(100, 0), (256, 256)])
def test_hopper_backward_varlen_window(d, window, monkeypatch, poison_alloc):
    """Packed sequences with a sliding window (``IS_VARLEN`` and ``WINDOW`` together), per sequence
    against the float64 oracle; the unowned trailing rows (NaN) get zero gradients."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    with hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q, k, v, window_size=window, cu_seqlens_q=cq, max_seqlen_q=max_q)
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, window_size=window,
                                                    return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"ws varlen window {window}", q, k, v, dout, out.detach(), lse, (dq, dk, dv), cq, ck,
                            window=window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d, form", [(64, "default"), (128, "default"), (128, "column split"), (256, "default")])
@pytest.mark.parametrize("mask", ["none", "causal", (100, 0), (256, 256)])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hopper_backward_softcap(d, form, mask, shape, dtype, monkeypatch, poison_alloc):
    """The ws backward's softcap form (``SOFTCAP``: the tanh recomputed, dS^T times its derivative)
    through flash_attn_func, alone, causal and with windows, the plan naming it; at d = 128 also as
    the column split (``WS_SOFTCAP_COL_SPLIT_HEADDIMS``): output and gradients against the float64
    oracle (2x PyTorch's own error); q drawn with standard deviation 4 so that many scores saturate
    the cap (20), where the derivative is near 0."""
    from ioattn.plan import hopper_bwd
    if dtype == torch.float16 and shape[1] != 1000:
        pytest.skip("fp16: one shape")
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    monkeypatch.setattr(hopper_bwd, "WS_SOFTCAP_COL_SPLIT_HEADDIMS", (128,) if form == "column split" else ())
    b, sq, sk, h, hkv = shape
    causal, window = mask == "causal", mask if isinstance(mask, tuple) else (-1, -1)
    q = (torch.randn(b, sq, h, d, device="cuda", dtype=dtype) * 4).requires_grad_()
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    with hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), causal=causal, window_size=window,
                                       softcap=20.0)
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        assert ("column split" if form == "column split" or d == 256 else "key split") in plan.backward["softcap"]
        out = ioattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=20.0)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, (-1, 0) if causal else window, softcap=20.0)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mode", ["causal", (100, 0), "deterministic"])
def test_hopper_backward_varlen_softcap(d, mode, monkeypatch, poison_alloc):
    """Packed sequences with a softcap (``IS_VARLEN`` and ``SOFTCAP``; with the causal mask, a window,
    or the ordered dQ mode), per sequence against the float64 oracle; the unowned trailing rows (NaN)
    get zero gradients."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    causal, window = mode == "causal", mode if isinstance(mode, tuple) else (-1, -1)
    with hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(mode == "deterministic"):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, window_size=window, cu_seqlens_q=cq,
                                       max_seqlen_q=max_q, softcap=20.0)
        assert plan.backward["gluon_hopper"].startswith("taken") and "softcap" in plan.backward, plan.backward
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, causal=causal, window_size=window,
                                                    softcap=20.0, deterministic=mode == "deterministic",
                                                    return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"ws varlen softcap {mode}", q, k, v, dout, out.detach(), lse, (dq, dk, dv), cq, ck,
                            window=(-1, 0) if causal else window, softcap=20.0)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal", (100, 0), (256, 256)])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
@pytest.mark.parametrize("softcap", [0.0, 20.0])
def test_hopper_alibi(d, mask, shape, softcap, monkeypatch, poison_alloc):
    """The Gluon kernels' ALiBi forms (``ALIBI``: the forward's two-warpgroup ping-pong kernels and the
    ws backward), alone, causal and with windows, with and without a softcap, the plan naming them:
    output and gradients against the float64 oracle (2x PyTorch's own error). Slopes per (batch,
    head) for the first shape, per head for the others; steep enough (up to 1) that the bias
    decides the softmax over a few keys, as for ALiBi's first heads."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    b, sq, sk, h, hkv = shape
    causal, window = mask == "causal", mask if isinstance(mask, tuple) else (-1, -1)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    slopes = torch.rand(b, h, device="cuda") if b == 2 else torch.rand(h, device="cuda")
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), causal=causal, window_size=window,
                                       softcap=softcap, alibi_slopes=slopes)
        assert plan.forward["gluon_hopper"].startswith("taken") and "alibi" in plan.forward, plan.forward
        bwd_taken = not (softcap and d in hopper_bwd.BWD_ALIBI_SOFTCAP_REFUSED)
        assert plan.backward["gluon_hopper"].startswith("taken") == bwd_taken, plan.backward
        assert ("alibi" in plan.backward) == bwd_taken, plan.backward
        out = ioattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                     alibi_slopes=slopes)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, (-1, 0) if causal else window, softcap=softcap,
                          slopes=slopes)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("form", ["magic", "fp32"])
@pytest.mark.parametrize("mask", ["causal", (300, 0)])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (1, 1500, 777, 2, 2)])
@pytest.mark.parametrize("d", [64, 128])
def test_hopper_alibi_forward_forms(d, form, mask, shape, monkeypatch, poison_alloc):
    """The masked ALiBi forward in both forms (``hopper.alibi_form``: the magic-number distance in the
    head dim's plain configuration, wg3 / 128-key tiles; the fp32 columns in pingpong, 64-key tiles at
    d = 128), whichever the policy picks: the output and lse against the float64 oracle (2x PyTorch's
    own error)."""
    from ioattn.plan import hopper
    monkeypatch.setattr(hopper, "ALIBI_MAGIC_CAUSAL_MIN_SEQLEN", {d: 0} if form == "magic" else {})
    monkeypatch.setattr(hopper, "ALIBI_MAGIC_WINDOW_HEADDIMS", (d,) if form == "magic" else ())
    b, sq, sk, h, hkv = shape
    causal, window = mask == "causal", mask if isinstance(mask, tuple) else (-1, -1)
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    slopes = torch.rand(h, device="cuda")
    with hopper.prefer_hopper(True):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes)
        assert plan.forward["alibi"].endswith("magic-number conversion)" if form == "magic" else "held as fp32)")
        expect = {(64, "magic"): ("wg3", 128), (64, "fp32"): ("pingpong", 128), (128, "magic"): ("pingpong", 128),
                  (128, "fp32"): ("pingpong", 64)}[(d, form)]
        assert plan.forward["kernel"].endswith(f"(Gluon, {expect[0]})") and plan.forward["tiles"][1] == expect[1]
        out, lse, _ = ioattn.flash_attn_func(q, k, v, causal=causal, window_size=window, alibi_slopes=slopes,
                                             return_attn_probs=True)
    ref = attention_oracles(q, k, v, torch.zeros_like(out), window=(-1, 0) if causal else window,
                            alibi_slopes=slopes)
    assert_within_torch_error(f"alibi {form} {mask}", out, ref["out64"], ref["out_t"])
    assert_lse_close(f"alibi {form} {mask}", lse, ref["lse64"].float())


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mode", ["none", "causal", (100, 0), "deterministic"])
@pytest.mark.parametrize("softcap", [0.0, 20.0])
def test_hopper_varlen_alibi(softcap, d, mode, monkeypatch, poison_alloc):
    """Packed sequences with ALiBi (``IS_VARLEN`` and ``ALIBI``, the slopes by (sequence, head)) through
    both Gluon kernels, with and without a softcap, per sequence against the float64 oracle; the unowned
    trailing rows (NaN) get zero gradients."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    slopes = torch.rand(cq.numel() - 1, q.shape[1], device="cuda")
    causal, window = mode == "causal", mode if isinstance(mode, tuple) else (-1, -1)
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(mode == "deterministic"):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, window_size=window, cu_seqlens_q=cq,
                                       max_seqlen_q=max_q, alibi_slopes=slopes, softcap=softcap)
        assert "alibi" in plan.forward and "alibi" in plan.backward, (plan.forward, plan.backward)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, causal=causal, window_size=window,
                                                    alibi_slopes=slopes, softcap=softcap,
                                                    deterministic=mode == "deterministic", return_attn_probs=True)
        dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"varlen alibi {mode} softcap {softcap}", q, k, v, dout, out.detach(), lse, (dq, dk, dv),
                            cq, ck, seq_kw=lambda i: dict(alibi_slopes=slopes[i]), window=(-1, 0) if causal else window,
                            softcap=softcap)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d, window", [(128, (256, 0)), (64, (16, 16)), (64, (200, -1))])
def test_hopper_backward_window_default_policy(d, window, monkeypatch, poison_alloc):
    """Without a switch, a window call's backward follows ``hopper_bwd.BWD_WINDOW_MIN_WIDTH`` (width = left +
    right + 1, an unbounded side as seqlen_k) and the lengths' table, the plan giving the reason, and
    its gradients pass the float64 oracle either way."""
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    qkv = [torch.randn(2, 1000, hh, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for hh in (4, 2, 2)]
    width = sum(w if w >= 0 else 1000 for w in window) + 1
    plan = ioattn.explain_dispatch(*[t.detach() for t in qkv], window_size=window)
    taken = width >= hopper_bwd.BWD_WINDOW_MIN_WIDTH[d] and 1000 >= hopper_bwd.BWD_AUTO_MIN_SEQLEN[(d, False)]
    assert plan.backward["gluon_hopper"].startswith("taken" if taken else "not taken"), plan.backward
    assert (f"window of width {width}" if taken else f"(hopper_bwd.BWD_WINDOW_MIN_WIDTH; here {width})") in \
        plan.backward["gluon_hopper"], plan.backward
    out = ioattn.flash_attn_func(*qkv, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, qkv, dout)
    _assert_out_and_grads(out, grads, dout, *qkv, window)


# the Gluon forward's sliding-window form: the backward's windows, and a narrow band whose right side
# reaches past the diagonal by more than a key tile
_FWD_WINDOWS = _BWD_WINDOWS + [(5, 130)]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "split", "wg3"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", _FWD_WINDOWS)
# (2, 1000, 1000, 4, 2): GQA 2, a key tail; (1, 777, 1500, 2, 1): seqlen_q < seqlen_k (bottom-right
# aligned); (3, 129, 64, 2, 2): seqlen_q > seqlen_k (rows that see no key, a CTA whose rows see none)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_hopper_forward_window(variant, d, window, shape, dtype, monkeypatch, poison_alloc):
    """The Gluon forward's sliding-window form (``WINDOW``) through flash_attn_func, the plan naming it:
    output, lse and the gradients of the backward fed by them against the float64 oracle (2x
    PyTorch's own error); the lse -inf exactly on the rows that see no key; the API's forward is the
    kernel's, called directly."""
    from ioattn.plan import hopper
    from ioattn import backends
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    if dtype == torch.float16 and shape != (2, 1000, 1000, 4, 2):
        pytest.skip("fp16: one shape (the same code but the dtype)")
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    with hopper.variant(variant), hopper.prefer_hopper(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), window_size=window)
        assert plan.forward["kernel"].endswith(f"(Gluon, {variant})"), plan.forward
        assert plan.forward["window"].startswith(str(window)), plan.forward
        out, lse, _ = ioattn.flash_attn_func(q, k, v, window_size=window, return_attn_probs=True)
        direct = backends.hopper_forward(q.detach(), k.detach(), v.detach(), d ** -0.5, False, window=window)
    assert torch.equal(out.detach(), direct[0]) and torch.equal(lse, direct[1])
    assert_lse_close(f"{variant} window {window}", lse, attention_oracles(q, k, v, torch.zeros_like(out),
                                                                          window=window)["lse64"].float())
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "wg3"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("window", [(100, 0), (256, 256), (0, 0), (-1, 30)])
def test_hopper_forward_varlen_window(variant, d, window, monkeypatch, poison_alloc):
    """Packed sequences with a sliding window in the Gluon forward (``IS_VARLEN`` and ``WINDOW``), per
    sequence against the float64 oracle (out, lse and the gradients); the unowned trailing rows hold
    NaN and get output 0, lse -inf and zero gradients."""
    from ioattn.plan import hopper
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    with hopper.variant(variant), hopper.prefer_hopper(True):
        plan = ioattn.explain_dispatch(q, k, v, window_size=window, cu_seqlens_q=cq, max_seqlen_q=max_q)
        assert plan.forward["kernel"].endswith(f"(Gluon, {variant})") and "window" in plan.forward, plan.forward
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, window_size=window,
                                                    return_attn_probs=True)
    dq, dk, dv = torch.autograd.grad(out, (qg, kg, vg), dout)
    assert (out[tq:] == 0).all() and torch.isneginf(lse[:, tq:]).all()
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"{variant} varlen window {window}", q, k, v, dout, out.detach(), lse, (dq, dk, dv),
                            cq, ck, window=window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d, window", [(128, (256, 0)), (128, (32, 32)), (64, (256, 0)), (256, (16, 16))])
def test_hopper_forward_window_default_policy(d, window, monkeypatch, poison_alloc):
    """Without a switch, a window call's forward follows ``hopper.WINDOW_MIN_WIDTH`` (width = left +
    right + 1; d = 64 not listed) and the lengths' table, the plan giving the reason, and its output
    and gradients pass the float64 oracle either way."""
    from ioattn.plan import hopper
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    qkv = [torch.randn(2, 1000, hh, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for hh in (4, 2, 2)]
    width = sum(window) + 1
    plan = ioattn.explain_dispatch(*[t.detach() for t in qkv], window_size=window)
    taken = width >= hopper.WINDOW_MIN_WIDTH.get(d, width + 1) and 1000 >= hopper.AUTO_MIN_SEQLEN[(d, False)]
    assert plan.forward["gluon_hopper"].startswith("taken" if taken else "not taken"), plan.forward
    assert ("hopper_fwd_kernel" in plan.forward["kernel"]) == taken, plan.forward
    assert (f"window of width {width}" if taken else "hopper.WINDOW_MIN_WIDTH") in \
        plan.forward["gluon_hopper"], plan.forward
    out = ioattn.flash_attn_func(*qkv, window_size=window)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, qkv, dout)
    _assert_out_and_grads(out, grads, dout, *qkv, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("variant", ["pingpong", "split", "wg3"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", ["none", "causal", (100, 0), (256, 256)])
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
def test_hopper_forward_softcap(variant, d, mask, shape, monkeypatch, poison_alloc):
    """The Gluon forward's softcap form (``SOFTCAP``: tanh.approx on the scores before the masks)
    through flash_attn_func, alone, causal and with windows, the plan naming it: output, lse and the
    gradients of the (portable) backward fed by them against the float64 oracle (2x PyTorch's own
    error); q drawn with standard deviation 4 so that many scores saturate the cap (20)."""
    from ioattn.plan import hopper
    from ioattn import backends
    if d not in hopper.TILE_TABLE[variant]:
        pytest.skip(f"the {variant} variant has no head dim {d}")
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    b, sq, sk, h, hkv = shape
    causal, window = mask == "causal", mask if isinstance(mask, tuple) else (-1, -1)
    q = (torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16) * 4).requires_grad_()
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with hopper.variant(variant), hopper.prefer_hopper(True):
        assert hopper.hopper_supports(q, k, v, False, Semantics(0.125, (-1, 0) if causal else window, 20.0), None)[0]
        out, lse, _ = ioattn.flash_attn_func(q, k, v, causal=causal, window_size=window, softcap=20.0,
                                             return_attn_probs=True)
        direct = backends.hopper_forward(q.detach(), k.detach(), v.detach(), d ** -0.5, causal, window=window,
                                       softcap=20.0)
    assert torch.equal(out.detach(), direct[0]) and torch.equal(lse, direct[1])
    ref_window = (-1, 0) if causal else window
    assert_lse_close(f"{variant} softcap {mask}", lse, attention_oracles(
        q, k, v, torch.zeros_like(out), window=ref_window, softcap=20.0)["lse64"].float())
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, ref_window, softcap=20.0)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
# 100: not a multiple of 8, the padded copies; 136 / 192: the forward's products over 192 columns
@pytest.mark.parametrize("d", [80, 96, 100, 136, 192])
@pytest.mark.parametrize("causal", [False, True])
# GQA 2; seqlen_q < seqlen_k (bottom-right causal); seqlen_q > seqlen_k (rows that see no key)
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1), (3, 129, 64, 2, 2)])
def test_hopper_padded_head_dims(d, causal, shape, monkeypatch, poison_alloc):
    """Head dims the Gluon kernels lack, run zero-padded to the next one (``hopper.PADDED_RANGE``,
    docs/decisions/padded-head-dims.md: in place where ``hopper.padded_in_place``, else on padded copies) through
    flash_attn_func, the plan naming the Gluon kernels both ways: output and gradients against the
    float64 oracle (2x PyTorch's own error), on poisoned allocations; the first shape also with
    transposed (b, h, n, d) inputs (made contiguous) and in the ordered dQ mode (two runs bitwise
    equal). The default policy takes the padded path at its lengths (``hopper.padded_min_seqlen``)."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    b, sq, sk, h, hkv = shape
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), causal=causal)
        assert plan.forward["gluon_hopper"].startswith("taken"), plan.forward
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        out = ioattn.flash_attn_func(q, k, v, causal=causal)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    _assert_out_and_grads(out, grads, dout, q, k, v, (-1, 0) if causal else (-1, -1))
    if shape[1] != 1000:
        return
    qt, kt, vt = (t.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_() for t in (q, k, v))
    runs = []
    for _ in range(2):
        with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(True):
            out_t = ioattn.flash_attn_func(qt, kt, vt, causal=causal, deterministic=True)
            runs.append(torch.autograd.grad(out_t, (qt, kt, vt), dout))
    assert all(torch.equal(a, b) for a, b in zip(*runs))
    _assert_out_and_grads(out_t, runs[0], dout, qt, kt, vt, (-1, 0) if causal else (-1, -1))
    least = hopper.padded_min_seqlen("fwd", d, causal)[0]
    long = torch.empty(1, least, 2, d, device="cuda", dtype=torch.bfloat16)
    plan = ioattn.explain_dispatch(long, long, long, causal=causal)
    assert plan.forward["gluon_hopper"].startswith("taken") and "zero-padded" in plan.forward["gluon_hopper"]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [72, 96, 136, 160, 192])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["persistent", "pingpong"])
def test_hopper_split_cols_matches_full_width(d, causal, variant, poison_alloc):
    """The products over 192 of the 256-wide tiles' columns (the kernels' ``PROD_DIM``; the forward's
    ``hopper.split_cols``: S as two chained products over columns 0:128 and 128:192, O as two
    accumulators; the ws backward's ``hopper.bwd_split_cols``: S^T and dP^T chained, dV and dK as two
    accumulators each) give bit for bit the 256-wide products' output and lse and the ordered backward's
    three gradients: the same k-steps in the same order, the skipped ones adding exact zeros (TMA's
    fill). At GQA, seqlen_q != seqlen_k, partial tiles and rows past the keys, from poisoned
    allocations, and against the float64 oracle."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.backends import hopper_backward
    torch.manual_seed(12)
    q = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    dp = hopper.padded_headdim(d)  # 256: both passes split; 128 (d = 72-96): the forward's over 96 columns
    assert hopper.split_cols_for(dp, d, variant) == 3 * dp // 4
    assert hopper.bwd_split_cols_for(dp, d, True) == (192 if dp == 256 else 0)
    results = []
    for split in (True, False):
        with hopper.variant(variant), hopper.split_cols(split), hopper.bwd_split_cols(split):
            out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal)
            grads = hopper_backward(dout, q, k, v, out, lse, d ** -0.5, causal, deterministic=True)
        results.append((out, lse, *grads))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert not torch.isnan(a).any(), name
        assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())
    window = (-1, 0) if causal else (-1, -1)
    refs = attention_oracles(q, k, v, torch.zeros_like(q), window=window)
    assert_within_torch_error(f"split d={d} {variant}", results[0][0], refs["out64"], refs["out_t"])
    assert_lse_close(f"split lse d={d} {variant}", results[0][1], refs["lse64"].float())
    _assert_out_and_grads(results[0][0], results[0][2:], dout, q, k, v, window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [192, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_dq_hi_first_matches_lo_first(d, causal, monkeypatch, poison_alloc):
    """The column split handing dQ's high half to the writer first (``DQ_HI_FIRST``: the Q slot
    released as soon as the half staged there is read, docs/decisions/split-products.md; the default at the
    products over 192 columns, ``WS_DQ_HI_FIRST``) gives the ordered backward's three gradients bit for bit those of the
    low half first (the same additions in the same key-block order, the halves' columns disjoint), and
    either order in the default (unordered) mode passes the float64 oracle. d = 256 native and d = 192
    padded in place (its 64-column high half), GQA, seqlen_q != seqlen_k, partial tiles, poisoned
    allocations."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.plan import hopper_bwd
    torch.manual_seed(13)
    q = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal)
    assert hopper_bwd.dq_hi_first(256, True, hopper.bwd_split_cols_for(256, d if d < 256 else 0, True)) == (d == 192)
    runs = []
    for widths in ((192, 256), ()):  # the high half first at every width, then at none
        monkeypatch.setattr(hopper_bwd, "WS_DQ_HI_FIRST", widths)
        backends.clear_routes()  # the plans are cached on the switches, not on the tables
        runs.append(backends.hopper_backward(dout, q, k, v, out, lse, d ** -0.5, causal, deterministic=True))
        grads = backends.hopper_backward(dout, q, k, v, out, lse, d ** -0.5, causal)
        _assert_out_and_grads(out, grads, dout, q, k, v, (-1, 0) if causal else (-1, -1))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert not torch.isnan(a).any(), name
        assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [136, 160, 192])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["persistent", "pingpong"])
def test_hopper_split_ring_matches_whole_tiles(d, causal, variant, poison_alloc):
    """The forward's split ring (``hopper.split_ring``: the K / V tiles' columns 0:128 and 128:192 in
    buffers of their own, three stages, docs/decisions/split-products.md) gives bit for bit the 256-wide tiles'
    output and lse (the same products in the same order; the ring only moves where the tiles sit), at GQA, seqlen_q !=
    seqlen_k (whole key tiles: the ring's condition), partial query tiles, from poisoned allocations, and
    against the float64 oracle; a key length with a partial last tile keeps the whole tiles."""
    from ioattn.plan import hopper
    from ioattn import backends
    torch.manual_seed(14)
    q = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 320, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    assert hopper.split_ring_for(256, d, variant) and not hopper.split_ring_for(256, d, variant, kv_tail=True)
    results = []
    for ring in (True, False):
        with hopper.variant(variant), hopper.split_ring(ring):
            results.append(backends.hopper_forward(q, k, v, d ** -0.5, causal))
    for name, a, b in zip(("out", "lse"), *results):
        assert not torch.isnan(a).any(), name
        assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())
    window = (-1, 0) if causal else (-1, -1)
    refs = attention_oracles(q, k, v, torch.zeros_like(q), window=window)
    assert_within_torch_error(f"ring d={d} {variant}", results[0][0], refs["out64"], refs["out_t"])
    assert_lse_close(f"ring lse d={d} {variant}", results[0][1], refs["lse64"].float())


# (flash_attn_func keywords, "alibi" for slopes): the kernels' forms at a padded head dim, in place
_PADDED_FORMS = [dict(window_size=(100, 0)), dict(window_size=(256, 256)), dict(softcap=20.0, causal=True),
                 dict(alibi=True), dict(alibi=True, causal=True), dict(alibi=True, softcap=20.0, window_size=(300, 0))]


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [96, 192])
@pytest.mark.parametrize("form", range(len(_PADDED_FORMS)))
@pytest.mark.parametrize("shape", [(2, 1000, 1000, 4, 2), (1, 777, 1500, 2, 1)])
def test_hopper_padded_forms(d, form, shape, monkeypatch, poison_alloc):
    """Sliding windows, a softcap and ALiBi (and their mixes) at a head dim the Gluon kernels run padded in
    place (``hopper.padded_in_place``: the padded dim's own forms, docs/decisions/padded-head-dims.md) through
    flash_attn_func, the plan naming both Gluon kernels and the in-place inputs: output and gradients against the
    float64 oracle (2x PyTorch's own error), on poisoned allocations."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    b, sq, sk, h, hkv = shape
    kw = dict(_PADDED_FORMS[form])
    q = torch.randn(b, sq, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(b, sk, hkv, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    slopes = torch.rand(h, device="cuda") if kw.pop("alibi", False) else None
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):
        plan = ioattn.explain_dispatch(q.detach(), k.detach(), v.detach(), alibi_slopes=slopes, **kw)
        assert plan.forward["gluon_hopper"].startswith("taken"), plan.forward
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        assert plan.forward["inputs"].startswith("read in place"), plan.forward
        out = ioattn.flash_attn_func(q, k, v, alibi_slopes=slopes, **kw)
    dout = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), dout)
    window = (-1, 0) if kw.get("causal") else kw.get("window_size", (-1, -1))
    _assert_out_and_grads(out, grads, dout, q, k, v, window, softcap=kw.get("softcap", 0.0), slopes=slopes)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [80, 192])
@pytest.mark.parametrize("mode", ["none", "causal", (100, 0), "deterministic", "alibi"])
def test_hopper_padded_varlen(d, mode, monkeypatch, poison_alloc):
    """Packed sequences at a head dim the Gluon kernels run padded in place (``IS_VARLEN`` with the
    descriptors' zero fill), through flash_attn_varlen_func with both Gluon kernels: per sequence against
    the float64 oracle, ragged lengths (a sequence with no queries, one with no keys, seqlen_q != seqlen_k),
    NaN in the 7 trailing rows no sequence owns, which get zero gradients; ``deterministic``: the ordered
    dQ mode, two runs bitwise equal; ``alibi``: slopes by (sequence, head), causal."""
    from ioattn.plan import hopper
    from ioattn.plan import hopper_bwd
    monkeypatch.delenv("IOATTN_HOPPER", raising=False)
    monkeypatch.delenv("IOATTN_HOPPER_BWD", raising=False)
    q, k, v, dout, cq, ck, max_q, max_k = _ragged_packed(d)
    tq, tk = int(cq[-1]), int(ck[-1])
    causal = mode in ("causal", "alibi")
    window = mode if isinstance(mode, tuple) else (-1, -1)
    slopes = torch.rand(cq.numel() - 1, q.shape[1], device="cuda") if mode == "alibi" else None
    det = mode == "deterministic"
    runs = []
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True), hopper_bwd.bwd_deterministic(det):
        plan = ioattn.explain_dispatch(q, k, v, causal=causal, window_size=window, cu_seqlens_q=cq,
                                       max_seqlen_q=max_q, alibi_slopes=slopes)
        assert plan.forward["gluon_hopper"].startswith("taken"), plan.forward
        assert plan.backward["gluon_hopper"].startswith("taken"), plan.backward
        for _ in range(2 if det else 1):
            qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
            out, lse, _ = ioattn.flash_attn_varlen_func(qg, kg, vg, cq, ck, max_q, max_k, causal=causal,
                                                        window_size=window, alibi_slopes=slopes, deterministic=det,
                                                        return_attn_probs=True)
            runs.append(torch.autograd.grad(out, (qg, kg, vg), dout))
    if det:
        assert all(torch.equal(a, b) for a, b in zip(*runs))
    dq, dk, dv = runs[0]
    assert (dq[tq:] == 0).all() and (dk[tk:] == 0).all() and (dv[tk:] == 0).all()
    assert_varlen_sequences(f"padded varlen {mode}", q, k, v, dout, out.detach(), lse, (dq, dk, dv), cq, ck,
                            seq_kw=(lambda i: dict(alibi_slopes=slopes[i])) if slopes is not None else None,
                            window=(-1, 0) if causal else window)


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("d", [80, 96, 192])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("variant", ["persistent", "pingpong"])
def test_hopper_padded_in_place_matches_copies(d, causal, variant, monkeypatch, poison_alloc):
    """A padded head dim read in place (``hopper.padded_in_place``: 3-D descriptors whose TMA boxes run
    past d, the stores masked to d; docs/decisions/padded-head-dims.md) computes bit for bit what the padded copies
    compute (the same kernel at the padded dim on the same values): the forward's output and lse, and the ordered
    backward's three gradients, at a shape with GQA, seqlen_q != seqlen_k, partial tiles and rows past
    the keys, in both forward kernels the padded calls take; the outputs come from poisoned allocations,
    so an unwritten element shows as NaN, and the in-place output is checked against the float64
    oracle too."""
    from ioattn.plan import hopper
    from ioattn import backends
    from ioattn.backends import hopper_backward
    torch.manual_seed(11)
    q = torch.randn(2, 333, 4, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 300, 2, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn_like(q)
    results = []
    for in_place in (True, False):
        monkeypatch.setattr(hopper, "padded_in_place", lambda dd, _keep=in_place: _keep and dd % 8 == 0)
        backends.clear_routes()  # the plans are cached on the switches, not on the tables
        with hopper.variant(variant):
            out, lse = backends.hopper_forward(q, k, v, d ** -0.5, causal)
        grads = hopper_backward(dout, q, k, v, out, lse, d ** -0.5, causal, deterministic=True)
        results.append((out, lse, *grads))
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), *results):
        assert a.shape == b.shape and not torch.isnan(a).any(), name
        assert torch.equal(a, b), (name, (a.float() - b.float()).abs().max().item())
    _assert_out_and_grads(results[0][0], results[0][2:], dout, q, k, v, (-1, 0) if causal else (-1, -1))


@pytest.mark.skipif(not _SM90, reason="needs an sm_90 GPU")
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "e4m3"])
def test_schedule_record_of_the_pingpong_forward(fp8):
    """``ioattn bench pingpong-trace``'s record (bf16, and the FP8 forward on inputs quantised per head):
    the traced build's output equals the untraced call's bit for bit, and every complete section's
    stamps are in order (turn, S ready, softmax done), each warpgroup's turns increasing."""
    from ioattn.bench import pingpong_trace

    rec = pingpong_trace.record(1024, 128, 4, False, 2, fp8=fp8)
    assert rec["max_diff_untraced"] == 0.0 and rec["dtype"] == ("e4m3" if fp8 else "bf16")
    for cta in rec["ctas"]:
        for wg in cta:
            full = [sec[:3] for sec in wg if None not in sec[:3]]
            assert len(full) >= 1024 // rec["block_n"] - 1, wg
            assert all(a <= b <= c for a, b, c in full), wg
            turns = [t for t, *_ in full]
            assert turns == sorted(turns), turns
