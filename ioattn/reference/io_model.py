"""The IO model of attention: HBM bytes read and written, FLOPs and a time lower bound.

FlashAttention (Dao et al., 2022), section 3.2 and Theorem 2: standard attention moves Θ(N d + N²) bytes
through HBM, the tiled algorithm Θ(N² d² / M) for on-chip memory M. This module counts those bytes
exactly, as named terms, for standard attention, FlashAttention-1 (outer loop over K/V blocks),
FlashAttention-2 (outer loop over Q blocks) and the compulsory traffic (``minimum``: every input
read once, every output written once), forward and backward. Every load and store is counted as an
HBM access (no cache); causal passes visit the blocks of ``ioattn.masks.key_block_range``.
Sizes are plain Python ints, so the counts are exact. ``docs/io-model.md`` states the assumptions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ioattn.masks import key_block_range

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1}
STAT_BYTES = 4  # lse, the FA1 statistics l and m, D = rowsum(dO * O) and the dQ accumulator: fp32
ALGORITHMS = ("standard", "fa1", "fa2", "minimum")
PASSES = ("forward", "backward")
KB, MIB = 1024, 2**20


class ModelArgumentError(ValueError):
    """A bad argument of the model: ``argument`` names it, ``problem`` says what is wrong with it."""

    def __init__(self, argument, problem):
        super().__init__(f"{argument} {problem}")
        self.argument, self.problem = argument, problem


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelArgumentError(name, f"must be a positive integer, got {value!r}")
    return value


@dataclass(frozen=True)
class Device:
    """What the time bound needs of a GPU: HBM bandwidth (bytes/s), matrix peak per dtype (FLOP/s),
    on-chip memory M per SM and L2 (bytes), and where the figures come from."""
    name: str
    bandwidth: float
    peak: dict
    sram: int
    l2: int
    source: str

    def time(self, nbytes, flops, dtype):
        """(memory time, compute time) in seconds: the bound is the larger."""
        return nbytes / self.bandwidth, flops / self.peak[dtype]


# Hopper: 228 KB of shared memory per SM and a 50 MB L2 on the H100 SXM and the H200 (NVIDIA's
# Hopper tuning guide and datasheets). fp32 runs on the CUDA cores (the kernels ask for IEEE fp32,
# not TF32): the vendor's 67 TFLOP/s.
DEVICES = {
    "h100": Device(
        "NVIDIA H100 SXM", 3025e9, {"bf16": 803e12, "fp16": 803e12, "fp8": 1979e12, "fp32": 67e12}, 228 * KB,
        50 * MIB,
        # bf16 8192³ matmul and a 2 GiB device-to-device copy (read + written), measured:
        # benchmarks/results/latency-2026-12-06-h100/results.jsonl, "ceilings"; fp8 and fp32: vendor spec (dense)
        "measured 2026-12-06: bf16 matmul 803 TFLOP/s, copy 3025 GB/s; vendor spec: fp8 1979, fp32 67 TFLOP/s"),
    "h200": Device(
        "NVIDIA H200", 4245e9, {"bf16": 806e12, "fp16": 806e12, "fp8": 1979e12, "fp32": 67e12}, 228 * KB, 50 * MIB,
        # the same ceilings, measured: benchmarks/results/run-2026-12-21-f/train/results.jsonl,
        # "ceilings"; fp8 and fp32: vendor spec (dense)
        "measured: bf16 matmul 806 TFLOP/s, copy 4245 GB/s; vendor spec: fp8 1979, fp32 67 TFLOP/s"),
}


@dataclass(frozen=True)
class Problem:
    """One attention call's shape: ``seqlen_k`` defaults to ``seqlen_q``, ``nheads_kv`` to ``nheads``
    (fewer KV heads: GQA). ``dtype`` sets the element size of Q, K, V (``in_bytes``) and of O, the
    gradients, S and P (``out_bytes``: bf16 for fp8, which the FP8 forward returns)."""
    seqlen_q: int
    headdim: int
    seqlen_k: Optional[int] = None
    batch: int = 1
    nheads: int = 1
    nheads_kv: Optional[int] = None
    dtype: str = "bf16"
    causal: bool = False

    def __post_init__(self):
        if self.seqlen_k is None:
            object.__setattr__(self, "seqlen_k", self.seqlen_q)
        if self.nheads_kv is None:
            object.__setattr__(self, "nheads_kv", self.nheads)
        for name in ("batch", "nheads", "nheads_kv", "seqlen_q", "seqlen_k", "headdim"):
            _positive(name, getattr(self, name))
        if self.nheads % self.nheads_kv:
            raise ModelArgumentError("nheads", f"must be a multiple of the KV heads, got nheads={self.nheads}, "
                                               f"nheads_kv={self.nheads_kv}")
        if self.dtype not in ELEMENT_BYTES:
            raise ModelArgumentError("dtype", f"must be one of {', '.join(ELEMENT_BYTES)}, got {self.dtype!r}")
        if not isinstance(self.causal, bool):
            raise ModelArgumentError("causal", f"must be True or False, got {self.causal!r}")

    @property
    def in_bytes(self):
        return ELEMENT_BYTES[self.dtype]

    @property
    def out_bytes(self):
        return 2 if self.dtype == "fp8" else ELEMENT_BYTES[self.dtype]


@dataclass(frozen=True)
class Tiles:
    block_m: int  # query rows of a block (the paper's B_r)
    block_n: int  # key rows of a block (B_c)


def footprint(tiles, headdim, elem):
    """On-chip bytes of the paper's working set: Q_i and O_i (block_m x d), K_j and V_j (block_n x d)."""
    return (2 * tiles.block_m + 2 * tiles.block_n) * headdim * elem


