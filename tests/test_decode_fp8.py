"""flash_attn_with_kvcache over FP8 (e4m3) caches: the split-KV kernel (under the interpreter without a
GPU) and the PyTorch path against the float64 reference of the dequantised cache, the quantising
append, the agreement with a 16-bit decode of the same values, the plan, and refused calls.

Accuracy: the reference ``kvcache_attention_ref(k_descale=, v_descale=)`` attends over ``fp8 *
descale`` in float64; the kernel must stay within twice the error of PyTorch's attention in q's
dtype over the same dequantised values (``upcast=False``: those values rounded to q's dtype). The
kernel holds the e4m3 values exactly (every e4m3 value is a bf16 / fp16 value) and applies the
descales in float32, so it has no error the 16-bit computation lacks."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, assert_lse_close, assert_within_torch_error, child_env
from test_decode import _clone, _make_case

import ioattn
from ioattn.decode import decode_config, flash_attn_with_kvcache
from ioattn.plan import dispatch
from ioattn.reference.decode import kvcache_attention_ref

E4M3 = torch.float8_e4m3fn
BACKENDS = ["triton", "reference"]

pytestmark = pytest.mark.usefixtures("one_thread", "poison_alloc")


def _descale(form, batch, nheads_kv, spread=1.0):
    """Random positive descales of one form: per (sequence, KV head), per KV head (1, nheads_kv) or
    one scalar tensor; about 1/64 times ``spread`` so that e4m3 values near 64 dequantise near 1."""
    shape = {"bh": (batch, nheads_kv), "head": (1, nheads_kv), "tensor": ()}[form]
    return ((0.5 + torch.rand(shape)) * spread / 64).to(DEVICE)


def _fp8_case(dtype=torch.bfloat16, descale="bh", **case):
    """``test_decode._make_case``'s call (q, new k/v in ``dtype``) with FP8 caches of random e4m3
    values (the whole range, never NaN) and their descales."""
    kw = _make_case(dtype=dtype, **case)
    for name in ("k_cache", "v_cache"):
        kw[name] = (torch.randn(kw[name].shape) * 64).clamp(-448, 448).to(E4M3).to(DEVICE)
    batch, nheads_kv = kw["q"].shape[0], kw["k_cache"].shape[2]
    kw["k_descale"], kw["v_descale"] = (_descale(descale, batch, nheads_kv) for _ in range(2))
    return kw


def _same_bytes(a, b):
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def _check(kw, backend, num_splits=0, **call):
    """The call against the float64 reference of the dequantised cache (after the same append)."""
    ref64_kw, ref_t_kw, got_kw = _clone(kw), _clone(kw), _clone(kw)
    out64, lse64 = kvcache_attention_ref(**ref64_kw)
    out_t, _ = kvcache_attention_ref(**ref_t_kw, upcast=False)
    with dispatch.forced_backend(backend):
        out, lse = flash_attn_with_kvcache(**got_kw, num_splits=num_splits, return_softmax_lse=True, **call)
    name = f"fp8 {backend} splits={num_splits}"
    assert out.shape == kw["q"].shape and out.dtype == kw["q"].dtype, name
    for c in ("k_cache", "v_cache"):
        assert got_kw[c].dtype == E4M3 and _same_bytes(got_kw[c], ref64_kw[c]), f"{name}: {c} differs after the append"
    assert_within_torch_error(f"{name} out", out, out64, out_t)
    assert_lse_close(f"{name} lse", lse, lse64)
    empty = torch.isneginf(lse64).transpose(1, 2)
    assert (out[empty] == 0).all(), f"{name}: rows with no visible key are not 0"


CASES = {
    "contiguous": {},
    "paged": {"paged": True},
    "gqa4_q3_causal": {"group": 4, "seqlen_q": 3, "seqlen_new": 3, "causal": True},
    "paged_gqa4_fp16_head": {"paged": True, "group": 4, "dtype": torch.float16, "descale": "head", "seqlen_q": 2,
                             "seqlen_new": 2, "causal": True},
    "no_append_tensor": {"new_kv": False, "descale": "tensor", "seqlen_q": 2, "causal": True},
    "paged_no_append": {"paged": True, "new_kv": False, "group": 1},
    "batch_idx_leftpad_rotary": {"batch_idx": True, "leftpad": True, "rotary": "neox", "seqlen_q": 2,
                                 "seqlen_new": 2, "causal": True},
    "softcap_alibi_window": {"softcap": 4.0, "alibi": "heads", "window": (20, 0), "seqlen_q": 2, "seqlen_new": 1},
}


@pytest.mark.interpreter
@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_fp8_kernel_matches_reference(case, num_splits):
    _check(_fp8_case(**CASES[case]), "triton", num_splits)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", ["contiguous", "paged", "batch_idx_leftpad_rotary", "softcap_alibi_window"])
def test_fp8_torch_path_matches_reference(case):
    _check(_fp8_case(**CASES[case]), "reference")


@pytest.mark.interpreter
@pytest.mark.parametrize("paged", [False, True])
def test_fp8_tail_split_and_unified_max(paged):
    """Whole units next to split ones (the descales indexed by the right sequence in both), and the
    unified max, whose phi is compared with scores that include k_descale."""
    kw = _fp8_case(paged=paged, group=2, seqlen_q=1)
    with decode_config(num_whole=2, num_splits=3):
        _check(kw, "triton")
    _check(kw, "triton", 2, unified_max=2.0)


@pytest.mark.interpreter
@pytest.mark.parametrize("case", ["paged", "batch_idx_leftpad_rotary"])
def test_fp8_tma_loads(case):
    """K/V tiles through tensor descriptors over the e4m3 cache, converted after the load."""
    with decode_config(use_tma=True):
        _check(_fp8_case(**CASES[case]), "triton", 2)


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
def test_append_quantises_only_the_new_rows(backend, paged):
    """The new rows hold value / descale of their (sequence, KV head), clamped to ±448 and rounded to
    nearest even (1.0625 -> 1 and 1.1875 -> 1.25 are ties; 500 and -1e4 saturate, never NaN);
    every other byte of both caches is unchanged."""
    kw = _fp8_case(paged=paged, batch_idx=not paged, seqlen_new=3, descale="bh")
    kw["k_descale"] = kw["k_descale"].log2().round().exp2()  # powers of two: the ties stay ties
    kw["k"][0, 0, 0, :5] = torch.tensor([1.0625, 1.1875, -1.0625, 500.0, -1e4], dtype=kw["k"].dtype)
    kw["k"][0, 0, 0, :5] *= kw["k_descale"][0, 0].to(kw["k"].dtype)
    before = {c: kw[c].clone() for c in ("k_cache", "v_cache")}
    with dispatch.forced_backend(backend):
        flash_attn_with_kvcache(**kw)
    for c, new, descale in (("k_cache", kw["k"], kw["k_descale"]), ("v_cache", kw["v"], kw["v_descale"])):
        expected = before[c].clone()
        for b in range(new.shape[0]):
            for t in range(new.shape[1]):
                col = int(kw["cache_seqlens"][b]) + t
                if paged:
                    where = (int(kw["block_table"][b, col // kw[c].shape[1]]), col % kw[c].shape[1])
                else:
                    where = (int(kw["cache_batch_idx"][b]), col)
                scaled = new[b, t].float() / descale[b].float()[:, None]
                expected[where] = scaled.clamp(-448, 448).to(E4M3)
        assert _same_bytes(kw[c], expected), f"{c}: the append wrote other bytes than the new rows' e4m3 values"
        assert not torch.isnan(kw[c].float()).any(), f"{c}: NaN in the cache"
    assert int(kw["cache_seqlens"][0]) == 0  # (_make_case's mixed lengths): sequence 0's new rows come first
    first = (int(kw["block_table"][0, 0]), 0) if paged else (int(kw["cache_batch_idx"][0]), 0)
    got = kw["k_cache"][first][0, :5].float().tolist()
    assert got == [1.0, 1.25, -1.0, 448.0, -448.0], got


@pytest.mark.interpreter
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("descale", ["bh", "tensor"])
def test_fp8_equals_16bit_decode_of_the_dequantised_cache(backend, descale):
    """With power-of-two descales the dequantised cache is exact in bf16 and scaling by the descales
    commutes with every rounding: the FP8 decode and the bf16 decode of the dequantised cache give
    the same bits (output and lse), split or not."""
    kw = _fp8_case(descale=descale, new_kv=False, group=2, seqlen_q=2, causal=True)
    for name in ("k_descale", "v_descale"):
        kw[name] = kw[name].log2().round().exp2()
    batch, nheads_kv = kw["q"].shape[0], kw["k_cache"].shape[2]
    ref = _clone(kw)
    for c, s in (("k_cache", ref.pop("k_descale")), ("v_cache", ref.pop("v_descale"))):
        scale = s.expand(batch, nheads_kv)[:, None, :, None]
        ref[c] = (ref[c].float() * scale).to(torch.bfloat16)
        assert torch.equal(ref[c].float(), kw[c].float() * scale), "the dequantised cache is not exact in bf16"
    for num_splits in (1, 3):
        with dispatch.forced_backend(backend):
            out8, lse8 = flash_attn_with_kvcache(**_clone(kw), num_splits=num_splits, return_softmax_lse=True)
            out16, lse16 = flash_attn_with_kvcache(**_clone(ref), num_splits=num_splits, return_softmax_lse=True)
        assert not torch.isnan(out8).any()
        assert torch.equal(out8, out16) and torch.equal(lse8, lse16), (backend, num_splits)


# ---------------------------------------------------------------- refused calls

def _with(kw, **changes):
    kw = dict(kw)
    kw.update(changes)
    return kw


def _bf16_caches(kw):
    return _with(kw, k_cache=kw["k_cache"].to(kw["q"].dtype), v_cache=kw["v_cache"].to(kw["q"].dtype))


BAD = {
    "k_descale_missing": (lambda kw: _with(kw, k_descale=None), ValueError, "k_descale is required"),
    "v_descale_missing": (lambda kw: _with(kw, v_descale=None), ValueError, "v_descale is required"),
    "descale_shape": (lambda kw: _with(kw, k_descale=torch.ones(4, 2, device=DEVICE)), ValueError,
                      r"k_descale must broadcast to \(3, 2\), got shape \(4, 2\)"),
    "descale_query_heads": (lambda kw: _with(kw, v_descale=torch.ones(3, 4, device=DEVICE)), ValueError,
                            r"v_descale must broadcast to \(3, 2\), got shape \(3, 4\)"),
    "descale_dtype": (lambda kw: _with(kw, k_descale=torch.ones(3, 2, dtype=torch.int32, device=DEVICE)), TypeError,
                      "k_descale must be a floating-point tensor"),
    "descale_not_tensor": (lambda kw: _with(kw, v_descale=0.5), TypeError, "v_descale must be a torch.Tensor"),
    "descale_device": (lambda kw: _with(kw, k_descale=torch.ones(3, 2, device="meta")), ValueError,
                       "k_descale must be on the inputs' device"),
    "descale_nan": (lambda kw: _with(kw, k_descale=kw["k_descale"].index_fill(1, torch.tensor([1], device=kw["k_descale"].device), float("nan"))),
                    ValueError, "k_descale must hold finite positive values"),
    "descale_inf": (lambda kw: _with(kw, v_descale=kw["v_descale"] * float("inf")), ValueError,
                    "v_descale must hold finite positive values"),
    "descale_zero": (lambda kw: _with(kw, v_descale=kw["v_descale"].index_fill(0, torch.tensor([2], device=kw["v_descale"].device), 0.0)),
                     ValueError, "v_descale must hold finite positive values"),
    "descale_negative": (lambda kw: _with(kw, k_descale=-kw["k_descale"]), ValueError,
                         "k_descale must hold finite positive values"),
    "descale_with_bf16_caches": (lambda kw: _with(_bf16_caches(kw), v_descale=None), ValueError,
                                 "k_descale is only for FP8"),
    "v_descale_with_bf16_caches": (lambda kw: _with(_bf16_caches(kw), k_descale=None), ValueError,
                                   "v_descale is only for FP8"),
    "one_cache_fp8": (lambda kw: _with(kw, v_cache=kw["v_cache"].to(kw["q"].dtype)), TypeError,
                      "must both be FP8"),
    "q_float32": (lambda kw: _with(kw, q=kw["q"].float(), k=kw["k"].float(), v=kw["v"].float()), TypeError,
                  "q must be float16 or bfloat16 with FP8 caches"),
    "q_headdim": (lambda kw: _with(kw, q=kw["q"][..., :16]), ValueError, "same head dim"),
    "k_fp8": (lambda kw: _with(kw, k=kw["k"].to(E4M3), v=kw["v"].to(E4M3)), TypeError, "k must have q's dtype"),
}


@pytest.mark.interpreter
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("case", list(BAD))
def test_refused_before_anything_changes(case, paged):
    """Each bad call raises a clear error naming the argument, before the append: both caches keep
    every byte."""
    kw = _fp8_case(batch=3, paged=paged)
    make, exc, msg = BAD[case]
    bad = make(_clone(kw))
    before = (bad["k_cache"].clone(), bad["v_cache"].clone())
    with pytest.raises(exc, match=msg):
        flash_attn_with_kvcache(**bad)
    assert _same_bytes(bad["k_cache"], before[0]) and _same_bytes(bad["v_cache"], before[1]), \
        "a refused call changed the cache"


@pytest.mark.interpreter
def test_descale_values_read_only_with_check_values(monkeypatch):
    """The descales' value check reads the device: it runs where ``check_values`` asks for value
    checks, for both descales, and not otherwise."""
    import ioattn.decode

    seen = []
    monkeypatch.setattr(ioattn.decode, "check_descale_values", lambda name, t: seen.append(name))
    kw = _fp8_case(new_kv=False)
    with dispatch.forced_backend("reference"):
        flash_attn_with_kvcache(**_clone(kw))
        assert seen == ["k_descale", "v_descale"]
        flash_attn_with_kvcache(**_clone(kw), check_values=False)
    assert seen == ["k_descale", "v_descale"]


# ---------------------------------------------------------------- plan, explain, torch.compile

@pytest.mark.interpreter
def test_explain_decode_shows_the_fp8_cache(monkeypatch):
    """The plan knows the cache is FP8 (``kv_fp8``, in the reasons too); on a GPU the 128-key tile read
    through pointers at 16 packed rows is register-capped for FP8 caches only (faked GPU queries)."""
    import types

    from ioattn.plan import decode
    kw = _fp8_case(new_kv=False)
    got = ioattn.explain_decode(kw["q"], kw["k_cache"], kw["v_cache"], cache_seqlens=kw["cache_seqlens"])
    assert got["path"] == "triton" and got["plan"]["kv_fp8"] and "FP8 (e4m3) cache" in got["reason"]
    bf16 = ioattn.explain_decode(kw["q"], kw["k_cache"].bfloat16(), kw["v_cache"].bfloat16())
    assert not bf16["plan"]["kv_fp8"] and "FP8" not in bf16["reason"]
    with dispatch.forced_backend("reference"):
        assert "FP8 cache dequantised" in ioattn.explain_decode(kw["q"], kw["k_cache"], kw["v_cache"])["reason"]

    monkeypatch.setattr(decode, "_num_sms", lambda device: 132)
    monkeypatch.setattr(decode, "_pdl_ok", lambda device: False)
    gpu_q = types.SimpleNamespace(shape=(96, 1, 32, 128), is_cuda=True, device=torch.device("cpu"))
    k16, k8 = torch.empty(1, 4096, 8, 128, dtype=torch.bfloat16), torch.empty(1, 4096, 8, 128, dtype=E4M3)
    wide16, wide8 = decode.plan(gpu_q, k16, k16, False, 4096), decode.plan(gpu_q, k8, k8, False, 4096)
    assert (wide16.block_n, wide16.use_tma, wide16.max_regs) == (128, False, None)
    assert (wide8.block_n, wide8.max_regs, wide8.kv_fp8) == (128, decode.FP8_WIDE_MAX_REGS, True)
    assert "registers capped" in wide8.reason
    with decode_config(max_regs=None):  # a forced field wins
        assert decode.plan(gpu_q, k8, k8, False, 4096).max_regs is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_decode_step_under_torch_compile(backend):
    """The custom op carries the descales: a compiled step (append and attention) equals the eager one,
    caches included."""
    kw = _fp8_case(batch=2, seqlen_q=1, causal=True)
    eager_kw, comp_kw = _clone(kw), _clone(kw)

    def step(**a):
        return flash_attn_with_kvcache(**a, return_softmax_lse=True, check_values=False)
    compiled = torch.compile(step, fullgraph=True, backend="eager" if DEVICE == "cpu" else "inductor")
    torch._dynamo.reset()
    with dispatch.forced_backend(backend):
        out_e, lse_e = step(**eager_kw)
        out_c, lse_c = compiled(**comp_kw)
    assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
    assert all(_same_bytes(comp_kw[c], eager_kw[c]) for c in ("k_cache", "v_cache"))


# ---------------------------------------------------------------- GPU compiler (no GPU needed)

_AOT_SCRIPT = """
import inspect
import sys
sys.path.insert(0, "tools")  # the compile checks' helpers (run from the repository root)
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from compile_check import signature
from gluon_aot import ptxas_report
from ioattn.plan import decode
from ioattn.kernels.decode import decode_split_kernel as fn

