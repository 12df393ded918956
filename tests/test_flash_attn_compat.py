"""flash-attn 2.8 compatibility: every public signature argument for argument, the refusal of what
ioattn lacks, and ``S_dmask`` in flash-attn's layout (what flash-attn's own tests rebuild the
probabilities from). Runs without flash-attn: its parameter lists are written here as data."""
from __future__ import annotations

import inspect
import math
import sys
from pathlib import Path

import pytest
import torch

import ioattn
from conftest import assert_within_torch_error, attention_oracles, max_err
from ioattn.api import attn_probs_block_n
from ioattn.masks import alibi_bias, keep_mask

FP16, BF16 = torch.float16, torch.bfloat16
REQUIRED = inspect.Parameter.empty

_COMMON_TAIL = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False)]

# flash-attn 2.8.0 .. 2.8.3 (flash_attn/flash_attn_interface.py): (name, default) in order
FLASH_ATTN_2_8 = {
    "flash_attn_func": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED)] + _COMMON_TAIL,
    "flash_attn_qkvpacked_func": [("qkv", REQUIRED)] + _COMMON_TAIL,
    "flash_attn_kvpacked_func": [("q", REQUIRED), ("kv", REQUIRED)] + _COMMON_TAIL,
    "flash_attn_varlen_func": [("q", REQUIRED), ("k", REQUIRED), ("v", REQUIRED), ("cu_seqlens_q", REQUIRED),
                               ("cu_seqlens_k", REQUIRED), ("max_seqlen_q", REQUIRED), ("max_seqlen_k", REQUIRED)]
                              + _COMMON_TAIL + [("block_table", None)],
    "flash_attn_varlen_qkvpacked_func": [("qkv", REQUIRED), ("cu_seqlens", REQUIRED), ("max_seqlen", REQUIRED)]
                                        + _COMMON_TAIL,
    "flash_attn_varlen_kvpacked_func": [("q", REQUIRED), ("kv", REQUIRED), ("cu_seqlens_q", REQUIRED),
                                        ("cu_seqlens_k", REQUIRED), ("max_seqlen_q", REQUIRED),
                                        ("max_seqlen_k", REQUIRED)] + _COMMON_TAIL,
    "flash_attn_with_kvcache": [("q", REQUIRED), ("k_cache", REQUIRED), ("v_cache", REQUIRED), ("k", None),
                                ("v", None), ("rotary_cos", None), ("rotary_sin", None), ("cache_seqlens", None),
                                ("cache_batch_idx", None), ("cache_leftpad", None), ("block_table", None),
                                ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
                                ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None),
                                ("num_splits", 0), ("return_softmax_lse", False)],
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN_2_8))
def test_signature_is_flash_attn_2_8(name):
    params = list(inspect.signature(getattr(ioattn, name)).parameters.values())
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert [(p.name, p.default) for p in positional] == FLASH_ATTN_2_8[name]
    # anything beyond flash-attn's arguments is keyword-only with a default, so that no call written
    # for flash-attn (positional or keyword) means something else here
    for p in params[len(positional):]:
        assert p.kind == p.KEYWORD_ONLY and p.default is not REQUIRED, f"{name}: {p}"


def _varlen_args(lens_q, lens_k, h=2, hk=1, d=16, dtype=FP16):
    cu = lambda lens: torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)  # noqa: E731
    q = torch.randn(sum(lens_q), h, d, dtype=dtype)
    k, v = (torch.randn(sum(lens_k), hk, d, dtype=dtype) for _ in range(2))
    return q, k, v, cu(lens_q), cu(lens_k), max(lens_q), max(lens_k)


def test_varlen_block_table_none_is_accepted():
    q, k, v, cq, ck, mq, mk = _varlen_args([5, 9], [7, 3])
    ref = ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True)
    assert torch.equal(ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, causal=True, block_table=None), ref)
    # positionally too, in flash-attn's place (after return_attn_probs)
    out = ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, 0.0, None, True, (-1, -1), 0.0, None, False,
                                        False, None)
    assert torch.equal(out, ref)


def test_varlen_paged_kv_is_refused_by_name():
    q, k, v, cq, ck, mq, mk = _varlen_args([5, 9], [7, 3])
    block_table = torch.zeros(2, 1, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match=r"block_table.*paged KV cache"):
        ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, block_table=block_table)
    # refused before anything else is looked at
    with pytest.raises(NotImplementedError, match="block_table"):
        ioattn.flash_attn_varlen_func(q, k, v, None, None, mq, mk, block_table=block_table)


def test_no_dropout_returns_an_empty_s_dmask():
    q = torch.randn(1, 9, 2, 16, dtype=FP16)
    out, lse, s_dmask = ioattn.flash_attn_func(q, q, q, return_attn_probs=True)
    assert s_dmask.shape == (0,) and s_dmask.dtype == FP16
    q, k, v, cq, ck, mq, mk = _varlen_args([5, 9], [7, 3])
    assert ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, return_attn_probs=True)[2].shape == (0,)


