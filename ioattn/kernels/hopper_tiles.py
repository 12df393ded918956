"""The Gluon forward's tile scheduling: which (batch, head, query block) a program takes, the
persistent walk over tiles (computed or read from the host's table), and how many key tiles a query
block sees."""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ioattn.kernels.common import block_row


def magic_divisor(d: int) -> tuple[int, int, int]:
    """(d, mul, shift) such that n // d == (umulhi(n, mul) + n) >> shift for every 0 <= n < 2**31
    (``_div_by``; 1 <= d < 2**31): the round-up multiplier of Granlund and Montgomery's division by
    invariant integers (PLDI 1994), shift = ceil(log2 d) and mul = floor(2**(32 + shift) / d) - 2**32
    + 1 < 2**32. ``mul`` is returned as the int32 of the same bits, so the launch passes one type."""
    if not 1 <= d < 2 ** 31:
        raise ValueError(f"magic_divisor: the divisor must be in [1, 2**31), got {d}")
    shift = (d - 1).bit_length()
    mul = (1 << (32 + shift)) // d - (1 << 32) + 1
    return d, mul - (1 << 32) if mul >= 1 << 31 else mul, shift



@gluon.jit
def _div_by(n, d, magic=None):
    """(n // d, n % d) for 0 <= n < 2**31: the division, or with ``magic`` (``magic_divisor(d)``,
    d itself its first entry) a multiply-high, an add and a shift (a run-time division is ~20
    instructions on sm_90: a float reciprocal and two corrections)."""
    if magic is None:
        return n // d, n % d
    else:
        nu = n.to(gl.uint32, bitcast=True)
        hi = gl.umulhi(nu, magic[1].to(gl.uint32, bitcast=True))
        q = ((hi + nu) >> magic[2].to(gl.uint32, bitcast=True)).to(gl.int32, bitcast=True)
        return q, n - q * magic[0]



