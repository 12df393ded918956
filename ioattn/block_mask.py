"""Block masks: a mask function computed once into lists of key blocks per query block.

``create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN)`` (FlexAttention's call) classifies every
(query block, key block) pair of the score matrix as empty (skipped), partial (the kernels evaluate
the mask function in it) or full (run without it), and stores, per query block, the partial and the
full key blocks in ascending order, and per key block the transposed lists that the backward's dK / dV
pass walks. ``block_sparse_mask(layout, ...)`` gives FlashAttention-1's block-sparse attention: the
listed blocks run whole, no mask function.

Positions are those of the mask function: ``q_idx`` in [0, Q_LEN), ``kv_idx`` in [0, KV_LEN), so a
mask that wants flash-attn's bottom-right alignment says so (``ioattn.mods.bottom_right_causal``).
For the varlen functions, ``B`` is the number of sequences and the lengths their maxima; positions
are within each sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ioattn import mods as _mods
from ioattn.plan import dispatch

__all__ = ["BlockMask", "create_block_mask", "block_sparse_mask"]

EMPTY, PARTIAL, FULL = 0, 1, 2


@dataclass(eq=False)
class BlockMask:
    """Per query block (rows of ``kv_num_blocks`` (B', H', q blocks), ``kv_indices`` (B', H', q
    blocks, k blocks)): the partial key blocks first ``kv_num_blocks`` of each row of indices; the
    same for the full ones (``full_*``); and per key block the query blocks (``q_*``, ``full_q_*``),
    for the backward. B' and H' are 1 where the mask does not depend on the batch entry or the head.
    ``mask_mod``: the function the partial blocks evaluate (None for a block-sparse layout)."""
    kv_num_blocks: torch.Tensor
    kv_indices: torch.Tensor
    full_kv_num_blocks: torch.Tensor
    full_kv_indices: torch.Tensor
    q_num_blocks: torch.Tensor
    q_indices: torch.Tensor
    full_q_num_blocks: torch.Tensor
    full_q_indices: torch.Tensor
    seq_lengths: tuple
    block_size: tuple
    mask_mod: object = None
    _regrouped: dict = field(default_factory=dict, repr=False, compare=False)  # ``regrouped``'s, by size

    @classmethod
    def from_classes(cls, classes, seq_lengths, block_size, mask_mod=None):
        """From a (B', H', q blocks, k blocks) tensor of EMPTY / PARTIAL / FULL."""
        def lists(c):
            part, full = c == PARTIAL, c == FULL
            return (part.sum(-1, dtype=torch.int32), _ascending(part), full.sum(-1, dtype=torch.int32),
                    _ascending(full))
        rows = lists(classes)
        cols = lists(classes.transpose(-1, -2))
        return cls(*rows, *cols, tuple(int(n) for n in seq_lengths), tuple(int(b) for b in block_size), mask_mod)

    @property
    def shape(self):
        """(B', H', Q_LEN, KV_LEN)."""
        return (*self.kv_num_blocks.shape[:2], *self.seq_lengths)

    def classes(self):
        """The (B', H', q blocks, k blocks) EMPTY / PARTIAL / FULL tensor, rebuilt from the lists."""
        nq, nk = self.kv_indices.shape[-2:]
        out = torch.zeros(*self.kv_num_blocks.shape, nk, dtype=torch.int8, device=self.kv_indices.device)
        for num, idx, value in ((self.kv_num_blocks, self.kv_indices, PARTIAL),
                                (self.full_kv_num_blocks, self.full_kv_indices, FULL)):
            listed = torch.arange(nk, device=idx.device) < num[..., None]
            out.scatter_add_(-1, idx.long(), torch.where(listed, value, 0).to(torch.int8))
        return out

    def regrouped(self, rows):
        """This mask's lists for query blocks of ``rows`` (key blocks unchanged; made once a size): a key
        block full where it is full in every block the rows overlap, empty where empty in all, else
        partial. Only for a mask built from a mask function, which then masks what a partial block holds
        (a kernel whose query tiles do not divide the blocks walks these)."""
        if self.mask_mod is None:
            raise ValueError("a block-sparse layout (no mask function) cannot be regrouped")
        if rows not in self._regrouped:
            classes = self.classes()
            n, bq = self.seq_lengths[0], self.block_size[0]
            # each new block's first and last old block, on the host (no read-back from the device)
            first = [s // bq for s in range(0, n, rows)]
            last = [(min(s + rows, n) - 1) // bq for s in range(0, n, rows)]
            span = max(hi - lo for lo, hi in zip(first, last)) + 1
            first, last = (torch.tensor(x, device=classes.device) for x in (first, last))
            picks = torch.minimum(first[:, None] + torch.arange(span, device=classes.device), last[:, None])
            parts = classes[:, :, picks.long()]  # (B', H', nq, span, k blocks)
            lo, hi = parts.amin(3), parts.amax(3)
            merged = torch.where(lo == hi, lo, torch.full_like(lo, PARTIAL))
            self._regrouped[rows] = BlockMask.from_classes(merged, self.seq_lengths, (rows, self.block_size[1]),
                                                           self.mask_mod)
        return self._regrouped[rows]

    def sparsity(self):
        """Percent of the blocks skipped (empty)."""
        total = self.kv_indices.numel()
        used = int(self.kv_num_blocks.sum()) + int(self.full_kv_num_blocks.sum())
        return 100.0 * (1.0 - used / total) if total else 0.0

    def to_string(self, grid_size=(20, 20), batch=0, head=0):
        """A picture of one (batch, head)'s blocks: '#' full, '+' partial, '.' empty (at most
        ``grid_size`` blocks a side, each character then standing for several blocks: the
        densest of them)."""
        c = self.classes()[min(batch, self.kv_num_blocks.shape[0] - 1), min(head, self.kv_num_blocks.shape[1] - 1)]
        rows, cols = c.shape
        gr, gc = min(grid_size[0], rows), min(grid_size[1], cols)
        lines = [f"BlockMask(shape={self.shape}, block_size={self.block_size}, sparsity={self.sparsity():.2f}%)"]
        for i in range(gr):
            r0, r1 = i * rows // gr, max((i + 1) * rows // gr, i * rows // gr + 1)
            line = ""
            for j in range(gc):
                c0, c1 = j * cols // gc, max((j + 1) * cols // gc, j * cols // gc + 1)
                line += ".+#"[int(c[r0:r1, c0:c1].max())]
            lines.append(line)
        return "\n".join(lines)

    def __str__(self):
        return self.to_string()

    def check_call(self, batch, nheads, seqlen_q, seqlen_k, device):
        """Raise if this mask was built for another call's lengths, batch, heads or device."""
        b, h = self.kv_num_blocks.shape[:2]
        if self.seq_lengths != (seqlen_q, seqlen_k):
            raise ValueError(f"block_mask was built for (seqlen_q, seqlen_k) = {self.seq_lengths}, the call has "
                             f"{(seqlen_q, seqlen_k)}")
        if b not in (1, batch) or h not in (1, nheads):
            raise ValueError(f"block_mask was built for batch {b} and {h} heads, the call has batch {batch} and "
                             f"{nheads} heads (1 broadcasts)")
        if self.kv_indices.device != device:
            raise ValueError(f"block_mask is on {self.kv_indices.device}, the call's tensors on {device}")

    def strides(self):
        """(batch, head) strides of a row of the lists in query-block rows (0 where broadcast)."""
        b, h, nq = self.kv_num_blocks.shape
        return (0 if b == 1 else h * nq), (0 if h == 1 else nq)

    def transposed_strides(self):
        b, h, nk = self.q_num_blocks.shape
        return (0 if b == 1 else h * nk), (0 if h == 1 else nk)