def choose_tiles(outer, headdim, elem, sram, block_m=None, block_n=None):
    """Tiles for a pass whose outer loop runs over ``outer`` blocks ("kv": FA1 and every backward;
    "q": the FA2 forward). The paper's Algorithm 1: the outer block gets floor(M / 4d) rows, the inner
    min(floor(M / 4d), d), M counted in elements of ``elem`` bytes (floor, not the paper's ceiling, so
    that the four tiles fit). A given ``block_m`` / ``block_n`` replaces its value; a derived one then
    shrinks to fit beside it. Raises ``ModelArgumentError`` where the tiles do not fit in ``sram``."""
    if outer not in ("kv", "q"):
        raise ValueError(f"outer must be 'kv' or 'q', got {outer!r}")
    rule = _positive("sram", sram) // (4 * headdim * elem)
    if rule < 1:
        raise ModelArgumentError("sram", f"must hold one row of each of the four tiles, 4 * headdim * element "
                                         f"size = {4 * headdim * elem} bytes, got {sram}")
    inner = min(rule, headdim)
    derived = Tiles(inner, rule) if outer == "kv" else Tiles(rule, inner)
    given = {k: _positive(k, v) for k, v in (("block_m", block_m), ("block_n", block_n)) if v is not None}
    room = sram // (2 * headdim * elem)  # the most block_m + block_n can be
    smallest = Tiles(given.get("block_m", 1), given.get("block_n", 1))
    if given and smallest.block_m + smallest.block_n > room:
        raise ModelArgumentError(next(iter(given)), f"does not fit on chip: {_listed(given)} at headdim {headdim} "
                                 f"needs at least {footprint(smallest, headdim, elem)} bytes for the Q, O, K and V "
                                 f"tiles, more than sram={sram}")
    if len(given) == 1:  # the derived one shrinks to the room left
        other = "block_n" if "block_m" in given else "block_m"
        given[other] = min(getattr(derived, other), room - sum(given.values()))
    return Tiles(given.get("block_m", derived.block_m), given.get("block_n", derived.block_n))


def _listed(named):
    return ", ".join(f"{k}={v}" for k, v in named.items())


@dataclass(frozen=True)
class Visits:
    """The (query block, key block) pairs a tiled pass computes, summed as the byte counts need them."""
    pairs: int  # blocks computed
    rows: int  # query rows, summed over the pairs (a Q-side tile is moved once per pair)
    cols: int  # key rows, summed over the pairs (a K-side tile is moved once per pair)
    area: int  # score entries computed, rows x cols summed over the pairs
    keys_seen: int  # key rows in the key blocks that at least one pair uses


def visits(seqlen_q, seqlen_k, tiles, causal):
    """Count the blocks of one head with ``key_block_range``'s rule (bottom-right aligned causal)."""
    window = (-1, 0) if causal else (-1, -1)
    pairs = rows = cols = area = 0
    spans = []
    for m_start in range(0, seqlen_q, tiles.block_m):
        lo, hi = key_block_range(m_start, tiles.block_m, tiles.block_n, seqlen_q, seqlen_k, window)
        if hi == lo:
            continue
        m_rows = min(tiles.block_m, seqlen_q - m_start)
        n_rows = min(hi * tiles.block_n, seqlen_k) - lo * tiles.block_n
        pairs += hi - lo
        rows += m_rows * (hi - lo)
        cols += n_rows
        area += m_rows * n_rows
        spans.append((lo, hi))
    return Visits(pairs, rows, cols, area, _covered(spans, tiles.block_n, seqlen_k))