@gluon.jit
def _tile_bhm(t, num_m, num_tiles, nheads, IS_CAUSAL: gl.constexpr, LPT: gl.constexpr, PAIRED: gl.constexpr = False,
              divs=None):
    """Tile ``t`` of the (batch * heads) x (query blocks) grid -> (b, h, m_block). Non-causal: each
    head's query blocks in turn. Causal: the longest rows first, either within each head (``LPT``
    False) or over the whole grid (``LPT`` True: every head's last query block, then every head's
    second to last, ...; longest-processing-time order, so tiles taken in order finish together).
    ``PAIRED`` (causal, an even ``num_m``): tiles in pairs of equal total length, head by head: pair
    q = t // 2 is query blocks num_m - 1 - i (t even) and i (t odd), num_m + 1 key tiles together on
    the diagonal. ``divs`` (the persistent kernel's ``FAST_DIV``): (the walk's divisor, the head
    count), each as ``magic_divisor`` gives it (``walk_divisor`` on the host: num_m / 2 paired, the
    (batch, head) count under LPT, else num_m), for ``_div_by``'s multiply-high instead of the
    divisions. The walks: docs/decisions/persistent-causal-walk.md."""
    if divs is None:
        walk = None
        heads = None
    else:
        walk = divs[0]
        heads = divs[1]
    if PAIRED:
        bh, i = _div_by(t // 2, num_m // 2, walk)
        m_block = i + (1 - t % 2) * (num_m - 1 - 2 * i)
    elif IS_CAUSAL and LPT:
        j, bh = _div_by(t, num_tiles // num_m, walk)
        m_block = num_m - 1 - j
    else:
        bh, m_block = _div_by(t, num_m, walk)
        if IS_CAUSAL:
            m_block = num_m - 1 - m_block
    b, h = _div_by(bh, nheads, heads)
    return b, h, m_block



@gluon.jit
def _walk(k, num_tiles, SNAKE: gl.constexpr, PAIRED: gl.constexpr = False, table=None):
    """A persistent program's k-th tile: waves of ``num_programs`` tiles, program p taking the p-th
    of each wave, or (``SNAKE``) the p-th from the end of every odd wave, so that under the causal
    LPT order the programs that drew the longest tile of one wave draw the shortest of the next.
    ``PAIRED`` (``_tile_bhm``'s paired order): waves of ``num_programs`` pairs, program p taking the
    p-th pair of each, its two tiles in turn (k even: the long one). May be >= num_tiles in the last
    wave (no tile); ``_walk_steps`` gives the walk's length.
    ``table`` (the kernel's ``Walk``, ``hopper.walk_table_for``): the walk read from the host's table
    instead, ``table[1 + k * programs + p]`` (tile indices in ``_tile_bhm``'s LPT encoding, num_tiles
    for none; one row past the walk's end, so a read a step ahead stays inside it)."""
    nprog = gl.num_programs(0)
    pid = gl.program_id(0)
    if table is not None:
        return gl.load(table + 1 + k * nprog + pid)
    if PAIRED:
        return 2 * ((k // 2) * nprog + pid) + k % 2
    if SNAKE:
        pid = pid + (k % 2) * (nprog - 1 - 2 * pid)  # odd waves: nprog - 1 - pid
    return k * nprog + pid



@gluon.jit
def _walk_steps(num_tiles, PAIRED: gl.constexpr, table=None):
    """Steps of a persistent program's walk (``_walk``): waves of programs tiles, or of programs pairs,
    or the table's first entry (its longest program's tile count)."""
    if table is not None:
        return gl.load(table)
    if PAIRED:
        return 2 * gl.cdiv(num_tiles // 2, gl.num_programs(0))
    return gl.cdiv(num_tiles, gl.num_programs(0))



@gluon.jit
def _kv_tile_count(m_start, seqlen_q, seqlen_k, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr,
                   IS_CAUSAL: gl.constexpr):
    """Key tiles (from the first) that the query rows [m_start, m_start + BLOCK_M) see: all of
    them, or under a causal mask up to the last row's diagonal (<= 0: no row sees a key)."""
    n_hi = gl.cdiv(seqlen_k, BLOCK_N)
    if IS_CAUSAL:
        last_row = gl.minimum(m_start + BLOCK_M, seqlen_q) - 1
        n_hi = gl.minimum(n_hi, gl.cdiv(gl.maximum(last_row + 1 + seqlen_k - seqlen_q, 0), BLOCK_N))
    return n_hi



@gluon.jit
def _block_lists(blocks, b, h, m_start, SUB: gl.constexpr, Q_BLOCK: gl.constexpr):
    """A block mask's walk for the query block from ``m_start`` (``blocks``: ``ioattn.modcall``'s
    (partial counts, partial indices, full counts, full indices, batch stride, head stride, indices a
    row)): ((partial row, full row, partial tiles), key tiles), a block of ``SUB`` key tiles a list
    entry; the partial blocks first (the mask function applies), then the full ones."""
    row = block_row(blocks, b, h, m_start, Q_BLOCK)
    n_part = gl.load(blocks[0] + row) * SUB
    n_full = gl.load(blocks[2] + row) * SUB
    offset = row.to(gl.int64) * blocks[6]
    return (blocks[1] + offset, blocks[3] + offset, n_part), n_part + n_full



@gluon.jit
def _key_tile(j, n_lo, lists=None, SUB: gl.constexpr = 1):
    """The key tile (in BLOCK_N units) of a query block's j-th step: n_lo + j, or with a block mask's
    lists (``_block_lists``) the j-th of its partial tiles, then of its full ones."""
    if lists is None:
        return n_lo + j
    else:
        n_part = lists[2]
        if j < n_part:
            t = gl.load(lists[0] + j // SUB) * SUB + j % SUB
        else:
            t = gl.load(lists[1] + (j - n_part) // SUB) * SUB + (j - n_part) % SUB
        return t



@gluon.jit
def _full_tile(j, lists=None):
    """Whether a query block's j-th step is a block mask's full block (``_block_lists``): no mask
    function there. Without lists, never."""
    if lists is None:
        return False
    else:
        return j >= lists[2]
