"""A value head dim of its own (``v.shape[-1] != q.shape[-1]``, MLA's 192 / 128 for training and
576 / 512 for decoding): forward, backward, varlen and decoding against the float64 oracle, on the
CPU path and the Triton kernels (the interpreter without a GPU), the plans that decline it, and the
refused calls. The shapes are small versions of MLA's (48 / 32, 96 / 64, and a V wider than q and
not a power of two, 32 / 40), and one decode at MLA's real head dims over a short cache."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from conftest import (DEVICE, assert_lse_close, assert_matches_oracles, assert_varlen_sequences,
                      assert_within_torch_error, attention_oracles, child_env, rotary_tables)

import ioattn
from ioattn.decode import decode_config, explain_decode, flash_attn_with_kvcache
from ioattn.kvcache import PagePool
from ioattn.plan import dispatch, hopper, hopper_bwd
from ioattn.plan.decode import head_blocks
from ioattn.reference.decode import kvcache_attention_ref
from ioattn.semantics import Semantics

BACKENDS = ["reference", "triton"]
I32 = torch.int32
F16 = torch.float16

pytestmark = pytest.mark.usefixtures("one_thread")


def _qkv(b, sq, sk, h, hk, d, dv, dtype=F16):
    q = torch.randn(b, sq, h, d, device=DEVICE).to(dtype)
    k = torch.randn(b, sk, hk, d, device=DEVICE).to(dtype)
    v = torch.randn(b, sk, hk, dv, device=DEVICE).to(dtype)
    return q, k, v


def _grads(fn, q, k, v, dout):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    return out.detach(), torch.autograd.grad(out, (q, k, v), dout)


# ---------------------------------------------------------------- forward and backward

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("d,dv", [(48, 32), (96, 64), (32, 40)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_backward_match_oracle(backend, d, dv, causal, poison_alloc):
    """GQA (4 query heads, 2 KV heads), seqlen_q != seqlen_k; the output has V's head dim."""
    q, k, v = _qkv(2, 37, 45, 4, 2, d, dv)
    dout = torch.randn(2, 37, 4, dv, device=DEVICE).to(F16)
    with dispatch.forced_backend(backend):
        out, grads = _grads(lambda *t: ioattn.flash_attn_func(*t, causal=causal), q, k, v, dout)
        _, lse, _ = ioattn.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
    assert out.shape == (2, 37, 4, dv)
    oracles = attention_oracles(q, k, v, dout, window=(-1, 0) if causal else (-1, -1))
    assert_matches_oracles(f"{backend} {d}/{dv}", out, grads, oracles)
    assert_lse_close(f"{backend} {d}/{dv} lse", lse, oracles["lse64"].float())


@pytest.mark.parametrize("backend", BACKENDS)
def test_varlen_matches_each_sequence(backend, poison_alloc):
    """Packed sequences (one without keys, one without queries) and tokens past the last sequence."""
    d, dv, h, hk = 48, 32, 4, 2
    cu_q = torch.tensor([0, 20, 20, 53, 60], dtype=I32, device=DEVICE)
    cu_k = torch.tensor([0, 0, 17, 60, 75], dtype=I32, device=DEVICE)
    q = torch.randn(64, h, d, device=DEVICE).to(F16)
    k = torch.randn(80, hk, d, device=DEVICE).to(F16)
    v = torch.randn(80, hk, dv, device=DEVICE).to(F16)
    dout = torch.randn(64, h, dv, device=DEVICE).to(F16)
    with dispatch.forced_backend(backend):
        def run(q, k, v):
            return ioattn.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 33, 43, causal=True, return_attn_probs=True)
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out, lse, _ = run(*leaves)
        grads = torch.autograd.grad(out, leaves, dout)
    assert out.shape == (64, h, dv) and (out[60:] == 0).all()
    assert_varlen_sequences(f"{backend} varlen", q, k, v, dout, out.detach(), lse, grads, cu_q, cu_k,
                            window=(-1, 0))


def test_fp8_forward_with_a_value_head_dim_of_its_own(poison_alloc):
    """e4m3 q, k, v with their descales, V's head dim 24 against q's 40: within the FP8 bound of float64
    attention over the dequantised inputs (tests/test_fp8_forward.py's), on the Triton kernel."""
    from test_fp8_forward import _bound, _check, _dequant

    from ioattn.reference import fp8 as ref8
    g = torch.Generator().manual_seed(5)
    tensors = (torch.randn(1, 33, 4, 40, generator=g, dtype=torch.float64),
               torch.randn(1, 50, 2, 40, generator=g, dtype=torch.float64),
               torch.randn(1, 50, 2, 24, generator=g, dtype=torch.float64))
    pairs = [tuple(x.to(DEVICE) for x in ref8.quantize_fp8_ref(t, "head")) for t in tensors]
    with dispatch.forced_backend("triton"):
        out = ioattn.flash_attn_func(*(t for t, _ in pairs), causal=True, q_descale=pairs[0][1],
                                     k_descale=pairs[1][1], v_descale=pairs[2][1])
    assert out.shape == (1, 33, 4, 24)
    _check(out, *_bound(*_dequant(pairs), (-1, 0)))