def test_attn_probs_block_n():
    # flash-attn's key block widths with dropout, by head dim
    widths = {d: attn_probs_block_n(d) for d in (16, 32, 40, 64, 80, 96, 111, 128, 160, 256)}
    assert widths == {16: 128, 32: 128, 40: 64, 64: 64, 80: 64, 96: 64, 111: 32, 128: 32, 160: 64, 256: 64}


# ---- S_dmask: rebuilding the probabilities as flash-attn's test helpers do ----

def _scores64(q, k, window, alibi_slopes):
    """float64 (batch, nheads, seqlen_q, seqlen_k) scores at the default scale, -inf where masked."""
    h, hk, d = q.shape[2], k.shape[2], q.shape[3]
    k = k.double().repeat_interleave(h // hk, dim=2)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k) / math.sqrt(d)
    sq, sk = s.shape[-2:]
    s = s.masked_fill(~keep_mask(sq, sk, window), float("-inf"))
    if alibi_slopes is not None:
        s = s + alibi_bias(alibi_slopes.double(), sq, sk)
    return s


def _rebuild(s_dmask, scores64, block_n):
    """The probabilities and the keep mask from ``S_dmask``, by the steps of flash-attn's test helpers
    (its documented layout): drop the padding and the masked entries, read the mask from the sign,
    and scale each ``block_n`` wide block of keys by ``exp(m - lse)``, ``m`` the row maximum of the
    scores over that block and the blocks after it."""
    sq, sk = scores64.shape[-2:]
    s = s_dmask[:, :, :sq, :sk].double().masked_fill(torch.isneginf(scores64), 0.0)
    keep = s >= 0
    lse = torch.logsumexp(scores64, dim=-1)
    lse = torch.where(torch.isneginf(lse), float("inf"), lse)  # a row with no key: exp(m - inf) = 0
    blocks = scores64.split(block_n, dim=-1)
    block_max = torch.stack([b.amax(-1) for b in blocks], dim=-1)
    m = block_max.flip(-1).cummax(-1).values.flip(-1)
    probs = torch.cat([a * torch.exp(m[..., j] - lse)[..., None]
                       for j, a in enumerate(s.abs().split(block_n, dim=-1))], dim=-1)
    return probs, keep


def _softmax64(scores64):
    return torch.softmax(scores64, dim=-1).nan_to_num(0.0)  # rows with no visible key: 0


_ATOL = {FP16: 2e-3, BF16: 1.6e-2}


@pytest.mark.parametrize("b,sq,sk,h,hk,d,causal,window,alibi,dtype", [
    (2, 50, 100, 2, 1, 128, False, (-1, -1), False, FP16),  # four 32-wide key blocks
    (1, 77, 140, 2, 2, 64, True, (40, -1), True, BF16),  # 64-wide blocks, a window, ALiBi
    (2, 40, 40, 1, 1, 32, False, (10, 5), False, FP16),  # one 128-wide block
    (1, 70, 30, 2, 1, 40, True, (-1, -1), False, FP16),  # rows that see no key
])
def test_s_dmask_rebuilds_the_reference_probabilities(b, sq, sk, h, hk, d, causal, window, alibi, dtype):
    p = 0.2
    q, k, v = torch.randn(b, sq, h, d, dtype=dtype), torch.randn(b, sk, hk, d, dtype=dtype), \
        torch.randn(b, sk, hk, d, dtype=dtype)
    slopes = torch.rand(b, h) * 0.3 if alibi else None
    out, lse, s_dmask = ioattn.flash_attn_func(q, k, v, p, causal=causal, window_size=window, alibi_slopes=slopes,
                                               return_attn_probs=True)
    # layout: (batch, nheads, lengths rounded up to 128), q's dtype, zero padding
    rounded = lambda n: -(-n // 128) * 128  # noqa: E731
    assert s_dmask.shape == (b, h, rounded(sq), rounded(sk)) and s_dmask.dtype == dtype
    assert (s_dmask[:, :, sq:] == 0).all() and (s_dmask[..., sk:] == 0).all()
    norm_window = (window[0], 0) if causal else window
    scores64 = _scores64(q, k, norm_window, slopes)
    assert (s_dmask[:, :, :sq, :sk][torch.isneginf(scores64)] == 0).all()  # masked entries are 0

    block_n = attn_probs_block_n(d)
    probs, keep = _rebuild(s_dmask, scores64, block_n)
    assert max_err(probs, _softmax64(scores64)) < _ATOL[dtype]
    if block_n < sk:
        # the block structure matters: read as one block, the same values are not the probabilities
        wrong, _ = _rebuild(s_dmask, scores64, sk)
        assert max_err(wrong, _softmax64(scores64)) > 5 * _ATOL[dtype]

    # the sign gives the dropout mask the kernel applied: the output recomputed with it matches
    visible = ~torch.isneginf(scores64)
    dropped = (~keep & visible).sum().item() / visible.sum().item()
    assert abs(dropped - p) < 0.05, dropped
    oracles = attention_oracles(q, k, v, torch.zeros_like(q), window=norm_window, alibi_slopes=slopes,
                                dropout_p=p, dropout_keep=keep)
    assert_within_torch_error("out with the mask read from S_dmask", out, oracles["out64"], oracles["out_t"])


def test_s_dmask_varlen_layout_and_probabilities():
    p, d = 0.25, 40  # 64-wide key blocks
    lens_q, lens_k = [37, 0, 70], [60, 9, 130]
    q, k, v, cq, ck, mq, mk = _varlen_args(lens_q, lens_k, h=2, hk=1, d=d)
    out, lse, s_dmask = ioattn.flash_attn_varlen_func(q, k, v, cq, ck, mq, mk, p, causal=True,
                                                      return_attn_probs=True)
    assert s_dmask.shape == (3, 2, 128, 256) and s_dmask.dtype == FP16
    for i, (lq, lk) in enumerate(zip(lens_q, lens_k)):
        # each sequence from row and column 0, zero beyond its lengths
        assert (s_dmask[i, :, lq:] == 0).all() and (s_dmask[i, :, :, lk:] == 0).all()
        if lq == 0:
            continue
        qi, ki, vi = (t[c[i]:c[i + 1]][None] for t, c in ((q, cq), (k, ck), (v, ck)))
        scores64 = _scores64(qi, ki, (-1, 0), None)
        probs, keep = _rebuild(s_dmask[i:i + 1], scores64, attn_probs_block_n(d))
        assert max_err(probs, _softmax64(scores64)) < _ATOL[FP16], f"sequence {i}"
        oracles = attention_oracles(qi, ki, vi, torch.zeros_like(qi), window=(-1, 0), dropout_p=p,
                                    dropout_keep=keep)
        assert_within_torch_error(f"sequence {i} out", out[cq[i]:cq[i + 1]][None], oracles["out64"],
                                  oracles["out_t"])


# ---- the flash_attn stand-in used to run flash-attn's test suite (tests/flash_attn_shim) ----

@pytest.fixture
def shim():
    """Imports ``flash_attn`` from tests/flash_attn_shim, and forgets it again afterwards (a real
    flash-attn, where installed, is what the benchmarks import under that name)."""
    path = str(Path(__file__).parent / "flash_attn_shim")
    saved = {n: m for n, m in sys.modules.items() if n == "flash_attn" or n.startswith("flash_attn.")}
    for n in saved:
        del sys.modules[n]
    sys.path.insert(0, path)
    try:
        import flash_attn
        assert Path(flash_attn.__file__).is_relative_to(path)
        yield flash_attn
    finally:
        sys.path.remove(path)
        for n in [n for n in sys.modules if n == "flash_attn" or n.startswith("flash_attn.")]:
            del sys.modules[n]
        sys.modules.update(saved)


def test_shim_resolves_to_ioattn(shim):
    import flash_attn.flash_attn_interface as fai

    for name in FLASH_ATTN_2_8:
        assert getattr(shim, name) is getattr(ioattn, name) is getattr(fai, name)
    assert fai._get_block_size_n(None, 59, True, False) == attn_probs_block_n(59)


def test_shim_padding_round_trip(shim):
    from flash_attn.bert_padding import pad_input, unpad_input

    x = torch.randn(3, 6, 2, 4)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    packed, indices, cu, max_len, used = unpad_input(x, mask)
    assert packed.shape == (10, 2, 4) and torch.equal(packed, x[mask])
    assert cu.tolist() == [0, 3, 9, 10] and cu.dtype == torch.int32 and max_len == 6 and used.tolist() == [3, 6, 1]
    back = pad_input(packed, indices, 3, 6)
    assert torch.equal(back, x * mask[..., None, None])


def test_shim_rotary_offsets(shim):
    from flash_attn.layers.rotary import apply_rotary_emb

    x = torch.randn(2, 3, 1, 8)
    angle = torch.rand(10, 2)
    out = apply_rotary_emb(x, angle.cos(), angle.sin(), seqlen_offsets=torch.tensor([0, 4]))
    # sequence 1, token 0 takes row 4; GPT-NeoX halves: features (0, 2) and (1, 3) rotate together
    c, s = angle[4].cos(), angle[4].sin()
    x1, x2 = x[1, 0, 0, :2], x[1, 0, 0, 2:4]
    torch.testing.assert_close(out[1, 0, 0, :4], torch.cat([x1 * c - x2 * s, x1 * s + x2 * c]))
    assert torch.equal(out[..., 4:], x[..., 4:])
