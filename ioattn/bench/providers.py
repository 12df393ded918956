"""Attention implementations measured side by side.

Each provider is ``fn(q, k, v, causal) -> out`` on flash-attn's layout (batch, seqlen, nheads,
headdim), or ``None`` with the reason it cannot run here (never silently dropped). Names: ours start
with ``ioattn``; peers are ``sdpa`` (PyTorch's own choice of SDPA backend: on the CPU its flash
kernel), ``sdpa-flash``, ``sdpa-cudnn``, ``sdpa-efficient``, ``sdpa-math`` (one SDPA backend forced),
``flex``, ``flash-attn`` and ``flash-attn-cute``.

Decode providers (``decode_providers``) are set up per input set, outside the timed region:
``setup(q, k_cache, v_cache, cache_seqlens) -> run`` with q (batch, 1, nheads, d), caches (batch,
kvlen, nheads_kv, d), ``cache_seqlens`` int32 (batch,) on the device, and ``run() -> out`` (batch, 1,
nheads, d) the call that is timed. Every sequence fills its cache (cache_seqlens = kvlen), so peers
without a length argument attend to the whole cache; their setup refuses anything else.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import re
import warnings

import torch
import torch.nn.functional as F

import ioattn
from ioattn.semantics import Semantics

PEERS = ("sdpa", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "flex", "flash-attn", "flash-attn-cute",
         "sageattn")
OURS = ("ioattn", "ioattn-ptr", "ioattn-hopper", "ioattn-hopper-bwd", "ioattn-fp8", "ioattn-fp8-portable",
        "ioattn-fp8-call", "ioattn-fp8-blocks")


def _backend(backend):
    """The context that forces one SDPA backend; none for ``backend=None`` (PyTorch picks)."""
    from torch.nn.attention import sdpa_kernel
    return contextlib.nullcontext() if backend is None else sdpa_kernel([backend])


def _sdpa(backend):
    def run(q, k, v, causal):
        with _backend(backend):
            out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                 is_causal=causal, enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return run


def _ioattn(q, k, v, causal):
    return ioattn.flash_attn_func(q, k, v, causal=causal)


def _ioattn_ptr(q, k, v, causal):
    """The portable forward with K/V through pointer loads instead of tensor descriptors (TMA, the
    default on Hopper) and never the Gluon kernel: the A/B of the load path, in every run."""
    from ioattn.plan import dispatch, hopper
    with dispatch.prefer_tma(False), hopper.prefer_hopper(False):
        return ioattn.flash_attn_func(q, k, v, causal=causal)


def _ioattn_hopper(q, k, v, causal):
    """The Gluon Hopper forward wherever it applies (``hopper.prefer_hopper(True)``; the default takes
    it only from ``hopper.AUTO_MIN_SEQLEN``'s lengths); the backward as the default dispatch picks
    it. A call it does not cover is refused with the reason (the bench records it)."""
    from ioattn.plan import hopper
    ok, why = hopper.hopper_supports(q, k, v, False, Semantics(q.shape[-1] ** -0.5, (-1, 0) if causal else (-1, -1)),
                                     None)
    if not ok:
        raise ValueError(f"the Gluon Hopper forward does not cover this call: {why}")
    with hopper.prefer_hopper(True):
        return ioattn.flash_attn_func(q, k, v, causal=causal)


def _ioattn_hopper_bwd(q, k, v, causal):
    """The default forward with the Gluon backward wherever it applies (``hopper_bwd.prefer_hopper_bwd``,
    variant "ws"; the default takes it only from ``hopper_bwd.BWD_AUTO_MIN_SEQLEN``'s
    lengths; the switch in force at the forward decides the backward): refused with the reason where
    that backward does not apply."""
    from ioattn.plan import hopper_bwd
    with hopper_bwd.prefer_hopper_bwd(True):
        ok, why = hopper_bwd.bwd_plan(q, k, v, False,
                                      Semantics(q.shape[-1] ** -0.5, (-1, 0) if causal else (-1, -1)), None)
        if not ok:
            raise ValueError(f"the Gluon Hopper backward does not cover this call: {why}")
        return ioattn.flash_attn_func(q, k, v, causal=causal)


class _IoattnFp8:
    """The FP8 forward on the inputs quantised per (batch, head) (``quantize_fp8_ref``), the quantisation
    done once per input set outside the timed calls (forward only). Judged, like the others, against
    twice the error of its same-precision twin: the float64 FP8 emulation
    (``reference.fp8.attention_fp8_ref``, ``same_precision``). ``portable``: the portable kernel even
    where the Gluon one applies (the A/B of the Gluon FP8 kernel); ``blocks``: q and k quantised per block
    of 128 rows (v per head), the kernels' block descales (their A/B against per-head ones)."""

    def __init__(self, portable=False, blocks=False):
        self._key, self._quantised, self.portable = None, None, portable
        self.granularity = ("block", "block", "head") if blocks else ("head",) * 3

    def _quantise(self, q, k, v):
        from ioattn.reference.fp8 import quantize_fp8_ref
        key = tuple((t.data_ptr(), t.shape, t.stride()) for t in (q, k, v))
        if key != self._key:
            self._key, self._quantised = key, [quantize_fp8_ref(t, g) for t, g in zip((q, k, v), self.granularity)]
        return self._quantised

    def __call__(self, q, k, v, causal):
        from ioattn.plan import hopper
        (q8, qs), (k8, ks), (v8, vs) = self._quantise(q, k, v)
        with hopper.prefer_hopper(False) if self.portable else contextlib.nullcontext():
            out = ioattn.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)
        return out.to(q.dtype)

    def same_precision(self, q, k, v, causal):
        from ioattn.reference.fp8 import attention_fp8_ref
        (q8, qs), (k8, ks), (v8, vs) = self._quantise(q, k, v)
        return attention_fp8_ref(q8, k8, v8, qs, ks, vs, causal=causal).to(q.dtype)


