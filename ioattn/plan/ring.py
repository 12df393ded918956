"""Ring attention's schedule: which kernel calls each ring step makes (pure Python).

Tokens are named by their index in the global sequence (for packed sequences, in the packed
tokens). A rank holds its tokens as one or two runs of consecutive indices ("chunks"), in increasing
order: one with ``layout="contiguous"`` (rank r holds the r-th slice), two with ``"zigzag"`` (chunks
r and 2W - 1 - r of 2W). At ring step s, rank r's queries meet the keys and values of rank
(r - s) mod W. Query p sees key t when both are in one sequence and ``p - left <= t <= p + right``
(the global window, -1 unbounded; causal is ``right = 0``).

The cells one (query chunk, key chunk, sequence) triple sees form a band: a rectangle of local rows
and columns cut by two diagonals (``lo <= j - i <= hi`` for local row i, column j). One kernel call
computes a band exactly, its window relative to the rectangle's bottom-right corner. Bands of one
sequence that together make a larger band are merged, so that a step costs as few calls as it can:
a zig-zag causal step is one call (the diagonal, or half of the pair), a contiguous one the full
pair, the diagonal or nothing. Steps no rank needs (a window shorter than the ring) are not run.
"""
from __future__ import annotations

import bisect
import functools
from dataclasses import dataclass

LAYOUTS = ("contiguous", "zigzag")
INF = float("inf")


def chunk_count(layout: str) -> int:
    """How many equal chunks of the sequence each rank holds."""
    return 2 if layout == "zigzag" else 1


def chunks(layout: str, world: int, rank: int, local_len: int) -> tuple:
    """Rank ``rank``'s tokens as ``(global_start, local_start, length)`` runs, in local order."""
    if layout == "contiguous":
        return ((rank * local_len, 0, local_len),)
    half = local_len // 2
    return ((rank * half, 0, half), ((2 * world - 1 - rank) * half, half, half))


def positions(layout: str, world: int, rank: int, local_len: int) -> list:
    """The global index of each of rank ``rank``'s local tokens."""
    return [g + i for g, _, n in chunks(layout, world, rank, local_len) for i in range(n)]


@dataclass(frozen=True)
class Band:
    """Local query rows [a, b) against local key columns [c, e), the cells with lo <= j - i <= hi
    (``lo``, ``hi`` clipped to the rectangle's own diagonals: dmin, dmax)."""
    a: int
    b: int
    c: int
    e: int
    lo: int
    hi: int

    @property
    def dmin(self):
        return self.c - (self.b - 1)

    @property
    def dmax(self):
        return self.e - 1 - self.a

    def window(self):
        """The kernel's (left, right) for this rectangle, bottom-right aligned; None where a bound
        falls outside what a window can say (a row at the bottom or top that sees nothing)."""
        corner = self.e - self.b  # the diagonal of the bottom-right alignment
        left = -1 if self.lo <= self.dmin else corner - self.lo
        right = -1 if self.hi >= self.dmax else self.hi - corner
        return None if (left < -1 or right < -1 or (left == -1 and self.lo > self.dmin)
                        or (right == -1 and self.hi < self.dmax)) else (left, right)

    def cells(self):
        """How many cells the band holds (of one batch entry and head)."""
        return _below(self, self.hi) - _below(self, self.lo - 1)


def _below(x, t):
    """Cells of ``x``'s rectangle with j - i <= t: row i holds clamp(i + t - c + 1, 0, e - c) of them."""
    width, n, v0 = x.e - x.c, x.b - x.a, x.a + t - x.c + 1
    zero = min(max(-v0 + 1, 0), n)  # rows holding none (v <= 0)
    full = min(max(n - (width - v0), 0), n - zero)  # rows holding the whole width (v >= width)
    k0, k1 = zero, n - full  # the rows in between hold v0 + k
    return full * width + (k1 - k0) * v0 + (k1 * (k1 - 1) - k0 * (k0 - 1)) // 2


def band(a, b, c, e, lo, hi):
    """The band of rows [a, b), columns [c, e) and diagonals [lo, hi] (+-inf unbounded), trimmed to
    the rows and columns that see something; None when nothing is visible."""
    if lo > hi:
        return None
    a, b = max(a, c - hi), min(b, e - lo)
    if a >= b:
        return None
    c, e = max(c, a + lo), min(e, b + hi)
    if c >= e:
        return None
    dmin, dmax = c - (b - 1), e - 1 - a
    return Band(int(a), int(b), int(c), int(e), int(max(lo, dmin)), int(min(hi, dmax)))


def _merged(parts):
    """One band over the bounding rectangle of ``parts`` (bands with disjoint rectangles) computing
    exactly their cells, or None. Its diagonals agree with each part's inside that part's rectangle,
    so it holds every part's cells; holding no more cells than they do together, it holds no other."""
    rect = (min(x.a for x in parts), max(x.b for x in parts), min(x.c for x in parts), max(x.e for x in parts))
    bounds = []
    for side in ("lo", "hi"):
        # a bound either cuts a band's rectangle (tight) or lies outside it; the merged band's bound
        # must equal every tight one and lie outside the other rectangles
        tight = {getattr(x, side) for x in parts if getattr(x, side) != (x.dmin if side == "lo" else x.dmax)}
        if len(tight) > 1:
            return None
        value = tight.pop() if tight else (-INF if side == "lo" else INF)
        for x in parts:
            if max(value, x.dmin) != x.lo if side == "lo" else min(value, x.dmax) != x.hi:
                return None
        bounds.append(value)
    out = band(*rect, *bounds)
    ok = out is not None and out.window() is not None and out.cells() == sum(x.cells() for x in parts)
    return out if ok else None


