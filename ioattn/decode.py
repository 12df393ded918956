"""``flash_attn_with_kvcache``: attention of a few new query tokens over a KV cache (decoding).

Semantics are flash-attn's, stated in ``ioattn.reference.decode`` (the oracle): optional rotary on
q and the new keys, an in-place append of the new k/v into the cache (contiguous, optionally
through ``cache_batch_idx``, or paged through ``block_table``), then attention over each sequence's
valid columns ``[cache_leftpad, cache_seqlens + seqlen_new)``.

Every argument is checked before the cache is touched: a refused call raises ``ValueError`` or
``TypeError`` naming the argument and leaves ``k_cache``/``v_cache`` as they were. The value checks
(cache_seqlens, block_table, cache_batch_idx, cache_leftpad ranges) read those tensors back to the
host once.

On CUDA (or under ``TRITON_INTERPRET=1``) the attention is the Flash-Decoding split-KV kernel of
``ioattn.kernels.decode`` followed by ``merge_attention_states``; elsewhere a plain PyTorch path
computing in float32.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import asdict, dataclass, field
from typing import Optional

import torch

from ioattn.plan import dispatch, options
from ioattn.api import _DTYPES, MAX_HEADDIM
from ioattn.backends import _scalars
from ioattn.kernels.constants import LOG2E
from ioattn.launch.cached import launcher_for
from ioattn.masks import normalize_window
from ioattn.launch.merge import merge_states
from ioattn.reference.decode import apply_rotary_ref, gather_kv_ref
from ioattn.reference.naive import attention_ref

# Launch policy (the device sweeps of `benchmarks/tune_decode.py` and `benchmarks/ab_decode.py`):
# - BLOCK_N 128, 2 stages; split launches read through pointers take BLOCK_N 64, 3 stages (ahead at
#   batch 1, behind without splits and on paged caches read through TMA). 16 under the interpreter so
#   that the small test caches cross several chunks and splits. Shrinks to divide the page size.
# - splits: enough programs for SPLIT_WAVES programs per SM, at least one chunk per split, at most
#   MAX_SPLITS; none once batch * KV heads fill the SMs.
# - loads: pointers on contiguous caches (TMA within a few per cent there, with a host-side descriptor
#   cost); paged caches through TMA without splits and with many (``_PAGED_TMA_MIN_SPLITS``).
# BLOCK_M is the packed row count (group * seqlen_q) rounded up to a power of two, >= 16, <= 64.
# tuned: docs/decisions/decode-splits.md, docs/decisions/decode-paged-loads.md
DEFAULT_NUM_SMS = 132  # H100/H200; the device's own count is used when there is one
SPLIT_WAVES = 2
# At least this many keys per split on the GPU (contiguous caches; the waves rule sets longer caches'
# counts first). Paged caches keep at least one 128-key chunk per split, their count before this rule.
# tuned: docs/decisions/decode-splits.md
MIN_KEYS_PER_SPLIT = 256
# The tail split (``_tail_split``) needs this many whole waves before the tail (after one wave, splitting
# every unit in two wins). tuned: docs/decisions/decode-splits.md
TAIL_MIN_WAVES = 2
# The wide tile without splits compiles to 186 registers a thread (2 programs of 128 threads per SM),
# its split launches to 168 (3 per SM; benchmarks/decode_occupancy.py). Where the units need more than
# 2 but at most 3 programs per SM, a launch that is neither split nor tail-split is capped at
# WIDE_MAX_REGS (Triton's maxnreg; 3 x 168 x 128 <= 65536), so every unit is resident at once
# (contiguous caches; paged ones read through pointers there instead, see plan()); elsewhere the cap
# loses. tests/test_decode.py's sm_90 compile fails if the split launch of the wide tile needs more
# than 170 registers (2 programs per SM: the wave rules would move). tuned: docs/decisions/decode-one-wave.md
WIDE_MAX_REGS = 168
# Where the units need more than 3 but at most 5 programs per SM (batch 50-82 at 8 KV heads on 132
# SMs), a launch without splits takes 64-key chunks with 2 stages (38 KB of ring, 119 registers
# compiled for sm_90) with its registers capped so that 4 or 5 programs share an SM and every unit is
# resident at once (ONE_WAVE_MAX_REGS: 65536 / 128 / p rounded down to 8; 102 -> 96), where the wide
# tile's 2 an SM run 1.8-2.5 waves. Uncapped past one wave of it, or at one wave of the wide tile (each
# program's smaller ring keeping half the bytes in flight), it loses. A tail split stays first only
# where the tail is at most SMs / 8 units and the one-wave launch would need 4 programs an SM
# (ONE_WAVE_TAIL_FIRST). Paged caches (pages that 64 divides) take it too, through pointer loads.
# tuned: docs/decisions/decode-one-wave.md
ONE_WAVE_BLOCK_N = 64
ONE_WAVE_STAGES = 2
ONE_WAVE_MAX_REGS = {4: 128, 5: 96}  # programs per SM -> register cap
ONE_WAVE_TAIL_FIRST = {4: 8}  # programs per SM -> the tail split first for tails of at most SMs // this
MAX_SPLITS = 256
_BLOCK_N_CUDA = 128
_BLOCK_N_SPLIT = 64  # split launches with pointer loads (above)
_BLOCK_N_INTERPRETER = 16
_MAX_BLOCK_M = 64
_NUM_WARPS = 4
_NUM_STAGES = 2
_NUM_STAGES_SPLIT = 3  # split launches with pointer loads (above)
_USE_TMA_DEFAULT = False
# Paged caches with many splits read through TMA (ahead of pointer loads at batch 1's 32-33 splits,
# behind at batch 8's 5): the threshold sits between the two measured split counts.
# tuned: docs/decisions/decode-paged-loads.md
_PAGED_TMA_MIN_SPLITS = 16
# Programmatic dependent launch of the merge after the split kernel (Hopper): hides the launch gap
# between a step's two kernels. On by default; `IOATTN_DECODE_PDL=0` or ``decode_config(pdl=False)``
# turns it off. tuned: docs/decisions/decode-launches.md
_PDL_DEFAULT = True
# The split programs let the merge grid launch after their key loop, not at their start: a merge grid
# resident from the split kernel's start held SM room the split programs' loads could use.
# The split kernel launched by programmatic dependent launch itself (waiting for the stream's previous
# work first thing), so its launch overlaps that work's end: calls back to back, as in a decode loop,
# lose the gap before the split kernel (a timing that records an event between two calls does not
# show it). On; IOATTN_DECODE_PDL_WAIT=0 or decode_config(pdl_wait=False) turn it off.
# tuned: docs/decisions/decode-launches.md
_PDL_WAIT_DEFAULT = True

# Unified max (FlashDecoding++): a split keeps phi only if every row max m satisfies
# phi - below <= m <= phi + above (log2 units). Above: exp2(s - phi) must fit the dtype the
# probabilities are cast to for P @ V (fp16 tops out at 65504 < 2**16; bf16/fp32 reach 2**127, and
# 2**64 leaves room for sums over 2**40 keys). Below: the largest probability of the row stays a
# normal number with room to spare (fp16 normals start at 2**-14). Off unless the caller passes
# ``unified_max``: docs/decisions/decode-unified-max.md.
PHI_RANGE = {torch.float16: (8.0, 15.0), torch.bfloat16: (64.0, 64.0), torch.float32: (64.0, 64.0)}

_plan_override: dict = {}


@dataclass(frozen=True)
class DecodePlan:
    """One launch of the split kernel: packed-row tile, key chunk, split count, load path."""
    block_m: int
    block_n: int
    num_splits: int
    use_tma: bool
    num_warps: int
    num_stages: int
    pdl: bool = False  # merge launched with programmatic dependent launch (only with splits)
    pdl_wait: bool = False  # the split kernel itself launched by PDL after the stream's previous work
    # units (sequence, KV head, row block) taken whole before the split ones; None: all whole when
    # num_splits == 1, else none (see _tail_split)
    num_whole: int | None = None
    max_regs: int | None = None  # a register cap for the launch (Triton's maxnreg), None: the compiler's choice
    reason: str = field(default="", compare=False)  # why: the rules that chose the fields (explain_decode)


@contextlib.contextmanager
def decode_config(**fields):
    """Force fields of the ``DecodePlan`` (block_n, num_splits, use_tma, num_warps, num_stages, pdl,
    pdl_wait, num_whole, max_regs) for the calls inside: tuning sweeps and tests (``pdl`` and
    ``pdl_wait`` are still only used where they can run; ``num_whole`` is rounded down to whole batch
    elements, and ``tail_split=False`` turns the tail split off)."""
    unknown = set(fields) - {"block_n", "num_splits", "use_tma", "num_warps", "num_stages", "pdl", "pdl_wait",
                             "num_whole", "tail_split", "max_regs"}
    if unknown:
        raise ValueError(f"decode_config: unknown fields {sorted(unknown)}")
    previous = dict(_plan_override)
    _plan_override.update(fields)
    try:
        yield
    finally:
        _plan_override.clear()
        _plan_override.update(previous)


def _type_name(x):
    return x.dtype if isinstance(x, torch.Tensor) else type(x).__name__


def _check_index_tensor(name, t, shape_text, ndim, device):
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
        raise TypeError(f"{name} must be an int32 tensor {shape_text}, got {_type_name(t)}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have shape {shape_text}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device}, got {t.device}")


def _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
              cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi_slopes,
              num_splits, check_values=True, unified_max=None):
    """All checks; returns the normalised call (nothing has been written yet).

    Shapes, dtypes and devices are always checked. With ``check_values`` the index tensors' values
    are checked too, read back to the host in one transfer; without it (or while a CUDA graph is
    being captured, when no read-back is possible) they are trusted and the returned max end is
    None."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions, got shape {tuple(t.shape)}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
    shapes = f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)}"
    if not (q.dtype == k_cache.dtype == v_cache.dtype):
        raise TypeError(f"q, k_cache, v_cache must share one dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    device = q.device
    if not (k_cache.device == v_cache.device == device):
        raise ValueError(f"q, k_cache, v_cache must be on one device, got {device}, {k_cache.device}, {v_cache.device}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have the same shape, got {shapes}")
    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k_cache.shape[2]
    if k_cache.shape[3] != d:
        raise ValueError(f"q and k_cache must have the same head dim, got {shapes}")
    if not 1 <= d <= MAX_HEADDIM:
        raise ValueError(f"head dim must be between 1 and {MAX_HEADDIM}, got {d} ({shapes})")
    if nheads_kv == 0 or nheads % nheads_kv != 0:
        raise ValueError(f"number of query heads ({nheads}) must be a multiple of the number of key/value "
                         f"heads ({nheads_kv}): {shapes}")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError(f"k_cache and v_cache must be contiguous in the head dim (stride 1), got strides "
                         f"{k_cache.stride()} and {v_cache.stride()}")

    # cache layout
    if block_table is not None:
        if cache_batch_idx is not None:
            raise ValueError("cache_batch_idx is for the contiguous cache only; it cannot be used with block_table")
        _check_index_tensor("block_table", block_table, f"({batch}, max_pages_per_seq)", 2, device)
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table must have shape ({batch}, max_pages_per_seq), got {tuple(block_table.shape)}")
        num_pages, page_size = k_cache.shape[0], k_cache.shape[1]
        if page_size == 0 or page_size % 16:
            raise ValueError(f"page size (k_cache.shape[1]) must be a positive multiple of 16, got {page_size}")
        capacity = block_table.shape[1] * page_size
    else:
        capacity = k_cache.shape[1]
        if cache_batch_idx is not None:
            _check_index_tensor("cache_batch_idx", cache_batch_idx, f"({batch},)", 1, device)
            if cache_batch_idx.shape[0] != batch:
                raise ValueError(f"cache_batch_idx must have shape ({batch},), got {tuple(cache_batch_idx.shape)}")
        elif k_cache.shape[0] < batch:
            raise ValueError(f"the contiguous cache needs a row per sequence (or cache_batch_idx): batch {batch} "
                             f"> k_cache.shape[0] {k_cache.shape[0]} ({shapes})")

    # new tokens
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (or neither)")
    seqlen_new = 0
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
            if t.dtype != q.dtype:
                raise TypeError(f"{name} must have q's dtype {q.dtype}, got {t.dtype}")
            if t.device != device:
                raise ValueError(f"{name} must be on {device}, got {t.device}")
        if k.shape != v.shape or k.dim() != 4 or k.shape[0] != batch or tuple(k.shape[2:]) != (nheads_kv, d):
            raise ValueError(f"k and v must both be (batch={batch}, seqlen_new, nheads_kv={nheads_kv}, d={d}), got "
                             f"{tuple(k.shape)} and {tuple(v.shape)}")
        seqlen_new = k.shape[1]
        if cache_seqlens is None:
            raise ValueError("cache_seqlens is required when new k/v are given (it says where they are written)")

    # lengths
    if cache_seqlens is None:
        seqlens = [capacity] * batch
    elif isinstance(cache_seqlens, bool):
        raise TypeError(f"cache_seqlens must be an int or an int32 tensor of shape ({batch},), got a bool")
    elif isinstance(cache_seqlens, int):
        seqlens = [cache_seqlens] * batch
    else:
        _check_index_tensor("cache_seqlens", cache_seqlens, f"({batch},)", 1, device)
        if cache_seqlens.shape[0] != batch:
            raise ValueError(f"cache_seqlens must have shape ({batch},), got {tuple(cache_seqlens.shape)}")
        seqlens = None  # on the device: read below with the other index values
    if cache_leftpad is not None:
        _check_index_tensor("cache_leftpad", cache_leftpad, f"({batch},)", 1, device)
        if cache_leftpad.shape[0] != batch:
            raise ValueError(f"cache_leftpad must have shape ({batch},), got {tuple(cache_leftpad.shape)}")

    # scalars
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(d)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number or None, got {softmax_scale!r}")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0 \
            or not math.isfinite(softcap):
        raise ValueError(f"softcap must be a finite number >= 0, got {softcap!r}")
    window = normalize_window(window_size, bool(causal))
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0 = heuristic), got {num_splits!r}")
    if alibi_slopes is not None:
        if not isinstance(alibi_slopes, torch.Tensor) or not alibi_slopes.is_floating_point():
            raise TypeError(f"alibi_slopes must be a floating-point tensor or None, got {_type_name(alibi_slopes)}")
        if tuple(alibi_slopes.shape) not in ((nheads,), (batch, nheads)):
            raise ValueError(f"alibi_slopes must have shape ({nheads},) or ({batch}, {nheads}), got "
                             f"{tuple(alibi_slopes.shape)}")
        if alibi_slopes.device != device:
            raise ValueError(f"alibi_slopes must be on {device}, got {alibi_slopes.device}")
    if unified_max is not None and (isinstance(unified_max, bool) or not isinstance(unified_max, (int, float))
                                    or not math.isfinite(unified_max)):
        raise ValueError(f"unified_max must be a finite number or None, got {unified_max!r}")

    # rotary
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together (or neither)")
    if rotary_cos is not None:
        for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise TypeError(f"{name} must be a floating-point tensor, got {_type_name(t)}")
            if t.device != device:
                raise ValueError(f"{name} must be on {device}, got {t.device}")
        if rotary_cos.dim() != 2 or rotary_cos.shape != rotary_sin.shape:
            raise ValueError(f"rotary_cos and rotary_sin must both be (seqlen_ro, rotary_dim / 2), got "
                             f"{tuple(rotary_cos.shape)} and {tuple(rotary_sin.shape)}")
        rotary_dim = 2 * rotary_cos.shape[1]
        if not 0 < rotary_dim <= d:
            raise ValueError(f"rotary_dim (2 * rotary_cos.shape[1] = {rotary_dim}) must be in (0, head dim {d}]")

    # index values: one read-back of everything, then the range checks
    if not check_values or (device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return float(softmax_scale), float(softcap), window, seqlen_new, None
    parts = [t for t in (cache_seqlens if seqlens is None else None, cache_leftpad, cache_batch_idx, block_table)
             if t is not None]
    values = torch.cat([t.reshape(-1) for t in parts]).tolist() if parts else []
    if seqlens is None:
        seqlens, values = values[:batch], values[batch:]
    if any(s < 0 or s + seqlen_new > capacity for s in seqlens):
        raise ValueError(f"cache_seqlens + seqlen_new must lie in [0, {capacity}] (the cache capacity), got "
                         f"cache_seqlens {seqlens} with seqlen_new {seqlen_new}")
    ends = [s + seqlen_new for s in seqlens]
    if cache_leftpad is not None:
        pads, values = values[:batch], values[batch:]
        if any(p < 0 or p > e for p, e in zip(pads, ends)):
            raise ValueError(f"need 0 <= cache_leftpad <= cache_seqlens + seqlen_new, got cache_leftpad {pads}, "
                             f"cache_seqlens + seqlen_new {ends}")
    if cache_batch_idx is not None:
        rows, values = values[:batch], values[batch:]
        if rows and (min(rows) < 0 or max(rows) >= k_cache.shape[0]):
            raise ValueError(f"cache_batch_idx entries must lie in [0, {k_cache.shape[0]}) (k_cache rows), "
                             f"got values {min(rows)}..{max(rows)}")
    if block_table is not None and values:
        num_pages = k_cache.shape[0]
        if min(values) < 0 or max(values) >= num_pages:
            raise ValueError(f"block_table entries must lie in [0, {num_pages}) (k_cache has {num_pages} pages), "
                             f"got values {min(values)}..{max(values)}")
    if rotary_cos is not None:
        per_token = window != (-1, -1)
        need = max([s + max(seqlen_new, seqlen_q if per_token else 1) for s in seqlens], default=0)
        if need > rotary_cos.shape[0]:
            raise ValueError(f"rotary_cos/rotary_sin have {rotary_cos.shape[0]} rows but positions up to "
                             f"{need - 1} are rotated (cache_seqlens {seqlens}, seqlen_q {seqlen_q}, "
                             f"seqlen_new {seqlen_new})")
    return float(softmax_scale), float(softcap), window, seqlen_new, max(ends, default=0)


def _storage_index(positions, block_table, cache_batch_idx, page_size):
    """(first index, row) of the absolute cache columns ``positions`` (batch, n)."""
    if block_table is not None:
        first = block_table.long().gather(1, positions // page_size)
        return first, positions % page_size
    batch = positions.shape[0]
    rows = cache_batch_idx.long() if cache_batch_idx is not None else torch.arange(batch, device=positions.device)
    return rows[:, None].expand_as(positions), positions


def _heuristic_splits(programs, max_end, block_n, num_sms=DEFAULT_NUM_SMS, min_keys=0):
    """As many splits as keep the grid within ``SPLIT_WAVES`` programs per SM (rounded down: a grid
    just past it leaves some SMs one program more than the rest, and the step waits for them), but
    at least one key chunk and ``min_keys`` keys per split of the longest sequence, and at most
    ``MAX_SPLITS``; 1 when the (sequence, KV head) programs alone fill the SMs
    (docs/decisions/decode-splits.md)."""
    if programs >= num_sms or max_end == 0:
        return 1
    pieces = dispatch.cdiv(max_end, max(block_n, min_keys))
    n = max(1, min(SPLIT_WAVES * num_sms // programs, pieces, MAX_SPLITS))
    # A count at most 1/8 past a power of two takes the power of two: the merge pads the splits to one
    # (33 -> 64 rows a load), and the split kernel runs faster with the extra programs gone.
    p = 1 << (n.bit_length() - 1)
    return p if 8 * (n - p) <= n else n


def _tail_split(units, units_per_batch, slots, pieces):
    """(whole units, split count of the rest) for a launch of ``units`` programs without splits on
    ``slots`` SMs, when the last wave would hold at most half the SMs; ``(units, 1)`` otherwise.
    After ``TAIL_MIN_WAVES`` whole waves or more, the batch elements that make up the last wave are
    split ``slots // tail`` ways (at most ``pieces``, the key chunks of the longest sequence), so the
    step ends on a short wave of pieces instead of a few SMs reading one whole unit each; after one
    wave, every unit is split in two (whole = 0). Measurements: docs/decisions/decode-splits.md."""
    waves, rest = divmod(units, slots)
    if waves == 0 or rest == 0 or rest > slots // 2:
        return units, 1
    if waves < TAIL_MIN_WAVES:
        return (0, 2) if pieces >= 2 else (units, 1)
    whole = waves * slots // units_per_batch * units_per_batch  # the split units are a batch suffix
    k = min(slots // (units - whole), pieces, MAX_SPLITS)
    return (whole, k) if k >= 2 else (units, 1)


@functools.lru_cache(maxsize=8)
def _num_sms(device):
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _tma_ok(k_cache, v_cache, d):
    """Descriptors over the cache: sm_90+ (or the interpreter), 16-byte aligned base and strides,
    d a power of two up to 128 (the box is the whole head; two stages of 128-key K and V tiles of a
    larger head do not fit in shared memory)."""
    if k_cache.is_cuda and not _sm90(k_cache.device):
        return False
    return d == dispatch.block_d(d) and d <= 128 and min(k_cache.shape) > 0 and _aligned16(k_cache, v_cache)


def _aligned16(*tensors):
    """Base and every stride but the last 16-byte aligned (TMA descriptors)."""
    return all(t.data_ptr() % 16 == 0 and all((st * t.element_size()) % 16 == 0 for st in t.stride()[:-1])
               for t in tensors)


def _switch(field, env_name, default):
    """An on/off plan choice: ``decode_config(field=...)`` first, else the environment variable ("1"
    on, anything else set off), else the default."""
    if field in _plan_override:
        return bool(_plan_override[field])
    env = options.env(env_name)
    return env == "1" if env else default


_PLANS: dict = {}
_PLANS_MAX = 256


def plan(q, k_cache, v_cache, paged, span, num_splits=0):
    """The launch for one call: ``span`` is the longest key range any sequence may have (its max end
    when the values were read, else the cache capacity, so the plan never depends on device values).
    Memoized on everything the rules read (shapes, strides, alignment, device, the forced fields and
    the environment switches): a decode loop plans once (host time: docs/decisions/decode-launches.md)."""
    key = (q.shape, q.device, k_cache.shape, k_cache.stride(), v_cache.stride(), k_cache.element_size(),
           _aligned16(k_cache, v_cache), paged, span, num_splits, tuple(_plan_override.items()),
           options.env("IOATTN_DECODE_PDL"), options.env("IOATTN_DECODE_PDL_WAIT"))
    cfg = _PLANS.get(key)
    if cfg is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        cfg = _PLANS[key] = _plan(q, k_cache, v_cache, paged, span, num_splits)
    return cfg


def _plan(q, k_cache, v_cache, paged, span, num_splits):
    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k_cache.shape[2]
    # on the GPU, split launches take the split tiles (the policy notes at the top)
    split_tiles = q.is_cuda and "block_n" not in _plan_override
    block_n = _plan_override.get("block_n", _BLOCK_N_SPLIT if split_tiles else
                                 _BLOCK_N_CUDA if q.is_cuda else _BLOCK_N_INTERPRETER)
    rows = (nheads // nheads_kv) * seqlen_q
    block_m = min(_MAX_BLOCK_M, max(16, dispatch.next_power_of_2(rows)))
    programs = batch * nheads_kv * dispatch.cdiv(rows, block_m)
    heuristic = num_splits == 0
    sms = _num_sms(q.device)
    why = [f"{programs} units (sequence x KV head x row block of {block_m}) on {sms} SMs"]
    if heuristic:
        min_keys = (_BLOCK_N_CUDA if paged else MIN_KEYS_PER_SPLIT) if q.is_cuda else 0
        num_splits = _plan_override.get("num_splits") or _heuristic_splits(programs, span, block_n, sms,
                                                                           min_keys=min_keys)
        why.append("split count forced" if "num_splits" in _plan_override else
                   "they fill the SMs: no split" if num_splits == 1 else
                   f"{num_splits} splits (the waves rule, at least {max(block_n, min_keys)} keys a split)")
    else:
        why.append(f"num_splits={num_splits} from the call")
    per_batch = programs // batch
    num_whole = None
    if "num_whole" in _plan_override:  # forced (tests, sweeps): whole batch elements
        num_whole = min(programs, _plan_override["num_whole"] // per_batch * per_batch)
        why.append("whole units forced")
    # the one-wave launch: a launch without splits whose units need 4-5 programs per SM (ONE_WAVE_BLOCK_N's
    # notes; measured with 16 packed rows at d = 128, so there only); paged caches through pointer loads
    one_wave = 0  # programs per SM, 0: not taken
    per_sm = dispatch.cdiv(programs, sms)
    if (heuristic and num_splits == 1 and q.is_cuda and block_m == 16 and d == 128
            and (not paged or k_cache.shape[1] % ONE_WAVE_BLOCK_N == 0)  # paged: a chunk within a page
            and per_sm in ONE_WAVE_MAX_REGS
            and not (per_sm in ONE_WAVE_TAIL_FIRST and 0 < programs % sms <= sms // ONE_WAVE_TAIL_FIRST[per_sm])
            and not {"block_n", "num_stages", "max_regs", "use_tma", "num_whole"} & set(_plan_override)):
        one_wave = per_sm
    elif (heuristic and num_splits == 1 and q.is_cuda and num_whole is None
          and _plan_override.get("tail_split", True)):
        whole, k = _tail_split(programs, per_batch, sms, dispatch.cdiv(span, _BLOCK_N_CUDA))
        if k > 1:
            num_whole, num_splits = whole, k
            why.append(f"tail split: {whole} units whole, the last {programs - whole} split {k} ways" if whole else
                       "one wave and a short one: every unit split in two")
    stages = _NUM_STAGES_SPLIT if split_tiles else _NUM_STAGES
    # a launch without splits whose units need 2-3 programs per SM (WIDE_MAX_REGS's notes)
    band = (heuristic and q.is_cuda and num_splits == 1 and num_whole is None
            and 2 * _num_sms(q.device) < programs <= 3 * _num_sms(q.device))
    # paged caches: TMA without splits, and with at least _PAGED_TMA_MIN_SPLITS splits (policy notes),
    # except in that band, where pointer loads keep 3 programs per SM (docs/decisions/decode-paged-loads.md)
    tma_default = _USE_TMA_DEFAULT or (paged and q.is_cuda and not band and not one_wave
                                       and (num_splits == 1 or num_splits >= _PAGED_TMA_MIN_SPLITS))
    use_tma = _plan_override.get("use_tma", tma_default) and _tma_ok(k_cache, v_cache, d)
    max_regs = _plan_override.get("max_regs")
    if max_regs is None and band and not paged and "block_n" not in _plan_override:
        max_regs = WIDE_MAX_REGS
        why.append(f"2-3 programs per SM needed: registers capped at {max_regs}")
    if band and paged and not use_tma:
        why.append("2-3 programs per SM needed: pointer loads, not TMA")
    # the wide tile without splits and on paged caches read through TMA (docs/decisions/decode-splits.md,
    # decode-paged-loads.md)
    if split_tiles and (num_splits == 1 or num_whole is not None or (paged and use_tma)):
        block_n, stages = _BLOCK_N_CUDA, _NUM_STAGES
        if paged and use_tma and num_splits > 1 and dispatch.cdiv(span, num_splits) <= _BLOCK_N_CUDA:
            # a split of one 128-key chunk has no ring to pipeline: two 64-key chunks
            block_n = _BLOCK_N_SPLIT
    if one_wave:
        block_n, stages, max_regs = ONE_WAVE_BLOCK_N, ONE_WAVE_STAGES, ONE_WAVE_MAX_REGS[one_wave]
        why.append(f"{one_wave} programs per SM needed: {block_n}-key chunks, registers capped at {max_regs}, "
                   "every unit resident at once")
    if paged:  # a chunk never crosses a page
        while k_cache.shape[1] % block_n:
            block_n //= 2
    pdl_wanted = _switch("pdl", "IOATTN_DECODE_PDL", _PDL_DEFAULT)
    pdl = bool(pdl_wanted) and num_splits > 1 and _pdl_ok(q.device)
    why.append(f"{block_n}-key chunks, {_plan_override.get('num_stages', stages)} stages, "
               f"{'TMA' if use_tma else 'pointer'} loads" + (", merge by programmatic dependent launch" if pdl else ""))
    # the split kernel launched early behind the stream's previous kernel: every launch, split or not
    pdl_wait = pdl_wanted and _switch("pdl_wait", "IOATTN_DECODE_PDL_WAIT", _PDL_WAIT_DEFAULT) and _pdl_ok(q.device)
    if pdl_wait:
        why.append("the split kernel launched by programmatic dependent launch behind the stream's previous work")
    return DecodePlan(block_m, block_n, num_splits, use_tma, _plan_override.get("num_warps", _NUM_WARPS),
                      _plan_override.get("num_stages", stages), pdl, pdl_wait, num_whole, max_regs,
                      "; ".join(why))


def explain_decode(q, k_cache, v_cache, cache_seqlens=None, block_table=None, num_splits=0):
    """What ``flash_attn_with_kvcache`` would run for these tensors (nothing is launched): a dict with
    ``path`` ("triton" or "torch"), the launch ``plan`` (``DecodePlan``'s fields) and ``reason`` (the
    rules that chose it, in order). ``cache_seqlens``: as in the call, before any append; a tensor's
    largest value is read back to the host here (the call itself plans by it only when
    ``check_values`` reads it, else by the capacity)."""
    paged = block_table is not None
    capacity = block_table.shape[1] * k_cache.shape[1] if paged else k_cache.shape[1]
    if isinstance(cache_seqlens, torch.Tensor):
        span = min(int(cache_seqlens.max()), capacity) if cache_seqlens.numel() else 0
    else:
        span = capacity if cache_seqlens is None else min(int(cache_seqlens), capacity)
    if not dispatch.use_triton(q.device):
        return {"path": "torch", "plan": None, "reason": "no Triton for this device: the PyTorch path"}
    cfg = plan(q, k_cache, v_cache, paged, span, num_splits)
    fields = asdict(cfg)
    return {"path": "triton", "plan": {k: v for k, v in fields.items() if k != "reason"}, "reason": cfg.reason}


@functools.lru_cache(maxsize=8)
def _sm90(device) -> bool:
    """A Hopper-or-newer GPU."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=8)
def _pdl_ok(device) -> bool:
    """Programmatic dependent launch: a Hopper-or-newer GPU and a Triton with grid dependency control."""
    if not _sm90(device):
        return False
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def _attention_torch(q, k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad, scale, window,
                     softcap, alibi_slopes):
    kv = gather_kv_ref(k_cache, v_cache, ends, block_table, cache_batch_idx, cache_leftpad)
    outs, lses = [], []
    for b, (kb, vb) in enumerate(kv):
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        o, lse = attention_ref(q[b:b + 1].float(), kb.float(), vb.float(), softmax_scale=scale, window=window,
                               softcap=softcap, alibi_slopes=None if slopes is None else slopes.float(),
                               upcast=False)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs).to(q.dtype), torch.cat(lses).float()


def _attention_triton(q, k_cache, v_cache, cache_seqlens, seqlen_new, span, block_table, cache_batch_idx,
                      cache_leftpad, scale, window, softcap, alibi_slopes, num_splits, unified_max):
    """``cache_seqlens``: the int32 tensor, an int, or None (= the capacity); sequence b ends at
    ``cache_seqlens[b] + seqlen_new``."""
    from ioattn.kernels.decode import decode_split_kernel

    batch, seqlen_q, nheads, d = q.shape
    nheads_kv = k_cache.shape[2]
    group = nheads // nheads_kv
    paged = block_table is not None
    cfg = plan(q, k_cache, v_cache, paged, span, num_splits)
    page_size = k_cache.shape[1] if paged else 0
    capacity = block_table.shape[1] * page_size if paged else k_cache.shape[1]
    num_m_blocks = dispatch.cdiv(group * seqlen_q, cfg.block_m)
    programs = batch * nheads_kv * num_m_blocks
    bd = dispatch.block_d(d)

    # units (sequence, KV head, row block) taken whole write out / lse; the rest, a batch suffix from
    # b0, are split and merged
    num_whole = (programs if cfg.num_splits == 1 else 0) if cfg.num_whole is None else cfg.num_whole
    b0 = num_whole // (nheads_kv * num_m_blocks)
    split = cfg.num_splits > 1 and b0 < batch
    out = torch.empty(batch, seqlen_q, nheads, d, device=q.device, dtype=q.dtype)
    lse = torch.empty(batch, nheads, seqlen_q, device=q.device, dtype=torch.float32)
    if split:
        opart = torch.empty(cfg.num_splits, batch - b0, seqlen_q, nheads, d, device=q.device, dtype=torch.float32)
        lpart = torch.empty(cfg.num_splits, batch - b0, seqlen_q, nheads, device=q.device, dtype=torch.float32)
    else:  # never written
        opart, lpart = out.new_empty(1, 1, 1, 1, 1, dtype=torch.float32), lse.new_empty(1, 1, 1, 1)
    has_seqlens = isinstance(cache_seqlens, torch.Tensor)
    seqlen_base = capacity if cache_seqlens is None else 0 if has_seqlens else int(cache_seqlens)
    has_alibi = alibi_slopes is not None
    slopes = alibi_slopes.float().contiguous() if has_alibi else q
    stride_ab = slopes.stride(0) if has_alibi and slopes.dim() == 2 else 0
    qk_scale, _, _ = _scalars(scale, softcap, 0.0)  # log2(e) or 1/cap folded in, as in the forward
    k_desc = v_desc = None
    if cfg.use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        k_desc, v_desc = (TensorDescriptor(t, list(t.shape), list(t.stride()), [1, cfg.block_n, 1, bd])
                          for t in (k_cache, v_cache))
    below, above = PHI_RANGE[q.dtype]
    dummy = lpart  # any tensor stands in for the absent index tensors (never read)
    launcher_for(decode_split_kernel)((num_whole + (programs - num_whole) * cfg.num_splits,), (
        q, k_cache, v_cache, out, lse, opart, lpart, cache_seqlens.contiguous() if has_seqlens else dummy,
        cache_leftpad.contiguous() if cache_leftpad is not None else dummy,
        block_table.contiguous() if paged else dummy,
        cache_batch_idx.contiguous() if cache_batch_idx is not None else dummy,
        slopes, k_desc, v_desc,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_table.shape[1] if paged else 0, stride_ab,
        *opart.stride()[:4], *lpart.stride(), seqlen_base, seqlen_new, nheads_kv, group, seqlen_q, num_m_blocks,
        cfg.num_splits, num_whole, b0, capacity, k_cache.shape[0],
        qk_scale, float(softcap), window[0], window[1], 0.0 if unified_max is None else unified_max * LOG2E),
        dict(HEAD_DIM=d, BLOCK_D=bd, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
             PAGE_SIZE=max(page_size, 1), PAGED=paged, HAS_BATCH_IDX=cache_batch_idx is not None,
             HAS_LEFTPAD=cache_leftpad is not None, HAS_SOFTCAP=softcap > 0, HAS_ALIBI=has_alibi,
             USE_TMA=cfg.use_tma, UNIFIED=unified_max is not None, PHI_BELOW=below, PHI_ABOVE=above,
             HAS_SEQLENS=has_seqlens, USE_PDL=cfg.pdl and split, PDL_WAIT=cfg.pdl_wait,
             num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"maxnreg": cfg.max_regs} if cfg.max_regs else {}),
             **({"launch_pdl": True} if cfg.pdl_wait else {})), cached=dispatch.cached_launch())
    if split:
        merge_states(opart, lpart, block_d=bd, cached=dispatch.cached_launch(), lse_bhm=True, pdl=cfg.pdl,
                     out=out[b0:], lse=lse[b0:])
    return out, lse


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False, *, check_values=True, unified_max=None):
    """Attention of ``q`` over a KV cache, after appending ``k``/``v`` to it in place (flash-attn API).

    q: (batch, seqlen_q, nheads, d). k_cache/v_cache: (batch_cache, seqlen_cache, nheads_kv, d), or
    paged (num_pages, page_size, nheads_kv, d) with ``block_table`` int32 (batch, max_pages_per_seq)
    and page_size a multiple of 16. k/v: optional new tokens (batch, seqlen_new, nheads_kv, d), written
    at columns ``cache_seqlens[b] ..`` (``cache_seqlens``: int32 (batch,) or int; None = every cache
    full, not allowed with k/v). ``cache_batch_idx`` int32 (batch,): the contiguous cache row of each
    sequence. ``cache_leftpad`` int32 (batch,): the first valid column. ``rotary_cos/sin``
    (seqlen_ro, rotary_dim / 2): rotary on q and the new k (``rotary_interleaved``: GPT-J pairs, else
    GPT-NeoX halves). ``causal``, ``window_size``, ``softcap``, ``alibi_slopes`` ((nheads,) or
    (batch, nheads)) as in ``flash_attn_func``, bottom-right aligned to each sequence's valid length.
    ``num_splits``: key-range splits of the split-KV kernel (0 = heuristic, 1 = no split).

    Beyond flash-attn's arguments (keyword only):

    * ``check_values`` (default True): check the values of ``cache_seqlens``, ``block_table``,
      ``cache_batch_idx`` and ``cache_leftpad`` before anything is written, at the cost of one
      device-to-host read per call. ``False`` trusts them (as flash-attn does) so a decode loop never
      waits for the device; the kernel still clamps every index to the cache, so bad values give
      wrong numbers, never reads outside it. Under CUDA graph capture the values are never read
      (the graph replays with whatever values the tensors hold then).
    * ``unified_max`` (float or None): FlashDecoding++'s asynchronous softmax. Every split subtracts
      this fixed score value (after softmax_scale and softcap, natural-log units) instead of a
      running max; a split whose scores leave the safe range around it is recomputed exactly, so the
      result is exact either way. Choose it from typical scores of the model (a calibration sample).
      The CPU path ignores it (it is exact already).

    Returns ``out`` (batch, seqlen_q, nheads, d) in q's dtype, and with ``return_softmax_lse`` also
    ``softmax_lse`` (batch, nheads, seqlen_q) float32 (-inf for rows that see no key; their output is 0).
    """
    if torch.compiler.is_compiling() and isinstance(window_size, (tuple, list)):
        # one opaque op in the traced graph (the value checks, the append and the launches inside)
        seqlens_t = cache_seqlens if isinstance(cache_seqlens, torch.Tensor) else None
        out, lse = torch.ops.ioattn.kvcache(
            q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens_t,
            None if seqlens_t is not None else cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
            softmax_scale, bool(causal), int(window_size[0]), int(window_size[1]), float(softcap),
            bool(rotary_interleaved), alibi_slopes, num_splits, bool(check_values), unified_max)
    else:
        out, lse = _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                            cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                            rotary_interleaved, alibi_slopes, num_splits, check_values, unified_max)
    return (out, lse) if return_softmax_lse else out


def _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
             block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes, num_splits,
             check_values, unified_max):
    """``flash_attn_with_kvcache``'s work: checks, append, attention; returns (out, lse)."""
    scale, softcap, window, seqlen_new, max_end = _validate(
        q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
        block_table, softmax_scale, causal, window_size, softcap, alibi_slopes, num_splits, check_values,
        unified_max)
    batch, seqlen_q = q.shape[:2]
    device = q.device
    capacity = block_table.shape[1] * k_cache.shape[1] if block_table is not None else k_cache.shape[1]

    def starts():  # int64 (batch,) on the device; built only where needed (each op is a launch)
        if isinstance(cache_seqlens, torch.Tensor):
            return cache_seqlens.long()
        return torch.full((batch,), capacity if cache_seqlens is None else cache_seqlens, dtype=torch.long,
                          device=device)

    if rotary_cos is not None:
        steps = torch.arange(seqlen_q, device=device)
        per_token = window != (-1, -1)  # causal or a window: query i sits at cache_seqlens + i
        first = starts()[:, None]
        q = apply_rotary_ref(q, rotary_cos, rotary_sin, first + (steps if per_token else 0 * steps),
                             rotary_interleaved)
        if k is not None:
            k = apply_rotary_ref(k, rotary_cos, rotary_sin, first + torch.arange(seqlen_new, device=device),
                                 rotary_interleaved)
    if k is not None and seqlen_new:
        positions = starts()[:, None] + torch.arange(seqlen_new, device=device)
        first, row = _storage_index(positions, block_table, cache_batch_idx, k_cache.shape[1])
        k_cache[first, row] = k
        v_cache[first, row] = v

    if dispatch.use_triton(device, q.dtype) and batch and seqlen_q:
        q = q if q.stride(-1) == 1 else q.contiguous()
        span = capacity if max_end is None else max_end  # the plan never waits for device values
        out, lse = _attention_triton(q, k_cache, v_cache, cache_seqlens, seqlen_new, span, block_table,
                                     cache_batch_idx, cache_leftpad, scale, window, softcap, alibi_slopes,
                                     num_splits, unified_max)
    elif batch and seqlen_q:
        out, lse = _attention_torch(q, k_cache, v_cache, starts() + seqlen_new, block_table, cache_batch_idx,
                                    cache_leftpad, scale, window, softcap, alibi_slopes)
    else:
        out = q.new_zeros(q.shape)
        lse = torch.full((batch, q.shape[2], seqlen_q), float("-inf"), device=device)
    return out, lse


@torch.library.custom_op("ioattn::kvcache", mutates_args=("k_cache", "v_cache"))
def _kvcache_op(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Optional[torch.Tensor],
                v: Optional[torch.Tensor], rotary_cos: Optional[torch.Tensor], rotary_sin: Optional[torch.Tensor],
                cache_seqlens: Optional[torch.Tensor], cache_seqlens_int: Optional[int],
                cache_batch_idx: Optional[torch.Tensor], cache_leftpad: Optional[torch.Tensor],
                block_table: Optional[torch.Tensor], softmax_scale: Optional[float], causal: bool, window_left: int,
                window_right: int, softcap: float, rotary_interleaved: bool, alibi_slopes: Optional[torch.Tensor],
                num_splits: int, check_values: bool, unified_max: Optional[float]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_attn_with_kvcache`` as one op for ``torch.compile`` (the caches mutated in place);
    ``cache_seqlens`` as a tensor or, in ``cache_seqlens_int``, an int (both None: every cache full)."""
    seqlens = cache_seqlens if cache_seqlens is not None else cache_seqlens_int
    return _kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, seqlens, cache_batch_idx, cache_leftpad,
                    block_table, softmax_scale, causal, (window_left, window_right), softcap, rotary_interleaved,
                    alibi_slopes, num_splits, check_values, unified_max)


@_kvcache_op.register_fake
def _(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_seqlens_int, cache_batch_idx,
      cache_leftpad, block_table, softmax_scale, causal, window_left, window_right, softcap, rotary_interleaved,
      alibi_slopes, num_splits, check_values, unified_max):
    # shapes, dtypes and devices are checked while tracing (a bad call fails there); values at run time
    _validate(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
              cache_seqlens if cache_seqlens is not None else cache_seqlens_int, cache_batch_idx, cache_leftpad,
              block_table, softmax_scale, causal, (window_left, window_right), softcap, alibi_slopes, num_splits,
              check_values=False, unified_max=unified_max)
    batch, seqlen_q, nheads, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((batch, nheads, seqlen_q), dtype=torch.float32)

