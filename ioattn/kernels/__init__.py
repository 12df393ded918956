"""The portable Triton kernels (forward, backward, decode, combine) and the Gluon Hopper kernels
(``hopper_forward``, ``hopper_backward``: launched only where ``ioattn._compat.gluon_status`` finds the
Gluon API they are written against). Each module is imported where it is used, not here."""
