"""``flash_attn.flash_attn_interface``: the public functions, and the block width that
``S_dmask``'s unnormalised probabilities refer to (what flash-attn's tests ask ``_get_block_size_n``)."""
from ioattn.api import (attn_probs_block_n, flash_attn_func, flash_attn_kvpacked_func,
                        flash_attn_qkvpacked_func, flash_attn_varlen_func,
                        flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from ioattn.decode import flash_attn_with_kvcache

__all__ = ["flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_with_kvcache"]


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    # ioattn returns S_dmask only with dropout, and its blocks depend on the head dim alone
    return attn_probs_block_n(head_dim)
