"""The decode plan: the launch of ``flash_attn_with_kvcache``'s split-KV kernel for a call's shapes,
strides, alignment and device (``DecodePlan``), chosen by the tuned rules below and memoized; forced
fields for sweeps and tests (``decode_config``). Pure Python: the launch (``ioattn.launch.decode``)
carries the plan out."""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field

import torch

from ioattn import _compat
from ioattn.plan import dispatch, options

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
# FP8 (e4m3) caches take the tiles above (timed with 16-bit caches). Their K/V tiles are converted to
# q's dtype in registers, so the 128-key tile read through pointers at 16 packed rows compiles for sm_90
# to spills without a register cap, and to WIDE_MAX_REGS without spills with it: that launch is
# capped there (tests/test_decode_fp8.py compiles it). tuned: docs/decisions/fp8-decode.md
FP8_WIDE_MAX_REGS = WIDE_MAX_REGS
# Head dims past WIDE_HEAD_MIN (MLA's 576 for q and the latent keys, 512 for V): at most 32 packed rows,
# 32-key chunks, 3 stages and 8 warps. Compiled for sm_90 (576 / 512, V read as its own tile) it needs
# 201 registers and 174 KB of shared memory without spills; 64 rows (wgmma) spill at 8 and 16 warps,
# the q tile of 64 x 576 held in registers beside the 64 x 512 accumulator. Compute-bound at 128 query
# heads, far from the copy ceiling: docs/decisions/value-head-dim.md
WIDE_HEAD_MIN = 256
WIDE_HEAD_BLOCK_M = 32
WIDE_HEAD_BLOCK_N = 32
WIDE_HEAD_STAGES = 3
WIDE_HEAD_WARPS = 8
# 32-bit caches at those head dims: the tiles above overflow shared memory (576 / 512 with V loaded on
# its own); half the chunk and 2 stages fit, compiled for sm_90 with a small spill.
WIDE_HEAD_FP32_BLOCK_N = 16
WIDE_HEAD_FP32_STAGES = 2
# MLA decoding on Hopper (the Gluon kernel, ``kernels/hopper_mla.py``): q and the latent keys MLA_HEAD_DIM
# wide over one KV head, V a view of the keys' first MLA_HEAD_DIM_V columns, 16-bit, sm_90. 64 packed rows
# over two warpgroups; 64-key tiles in a ring of 2 (with Q and P: 225 KB of shared memory, one program an
# SM), so the splits fill the SMs once. tuned: docs/decisions/mla-decode-kernel.md
MLA_HEAD_DIM, MLA_HEAD_DIM_V = 576, 512
MLA_BLOCK_M = 64
MLA_BLOCK_N = 64
MLA_STAGES = 2
MLA_WARPS = 8
MLA_MAX_BATCH = 65535  # the grid's z dimension: one sequence a step
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
    kv_fp8: bool = False  # the caches hold e4m3 values (converted after the load, descales folded in)
    kernel: str = "split"  # "split": the Triton split-KV kernel; "mla": the Gluon MLA kernel (Hopper)
    reason: str = field(default="", compare=False)  # why: the rules that chose the fields (explain_decode)