# ---------------------------------------------------------------- the plans and refused calls

def test_gluon_plans_decline_and_say_why():
    """The Gluon forward, backward and FP8 forward take one head dim: their plans decline first, with
    the reason explain_dispatch shows, and the portable kernels run."""
    q, k, v = _qkv(1, 64, 64, 4, 2, 192, 128, torch.bfloat16)
    sem = Semantics(192 ** -0.5, (-1, 0))
    for ok, why in (hopper.fwd_plan(q, k, v, False, sem, None), hopper.call_supported(q, k, v, False, sem, None),
                    hopper.hopper_supports(q, k, v, False, sem, None), hopper.fp8_fwd_plan(q, k, v, False, sem, None),
                    hopper_bwd.bwd_plan(q, k, v, False, sem, None, 64),
                    hopper_bwd.bwd_call_supported(q, k, v, False, sem, None)):
        assert not ok and why.startswith("portable: value head dim differs (v 128, q and k 192)"), why
    with hopper.prefer_hopper(True), hopper_bwd.prefer_hopper_bwd(True):  # declined even where asked for
        assert not hopper.fwd_plan(q, k, v, False, sem, None)[0]
        assert not hopper_bwd.bwd_plan(q, k, v, False, sem, None, 64)[0]
    with dispatch.forced_backend("triton"):
        plan = ioattn.explain_dispatch(q.half(), k.half(), v.half(), causal=True)
    assert "value head dim differs" in plan.forward["gluon_hopper"], plan.describe()
    assert "value head dim differs" in plan.backward["gluon_hopper"], plan.describe()
    assert plan.forward["head_dim_padded"] == 256 and plan.forward["value_head_dim_padded"] == 128
    with dispatch.forced_backend("reference"):  # the tiled PyTorch route (for CUDA tensors, for that reason)
        why = "cuda tensors" if q.is_cuda else "value head dim differs"
        assert why in ioattn.explain_dispatch(q, k, v).forward["route"]


def test_tiles_of_the_larger_head_dim():
    """The portable kernels' tiles for 192 / 128 are 256's (K's tile the wider); dv == d unchanged."""
    dev = torch.device("cuda")
    assert dispatch.tiles("fwd", 192, dev, headdim_v=128) == dispatch.tiles("fwd", 256, dev)
    assert dispatch.tiles("bwd", 64, dev, headdim_v=256) == dispatch.tiles("bwd", 256, dev)
    assert dispatch.tiles("fwd", 64, dev, headdim_v=None) == dispatch.tiles("fwd", 64, dev)


def _ok(d=48, dv=32):
    return _qkv(2, 8, 8, 4, 2, d, dv)