def _covered(spans, block_n, seqlen_k):
    """Key rows in the union of the key-block ranges ``spans``."""
    covered = end = 0
    for lo, hi in sorted(spans):
        lo = max(lo, end)
        if hi > lo:
            covered += min(hi * block_n, seqlen_k) - lo * block_n
            end = hi
    return covered


def visible_pairs(seqlen_q, seqlen_k, causal):
    """(query, key) pairs the mask keeps. Causal, bottom-right: row i sees max(0, i + seqlen_k -
    seqlen_q + 1) keys, so the rows that see any see a, a + 1, ..., seqlen_k keys."""
    if not causal:
        return seqlen_q * seqlen_k
    a = max(1, seqlen_k - seqlen_q + 1)  # the keys the first row that sees any sees
    return (a + seqlen_k) * (seqlen_k - a + 1) // 2


@dataclass
class Pass:
    """One algorithm's forward or backward pass: its terms {name: (bytes read, bytes written)} over
    the whole call, its matrix FLOPs and the tiles it runs with (None: untiled)."""
    algorithm: str
    direction: str
    flops: int
    tiles: Optional[Tiles] = None
    terms: dict = field(default_factory=dict)

    def add(self, name, read=0, written=0):
        r, w = self.terms.get(name, (0, 0))
        self.terms[name] = (r + read, w + written)
        return self

    @property
    def read(self):
        return sum(r for r, _ in self.terms.values())

    @property
    def written(self):
        return sum(w for _, w in self.terms.values())

    @property
    def bytes(self):
        return self.read + self.written


# ---- the passes: each term is (bytes read, bytes written) over the whole call ----

def _sizes(p):
    """(query heads, KV heads, Q/K/V element bytes, O/gradient element bytes) of the call."""
    return p.batch * p.nheads, p.batch * p.nheads_kv, p.in_bytes, p.out_bytes


def standard_forward(p):
    """The paper's Algorithm 0, per query head: read Q and K, write S = Q Kᵀ; read S, write P =
    softmax(S); read P and V, write O = P V. S and P are (seqlen_q x seqlen_k) in the output dtype,
    whole even when causal (the mask is applied to S). K and V are read per query head (GQA:
    broadcast). FLOPs: 4 d per (query, key) pair, every pair."""
    hq, _, e, eo = _sizes(p)
    nq, nk, d = p.seqlen_q, p.seqlen_k, p.headdim
    scores = hq * nq * nk * eo
    out = Pass("standard", "forward", 4 * d * hq * nq * nk)
    out.add("Q", hq * nq * d * e).add("K", hq * nk * d * e).add("S", scores, scores).add("P", scores, scores)
    return out.add("V", hq * nk * d * e).add("O", 0, hq * nq * d * eo)


def standard_backward(p):
    """The paper's Algorithm 3, per query head: dV = Pᵀ dO (read P, dO; write dV); dP = dO Vᵀ
    (read dO, V; write dP); dS = P ∘ (dP - rowsum(P ∘ dP)) (read P, dP; write dS); dQ = dS K (read
    dS, K; write dQ); dK = dSᵀ Q (read dS, Q; write dK). GQA: dK and dV are written per query head,
    then summed over each group (read per query head, write per KV head). FLOPs: 8 d per pair."""
    hq, hkv, e, eo = _sizes(p)
    nq, nk, d = p.seqlen_q, p.seqlen_k, p.headdim
    scores = hq * nq * nk * eo
    out = Pass("standard", "backward", 8 * d * hq * nq * nk)
    out.add("P", 2 * scores).add("dO", 2 * hq * nq * d * eo).add("V", hq * nk * d * e).add("dP", scores, scores)
    out.add("dS", 2 * scores, scores).add("K", hq * nk * d * e).add("Q", hq * nq * d * e)
    out.add("dQ", 0, hq * nq * d * eo).add("dK", 0, hq * nk * d * eo).add("dV", 0, hq * nk * d * eo)
    if hkv != hq:
        out.add("dK, dV group sum", 2 * hq * nk * d * eo, 2 * hkv * nk * d * eo)
    return out


