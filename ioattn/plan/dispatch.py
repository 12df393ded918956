"""Host policy: which implementation runs a call, and with which tile sizes.

CUDA tensors go to the Triton kernels. CPU tensors go to the CPU path (``ioattn.kernels.cpu``:
PyTorch's fused CPU attention kernel where it applies, tiled PyTorch ops elsewhere), unless
``TRITON_INTERPRET=1`` is set, in which case they go to the same Triton kernels run by Triton's
interpreter (how CI tests the kernels without a GPU). An interpreted call that this installation's
interpreter would compute wrongly (``ioattn._compat.check_interpreter``: bf16 where its ``tl.dot`` is
broken) is refused here, where the route is chosen.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from ioattn import _compat
from ioattn.plan import options

_compat.warn_unsupported_versions()  # once, at the package's import (through api and explain)

_forced_backend: str | None = None


@contextlib.contextmanager
def forced_backend(name: str):
    """Run the calls inside on one implementation: 'triton' or 'reference' (tests, debugging)."""
    global _forced_backend
    if name not in ("triton", "reference"):
        raise ValueError(f"backend must be 'triton' or 'reference', got {name!r}")
    previous, _forced_backend = _forced_backend, name
    try:
        yield
    finally:
        _forced_backend = previous


def interpreting(device: torch.device) -> bool:
    """Tensors on ``device`` that go to the Triton kernels run under Triton's interpreter."""
    return device.type != "cuda" and os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_triton(device: torch.device, dtype: torch.dtype | None = None) -> bool:
    """Whether a call on ``device`` runs the Triton kernels (else the PyTorch path). With the call's
    ``dtype``, an interpreted call the interpreter cannot compute raises
    ``ioattn._compat.InterpreterUnsupportedError`` (bf16 where its ``tl.dot`` is wrong)."""
    if _forced_backend is not None:
        triton = _forced_backend == "triton"
    else:
        triton = device.type == "cuda" or interpreting(device)
    if triton and dtype is not None and interpreting(device):
        _compat.check_interpreter(dtype)
    return triton


class Preference:
    """A switch that is unset (the default policy decides) until a block sets it:
    ``with dispatch.prefer_tma(True): ...``. ``env`` names an environment variable ("1" = on) read
    when the switch is unset and the default is off."""

    ALL: list = []  # every switch made, for ``switch_state``

    def __init__(self, default: bool = False, env: str | None = None):
        self.default, self.env, self.value = default, env, None
        Preference.ALL.append(self)

    @contextlib.contextmanager
    def __call__(self, enabled: bool):
        previous, self.value = self.value, enabled
        try:
            yield
        finally:
            self.value = previous

    def wanted(self) -> bool:
        if self.value is not None:
            return self.value
        return self.default or (self.env is not None and options.env(self.env) == "1")


# Forward K/V loads through tensor descriptors (TMA on Hopper): Triton pipelines these, not the
# pointer loads. On by default. tuned: docs/decisions/portable-tiles.md
FWD_TMA_DEFAULT = True


prefer_tma = Preference(FWD_TMA_DEFAULT)  # the descriptor (TMA) forward on or off inside a block


def fwd_uses_tma(k: torch.Tensor, v: torch.Tensor, varlen: bool) -> bool:
    """Descriptors need a batched layout (they clip at each sequence's end), 16-byte aligned base
    and strides, at least 16 bytes per row and no empty dimension; on CUDA, sm_90 or newer."""
    if not prefer_tma.wanted() or varlen:
        return False
    if k.is_cuda and torch.cuda.get_device_capability(k.device)[0] < 9:
        return False
    es = k.element_size()
    return all(t.data_ptr() % 16 == 0 and all((st * es) % 16 == 0 for st in t.stride()[:-1])
               and t.shape[-1] * es >= 16 and min(t.shape) > 0 for t in (k, v))


# Forward conditional rescaling (FlashAttention-4): the accumulator is rescaled only when a row max
# grows by more than this many log2 units in one key tile (kernels/common.softmax_step_lazy; FA4
# uses 8). Off (0.0, the kernel as before, bit for bit): on the H200 the block-wide decision costs more
# than the multiplies it skips. ``with rescale_threshold(8.0): ...`` or IOATTN_RESCALE_TAU=8 turn it on.
# tuned: docs/decisions/conditional-rescale.md
FWD_RESCALE_TAU = 0.0
# p = exp2(s - stale max) reaches 2**tau and is cast to the input dtype for p @ V: 2**16 = 65536 is
# past fp16's largest finite value (65504), 2**15 fits with room
RESCALE_TAU_MAX = 15.0
_rescale_tau: float | None = None


