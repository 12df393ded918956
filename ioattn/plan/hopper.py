"""Host policy of the Gluon Hopper forward (``ioattn.kernels.hopper_forward``; the backward's is
``ioattn.plan.hopper_bwd``).

``policy`` decides when a call takes the Gluon forward (``prefer_hopper`` / ``IOATTN_HOPPER`` override
it), ``hopper_supports`` which calls it covers, ``variant_for`` the kernel variant (``VARIANTS``;
``IOATTN_HOPPER_VARIANT`` or ``variant(...)`` name one) and ``kernel_config`` its tiles and
compile-time options. The kernels run only where ``ioattn._compat.gluon_status`` finds the Gluon API
they are written against. Variants and options: docs/hopper-forward.md; each tuned table names its
record in docs/decisions/.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping

import torch

from ioattn import _compat
from ioattn.layout import tma_rows_view
from ioattn.plan import dispatch, options
from ioattn.kernels.hopper_flags import ALIBI_FP32_COLS, ALIBI_MAGIC  # noqa: F401

VARIANTS = ("base", "pingpong", "split", "wg3", "persistent")
VARIANT_ENV = "IOATTN_HOPPER_VARIANT"
# tuned: docs/decisions/hopper-forward-variants.md
DEFAULT_VARIANT = "pingpong"
# Head dims whose default is another variant. tuned: docs/decisions/hopper-forward-variants.md
DEFAULT_VARIANT_BY_HEADDIM = {64: "wg3"}
# (head dim, causal) -> the longest seqlen_q a fixed-length call (no window, softcap or ALiBi) runs
# the persistent variant, and where listed the shortest (none now).
# tuned: docs/decisions/persistent-forward-range.md
PERSISTENT_MAX_SEQLEN = {(64, False): 1024, (64, True): 4096, (128, False): 8192, (128, True): 8192,
                         (256, False): 8192, (256, True): 8192}
PERSISTENT_MIN_SEQLEN: dict = {}
# The default policy: (head dim, causal) -> the shortest seqlen_q from which the Gluon forward runs;
# below 512 nothing was measured: the portable kernel.
# tuned: docs/decisions/hopper-forward-lengths.md
AUTO_MIN_SEQLEN = {(64, False): 512, (64, True): 512, (128, False): 512, (128, True): 512,
                   (256, False): 512, (256, True): 512}

# Head dims the Gluon kernels lack: a call of head dim d in PADDED_RANGE[dp] runs both kernels at dp on
# zero columns (exact; the scale stays the call's), from TMA's fill (``padded_in_place``) or copies.
# tuned: docs/decisions/padded-head-dims.md
PADDED_RANGE = {128: range(65, 128), 256: range(129, 256)}
# (pass, padded head dim, causal) -> the shortest seqlen_q from which a call padded on copies takes the
# Gluon kernels. tuned: docs/decisions/padded-head-dims.md
PADDED_MIN_SEQLEN = {("fwd", 128, False): 4096, ("fwd", 128, True): 8192,
                     ("fwd", 256, False): 4096, ("fwd", 256, True): 4096,
                     ("bwd", 128, False): 2048, ("bwd", 128, True): 4096,
                     ("bwd", 256, False): 1024, ("bwd", 256, True): 1024}
# The same for the in-place path (``padded_in_place``: d a multiple of 8, the backward's "ws" variant).
# tuned: docs/decisions/padded-head-dims.md
PADDED_IN_PLACE_MIN_SEQLEN = {("fwd", 128, False): 512, ("fwd", 128, True): 512,
                              ("fwd", 256, False): 512, ("fwd", 256, True): 512,
                              ("bwd", 128, False): 512, ("bwd", 128, True): 512,
                              ("bwd", 256, False): 512, ("bwd", 256, True): 512}


def padded_min_seqlen(pass_: str, d: int, causal: bool) -> tuple[int | None, str]:
    """(the shortest seqlen_q the default policy takes the padded Gluon ``pass_`` from, the table's name)
    for head dim ``d``: ``PADDED_IN_PLACE_MIN_SEQLEN`` where the call runs in place, else
    ``PADDED_MIN_SEQLEN``."""
    in_place = padded_in_place(d)
    name = "PADDED_IN_PLACE_MIN_SEQLEN" if in_place else "PADDED_MIN_SEQLEN"
    return globals()[name].get((pass_, padded_headdim(d), bool(causal))), name


def padded_headdim(d: int) -> int | None:
    """The Gluon head dim a call of head dim ``d`` runs at zero-padded (``PADDED_RANGE``); None if
    ``d`` is one the kernels have, or none covers it."""
    return next((dp for dp, dims in PADDED_RANGE.items() if d in dims), None)


def padded_in_place(d: int) -> bool:
    """Whether a padded call (``padded_headdim``) runs without padded copies: the kernels read its
    tensors through descriptors whose boxes run past d (``padded_rows_desc``; TMA fills the zeros) and
    store d columns. Needs d a multiple of 8 (each head's first column a whole 16-byte group)."""
    return bool(padded_headdim(d)) and d % 8 == 0


# The forward's products over the first three quarters of the tiles' columns at padded head dims that
# fit there (the kernel's ``PROD_DIM``; ``SPLIT_COLS_TILES``: kernel head dim -> columns covered), in
# ``SPLIT_COLS_VARIANTS``; ``with hopper.split_cols(False)``: whole. tuned: docs/decisions/split-products.md
split_cols = dispatch.Preference(True)
SPLIT_COLS_VARIANTS = ("pingpong", "split", "persistent")
SPLIT_COLS_TILES = {256: 192, 128: 96}


def split_cols_for(d: int, io_dim: int, name: str) -> int:
    """The forward kernel's ``PROD_DIM`` for kernel head dim ``d``, the tensors' ``io_dim`` (0: d) and
    variant ``name``: ``SPLIT_COLS_TILES[d]`` where the products may skip the columns past it
    (``split_cols``), else 0 (all d columns)."""
    prod = SPLIT_COLS_TILES.get(d, 0)
    if prod and 0 < io_dim <= prod and name in SPLIT_COLS_VARIANTS and split_cols.wanted():
        return prod
    return 0


def split_cols_q_in_regs(q_in_regs: bool, prod_dim: int) -> bool:
    """The kernel's ``Q_IN_REGS`` with the split products (``prod_dim`` > 0): off (both products read
    their slice of Q from shared memory; Q's registers hold the whole tile's operand)."""
    return q_in_regs and not prod_dim


# The backward's twin (the column-split ws kernel at d = 256: products over 192 columns);
# ``with hopper.bwd_split_cols(False)``: whole. tuned: docs/decisions/split-products.md
bwd_split_cols = dispatch.Preference(True)


def bwd_split_cols_for(d: int, io_dim: int, col_split: bool) -> int:
    """The ws backward's ``PROD_DIM`` for kernel head dim ``d``, the tensors' ``io_dim`` (0: d) and the
    kernel's ``COL_SPLIT``: 192 where the products may skip the columns past 192 (``bwd_split_cols``),
    else 0."""
    if d == 256 and 0 < io_dim <= 192 and col_split and bwd_split_cols.wanted():
        return 192
    return 0


# The forward's split ring with the products over 192 columns: each K / V tile as a 128- and a 64-column
# buffer (``k_desc`` / ``k_hi_desc``, ``v_desc`` / ``v_hi_desc``), ``SPLIT_RING_STAGES`` deep;
# ``with hopper.split_ring(False)``: whole tiles. tuned: docs/decisions/split-products.md
split_ring = dispatch.Preference(True)
SPLIT_RING_STAGES = 3


def split_ring_for(d: int, io_dim: int, name: str, kv_tail: bool = False) -> bool:
    """Whether the forward kernel runs the split ring (``split_ring``) for kernel head dim ``d``, the
    tensors' ``io_dim`` and variant ``name``: only with the products over 192 columns (``split_cols_for``)
    and whole key tiles (``kv_tail`` False: docs/decisions/split-products.md)."""
    return split_cols_for(d, io_dim, name) == 192 and not kv_tail and split_ring.wanted()


def padded_inputs_note(d: int, backward: bool = False) -> str:
    """How a padded call's tensors reach the kernels (``explain_dispatch``'s "inputs")."""
    dp = padded_headdim(d)
    if padded_in_place(d):
        what = "the gradients stored" if backward else "the output stored"
        prod = bwd_split_cols_for(dp, d, True) if backward else split_cols_for(dp, d, variant_for(dp))
        products = (f", the products over {prod} of the {dp} columns (hopper.{'bwd_' if backward else ''}split_cols)"
                    if prod else "")
        if not backward and split_ring_for(dp, d, variant_for(dp)):
            products += (", K / V in 128- and 64-column tiles three deep where the keys fill whole 64-key tiles "
                         "(hopper.split_ring)")
        return (f"read in place at head dim {dp}, the columns past {d} zero-filled by TMA (gluon_fwd.padded_rows_desc), "
                f"{what} to {d} columns{products}")
    if backward:
        return f"zero-padded copies of q, k, v, out, dout at head dim {dp} (gluon_fwd.pad_head), the gradients sliced"
    return f"zero-padded copies at head dim {dp} (gluon_fwd.pad_head), the output sliced"


def call_forms(varlen: bool, window, softcap: float, alibi_slopes) -> list[str]:
    """The features of a call beyond a plain fixed-length one (the causal mask is plain), by name."""
    return [name for name, on in (("packed sequences", varlen),
                                  ("a sliding window", tuple(window) not in ((-1, -1), (-1, 0))),
                                  ("a softcap", softcap > 0), ("ALiBi", alibi_slopes is not None)) if on]


def padded_refusal(d: int, varlen: bool, window, softcap: float, alibi_slopes) -> str:
    """Why a call of head dim ``d`` cannot take the padded path ("" if it can, or ``d`` is not padded).
    In place (``padded_in_place``) the kernels run their own forms at the padded dim (windows, softcap,
    ALiBi, packed sequences: the native checks at that dim apply); on the padded copies, plain
    fixed-length calls only (the causal mask allowed), as measured."""
    dp = padded_headdim(d)
    if dp is None or padded_in_place(d):
        return ""
    extra = call_forms(varlen, window, softcap, alibi_slopes)
    if extra:
        return (f"head dim {d} runs zero-padded to {dp} on copies (not a multiple of 8): plain fixed-length "
                f"calls only (here {', '.join(extra)})")
    return ""

# (block_m, block_n, stages) per variant and head dim, FA3's shapes where Gluon's powers of two allow.
# tuned: docs/decisions/hopper-forward-variants.md
TILE_TABLE = {
    # one consumer partition of 64-row warpgroups + 1 producer warp (an A/B control)
    "base": {64: (128, 128, 2), 128: (128, 128, 2)},
    # two consumer warpgroups x 64 rows; d = 64 spends its spare shared memory on a third stage
    "pingpong": {64: (128, 128, 3), 128: (128, 128, 2), 256: (128, 64, 2)},
    # the same tiles as "pingpong", so that the A/B between the two isolates the ordering
    "split": {64: (128, 128, 3), 128: (128, 128, 2), 256: (128, 64, 2)},
    # the ping-pong kernel made persistent: the same tiles, so that the A/B isolates the tile loop
    "persistent": {64: (128, 128, 3), 128: (128, 128, 2), 256: (128, 64, 2)},
    # three consumer warpgroups x 64 rows, four stages; d = 64 only (160 registers a thread)
    "wg3": {64: (192, 128, 4)},
}

_variant: str | None = None  # set from Python (set_variant / variant); None: the environment decides


def _check(name: str) -> str:
    if name not in VARIANTS:
        raise ValueError(f"unknown Hopper kernel variant {name!r}; one of {VARIANTS}")
    return name


def active_variant() -> str | None:
    """The variant set by name: the Python setting if any, else ``IOATTN_HOPPER_VARIANT``; None when
    neither is set (each head dim then takes its default, ``variant_for``)."""
    if _variant is not None:
        return _variant
    env = options.env(VARIANT_ENV).lower()
    return _check(env) if env else None


def variant_for(d: int, causal: bool = False, seqlen_q: int | None = None, varlen: bool = False,
                window: bool = False, alibi: int = 0) -> str:
    """The variant a call at head dim ``d`` runs: the one set by name; else, for a fixed-length
    call without a sliding ``window`` (or another one-tile form: softcap, ALiBi) with
    ``PERSISTENT_MIN_SEQLEN[(d, causal)]`` (0 if absent) <= ``seqlen_q`` <=
    ``PERSISTENT_MAX_SEQLEN[(d, causal)]``, "persistent"; else ``DEFAULT_VARIANT_BY_HEADDIM``'s, else
    ``DEFAULT_VARIANT``, and with ``alibi`` (the call's form, ``alibi_form``) ``DEFAULT_VARIANT`` where
    that one has no such form (``ALIBI_VARIANTS``, the fp32 columns ``ALIBI_FP32_VARIANTS``). (Without
    ``seqlen_q``: the head dim's default.)"""
    named = active_variant()
    if named:
        return named
    key = (d, bool(causal))
    if not varlen and not window and not alibi and seqlen_q is not None and \
            PERSISTENT_MIN_SEQLEN.get(key, 0) <= seqlen_q <= PERSISTENT_MAX_SEQLEN.get(key, 0):
        return "persistent"
    name = DEFAULT_VARIANT_BY_HEADDIM.get(d, DEFAULT_VARIANT)
    if alibi and name not in alibi_variants(alibi):
        return DEFAULT_VARIANT
    return name


def set_variant(name: str | None) -> None:
    """Set the variant for the process (None: back to ``IOATTN_HOPPER_VARIANT`` / the defaults)."""
    global _variant
    _variant = None if name is None else _check(name)


@contextlib.contextmanager
def variant(name: str):
    """``with hopper.variant("pingpong"): ...``: the variant inside the block, restored after."""
    global _variant
    previous, _variant = _variant, _check(name)
    try:
        yield
    finally:
        _variant = previous


class _ActiveTiles(Mapping):
    """``TILES[d]``: (block_m, block_n, stages) of the variant head dim ``d`` runs (``variant_for``);
    its keys are the head dims covered now (a live view, not a copy)."""

    def _dims(self):
        return sorted(d for d in {d for t in TILE_TABLE.values() for d in t} if d in TILE_TABLE[variant_for(d)])

    def __getitem__(self, d):
        return TILE_TABLE[variant_for(d)][d]

    def __iter__(self):
        return iter(self._dims())

    def __len__(self):
        return len(self._dims())

    def __repr__(self):
        return repr({d: self[d] for d in self._dims()})


TILES = _ActiveTiles()


def _lean_flags(lean: bool, name: str, d: int, causal: bool) -> dict:
    """The kernel's ``LEAN`` (the lean softmax) and its options, each on only with it:
    ``COND_RESCALE`` (conditional rescaling; ``RESCALE_BY_WARP``: decided by the warp, not the thread),
    ``Q_IN_REGS`` (Q as S's register operand), ``DEFERRED_SUM`` (the row sum's quad reduction once a
    tile), ``MASK_BRANCH`` (a tile's first-step mask under its own branch), ``PTX_BARRIERS`` (the
    partition-barrier pass)."""
    cond = lean and conditional_rescale_for(name, d)
    return dict(LEAN=lean, COND_RESCALE=cond, RESCALE_BY_WARP=cond and rescale_by_warp.wanted(),
                Q_IN_REGS=lean and q_in_registers_for(name, d),
                DEFERRED_SUM=lean and deferred_row_sum_for(name, d, causal),
                MASK_BRANCH=lean and mask_branch_for(name, d, causal),
                PTX_BARRIERS=lean and ptx_barriers_for(name))


# The consumers' redundant partition barriers dropped from the PTX (``ioattn.kernels.ptx_barriers``,
# the kernel's ``PTX_BARRIERS``) in ``PTX_BARRIERS_ON``; ``with hopper.ptx_barriers(True / False)``
# forces it. tuned: docs/decisions/ptx-barrier-pass.md
ptx_barriers = dispatch.Preference(False)
PTX_BARRIERS_ON = ("pingpong", "persistent")


def ptx_barriers_for(name: str) -> bool:
    """Whether variant ``name`` drops its consumers' redundant partition barriers: ``ptx_barriers``'s
    value inside its block, else the measured policy (``PTX_BARRIERS_ON``)."""
    if ptx_barriers.value is not None:
        return ptx_barriers.value
    return name in PTX_BARRIERS_ON


# Short causal persistent calls on 64-key tiles, so that ``diag_trim`` skips a whole tile: head dim ->
# (the longest seqlen_q, the tiles). tuned: docs/decisions/causal-diagonal-trim.md
SHORT_CAUSAL_TILES = {128: (512, (128, 64, 4))}


def kernel_config(d: int, name: str | None = None, causal: bool = False, seqlen_q: int | None = None,
                  alibi: int = 0) -> dict:
    """Launch configuration of ``hopper_fwd_kernel``: tiles, the Q descriptor's block rows, num_warps
    and the constexprs, for head dim ``d``, variant ``name`` (default ``variant_for(d)``), the mask,
    ``seqlen_q`` (the short causal tiles, ``SHORT_CAUSAL_TILES``; None: the variant's own) and the
    ALiBi form ``alibi`` (``alibi_form``; 0 without). The launcher and the compile check share it."""
    name = variant_for(d) if name is None else _check(name)
    block_m, block_n, stages = TILE_TABLE[name][d]
    if alibi == ALIBI_FP32_COLS and d in ALIBI_KEY_TILES:
        block_n, stages = ALIBI_KEY_TILES[d]
    short = SHORT_CAUSAL_TILES.get(d)
    if name == "persistent" and causal and seqlen_q is not None and short and seqlen_q <= short[0]:
        block_m, block_n, stages = short[1]
    pingpong = name != "base"
    num_wg = 3 if name == "wg3" else 2  # consumer warpgroups (partitions) of the ping-pong kernel
    assert not pingpong or block_m == 64 * num_wg, (name, block_m)
    return dict(variant=name, block_m=block_m, block_n=block_n, stages=stages,
                q_rows=block_m // num_wg if pingpong else block_m,  # ping-pong: each warpgroup loads its own Q
                num_warps=4 if pingpong else 4 * (block_m // 64),  # ping-pong: the default partition = warpgroup 0
                constexprs=dict(HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=block_n, STAGES=stages, PINGPONG=pingpong,
                                NUM_WG=num_wg, ORDERED=name != "split",
                                # the register-lean softmax and lse offsets the 160-register consumers need
                                # (and, by choice, the two-warpgroup variants': lean_softmax below)
                                **_lean_flags(num_wg == 3 or (pingpong and lean_softmax.wanted()), name, d, causal),
                                PERSISTENT=name == "persistent",
                                FEWER_MASKS=pingpong and num_wg == FEWER_MASKS_NUM_WG))


# Fewer masked key tiles (the kernel's ``FEWER_MASKS``): the first key tile masked only where the loop's
# rule asks, no key-end test under a causal mask; in kernels of this many consumer warpgroups.
# tuned: docs/decisions/forward-masked-tiles.md
FEWER_MASKS_NUM_WG = 2


# Packed (varlen) batches through the kernel's ``IS_VARLEN`` form; while False ``hopper_supports``
# refuses them, naming it. tuned: docs/decisions/gluon-varlen.md
GLUON_VARLEN = True
# The varlen policy: (head dim, causal) -> the shortest max_seqlen_q from which the Gluon varlen forward
# runs; d = 64 is not listed: the portable kernel. tuned: docs/decisions/gluon-varlen.md
VARLEN_AUTO_MIN_SEQLEN = {(128, False): 2048, (128, True): 1024, (256, False): 1024, (256, True): 1024}

# Sliding windows: the one-tile kernels' ``WINDOW`` form in ``WINDOW_VARIANTS``, from the width
# ``WINDOW_MIN_WIDTH[head dim]`` (``window_width_of``). tuned: docs/decisions/sliding-windows.md
WINDOW_VARIANTS = ("pingpong", "split", "wg3")
WINDOW_MIN_WIDTH = {128: 129, 256: 33}
# A score softcap: the one-tile kernels' ``SOFTCAP`` form, at ``SOFTCAP_HEADDIMS``, by the lengths' and
# windows' tables as without it. tuned: docs/decisions/softcap.md
SOFTCAP_VARIANTS = WINDOW_VARIANTS
SOFTCAP_HEADDIMS = (64, 128, 256)
# ALiBi: the one-tile kernels' ``ALIBI`` form (``ALIBI_MAGIC`` or ``ALIBI_FP32_COLS``, ``alibi_form``),
# at ``ALIBI_HEADDIMS``, by the lengths' and windows' tables as without it. tuned: docs/decisions/alibi.md
ALIBI_VARIANTS = ("pingpong", "split", "wg3")  # wg3: the magic form only (``alibi_form``)
ALIBI_FP32_VARIANTS = ("pingpong", "split")
ALIBI_HEADDIMS = (64, 128, 256)
# Where the magic-number form runs: without a mask, causal from a length, with a window.
# tuned: docs/decisions/alibi.md
ALIBI_MAGIC_HEADDIMS = (64, 128)
ALIBI_MAGIC_CAUSAL_MIN_SEQLEN = {128: 1024, 64: 8192}
ALIBI_MAGIC_WINDOW_HEADDIMS = (128,)
# The fp32 form's (key tile, ring depth) by head dim where it differs from ``TILE_TABLE``'s.
# tuned: docs/decisions/alibi.md
ALIBI_KEY_TILES = {128: (64, 4)}


def alibi_form(d: int, causal: bool = False, window: bool = False, varlen: bool = False,
               seqlen_q: int | None = None, softcap: bool = False) -> int:
    """The forward kernel's ``ALIBI`` constexpr for an ALiBi call at head dim ``d`` (``window``: a
    sliding window other than the causal mask; ``seqlen_q``: the query length, a varlen call's longest,
    None: any): the magic-number form at ``ALIBI_MAGIC_HEADDIMS`` without a mask, with a causal one
    from ``ALIBI_MAGIC_CAUSAL_MIN_SEQLEN``'s length, with a window at ``ALIBI_MAGIC_WINDOW_HEADDIMS``
    (at d = 64 neither packed nor causal with a ``softcap``); else the fp32 columns."""
    if d not in ALIBI_MAGIC_HEADDIMS or (d == 64 and (varlen or (causal and softcap))):
        return ALIBI_FP32_COLS
    if window:
        return ALIBI_MAGIC if d in ALIBI_MAGIC_WINDOW_HEADDIMS else ALIBI_FP32_COLS
    if causal:
        least = ALIBI_MAGIC_CAUSAL_MIN_SEQLEN.get(d)
        if least is None or (seqlen_q is not None and seqlen_q < least):
            return ALIBI_FP32_COLS
    return ALIBI_MAGIC


def alibi_call_form(alibi_slopes, d: int, window, varlen: bool, seqlen_q: int | None = None,
                    softcap: float = 0.0) -> int:
    """``alibi_form`` for a call by its flash-attn window ((-1, 0): causal) at the kernels' head dim (a
    padded call's, ``padded_headdim``); 0 without ``alibi_slopes``."""
    if alibi_slopes is None:
        return 0
    return alibi_form(padded_headdim(d) or d, tuple(window) == (-1, 0), tuple(window) not in ((-1, -1), (-1, 0)),
                      varlen, seqlen_q, softcap > 0)


def alibi_max_seqlen(form: int) -> int:
    """The longest sequence (query or key) whose ALiBi distances ``form`` converts exactly, with a
    tile's padding rows and columns past the end: |distance| < 2^22 by the magic number, 2^24 as fp32."""
    return (1 << (22 if form == ALIBI_MAGIC else 24)) - 256


def alibi_variants(form: int) -> tuple:
    """The forward variants that have ALiBi form ``form`` (wg3 only the magic one: no room for the columns)."""
    return ALIBI_FP32_VARIANTS if form == ALIBI_FP32_COLS else ALIBI_VARIANTS


def alibi_length_refusal(q, k, varlen: bool, form: int) -> str:
    """Why ALiBi form ``form`` cannot take this call's lengths ("" if it can): a sequence past
    ``alibi_max_seqlen`` (packed: the totals, which bound every sequence)."""
    longest = max(q.shape[0 if varlen else 1], k.shape[0 if varlen else 1])
    if longest > alibi_max_seqlen(form):
        return f"ALiBi: sequences up to {alibi_max_seqlen(form)} tokens (the bias's exact conversion; here {longest})"
    return ""


prefer_hopper = dispatch.Preference(False, env="IOATTN_HOPPER")  # ``with prefer_hopper(True): ...``

# The lean softmax (the kernel's ``LEAN``) in the two-warpgroup variants too (wg3 always takes it);
# ``with hopper.lean_softmax(False)`` turns it off. tuned: docs/decisions/forward-softmax-form.md
lean_softmax = dispatch.Preference(True)
# FlashAttention-4's conditional rescaling with the lean softmax (the kernel's ``COND_RESCALE``), except
# ``CONDITIONAL_RESCALE_OFF``; ``with hopper.conditional_rescale(False / True)`` or
# IOATTN_HOPPER_COND_RESCALE=0 / 1: off / on everywhere. tuned: docs/decisions/conditional-rescale.md
conditional_rescale = dispatch.Preference(True)
CONDITIONAL_RESCALE_ENV = "IOATTN_HOPPER_COND_RESCALE"
CONDITIONAL_RESCALE_OFF = {("persistent", 64)}  # (variant, head dim) measured slower with it
# Its decision by the warp (a uniform branch), not the thread; ``with hopper.rescale_by_warp(False)``:
# by the thread. tuned: docs/decisions/conditional-rescale.md
rescale_by_warp = dispatch.Preference(True)


def conditional_rescale_for(name: str, d: int) -> bool:
    """Whether variant ``name`` at head dim ``d`` rescales conditionally: ``conditional_rescale``'s
    value inside its block, else IOATTN_HOPPER_COND_RESCALE (0 / 1) if set, else the measured policy
    (on, except ``CONDITIONAL_RESCALE_OFF``)."""
    if conditional_rescale.value is not None:
        return conditional_rescale.value
    env = options.env(CONDITIONAL_RESCALE_ENV)
    if env:
        if env not in ("0", "1"):
            raise ValueError(f"{CONDITIONAL_RESCALE_ENV} must be 0 (off) or 1 (on everywhere), got {env!r}")
        return env == "1"
    return (name, d) not in CONDITIONAL_RESCALE_OFF

# Q as the register operand of S = Q K^T (the kernel's ``Q_IN_REGS``): fits in ``Q_IN_REGISTERS_FITS`` at
# d <= 128, on at ``Q_IN_REGISTERS_HEADDIMS``; ``with hopper.q_in_registers(True / False)``: on wherever
# it fits / off. tuned: docs/decisions/forward-q-in-registers.md
q_in_registers = dispatch.Preference(False)
Q_IN_REGISTERS_FITS = ("pingpong", "split", "persistent")  # variants; and d <= 128
Q_IN_REGISTERS_HEADDIMS = (128,)


def q_in_registers_for(name: str, d: int) -> bool:
    """Whether variant ``name`` at head dim ``d`` takes Q as S = Q K^T's register operand: where it
    fits, ``q_in_registers``' value inside its block, else the measured policy
    (``Q_IN_REGISTERS_HEADDIMS``)."""
    if name not in Q_IN_REGISTERS_FITS or d > 128:
        return False
    if q_in_registers.value is not None:
        return q_in_registers.value
    return d in Q_IN_REGISTERS_HEADDIMS


# The row sum kept as per-thread partial sums, reduced across the quad once a tile (the kernel's
# ``DEFERRED_SUM``): fits in ``DEFERRED_ROW_SUM_FITS`` and wg3 non-causal, on at ``DEFERRED_ROW_SUM_ON``;
# ``with hopper.deferred_row_sum(True / False)``: on wherever it fits / off.
# tuned: docs/decisions/forward-softmax-form.md
deferred_row_sum = dispatch.Preference(False)
DEFERRED_ROW_SUM_FITS = ("pingpong", "split", "persistent")  # variants, every head dim and mask; wg3 non-causal
DEFERRED_ROW_SUM_ON = (("pingpong", 128), ("pingpong", 256), ("persistent", 64), ("persistent", 128),
                       ("persistent", 256), ("wg3", 64))


# A tile's first-step mask alone under its run-time branch, ahead of one softmax body (the kernel's
# ``MASK_BRANCH``), instead of two inlined bodies; ``with hopper.mask_branch(True / False)``: on in every
# lean kernel / off. tuned: docs/decisions/forward-masked-tiles.md
mask_branch = dispatch.Preference(False)
MASK_BRANCH_CAUSAL_HEADDIMS = (128, 256)
MASK_BRANCH_VARIANTS = ("pingpong", "split", "persistent")


def mask_branch_for(name: str, d: int, causal: bool) -> bool:
    """Whether variant ``name`` at head dim ``d`` under the mask puts a tile's first-step mask under its
    own branch: ``mask_branch``'s value inside its block, else the measured policy (causal calls at
    ``MASK_BRANCH_CAUSAL_HEADDIMS`` in ``MASK_BRANCH_VARIANTS``)."""
    if mask_branch.value is not None:
        return mask_branch.value
    return bool(causal) and d in MASK_BRANCH_CAUSAL_HEADDIMS and name in MASK_BRANCH_VARIANTS


def deferred_row_sum_for(name: str, d: int, causal: bool) -> bool:
    """Whether variant ``name`` at head dim ``d`` under the mask keeps the row sum as per-thread
    partial sums: where it fits, ``deferred_row_sum``'s value inside its block, else the measured
    policy (``DEFERRED_ROW_SUM_ON``)."""
    if name not in DEFERRED_ROW_SUM_FITS and not (name == "wg3" and not causal):
        return False
    if deferred_row_sum.value is not None:
        return deferred_row_sum.value
    return (name, d) in DEFERRED_ROW_SUM_ON


# The output stored as whole 16-byte rows (the kernel's ``ROW_STORES``, ``row_stores``) instead of from
# the accumulator layout; ``with hopper.out_row_stores(False)`` turns it off everywhere.
# tuned: docs/decisions/forward-output-stores.md
out_row_stores = dispatch.Preference(True)
# variant -> the head dims whose rows go through Triton's layout conversion (its scratch fits there)
ROW_STORE_HEADDIMS = {"base": (64, 128), "pingpong": (64, 128), "split": (64, 128), "wg3": (64,),
                      "persistent": (128,)}
# variant -> the head dims whose rows are staged in the warpgroup's dead Q buffer (no room for the scratch)
ROW_STORE_VIA_Q_HEADDIMS = {"pingpong": (256,), "split": (256,), "persistent": (256,)}  # one Q buffer there
# The persistent kernel's output tiles copied by TMA from the warpgroup's dead Q buffer (``ROW_STORES``
# = 3) at ``TMA_STORE_HEADDIMS``; ``with hopper.out_tma_store(False)`` turns it off.
# tuned: docs/decisions/forward-output-stores.md
out_tma_store = dispatch.Preference(False)
TMA_STORE_HEADDIMS = (64, 128, 256)

# No masked key tile where no mask can cut one (the kernel's ``KEY_MASKS`` False: no causal mask, the
# keys in whole key tiles), up to ``UNMASKED_KEYS_MAX_SEQLEN``; ``with hopper.unmasked_full_keys(True /
# False)`` forces it wherever it applies. tuned: docs/decisions/forward-masked-tiles.md
unmasked_full_keys = dispatch.Preference(False)
UNMASKED_KEYS_VARIANTS = ("base", "pingpong", "split", "wg3", "persistent")
# (variant, head dim) -> the longest seqlen_k where it is the default
UNMASKED_KEYS_MAX_SEQLEN = {("persistent", 64): PERSISTENT_MAX_SEQLEN[(64, False)], ("persistent", 128): 512,
                            ("persistent", 256): PERSISTENT_MAX_SEQLEN[(256, False)]}


def key_masks(d: int, name: str, causal: bool, kv_tail: bool, seqlen_k: int | None = None) -> bool:
    """The kernel's ``KEY_MASKS``: False (no key tile masked) only for a call with no causal mask whose
    key tiles all lie inside the sequence (``kv_tail`` False: fixed length, seqlen_k a multiple of the
    key tile), where ``unmasked_full_keys`` asks for it or, unset, ``UNMASKED_KEYS_MAX_SEQLEN`` covers
    ``seqlen_k`` (None: any length it covers)."""
    if causal or kv_tail or name not in UNMASKED_KEYS_VARIANTS:
        return True
    longest = UNMASKED_KEYS_MAX_SEQLEN.get((name, d), -1)
    return not _switch(unmasked_full_keys, (seqlen_k if seqlen_k is not None else 0) <= longest)


# The causal diagonal trimmed in the persistent kernel (the kernel's ``DIAG_TRIM``): warpgroup 0 skips a
# key tile none of its rows sees; ``with hopper.diag_trim(True / False)`` forces it.
# tuned: docs/decisions/causal-diagonal-trim.md
diag_trim = dispatch.Preference(False)
# head dim -> the longest seqlen_q where it is the default (d = 128: where the short causal tiles give it
# a whole tile to skip)
DIAG_TRIM_MAX_SEQLEN = {128: SHORT_CAUSAL_TILES[128][0], 256: PERSISTENT_MAX_SEQLEN[(256, True)]}


def diag_trim_for(d: int, name: str, causal: bool, seqlen_q: int | None = None) -> bool:
    """The kernel's ``DIAG_TRIM``: only in the persistent kernel under a causal mask, where
    ``diag_trim`` asks for it or, unset, ``DIAG_TRIM_MAX_SEQLEN`` covers ``seqlen_q`` (None: any
    length it covers)."""
    if not causal or name != "persistent":
        return False
    return _switch(diag_trim, (seqlen_q if seqlen_q is not None else 0) <= DIAG_TRIM_MAX_SEQLEN.get(d, -1))


# The persistent kernel's tile index by multiply-high with host-computed magic numbers (the kernel's
# ``FAST_DIV``, ``hopper_tiles.magic_divisor``) instead of run-time divisions; ``with
# hopper.fast_tile_div(False)`` turns it off. tuned: docs/decisions/persistent-forward-options.md
fast_tile_div = dispatch.Preference(False)
FAST_DIV_HEADDIMS = (64, 128, 256)

# Two Q buffers a consumer warpgroup in the persistent kernel (the kernel's ``Q_BUFS``: the next tile's
# Q a whole tile ahead), room for them at ``PERSISTENT_Q2_FITS``; ``with
# hopper.persistent_q_prefetch(True / False)`` forces it. tuned: docs/decisions/persistent-forward-options.md
persistent_q_prefetch = dispatch.Preference(False)
PERSISTENT_Q2_FITS = (64, 128)
PERSISTENT_Q2_HEADDIMS = (64, 128)

# The persistent causal walk by pairs of query blocks of equal total length, head by head (the kernel's
# ``PAIRED``), for an even number of query blocks where the table's walk is off; ``with
# hopper.paired_walk(True / False)`` forces it. tuned: docs/decisions/persistent-causal-walk.md
paired_walk = dispatch.Preference(False)
PAIRED_MIN_BLOCKS = {128: 0, 256: 0, 64: 16}  # head dim -> query blocks a sequence from which it is the default

# The persistent causal walk read from a host-built table (the kernel's ``Walk``, ``build_walk_table``):
# LPT order within groups of heads whose K / V fit in L2, each tile to the program that frees first;
# ``with hopper.walk_table(True / False)`` forces it. tuned: docs/decisions/persistent-causal-walk.md
walk_table = dispatch.Preference(False)
# head dim -> query blocks a sequence from which it is the default
WALK_TABLE_MIN_BLOCKS = {64: 0, 128: 0}
WALK_TABLE_FITS = (64, 128)  # d = 256's consumers spill with it
# head dim -> K / V bytes of a group of heads walked together (leaving L2 room for Q, O, the next group)
WALK_TABLE_L2_BYTES = {64: 4 << 20, 128: 16 << 20}
# a tile's fixed cost (Q load, epilogue) in key tiles, for the model's balance
WALK_TABLE_TILE_COST = 1.0


# Head dims whose persistent rows that see no key are stored 16 bytes a thread (the kernel's
# ``NO_KEY_WIDE``) instead of an element a thread. tuned: docs/decisions/persistent-forward-options.md
NO_KEY_WIDE_HEADDIMS = (64,)


def _switch(pref: dispatch.Preference, default: bool) -> bool:
    """A preference's value when a block has set it, else ``default`` (the table's)."""
    return default if pref.value is None else bool(pref.value)


def persistent_options(d: int, name: str, causal: bool, num_m: int) -> dict:
    """The persistent kernel's ``Q_BUFS``, ``PAIRED``, ``FAST_DIV`` and ``NO_KEY_WIDE`` for head dim
    ``d``, the mask and ``num_m`` query blocks per sequence (one buffer, the LPT walk, divisions and
    the narrow no-key stores for the other variants). Options measured and removed:
    docs/decisions/persistent-forward-options.md."""
    persistent = name == "persistent"
    q2 = _switch(persistent_q_prefetch, d in PERSISTENT_Q2_HEADDIMS) and d in PERSISTENT_Q2_FITS
    paired = _switch(paired_walk, num_m >= PAIRED_MIN_BLOCKS.get(d, num_m + 1)) and bool(causal) and num_m % 2 == 0
    paired = paired and not walk_table_for(d, name, causal, num_m)
    return dict(Q_BUFS=2 if persistent and q2 else 1, PAIRED=persistent and paired,
                FAST_DIV=persistent and _switch(fast_tile_div, d in FAST_DIV_HEADDIMS),
                NO_KEY_WIDE=persistent and d in NO_KEY_WIDE_HEADDIMS)


def walk_table_for(d: int, name: str, causal: bool, num_m: int | None = None) -> bool:
    """Whether the persistent kernel walks a host-built table (``build_walk_table``): causal calls
    at a head dim in ``WALK_TABLE_FITS`` only, where ``walk_table`` asks for it or, unset (and
    ``paired_walk`` not forced on), ``WALK_TABLE_MIN_BLOCKS`` covers ``num_m`` query blocks (None: any
    number it covers)."""
    if name != "persistent" or not causal or d not in WALK_TABLE_FITS:
        return False
    if walk_table.value is None and paired_walk.value:  # the paired walk asked for, the table not: pairs
        return False
    return _switch(walk_table, (num_m if num_m is not None else 1 << 30) >= WALK_TABLE_MIN_BLOCKS.get(d, 1 << 31))


def walk_group_heads(kv_bytes_per_head: int, d: int) -> int:
    """Heads a group of the table's walk (``build_walk_table``) at head dim ``d``: as many as fit
    their K / V in ``WALK_TABLE_L2_BYTES[d]``, at least one."""
    return max(1, WALK_TABLE_L2_BYTES[d] // max(1, kv_bytes_per_head))


def row_stores(d: int, name: str) -> int:
    """How the forward for head dim ``d`` under variant ``name`` stores its output (the kernel's
    ``ROW_STORES``): 0 from the accumulator layout, 1 as whole rows through Triton's layout
    conversion, 2 as whole rows staged in the warpgroup's Q buffer, 3 (persistent) copied from that
    buffer by TMA (``out_tma_store``; not in the one-tile kernels: docs/decisions/forward-output-stores.md)."""
    if not out_row_stores.wanted():
        return 0
    if name == "persistent" and _switch(out_tma_store, d in TMA_STORE_HEADDIMS):
        return 3
    if d in ROW_STORE_HEADDIMS.get(name, ()):
        return 1
    return 2 if d in ROW_STORE_VIA_Q_HEADDIMS.get(name, ()) else 0

# FlashAttention-4's exp2 emulation (the kernel's ``EXP2_FMA``): this percentage of each key tile's
# exponentials from a cubic on the FMA units; off, a switch for other chips (``with hopper.exp2_fma(25)``
# or IOATTN_HOPPER_EXP2_FMA=25). tuned: docs/decisions/exp2-emulation.md
EXP2_FMA_DEFAULT = 0.0
EXP2_FMA_SHARES = (0.0, 12.5, 25.0, 50.0, 100.0)
EXP2_FMA_ENV = "IOATTN_HOPPER_EXP2_FMA"
_exp2_fma: float | None = None  # set by exp2_fma(...); None: the environment, else the default


def _checked_share(percent, source: str) -> float:
    try:
        value = float(percent)
    except (TypeError, ValueError):
        value = float("nan")
    if value not in EXP2_FMA_SHARES:
        raise ValueError(f"{source}: the share of exponentials on the FMA units is a percentage in "
                         f"{EXP2_FMA_SHARES} (0 = off), got {percent!r}")
    return value


@contextlib.contextmanager
def exp2_fma(percent: float):
    """``with hopper.exp2_fma(25): ...``: the Gluon forward computes that percentage of each score
    tile's exponentials on the FMA units inside the block (0: all on MUFU, the default)."""
    global _exp2_fma
    previous, _exp2_fma = _exp2_fma, _checked_share(percent, "hopper.exp2_fma")
    try:
        yield
    finally:
        _exp2_fma = previous


def exp2_fma_share() -> float:
    """The percentage in force: ``exp2_fma``'s inside its block, else ``IOATTN_HOPPER_EXP2_FMA`` if
    set, else ``EXP2_FMA_DEFAULT``."""
    if _exp2_fma is not None:
        return _exp2_fma
    env = options.env(EXP2_FMA_ENV)
    if env:
        return _checked_share(env, EXP2_FMA_ENV)
    return _checked_share(EXP2_FMA_DEFAULT, "hopper.EXP2_FMA_DEFAULT")


def exp2_fma_cols(percent: float, block_n: int) -> int:
    """The kernel's ``EXP2_FMA``: columns of a ``block_n``-key tile for ``percent`` (the tile's last
    ones; a power-of-two fraction of it)."""
    cols = block_n * _checked_share(percent, "exp2_fma_cols") / 100
    assert cols == int(cols), (percent, block_n)
    return int(cols)


def wanted(q=None, seqlen_q: int | None = None, causal: bool = False, varlen: bool = False,
           window_width: int | None = None, softcap: bool = False, alibi: bool = False) -> bool:
    """Whether the forward of this call should take the Gluon kernel (if ``hopper_supports`` it)."""
    return policy(q, seqlen_q, causal, varlen, window_width, softcap, alibi)[0]


def policy(q=None, seqlen_q: int | None = None, causal: bool = False, varlen: bool = False,
           window_width: int | None = None, softcap: bool = False, alibi: bool = False) -> tuple[bool, str]:
    """(wanted, why): ``prefer_hopper``'s value inside its block, else ``IOATTN_HOPPER`` ("1" / "0")
    if set, else the default policy (``AUTO_MIN_SEQLEN``, or for packed batches
    ``VARLEN_AUTO_MIN_SEQLEN`` with the longest sequence) for q's head dim, the mask and
    ``seqlen_q`` (default: q.shape[1]); a sliding window (``window_width``: left + right + 1,
    ``window_width_of``) also needs ``WINDOW_MIN_WIDTH``'s width, a ``softcap`` the head dim in
    ``SOFTCAP_HEADDIMS``, ``alibi`` in ``ALIBI_HEADDIMS``."""
    if prefer_hopper.value is not None:
        return prefer_hopper.value, f"hopper.prefer_hopper({prefer_hopper.value})"
    env = options.env("IOATTN_HOPPER")
    if env:
        return env == "1", f"IOATTN_HOPPER={env}"
    if q is None:
        return False, "no call to judge"
    d = q.shape[-1]
    n = q.shape[1] if seqlen_q is None else seqlen_q
    if dispatch.tiles_overridden("fwd", d):
        return False, "the forward's tiles are fixed (IOATTN_TILES / set_tile_override)"
    mask = ("causal" if causal else "non-causal") + (" varlen" if varlen else "")
    kd = padded_headdim(d)
    if kd:
        forms = varlen or window_width is not None or softcap or alibi
        if not forms or not padded_in_place(d):
            return _padded_policy("fwd", d, n, causal, forms)
        if varlen:  # the packed forward stays portable here: docs/decisions/padded-head-dims.md
            return False, (f"default policy: head dim {d} (zero-padded to {kd}) packed sequences: the portable "
                           "forward (measured behind it at some lengths, docs/decisions/padded-head-dims.md)")
    # in place, a padded call's windows, softcap and ALiBi by the padded dim's own rules
    # (docs/decisions/padded-head-dims.md)
    label = f"{d} (zero-padded to {kd})" if kd else f"{d}"
    d = kd or d
    table = "VARLEN_AUTO_MIN_SEQLEN" if varlen else "AUTO_MIN_SEQLEN"
    least = globals()[table].get((d, bool(causal)))
    if least is None:
        return False, f"default policy: head dim {label} {mask} is not in hopper.{table}"
    if n < least:
        return False, f"default policy: head dim {label} {mask} from seqlen_q >= {least} (here {n})"
    if window_width is not None:
        narrowest = WINDOW_MIN_WIDTH.get(d)
        if narrowest is None:
            return False, f"default policy: head dim {label} sliding windows are not in hopper.WINDOW_MIN_WIDTH"
        if window_width < narrowest:
            return False, (f"default policy: head dim {label} sliding windows from width {narrowest} "
                           f"(hopper.WINDOW_MIN_WIDTH; here {window_width})")
        mask += f" window of width {window_width}"
    if softcap:
        if d not in SOFTCAP_HEADDIMS:
            return False, f"default policy: head dim {label} with a softcap is not in hopper.SOFTCAP_HEADDIMS"
        mask += " softcap"
    if alibi:
        if d not in ALIBI_HEADDIMS:
            return False, f"default policy: head dim {label} with ALiBi is not in hopper.ALIBI_HEADDIMS"
        mask += " ALiBi"
    return True, f"default policy: head dim {label} {mask} from seqlen_q >= {least} (here {n})"


def _padded_policy(pass_: str, d: int, n: int, causal: bool, other: bool) -> tuple[bool, str]:
    """``policy`` / ``bwd_policy`` for a padded head dim's plain calls (``padded_min_seqlen``); ``other``:
    the call has a feature the padded copies do not take (packed, window, softcap, ALiBi; in place those
    go by the padded dim's own rules, ``policy`` / ``bwd_policy``)."""
    dp = padded_headdim(d)
    what = f"head dim {d} (zero-padded to {dp}) {'causal' if causal else 'non-causal'}"
    if other:
        return False, f"default policy: {what}: plain fixed-length calls only"
    least, table = padded_min_seqlen(pass_, d, causal)
    if least is None:
        return False, f"default policy: {what} is not in hopper.{table}"
    return n >= least, f"default policy: {what} from seqlen_q >= {least} (here {n})"


def window_width_of(window, seqlen_k: int | None, seqlen_q: int | None = None) -> int | None:
    """A sliding window's width for the policies (left + right + 1, an unbounded side as ``seqlen_k``,
    or for a varlen call, which passes None, as the longest query length ``seqlen_q``); None for no
    window and for the causal mask (-1, 0)."""
    if window in ((-1, -1), (-1, 0)):
        return None
    return sum(w if w >= 0 else (seqlen_k or seqlen_q or 0) for w in window) + 1


def value_dim_refusal(q, v) -> str:
    """Why the Gluon kernels decline a call whose V has a head dim of its own (they take one head dim
    for q, k and v), or "" where it is q's and k's. Checked before any policy: such calls always run
    the portable kernels."""
    if v.shape[-1] == q.shape[-1]:
        return ""
    return (f"portable: value head dim differs (v {v.shape[-1]}, q and k {q.shape[-1]}); the Gluon kernels "
            "take one head dim")


def fwd_plan(q, k, v, varlen, sem, alibi_slopes, seqlen_q: int | None = None) -> tuple[bool, str]:
    """(taken, why) for the forward of this call (``sem``: its ``ioattn.semantics.Semantics``): where
    ``policy`` wants it (judging a sliding window's width too) and ``hopper_supports`` it (checked only
    then). ``seqlen_q``: the query length the policy judges (a varlen call's max_seqlen_q; default
    q.shape[1]). ALiBi without a softcap needs a nonzero scale (``alibi_scale_ok``). A value head dim
    of its own is declined first (``value_dim_refusal``)."""
    if value_dim_refusal(q, v):
        return False, value_dim_refusal(q, v)
    seqlen_q = q.shape[1] if seqlen_q is None else seqlen_q
    width = window_width_of(sem.window, None if varlen else k.shape[-3], seqlen_q)
    wanted, why = policy(q, seqlen_q, causal=sem.causal, varlen=varlen, window_width=width,
                         softcap=sem.softcap > 0, alibi=alibi_slopes is not None)
    if not wanted:
        return False, why
    ok, reason = hopper_supports(q, k, v, varlen, sem, alibi_slopes)
    if ok and not alibi_scale_ok(alibi_slopes, sem.softcap, sem.softmax_scale):
        ok, reason = False, "ALiBi with softmax_scale 0: the portable kernels (the bias is added in the scores' units)"
    return (True, why) if ok else (False, reason)


def alibi_scale_ok(alibi_slopes, softcap: float, softmax_scale: float | None) -> bool:
    """Whether the Gluon kernels' ALiBi form can take this scale: the bias joins the scores in their
    own units, -slope / softmax_scale (-slope / cap after a softcap), so without a softcap the scale
    must be nonzero (None: unknown, the default's)."""
    return alibi_slopes is None or softcap > 0 or softmax_scale is None or softmax_scale != 0


def _on_sm90(q) -> bool:
    return q.is_cuda and torch.cuda.get_device_capability(q.device)[0] == 9


def _device_ok(q) -> tuple[bool, str]:
    """The Gluon kernels' own requirements: q on an sm_90 GPU and a Triton whose Gluon API is the one
    they are written against (``ioattn._compat.gluon_status``: else the portable kernels, and its reason)."""
    if not _on_sm90(q):
        return False, "needs an sm_90 (Hopper) GPU"
    ok, why = _compat.gluon_status()
    return (True, "") if ok else (False, why)


# FP8's kernel: the ping-pong variant's (block_n, stages, consumer warpgroups) by head dim, the lean
# softmax and its options off (on e4m3 slower or level, as were 256-key tiles at d = 128); a third
# warpgroup (192 query rows), measured faster, where its builds compile without spills
# (``fp8_warpgroups``). tuned: docs/decisions/fp8-forward.md
FP8_TILES = {64: (128, 2, 3), 128: (128, 2, 3), 256: (64, 2, 2)}


def fp8_warpgroups(d: int, causal: bool, varlen: bool, blocks: bool) -> int:
    """The FP8 forward's consumer warpgroups at head dim ``d`` (``FP8_TILES``); two where three spill
    (d = 128 causal or over packed sequences) or with block descales (192 query rows would span two
    blocks)."""
    num_wg = FP8_TILES[d][2]
    if blocks or (d == 128 and (causal or varlen)):
        return 2
    return num_wg


def fp8_fwd_plan(q, k, v, varlen, sem, alibi_slopes) -> tuple[bool, str]:
    """(taken, why) for the Gluon FP8 forward (``sem``: the call's ``Semantics``): on sm_90 wherever it
    covers the call, unless ``prefer_hopper(False)`` asks for the portable kernel."""
    if value_dim_refusal(q, v):
        return False, value_dim_refusal(q, v)
    if prefer_hopper.value is False:
        return False, "prefer_hopper(False): the portable kernel"
    ok, why = _device_ok(q)
    return fp8_call_supported(q, k, v, varlen, sem, alibi_slopes) if ok else (False, why)


def fp8_call_supported(q, k, v, varlen, sem, alibi_slopes) -> tuple[bool, str]:
    """``fp8_fwd_plan``'s checks of the call itself: pure Python, testable anywhere."""
    if value_dim_refusal(q, v):
        return False, value_dim_refusal(q, v)
    if q.shape[-1] not in FP8_TILES:
        return False, f"FP8: head dims {sorted(FP8_TILES)} only"
    if alibi_slopes is not None:
        return False, "FP8 with ALiBi: the portable kernel"
    if sem.dropout_p > 0:
        return False, "no dropout with FP8"
    return True, "FP8 on sm_90: the Gluon ping-pong kernel"


def hopper_supports(q, k, v, varlen, sem, alibi_slopes) -> tuple[bool, str]:
    """Whether the Gluon forward covers this call (``sem``: its ``Semantics``), and why not."""
    if value_dim_refusal(q, v):
        return False, value_dim_refusal(q, v)
    ok, why = _device_ok(q)
    if ok:
        ok, why = call_supported(q, k, v, varlen, sem, alibi_slopes)
    return ok, why


def call_supported(q, k, v, varlen, sem, alibi_slopes) -> tuple[bool, str]:
    """``hopper_supports``' checks of the call itself (dtype, variant, head dim, features, layout),
    without the device and the Triton build: pure Python, testable anywhere."""
    window, softcap, dropout_p = sem.window, sem.softcap, sem.dropout_p
    if value_dim_refusal(q, v):
        return False, value_dim_refusal(q, v)
    if q.dtype not in (torch.float16, torch.bfloat16):
        return False, "fp16/bf16 only"
    dp = padded_headdim(q.shape[-1])
    plain = not call_forms(varlen, window, softcap, alibi_slopes)
    if dp:  # zero-padded to dp (``PADDED_RANGE``): the kernel dim's variant and tiles
        refusal = padded_refusal(q.shape[-1], varlen, window, softcap, alibi_slopes)
        if refusal:
            return False, refusal
        if plain:  # any layout (made contiguous, or padded copies)
            if dropout_p > 0:
                return False, "no dropout yet"
            try:
                name = variant_for(dp)
            except ValueError as e:
                return False, str(e)
            return (True, "") if dp in TILES else (False, f"head dims {sorted(TILES)} only (variant {name})")
    kd = dp or q.shape[-1]  # the kernels' head dim (in place, a padded call's forms take its checks)
    # (varlen: the longest query is not known here; the form with the stricter length bound)
    form = alibi_call_form(alibi_slopes, kd, window, varlen, None if varlen else q.shape[1], softcap)
    try:
        name = variant_for(kd, alibi=form)
    except ValueError as e:
        return False, str(e)
    if kd not in TILES:
        return False, f"head dims {sorted(TILES)} only (variant {name})"
    if varlen and name == "persistent":
        return False, "varlen: not in the persistent variant"
    if varlen and not GLUON_VARLEN:
        return False, ("varlen: the Gluon kernel's IS_VARLEN specialisation is switched off "
                       "(hopper.GLUON_VARLEN = False)")
    if sem.sliding and name not in WINDOW_VARIANTS:
        return False, f"sliding window: the variants {WINDOW_VARIANTS} only (here {name})"
    if softcap > 0 and name not in SOFTCAP_VARIANTS:
        return False, f"softcap: the variants {SOFTCAP_VARIANTS} only (here {name})"
    if form:
        if name not in alibi_variants(form):
            return False, f"ALiBi: the variants {alibi_variants(form)} only (here {name})"
        if alibi_length_refusal(q, k, varlen, form):
            return False, alibi_length_refusal(q, k, varlen, form)
    if dropout_p > 0:
        return False, "no dropout yet"
    return _rows_layout_ok(q, k, v, varlen, sem.causal)


def _rows_layout_ok(q, k, v, varlen, causal, backward=False) -> tuple[bool, str]:
    """The Gluon kernels read q, k, v through 2-D descriptors over (rows, heads * d)
    (``layout.tma_rows_view``): contiguous tensors and views of packed ones in place; a batched
    tensor with no such view through a contiguous copy where ``copy_for_layout`` says so."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() and tma_rows_view(t) is None:
            why = (f"{name} of shape {tuple(t.shape)} and strides {tuple(t.stride())} has no (rows, heads * d) view "
                   "for the kernels' descriptors (the head dim contiguous, the heads packed next to it, 16-byte "
                   "aligned rows)")
            if varlen:
                return False, why
            copy, policy = copy_for_layout(q.shape[-1], causal, q.shape[1], backward)
            if not copy:
                return False, f"{why}; no contiguous copy ({policy})"
    return True, ""


def inputs_note(q, k, v, varlen, causal, backward=False) -> str:
    """How the Gluon kernels get q, k, v for this call: in place, or which ones are copied and why
    (for ``explain_dispatch``)."""
    copied = [name for name, t in (("q", q), ("k", k), ("v", v)) if t.numel() and tma_rows_view(t) is None]
    if not copied:
        return "in place (2-D (rows, heads * d) views)"
    if varlen:
        return f"{', '.join(copied)}: no (rows, heads * d) view (varlen: not copied)"
    return f"contiguous copies of {', '.join(copied)} ({copy_for_layout(q.shape[-1], causal, q.shape[1], backward)[1]})"


# Batched q / k / v with no (rows, heads * d) view reach the Gluon kernels as contiguous copies from
# ``COPY_MIN_SEQLEN[pass][(head dim, causal)]`` query rows; ``with hopper.copy_strided(True / False)`` or
# IOATTN_HOPPER_COPY=1 / 0 decides it at any length. tuned: docs/decisions/strided-inputs.md
copy_strided = dispatch.Preference(False)
COPY_MIN_SEQLEN = {"fwd": {(64, False): 16384, (64, True): 16384, (128, False): 4096, (128, True): 16384,
                           (256, False): 4096, (256, True): 16384},
                   "bwd": {(64, False): 1024, (64, True): 2048, (128, False): 1024, (128, True): 2048,
                           (256, False): 512, (256, True): 512}}


def copy_for_layout(d: int, causal: bool, seqlen_q: int, backward: bool = False) -> tuple[bool, str]:
    """(copy, why): whether a call at head dim ``d``, mask and ``seqlen_q`` whose inputs have no
    (rows, heads * d) view takes the Gluon forward (or ``backward``) through contiguous copies
    (``COPY_MIN_SEQLEN``)."""
    if copy_strided.value is not None:
        return copy_strided.value, f"hopper.copy_strided({copy_strided.value})"
    env = options.env("IOATTN_HOPPER_COPY")
    if env:
        if env not in ("0", "1"):
            raise ValueError(f"IOATTN_HOPPER_COPY must be 0 or 1, got {env!r}")
        return env == "1", f"IOATTN_HOPPER_COPY={env}"
    which = "bwd" if backward else "fwd"
    least = COPY_MIN_SEQLEN[which].get((d, bool(causal)))
    mask = "causal" if causal else "non-causal"
    if least is None:
        return False, f"head dim {d} {mask} is not in hopper.COPY_MIN_SEQLEN[{which!r}]"
    return seqlen_q >= least, f"{which} copies at head dim {d} {mask} from seqlen_q >= {least}, here {seqlen_q}"


