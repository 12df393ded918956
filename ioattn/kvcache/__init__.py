"""Host-side data structures for KV-cache decoding (paged cache bookkeeping)."""
from ioattn.kvcache.pool import OutOfPagesError, PagePool

__all__ = ["OutOfPagesError", "PagePool"]