def _flex():
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    import torch._dynamo
    # dynamic=False compiles once per shape, mask and grad mode: the train grid needs ~40 entries per
    # head dim, over dynamo's default limit of 8 (past it dynamo would fall back to eager flex).
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 128)
    # The bwd mode times autograd.grad(..., retain_graph=True) over one forward graph, which a
    # backward compiled with donated buffers refuses.
    import torch._functorch.config
    torch._functorch.config.donated_buffer = False
    compiled = torch.compile(flex_attention, dynamic=False)

    @functools.lru_cache(maxsize=16)
    def causal_mask(sq, sk, device):
        # bottom-right aligned, like every other provider here
        offset = sk - sq
        return create_block_mask(lambda b, h, i, j: j <= i + offset, None, None, sq, sk, device=device)

    def run(q, k, v, causal):
        bm = causal_mask(q.shape[1], k.shape[1], str(q.device)) if causal else None
        out = compiled(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=bm,
                       enable_gqa=k.shape[2] != q.shape[2])
        return out.transpose(1, 2)
    return run


class _IoattnFp8Call:
    """``flash_attn_func(q, k, v, fp8=True)``: the quantisation (per head, q and k rotated) inside the timed
    call, so its time against ``ioattn-fp8``'s is the quantisation's cost. Its same-precision twin: the
    float64 emulation of those quantised inputs (``fp8.quantize_qkv``'s recipe)."""

    def __call__(self, q, k, v, causal):
        return ioattn.flash_attn_func(q, k, v, causal=causal, fp8=True)

    def same_precision(self, q, k, v, causal):
        from ioattn.fp8 import quantize_qkv
        from ioattn.reference.fp8 import attention_fp8_ref
        q8, k8, v8, (qs, ks, vs) = quantize_qkv(q, k, v)
        return attention_fp8_ref(q8, k8, v8, qs, ks, vs, causal=causal).to(q.dtype)


class _Sage:
    """SageAttention's quantised forward (``sageattention.sageattn``: int8 Q Kᵀ, its 1.x Triton kernels),
    the quantised peer of the FP8 forward. Held to the same bound as ``ioattn-fp8``: twice the error of
    the float64 FP8 emulation with per-head scales (``same_precision``)."""

    def __init__(self):
        from sageattention import sageattn
        self.fn, self.twin = sageattn, _IoattnFp8()

    def __call__(self, q, k, v, causal):
        return self.fn(q, k, v, tensor_layout="NHD", is_causal=causal)

    def same_precision(self, q, k, v, causal):
        return self.twin.same_precision(q, k, v, causal)


def _import_peer(name):
    """flash-attn (FA2, CUDA), flash-attn's CuTe kernels (FA4) and SageAttention, when installed."""
    if name == "sageattn":
        return _Sage()
    if name == "flash-attn":
        from flash_attn import flash_attn_func as fa2
        return lambda q, k, v, c: fa2(q, k, v, causal=c)
    from flash_attn.cute import flash_attn_func as fa_cute

    def run(q, k, v, causal):
        out = fa_cute(q, k, v, causal=causal)
        return out[0] if isinstance(out, tuple) else out
    return run