def _merge_all(bands):
    """Fewer bands with the same cells: all of them in one if they make one band, else pairs merged
    while any pair does."""
    whole = _merged(bands) if len(bands) > 1 else None
    if whole is not None:
        return [whole]
    bands = sorted(bands, key=lambda x: (x.a, x.c))
    pairs = ((i, j) for i in range(len(bands)) for j in range(i + 1, len(bands)))
    for i, j in pairs:
        m = _merged([bands[i], bands[j]])
        if m is not None:
            return _merge_all([x for k, x in enumerate(bands) if k not in (i, j)] + [m])
    return bands


@dataclass(frozen=True)
class Call:
    """One kernel call of a ring step: local query rows ``rows`` against the visiting key columns
    ``cols`` with ``window`` (relative to the call, bottom-right aligned). ``seqlens``: for packed
    sequences, the (query length, key length) of each sequence the call packs (fillers of length 0
    on one side cover the gaps between them), else None: one rectangle for every batch entry."""
    rows: tuple
    cols: tuple
    window: tuple
    seqlens: tuple | None = None


def _bands(q_chunks, k_chunks, sequences, window):
    """The bands of one step, merged within each sequence."""
    left, right = window
    out = []
    starts = [s0 for s0, _ in sequences]
    lo = bisect.bisect_right(starts, q_chunks[0][0]) - 1
    hi = bisect.bisect_left(starts, q_chunks[-1][0] + q_chunks[-1][2])
    for s0, s1 in sequences[max(lo, 0):hi]:  # the sequences the queries' tokens can be in
        seq = []
        for qg, ql, qn in q_chunks:
            q0, q1 = max(qg, s0), min(qg + qn, s1)
            for kg, kl, kn in k_chunks:
                k0, k1 = max(kg, s0), min(kg + kn, s1)
                if q0 >= q1 or k0 >= k1:
                    continue
                g = (qg - ql) - (kg - kl)  # local diagonal j - i of the global diagonal t - p = 0
                x = band(ql + q0 - qg, ql + q1 - qg, kl + k0 - kg, kl + k1 - kg,
                         g - left if left >= 0 else -INF, g + right if right >= 0 else INF)
                if x is not None:
                    seq.append(x)
        out += _merge_all(seq)
    return out


def _packed_calls(bands):
    """Bands of packed sequences grouped into varlen calls: one window a call, rows and columns
    increasing from one band to the next."""
    groups = []
    for x in sorted(bands, key=lambda x: (x.a, x.c)):
        w = x.window()
        for g in groups:
            if g[0] == w and g[1][-1].b <= x.a and g[1][-1].e <= x.c:
                g[1].append(x)
                break
        else:
            groups.append((w, [x]))
    calls = []
    for w, members in groups:
        seqlens, row, col = [], members[0].a, members[0].c
        for x in members:
            if x.a > row:
                seqlens.append((x.a - row, 0))
            if x.c > col:
                seqlens.append((0, x.c - col))
            seqlens.append((x.b - x.a, x.e - x.c))
            row, col = x.b, x.e
        calls.append(Call((members[0].a, row), (members[0].c, col), w, tuple(seqlens)))
    return tuple(calls)


def step_calls(layout, world, rank, step, local_len, window, sequences=None):
    """The calls rank ``rank`` makes at ring step ``step``. ``sequences``: the packed sequences'
    global (start, end), or None for one sequence of ``world * local_len`` tokens per batch entry."""
    src = (rank - step) % world
    bands = _bands(chunks(layout, world, rank, local_len), chunks(layout, world, src, local_len),
                   sequences or ((0, world * local_len),), window)
    for x in bands:
        if x.window() is None:  # a single band always fits a window: a bug if this fires
            raise AssertionError(f"ring schedule: band {x} has no kernel window")
    if sequences is None:
        return tuple(Call((x.a, x.b), (x.c, x.e), x.window()) for x in bands)
    return _packed_calls(bands)


@functools.lru_cache(maxsize=64)
def ring_length(layout, world, local_len, window):
    """How many steps the ring runs: ``world``, or fewer when a window bounded on both sides keeps
    the farther shards out of every rank's sight. Counted without the packed sequences, whose
    boundaries only remove cells, so that it costs nothing a call when the packing changes."""
    if window[0] < 0 or window[1] < 0:
        return world
    return max((s + 1 for r in range(world) for s in range(world)
                if step_calls(layout, world, r, s, local_len, window)), default=1)


@functools.lru_cache(maxsize=64)
def schedule(layout, world, rank, local_len, window, sequences=None):
    """Rank ``rank``'s calls for every step the ring runs (``ring_length``, the same on every rank): a
    tuple with one tuple of calls a step (empty: a fully masked step, skipped)."""
    return tuple(step_calls(layout, world, rank, s, local_len, window, sequences)
                 for s in range(ring_length(layout, world, local_len, window)))


def cells(call):
    """Score cells (of one batch entry and head) that ``call`` computes, for the work-balance tests."""
    if call.seqlens is None:
        (a, b), (c, e) = call.rows, call.cols
        left, right = call.window
        corner = e - b
        lo = corner - left if left >= 0 else -INF
        hi = corner + right if right >= 0 else INF
        return Band(a, b, c, e, max(lo, c - (b - 1)), min(hi, e - 1 - a)).cells()
    total = 0
    for sq, sk in call.seqlens:
        if sq and sk:
            total += cells(Call((0, sq), (0, sk), call.window))
    return total