def _checked_tau(tau, source: str) -> float:
    try:
        value = float(tau)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value == 0.0 or 0.0 < value <= RESCALE_TAU_MAX):
        raise ValueError(f"{source}: the rescale threshold must be 0 (off) or in (0, {RESCALE_TAU_MAX:g}] "
                         f"log2 units (larger lets fp16 p = 2**tau overflow in p @ V), got {tau!r}")
    return value


@contextlib.contextmanager
def rescale_threshold(tau: float):
    """Forward calls inside use conditional rescaling with threshold ``tau`` (0 = off)."""
    global _rescale_tau
    previous, _rescale_tau = _rescale_tau, _checked_tau(tau, "dispatch.rescale_threshold")
    try:
        yield
    finally:
        _rescale_tau = previous


def fwd_rescale_tau() -> float:
    """The forward's ``RESCALE_TAU``: ``rescale_threshold``'s inside its block, else
    IOATTN_RESCALE_TAU if set, else ``FWD_RESCALE_TAU``."""
    if _rescale_tau is not None:
        return _rescale_tau
    env = options.env("IOATTN_RESCALE_TAU")
    if env:
        return _checked_tau(env, "IOATTN_RESCALE_TAU")
    return _checked_tau(FWD_RESCALE_TAU, "dispatch.FWD_RESCALE_TAU")


class PlanCache:
    """Plans made once per key and kept, all dropped when ``maxsize`` keys are held: ``get(key, make)``
    returns the key's plan, calling ``make()`` the first time."""

    def __init__(self, maxsize: int = 512):
        self.plans, self.maxsize = {}, maxsize

    def get(self, key, make):
        plan = self.plans.get(key)
        if plan is None:
            if len(self.plans) >= self.maxsize:
                self.plans.clear()
            plan = self.plans[key] = make()
        return plan

    def clear(self):
        self.plans.clear()


def switch_state() -> tuple:
    """The value of every ``Preference`` (None: unset) and every registered environment variable:
    part of a cached plan's key."""
    return tuple(p.value for p in Preference.ALL), options.env_state()


def cached_launch() -> bool:
    """Whether decode and merge kernels launch through ``ioattn.launch.cached`` (``IOATTN_CACHED_LAUNCH``,
    on unless "0" / "false" / "off" / "no")."""
    return (options.env("IOATTN_CACHED_LAUNCH") or "1").lower() not in ("0", "false", "off", "no")


