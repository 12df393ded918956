"""KV-cache decoding ground truth (ioattn.reference.decode) and the page allocator (ioattn.kvcache)."""
import random

import pytest
import torch

from conftest import rotary_tables

from ioattn.kvcache import OutOfPagesError, PagePool
from ioattn.masks import normalize_window
from ioattn.reference import attention_ref
from ioattn.reference.decode import (
    append_kv_ref,
    apply_rotary_ref,
    gather_kv_ref,
    kvcache_attention_ref,
)

F64 = torch.float64
I32 = torch.int32


pytestmark = pytest.mark.usefixtures("one_thread")


_rotary_tables = rotary_tables


def _rotary_complex(x, theta, positions, interleaved):
    """The rotation as a product of complex numbers: pair (x1, x2) -> (x1 + i x2) * e^{i theta}."""
    half = theta.shape[1]
    r = 2 * half
    xr = x[..., :r].double()
    if interleaved:
        z = torch.view_as_complex(xr.reshape(*xr.shape[:-1], half, 2).contiguous())
    else:
        z = torch.complex(xr[..., :half], xr[..., half:])
    z = z * torch.polar(torch.ones_like(theta), theta)[positions][:, :, None, :]
    if interleaved:
        rot = torch.view_as_real(z).flatten(-2)
    else:
        rot = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((rot, x[..., r:].double()), dim=-1)


# ---------------------------------------------------------------- rotary

@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rotary_dim", [32, 16, 6])
def test_rotary_matches_complex_formulation(interleaved, rotary_dim):
    x = torch.randn(2, 5, 3, 32, dtype=F64)
    cos, sin, theta = _rotary_tables(100, rotary_dim, F64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [40, 41, 97, 7, 99]])  # offsets, non-monotonic too
    got = apply_rotary_ref(x, cos, sin, positions, interleaved)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert torch.allclose(got, _rotary_complex(x, theta, positions, interleaved), atol=1e-12)
    assert torch.equal(got[..., rotary_dim:], x[..., rotary_dim:])  # the tail is untouched
    assert not torch.equal(got[..., :rotary_dim], x[..., :rotary_dim])
    # position 0 is the identity
    assert torch.allclose(apply_rotary_ref(x, cos, sin, torch.zeros(2, 5, dtype=torch.long), interleaved), x)


def test_rotary_interleaved_is_neox_on_permuted_features():
    """GPT-J pairs (2j, 2j+1) are GPT-NeoX pairs (j, j + r/2) after de-interleaving the features."""
    x = torch.randn(1, 4, 2, 24, dtype=F64)
    cos, sin, _ = _rotary_tables(10, 16, F64)
    pos = torch.tensor([[1, 3, 5, 9]])
    perm = torch.cat((torch.arange(0, 16, 2), torch.arange(1, 16, 2), torch.arange(16, 24)))
    gptj = apply_rotary_ref(x, cos, sin, pos, interleaved=True)
    neox = apply_rotary_ref(x[..., perm], cos, sin, pos, interleaved=False)
    assert torch.allclose(gptj[..., perm], neox, atol=1e-12)
    assert not torch.allclose(gptj, apply_rotary_ref(x, cos, sin, pos, interleaved=False))


def test_rotary_low_precision_computes_in_fp32():
    x = torch.randn(2, 3, 2, 16, dtype=torch.bfloat16)
    cos, sin, theta = _rotary_tables(8, 16)
    pos = torch.tensor([[0, 4, 7], [1, 2, 3]])
    got = apply_rotary_ref(x, cos, sin, pos, False)
    assert got.dtype == torch.bfloat16
    want = _rotary_complex(x, theta, pos, False).float().to(torch.bfloat16)
    assert (got.double() - want.double()).abs().max() <= 2 ** -7 * want.double().abs().max()


def test_rotary_rejects_bad_arguments():
    x = torch.randn(1, 2, 1, 8)
    cos, sin, _ = _rotary_tables(4, 8)
    with pytest.raises(ValueError, match="rotary positions"):
        apply_rotary_ref(x, cos, sin, torch.tensor([[0, 4]]), True)
    cos2, sin2, _ = _rotary_tables(4, 10)
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rotary_ref(x, cos2, sin2, torch.tensor([[0, 1]]), True)