BAD = {
    "kv_seqlen": (lambda q, k, v: (q, k, v[:, :5]), "k and v must agree in all but the head dim"),
    "kv_heads": (lambda q, k, v: (q, k, v[:, :, :1]), "k and v must agree in all but the head dim"),
    "dv_too_wide": (lambda q, k, v: (q, k, torch.zeros(*v.shape[:3], 257, dtype=v.dtype, device=v.device)),
                    r"value head dim \(v.shape\[-1\]\) must be between 1 and 256"),
    "dv_zero": (lambda q, k, v: (q, k, v[..., :0]), r"value head dim \(v.shape\[-1\]\) must be between 1 and 256"),
    "qk_dims": (lambda q, k, v: (q[..., :40], k, v), "q and k must have the same head dim"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_shapes_are_refused_with_the_shapes(case):
    make, msg = BAD[case]
    q, k, v = make(*_ok())
    with pytest.raises(ValueError, match=msg) as e:
        ioattn.flash_attn_func(q, k, v)
    assert f"v {tuple(v.shape)}" in str(e.value)


# ---------------------------------------------------------------- decoding

def _decode_case(d, dv, nheads, nheads_kv, paged, shared=False, batch=2, capacity=48, seqlen_new=2, seqlen_q=1,
                 rotary_dim=None, dtype=torch.float32):
    """Keyword arguments of one flash_attn_with_kvcache call; ``shared``: v_cache is k_cache's first dv
    columns (MLA's latent cache) and the new v the new k's."""
    g = torch.Generator().manual_seed(d + dv + paged)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(DEVICE)

    kw = {}
    if paged:
        page_size, pages = 16, -(-capacity // 16)
        perm = torch.randperm(batch * pages + 2, generator=g)[:batch * pages]
        kw["block_table"] = perm.view(batch, pages).to(I32).to(DEVICE)
        lead = (batch * pages + 2, page_size, nheads_kv)
    else:
        lead = (batch, capacity, nheads_kv)
    kw["k_cache"] = rnd(*lead, d)
    kw["v_cache"] = kw["k_cache"][..., :dv] if shared else rnd(*lead, dv)
    kw["q"] = rnd(batch, seqlen_q, nheads, d)
    kw["k"] = rnd(batch, seqlen_new, nheads_kv, d)
    kw["v"] = kw["k"][..., :dv].clone() if shared else rnd(batch, seqlen_new, nheads_kv, dv)
    kw["cache_seqlens"] = torch.tensor([capacity - seqlen_new, 7], dtype=I32)[:batch].to(DEVICE)
    if rotary_dim:
        kw["rotary_cos"], kw["rotary_sin"], _ = rotary_tables(capacity + seqlen_q, rotary_dim, device=DEVICE)
    kw["causal"] = True
    return kw


def _clone(kw):
    """A copy of the call's tensors; a shared v_cache stays a view of the copied k_cache."""
    out = {n: t.clone() if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
    if kw["v_cache"].data_ptr() == kw["k_cache"].data_ptr():
        out["v_cache"] = out["k_cache"][..., :kw["v_cache"].shape[-1]]
    return out


def _check_decode(kw, backend, num_splits=0):
    ref_kw, same_kw, got_kw = _clone(kw), _clone(kw), _clone(kw)
    out64, lse64 = kvcache_attention_ref(**ref_kw)
    out_t, _ = kvcache_attention_ref(**same_kw, upcast=False)
    with dispatch.forced_backend(backend):
        out, lse = flash_attn_with_kvcache(**got_kw, num_splits=num_splits, return_softmax_lse=True)
    name = f"{backend} splits={num_splits}"
    assert out.shape == (*kw["q"].shape[:3], kw["v_cache"].shape[-1]), name
    for c in ("k_cache", "v_cache"):  # the append wrote exactly what the reference's did
        assert torch.equal(got_kw[c], ref_kw[c]), f"{name}: {c} differs after the append"
    assert_within_torch_error(f"{name} out", out, out64, out_t)
    assert_lse_close(f"{name} lse", lse, lse64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
def test_decode_matches_oracle(backend, paged, poison_alloc):
    """48 / 32, GQA 3, two query tokens with a causal append and rotary on q and the new k (rotary_dim
    < d), split and unsplit."""
    kw = _decode_case(48, 32, 6, 2, paged, seqlen_q=2, rotary_dim=16)
    for splits in (1, 3):
        _check_decode(kw, backend, splits)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
def test_mla_decode_real_head_dims(backend, paged, poison_alloc):
    """MLA's decoding at its real head dims over a short cache: q and the latent keys 576 wide, V the
    cache's first 512 columns (one KV head, 4 query heads); the kernel takes q.k as 512 + 64 columns."""
    kw = _decode_case(576, 512, 4, 1, paged, shared=True, capacity=40)
    _check_decode(kw, backend, 3)


@pytest.mark.parametrize("paged", [False, True])
def test_decode_tma_loads(paged, poison_alloc):
    """K and V through tensor descriptors of their own widths (64 and 32)."""
    kw = _decode_case(64, 32, 4, 2, paged)
    with decode_config(use_tma=True):
        assert explain_decode(kw["q"], kw["k_cache"], kw["v_cache"], kw["cache_seqlens"],
                              kw.get("block_table"))["plan"]["use_tma"] == dispatch.use_triton(kw["q"].device)
        _check_decode(kw, "triton", 2)


def test_mla_decode_plan_and_v_loaded_on_its_own(poison_alloc):
    """The plan names the two q.k blocks and V's head dim; V a view of K's columns (the latent cache)
    and a copy of them are read alike: the same plan, the same result."""
    assert head_blocks(576) == (512, 64) and head_blocks(128) == (128, 0) and head_blocks(200) == (256, 0)
    kw = _decode_case(576, 512, 4, 1, False, shared=True, capacity=32, seqlen_new=0)
    del kw["k"], kw["v"]
    with dispatch.forced_backend("triton"):
        latent = explain_decode(kw["q"], kw["k_cache"], kw["v_cache"], kw["cache_seqlens"])
        assert "two blocks of 512 + 64" in latent["reason"] and "value head dim 512" in latent["reason"], latent
        copy = explain_decode(kw["q"], kw["k_cache"], kw["v_cache"].contiguous(), kw["cache_seqlens"])
        assert copy["plan"] == latent["plan"], (copy, latent)
        first = flash_attn_with_kvcache(**kw)
        assert torch.equal(first, flash_attn_with_kvcache(**dict(kw, v_cache=kw["v_cache"].contiguous())))


def _new_kv_bad_dv(kw):
    kw["v"] = kw["v"][..., :16]
    return kw


def _v_cache_too_wide(kw):
    kw["v_cache"] = torch.zeros(*kw["v_cache"].shape[:3], 520, device=DEVICE)
    return kw


def _k_cache_too_wide(kw):
    kw["k_cache"] = torch.zeros(*kw["k_cache"].shape[:3], 600, device=DEVICE)
    kw["q"] = torch.zeros(*kw["q"].shape[:3], 600, device=DEVICE)
    kw["k"] = torch.zeros(*kw["k"].shape[:3], 600, device=DEVICE)
    return kw


def _caches_disagree(kw):
    kw["v_cache"] = kw["v_cache"][:, :-16]
    return kw


DECODE_BAD = {
    "new_v_dim": (_new_kv_bad_dv, "k and v must both be .* k_cache's head dim 48 and v_cache's 32"),
    "v_cache_too_wide": (_v_cache_too_wide, r"value head dim \(v_cache.shape\[-1\]\) must be between 1 and 512"),
    "k_cache_too_wide": (_k_cache_too_wide, "head dim must be between 1 and 576"),
    "caches_disagree": (_caches_disagree, "k_cache and v_cache must agree in all but the head dim"),
}


@pytest.mark.parametrize("case", list(DECODE_BAD))
def test_decode_bad_input_leaves_the_caches(case):
    make, msg = DECODE_BAD[case]
    kw = make(_clone(_decode_case(48, 32, 4, 2, False)))
    before = kw["k_cache"].clone(), kw["v_cache"].clone()
    with pytest.raises(ValueError, match=msg) as e:
        flash_attn_with_kvcache(**kw)
    assert "v_cache" in str(e.value) or "v " in str(e.value) or "k_cache" in str(e.value)
    assert torch.equal(kw["k_cache"], before[0]) and torch.equal(kw["v_cache"], before[1])


def test_page_pool_with_a_value_head_dim():
    pool = PagePool(num_pages=4, page_size=16, nheads_kv=1, headdim=48, headdim_v=32, dtype=torch.float32)
    assert pool.k_pages.shape[-1] == 48 and pool.v_pages.shape[-1] == 32
    s = pool.add_sequence()
    k, v = torch.randn(20, 1, 48), torch.randn(20, 1, 32)
    pool.append(s, k, v)
    assert torch.equal(pool.v_pages[pool.pages(s)].flatten(0, 1)[:20], v)
    with pytest.raises(ValueError, match=r"v \(n, 1, 32\)"):
        pool.append(s, k, torch.randn(20, 1, 48))
    assert pool.seqlen(s) == 20  # the refused append changed nothing


def test_torch_compile_shapes():
    """torch.compile(fullgraph=True) traces the ops with the output in V's head dim (their fake
    implementations), forward, backward and decoding, and gives the eager results."""
    q, k, v = (t.float().requires_grad_() for t in _qkv(1, 16, 16, 4, 2, 48, 32))
    f = torch.compile(lambda q, k, v: ioattn.flash_attn_func(q, k, v, causal=True), fullgraph=True)
    out = f(q, k, v)
    (dv,) = torch.autograd.grad(out.sum(), (v,))
    assert out.shape == (1, 16, 4, 32) and dv.shape == v.shape
    assert torch.equal(out, ioattn.flash_attn_func(q, k, v, causal=True))
    kc = torch.randn(1, 32, 1, 64, device=DEVICE)
    qd = torch.randn(1, 1, 4, 64, device=DEVICE)
    g = torch.compile(lambda q, kc: flash_attn_with_kvcache(q, kc, kc[..., :32], cache_seqlens=20), fullgraph=True)
    assert torch.equal(g(qd, kc), flash_attn_with_kvcache(qd, kc, kc[..., :32], cache_seqlens=20))


# ---------------------------------------------------------------- the MLA benchmark sweep

def test_latent_decode_sweep_counts_the_latent_bytes(monkeypatch):
    """The ``mla`` sweep's machinery on the CPU (a small latent shape): records valid, checked against
    the oracle, GB/s counting K's bytes alone (V is its first columns)."""
    from ioattn.bench import report
    from ioattn.bench import run as bench_run

    small = bench_run.DecodeSweep(cases=((1, 64),), nheads=4, nheads_kv=1, headdims=(48,), headdim_v=32, latent=True,
                                  providers=("ioattn",))
    monkeypatch.setitem(bench_run.CPU_DECODE, "mla", small)
    records = bench_run.run_decode_sweep("mla", "cpu", "fp32", log=lambda s: None, rounds=1)
    (rec,) = records
    assert rec["ok"] and rec["headdim_v"] == 32 and rec["latent"] and report.validate(rec) == []
    assert rec["gbps"] == pytest.approx(64 * 48 * 4 / rec["ms"] / 1e6)
    assert bench_run.DecodeShape(1, 64, 4, 1, 48, 32).kv_bytes(4) == 64 * 80 * 4


# ---------------------------------------------------------------- the GPU compiler (no GPU needed)

_AOT_SCRIPT = """
import sys
sys.path.insert(0, "tools")
from compile_check import compile_one
from gluon_aot import ptxas_report
from ioattn.kernels.backward import attn_bwd_dkdv_kernel, attn_bwd_dq_kernel
from ioattn.kernels.decode import decode_split_kernel
from ioattn.kernels.forward import attn_fwd_kernel
from ioattn.plan import decode, dispatch
# MLA's decode launch as the plan makes it on a GPU (576 = 512 + 64, V read as its own tile): no spills, fits
# shared memory
c = dict(HEAD_DIM=576, BLOCK_D=512, BLOCK_D_TAIL=64, HEAD_DIM_V=512, BLOCK_DV=512,
         BLOCK_M=decode.WIDE_HEAD_BLOCK_M, BLOCK_N=decode.WIDE_HEAD_BLOCK_N, PAGE_SIZE=1, PAGED=False,
         HAS_BATCH_IDX=False, HAS_LEFTPAD=False, HAS_SOFTCAP=False, HAS_ALIBI=False, USE_TMA=False, UNIFIED=False,
         PHI_BELOW=64.0, PHI_ABOVE=64.0, HAS_SEQLENS=True)
# as the device compiles it: aligned pointers and strides (the JIT's divisibility hints)
aligned = [n for n in decode_split_kernel.arg_names if n not in c and not n.endswith("_desc")
           and (n[0].isupper() or (n.startswith("stride_") and n[-1] in "bmhnsl"))]
_, shared, k = compile_one(decode_split_kernel, c, decode.WIDE_HEAD_WARPS, decode.WIDE_HEAD_STAGES, divisible=aligned)
regs, spills, _, _ = ptxas_report(k.asm["ptx"])
print("mla decode: registers", regs, "spills", spills, "shared", shared)
assert spills == 0 and shared <= 232448, (regs, spills, shared)
# fp32 caches (the most shared memory): the plan's smaller tiles fit
c.update(BLOCK_N=decode.WIDE_HEAD_FP32_BLOCK_N)
_, shared, _ = compile_one(decode_split_kernel, c, decode.WIDE_HEAD_WARPS, decode.WIDE_HEAD_FP32_STAGES, dtype="fp32",
                           divisible=aligned)
assert shared <= 232448, shared
# 192 / 128 training launches at their tiles (256's)
for fn, kind in ((attn_fwd_kernel, "fwd"), (attn_bwd_dkdv_kernel, "bwd"), (attn_bwd_dq_kernel, "bwd")):
    cfg = dispatch._FWD_TILES[256] if kind == "fwd" else dispatch._BWD_TILES[256]
    c = dict(HEAD_DIM=192, BLOCK_D=256, HEAD_DIM_V=128, BLOCK_DV=128, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
             IS_VARLEN=False, HAS_SOFTCAP=False, HAS_ALIBI=False, HAS_DROPOUT=False)
    if fn is attn_fwd_kernel:
        c.update(USE_TMA=False)
    _, shared, k = compile_one(fn, c, cfg.num_warps, cfg.num_stages)
    assert shared <= 232448, (fn.__name__, shared)
print("value head dim kernels compiled for sm_90")
"""


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_kernels_compile_for_sm90():
    """MLA's decode launch (the plan's WIDE_HEAD_* tiles) compiles for sm_90 without spills, and the
    192 / 128 forward and backward fit shared memory (in a child process without the interpreter)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], cwd=root, env=child_env(), capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "value head dim kernels compiled for sm_90" in proc.stdout