@contextlib.contextmanager
def decode_config(**fields):
    """Force fields of the ``DecodePlan`` (block_m, block_n, num_splits, use_tma, num_warps, num_stages,
    pdl, pdl_wait, num_whole, max_regs) for the calls inside: tuning sweeps and tests (``pdl`` and
    ``pdl_wait`` are still only used where they can run; ``num_whole`` is rounded down to
    whole batch elements, and ``tail_split=False`` turns the tail split off). ``kernel="split"`` keeps
    MLA calls on the split kernel (``"mla"``, the default: the MLA kernel where it takes the call); the
    MLA kernel takes only ``num_splits``, ``block_n`` and ``num_stages``."""
    unknown = set(fields) - {"block_m", "block_n", "num_splits", "use_tma", "num_warps", "num_stages", "pdl",
                             "pdl_wait", "num_whole", "tail_split", "max_regs", "kernel"}
    if unknown:
        raise ValueError(f"decode_config: unknown fields {sorted(unknown)}")
    if fields.get("kernel", "split") not in ("split", "mla"):
        raise ValueError(f"decode_config: kernel must be 'split' or 'mla' (the MLA kernel where it takes the call), "
                         f"got {fields['kernel']!r}")
    previous = dict(_plan_override)
    _plan_override.update(fields)
    try:
        yield
    finally:
        _plan_override.clear()
        _plan_override.update(previous)


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
    d and V's head dim powers of two up to 128 (the box is the whole head; two stages of 128-key K
    and V tiles of a larger head do not fit in shared memory)."""
    if k_cache.is_cuda and not _sm90(k_cache.device):
        return False
    return (all(x == dispatch.block_d(x) and x <= 128 for x in (d, v_cache.shape[-1])) and min(k_cache.shape) > 0
            and _aligned16(k_cache, v_cache))


# Head dims past 256 (MLA's 576 for q and the latent keys): q.k in two blocks, the largest power of two
# below d and the rest padded (576 = 512 + 64), where one block padded to 1024 would be nearly half
# padding; 256 and below keep one block (their launches as they were).
TWO_BLOCK_MIN_HEADDIM = 257


def head_blocks(d: int) -> tuple[int, int]:
    """(BLOCK_D, BLOCK_D_TAIL) of the split kernel for q's and K's head dim ``d``: one padded block and 0,
    or from ``TWO_BLOCK_MIN_HEADDIM`` on, where d is not a power of two, two blocks."""
    bd = dispatch.block_d(d)
    if d < TWO_BLOCK_MIN_HEADDIM or bd == d:
        return bd, 0
    return bd // 2, dispatch.block_d(d - bd // 2)


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


def plan(q, k_cache, v_cache, paged, span, num_splits=0, features=()):
    """The launch for one call: ``span`` is the longest key range any sequence may have (its max end
    when the values were read, else the cache capacity, so the plan never depends on device values);
    ``features``: the call's options the MLA kernel does not take (``MLA_DECLINES``' names) that it uses.
    Memoized on everything the rules read (shapes, strides, alignment, device, the forced fields and
    the environment switches): a decode loop plans once (host time: docs/decisions/decode-launches.md)."""
    key = (q.shape, q.device, k_cache.shape, k_cache.stride(), v_cache.shape[-1], v_cache.stride(),
           k_cache.dtype, _aligned16(k_cache, v_cache), v_cache.data_ptr() == k_cache.data_ptr(), paged, span,
           num_splits, tuple(features),
           tuple(_plan_override.items()),
           options.env("IOATTN_DECODE_PDL"), options.env("IOATTN_DECODE_PDL_WAIT"))
    cfg = _PLANS.get(key)
    if cfg is None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        why_not = mla_why_not(q, k_cache, v_cache, paged, features)
        cfg = _PLANS[key] = (_mla_plan(q, span, num_splits) if why_not is None else
                             _plan(q, k_cache, v_cache, paged, span, num_splits, why_not))
    return cfg


# options of a decode call the MLA kernel does not take, by the name ``plan``'s ``features`` gives them
MLA_DECLINES = {"window": "a sliding window", "softcap": "a softcap", "alibi": "ALiBi", "leftpad": "cache_leftpad",
                "batch_idx": "cache_batch_idx", "unified_max": "unified_max"}


def mla_why_not(q, k_cache, v_cache, paged, features=()):
    """None where the Gluon MLA kernel takes the call, else why not ('' for calls that are not MLA's
    shapes at all, which say nothing about it)."""
    d, dv = q.shape[-1], v_cache.shape[-1]
    if (d, dv) != (MLA_HEAD_DIM, MLA_HEAD_DIM_V) or k_cache.shape[2] != 1:
        return ""
    if _plan_override.get("kernel") == "split":
        return "kernel='split' forced"
    on_device = _mla_device_why_not(q.device)
    if on_device:
        return on_device
    if k_cache.dtype not in (torch.float16, torch.bfloat16):  # (q's dtype then: the call's checks)
        return "the MLA kernel takes 16-bit caches"
    declined = [MLA_DECLINES[f] for f in features]
    if declined:
        return "the MLA kernel does not take " + ", ".join(declined)
    if v_cache.data_ptr() != k_cache.data_ptr() or v_cache.stride() != k_cache.stride():
        return "the MLA kernel reads V as k_cache's first columns: v_cache must be that view"
    rows, row_stride = k_cache.shape[1], k_cache.stride(1)
    if k_cache.stride(0) != rows * row_stride or not _aligned16(k_cache):
        return "the MLA kernel reads the cache as evenly spaced 16-byte aligned rows"
    if paged and rows % MLA_BLOCK_N:
        return f"the MLA kernel needs a page size that {MLA_BLOCK_N} divides"
    if q.shape[0] > MLA_MAX_BATCH:
        return f"the MLA kernel's grid takes at most {MLA_MAX_BATCH} sequences"
    return None


def _mla_device_why_not(device) -> str:
    """'' where the MLA kernel can run on ``device`` (sm_90 with the Gluon kernels on), else why not."""
    if device.type != "cuda" or not _sm90_exactly(device):
        return "the MLA kernel needs an sm_90 GPU"
    ok, why = _compat.gluon_status()
    return "" if ok else f"Gluon kernels off: {why}"


def _mla_plan(q, span, num_splits) -> DecodePlan:
    """The MLA kernel's launch: one program an SM, so without a split count from the call the splits
    fill the SMs once (at least one key tile a split)."""
    batch, seqlen_q, nheads, _ = q.shape
    block_n = _plan_override.get("block_n", MLA_BLOCK_N)
    programs = batch * dispatch.cdiv(nheads * seqlen_q, MLA_BLOCK_M)
    sms = _num_sms(q.device)
    why = [f"the Gluon MLA kernel: {programs} units (sequence x {MLA_BLOCK_M} packed rows) on {sms} SMs"]
    if num_splits:
        why.append(f"num_splits={num_splits} from the call")
    elif "num_splits" in _plan_override:
        num_splits = _plan_override["num_splits"]
        why.append("split count forced")
    else:
        num_splits = 1 if programs >= sms else max(1, min(sms // programs, dispatch.cdiv(span, block_n), MAX_SPLITS))
        why.append("they fill the SMs: no split" if num_splits == 1 else f"{num_splits} splits (one program an SM)")
    stages = _plan_override.get("num_stages", MLA_STAGES)
    why.append(f"{block_n}-key tiles, {stages} stages, TMA loads")
    return DecodePlan(MLA_BLOCK_M, block_n, num_splits, True, MLA_WARPS, stages, kernel="mla", reason="; ".join(why))


@dataclass
class _Draft:
    """The plan's fields while ``_plan``'s steps decide them, and the reasons so far."""
    block_m: int
    block_n: int
    programs: int
    span: int  # the longest key range a sequence may have
    heuristic: bool = True  # the split count is the plan's to choose (the call gave none)
    num_splits: int = 1
    num_whole: int | None = None
    one_wave: int = 0  # programs per SM of the one-wave launch, 0: not taken
    band: bool = False  # a launch without splits whose units need 2-3 programs per SM
    stages: int = 0
    num_warps: int = _NUM_WARPS
    use_tma: bool = False
    max_regs: int | None = None
    why: list = field(default_factory=list)


def _plan(q, k_cache, v_cache, paged, span, num_splits, why_not_mla=""):
    """The rules, in order: units and splits, the load path, the key chunk, the operands, the launch
    order; each step reads the draft the earlier ones left. ``why_not_mla``: why the MLA kernel does not
    take an MLA-shaped call (the reason's first line)."""
    draft = _units(q, k_cache, v_cache, span)
    if why_not_mla:
        draft.why.insert(0, f"split kernel: {why_not_mla}")
    _splits(draft, q, k_cache, paged, num_splits)
    _load_path(draft, q, k_cache, v_cache, paged)
    _chunks(draft, q, k_cache, v_cache, paged)
    kv_fp8 = _operands(draft, q, k_cache, v_cache)
    pdl, pdl_wait = _launch_order(draft, q)
    return DecodePlan(draft.block_m, draft.block_n, draft.num_splits, draft.use_tma,
                      _plan_override.get("num_warps", draft.num_warps), _plan_override.get("num_stages", draft.stages),
                      pdl, pdl_wait, draft.num_whole, draft.max_regs, kv_fp8, reason="; ".join(draft.why))


def _split_tiles(q) -> bool:
    """On the GPU, split launches take the split tiles (the policy notes at the top)."""
    return q.is_cuda and "block_n" not in _plan_override


def _wide_head(q, v_cache) -> bool:
    return q.is_cuda and max(q.shape[-1], v_cache.shape[-1]) > WIDE_HEAD_MIN


def _units(q, k_cache, v_cache, span) -> _Draft:
    """The packed-row tile and the launch's units (sequence x KV head x row block)."""
    batch, seqlen_q, nheads, _ = q.shape
    nheads_kv = k_cache.shape[2]
    block_n = _plan_override.get("block_n", _BLOCK_N_SPLIT if _split_tiles(q) else
                                 _BLOCK_N_CUDA if q.is_cuda else _BLOCK_N_INTERPRETER)
    rows = (nheads // nheads_kv) * seqlen_q
    most_rows = WIDE_HEAD_BLOCK_M if _wide_head(q, v_cache) else _MAX_BLOCK_M
    block_m = _plan_override.get("block_m", min(most_rows, max(16, dispatch.next_power_of_2(rows))))
    programs = batch * nheads_kv * dispatch.cdiv(rows, block_m)
    why = [f"{programs} units (sequence x KV head x row block of {block_m}) on {_num_sms(q.device)} SMs"]
    return _Draft(block_m, block_n, programs, span, why=why)


def _splits(draft, q, k_cache, paged, num_splits):
    """The split count (the waves rule, or the call's), whole units, and the launches without splits:
    the one-wave launch or the tail split."""
    draft.heuristic = heuristic = num_splits == 0
    sms, programs, span = _num_sms(q.device), draft.programs, draft.span
    if heuristic:
        min_keys = (_BLOCK_N_CUDA if paged else MIN_KEYS_PER_SPLIT) if q.is_cuda else 0
        num_splits = _plan_override.get("num_splits") or _heuristic_splits(programs, span, draft.block_n, sms,
                                                                           min_keys=min_keys)
        draft.why.append("split count forced" if "num_splits" in _plan_override else
                         "they fill the SMs: no split" if num_splits == 1 else
                         f"{num_splits} splits (the waves rule, at least {max(draft.block_n, min_keys)} keys a split)")
    else:
        draft.why.append(f"num_splits={num_splits} from the call")
    draft.num_splits = num_splits
    per_batch = programs // q.shape[0]
    if "num_whole" in _plan_override:  # forced (tests, sweeps): whole batch elements
        draft.num_whole = min(programs, _plan_override["num_whole"] // per_batch * per_batch)
        draft.why.append("whole units forced")
    if not (heuristic and num_splits == 1 and q.is_cuda):
        return
    # the one-wave launch: a launch without splits whose units need 4-5 programs per SM (ONE_WAVE_BLOCK_N's
    # notes; measured with 16 packed rows at d = 128, so there only); paged caches through pointer loads
    per_sm = dispatch.cdiv(programs, sms)
    if (draft.block_m == 16 and q.shape[-1] == 128
            and (not paged or k_cache.shape[1] % ONE_WAVE_BLOCK_N == 0)  # paged: a chunk within a page
            and per_sm in ONE_WAVE_MAX_REGS
            and not (per_sm in ONE_WAVE_TAIL_FIRST and 0 < programs % sms <= sms // ONE_WAVE_TAIL_FIRST[per_sm])
            and not {"block_n", "num_stages", "max_regs", "use_tma", "num_whole"} & set(_plan_override)):
        draft.one_wave = per_sm
    elif draft.num_whole is None and _plan_override.get("tail_split", True):
        whole, k = _tail_split(programs, per_batch, sms, dispatch.cdiv(span, _BLOCK_N_CUDA))
        if k > 1:
            draft.num_whole, draft.num_splits = whole, k
            draft.why.append(f"tail split: {whole} units whole, the last {programs - whole} split {k} ways" if whole
                             else "one wave and a short one: every unit split in two")


def _load_path(draft, q, k_cache, v_cache, paged):
    """TMA or pointer loads, the ring's depth, and a register cap for the 2-3-programs-per-SM band."""
    draft.stages = _NUM_STAGES_SPLIT if _split_tiles(q) else _NUM_STAGES
    sms = _num_sms(q.device)
    draft.band = band = (draft.heuristic and q.is_cuda and draft.num_splits == 1 and draft.num_whole is None
                         and 2 * sms < draft.programs <= 3 * sms)
    # paged caches: TMA without splits, and with at least _PAGED_TMA_MIN_SPLITS splits (policy notes),
    # except in that band, where pointer loads keep 3 programs per SM (docs/decisions/decode-paged-loads.md)
    tma_default = _USE_TMA_DEFAULT or (paged and q.is_cuda and not band and not draft.one_wave
                                       and (draft.num_splits == 1 or draft.num_splits >= _PAGED_TMA_MIN_SPLITS))
    draft.use_tma = _plan_override.get("use_tma", tma_default) and _tma_ok(k_cache, v_cache, q.shape[-1])
    draft.max_regs = _plan_override.get("max_regs")
    if draft.max_regs is None and band and not paged and "block_n" not in _plan_override:
        draft.max_regs = WIDE_MAX_REGS
        draft.why.append(f"2-3 programs per SM needed: registers capped at {draft.max_regs}")
    if band and paged and not draft.use_tma:
        draft.why.append("2-3 programs per SM needed: pointer loads, not TMA")


def _chunks(draft, q, k_cache, v_cache, paged):
    """The key chunk, stages and warps: the wide tile where nothing is split or paged caches go through
    TMA, the one-wave launch's, the wide heads' (MLA), and a chunk within a page."""
    # the wide tile without splits and on paged caches read through TMA (docs/decisions/decode-splits.md,
    # decode-paged-loads.md)
    if _split_tiles(q) and (draft.num_splits == 1 or draft.num_whole is not None or (paged and draft.use_tma)):
        draft.block_n, draft.stages = _BLOCK_N_CUDA, _NUM_STAGES
        if paged and draft.use_tma and draft.num_splits > 1 and dispatch.cdiv(draft.span, draft.num_splits) <= _BLOCK_N_CUDA:
            # a split of one 128-key chunk has no ring to pipeline: two 64-key chunks
            draft.block_n = _BLOCK_N_SPLIT
    if draft.one_wave:
        draft.block_n, draft.stages = ONE_WAVE_BLOCK_N, ONE_WAVE_STAGES
        draft.max_regs = ONE_WAVE_MAX_REGS[draft.one_wave]
        draft.why.append(f"{draft.one_wave} programs per SM needed: {draft.block_n}-key chunks, registers capped at "
                         f"{draft.max_regs}, every unit resident at once")
    if _wide_head(q, v_cache) and not {"block_n", "num_stages", "num_warps"} & set(_plan_override):
        draft.block_n, draft.stages, draft.num_warps = WIDE_HEAD_BLOCK_N, WIDE_HEAD_STAGES, WIDE_HEAD_WARPS
        if k_cache.element_size() == 4:
            draft.block_n, draft.stages = WIDE_HEAD_FP32_BLOCK_N, WIDE_HEAD_FP32_STAGES
        draft.max_regs = _plan_override.get("max_regs")  # (the caps above were measured at d = 128)
        draft.why.append(f"head dims past {WIDE_HEAD_MIN}: at most {WIDE_HEAD_BLOCK_M} rows, {draft.block_n}-key "
                         f"chunks, {draft.stages} stages, {draft.num_warps} warps (WIDE_HEAD_*)")
    if paged:  # a chunk never crosses a page
        while k_cache.shape[1] % draft.block_n:
            draft.block_n //= 2


def _operands(draft, q, k_cache, v_cache) -> bool:
    """q.k's column blocks, V's head dim, and an FP8 cache's conversion and register cap; returns
    whether the cache is FP8."""
    d = q.shape[-1]
    block_d, block_d_tail = head_blocks(d)
    if block_d_tail:
        draft.why.append(f"q.k in two blocks of {block_d} + {block_d_tail} columns (head dim {d})")
    if v_cache.shape[-1] != d:
        draft.why.append(f"value head dim {v_cache.shape[-1]}")
    kv_fp8 = k_cache.dtype == torch.float8_e4m3fn
    if kv_fp8:
        draft.why.append("FP8 (e4m3) cache: tiles converted to q's dtype after the load, k_descale folded into the "
                         "score scale and v_descale into the output")
        if (draft.max_regs is None and "max_regs" not in _plan_override and q.is_cuda and not draft.use_tma
                and draft.block_n == _BLOCK_N_CUDA and draft.block_m == 16):
            draft.max_regs = FP8_WIDE_MAX_REGS
            draft.why.append(f"FP8 128-key tile through pointers: registers capped at {draft.max_regs}")
    return kv_fp8


def _launch_order(draft, q) -> tuple[bool, bool]:
    """(pdl, pdl_wait): the merge launched by programmatic dependent launch behind the split kernel,
    and the split kernel itself behind the stream's previous work."""
    pdl_wanted = _switch("pdl", "IOATTN_DECODE_PDL", _PDL_DEFAULT)
    pdl = bool(pdl_wanted) and draft.num_splits > 1 and _pdl_ok(q.device)
    draft.why.append(f"{draft.block_n}-key chunks, {_plan_override.get('num_stages', draft.stages)} stages, "
                     f"{'TMA' if draft.use_tma else 'pointer'} loads"
                     + (", merge by programmatic dependent launch" if pdl else ""))
    # the split kernel launched early behind the stream's previous kernel: every launch, split or not
    pdl_wait = pdl_wanted and _switch("pdl_wait", "IOATTN_DECODE_PDL_WAIT", _PDL_WAIT_DEFAULT) and _pdl_ok(q.device)
    if pdl_wait:
        draft.why.append("the split kernel launched by programmatic dependent launch behind the stream's previous work")
    return pdl, pdl_wait


@functools.lru_cache(maxsize=8)
def _sm90(device) -> bool:
    """A Hopper-or-newer GPU."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


@functools.lru_cache(maxsize=8)
def _sm90_exactly(device) -> bool:
    """A Hopper GPU (wgmma: sm_90 only)."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


@functools.lru_cache(maxsize=8)
def _pdl_ok(device) -> bool:
    """Programmatic dependent launch: a Hopper-or-newer GPU and a Triton with grid dependency control."""
    return _sm90(device) and _compat.grid_dependency_control()