def cdiv(a: int, b: int) -> int:
    """Ceiling division for host code (``triton.cdiv`` is a JIT-aware function costing microseconds
    a call; a decode step on the host made five of them)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def block_d(headdim: int) -> int:
    """Head dims are padded to a power of two inside the kernel (masked loads, no copies)."""
    return max(16, 1 << (headdim - 1).bit_length())


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


# Interpreter: blocks small enough that the test shapes (seqlens ~100-200) cross several tiles,
# so the block-range and edge-masking logic is exercised.
INTERPRETER_TILES = TileConfig(block_m=32, block_n=32, num_warps=4, num_stages=1)

# H200 forward tiles by padded head dim (block_m, block_n, num_warps, num_stages), pointer loads:
# the best of `benchmarks/tune_tiles.py`'s sweep at each head dim (256: the one shape that fits shared
# memory well); 16 and 32 follow 64 (not tuned separately). tuned: docs/decisions/portable-tiles.md
_FWD_TILES = {
    16: TileConfig(128, 64, 4, 3),
    32: TileConfig(128, 64, 4, 3),
    64: TileConfig(128, 64, 4, 3),
    128: TileConfig(128, 64, 8, 3),
    256: TileConfig(64, 64, 4, 3),
}
# Backward tiles, used by both the dK/dV and the dQ pass (with 8 warps the fp32 dK / dV accumulators
# spill). tuned: docs/decisions/portable-tiles.md
_BWD_TILES = {
    16: TileConfig(64, 64, 4, 2),
    32: TileConfig(64, 64, 4, 2),
    64: TileConfig(64, 64, 4, 2),
    128: TileConfig(64, 64, 4, 2),
    256: TileConfig(32, 32, 4, 2),
}

_override: dict[str, TileConfig] = {}


def set_tile_override(kind: str, config: TileConfig | None) -> None:
    """For tuning sweeps and tests: force the tiles of ``kind`` ('fwd' or 'bwd')."""
    if config is None:
        _override.pop(kind, None)
    else:
        _override[kind] = config


def tiles_overridden(kind: str, headdim: int) -> bool:
    """Whether the caller fixed this kind's tiles (``set_tile_override`` or ``IOATTN_TILES``): the
    portable kernel is then what was asked for."""
    return kind in _override or _env_tiles(kind, block_d(headdim)) is not None


def _env_tiles(kind: str, bd: int) -> TileConfig | None:
    """``IOATTN_TILES="fwd:64=128,64,4,3;bwd:128=64,64,8,2"``: per-kind, per-padded-head-dim tiles
    for tuning runs without editing the tables."""
    for entry in filter(None, options.env("IOATTN_TILES").split(";")):
        key, _, vals = entry.partition("=")
        k, _, d = key.partition(":")
        if k.strip() == kind and int(d) == bd:
            return TileConfig(*(int(x) for x in vals.split(",")))
    return None


# Short causal sequences at small head dims: 64-row tiles. With 128 rows a program under a causal
# mask at N <= 1024 has one to eight key blocks, two of them masked; 64-row tiles halve that and fit
# more programs per SM. Non-causal and d=128 keep the table (the 128-row tiles won there).
# tuned: docs/decisions/portable-tiles.md
_FWD_SHORT_CAUSAL = TileConfig(64, 64, 4, 3)
SHORT_SEQLEN = 1024


# Forward tiles when K/V come through descriptors (TMA), where they differ from the table above: 64
# query rows (the 8-warp 128-row program was latency-bound); at d = 64, 64 x 64 for causal masks up to
# TMA_CAUSAL_SHORT_SEQLEN (the 64 x 128 tiles win beyond), and with pointer loads 64 x 128 loses.
# tuned: docs/decisions/portable-tiles.md
_FWD_TILES_TMA = {64: TileConfig(64, 128, 4, 3), 128: TileConfig(64, 64, 4, 3)}
_FWD_TMA_CAUSAL_SHORT = TileConfig(64, 64, 4, 3)
TMA_CAUSAL_SHORT_SEQLEN = 4096
# d <= 64 without a mask: 64 x 64 also wins up to N = 512 (not at 4096).
TMA_SHORT_SEQLEN = 512
# A sliding window with both edges bounds the keys a row sees by its width (left + right + 1; the
# ``band`` argument), which the short causal rule then judges in place of seqlen_q: at d = 64 the
# 64 x 64 tiles take a narrow band well at any length. tuned: docs/decisions/portable-tiles.md


def tiles(kind: str, headdim: int, device: torch.device, seqlen_q: int | None = None,
          masked_right: bool = False, tma: bool = False, band: int | None = None,
          headdim_v: int | None = None) -> TileConfig:
    """Tiles for a launch. ``masked_right``: a causal (or right-bounded window) mask; ``tma``: the
    forward loads K/V through descriptors; ``band``: the keys a query row sees at most (a sliding
    window's width, when both its sides are bounded), judged as the length of a causal call.
    ``headdim_v``: V's head dim where it differs from q's and k's: the tiles of the larger of the two,
    whose K and V tiles both fit the shared memory the smaller one's take (untuned)."""
    if headdim_v is not None:
        headdim = max(headdim, headdim_v)
    if kind in _override:
        return _override[kind]
    from_env = _env_tiles(kind, block_d(headdim))
    if from_env is not None:
        return from_env
    if device.type != "cuda":
        return INTERPRETER_TILES
    if (kind == "fwd" and not tma and masked_right and seqlen_q is not None and seqlen_q <= SHORT_SEQLEN
            and block_d(headdim) <= 64):
        return _FWD_SHORT_CAUSAL
    if kind == "fwd" and tma and block_d(headdim) in _FWD_TILES_TMA:
        if block_d(headdim) <= 64 and seqlen_q is not None and seqlen_q <= (
                TMA_CAUSAL_SHORT_SEQLEN if masked_right else TMA_SHORT_SEQLEN):
            return _FWD_TMA_CAUSAL_SHORT
        if block_d(headdim) <= 64 and band is not None and band <= TMA_CAUSAL_SHORT_SEQLEN:
            return _FWD_TMA_CAUSAL_SHORT
        return _FWD_TILES_TMA[block_d(headdim)]
    table = _FWD_TILES if kind == "fwd" else _BWD_TILES
    return table[block_d(headdim)]