def compile_fp8(c, num_stages, maxnreg=None):
    # K, V (and their descriptors) e4m3, the descales float32; pointers and strides aligned as on the device
    sig = signature(fn, "bf16")
    sig.update(K="*fp8e4nv", V="*fp8e4nv", KDescale="*fp32", VDescale="*fp32")
    c = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}, **c}
    if c["USE_TMA"]:
        sig["k_desc"] = sig["v_desc"] = f"tensordesc<fp8e4nv[1,{c['BLOCK_N']},1,{c['BLOCK_D']}]>"
    else:
        c = dict(c, k_desc=None, v_desc=None)
    sig.update({n: "constexpr" for n in c})
    aligned = [n for n in fn.arg_names if n not in c and (n[0].isupper() or n.startswith("stride_") and n[-1] in "bmhnsl")]
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    options = dict(num_warps=decode._NUM_WARPS, num_stages=num_stages, **({"maxnreg": maxnreg} if maxnreg else {}))
    return triton.compile(ASTSource(fn, sig, c, attrs), target=GPUTarget("cuda", 90, 32), options=options)

plain = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=decode._BLOCK_N_CUDA, PAGE_SIZE=1, PAGED=False,
             HAS_BATCH_IDX=False, HAS_LEFTPAD=False, HAS_SOFTCAP=False, HAS_ALIBI=False, USE_TMA=False, UNIFIED=False,
             PHI_BELOW=64.0, PHI_ABOVE=64.0, HAS_SEQLENS=True, USE_PDL=True, KV_FP8=True)
