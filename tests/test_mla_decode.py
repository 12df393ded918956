"""The Gluon MLA decode kernel (``ioattn.kernels.hopper_mla``): its plan's rules on the CPU (which calls it
takes, which it leaves to the split kernel and why, its split count), its sm_90 compile (no GPU), and on
an sm_90 GPU its output and lse against the float64 oracle over latent caches whose unused slots hold
NaN, contiguous and paged, causal appends, split counts from 1 to past the tiles."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from conftest import assert_lse_close, assert_within_torch_error, child_env

from ioattn.decode import decode_config, explain_decode, flash_attn_with_kvcache
from ioattn.plan import decode as decode_plan
from ioattn.reference.decode import kvcache_attention_ref

ROOT = pathlib.Path(__file__).resolve().parents[1]
I32 = torch.int32
BF16 = torch.bfloat16
SM90 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _call(batch, nheads, seqlen_q, capacity, seqlens, paged, device="cpu", page_size=64, dtype=BF16, seed=0):
    """Keyword arguments of an MLA decode call (576 / 512, one KV head, V the latent cache's first 512
    columns, ``seqlen_q`` new tokens appended at ``seqlens``); every cache slot past a sequence's end
    after the append is NaN."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(device)

    kw = {}
    if paged:
        pages = -(-capacity // page_size)
        perm = torch.randperm(batch * pages + 3, generator=g)[:batch * pages]
        kw["block_table"] = perm.view(batch, pages).to(I32).to(device)
        cache = rnd(batch * pages + 3, page_size, 1, 576)
    else:
        cache = rnd(batch, capacity, 1, 576)
    kw["k_cache"], kw["v_cache"] = cache, cache[..., :512]
    ends = [s + seqlen_q for s in seqlens]
    for b, end in enumerate(ends):  # the slots no key of sequence b occupies: NaN
        cols = torch.arange(end, capacity if not paged else kw["block_table"].shape[1] * page_size)
        if paged:
            pages_b = kw["block_table"][b].long().cpu()
            cache[pages_b[cols // page_size].to(device), (cols % page_size).to(device)] = float("nan")
        else:
            cache[b, cols.to(device)] = float("nan")
    kw["q"] = rnd(batch, seqlen_q, nheads, 576)
    kw["k"] = rnd(batch, seqlen_q, 1, 576)
    kw["v"] = kw["k"][..., :512].clone()
    kw["cache_seqlens"] = torch.tensor(seqlens, dtype=I32).to(device)
    kw["causal"] = True
    return kw


def _clone(kw):
    out = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    out["v_cache"] = out["k_cache"][..., :512]
    return out


# ---------------------------------------------------------------- the plan (CPU)

@pytest.fixture
def on_hopper(monkeypatch):
    """The plan's rules as on an sm_90 GPU with the Gluon kernels on (the device test is elsewhere)."""
    monkeypatch.setattr(decode_plan, "_mla_device_why_not", lambda device: "")
    decode_plan._PLANS.clear()
    yield
    decode_plan._PLANS.clear()


def _plan(kw, features=(), num_splits=0, span=None):
    paged = "block_table" in kw
    span = span or (kw["block_table"].shape[1] * kw["k_cache"].shape[1] if paged else kw["k_cache"].shape[1])
    return decode_plan.plan(kw["q"], kw["k_cache"], kw["v_cache"], paged, span, num_splits, features)


def test_plan_takes_mla_calls(on_hopper):
    """Batch 1 at 128 heads: two row blocks, the splits fill 132 SMs once; batch 66: no split; the
    call's own split count stands; a paged cache of 64-token pages too."""
    kw = _call(1, 128, 1, 32768, [100], False)
    cfg = _plan(kw)
    assert (cfg.kernel, cfg.block_m, cfg.block_n, cfg.num_stages, cfg.num_warps) == ("mla", 64, 64, 2, 8), cfg
    assert cfg.num_splits == 66 and "one program an SM" in cfg.reason, cfg
    assert _plan(_call(66, 128, 1, 64, [1] * 66, False)).num_splits == 1
    assert _plan(kw, num_splits=5).num_splits == 5
    assert _plan(kw, span=128).num_splits == 2  # at least one key tile a split
    assert _plan(_call(2, 16, 1, 256, [3, 4], True)).kernel == "mla"


@pytest.mark.parametrize("case,reason", [
    ("window", "does not take a sliding window"), ("fp32", "16-bit"), ("copy", "v_cache must be that view"),
    ("page32", "page size that 64 divides"), ("forced", "kernel='split' forced"), ("gqa", None),
    ("batch", "at most 65535 sequences")])
def test_plan_declines_with_the_reason(case, reason, on_hopper):
    """Calls the kernel does not take go to the split kernel, whose reason says why first; calls of
    other shapes (two KV heads) say nothing about it."""
    kw = _call(1, 16, 1, 256, [10], case == "page32", page_size=32, dtype=torch.float32 if case == "fp32" else BF16)
    features = ()
    if case == "window":
        features = ("window",)
    elif case == "copy":
        kw["v_cache"] = kw["v_cache"].contiguous()
    elif case == "batch":
        kw["q"] = kw["q"].expand(65536, -1, -1, -1)
    elif case == "gqa":
        kw["k_cache"] = kw["k_cache"].expand(-1, -1, 2, -1).contiguous()
        kw["v_cache"] = kw["k_cache"][..., :512]
    if case == "forced":
        with decode_config(kernel="split"):
            cfg = _plan(kw)
    else:
        cfg = _plan(kw, features)
    assert cfg.kernel == "split", cfg
    if reason is None:
        assert "MLA" not in cfg.reason, cfg.reason
    else:
        assert cfg.reason.startswith("split kernel: ") and reason in cfg.reason.split(";")[0], cfg.reason


def test_decode_config_refuses_an_unknown_kernel():
    with pytest.raises(ValueError, match="kernel must be 'split' or 'mla'"):
        with decode_config(kernel="gluon"):
            pass


def test_plan_off_hopper_says_why():
    kw = _call(1, 16, 1, 128, [10], False)
    assert decode_plan.mla_why_not(kw["q"], kw["k_cache"], kw["v_cache"], False) == "the MLA kernel needs an sm_90 GPU"


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.gluon
def test_mla_kernel_compiles_for_sm90():
    """The plan's builds (paged, split, causal and not) fit shared memory, do not spill, and issue every
    product by wgmma (the script's assertions)."""
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "compile_check_mla.py"), "--quick"], cwd=ROOT,
                          env=child_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("mla block_n=")]
    assert len(lines) == 2 and all("spill=0B" in line for line in lines), lines