# ---------------------------------------------------------------- append / gather

def _paged_copy(kc, vc, page_size, num_pages):
    """The same logical content in a paged cache (unused pages NaN), with a random block table."""
    batch, capacity = kc.shape[:2]
    per_seq = capacity // page_size
    table = torch.randperm(num_pages)[:batch * per_seq].view(batch, per_seq).to(I32)
    paged = []
    for cache in (kc, vc):
        pages = torch.full((num_pages, page_size, *cache.shape[2:]), float("nan"), dtype=cache.dtype)
        for b in range(batch):
            pages[table[b].long()] = cache[b].view(per_seq, page_size, *cache.shape[2:])
        paged.append(pages)
    return paged[0], paged[1], table


def test_append_contiguous_and_paged_write_the_same_tokens():
    batch, cap, hkv, d, new, ps = 3, 64, 2, 8, 5, 16
    kc = torch.full((batch, cap, hkv, d), float("nan"), dtype=F64)
    vc = kc.clone()
    kp = torch.full((17, ps, hkv, d), float("nan"), dtype=F64)
    vp = kp.clone()
    table = torch.randperm(17)[:batch * 4].view(batch, 4).to(I32)
    assert not all((row[1:] - row[:-1] == 1).all() for row in table)  # non-consecutive pages
    # prefill lengths 0, 13, full - new; then append `new` tokens
    pre = [torch.randn(1, n, hkv, d, dtype=F64) for n in (0, 13, cap - new)]
    for b, p in enumerate(pre):
        idx = torch.tensor([b], dtype=I32)
        append_kv_ref(kc, vc, p, -p, 0, cache_batch_idx=idx)
        append_kv_ref(kp, vp, p, -p, 0, block_table=table[b:b + 1])
    seqlens = torch.tensor([p.shape[1] for p in pre], dtype=I32)
    k, v = torch.randn(batch, new, hkv, d, dtype=F64), torch.randn(batch, new, hkv, d, dtype=F64)
    append_kv_ref(kc, vc, k, v, seqlens)
    append_kv_ref(kp, vp, k, v, seqlens, block_table=table)
    got_c = gather_kv_ref(kc, vc, seqlens + new)
    got_p = gather_kv_ref(kp, vp, seqlens + new, block_table=table)
    for b in range(batch):
        want_k = torch.cat((pre[b], k[b:b + 1]), dim=1)
        want_v = torch.cat((-pre[b], v[b:b + 1]), dim=1)
        for (gk, gv) in (got_c[b], got_p[b]):
            assert gk.shape == (1, seqlens[b] + new, hkv, d)
            assert torch.equal(gk, want_k) and torch.equal(gv, want_v)
        assert torch.isnan(kc[b, seqlens[b] + new:]).all()  # nothing written past the new tokens
    unused = sorted(set(range(17)) - set(table.flatten().tolist()))
    assert torch.isnan(kp[unused]).all() and torch.isnan(vp[unused]).all()
    # gather returns copies
    got_c[1][0].zero_()
    assert not torch.equal(gather_kv_ref(kc, vc, seqlens + new)[1][0], got_c[1][0])


