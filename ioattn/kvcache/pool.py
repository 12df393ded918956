"""A host-side page allocator for a paged KV cache (the ``block_table`` layout of
``flash_attn_with_kvcache``)."""
from __future__ import annotations

import torch


class OutOfPagesError(RuntimeError):
    """A ``reserve`` needed more free pages than the pool has; nothing was changed."""


class PagePool:
    """Pages of ``page_size`` tokens shared by many sequences, and the bookkeeping to hand them out.

    Owns ``k_pages``/``v_pages`` (num_pages, page_size, nheads_kv, headdim / headdim_v: V's head dim,
    ``headdim`` unless given, MLA's 576 / 512), allocated with
    ``torch.empty`` (rows no sequence has written are garbage, and no valid call reads them), and a
    free list. Token ``t`` of a sequence lives in page ``pages[t // page_size]``, row
    ``t % page_size`` (flash-attn's paged layout).

    Contract — each sequence has a *length* (tokens committed, what ``seqlen``/``cache_seqlens``
    report) and a *capacity* (pages held * page_size >= length):

    * ``reserve(s, n)`` makes the capacity at least ``length + n``, taking pages from the free list.
      It is all-or-nothing: if the free list cannot cover it, ``OutOfPagesError`` (a RuntimeError,
      "out of pages: need X, have Y free") is raised and no state changes. It never changes the
      length and is idempotent (``reserve(s, 5)`` twice holds room for 5 tokens, not 10).
    * The caller writes the n new tokens at columns ``length .. length + n - 1`` — e.g. by passing
      ``cache_seqlens(ids)`` (the *old* lengths) and ``block_table(ids)`` with the new k/v to
      ``flash_attn_with_kvcache``, which appends them in place.
    * ``commit(s, n)`` then advances the length by n (refused beyond the capacity).
    * ``free(s)`` returns all of ``s``'s pages to the free list and forgets ``s``.

    A decoding step therefore reads::

        for s in ids: pool.reserve(s, 1)          # may raise: that s then got nothing new
        out = flash_attn_with_kvcache(q, pool.k_pages, pool.v_pages, k_new, v_new,
                                      cache_seqlens=pool.cache_seqlens(ids),
                                      block_table=pool.block_table(ids), causal=True)
        for s in ids: pool.commit(s, 1)

    ``append(s, k, v)`` does the three steps for one sequence with the reference writer (prefill,
    tests). Sequence ids are ints handed out by ``add_sequence`` and never reused. Freed pages are
    reused last-in first-out. Not thread-safe.
    """

    def __init__(self, num_pages, page_size, nheads_kv, headdim, dtype=torch.bfloat16, device="cpu", headdim_v=None):
        headdim_v = headdim if headdim_v is None else headdim_v
        for name, val in (("num_pages", num_pages), ("nheads_kv", nheads_kv), ("headdim", headdim),
                          ("headdim_v", headdim_v)):
            if isinstance(val, bool) or not isinstance(val, int) or val <= 0:
                raise ValueError(f"{name} must be a positive int, got {val!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0 or page_size % 16:
            raise ValueError(f"page_size must be a positive multiple of 16, got {page_size!r}")
        self.num_pages, self.page_size = num_pages, page_size
        self.nheads_kv, self.headdim, self.headdim_v = nheads_kv, headdim, headdim_v
        self.k_pages = torch.empty(num_pages, page_size, nheads_kv, headdim, dtype=dtype, device=device)
        self.v_pages = torch.empty(num_pages, page_size, nheads_kv, headdim_v, dtype=dtype, device=device)
        self._free = list(range(num_pages - 1, -1, -1))  # a stack: pop() hands out page 0 first
        self._pages: dict[int, list[int]] = {}
        self._len: dict[int, int] = {}
        self._next_id = 0

    # ---- queries

    @property
    def num_free_pages(self) -> int:
        return len(self._free)

    def _check(self, seq_id):
        if seq_id not in self._pages:
            raise KeyError(f"unknown seq_id {seq_id!r}")

    def seqlen(self, seq_id) -> int:
        """Tokens committed to ``seq_id``."""
        self._check(seq_id)
        return self._len[seq_id]

    def capacity(self, seq_id) -> int:
        """Tokens ``seq_id`` can hold without another page (pages held * page_size)."""
        self._check(seq_id)
        return len(self._pages[seq_id]) * self.page_size

    def pages(self, seq_id) -> list[int]:
        """The page indices of ``seq_id``, in token order (a copy)."""
        self._check(seq_id)
        return list(self._pages[seq_id])

    def sequences(self) -> list[int]:
        return list(self._pages)

    # ---- life cycle

    def add_sequence(self) -> int:
        """A new, empty sequence (no pages, length 0); returns its id."""
        seq_id = self._next_id
        self._next_id += 1
        self._pages[seq_id], self._len[seq_id] = [], 0
        return seq_id

    def reserve(self, seq_id, n_tokens) -> None:
        """Make room for ``n_tokens`` more tokens after the committed length (all or nothing)."""
        self._check(seq_id)
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an int >= 0, got {n_tokens!r}")
        needed = -(-(self._len[seq_id] + n_tokens) // self.page_size) - len(self._pages[seq_id])
        if needed <= 0:
            return
        if needed > len(self._free):
            raise OutOfPagesError(f"out of pages: need {needed}, have {len(self._free)} free "
                                  f"(seq_id {seq_id}: length {self._len[seq_id]} + {n_tokens} tokens, "
                                  f"page_size {self.page_size})")
        self._pages[seq_id].extend(self._free.pop() for _ in range(needed))

    def commit(self, seq_id, n_tokens) -> None:
        """Advance ``seq_id``'s length by ``n_tokens`` once they have been written (within the capacity)."""
        self._check(seq_id)
        if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 0:
            raise ValueError(f"n_tokens must be an int >= 0, got {n_tokens!r}")
        new_len = self._len[seq_id] + n_tokens
        if new_len > self.capacity(seq_id):
            raise ValueError(f"cannot commit {n_tokens} tokens to seq_id {seq_id}: length {self._len[seq_id]} + "
                             f"{n_tokens} exceeds the reserved capacity {self.capacity(seq_id)} (call reserve first)")
        self._len[seq_id] = new_len

    def free(self, seq_id) -> None:
        """Return all of ``seq_id``'s pages to the free list; the id becomes unknown."""
        self._check(seq_id)
        self._free.extend(reversed(self._pages.pop(seq_id)))  # its first page is handed out first again
        del self._len[seq_id]

    def append(self, seq_id, k, v, k_descale=None, v_descale=None) -> None:
        """Reserve, write ``k`` (n, nheads_kv, headdim) and ``v`` (n, nheads_kv, headdim_v) after the
        committed tokens, commit. A pool of e4m3 pages takes the sequence's descales (``k_descale``,
        ``v_descale``: (nheads_kv,) or anything broadcasting to (1, nheads_kv), the values
        ``flash_attn_with_kvcache`` is given for it) and stores the tokens quantised, ``value / descale``
        saturated to e4m3; other pools take none."""
        from ioattn.fp8 import check_descale, check_descale_values
        from ioattn.reference.decode import append_kv_ref

        if (k.dim() != 3 or v.dim() != 3 or k.shape[0] != v.shape[0]
                or tuple(k.shape[1:]) != (self.nheads_kv, self.headdim)
                or tuple(v.shape[1:]) != (self.nheads_kv, self.headdim_v)):
            raise ValueError(f"k must be (n, {self.nheads_kv}, {self.headdim}) and v (n, {self.nheads_kv}, "
                             f"{self.headdim_v}), got {tuple(k.shape)} and {tuple(v.shape)}")
        fp8 = self.k_pages.dtype == torch.float8_e4m3fn
        if fp8 != (k_descale is not None) or fp8 != (v_descale is not None):
            raise ValueError("an e4m3 pool's append needs k_descale and v_descale, and a pool of other pages takes "
                             f"none (pages {self.k_pages.dtype}, k_descale {'given' if k_descale is not None else 'None'}, "
                             f"v_descale {'given' if v_descale is not None else 'None'})")
        if fp8:
            k_descale, v_descale = (check_descale(name, d, 1, self.nheads_kv, self.k_pages.device)
                                    for name, d in (("k_descale", k_descale), ("v_descale", v_descale)))
            check_descale_values("k_descale", k_descale)
            check_descale_values("v_descale", v_descale)
        n = k.shape[0]
        self.reserve(seq_id, n)
        append_kv_ref(self.k_pages, self.v_pages, k[None], v[None], self.cache_seqlens([seq_id]),
                      block_table=self.block_table([seq_id]), k_descale=k_descale, v_descale=v_descale)
        self.commit(seq_id, n)

    # ---- kernel arguments

    def block_table(self, seq_ids, max_pages=None) -> torch.Tensor:
        """int32 (len(seq_ids), width) on the pool's device: row i lists seq_ids[i]'s pages in token
        order. ``width`` is ``max_pages`` if given (fixed shapes, e.g. CUDA graphs), else the most
        pages any of these sequences holds (at least 1). Unused entries are 0 — a valid page index,
        so a kernel that loads a whole page block stays in bounds; they are never *used* because
        ``cache_seqlens`` (plus the new tokens, which ``reserve`` made room for) bounds every read."""
        rows = []
        for s in seq_ids:
            self._check(s)
            rows.append(self._pages[s])
        width = max([1] + [len(r) for r in rows]) if max_pages is None else max_pages
        if any(len(r) > width for r in rows):
            raise ValueError(f"max_pages={max_pages} is smaller than a sequence's page count "
                             f"({max(len(r) for r in rows)})")
        table = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, r in enumerate(rows):
            table[i, :len(r)] = torch.tensor(r, dtype=torch.int32)
        return table.to(self.k_pages.device)

    def cache_seqlens(self, seq_ids) -> torch.Tensor:
        """int32 (len(seq_ids),) on the pool's device: the committed lengths."""
        return torch.tensor([self.seqlen(s) for s in seq_ids], dtype=torch.int32, device=self.k_pages.device)

    def __repr__(self):
        return (f"PagePool(num_pages={self.num_pages}, page_size={self.page_size}, nheads_kv={self.nheads_kv}, "
                f"headdim={self.headdim}, headdim_v={self.headdim_v}, dtype={self.k_pages.dtype}, free={len(self._free)}, "
                f"sequences={len(self._pages)})")