def fa1_forward(p, tiles):
    """The paper's Algorithm 1, per query head: outer loop over K/V blocks (K_j, V_j read once), inner
    over the Q blocks that see block j: read Q_i, O_i, l_i, m_i, write O_i, l_i, m_i. O, l, m are
    zeroed in HBM first. Terms: ``O`` the one write per row, ``O partial`` the re-reads and the other
    re-writes; ``l, m`` (fp32) are kept for the backward. FLOPs: 4 d per score entry of every block
    computed."""
    hq, _, e, eo = _sizes(p)
    nq, d, v = p.seqlen_q, p.headdim, visits(p.seqlen_q, p.seqlen_k, tiles, p.causal)
    out = Pass("fa1", "forward", 4 * d * hq * v.area, tiles)
    out.add("Q", hq * v.rows * d * e).add("K", hq * v.keys_seen * d * e).add("V", hq * v.keys_seen * d * e)
    out.add("O", 0, hq * nq * d * eo).add("O partial", hq * v.rows * d * eo, hq * v.rows * d * eo)
    return out.add("l, m", 2 * hq * v.rows * STAT_BYTES, 2 * hq * (nq + v.rows) * STAT_BYTES)


def fa2_forward(p, tiles):
    """FlashAttention-2's Algorithm 1, per query head: outer loop over Q blocks (Q_i read once, O_i
    and lse_i written once), inner over the K/V blocks Q_i sees (K_j, V_j read per visit).
    FLOPs: 4 d per score entry of every block computed."""
    hq, _, e, eo = _sizes(p)
    nq, d, v = p.seqlen_q, p.headdim, visits(p.seqlen_q, p.seqlen_k, tiles, p.causal)
    out = Pass("fa2", "forward", 4 * d * hq * v.area, tiles)
    out.add("Q", hq * nq * d * e).add("K", hq * v.cols * d * e).add("V", hq * v.cols * d * e)
    return out.add("O", 0, hq * nq * d * eo).add("lse", 0, hq * nq * STAT_BYTES)


def _tiled_backward(algorithm, p, tiles):
    """What the FA1 and FA2 backward share. Outer loop over the K/V blocks of each KV head (K_j, V_j
    read once, dK_j, dV_j written once), inner over the query heads of its group and their Q blocks
    that see block j: Q_i and dO_i read per visit; dQ accumulates in fp32 in HBM, as atomic adds do:
    zeroed, read and written per visit, then read once to write dQ in the output dtype.
    FLOPs: 10 d per score entry computed (S recomputed, then dV, dP, dQ, dK)."""
    hq, hkv, e, eo = _sizes(p)
    nq, nk, d, v = p.seqlen_q, p.seqlen_k, p.headdim, visits(p.seqlen_q, p.seqlen_k, tiles, p.causal)
    out = Pass(algorithm, "backward", 10 * d * hq * v.area, tiles)
    out.add("K", hkv * v.keys_seen * d * e).add("V", hkv * v.keys_seen * d * e).add("Q", hq * v.rows * d * e)
    out.add("dO", hq * v.rows * d * eo)
    acc = hq * (nq + v.rows) * d * STAT_BYTES
    out.add("dQ accumulator", acc, acc).add("dQ", 0, hq * nq * d * eo)
    return out.add("dK", 0, hkv * nk * d * eo).add("dV", 0, hkv * nk * d * eo), v


def fa1_backward(p, tiles):
    """The paper's Algorithm 4 (see ``_tiled_backward``), which reads O_i, l_i and m_i per visit
    (D_i = rowsum(dO_i ∘ O_i) is recomputed there)."""
    out, v = _tiled_backward("fa1", p, tiles)
    hq = p.batch * p.nheads
    return out.add("O", hq * v.rows * p.headdim * p.out_bytes).add("l, m", 2 * hq * v.rows * STAT_BYTES)


def fa2_backward(p, tiles):
    """FlashAttention-2's Algorithm 2 (see ``_tiled_backward``): a first pass reads O and dO and
    writes D = rowsum(dO ∘ O); then lse_i and D_i are read per visit."""
    out, v = _tiled_backward("fa2", p, tiles)
    hq, nq = p.batch * p.nheads, p.seqlen_q
    rows = hq * nq * p.headdim * p.out_bytes
    out.add("O", rows).add("dO", rows).add("D", hq * v.rows * STAT_BYTES, hq * nq * STAT_BYTES)
    return out.add("lse", hq * v.rows * STAT_BYTES)


def minimum_forward(p):
    """The compulsory traffic: Q, K, V read once (K, V once per KV head), O and lse written once.
    FLOPs: 4 d per (query, key) pair the mask keeps."""
    hq, hkv, e, eo = _sizes(p)
    nq, nk, d = p.seqlen_q, p.seqlen_k, p.headdim
    out = Pass("minimum", "forward", 4 * d * hq * visible_pairs(nq, nk, p.causal))
    out.add("Q", hq * nq * d * e).add("K", hkv * nk * d * e).add("V", hkv * nk * d * e)
    return out.add("O", 0, hq * nq * d * eo).add("lse", 0, hq * nq * STAT_BYTES)


