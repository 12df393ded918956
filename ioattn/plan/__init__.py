"""The plan layer: pure Python decisions about a call (which backend and kernel, its variant, tiles and
compile-time options, and why), read from the policy tables and the registered switches
(``options``). Nothing here launches or touches a GPU; the launch layer (``ioattn.launch``) carries
the decisions out."""
