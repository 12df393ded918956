"""Numbers every layer shares, as plain floats: the softmax runs in base 2 (exp(x) = exp2(x * LOG2E),
log(x) = log2(x) * LN2). The kernels wrap them as compile-time constants."""
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The Gluon forward's schedule trace (``hopper_fwd_kernel``'s ``Trace``): clock stamps per consumer
# warpgroup and critical section: the turn taken (its GEMMs issued), S ready, the softmax done, P V done.
TRACE_EVENTS = 4