def providers(names=None):
    """Name -> (callable or None, reason). Unknown names get a reason, not an exception."""
    table = {"ioattn": (_ioattn, ""), "ioattn-ptr": (_ioattn_ptr, ""), "ioattn-hopper": (_ioattn_hopper, ""),
             "ioattn-hopper-bwd": (_ioattn_hopper_bwd, ""), "ioattn-fp8": (_IoattnFp8(), ""),
             "ioattn-fp8-portable": (_IoattnFp8(portable=True), ""), "ioattn-fp8-call": (_IoattnFp8Call(), ""),
             "ioattn-fp8-blocks": (_IoattnFp8(blocks=True), "")}
    return _with_peers(table, names, _sdpa, _flex, lambda peer: (_import_peer(peer), ""), OURS, "provider")


def _with_peers(table, names, make_sdpa, make_flex, import_peer, ours, what, peers=PEERS):
    """``table`` (ours) completed with the peers (``peers``): SDPA per backend, FlexAttention and the
    imported libraries when they can be built here, each else (None, reason); with ``names``, exactly
    those names, unknown ones with a reason (the train and decode tables share this)."""
    from torch.nn.attention import SDPBackend

    for name, backend in (("sdpa", None), ("sdpa-flash", SDPBackend.FLASH_ATTENTION), ("sdpa-cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("sdpa-efficient", SDPBackend.EFFICIENT_ATTENTION), ("sdpa-math", SDPBackend.MATH)):
        table[name] = (make_sdpa(backend), "")
    wanted = set(table) | set(peers) if names is None else set(names)
    if "flex" in wanted:
        try:
            table["flex"] = (make_flex(), "")
        except Exception as e:  # noqa: BLE001 - an old torch without FlexAttention
            table["flex"] = (None, f"FlexAttention unavailable: {type(e).__name__}: {e}")
    for peer in peers[peers.index("flex") + 1:]:
        if peer in wanted:
            try:
                table[peer] = import_peer(peer)
            except Exception as e:  # noqa: BLE001 - any import failure means "not installed here"
                table[peer] = (None, f"not importable here ({type(e).__name__})")
    if names is None:
        return table
    known = ", ".join(list(ours) + list(peers))
    return {n: table.get(n, (None, f"unknown {what} {n!r}; known: {known}")) for n in names}


# ---------------------------------------------------------------- decode (one query token per sequence)

DECODE_OURS = ("ioattn", "ioattn-checked", "ioattn-paged", "ioattn-unified", "ioattn-graph", "ioattn-nopdl",
               "ioattn-graph-nopdl", "ioattn-tma", "ioattn-fp8", "ioattn-split")
DECODE_PEERS = PEERS + ("flashinfer", "flashinfer-fp8")
DECODE_PAGE_SIZE = 256
UNIFIED_CALIBRATION_KEYS = 1024


@functools.lru_cache(maxsize=1)
def _kvcache_params():
    """The keyword arguments ``ioattn.flash_attn_with_kvcache`` accepts (read once)."""
    return frozenset(inspect.signature(ioattn.flash_attn_with_kvcache).parameters)


def _unchecked():
    """``check_values=False`` (trust the index tensors, no host read-back) where it is accepted."""
    return {"check_values": False} if "check_values" in _kvcache_params() else {}


def _kvcache_setup(**extra):
    def setup(q, k_cache, v_cache, cache_seqlens):
        f, kw = ioattn.flash_attn_with_kvcache, {**extra, **_unchecked()}
        return lambda: f(q, k_cache, v_cache, cache_seqlens=cache_seqlens, **kw)
    return setup


class _Fp8DecodeSetup:
    """The unchecked call over e4m3 caches: K and V quantised per (batch, KV head) at setup
    (``quantize_fp8_ref``; ``granularity``: "tensor" for a peer's one scale a tensor), their descales
    passed as ``k_descale`` / ``v_descale``. Its same-precision twin (``same_precision``): PyTorch's
    attention in q's dtype over the dequantised caches, so the check holds it to twice the error the
    e4m3 cache itself costs. (Its GB/s count bf16 bytes: it reads half as many.)"""

    def __init__(self, granularity="head"):
        self.granularity = granularity

    def _quantised(self, k_cache, v_cache):
        from ioattn.reference.fp8 import quantize_fp8_ref
        return [quantize_fp8_ref(t, self.granularity) for t in (k_cache, v_cache)]

    def __call__(self, q, k_cache, v_cache, cache_seqlens):
        (k8, ks), (v8, vs) = self._quantised(k_cache, v_cache)
        f, kw = ioattn.flash_attn_with_kvcache, _unchecked()
        return lambda: f(q, k8, v8, cache_seqlens=cache_seqlens, k_descale=ks, v_descale=vs, **kw)

    def same_precision(self, q, k_cache, v_cache, cache_seqlens):
        from ioattn.reference.decode import kvcache_attention_ref
        from ioattn.reference.fp8 import dequantize_fp8_ref
        k, v = (dequantize_fp8_ref(t, s).to(q.dtype) for t, s in self._quantised(k_cache, v_cache))
        return kvcache_attention_ref(q, k, v, cache_seqlens=cache_seqlens, upcast=False)[0]


def _checked_setup(q, k_cache, v_cache, cache_seqlens):
    f = ioattn.flash_attn_with_kvcache
    return lambda: f(q, k_cache, v_cache, cache_seqlens=cache_seqlens)


def paged_copy(k_cache, v_cache, page_size=DECODE_PAGE_SIZE, seed=0):
    """The contiguous caches copied into pages (num_pages, page_size, nheads_kv, d), num_pages =
    batch * ceil(kvlen / page_size), laid out in a random permutation of the pages; returns
    (k_pages, v_pages, block_table int32 (batch, pages per sequence))."""
    batch, kvlen, hkv, d = k_cache.shape
    per_seq = -(-kvlen // page_size)
    num_pages = batch * per_seq
    perm = torch.randperm(num_pages, generator=torch.Generator().manual_seed(seed)).to(k_cache.device)
    pages = []
    for cache in (k_cache, v_cache):
        if kvlen != per_seq * page_size:  # pad the last page (never read: cache_seqlens bounds it)
            full = cache.new_zeros(batch, per_seq * page_size, hkv, d)
            full[:, :kvlen] = cache
            cache = full
        chunks = cache.reshape(num_pages, page_size, hkv, d)  # chunk b * per_seq + j: tokens of page j of b
        pages.append(torch.empty_like(chunks).index_copy_(0, perm, chunks))
    return pages[0], pages[1], perm.view(batch, per_seq).to(torch.int32)


def _paged_setup(q, k_cache, v_cache, cache_seqlens):
    k_pages, v_pages, block_table = paged_copy(k_cache, v_cache)
    f, kw = ioattn.flash_attn_with_kvcache, _unchecked()
    return lambda: f(q, k_pages, v_pages, cache_seqlens=cache_seqlens, block_table=block_table, **kw)


def calibrate_unified_max(q, k_cache, softmax_scale=None, keys=UNIFIED_CALIBRATION_KEYS):
    """phi for the unified max from a calibration sample, as FlashDecoding++ does offline: the largest
    score q . k^T * scale over every row and the first ``keys`` keys of each sequence."""
    batch, _, nheads, d = q.shape
    hkv = k_cache.shape[2]
    scale = 1.0 / d ** 0.5 if softmax_scale is None else softmax_scale
    qg = q.float().view(batch, q.shape[1], hkv, nheads // hkv, d)  # query heads grouped by KV head
    s = torch.einsum("bqgrd,bkgd->bgrqk", qg, k_cache[:, :keys].float())
    return float(s.max()) * scale


def _unified_setup(q, k_cache, v_cache, cache_seqlens):
    phi = calibrate_unified_max(q, k_cache)
    return _kvcache_setup(unified_max=phi)(q, k_cache, v_cache, cache_seqlens)


def _configured(**fields):
    """Setup of the unchecked call with fields of the decode plan forced (``decode_config``): the A/B
    providers against the default (``pdl=False``, ``use_tma=True``)."""
    def setup(q, k_cache, v_cache, cache_seqlens):
        from ioattn.decode import decode_config
        call = _kvcache_setup()(q, k_cache, v_cache, cache_seqlens)

        def run():
            with decode_config(**fields):
                return call()
        return run
    return setup


def _graph_setup(q, k_cache, v_cache, cache_seqlens, fields=None):
    """One unchecked call captured into a CUDA graph; ``run`` replays it (``fields``: captured with
    those fields of the decode plan forced, as ``_configured``)."""
    return graph_replay((_configured(**fields) if fields else _kvcache_setup())(q, k_cache, v_cache, cache_seqlens))


def graph_replay(call):
    """``call`` (a no-argument function) warmed up on a side stream, captured into a CUDA graph;
    returns the replay (which returns the captured call's output)."""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up (compile, autotune, allocate) outside the capture
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call()
        torch.cuda.synchronize()
    except Exception as e:  # reported as this provider's error
        first = str(e).splitlines()[0][:160] if str(e) else ""
        raise RuntimeError(f"CUDA graph capture failed: {type(e).__name__}: {first}") from e

    def run():
        graph.replay()
        return out
    return run


def _full_caches(k_cache, cache_seqlens, who):
    """Peers without a length argument attend to the whole cache: refuse partly filled caches (a
    host read, at setup only)."""
    if int(cache_seqlens.min()) != k_cache.shape[1]:
        raise ValueError(f"{who} here needs every cache full (cache_seqlens == {k_cache.shape[1]})")


def _sdpa_reasons(caught):
    """SDPA's warnings about a refused backend as one line: the reasons, without the headers
    ("... not used because:") and the "(Triggered internally at ...)" source locations."""
    reasons = []
    for w in caught:
        text = " ".join(re.sub(r"\(Triggered internally at [^)]*\)\.?", "", str(w.message)).split())
        if text and not text.endswith("because:"):
            reasons.append(text)
    return "; ".join(reasons)


def _sdpa_decode(backend):
    def setup(q, k_cache, v_cache, cache_seqlens):
        _full_caches(k_cache, cache_seqlens, "sdpa")
        qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)  # (B, H, S, D)

        def run():
            with _backend(backend):
                out = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True)
            return out.transpose(1, 2)

        with warnings.catch_warnings(record=True) as caught:  # a refusing backend says why in warnings
            warnings.simplefilter("always")
            try:
                run()
            except RuntimeError as e:
                raise RuntimeError(f"{getattr(backend, 'name', 'SDPA')} refused: {_sdpa_reasons(caught) or e}") from e
        return run
    return setup


def _flex_decode():
    from torch.nn.attention.flex_attention import flex_attention

    import torch._dynamo
    # dynamic=False compiles once per shape, mask and grad mode: the train grid needs ~40 entries per
    # head dim, over dynamo's default limit of 8 (past it dynamo would fall back to eager flex).
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 128)
    compiled = torch.compile(flex_attention, dynamic=False)

    def setup(q, k_cache, v_cache, cache_seqlens):
        _full_caches(k_cache, cache_seqlens, "flex")
        qt, kt, vt = q.transpose(1, 2), k_cache.transpose(1, 2), v_cache.transpose(1, 2)
        return lambda: compiled(qt, kt, vt, enable_gqa=True).transpose(1, 2)
    return setup


FLASHINFER_PAGE = 64  # the contiguous caches viewed as pages of this many tokens (no copy)
FLASHINFER_WORKSPACE = 128 << 20  # bytes: FlashInfer's own example's float workspace


class _FlashInferDecode:
    """FlashInfer's batch decode (``BatchDecodeWithPagedKVCacheWrapper``, its ``auto`` backend, tensor
    cores from four query heads a KV head as its documentation advises) over the contiguous caches viewed
    as pages of ``FLASHINFER_PAGE`` tokens in order, planned once at setup; ``fp8``: e4m3 caches with
    one scale a tensor (its ``k_scale`` / ``v_scale`` form), and a same-precision twin as ours has."""

    def __init__(self, fp8=False):
        import flashinfer

        self.fi, self.twin = flashinfer, _Fp8DecodeSetup("tensor") if fp8 else None

    def __call__(self, q, k_cache, v_cache, cache_seqlens):
        batch, capacity, hkv, d = k_cache.shape
        if capacity % FLASHINFER_PAGE or v_cache.shape[-1] != d:
            raise ValueError(f"flashinfer here: caches of whole {FLASHINFER_PAGE}-token pages, V's head dim K's")
        scales = {}
        if self.twin is not None:  # (setup: the scales read back once)
            (k_cache, ks), (v_cache, vs) = self.twin._quantised(k_cache, v_cache)
            scales = dict(k_scale=float(ks), v_scale=float(vs))
        per = capacity // FLASHINFER_PAGE
        pages = [c.reshape(batch * per, FLASHINFER_PAGE, hkv, d) for c in (k_cache, v_cache)]
        dev = q.device
        lens = cache_seqlens.to(torch.int32)
        used = (lens + FLASHINFER_PAGE - 1) // FLASHINFER_PAGE
        indptr = torch.zeros(batch + 1, dtype=torch.int32, device=dev)
        indptr[1:] = torch.cumsum(used, 0)
        indices = torch.cat([torch.arange(b * per, b * per + int(n), dtype=torch.int32, device=dev)
                             for b, n in enumerate(used.tolist())])
        last = lens - (used - 1) * FLASHINFER_PAGE
        nheads = q.shape[2]
        wrapper = self.fi.BatchDecodeWithPagedKVCacheWrapper(
            torch.empty(FLASHINFER_WORKSPACE, dtype=torch.uint8, device=dev), "NHD",
            use_tensor_cores=nheads // hkv >= 4)
        wrapper.plan(indptr, indices, last, nheads, hkv, d, FLASHINFER_PAGE, q_data_type=q.dtype,
                     kv_data_type=k_cache.dtype)
        q3 = q[:, 0]
        return lambda: wrapper.run(q3, tuple(pages), **scales).unsqueeze(1)

    def same_precision(self, q, k_cache, v_cache, cache_seqlens):
        if self.twin is not None:
            return self.twin.same_precision(q, k_cache, v_cache, cache_seqlens)
        from ioattn.reference.decode import kvcache_attention_ref
        return kvcache_attention_ref(q, k_cache, v_cache, cache_seqlens=cache_seqlens, upcast=False)[0]


def _import_decode_peer(name):
    if name in ("flashinfer", "flashinfer-fp8"):
        return _FlashInferDecode(fp8=name == "flashinfer-fp8"), ""
    if name == "sageattn":
        return None, "SageAttention: no KV-cache decoding entry measured here"
    if name == "flash-attn":
        from flash_attn import flash_attn_with_kvcache as fa
    else:
        from flash_attn import cute

        fa = getattr(cute, "flash_attn_with_kvcache", None)
        if fa is None:
            try:
                from flash_attn.cute.interface import flash_attn_with_kvcache as fa
            except ImportError:
                return None, "flash_attn.cute has no flash_attn_with_kvcache"

    def setup(q, k_cache, v_cache, cache_seqlens):
        def run():
            out = fa(q, k_cache, v_cache, cache_seqlens=cache_seqlens)
            return out[0] if isinstance(out, tuple) else out
        return run
    return setup, ""


def decode_providers(names=None):
    """Name -> (setup or None, reason) for the decode sweep; unknown or unavailable names get a
    reason, never an exception. ``ioattn``: unchecked index values when the API offers it;
    ``ioattn-checked``: the default (values checked); ``ioattn-paged``: the same data in pages of
    256 tokens in a random order; ``ioattn-unified``: with a unified max from a calibration sample;
    ``ioattn-graph``: the ``ioattn`` call captured once into a CUDA graph and replayed;
    ``ioattn-nopdl`` / ``ioattn-graph-nopdl``: the same without programmatic dependent launch of the
    merge kernel (the default uses it on Hopper; kept as the A/B that justifies it); ``ioattn-tma``:
    K/V through tensor descriptors on the contiguous cache (the A/B of the pointer-load default);
    ``ioattn-split``: MLA calls kept on the split kernel (the A/B of the Gluon MLA kernel); ``ioattn-fp8``: the same data in e4m3 caches with per-head descales (``_Fp8DecodeSetup``)."""
    table = {"ioattn": (_kvcache_setup(), ""), "ioattn-checked": (_checked_setup, ""),
             "ioattn-paged": (_paged_setup, ""), "ioattn-fp8": (_Fp8DecodeSetup(), "")}
    table["ioattn-unified"] = ((_unified_setup, "") if "unified_max" in _kvcache_params()
                               else (None, "needs unified_max support"))
    table["ioattn-graph"] = ((_graph_setup, "") if torch.cuda.is_available()
                             else (None, "needs CUDA (CUDA graph replay)"))
    cuda = torch.cuda.is_available()
    for name, fields in (("nopdl", dict(pdl=False)), ("tma", dict(use_tma=True)), ("split", dict(kernel="split"))):
        table[f"ioattn-{name}"] = (_configured(**fields), "") if cuda else (None, f"needs CUDA (the A/B of {fields})")
    for name, fields in (("nopdl", dict(pdl=False)),):
        table[f"ioattn-graph-{name}"] = ((functools.partial(_graph_setup, fields=fields), "") if cuda
                                         else (None, "needs CUDA (CUDA graph replay)"))
    return _with_peers(table, names, _sdpa_decode, _flex_decode, _import_decode_peer, DECODE_OURS,
                       "decode provider", DECODE_PEERS)
