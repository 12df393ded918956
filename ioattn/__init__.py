"""ioattn: exact, IO-aware attention (the FlashAttention family) for PyTorch."""
from ioattn import mods
from ioattn.api import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func)
from ioattn.block_mask import BlockMask, block_sparse_mask, create_block_mask
from ioattn.decode import explain_decode, flash_attn_with_kvcache
from ioattn.explain import explain_dispatch
from ioattn.fp8 import quantize_fp8
from ioattn.merge import merge_attention_states

__version__ = "0.1.0"
__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_with_kvcache", "merge_attention_states", "explain_dispatch", "explain_decode",
           "quantize_fp8", "mods", "create_block_mask", "block_sparse_mask", "BlockMask"]
