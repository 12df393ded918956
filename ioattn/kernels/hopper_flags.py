"""The Gluon Hopper kernels' compile-time codes, as plain ints: the kernels read them and the host
policy (``ioattn.plan.hopper``) sets them, so both import them from here (the kernels import nothing
from the layers above).

``ALIBI``: the form of the ALiBi bias in both kernels (0: no ALiBi). ``WS_*_REGS``: the warp-specialised
backward's register budgets (setmaxnreg)."""
ALIBI_MAGIC = 1      # the distance by the magic-number conversion
ALIBI_FP32_COLS = 2  # the tile's columns held as fp32

# producer and dQ-writer warps: FA3's producer budget; the consumers get what is left of the 64K
# registers, rounded down to a multiple of 8
WS_WORKER_REGS = 24
WS_CONSUMER_REGS = 240