every = dict(plain, PAGED=True, PAGE_SIZE=256, HAS_LEFTPAD=True, HAS_SOFTCAP=True, HAS_ALIBI=True)
# the 128-key tile through pointers with the plan's cap: contiguous and paged fit it without spills
for c in (plain, dict(plain, PAGED=True, PAGE_SIZE=256)):
    k = compile_fp8(c, decode._NUM_STAGES, decode.FP8_WIDE_MAX_REGS)
    regs, spills = ptxas_report(k.asm["ptx"])[:2]
    print("fp8 wide tile paged" if c["PAGED"] else "fp8 wide tile", "registers", regs, "spills", spills)
    assert regs <= decode.FP8_WIDE_MAX_REGS and spills == 0, (c["PAGED"], regs, spills)
# every feature, TMA, the split tile, the unified max with 64 packed rows: they compile
compile_fp8(every, decode._NUM_STAGES, decode.FP8_WIDE_MAX_REGS)
compile_fp8(dict(every, USE_TMA=True), decode._NUM_STAGES)
compile_fp8(dict(plain, BLOCK_N=decode._BLOCK_N_SPLIT), decode._NUM_STAGES_SPLIT)
compile_fp8(dict(plain, UNIFIED=True, HEAD_DIM=64, BLOCK_D=64, BLOCK_M=64), decode._NUM_STAGES)
print("fp8 decode kernel compiled for sm_90")
"""


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
def test_fp8_decode_kernel_compiles_for_sm90():
    """The interpreter runs no GPU compiler: compile the FP8 kernel for sm_90 ahead of time (a child
    process without TRITON_INTERPRET), the register-capped 128-key tile without spills."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "fp8 decode kernel compiled for sm_90" in proc.stdout