def test_append_and_gather_respect_cache_batch_idx_and_leftpad():
    kc = torch.full((5, 20, 1, 4), float("nan"), dtype=F64)
    vc = kc.clone()
    idx = torch.tensor([3, 0, 4], dtype=I32)
    lp = torch.tensor([2, 0, 6], dtype=I32)
    k, v = torch.randn(3, 4, 1, 4, dtype=F64), torch.randn(3, 4, 1, 4, dtype=F64)
    seqlens = torch.tensor([5, 16, 6], dtype=I32)  # seqlens >= leftpad: columns are absolute
    append_kv_ref(kc, vc, k, v, seqlens, cache_batch_idx=idx)
    assert torch.isnan(kc[[1, 2]]).all()
    for b, row in enumerate(idx.tolist()):
        assert torch.equal(kc[row, seqlens[b]:seqlens[b] + 4], k[b])
        assert torch.isnan(kc[row, :seqlens[b]]).all()
    kc[:, :, :, :] = kc.nan_to_num(7.0)
    vc[:, :, :, :] = vc.nan_to_num(7.0)
    got = gather_kv_ref(kc, vc, seqlens + 4, cache_batch_idx=idx, cache_leftpad=lp)
    for b, row in enumerate(idx.tolist()):
        assert torch.equal(got[b][0][0], kc[row, lp[b]:seqlens[b] + 4])
        assert torch.equal(got[b][1][0], vc[row, lp[b]:seqlens[b] + 4])


