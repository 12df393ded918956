"""A stand-in ``flash_attn`` package that resolves to ioattn, for running code (or flash-attn's own
test suite) written against flash-attn without changing its imports. Not installed with ioattn:
put ``tests/flash_attn_shim`` first on ``PYTHONPATH``."""
from ioattn import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                    flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                    flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)

# the flash-attn release whose public signatures ioattn's match
__version__ = "2.8.3"

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_with_kvcache"]
