"""The Gluon Hopper kernels' compile-time codes, as plain ints: the kernels read them and the host
policy (``ioattn.plan.hopper``) sets them, so both import them from here (the kernels import nothing
from the layers above).

``LEAN``: the Gluon forward's bit field above the lean softmax itself (bit 0), each bit needing it.
``ALIBI``: the form of the ALiBi bias in both kernels (0: no ALiBi). ``WS_*_REGS``: the warp-specialised
backward's register budgets (setmaxnreg)."""
LEAN_COND_RESCALE = 2   # conditional rescaling (``hopper.conditional_rescale_for``)
LEAN_BY_WARP = 4        # ... decided by the warp (``hopper.rescale_by_warp``)
LEAN_Q_REGS = 8         # Q as S = Q K^T's register operand (``hopper.q_in_registers_for``)
LEAN_DEFERRED_SUM = 16  # the row sum's quad reduction once a tile (``hopper.deferred_row_sum``)
LEAN_MASK_BRANCH = 32   # a tile's first-step mask under its own branch, one softmax body (``hopper.mask_branch``)
LEAN_PTX_BARRIERS = 64  # the consumers' redundant partition barriers dropped in the PTX (``hopper.ptx_barriers_for``)

ALIBI_MAGIC = 1      # the distance by the magic-number conversion
ALIBI_FP32_COLS = 2  # the tile's columns held as fp32

# producer and dQ-writer warps: FA3's producer budget; the consumers get what is left of the 64K
# registers, rounded down to a multiple of 8
WS_WORKER_REGS = 24
WS_CONSUMER_REGS = 240