def test_append_rejects_overflow_and_bad_tables():
    kc, vc = torch.zeros(2, 16, 1, 4), torch.zeros(2, 16, 1, 4)
    k = torch.ones(2, 3, 1, 4)
    with pytest.raises(ValueError, match="capacity"):
        append_kv_ref(kc, vc, k, k, torch.tensor([0, 14], dtype=I32))
    assert (kc == 0).all()
    with pytest.raises(TypeError, match="block_table"):
        append_kv_ref(kc, vc, k, k, 0, block_table=torch.zeros(2, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="block_table"):
        append_kv_ref(kc, vc, k, k, 0, block_table=torch.tensor([[0], [2]], dtype=I32))
    with pytest.raises(ValueError, match="cache_batch_idx"):
        append_kv_ref(kc, vc, k, k, 0, block_table=torch.zeros(2, 1, dtype=I32),
                      cache_batch_idx=torch.zeros(2, dtype=I32))


# ---------------------------------------------------------------- attention

MODES = {
    "plain": {},
    "causal": dict(causal=True),
    "window": dict(window_size=(3, 1)),
    "causal-window": dict(causal=True, window_size=(4, -1)),
    "softcap": dict(softcap=2.0, causal=True),
    "alibi": dict(alibi=True),
}


def _direct(q, kc, vc, seqlens, k, v, kw, rows=None, leftpad=None):
    """attention_ref per sequence on the explicitly concatenated (old cache + new) keys."""
    batch = q.shape[0]
    kw = dict(kw)
    window = normalize_window(kw.pop("window_size", (-1, -1)), kw.pop("causal", False))
    outs, lses = [], []
    for b in range(batch):
        row = b if rows is None else int(rows[b])
        lo = 0 if leftpad is None else int(leftpad[b])
        keys, vals = kc[row:row + 1, lo:int(seqlens[b])], vc[row:row + 1, lo:int(seqlens[b])]
        if k is not None:
            keys, vals = torch.cat((keys, k[b:b + 1]), dim=1), torch.cat((vals, v[b:b + 1]), dim=1)
        slopes = kw.get("alibi_slopes")
        slopes = slopes[b] if slopes is not None and slopes.dim() == 2 else slopes
        o, lse = attention_ref(q[b:b + 1], keys, vals, window=window, softcap=kw.get("softcap", 0.0),
                               alibi_slopes=slopes, softmax_scale=kw.get("softmax_scale"))
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("seqlen_q,seqlen_new", [(1, 1), (1, 0), (4, 4), (3, 0), (2, 5)])
def test_kvcache_attention_matches_direct_attention(mode, group, seqlen_q, seqlen_new):
    batch, cap, hkv, d = 4, 24, 2, 16
    nheads = hkv * group
    q = torch.randn(batch, seqlen_q, nheads, d, dtype=F64)
    kc, vc = torch.randn(batch, cap, hkv, d, dtype=F64), torch.randn(batch, cap, hkv, d, dtype=F64)
    kc0, vc0 = kc.clone(), vc.clone()
    # empty, short, mid, and full after the append (cache_seqlens + new == capacity)
    seqlens = torch.tensor([0, 1, 11, cap - seqlen_new], dtype=I32)
    k = v = None
    if seqlen_new:
        k, v = torch.randn(batch, seqlen_new, hkv, d, dtype=F64), torch.randn(batch, seqlen_new, hkv, d, dtype=F64)
    kw = dict(MODES[mode])
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(batch, nheads, dtype=F64)
    out, lse = kvcache_attention_ref(q, kc, vc, k, v, cache_seqlens=seqlens, **kw)
    want_out, want_lse = _direct(q, kc0, vc0, seqlens, k, v, kw)
    assert out.shape == (batch, seqlen_q, nheads, d) and lse.shape == (batch, nheads, seqlen_q)
    assert torch.allclose(out, want_out, atol=1e-12, rtol=0)
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    assert torch.allclose(lse, want_lse, atol=1e-12, rtol=0)
    # the caches were appended in place and are otherwise unchanged
    for b in range(batch):
        s = int(seqlens[b])
        if k is not None:
            assert torch.equal(kc[b, s:s + seqlen_new], k[b]) and torch.equal(vc[b, s:s + seqlen_new], v[b])
        keep = torch.ones(cap, dtype=torch.bool)
        keep[s:s + seqlen_new] = False
        assert torch.equal(kc[b, keep], kc0[b, keep]) and torch.equal(vc[b, keep], vc0[b, keep])
    if seqlen_new == 0:  # sequence 0 sees no key at all
        assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()


@pytest.mark.parametrize("kw", [{}, dict(causal=True), dict(window_size=(2, 2), softcap=1.5)], ids=str)
def test_kvcache_paged_equals_contiguous(kw):
    batch, cap, hkv, d, ps, new = 3, 48, 2, 8, 16, 3
    q = torch.randn(batch, 3, 4, d, dtype=F64)
    kc, vc = torch.randn(batch, cap, hkv, d, dtype=F64), torch.randn(batch, cap, hkv, d, dtype=F64)
    kp, vp, table = _paged_copy(kc, vc, ps, 11)
    k, v = torch.randn(batch, new, hkv, d, dtype=F64), torch.randn(batch, new, hkv, d, dtype=F64)
    cos, sin, _ = _rotary_tables(cap, 8, F64)
    seqlens = torch.tensor([0, 20, cap - new], dtype=I32)
    leftpad = torch.tensor([0, 7, 30], dtype=I32)
    common = dict(k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=seqlens, cache_leftpad=leftpad, **kw)
    out_c, lse_c = kvcache_attention_ref(q, kc, vc, **common)
    out_p, lse_p = kvcache_attention_ref(q, kp, vp, block_table=table, **common)
    assert torch.equal(out_c, out_p) and torch.equal(lse_c, lse_p)
    for b, (gk, gv) in enumerate(gather_kv_ref(kp, vp, seqlens + new, block_table=table)):
        assert torch.equal(gk[0], kc[b, :seqlens[b] + new]) and torch.equal(gv[0], vc[b, :seqlens[b] + new])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("kw", [{}, dict(causal=True), dict(window_size=(5, 0))], ids=str)
def test_kvcache_rotary_positions(interleaved, kw):
    """New keys rotate at cache_seqlens + i; queries at cache_seqlens + i with a mask, else all at
    cache_seqlens. Combined with cache_batch_idx and cache_leftpad (columns stay absolute)."""
    batch, cap, hkv, d, new, rd = 2, 32, 1, 16, 3, 8
    q = torch.randn(batch, new, 2, d, dtype=F64)
    kc, vc = torch.randn(4, cap, hkv, d, dtype=F64), torch.randn(4, cap, hkv, d, dtype=F64)
    kc0, vc0 = kc.clone(), vc.clone()
    k, v = torch.randn(batch, new, hkv, d, dtype=F64), torch.randn(batch, new, hkv, d, dtype=F64)
    cos, sin, theta = _rotary_tables(cap, rd, F64)
    seqlens = torch.tensor([9, 20], dtype=I32)
    rows = torch.tensor([2, 0], dtype=I32)
    leftpad = torch.tensor([4, 0], dtype=I32)
    out, lse = kvcache_attention_ref(q, kc, vc, k, v, cos, sin, cache_seqlens=seqlens, cache_batch_idx=rows,
                                     cache_leftpad=leftpad, rotary_interleaved=interleaved, **kw)
    k_pos = seqlens.long()[:, None] + torch.arange(new)
    q_pos = k_pos if kw else seqlens.long()[:, None].expand(batch, new)
    k_rot = _rotary_complex(k, theta, k_pos, interleaved)
    q_rot = _rotary_complex(q, theta, q_pos, interleaved)
    for b in range(batch):
        assert torch.allclose(kc[rows[b], seqlens[b]:seqlens[b] + new], k_rot[b], atol=1e-12)
        assert torch.equal(vc[rows[b], seqlens[b]:seqlens[b] + new], v[b])  # v is never rotated
    want_out, want_lse = _direct(q_rot, kc0, vc0, seqlens, k_rot, v, kw, rows=rows, leftpad=leftpad)
    assert torch.allclose(out, want_out, atol=1e-10) and torch.allclose(lse, want_lse, atol=1e-10)


def test_kvcache_empty_rows_and_dtypes():
    q = torch.randn(2, 5, 4, 8, dtype=torch.bfloat16)
    kc, vc = torch.randn(2, 16, 2, 8, dtype=torch.bfloat16), torch.randn(2, 16, 2, 8, dtype=torch.bfloat16)
    out, lse = kvcache_attention_ref(q, kc, vc, cache_seqlens=torch.tensor([0, 2], dtype=I32), causal=True,
                                     upcast=False)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert (out[0] == 0).all() and torch.isneginf(lse[0]).all()  # empty cache
    assert (out[1, :3] == 0).all() and torch.isneginf(lse[1, :, :3]).all()  # causal rows before the keys
    assert torch.isfinite(lse[1, :, 3:]).all()
    out64, lse64 = kvcache_attention_ref(q, kc, vc, cache_seqlens=2)
    assert out64.dtype == F64 and lse64.dtype == F64 and torch.isfinite(lse64).all()
    # cache_seqlens=None: the whole cache is valid
    full, _ = kvcache_attention_ref(q, kc, vc)
    assert torch.allclose(full, kvcache_attention_ref(q, kc, vc, cache_seqlens=16)[0])


def test_kvcache_validation():
    q = torch.randn(2, 1, 4, 8)
    kc = torch.randn(2, 16, 2, 8)
    k = torch.randn(2, 1, 2, 8)
    with pytest.raises(ValueError, match="cache_seqlens"):
        kvcache_attention_ref(q, kc, kc.clone(), k, k)
    with pytest.raises(ValueError, match="k and v"):
        kvcache_attention_ref(q, kc, kc.clone(), k, None, cache_seqlens=0)
    with pytest.raises(ValueError, match="multiple"):
        kvcache_attention_ref(torch.randn(2, 1, 3, 8), kc, kc.clone(), cache_seqlens=1)
    with pytest.raises(ValueError, match="head dim"):
        kvcache_attention_ref(torch.randn(2, 1, 4, 4), kc, kc.clone(), cache_seqlens=1)
    with pytest.raises(ValueError, match="cache_seqlens"):
        kvcache_attention_ref(q, kc, kc.clone(), cache_seqlens=torch.tensor([1, 2, 3], dtype=I32))
    with pytest.raises(ValueError, match="capacity"):
        kvcache_attention_ref(q, kc, kc.clone(), k, k, cache_seqlens=16)
    with pytest.raises(ValueError, match="alibi_slopes"):
        kvcache_attention_ref(q, kc, kc.clone(), cache_seqlens=1, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="rotary"):
        kvcache_attention_ref(q, kc, kc.clone(), cache_seqlens=1, rotary_cos=torch.ones(16, 4))


# ---------------------------------------------------------------- PagePool

def _check_invariants(pool):
    held = [p for s in pool.sequences() for p in pool.pages(s)]
    assert len(held) == len(set(held)), "a page is held twice"
    assert sorted(held + pool._free) == list(range(pool.num_pages)), "pages leaked or duplicated"
    for s in pool.sequences():
        assert 0 <= pool.seqlen(s) <= pool.capacity(s) == len(pool.pages(s)) * pool.page_size


@pytest.mark.parametrize("page_size", [24, 0, -16, 8, 16.0])
def test_pool_rejects_bad_page_size(page_size):
    with pytest.raises(ValueError, match="page_size"):
        PagePool(4, page_size, 1, 8)


def test_pool_allocate_grow_free_reuse():
    pool = PagePool(6, 16, 2, 8, dtype=F64)
    assert pool.k_pages.shape == (6, 16, 2, 8) == pool.v_pages.shape and pool.k_pages.dtype == F64
    a, b = pool.add_sequence(), pool.add_sequence()
    assert a != b and pool.seqlen(a) == 0 and pool.capacity(a) == 0
    pool.reserve(a, 1)
    assert pool.pages(a) == [0] and pool.capacity(a) == 16 and pool.seqlen(a) == 0
    pool.reserve(a, 16)  # idempotent within the page: still one page
    assert pool.pages(a) == [0]
    pool.reserve(b, 20)
    assert pool.pages(b) == [1, 2]
    pool.commit(a, 16)
    pool.reserve(a, 1)
    assert pool.pages(a) == [0, 3] and pool.seqlen(a) == 16
    pool.commit(a, 1)
    assert pool.num_free_pages == 2
    _check_invariants(pool)
    pool.free(b)
    assert pool.num_free_pages == 4
    with pytest.raises(KeyError, match=str(b)):
        pool.seqlen(b)
    c = pool.add_sequence()
    assert c not in (a, b)  # ids are never reused
    pool.reserve(c, 40)
    assert pool.pages(c) == [1, 2, 4]  # b's pages come back first, in their order
    _check_invariants(pool)
    with pytest.raises(ValueError, match="capacity"):
        pool.commit(c, 49)
    pool.commit(c, 40)
    pool.free(a)
    pool.free(c)
    assert pool.num_free_pages == 6 and pool.sequences() == []


def test_pool_over_large_reserve_changes_nothing():
    pool = PagePool(5, 16, 1, 4)
    a, b = pool.add_sequence(), pool.add_sequence()
    pool.reserve(a, 33)
    pool.commit(a, 30)
    before = (list(pool._free), pool.pages(a), pool.pages(b), pool.seqlen(a), pool.seqlen(b))
    with pytest.raises(OutOfPagesError, match="out of pages: need 3, have 2 free"):
        pool.reserve(b, 40)
    with pytest.raises(RuntimeError, match="out of pages: need 4, have 2 free"):
        pool.reserve(a, 70)  # 30 + 70 = 100 tokens = 7 pages, holds 3
    assert (list(pool._free), pool.pages(a), pool.pages(b), pool.seqlen(a), pool.seqlen(b)) == before
    pool.reserve(b, 32)  # exactly what is left still works
    assert pool.num_free_pages == 0
    _check_invariants(pool)


def test_pool_unknown_ids_and_bad_counts():
    pool = PagePool(2, 16, 1, 4)
    for call in (pool.seqlen, pool.free, pool.capacity, lambda s: pool.reserve(s, 1), lambda s: pool.commit(s, 0),
                 lambda s: pool.block_table([s]), lambda s: pool.cache_seqlens([s])):
        with pytest.raises(KeyError, match="42"):
            call(42)
    s = pool.add_sequence()
    with pytest.raises(ValueError, match="n_tokens"):
        pool.reserve(s, -1)
    with pytest.raises(ValueError, match="n_tokens"):
        pool.commit(s, 1.5)


def test_pool_block_table_and_cache_seqlens():
    pool = PagePool(8, 32, 1, 4)
    s = [pool.add_sequence() for _ in range(3)]
    pool.reserve(s[0], 70)
    pool.commit(s[0], 70)
    pool.reserve(s[2], 10)
    pool.commit(s[2], 3)
    bt = pool.block_table(s)
    assert bt.dtype == I32 and bt.shape == (3, 3)
    assert bt.tolist() == [[0, 1, 2], [0, 0, 0], [3, 0, 0]]  # padded with 0
    assert pool.block_table([s[2], s[0]]).tolist() == [[3, 0, 0], [0, 1, 2]]
    assert pool.block_table([s[1]]).shape == (1, 1)  # at least one column
    assert pool.block_table(s, max_pages=5).shape == (3, 5)
    with pytest.raises(ValueError, match="max_pages"):
        pool.block_table(s, max_pages=2)
    cs = pool.cache_seqlens(s)
    assert cs.dtype == I32 and cs.tolist() == [70, 0, 3]
    assert pool.cache_seqlens([]).shape == (0,)


def test_pool_random_cycles_keep_invariants():
    rng = random.Random(0)
    pool = PagePool(12, 16, 1, 4)
    live = []
    for _ in range(400):
        op = rng.random()
        if op < 0.2 or not live:
            live.append(pool.add_sequence())
        elif op < 0.35:
            pool.free(live.pop(rng.randrange(len(live))))
        else:
            s = rng.choice(live)
            n = rng.randrange(0, 40)
            free_before, len_before, pages_before = pool.num_free_pages, pool.seqlen(s), pool.pages(s)
            try:
                pool.reserve(s, n)
            except OutOfPagesError:
                assert pool.num_free_pages == free_before and pool.pages(s) == pages_before
                continue
            # exactly the pages needed, never more; the earlier pages stay in place
            assert pool.capacity(s) == max(len(pages_before), -(-(len_before + n) // 16)) * 16
            assert pool.pages(s)[:len(pages_before)] == pages_before
            pool.commit(s, rng.randrange(0, n + 1))
        _check_invariants(pool)


def test_pool_decode_loop_matches_attention_over_history():
    """Prefill sequences of different lengths, decode with reserve -> kvcache call -> commit, free one
    mid-way and start another on its pages: every step equals attention over the stored history."""
    hkv, d, nheads = 2, 8, 4
    pool = PagePool(10, 16, hkv, d, dtype=F64)
    cos, sin, _ = _rotary_tables(160, d, F64)
    history = {}

    def prefill(n):
        s = pool.add_sequence()
        k, v = torch.randn(n, hkv, d, dtype=F64), torch.randn(n, hkv, d, dtype=F64)
        pool.append(s, k, v)
        history[s] = (k, v)
        return s

    ids = [prefill(n) for n in (5, 16, 30)]
    for step in range(20):
        if step == 8:
            pool.free(ids.pop(1))
            ids.append(prefill(17))
        for s in ids:
            pool.reserve(s, 1)
        q = torch.randn(len(ids), 1, nheads, d, dtype=F64)
        k, v = torch.randn(len(ids), 1, hkv, d, dtype=F64), torch.randn(len(ids), 1, hkv, d, dtype=F64)
        seqlens = pool.cache_seqlens(ids)
        out, lse = kvcache_attention_ref(q, pool.k_pages, pool.v_pages, k, v, cos, sin, cache_seqlens=seqlens,
                                         block_table=pool.block_table(ids), causal=True)
        for s in ids:
            pool.commit(s, 1)
        for b, s in enumerate(ids):
            hk, hv = history[s]
            pos = torch.tensor([[int(seqlens[b])]])
            k_rot = apply_rotary_ref(k[b:b + 1], cos, sin, pos, True)[0]
            history[s] = (torch.cat((hk, k_rot)), torch.cat((hv, v[b])))
            q_rot = apply_rotary_ref(q[b:b + 1], cos, sin, pos, True)
            want, want_lse = attention_ref(q_rot, history[s][0][None], history[s][1][None], window=(-1, 0))
            assert torch.allclose(out[b:b + 1], want, atol=1e-12) and torch.allclose(lse[b:b + 1], want_lse, atol=1e-12)
            assert pool.seqlen(s) == history[s][0].shape[0]
        _check_invariants(pool)
    for s in list(ids):
        pool.free(s)
    assert pool.num_free_pages == 10
