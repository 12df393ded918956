"""Pure-PyTorch attention algorithms: the textbook and the test oracle (run on any device)."""
from ioattn.reference.naive import attention_ref
from ioattn.reference.philox import dropout_keep_mask, dropout_threshold, philox_randint
from ioattn.reference.tiled import flash1_forward, flash2_forward, flash_backward

__all__ = [
    "attention_ref",
    "dropout_keep_mask",
    "dropout_threshold",
    "flash1_forward",
    "flash2_forward",
    "flash_backward",
    "philox_randint",
]
