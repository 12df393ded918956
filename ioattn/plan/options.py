"""Every switch of ioattn in one registry: its name, what holds when it is not set, what it changes
and the decision record behind it.

Switches are for measurement and debugging (A/B runs, tuning, bisecting a kernel option); a user
needs none of them. Three kinds:

* a context manager, ``with ioattn.plan.hopper.split_cols(False): ...`` (``dispatch.Preference`` and a few
  functions taking a value), which holds inside its block;
* an environment variable ``IOATTN_*``, read where the switch is unset; ``env`` is the only reader
  of them in the library, and refuses a name that is not registered here;
* ``decode_config(field=...)``, the decode plan's fields (``ioattn.plan.decode``, public in ``ioattn.decode``).

``docs/options.md`` is this table rendered (``options.table()``); a test keeps both, the
switches defined in the modules and the environment variables they read equal to it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    name: str      # how it is set: "module.attribute" of a context manager, or the environment variable
    default: str   # what holds when it is not set
    changes: str   # what it changes
    record: str    # the decision record (docs/decisions/...)
    env: str | None = None  # the environment variable read when the context manager is unset


_D = "docs/decisions/"

OPTIONS = (
    # the portable Triton kernels (ioattn.plan.dispatch)
    Option("dispatch.prefer_tma", "on", "the forward's K / V loads through tensor descriptors (TMA), which "
           "Triton pipelines, instead of pointer loads", _D + "portable-tiles.md"),
    Option("dispatch.rescale_threshold", "dispatch.FWD_RESCALE_TAU", "the portable forward's conditional "
           "rescaling threshold (a row's maximum may grow this much before the accumulator is rescaled)",
           _D + "conditional-rescale.md", env="IOATTN_RESCALE_TAU"),
    Option("IOATTN_TILES", "the tile tables", "the portable kernels' tiles per pass and head dim, "
           "\"fwd:64=128,64,4,3;bwd:128=64,64,8,2\" (tuning runs)", _D + "portable-tiles.md"),
    # the Gluon Hopper forward (ioattn.plan.hopper)
    Option("hopper.prefer_hopper", "by length: hopper.AUTO_MIN_SEQLEN", "the Gluon Hopper forward instead of "
           "the portable one", _D + "hopper-forward-lengths.md", env="IOATTN_HOPPER"),
    Option("hopper.variant", "by head dim and length: hopper.variant_for", "the Gluon forward's variant "
           "(ping-pong, wg3, split, persistent) by name", _D + "hopper-forward-variants.md",
           env="IOATTN_HOPPER_VARIANT"),
    Option("hopper.lean_softmax", "on", "the two-warpgroup variants' lean softmax (the scale folded into one "
           "multiply-add a score, the row maximum on raw scores)", _D + "forward-softmax-form.md"),
    Option("hopper.deferred_row_sum", "by table: hopper.DEFERRED_ROW_SUM_ON", "the softmax's row sums added "
           "across threads once a tile instead of every key tile", _D + "forward-softmax-form.md"),
    Option("hopper.conditional_rescale", "on, except hopper.CONDITIONAL_RESCALE_OFF", "the accumulator's "
           "rescale skipped where no row maximum grew (FA4's conditional rescaling)",
           _D + "conditional-rescale.md", env="IOATTN_HOPPER_COND_RESCALE"),
    Option("hopper.rescale_by_warp", "on", "the conditional rescale decided by a warp vote instead of by "
           "each thread", _D + "conditional-rescale.md"),
    Option("hopper.exp2_fma", "hopper.EXP2_FMA_DEFAULT (0 %)", "the share of a key tile's exponentials "
           "computed by a polynomial on the FMA units", _D + "exp2-emulation.md", env="IOATTN_HOPPER_EXP2_FMA"),
    Option("hopper.q_in_registers", "by table: hopper.Q_IN_REGISTERS_HEADDIMS", "Q held in registers for "
           "the QK^T products instead of read from shared memory", _D + "forward-q-in-registers.md"),
    Option("hopper.mask_branch", "by table: hopper.MASK_BRANCH_CAUSAL_HEADDIMS", "the first key step's mask "
           "under its own branch", _D + "forward-masked-tiles.md"),
    Option("hopper.unmasked_full_keys", "by length: hopper.unmasked_full_keys's table", "no masked softmax "
           "for fixed-length calls whose key tiles are all whole", _D + "forward-masked-tiles.md"),
    Option("hopper.diag_trim", "by length: hopper.DIAG_TRIM_MAX_SEQLEN", "the persistent causal kernel's "
           "warpgroup 0 skipping a diagonal key tile none of its rows sees", _D + "causal-diagonal-trim.md"),
    Option("hopper.out_row_stores", "on", "the output converted to whole-row 16-byte stores",
           _D + "forward-output-stores.md"),
    Option("hopper.out_tma_store", "by table: hopper.TMA_STORE_HEADDIMS", "the persistent kernel's output "
           "tiles copied out by TMA from the dead Q buffer", _D + "forward-output-stores.md"),
    Option("hopper.fast_tile_div", "by table: hopper.FAST_DIV_HEADDIMS", "the persistent kernel's tile "
           "index by multiply-high instead of divisions", _D + "persistent-forward-options.md"),
    Option("hopper.persistent_q_prefetch", "by table: hopper.PERSISTENT_Q2_HEADDIMS", "two Q buffers a "
           "consumer: the next tile's Q loaded a whole tile ahead", _D + "persistent-forward-options.md"),
    Option("hopper.paired_walk", "by length: hopper.PAIRED_MIN_BLOCKS", "the persistent causal walk by pairs "
           "of query blocks of equal total work", _D + "persistent-causal-walk.md"),
    Option("hopper.walk_table", "by length: hopper.WALK_TABLE_MIN_BLOCKS", "the persistent causal walk from "
           "a table built on the host (groups of heads sharing L2)", _D + "persistent-causal-walk.md"),
    Option("hopper.split_cols", "on", "padded head dims' products over their real columns only",
           _D + "split-products.md"),
    Option("hopper.split_ring", "on", "the K / V ring at 192 columns as 128- and 64-column buffers",
           _D + "split-products.md"),
    Option("hopper.ptx_barriers", "by variant: hopper.PTX_BARRIERS_ON", "redundant partition barriers "
           "dropped from the forward's PTX", _D + "ptx-barrier-pass.md"),
    Option("hopper.copy_strided", "by length: hopper.COPY_MIN_SEQLEN", "inputs without a (rows, heads x d) "
           "view sent to the Gluon kernels as contiguous copies", _D + "strided-inputs.md",
           env="IOATTN_HOPPER_COPY"),
    # the Gluon Hopper backward
    Option("hopper_bwd.prefer_hopper_bwd", "by length: hopper_bwd.BWD_AUTO_MIN_SEQLEN", "the Gluon Hopper backward "
           "instead of the portable one", _D + "hopper-backward-kernel.md", env="IOATTN_HOPPER_BWD"),
    Option("hopper_bwd.bwd_deterministic", "off (the API's deterministic=True sets it)", "dQ's partial sums "
           "added in a fixed order", _D + "deterministic-backward.md"),
    Option("hopper.bwd_split_cols", "on", "the backward's products at d 192 over their real columns",
           _D + "split-products.md"),
    # decoding (ioattn.plan.decode, ioattn.launch.cached)
    Option("IOATTN_DECODE_PDL", "on (Hopper)", "the decode merge launched by programmatic dependent launch "
           "behind the split kernel (also decode_config(pdl=...))", _D + "decode-launches.md"),
    Option("IOATTN_DECODE_PDL_WAIT", "on (Hopper)", "the decode split kernel launched by programmatic "
           "dependent launch behind the previous kernel (also decode_config(pdl_wait=...))",
           _D + "decode-launches.md"),
    Option("IOATTN_CACHED_LAUNCH", "on", "the Gluon forward and backward, decode and merge kernels launched "
           "through the cached compiled kernel instead of Triton's per-call specialisation",
           _D + "decode-launches.md"),
)

BY_NAME = {o.name: o for o in OPTIONS}
ENV_VARS = frozenset([o.env for o in OPTIONS if o.env] + [o.name for o in OPTIONS if o.name.startswith("IOATTN_")])


def env(name: str) -> str:
    """The stripped value of the registered environment variable ``name`` ('' when unset)."""
    if name not in ENV_VARS:
        raise KeyError(f"{name} is not a registered option (ioattn.plan.options.OPTIONS)")
    return os.environ.get(name, "").strip()


# ``env_state`` runs on every call: it reads os.environ's underlying mapping with the keys encoded
# once (``os.environ.get`` encodes the key and decodes the value on each read, a microsecond a variable)
_ENV_NAMES = tuple(sorted(ENV_VARS))
_ENV_KEYS = tuple(os.environ.encodekey(name) for name in _ENV_NAMES)


def env_state() -> tuple:
    """Every registered environment variable's raw value (None: unset), in a fixed order: part of a
    cached plan's key, so that setting one takes effect on the next call."""
    data = getattr(os.environ, "_data", None)
    if data is None:  # not CPython's os.environ
        return tuple(os.environ.get(name) for name in _ENV_NAMES)
    return tuple(map(data.get, _ENV_KEYS))


def table() -> str:
    """The registry as a Markdown table (``docs/options.md``)."""
    rows = ["| switch | environment | when unset | what it changes | record |", "|---|---|---|---|---|"]
    for o in OPTIONS:
        name, var = (("", o.name) if o.name.startswith("IOATTN_") else (f"`{o.name}`", o.env or ""))
        record = o.record.removeprefix("docs/")
        rows.append(f"| {name} | {f'`{var}`' if var else ''} | {o.default} | {o.changes} | [{record.split('/')[-1]}]"
                    f"({record}) |")
    return "\n".join(rows)
