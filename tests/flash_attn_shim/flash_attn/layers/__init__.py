"""``flash_attn.layers``: only ``rotary.apply_rotary_emb`` is provided."""