def _ascending(listed):
    """Per row, the column indices where ``listed`` holds, in ascending order, then the rest."""
    n = listed.shape[-1]
    cols = torch.arange(n, device=listed.device, dtype=torch.int32)
    key = torch.where(listed, cols, cols + n)
    return torch.sort(key, dim=-1, stable=True).values.remainder(n).to(torch.int32).contiguous()


def _check_sizes(B, H, Q_LEN, KV_LEN, block_size):
    for name, n in (("B", B), ("H", H)):
        if n is not None and (not isinstance(n, int) or n < 1):
            raise ValueError(f"{name} must be a positive int or None (broadcast), got {n!r}")
    for name, n in (("Q_LEN", Q_LEN), ("KV_LEN", KV_LEN)):
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} must be a positive int, got {n!r}")
    bq, bk = (block_size, block_size) if isinstance(block_size, int) else tuple(block_size)
    for n in (bq, bk):
        if n < 16 or n & (n - 1):
            raise ValueError(f"BLOCK_SIZE must be a power of two >= 16 (or a pair of them), got {block_size!r}")
    return bq, bk


def _indexed(device):
    """``cuda`` as the tensor it makes would name it (``cuda:0``): captures and calls compare equal."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def create_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device="cpu", BLOCK_SIZE=128):
    """The ``BlockMask`` of ``mask_mod(b, h, q_idx, kv_idx)`` over a (B, H, Q_LEN, KV_LEN) score
    matrix (``B`` / ``H`` None: the mask does not depend on them). On CUDA one Triton kernel evaluates
    the mask function tile by tile (``ioattn.launch.block_mask``); on the CPU it is evaluated densely
    one band of query blocks at a time."""
    mod = _mods.trace(mask_mod, "mask")
    bq, bk = _check_sizes(B, H, Q_LEN, KV_LEN, BLOCK_SIZE)
    device = _indexed(torch.device(device))
    mod.check_device(device)
    nb, nh = B or 1, H or 1
    if dispatch.use_triton(device):
        from ioattn.launch.block_mask import classify_blocks
        classes = classify_blocks(mod, nb, nh, Q_LEN, KV_LEN, bq, bk, device)
    else:
        classes = _classify_dense(mod, nb, nh, Q_LEN, KV_LEN, bq, bk, device)
    return BlockMask.from_classes(classes, (Q_LEN, KV_LEN), (bq, bk), mod)


def _classify_dense(mod, nb, nh, Q_LEN, KV_LEN, bq, bk, device):
    nq, nk = -(-Q_LEN // bq), -(-KV_LEN // bk)
    out = torch.empty(nb, nh, nq, nk, dtype=torch.int8, device=device)
    band = max(1, (1 << 22) // max(1, nb * nh * bq * nk * bk))  # query blocks a band: ~4M mask entries
    for q0 in range(0, nq, band):
        q1 = min(nq, q0 + band)
        rows = min(Q_LEN, q1 * bq) - q0 * bq
        keep = _mods.dense_mask(_shift_q(mod, q0 * bq), nb, nh, rows, KV_LEN, device)
        pad_q, pad_k = (q1 - q0) * bq - rows, nk * bk - KV_LEN
        valid = torch.ones(rows, KV_LEN, dtype=torch.bool, device=device)
        keep = torch.nn.functional.pad(keep, (0, pad_k, 0, pad_q))
        valid = torch.nn.functional.pad(valid, (0, pad_k, 0, pad_q))
        blocks = keep.reshape(nb, nh, q1 - q0, bq, nk, bk)
        vblocks = valid.reshape(q1 - q0, bq, nk, bk)
        kept = blocks.sum((3, 5))
        total = vblocks.sum((1, 3))
        out[:, :, q0:q1] = torch.where(kept == 0, EMPTY, torch.where(kept == total, FULL, PARTIAL)).to(torch.int8)
    return out


def _shift_q(mod, offset):
    return lambda b, h, q_idx, kv_idx: mod(b, h, q_idx + offset, kv_idx)


def block_sparse_mask(layout, seqlen_q, seqlen_k, block_size=128):
    """FlashAttention-1's block-sparse attention: ``layout`` bool (q blocks, k blocks), (H, ...) or
    (B, H, ...), True where a block of ``block_size`` queries by keys is computed; such blocks run
    whole (no mask function), the rest are skipped."""
    if layout.dtype != torch.bool or layout.dim() not in (2, 3, 4):
        raise ValueError(f"layout must be a bool tensor (q blocks, k blocks), optionally with leading (B, H) "
                         f"or (H,), got {layout.dtype} of shape {tuple(layout.shape)}")
    bq, bk = _check_sizes(None, None, seqlen_q, seqlen_k, block_size)
    nq, nk = -(-seqlen_q // bq), -(-seqlen_k // bk)
    if tuple(layout.shape[-2:]) != (nq, nk):
        raise ValueError(f"layout must have ({nq}, {nk}) blocks for lengths ({seqlen_q}, {seqlen_k}) and blocks "
                         f"{(bq, bk)}, got {tuple(layout.shape[-2:])}")
    while layout.dim() < 4:
        layout = layout.unsqueeze(0)
    classes = torch.where(layout, FULL, EMPTY).to(torch.int8)
    return BlockMask.from_classes(classes, (seqlen_q, seqlen_k), (bq, bk), None)