def minimum_backward(p):
    """Q, K, V, O, dO and lse read once; dQ, dK, dV written once. FLOPs: 10 d per kept pair (the
    recomputing backward's, the usual 2.5 x the forward)."""
    hq, hkv, e, eo = _sizes(p)
    nq, nk, d = p.seqlen_q, p.seqlen_k, p.headdim
    out = Pass("minimum", "backward", 10 * d * hq * visible_pairs(nq, nk, p.causal))
    out.add("Q", hq * nq * d * e).add("K", hkv * nk * d * e).add("V", hkv * nk * d * e)
    out.add("O", hq * nq * d * eo).add("dO", hq * nq * d * eo).add("lse", hq * nq * STAT_BYTES)
    return out.add("dQ", 0, hq * nq * d * eo).add("dK", 0, hkv * nk * d * eo).add("dV", 0, hkv * nk * d * eo)


# ---- the whole prediction ----

@dataclass
class Prediction:
    """Every pass of one problem on one device with on-chip memory ``sram``; ``as_dict()`` is the
    JSON form, one row per pass with its figures under "predicted" (room for measured ones beside)."""
    problem: Problem
    device: Device
    sram: int
    passes: list
    notes: list

    def find(self, algorithm, direction):
        return next(x for x in self.passes if (x.algorithm, x.direction) == (algorithm, direction))

    def figures(self, x):
        """The predicted figures of pass ``x``: bytes, FLOPs, intensity and the time bound."""
        memory_s, compute_s = self.device.time(x.bytes, x.flops, self.problem.dtype)
        return {"read": x.read, "written": x.written, "bytes": x.bytes,
                "terms": {k: {"read": r, "written": w} for k, (r, w) in x.terms.items()},
                "vs_standard": x.bytes / self.find("standard", x.direction).bytes,
                "flops": x.flops, "intensity": x.flops / x.bytes, "memory_s": memory_s, "compute_s": compute_s,
                "time_s": max(memory_s, compute_s), "bound": "memory" if memory_s >= compute_s else "compute"}

    def as_dict(self):
        p, dev = self.problem, self.device
        rows = [{"algorithm": x.algorithm, "pass": x.direction,
                 "tiles": None if x.tiles is None else {"block_m": x.tiles.block_m, "block_n": x.tiles.block_n},
                 "predicted": self.figures(x)} for x in self.passes]
        return {"problem": {**{k: getattr(p, k) for k in ("batch", "nheads", "nheads_kv", "seqlen_q", "seqlen_k",
                                                           "headdim", "dtype", "causal")},
                            "in_bytes": p.in_bytes, "out_bytes": p.out_bytes, "stat_bytes": STAT_BYTES},
                "device": {"name": dev.name, "bandwidth": dev.bandwidth, "peak_flops": dev.peak[p.dtype],
                           "sram": self.sram, "l2": dev.l2, "source": dev.source},
                "kv_bytes_per_head": 2 * p.seqlen_k * p.headdim * p.in_bytes,
                "rows": rows, "notes": self.notes}


def predict(problem, device="h100", sram=None, block_m=None, block_n=None):
    """The passes of ``problem`` (a ``Problem``) on ``device`` (a ``DEVICES`` key or a ``Device``)
    with on-chip memory ``sram`` bytes (default: the device's shared memory per SM). ``block_m`` /
    ``block_n`` replace the derived tiles of every tiled pass (``choose_tiles``). FP8 has no
    backward in ioattn: its backward passes are left out, with a note."""
    if isinstance(device, str):
        if device not in DEVICES:
            raise ModelArgumentError("device", f"must be one of {', '.join(DEVICES)}, got {device!r}")
        device = DEVICES[device]
    sram = device.sram if sram is None else sram
    elem = max(problem.in_bytes, problem.out_bytes)
    outer_kv, outer_q = (choose_tiles(o, problem.headdim, elem, sram, block_m, block_n) for o in ("kv", "q"))
    passes = [standard_forward(problem), fa1_forward(problem, outer_kv), fa2_forward(problem, outer_q),
              minimum_forward(problem)]
    notes = []
    if problem.dtype == "fp8":
        notes.append("fp8: forward only (ioattn's FP8 attention has no backward); O in bf16")
    else:
        passes += [standard_backward(problem), fa1_backward(problem, outer_kv), fa2_backward(problem, outer_kv),
                   minimum_backward(problem)]
    return Prediction(problem, device, sram, passes, notes)
