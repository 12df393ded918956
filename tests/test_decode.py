"""flash_attn_with_kvcache (ioattn.decode) and its split-KV kernel against the reference
``kvcache_attention_ref``: both paths (Triton kernel, under the interpreter without a GPU, and the
PyTorch fallback), contiguous and paged caches, appends with rotary, masks, and refused calls."""
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from conftest import DEVICE, assert_lse_close, assert_within_torch_error, rotary_tables, child_env

from ioattn.plan import dispatch
from ioattn.decode import decode_config, flash_attn_with_kvcache
from ioattn.plan.decode import DEFAULT_NUM_SMS, MAX_SPLITS, SPLIT_WAVES, _heuristic_splits
from ioattn.reference.decode import kvcache_attention_ref

I32 = torch.int32
BACKENDS = ["triton", "reference"]


pytestmark = pytest.mark.usefixtures("one_thread", "poison_alloc")


def _rotary_tables(seqlen_ro, rotary_dim):
    cos, sin, _ = rotary_tables(seqlen_ro, rotary_dim, device=DEVICE)
    return cos, sin


def _make_case(dtype=torch.float32, batch=3, nheads_kv=2, group=2, d=32, seqlen_q=1, seqlen_new=1,
               capacity=96, paged=False, page_size=16, seqlens="mixed", rotary=None, rotary_dim=None,
               causal=False, window=(-1, -1), softcap=0.0, alibi=None, batch_idx=False, leftpad=False,
               new_kv=True):
    """Keyword arguments of one call (caches included) plus nothing else: the caller clones them."""
    dev = DEVICE
    nheads = nheads_kv * group
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).to(dtype).to(dev)

    kw = {}
    if paged:
        pages_per_seq = -(-capacity // page_size)
        capacity = pages_per_seq * page_size
        num_pages = batch * pages_per_seq + 3
        perm = torch.randperm(num_pages, generator=g)[: batch * pages_per_seq]
        kw["block_table"] = perm.view(batch, pages_per_seq).to(I32).to(dev)
        cache_shape = (num_pages, page_size, nheads_kv, d)
    else:
        rows = batch + 2 if batch_idx else batch
        cache_shape = (rows, capacity, nheads_kv, d)
        if batch_idx:
            kw["cache_batch_idx"] = torch.randperm(rows, generator=g)[:batch].to(I32).to(dev)
    kw["k_cache"], kw["v_cache"] = rnd(*cache_shape), rnd(*cache_shape)
    kw["q"] = rnd(batch, seqlen_q, nheads, d)
    n_new = seqlen_new if new_kv else 0
    if new_kv:
        kw["k"], kw["v"] = rnd(batch, seqlen_new, nheads_kv, d), rnd(batch, seqlen_new, nheads_kv, d)
    if seqlens == "mixed":  # 0, full, and random lengths in between
        top = capacity - n_new
        sl = torch.randint(0, top + 1, (batch,), generator=g)
        sl[0] = 0
        if batch > 1:
            sl[1] = top
        kw["cache_seqlens"] = sl.to(I32).to(dev)
    else:
        kw["cache_seqlens"] = seqlens
    if leftpad:
        ends = (torch.as_tensor(kw["cache_seqlens"]).expand(batch) + n_new).cpu()
        kw["cache_leftpad"] = (torch.rand(batch, generator=g) * (ends + 1).float()).long().clamp(max=ends).to(I32).to(dev)
    if rotary is not None:
        kw["rotary_cos"], kw["rotary_sin"] = _rotary_tables(capacity + seqlen_q, rotary_dim or d)
        kw["rotary_interleaved"] = rotary == "interleaved"
    if alibi == "heads":
        kw["alibi_slopes"] = (torch.rand(nheads, generator=g) * 0.5).to(dev)
    elif alibi == "batch":
        kw["alibi_slopes"] = (torch.rand(batch, nheads, generator=g) * 0.5).to(dev)
    kw.update(causal=causal, window_size=window, softcap=softcap)
    return kw


def _clone(kw):
    return {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def _check(kw, backend, num_splits=0):
    ref64_kw, ref_t_kw, got_kw = _clone(kw), _clone(kw), _clone(kw)
    out64, lse64 = kvcache_attention_ref(**ref64_kw)
    out_t, _ = kvcache_attention_ref(**ref_t_kw, upcast=False)
    with dispatch.forced_backend(backend):
        out, lse = flash_attn_with_kvcache(**got_kw, num_splits=num_splits, return_softmax_lse=True)
    name = f"{backend} splits={num_splits}"
    assert out.shape == kw["q"].shape and out.dtype == kw["q"].dtype, name
    # the in-place append wrote exactly what the reference's did
    for c in ("k_cache", "v_cache"):  # (unused slots may hold NaN on purpose)
        assert torch.equal(got_kw[c].nan_to_num(7.0), ref64_kw[c].nan_to_num(7.0)), f"{name}: {c} differs after the append"
    assert_within_torch_error(f"{name} out", out, out64, out_t)
    assert_lse_close(f"{name} lse", lse, lse64)
    # rows that see no key: exactly 0
    empty = torch.isneginf(lse64).transpose(1, 2)
    assert (out[empty] == 0).all(), f"{name}: rows with no visible key are not 0"


# ---------------------------------------------------------------- splits and layouts

@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_splits", [0, 1, 2, 3, 64])  # 64 > key chunks: empty splits
def test_splits(backend, paged, num_splits):
    _check(_make_case(paged=paged, seqlen_q=1, group=2), backend, num_splits)


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("num_whole,num_splits", [(2, 2), (2, 3), (4, 64), (0, 3), (99, 3)])
def test_tail_split(paged, num_whole, num_splits):
    """The launch that takes the first units whole (final output written by the kernel) and splits
    the rest (a batch suffix, merged into the output's tail): 2 units a batch element here, so
    num_whole 2 / 4 leaves two / one elements split (the mixed lengths put 0 and the full cache in
    the whole part, random ones in the split part); 64 splits > key chunks (empty splits); 0 splits
    every unit, 99 none."""
    with decode_config(num_whole=num_whole, num_splits=num_splits):
        _check(_make_case(paged=paged, seqlen_q=1, group=2), "triton")


def test_tail_split_row_blocks():
    """Several row blocks a unit (36 query tokens x group 4 = 144 packed rows: 3 blocks of 64), a
    causal append, a window: the whole / split boundary between batch elements, not row blocks."""
    kw = _make_case(seqlen_q=36, seqlen_new=36, group=4, causal=True, window=(20, 0), capacity=128)
    with decode_config(num_whole=6, num_splits=3):
        _check(kw, "triton")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [16, 32])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_half(backend, page_size, dtype):
    _check(_make_case(dtype=dtype, paged=True, page_size=page_size, seqlen_q=5, seqlen_new=2, causal=True,
                      group=4), backend, 3)


CASES = {
    "gqa1_q5": {"group": 1, "seqlen_q": 5, "seqlen_new": 5, "causal": True},
    "gqa4": {"group": 4, "seqlen_q": 1},
    "gqa8_q5": {"group": 8, "seqlen_q": 5, "seqlen_new": 3, "causal": True},  # 40 packed rows
    "gqa8_q9_rowblocks": {"group": 8, "seqlen_q": 9, "seqlen_new": 9, "causal": True, "nheads_kv": 1},  # 72 rows: 2 blocks
    "gqa8_q9_rowblocks_window": {"group": 8, "seqlen_q": 9, "seqlen_new": 4, "window": (6, 1), "nheads_kv": 1},
    "rotary_interleaved_causal": {"rotary": "interleaved", "seqlen_q": 3, "seqlen_new": 3, "causal": True},
    "rotary_neox": {"rotary": "neox", "seqlen_q": 3, "seqlen_new": 2},
    "rotary_partial_paged": {"rotary": "neox", "rotary_dim": 16, "paged": True, "seqlen_q": 2, "seqlen_new": 2,
                                 "causal": True},
    "window": {"window": (20, 2), "seqlen_q": 5, "seqlen_new": 5},
    "window_causal_paged": {"window": (10, -1), "causal": True, "seqlen_q": 4, "seqlen_new": 1, "paged": True},
    "softcap": {"softcap": 3.0, "seqlen_q": 2, "seqlen_new": 2, "causal": True},
    "alibi_heads": {"alibi": "heads", "seqlen_q": 3, "seqlen_new": 1},
    "alibi_batch_causal_paged": {"alibi": "batch", "causal": True, "seqlen_q": 3, "seqlen_new": 3, "paged": True},
    "batch_idx": {"batch_idx": True, "seqlen_q": 2, "seqlen_new": 2, "causal": True},
    "leftpad": {"leftpad": True, "seqlen_q": 3, "seqlen_new": 1, "causal": True, "window": (16, -1)},
    "leftpad_paged_alibi": {"leftpad": True, "paged": True, "alibi": "heads"},
    "no_new_kv": {"new_kv": False, "seqlen_q": 2, "causal": True},
    "int_seqlens_full": {"seqlens": 95, "seqlen_new": 1},
    "no_new_kv_seqlens_none": {"new_kv": False, "seqlens": None, "capacity": 48},
    "headdim_40": {"d": 40, "seqlen_q": 2, "causal": True},
    "bf16_everything": {"dtype": torch.bfloat16, "rotary": "interleaved", "causal": True, "softcap": 5.0,
                            "alibi": "heads", "paged": True, "page_size": 32, "leftpad": True, "seqlen_q": 3, "seqlen_new": 2},
    "fp16_batch_idx_window": {"dtype": torch.float16, "batch_idx": True, "window": (8, 8), "seqlen_q": 5,
                                  "seqlen_new": 2, "group": 2},
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_features(backend, case):
    _check(_make_case(**CASES[case]), backend, 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_window_edges_at_chunk_boundaries(backend, seqlen_q):
    """The window's first visible column at every offset around a 16-column chunk edge."""
    seqlens = torch.arange(46, 52, dtype=I32, device=DEVICE)
    kw = _make_case(batch=6, seqlens=seqlens, seqlen_q=seqlen_q, seqlen_new=1, window=(32 - seqlen_q, 0),
                    capacity=64)
    _check(kw, backend, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_all_empty(backend):
    """cache_seqlens 0 and no new tokens: nothing to attend to anywhere."""
    kw = _make_case(new_kv=False, seqlens=0, batch=2)
    with dispatch.forced_backend(backend):
        out, lse = flash_attn_with_kvcache(**kw, return_softmax_lse=True)
    assert (out == 0).all() and torch.isneginf(lse).all()


def test_output_without_lse_is_a_tensor():
    kw = _make_case()
    out = flash_attn_with_kvcache(**kw)
    assert isinstance(out, torch.Tensor) and out.shape == kw["q"].shape


def test_heuristic_splits():
    assert _heuristic_splits(DEFAULT_NUM_SMS, 10_000, 64) == 1  # the grid is full already
    # 2 programs per SM (264 / 8 = 33), then 33 is at most 1/8 past 32: 32 (the merge pads to powers of two)
    assert SPLIT_WAVES * DEFAULT_NUM_SMS // 8 == 33 and _heuristic_splits(8, 100_000, 64) == 32
    assert _heuristic_splits(24, 100_000, 64) == 11  # 11 is 3/11 past 8: kept
    assert _heuristic_splits(8, 100_000, 64, num_sms=160) == 40  # 40 is 8/40 = 1/5 past 32: kept
    assert _heuristic_splits(8, 100_000, 64, num_sms=144) == 32  # 36: 4/36 past 32
    # rounded down: 64 programs x 4 splits = 256 <= 264; 5 splits would put 3 programs on some SMs
    assert _heuristic_splits(64, 100_000, 64) == 4 and 64 * 4 <= SPLIT_WAVES * DEFAULT_NUM_SMS < 64 * 5
    assert _heuristic_splits(8, 100, 64) == 2  # never more splits than chunks of the longest sequence
    assert _heuristic_splits(1, 0, 64) == 1
    assert _heuristic_splits(1, 10 ** 7, 64) == MAX_SPLITS  # capped
    assert _heuristic_splits(8, 4096, 64, min_keys=256) == 16  # at least min_keys keys per split
    assert _heuristic_splits(8, 16384, 64, min_keys=256) == 32


# ---------------------------------------------------------------- refused calls

def _bad(kw, **changes):
    kw = dict(kw)
    kw.update(changes)
    return kw


BAD = {
    "q_3d": (lambda kw: _bad(kw, q=kw["q"][0]), ValueError, "q must have 4 dimensions"),
    "q_int": (lambda kw: _bad(kw, q=kw["q"].long()), TypeError, "q must be float16"),
    "dtype_mismatch": (lambda kw: _bad(kw, q=kw["q"].double().half()), TypeError, "share one dtype"),
    "heads": (lambda kw: _bad(kw, q=kw["q"][:, :, :3]), ValueError, "multiple of the number of key/value heads"),
    "headdim": (lambda kw: _bad(kw, q=kw["q"][..., :16]), ValueError, "same head dim"),
    "v_cache_shape": (lambda kw: _bad(kw, v_cache=kw["v_cache"][:, :-16]), ValueError, "agree in all but the head dim"),
    "k_without_v": (lambda kw: _bad(kw, v=None), ValueError, "k and v must be given together"),
    "k_shape": (lambda kw: _bad(kw, k=kw["k"][:, :, :1], v=kw["v"][:, :, :1]), ValueError, "k and v must both be"),
    "k_dtype": (lambda kw: _bad(kw, k=kw["k"].half(), v=kw["v"].half()), TypeError, "k must have q's dtype"),
    "seqlens_dtype": (lambda kw: _bad(kw, cache_seqlens=kw["cache_seqlens"].long()), TypeError, "cache_seqlens"),
    "seqlens_shape": (lambda kw: _bad(kw, cache_seqlens=kw["cache_seqlens"][:2]), ValueError, "cache_seqlens"),
    "seqlens_overflow": (lambda kw: _bad(kw, cache_seqlens=kw["cache_seqlens"] * 0 + 95, k=kw["k"].repeat(1, 2, 1, 1),
                                         v=kw["v"].repeat(1, 2, 1, 1)), ValueError, "cache capacity"),
    "seqlens_negative": (lambda kw: _bad(kw, cache_seqlens=kw["cache_seqlens"] * 0 - 1), ValueError, "cache_seqlens"),
    "seqlens_none_with_k": (lambda kw: _bad(kw, cache_seqlens=None), ValueError, "cache_seqlens is required"),
    "batch_idx_range": (lambda kw: _bad(kw, cache_batch_idx=torch.tensor([0, 1, 9], dtype=I32, device=DEVICE)),
                        ValueError, "cache_batch_idx entries"),
    "batch_idx_dtype": (lambda kw: _bad(kw, cache_batch_idx=torch.tensor([0, 1, 2], device=DEVICE)),
                        TypeError, "cache_batch_idx"),
    "leftpad_past_end": (lambda kw: _bad(kw, cache_leftpad=kw["cache_seqlens"] + 2), ValueError, "cache_leftpad"),
    "rotary_one_sided": (lambda kw: _bad(kw, rotary_sin=None), ValueError,
                         "rotary_cos and rotary_sin"),
    "rotary_too_short": (lambda kw: _bad(kw, rotary_cos=torch.ones(10, 16, device=DEVICE),
                                         rotary_sin=torch.ones(10, 16, device=DEVICE)), ValueError, "rotary_cos/rotary_sin have"),
    "rotary_too_wide": (lambda kw: _bad(kw, rotary_cos=torch.ones(100, 17, device=DEVICE),
                                        rotary_sin=torch.ones(100, 17, device=DEVICE)), ValueError, "rotary_dim"),
    "alibi_shape": (lambda kw: _bad(kw, alibi_slopes=torch.ones(3, device=DEVICE)), ValueError, "alibi_slopes"),
    "softcap": (lambda kw: _bad(kw, softcap=-1.0), ValueError, "softcap"),
    "window": (lambda kw: _bad(kw, window_size=(-2, 0)), ValueError, "window_size"),
    "num_splits": (lambda kw: _bad(kw, num_splits=-1), ValueError, "num_splits"),
}

BAD_PAGED = {
    "page_out_of_range": (lambda kw: _bad(kw, block_table=torch.where(kw["block_table"] == kw["block_table"].max(),
                                                                      kw["k_cache"].shape[0], kw["block_table"])),
                          ValueError, "block_table entries must lie in"),
    "page_negative": (lambda kw: _bad(kw, block_table=kw["block_table"] - kw["block_table"].max() - 1), ValueError,
                      "block_table entries"),
    "table_dtype": (lambda kw: _bad(kw, block_table=kw["block_table"].long()), TypeError, "block_table"),
    "table_shape": (lambda kw: _bad(kw, block_table=kw["block_table"][:2]), ValueError, "block_table"),
    "page_size": (lambda kw: _bad(kw, k_cache=kw["k_cache"][:, :8], v_cache=kw["v_cache"][:, :8]), ValueError,
                  "multiple of 16"),
    "table_with_batch_idx": (lambda kw: _bad(kw, cache_batch_idx=torch.zeros(3, dtype=I32, device=DEVICE)),
                             ValueError, "cache_batch_idx is for the contiguous cache only"),
    "append_past_pages": (lambda kw: _bad(kw, cache_seqlens=kw["cache_seqlens"] * 0 + 96), ValueError, "cache capacity"),
}


def _assert_refused(make, exc, msg, kw):
    bad = make(_clone(kw))
    before = (bad["k_cache"].clone(), bad["v_cache"].clone())
    with pytest.raises(exc, match=msg):
        flash_attn_with_kvcache(**bad)
    assert torch.equal(bad["k_cache"], before[0]) and torch.equal(bad["v_cache"], before[1]), \
        "a refused call changed the cache"


@pytest.mark.parametrize("case", list(BAD))
def test_refused_contiguous(case):
    kw = _make_case(batch=3, rotary="interleaved", batch_idx=case.startswith("batch_idx"))
    make, exc, msg = BAD[case]
    _assert_refused(make, exc, msg, kw)


@pytest.mark.parametrize("case", list(BAD_PAGED))
def test_refused_paged(case):
    kw = _make_case(batch=3, paged=True)
    make, exc, msg = BAD_PAGED[case]
    _assert_refused(make, exc, msg, kw)


# ---------------------------------------------------------------- GPU compiler (no GPU needed)

_AOT_SCRIPT = """
import sys
sys.path.insert(0, "tools")  # the compile checks' helpers (run from the repository root)
from compile_check import compile_one
from ioattn.plan import decode
from ioattn.kernels.decode import decode_split_kernel as fn
# (dtype, paged, every feature, BLOCK_M, head dim, TMA, unified max): a few corners, each compile takes
# seconds; argument "all": every one, else the last (every feature)
CORNERS = (("bf16", False, False, 16, 128, False, False),
           ("bf16", False, False, 16, 128, True, True),
           ("bf16", True, True, decode._MAX_BLOCK_M, 256, True, False),
           ("fp32", True, True, decode._MAX_BLOCK_M, 59, False, True),
           ("fp16", False, True, 16, 64, False, False))
for dt, paged, feat, block_m, d, tma, uni in (CORNERS if sys.argv[1:] == ["all"] else CORNERS[-1:]):
    c = dict(HEAD_DIM=d, BLOCK_D=max(16, 1 << (d - 1).bit_length()), BLOCK_M=block_m,
             BLOCK_N=decode._BLOCK_N_CUDA if d <= 128 else 64,
             PAGE_SIZE=64 if paged else 1, PAGED=paged, HAS_BATCH_IDX=feat and not paged, HAS_LEFTPAD=feat,
             HAS_SOFTCAP=feat, HAS_ALIBI=feat, USE_TMA=tma, UNIFIED=uni, PHI_BELOW=8.0, PHI_ABOVE=15.0,
             HAS_SEQLENS=not feat)
    _, shared, k = compile_one(fn, c, decode._NUM_WARPS, 3 if tma else decode._NUM_STAGES, dtype=dt)
    assert shared <= 232448, (dt, paged, feat, block_m, d, shared)
    print(dt, paged, feat, block_m, d, tma, uni, "shared", shared, "async ops", k.asm["ttgir"].count("async_"))
# the wide tile in a split launch as the device compiles it (aligned pointers and strides): at most
# 170 registers, so 3 programs of 128 threads share an SM's 65536 (decode.WIDE_MAX_REGS and the wave
# rules were measured with 168; docs/decisions/decode-one-wave.md); a change that crosses it must be re-measured
from gluon_aot import ptxas_report
aligned = [n for n in fn.arg_names if n[0].isupper() and n not in ("HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N",
                                                                    "PAGE_SIZE", "PAGED")] + [
    n for n in fn.arg_names if n.startswith("stride_") and n[-1] in "bmhnsl"]
wide = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_M=16, BLOCK_N=decode._BLOCK_N_CUDA, PAGE_SIZE=1, PAGED=False,
            HAS_BATCH_IDX=False, HAS_LEFTPAD=False, HAS_SOFTCAP=False, HAS_ALIBI=False, USE_TMA=False, UNIFIED=False,
            PHI_BELOW=64.0, PHI_ABOVE=64.0, HAS_SEQLENS=True, USE_PDL=True)
_, shared, k = compile_one(fn, wide, decode._NUM_WARPS, decode._NUM_STAGES, dtype="bf16",
                           divisible=[n for n in aligned if n not in ("k_desc", "v_desc")])
regs = ptxas_report(k.asm["ptx"])[0]
print("wide split launch: registers", regs, "shared", shared)
assert regs <= 170 and 3 * shared <= 233472, (regs, shared)
# programmatic dependent launch: the split kernel releases the merge grid, the merge waits for it
c.update(USE_PDL=True)  # the split kernel releases the merge grid after its key loop
_, _, k = compile_one(fn, c, decode._NUM_WARPS, decode._NUM_STAGES, dtype="fp16")
ptx = k.asm["ptx"]
first_load = lambda ptx: min(i for i in (ptx.find("ld.global"), ptx.find("cp.async")) if i >= 0)
assert ptx.count("griddepcontrol.launch_dependents") == 1
assert ptx.find("griddepcontrol.launch_dependents") > max(ptx.rfind("cp.async"), first_load(ptx))
c.update(PDL_WAIT=True)  # launched by PDL itself: the wait comes before any load
_, _, k = compile_one(fn, c, decode._NUM_WARPS, decode._NUM_STAGES, dtype="fp16")
assert 0 <= k.asm["ptx"].find("griddepcontrol.wait") < first_load(k.asm["ptx"])
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from ioattn.kernels.combine import merge_states_kernel as mfn
sig = {n: "i32" for n in mfn.arg_names}
sig.update(Outs="*fp32", Lses="*fp32", Out="*bf16", Lse="*fp32")
mc = dict(HEAD_DIM=128, BLOCK_D=128, BLOCK_S=32, CHUNK_S=32, LSE_BHM=True, USE_PDL=True)
sig.update({n: "constexpr" for n in mc})
k = triton.compile(ASTSource(mfn, sig, mc), target=GPUTarget("cuda", 90, 32),
                   options=dict(num_warps=4, launch_pdl=True))
assert "griddepcontrol.wait" in k.asm["ptx"] and k.metadata.launch_pdl
print("decode kernel compiled for sm_90")
"""


@pytest.mark.skipif(os.environ.get("IOATTN_SKIP_AOT") == "1", reason="IOATTN_SKIP_AOT=1")
@pytest.mark.parametrize("corners", ["one", pytest.param("all", marks=pytest.mark.sass)])
def test_decode_kernel_compiles_for_sm90(corners):
    """The interpreter does not run the GPU compiler: compile the kernel for sm_90 ahead of time (in a
    child process without TRITON_INTERPRET, which replaces @triton.jit functions in this one); the
    CPU run at one corner (every feature), the device suite at each."""
    root = pathlib.Path(__file__).resolve().parents[1]
    env = child_env()
    proc = subprocess.run([sys.executable, "-c", _AOT_SCRIPT, corners], cwd=root, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert "decode kernel compiled for sm_90" in proc.stdout


@pytest.mark.parametrize("backend", BACKENDS)
def test_softmax_scale(backend):
    """A non-default scale reaches the kernel (the default 1/sqrt(d) would fail the oracle check)."""
    kw = _make_case(seqlen_q=3, seqlen_new=2, causal=True)
    kw["softmax_scale"] = 0.9
    _check(kw, backend, 2)


# ---------------------------------------------------------------- load paths, unified max, trusted values

@pytest.mark.parametrize("case", ["gqa4", "bf16_everything", "window_causal_paged", "batch_idx", "leftpad"])
def test_tma_loads(case):
    """K/V through tensor descriptors: columns past a sequence's end come from the cache (not
    zero-filled), so this also checks that they are masked and their V rows zeroed."""
    kw = _make_case(**CASES[case])
    kw["k_cache"][..., :] = kw["k_cache"] * 0 + float("nan")  # unused slots hold NaN; the append refills some
    kw["v_cache"][..., :] = kw["v_cache"] * 0 + float("nan")
    ref = _make_case(**CASES[case])
    # the valid columns hold the original data again
    for name in ("k_cache", "v_cache"):
        mask = _valid_columns(ref)
        kw[name][mask] = ref[name][mask]
    with decode_config(use_tma=True):
        _check(kw, "triton", 2)


def _valid_columns(kw):
    """Boolean mask over the cache's first two dims: the columns some sequence reads (before the append)."""
    cache = kw["k_cache"]
    mask = torch.zeros(cache.shape[:2], dtype=torch.bool, device=cache.device)
    batch = kw["q"].shape[0]
    seqlens = kw["cache_seqlens"]
    seqlens = torch.full((batch,), cache.shape[1] if seqlens is None else seqlens) if not torch.is_tensor(seqlens) \
        else seqlens
    for b in range(batch):
        cols = torch.arange(int(seqlens[b]) + (kw["k"].shape[1] if kw.get("k") is not None else 0))
        if "block_table" in kw:
            page_size = cache.shape[1]
            mask[kw["block_table"][b, cols // page_size].long(), cols % page_size] = True
        else:
            row = int(kw["cache_batch_idx"][b]) if "cache_batch_idx" in kw else b
            mask[row, cols] = True
    return mask


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("phi", ["typical", "far_below", "far_above"])
def test_unified_max_matches_exact(dtype, phi):
    """FlashDecoding++'s unified max: exact whatever phi is. far_below makes exp2(s - phi) overflow and
    far_above makes it underflow to 0; without the exact recomputation both would fail (inf/NaN, or
    rows of 0 with lse -inf)."""
    kw = _make_case(dtype=dtype, group=4, seqlen_q=2, seqlen_new=2, causal=True, capacity=160)
    # q.k * scale is about N(0, 1) here: the row maxima over ~100 keys sit near 2.5
    value = {"typical": 2.5, "far_below": -500.0, "far_above": 500.0}[phi]
    _check_unified(kw, value)


@pytest.mark.parametrize("splits", [1, 3])
def test_unified_max_mixed_splits(splits):
    """Some splits in range and some not: only the others are recomputed; the merge is still exact.
    One sequence has huge scores (keys scaled up), the others ordinary ones."""
    kw = _make_case(dtype=torch.bfloat16, batch=3, group=2, seqlen_q=1, seqlen_new=1, capacity=128,
                    seqlens=torch.tensor([100, 60, 127], dtype=I32, device=DEVICE))
    kw["k_cache"][0] *= 40  # sequence 0: scores far above phi = 0
    _check_unified(kw, 0.0, splits)


def _check_unified(kw, phi, splits=2):
    with dispatch.forced_backend("triton"):
        out_u, lse_u = flash_attn_with_kvcache(**_clone(kw), num_splits=splits, return_softmax_lse=True,
                                               unified_max=phi)
    assert not torch.isnan(out_u).any(), "unified max gave NaN"
    _check(kw, "triton", splits)  # the exact path against the oracle
    out64, lse64 = kvcache_attention_ref(**_clone(kw))
    out_t, _ = kvcache_attention_ref(**_clone(kw), upcast=False)
    assert_within_torch_error("unified out", out_u, out64, out_t)
    assert_lse_close("unified lse", lse_u, lse64)


def test_check_values_false_matches():
    kw = _make_case(paged=True, seqlen_q=3, seqlen_new=2, causal=True, group=4)
    a_kw, b_kw = _clone(kw), _clone(kw)
    with dispatch.forced_backend("triton"):
        a = flash_attn_with_kvcache(**a_kw, num_splits=2)
        b = flash_attn_with_kvcache(**b_kw, num_splits=2, check_values=False)
    assert torch.equal(a, b) and torch.equal(a_kw["k_cache"], b_kw["k_cache"])


def test_unchecked_bad_indices_stay_inside_the_cache():
    """check_values=False trusts the values; the kernel clamps them, so garbage indices read only
    cache memory (finite output), never past it."""
    kw = _make_case(paged=True, new_kv=False, seqlen_q=1, group=2)
    kw["block_table"] = kw["block_table"] * 1000 + 10 ** 6  # every page far outside the pool
    kw["cache_seqlens"] = kw["cache_seqlens"] * 0 + 10 ** 6  # past the capacity
    with dispatch.forced_backend("triton"):
        out = flash_attn_with_kvcache(**kw, num_splits=2, check_values=False)
    assert torch.isfinite(out).all()


def test_unified_max_refused():
    kw = _make_case()
    with pytest.raises(ValueError, match="unified_max"):
        flash_attn_with_kvcache(**kw, unified_max=float("inf"))


def test_decode_config_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown fields"), decode_config(block_size=3):
        pass


def test_unified_max_takes_its_own_path_and_falls_back_exactly():
    """unified_max is not ignored: with phi in range the arithmetic differs from the running-max path
    (not bit-identical, same accuracy); with phi out of range every split is recomputed by the exact
    path, so the result is bit-identical to it."""
    kw = _make_case(dtype=torch.float32, group=4, seqlen_q=1, seqlen_new=1, capacity=160, seqlens=150)
    with dispatch.forced_backend("triton"):
        exact = flash_attn_with_kvcache(**_clone(kw), num_splits=2)
        in_range = flash_attn_with_kvcache(**_clone(kw), num_splits=2, unified_max=2.5)
        fallback = flash_attn_with_kvcache(**_clone(kw), num_splits=2, unified_max=-500.0)
    assert not torch.equal(in_range, exact)
    assert (in_range - exact).abs().max() < 1e-5
    assert torch.equal(fallback, exact)


def test_plan_is_memoized_on_what_it_reads(monkeypatch):
    """A decode loop plans once: the same call gives the same plan object; a forced field, an
    environment switch, another span or a misaligned cache give a fresh plan."""
    from ioattn.plan import decode
    q = torch.empty(2, 1, 8, 64)
    k = torch.empty(2, 4096, 2, 64)
    first = decode.plan(q, k, k, False, 4096)
    assert decode.plan(q, k, k, False, 4096) is first
    with decode_config(num_splits=3):
        assert decode.plan(q, k, k, False, 4096).num_splits == 3
    assert decode.plan(q, k, k, False, 4096) is first
    assert decode.plan(q, k, k, False, 256) is not first
    monkeypatch.setenv("IOATTN_DECODE_PDL", "0")
    assert decode.plan(q, k, k, False, 4096) is not first
    monkeypatch.delenv("IOATTN_DECODE_PDL")
    shifted = torch.empty(2 * 4096 * 2 * 64 + 1)[1:].view(2, 4096, 2, 64)  # 4 bytes off: TMA cannot take it
    with decode_config(use_tma=True):
        assert decode.plan(q, k, k, False, 4096).use_tma
        assert not decode.plan(q, shifted, shifted, False, 4096).use_tma


def test_pdl_switches_reach_the_plan(monkeypatch):
    """Programmatic dependent launch: on by default (measured to pay); IOATTN_DECODE_PDL=0 or
    decode_config(pdl=False) turn it off; only where it can run (faked here: this machine has no
    Hopper GPU), only for split launches (one split has no merge to overlap)."""
    from ioattn.plan import decode
    q = torch.empty(1, 1, 8, 64)
    k = torch.empty(1, 4096, 2, 64)
    monkeypatch.delenv("IOATTN_DECODE_PDL", raising=False)
    assert not decode._pdl_ok(q.device)
    assert not decode.plan(q, k, k, False, 4096, num_splits=8).pdl  # no Hopper here
    with decode_config(pdl=True):
        assert not decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    monkeypatch.setattr(decode, "_pdl_ok", lambda device: True)
    monkeypatch.setattr(decode, "_PLANS", {})  # plans are memoized; the faked device is new to them
    assert decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    assert not decode.plan(q, k, k, False, 4096, num_splits=1).pdl
    with decode_config(pdl=False):
        assert not decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    monkeypatch.setenv("IOATTN_DECODE_PDL", "0")
    assert not decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    with decode_config(pdl=True):
        assert decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    monkeypatch.setenv("IOATTN_DECODE_PDL", "1")
    assert decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    with decode_config(pdl=False):
        assert not decode.plan(q, k, k, False, 4096, num_splits=8).pdl
    # the split kernel launched by PDL itself: any launch, split or not, where PDL can run
    assert decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait == decode._PDL_WAIT_DEFAULT
    monkeypatch.setenv("IOATTN_DECODE_PDL_WAIT", "1")
    assert decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait
    with decode_config(pdl_wait=False):
        assert not decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait
    monkeypatch.setenv("IOATTN_DECODE_PDL_WAIT", "0")
    assert not decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait
    with decode_config(pdl_wait=True):
        assert decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait
        with decode_config(pdl=False):
            assert not decode.plan(q, k, k, False, 4096, num_splits=1).pdl_wait


def test_plan_tiles_by_launch_kind(monkeypatch):
    """The GPU tile policy (from the device sweeps, ioattn/plan/decode.py's notes): split launches on a
    contiguous cache take 64-key chunks with 3 stages; launches without splits and paged caches keep
    128-key chunks with 2 stages, but for 3-4 programs an SM 64 x 2; an explicit block_n wins. Faked GPU query (this machine has none)."""
    import types

    from ioattn.plan import decode
    monkeypatch.setattr(decode, "_num_sms", lambda device: 132)
    monkeypatch.setattr(decode, "_pdl_ok", lambda device: False)

    def gpu_q(batch):
        return types.SimpleNamespace(shape=(batch, 1, 32, 128), is_cuda=True, device=torch.device("cpu"))
    k = torch.empty(1, 1, 8, 128)
    one = decode.plan(gpu_q(1), k, k, False, 131072)
    assert (one.block_n, one.num_stages, one.num_splits) == (64, 3, 32)  # 264 / 8 = 33, a power of two: 32
    wide = decode.plan(gpu_q(96), k, k, False, 4096)  # 768 programs fill the SMs: no split
    assert (wide.block_n, wide.num_stages, wide.num_splits) == (128, 2, 1)
    # 512 programs: 4 a SM with 64-key chunks, all resident at once (ONE_WAVE_BLOCK_N)
    assert decode.plan(gpu_q(64), k, k, False, 4096).block_n == decode.ONE_WAVE_BLOCK_N
    pages = torch.empty(8, 256, 8, 128)
    paged = decode.plan(gpu_q(1), pages, pages, True, 131072)
    assert (paged.block_n, paged.num_stages) == (128, 2) and paged.num_splits > 1
    short = decode.plan(gpu_q(1), pages, pages, True, 4096)  # 32 TMA splits of 128 keys: two 64-key chunks
    assert (short.block_n, short.num_stages, short.num_splits, short.use_tma) == (64, 2, 32, True)
    with decode_config(block_n=32):
        assert decode.plan(gpu_q(1), k, k, False, 131072).block_n == 32


def test_plan_tail_split(monkeypatch):
    """Launches without splits whose last wave would hold at most half the SMs split that wave's batch
    elements (``decode._tail_split``): 8 units a batch element on 132 SMs, 32 key chunks of 128."""
    import types

    from ioattn.plan import decode
    monkeypatch.setattr(decode, "_num_sms", lambda device: 132)
    monkeypatch.setattr(decode, "_pdl_ok", lambda device: False)

    def gpu_q(batch):
        return types.SimpleNamespace(shape=(batch, 1, 32, 128), is_cuda=True, device=torch.device("cpu"))
    k = torch.empty(1, 1, 8, 128)

    def tail(batch, **kw):
        p = decode.plan(gpu_q(batch), k, k, False, 4096, **kw)
        return p.num_whole, p.num_splits, p.block_n, p.num_stages
    assert tail(68) == (None, 1, 64, 2)    # 544 units: 4 waves + 16: all resident, 5 an SM (ONE_WAVE_*)
    assert tail(34) == (264, 16, 128, 2)   # 272: 2 waves + 8 -> 16 ways
    assert tail(40) == (264, 2, 128, 2)    # 320: 2 waves + 56 (42 %) -> 2 ways
    assert tail(64) == (None, 1, 64, 2)    # 512: the last wave 88 % full: no split; 4 programs an SM
    assert tail(66) == (None, 1, 64, 2)    # 528: exactly 4 waves (one of the 4-a-SM tile)
    assert tail(100) == (792, 16, 128, 2)  # 800: 6 waves + 8 -> 16 ways
    assert tail(17) == (0, 2, 128, 2)      # 136: 1 wave + 4: every unit split in two, wide tile
    assert tail(24) == (0, 2, 128, 2)      # 192: 1 wave + 60 (45 %)
    assert tail(32)[:2] == (None, 1)       # 256: 1 wave + 124 (94 %): no split
    assert decode._tail_split(272, 8, 132, 4) == (264, 4)    # at most one piece per key chunk
    assert decode._tail_split(272, 8, 132, 1) == (272, 1)    # one chunk: nothing to split
    assert tail(68, num_splits=1)[:2] == (None, 1)  # an explicit split count is kept
    with decode_config(tail_split=False):
        assert tail(100)[:2] == (None, 1)
    # units needing 3 programs per SM, neither split nor tail-split: registers capped (WIDE_MAX_REGS)
    assert decode.plan(gpu_q(48), k, k, False, 4096).max_regs == decode.WIDE_MAX_REGS      # 384 units
    for batch in (40, 96, 32, 17):  # tail split; > 5 per SM; <= 2 per SM; wave split
        assert decode.plan(gpu_q(batch), k, k, False, 4096).max_regs is None, batch
    # units needing 4-5 programs per SM (ONE_WAVE_BLOCK_N): 64-key chunks, 2 stages, registers capped so
    # that all are resident, with 16 packed rows at d = 128 only (where it was measured)
    for batch, per_sm in ((52, 4), (56, 4), (60, 4), (64, 4), (66, 4), (67, 5), (68, 5), (80, 5), (82, 5)):
        p = decode.plan(gpu_q(batch), k, k, False, 4096)
        assert (p.block_n, p.num_stages, p.max_regs, p.num_splits, p.num_whole) == \
            (64, 2, decode.ONE_WAVE_MAX_REGS[per_sm], 1, None), (batch, p)
        assert decode.ONE_WAVE_MAX_REGS[per_sm] * 128 * per_sm <= 65536
    # a tail of at most SMs / 8 units past 3 waves (4 programs an SM): the tail split first (400 = 3 x 132
    # + 4 units); past 4 waves (5 an SM) the one-wave launch (67, 68 above)
    assert tail(50) == (392, 16, 128, 2)
    assert decode.plan(gpu_q(83), k, k, False, 4096).block_n == 128  # 664 units: past 5 a SM
    gqa8 = types.SimpleNamespace(shape=(64, 4, 64, 128), is_cuda=True, device=torch.device("cpu"))
    assert decode.plan(gqa8, k, k, False, 4096).block_n == 128  # 32 packed rows: not measured, not taken
    q64 = types.SimpleNamespace(shape=(64, 1, 32, 64), is_cuda=True, device=torch.device("cpu"))
    k64 = torch.empty(1, 1, 8, 64)
    assert decode.plan(q64, k64, k64, False, 4096).max_regs is None  # d = 64: not measured, not taken
    with decode_config(num_stages=3):
        assert decode.plan(gpu_q(64), k, k, False, 4096).block_n == 128  # a forced field keeps the wide tile
    pages = torch.empty(8, 256, 8, 128)  # paged in that band: pointer loads, no cap; TMA outside it
    banded = decode.plan(gpu_q(48), pages, pages, True, 4096)
    assert (banded.use_tma, banded.max_regs, banded.num_splits) == (False, None, 1)
    assert decode.plan(gpu_q(96), pages, pages, True, 4096).use_tma
    # paged in the one-wave range: pointer loads, 64-key chunks within the pages, the cap; not with pages
    # that a 64-key chunk does not divide
    p = decode.plan(gpu_q(64), pages, pages, True, 4096)
    assert (p.use_tma, p.block_n, p.max_regs) == (False, 64, decode.ONE_WAVE_MAX_REGS[4]), p
    small = torch.empty(8, 32, 8, 128)
    assert decode.plan(gpu_q(64), small, small, True, 4096).max_regs is None
    with decode_config(num_whole=20, num_splits=3):  # forced: rounded down to whole elements
        assert tail(68)[:2] == (16, 3)



def test_explain_decode(monkeypatch):
    """``ioattn.explain_decode`` names the path and the plan with the rules that chose it: the split
    count, the tail split, the register cap (faked GPU queries, as the plan tests), and the PyTorch
    path where Triton does not run; nothing is launched."""
    import types

    import ioattn
    from ioattn.plan import decode
    monkeypatch.setattr(decode, "_num_sms", lambda device: 132)
    monkeypatch.setattr(decode, "_pdl_ok", lambda device: False)
    monkeypatch.setattr(dispatch, "use_triton", lambda device: True)

    def gpu_q(batch):
        return types.SimpleNamespace(shape=(batch, 1, 32, 128), is_cuda=True, device=torch.device("cpu"))
    k = torch.empty(1, 4096, 8, 128)
    one = ioattn.explain_decode(gpu_q(1), k, k)
    assert one["path"] == "triton" and one["plan"]["num_splits"] == 16
    assert "8 units" in one["reason"] and "16 splits (the waves rule" in one["reason"]
    tail = ioattn.explain_decode(gpu_q(100), k, k, cache_seqlens=torch.full((100,), 4096, dtype=I32))
    assert tail["plan"]["num_whole"] == 792 and "tail split: 792 units whole, the last 8 split 16 ways" in tail["reason"]
    one = ioattn.explain_decode(gpu_q(64), k, k, cache_seqlens=4096)
    assert one["plan"]["max_regs"] == decode.ONE_WAVE_MAX_REGS[4] and "4 programs per SM needed" in one["reason"]
    capped = ioattn.explain_decode(gpu_q(48), k, k, cache_seqlens=4096)
    assert capped["plan"]["max_regs"] == decode.WIDE_MAX_REGS and "registers capped" in capped["reason"]
    assert "num_splits=3 from the call" in ioattn.explain_decode(gpu_q(48), k, k, num_splits=3)["reason"]
    short = ioattn.explain_decode(gpu_q(1), k, k, cache_seqlens=torch.tensor([512], dtype=I32))
    assert short["plan"]["num_splits"] == 2  # planned by the longest sequence: 512 keys, 256 a split
    monkeypatch.setattr(dispatch, "use_triton", lambda device: False)
    assert ioattn.explain_decode(gpu_q(1), k, k)["path"] == "torch"


# ---------------------------------------------------------------- torch.compile

@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_step_under_torch_compile(backend, paged):
    """A decode step (rotary, append, attention) compiled with fullgraph=True: one custom op in the
    graph that mutates the caches; outputs, lse and both caches equal the eager call's, over two
    steps (the second reusing the compiled graph with the lengths advanced)."""
    kw = _make_case(batch=3, paged=paged, rotary="interleaved", causal=True, seqlens="mixed")
    kw["cache_seqlens"] = kw["cache_seqlens"].clamp(max=kw["k_cache"].shape[1] * (
        kw["block_table"].shape[1] if paged else 1) - 2)  # room for two appends
    eager_kw, comp_kw = _clone(kw), _clone(kw)

    def step(**a):
        return flash_attn_with_kvcache(**a, return_softmax_lse=True, check_values=False)
    compiled = torch.compile(step, fullgraph=True, backend="eager" if DEVICE == "cpu" else "inductor")
    torch._dynamo.reset()
    with dispatch.forced_backend(backend):
        for _ in range(2):
            out_e, lse_e = step(**eager_kw)
            out_c, lse_c = compiled(**comp_kw)
            assert torch.equal(out_c, out_e) and torch.equal(lse_c, lse_e)
            assert torch.equal(comp_kw["k_cache"], eager_kw["k_cache"])
            assert torch.equal(comp_kw["v_cache"], eager_kw["v_cache"])
            for a in (eager_kw, comp_kw):
                a["cache_seqlens"] += 1


def test_decode_refused_under_torch_compile():
    """Shapes are checked while tracing: a cache whose head dim disagrees with q fails there, with
    the eager call's message, and the cache is untouched."""
    kw = _make_case(batch=2)
    bad = _clone(kw)
    bad["k_cache"], bad["v_cache"] = bad["k_cache"][..., :16], bad["v_cache"][..., :16]
    before = bad["k_cache"].clone()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="same head dim"):
        torch.compile(lambda **a: flash_attn_with_kvcache(**a), fullgraph=True, backend="eager")(**bad)
    assert torch.equal(bad["k_cache"], before)