# ---------------------------------------------------------------- the kernel (sm_90)

def _check(kw, num_splits=0):
    ref_kw, same_kw, got_kw = _clone(kw), _clone(kw), _clone(kw)
    out64, lse64 = kvcache_attention_ref(**ref_kw)
    out_t, _ = kvcache_attention_ref(**same_kw, upcast=False)
    plan = explain_decode(got_kw["q"], got_kw["k_cache"], got_kw["v_cache"], got_kw["cache_seqlens"],
                          got_kw.get("block_table"), num_splits)
    assert plan["plan"]["kernel"] == "mla", plan
    out, lse = flash_attn_with_kvcache(**got_kw, num_splits=num_splits, return_softmax_lse=True)
    name = f"splits={num_splits}"
    for c in ("k_cache",):  # the append wrote exactly what the reference's did (NaN slots compare equal)
        assert torch.equal(got_kw[c].nan_to_num(7.0), ref_kw[c].nan_to_num(7.0)), f"{name}: {c} after the append"
    assert_within_torch_error(f"{name} out", out, out64, out_t)
    assert_lse_close(f"{name} lse", lse, lse64)


@pytest.mark.skipif(not SM90, reason="the Gluon MLA kernel: an sm_90 GPU")
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("nheads,seqlen_q", [(128, 1), (16, 2), (40, 3)])
def test_mla_decode_matches_oracle(paged, nheads, seqlen_q, poison_alloc):
    """Three sequences ending off the tiles (one in its first tile), row blocks that the packed rows
    fill in part, and split counts: one, the plan's, more splits than some sequences have tiles."""
    kw = _call(3, nheads, seqlen_q, 700, [650, 3, 64 * 5 - seqlen_q], paged, device="cuda", seed=nheads + paged)
    for splits in (1, 0, 7):
        _check(kw, splits)


@pytest.mark.skipif(not SM90, reason="the Gluon MLA kernel: an sm_90 GPU")
def test_mla_decode_fp16_without_new_tokens(poison_alloc):
    """fp16, no append, cache_seqlens an int, non-causal."""
    kw = _call(2, 32, 1, 300, [200, 200], False, device="cuda", dtype=torch.float16, seed=5)
    del kw["k"], kw["v"]
    kw["cache_seqlens"], kw["causal"] = 201, False
    out64, lse64 = kvcache_attention_ref(**_clone(kw))
    out_t, _ = kvcache_attention_ref(**_clone(kw), upcast=False)
    out, lse = flash_attn_with_kvcache(**_clone(kw), return_softmax_lse=True)
    assert_within_torch_error("fp16 out", out, out64, out_t)
    assert_lse_close("fp16 lse", lse, lse64)


@pytest.mark.skipif(not SM90, reason="the Gluon MLA kernel: an sm_90 GPU")
def test_mla_decode_q_not_aligned_or_contiguous(poison_alloc):
    """q as a strided view and at an address off 16 bytes: the launch takes a copy, the result stands."""
    kw = _call(1, 16, 1, 256, [100], False, device="cuda", seed=9)
    del kw["k"], kw["v"]
    wide = torch.randn(1, 1, 16, 578, device="cuda", dtype=BF16)
    for q in (wide[..., 1:577], torch.randn(2 * 16 * 576 + 1, device="cuda", dtype=BF16)[1:].view(2, 1, 16, 576)[:1]):
        assert q.data_ptr() % 16 or not q.is_contiguous()
        call = dict(_clone(kw), q=q)
        out64, _ = kvcache_attention_ref(**dict(_clone(call), q=q.clone()))
        out_t, _ = kvcache_attention_ref(**dict(_clone(call), q=q.clone()), upcast=False)
        assert_within_torch_error("q view", flash_attn_with_kvcache(**call), out64, out_t)