@pytest.mark.interpreter
def test_page_pool_appends_quantised_tokens_and_decodes_them():
    """A pool of e4m3 pages: ``append`` stores value / descale saturated to e4m3 (the rows of the
    quantised reference), a decode step over the pool equals the 16-bit decode of the dequantised
    pages, and an append without descales (or with them on a 16-bit pool) is refused unchanged."""
    from ioattn.kvcache.pool import PagePool
    from ioattn.reference.decode import quantize_kv_ref

    g = torch.Generator().manual_seed(5)
    pool = PagePool(8, 16, 2, 32, dtype=torch.float8_e4m3fn, device=DEVICE)
    kd, vd = torch.tensor([0.02, 0.05], device=DEVICE), torch.tensor([0.03, 0.04], device=DEVICE)
    seqs = [pool.add_sequence() for _ in range(2)]
    news = {}
    for s, n in zip(seqs, (21, 9)):
        k, v = (torch.randn(n, 2, 32, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
        pool.append(s, k, v, k_descale=kd, v_descale=vd)
        news[s] = (k, v)
    first = pool.pages(seqs[0])[0]
    assert torch.equal(pool.k_pages[first].float(), quantize_kv_ref(news[seqs[0]][0][None, :16], kd.view(1, 2))[0]
                       .to(torch.float8_e4m3fn).float())
    q = torch.randn(2, 1, 4, 32, generator=g).to(DEVICE, torch.bfloat16)
    descales = kd.view(1, 2).expand(2, 2), vd.view(1, 2).expand(2, 2)
    out = flash_attn_with_kvcache(q, pool.k_pages, pool.v_pages, cache_seqlens=pool.cache_seqlens(seqs),
                                  block_table=pool.block_table(seqs), k_descale=descales[0], v_descale=descales[1])
    k16 = (pool.k_pages.float() * kd.view(1, 1, 2, 1)).to(torch.bfloat16)
    v16 = (pool.v_pages.float() * vd.view(1, 1, 2, 1)).to(torch.bfloat16)
    ref = flash_attn_with_kvcache(q, k16, v16, cache_seqlens=pool.cache_seqlens(seqs),
                                  block_table=pool.block_table(seqs))
    assert (out.float() - ref.float()).abs().max() < 2e-2
    before = pool.seqlen(seqs[1]), pool.k_pages.clone()
    with pytest.raises(ValueError, match="needs k_descale and v_descale"):
        pool.append(seqs[1], *news[seqs[1]])
    assert pool.seqlen(seqs[1]) == before[0] and torch.equal(pool.k_pages.view(torch.uint8),
                                                             before[1].view(torch.uint8))
    plain = PagePool(2, 16, 2, 32, device=DEVICE)
    with pytest.raises(ValueError, match="takes none"):
        plain.append(plain.add_sequence(), *news[seqs[1]], k_descale=kd, v_descale=vd)
